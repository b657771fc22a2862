"""Cluster mode: this node's part of one fastlimit tier spread over many
processes, spoken to clients as Redis Cluster (hash slots, CLUSTER SLOTS,
-MOVED).

The slot map (``cluster/slot_map.py``, read from ``cluster-config-file``) says
which shard owns each slot.  Who is primary of each shard comes from the
map for static shards, and from Redis Sentinel for the others
(``sentinel_roles.ShardRoles``): Sentinel stays the only thing that detects
failures and promotes.  From the map and the roles this subsystem works
out the routing the connection applies in C (``ServerCore.set_routing``):
the slots this node serves as primary, and for every other slot the
primary to redirect to.  A shard with no known primary answers
CLUSTERDOWN.

A node that Sentinel promotes (SLAVEOF NO ONE) serves its shard at once,
before the sentinels announce the switch: its own state wins for its own
data until Sentinel reports the shard under a newer config epoch.  A
returning old primary that still believes it is one redirects to the
primary Sentinel names, so it takes no writes meant for the new one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from fastlimit._cluster import SLOTS
from fastlimit._resp import ReplyError
from fastlimit.cluster import slot_map as clustermap
from fastlimit.cluster.peers import Challenges, Credentials, Peers, answer, names, unreached
from fastlimit.cluster.sentinel_roles import ShardRoles
from fastlimit.cluster.slot_map import Address, MapError, Roles, SlotMap
from fastlimit.lazy_redis import redis
from fastlimit.rules.model import RuleError
from fastlimit.server import config as cfg
from fastlimit.server import tls
from fastlimit.server.subsystem import Subsystem

# How often a node compares its map and rules with a peer's (a node that
# missed a change catches up within this).
CATCH_UP_S = 5.0


class Cluster(Subsystem):
    def __init__(self, app, log: logging.Logger):
        self.app = app
        self.log = log
        self.slot_map: SlotMap | None = None
        self.myself: Address | None = None
        self.roles: dict[str, Roles] = {}
        self.sentinel_roles: dict[str, Roles] = {}
        # (shard, Sentinel's epoch then) after a promotion Sentinel has not
        # announced yet.
        self.promotion: tuple[str, int] | None = None
        self.route_updates = 0
        self.peers = Peers(self._credentials, lambda: tls.redis_py_options(self.app.settings),
                           log)
        self.challenges = Challenges()
        # The cluster-wide rules version: (counter, id of the node that made
        # the change); the highest wins everywhere.
        self.rules_epoch: tuple[int, str] = (0, "")
        # The registry's own version when the rules last matched rules_epoch.
        self.rules_seen = 0
        self._rules_lock = asyncio.Lock()
        self._catch_up_task: asyncio.Task | None = None
        self._next_catch_up = 0.0
        self._peer_turn = 0
        self.watcher: ShardRoles | None = None
        self._started = False

    @property
    def enabled(self) -> bool:
        return self.slot_map is not None

    def load(self, settings) -> None:
        """Reads the slot map at start; MapError (the server refuses to
        start) if it cannot be used."""
        if settings.cluster_enabled:
            self.slot_map = clustermap.load(settings.cluster_config_file)
            self.roles = clustermap.static_roles(self.slot_map)
            self.myself = self._announced(settings)
            self._route()
            self.rules_seen = self.app.rules.version
            self._catch_up_at_start(primary=settings.replicaof is None)

    # ---- settings and lifecycle ------------------------------------------------

    def apply_settings(self, settings) -> None:
        if not self.enabled:
            return
        myself = self._announced(settings)
        if myself != self.myself:
            self.myself = myself
            self._route()

    def _announced(self, settings) -> Address | None:
        """This node's address as the map and clients know it; None while
        the port is not known yet (port 0 before the listener is up).  With
        tls-cluster, the cluster knows it by its tls-port."""
        port = settings.cluster_announce_port or (
            settings.tls_port if settings.tls_cluster else self.app.port)
        host = settings.cluster_announce_ip or settings.bind[0]
        if not port:
            return None
        try:
            return Address.parse(f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                                 "cluster-announce-ip")
        except MapError as e:
            raise ValueError(f"{e}; set cluster-announce-ip to the address clients "
                             "connect to") from None

    async def start(self) -> None:
        if not self.enabled:
            return
        self.apply_settings(self.app.settings)
        assert self.slot_map is not None
        self._started = True
        if self._credentials() is None:
            self.log.warning("cluster: no cluster-user and cluster-password: the nodes do "
                             "not prove who they are, and any process on this host that "
                             "answers at an address of the map is taken for a node")
        await self._watch_sentinels()
        self.log.info("cluster mode: slot map version %d, %d shard(s); this node is %s",
                      self.slot_map.version, len(self.slot_map.shards), self.myself)

    def cron(self) -> None:
        if not self.enabled:
            return
        if self.rules_travel and self.app.rules.version != self.rules_seen:
            self._rules_changed_here()
        now = time.monotonic()
        if now >= self._next_catch_up and (self._catch_up_task is None
                                           or self._catch_up_task.done()):
            self._next_catch_up = now + CATCH_UP_S
            self._catch_up_task = asyncio.ensure_future(self._catch_up())

    def _credentials(self) -> Credentials:
        s = self.app.settings
        return (s.cluster_user, s.cluster_password) if s.cluster_password else None

    async def _watch_sentinels(self) -> None:
        """(Re)starts the Sentinel watcher for the map's Sentinel shards."""
        assert self.slot_map is not None
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None
        masters = {s.name: s.sentinel for s in self.slot_map.shards if s.sentinel}
        self.sentinel_roles = {k: v for k, v in self.sentinel_roles.items() if k in masters}
        if masters:
            password = self.app.settings.cluster_sentinel_password
            self.watcher = ShardRoles(self.slot_map.sentinels, masters, self.sentinels_changed,
                                      password=password,
                                      log=self.log)
            await self.watcher.start()
        self._merge_roles(map_changed=True)

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
        if self._catch_up_task is not None:
            self._catch_up_task.cancel()
            await asyncio.gather(self._catch_up_task, return_exceptions=True)
        await self.peers.close()

    # ---- peers proving who they are (the called side of peers.py's exchange) ----------

    def prove_peer(self, conn_id: int, name: str, challenge: bytes, nonce: bytes,
                   given: bytes):
        """CL.PEERAUTH PROVE: (the user, this node's own proof) when given
        answers a fresh challenge of this connection, for this node's
        address, under a password of cluster-user; None otherwise."""
        if name != self.app.settings.cluster_user or self.myself is None or \
                not self.challenges.valid(challenge, conn_id):
            return None
        found = self.app.acl.password_hashes(name)
        if found is None:
            return None
        user, keys = found
        mine = answer(keys, name, str(self.myself), challenge, nonce, given)
        return None if mine is None else (user, mine)

    # ---- roles -----------------------------------------------------------------

    def sentinels_changed(self, roles: Mapping[str, Roles]) -> None:
        """The Sentinel view of the shards changed."""
        self.sentinel_roles = dict(roles)
        if self.promotion is not None:
            shard, epoch = self.promotion
            now = roles.get(shard)
            if now is not None and (now.epoch > epoch or now.primary == self.myself):
                self.promotion = None
        self._merge_roles()

    def promoted(self) -> None:
        """SLAVEOF NO ONE: if this node was a standby of a Sentinel shard,
        it serves that shard now."""
        shard = self.standby_of()
        if shard is None or self.slot_map is None or self.slot_map_shard(shard).sentinel is None:
            return
        self.promotion = (shard, self.roles[shard].epoch)
        self.log.warning("cluster: promoted; serving shard %s before Sentinel announces it",
                         shard)
        self._merge_roles()

    def _merge_roles(self, map_changed: bool = False) -> None:
        assert self.slot_map is not None
        roles = clustermap.static_roles(self.slot_map)
        roles.update(self.sentinel_roles)
        if self.promotion is not None and self.myself is not None:
            shard, _ = self.promotion
            before = roles.get(shard)
            standbys = tuple(a for a in (before.standbys if before else ()) if a != self.myself)
            if before is not None and before.primary != self.myself:
                standbys += (before.primary,)
            roles[shard] = Roles(self.myself, standbys, before.epoch if before else 0)
        if roles != self.roles or map_changed:
            self.roles = roles
            self._route()

    def slot_map_shard(self, name: str):
        assert self.slot_map is not None
        return next(s for s in self.slot_map.shards if s.name == name)

    def standby_of(self) -> str | None:
        """The shard listing this node as a standby, if any."""
        return next((name for name, r in self.roles.items() if self.myself in r.standbys), None)

    def my_shard(self) -> str | None:
        """The shard this node is primary or standby of, if any."""
        return next((name for name, r in self.roles.items()
                     if self.myself == r.primary or self.myself in r.standbys), None)

    def other_nodes(self, *maps: SlotMap) -> list[Address]:
        """Every node the maps and the roles name, but this one."""
        nodes = {a for r in self.roles.values() for a in (r.primary, *r.standbys)}
        nodes |= {a for m in maps for s in m.shards
                  for a in ((s.primary,) if s.primary else ()) + s.standbys}
        if self.myself is not None:
            nodes.discard(self.myself)
        return sorted(nodes)

    def other_primaries(self) -> list[Address]:
        return sorted({r.primary for r in self.roles.values()} - {self.myself})

    def is_primary(self) -> bool:
        return not self.app.core.readonly and any(
            r.primary == self.myself for r in self.roles.values())

    @property
    def my_id(self) -> str:
        assert self.slot_map is not None and self.myself is not None
        return self.slot_map.node_id(self.myself)

    # ---- a takeover (takeover/): what the new process goes on from ---------------

    def handover_state(self) -> dict | None:
        """What a takeover's new process needs of this node, taken at the
        pause, that the replication stream does not carry: the map's
        version (a map installed during the copy is in cluster-config-file,
        which the new process read before), the cluster rules' version,
        and what Sentinel said (and a promotion it has not announced), so
        that the new process routes from the flip on as this one did.
        None outside cluster mode."""
        if not self.enabled:
            return None
        assert self.slot_map is not None
        return {"map_version": self.slot_map.version, "rules_epoch": list(self.rules_epoch),
                "sentinel_roles": {shard: _roles_doc(r)
                                   for shard, r in self.sentinel_roles.items()},
                "promotion": list(self.promotion) if self.promotion else None}

    def take_handover_state(self, doc: dict | None) -> None:
        """handover_state() of the process this one takes over, before it
        accepts; MapError if the map it installed cannot be read."""
        if doc is None or not self.enabled:
            return
        assert self.slot_map is not None
        if doc["map_version"] > self.slot_map.version:
            self.install(clustermap.load(self.app.settings.cluster_config_file))
        self.rules_epoch = (doc["rules_epoch"][0], doc["rules_epoch"][1])
        self.rules_seen = self.app.rules.version    # the stream's rules are no change here
        self.sentinel_roles = {shard: _roles_from_doc(r)
                               for shard, r in doc["sentinel_roles"].items()}
        self.promotion = tuple(doc["promotion"]) if doc["promotion"] else None
        self._merge_roles()

    # ---- the slot map: changes and catching up ------------------------------------

    def install_text(self, text: str) -> bool:
        """CL.CLUSTER SETMAP: installs a newer map; False if it is the
        running one.  MapError names what is wrong with any other."""
        return self.install(clustermap.loads(text, "the new slot map"))

    def install(self, new: SlotMap) -> bool:
        """Makes new the running map, written to cluster-config-file first
        (so a restart keeps it); a stale or unwritable one changes nothing."""
        assert self.slot_map is not None
        if new == self.slot_map:
            return False
        new.check_replaces(self.slot_map)
        path = self.app.settings.cluster_config_file
        try:
            cfg.replace_file(path, clustermap.dumps(new).encode())
        except cfg.ConfigError as e:
            raise MapError(f"cannot write the slot map to {path}: {e.reason}") from None
        old, self.slot_map = self.slot_map, new
        self.log.warning("cluster: slot map version %d installed (%d shards)", new.version,
                         len(new.shards))
        if self._started and _sentinel_shards(old) != _sentinel_shards(new):
            asyncio.ensure_future(self._watch_sentinels())
        self._merge_roles(map_changed=True)
        return True

    async def push_map(self, text: str) -> None:
        """CL.CLUSTER PUSH: installs the map here and hands it to every node
        of the old and the new map; ReplyError names the nodes not reached
        (they catch up from a peer)."""
        assert self.slot_map is not None
        old = self.slot_map
        new = clustermap.loads(text, "the new slot map")
        self.install(new)
        others = self.other_nodes(old, new)
        replies = await self.peers.call_each(others, "CL.CLUSTER", "SETMAP", clustermap.dumps(new))
        failed = unreached(replies)
        if failed:
            raise ReplyError(
                f"ERR slot map version {new.version} is in force here and on "
                f"{len(others) - len(failed)} of {len(others)} other nodes; not reached: "
                f"{_reasons(replies, failed)}; they take it from a peer within "
                f"{CATCH_UP_S:g} s of coming back")

    def versions(self) -> list:
        """CL.CLUSTER VERSIONS: [map version, rules counter, rules origin]."""
        assert self.slot_map is not None
        return [self.slot_map.version, self.rules_epoch[0], self.rules_epoch[1]]

    def _catch_up_at_start(self, primary: bool) -> None:
        """Before listening: takes the newest map and (on a primary) the
        newest rules any reachable peer has, so a node that was away does
        not answer from what it missed."""
        assert self.slot_map is not None
        best: tuple[list, Address] | None = None
        for peer in self.other_nodes(self.slot_map):
            try:
                v = self.peers.call_at_start(peer, "CL.CLUSTER", "VERSIONS")
            except (redis.RedisError, OSError):
                continue
            if best is None or _newer(v, best[0]):
                best = (v, peer)
        if best is None:
            return
        (map_version, *_), peer = best
        try:
            if map_version > self.slot_map.version:
                self.install_text(_text(self.peers.call_at_start(peer, "CL.CLUSTER", "MAP")))
            if primary and self.rules_travel:
                self.set_rules(*self.peers.call_at_start(peer, "CL.CLUSTER", "RULES"))
        except (redis.RedisError, OSError, MapError, ReplyError) as e:
            self.log.warning("cluster: could not catch up from %s at start: %s", peer, e)

    async def _catch_up(self) -> None:
        """Compares versions with the next peer in turn and takes what it
        has that is newer."""
        assert self.slot_map is not None
        peers = self.other_nodes(self.slot_map)
        if not peers:
            return
        self._peer_turn = (self._peer_turn + 1) % len(peers)
        peer = peers[self._peer_turn]
        try:
            map_version, counter, origin = await self.peers.call(peer, "CL.CLUSTER", "VERSIONS")
            if map_version > self.slot_map.version:
                self.install_text(_text(await self.peers.call(peer, "CL.CLUSTER", "MAP")))
            if self.is_primary() and self.rules_travel and \
                    (counter, _text(origin)) > self.rules_epoch:
                self.set_rules(*await self.peers.call(peer, "CL.CLUSTER", "RULES"))
        except (TimeoutError, redis.RedisError, OSError, MapError, ReplyError) as e:
            self.log.debug("cluster: catching up from %s: %s", peer, e)

    # ---- one rule set for the whole cluster -----------------------------------------

    @property
    def rules_travel(self) -> bool:
        """Whether rule changes are handed from primary to primary: not
        with a PostgreSQL rules-store, whose table every node follows."""
        return self.app.rules_store is None

    def rules_state(self) -> list:
        """CL.CLUSTER RULES: [counter, origin, the rules as JSON rows]."""
        return [self.rules_epoch[0], self.rules_epoch[1], json.dumps(self.app.rules.export())]

    def set_rules(self, counter, origin, rows) -> bool:
        """CL.CLUSTER SETRULES: takes a newer cluster rule set (all or
        nothing); False if it is not newer than the one in force, or if
        rules do not travel between primaries here (rules_travel)."""
        epoch = (int(counter), _text(origin))
        if epoch <= self.rules_epoch or not self.rules_travel:
            return False
        try:
            self.app.rules.mirror(json.loads(_text(rows)))
        except (RuleError, ValueError, TypeError) as e:
            raise ReplyError(f"ERR rules version {epoch[0]} cannot be used: {e}") from None
        self.rules_epoch = epoch
        self.rules_seen = self.app.rules.version
        self.log.warning("cluster: rules version %d from %s in force", epoch[0], epoch[1][:8])
        return True

    async def rule_change(self, run: Callable[[], object]):
        """A rule change from a client (CL.RULE SET, DEL, RELOAD): refused,
        with nothing changed, unless every other primary answers; then
        made here and handed to each of them before the reply."""
        async with self._rules_lock:
            others = self.other_primaries()
            replies = await self.peers.call_each(others, "CL.CLUSTER", "RULES")
            failed = unreached(replies)
            if failed:
                raise ReplyError(f"CLUSTERDOWN rule change refused, nothing changed: "
                                 f"primaries not reachable: {_reasons(replies, failed)}")
            for state in replies.values():
                self.set_rules(*state)       # a newer set first, as the base
            counter = max([self.rules_epoch[0], *(int(r[0]) for r in replies.values())])
            before = self.app.rules.version
            reply = run()
            if self.app.rules.version == before:
                return reply
            failed = await self._hand_out_rules(counter + 1, others)
            if failed:
                raise ReplyError(
                    f"ERR the rule change is in force here and on {len(others) - len(failed)} "
                    f"of {len(others)} other primaries; not reached: {names(failed)}; they "
                    f"take it from a peer within {CATCH_UP_S:g} s of coming back")
            return reply

    def _rules_changed_here(self) -> None:
        """A change not made through a command (SIGHUP, replication)."""
        if not self.is_primary():
            self.rules_seen = self.app.rules.version
            return
        asyncio.ensure_future(self._hand_out_rules(self.rules_epoch[0] + 1,
                                                   self.other_primaries()))

    async def _hand_out_rules(self, counter: int, others: Iterable[Address]) -> list[Address]:
        self.rules_epoch = (counter, self.my_id)
        self.rules_seen = self.app.rules.version
        replies = await self.peers.call_each(others, "CL.CLUSTER", "SETRULES",
                                             *self.rules_state())
        return unreached(replies)

    # ---- routing -----------------------------------------------------------------

    def _route(self) -> None:
        """Hands the connection layer the slots served here and where the
        others go."""
        assert self.slot_map is not None
        shards = self.slot_map.shards
        moved_to = [self.roles[s.name].primary.redis_form if s.name in self.roles else None
                    for s in shards]
        mine = bytes(1 if s.name in self.roles and self.roles[s.name].primary == self.myself
                     else 0 for s in shards)
        owner = self.slot_map.owner
        served = bytes(mine[owner[slot]] for slot in range(SLOTS))
        self.app.core.set_routing(served, owner, moved_to)
        self.route_updates += 1

    # ---- INFO --------------------------------------------------------------------

    def info_sections(self, sections, named):
        if not self.enabled:
            return {"cluster": {"cluster_enabled": 0}}
        fields: dict[str, object] = {
            "cluster_enabled": 1, "cluster_slot_map_version": self.slot_map.version,
            "cluster_state": self.state(), "cluster_shard": self.my_shard() or "",
            "cluster_route_updates": self.route_updates,
            "cluster_rules_version": self.rules_epoch[0],
            "cluster_peer_calls": self.peers.calls, "cluster_peer_failures": self.peers.failures,
            "cluster_peer_refusals": self.peers.refusals}
        if self.watcher is not None:
            fields.update(self.watcher.info_fields())
        return {"server": {"redis_mode": "cluster"}, "cluster": fields}

    def state(self) -> str:
        """"ok" when every shard has a known primary (every slot is served)."""
        assert self.slot_map is not None
        return "ok" if all(s.name in self.roles for s in self.slot_map.shards) else "fail"

    def slots_served(self) -> int:
        assert self.slot_map is not None
        return sum(r.end - r.start + 1 for s in self.slot_map.shards if s.name in self.roles
                   for r in s.slots)

    # ---- what CLUSTER INFO shows ---------------------------------------------------

    def cluster_info(self) -> dict[str, object]:
        """CLUSTER INFO's fields in Redis 7.0's order (no cluster bus: no
        messages), then fastlimit's."""
        assert self.slot_map is not None
        served = self.slots_served()
        epochs = [r.epoch for r in self.roles.values()]
        mine = self.my_shard()
        nodes = {a for r in self.roles.values() for a in (r.primary, *r.standbys)}
        return {"cluster_state": self.state(), "cluster_slots_assigned": SLOTS,
                "cluster_slots_ok": served, "cluster_slots_pfail": 0,
                "cluster_slots_fail": SLOTS - served, "cluster_known_nodes": len(nodes),
                "cluster_size": len(self.roles), "cluster_current_epoch": max(epochs, default=0),
                "cluster_my_epoch": self.roles[mine].epoch if mine else 0,
                "cluster_stats_messages_sent": 0, "cluster_stats_messages_received": 0,
                "total_cluster_links_buffer_limit_exceeded": 0,
                "cluster_slot_map_version": self.slot_map.version,
                "rules_version": self.rules_epoch[0]}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _newer(versions: list, than: list) -> bool:
    """Whether a peer's VERSIONS reply is ahead of another's."""
    return (versions[0], versions[1], _text(versions[2])) > (than[0], than[1], _text(than[2]))


def _reasons(replies: Mapping[Address, object], failed: Iterable[Address]) -> str:
    """Each failed node with why: its error reply, or that it did not answer."""
    return ", ".join(f"{a} ({replies[a]})" if isinstance(replies[a], redis.ResponseError)
                     else f"{a} (no answer)" for a in failed)


def _sentinel_shards(slot_map: SlotMap) -> tuple:
    return slot_map.sentinels, tuple((s.name, s.sentinel) for s in slot_map.shards if s.sentinel)


def _roles_doc(roles: Roles) -> list:
    return [str(roles.primary), [str(a) for a in roles.standbys], roles.epoch]


def _roles_from_doc(doc: list) -> Roles:
    primary, standbys, epoch = doc
    return Roles(Address.parse(primary, "a takeover's roles"),
                 tuple(Address.parse(a, "a takeover's roles") for a in standbys), epoch)
