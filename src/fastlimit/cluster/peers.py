"""Calls from this node to the other nodes of its cluster (slot maps, rules
and moving buckets are handed over this way), each one bounded in time,
and the proof the two ends of a call give each other first.

Connections are kept per node, so there are at most as many as the map
names nodes; a node that fails to answer loses its connection and gets
a new one on the next call.  With tls-cluster they call each other's
tls-port over TLS.

Nodes prove who they are on each new connection (CL.PEERAUTH), before
anything else goes over it.  The calling node asks for a challenge and
answers it with an HMAC-SHA256, keyed on the SHA-256 of cluster-password,
over its role, cluster-user, the address it means to reach, the challenge
and a nonce of its own.  The called node checks it against the hashes its
ACL holds for cluster-user, runs the connection as that user from then
on, and answers with the HMAC over the same values in its own role.  Only
once that answer checks out does the calling node send a command or read
a reply.  So the password never travels, and a proof is good for one
connection to one node: a challenge names its connection and expires,
the nonce makes each answer new, and the address makes a proof relayed
to another node worthless.  What goes over the connection after the
proofs is protected only by tls-cluster.

Without cluster-password (allowed only while the server is bound to
loopback: settings refuse it otherwise) nodes call each other without
proof, and only at loopback addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastlimit.cluster.slot_map import Address
from fastlimit.lazy_redis import redis
from fastlimit.server.config import is_loopback

# A node slower than this is taken as not reachable.
CALL_TIMEOUT_S = 1.0
# At start the server does not listen yet: a peer gets less time.
START_TIMEOUT_S = 0.3
# A challenge not answered within this is refused (a peer answers in one
# round trip; this only has to outlast a slow one).
CHALLENGE_TTL_MS = 10_000

# What cluster-user must be allowed: every command a node sends another
# (cluster/subsystem.py's and cluster/reshard.py's calls), and nothing else.
LINK_PERMISSIONS = ("+cl.cluster|versions", "+cl.cluster|map", "+cl.cluster|rules",
                    "+cl.cluster|setrules", "+cl.cluster|setmap", "+cl.cluster|import")

PROTOCOL = b"fastlimit-cluster-1"
CALLER, CALLED = b"caller", b"called"

# (cluster-user, cluster-password), or None: no proofs.
Credentials = tuple[str, bytes] | None


def password_key(password: bytes) -> bytes:
    """What a proof is keyed on: the SHA-256 of the password, which is what
    an ACL user keeps of it (acl.hash_password, in hex)."""
    return hashlib.sha256(password).digest()


def proof(key: bytes, role: bytes, user: str, address: str, challenge: bytes,
          nonce: bytes) -> bytes:
    """One end's proof that it holds key, for this exchange only."""
    message = b"\0".join((PROTOCOL, role, user.encode("utf-8", "surrogateescape"),
                          address.encode(), challenge, nonce))
    return hmac.new(key, message, hashlib.sha256).hexdigest().encode()


def answer(keys: Iterable[bytes], user: str, address: str, challenge: bytes, nonce: bytes,
           given: bytes) -> bytes | None:
    """The called node's side: its own proof if given is the caller's proof
    under one of keys (the user's password hashes), else None."""
    for key in keys:
        if hmac.compare_digest(proof(key, CALLER, user, address, challenge, nonce), given):
            return proof(key, CALLED, user, address, challenge, nonce)
    return None


class NotProven(Exception):
    """The called node did not prove itself (or is not to be called)."""


