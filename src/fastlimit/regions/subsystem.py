"""This tier's place among the regions in the server (README, "Regions"):

- static rules: their shares are applied where rules are defined
  (rules/registry.py through shares.share_spec); nothing runs here;
- global rules: every region-sync-ms the engine's log of their spends is
  drained, cut into batches (wire.py) and queued on every peer region's
  link (links.py); a peer's batches arrive as CL.REGIONSYNC (receive())
  and are debited from the buckets here, once per sequence number;
- a peer unreachable for region-partition-ms puts the global rules under
  their partition policy until every peer answers again;
- home rules: a check whose key lives in another region is asked of it
  (ask_home, over the link; CL.REGIONCHECK there), and while that region
  is unreachable counted here against the rules' home allowances, or
  answered by their failure policy (answer_elsewhere);
- rebalanced static rules: every region-rebalance-ms this region's demand
  goes to the coordinator (the first region), which sends the rounds of
  new shares (rebalance.py); the shares are held through the registry;
- INFO regions: the region, the links, what crossed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping

from fastlimit._cluster import keyslot
from fastlimit._load import SHED_REMAINING, SHED_RETRY_MS
from fastlimit._resp import ReplyError
from fastlimit._rules import HomeElsewhere
from fastlimit.regions.cluster_peer import ClusterPeer
from fastlimit.regions.links import PeerLink
from fastlimit.regions.rebalance import Coordinator
from fastlimit.regions.shares import MAX_PERIOD_MS, rebalance_floor
from fastlimit.regions.wire import (
    WireError,
    decode_batch,
    decode_demand,
    decode_rls_reply,
    decode_shares,
    encode_demand,
    encode_rls_request,
    encode_shares,
    route_key,
)
from fastlimit.rules.registry import RESERVED_PREFIX
from fastlimit.server.subsystem import Subsystem

# Which batches arrived is kept in the tables, so that whatever carries the
# buckets carries it with the debits it stands for, in the same replication
# batch and the same snapshot: a promoted standby, or a tier restarted from
# its snapshot, skips a resend of a batch it has the debits of.  One counter
# per (origin region, sender's run) under a reserved number, its count the
# last sequence number applied: an exact counter (limit 10^15) in the
# engine's longest fixed window, which expires a run's counter 49.7 days
# after its window began (and starts it over at the window's end: a resend
# crossing that instant, once in 49.7 days, would be applied again).
APPLIED = RESERVED_PREFIX + "region-applied"
APPLIED_LIMIT = 10**15
APPLIED_SPEC = {"algorithm": "fixed_window", "limit": APPLIED_LIMIT,
                "window_ms": MAX_PERIOD_MS, "shadow": False, "scope": "client"}
MAX_RUN_BYTES = 128     # a sender's run id and link incarnation


def reserve_applied(rules) -> int | None:
    """The engine number of the batches' counters, reserved (before the
    snapshot loads, so that their buckets are found there) on a tier
    with regions; None without."""
    if rules.regions is None:
        return None
    num = rules.reserve(APPLIED, "fixed_window", "region-applied")
    rules.engine.define(num, APPLIED_SPEC)
    return num


class RegionsSubsystem(Subsystem):
    def __init__(self, server, log):
        self.app = server
        self.log = log
        self.regions = server.regions
        self.rules = server.rules
        self.engine = server.rule_engine
        self.origin = self.regions.name.encode() if self.regions else b""
        self.links: list[PeerLink | ClusterPeer] = []     # made by apply_settings
        self.incarnations = 0               # links made: each numbers its batches anew
        self.started = False
        self.partitioned = False
        self.partitions = 0
        # what arrived: the counters of reserve_applied's number
        self.applied_num = server.region_applied
        self.batches_received = 0
        self.spends_received = 0
        self.tokens_debited = 0
        self.tokens_overdrawn = 0     # spent there, found empty here: the overshoot
        self.batches_sent = 0
        self.spends_misrouted = 0     # a cluster's: for a key another shard serves
        self._timer: asyncio.TimerHandle | None = None
        # rebalancing: the coordinator's plan (on the first region only),
        # each rule's checks counted at the last round, the last shrink here
        r = self.regions
        self.floor = rebalance_floor(len(r.names)) if r else 0
        self.coordinator = Coordinator(r.names, self.floor) if r and r.name == r.names[0] \
            else None
        self.checks_seen: dict[str, int] = {}
        self.share_version = 0
        self._rebalance_timer: asyncio.TimerHandle | None = None
        # home rules: this region's place among the regions, for the engine's
        # routing; the checks asked of other regions, those that went
        # unanswered, and the other regions' checks run here
        if r is not None:
            self.engine.set_region(r.names.index(r.name), len(r.names))
        self.checks_asked = 0
        self.checks_unanswered = 0
        self.checks_served = 0
        self.checks_allowance = 0       # counted here while their home was unreachable

    # ---- the subsystem's calls ----------------------------------------------------------

    def apply_settings(self, settings) -> None:
        """region-peers: a link per peer region; one whose address changed,
        or that is no longer listed, is stopped (its queue with it)."""
        wanted = settings.region_peers
        kept: list[PeerLink | ClusterPeer] = []
        for link in self.links:
            if wanted.get(link.name) == link.address:
                kept.append(link)
            else:
                link.stop()
        have = {link.name for link in kept}
        for name, address in wanted.items():
            if name not in have:
                link = ClusterPeer(self, name, address, self.incarnation) if address.cluster \
                    else PeerLink(self, name, address, self.incarnation())
                kept.append(link)
                if self.started:
                    link.start()
        self.links = kept
        # rebalancing needs one coordinator and one demand per region: not
        # with shards on either side (a rebalanced rule keeps its static share)
        self.rules.set_rebalancing(not settings.cluster_enabled and not any(
            address.cluster for address in wanted.values()))

    def incarnation(self) -> int:
        """A new link's number: each numbers its batches anew."""
        self.incarnations += 1
        return self.incarnations

    async def start(self) -> None:
        self.started = True
        for link in self.links:
            link.start()
        self._schedule()
        if self.regions is not None:
            self._schedule_rebalance()

    async def stop(self) -> None:
        for timer in (self._timer, self._rebalance_timer):
            if timer is not None:
                timer.cancel()
        tasks: list[asyncio.Future] = [t for t in (link.stop() for link in self.links)
                                       if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(
            self.app.settings.region_sync_ms / 1000, self._sync)

    def _sync(self) -> None:
        """Every region-sync-ms: the spends since the last time to every
        peer, and whether a peer has been unreachable too long."""
        try:
            spends = self.engine.drain_spends()
            if spends and self.links and self.app.replication.link is None:   # a primary
                # rule ids, and the Envoy service's counters' reserved names
                carried = self.rules.carried()
                names = {num: name for num, (name, _, _) in carried.items()}
                per_resource = {num for num, (_, _, scope) in carried.items()
                                if scope == "client+resource"}

                def route(num: int, key: bytes) -> bytes:
                    return route_key(key, num in per_resource)
                for link in self.links:
                    self.batches_sent += link.send_spends(spends, names, route)
            for link in self.links:
                link.tick()
            self._check_partition()
        finally:
            self._schedule()

    def _check_partition(self) -> None:
        within = self.app.settings.region_partition_ms / 1000
        apart = [link.name for link in self.links if not link.reachable(within)]
        if self.regions is not None:      # home rules' keys there: the failure policy
            for link in self.links:
                self.engine.set_home_down(self.regions.names.index(link.name),
                                          link.name in apart)
        if bool(apart) == self.partitioned:
            return
        self.partitioned = bool(apart)
        self.partitions += self.partitioned
        self.rules.repartition(self.partitioned)
        if apart:
            self.log.warning("region(s) %s unreachable for %d ms: global rules follow their "
                             "partition policy", ",".join(apart),
                             self.app.settings.region_partition_ms)
        else:
            self.log.warning("every peer region reachable again: global rules whole")

    # ---- rebalancing static shares (rebalance.py) -----------------------------------------

    def _schedule_rebalance(self) -> None:
        self._rebalance_timer = asyncio.get_running_loop().call_later(
            self.app.settings.region_rebalance_ms / 1000, self._rebalance)

    def _rebalance(self) -> None:
        """This region's demand to the coordinator; on the coordinator, the
        next round."""
        try:
            rules = [rule.id for rule in self.rules.list() if rule.rebalance]
            if rules and self.rules.rebalancing and self.app.replication.link is None:
                demand = self._demand(rules)
                if self.coordinator is not None:
                    self.coordinator.note_demand(self.regions.name, demand)
                    self._coordinate(rules)
                else:
                    link = self._link_to(self.regions.names[0])
                    if link is not None:
                        link.call([b"CL.REGIONDEMAND", self.origin, encode_demand(demand)],
                                  lambda reply: None)
        finally:
            self._schedule_rebalance()

    def _demand(self, rules: list[str]) -> dict[str, int]:
        """Each rule's checks here since the last round."""
        demand = {}
        for rule_id in rules:
            stats = self.rules.stats(rule_id) or {}
            checks = sum(stats.values())
            demand[rule_id] = max(0, checks - self.checks_seen.get(rule_id, checks))
            self.checks_seen[rule_id] = checks
        return demand

    def _link_to(self, name: str) -> PeerLink | ClusterPeer | None:
        return next((link for link in self.links if link.name == name), None)

    def _coordinate(self, rules: list[str]) -> None:
        assert self.coordinator is not None
        step = self.app.settings.region_rebalance_step
        round_ = self.coordinator.next_round(rules, step)
        if round_ is None:
            return
        doc, version = encode_shares(round_.shares), round_.version
        self.share_version = version        # the coordinator's own, as a region's
        for link in self.links:
            link.call([b"CL.REGIONSHARES", self.origin, b"%d" % version, b"shrink", doc],
                      lambda reply, name=link.name: self._answered(name, version, doc, reply))
        self.hold(round_.shares, shrink=True)
        self._acknowledged(self.regions.name, version, doc)

    def _answered(self, region: str, version: int, doc: bytes, reply) -> None:
        if reply == version:      # else not acknowledged: the round waits, then ends
            self._acknowledged(region, version, doc)

    def _acknowledged(self, region: str, version: int, doc: bytes) -> None:
        assert self.coordinator is not None
        if not self.coordinator.acknowledged(region, version):
            return
        self.hold(decode_shares(doc), shrink=False)
        for link in self.links:
            link.call([b"CL.REGIONSHARES", self.origin, b"%d" % version, b"commit", doc],
                      lambda reply: None)

    def hold(self, shares: dict[str, dict[str, int]], shrink: bool) -> None:
        """This region's shares of a round: in the shrink phase at most
        what it holds, in the commit phase as given."""
        me = self.regions.name
        for rule_id, per_region in shares.items():
            mine = per_region.get(me)
            if mine is None or mine < self.floor:
                continue
            held = self.rules.held_shares.get(rule_id, self.floor)
            self.rules.hold_share(rule_id, min(held, mine) if shrink else mine)

    def receive_demand(self, origin: bytes, data: bytes) -> None:
        """CL.REGIONDEMAND: a region's demand, on the coordinator."""
        name = self.peer_name(origin, "CL.REGIONDEMAND")
        if self.coordinator is None:
            raise ReplyError("ERR CL.REGIONDEMAND goes to the coordinator, the first of "
                             "the regions")
        try:
            self.coordinator.note_demand(name, decode_demand(data))
        except WireError as e:
            raise ReplyError(f"ERR CL.REGIONDEMAND: {e}") from None

    def receive_shares(self, origin: bytes, version: int, phase: bytes, data: bytes) -> int:
        """CL.REGIONSHARES: a round's phase from the coordinator."""
        name = self.peer_name(origin, "CL.REGIONSHARES")
        if name != self.regions.names[0]:
            raise ReplyError("ERR CL.REGIONSHARES comes from the coordinator, the first of "
                             "the regions")
        if phase not in (b"shrink", b"commit"):
            raise ReplyError("ERR CL.REGIONSHARES: the phase is shrink or commit")
        try:
            shares = decode_shares(data)
        except WireError as e:
            raise ReplyError(f"ERR CL.REGIONSHARES: {e}") from None
        if phase == b"shrink":
            self.share_version = version
            self.hold(shares, shrink=True)
        elif version == self.share_version:    # the commit of the last shrink seen
            self.hold(shares, shrink=False)
        return version

    def peer_name(self, origin: bytes, command: str) -> str:
        name = origin.decode("utf-8", "replace")
        if self.regions is None or name == self.regions.name or \
                name not in self.regions.names:
            raise ReplyError(f"ERR {command} from '{name[:64]}', which is not another of "
                             "this tier's regions")
        return name

    # ---- home rules ------------------------------------------------------------------------

    def answer_elsewhere(self, e: HomeElsewhere, args: list[bytes], client: bytes,
                         resource: bytes, cost: int, detail: bool) -> list | Awaitable[list]:
        """A check (CL.LIMIT or CL.APPLY, args) whose key lives in another
        region: that region's reply (an awaitable of it, ask_home); while
        it is unreachable, counted here against the home allowances of
        the check's home rules when each has one, else the failure
        policy's answer, uncounted.  A reply: five integers, with detail
        the rules' steps."""
        unanswered: list = [int(not e.fail_closed), -1, SHED_REMAINING,
                            SHED_RETRY_MS if e.fail_closed else 0, 0]
        if detail:
            unanswered.append([])
        if not e.down:
            return self.ask_home(e.home, args, unanswered)
        nums = self.rules.allowances(e.rules)
        if nums is None:
            return unanswered
        result = self.engine.apply(nums, client, cost, resource, detail=detail)
        self.checks_allowance += 1
        if not detail:
            return list(result)
        five, steps = result
        return [*five, self.app.rules_detail(steps)]

    async def ask_home_rls(self, home: int, domain: bytes, descriptors,
                           hits_addend: int) -> tuple[int, list, list] | None:
        """An Envoy request whose home limit lives in region home (RlsHome):
        that region's decision, or None if it did not answer in time (the
        front fails the call: Envoy's failure_mode_deny decides)."""
        reply = await self.ask_home(home, [b"RLS", domain, encode_rls_request(
            descriptors, hits_addend)], None, domain)
        if reply is None:
            return None
        try:
            return decode_rls_reply(reply)
        except WireError as e:
            raise ReplyError(f"ERR the home region's answer: {e}") from None

    async def ask_home(self, home: int, args: list[bytes], unanswered,
                       route_key: bytes | None = None):
        """A check (CL.LIMIT or CL.APPLY and its arguments) asked of region
        home, over its link: its reply, or `unanswered` (the failure
        policy's) if the link is down or the answer takes longer than
        region-home-timeout-ms.  An error the home answers is this one's.
        In a cluster the shard of route_key (else the check's client key)
        answers."""
        assert self.regions is not None
        link = self._link_to(self.regions.names[home])
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        def answered(reply) -> None:
            if not answer.done():      # not after a timeout gave up on it
                answer.set_result(reply)

        if link is not None:      # a cluster's shard by the check's client key
            link.call([b"CL.REGIONCHECK", self.origin, *args], answered, route_key or (
                args[1] if args[0].upper() == b"CL.LIMIT" else args[2]))
        else:
            answered(None)
        try:
            async with asyncio.timeout(self.app.settings.region_home_timeout_ms / 1000):
                reply = await answer
        except TimeoutError:
            reply = None
        if reply is None:
            self.checks_unanswered += 1
            return unanswered
        if isinstance(reply, Exception):
            raise ReplyError(str(reply))
        self.checks_asked += 1
        return reply

    # ---- what arrives ---------------------------------------------------------------------

    def receive(self, origin: bytes, run: bytes, seq: int, batch: bytes) -> int:
        """A peer's batch (CL.REGIONSYNC): debited here once; returns seq,
        its acknowledgement."""
        self.peer_name(origin, "CL.REGIONSYNC")
        if len(run) > MAX_RUN_BYTES:
            raise ReplyError(f"ERR CL.REGIONSYNC: a run id of at most {MAX_RUN_BYTES} bytes")
        counter = origin + b"\0" + run
        applied = self._applied(counter)
        if seq <= applied:
            return seq
        try:
            spends = decode_batch(batch)
        except WireError as e:
            raise ReplyError(f"ERR CL.REGIONSYNC: {e}") from None
        # at most once: marked before any spend is applied, so that a batch
        # broken off halfway (memory) is never applied twice
        try:
            self.engine.apply([self.applied_num], counter, seq - applied)
        except MemoryError:
            raise ReplyError("OOM the batch cannot be marked applied: sent again later") \
                from None
        cluster = self.app.settings.cluster_enabled
        for rule_id, key, cost in spends:
            num = self.rules.number_of(rule_id)
            if cluster and num is not None and not self.app.core.serves_slot(keyslot(
                    route_key(key, self.rules.per_resource(num)))):
                self.spends_misrouted += 1      # its shard moved: the sender asks again
                continue
            try:
                taken = self.engine.debit(num, key, cost) if num is not None else 0
            except (MemoryError, ValueError, ReplyError):     # no room: counted as overdrawn
                taken = 0
            self.tokens_debited += taken
            self.tokens_overdrawn += cost - taken
        self.batches_received += 1
        self.spends_received += len(spends)
        return seq

    def _applied(self, counter: bytes) -> int:
        """The last sequence number applied of a sender's run (0: none)."""
        return APPLIED_LIMIT - self.engine.apply([self.applied_num], counter, 0)[2]

    # ---- INFO -------------------------------------------------------------------------------

    def info_sections(self, sections: frozenset[str],
                      named: frozenset[str]) -> Mapping[str, Mapping[str, object]]:
        if "regions" not in sections:
            return {}
        rules = self.rules.list()
        r = self.regions
        out: dict[str, object] = {
            "region": r.name if r else "", "regions": ",".join(r.names) if r else "",
            "region_count": len(r.names) if r else 0,
            "static_rules": sum(rule.regions == "static" for rule in rules),
            "global_rules": sum(rule.regions == "global" for rule in rules),
            "region_partitioned": int(self.partitioned), "region_partitions": self.partitions,
            "region_spends_logged": self.engine.spends_logged,
            "region_spends_log_dropped": self.engine.spends_dropped,
            "region_batches_sent": self.batches_sent,
            "region_batches_received": self.batches_received,
            "region_spends_received": self.spends_received,
            "region_spends_misrouted": self.spends_misrouted,
            "region_tokens_debited": self.tokens_debited,
            "region_tokens_overdrawn": self.tokens_overdrawn,
            "region_home_rules": sum(rule.regions == "home" for rule in rules),
            "region_checks_asked": self.checks_asked,
            "region_checks_unanswered": self.checks_unanswered,
            "region_checks_served": self.checks_served,
            "region_checks_allowance": self.checks_allowance,
            "region_rebalanced_rules": sum(rule.rebalance for rule in rules),
            "region_share_version": self.share_version,
            "region_coordinator": r.names[0] if r else "",
            "region_rebalance_commits": self.coordinator.commits if self.coordinator else 0,
            "region_rebalance_aborts": self.coordinator.aborts if self.coordinator else 0,
            "region_links": len(self.links),
            "region_links_up": sum(link.shown_state == "up" for link in self.links)}
        for i, link in enumerate(self.links):
            out[f"peer{i}"] = link.info()
        if "regions" in named and r is not None:
            static = sorted((rule for rule in rules if rule.regions == "static"),
                            key=lambda rule: rule.id)
            for i, rule in enumerate(static):
                if rule.rebalance and self.rules.rebalancing:
                    weight, total = self.rules.held_shares.get(rule.id, self.floor), 1000
                else:
                    weight, total = r.weights(rule.shares)    # the registry took it here
                out[f"static{i}"] = f"id={rule.id},share={weight}/{total}"
        return {"regions": out}

    def link_ages(self) -> dict[str, float]:
        """Seconds since each peer last answered (for /metrics)."""
        now = time.monotonic()
        return {link.name: now - link.last_reply for link in self.links}
