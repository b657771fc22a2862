"""Cluster mode: this node's part of one fastlimit tier spread over many
processes, spoken to clients as Redis Cluster (hash slots, CLUSTER SLOTS,
-MOVED).

The slot map (``cluster/map.py``, read from ``cluster-config-file``) says
which shard owns each slot.  Who is primary of each shard comes from the
map for static shards, and from Redis Sentinel for the others
(``shard_roles.ShardRoles``): Sentinel stays the only thing that detects
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

import logging
from collections.abc import Mapping

from fastlimit._cluster import SLOTS
from fastlimit.cluster import map as clustermap
from fastlimit.cluster.map import Address, MapError, Roles, SlotMap
from fastlimit.server.subsystem import Subsystem


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

    @property
    def enabled(self) -> bool:
        return self.slot_map is not None

    def load(self, settings) -> None:
        """Reads the slot map at start; MapError (the server refuses to
        start) if it cannot be used."""
        if settings.cluster_enabled:
            self.slot_map = clustermap.load(settings.cluster_config_file)
            self.roles = clustermap.static_roles(self.slot_map)

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
        the port is not known yet (port 0 before the listener is up)."""
        port = settings.cluster_announce_port or self.app.port
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
        self.log.info("cluster mode: slot map version %d, %d shard(s); this node is %s",
                      self.slot_map.version, len(self.slot_map.shards), self.myself)

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

    def _merge_roles(self) -> None:
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
        if roles != self.roles:
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
            "cluster_route_updates": self.route_updates}
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
                "cluster_slot_map_version": self.slot_map.version}
