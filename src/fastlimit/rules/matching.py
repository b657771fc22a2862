"""Which rules a request matches, kept so that a rule change and a lookup
cost what changed or what matches, not the number of rules.

Each rule is compiled once, when it is set, into a MatchRow.  Its resource
glob is indexed by its literal prefix (the bytes before the first ``*``,
``?`` or ``[``): a glob without metacharacters is a *point* (it matches one
string), any other a *cone* (every string it matches starts with the
prefix).  A lookup visits only the cones whose prefix starts the resource,
one dict probe per distinct prefix length, and the point equal to it, and
runs the full glob only on those.

The same view gives a sound check of the engine's limit of rules per
request (``crowding``): cones overlap only if one prefix starts the other,
and a set of boxes (resource x tier x client) that pairwise overlap has a
common point, so the most rules one request can match is found by
sweeping the sorted prefixes with a stack.  It over-counts (a cone stands
for more than its glob matches), never under-counts.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter

from fastlimit.rules.model import MAX_RULES_PER_REQUEST

# A compiled glob: the .match of its regex.
GlobMatch = Callable[[bytes], re.Match[bytes] | None]

GLOB_METACHARACTERS = re.compile(rb"[*?\[]")
BATCH_RESORT = 64     # changes in one batch above which the index re-sorts its keys once


def compile_glob(glob: bytes) -> GlobMatch:
    """fnmatch.fnmatchcase on bytes, compiled once: the pattern is read
    byte for byte (as ISO-8859-1), exactly as fnmatch does for bytes."""
    pattern = fnmatch.translate(glob.decode("iso-8859-1"))
    return re.compile(pattern.encode("iso-8859-1")).match


def literal_prefix(glob: bytes | None) -> tuple[bytes, bool]:
    """(the literal bytes a glob's matches start with, whether the glob is
    exactly that literal).  None (any string) is the empty cone."""
    if glob is None:
        return b"", False
    m = GLOB_METACHARACTERS.search(glob)
    return (glob, True) if m is None else (glob[:m.start()], False)


def _glob_or_any(glob: str | None) -> bytes | None:
    # "*" matches every string: say "any" so nothing is matched per call.
    return None if glob is None or glob == "*" else glob.encode("utf-8")


@dataclass(frozen=True, eq=False)
class MatchRow:
    """One rule as the matcher sees it, compiled once per change."""
    rule_id: str
    num: int
    resource: GlobMatch | None  # compiled bytes-glob .match, None when the index decides
    tier: bytes | None
    client: bytes | None        # glob the engine matches per call, or None for any
    key: bytes                  # literal prefix of the resource glob
    exact: bool                 # the resource glob is exactly `key`
    client_key: bytes
    client_exact: bool
    counted: bool               # evaluated by CL.LIMIT (concurrency rules are not)


def compile_row(rule, num: int) -> MatchRow:
    match = rule.match
    resource, client = _glob_or_any(match.resource), _glob_or_any(match.client)
    key, exact = literal_prefix(resource)
    # A point, or "<prefix>*", is matched by the index alone: only other
    # globs need a regex (compiling one is most of what a change costs).
    by_index_alone = resource is None or exact or resource == key + b"*"
    client_key, client_exact = literal_prefix(client)
    return MatchRow(rule_id=rule.id, num=num,
                    resource=None if by_index_alone or resource is None else compile_glob(resource),
                    tier=match.tier.encode("utf-8") if match.tier is not None else None,
                    client=client, key=key, exact=exact, client_key=client_key,
                    client_exact=client_exact, counted=rule.algorithm != "concurrency")


class MatchIndex:
    """The rows of the rules in force, by rule id, indexed by resource
    prefix.  A change costs O(log n) plus a list insertion per row (a
    memmove); a lookup O(distinct prefix lengths + candidates)."""

    def __init__(self):
        self.rows: dict[str, MatchRow] = {}
        self._cones: dict[bytes, dict[str, MatchRow]] = {}
        self._points: dict[bytes, dict[str, MatchRow]] = {}
        self._keys: list[bytes] = []             # sorted keys of both, for prefix ranges
        self._length_uses: dict[int, int] = defaultdict(int)   # cone prefix length -> keys
        self._lengths: tuple[int, ...] = ()

    def update(self, removes: list[str], adds: list[MatchRow]) -> list[MatchRow]:
        """Takes the rows of `removes` (rule ids) out and puts `adds` in;
        returns the rows taken out.  A large batch (a load) sorts the keys
        once instead of inserting each, which would be quadratic."""
        one_by_one = len(removes) + len(adds) <= BATCH_RESORT
        removed = [self._remove(rule_id, one_by_one) for rule_id in removes]
        for row in adds:
            self._add(row, one_by_one)
        if not one_by_one:
            self._keys = sorted(self._cones.keys() | self._points.keys())
        return removed

    def _add(self, row: MatchRow, keep_sorted: bool) -> None:
        self.rows[row.rule_id] = row
        table = self._points if row.exact else self._cones
        group = table.get(row.key)
        if group is None:
            group = table[row.key] = {}
            if keep_sorted and row.key not in (self._cones if row.exact else self._points):
                bisect.insort(self._keys, row.key)
            if not row.exact:
                self._use_length(len(row.key), 1)
        group[row.rule_id] = row

    def _remove(self, rule_id: str, keep_sorted: bool) -> MatchRow:
        row = self.rows.pop(rule_id)
        table = self._points if row.exact else self._cones
        group = table[row.key]
        del group[rule_id]
        if not group:
            del table[row.key]
            if keep_sorted and row.key not in (self._cones if row.exact else self._points):
                del self._keys[bisect.bisect_left(self._keys, row.key)]
            if not row.exact:
                self._use_length(len(row.key), -1)
        return row

    def _use_length(self, length: int, delta: int) -> None:
        uses = self._length_uses[length] + delta
        if uses:
            self._length_uses[length] = uses
        else:
            del self._length_uses[length]
        if uses in (0, 1):      # a length appeared or went away
            self._lengths = tuple(sorted(self._length_uses))

    def candidates(self, resource: bytes) -> list[MatchRow]:
        """Rows whose prefix view contains `resource`: the cones whose
        prefix starts it and the point equal to it (unsorted)."""
        out: list[MatchRow] = []
        cones = self._cones
        for length in self._lengths:
            if length > len(resource):
                break
            group = cones.get(resource[:length])
            if group:
                out.extend(group.values())
        group = self._points.get(resource)
        if group:
            out.extend(group.values())
        return out

    def lookup(self, resource: bytes, tier: bytes | None) -> list[MatchRow]:
        """The rows whose resource glob and tier match, in rule id order."""
        rows = [row for row in self.candidates(resource)
                if (row.tier is None or row.tier == tier)
                and (row.resource is None or row.resource(resource) is not None)]
        rows.sort(key=_rule_id)
        return rows

    def sharing_bound(self, row: MatchRow) -> int:
        """At most how many rows (row included, if indexed) one resource
        that `row` matches can match, by resource alone: a cheap sweep of
        the index's counts under row's prefix, no rows touched."""
        if row.exact:
            return len(self.candidates(row.key))
        key, keys, cones, points = row.key, self._keys, self._cones, self._points
        depth = sum(len(cones.get(key[:length], ())) for length in self._lengths
                    if length <= len(key))
        best = depth + len(points.get(key, ()))
        stack: list[tuple[bytes, int]] = []     # cones under key that start the current key
        i = bisect.bisect_right(keys, key)
        while i < len(keys) and keys[i].startswith(key):
            current = keys[i]
            while stack and not current.startswith(stack[-1][0]):
                depth -= stack.pop()[1]
            here = len(cones.get(current, ()))
            if here:
                stack.append((current, here))
                depth += here
            best = max(best, depth + len(points.get(current, ())))
            i += 1
        return best

    def overlapping(self, row: MatchRow) -> list[MatchRow]:
        """Every row whose resource view may share a string with `row`'s:
        cones whose prefix starts row's key, and (for a cone) the rows
        whose key starts with row's key.  Includes row if indexed."""
        if row.exact:
            return self.candidates(row.key)
        out = [r for r in self.candidates(row.key) if not r.exact]
        keys = self._keys
        i = bisect.bisect_left(keys, row.key)
        while i < len(keys) and keys[i].startswith(row.key):
            key = keys[i]
            if key != row.key:
                out.extend(self._cones.get(key, {}).values())
            out.extend(self._points.get(key, {}).values())
            i += 1
        return out


