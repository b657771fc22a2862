"""Automatic failover by real redis-sentinel processes: three sentinels, a
fastlimit primary and two standbys on 127.0.0.1 (scripts/ha.py), with
down-after-milliseconds 1000.  Real time is the point here, so these
tests wait on real events, each bounded.  Release build only: they time
failovers (and the debug pass traces every line of the servers); the
commands they exercise run on the debug build in test_pubsub.py,
test_repoint.py and test_config_rewrite.py.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel
from servers import PYTHON, failed
from wire import wait_until

import fastlimit

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from ha import SERVICE, HASet  # noqa: E402

pytestmark = pytest.mark.release_only

FAILOVER_TIMEOUT_S = 30.0
# A sentinel demotes a primary that comes back on an INFO refresh (every
# 10 s for a replica it knows) once it has said "master" for 8 s: one
# refusal, a lost reply or a slow sync costs a whole period, so this bound
# is several of them (a normal run takes about 10.5 s).
DEMOTE_TIMEOUT_S = 60.0
CAP = 5
FOREVER_MS = 3_600_000       # a refill too slow to matter within a test


def check(client: redis.Redis, key: str, capacity: int = CAP) -> int:
    """CL.CHECK with one token per hour: 1 allowed, 0 denied."""
    return client.execute_command("CL.CHECK", key, capacity, 1, "PERIOD", FOREVER_MS)[0]


def _started(s: HASet):
    try:
        s.start()
    except BaseException:
        print(s.logs())
        s.stop()
        raise
    return s


def _serving(request, s: HASet):
    _started(s)
    yield s
    if failed(request):
        print(s.logs())
    s.stop()


@pytest.fixture
def ha(request):
    yield from _serving(request, HASet("fastlimit", python=PYTHON))


@pytest.fixture
def ha_with_snapshots(request):
    # relative to each node's own directory, its working directory
    yield from _serving(request, HASet("fastlimit", python=PYTHON,
                                       extra=["--snapshot-file", "snap.fls"]))


def wait_caught_up(ha: HASet, primary) -> None:
    """Every replica has acknowledged everything the primary wrote."""
    def caught_up() -> bool:
        info = primary.client().info("replication")
        offsets = [v["offset"] for k, v in info.items()
                   if k.startswith("slave") and isinstance(v, dict)]
        return len(offsets) == len(ha.nodes) - 1 and min(offsets) >= info["master_repl_offset"]
    wait_until(caught_up, 10, "the replicas to catch up")


def wait_new_primary(ha: HASet, old_port: int) -> int:
    return wait_until(lambda: (p := ha.primary_port()) not in (None, old_port) and p,
                      FAILOVER_TIMEOUT_S, "the sentinels to promote a standby", interval=0.05)


def role(node) -> dict:
    return node.client(socket_timeout=2).info("replication")


def test_kill_primary_promotes_a_standby_and_limits_hold(ha):
    old = ha.nodes[0]
    c = old.client()
    for _ in range(CAP):
        assert check(c, "spent") == 1
    assert check(c, "spent") == 0
    wait_caught_up(ha, old)

    old.signal(signal.SIGKILL)
    new_port = wait_new_primary(ha, old.port)
    new = ha.node(new_port)
    wait_until(lambda: role(new)["role"] == "master", 10, "the new primary to say master")
    assert check(new.client(), "spent") == 0, "a key spent before the kill is limited after"

    other = next(n for n in ha.nodes if n.port not in (old.port, new_port))
    wait_until(lambda: (i := role(other)).get("master_port") == new_port
               and i.get("master_link_status") == "up", FAILOVER_TIMEOUT_S,
               "the other standby to follow the new primary", interval=0.1)
    assert check(new.client(), "after") == 1
    wait_until(lambda: other.client().execute_command(
        "CL.CHECK", "after", CAP, 1, "PERIOD", FOREVER_MS, "COST", 0)[2] == CAP - 1, 10,
        "the other standby to see the new primary's writes")

    # The old primary comes back on its own config file, as a primary; the
    # sentinels demote it and it converges to the primary's state.  Which
    # primary: the one the sentinels agree on then (with a 1 s down-after,
    # they may have failed over once more meanwhile; the state is the same).
    old.start()
    wait_until(lambda: (i := role(old)).get("role") == "slave"
               and i.get("master_port") == ha.primary_port() != old.port
               and i.get("master_link_status") == "up",
               DEMOTE_TIMEOUT_S, "the old primary to follow the new one", interval=0.2)
    peek = old.client().execute_command("CL.CHECK", "after", CAP, 1, "PERIOD", FOREVER_MS,
                                        "COST", 0)
    assert peek[2] == CAP - 1


def test_overshoot_across_a_failover_is_within_one_unsent_batch(ha):
    """A client spends one key as fast as it can while the primary is
    killed: what the new primary allows on top of the capacity is what
    the old one allowed but had not yet sent to its standbys."""
    capacity = 100_000
    old = ha.nodes[0]
    allowed_at: list[float] = []     # when each allowed reply from the old primary arrived
    c = old.client(socket_timeout=1)
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            try:
                if check(c, "hot", capacity):
                    allowed_at.append(time.monotonic())
            except (redis.ConnectionError, redis.TimeoutError):
                return

    driver = threading.Thread(target=drive)
    driver.start()
    # long enough that the bound below (what the last 100 ms allowed) is a
    # small part of what was spent, and a second of steady flow whatever the
    # machine's load (a slow start would put half the run in its last 100 ms)
    wait_until(lambda: len(allowed_at) > 3000 and time.monotonic() - allowed_at[0] > 1.0, 20,
               "checks to flow")
    killed_at = time.monotonic()
    old.signal(signal.SIGKILL)
    driver.join(10)
    stop.set()
    new = ha.node(wait_new_primary(ha, old.port))
    remaining = new.client().execute_command("CL.CHECK", "hot", capacity, 1, "PERIOD",
                                             FOREVER_MS, "COST", 0)[2]
    overshoot = len(allowed_at) - (capacity - remaining)
    recent = sum(1 for t in allowed_at if t > killed_at - 0.1)
    print(f"allowed by the old primary {len(allowed_at)}, known to the new one "
          f"{capacity - remaining}: overshoot {overshoot} (allowed in the last 100 ms: {recent})")
    assert 0 <= overshoot <= recent < len(allowed_at) / 2


def test_a_stopped_primary_is_demoted_when_it_resumes(ha):
    """SIGSTOP past down-after, then SIGCONT: the split-brain window is the
    time from SIGCONT until the old primary refuses writes."""
    old = ha.nodes[0]
    old.signal(signal.SIGSTOP)
    try:
        new_port = wait_new_primary(ha, old.port)
    finally:
        old.signal(signal.SIGCONT)
    resumed = time.monotonic()
    c = old.client(socket_timeout=2)

    def refuses() -> bool:
        try:
            check(c, "split")
        except redis.ReadOnlyError:
            return True
        except redis.ResponseError as e:
            return "READONLY" in str(e)
        return False
    wait_until(refuses, DEMOTE_TIMEOUT_S, "the resumed primary to refuse writes",
               interval=0.05)
    window = time.monotonic() - resumed
    print(f"split-brain window after SIGCONT: {window:.2f} s")
    wait_until(lambda: role(old).get("master_port") == new_port, 10, "it to follow")


def _first_answer_after(kill, call) -> float:
    """Seconds from kill() to the first call() that answers."""
    kill()
    killed = time.monotonic()
    deadline = killed + FAILOVER_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if call():
                return time.monotonic() - killed
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            pass
        time.sleep(0.01)
    raise AssertionError("no answer from a new primary")


def test_redis_py_sentinel_client_follows_the_failover(ha):
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", s.port) for s in ha.sentinels],
                                       socket_timeout=0.5)
    primary = sentinel.master_for(SERVICE, socket_timeout=0.5)
    try:
        assert check(primary, "py") == 1
        took = _first_answer_after(lambda: ha.nodes[0].signal(signal.SIGKILL),
                                   lambda: check(primary, "py2") == 1)
        print(f"redis-py Sentinel client: kill to first answer {took:.2f} s")
        assert primary.connection_pool.get_master_address()[1] != ha.nodes[0].port
    finally:
        primary.close()
        sentinel.close()


def test_fastlimit_client_with_sentinels_follows_the_failover(ha):
    client = fastlimit.Client(sentinels=[f"127.0.0.1:{s.port}" for s in ha.sentinels],
                              service=SERVICE, timeout_ms=200)
    try:
        assert client.check("fl", CAP, 1).source == "server"
        took = _first_answer_after(lambda: ha.nodes[0].signal(signal.SIGKILL),
                                   lambda: client.check("fl2", CAP, 1).source == "server")
        print(f"fastlimit.Client: kill to first answer {took:.2f} s; stats {client.stats}")
        wait_until(lambda: client.stats.master_switches >= 1, 10,
                   "the client to hear +switch-master")
        assert client.check("fl", CAP, 1, on_failure="closed").source == "server"
    finally:
        client.close()


def test_async_fastlimit_client_with_sentinels_follows_the_failover(ha):
    async def run() -> float:
        client = fastlimit.AsyncClient(
            sentinels=[("127.0.0.1", s.port) for s in ha.sentinels], service=SERVICE,
            timeout_ms=200)
        try:
            assert (await client.check("afl", CAP, 1)).source == "server"
            ha.nodes[0].signal(signal.SIGKILL)
            killed = time.monotonic()
            while time.monotonic() - killed < FAILOVER_TIMEOUT_S:
                if (await client.check("afl2", CAP, 1)).source == "server":
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("no answer from a new primary")
            took = time.monotonic() - killed
            while client.stats.master_switches < 1:
                assert time.monotonic() - killed < FAILOVER_TIMEOUT_S, "no +switch-master"
                await asyncio.sleep(0.05)
            return took
        finally:
            await client.aclose()
    took = asyncio.run(run())
    print(f"fastlimit.AsyncClient: kill to first answer {took:.2f} s")


def test_decisions_follow_on_failure_while_there_is_no_primary(ha):
    """Between the kill and the promotion the client answers by policy,
    at once, rather than raising or hanging."""
    client = fastlimit.Client(sentinels=[f"127.0.0.1:{s.port}" for s in ha.sentinels],
                              service=SERVICE, timeout_ms=50)
    try:
        assert client.check("p", CAP, 1).source == "server"
        ha.nodes[0].signal(signal.SIGKILL)
        opened = client.check("p", CAP, 1, on_failure="open")
        closed = client.check("p", CAP, 1, on_failure="closed")
        assert (opened.source, opened.allowed) == ("failed_open", True)
        assert (closed.source, closed.allowed) == ("failed_closed", False)
    finally:
        client.close()


def test_the_ha_script_writes_configs_sentinel_can_rewrite(ha):
    """Sentinel's CONFIG REWRITE lands in the standby's TOML file: after a
    failover the promoted standby's file no longer names a primary."""
    old = ha.nodes[0]
    old.signal(signal.SIGKILL)
    new = ha.node(wait_new_primary(ha, old.port))
    wait_until(lambda: "replicaof" not in new.config.read_text()
               or 'replicaof = ""' in new.config.read_text(), 10,
               "CONFIG REWRITE to clear replicaof in the promoted standby's file")


