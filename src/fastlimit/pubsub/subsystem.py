"""Pub/Sub: which connections listen to which channels and patterns, and
delivery of PUBLISH to them, framed as Redis 7.0 frames it (a RESP2
array, or a RESP3 push).  Sentinels find each other through it.

The registry maps a channel (or pattern) to its subscribers in the order
they subscribed, and each connection keeps its own channels and patterns
(``Connection.pubsub_channels`` / ``pubsub_patterns``) so that leaving,
RESET and a closed connection cost only what that client holds.  A
subscriber is written to at once and never waited for: past the
``client-output-buffer-limit`` pubsub class it is dropped (see
``Connection.push``), and what its subscriptions hold counts against
the same class's hard limit (Redis bounds neither).  Pattern matching is Redis's glob in C
(``fastlimit._protocol.glob``), once per pattern per PUBLISH.

A subsystem (``server/subsystem.py``): the Server holds it as
``app.pubsub``; it takes the pubsub output class from the settings and
adds its INFO fields.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from fastlimit._protocol import glob
from fastlimit._resp import ReplyError
from fastlimit.server.subsystem import Subsystem

# Estimated bytes per registry entry beyond the name (the name's bytes
# object, the entry in the registry and in the client's own dict, the
# dict of subscribers), and per further subscriber of an entry.
ENTRY_BYTES = sys.getsizeof(b"") + sys.getsizeof({}) + 2 * 64
SUBSCRIBER_BYTES = 2 * 64


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _frame(proto: int, count: int, body: bytes) -> bytes:
    """A pub/sub frame: an array on RESP2, a push on RESP3."""
    return b"%c%d\r\n%s" % (62 if proto == 3 else 42, count, body)


class _Frames:
    """One message's frame for each protocol, made the first time a
    subscriber of that protocol needs it."""

    __slots__ = ("count", "body", "made")

    def __init__(self, count: int, body: bytes):
        self.count, self.body = count, body
        self.made: dict[int, bytes] = {}

    def get(self, proto: int) -> bytes:
        frame = self.made.get(proto)
        if frame is None:
            frame = self.made[proto] = _frame(proto, self.count, self.body)
        return frame


class PubSub(Subsystem):
    def __init__(self, core):
        self.core = core
        self.channels: dict[bytes, dict] = {}     # channel -> {connection: None}
        self.patterns: dict[bytes, dict] = {}     # pattern -> {connection: None}
        self.memory_bytes = 0

    # ---- the subsystem's calls ------------------------------------------------

    def apply_settings(self, settings) -> None:
        core = self.core
        core.pubsub_hard_limit, core.pubsub_soft_limit, core.pubsub_soft_seconds = \
            settings.client_output_buffer_limit["pubsub"]

    def info_sections(self, sections: frozenset[str],
                      named: frozenset[str]) -> Mapping[str, Mapping[str, object]]:
        return {"stats": self.stats_info(), "memory": self.memory_info()}

    def stats_info(self) -> dict:
        return {"pubsub_channels": len(self.channels), "pubsub_patterns": len(self.patterns)}

    def memory_info(self) -> dict:
        return {"mem_pubsub": self.memory_bytes}

    # ---- subscribing ------------------------------------------------------------

    def subscribe(self, conn, names: list[bytes], pattern: bool) -> None:
        """(P)SUBSCRIBE: one confirmation per name, with the client's
        subscription count after it (a name already held counts once)."""
        mine, registry = self._side(conn, pattern)
        kind = b"p" * pattern + b"subscribe"
        self._check_room(conn, mine, names)
        if mine is None:
            mine = {}
            if pattern:
                conn.pubsub_patterns = mine
            else:
                conn.pubsub_channels = mine
        conn.subscribed = True
        for name in names:
            if name not in mine:
                mine[name] = None
                conn.pubsub_bytes += ENTRY_BYTES + len(name)
                self._add(registry, name, conn)
            conn.push(self._confirmation(conn, kind, _bulk(name)))

    def unsubscribe(self, conn, names: list[bytes], pattern: bool) -> None:
        """(P)UNSUBSCRIBE: one confirmation per name; with no names, one
        per name held, or a single one with a null name when none is."""
        mine, registry = self._side(conn, pattern)
        kind = b"p" * pattern + b"unsubscribe"
        if not names:
            names = list(mine or ())
            if not names:
                conn.push(self._confirmation(conn, kind, b"_\r\n" if conn.proto == 3
                                             else b"$-1\r\n"))
        for name in names:
            if mine is not None and name in mine:
                del mine[name]
                conn.pubsub_bytes -= ENTRY_BYTES + len(name)
                self._remove(registry, name, conn)
            self._update_mode(conn)
            conn.push(self._confirmation(conn, kind, _bulk(name)))

    def forget(self, conn) -> None:
        """Drops every subscription of a client, without telling it (RESET,
        a closed connection, a client dropped past its output limits)."""
        for names, registry in ((conn.pubsub_channels, self.channels),
                                (conn.pubsub_patterns, self.patterns)):
            for name in names or ():
                self._remove(registry, name, conn)
        conn.pubsub_channels = conn.pubsub_patterns = None
        conn.subscribed = False
        conn.pubsub_bytes = 0

    def restore(self, conn, channels: list[bytes], patterns: list[bytes]) -> None:
        """The subscriptions of a connection passed by a takeover
        (takeover/), with no confirmation: the client made them with the
        process before."""
        for names, pattern in ((channels, False), (patterns, True)):
            if not names:
                continue
            mine: dict = {}
            registry = self.patterns if pattern else self.channels
            for name in names:
                mine[name] = None
                conn.pubsub_bytes += ENTRY_BYTES + len(name)
                self._add(registry, name, conn)
            if pattern:
                conn.pubsub_patterns = mine
            else:
                conn.pubsub_channels = mine
        self._update_mode(conn)

    def _check_room(self, conn, mine: dict | None, names: list[bytes]) -> None:
        """Refuses, before any of it is done, a (P)SUBSCRIBE that would take
        the client's subscriptions past the pubsub class's hard limit."""
        limit = self.core.pubsub_hard_limit
        if limit <= 0:
            return
        new = {n for n in names if mine is None or n not in mine}
        needed = conn.pubsub_bytes + sum(ENTRY_BYTES + len(n) for n in new)
        if needed > limit:
            raise ReplyError(f"ERR this client's subscriptions would hold {needed} bytes, over "
                             f"client-output-buffer-limit pubsub ({limit} bytes)")

    def _side(self, conn, pattern: bool):
        if pattern:
            return conn.pubsub_patterns, self.patterns
        return conn.pubsub_channels, self.channels

    def _add(self, registry: dict, name: bytes, conn) -> None:
        subscribers = registry.get(name)
        if subscribers is None:
            subscribers = registry[name] = {}
            self.memory_bytes += ENTRY_BYTES + len(name)
        subscribers[conn] = None
        self.memory_bytes += SUBSCRIBER_BYTES

    def _remove(self, registry: dict, name: bytes, conn) -> None:
        subscribers = registry[name]
        del subscribers[conn]
        self.memory_bytes -= SUBSCRIBER_BYTES
        if not subscribers:
            del registry[name]       # no subscriber left: nothing kept for it
            self.memory_bytes -= ENTRY_BYTES + len(name)

    @staticmethod
    def _update_mode(conn) -> None:
        conn.subscribed = bool(conn.pubsub_channels or conn.pubsub_patterns)

    @staticmethod
    def _confirmation(conn, kind: bytes, name: bytes) -> bytes:
        count = len(conn.pubsub_channels or ()) + len(conn.pubsub_patterns or ())
        return _frame(conn.proto, 3, b"%s%s:%d\r\n" % (_bulk(kind), name, count))

    # ---- publishing ---------------------------------------------------------------

    def publish(self, channel: bytes, message: bytes) -> int:
        """Delivers to the channel's subscribers, then to those of every
        matching pattern, as Redis does; the number of receivers."""
        receivers = 0
        dropped: list = []
        subscribers = self.channels.get(channel)
        if subscribers:
            frames = _Frames(3, b"$7\r\nmessage\r\n%s%s" % (_bulk(channel), _bulk(message)))
            receivers += self._deliver(subscribers, frames, dropped)
        if self.patterns:
            tail = _bulk(channel) + _bulk(message)
            for pattern, subscribers in self.patterns.items():
                if glob(pattern, channel):
                    frames = _Frames(4, b"$8\r\npmessage\r\n%s%s" % (_bulk(pattern), tail))
                    receivers += self._deliver(subscribers, frames, dropped)
        for conn in dropped:
            if conn.subscribed:
                self.forget(conn)
        return receivers

    @staticmethod
    def _deliver(subscribers: dict, frames: _Frames, dropped: list) -> int:
        for conn in subscribers:
            if not conn.push(frames.get(conn.proto)):
                dropped.append(conn)      # forgotten after the loop, not during it
        return len(subscribers)

    # ---- PUBSUB ---------------------------------------------------------------------

    def channel_names(self, pattern: bytes | None) -> list[bytes]:
        if pattern is None:
            return list(self.channels)
        return [c for c in self.channels if glob(pattern, c)]

    def numsub(self, channel: bytes) -> int:
        return len(self.channels.get(channel, ()))
