"""Cluster mode for ``Client`` and ``AsyncClient``: the slot map.

A fastlimit cluster (or any Redis Cluster) splits the 16384 hash slots
between primaries and answers ``CLUSTER SLOTS`` with who serves which.
The client keeps that as one array of node indices, one entry a slot, so
routing a call costs one CRC16 (in C) and two indexings, with no state per
key.  A node that does not serve a key answers ``-MOVED <slot> <ip>:<port>``:
the client re-sends there at once, patches that slot, and refreshes the
whole map in the background (``RefreshGate``: one refresh in flight, at
most one start per interval, however many calls asked).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from fastlimit._cluster import keyslot

SLOTS = 16384
# MOVED replies one call follows before its failure policy answers it.
MAX_REDIRECTS = 5
# Each question about the map (CLUSTER SLOTS) to one node.
DEFAULT_CLUSTER_TIMEOUT_MS = 100
# Between the starts of two map refreshes: a dead node's failing calls
# each ask for one, and must not turn into a loop of CLUSTER SLOTS.
REFRESH_INTERVAL_S = 0.1

N = TypeVar("N")


class ClusterMapError(Exception):
    """No usable slot map: no node answered CLUSTER SLOTS with one
    covering every slot."""


def primaries_by_slot(reply, asked_host: str) -> tuple[list[str], array]:
    """A ``CLUSTER SLOTS`` reply -> the primaries' "host:port" (in order of
    appearance) and, for each slot, the index of its primary.

    Raises ClusterMapError when the reply is malformed, overlaps, or leaves
    a slot without a primary.  An empty host means the node asked, as in
    Redis.
    """
    if not isinstance(reply, list):
        raise ClusterMapError(f"CLUSTER SLOTS answered {reply!r}, not a list")
    addresses: list[str] = []
    index: dict[str, int] = {}
    slots = array("H", [0]) * SLOTS
    owned = bytearray(SLOTS)
    for entry in reply:
        start, end, address = _slot_range(entry, asked_host)
        if address not in index:
            index[address] = len(addresses)
            addresses.append(address)
        if any(owned[start:end + 1]):
            raise ClusterMapError(f"CLUSTER SLOTS lists slots in {start}-{end} twice")
        owned[start:end + 1] = b"\x01" * (end + 1 - start)
        slots[start:end + 1] = array("H", [index[address]]) * (end + 1 - start)
    missing = owned.count(0)
    if missing:
        raise ClusterMapError(f"CLUSTER SLOTS covers {SLOTS - missing} of {SLOTS} slots; "
                              f"uncovered: {_ranges(owned)}")
    return addresses, slots


def _slot_range(entry, asked_host: str) -> tuple[int, int, str]:
    """One entry, ``[start, end, [host, port, ...], replicas...]``."""
    if (not isinstance(entry, list) or len(entry) < 3 or not isinstance(entry[2], list)
            or len(entry[2]) < 2):
        raise ClusterMapError(f"CLUSTER SLOTS entry {entry!r} has no primary")
    start, end, (host, port, *_) = entry[0], entry[1], entry[2]
    if not (type(start) is int and type(end) is int and 0 <= start <= end < SLOTS
            and type(port) is int and 0 < port < 65536):
        raise ClusterMapError(f"CLUSTER SLOTS entry {entry!r} is not a slot range and a port")
    if isinstance(host, bytes):
        host = host.decode("utf-8", "replace")
    if not isinstance(host, str):
        raise ClusterMapError(f"CLUSTER SLOTS entry {entry!r} has no host")
    host = host or asked_host
    return start, end, f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _ranges(owned: bytearray) -> str:
    """The slots still 0 in owned, as "a-b, c" (the first few)."""
    out: list[str] = []
    slot = owned.find(0)
    while slot >= 0 and len(out) < 8:
        end = owned.find(1, slot)
        end = SLOTS if end < 0 else end
        out.append(f"{slot}-{end - 1}" if end - 1 > slot else str(slot))
        slot = owned.find(0, end)
    return ", ".join(out) + (", ..." if slot >= 0 else "")


class SlotMap(Generic[N]):
    """Each slot's node.  Never changed in place: a MOVED patch or a
    refresh makes a new one, so a thread reading the client's map sees
    one whole map."""

    __slots__ = ("nodes", "slots")

    def __init__(self, nodes: Sequence[N], slots: array):
        self.nodes = tuple(nodes)
        self.slots = slots

    def node_for(self, route_key: bytes) -> N:
        return self.nodes[self.slots[keyslot(route_key)]]

    def moved(self, slot: int, node: N) -> SlotMap[N]:
        """This map with slot served by node."""
        nodes = self.nodes if node in self.nodes else (*self.nodes, node)
        slots = array("H", self.slots)
        slots[slot] = nodes.index(node)
        return SlotMap(nodes, slots)


class RefreshGate:
    """Coalesces refresh requests: ``ask()`` says whether to start a
    refresh (none is running), else marks one more as wanted, and
    ``finished()`` whether to run that one; each start waits ``wait_s()``
    so starts are at least ``interval_s`` apart.  Thread-safe."""

    def __init__(self, interval_s: float = REFRESH_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self._running = False
        self._again = False
        self._last_start = -interval_s
        self._lock = threading.Lock()

    def ask(self) -> bool:
        with self._lock:
            if self._running:
                self._again = True
                return False
            self._running = True
            return True

    def wait_s(self) -> float:
        """How long to wait before starting; the start is then counted."""
        with self._lock:
            now = self.clock()
            start = max(now, self._last_start + self.interval_s)
            self._last_start = start
            return start - now

    def finished(self) -> bool:
        """True: run once more (asked meanwhile); False: the gate is open again."""
        with self._lock:
            again, self._again = self._again, False
            self._running = again
            return again
