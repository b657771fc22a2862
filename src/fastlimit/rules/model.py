"""A named rule: one JSON document, the same shape wherever rules are
written (CL.RULE SET, the rules file, the rules database), validated here
and only here, so every way in gives the same errors.

    {"match": {"resource": "POST /orders", "tier": "free", "client": "ip:10.*"},
     "algorithm": "token_bucket", "capacity": 20, "refill_per_second": 10,
     "mode": "enforce", "on_failure": "open", "key": "client"}

Every error names the rule, the field and why:
``invalid rule 'orders': capacity: must be an integer from 1 to 10^15``.
The numeric bounds are the engine's (``fastlimit._rules``), checked here
first so that a rule the engine would refuse is never stored.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from functools import cached_property

from fastlimit._load import PRIORITIES
from fastlimit._rules import (
    MAX_HOME_PREFIX_LEN,
    MAX_HOME_PREFIXES,
    MAX_RULES_PER_REQUEST,  # noqa: F401  (rules refer to it here)
    MAX_SPLIT,
)
from fastlimit.regions.shares import (
    HOME_BY_KEY,
    MAX_REGIONS,
    MAX_WEIGHT,
    PARTITION_POLICIES,
    REBALANCE_TOTAL,
    REGION_NAME,
    REGION_SCOPES,
    Regions,
    share_spec,
    tokens_of,
)

E6, E9, E15, E18 = 10**6, 10**9, 10**15, 10**18
MAX_PERIOD_MS = 4294967295          # the engine keeps refill remainders in a u32
MAX_LEASE_MS = 86_400_000           # a day: a crashed caller's lease must end
MAX_CONCURRENCY = 1024              # the engine keeps a slot per lease in each record
MAX_REFILL_TIME_MS = E15            # refilling a whole bucket must be representable
MAX_GCRA_TOLERANCE = E18            # period_ms * (burst + 1)
MAX_PATTERN_LEN = 1024
MAX_DOCUMENT_BYTES = 65536

RULE_ID = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")

ALGORITHMS = ("token_bucket", "fixed_window", "sliding_window", "gcra", "concurrency")
MODES = ("enforce", "shadow")
ON_FAILURE = ("open", "closed")
SCOPES = ("client", "client+resource")
MATCH_FIELDS = ("resource", "tier", "client")
COMMON_FIELDS = ("match", "algorithm", "mode", "on_failure", "key", "split", "split_epoch",
                 "split_history", "priority", "regions", "shares", "partition", "rebalance",
                 "home", "home_prefixes", "home_allowance")
MAX_SPLIT_EPOCH = 255               # the high byte of a bucket key's rule number
SPLIT_HISTORY = 3                   # earlier splits whose buckets a new split inherits

# Per algorithm, its numeric fields in canonical order with their bounds
# and the bound as the error message says it.
_Bound = tuple[int, int, str]
_ANY_LIMIT: _Bound = (1, E15, "from 1 to 10^15")
_PERIOD: _Bound = (1, MAX_PERIOD_MS, f"from 1 to {MAX_PERIOD_MS}")
NUMBER_FIELDS: dict[str, dict[str, _Bound]] = {
    "token_bucket": {"capacity": _ANY_LIMIT, "refill_per_second": _ANY_LIMIT,
                     "refill": _ANY_LIMIT, "period_ms": _PERIOD},
    "fixed_window": {"limit": _ANY_LIMIT, "window_ms": _PERIOD},
    "sliding_window": {"limit": _ANY_LIMIT, "window_ms": _PERIOD},
    "gcra": {"burst": (0, E9, "from 0 to 10^9"), "count": (1, E6, "from 1 to 10^6"),
             "period_ms": _PERIOD},
    "concurrency": {"limit": (1, MAX_CONCURRENCY, f"from 1 to {MAX_CONCURRENCY}"),
                    "lease_ms": (1, MAX_LEASE_MS, f"from 1 to {MAX_LEASE_MS}")},
}
ALL_NUMBER_FIELDS = {name for fields in NUMBER_FIELDS.values() for name in fields}


NESTED_TOO_DEEPLY = "nested too deeply"


class RuleError(ValueError):
    """A rule, rule id or rules file that cannot be used; the message is
    one line, ready to follow "ERR " in a reply.  ``field`` is the
    document field it names (``capacity``, ``match.tier``), if any, for
    replies that carry it apart (the HTTP API's problem documents)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class DocumentError(RuleError):
    """A rule document that is not JSON text at all (too long, not UTF-8,
    not JSON), as against a JSON value that is not a valid rule: HTTP
    answers one with 400, the other with 422."""


@dataclass(frozen=True)
class Match:
    """Which requests a rule applies to; None matches anything.  resource
    and client are fnmatch-style globs (case-sensitive), tier is exact."""
    resource: str | None = None
    tier: str | None = None
    client: str | None = None

    def to_dict(self) -> dict:
        """The match as it is written in a rule document."""
        return {name: getattr(self, name) for name in MATCH_FIELDS
                if getattr(self, name) is not None}


@dataclass(frozen=True)
class Rule:
    id: str
    match: Match
    algorithm: str
    # (field, value) pairs in NUMBER_FIELDS order: a tuple keeps Rule immutable.
    numbers: tuple[tuple[str, int], ...]
    mode: str = "enforce"
    on_failure: str = "open"
    scope: str = "client"          # the document's "key" field
    # A hot key's bucket split into this many sub-buckets (README, "Split
    # keys"); the epoch tells the buckets of successive splits apart and
    # the history, ((epoch, k), ...) newest first, is where a new split's
    # buckets take what is left from.  The registry advances both.
    split: int = 1
    split_epoch: int = 0
    split_history: tuple[tuple[int, int], ...] = ()
    # Its checks' priority when a request names none (README, "Overload");
    # None: the caller's.  A shed check is answered by on_failure.
    priority: str | None = None
    # Its scope among regions (README, "Regions"): "regional", each region
    # the whole limit; "static", each region its share, by the weights of
    # shares ((region, weight), ... sorted; none: equal shares); "global",
    # the whole limit less the other regions' spends, and while a peer is
    # unreachable what partition says ("share": the static share).
    regions: str = "regional"
    shares: tuple[tuple[str, int], ...] = ()
    partition: str = "share"
    # A static rule whose shares follow the regions' demand (README,
    # "Rebalancing static shares"): the shares then come from the regions'
    # coordinator, never above the total.
    rebalance: bool = False
    # A home rule's region for every key (None: each key's hash over the
    # regions picks it); README, "Home rules".
    home: str | None = None
    # keys starting with a prefix live in its region (longest first); the
    # others where "home" (or their hash) says: ((prefix, region), ...)
    home_prefixes: tuple[tuple[str, str], ...] = ()
    # While a key's home region is unreachable, its checks here are
    # counted against this many of the rule's tokens (and that share of its
    # rate) instead of being answered by on_failure; 0: none (README,
    # "Home rules").
    home_allowance: int = 0

    @property
    def params(self) -> dict[str, int]:
        """The algorithm's numbers by field name (capacity, window_ms...)."""
        return dict(self.numbers)

    @property
    def shadow(self) -> bool:
        """Whether the rule only counts what it would deny."""
        return self.mode == "shadow"

    def to_dict(self) -> dict:
        """The canonical document: every field, defaults written out, in a
        fixed order, so equal rules have equal documents."""
        doc = {"match": self.match.to_dict(), "algorithm": self.algorithm,
               **self.params, "mode": self.mode, "on_failure": self.on_failure,
               "key": self.scope}
        if self.split > 1:
            doc["split"] = self.split
        if self.split_epoch:
            doc["split_epoch"] = self.split_epoch
        if self.split_history:
            doc["split_history"] = [list(pair) for pair in self.split_history]
        if self.priority is not None:
            doc["priority"] = self.priority
        if self.regions != "regional":
            doc["regions"] = self.regions
        if self.shares:
            doc["shares"] = dict(self.shares)
        if self.regions == "global":
            doc["partition"] = self.partition
        if self.rebalance:
            doc["rebalance"] = True
        if self.home is not None:
            doc["home"] = self.home
        if self.home_prefixes:
            doc["home_prefixes"] = dict(self.home_prefixes)
        if self.home_allowance:
            doc["home_allowance"] = self.home_allowance
        return doc

    def to_json(self) -> str:
        """The canonical document as compact JSON."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    # Made once per rule (a Rule never changes): listing 10,000 rules over
    # HTTP would otherwise serialise and hash every one on each request.
    @cached_property
    def document(self) -> bytes:
        """The canonical document as UTF-8 JSON: CL.RULE GET's reply and
        the HTTP API's body."""
        return self.to_json().encode("utf-8")

    @cached_property
    def digest(self) -> str:
        """SHA-256 of the document in hex: it changes whenever the
        document does, and equal documents have equal digests (the HTTP
        API's ETags)."""
        return hashlib.sha256(self.document).hexdigest()

    def engine_spec(self, regions: Regions | None = None, partitioned: bool = False,
                    held: int | None = None) -> dict:
        """The spec dict of fastlimit._rules.RuleEngine.define(), in the
        region given (a static rule's share of it, or with rebalance the
        share it holds, in thousandths; a global rule's while partitioned
        with partition "share"; the whole rule where the tier has no
        regions); ValueError if the region's share cannot be a rule."""
        spec = {"algorithm": self.algorithm, "shadow": self.shadow, "scope": self.scope}
        if self.on_failure != "open":       # what a shed check answers
            spec["on_failure"] = self.on_failure
        if self.priority is not None:
            spec["priority"] = PRIORITIES.index(self.priority)
        params = self.params
        if "refill_per_second" in params:
            params["refill"] = params.pop("refill_per_second")
            params["period_ms"] = 1000
        spec.update(params)
        if self.split > 1 or self.split_epoch:
            spec.update(split=self.split, split_epoch=self.split_epoch,
                        split_history=[list(pair) for pair in self.split_history])
        if self.regions == "global":
            spec["region_sync"] = True
        if self.regions == "home" and regions is not None:
            if self.home is not None and self.home not in regions.names:
                raise ValueError(f"home: '{self.home}' is not one of the regions "
                                 f"({' '.join(regions.names)})")
            spec["home"] = regions.names.index(self.home) if self.home else HOME_BY_KEY
            unknown = [r for _, r in self.home_prefixes if r not in regions.names]
            if unknown:
                raise ValueError(f"home_prefixes: '{unknown[0]}' is not one of the regions "
                                 f"({' '.join(regions.names)})")
            spec["home_prefixes"] = [(prefix.encode("utf-8"), regions.names.index(region))
                                     for prefix, region in self.home_prefixes]
        if regions is not None and held is not None and self.rebalance:
            return share_spec(spec, held, REBALANCE_TOTAL)
        if regions is not None and (self.regions == "static" or (
                self.regions == "global" and partitioned and self.partition == "share")):
            spec = share_spec(spec, *regions.weights(self.shares))
        return spec

    def allowance_spec(self) -> dict | None:
        """A home rule's local allowance as an engine spec of its own: the
        rule's home_allowance tokens of its limit and that share of its
        rate, counted here whatever the key's home; None without one."""
        if not self.home_allowance:
            return None
        local = replace(self, regions="regional", home=None, home_prefixes=(),
                        home_allowance=0).engine_spec()
        return share_spec(local, self.home_allowance, tokens_of(local))

    def resplit(self, old: Rule) -> Rule:
        """This rule replacing `old` on the same buckets: a changed split
        gets the next epoch, with old's split first in its history, unless
        the document moved the epoch itself (a stored rule another node
        already advanced); an unchanged split keeps old's epoch and
        history unless the document gives its own.  Epochs run 1 to 255
        once advanced, so 0 means "never changed"."""
        if self.split == old.split:
            if self.split_epoch or self.split_history:
                return self
            return replace(self, split_epoch=old.split_epoch,
                           split_history=old.split_history)
        if self.split_epoch not in (0, old.split_epoch):
            return self
        history = ((old.split_epoch, old.split),) + old.split_history[:SPLIT_HISTORY - 1]
        return replace(self, split_epoch=old.split_epoch % MAX_SPLIT_EPOCH + 1,
                       split_history=history)


# ---- parsing -----------------------------------------------------------------------

def show(text: str, limit: int = 64) -> str:
    """A user-supplied string made safe for a one-line error message:
    cut short, control and non-ASCII characters escaped."""
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return cut.encode("unicode_escape").decode("ascii")


def check_rule_id(rule_id) -> str:
    if not isinstance(rule_id, str) or not RULE_ID.fullmatch(rule_id):
        shown = show(rule_id) if isinstance(rule_id, str) else repr(rule_id)
        raise RuleError(f"invalid rule id '{shown}': must be 1 to 128 characters "
                        "of A-Z a-z 0-9 _ . : / -")
    return rule_id


def parse_rule(rule_id: str, doc: dict | str | bytes) -> Rule:
    """Validates a rule document (a dict, or JSON text) into a Rule;
    raises RuleError naming the field and why."""
    check_rule_id(rule_id)
    if isinstance(doc, (bytes, bytearray, str)):
        doc = _load_json(rule_id, doc)
    if not isinstance(doc, dict):
        raise _invalid(rule_id, None, "must be an object")
    return _RuleParser(rule_id, doc).parse()


def _invalid(rule_id: str, field: str | None, reason: str) -> RuleError:
    where = f"{field}: " if field else ""
    return RuleError(f"invalid rule '{rule_id}': {where}{reason}", field)


def no_duplicate_keys(pairs):
    """json object_pairs_hook: JSON allows duplicate keys and keeps the
    last; a rule with two capacities is a mistake, not a choice."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key '{show(key)}'")
        out[key] = value
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def load_json(text: str):
    """json.loads, strict: no duplicate keys, no NaN/Infinity."""
    return json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=_no_constant)


def _load_json(rule_id: str, text: str | bytes):
    # len() first, so a huge str is refused without encoding it.
    if len(text) > MAX_DOCUMENT_BYTES or (
            isinstance(text, str) and len(text.encode("utf-8")) > MAX_DOCUMENT_BYTES):
        raise _malformed(rule_id, f"document longer than {MAX_DOCUMENT_BYTES} bytes")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed(rule_id, "not valid UTF-8") from None
    try:
        return load_json(text)
    except ValueError as e:   # JSONDecodeError, duplicates, NaN, 4300+ digit ints
        raise _malformed(rule_id, f"not valid JSON: {show(str(e), 200)}") from None
    except RecursionError:
        raise _malformed(rule_id, f"not valid JSON: {NESTED_TOO_DEEPLY}") from None


def _malformed(rule_id: str, reason: str) -> DocumentError:
    return DocumentError(f"invalid rule '{rule_id}': {reason}")


def is_utf8(text: str) -> bool:
    """Whether text can be written as UTF-8 (the database, replies and the
    engine's globs all need it): JSON's "\\ud800" gives a lone surrogate,
    which cannot."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# What "required" means where a field has an alternative or a partner.
_MISSING = {("token_bucket", "refill_per_second"): "required (or refill with period_ms)",
            ("token_bucket", "period_ms"): "required with refill"}


class _RuleParser:
    """Reads one document field by field; the first problem found wins,
    in a fixed order (algorithm, unknown fields, match, numbers, mode,
    on_failure, key) so the same document always gives the same error."""

    def __init__(self, rule_id: str, doc: dict):
        self.rule_id = rule_id
        self.doc = doc

    def fail(self, field: str | None, reason: str) -> RuleError:
        return _invalid(self.rule_id, field, reason)

    def parse(self) -> Rule:
        algorithm = self.choice("algorithm", ALGORITHMS, default="token_bucket",
                                message="must be one of " + ", ".join(ALGORITHMS))
        self.reject_unknown(algorithm)
        match, numbers = self.match(), self.numbers(algorithm)
        return Rule(id=self.rule_id, match=match, algorithm=algorithm, numbers=numbers,
                    mode=self.choice("mode", MODES, default="enforce"),
                    on_failure=self.choice("on_failure", ON_FAILURE, default="open"),
                    scope=self.choice("key", SCOPES, default="client"),
                    split=self.split(algorithm, dict(numbers)),
                    split_epoch=self.integer("split_epoch", 0, MAX_SPLIT_EPOCH, 0),
                    split_history=self.split_history(),
                    priority=self.optional_choice("priority", PRIORITIES),
                    regions=self.region_scope(algorithm),
                    shares=self.shares(), partition=self.partition(),
                    rebalance=self.rebalance(), home=self.home(),
                    home_prefixes=self.home_prefixes(),
                    home_allowance=self.home_allowance())

    def home_allowance(self) -> int:
        if "home_allowance" not in self.doc:
            return 0
        if self.doc.get("regions") != "home":
            raise self.fail("home_allowance", "only a home rule has a home_allowance "
                                              "(\"regions\": \"home\")")
        base = self.base_spec()
        tokens = tokens_of(base)
        allowance = self.integer("home_allowance", 1, tokens, 0)
        try:
            share_spec(base, allowance, tokens)
        except ValueError as e:
            raise self.fail("home_allowance", str(e)) from None
        return allowance

    def home_prefixes(self) -> tuple[tuple[str, str], ...]:
        if "home_prefixes" not in self.doc:
            return ()
        table = self.doc["home_prefixes"]
        if self.doc.get("regions") != "home":
            raise self.fail("home_prefixes", "only a home rule has home_prefixes "
                                             "(\"regions\": \"home\")")
        if not isinstance(table, dict) or not 1 <= len(table) <= MAX_HOME_PREFIXES or not all(
                isinstance(prefix, str) and 1 <= len(prefix.encode("utf-8", "replace"))
                <= MAX_HOME_PREFIX_LEN and is_utf8(prefix)
                and isinstance(region, str) and REGION_NAME.fullmatch(region)
                for prefix, region in table.items()):
            raise self.fail("home_prefixes", f"must be an object of 1 to {MAX_HOME_PREFIXES} "
                                             f"key prefixes (1 to {MAX_HOME_PREFIX_LEN} bytes) "
                                             "each naming a region")
        return tuple(sorted(table.items()))

    def home(self) -> str | None:
        if "home" not in self.doc:
            return None
        value = self.doc["home"]
        if self.doc.get("regions") != "home":
            raise self.fail("home", "only a home rule has a home (\"regions\": \"home\")")
        if not isinstance(value, str) or not REGION_NAME.fullmatch(value):
            raise self.fail("home", "must be a region's name (1 to 64 characters of A-Z a-z "
                                    "0-9 _ -)")
        return value

    def rebalance(self) -> bool:
        value = self.doc.get("rebalance", False)
        if type(value) is not bool:
            raise self.fail("rebalance", "must be true or false")
        if value and self.doc.get("regions") != "static":
            raise self.fail("rebalance", "only a static rule is rebalanced "
                                         "(\"regions\": \"static\")")
        return value

    def region_scope(self, algorithm: str) -> str:
        scope = self.choice("regions", REGION_SCOPES, default="regional")
        if scope in ("global", "home") and (algorithm == "concurrency"
                                            or self.doc.get("split", 1) != 1):
            raise self.fail("regions", f"a {scope} rule cannot be a concurrency rule or split "
                                       "(its key is counted whole, in one place)")
        return scope

    def partition(self) -> str:
        if "partition" in self.doc and self.doc.get("regions") != "global":
            raise self.fail("partition", "only a global rule has a partition policy "
                                         "(\"regions\": \"global\")")
        return self.choice("partition", PARTITION_POLICIES, default="share")

    def shares(self) -> tuple[tuple[str, int], ...]:
        """A static rule's weights by region, each of which must hold at
        least one token of every number the rule has: the same document is
        refused alike in every region."""
        if "shares" not in self.doc:
            return ()
        shares = self.doc["shares"]
        reason = (f"must be an object of at most {MAX_REGIONS} regions (names of 1 to 64 "
                  f"A-Z a-z 0-9 _ -), each with a weight from 1 to {MAX_WEIGHT}")
        if self.doc.get("regions") not in ("static", "global"):
            raise self.fail("shares", "only a static or global rule has shares "
                                      "(\"regions\": \"static\" or \"global\")")
        if not isinstance(shares, dict) or not 1 <= len(shares) <= MAX_REGIONS or not all(
                isinstance(name, str) and REGION_NAME.fullmatch(name)
                and type(weight) is int and 1 <= weight <= MAX_WEIGHT
                for name, weight in shares.items()):
            raise self.fail("shares", reason)
        pairs = tuple(sorted(shares.items()))
        total = sum(weight for _, weight in pairs)
        for name, weight in pairs:
            try:
                share_spec(self.base_spec(), weight, total)
            except ValueError as e:
                raise self.fail("shares", f"region '{name}': {e}") from None
        return pairs

    def base_spec(self) -> dict:
        """The engine spec of the document's numbers alone."""
        algorithm = self.doc.get("algorithm", "token_bucket")
        return Rule(id=self.rule_id, match=Match(), algorithm=algorithm,
                    numbers=self.numbers(algorithm)).engine_spec()

    def optional_choice(self, field: str, allowed: tuple) -> str | None:
        return self.choice(field, allowed, "") if field in self.doc else None

    def choice(self, field: str, allowed: tuple, default: str, message: str = "") -> str:
        value = self.doc.get(field, default)
        if not isinstance(value, str) or value not in allowed:
            quoted = " or ".join(f"'{a}'" for a in allowed)
            raise self.fail(field, message or f"must be {quoted}")
        return value

    def integer(self, field: str, low: int, high: int, default: int) -> int:
        value = self.doc.get(field, default)
        if type(value) is not int or not low <= value <= high:
            raise self.fail(field, f"must be an integer from {low} to {high}")
        return value

    def split(self, algorithm: str, v: dict[str, int]) -> int:
        """k, with the engine's bounds on a sub-bucket: at least one token
        each, its period (k times the rule's) in range."""
        k = self.integer("split", 1, MAX_SPLIT, 1)
        if k == 1:
            return k
        if algorithm == "concurrency":
            raise self.fail("split", "a concurrency rule cannot be split (its leases "
                                     "must be counted in one place)")
        if algorithm == "token_bucket":
            total = v["capacity"]
        elif algorithm == "gcra":
            total = v.get("burst", 0) + 1
        else:
            total = v["limit"]
        if total < k:
            raise self.fail("split", f"more sub-buckets than the {algorithm} has tokens "
                                     f"({total})")
        period = v.get("window_ms", v.get("period_ms", 1000))
        if period * k > MAX_PERIOD_MS:
            raise self.fail("split", f"a sub-bucket's period ({period} ms x {k}) must be "
                                     f"at most {MAX_PERIOD_MS} ms")
        share = -(-total // k)                   # the largest sub-bucket
        if algorithm == "token_bucket" and share * period * k > \
                MAX_REFILL_TIME_MS * (v["refill"] if "refill" in v else v["refill_per_second"]):
            raise self.fail("split", "too slow a refill for a sub-bucket: refilling it "
                                     "would take more than 10^15 ms")
        if algorithm == "gcra" and period * k * share > MAX_GCRA_TOLERANCE:
            raise self.fail("split", "a sub-bucket's period_ms * (burst + 1) must be at "
                                     "most 10^18")
        return k

    def split_history(self) -> tuple[tuple[int, int], ...]:
        history = self.doc.get("split_history", [])
        reason = (f"must be a list of at most {SPLIT_HISTORY} [epoch, k] pairs, epoch "
                  f"0 to {MAX_SPLIT_EPOCH}, k 1 to {MAX_SPLIT}")
        if not isinstance(history, list) or len(history) > SPLIT_HISTORY:
            raise self.fail("split_history", reason)
        pairs = []
        for pair in history:
            if not (isinstance(pair, list) and len(pair) == 2
                    and all(type(x) is int for x in pair)
                    and 0 <= pair[0] <= MAX_SPLIT_EPOCH and 1 <= pair[1] <= MAX_SPLIT):
                raise self.fail("split_history", reason)
            pairs.append((pair[0], pair[1]))
        return tuple(pairs)

    def reject_unknown(self, algorithm: str) -> None:
        own = NUMBER_FIELDS[algorithm]
        for field in self.doc:
            if field in COMMON_FIELDS or field in own:
                continue
            hint = ""
            if field in ALL_NUMBER_FIELDS:
                hint = f" for {algorithm} (it takes {', '.join(own)})"
            raise self.fail(show(str(field)), f"unknown field{hint}")

    def match(self) -> Match:
        match = self.doc.get("match", {})
        if not isinstance(match, dict):
            raise self.fail("match", "must be an object")
        for field in match:
            if field not in MATCH_FIELDS:
                raise self.fail(f"match.{show(str(field))}",
                                "unknown field (match takes resource, tier, client)")
        values = {}
        for field in MATCH_FIELDS:
            if field not in match:
                continue
            value = match[field]
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_PATTERN_LEN:
                raise self.fail(f"match.{field}",
                                f"must be a string of 1 to {MAX_PATTERN_LEN} characters")
            if not is_utf8(value):
                raise self.fail(f"match.{field}", "not valid UTF-8")
            values[field] = value
        return Match(**values)

    def numbers(self, algorithm: str) -> tuple[tuple[str, int], ...]:
        required = self.required_numbers(algorithm)
        values = {}
        for field, (low, high, text) in NUMBER_FIELDS[algorithm].items():
            if field not in self.doc:
                if field in required:
                    raise self.fail(field, _MISSING.get((algorithm, field), "required"))
                continue
            value = self.doc[field]
            # bool is an int in Python, but true is not a capacity.
            if type(value) is not int or not low <= value <= high:
                raise self.fail(field, f"must be an integer {text}")
            values[field] = value
        self.check_combination(algorithm, values)
        return tuple(values.items())

    def required_numbers(self, algorithm: str) -> tuple[str, ...]:
        if algorithm != "token_bucket":
            return tuple(NUMBER_FIELDS[algorithm])
        doc = self.doc
        if "refill_per_second" in doc and "refill" in doc:
            raise self.fail("refill", "give either refill_per_second, or refill with "
                                      "period_ms, not both")
        if "period_ms" in doc and "refill" not in doc:
            raise self.fail("period_ms", "goes with refill (refill_per_second is per "
                                         "1000 ms)")
        if "refill" in doc:
            return ("capacity", "refill", "period_ms")
        return ("capacity", "refill_per_second")

    def check_combination(self, algorithm: str, v: dict) -> None:
        """The engine's bounds that involve two fields."""
        if algorithm == "token_bucket":
            refill_field = "refill" if "refill" in v else "refill_per_second"
            period = v.get("period_ms", 1000)
            if v["capacity"] * period > MAX_REFILL_TIME_MS * v[refill_field]:
                raise self.fail(refill_field, "too slow for the capacity: refilling "
                                              "the whole bucket would take more than "
                                              "10^15 ms")
        elif algorithm == "gcra":
            if v["period_ms"] * (v["burst"] + 1) > MAX_GCRA_TOLERANCE:
                raise self.fail("period_ms", "period_ms * (burst + 1) must be at most 10^18")