def test_a_failover_while_the_standbys_run_bgsave(ha_with_snapshots):
    """The standbys write snapshots from forked children while the primary
    dies and one of them is promoted: the failover completes, the saves
    succeed, and the promoted standby keeps every limit."""
    ha = ha_with_snapshots
    old = ha.nodes[0]
    pipe = old.client().pipeline(transaction=False)
    for i in range(100_000):
        pipe.execute_command("CL.CHECK", f"bulk:{i}", CAP, 1, "PERIOD", FOREVER_MS)
    pipe.execute()
    for _ in range(CAP):
        check(old.client(), "spent")
    wait_caught_up(ha, old)
    standbys = ha.nodes[1:]
    started = {n.port: 0 for n in standbys}
    stop = threading.Event()

    def keep_saving() -> None:
        while not stop.is_set():
            for n in standbys:
                try:
                    n.client(socket_timeout=2).bgsave()
                    started[n.port] += 1
                except redis.ResponseError:
                    pass       # one already running
                except (redis.ConnectionError, redis.TimeoutError):
                    return
            time.sleep(0.02)

    saver = threading.Thread(target=keep_saving)
    saver.start()
    try:
        old.signal(signal.SIGKILL)
        new = ha.node(wait_new_primary(ha, old.port))
        wait_until(lambda: role(new)["role"] == "master", 10, "the new primary to say master")
    finally:
        stop.set()
        saver.join(10)
    assert min(started.values()) > 0, started
    assert check(new.client(), "spent") == 0
    wait_until(lambda: new.client().info("persistence")["rdb_bgsave_in_progress"] == 0, 30,
               "the last save to finish")
    assert new.client().info("persistence")["rdb_last_bgsave_status"] == "ok"
    assert new.client().dbsize() >= 100_001


