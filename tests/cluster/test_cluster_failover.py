"""One shard's primary killed under load in a Sentinel-watched cluster
(scripts/cluster.py's rig): Sentinel promotes its standby, every node
names the new primary soon after the sentinels announce it, clients
recover, an exhausted key (and an exhausted split key) stays limited,
the old primary redirects when it returns, and the other shard's answers
never stop.  Real time: release build, run alone."""

from __future__ import annotations

import importlib.util
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from servers import PYTHON, wait_caught_up
from wire import Wire, wait_until

from fastlimit._cluster import keyslot

pytestmark = pytest.mark.release_only

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster.py"
_spec = importlib.util.spec_from_file_location("local_cluster", SCRIPT)
local_cluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local_cluster)

# One token an hour: spent, a key stays exhausted for the whole test.
HOURLY = (5, 1, "PERIOD", 3_600_000)


def key_in(shards: int, shard: int, prefix: str) -> str:
    """A key whose slot the given shard of an even split owns."""
    for i in range(100_000):
        key = f"{prefix}:{i}"
        if keyslot(key.encode()) * shards // 16384 == shard:
            return key
    raise AssertionError("no key found")


def split_key_in(shards: int, shard: int, prefix: str) -> str:
    """A key split 2 ways whose both sub-keys the given shard owns."""
    for i in range(100_000):
        key = f"{prefix}:{i}"
        if all(keyslot(f"{key}#{j}".encode()) * shards // 16384 == shard for j in range(2)):
            return key
    raise AssertionError("no key found")


def primary_named_by(port: int, slot: int) -> int | None:
    try:
        with redis.Redis(port=port, socket_timeout=1) as c:
            for entry in c.execute_command("CLUSTER", "SLOTS"):
                if entry[0] <= slot <= entry[1]:
                    return int(entry[2][1])
    except redis.RedisError:
        return None
    return None


class Load(threading.Thread):
    """Spends tokens on one key through RedisCluster as fast as it can,
    noting the time of every answer and every error."""

    def __init__(self, port: int, key: str):
        super().__init__(daemon=True)
        self.client = redis.RedisCluster(host="127.0.0.1", port=port, socket_timeout=2)
        self.key = key
        self.answers: list[float] = []
        self.errors: list[str] = []
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                self.client.execute_command("CL.CHECK", self.key, 1_000_000_000, 1_000_000)
                self.answers.append(time.monotonic())
            except redis.RedisError as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.01)
        self.client.close()


def test_a_killed_shard_primary_is_replaced_everywhere_and_the_other_shard_never_stops():
    with local_cluster.LocalCluster(shards=2, python=PYTHON) as c:
        c.wait_state_ok()
        old, standby = c.shards["fl-0"]
        other = c.shards["fl-1"][0]
        exhausted = key_in(2, 0, "spent")
        rc = redis.RedisCluster(host="127.0.0.1", port=other.port, socket_timeout=2)
        for _ in range(5):
            assert rc.execute_command("CL.CHECK", exhausted, *HOURLY)[0] == 1
        assert rc.execute_command("CL.CHECK", exhausted, *HOURLY)[0] == 0
        # a split key: both sub-buckets spent through one sub-key (two choices)
        split = f"{split_key_in(2, 0, 'split')}#0"
        split_check = (split, 10, 1, "PERIOD", 3_600_000, "SPLIT", 2)
        assert all(rc.execute_command("CL.CHECK", *split_check)[0] for _ in range(10))
        assert rc.execute_command("CL.CHECK", *split_check)[0] == 0
        # the standby has both spent keys before its primary is killed
        with redis.Redis(port=old.port) as p, redis.Redis(port=standby.port) as r:
            wait_caught_up(p, r)
        load = Load(other.port, key_in(2, 1, "steady"))
        load.start()
        switches: list[float] = []
        sentinel = redis.Redis(port=c.sentinel_addresses()[0].port, socket_timeout=1)
        pubsub = sentinel.pubsub()
        pubsub.subscribe("+switch-master")
        try:
            wait_until(lambda: len(load.answers) > 100, 10, "the load to run")
            killed = time.monotonic()
            old.signal(signal.SIGKILL)
            slot = keyslot(exhausted.encode())
            deadline = time.monotonic() + 30
            while not switches and time.monotonic() < deadline:
                m = pubsub.get_message(timeout=0.1)
                if m and m["type"] == "message" and m["data"].startswith(b"fl-0 "):
                    switches.append(time.monotonic())
            assert switches, "no +switch-master for fl-0 within 30 s"
            live = [n.port for n in c.ha.nodes if n is not old]
            wait_until(lambda: all(primary_named_by(p, slot) == standby.port for p in live),
                       5, "every node to name the promoted standby", interval=0.02)
            everywhere = time.monotonic()
            print(f"\nkill -> +switch-master {switches[0] - killed:.2f} s, "
                  f"-> every node's CLUSTER SLOTS {everywhere - switches[0]:.3f} s later")
            assert everywhere - switches[0] < 1.0
            # Clients recover on the new primary, and the spent key stays spent.
            wait_until(lambda: _answers(rc, exhausted), 10, "the client to reach fl-0 again",
                       interval=0.05)
            assert rc.execute_command("CL.CHECK", exhausted, *HOURLY)[0] == 0
            assert rc.execute_command("CL.CHECK", *split_check)[0] == 0
            # The old primary comes back believing it is one: it redirects to
            # the primary Sentinel names instead of taking the shard's writes.
            old.start()
            with Wire.to(old.port) as w:
                assert w.call("CL.CHECK", exhausted, "5", "1") == \
                    f"-MOVED {slot} 127.0.0.1:{standby.port}\r\n".encode()
        finally:
            load.done.set()
            load.join(10)
            pubsub.close()
            sentinel.close()
            rc.close()
        assert load.errors == []
        gaps = [b - a for a, b in zip(load.answers, load.answers[1:], strict=False)]
        assert max(gaps) < 0.5, f"the other shard stopped answering for {max(gaps):.2f} s"


def _answers(rc: redis.RedisCluster, key: str) -> bool:
    try:
        rc.execute_command("CL.CHECK", key, *HOURLY[:2], "COST", 0, *HOURLY[2:])
        return True
    except redis.RedisError:
        return False
