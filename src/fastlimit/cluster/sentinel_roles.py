"""Who is primary of each shard, from Redis Sentinel (cluster mode).

Every shard of the slot map that names a Sentinel master is one Sentinel
service; this module keeps, for each, the current primary and its
available standbys, and says when that changes::

    roles = ShardRoles(sentinels, {"fl-0": "fl-0", "fl-1": "fl-1"}, on_change)
    await roles.start()     # one query of every shard, bounded by timeout_s
    roles.roles()           # {shard: Roles(primary, standbys, epoch)}, known shards only
    roles.info_fields()     # counters for INFO
    await roles.stop()      # cancels the tasks, closes every connection

``on_change(view)`` is called with a copy of the whole view each time it
changes (a shard learned, a new primary, a standby gone or back), never
for an unchanged one; it runs on the loop and must not block.

How (cluster.md §3.4-3.5):

- A shard is read from every sentinel at once, as one pipelined
  ``SENTINEL MASTER <name>`` + ``SENTINEL REPLICAS <name>``.  Replicas
  flagged ``s_down``, ``o_down`` or ``disconnected``, or whose link to the
  primary is not ``ok``, are not available.  Of the answers, the highest
  ``config-epoch`` wins (Sentinel raises it with every failover); an
  answer older than the current view is ignored, and at an equal epoch the
  current primary stays.  The standbys are those listed by more than half
  of the answers naming that primary at that epoch: one confused or just
  restarted sentinel of three neither hides a standby nor advertises a
  dead one.
- One pub/sub connection per sentinel follows ``+switch-master``,
  ``+sdown``, ``-sdown``, ``+odown``, ``+slave``, ``+convert-to-slave``
  and ``+failover-end``; an event naming a known master re-reads that
  shard at once (``+switch-master`` carries no epoch, so the answer
  decides), and every (re)subscription re-reads every shard, as events
  may have been missed meanwhile.  Each shard is also re-read every
  ``poll_s``, so a lost message or a restarted sentinel cannot leave the
  view stale.  A quiet subscription is PINGed, so a sentinel that stops
  answering without closing the socket is noticed.
- Every sentinel call is bounded by ``timeout_s``; a sentinel that is
  down is retried every ``RETRY_S`` (its subscription) and at each poll
  (its queries).  The queries say whether it is reachable: one warning
  when they start failing, one info line when they are answered again
  (an answer to a query sent before the last change is stale and changes
  nothing, so the state does not flap).  Nothing queues: a shard re-read requested while one
  runs is one more re-read, however many events asked for it.
- A sentinel that is unreachable without refusing connections delays
  each re-read by up to ``timeout_s``.  A Sentinel config reset to a lower
  epoch on every sentinel is not followed (the higher epoch seen wins
  until restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from fastlimit._resp import parse_integer
from fastlimit.cluster.slot_map import Address, MapError, Roles
from fastlimit.failover import RETRY_S, SWITCH_CHANNEL, parse_switch
from fastlimit.lazy_redis import redis

# The events that may mean a shard's roles changed (cluster.md §3.4).
CHANNELS = (SWITCH_CHANNEL, "+sdown", "-sdown", "+odown", "+slave", "+convert-to-slave",
            "+failover-end")
# Replica flags that make a standby unavailable (Redis lists only healthy ones).
_DOWN_FLAGS = frozenset({b"s_down", b"o_down", b"disconnected"})
# The longest error text kept for INFO.
_ERROR_CHARS = 200
# How long stop() waits for the tasks to end.
STOP_WAIT_S = 2.0

OnChange = Callable[[dict[str, Roles]], None]


def _unreachable() -> tuple[type[BaseException], ...]:
    """A sentinel that cannot be reached, did not answer in time (the
    builtin TimeoutError, which asyncio.timeout raises, is an OSError) or
    answered something that is not RESP.  A function: redis-py is loaded
    when first used (lazy_redis)."""
    return (redis.RedisError, OSError)


class AnswerError(ValueError):
    """A sentinel's answer that names no usable primary."""


