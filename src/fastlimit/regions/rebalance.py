"""Rebalancing static shares (README, "Rebalancing static shares"): the
plan, no I/O.

The first region of the fleet coordinates.  Every region-rebalance-ms each
region tells it the checks each rebalanced rule had there since the last
time (its demand); the coordinator moves each region's share toward its
part of the demand, at most region-rebalance-step (thousandths of the
rule) per round, never below the floor, the shares together never above
the whole, and puts the new shares in force in two phases, so that the
regions never hold more than the whole between them, whatever they held
before (a region that restarted, a coordinator that restarted):

  1. shrink: every region holds min(what it holds, its new share) and
     acknowledges;
  2. commit, once every region acknowledged: every region holds its new
     share.

A region that does not acknowledge within a few rounds aborts the round:
the others keep what they hold, which is at most what they were granted.
A region starts holding the floor, which is never more than what it was
granted, until a commit says otherwise; an unchanged plan is put in force
again every REFRESH rounds, so a region that restarted gets its share
back under steady demand too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastlimit.regions.shares import REBALANCE_TOTAL


def targets(current: dict[str, int], demand: dict[str, int], floor: int, step: int,
            total: int = REBALANCE_TOTAL) -> dict[str, int]:
    """Each region's next share: toward floor + its part of the rest by
    demand, by at most step, at least floor, together at most total.
    Without demand anywhere the shares stay."""
    asked = sum(demand.get(r, 0) for r in current)
    if asked == 0:
        return dict(current)
    spare = total - floor * len(current)
    ideal = {r: floor + spare * demand.get(r, 0) // asked for r in current}
    # shrink first, then grow into what the shrinking left
    out = {r: max(floor, max(ideal[r], current[r] - step)) if ideal[r] < current[r]
           else current[r] for r in current}
    room = total - sum(out.values())
    for r in sorted(current, key=lambda r: -demand.get(r, 0)):
        if ideal[r] > out[r] and room > 0:
            grow = min(ideal[r] - out[r], step, room)
            out[r] += grow
            room -= grow
    return out


@dataclass
class Round:
    version: int
    shares: dict[str, dict[str, int]]      # rule id -> region -> thousandths
    acked: set[str] = field(default_factory=set)
    rounds_waited: int = 0


class Coordinator:
    """The first region's side: demand in, rounds out."""

    # rounds a region may take to acknowledge a shrink before the round ends
    PATIENCE = 5
    # rounds without a change after which the plan is put in force again
    # anyway: a region that restarted meanwhile holds the floor, and under
    # steady demand no change would ever give it its share back
    REFRESH = 10

    def __init__(self, names: tuple[str, ...], floor: int):
        self.names = names
        self.floor = floor
        self.demand: dict[str, dict[str, int]] = {}    # rule -> region -> checks
        self.planned: dict[str, dict[str, int]] = {}   # rule -> the last committed shares
        self.version = 0
        self.pending: Round | None = None
        self.commits = 0
        self.aborts = 0
        self.unchanged = 0        # rounds since the last one put in force

    def note_demand(self, region: str, demand: dict[str, int]) -> None:
        for rule_id, checks in demand.items():
            self.demand.setdefault(rule_id, {})[region] = checks

    def next_round(self, rules: list[str], step: int) -> Round | None:
        """A new round for these rules, unless one is under way (it waits
        one more round, or ends after PATIENCE) or nothing would change."""
        if self.pending is not None:
            self.pending.rounds_waited += 1
            if self.pending.rounds_waited < self.PATIENCE:
                return None
            self.pending = None
            self.aborts += 1
        shares, changed = {}, False
        for rule_id in rules:
            current = self.planned.get(rule_id) or dict.fromkeys(self.names, self.floor)
            shares[rule_id] = targets(current, self.demand.get(rule_id, {}), self.floor, step)
            changed = changed or shares[rule_id] != current
        self.demand = {}
        self.unchanged += 1
        if not changed and (self.unchanged < self.REFRESH or not self.planned):
            return None
        self.unchanged = 0
        self.version += 1
        self.pending = Round(self.version, shares)
        return self.pending

    def acknowledged(self, region: str, version: int) -> bool:
        """Notes a region's acknowledgement of the shrink; True once every
        region has, when the round is to be committed."""
        if self.pending is None or self.pending.version != version:
            return False
        self.pending.acked.add(region)
        if self.pending.acked < set(self.names):
            return False
        self.planned.update(self.pending.shares)
        self.pending = None
        self.commits += 1
        return True
