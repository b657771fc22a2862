"""ShouldRateLimit's decision, as envoyproxy/ratelimit makes it
(src/service/ratelimit.go, src/limiter/base_limiter.go,
src/redis/fixed_cache_impl.go), on fastlimit's engine.  No asyncio, no
network: the gRPC front (and CL.RLS, and /json) call should_rate_limit.

The counters are rules of the server's RuleEngine (so INFO memory, the
sweep and BGSAVE see them as any rule's buckets):

- the reference's fixed window is an exact counter: an engine
  fixed_window rule per window length whose limit (10^15) is never
  reached, so every hit is counted as Redis's INCRBY counts it, even when
  over; the comparison with requests_per_unit is made here.  The engine
  is asked at the window's last millisecond (windows are aligned to the
  Unix epoch, as the engine's and the reference's are), which changes
  nothing for a window the engine can hold and lets one longer than its
  49.7 days (a year) be counted in a single engine window that ends after
  it: the next window's last millisecond is in another engine window,
  where the count starts over;
- token_bucket, gcra and sliding_window limits are engine rules with the
  limit's numbers, one per distinct set of numbers;

their numbers are reserved in the rule registry under names made of the
numbers that give the buckets their meaning (``@rls/token_bucket/100/60``),
so snapshots and replication carry these counters by name as they carry
rules' buckets by rule id: a restart or a failover keeps them;

a bucket's key is the domain, the descriptor's entries (a share_threshold
entry's pattern instead of its value) and the limit's index on its node,
length-prefixed so no two descriptors share one by accident.

Counting is the reference's by default: every matched limit of every
descriptor is counted, whatever the others say.  A domain with
``counting: atomic`` is fastlimit's all or nothing: every limit of the
request is read first, and only if the request passes is anything spent.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastlimit._load import PRIORITIES, priority_value
from fastlimit._rules import home_index
from fastlimit.regions.shares import Regions
from fastlimit.rls.config import (
    EMPTY,
    UNIT_SECONDS,
    Limit,
    Node,
    RlsConfig,
    counter_key,
    with_regions,
)
from fastlimit.rls.matcher import find_limit
from fastlimit.structured_fields import sf_string

OK, OVER_LIMIT = 1, 2
MAX_UINT32 = 2**32 - 1
# The reference counter's engine limit (the engine's largest): never reached.
COUNTER_LIMIT = 10**15
MAX_ENGINE_WINDOW_MS = 2**32 - 1      # fl_native.h MAX_PERIOD_MS
NO_MATCH = (OK, None, 0, 0)
RESERVED_SCOPE = "rls"
# Redis's words, as the reference passes on its Redis's refusal.
READONLY = "READONLY You can't write against a read only replica."
UNLIMITED = (OK, None, MAX_UINT32, 0)
# A descriptor entry that sets the request's priority for shedding (README,
# "Overload"); it is taken out before matching. Envoy sets it with a
# generic_key action's descriptor_key.  A shed request is allowed, as the
# reference's users fail open, and says so in a response header.
PRIORITY_ENTRY = b"x-fastlimit-priority"
NORMAL = PRIORITIES.index("normal")
SHED_HEADER = (b"x-fastlimit-shed", b"1")


class RlsError(Exception):
    """A request the service refuses: sent as gRPC status UNKNOWN (2) with
    this message, as the reference does."""


class RlsHome(Exception):
    """A request with a home limit whose descriptor lives in another
    region (`home`, an index of the regions), which answers the whole
    request (README "Home rules"): the front asks it over the region link
    (regions/subsystem.py ask_home_rls)."""

    def __init__(self, home: int):
        super().__init__(f"the request's home region ({home}) is another region")
        self.home = home


def engine_spec(algorithm: str, rpu: int, window_s: int, split: int = 1,
                region_sync: bool = False) -> dict:
    """The engine rule a limit counts in; a global limit's (region_sync)
    logs its spends for the other regions."""
    window_ms = window_s * 1000
    if algorithm == "fixed_window":
        spec = {"algorithm": "fixed_window", "limit": COUNTER_LIMIT,
                "window_ms": min(window_ms, MAX_ENGINE_WINDOW_MS)}
        return dict(spec, region_sync=True) if region_sync else spec
    if algorithm == "token_bucket":
        spec = {"algorithm": "token_bucket", "capacity": rpu, "refill": rpu,
                "period_ms": window_ms}
    elif algorithm == "gcra":
        spec = {"algorithm": "gcra", "burst": rpu - 1, "count": rpu, "period_ms": window_ms}
    else:
        spec = {"algorithm": "sliding_window", "limit": rpu, "window_ms": window_ms}
    if region_sync:
        spec["region_sync"] = True
    return dict(spec, split=split) if split > 1 else spec


def bucket_key(domain: bytes, entries, shares) -> bytes:
    """The descriptor's part of its buckets' keys (a limit's index follows):
    length-prefixed, so no two descriptors share one by accident."""
    parts = [b"%d:%s" % (len(domain), domain)]
    for i, (k, v) in enumerate(entries):
        if shares is not None and shares[i] is not None:
            v = shares[i]
        parts.append(b"%d:%s%d:%s" % (len(k), k, len(v), v))
    return b"".join(parts)


def override_limit(domain: bytes, entries, rpu: int, unit: int) -> Limit:
    """The descriptor's `limit` from Envoy: no shadow mode, no name."""
    if unit not in UNIT_SECONDS:
        raise RlsError(f"invalid rate limit unit {unit} in the descriptor's limit")
    key = ".".join((k + b"_" + v if v else k).decode("utf-8", "replace") for k, v in entries)
    window_s = UNIT_SECONDS[unit]
    return Limit(rpu, unit, b"", False, False, False, frozenset(), "fixed_window",
                 window_s, domain.decode("utf-8", "replace") + "." + key, 0,
                 counter_key("fixed_window", rpu, window_s))


class DomainStats:
    __slots__ = ("calls", "over_limit", "shadow", "limits_over")

    def __init__(self):
        self.calls = self.over_limit = self.shadow = self.limits_over = 0


# The reference's NEAR_LIMIT_RATIO default.
NEAR_LIMIT_RATIO = 0.8
LIMIT_STAT_FIELDS = ("total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode")


class LimitStats:
    """One configured limit's hits as the reference's stats count them
    (base_limiter.go), kept across reloads by the limit's name: hits, not
    calls, and no series per descriptor value."""
    __slots__ = LIMIT_STAT_FIELDS

    def __init__(self):
        self.total_hits = self.within_limit = self.near_limit = 0
        self.over_limit = self.shadow_mode = 0

    def count(self, rpu: int, before: int, hits: int, over: bool) -> None:
        """before: what the limit had used before these hits."""
        near = int(rpu * NEAR_LIMIT_RATIO)
        after = before + hits
        self.total_hits += hits
        if over:
            if before >= rpu:
                self.over_limit += hits
            else:
                self.over_limit += after - rpu
                self.near_limit += rpu - max(near, before)
        else:
            self.within_limit += hits
            if after > near:
                self.near_limit += hits if before >= near else after - near


@dataclass(eq=False)
class Prepared:
    """A configuration ready to be put in force (RateLimitService.prepare)."""
    config: RlsConfig
    counters: dict          # counter_key -> (a limit counting in it, its file)
    stats: dict             # domain -> DomainStats, the old ones kept
    limit_stats: dict       # (domain, full_key, index) -> LimitStats, the old ones kept
    stats_of: dict          # Limit -> its LimitStats


class RateLimitService:
    def __init__(self, engine, registry, response_headers: bool = False,
                 read_only=lambda: False, shadow_mode: bool = False, load=None,
                 regions: Regions | None = None):
        """registry: where the counters' rule numbers are reserved
        (rules.registry.RuleRegistry); read_only: whether this server is a
        standby now, which counts nothing (its primary's counts replace
        its own); load: the server's saturation meter (_load.LoadMeter),
        which sheds requests by their priority, or None; regions: this
        tier's region, whose share of each static limit it enforces."""
        self.load = load
        self.regions = regions
        self.engine = engine
        self.clock = engine.clock
        self.registry = registry
        self.read_only = read_only
        self.response_headers = response_headers
        # the reference's SHADOW_MODE: a refused request is answered OK
        self.shadow_mode = shadow_mode
        self.global_shadow_mode = 0     # requests it let through
        self.config: RlsConfig = EMPTY
        self._num_by_spec: dict[tuple, int] = {}    # counter_key -> engine rule number
        self.stats: dict[bytes, DomainStats] = {}
        # by (domain, limit name, index): what survives a reload
        self.limit_stats: dict[tuple[bytes, str, int], LimitStats] = {}
        self._stats_of: dict[Limit, LimitStats] = {}
        self.unknown_domain = 0
        # home limits: whether the configuration has any (else no request
        # looks for its home), and whether requests run here whatever their
        # home (one another region asked this one to answer)
        self.has_home = False
        self.home_local = False

    # ---- configuration ---------------------------------------------------------

    def set_config(self, config: RlsConfig) -> None:
        """Puts a loaded configuration in force (see install)."""
        self.install(self.prepare(config))

    def prepare(self, config: RlsConfig) -> Prepared:
        """Everything a configuration needs before it is put in force that
        takes time with its size: a walk of every limit.  It only reads
        the service, so it may run in another thread (the loaders'),
        provided install() comes after it and no other install between.
        Static limits become this region's share (ConfigError if one
        holds no request)."""
        config = with_regions(config, self.regions)
        counters: dict[tuple, tuple[Limit, str]] = {}
        limit_stats: dict[tuple[bytes, str, int], LimitStats] = {}
        stats_of: dict[Limit, LimitStats] = {}
        for name, domain in config.domains.items():
            for limit in walk_limits(domain.root):
                if limit.unlimited:
                    continue
                counters.setdefault(limit.counter, (limit, domain.source))
                at = (name, limit.full_key, limit.index)
                stats_of[limit] = limit_stats[at] = self.limit_stats.get(at) or LimitStats()
        stats = {name: self.stats.get(name) or DomainStats() for name in config.domains}
        return Prepared(config, counters, stats, limit_stats, stats_of)

    def install(self, prepared: Prepared) -> None:
        """Puts a prepared configuration in force in one step, its engine
        rules defined first (one per counter: a few, whatever the number of
        descriptors); all or nothing: ValueError if the engine refuses one,
        and the old configuration stays.  Rules the old one used and the
        new one does not are retired."""
        num_by_spec = dict(self._num_by_spec)
        created: list[tuple] = []
        try:
            for limit, source in prepared.counters.values():
                self._number(num_by_spec, created, limit, source)
        except ValueError:
            for spec_key in created:
                self.engine.forget(num_by_spec[spec_key])
                self.registry.release(reserved_name(spec_key))
            raise
        for spec, num in list(num_by_spec.items()):
            if spec not in prepared.counters and spec[0] != "fixed_window":
                self.engine.forget(num)
                self.registry.release(reserved_name(spec))
                del num_by_spec[spec]
        self.config, self._num_by_spec = prepared.config, num_by_spec
        self.has_home = self.regions is not None and any(
            limit.regions == "home" for limit, _ in prepared.counters.values())
        self.stats = prepared.stats
        self.limit_stats, self._stats_of = prepared.limit_stats, prepared.stats_of

    def _number(self, num_by_spec, created, limit: Limit, source: str) -> int:
        """The number of the engine rule limit counts in, defined now if
        no limit used it yet."""
        spec_key = limit.counter
        num = num_by_spec.get(spec_key)
        if num is None:
            name = reserved_name(spec_key)
            num = self.registry.reserve(name, limit.algorithm, RESERVED_SCOPE)
            try:
                self.engine.define(num, engine_spec(limit.algorithm, limit.requests_per_unit,
                                                   limit.window_s, limit.split,
                                                   limit.regions == "global"))
            except ValueError as e:
                self.registry.release(name)
                raise ValueError(f"{source}: {limit.full_key}: {e}") from None
            created.append(spec_key)
            num_by_spec[spec_key] = num
        return num

    def override_number(self, limit: Limit) -> int:
        return self._number(self._num_by_spec, [], limit, "descriptor limit")

    # ---- the decision ----------------------------------------------------------

    def should_rate_limit(self, domain: bytes, descriptors, hits_addend: int):
        """(overall_code, statuses, response_headers_to_add) or RlsError."""
        if not domain:
            raise RlsError("rate limit domain must not be empty")
        if not descriptors:
            raise RlsError("rate limit descriptor list must not be empty")
        dom = self.config.domains.get(domain)
        if dom is None:
            self.unknown_domain += 1
            return OK, [NO_MATCH] * len(descriptors), []
        descriptors, priority = take_priority(descriptors)
        if self.load is not None and self.load.shed(priority):
            return OK, [NO_MATCH] * len(descriptors), [SHED_HEADER]
        request_hits = max(1, hits_addend)
        spent = [min(max(0, d_hits if d_hits is not None else request_hits), COUNTER_LIMIT + 1)
                 for _, _, d_hits in descriptors]
        if any(spent) and self.read_only():
            raise RlsError(READONLY)
        matched = self.limits_to_check(dom, descriptors)
        if self.has_home and not self.home_local:
            home = self.home_elsewhere(domain, descriptors, matched)
            if home >= 0:
                raise RlsHome(home)
        now_ms = self.clock.now()
        atomic = dom.counting == "atomic"
        results = []   # per descriptor: (status, limit or None)
        commits: list[tuple[int, bytes, int, int]] = []
        for (entries, _, _), match, hits in zip(descriptors, matched, spent, strict=True):
            if match is None or match is True:
                results.append((UNLIMITED if match is True else NO_MATCH, None))
                continue
            limits, shares = match
            key = bucket_key(domain, entries, shares)
            steps = [self.step(key, limit, hits, now_ms, atomic, commits) for limit in limits]
            results.append(binding(steps))
        overall, quota_total, quota_over = OK, 0, 0
        stats = self.stats[domain]
        stats.calls += 1
        statuses = []
        for (status, limit), hits in zip(results, spent, strict=True):
            if limit is not None and status[0] == OVER_LIMIT:
                stats.limits_over += 1
                if limit.shadow_mode:
                    stats.shadow += 1
                    self._stats_of[limit].shadow_mode += hits
                    status = (OK,) + status[1:]
            statuses.append(status)
            if limit is not None and limit.quota_mode:
                quota_total += 1
                quota_over += status[0] == OVER_LIMIT
            elif status[0] == OVER_LIMIT:
                overall = OVER_LIMIT
        if quota_total and quota_total == quota_over:
            overall = OVER_LIMIT
        if atomic and overall == OK:
            for num, key, hits, at_ms in commits:
                self.engine.apply([num], key, hits, now_ms=at_ms)
        elif atomic:
            # nothing was spent: what passed shows what is left unspent
            statuses = [unspent(status, hits) for status, hits in zip(statuses, spent, strict=True)]
        if overall == OVER_LIMIT and self.shadow_mode:
            # after counting, as shouldRateLimitWorker does: the statuses
            # still say which descriptors are over
            overall = OK
            self.global_shadow_mode += 1
        if overall == OVER_LIMIT:
            stats.over_limit += 1
        headers = self.headers(results, overall) if self.response_headers else []
        return overall, statuses, headers

    def home_elsewhere(self, domain: bytes, descriptors, matched) -> int:
        """The region of the first home limit matched whose descriptor
        lives in another region (its "home", else the descriptor key's
        hash over the regions, as a home rule's client key), or -1."""
        regions = self.regions
        assert regions is not None
        here = regions.names.index(regions.name)
        for (entries, _, _), match in zip(descriptors, matched, strict=True):
            if match is None or match is True:
                continue
            limits, shares = match
            for limit in limits:
                if limit.regions != "home":
                    continue
                home = regions.names.index(limit.home) if limit.home is not None else \
                    home_index(bucket_key(domain, entries, shares), len(regions.names))
                if home != here:
                    return home
        return -1

    def limits_to_check(self, dom, descriptors) -> list:
        """constructLimitsToCheck: per descriptor (limits, shares), None
        (no limit) or True (unlimited); limits named by another matched
        limit's `replaces` are dropped."""
        matched: list = []
        replacing: frozenset = frozenset()
        for entries, override, _ in descriptors:
            if override is not None:
                matched.append(((override_limit(dom.name, entries, *override),), None))
                continue
            node, shares = find_limit(dom.root, entries)
            if node is None:
                matched.append(None)
                continue
            if node.replaces:
                replacing |= node.replaces
            matched.append(True if node.unlimited else (node.counted, shares))
        if replacing:
            for i, match in enumerate(matched):
                if match is None or match is True:
                    continue
                kept = tuple(lim for lim in match[0] if not lim.name or lim.name not in replacing)
                matched[i] = (kept, match[1]) if kept else None
        return matched

    def step(self, descriptor_key: bytes, limit: Limit, hits: int, now_ms: int,
             atomic: bool, commits: list):
        """One limit's count: ((code, current_limit, remaining, reset_s), limit)."""
        num = self._num_by_spec.get(limit.counter)
        if num is None:         # Envoy's descriptor limit, of a window no limit has
            num = self.override_number(limit)
        key = descriptor_key + b"%d" % limit.index
        cost = 0 if atomic else hits
        at_ms = now_ms
        if limit.algorithm == "fixed_window":
            window_ms = limit.window_s * 1000
            at_ms = now_ms - now_ms % window_ms + window_ms - 1
        try:
            allowed, _, remaining, retry_ms, reset_ms = self.engine.apply(
                [num], key, cost, now_ms=at_ms)
        except ValueError:
            raise RlsError("descriptor too long: its key must be at most 65535 bytes") from None
        now_s = now_ms // 1000
        if limit.algorithm == "fixed_window":
            after = COUNTER_LIMIT - remaining + (hits if cost == 0 or not allowed else 0)
            over = after > limit.requests_per_unit
            left = 0 if over else limit.requests_per_unit - after
            reset_s = limit.window_s - now_s % limit.window_s
            before = after - hits
        else:
            over = not allowed if not atomic else remaining < hits
            left = 0 if over else (remaining - hits if atomic else remaining)
            wait = retry_ms if over and retry_ms > 0 else reset_ms
            reset_s = max(1, -(-wait // 1000)) if wait >= 0 else limit.window_s
            spent_here = hits if allowed and cost else 0
            before = max(0, limit.requests_per_unit - remaining - spent_here)
        if atomic and not over and hits:
            commits.append((num, key, hits, at_ms))
        stats = self._stats_of.get(limit)       # None for Envoy's descriptor limit
        if stats is not None and hits:
            stats.count(limit.requests_per_unit, before, hits, over)
        return (OVER_LIMIT if over else OK, limit.current_limit, left, reset_s), limit

    # ---- response headers ------------------------------------------------------

    def headers(self, results, overall) -> list:
        """The IETF RateLimit-Policy and RateLimit fields of the most
        restrictive status (an over-limit one first, then the fewest
        remaining), as the HTTP front writes them, and Retry-After when
        the request is refused."""
        chosen = None
        for status, limit in results:
            if limit is None:
                continue
            if chosen is None or tighter(status, chosen[0]):
                chosen = (status, limit)
        if chosen is None:
            return []
        (code, _, remaining, reset_s), limit = chosen
        name = sf_string((limit.name or limit.full_key.encode()).decode("utf-8", "replace"))
        out = [(b"RateLimit-Policy",
                f"{name};q={limit.requests_per_unit};w={limit.window_s}".encode()),
               (b"RateLimit", f"{name};r={remaining};t={reset_s}".encode())]
        if overall == OVER_LIMIT:
            out.append((b"Retry-After", str(max(1, reset_s)).encode()))
        return out

    # ---- introspection ------------------------------------------------------------

    def info(self) -> dict:
        return {name.decode("utf-8", "replace"): s for name, s in self.stats.items()}


def reserved_name(spec_key: tuple) -> str:
    """(algorithm, requests_per_unit or 0, window_s) as the registry
    knows the counters' rule: the same numbers, the same name, in every
    process with the same limits."""
    return "@rls/" + "/".join(str(part) for part in spec_key)


def unspent(status, hits: int):
    if status[0] != OK or status[1] is None:
        return status
    return (OK, status[1], min(status[2] + hits, status[1][0]), status[3])


def tighter(a, b) -> bool:
    """Whether status a describes the request better than b: refused
    first (the longest wait), then the fewest remaining."""
    if (a[0] == OVER_LIMIT) != (b[0] == OVER_LIMIT):
        return a[0] == OVER_LIMIT
    if a[0] == OVER_LIMIT:
        return a[3] > b[3]
    return a[2] < b[2]


def binding(steps: list):
    """A descriptor's status from its limits' steps (one, unless the node
    has several limits)."""
    best = steps[0]
    for s in steps[1:]:
        if tighter(s[0], best[0]):
            best = s
    return best


def walk_limits(root: Node):
    """Every limit of a tree (without recursion: its depth is the file's)."""
    stack = [root]
    while stack:
        for child in stack.pop().children.values():
            yield from child.limits
            stack.append(child)


def take_priority(descriptors) -> tuple[list, int]:
    """The descriptors without their PRIORITY_ENTRY entries, and the
    highest priority those name (normal when none does); RlsError for a
    value that is not a priority."""
    if not any(key == PRIORITY_ENTRY for entries, _, _ in descriptors for key, _ in entries):
        return descriptors, NORMAL
    named = []
    kept = []
    for entries, override, hits in descriptors:
        for key, value in entries:
            if key == PRIORITY_ENTRY:
                priority = priority_value(value)
                if priority is None:
                    raise RlsError(f"{PRIORITY_ENTRY.decode()} must be low, normal or critical")
                named.append(priority)
        kept.append(([e for e in entries if e[0] != PRIORITY_ENTRY], override, hits))
    return kept, max(named)
