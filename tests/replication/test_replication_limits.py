"""What replication costs a primary, bounded: full copies shared by the
followers that arrive together and capped by repl-max-full-copies, every
byte a replica has not read counted against repl-buffer-limit, CL.SYNC's
credentials, and links that can never come up (to itself, to a replica)
that neither spin nor fill the log.

Fake replicas are raw sockets that send CL.SYNC and never read (a tiny
receive buffer), as an attacker's would; real replicas are server
processes.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import ExitStack, closing

import pytest
import redis

from wire import Wire, command, wait_until

T0 = 1_000_000
WAIT = 30.0
MB = 1024 * 1024
BIG = 400_000            # buckets: a full copy of about 12 MB, more than a socket absorbs


def populate(port: int, n: int, prefix: str = "key", chunk: int = 20_000) -> None:
    """n buckets, CL.CHECKs pipelined on one raw connection."""
    with closing(socket.create_connection(("127.0.0.1", port), timeout=30)) as s:
        for start in range(0, n, chunk):
            count = min(chunk, n - start)
            s.sendall(b"".join(command("CL.CHECK", f"{prefix}:{i:07d}", 100, 1)
                               for i in range(start, start + count)))
            lines = 0
            while lines < 6 * count:      # a CL.CHECK reply is 6 lines
                data = s.recv(1 << 20)
                assert data and b"-" not in data[:1], data[:100]
                lines += data.count(b"\n")


def fake_replica(stack: ExitStack, port: int) -> socket.socket:
    """A connection that asks for a full copy and then never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(command("CL.SYNC"))
    return stack.enter_context(closing(s))


