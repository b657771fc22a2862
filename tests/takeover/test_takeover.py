"""A new process takes over a running one (src/fastlimit/takeover/): the
listening sockets and every bucket move, the old one exits 0, and a
takeover that fails before the flip leaves the old one serving.  Real
processes on real sockets; the manual clock (never moved), so that a
bucket's state is the same wherever and whenever it is read."""

from __future__ import annotations

import errno
import http.client
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
import redis
from certs import make_certs
from grpcserver import RIG_YAML
from redis.backoff import NoBackoff
from redis.retry import Retry
from rls_messages import OK, RLS_PATH, decode_response, descriptor, request
from servers import ServerProcess, process_state, readme_block, run_lines
from takeover_kit import hello_answer, paused_stand_in
from wire import Wire, command, free_port, wait_until

from fastlimit.takeover import wire as handover

BUCKETS = 100_000
CAPACITY = 100
LOAD_CAPACITY = 10**12       # never empty: every check of the load is allowed


class Node(ServerProcess):
    """A server on a fixed port with a takeover-socket, the old one or,
    given takeover_from, the new one taking over from it."""

    def __init__(self, port: int, path: str, *args: str, takeover_from: bool = False):
        extra = ["--takeover", path] if takeover_from else []
        super().__init__("--manual-clock", "--port", str(port), "--takeover-socket", path,
                         *extra, *args)
        self.port = port


@pytest.fixture
def path(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("tk") / "takeover.sock")


@pytest.fixture
def nodes():
    """Starts Nodes; stops those still running after the test."""
    started: list[Node] = []

    def make(*args, **kw) -> Node:
        node = Node(*args, **kw)
        started.append(node)
        return node.start()

    yield make
    for node in started:
        node.stop()


def fill(r: redis.Redis, n: int) -> None:
    """n buckets, each spent by a cost of its own (1..CAPACITY-1)."""
    for start in range(0, n, 10_000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(start + 10_000, n)):
            pipe.execute_command("CL.CHECK", f"b:{i}", CAPACITY, 1, "COST", 1 + i % (CAPACITY - 1))
        pipe.execute()


def bulk(port: int, n: int) -> None:
    """About two thirds of n buckets more (random keys), made fast by
    redis-benchmark: a copy of 5,000 can end between two looks at a log."""
    subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(n),
                    "-r", str(n), "-P", "64", "-c", "4", "-q", "CL.CHECK", "bulk:__rand_int__",
                    "10", "1"], check=True, capture_output=True, timeout=120)


def peek_all(r: redis.Redis, n: int) -> list:
    out: list = []
    for start in range(0, n, 10_000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(start + 10_000, n)):
            pipe.execute_command("CL.CHECK", f"b:{i}", CAPACITY, 1, "COST", 0)
        out += pipe.execute()
    return out


def remaining(r: redis.Redis, key: str, capacity: int) -> int:
    return r.execute_command("CL.CHECK", key, capacity, 1, "COST", 0)[2]


class Load(threading.Thread):
    """Runs work() in a loop until stopped; what it raises is an error
    (a closed connection among them: every client connection is passed)."""

    def __init__(self, work):
        super().__init__(daemon=True)
        self.work = work
        self.done = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.done.is_set():
                self.work()
        except BaseException as e:     # the test asserts there were none
            self.errors.append(e)

    def stop(self) -> None:
        self.done.set()
        self.join(30)
        assert not self.is_alive()
        assert not self.errors, self.errors