def _fields(reply: object) -> dict[bytes, bytes]:
    """A RESP2 flat [key, value, ...] array as a dict of its bulk strings."""
    if not isinstance(reply, list):
        raise AnswerError(f"expected a flat array of fields, got {type(reply).__name__}")
    return {k: v for k, v in zip(reply[::2], reply[1::2], strict=False)
            if isinstance(k, bytes) and isinstance(v, bytes)}


def _address(fields: Mapping[bytes, bytes], what: str) -> Address:
    ip = fields.get(b"ip", b"").decode("utf-8", "replace")
    port = fields.get(b"port", b"").decode("utf-8", "replace")
    try:
        return Address.parse(f"{ip}:{port}", what)
    except MapError as e:
        raise AnswerError(str(e)) from None


def _available(fields: Mapping[bytes, bytes]) -> bool:
    flags = set(fields.get(b"flags", b"").split(b","))
    return not flags & _DOWN_FLAGS and fields.get(b"master-link-status") == b"ok"


def roles_from_answer(master: object, replicas: object) -> Roles:
    """The replies to SENTINEL MASTER and SENTINEL REPLICAS -> Roles, the
    replicas not available left out, and any replica entry without a
    usable address.  AnswerError if the master part is unusable."""
    m = _fields(master)
    primary = _address(m, "sentinel's master")
    epoch = parse_integer(m.get(b"config-epoch", b""))
    if epoch is None or epoch < 0:
        raise AnswerError(f"config-epoch {m.get(b'config-epoch')!r} is not an integer >= 0")
    if not isinstance(replicas, list):
        raise AnswerError("SENTINEL REPLICAS did not answer an array")
    standbys = set()
    for reply in replicas:
        try:
            r = _fields(reply)
            if _available(r):
                standbys.add(_address(r, "sentinel's replica"))
        except AnswerError:
            continue
    standbys.discard(primary)
    return Roles(primary, tuple(sorted(standbys)), epoch)


def choose(current: Roles | None, answers: Sequence[Roles]) -> Roles | None:
    """The view of a shard after one round of answers (in sentinel order):
    the highest epoch wins; an older one than the current is ignored; at
    the current epoch the current primary stays if any answer names it;
    else the primary most answers name (the first sentinel's on a tie).
    Standbys: those listed by more than half of the answers naming that
    primary at that epoch."""
    if not answers:
        return current
    top = max(a.epoch for a in answers)
    if current is not None and top < current.epoch:
        return current
    best = [a for a in answers if a.epoch == top]
    if current is not None and top == current.epoch and any(
            a.primary == current.primary for a in best):
        primary = current.primary
    else:
        counts = Counter(a.primary for a in best)
        primary = max(counts, key=lambda p: (counts[p], -next(
            i for i, a in enumerate(best) if a.primary == p)))
    agreeing = [a for a in best if a.primary == primary]
    listed = Counter(s for a in agreeing for s in a.standbys)
    standbys = sorted(s for s, n in listed.items() if 2 * n > len(agreeing))
    return Roles(primary, tuple(standbys), top)


def event_master(channel: bytes | str, data: bytes | str, names: set[str]) -> str | None:
    """The master name an event is about, if it is one of names.
    ``+switch-master``: ``<name> <old ip> <old port> <new ip> <new port>``;
    the others: ``<type> <name> <ip> <port> @ <master> <ip> <port>``, or
    ``master <name> <ip> <port> ...`` when the instance is a master."""
    if isinstance(channel, bytes):
        channel = channel.decode("utf-8", "replace")
    if channel == SWITCH_CHANNEL:
        switch = parse_switch(data, names)
        return switch[0] if switch is not None else None
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    parts = data.split()
    if "@" in parts:
        after = parts[parts.index("@") + 1:]
        name = after[0] if after else None
    elif len(parts) >= 2 and parts[0] == "master":
        name = parts[1]
    else:
        name = None
    return name if name in names else None


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:_ERROR_CHARS]


