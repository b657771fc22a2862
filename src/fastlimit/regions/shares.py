"""A region's static share of a limit (README, "Regions"): region i of a
rule with weights w gets w_i / W of the tokens, rounded down, and exactly
w_i / W of the rate, so the regions together never hold more than the
rule (the overshoot is 0) and lose at most one token each to rounding.

Done on the engine spec, once, when a rule is defined: the check path
sees an ordinary rule with smaller numbers and costs nothing more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import gcd

# A rule's scope among regions.  regional: every region has the whole
# limit (a tier alone, as before regions).  static: each region its share.
# global: each region the whole limit less what the others spent (their
# spends cross every region-sync-ms); while a peer region is unreachable,
# its partition policy: "share" (its static share) or "whole".  home:
# each key lives in one region (the rule's "home", or the key's hash),
# which answers every region's checks of it.
REGION_SCOPES = ("regional", "static", "global", "home")
HOME_BY_KEY = -2                    # the engine's RuleSpec.home: the key's hash decides
PARTITION_POLICIES = ("share", "whole")
REGION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
MAX_REGIONS = 64
MAX_WEIGHT = 1_000_000
MAX_PERIOD_MS = 4294967295          # the engine keeps refill remainders in a u32
MAX_REFILL_TIME_MS = 10**15
MAX_AMOUNT = 10**15
MAX_GCRA_TOLERANCE = 10**18


# Rebalanced static shares (README, "Rebalancing static shares") are in
# thousandths of the rule; a region never holds less than the floor, which
# is also what it holds after a start until the coordinator grants more
# (safe whatever the others were granted before: see regions/rebalance.py).
REBALANCE_TOTAL = 1000


def rebalance_floor(regions: int) -> int:
    """Each region's least share, in thousandths: 5%, less with many regions."""
    return min(50, REBALANCE_TOTAL // (2 * max(1, regions)))


@dataclass(frozen=True)
class PeerAddress:
    """Where a peer region's tier is reached: its host and port; or with a
    service the sentinels that know its primary; or, for a cluster, seeds
    that answer CLUSTER SLOTS (region-peers)."""
    host: str
    port: int
    service: str | None = None
    sentinels: tuple[tuple[str, int], ...] = ()     # or a cluster's seeds
    cluster: bool = False

    def __str__(self) -> str:
        def one(host: str, port: int) -> str:
            return f"{f'[{host}]' if ':' in host else host}:{port}"
        if self.cluster:
            return "cluster:" + ",".join(one(h, p) for h, p in self.sentinels)
        if self.service is None:
            return one(self.host, self.port)
        return f"sentinel:{self.service}@" + ",".join(one(h, p) for h, p in self.sentinels)


@dataclass(frozen=True)
class Regions:
    """This tier's region and every region of the fleet (this one among
    them), sorted: equal shares need only the names, and every region
    must list the same ones."""
    name: str
    names: tuple[str, ...]

    def weights(self, shares: tuple[tuple[str, int], ...]) -> tuple[int, int]:
        """(this region's weight, the total) under a rule's shares; with
        none given, equal shares among the regions."""
        if not shares:
            return 1, len(self.names)
        own = dict(shares).get(self.name)
        if own is None:
            raise ValueError(f"shares: no share for this region ('{self.name}'); a static "
                             "rule's shares must name every region that enforces it")
        return own, sum(weight for _, weight in shares)


def share_spec(spec: dict, weight: int, total: int) -> dict:
    """An engine spec (fastlimit._rules.RuleEngine.define) scaled to
    weight / total of its tokens (rounded down) and of its rate (exact,
    the period made longer); ValueError when the share holds no token or
    its numbers leave the engine's range."""
    if weight == total:
        return spec
    out = dict(spec)
    algorithm = spec["algorithm"]
    if algorithm == "token_bucket":
        out["capacity"] = _tokens(spec["capacity"], weight, total)
        out["refill"], out["period_ms"] = _rate(spec["refill"], spec.get("period_ms", 1000),
                                                weight, total)
        if out["capacity"] * out["period_ms"] > MAX_REFILL_TIME_MS * out["refill"]:
            raise ValueError("a region's share refills too slowly: refilling it would "
                             "take more than 10^15 ms")
    elif algorithm == "gcra":
        out["burst"] = _tokens(spec["burst"] + 1, weight, total) - 1
        out["count"], out["period_ms"] = _rate(spec["count"], spec["period_ms"], weight, total)
        if out["period_ms"] * (out["burst"] + 1) > MAX_GCRA_TOLERANCE:
            raise ValueError("a region's share: period_ms * (burst + 1) must be at most "
                             "10^18")
    else:                               # windows and concurrency: a limit
        out["limit"] = _tokens(spec["limit"], weight, total)
    return out


def tokens_of(spec: dict) -> int:
    """The most an engine spec's bucket holds: what share_spec shares."""
    algorithm = spec["algorithm"]
    if algorithm == "token_bucket":
        return spec["capacity"]
    if algorithm == "gcra":
        return spec["burst"] + 1
    return spec["limit"]


def share_count(count: int, weight: int, total: int) -> int:
    """A count (a descriptor's requests_per_unit) scaled to its share,
    rounded down; ValueError when nothing is left."""
    return _tokens(count, weight, total)


def _tokens(count: int, weight: int, total: int) -> int:
    share = count * weight // total
    if share < 1:
        raise ValueError(f"a region's share ({weight}/{total} of {count}) holds no token")
    return share


def _rate(amount: int, period_ms: int, weight: int, total: int) -> tuple[int, int]:
    """amount per period_ms times weight / total, as the engine's integer
    (amount, period) in lowest terms."""
    amount, period_ms = amount * weight, period_ms * total
    common = gcd(amount, period_ms)
    amount, period_ms = amount // common, period_ms // common
    if amount > MAX_AMOUNT:
        raise ValueError(f"a region's share makes the refill {amount}, past 10^15")
    if period_ms > MAX_PERIOD_MS:
        raise ValueError(f"a region's share makes the refill period {period_ms} ms, past "
                         f"{MAX_PERIOD_MS}")
    return amount, period_ms


def tier_regions(region: str | None, names: list[str]) -> Regions | None:
    """The settings region and regions as Regions; None for a tier that
    has no region (every rule whole)."""
    if region is None:
        return None
    return Regions(region, tuple(sorted(names or [region])))
