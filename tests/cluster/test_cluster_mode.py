"""Cluster mode on real processes: three static shards of a primary and a
standby, spoken to by raw sockets, redis-py's RedisCluster (sync and
asyncio), redis-cli -c and redis-benchmark --cluster, every answer on
the manual clock compared with one standalone fastlimit's."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
import redis
import redis.asyncio
from cluster_rig import info, raw_reply, ruled_servers
from servers import ServerProcess
from wire import Wire, free_port

from fastlimit._cluster import keyslot

FOO = keyslot(b"foo")      # 12182: the third shard's


def shard_of(cluster, slot: int) -> int:
    return slot * len(cluster.nodes) // 16384


def node_of(cluster, key: bytes):
    return cluster.primaries[shard_of(cluster, keyslot(key))]


def elsewhere(cluster, key: bytes):
    """A primary that does not serve key."""
    return cluster.primaries[(shard_of(cluster, keyslot(key)) + 1) % len(cluster.nodes)]


def raw(node, *args, protocol: int = 2):
    return raw_reply(node.port, *args, protocol=protocol)


def set_clock(cluster, ms: int, *others) -> None:
    for node in [*cluster.every_node, *others]:
        with node.client() as c:
            c.execute_command("DEBUG", "CLOCK", "SET", ms)


# ---- topology replies ---------------------------------------------------------------

def test_every_node_answers_the_same_cluster_slots_covering_every_slot(fl_cluster):
    replies = [raw(n, "CLUSTER", "SLOTS") for n in fl_cluster.every_node]
    assert all(r == replies[0] for r in replies)
    covered = sorted((e[0], e[1]) for e in replies[0])
    assert covered[0][0] == 0 and covered[-1][1] == 16383
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:], strict=False))
    for entry, shard in zip(replies[0], fl_cluster.nodes, strict=True):
        assert [(n[0], n[1]) for n in entry[2:]] == [(b"127.0.0.1", s.port) for s in shard]
        assert all(len(n[2]) == 40 and n[3] == [] for n in entry[2:])
    resp3 = raw(fl_cluster.primaries[0], "CLUSTER", "SLOTS", protocol=3)
    assert [[*e[:2], *(n[:3] + [[]] for n in e[2:])] for e in resp3] == replies[0]
    assert all(n[3] == {} for e in resp3 for n in e[2:])    # a map in RESP3, as Redis


def test_cluster_nodes_lines_end_in_newline_with_one_myself_line_matching_myid(fl_cluster):
    ids = set()
    for node in fl_cluster.every_node:
        text = raw(node, "CLUSTER", "NODES").decode()
        assert "\r" not in text and text.endswith("\n")
        lines = text.splitlines()
        assert len(lines) == 6
        myself = [ln for ln in lines if "myself" in ln.split()[2]]
        assert len(myself) == 1
        assert myself[0].split()[0] == raw(node, "CLUSTER", "MYID").decode()
        assert myself[0].split()[1] == f"127.0.0.1:{node.port}@0"
        ids.add(frozenset(ln.split()[0] for ln in lines))
    assert len(ids) == 1      # the same ids in every node's view


def test_cluster_info_says_ok_with_every_slot_served(fl_cluster, redis_cluster):
    ours = raw(fl_cluster.primaries[0], "CLUSTER", "INFO").decode()
    theirs = raw(redis_cluster[0], "CLUSTER", "INFO").decode()
    fields = dict(line.split(":", 1) for line in ours.split("\r\n") if line)
    assert ours.endswith("\r\n")
    assert fields["cluster_state"] == "ok" and fields["cluster_slots_ok"] == "16384"
    assert fields["cluster_known_nodes"] == "6" and fields["cluster_size"] == "3"
    redis_names = [line.split(":")[0] for line in theirs.split("\r\n")[:9]]
    assert list(fields)[:9] == redis_names


def test_info_shows_cluster_mode(fl_cluster):
    node = fl_cluster.primaries[1]
    assert info(node, "cluster")["cluster_enabled"] == 1
    assert info(node, "server")["redis_mode"] == "cluster"
    assert info(node, "cluster")["cluster_shard"] == "fl-1"


@pytest.mark.parametrize("key", [b"foo", b"{user1000}.following", b"", b"{}", b"a{b}c"])
def test_cluster_keyslot_is_the_key_slot(fl_cluster, redis_cluster_node, key):
    assert raw(fl_cluster.primaries[0], "CLUSTER", "KEYSLOT", key) == \
        raw(redis_cluster_node, "CLUSTER", "KEYSLOT", key) == keyslot(key)


def test_readonly_readwrite_and_asking_answer_ok(fl_cluster):
    with Wire.to(fl_cluster.nodes[0][1].port) as w:
        for command in ("READONLY", "READWRITE", "ASKING"):
            assert w.call(command) == b"+OK\r\n"


# ---- routing -----------------------------------------------------------------------

def test_a_key_another_shard_serves_is_moved_to_its_primary(fl_cluster):
    owner = node_of(fl_cluster, b"foo")
    with Wire.to(elsewhere(fl_cluster, b"foo").port) as w:
        assert w.call("CL.CHECK", "foo", "10", "1") == \
            f"-MOVED {FOO} 127.0.0.1:{owner.port}\r\n".encode()
    with Wire.to(owner.port) as w:
        assert w.call("CL.CHECK", "foo", "10", "1").startswith(b"*5\r\n:1\r\n")


def test_a_standby_moves_even_its_own_shards_keys_to_its_primary(fl_cluster):
    owner = node_of(fl_cluster, b"foo")
    standby = fl_cluster.nodes[fl_cluster.primaries.index(owner)][1]
    with Wire.to(standby.port) as w:
        assert w.call("READONLY") == b"+OK\r\n"
        for cost in ("1", "0"):
            assert w.call("CL.CHECK", "foo", "10", "1", "COST", cost) == \
                f"-MOVED {FOO} 127.0.0.1:{owner.port}\r\n".encode()


@pytest.mark.parametrize("args,key_at", [
    (["CL.CHECK", "{k}", "10", "1"], 1), (["CL.RESET", "{k}"], 1),
    (["CL.THROTTLE", "{k}", "5", "10", "60"], 1), (["CL.LIMIT", "{k}", "GET /"], 1),
    (["CL.APPLY", "r", "{k}"], 2), (["CL.ACQUIRE", "r", "{k}"], 2),
    (["CL.RELEASE", "r", "{k}", "1"], 2),
])
def test_every_keyed_command_routes_by_its_key(fl_cluster, args, key_at):
    slot = keyslot(args[key_at].encode())
    owner = node_of(fl_cluster, args[key_at].encode())
    for node in fl_cluster.primaries:
        with Wire.to(node.port) as w:
            reply = w.call(*args)
        if node is owner:
            assert not reply.startswith(b"-MOVED")
        else:
            assert reply == f"-MOVED {slot} 127.0.0.1:{owner.port}\r\n".encode()


def test_keyless_commands_run_on_any_node(fl_cluster):
    for node in fl_cluster.every_node:
        with Wire.to(node.port) as w:
            assert w.call("PING") == b"+PONG\r\n"
            assert w.call("DBSIZE").startswith(b":")


def test_a_moved_command_in_multi_fails_the_transaction(fl_cluster):
    with Wire.to(elsewhere(fl_cluster, b"foo").port) as w:
        assert w.call("MULTI") == b"+OK\r\n"
        assert w.call("CL.CHECK", "foo", "10", "1").startswith(b"-MOVED ")
        assert w.call("EXEC") == \
            b"-EXECABORT Transaction discarded because of previous errors.\r\n"


def test_moved_replies_are_counted_in_errorstats(fl_cluster):
    node = elsewhere(fl_cluster, b"foo")
    before = info(node, "errorstats").get("errorstat_MOVED", {}).get("count", 0)
    with Wire.to(node.port) as w:
        w.call("CL.CHECK", "foo", "10", "1")
    assert info(node, "errorstats")["errorstat_MOVED"]["count"] == before + 1


# ---- clients --------------------------------------------------------------------------

KEYS = [f"user:{i}".encode() for i in range(10_000)]
RULES = {"rules": {"api": {"match": {"resource": "GET /api"}, "capacity": 3,
                           "refill_per_second": 1}}}


@pytest.fixture(scope="module")
def ruled_cluster(tmp_path_factory):
    """The same rules on every node of a cluster and on one standalone
    server, to compare their answers."""
    cluster, single = ruled_servers(tmp_path_factory.mktemp("ruled"), RULES)
    yield cluster, single
    single.stop()
    cluster.stop()


def answers(client, pipeline_of) -> list:
    out = []
    for start in range(0, len(KEYS), 1000):
        pipe = pipeline_of(client)
        for key in KEYS[start:start + 1000]:
            pipe.execute_command("CL.CHECK", key, 5, 2)
            pipe.execute_command("CL.LIMIT", key, "GET /api")
        out += pipe.execute()
    return out


@pytest.mark.untraced
def test_redis_py_cluster_answers_as_one_standalone_server(ruled_cluster):
    cluster, single = ruled_cluster
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.primaries[0].port,
                            socket_timeout=10)
    plain = single.client()
    try:
        for t in (0, 0, 400, 1500):
            set_clock(cluster, t, single)
            ours = answers(rc, lambda c: c.pipeline())
            assert ours == answers(plain, lambda c: c.pipeline(transaction=False))
        assert {shard_of(cluster, keyslot(k)) for k in KEYS} == {0, 1, 2}
    finally:
        rc.close()
        plain.close()


def test_redis_py_cluster_follows_a_wrong_first_guess(ruled_cluster):
    cluster, _ = ruled_cluster
    set_clock(cluster, 10_000_000)
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.primaries[0].port,
                            socket_timeout=10)
    try:
        rc.nodes_manager.slots_cache[FOO] = [rc.get_node(port=elsewhere(cluster, b"foo").port,
                                                         host="127.0.0.1")]
        assert rc.execute_command("CL.CHECK", "foo", 10, 1)[:3] == [1, 10, 9]
        assert rc.nodes_manager.slots_cache[FOO][0].port == node_of(cluster, b"foo").port
    finally:
        rc.close()


def test_async_redis_py_cluster_routes_every_key(ruled_cluster):
    cluster, _ = ruled_cluster
    set_clock(cluster, 20_000_000)

    async def run():
        rc = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.primaries[1].port)
        try:
            return [await rc.execute_command("CL.CHECK", k, 5, 2) for k in KEYS[:300]]
        finally:
            await rc.aclose()

    assert all(reply[:3] == [1, 5, 4] for reply in asyncio.run(run()))


def test_redis_cli_c_follows_moved(fl_cluster):
    node = elsewhere(fl_cluster, b"foo")
    out = subprocess.run(["redis-cli", "-c", "-p", str(node.port), "CL.CHECK", "foo",
                          "10", "1", "COST", "0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.split()[:2] == ["1", "10"]
    assert "MOVED" not in out.stdout


@pytest.mark.untraced
def test_redis_benchmark_cluster_finishes_with_no_error_reply(fl_cluster):
    out = subprocess.run(
        ["redis-benchmark", "--cluster", "-p", str(fl_cluster.primaries[0].port), "-n", "6000",
         "-r", "1000", "-c", "6", "-q", "CL.CHECK", "rl:{tag}:__rand_int__", "100", "10"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Error" not in out.stdout + out.stderr
    assert "requests per second" in out.stdout
    assert out.stdout.count("Master ") == 3


# ---- standalone, and maps a node cannot use ------------------------------------------

@pytest.mark.parametrize("args", [["CLUSTER", "SLOTS"], ["CLUSTER", "INFO"], ["READONLY"],
                                  ["ASKING"], ["CLUSTER", "KEYSLOT", "x"]])
def test_standalone_answers_cluster_commands_as_redis_does(server, redis_server, args):
    with Wire.to(server.port) as ours, Wire.to(redis_server.port) as theirs:
        assert ours.call(*args) == theirs.call(*args)


def test_standalone_routes_nothing(r):
    assert r.execute_command("CL.CHECK", "foo", 10, 1)[0] == 1
    assert r.info("cluster") == {"cluster_enabled": 0}


def start_failing(*args: str) -> str:
    with pytest.raises(RuntimeError) as e:
        ServerProcess(*args).start()
    return str(e.value)


@pytest.mark.parametrize("text,reason", [
    ("version = 1\n[[shard]]\nname = 'a'\nslots = ['0-100']\nprimary = '127.0.0.1:1'\n",
     "not covered by any shard (16283 slots): 101-16383"),
    ("version = 1\n[[shard]]\nname = 'a'\nslots = ['0-16383']\nprimary = '127.0.0.1:1'\n"
     "[[shard]]\nname = 'b'\nslots = ['5']\nprimary = '127.0.0.1:2'\n", "overlap"),
    ("version = [", "TOML"),
])
def test_a_map_that_cannot_be_used_stops_the_start_naming_the_problem(tmp_path, text, reason):
    path = tmp_path / "map.toml"
    path.write_text(text)
    log = start_failing("--cluster-enabled", "yes", "--cluster-config-file", str(path))
    assert "cannot start" in log and reason.lower() in log.lower()
    assert "Traceback" not in log


def test_cluster_mode_needs_a_map(tmp_path):
    log = start_failing("--cluster-enabled", "yes")
    assert "cluster-enabled needs cluster-config-file" in log
    log = start_failing("--cluster-enabled", "yes", "--cluster-config-file",
                        str(tmp_path / "missing.toml"))
    assert "cannot start" in log and "missing.toml" in log


def test_a_node_the_map_does_not_name_serves_nothing_and_redirects_everything(
        fl_cluster, tmp_path):
    node = ServerProcess("--port", str(free_port()), "--cluster-enabled", "yes",
                         "--cluster-config-file", fl_cluster.map_path, *fl_cluster.auth).start()
    try:
        with Wire.to(node.port) as w:
            assert w.call("CL.CHECK", "foo", "10", "1").startswith(b"-MOVED 12182 ")
        lines = raw(node, "CLUSTER", "NODES").decode().splitlines()
        assert len(lines) == 7 and lines[-1].split()[2] == "myself,master"
        assert info(node, "cluster")["cluster_shard"] == ""
    finally:
        node.stop()