def _rule_id(row: MatchRow) -> str:
    return row.rule_id


_RESOURCE_VIEW = (attrgetter("key"), attrgetter("exact"))
_CLIENT_VIEW = (attrgetter("client_key"), attrgetter("client_exact"))


def _crowds(rows: list[MatchRow], view, limit: int):
    """Sweeps one dimension: yields each group of more than `limit` rows
    whose views share a string (the cones whose prefix starts a key, plus
    the points equal to it), over every key of `rows`.  Sorted keys put a
    prefix before what it starts, so the cones containing the current key
    are a stack."""
    if len(rows) <= limit:
        return
    key_of, exact_of = view
    stack: list[tuple[bytes, list]] = []
    depth = 0
    for key, grouped in groupby(sorted(rows, key=key_of), key_of):
        while stack and not key.startswith(stack[-1][0]):
            depth -= len(stack.pop()[1])
        group = list(grouped)
        points = [row for row in group if exact_of(row)]
        if len(points) < len(group):
            cones = [row for row in group if not exact_of(row)]
            stack.append((key, cones))
            depth += len(cones)
        if depth + len(points) > limit:
            yield [row for _, cones in stack for row in cones] + points


def _depth(rows: list[MatchRow]) -> int:
    """The most rows one (resource, client) can share, whatever the tier."""
    best = min(len(rows), 1)
    for by_resource in _crowds(rows, _RESOURCE_VIEW, 0):
        if len(by_resource) > best:     # the client can only split it further
            best = max([best, *map(len, _crowds(by_resource, _CLIENT_VIEW, best))])
    return best