class PipelinedChecks:
    """redis-py, pipelined: batches of CL.CHECK on keys of its own, on one
    connection and with no retry, so that a reconnect would be an error
    (redis-py would send a cut batch again whole)."""

    def __init__(self, port: int, name: str, keys: int = 50, batch: int = 200, **options):
        self.name, self.keys, self.batch = name, keys, batch
        self.r = redis.Redis(port=port, socket_timeout=10, single_connection_client=True,
                             retry=Retry(NoBackoff(), 0), **{"protocol": 2, **options})
        self.spent = 0

    def __call__(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        for i in range(self.batch):
            pipe.execute_command("CL.CHECK", f"{self.name}:{i % self.keys}", LOAD_CAPACITY, 1)
        replies = pipe.execute()
        assert all(reply[0] == 1 for reply in replies), replies
        self.spent += len(replies)


class ExactChecks:
    """A pipelined client by hand on one connection for the whole test
    (EOFError if it closes): it counts every reply, so a reply lost, twice
    or out of order shows in what it spent."""

    def __init__(self, port: int, name: str = "exact", keys: int = 20, batch: int = 100,
                 hello: tuple = ()):
        self.name, self.keys, self.batch = name, keys, batch
        self.wire = Wire.to(port)
        if hello:
            assert self.wire.call("HELLO", *hello).startswith(b"%")
        self.spent = 0

    def __call__(self) -> None:
        self.wire.send(b"".join(command("CL.CHECK", f"{self.name}:{i % self.keys}",
                                        LOAD_CAPACITY, 1) for i in range(self.batch)))
        for _ in range(self.batch):
            reply = self.wire.read_reply()
            assert reply.startswith(b"*5\r\n:1\r\n"), reply
            self.spent += 1


class Connector:
    """Connects in a loop, as a new client would: a refused connection
    attempt is what a takeover must never cause."""

    def __init__(self, port: int):
        self.port = port
        self.connects = self.refused = 0

    def __call__(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except ConnectionRefusedError:
            self.refused += 1
            return
        except OSError as e:
            assert e.errno != errno.ECONNREFUSED, e
            raise
        s.close()
        self.connects += 1


def per_key(r: redis.Redis, prefix: str, keys: int) -> int:
    """What the load spent on its keys, from their buckets."""
    return sum(LOAD_CAPACITY - remaining(r, f"{prefix}:{i}", LOAD_CAPACITY)
               for i in range(keys))


@pytest.mark.untraced
def test_a_takeover_under_pipelined_load_moves_every_bucket_and_refuses_no_connection(
        nodes, path):
    port = free_port()
    old = nodes(port, path)
    r = old.client(protocol=2)
    fill(r, BUCKETS)
    before = peek_all(r, BUCKETS)
    assert r.dbsize() == BUCKETS
    pipelined, exact, connector = PipelinedChecks(port, "piped"), ExactChecks(port), \
        Connector(port)
    loads = [Load(pipelined), Load(exact), Load(connector)]
    for load in loads:
        load.start()
    wait_until(lambda: pipelined.spent and exact.spent and connector.connects, 10,
               "the load to run")
    new = nodes(port, path, takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    spent_at_flip = exact.spent
    wait_until(lambda: exact.spent > spent_at_flip + 1000, 10, "the load on the new process")
    for load in loads:
        load.stop()

    after = new.client(protocol=2)
    assert peek_all(after, BUCKETS) == before
    assert per_key(after, "exact", exact.keys) == exact.spent
    assert per_key(after, "piped", pipelined.keys) == pipelined.spent
    assert connector.refused == 0 and connector.connects > 0
    info = after.info("server")
    assert info["process_id"] == new.proc.pid
    assert info["takeover_from_pid"] == old.proc.pid
    assert 0 < info["takeover_pause_ms"] < info["takeover_total_ms"]
    assert "handed over to pid" in old.log()


def test_info_server_says_where_the_process_came_from_and_the_fronts_move(nodes, path):
    port, http_port = free_port(), free_port()
    old = nodes(port, path, "--http-port", str(http_port))
    first = old.client().info("server")
    assert first["takeover_from_pid"] == 0 and first["takeover_pause_ms"] == -1
    assert abs(first["process_started_ms"] / 1000 - time.time()) < 60
    old.client().execute_command("CL.CHECK", "k", 10, 1, "COST", 4)
    held = old.client()        # a client of the old process: passed at the flip
    held.ping()

    new = nodes(port, path, "--http-port", str(http_port), takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    info = new.client().info("server")
    assert info["takeover_from_pid"] == old.proc.pid
    assert info["takeover_pause_ms"] >= 0
    assert info["process_started_ms"] >= first["process_started_ms"]
    assert remaining(new.client(), "k", 10) == 6
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10) as resp:
        assert resp.status == 200
    assert held.ping()         # its connection, now the new process's
    assert held.info("server")["process_id"] == new.proc.pid


def test_the_new_process_can_be_taken_over_in_turn(nodes, path):
    port = free_port()
    first = nodes(port, path)
    first.client().execute_command("CL.CHECK", "k", 10, 1, "COST", 3)
    second = nodes(port, path, takeover_from=True)
    assert first.proc.wait(20) == 0
    third = nodes(port, path, takeover_from=True)
    assert second.proc.wait(20) == 0
    assert remaining(third.client(), "k", 10) == 7
    assert third.client().info("server")["takeover_from_pid"] == second.proc.pid


@pytest.mark.untraced
def test_the_new_process_killed_mid_copy_leaves_the_old_one_serving(nodes, path):
    port = free_port()
    old = nodes(port, path)
    r = old.client(protocol=2)
    fill(r, 5_000)
    bulk(port, 300_000)     # a copy long enough to be stopped in, on a loaded machine too
    before = peek_all(r, 5_000)
    kept = Wire.to(port)       # a client of the old process, kept across
    assert kept.call("PING") == b"+PONG\r\n"
    heir = Node(port, path, takeover_from=True)
    heir_thread = threading.Thread(target=lambda: pytest.raises(RuntimeError, heir.start))
    heir_thread.start()
    wait_until(lambda: "follows this server as a replica" in old.log(), 20, "the offer")
    pid = heir.proc.pid
    heir.proc.send_signal(signal.SIGSTOP)      # the copy stalls...
    heir.proc.send_signal(signal.SIGKILL)      # ...and the new process dies in it
    heir_thread.join(30)
    heir.stop()
    wait_until(lambda: "failed before the flip" in old.log(), 10, "the old one to notice")
    assert process_state(pid) is None
    assert old.alive()
    assert kept.call("PING") == b"+PONG\r\n"
    assert peek_all(r, 5_000) == before
    assert r.info("server")["takeover_handing_over"] == 0
    assert r.execute_command("CL.CHECK", "b:1", CAPACITY, 1)[0] == 1     # writes go on


def test_an_incompatible_new_process_is_refused_before_anything_moves(nodes, path):
    port = free_port()
    old = nodes(port, path)
    old.client().execute_command("CL.CHECK", "k", 10, 1, "COST", 2)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        handover.send(s, handover.encode("hello", protocol=handover.PROTOCOL + 1,
                                         snapshot_format=2, pid=0))
        answer, fds = handover.receive(s, handover.Reader(), 10)
    assert fds == []
    assert answer["kind"] == "refused"
    assert f"handover protocol version {handover.PROTOCOL + 1}" in answer["reason"]
    wait_until(lambda: "refused: handover protocol version" in old.log(), 10,
               "the old one to say why")
    assert remaining(old.client(), "k", 10) == 8
    assert old.client().info("server")["takeover_handing_over"] == 0


def test_a_new_process_refuses_an_incompatible_old_one_and_exits(path):
    """The check runs on both sides: an old process of another handover
    protocol (a stand-in here) is refused by the new one, which exits."""
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(1)
        heir = Node(free_port(), path, takeover_from=True)
        heir_thread = threading.Thread(target=lambda: pytest.raises(RuntimeError, heir.start))
        heir_thread.start()
        listener.settimeout(10)
        conn, _ = listener.accept()
        with conn:
            hello, _ = handover.receive(conn, handover.Reader(), 10)
            assert hello["protocol"] == handover.PROTOCOL
            handover.send(conn, handover.encode("offer", protocol=handover.PROTOCOL + 1,
                                                snapshot_format=2, pid=0, listeners=[]))
            failed, _ = handover.receive(conn, handover.Reader(), 10)
        heir_thread.join(30)
    assert failed["kind"] == "failed" and "incompatible" in failed["reason"]
    assert heir.proc.wait(10) == 1
    assert "incompatible" in heir.log()


def test_a_takeover_through_a_socket_nobody_listens_on_is_refused_at_start(path):
    heir = Node(free_port(), path, takeover_from=True)
    with pytest.raises(RuntimeError, match="cannot take over through"):
        heir.start()
    assert heir.proc.wait(10) == 1
    heir.stop()


def test_kill_9_of_the_new_process_after_the_flip_leaves_nothing_serving(nodes, path):
    """The issue allows it: after the flip the new process is complete (it
    had every bucket), and a process killed is not serving."""
    port = free_port()
    old = nodes(port, path)
    old.client().execute_command("CL.CHECK", "k", 10, 1, "COST", 5)
    new = nodes(port, path, takeover_from=True)
    assert old.proc.wait(20) == 0
    assert remaining(new.client(), "k", 10) == 5
    new.proc.kill()
    new.proc.wait(10)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_command_sent_during_the_pause_waits_and_runs_when_the_takeover_fails(nodes, path):
    """A stand-in new process that says ready and then goes away: the old
    one's clients wait through the pause, nothing refused or lost, and run
    once it ends, a keep-alive HTTP connection's request among them; a new
    HTTP connection accepted during the pause may read, not spend."""
    port, http_port = free_port(), free_port()
    old = nodes(port, path, "--http-port", str(http_port))
    client = Wire.to(port)
    assert client.call("CL.CHECK", "k", 10, 1, "COST", 3).startswith(b"*5\r\n:1\r\n")
    keep_alive = socket.create_connection(("127.0.0.1", http_port), timeout=10)
    keep_alive.sendall(KEEP_ALIVE_CHECK)
    assert keep_alive.recv(65536).startswith(b"HTTP/1.1 200 ")
    with socket.socket(socket.AF_UNIX) as heir:
        heir.connect(path)
        reader = handover.Reader()
        handover.send(heir, handover.encode("hello", **handover.versions(), pid=0))
        offer, fds = handover.receive(heir, reader, 10)
        handover.close_fds(fds)
        assert offer["kind"] == "offer" and len(fds) == len(offer["listeners"]) + 1
        assert [front for front, *_ in offer["listeners"]] == ["resp", "http", "takeover"]
        handover.send(heir, handover.encode("ready", offset=0))
        paused, _ = handover.receive(heir, reader, 10)
        assert paused["kind"] == "paused"
        client.send(command("CL.CHECK", "k", 10, 1, "COST", 2))
        late = Wire.to(port)           # accepted meanwhile: it waits too
        late.send(command("PING"))
        keep_alive.sendall(KEEP_ALIVE_CHECK)
        with pytest.raises(TimeoutError):
            client.read_reply(time.monotonic() + 0.3)
        keep_alive.settimeout(0.1)
        with pytest.raises(TimeoutError):        # held as the RESP clients are
            keep_alive.recv(65536)
        # a connection accepted during the pause is not held: it may read, not spend
        assert http_check(http_port, cost=0) == 200
        assert http_check(http_port, cost=1) == 503       # READONLY
    assert client.read_reply().startswith(b"*5\r\n:1\r\n:10\r\n:5\r\n")
    assert http_check(http_port, cost=1) == 200
    assert late.read_reply() == b"+PONG\r\n"
    keep_alive.settimeout(10)
    assert keep_alive.recv(65536).startswith(b"HTTP/1.1 200 ")
    keep_alive.close()
    wait_until(lambda: "failed before the flip" in old.log(), 10, "the old one to say why")
    assert remaining(old.client(), "k", 10) == 5
    assert remaining(old.client(), "keepalive", LOAD_CAPACITY) == LOAD_CAPACITY - 2


def test_the_readmes_takeover_lines_work_as_written(tmp_path):
    lines = readme_block("### Upgrades without a restart")
    assert [line.split()[0] for line in lines] == ["fastlimit-server", "fastlimit-server",
                                                   "redis-cli"], lines
    seen = run_lines(tmp_path, lines)
    old, new = seen["servers"]
    assert new["alive"], seen
    assert "handed over to pid" in old["log"], old["log"]     # and exiting (maybe not yet gone)
    assert "ready to exit" in old["log"], old["log"]
    (shown,) = seen["commands"]
    fields = dict(line.split(":", 1) for line in shown["out"].split() if ":" in line)
    assert shown["rc"] == 0 and int(fields["takeover_from_pid"]) > 0, shown
    assert float(fields["takeover_pause_ms"]) >= 0, shown


RULE = '{"match": {"resource": "api"}, "capacity": 10, "refill_per_second": 1}'


def test_the_rules_and_their_database_pass_at_the_pause(nodes, path, tmp_path):
    """rules-db takes one process at a time: the old one lets it go at
    its pause, the new one opens it before it flips and keeps writing it."""
    port, rules_db = free_port(), str(tmp_path / "rules.db")
    old = nodes(port, path, "--rules-db", rules_db)
    r = old.client(protocol=2)
    r.execute_command("CL.RULE", "SET", "api", RULE)
    assert r.execute_command("CL.LIMIT", "alice", "api", "COST", 4)[0] == 1
    new = nodes(port, path, "--rules-db", rules_db, takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    r = new.client(protocol=2)
    assert r.execute_command("CL.LIMIT", "alice", "api", "COST", 0)[2] == 6
    r.execute_command("CL.RULE", "SET", "later", RULE.replace("api", "later"))
    new.stop()
    again = nodes(free_port(), path + ".2", "--rules-db", rules_db)
    ids = again.client(protocol=2).execute_command("CL.RULE", "LIST")
    assert {b"api", b"later"} <= set(ids), ids


def test_a_takeover_that_fails_in_the_pause_gives_the_rules_database_back(nodes, path,
                                                                          tmp_path):
    port, rules_db = free_port(), str(tmp_path / "rules.db")
    old = nodes(port, path, "--rules-db", rules_db)
    with paused_stand_in(path):
        pass                # and gone: the takeover failed in the pause
    wait_until(lambda: "failed before the flip" in old.log(), 10, "the old one to say why")
    old.client().execute_command("CL.RULE", "SET", "api", RULE)     # written to rules-db
    assert "rules-db could not be opened" not in old.log()
    old.stop()
    again = nodes(free_port(), path + ".2", "--rules-db", rules_db)
    assert again.client().execute_command("CL.RULE", "LIST") == [b"api"]


def test_every_front_s_listener_moves_tls_and_grpc_included(nodes, path, tmp_path):
    (tmp_path / "certs").mkdir()
    certs = make_certs(str(tmp_path / "certs"))
    port, tls_port, grpc_port = free_port(), free_port(), free_port()
    fronts = ["--tls-port", str(tls_port), "--grpc-port", str(grpc_port),
              "--tls-cert-file", certs.server.cert, "--tls-key-file", certs.server.key,
              "--tls-ca-cert-file", certs.ca, "--tls-auth-clients", "no"]
    old = nodes(port, path, *fronts)
    tls = redis.Redis(host="127.0.0.1", port=tls_port, ssl=True, ssl_ca_certs=certs.ca,
                      socket_timeout=10)
    tls.execute_command("CL.CHECK", "k", 10, 1, "COST", 7)
    new = nodes(port, path, *fronts, takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    # a TLS connection is closed, not passed (its session keys stay in the old process)
    assert new.client().info("server")["takeover_connections_closed"] == 1
    assert remaining(tls, "k", 10) == 3       # reconnected over TLS, to the new process
    assert tls.info("server")["process_id"] == new.proc.pid
    with socket.create_connection(("127.0.0.1", grpc_port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        assert s.recv(9)[3] == 4              # the new process's HTTP/2 SETTINGS frame
    assert "handed over" in old.log() and "4 listening sockets" in old.log()


def http_check(port: int, cost: int) -> int:
    """The status of POST /v1/check/bucket on the key "h"."""
    body = json.dumps({"key": "h", "capacity": 10, "refill_per_sec": 1, "cost": cost}).encode()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/check/bucket", body,
                                    timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_standby_of_the_old_process_follows_the_new_one_under_the_same_replication_id(
        nodes, make_server, path):
    port = free_port()
    old = nodes(port, path)
    old.client().execute_command("CL.CHECK", "k", 10, 1, "COST", 6)
    standby = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(port))
    up = lambda: standby.client().info("replication")["master_link_status"] == "up"  # noqa: E731
    wait_until(up, 10, "the standby's link")
    replid = old.client().info("replication")["master_replid"]
    new = nodes(port, path, takeover_from=True)
    assert old.proc.wait(20) == 0
    assert new.client().info("replication")["master_replid"] == replid
    wait_until(lambda: up() and new.client().info("replication")["connected_slaves"] == 1, 20,
               "the standby to follow the new process")
    assert standby.client().info("replication")["master_replid"] == replid
    assert remaining(standby.client(), "k", 10) == 4


def test_a_replica_refuses_to_be_taken_over(nodes, make_server, path):
    primary = make_server("--manual-clock")
    nodes(free_port(), path, "--replicaof", "127.0.0.1", str(primary.port))
    answer = hello_answer(path)
    assert answer["kind"] == "refused" and "is a replica" in answer["reason"], answer


@pytest.mark.untraced
def test_a_new_process_asked_to_stop_mid_copy_leaves_the_old_one_serving(nodes, path):
    """Enough buckets that the copy takes a while (some 100 ms) after the
    new process starts following the old one, which is when it is
    stopped, then told to stop."""
    port = free_port()
    old = nodes(port, path)
    fill(old.client(), BUCKETS * 2)
    old.client().execute_command("CL.CHECK", "k", 10, 1, "COST", 1)
    heir = Node(port, path, takeover_from=True)
    heir_thread = threading.Thread(target=lambda: pytest.raises(RuntimeError, heir.start))
    heir_thread.start()
    wait_until(lambda: heir.log_path and "following primary" in heir.log(), 20,
               "the new process to follow the old one", interval=0.001)
    heir.proc.send_signal(signal.SIGSTOP)      # in the copy...
    heir.proc.send_signal(signal.SIGTERM)      # ...asked to stop,
    heir.proc.send_signal(signal.SIGCONT)      # which it notices on waking
    heir_thread.join(30)
    assert heir.stop() == 1, heir.log()
    assert "asked to stop" in heir.log()
    wait_until(lambda: "failed before the flip" in old.log(), 10, "the old one to notice")
    assert remaining(old.client(), "k", 10) == 9


def test_the_new_process_serves_when_the_old_one_dies_before_the_flip(nodes, path):
    """Never neither: the new process holds the listening sockets, so when
    the old one is gone (here killed as the copy was to begin) it serves
    what it has rather than exit."""
    port = free_port()
    old = nodes(port, path)
    heir = Node(port, path, takeover_from=True)
    heir_thread = threading.Thread(target=heir.start)
    heir_thread.start()
    wait_until(lambda: "follows this server as a replica" in old.log(), 20, "the offer",
               interval=0.001)
    old.proc.send_signal(signal.SIGSTOP)
    old.proc.kill()
    old.proc.wait(10)
    heir_thread.join(30)
    assert heir.alive(), heir.log()
    assert "is gone before the flip" in heir.log()
    r = heir.client()
    assert r.ping()
    assert r.info("server")["takeover_from_pid"] == old.proc.pid
    assert r.info("server")["takeover_pause_ms"] == -1       # there was no pause
    assert r.execute_command("CL.CHECK", "k", 10, 1)[0] == 1  # a primary: it writes
    heir.stop()


# ---- client connections passed at the flip (takeover/connections.py) ----------------------

ACL = "user app on >pw ~* &* +@all -flushall\nuser default on nopass ~* &* +@all\n"


def client_fields(line: bytes) -> dict[str, str]:
    """CLIENT INFO's line (a verbatim or bulk string) as its fields."""
    text = line.decode().split("\r\n", 1)[1].removeprefix("txt:")
    return dict(field.split("=", 1) for field in text.split())


@pytest.mark.untraced
def test_pipelined_clients_keep_their_connection_and_its_state_across_a_takeover(
        nodes, path, tmp_path):
    acl = tmp_path / "users.acl"
    acl.write_text(ACL)
    port = free_port()
    old = nodes(port, path, "--aclfile", str(acl))
    by_hand = ExactChecks(port, "same", hello=(3, "AUTH", "app", "pw", "SETNAME", "passed"))
    assert by_hand.wire.call("CLIENT", "SETINFO", "LIB-NAME", "by-hand") == b"+OK\r\n"
    piped = PipelinedChecks(port, "py", protocol=3, client_name="py", username="app",
                            password="pw")
    r = piped.r
    loads = [Load(by_hand), Load(piped)]
    for load in loads:
        load.start()
    wait_until(lambda: by_hand.spent and piped.spent, 10, "the load to run")
    sock = r.connection._sock
    new = nodes(port, path, "--aclfile", str(acl), takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    spent_at_exit = by_hand.spent
    wait_until(lambda: by_hand.spent > spent_at_exit + 1000, 10, "the load on the new process")
    for load in loads:
        load.stop()

    assert r.connection._sock is sock      # the same socket throughout
    after = new.client(protocol=2)
    assert per_key(after, "same", by_hand.keys) == by_hand.spent
    assert per_key(after, "py", piped.keys) == piped.spent
    assert by_hand.wire.call("INFO", "server").count(f"process_id:{new.proc.pid}".encode())
    seen = client_fields(by_hand.wire.call("CLIENT", "INFO"))
    assert (seen["name"], seen["user"], seen["resp"], seen["lib-name"]) == \
        ("passed", "app", "3", "by-hand")
    assert by_hand.wire.call("CLIENT", "GETNAME") == b"$6\r\npassed\r\n"
    assert by_hand.wire.call("FLUSHALL").startswith(b"-NOPERM")       # still the user's rules
    assert r.client_getname() == b"py" and r.acl_whoami() == b"app"
    info = after.info("server")
    assert info["takeover_connections_passed"] >= 2
    assert info["takeover_connections_closed"] == 0
    assert "client connections passed" in old.log()


def test_a_command_cut_in_two_by_the_takeover_runs_once_on_the_new_process(nodes, path):
    port = free_port()
    old = nodes(port, path)
    client = Wire.to(port)
    whole = command("CL.CHECK", "cut", 10, 1, "COST", 3)
    client.send(whole[:9])          # its first half read by the old process...
    assert not client.fill(time.monotonic() + 0.2)
    new = nodes(port, path, takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    client.send(whole[9:])          # ...and the rest by the new one
    assert client.read_reply().startswith(b"*5\r\n:1\r\n:10\r\n:7\r\n")
    assert remaining(new.client(), "cut", 10) == 7


def test_a_subscriber_keeps_its_subscriptions_across_a_takeover(nodes, path):
    port = free_port()
    old = nodes(port, path)
    subscriber = Wire.to(port)
    subscriber.call("SUBSCRIBE", "news")
    subscriber.call("PSUBSCRIBE", "alerts.*")
    pushes = Wire.to(port)
    assert pushes.call("HELLO", 3).startswith(b"%")
    assert pushes.call("SUBSCRIBE", "news").startswith(b">3\r\n")
    new = nodes(port, path, takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    r = new.client(protocol=2)
    assert r.publish("news", "after") == 2
    assert r.publish("alerts.fire", "now") == 1
    assert subscriber.read_reply() == b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nafter\r\n"
    assert subscriber.read_reply() == (b"*4\r\n$8\r\npmessage\r\n$8\r\nalerts.*\r\n"
                                       b"$11\r\nalerts.fire\r\n$3\r\nnow\r\n")
    assert pushes.read_reply() == b">3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nafter\r\n"
    assert r.pubsub_numsub("news") == [(b"news", 2)] and r.pubsub_numpat() == 1
    assert subscriber.call("PING") == b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"    # still subscribed


def test_a_transaction_and_a_monitor_are_closed_not_passed(nodes, path):
    port = free_port()
    old = nodes(port, path)
    in_multi, watching, monitor, plain = (Wire.to(port) for _ in range(4))
    assert in_multi.call("MULTI") == b"+OK\r\n"
    assert in_multi.call("CL.CHECK", "m", 10, 1) == b"+QUEUED\r\n"
    assert watching.call("WATCH", "m") == b"+OK\r\n"
    assert monitor.call("MONITOR") == b"+OK\r\n"
    assert plain.call("PING") == b"+PONG\r\n"
    new = nodes(port, path, takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    assert in_multi.read_until_closed() == b""        # closed cleanly: no error, no reply
    assert watching.read_until_closed() == b""
    lines = monitor.read_until_closed().splitlines()
    assert lines and all(line.startswith(b"+") for line in lines), lines   # no error
    assert not (in_multi.reset or watching.reset or monitor.reset)
    assert plain.call("PING") == b"+PONG\r\n"
    info = new.client().info("server")
    assert info["takeover_connections_closed"] == 3
    assert remaining(new.client(), "m", 10) == 10     # the queued check never ran


def test_a_new_process_gone_at_the_flip_leaves_the_old_one_s_clients_closed_not_hanging(
        nodes, path):
    """A stand-in new process that flips and goes at once: after the flip
    nothing else can serve the clients, so the old process exits and
    their connections end (as after a crash of the new process)."""
    port = free_port()
    old = nodes(port, path)
    client = Wire.to(port)
    assert client.call("PING") == b"+PONG\r\n"
    with paused_stand_in(path) as (heir, _):
        handover.send(heir, handover.encode("flipped", pause_ms=0))
    assert old.proc.wait(20) == 0, old.log()
    client.read_until_closed()
    assert "Traceback" not in old.log()


def test_more_connections_than_one_message_carries_all_pass(nodes, path):
    port = free_port()
    old = nodes(port, path)
    clients = [Wire.to(port) for _ in range(handover.MAX_FDS + 50)]
    for i, client in enumerate(clients):
        assert client.call("CLIENT", "SETNAME", f"c{i}") == b"+OK\r\n"
    new = nodes(port, path, takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    for i, client in enumerate(clients):
        assert client.call("CLIENT", "GETNAME") == b"$%d\r\nc%d\r\n" % (len(str(i)) + 1, i)
    assert new.client().info("server")["takeover_connections_passed"] >= len(clients)
    for client in clients:
        client.close()


def test_a_connection_whose_user_the_new_process_lacks_is_closed_not_restored(nodes, path,
                                                                               tmp_path):
    acl, fewer = tmp_path / "users.acl", tmp_path / "fewer.acl"
    acl.write_text(ACL)
    fewer.write_text(ACL.split("\n", 1)[1])          # no user app
    port = free_port()
    old = nodes(port, path, "--aclfile", str(acl))
    as_app, as_default = Wire.to(port), Wire.to(port)
    assert as_app.call("AUTH", "app", "pw") == b"+OK\r\n"
    assert as_default.call("PING") == b"+PONG\r\n"
    new = nodes(port, path, "--aclfile", str(fewer), takeover_from=True)
    assert old.proc.wait(20) == 0, old.log()
    as_app.read_until_closed()
    assert as_default.call("PING") == b"+PONG\r\n"
    assert new.client().info("server")["takeover_connections_closed"] == 1
    assert "no ACL user 'app' here" in new.log()


KEEP_ALIVE_BODY = json.dumps({"key": "keepalive", "capacity": LOAD_CAPACITY,
                              "refill_per_sec": 1, "cost": 1}).encode()
KEEP_ALIVE_CHECK = (b"POST /v1/check/bucket HTTP/1.1\r\nHost: fastlimit\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(KEEP_ALIVE_BODY), KEEP_ALIVE_BODY))


class KeepAliveChecks:
    """POST /v1/check/bucket on one keep-alive connection (http.client), in
    a loop; a request is sent again, on a new connection, only when its
    connection failed (closed or reset before the response), as a client
    that retries on connection errors only: any status but 200 is an
    error (the load fails)."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.allowed = self.reconnects = 0

    def __call__(self) -> None:
        status = self.send()
        assert status == 200, status
        self.allowed += 1

    def send(self) -> int:
        while True:
            try:
                self.conn.request("POST", "/v1/check/bucket", KEEP_ALIVE_BODY,
                                  {"Content-Type": "application/json"})
                response = self.conn.getresponse()
                response.read()
                return response.status
            except ConnectionError:          # RemoteDisconnected and resets among them
                self.conn.close()            # the next request connects again
                self.reconnects += 1


class RlsCalls:
    """ShouldRateLimit calls on one grpcio channel, IN_FLIGHT at a time
    (so that some are on their way whenever the takeover pauses), in a
    loop, with grpcio's own retry only (transparent: a call the server
    never read); a call that fails is an error (the load fails)."""

    MESSAGE = request(b"rig", descriptor([(b"generic_key", b"per_path"), (b"path", b"/tk")]))
    IN_FLIGHT = 8

    def __init__(self, port: int):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.call = self.channel.unary_unary(RLS_PATH)
        self.allowed = 0

    def __call__(self) -> None:
        calls = [self.call.future(self.MESSAGE, timeout=10) for _ in range(self.IN_FLIGHT)]
        for call in calls:
            answer = decode_response(call.result())
            assert answer["overall"] == OK, answer
            self.allowed += 1

    def remaining(self) -> int:
        return decode_response(self.call(self.MESSAGE, timeout=10))["statuses"][0]["remaining"]


@pytest.mark.untraced
def test_http_keep_alive_and_grpc_clients_reconnect_to_the_new_process_counted_once(
        nodes, path, tmp_path):
    """The HTTP and gRPC connections are held from the pause and closed at
    the old process's exit (gRPC's with a GOAWAY): the keep-alive client
    sees its connection close and sends its request again to the new
    process, grpcio retries its calls there by itself; no error answer,
    each check counted once (the buckets say so)."""
    rls = tmp_path / "rls.yaml"
    # The rig's per-path limit, raised out of the load's reach.
    rls.write_text(RIG_YAML.replace("requests_per_unit: 1000,", "requests_per_unit: 1000000,"))
    port, http_port, grpc_port = free_port(), free_port(), free_port()
    fronts = ["--http-port", str(http_port), "--grpc-port", str(grpc_port),
              "--rls-config", str(rls)]
    old = nodes(port, path, *fronts)
    keep_alive, rls_calls = KeepAliveChecks(http_port), RlsCalls(grpc_port)
    loads = [Load(keep_alive), Load(rls_calls)]
    for load in loads:
        load.start()

    def failed() -> bool:          # the waits end at a load's first error, which stop() shows
        return any(load.errors for load in loads)

    try:
        wait_until(lambda: keep_alive.allowed and rls_calls.allowed or failed(), 10,
                   "the load to run")
        new = nodes(port, path, *fronts, takeover_from=True)
        assert old.proc.wait(20) == 0, old.log()
        at_exit = keep_alive.allowed, rls_calls.allowed
        wait_until(lambda: keep_alive.allowed > at_exit[0] + 100
                   and rls_calls.allowed > at_exit[1] + 100 or failed(), 10,
                   "the load on the new process")
        for load in loads:
            load.stop()
        assert rls_calls.remaining() == 1_000_000 - rls_calls.allowed - 1
    finally:
        for load in loads:
            load.done.set()
        rls_calls.channel.close()

    assert keep_alive.reconnects >= 1           # closed at the old process's exit
    assert LOAD_CAPACITY - remaining(new.client(), "keepalive", LOAD_CAPACITY) \
        == keep_alive.allowed
