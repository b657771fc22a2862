"""INFO replication (and run_id) as Redis Sentinel reads it: Redis 7.0's
field names, order and formats, compared with a real redis-server primary
and replica; a replica listed under its reachable address; the
replica-priority, replica-announce-* and replica-announced settings.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import threading
from contextlib import closing

import pytest
import redis
from servers import RedisServerProcess
from wire import Wire, command, free_port, wait_until

WAIT = 20.0
# What Redis 7.0 has and fastlimit has no concept of: it has no partial
# resync, so no second replication id and no backlog.
REDIS_ONLY = {"master_replid2", "second_repl_offset", "repl_backlog_active",
              "repl_backlog_size", "repl_backlog_first_byte_offset", "repl_backlog_histlen"}
SLAVE_LINE = re.compile(r"ip=[^,]+,port=\d+,state=(wait_bgsave|send_bulk|online),"
                        r"offset=\d+,lag=\d+")


def raw_info(port: int, section: str = "replication") -> list[tuple[str, str]]:
    """(field, value) in the order sent."""
    with Wire.to(port) as w:
        reply = w.call("INFO", section)
    assert reply.startswith(b"$")
    body = reply.split(b"\r\n", 1)[1].decode()
    return [tuple(line.split(":", 1)) for line in body.split("\r\n")
            if line and not line.startswith("#")]


def names(fields) -> list[str]:
    """Field names, every slave<N> as slave<N>."""
    return [re.sub(r"^slave\d+$", "slave<N>", k) for k, _ in fields]


def redis_view(fastlimit_fields, redis_fields) -> tuple[list[str], list[str]]:
    """Both lists of names, each cut to the names the other has (beyond
    REDIS_ONLY, Redis must have nothing fastlimit lacks)."""
    ours, theirs = names(fastlimit_fields), names(redis_fields)
    assert set(theirs) - set(ours) <= REDIS_ONLY, set(theirs) - set(ours)
    return [n for n in ours if n in theirs], [n for n in theirs if n in ours]


class RedisReplica:
    """A redis-server replica of a redis-server primary, for comparison."""

    def __init__(self, primary_port: int):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-replica-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir,
             "--replicaof", "127.0.0.1", str(primary_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._answers, WAIT, "redis-server replica to start")

    def _answers(self) -> bool:
        try:
            return redis.Redis(port=self.port).ping()
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def redis_pair():
    primary = RedisServerProcess()
    replica = RedisReplica(primary.port)
    try:
        wait_until(lambda: dict(raw_info(replica.port))["master_link_status"] == "up", WAIT,
                   "the redis replica's link")
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def fastlimit_pair(make_server, *replica_args):
    primary = make_server()
    replica = make_server("--replicaof", "127.0.0.1", str(primary.port), *replica_args)
    wait_until(lambda: dict(raw_info(replica.port))["master_link_status"] == "up", WAIT,
               "the link")
    wait_until(lambda: "state=online" in dict(raw_info(primary.port)).get("slave0", ""), WAIT,
               "the replica online")
    return primary, replica


def test_replication_fields_are_redis_7s_in_its_order(make_server, redis_pair):
    rp, rr = redis_pair
    primary, replica = fastlimit_pair(make_server)
    ours, theirs = redis_view(raw_info(primary.port), raw_info(rp.port))
    assert ours == theirs
    ours, theirs = redis_view(raw_info(replica.port), raw_info(rr.port))
    assert ours == theirs
    for fields in (raw_info(primary.port), raw_info(rp.port)):
        assert SLAVE_LINE.fullmatch(dict(fields)["slave0"]), fields

    # and with the link down: the time down appears, where Redis has it
    primary.stop()
    rp.proc.terminate()
    rp.proc.wait(10)
    for port in (replica.port, rr.port):
        wait_until(lambda p=port: dict(raw_info(p))["master_link_status"] == "down", WAIT,
                   "the link down")
    ours, theirs = redis_view(raw_info(replica.port), raw_info(rr.port))
    assert ours == theirs
    assert "master_link_down_since_seconds" in ours


def test_values_in_the_replication_section(make_server):
    primary, replica = fastlimit_pair(make_server)
    info = dict(raw_info(replica.port))
    assert info["role"] == "slave"
    assert (info["master_host"], info["master_port"]) == ("127.0.0.1", str(primary.port))
    assert (info["master_link_status"], info["master_sync_in_progress"]) == ("up", "0")
    assert int(info["master_last_io_seconds_ago"]) >= 0
    assert "master_link_down_since_seconds" not in info     # only while down, as Redis
    assert (info["slave_priority"], info["slave_read_only"], info["replica_announced"]) == \
        ("100", "1", "1")
    assert int(info["slave_read_repl_offset"]) >= int(info["slave_repl_offset"]) >= 0
    pinfo = dict(raw_info(primary.port))
    assert re.fullmatch(r"[0-9a-f]{40}", pinfo["master_replid"])
    assert info["master_replid"] == pinfo["master_replid"]
    # the replica's reachable address: the link's address and its listening port
    assert pinfo["slave0"].startswith(f"ip=127.0.0.1,port={replica.port},state=online,")
    assert pinfo["role"] == "master" and pinfo["connected_slaves"] == "1"


def test_run_id_is_40_hex_digits_for_the_life_of_the_process(make_server):
    a, b = make_server(), make_server()
    run_id = dict(raw_info(a.port, "server"))["run_id"]
    assert re.fullmatch(r"[0-9a-f]{40}", run_id)
    assert dict(raw_info(a.port, "server"))["run_id"] == run_id
    assert dict(raw_info(b.port, "server"))["run_id"] != run_id


def test_a_never_connected_replica_says_down_since_minus_one_as_redis_does(make_server,
                                                                          redis_server):
    nowhere = free_port()
    replica = make_server("--replicaof", "127.0.0.1", str(nowhere))
    r = redis_server.client()
    r.execute_command("REPLICAOF", "127.0.0.1", nowhere)
    try:
        theirs = dict(raw_info(redis_server.port))
        ours = dict(raw_info(replica.port))
        assert ours["master_link_down_since_seconds"] == \
            theirs["master_link_down_since_seconds"] == "-1"
        assert ours["master_last_io_seconds_ago"] == theirs["master_last_io_seconds_ago"] == "-1"
    finally:
        r.execute_command("REPLICAOF", "NO", "ONE")


def test_a_replica_is_listed_under_its_announced_address(make_server):
    primary, replica = fastlimit_pair(make_server, "--replica-announce-ip", "10.9.8.7",
                                      "--replica-announce-port", "7001")
    assert dict(raw_info(primary.port))["slave0"].startswith(
        "ip=10.9.8.7,port=7001,state=online,")
    role = primary.client().execute_command("ROLE")
    assert role[2][0][:2] == [b"10.9.8.7", b"7001"]
    # changed at runtime, it is sent on the next link (here: after a re-point)
    other = make_server()
    c = replica.client()
    c.config_set("replica-announce-ip", "replica.example")
    c.config_set("replica-announce-port", "0")
    c.execute_command("SLAVEOF", "127.0.0.1", other.port)
    wait_until(lambda: "state=online" in dict(raw_info(other.port)).get("slave0", ""), WAIT,
               "the replica online at the other primary")
    assert dict(raw_info(other.port))["slave0"].startswith(
        f"ip=replica.example,port={replica.port},")


def test_replica_priority_and_announced_are_settings(make_server):
    primary, replica = fastlimit_pair(make_server, "--replica-priority", "0",
                                      "--replica-announced", "no")
    info = dict(raw_info(replica.port))
    assert (info["slave_priority"], info["replica_announced"]) == ("0", "0")
    c = replica.client()
    assert c.config_get("replica-*") == {
        "replica-priority": "0", "replica-announce-ip": "", "replica-announce-port": "0",
        "replica-announced": "no"}
    c.config_set("replica-priority", "25")
    c.config_set("replica-announced", "yes")
    info = dict(raw_info(replica.port))
    assert (info["slave_priority"], info["replica_announced"]) == ("25", "1")


@pytest.mark.parametrize("name, value", [
    ("replica-priority", "-1"),
    ("replica-priority", "2147483648"),
    ("replica-priority", "+5"),
    ("replica-announce-port", "65536"),
    ("replica-announce-ip", "10.0.0.1,port=1"),
    ("replica-announce-ip", "a b"),
    ("replica-announce-ip", "x" * 256),
    ("replica-announced", "maybe"),
])
def test_bad_replica_settings_are_refused(server, name, value):
    with Wire.to(server.port) as w:
        reply = w.call("CONFIG", "SET", name, value)
    assert reply.startswith(
        f"-ERR CONFIG SET failed (possibly related to argument '{name}') - ".encode()), reply


def test_bad_replica_flags_stop_the_server_with_a_clear_error(make_server):
    with pytest.raises(RuntimeError, match="replica-announce-ip: argument must be"):
        make_server("--replica-announce-ip", "a\r\nrole:master")


def test_an_announced_address_that_would_forge_info_fields_is_refused(make_server):
    """A replica link's REPLCONF ip-address goes into the primary's INFO:
    one with a comma or a line break closes the link; before CL.SYNC it
    has nowhere to go, and says so."""
    primary = make_server()
    with closing(socket.create_connection(("127.0.0.1", primary.port), timeout=10)) as s:
        s.sendall(command("CL.SYNC") + command("REPLCONF", "ip-address", "1.2.3.4\r\nrole:slave"))
        wait_until(lambda: dict(raw_info(primary.port))["connected_slaves"] == "0", WAIT,
                   "the link closed")
    assert "role:slave" not in str(raw_info(primary.port))
    with Wire.to(primary.port) as w:
        assert w.call("REPLCONF", "ip-address", "1.2.3.4") == \
            b"-ERR REPLCONF ip-address is taken after CL.SYNC, on the replica link\r\n"


class StalledPrimary:
    """A primary that answers CL.SYNC, then sends the first part of a
    full-copy frame and stops: its replica stays mid-sync."""

    FRAME_SIZE = 9 + 1000      # <u8 kind><u64 length> and a 1,000-byte payload
    SENT = 9 + 400

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        self.conns.append(conn)
        data = b""
        while b"CL.SYNC" not in data:
            data += conn.recv(4096)
        conn.sendall(b"+FULLSYNC " + b"ab" * 20 + b" 0\r\n" + b"S" +
                     (1000).to_bytes(8, "little") + b"\0" * 400)

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


def test_a_replica_mid_sync_shows_redis_s_sync_progress_fields(make_server, redis_server):
    stalled = StalledPrimary()
    try:
        replica = make_server("--replicaof", "127.0.0.1", str(stalled.port))
        wait_until(lambda: dict(raw_info(replica.port))["master_sync_in_progress"] == "1", WAIT,
                   "the sync to start")
        fields = raw_info(replica.port)
        info = dict(fields)
        assert info["master_sync_total_bytes"] == str(StalledPrimary.FRAME_SIZE)
        assert info["master_sync_read_bytes"] == str(StalledPrimary.SENT)
        assert info["master_sync_left_bytes"] == str(StalledPrimary.FRAME_SIZE -
                                                     StalledPrimary.SENT)
        assert info["master_sync_perc"] == f"{100 * StalledPrimary.SENT / 1009:.2f}"
        assert int(info["master_sync_last_io_seconds_ago"]) >= 0
        # where Redis puts them: after the offsets, before the time down
        order = names(fields)
        assert order[order.index("slave_repl_offset") + 1:][:6] == [
            "master_sync_total_bytes", "master_sync_read_bytes", "master_sync_left_bytes",
            "master_sync_perc", "master_sync_last_io_seconds_ago",
            "master_link_down_since_seconds"]
    finally:
        stalled.close()