class Challenges:
    """The called node's challenges.  Each names the connection it was given
    on and when, under a MAC only this process can make, so nothing is
    kept per connection, and one is refused on any other connection or
    once CHALLENGE_TTL_MS old."""

    def __init__(self):
        self._key = os.urandom(32)

    def issue(self, conn_id: int) -> bytes:
        body = b"%d.%d.%s" % (conn_id, _now_ms(), secrets.token_hex(16).encode())
        return body + b"." + self._mac(body)

    def valid(self, challenge: bytes, conn_id: int) -> bool:
        body, _, mac = challenge.rpartition(b".")
        if not hmac.compare_digest(mac, self._mac(body)):
            return False
        issued_for, issued_ms, _ = body.split(b".")      # made by issue(): well formed
        return int(issued_for) == conn_id and 0 <= _now_ms() - int(issued_ms) <= \
            CHALLENGE_TTL_MS

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).hexdigest().encode()


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Peers:
    def __init__(self, credentials: Callable[[], Credentials], tls: Callable[[], dict],
                 log: logging.Logger):
        self.credentials = credentials
        self.tls = tls            # redis-py's ssl_* arguments (tls-cluster), or {}
        self.log = log
        # each with the credentials it proved itself with
        self._clients: dict[Address, tuple[redis.asyncio.Redis, Credentials]] = {}
        self._refusing: set[Address] = set()     # refused since its last proof: logged once
        self.calls = self.failures = self.refusals = 0

    async def _client(self, addr: Address) -> redis.asyncio.Redis:
        credentials = self.credentials()
        client, proved_with = self._clients.get(addr, (None, None))
        if client is not None and proved_with == credentials:
            return client
        await self._forget(addr)          # cluster-password changed: prove it again
        client = redis.asyncio.Redis(
            host=addr.host, port=addr.port, protocol=2, driver_info=None,
            socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S,
            single_connection_client=True, redis_connect_func=self._prove_async(addr),
            retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0), **self.tls())
        self._clients[addr] = (client, credentials)
        return client

    async def call(self, addr: Address, *args):
        """One command on one node; raises what redis-py raises (a
        ResponseError for an error reply, ConnectionError/TimeoutError
        when it cannot be reached in time, AuthenticationError when either
        end refuses the other's proof)."""
        self.calls += 1
        try:
            client = await self._client(addr)
            async with asyncio.timeout(CALL_TIMEOUT_S * 2):
                return await client.execute_command(*args)
        except (TimeoutError, redis.ConnectionError, redis.TimeoutError, OSError):
            self.failures += 1
            await self._forget(addr)
            raise

    async def call_each(self, addrs: Iterable[Address], *args) -> dict[Address, Any]:
        """The command on every node at once: each node's reply, or the
        exception its call raised."""
        addrs = list(addrs)
        replies = await asyncio.gather(*(self.call(a, *args) for a in addrs),
                                       return_exceptions=True)
        return dict(zip(addrs, replies, strict=True))

    def call_at_start(self, addr: Address, *args):
        """A blocking call, before the loop runs (catching up at start)."""
        with redis.Redis(host=addr.host, port=addr.port, protocol=2, driver_info=None,
                         socket_timeout=START_TIMEOUT_S,
                         socket_connect_timeout=START_TIMEOUT_S,
                         redis_connect_func=self._prove_blocking(addr),
                         retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
                         **self.tls()) as client:
            return client.execute_command(*args)

    # ---- the proofs, on each new connection ----------------------------------------

    def _prove_async(self, addr: Address):
        async def on_connect(conn) -> None:
            await conn.on_connect_check_health(check_health=False)
            with self._refusal(addr):
                steps = self._exchange(addr)
                command = next(steps, None)
                while command is not None:
                    await conn.send_command(*command, check_health=False)
                    command = _reply_to(steps, await conn.read_response())
        return on_connect

    def _prove_blocking(self, addr: Address):
        def on_connect(conn) -> None:
            conn.on_connect_check_health(check_health=False)
            with self._refusal(addr):
                steps = self._exchange(addr)
                command = next(steps, None)
                while command is not None:
                    conn.send_command(*command, check_health=False)
                    command = _reply_to(steps, conn.read_response())
        return on_connect

    def _exchange(self, addr: Address) -> Iterator[tuple]:
        """The calling side of CL.PEERAUTH: yields each command and is sent
        its reply; raises NotProven if the called node's answer does not
        prove it knows the password."""
        credentials = self.credentials()
        if credentials is None:
            if not is_loopback(addr.host):
                raise NotProven("not called: without cluster-password only nodes on this "
                                "host are")
            return
        user, password = credentials
        key = password_key(password)
        challenge = yield ("CL.PEERAUTH", "CHALLENGE")
        nonce = secrets.token_hex(16).encode()
        if not isinstance(challenge, bytes):
            raise NotProven("its challenge is not a string")
        reply = yield ("CL.PEERAUTH", "PROVE", user, challenge, nonce,
                       proof(key, CALLER, user, str(addr), challenge, nonce))
        expected = proof(key, CALLED, user, str(addr), challenge, nonce)
        if not (isinstance(reply, bytes) and hmac.compare_digest(reply, expected)):
            raise NotProven(f"it did not prove it knows the password of cluster-user {user!r}")
        self._refusing.discard(addr)

    @contextlib.contextmanager
    def _refusal(self, addr: Address):
        """A refused proof, either way, as AuthenticationError, counted, and
        logged the first time since the node last proved itself."""
        try:
            yield
        except NotProven as e:
            self._refused(addr, str(e))
        except (redis.ResponseError, redis.AuthenticationError) as e:    # WRONGPASS, ...
            self._refused(addr, f"it refused this node's proof ({e})")

    def _refused(self, addr: Address, reason: str):
        self.refusals += 1
        if addr not in self._refusing:
            self._refusing.add(addr)
            self.log.warning("cluster: peer %s refused: %s; nothing is sent to it or taken "
                             "from it", addr, reason)
        raise redis.AuthenticationError(f"peer {addr} refused: {reason}")

    async def _forget(self, addr: Address) -> None:
        client, _ = self._clients.pop(addr, (None, None))
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def close(self) -> None:
        for addr in list(self._clients):
            await self._forget(addr)


def _reply_to(steps: Iterator[tuple], reply) -> tuple | None:
    """The exchange's next command given the last one's reply, or None
    when it is done."""
    try:
        return steps.send(reply)          # type: ignore[attr-defined]
    except StopIteration:
        return None


def unreached(replies: dict[Address, object]) -> list[Address]:
    """The nodes whose call failed."""
    return sorted(a for a, r in replies.items() if isinstance(r, BaseException))


def names(addrs: Iterable[Address]) -> str:
    return ", ".join(str(a) for a in addrs)
