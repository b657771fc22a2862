"""The rules in force: one place that keeps the engine, the rules
database and the rules file in step.

Every change (CL.RULE SET or DEL, a reload, the load at start) is a batch
that happens all or nothing, in this order:

1. validate every rule (model.parse_rule);
2. compile the changed rules' rows into the match index (matching.py),
   and refuse the batch if some request could then match more rules than
   the engine evaluates;
3. stage it in the engine (``define``), undone if the engine refuses one;
4. persist the batch in one database transaction, so what is
   acknowledged is durable and what is in force is what is stored;
5. publish: clear the engine's match cache, so the next check sees the
   new rules; only then retire dropped rules' numbers.

Any failure in 2-4, expected or not, undoes the index and the engine
stage: a failed change leaves the old rules in force everywhere.

All of it runs on the event loop's thread between two checks, so no
check ever sees half a batch, and none runs while a stage is undone.

Rule numbers: each rule gets a small integer for the engine, which keys
its buckets by it.  A number is never given to another rule, so buckets of
different rules never collide, and a deleted rule's buckets are
unreachable.  A rule keeps its number (and buckets) when its numbers,
match or mode change, and gets a new one when its algorithm or key scope
changes, because its old buckets would mean something else.

Reserved numbers: parts of the server that keep counters as engine rules
of their own (the Envoy rate limit service) reserve numbers by a name
that no rule id can be (it starts with RESERVED_PREFIX).  Snapshots and
replication carry buckets by rule id, or by that name, with the
algorithm and key scope: so these counters outlive a restart and follow
a failover as rules' buckets do.
"""

from __future__ import annotations

import builtins  # RuleRegistry.list() hides the builtin in its annotations
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from fastlimit.regions.shares import Regions, rebalance_floor
from fastlimit.rules.files import load_rules_file
from fastlimit.rules.matching import MatchIndex, compile_row, crowding
from fastlimit.rules.model import (
    MAX_RULES_PER_REQUEST,
    Rule,
    RuleError,
    check_rule_id,
    parse_rule,
    show,
)
from fastlimit.rules.store import RuleStore, StoredRule, StoreError, wall_ms

SOURCE_COMMAND = "command"
SOURCE_FILE = "file"
SOURCE_RESERVED = "reserved"
# No rule id starts with it (model.RULE_ID).
RESERVED_PREFIX = "@"
STAT_FIELDS = ("allowed", "denied", "shadow_denied")
# A home rule's allowance's reserved name is this and the rule's id.
ALLOWANCE = RESERVED_PREFIX + "home-allowance:"
ALLOWANCE_SCOPE = "home-allowance"
# The number vet() indexes rules under while it looks (never an engine's).
VETTED = 0

log = logging.getLogger("fastlimit.rules")


@dataclass(frozen=True)
class Entry:
    """A rule in force."""
    rule: Rule
    num: int
    source: str
    updated_ms: int
    version: int = 0      # the row's version in a PostgreSQL store, else 0


@dataclass(frozen=True)
class Change:
    rule_id: str
    old: Entry | None      # None: a new rule
    new: Entry | None      # None: deleted

    @property
    def new_number(self) -> bool:
        return self.new is not None and (self.old is None or self.old.num != self.new.num)

    @property
    def retired(self) -> int | None:
        """The number this change stops using, if any."""
        if self.old is not None and (self.new is None or self.new.num != self.old.num):
            return self.old.num
        return None


