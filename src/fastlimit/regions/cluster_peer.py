"""A peer region whose tier is a cluster (``region-peers
eu=cluster:<seed>,...``; README, "A region that is a cluster"): one
PeerLink (links.py) to each of its primaries, and its slot map, asked of
a primary with ``CLUSTER SLOTS`` every CLUSTER_REFRESH_S (and after a
``MOVED``), so that each bucket's spends and each home check go to the
shard that serves the bucket's key.

Until the first map arrives the seeds are the links; spends made
meanwhile wait, merged per bucket (at most MAX_UNROUTED of them; past it
they are dropped and counted).  A shard's unacknowledged batches stay
with its link: a shard that stops serving a key has its spends still
debited there (the receiver skips and counts a key it no longer serves,
regions/subsystem.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import hiredis

from fastlimit.cluster.client import ClusterMapError, SlotMap, primaries_by_slot
from fastlimit.regions.links import PeerLink
from fastlimit.regions.shares import PeerAddress
from fastlimit.regions.wire import encode_batches
from fastlimit.server.subsystem import info_text

CLUSTER_REFRESH_S = 5.0         # the slot map asked again this often
MAX_UNROUTED = 100_000          # buckets whose spends wait for the first map


def split_address(text: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" (cluster/client.py's form)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class ClusterPeer:
    """The links to one peer region's cluster, used as one link is."""

    def __init__(self, owner, name: str, address: PeerAddress, incarnations: Callable[[], int]):
        self.owner = owner
        self.name, self.address = name, address
        self.incarnations = incarnations        # a new link's incarnation (its batches' run)
        self.nodes: dict[str, PeerLink] = {}     # "host:port" -> its link
        self.map: SlotMap[str] | None = None
        self.unrouted: dict[tuple[int, bytes], int] = {}
        self.unrouted_dropped = 0
        self.refreshes = 0
        self.moved = 0
        self.last_error = ""
        self.started = False
        self._refresh_at = 0.0
        self._names: Mapping[int, str] = {}
        self._route: Callable[[int, bytes], bytes] = lambda num, key: key
        for host, port in address.sentinels:       # the seeds
            self._link(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")

    def _link(self, node: str) -> PeerLink:
        link = self.nodes.get(node)
        if link is None:
            host, port = split_address(node)
            link = PeerLink(self.owner, self.name, PeerAddress(host, port), self.incarnations())
            self.nodes[node] = link
            if self.started:
                link.start()
        return link

    # ---- as a link -----------------------------------------------------------------------

    def start(self) -> None:
        self.started = True
        for link in self.nodes.values():
            link.start()

    def stop(self) -> asyncio.Future | None:
        tasks = [t for t in (link.stop() for link in self.nodes.values()) if t is not None]
        return asyncio.gather(*tasks, return_exceptions=True) if tasks else None

    def tick(self) -> None:
        for link in self.nodes.values():
            link.tick()
        if time.monotonic() >= self._refresh_at:
            self.refresh()

    def reachable(self, within_s: float) -> bool:
        """Whether every shard (before the first map, every seed) answered
        within within_s, or its link started that recently."""
        return all(link.reachable(within_s) for link in self.nodes.values())

    def send_spends(self, spends: Mapping[tuple[int, bytes], int], names: Mapping[int, str],
                    route: Callable[[int, bytes], bytes]) -> int:
        """Each bucket's spends queued on the link to its shard (route: the
        key its slot comes from); the batches queued."""
        self._names, self._route = names, route
        if self.map is None:
            for bucket, cost in spends.items():
                if bucket in self.unrouted or len(self.unrouted) < MAX_UNROUTED:
                    self.unrouted[bucket] = self.unrouted.get(bucket, 0) + cost
                else:
                    self.unrouted_dropped += 1
            return 0
        by_node: dict[str, dict[tuple[int, bytes], int]] = {}
        for (num, key), cost in spends.items():
            by_node.setdefault(self.map.node_for(route(num, key)), {})[(num, key)] = cost
        queued = 0
        for node, part in by_node.items():
            link = self._link(node)
            for batch in encode_batches(part, names):
                link.enqueue(batch)
                queued += 1
        return queued

    def call(self, args: list[bytes], answered, route_key: bytes | None = None) -> None:
        """A command to the shard serving route_key; a MOVED answer is
        followed once (and the map asked again)."""
        if self.map is None or route_key is None:
            answered(None)
            return

        def first(reply) -> None:
            if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("MOVED "):
                self.moved += 1
                parts = str(reply).split()
                self._refresh_at = 0.0
                if len(parts) == 3 and parts[1].isdigit() and self.map is not None:
                    self.map = self.map.moved(int(parts[1]), parts[2])
                    self._link(parts[2]).call(args, answered)
                    return
            answered(reply)
        self._link(self.map.node_for(route_key)).call(args, first)

    # ---- the slot map ------------------------------------------------------------------------

    def refresh(self) -> None:
        """CLUSTER SLOTS asked of a shard whose link is up; its answer
        makes the map, a link for each primary, and stops the others'."""
        self._refresh_at = time.monotonic() + (CLUSTER_REFRESH_S if self.map is not None
                                               else 0.2)
        up = [link for link in self.nodes.values() if link.shown_state == "up"]
        if up:
            asker = up[self.refreshes % len(up)]
            self.refreshes += 1
            asker.call([b"CLUSTER", b"SLOTS"], lambda reply: self._slots(asker.host, reply))

    def _slots(self, host: str, reply) -> None:
        if reply is None:
            return
        try:
            nodes, slots = primaries_by_slot(reply, host)
        except ClusterMapError as e:
            self.last_error = info_text(str(e))
            return
        self.map = SlotMap(nodes, slots)
        for node in nodes:
            self._link(node)
        for node in [n for n in self.nodes if n not in nodes]:
            self.nodes.pop(node).stop()
        if self.unrouted:
            waiting, self.unrouted = self.unrouted, {}
            self.send_spends(waiting, self._names, self._route)

    # ---- what it shows -------------------------------------------------------------------------

    @property
    def links(self) -> list[PeerLink]:
        return list(self.nodes.values())

    @property
    def shown_state(self) -> str:
        if self.map is None:
            return "connect"
        states = {link.shown_state for link in self.nodes.values()}
        return "up" if states == {"up"} else "partial" if "up" in states else "connect"

    @property
    def last_reply(self) -> float:
        return min((link.last_reply for link in self.nodes.values()), default=0.0)

    @property
    def lag_ms(self) -> float:
        return max((link.lag_ms for link in self.nodes.values()), default=0.0)

    @property
    def lag_max_ms(self) -> float:
        return max((link.lag_max_ms for link in self.nodes.values()), default=0.0)

    @property
    def bytes_sent(self) -> int:
        return sum(link.bytes_sent for link in self.nodes.values())

    @property
    def queued_bytes(self) -> int:
        return sum(link.queued_bytes for link in self.nodes.values())

    @property
    def batches_dropped(self) -> int:
        return sum(link.batches_dropped for link in self.nodes.values())

    def info(self) -> str:
        shards = "+".join(f"{node}:{link.shown_state}" for node, link in self.nodes.items())
        return (f"name={self.name},via=cluster,state={self.shown_state},shards={shards},"
                f"last_reply_ms={int((time.monotonic() - self.last_reply) * 1000)},"
                f"lag_ms={self.lag_ms:.1f},lag_max_ms={self.lag_max_ms:.1f},"
                f"queued_bytes={self.queued_bytes},bytes_sent={self.bytes_sent},"
                f"batches_acked={sum(link.batches_acked for link in self.nodes.values())},"
                f"batches_dropped={self.batches_dropped},"
                f"unrouted={len(self.unrouted)},unrouted_dropped={self.unrouted_dropped},"
                f"map_refreshes={self.refreshes},moved={self.moved},"
                f"last_error={self.last_error or self._link_error()}")

    def _link_error(self) -> str:
        return next((link.last_error for link in self.nodes.values() if link.last_error), "")
