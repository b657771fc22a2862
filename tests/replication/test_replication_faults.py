"""Replication under faults, with real processes: a standby paused
(SIGSTOP), one that falls past repl-buffer-limit, a link cut or stalled
by a proxy (tests/support/proxy.py), a standby or primary restarted, a standby
started before its primary, and a primary killed (kill -9) with its
standby promoted, where what the standby had not yet received is
measured as extra requests allowed.

Every server runs on the manual clock, set to T on all of them, so a
replica is compared with its primary by a peek (``CL.CHECK ... COST 0``)
of every key on both: the same clock and the same state give the same
reply.  A peek on the primary is itself a write of the same state (it
rewrites the bucket's refill time), so it is replicated too; harmless
for the comparison.  Only the link timeouts run on real time.

At the end of every test, each server the test did not stop on purpose
is still running and then stops cleanly, and no server's log holds a
traceback or an error.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from contextlib import closing, contextmanager
from dataclasses import dataclass

import pytest
import redis

from proxy import Proxy
from servers import ServerProcess, process_state
from wire import command, free_port, wait_until

T = 1_000_000              # the manual clock's time on every server, in ms
CAP, RATE = 10, 1          # the bucket of most keys: 10 tokens, refilled 1 a second
WAIT = 20.0                # bound for a link to come up and a replica to catch up
REPL_TIMEOUT = 2           # seconds, where a test needs a silent link noticed
# Silence is noticed after repl-timeout, checked once a second, counted
# from the last heartbeat or ack (once a second); plus slack for a loaded
# machine.
NOTICE = REPL_TIMEOUT + 1 + 1 + 4.0
SHORT_TIMEOUT = ("--repl-timeout", str(REPL_TIMEOUT))
PROMPT = 2.0               # socket timeout for calls that must not wait on a replica
CHUNK = 10_000             # commands per pipelined write
READONLY = "You can't write against a read only replica."


# ---- servers ---------------------------------------------------------------------------------

@dataclass
class Node:
    server: ServerProcess
    c: redis.Redis
    follows: bool             # started as a replica

    @property
    def pid(self) -> int:
        return self.server.proc.pid

    def repl(self) -> dict:
        return self.c.info("replication")


class Cluster:
    """The servers (and proxies) of one test, each server on the manual
    clock at T; see finish for what the end of a test checks."""

    def __init__(self, make_server):
        self._make = make_server
        self.nodes: list[Node] = []
        self.proxies: list[Proxy] = []
        self.stopped: set[int] = set()       # pids the test stopped or killed on purpose

    def start(self, *args) -> Node:
        s = self._make("--manual-clock", *args)
        node = Node(s, s.client(), "--replicaof" in args)
        node.c.execute_command("DEBUG", "CLOCK", "SET", T)
        self.nodes.append(node)
        return node

    def replica(self, port: int, *args) -> Node:
        return self.start("--replicaof", "127.0.0.1", str(port), *args)

    def pair(self, *args) -> tuple[Node, Node]:
        """A primary and a replica with the same args, the link up."""
        primary = self.start(*args)
        replica = self.replica(primary.server.port, *args)
        wait_link(replica, "up")
        return primary, replica

    def proxy(self, port: int) -> Proxy:
        """A proxy to port, closed after the servers stop (a replica whose
        link drops at the end only adds noise to its log)."""
        self.proxies.append(Proxy(port))
        return self.proxies[-1]

    def stop(self, node: Node, sig=signal.SIGTERM) -> None:
        self.stopped.add(node.pid)
        code = node.server.stop(sig)
        assert code == -sig or (sig == signal.SIGTERM and code == 0), node.server.log()

    def finish(self) -> None:
        """Every server the test left running is still up and stops
        cleanly (replicas first, so no link is left reconnecting); no log
        holds a traceback or an error."""
        for node in sorted(reversed(self.nodes), key=lambda n: not n.follows):
            if node.pid not in self.stopped:
                assert node.server.alive(), f"server {node.pid} died:\n{node.server.log()}"
                self.stop(node)
        for proxy in self.proxies:
            proxy.close()
        for node in self.nodes:
            log = node.server.log()
            assert "Traceback" not in log and " ERROR " not in log, log


@pytest.fixture
def cluster(make_server):
    c = Cluster(make_server)
    yield c
    c.finish()


@contextmanager
def paused(node: Node):
    """The node's process stopped (SIGSTOP) for the block, as a VM pause
    or a swapped-out host would stop it; resumed after, whatever happens."""
    os.kill(node.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: process_state(node.pid) == "T", 5, "the process to stop")
        yield
    finally:
        os.kill(node.pid, signal.SIGCONT)


def peak_rss(node: Node) -> int:
    """The process's RSS high-water mark (VmHWM), in bytes."""
    with open(f"/proc/{node.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


# ---- replication state -----------------------------------------------------------------------

def wait_link(replica: Node, status: str, timeout: float = WAIT) -> None:
    wait_until(lambda: replica.repl()["master_link_status"] == status, timeout,
               f"the replica's link to be {status}")


def wait_replicas(primary: Node, n: int, timeout: float = WAIT) -> None:
    wait_until(lambda: primary.repl()["connected_slaves"] == n, timeout,
               f"the primary to have {n} replica(s)")


def wait_converged(primary: Node, replica: Node, keys, capacity=CAP, rate=RATE,
                   timeout: float = WAIT) -> None:
    """The replica has applied all the primary sent, holds as many buckets,
    and peeks at every key alike."""
    last: dict = {}

    def same() -> bool:
        if replica.repl()["slave_repl_offset"] != primary.repl()["master_repl_offset"]:
            return False
        mine = checks(primary, keys, 0, capacity, rate)
        theirs = checks(replica, keys, 0, capacity, rate)
        last["(key, primary, replica) differing"] = [
            (k, a, b) for k, a, b in zip(keys, mine, theirs) if a != b][:5]
        last["dbsize"] = primary.c.dbsize(), replica.c.dbsize()
        return mine == theirs and last["dbsize"][0] == last["dbsize"][1]
    try:
        wait_until(same, timeout, "the replica to catch up")
    except AssertionError as e:
        raise AssertionError(f"{e}; last comparison: {last}") from None


# ---- traffic ---------------------------------------------------------------------------------

def checks(node: Node, keys, cost=1, capacity=CAP, rate=RATE) -> list[list[int]]:
    """CL.CHECK of every key; the replies as [allowed, limit, remaining,
    retry_after_ms, reset_after_ms]."""
    return run_checks(node, [command("CL.CHECK", k, capacity, rate, "COST", cost)
                             for k in keys])


def run_checks(node: Node, frames: list[bytes]) -> list[list[int]]:
    """CL.CHECK commands (encoded), pipelined on one raw connection."""
    out = []
    with closing(node.server.connect()) as sock:
        for start in range(0, len(frames), CHUNK):
            part = frames[start:start + CHUNK]
            sock.sendall(b"".join(part))
            out += read_check_replies(sock, len(part))
    return out


def read_check_replies(sock: socket.socket, n: int) -> list[list[int]]:
    """n CL.CHECK replies (arrays of 5 integers: 6 lines each) off sock;
    an error reply fails at once."""
    chunks, lines, tail = [], 0, b""
    while lines < 6 * n:
        data = sock.recv(1 << 20)
        if not data:
            raise EOFError("the server closed the connection")
        if b"\n-" in (tail[-1:] or b"\n") + data:      # a line that starts with "-"
            raise AssertionError(f"error reply: {b''.join(chunks)[-200:] + data[:200]!r}")
        lines += (tail[-1:] + data).count(b"\r\n")
        chunks.append(data)
        tail = data
    parts = b"".join(chunks).split(b"\r\n")
    assert all(p == b"*5" for p in parts[0:6 * n:6]), parts[:12]
    return [[int(x[1:]) for x in parts[i + 1:i + 6]] for i in range(0, 6 * n, 6)]


def spend(node: Node, keys, cost=1, capacity=CAP, rate=RATE) -> None:
    """Spends cost from every key; all of it must be allowed."""
    replies = checks(node, keys, cost, capacity, rate)
    refused = [k for k, reply in zip(keys, replies) if reply[0] != 1]
    assert not refused, f"{len(refused)} checks denied, e.g. {refused[:3]}"


def keys_named(prefix: str, n: int, width: int = 0) -> list[bytes]:
    return [f"{prefix}:{i:0{width}d}".encode() for i in range(n)]


# ---- what a replica sees, then misses --------------------------------------------------------

BEFORE = keys_named("before", 500)
DURING = keys_named("during", 500)
REMOVED = BEFORE[:100]


def seed(primary: Node, replica: Node) -> None:
    """Buckets the replica has seen: 3 tokens spent from each of BEFORE."""
    spend(primary, BEFORE, 3)
    wait_converged(primary, replica, BEFORE)


def churn(c: redis.Redis) -> None:
    """What a replica away misses: new buckets (DURING) and removed ones
    (REMOVED, which it still holds).  One call at a time, each bounded by
    the client's socket timeout."""
    for k in DURING:
        assert c.execute_command("CL.CHECK", k, CAP, RATE, "COST", 2)[0] == 1
    for k in REMOVED:
        assert c.execute_command("CL.RESET", k) == 1


# ---- 1. a standby paused ---------------------------------------------------------------------

PAUSES = [
    # well under repl-timeout (60 s) and repl-buffer-limit: no failure,
    # the stream goes on where it was
    pytest.param((), False, id="short"),
    # past repl-timeout: the primary drops it; resumed, it resyncs in full
    pytest.param(SHORT_TIMEOUT, True, id="past-repl-timeout"),
]


@pytest.mark.parametrize("args,dropped", PAUSES)
def test_paused_standby_catches_up(cluster, args, dropped):
    primary, replica = cluster.pair(*args)
    seed(primary, replica)
    prompt = primary.server.client(socket_timeout=PROMPT)
    with paused(replica):
        if dropped:
            wait_replicas(primary, 0, NOTICE)
        # every call returns within PROMPT (redis-py raises TimeoutError
        # otherwise): the primary never waits for a replica
        churn(prompt)
        assert prompt.info("replication")["connected_slaves"] == (0 if dropped else 1)
    prompt.close()

    wait_converged(primary, replica, BEFORE + DURING)
    info = primary.repl()
    assert (info["repl_full_syncs"], info["repl_dropped_replicas"]) == \
        ((2, 1) if dropped else (1, 0)), info


# ---- 2. a standby paused past repl-buffer-limit ----------------------------------------------

BIG = 300_000
RSS_SLACK = 8 * 1024**2     # a few change logs, batches and output buffers of 1 MB


def grow(node: Node, keys) -> int:
    """Two passes of checks over keys (a stream of about twice their
    records, but no more buckets than one pass); the growth of the
    process's peak RSS."""
    before = node.server.rss_bytes()
    spend(node, keys, 1)
    spend(node, keys, 2)
    return peak_rss(node) - before


@pytest.mark.untraced
def test_paused_standby_is_dropped_at_the_buffer_limit_then_resyncs(cluster):
    limit = ("--repl-buffer-limit", "1mb")
    keys = keys_named("k", BIG, 28)               # 30-byte keys
    # the same work on a primary without replica: what the buckets cost
    alone = cluster.start(*limit)
    baseline = grow(alone, keys)
    cluster.stop(alone)

    primary, replica = cluster.pair(*limit)
    seed(primary, replica)
    with paused(replica):
        growth = grow(primary, keys)
        print(f"\npeak RSS growth for {BIG} keys x 2 passes: {growth / 2**20:.1f} MB with a "
              f"paused replica, {baseline / 2**20:.1f} MB without one")
        assert growth <= baseline + RSS_SLACK, (growth, baseline)
        # ~17 MB of records per pass, far past 1 MB plus what the kernel
        # buffers: the primary gave up on the replica
        info = primary.repl()
        assert info["repl_dropped_replicas"] >= 1, info
        assert info["connected_slaves"] == 0, info
        churn(primary.c)

    # resumed, it reads the rest of the old stream, finds the link closed,
    # reconnects and gets a full copy, which replaces all it had
    wait_link(replica, "up")
    wait_converged(primary, replica, BEFORE + DURING + keys)
    assert primary.repl()["repl_full_syncs"] >= 2
    assert "passed repl-buffer-limit" in primary.server.log()


# ---- 3. the link cut or stalled --------------------------------------------------------------

LINK_FAULTS = [
    # A cut closes both ends: each side sees it at once, so the 60 s
    # default repl-timeout must play no part.
    pytest.param("cut", (), 5.0, id="cut"),
    # A stall closes nothing: each side must notice the silence.
    pytest.param("stall", SHORT_TIMEOUT, NOTICE, id="stall"),
]


@pytest.mark.parametrize("fault,args,notice", LINK_FAULTS)
def test_link_fault_then_restored(cluster, fault, args, notice):
    primary = cluster.start(*args)
    proxy = cluster.proxy(primary.server.port)
    replica = cluster.replica(proxy.port, *args)
    wait_link(replica, "up")
    seed(primary, replica)

    getattr(proxy, fault)()
    churn(primary.c)
    wait_link(replica, "down", notice)
    wait_replicas(primary, 0, notice)
    assert checks(replica, DURING, 0) == [[1, CAP, CAP, 0, 0]] * len(DURING), \
        "writes made after the fault reached the replica"
    # the replica keeps trying: new connections reach the proxy
    tried = proxy.accepted
    wait_until(lambda: proxy.accepted > tried, notice, "the replica to try again")
    assert replica.repl()["master_link_status"] == "down"

    proxy.restore()
    wait_link(replica, "up")
    wait_converged(primary, replica, BEFORE + DURING)
    assert primary.repl()["repl_full_syncs"] >= 2


# ---- 4. the standby restarted ----------------------------------------------------------------

def test_restarted_standby_resyncs(cluster):
    primary, replica = cluster.pair()
    seed(primary, replica)
    cluster.stop(replica)
    wait_replicas(primary, 0)
    churn(primary.c)

    again = cluster.replica(primary.server.port)
    wait_link(again, "up")
    wait_converged(primary, again, BEFORE + DURING)


# ---- 5. the primary restarted ----------------------------------------------------------------

RESTARTS = [
    # SIGTERM saves at exit: the primary comes back with everything
    pytest.param(signal.SIGTERM, id="sigterm"),
    # kill -9 after a SAVE: it comes back without what followed the SAVE,
    # which the replica holds and must drop, as the full copy replaces all
    pytest.param(signal.SIGKILL, id="kill9-after-save"),
]


@pytest.mark.parametrize("sig", RESTARTS)
def test_restarted_primary_is_followed_again(cluster, tmp_path, sig):
    args = ("--port", str(free_port()), "--snapshot-file", str(tmp_path / "p.snap"))
    primary = cluster.start(*args)
    replica = cluster.replica(primary.server.port)
    wait_link(replica, "up")
    seed(primary, replica)
    assert primary.c.execute_command("SAVE") in (b"OK", True)
    saved = checks(primary, BEFORE + DURING, 0)
    churn(primary.c)
    wait_converged(primary, replica, BEFORE + DURING)
    last = checks(primary, BEFORE + DURING, 0)

    cluster.stop(primary, sig)
    wait_link(replica, "down")
    assert checks(replica, BEFORE + DURING, 0) == last, "the replica lost state with its primary"

    # same port, same snapshot: the replica finds it by itself
    primary = cluster.start(*args)
    wait_link(replica, "up")
    wait_converged(primary, replica, BEFORE + DURING)
    assert checks(primary, BEFORE + DURING, 0) == (last if sig == signal.SIGTERM else saved)
    after = keys_named("after", 500)
    spend(primary, after, 2)                 # and the stream goes on
    wait_converged(primary, replica, BEFORE + DURING + after)


# ---- 6. the standby started before its primary -----------------------------------------------

REFUSED_ON_REPLICA = [
    ("CL.CHECK", "k", CAP, RATE),
    ("CL.CHECK", "k", CAP, RATE, "COST", 5),
    ("CL.RESET", "k"),
    ("FLUSHALL",),
    ("CL.RULE", "SET", "r1", json.dumps({"match": {"resource": "x"}, "capacity": 5,
                                         "refill_per_second": 1})),
]


def test_standby_waits_for_an_unreachable_primary(cluster):
    port = free_port()
    replica = cluster.replica(port)
    assert replica.c.ping()
    info = replica.repl()
    assert (info["role"], info["master_link_status"]) == ("slave", "down"), info
    assert info["master_link_down_since_seconds"] == -1, info     # never up, as Redis says
    assert replica.c.execute_command("ROLE")[3] in (b"connect", b"connecting")
    for cmd in REFUSED_ON_REPLICA:
        with pytest.raises(redis.ReadOnlyError, match=READONLY):
            replica.c.execute_command(*cmd)
    assert checks(replica, [b"k"], 0) == [[1, CAP, CAP, 0, 0]]   # a peek is fine
    # it retries, backing off, and logs the first failure only (a line per
    # retry would fill the log of a standby whose primary is down for long)
    wait_until(lambda: replica.repl()["master_link_failures"] >= 3, 10,
               "the replica to retry")
    assert replica.server.log().count("cannot reach primary") == 1

    primary = cluster.start("--port", str(port))
    keys = keys_named("k", 500)
    spend(primary, keys, 3)
    wait_link(replica, "up")
    wait_converged(primary, replica, keys)
    assert replica.c.execute_command("ROLE")[3] == b"connected"


# ---- 7. the primary killed, the standby promoted ---------------------------------------------

def promote(replica: Node) -> None:
    assert replica.c.execute_command("REPLICAOF", "NO", "ONE") in (b"OK", True)
    assert replica.c.execute_command("ROLE")[0] == b"master"


def test_promoted_standby_keeps_exhausted_keys_denied(cluster):
    primary, replica = cluster.pair()
    keys = keys_named("spent", 200)
    for _ in range(CAP):
        spend(primary, keys)
    for _ in range(3):
        assert all(r[0] == 0 for r in checks(primary, keys))
    wait_converged(primary, replica, keys)

    cluster.stop(primary, signal.SIGKILL)
    promote(replica)
    for _ in range(CAP + 3):            # the same checks, at the same time
        assert all(r[0] == 0 for r in checks(replica, keys)), "an exhausted key was allowed"
    spend(replica, [b"fresh"])          # and it takes writes now


# The load on the primary when it is killed: round-robin over LOAD_KEYS
# keys, the first SMALL_FROM with capacity 1000 (never exhausted here, so
# every check on them is allowed up to the kill), the rest with capacity
# 10 (exhausted early, then denied), in pipelined batches of LOAD_BATCH.
LOAD_KEYS, SMALL_FROM = 500, 400
LOAD_BATCH = 32
KILL_AFTER = 20_000          # replies seen before the kill: 40 per key
RECENT_S = 0.050             # the window the overshoot is bounded by


def load_capacity(j: int) -> int:
    return 1000 if j < SMALL_FROM else CAP


def load_check(j: int, cost: int = 1) -> bytes:
    return command("CL.CHECK", f"load:{j}", load_capacity(j), RATE, "COST", cost)


def load_spent(n: int) -> list[int]:
    """Per key, the tokens the first n requests of the load spend."""
    return [min(load_capacity(j), n // LOAD_KEYS + (j < n % LOAD_KEYS))
            for j in range(LOAD_KEYS)]


class Load(threading.Thread):
    """Sends the load as fast as it can until the server goes away;
    records when each batch's replies arrived and which were allowed."""

    def __init__(self, node: Node):
        super().__init__(daemon=True)
        self.sock = node.server.connect()
        self.frames = [load_check(j) for j in range(LOAD_KEYS)]
        self.sent = 0
        self.batches: list[tuple[float, list[int]]] = []    # (arrival, allowed flags)
        self.error: BaseException | None = None

    @property
    def observed(self) -> int:
        return len(self.batches) * LOAD_BATCH

    def run(self) -> None:
        try:
            while True:
                i = self.sent
                self.sock.sendall(b"".join(self.frames[(i + j) % LOAD_KEYS]
                                           for j in range(LOAD_BATCH)))
                self.sent += LOAD_BATCH
                replies = read_check_replies(self.sock, LOAD_BATCH)
                self.batches.append((time.monotonic(), [r[0] for r in replies]))
        except (OSError, EOFError):
            pass                     # the kill
        except BaseException as e:   # anything else fails the test
            self.error = e
        finally:
            self.sock.close()

    def allowed_per_key(self) -> list[int]:
        out = [0] * LOAD_KEYS
        for b, (_, flags) in enumerate(self.batches):
            for j, flag in enumerate(flags):
                out[(b * LOAD_BATCH + j) % LOAD_KEYS] += flag
        return out

    def allowed_from(self, n: int = 0, since: float = 0.0) -> int:
        """Allowed replies seen for requests n and later, arrived after since."""
        return sum(flag for b, (at, flags) in enumerate(self.batches) if at > since
                   for j, flag in enumerate(flags) if b * LOAD_BATCH + j >= n)


def prefix_length(spent: list[int], sent: int) -> int:
    """The n for which load_spent(n) == spent (the smallest, as requests to
    exhausted keys change nothing); fails if there is none."""
    total = sum(spent)
    lo, hi = 0, sent
    while lo < hi:                       # sum(load_spent(n)) grows with n
        mid = (lo + hi) // 2
        if sum(load_spent(mid)) < total:
            lo = mid + 1
        else:
            hi = mid
    assert load_spent(lo) == spent, (
        "the promoted replica's state is not the primary's state after any prefix "
        f"of the requests (closest: {lo} of {sent})")
    return lo


@pytest.mark.untraced     # its RECENT_S window is real time: alone, on the release build
def test_promoted_standby_overshoot_under_load(cluster, record_property):
    primary, replica = cluster.pair()
    load = Load(primary)
    load.start()
    wait_until(lambda: load.observed >= KILL_AFTER or not load.is_alive(), WAIT,
               "the load to get going")
    killed_at = time.monotonic()
    cluster.stop(primary, signal.SIGKILL)
    load.join(10)
    assert not load.is_alive() and load.error is None, load.error
    promote(replica)

    # What the promoted replica still allows per key, at the same time:
    # a peek, then spending exactly that is allowed, and one more is not.
    keys = range(LOAD_KEYS)
    caps = [load_capacity(j) for j in keys]
    remaining = [reply[2] for reply in run_checks(replica, [load_check(j, 0) for j in keys])]
    assert all(reply[0] == 1 for reply in run_checks(
        replica, [load_check(j, left) for j, left in zip(keys, remaining) if left]))
    assert all(reply[0] == 0 for reply in run_checks(replica, [load_check(j) for j in keys]))

    # Provable whatever the timing: the replica holds the primary's state
    # as of one moment, i.e. after the first n requests of the load (one
    # connection, served in order), for some n no larger than what was sent.
    n = prefix_length([cap - left for cap, left in zip(caps, remaining)], load.sent)
    seen = load.allowed_per_key()
    assert all(a == min(cap, load.observed // LOAD_KEYS + (j < load.observed % LOAD_KEYS))
               for j, (a, cap) in enumerate(zip(seen, caps))), "the primary itself overshot"
    overshoot = sum(max(0, a + left - cap) for a, left, cap in zip(seen, remaining, caps))
    # So the overshoot is exactly the allowed requests after the n-th
    # whose replies the load saw: those the primary had not yet sent on.
    assert overshoot == load.allowed_from(n)
    # Not provable, as replication is asynchronous, but expected with
    # repl-flush-ms 2: the replica was at most RECENT_S behind when the
    # primary died, so every lost request was answered in that window.
    recent = load.allowed_from(since=killed_at - RECENT_S)
    behind_ms = 1000 * max(0.0, killed_at - load.batches[n // LOAD_BATCH][0]) \
        if n < load.observed else 0.0
    print(f"\novershoot after promotion: {overshoot} extra allowed of {load.observed} "
          f"requests seen; the replica had the first {n} of {load.sent} sent; the first "
          f"it missed was answered {behind_ms:.1f} ms before the kill; {recent} allowed "
          f"in the last {RECENT_S * 1000:.0f} ms")
    record_property("overshoot", overshoot)
    record_property("requests_seen", load.observed)
    record_property("replica_behind_ms", round(behind_ms, 1))
    assert overshoot <= recent
    # the exhausted keys gained nothing
    assert all(left == 0 for left in remaining[SMALL_FROM:]), remaining[SMALL_FROM:]


@contextmanager
def unanswered_port():
    """A port whose SYNs go unanswered, as behind a partition: a listener
    that never accepts, its backlog filled.  Yields (port, listener)."""
    with closing(socket.socket()) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        try:
            for s in fillers:
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
            time.sleep(0.3)      # the handshakes of the fillers complete
            yield port, listener
        finally:
            for s in fillers:
                s.close()


def test_a_connect_in_flight_times_out_and_promotion_ends_it(cluster):
    with unanswered_port() as (port, listener):
        replica = cluster.replica(port, *SHORT_TIMEOUT)
        # the connect gives up after repl-timeout and is retried, instead
        # of waiting minutes for the kernel
        wait_until(lambda: "connect timed out" in replica.server.log(), NOTICE,
                   "a connect to an unanswered port never timed out")
        wait_until(lambda: replica.c.execute_command("ROLE")[3] == b"connecting", WAIT,
                   "no new attempt")
        assert replica.c.execute_command("REPLICAOF", "NO", "ONE") == b"OK"
        replica.c.execute_command("CL.CHECK", "promoted", CAP, RATE, "COST", 5)
        # The partition heals: whatever connects now is accepted.  The
        # promoted server must not be among them (its connect was in
        # flight when it was promoted).
        listener.settimeout(0.2)
        deadline = time.monotonic() + 4      # past the SYN retransmits at 1 and 3 s
        while time.monotonic() < deadline:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            with closing(conn):
                conn.settimeout(0.5)
                try:
                    assert conn.recv(100) == b"", "the promoted server tried to sync"
                except socket.timeout:
                    pass      # a filler: connected, silent
        assert replica.c.execute_command("ROLE")[0] == b"master"
        assert replica.c.execute_command("CL.CHECK", "promoted", CAP, RATE, "COST", 0)[2] == 5