class RuleRegistry:
    def __init__(self, engine, store: RuleStore | None = None,
                 rules_file: str | None = None, *, now_ms=wall_ms,
                 regions: Regions | None = None):
        self.engine = engine
        # This tier's region, for static rules' shares (README, "Regions"),
        # and whether a peer region is unreachable (global rules' policy).
        self.regions = regions
        self.partitioned = False
        # rebalanced static rules: the share each holds here, in thousandths
        # (regions/rebalance.py); a rule not in it holds the floor
        self.held_shares: dict[str, int] = {}
        # whether they are rebalanced at all (not where either side is a
        # cluster: regions/subsystem.py); if not, each holds its static share
        self.rebalancing = True
        self.store = store
        self.rules_file = rules_file
        self.now_ms = now_ms
        self.version = 0
        self.last_change_ms = 0
        self._entries: dict[str, Entry] = {}
        self._entry_by_num: dict[int, Entry] = {}
        self._index = MatchIndex()
        self._next_num = 1
        # Every number ever given, so a denial sampled before a rule was
        # deleted or replaced still names it.
        self._id_by_num: dict[int, str] = {}
        # Counts of a rule's retired numbers, so its counters survive a
        # change of algorithm.
        self._stats_base: dict[str, Counter] = {}
        # name -> (number, algorithm, scope): see "Reserved numbers".
        self._reserved: dict[str, tuple[int, str, str]] = {}
        # home rules' local allowances (README, "Home rules"): the rule's
        # number -> its allowance's, reserved as ALLOWANCE + the rule's id
        self._allowances: dict[int, int] = {}
        # Called after every published change (replication sends the rules).
        self.on_change = None
        # Reads of the rules file begun (here or in a thread): one made in
        # a thread is stale once another began after it.
        self.file_reads = 0

    # ---- start and reload -----------------------------------------------------------

    def start(self, load_file: bool = True) -> None:
        """Loads the database, then the rules file (which wins for the ids
        it declares; not with load_file False: a shared store writes it to
        its table instead).  Raises RuleError (StoreError for the database)
        if either cannot be used: the server should refuse to start rather
        than run without rules it was given."""
        self.engine.set_matcher(self.matcher)
        stored = self.store.load() if self.store is not None else []
        try:
            self._commit([self._change(s.rule, s.source, None, s.updated_ms, s.version)
                          for s in stored], persist=False)
        except RuleError as e:
            assert self.store is not None     # only stored rules were committed
            raise StoreError(f"rules database {self.store.path}: {e}") from None
        log.info("rules: %d loaded from the database", len(stored))
        if self.rules_file and load_file:
            summary = self.reload()
            log.info("rules: rules file %s: %s", self.rules_file, _summary_text(summary))

    def reload(self, read: Callable[[], dict[str, Rule]] | None = None) -> dict:
        """Re-reads the rules file, all or nothing: its rules replace those
        of the same ids; rules that came from it and are gone from it are
        deleted; rules set by CL.RULE SET and not in it stay.  A file that
        fails to parse or validate changes nothing and raises RuleError.
        Returns counts: added, updated, deleted, unchanged.  read gives
        the file's rules when they were read beforehand, in a thread
        (load_rules_file; it raises what that raised); None: read now."""
        puts, deletes, summary = self.file_plan(read)
        self._commit([self._change(rule, SOURCE_FILE, self._entries.get(rule.id))
                      for rule in puts] +
                     [Change(rule_id, self._entries[rule_id], None) for rule_id in deletes])
        return summary

    def file_plan(self, read: Callable[[], dict[str, Rule]] | None = None
                  ) -> tuple[builtins.list[Rule], builtins.list[str], dict]:
        """What a reload of the rules file changes (read: see reload): the
        rules to put, the ids to delete, and the counts."""
        if not self.rules_file:
            raise RuleError("no rules file is configured (rules-file)")
        if read is None:
            self.file_reads += 1
            wanted = load_rules_file(self.rules_file)
        else:
            wanted = read()
        puts, summary = [], Counter(added=0, updated=0, deleted=0, unchanged=0)
        for rule_id, rule in wanted.items():
            old = self._entries.get(rule_id)
            if old is not None and old.rule == rule and old.source == SOURCE_FILE:
                summary["unchanged"] += 1
                continue
            summary["updated" if old else "added"] += 1
            puts.append(rule)
        deletes = [rule_id for rule_id, old in self._entries.items()
                   if old.source == SOURCE_FILE and rule_id not in wanted]
        summary["deleted"] = len(deletes)
        return puts, deletes, dict(summary)

    def reload_from_signal(self, read: Callable[[], dict[str, Rule]] | None = None) -> bool:
        """SIGHUP: reload (read: see reload) and log the outcome; a failure
        is logged and the rules in force stay.  Returns whether the reload
        succeeded."""
        if not self.rules_file:
            log.warning("SIGHUP: no rules file is configured; rules unchanged")
            return False
        try:
            summary = self.reload(read)
        except RuleError as e:
            log.warning("rules reload failed, the rules in force are unchanged: %s", e)
            return False
        log.warning("rules file %s reloaded: %s (rules version %d)",
                    self.rules_file, _summary_text(summary), self.version)
        return True

    def mirror(self, rules) -> None:
        """Makes the rules in force exactly `rules`, rows of (id, JSON,
        source, updated_ms) as ``export`` gives them: a replica following
        its primary.  Persisted like any change, so a promoted replica
        keeps them."""
        wanted = {rule_id: (parse_rule(rule_id, doc), source, updated_ms)
                  for rule_id, doc, source, updated_ms in rules}
        changes = []
        for rule_id, (rule, source, updated_ms) in wanted.items():
            old = self._entries.get(rule_id)
            if old is None or old.rule != rule or old.source != source:
                changes.append(self._change(rule, source, old, updated_ms))
        changes.extend(Change(rule_id, old, None) for rule_id, old in self._entries.items()
                       if rule_id not in wanted)
        self._commit(changes)

    def apply_stored(self, rows) -> builtins.list[tuple[str, int, str]]:
        """Makes the rules of these ids what a shared store holds: rows of
        (id, parsed, version, source, updated_ms) where parsed is the Rule,
        None for a rule that is gone, or the reason the row's document does
        not validate (parse_stored).  A row whose version is the one in
        force changes nothing.  Each row is applied all or nothing; a row
        that does not validate, or that the batch cannot take, is not
        applied (its rule keeps the version in force, or stays absent) and
        is returned as (id, version, reason) while the others apply."""
        changes, rejected = [], []
        for rule_id, parsed, version, source, updated_ms in rows:
            old = self._entries.get(rule_id)
            if parsed is None:
                if old is not None:
                    changes.append(Change(rule_id, old, None))
            elif isinstance(parsed, str):
                rejected.append((rule_id, version, parsed))
            elif old is None or old.version != version:
                changes.append(self._change(parsed, source, old, updated_ms, version))
        try:
            self._commit(changes)
        except RuleError:
            # One by one, so that one row the batch cannot take (too many
            # rules per request) keeps no other out.
            for change in changes:
                try:
                    self._commit([change])
                except RuleError as e:
                    new = change.new
                    rejected.append((change.rule_id, new.version if new else 0, str(e)))
        return rejected

    def vet(self, rules: builtins.list[Rule]) -> None:
        """Raises the RuleError that setting these (validated) rules would
        raise for too many rules per request, and changes nothing: a shared
        store's writer checks a change before it commits it to the table
        that every node applies.  No engine number is taken (numbers are
        never given twice, and the engine's table grows with the highest)."""
        changes = [Change(rule.id, self._entries.get(rule.id),
                          Entry(rule, VETTED, SOURCE_COMMAND, 0)) for rule in rules]
        undo_index = self._index_batch(changes)
        try:
            self._check_crowding(changes)
        finally:
            undo_index()

    def export(self) -> list[tuple[str, str, str, int]]:
        """The rules in force as ``mirror`` takes them."""
        return [(rule_id, e.rule.to_json(), e.source, e.updated_ms)
                for rule_id, e in sorted(self._entries.items())]

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    # ---- one rule -----------------------------------------------------------------

    def set(self, rule_id: str, doc, source: str = SOURCE_COMMAND) -> Rule:
        """Validates, persists and applies one rule; an invalid rule (or a
        failed write) raises RuleError and changes nothing."""
        old = self._entries.get(rule_id)
        new = self._new_entry(parse_rule(rule_id, doc), source, old)
        if old is None or old.rule != new.rule or old.source != source:
            self._commit([Change(rule_id, old, new)])
        return new.rule

    def get(self, rule_id: str) -> Rule | None:
        entry = self._entries.get(rule_id)
        return entry.rule if entry else None

    def entry(self, rule_id: str) -> Entry | None:
        return self._entries.get(rule_id)

    def delete(self, rule_id: str) -> bool:
        old = self._entries.get(rule_id)
        if old is None:
            return False
        self._commit([Change(rule_id, old, None)])
        return True

    def list(self) -> list[Rule]:
        return [entry.rule for entry in self.entries()]

    def entries(self) -> builtins.list[Entry]:
        """The entries in force, by rule id."""
        return [self._entries[rule_id] for rule_id in sorted(self._entries)]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_by_id(self) -> dict[str, int]:
        return {rule_id: e.num for rule_id, e in self._entries.items()}

    @property
    def rule_by_num(self) -> dict[int, Rule]:
        return {e.num: e.rule for e in self._entries.values()}

    def rule_for_num(self, num: int) -> Rule | None:
        """The rule in force with this engine number, if any."""
        entry = self._entry_by_num.get(num)
        return entry.rule if entry is not None else None

    def num_for(self, rule_id: str) -> int | None:
        """The engine number of a rule in force (for checks by rule id)."""
        entry = self._entries.get(rule_id)
        return entry.num if entry is not None else None

    def number_of(self, name: str) -> int | None:
        """The engine number of a rule in force or of a reservation, by
        its id or reserved name (what another region names a bucket's
        rule by)."""
        held = self._reserved.get(name)
        return held[0] if held is not None else self.num_for(name)

    def reserve(self, name: str, algorithm: str, scope: str) -> int:
        """The engine number reserved under a name (RESERVED_PREFIX and the
        part's own name): the same one for as long as the name is
        reserved with the same algorithm and scope, which snapshots and
        replication then carry.  The caller defines it in the engine."""
        assert name.startswith(RESERVED_PREFIX)
        held = self._reserved.get(name)
        if held is not None and held[1:] == (algorithm, scope):
            return held[0]
        num = self._take_number()
        self._reserved[name] = (num, algorithm, scope)
        self._id_by_num[num] = name
        if self.on_change is not None:
            self.on_change()
        return num

    def release(self, name: str) -> None:
        """Ends a reservation; the caller forgets the number in the engine."""
        if self._reserved.pop(name, None) is not None and self.on_change is not None:
            self.on_change()

    def carried(self) -> dict[int, tuple[str, str, str]]:
        """Every number whose buckets snapshots and replication carry:
        number -> (rule id or reserved name, algorithm, scope)."""
        numbers = {e.num: (rule_id, e.rule.algorithm, e.rule.scope)
                   for rule_id, e in self._entries.items()}
        numbers.update((num, (name, algorithm, scope))
                       for name, (num, algorithm, scope) in self._reserved.items())
        return numbers

    def reserved_rows(self) -> builtins.list[tuple[int, str, str, str, int]]:
        """The reservations as replication's rules frame lists them
        (number, name, algorithm, SOURCE_RESERVED, 0) beside the rules'
        (number, id, JSON, source, updated_ms)."""
        return [(num, name, algorithm, SOURCE_RESERVED, 0)
                for name, (num, algorithm, _) in sorted(self._reserved.items())]

    def rule_id(self, num: int) -> str:
        """The id of the rule that has or had this number (CL.LIMIT DETAIL,
        denial samples); the number itself if it was never given."""
        return self._id_by_num.get(num, str(num))

    # ---- the batch --------------------------------------------------------------------

    def _change(self, rule: Rule, source: str, old: Entry | None,
                updated_ms: int | None = None, version: int = 0) -> Change:
        return Change(rule.id, old, self._new_entry(rule, source, old, updated_ms, version))

    def _new_entry(self, rule: Rule, source: str, old: Entry | None,
                   updated_ms: int | None = None, version: int = 0) -> Entry:
        """The entry a rule replacing old makes: old's number and buckets
        (re-split to the new k) while the algorithm and scope stay."""
        if old is not None and old.rule.algorithm == rule.algorithm \
                and old.rule.scope == rule.scope:
            num = old.num
            rule = rule.resplit(old.rule)
        else:
            num = self._take_number()
        stamp = self.now_ms() if updated_ms is None else updated_ms
        return Entry(rule, num, source, stamp, version)

    def _take_number(self) -> int:
        num = self._next_num
        self._next_num += 1
        return num

    def _commit(self, changes: builtins.list[Change], persist: bool = True) -> None:
        """Applies a batch all or nothing: on any failure (a rule the
        engine refuses, too many rules per request, the database, or
        anything unforeseen) the match index, the engine and the database
        are as they were, and the error is a RuleError."""
        if not changes:
            return
        undo_index = self._index_batch(changes)
        staged = False
        try:
            self._check_crowding(changes)
            self._stage(changes)
            staged = True
            if persist and self.store is not None:
                self.store.write(
                    puts=[StoredRule(c.new.rule, c.new.source, c.new.updated_ms,
                                     c.new.version)
                          for c in changes if c.new is not None],
                    deletes=[c.rule_id for c in changes if c.new is None])
        except BaseException as e:
            if staged:
                self._unstage(changes)
            undo_index()
            if isinstance(e, RuleError) or not isinstance(e, Exception):
                raise
            log.exception("rule change failed; the rules in force are unchanged")
            raise RuleError(f"the rule change failed ({show(str(e), 200)}); "
                            "the rules in force are unchanged") from None
        self._publish(changes)

    def _index_batch(self, changes: builtins.list[Change]):
        """Puts the batch's rows in the match index (each compiled once,
        before anything changes, so compiling cannot leave half a batch);
        returns the function that takes them out again."""
        rows = [compile_row(c.new.rule, c.new.num) for c in changes if c.new is not None]
        removed = self._index.update([c.rule_id for c in changes if c.old is not None], rows)

        def undo():
            self._index.update([row.rule_id for row in rows], removed)
        return undo

    def _check_crowding(self, changes: builtins.list[Change]) -> None:
        """Refuses a batch after which some request could match more than
        the engine's MAX_RULES_PER_REQUEST rules (CL.LIMIT would then fail
        for it, and clients fail open): what is acknowledged must be
        enforceable.  Only requests that a changed rule matches are looked
        at; a rule only ever meets the rules whose resource globs overlap
        its own."""
        index = self._index
        changed = {c.rule_id for c in changes if c.new is not None}
        if len(changed) > MAX_RULES_PER_REQUEST:    # a load or reload: one sweep of all
            rows = list(index.rows.values())
        else:
            # Most rules cannot reach the limit even counting every rule
            # their resource glob may meet: only the others need the sweep.
            changed = {rule_id for rule_id in changed
                       if index.sharing_bound(index.rows[rule_id]) > MAX_RULES_PER_REQUEST}
            seen = {}
            for rule_id in changed:
                for row in index.overlapping(index.rows[rule_id]):
                    seen[row.rule_id] = row
            rows = list(seen.values())
        crowded = crowding(rows, changed)
        if crowded is not None:
            rule_id, count, prefix = crowded
            where = (f"resource '{show(prefix.decode('utf-8', 'replace'))}...'" if prefix
                     else "any resource")
            raise RuleError(
                f"invalid rule '{rule_id}': {count} rules could match one request "
                f"({where}), and a request is checked against at most "
                f"{MAX_RULES_PER_REQUEST}: narrow the match of this rule or of the "
                "rules it overlaps")

    def _stage(self, changes: builtins.list[Change]) -> None:
        """Defines every new or changed rule in the engine.  New numbers are
        not reachable until published; a kept number takes its new spec
        now, and is put back if a later rule of the batch is refused."""
        staged: builtins.list[Change] = []
        for change in changes:
            if change.new is None:
                continue
            try:
                self.engine.define(change.new.num, self._spec(change.new.rule))
            except BaseException as e:
                self._unstage(staged)
                if isinstance(e, ValueError):
                    raise RuleError(f"invalid rule '{change.rule_id}': {e}") from None
                raise
            staged.append(change)

    def _spec(self, rule: Rule) -> dict:
        """The rule's engine spec here and now; a global rule's partition
        share is worked out either way, so that a rule whose share cannot
        be a rule is refused now rather than at a partition, and while
        partitioned carries the whole rule's numbers, which other regions'
        spends are debited against."""
        if rule.rebalance and self.regions is not None and self.rebalancing:
            floor = rebalance_floor(len(self.regions.names))
            rule.engine_spec(self.regions, held=floor)      # the floor must hold a token
            return rule.engine_spec(self.regions, held=self.held_shares.get(rule.id, floor))
        if rule.regions != "global" or self.regions is None:
            return rule.engine_spec(self.regions)
        whole, apart = rule.engine_spec(self.regions), rule.engine_spec(self.regions, True)
        return dict(apart, whole=whole) if self.partitioned else whole

    def hold_share(self, rule_id: str, thousandths: int) -> None:
        """A rebalanced static rule's share here, as the coordinator's
        latest word says; its buckets are kept.  Kept even for a rule not
        (or no longer) rebalanced here, as what it may hold if it comes
        back (never more than it was granted).  A share the rule's numbers
        cannot express (a refill period out of range) is rounded down to
        one they can, which is always safe; the floor always can."""
        self.held_shares[rule_id] = thousandths
        entry = self._entries.get(rule_id)
        if entry is None or not entry.rule.rebalance or self.regions is None or \
                not self.rebalancing:
            return
        floor = rebalance_floor(len(self.regions.names))
        for held in range(thousandths, floor - 1, -1):
            try:
                spec = entry.rule.engine_spec(self.regions, held=held)
            except ValueError:
                continue
            self.held_shares[rule_id] = held
            self.engine.define(entry.num, spec)
            return

    def set_rebalancing(self, on: bool) -> None:
        """Rebalanced rules follow the coordinator's shares, or (off) hold
        their static shares; their buckets are kept."""
        if on == self.rebalancing:
            return
        self.rebalancing = on
        for entry in self._entries.values():
            if entry.rule.rebalance:
                self.engine.define(entry.num, self._spec(entry.rule))

    def per_resource(self, num: int) -> bool:
        """Whether the buckets of rule num are per client and resource."""
        entry = self._entry_by_num.get(num)
        return entry is not None and entry.rule.scope == "client+resource"

    def repartition(self, partitioned: bool) -> None:
        """Global rules under their partition policy, or whole again: the
        same numbers, so their buckets are kept."""
        self.partitioned = partitioned
        for entry in self._entries.values():
            if entry.rule.regions == "global":
                self.engine.define(entry.num, self._spec(entry.rule))

    def _unstage(self, changes: builtins.list[Change]) -> None:
        # Lossless, as no check runs in between: buckets are capped to a
        # capacity lazily, at the next check.  The one exception is a
        # concurrency rule whose limit changed: the engine starts its
        # leases afresh on a new limit, and putting the old one back does too.
        for change in reversed(changes):
            if change.new is None:
                continue
            if change.new_number:
                self.engine.forget(change.new.num)
            elif change.old is not None:     # always: a kept number was the old entry's
                self.engine.define(change.old.num, self._spec(change.old.rule))

    def _publish(self, changes: builtins.list[Change]) -> None:
        # Plain dict updates only: nothing here can fail halfway.
        for change in changes:
            if change.old is not None:
                del self._entry_by_num[change.old.num]
            if change.new is None:
                del self._entries[change.rule_id]
                self._stats_base.pop(change.rule_id, None)
            else:
                self._entries[change.rule_id] = change.new
                self._entry_by_num[change.new.num] = change.new
                self._id_by_num[change.new.num] = change.rule_id
                if change.retired is not None:
                    self._carry_stats(change.rule_id, change.retired)
        self.engine.invalidate()
        for change in changes:
            if change.retired is not None:
                self.engine.forget(change.retired)
            self._hold_allowance(change)
        self.version += 1
        self.last_change_ms = self.now_ms()
        if self.on_change is not None:
            self.on_change()

    def _hold_allowance(self, change: Change) -> None:
        """A home rule's allowance: its own engine number, reserved under
        the rule's id while the rule has one (its buckets kept across a
        change of the allowance's size), forgotten with it.  The spec was
        validated with the rule, so defining it cannot fail."""
        name = ALLOWANCE + change.rule_id
        if change.old is not None:
            self._allowances.pop(change.old.num, None)
        spec = change.new.rule.allowance_spec() if change.new is not None else None
        held = self._reserved.get(name)
        if held is not None and (spec is None or held[1] != spec["algorithm"]):
            self.engine.forget(held[0])
            self.release(name)
        if spec is not None:
            assert change.new is not None
            num = self.reserve(name, spec["algorithm"], ALLOWANCE_SCOPE)
            self.engine.define(num, spec)
            self._allowances[change.new.num] = num
        self.engine.home_allowing = bool(self._allowances)

    def allowances(self, nums: builtins.list[int]) -> builtins.list[int] | None:
        """The rule numbers of a check whose home region is unreachable,
        each home rule's replaced by its allowance's; None if a home rule
        among them has none (the failure policy answers)."""
        out = []
        for num in nums:
            entry = self._entry_by_num.get(num)
            if entry is not None and entry.rule.regions == "home":
                num = self._allowances.get(num, 0)
                if not num:
                    return None
            out.append(num)
        return out

    def _carry_stats(self, rule_id: str, retired: int) -> None:
        base = self._stats_base.setdefault(rule_id, Counter())
        base.update(self.engine.stats(retired))

    # ---- matching -----------------------------------------------------------------------

    def matcher(self, resource: bytes,
                tier: bytes | None) -> builtins.list[tuple[int, bytes | None]]:
        """The engine's matcher: (number, client glob) of every rule whose
        resource glob and tier match, in rule id order.  A rule without a
        tier matches any tier and none; a rule with one only that tier."""
        return [(row.num, row.client) for row in self._index.lookup(resource, tier)]

    # ---- observing ------------------------------------------------------------------------

    def stats(self, rule_id: str) -> dict[str, int] | None:
        entry = self._entries.get(rule_id)
        if entry is None:
            return None
        counts = self.engine.stats(entry.num)
        base = self._stats_base.get(rule_id)
        return {name: counts[name] + (base[name] if base else 0) for name in STAT_FIELDS}

    def denials(self, count: int | None = None) -> builtins.list[tuple[int, str, bytes, int]]:
        """Recent denials, newest first: (time_ms, rule id, key, cost)."""
        # The sample is in arrival order; reversing before the stable sort
        # keeps the newest first among denials of the same millisecond.
        sample = sorted(reversed(self.engine.denials()), key=lambda d: d[0], reverse=True)
        if count is not None:
            sample = sample[:count]
        return [(time_ms, self.rule_id(num), key, cost)
                for time_ms, num, key, cost in sample]

    def info(self, per_rule: bool = False) -> dict:
        """The INFO "rules" section: counts, and with per_rule one rule<i>
        line per rule (only for INFO rules: with many rules they are
        large), as Redis does for replicas (slave0:...), because rule ids
        may hold ':' and an INFO field name may not."""
        out = {"rules": len(self._entries), "rules_version": self.version,
               "rules_last_change_ms": self.last_change_ms,
               "rules_file": self.rules_file or "",
               "rules_db": self.store.path if self.store is not None else ""}
        if per_rule:
            for i, rule_id in enumerate(sorted(self._entries)):
                entry = self._entries[rule_id]
                stats = self.stats(rule_id)
                assert stats is not None     # the rule is in self._entries
                out[f"rule{i}"] = (f"id={rule_id},algorithm={entry.rule.algorithm},"
                                   f"mode={entry.rule.mode},source={entry.source},"
                                   + ",".join(f"{k}={stats[k]}" for k in STAT_FIELDS))
        return out


def parse_stored(rule_id: str, doc: str | None) -> Rule | str | None:
    """A shared store's row as apply_stored takes it: the Rule, None for
    no document (the rule is gone), or why the document does not validate."""
    if doc is None:
        return None
    try:
        return parse_rule(check_rule_id(rule_id), doc)
    except RuleError as e:
        return str(e)


def _summary_text(summary: dict) -> str:
    return ", ".join(f"{n} {what}" for what, n in summary.items())


__all__ = ["RuleRegistry", "Entry", "SOURCE_COMMAND", "SOURCE_FILE"]
