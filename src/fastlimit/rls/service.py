"""The configuration's side of ShouldRateLimit's decision, whose walk and
counting are in C (_rls.pyx, as envoyproxy/ratelimit's
src/service/ratelimit.go, src/limiter/base_limiter.go and
src/redis/fixed_cache_impl.go make it): the engine rules the limits count
in, and a configuration compiled and put in force.  No asyncio, no
network: the gRPC front calls the Decider in C, CL.RLS, /json and
CL.REGIONCHECK should_rate_limit.

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

from collections import namedtuple
from dataclasses import dataclass
from types import SimpleNamespace

from fastlimit._rls import (
    COUNTER_LIMIT,
    LIMIT_STAT_FIELDS,
    NEAR_LIMIT_RATIO,
    PRIORITY_ENTRY,
    Compiled,
    Decider,
    RlsError,
    RlsHome,
    walk_limits,
)
from fastlimit.regions.shares import Regions
from fastlimit.rls.config import EMPTY, RlsConfig, counter_key, with_regions

__all__ = ["COUNTER_LIMIT", "LIMIT_STAT_FIELDS", "NEAR_LIMIT_RATIO", "PRIORITY_ENTRY",
           "RlsError", "RlsHome", "walk_limits", "OK", "OVER_LIMIT", "MAX_UINT32",
           "RateLimitService", "Prepared", "engine_spec"]

OK, OVER_LIMIT = 1, 2
LimitStat = namedtuple("LimitStat", LIMIT_STAT_FIELDS)  # type: ignore[misc]  # _rls declares them
MAX_UINT32 = 2**32 - 1
MAX_ENGINE_WINDOW_MS = 2**32 - 1      # fl_native.h MAX_PERIOD_MS
RESERVED_SCOPE = "rls"


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


@dataclass(eq=False)
class Prepared:
    """A configuration ready to be put in force (RateLimitService.prepare)."""
    config: RlsConfig
    compiled: Compiled      # its trees in C, its statistics


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
        self.regions = regions
        self.engine = engine
        self.registry = registry
        self.decider = Decider(engine, self)
        self.decider.read_only = read_only
        self.decider.response_headers = response_headers
        # the reference's SHADOW_MODE: a refused request is answered OK
        self.decider.shadow_mode = shadow_mode
        self.decider.load = load
        if regions is not None:
            self.decider.region_here = regions.names.index(regions.name)
            self.decider.region_count = len(regions.names)
        self.config: RlsConfig = EMPTY
        self._num_by_spec: dict[tuple, int] = {}    # counter_key -> engine rule number

    # the settings the decision reads, by their old names
    load = property(lambda self: self.decider.load,
                    lambda self, v: setattr(self.decider, "load", v))
    response_headers = property(lambda self: self.decider.response_headers,
                                lambda self, v: setattr(self.decider, "response_headers", v))
    shadow_mode = property(lambda self: self.decider.shadow_mode,
                           lambda self, v: setattr(self.decider, "shadow_mode", v))
    home_local = property(lambda self: self.decider.home_local,
                          lambda self, v: setattr(self.decider, "home_local", v))
    unknown_domain = property(lambda self: self.decider.unknown_domain)
    global_shadow_mode = property(lambda self: self.decider.global_shadow_mode)

    @property
    def has_home(self) -> bool:
        return self.decider.compiled_config.has_home

    @property
    def stats(self) -> dict:
        """{domain: calls, over_limit, shadow, limits_over}."""
        return {name: SimpleNamespace(**s)
                for name, s in self.decider.compiled_config.domain_stat_items()}

    def limit_stats(self, first: int | None = None) -> list:
        """[((domain, full_key, index), LimitStat)] in key order (the first
        `first` only, when given): a configured limit's hits as the
        reference's stats count them, kept across reloads."""
        return [(key, LimitStat(*values))
                for key, values in self.decider.compiled_config.limit_stat_rows(first)]

    def should_rate_limit(self, domain: bytes, descriptors, hits_addend: int):
        """(overall_code, statuses, response_headers_to_add) or RlsError."""
        return self.decider.should_rate_limit(domain, list(descriptors), hits_addend)

    # ---- configuration ---------------------------------------------------------

    def set_config(self, config: RlsConfig) -> None:
        """Puts a loaded configuration in force (see install)."""
        self.install(self.prepare(config))

    def prepare(self, config: RlsConfig) -> Prepared:
        """Everything a configuration needs before it is put in force that
        takes time with its size: its trees compiled to C.  It only reads
        the service, so it may run in another thread (the loaders'),
        provided install() comes after it and no other install between.
        Static limits become this region's share (ConfigError if one
        holds no request)."""
        config = with_regions(config, self.regions)
        compiled = Compiled(config, self.regions)
        compiled.carry_from(self.decider.compiled_config)
        return Prepared(config, compiled)

    def install(self, prepared: Prepared) -> tuple:
        """Puts a prepared configuration in force in one step, its engine
        rules defined first (one per counter: a few, whatever the number of
        descriptors); all or nothing: ValueError if the engine refuses one,
        and the old configuration stays.  Rules the old one used and the
        new one does not are retired.  Returns the old configuration
        (RlsConfig, Compiled), for its caller to drop (see retire)."""
        num_by_spec = dict(self._num_by_spec)
        counters = {key: (limit, source) for key, limit, source in prepared.compiled.counters}
        created: list[tuple] = []
        try:
            for key, (limit, source) in counters.items():
                self._number(num_by_spec, created, key, limit.algorithm,
                             limit.requests_per_unit, limit.window_s, limit.split,
                             limit.regions == "global", f"{source}: {limit.full_key}")
        except ValueError:
            for spec_key in created:
                self.engine.forget(num_by_spec[spec_key])
                self.registry.release(reserved_name(spec_key))
            raise
        for spec, num in list(num_by_spec.items()):
            if spec not in counters and spec[0] != "fixed_window":
                self.engine.forget(num)
                self.registry.release(reserved_name(spec))
                del num_by_spec[spec]
        prepared.compiled.set_numbers(num_by_spec)
        old = self.decider.install(prepared.compiled)
        retired = (self.config if self.config is not prepared.config else EMPTY, old)
        self.config, self._num_by_spec = prepared.config, num_by_spec
        return retired

    def _number(self, num_by_spec, created, spec_key: tuple, algorithm: str, rpu: int,
                window_s: int, split: int, region_sync: bool, where: str) -> int:
        """The number of the engine rule a counter counts in, defined now
        if no limit used it yet."""
        num = num_by_spec.get(spec_key)
        if num is None:
            name = reserved_name(spec_key)
            num = self.registry.reserve(name, algorithm, RESERVED_SCOPE)
            try:
                self.engine.define(num, engine_spec(algorithm, rpu, window_s, split,
                                                   region_sync))
            except ValueError as e:
                self.registry.release(name)
                raise ValueError(f"{where}: {e}") from None
            created.append(spec_key)
            num_by_spec[spec_key] = num
        return num

    def override_number(self, window_s: int) -> int:
        """The rule Envoy's descriptor `limit` of this window counts in (a
        fixed window's: the configured limits of that window share it)."""
        return self._number(self._num_by_spec, [], counter_key("fixed_window", 0, window_s),
                            "fixed_window", 0, window_s, 1, False, "descriptor limit")

    def info(self) -> dict:
        return {name.decode("utf-8", "replace"): s for name, s in self.stats.items()}


def retire(retired: tuple) -> None:
    """Drops a configuration no longer in force piece by piece (its tree
    node by node, in Python), so that a thread doing it lets the loop run
    between pieces; one dropped at once would be freed in one C call, which
    holds the GIL for milliseconds with 10,000 descriptors."""
    config, compiled = retired
    del compiled
    for domain in list(config.domains.values()):
        stack = [domain.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            node.children.clear()
            node.wildcards.clear()
    config.domains.clear()


def reserved_name(spec_key: tuple) -> str:
    """(algorithm, requests_per_unit or 0, window_s) as the registry
    knows the counters' rule: the same numbers, the same name, in every
    process with the same limits."""
    return "@rls/" + "/".join(str(part) for part in spec_key)