def test_a_password_protected_set_fails_over_with_auth_pass():
    """requirepass on the servers, masterauth on the standbys, Sentinel's
    auth-pass: nothing runs before AUTH, and the failover still works."""
    ha = _started(HASet("fastlimit", python=PYTHON, password="s3cret"))
    try:
        old = ha.nodes[0]
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=old.port, socket_timeout=2).execute_command(
                "CL.CHECK", "k", CAP, 1)
        old.signal(signal.SIGKILL)
        new = ha.node(wait_new_primary(ha, old.port))
        wait_until(lambda: role(new)["role"] == "master", 10, "the new primary to say master")
        other = next(n for n in ha.nodes if n.port not in (old.port, new.port))
        wait_until(lambda: (i := role(other)).get("master_port") == new.port
                   and i.get("master_link_status") == "up", FAILOVER_TIMEOUT_S,
                   "the other standby to follow with masterauth", interval=0.1)
    finally:
        ha.stop()


def test_redis_py_asyncio_sentinel_client_follows_the_failover(ha):
    async def run() -> float:
        sentinel = redis.asyncio.sentinel.Sentinel(
            [("127.0.0.1", s.port) for s in ha.sentinels], socket_timeout=0.5)
        primary = sentinel.master_for(SERVICE, socket_timeout=0.5)
        try:
            assert (await primary.execute_command("CL.CHECK", "apy", CAP, 1))[0] == 1
            ha.nodes[0].signal(signal.SIGKILL)
            killed = time.monotonic()
            while time.monotonic() - killed < FAILOVER_TIMEOUT_S:
                try:
                    if (await primary.execute_command("CL.CHECK", "apy2", CAP, 1))[0] == 1:
                        return time.monotonic() - killed
                except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
                    pass
                await asyncio.sleep(0.01)
            raise AssertionError("no answer from a new primary")
        finally:
            await primary.aclose()
            await sentinel.aclose()
    took = asyncio.run(run())
    print(f"redis-py asyncio Sentinel client: kill to first answer {took:.2f} s")