def _tier_groups(rows: list[MatchRow], limit: int) -> list[list[MatchRow]]:
    """The groups of rows a request's tier selects together that might hold
    more than `limit` sharing one request: the rules of any tier alone (a
    request without a tier, or of a tier no rule names), and with each
    tier's own rules where the depths of the two parts may add up to more."""
    any_tier: list[MatchRow] = []
    by_tier: dict[bytes, list[MatchRow]] = {}
    for row in rows:
        if row.tier is None:
            any_tier.append(row)
        else:
            by_tier.setdefault(row.tier, []).append(row)
    groups, any_depth = [any_tier], None
    for own in by_tier.values():
        if len(any_tier) + len(own) <= limit:
            continue
        if any_depth is None:
            any_depth = _depth(any_tier)
        if any_depth + _depth(own) > limit:
            groups.append(any_tier + own)
    return groups


def crowding(rows: list[MatchRow], changed: set[str],
             limit: int = MAX_RULES_PER_REQUEST) -> tuple[str, int, bytes] | None:
    """A request one of the `changed` rules matches together with more than
    `limit` others counted by CL.LIMIT, if the rows allow one: (a changed
    rule id, how many rules, a resource prefix of such a request)."""
    counted = [row for row in rows if row.counted]
    if len(counted) <= limit:
        return None
    for by_tier in _tier_groups(counted, limit):
        for by_resource in _crowds(by_tier, _RESOURCE_VIEW, limit):
            for group in _crowds(by_resource, _CLIENT_VIEW, limit):
                ids = sorted(row.rule_id for row in group if row.rule_id in changed)
                if ids:
                    prefix = max((row.key for row in group), key=len)
                    return ids[0], len(group), prefix
    return None