@dataclass(eq=False)
class _Sentinel:
    """One sentinel: its client (a pool of at most one connection per
    shard plus the subscription) and whether its queries are answered."""

    addr: Address
    client: redis.asyncio.Redis
    up: bool | None = None       # None: not tried yet
    # When the query that last changed `up` was sent: a query sent before
    # it and ending after it is stale (it timed out against a sentinel
    # that has answered since), and changes nothing.
    since: float = 0.0


class ShardRoles:
    """The roles of the shards whose primary Sentinel chooses (see the
    module docstring).  ``masters`` maps shard name -> Sentinel master name."""

    def __init__(self, sentinels: Sequence[Address], masters: Mapping[str, str],
                 on_change: OnChange, *, password: bytes | None = None,
                 poll_s: float = 1.0, timeout_s: float = 0.5,
                 log: logging.Logger | None = None):
        if not sentinels:
            raise ValueError("at least one sentinel is needed")
        if poll_s <= 0 or timeout_s <= 0:
            raise ValueError("poll_s and timeout_s must be > 0")
        self._addrs = tuple(sentinels)
        self._masters = dict(masters)
        self._names = set(self._masters.values())
        self._on_change = on_change
        self._password = password
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._log = log or logging.getLogger("fastlimit")
        self._view: dict[str, Roles] = {}
        self._sentinels: list[_Sentinel] = []
        self._wake = {shard: asyncio.Event() for shard in self._masters}
        self._tasks: list[asyncio.Task] = []
        self._updates = 0
        self._events = 0
        self._last_error = ""

    # -- interface --------------------------------------------------------

    async def start(self) -> None:
        """Reads every shard once (returns within about timeout_s, whatever
        the sentinels' state), then follows them in background tasks."""
        if self._sentinels:
            raise RuntimeError("ShardRoles started twice")
        self._sentinels = [_Sentinel(a, self._client(a)) for a in self._addrs]
        changed = await asyncio.gather(*(self._refresh(s) for s in self._masters))
        if any(changed):
            self._publish()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._subscribe(s), name=f"sentinel-events {s.addr}")
                       for s in self._sentinels]
        self._tasks += [loop.create_task(self._follow(shard), name=f"shard-roles {shard}")
                        for shard in self._masters]

    def roles(self) -> dict[str, Roles]:
        """The current view: the shards some sentinel has answered for."""
        return dict(self._view)

    def info_fields(self) -> dict[str, object]:
        return {
            "cluster_sentinels": len(self._addrs),
            "cluster_sentinels_reachable": sum(1 for s in self._sentinels if s.up),
            "cluster_shards_known": len(self._view),
            "cluster_role_updates": self._updates,
            "cluster_sentinel_events": self._events,
            "cluster_sentinel_last_error": self._last_error,
        }

    async def stop(self) -> None:
        """Cancels every task and closes every sentinel connection, within
        about STOP_WAIT_S.  A cancellation that lands as one of redis-py's
        own timeouts fires can be swallowed (asyncio.timeout's race in
        3.11): the tasks are cancelled again until they end."""
        pending, self._tasks = set(self._tasks), []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_WAIT_S
        while pending and loop.time() < deadline:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        if pending:
            self._log.warning("cluster: %d Sentinel task(s) did not stop", len(pending))
        for s in self._sentinels:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._timeout_s):
                    await s.client.aclose()

    # -- reading a shard --------------------------------------------------

    def _client(self, addr: Address) -> redis.asyncio.Redis:
        # RESP2 (redis-py 8 defaults to RESP3): flat replies, plain pub/sub
        # frames.  No retries inside redis-py (its default retries with
        # backoff for seconds): a failed call is the answer, the next poll
        # the retry.
        # redis-py sends a bytes password as it is; its annotation says str.
        password = cast(str | None, self._password)
        return redis.asyncio.Redis(
            host=addr.host, port=addr.port, password=password, protocol=2,
            socket_timeout=self._timeout_s, socket_connect_timeout=self._timeout_s,
            retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0),
            max_connections=len(self._masters) + 1)

    async def _ask(self, s: _Sentinel, master: str) -> Roles | None:
        """One sentinel's answer for master, None if it has none."""
        sent = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(self._timeout_s):
                async with s.client.pipeline(transaction=False) as pipe:
                    pipe.execute_command("SENTINEL", "MASTER", master)
                    pipe.execute_command("SENTINEL", "REPLICAS", master)
                    master_reply, replicas_reply = await pipe.execute(raise_on_error=False)
        except _unreachable() as e:
            self._down(s, sent, e)
            return None
        self._up(s, sent)
        try:
            for reply in (master_reply, replicas_reply):
                if isinstance(reply, Exception):
                    raise AnswerError(_short(reply))
            return roles_from_answer(master_reply, replicas_reply)
        except AnswerError as e:
            self._error(s, f"{master}: {e}")
            return None

    async def _refresh(self, shard: str) -> bool:
        """Reads shard from every sentinel; True if its roles changed."""
        master = self._masters[shard]
        answers = await asyncio.gather(*(self._ask(s, master) for s in self._sentinels))
        current = self._view.get(shard)
        new = choose(current, [a for a in answers if a is not None])
        if new is None or new == current:
            return False
        self._view[shard] = new
        return True

    async def _follow(self, shard: str) -> None:
        """Re-reads shard when an event asks, or every poll_s."""
        wake = self._wake[shard]
        while True:
            try:
                async with asyncio.timeout(self._poll_s):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
            try:
                if await self._refresh(shard):
                    self._publish()
            except Exception:      # a bug here must not stop the shard being followed
                self._log.exception("cluster: reading shard %s from Sentinel failed", shard)

    def _publish(self) -> None:
        self._updates += 1
        try:
            self._on_change(dict(self._view))
        except Exception:
            self._log.exception("cluster: the shard roles callback failed")

    # -- events -----------------------------------------------------------

    async def _subscribe(self, s: _Sentinel) -> None:
        """Follows s's events, reconnecting every RETRY_S while it is down."""
        while True:
            pubsub = s.client.pubsub()
            try:
                async with asyncio.timeout(self._timeout_s):
                    await pubsub.subscribe(*CHANNELS)
                for wake in self._wake.values():     # events may have been missed
                    wake.set()
                await self._listen(pubsub)
            except _unreachable() as e:
                # The queries (every poll_s) say whether s is reachable;
                # the subscription only retries, quietly.
                self._error(s, f"subscription: {_short(e)}")
            except Exception:      # a bug here must not stop the events being followed
                self._log.exception("cluster: following sentinel %s failed", s.addr)
            finally:
                await pubsub.aclose()
            await asyncio.sleep(RETRY_S)

    async def _listen(self, pubsub: redis.asyncio.client.PubSub) -> None:
        """Reads events until the link fails; PINGs after poll_s of
        silence and gives up if nothing comes back within timeout_s."""
        pinged = False
        while True:
            message = await pubsub.get_message(
                timeout=self._timeout_s if pinged else self._poll_s)
            if message is None:
                if pinged:
                    raise TimeoutError("no reply to PING on the subscription")
                await pubsub.ping()
                pinged = True
                continue
            pinged = False
            if message["type"] == "message":
                name = event_master(message["channel"], message["data"], self._names)
                if name is not None:
                    self._events += 1
                    for shard, master in self._masters.items():
                        if master == name:
                            self._wake[shard].set()

    # -- sentinel state, from the queries, logged on change only ------------

    def _up(self, s: _Sentinel, sent: float) -> None:
        if s.up is not True and sent >= s.since:
            if s.up is False:
                self._log.info("cluster: sentinel %s is reachable again", s.addr)
            s.up, s.since = True, sent

    def _down(self, s: _Sentinel, sent: float, error: BaseException) -> None:
        self._error(s, _short(error))
        if s.up is not False and sent >= s.since:
            self._log.warning("cluster: sentinel %s unreachable (%s); retrying",
                              s.addr, _short(error))
            s.up, s.since = False, sent

    def _error(self, s: _Sentinel, text: str) -> None:
        self._last_error = f"{s.addr}: {text}"[:_ERROR_CHARS]

