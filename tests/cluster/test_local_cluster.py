"""scripts/cluster.py: the local cluster rig (N shards of a fastlimit
primary and standby in cluster mode, three redis-sentinels watching
every shard), from Python and from its start/stop commands.  Real
processes; every wait bounded."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from servers import PYTHON
from wire import wait_until

from fastlimit._cluster import SLOTS
from fastlimit.cluster import slot_map as clustermap
from fastlimit.cluster.slot_map import Address

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster.py"
_spec = importlib.util.spec_from_file_location("local_cluster", SCRIPT)
local_cluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local_cluster)
LocalCluster = local_cluster.LocalCluster


def info(port: int, section: str) -> dict:
    with redis.Redis(port=port, socket_timeout=5) as c:
        return c.info(section)


def test_the_rig_writes_an_even_sentinel_map_and_starts_every_shard():
    with LocalCluster(shards=3, python=PYTHON) as c:
        loaded = clustermap.load(str(c.map_path))
        assert loaded == c.slot_map
        assert [s.name for s in loaded.shards] == [s.sentinel for s in loaded.shards] == \
            ["fl-0", "fl-1", "fl-2"]
        sizes = [sum(r.end - r.start + 1 for r in s.slots) for s in loaded.shards]
        assert sum(sizes) == SLOTS and max(sizes) - min(sizes) <= 1
        assert loaded.sentinels == tuple(Address("127.0.0.1", s.port) for s in c.ha.sentinels)
        assert c.primaries() == {name: nodes[0].port for name, nodes in c.shards.items()}
        for primary, standby in c.shards.values():
            assert info(primary.port, "cluster")["cluster_enabled"] == 1
            repl = info(standby.port, "replication")
            assert (repl["master_port"], repl["master_link_status"]) == (primary.port, "up")


def test_without_cluster_flags_the_same_rig_runs_standalone():
    with LocalCluster(shards=2, python=PYTHON, cluster_flags=False) as c:
        assert all(info(n.port, "cluster")["cluster_enabled"] == 0 for n in c.ha.nodes)
        assert c.primaries() == {name: nodes[0].port for name, nodes in c.shards.items()}


@pytest.mark.release_only
def test_sentinel_fails_over_one_shard_of_the_rig_and_leaves_the_others():
    with LocalCluster(shards=2, python=PYTHON) as c:
        before = c.primaries()
        old, standby = c.shards["fl-0"]
        old.signal(signal.SIGKILL)
        wait_until(lambda: c.primaries()["fl-0"] == standby.port, 30,
                   "the sentinels to promote fl-0's standby", interval=0.1)
        assert c.primaries()["fl-1"] == before["fl-1"]
        assert info(standby.port, "replication")["role"] == "master"


def free_port_run(count: int) -> int:
    """A base port with count free loopback ports from it on."""
    for _ in range(100):
        base = random.randrange(20_000, 40_000)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no run of {count} free ports found")


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120)


def alive(pid: int) -> bool:
    try:
        os.readlink(f"/proc/{pid}/cwd")       # fails for a zombie too
        return True
    except OSError:
        return False


def test_start_leaves_the_cluster_running_and_stop_ends_every_process(tmp_path):
    shards = 2
    base = free_port_run(2 * shards + 3)
    folder = tmp_path / "rig"
    started = run_script("start", "--dir", str(folder), "--shards", str(shards),
                         "--base-port", str(base))
    try:
        assert started.returncode == 0, started.stderr
        for port in range(base, base + 2 * shards + 3):
            assert f"127.0.0.1:{port}" in started.stdout
        pids = [int(p.read_text()) for p in sorted(folder.glob("*/pid"))]
        assert len(pids) == 2 * shards + 3 and all(alive(p) for p in pids)
        assert info(base, "cluster")["cluster_enabled"] == 1

        again = run_script("start", "--dir", str(folder))
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = run_script("stop", "--dir", str(folder))
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped {2 * shards + 3} process" in stopped.stdout
    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)
    assert list(folder.glob("*/pid")) == []
    assert run_script("stop", "--dir", str(folder)).stdout.startswith("stopped 0 ")


def test_stop_leaves_a_process_that_reused_a_pid_alone(tmp_path):
    """A pidfile naming a live process that is not the rig's (another
    folder): stop does not signal it."""
    (tmp_path / "node-1").mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             cwd=tmp_path)
    try:
        (tmp_path / "node-1" / "pid").write_text(f"{other.pid}\n")
        assert local_cluster.stop_dir(tmp_path) == 0
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