def full_copy_files(pid: int) -> int:
    """The full copies' memory files the process holds open."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:fastlimit-full-copy")
        except FileNotFoundError:
            pass
    return n


def states(p: redis.Redis) -> list[str]:
    info = p.info("replication")
    return [info[f"slave{i}"]["state"] for i in range(info["connected_slaves"])]


def wait_states(p: redis.Redis, expected: list[str]) -> None:
    wait_until(lambda: sorted(states(p)) == sorted(expected), WAIT,
               f"replicas in states {expected}")


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def peek(c, key):
    return c.execute_command("CL.CHECK", key, 100, 1, "COST", 0)


# ---- one full copy, shared ---------------------------------------------------------------------

@pytest.mark.untraced
def test_replicas_arriving_together_share_one_full_copy(make_server):
    primary = make_server("--manual-clock")
    p = primary.client()
    p.execute_command("DEBUG", "CLOCK", "SET", T0)
    populate(primary.port, BIG)
    with ExitStack() as stack:
        for _ in range(10):
            fake_replica(stack, primary.port)
        wait_states(p, ["send_bulk"] * 10)
        info, memory = p.info("replication"), p.info("memory")
        # one fork and one memory file for all ten
        assert (info["repl_full_syncs"], info["repl_full_copies_written"],
                info["repl_full_copies_in_flight"]) == (10, 1, 1), info
        assert full_copy_files(primary.proc.pid) == 1
        size = info["repl_full_copy_bytes"]
        assert size > 8 * MB and memory["mem_repl_full_copies"] == size
        assert memory["repl_full_copies"] == 1
        assert memory["mem_clients_slaves"] > 0

        # Real replicas arriving meanwhile share it too, and converge with
        # the writes made while it is sent.
        replicas = [make_server("--manual-clock", "--replicaof", "127.0.0.1",
                                str(primary.port)) for _ in range(2)]
        clients = [r.client() for r in replicas]
        for c in clients:
            c.execute_command("DEBUG", "CLOCK", "SET", T0)
        populate(primary.port, 5000, prefix="during")
        for c in clients:
            wait_until(lambda: c.info("replication")["master_link_status"] == "up", WAIT,
                       "a real replica's link up")
        populate(primary.port, 5000, prefix="after")
        target = p.info("replication")["master_repl_offset"]
        for c in clients:
            wait_until(lambda: c.info("replication")["slave_repl_offset"] >= target, WAIT,
                       "a real replica catching up")
            assert c.dbsize() == p.dbsize() == BIG + 10_000
            for key in ("key:0000000", f"key:{BIG - 1:07d}", "during:0004999", "after:0000000"):
                assert peek(c, key) == peek(p, key)
        info = p.info("replication")
        assert info["repl_full_copies_written"] == 1, info
        assert sorted(states(p)) == ["online"] * 2 + ["send_bulk"] * 10
    # the fakes gone, the copy is freed
    wait_until(lambda: p.info("replication")["repl_full_copies_in_flight"] == 0, WAIT,
               "the copy freed")
    assert full_copy_files(primary.proc.pid) == 0
    assert p.info("memory")["mem_repl_full_copies"] == 0


@pytest.mark.untraced
@pytest.mark.parametrize("max_copies, copies", [(1, 1), (2, 2)])
def test_full_copies_in_flight_are_capped_by_repl_max_full_copies(make_server, max_copies,
                                                                  copies):
    """A copy whose waiting frames pass half repl-buffer-limit is too far
    behind to share when another may be made; past the cap it is shared
    anyway."""
    limit = 16 * MB
    primary = make_server("--manual-clock", "--repl-buffer-limit", "16mb",
                          "--repl-max-full-copies", str(max_copies))
    p = primary.client()
    populate(primary.port, BIG)
    with ExitStack() as stack:
        fake_replica(stack, primary.port)
        wait_states(p, ["send_bulk"])
        for i in range(40):
            if p.info("memory")["mem_repl_waiting_frames"] > limit // 2:
                break
            populate(primary.port, 20_000, prefix=f"more{i}")
        else:
            raise AssertionError("the frames behind the copy never passed half the limit")
        assert p.info("replication")["connected_slaves"] == 1
        fake_replica(stack, primary.port)
        wait_until(lambda: len(states(p)) == 2, WAIT, "the second fake replica attached")
        info = p.info("replication")
        assert (info["repl_full_copies_written"], info["repl_full_copies_in_flight"]) == \
            (copies, copies), info
        assert full_copy_files(primary.proc.pid) == copies


# ---- the output bound, in every phase --------------------------------------------------------

def write_until_dropped(p: redis.Redis, port: int) -> int:
    """Writes new buckets until the primary drops its replica; the stream
    bytes written meanwhile."""
    start = p.info("replication")["master_repl_offset"]
    for i in range(400):
        if p.info("replication")["repl_dropped_replicas"]:
            return p.info("replication")["master_repl_offset"] - start
        populate(port, 5_000, prefix=f"flood{i}")
    raise AssertionError("the replica was never dropped")


@pytest.mark.untraced
def test_a_replica_that_never_reads_its_full_copy_is_dropped_at_repl_buffer_limit(
        make_server):
    """While its copy is sent, the copy's bytes in its socket buffer count
    with the batches waiting behind it."""
    primary = make_server("--manual-clock", "--repl-buffer-limit", "8mb")
    p = primary.client()
    populate(primary.port, BIG)
    with ExitStack() as stack:
        fake_replica(stack, primary.port)
        wait_states(p, ["send_bulk"])
        rss = primary.rss_bytes()
        written = write_until_dropped(p, primary.port)
        # the batches alone stayed under the limit: the unsent copy counted
        assert written < 8 * MB, written
        assert peak_rss(primary.proc.pid) - rss < 8 * MB + 32 * MB
    assert "passed repl-buffer-limit" in primary.log()
    assert p.info("replication")["repl_full_copies_in_flight"] == 0


@pytest.mark.untraced
def test_an_online_replica_that_stops_reading_is_dropped_at_repl_buffer_limit(make_server):
    primary = make_server("--manual-clock", "--repl-buffer-limit", "2mb")
    p = primary.client()
    with ExitStack() as stack:
        fake_replica(stack, primary.port)
        wait_states(p, ["online"])       # a copy small enough to fit the socket
        rss = primary.rss_bytes()
        write_until_dropped(p, primary.port)
        assert peak_rss(primary.proc.pid) - rss < 2 * MB + 32 * MB
    assert "passed repl-buffer-limit" in primary.log()


def read_stream(sock: socket.socket, frames_wanted: int) -> list[int]:
    """The kinds of the first frames after +FULLSYNC; fails on anything
    that is not a frame (a reply spliced into the stream)."""
    from fastlimit.replication import stream as rs
    wire, reader, kinds = Wire(sock), rs.FrameReader(), []
    assert wire.read_reply().startswith(b"+FULLSYNC ")
    data, deadline = wire.buf, time.monotonic() + WAIT
    while len(kinds) < frames_wanted:
        kinds += [kind for kind, _ in reader.feed(data)]
        assert time.monotonic() < deadline, kinds
        sock.settimeout(1)
        try:
            data = sock.recv(1 << 16)
        except socket.timeout:
            data = b""
    return kinds


def test_replconf_on_a_replica_link_gets_no_reply_in_the_stream(make_server):
    primary = make_server("--manual-clock")
    p = primary.client()
    with closing(socket.create_connection(("127.0.0.1", primary.port))) as s:
        s.sendall(command("CL.SYNC") + command("REPLCONF", "listening-port", "4321") +
                  command("REPLCONF", "ACK", "0"))
        # rules, full copy, then heartbeat batches: all frames, no +OK
        assert read_stream(s, 3)[:2] == [ord("R"), ord("S")]
        assert p.info("replication")["slave0"]["port"] == 4321
        s.sendall(command("REPLCONF", "bogus", "1"))      # malformed: the link closes
        wait_until(lambda: p.info("replication")["connected_slaves"] == 0, WAIT,
                   "the link closed")


# ---- credentials ---------------------------------------------------------------------------

def test_cl_sync_on_a_requirepass_server_needs_auth(make_server):
    primary = make_server("--requirepass", "pw")
    with Wire.to(primary.port) as w:
        assert w.call("CL.SYNC") == b"-NOAUTH Authentication required.\r\n"
        assert w.call("REPLCONF", "listening-port", "1") == \
            b"-NOAUTH Authentication required.\r\n"
        # CL.SYNC takes no credentials of its own: nothing is a way around AUTH
        assert w.call("CL.SYNC", "replica", "pw") == \
            b"-ERR wrong number of arguments for 'cl.sync' command\r\n"
        assert w.call("PING") == b"-NOAUTH Authentication required.\r\n"
    assert primary.client(password="pw").info("replication")["connected_slaves"] == 0


def replica_in_sync(make_server, primary, *args):
    """A manual-clock replica of primary, at T0, once its link is up."""
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(primary.port), *args)
    r = replica.client()
    r.execute_command("DEBUG", "CLOCK", "SET", T0)
    wait_until(lambda: r.info("replication")["master_link_status"] == "up", WAIT, "link up")
    return replica


def test_repl_password_is_required_by_cl_sync(make_server):
    primary = make_server("--manual-clock", "--repl-user", "rep", "--repl-password", "s3cret")
    p = primary.client()
    p.execute_command("DEBUG", "CLOCK", "SET", T0)
    p.execute_command("CL.CHECK", "k", 100, 1, "COST", 7)
    with Wire.to(primary.port) as w:
        assert w.call("CL.SYNC").startswith(b"-NOPERM this primary requires replication "
                                            b"credentials")
        assert w.call("AUTH", "rep", "nope").startswith(b"-WRONGPASS")
        assert w.call("AUTH", "other", "s3cret").startswith(b"-WRONGPASS")
    assert p.info("replication")["connected_slaves"] == 0

    wrong = make_server("--replicaof", "127.0.0.1", str(primary.port),
                        "--masteruser", "rep", "--masterauth", "nope")
    right = replica_in_sync(make_server, primary, "--masteruser", "rep", "--masterauth", "s3cret")
    assert peek(right.client(), "k") == peek(p, "k")
    info = p.info("replication")
    assert info["connected_slaves"] == 1 and info["slave0"]["port"] == right.port
    assert wrong.client().info("replication")["master_link_status"] == "down"
    wait_until(lambda: "WRONGPASS" in wrong.log(), WAIT, "the refusal logged")


def test_replication_credentials_stand_in_for_requirepass_only_to_replicate(make_server):
    primary = make_server("--manual-clock", "--requirepass", "adminpw",
                          "--repl-password", "replpw")
    p = primary.client(password="adminpw")
    p.execute_command("DEBUG", "CLOCK", "SET", T0)
    p.execute_command("CL.CHECK", "k", 100, 1, "COST", 7)
    with Wire.to(primary.port) as w:     # the admin password is not the replication one
        assert w.call("AUTH", "adminpw") == b"+OK\r\n"
        assert w.call("CL.SYNC").startswith(b"-NOPERM")
    with Wire.to(primary.port) as w:     # the replication one is no admin password
        assert w.call("AUTH", "replica", "replpw") == b"+OK\r\n"
        assert w.call("CL.RESET", "k") == \
            b"-NOPERM this user has no permissions to run the 'cl.reset' command\r\n"
        w.send(command("CL.SYNC"))
        assert w.read_reply().startswith(b"+FULLSYNC ")
        w.send(command("CL.RESET", "k") + command("FLUSHALL"))
        time.sleep(0.5)
    assert peek(p, "k") == [1, 100, 93, 0, 7000]
    replica = replica_in_sync(make_server, primary, "--masteruser", "replica",
                              "--masterauth", "replpw")
    assert peek(replica.client(), "k") == peek(p, "k")


# ---- links that can never come up ------------------------------------------------------------

def test_replicaof_itself_stops_with_a_clear_error(make_server):
    server = make_server()
    c = server.client()
    # by a name, not the address it listens on: detected in the handshake
    assert c.execute_command("REPLICAOF", "localhost", server.port) in (b"OK", True)
    wait_until(lambda: "can't replicate from myself" in server.log(), WAIT, "the refusal")
    time.sleep(2)     # real time is the point: it would have retried 4 times by now
    log = server.log()
    assert log.count("can't replicate from myself") == 1 and " ERROR " in log
    assert log.count("replication from primary") == 0, log
    assert c.execute_command("ROLE")[3] == b"connect"
    assert c.execute_command("REPLICAOF", "NO", "ONE") in (b"OK", True)
    assert c.execute_command("CL.CHECK", "k", 10, 1)[0] == 1


def test_a_replica_out_of_sync_refuses_its_replicas_who_back_off_and_log_once(make_server):
    nowhere = make_server()
    port = nowhere.port
    nowhere.stop()
    middle = make_server("--replicaof", "127.0.0.1", str(port))
    below = make_server("--replicaof", "127.0.0.1", str(middle.port))
    c = below.client()
    wait_until(lambda: c.info("replication")["master_link_failures"] >= 4, WAIT,
               "retries")
    log = below.log()
    assert log.count("NOMASTERLINK Can't SYNC while not connected with my master") == 1, log
    # the retries back off: 0.5, 1, 2, 4 s...
    failures = c.info("replication")["master_link_failures"]
    time.sleep(3)
    assert c.info("replication")["master_link_failures"] <= failures + 1
