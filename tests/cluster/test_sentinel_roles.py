"""ShardRoles (cluster/sentinel_roles.py): who is primary of each shard, from
real redis-sentinel processes (scripts/ha.py) watching two shards, each a
primary and a standby.  Real time is the point here (Sentinel's
failovers, timeouts against silent sockets), so the waits are real and
each one bounded.  The failover timing runs on the release build only;
the rest, and the parsers, run on both.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import redis.asyncio
import uvloop
from servers import PYTHON

from fastlimit.cluster.sentinel_roles import (
    AnswerError,
    ShardRoles,
    choose,
    event_master,
    roles_from_answer,
)
from fastlimit.cluster.slot_map import Address, Roles

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from ha import HASet, Node, answers, free_port, terminate, wait_until  # noqa: E402

MASTERS = {"shard-a": "fl-0", "shard-b": "fl-1"}
WAIT_S = 30.0


def at(port: int) -> Address:
    return Address("127.0.0.1", port)


# -- the parsers, on Sentinel's formats (cluster.md §3.4) ---------------------

def test_events_name_their_master_in_every_payload_format():
    names = {"fl-0", "fl-1"}
    assert event_master(b"+switch-master", b"fl-0 127.0.0.1 7000 127.0.0.1 7001", names) == "fl-0"
    assert event_master("+sdown", "master fl-1 127.0.0.1 7002", names) == "fl-1"
    assert event_master(b"+odown", b"master fl-1 127.0.0.1 7002 #quorum 2/2", names) == "fl-1"
    assert event_master(b"+sdown", b"slave 127.0.0.1:7001 127.0.0.1 7001 @ fl-0 127.0.0.1 7000",
                        names) == "fl-0"
    assert event_master(b"-sdown", b"sentinel 0f3a 127.0.0.1 26380 @ fl-1 127.0.0.1 7002",
                        names) == "fl-1"
    assert event_master(b"+failover-end", b"master fl-0 127.0.0.1 7000", names) == "fl-0"


def test_events_about_other_masters_or_malformed_are_ignored():
    names = {"fl-0"}
    for channel, data in [(b"+switch-master", b"other 1.1.1.1 1 2.2.2.2 2"),
                          (b"+switch-master", b"fl-0 127.0.0.1 7000 127.0.0.1"),
                          (b"+sdown", b"master other 127.0.0.1 7000"),
                          (b"+sdown", b"slave x 127.0.0.1 7001 @ other 127.0.0.1 7000"),
                          (b"+sdown", b"slave x 127.0.0.1 7001 @"),
                          (b"+slave", b""), (b"+sdown", b"\xff\xfe @ \xff")]:
        assert event_master(channel, data, names) is None, (channel, data)


def _flat(**fields: str) -> list[bytes]:
    return [x.encode() for k, v in fields.items() for x in (k.replace("_", "-"), v)]


def test_an_answer_keeps_only_available_replicas():
    master = _flat(name="fl-0", ip="127.0.0.1", port="7000", flags="master", config_epoch="3")
    replicas = [
        _flat(ip="127.0.0.1", port="7003", flags="slave", master_link_status="ok"),
        _flat(ip="127.0.0.1", port="7001", flags="slave", master_link_status="ok"),
        _flat(ip="127.0.0.1", port="7002", flags="s_down,slave", master_link_status="ok"),
        _flat(ip="127.0.0.1", port="7004", flags="slave,disconnected", master_link_status="ok"),
        _flat(ip="127.0.0.1", port="7005", flags="slave,o_down", master_link_status="ok"),
        _flat(ip="127.0.0.1", port="7006", flags="slave", master_link_status="err"),
        _flat(ip="some-host", port="7007", flags="slave", master_link_status="ok"),
        _flat(ip="127.0.0.1", port="7000", flags="slave", master_link_status="ok"),
        b"not an entry", [b"ip"],
    ]
    assert roles_from_answer(master, replicas) == Roles(at(7000), (at(7001), at(7003)), 3)


@pytest.mark.parametrize("fields", [
    {"ip": "127.0.0.1", "port": "7000", "config_epoch": "x"},
    {"ip": "127.0.0.1", "port": "7000", "config_epoch": "-1"},
    {"ip": "127.0.0.1", "port": "7000"},
    {"ip": "127.0.0.1", "port": "99999", "config_epoch": "1"},
    {"ip": "a-hostname", "port": "7000", "config_epoch": "1"},
    {"port": "7000", "config_epoch": "1"},
])
def test_an_answer_without_a_usable_primary_is_an_answer_error(fields):
    with pytest.raises(AnswerError):
        roles_from_answer(_flat(**fields), [])
    with pytest.raises(AnswerError):
        roles_from_answer(b"not an array", [])


def test_the_highest_epoch_wins_and_a_tie_keeps_the_current_primary():
    old = Roles(at(7000), (at(7001),), 1)
    promoted = Roles(at(7001), (), 2)
    assert choose(None, []) is None
    assert choose(old, []) == old
    assert choose(old, [old, promoted, old]) == promoted
    assert choose(promoted, [old]) == promoted, "a stale sentinel is ignored"
    rival = Roles(at(7002), (at(7001),), 1)
    assert choose(old, [rival, rival, old]) == old, "equal epoch: the current primary stays"
    assert choose(None, [rival, old, old]).primary == at(7000), "else the majority"
    assert choose(None, [rival, old]).primary == at(7002), "else the first sentinel's"


def test_standbys_are_those_most_agreeing_sentinels_list():
    both = Roles(at(7000), (at(7001), at(7002)), 4)
    one = Roles(at(7000), (at(7002),), 4)
    other = Roles(at(7009), (at(7001),), 4)
    assert choose(None, [both, one, both]) == both, "one sentinel's doubt is outvoted"
    assert choose(None, [both, one]) == one, "of two, both must list it"
    assert choose(None, [both, one, other]) == one, "only answers naming the primary count"
    assert choose(None, [both]) == both


# -- against real sentinels ---------------------------------------------------

def _started(ha: HASet) -> HASet:
    try:
        ha.start()
    except BaseException:
        print(ha.logs())
        ha.stop()
        raise
    return ha


@pytest.fixture
def shards():
    """Two shards of redis-servers, fl-0 and fl-1, under three sentinels."""
    ha = _started(HASet("redis", services=list(MASTERS.values()), replicas=1))
    yield ha
    ha.stop()


def expected_roles(ha: HASet, epoch: int = 0) -> dict[str, Roles]:
    return {shard: Roles(at(ha.services[m][0].port), (at(ha.services[m][1].port),), epoch)
            for shard, m in MASTERS.items()}


def run(coro):
    """A scenario, bounded: a hang fails the test instead of stalling the run."""
    async def bounded():
        async with asyncio.timeout(3 * WAIT_S):     # in this task: no task of its own
            return await coro
    return uvloop.run(bounded())


class Recorder:
    """on_change's calls, with when they came."""

    def __init__(self):
        self.calls: list[tuple[float, dict[str, Roles]]] = []
        self.changed = asyncio.Event()

    def __call__(self, view: dict[str, Roles]) -> None:
        self.calls.append((time.monotonic(), view))
        self.changed.set()

    async def until(self, predicate, what: str, timeout_s: float = WAIT_S):
        try:
            async with asyncio.timeout(timeout_s):
                while not (self.calls and predicate(self.calls[-1][1])):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"no {what} within {timeout_s} s: {self.calls}") from None
        return self.calls[-1]


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


def quiet_logger() -> tuple[logging.Logger, Lines]:
    lines = Lines()
    log = logging.getLogger(f"test.shard_roles.{id(lines)}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(lines)
    return log, lines


def sentinel_addrs(ha: HASet) -> list[Address]:
    return [at(s.port) for s in ha.sentinels]


def test_the_view_after_start_is_what_the_sentinels_say(shards):
    async def scenario():
        rec = Recorder()
        roles = ShardRoles(sentinel_addrs(shards), MASTERS, rec)
        await roles.start()
        try:
            assert roles.roles() == expected_roles(shards)
            assert [view for _, view in rec.calls] == [expected_roles(shards)]
            info = roles.info_fields()
            assert info["cluster_sentinels"] == info["cluster_sentinels_reachable"] == 3
            assert info["cluster_shards_known"] == 2
            assert info["cluster_role_updates"] == 1
            assert info["cluster_sentinel_last_error"] == ""
            await asyncio.sleep(0.5)        # polls and subscriptions: nothing changed
            assert len(rec.calls) == 1
        finally:
            await roles.stop()
    run(scenario())


def test_a_shard_no_sentinel_knows_stays_unknown_and_says_why(shards):
    async def scenario():
        roles = ShardRoles(sentinel_addrs(shards), {**MASTERS, "shard-x": "nobody"},
                           lambda view: None)
        await roles.start()
        try:
            assert roles.roles() == expected_roles(shards)
            info = roles.info_fields()
            assert "nobody" in info["cluster_sentinel_last_error"]
            assert info["cluster_sentinels_reachable"] == 3
        finally:
            await roles.stop()
    run(scenario())


async def _switch_seen(ha: HASet, master: str, seen: dict[str, float]) -> None:
    """Records when any sentinel first publishes +switch-master for master."""
    async def follow(port: int) -> None:
        client = redis.asyncio.Redis(port=port, protocol=2)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe("+switch-master")
            while master not in seen:
                message = await pubsub.get_message(timeout=0.1)
                if message and message["data"].split()[0] == master.encode():
                    seen.setdefault(master, time.monotonic())
        finally:
            await pubsub.aclose()
            await client.aclose()
    await asyncio.gather(*(follow(s.port) for s in ha.sentinels))


@pytest.mark.release_only
def test_a_killed_primary_is_replaced_in_the_view_within_a_second_of_switch_master():
    """SIGKILL of fl-0's primary (fastlimit nodes): on_change names the
    promoted standby soon after the first +switch-master, from the events
    alone (the poll is set far beyond the wait), and fl-1 never changes."""
    ha = _started(HASet("fastlimit", python=PYTHON, services=list(MASTERS.values()),
                        replicas=1))
    try:
        async def scenario():
            rec = Recorder()
            roles = ShardRoles(sentinel_addrs(ha), MASTERS, rec, poll_s=3600)
            await roles.start()
            seen: dict[str, float] = {}
            watch = asyncio.create_task(_switch_seen(ha, "fl-0", seen))
            try:
                assert roles.roles() == expected_roles(ha)
                await asyncio.sleep(0.3)     # the watcher is subscribed
                old, standby = ha.services["fl-0"]
                old.signal(signal.SIGKILL)
                killed = time.monotonic()
                changed_at, view = await rec.until(
                    lambda v: v["shard-a"].primary == at(standby.port), "the promotion")
                async with asyncio.timeout(5):
                    await watch
                delay = changed_at - seen["fl-0"]
                print(f"kill -> +switch-master {seen['fl-0'] - killed:.2f} s; "
                      f"+switch-master -> on_change {delay * 1000:.0f} ms")
                assert delay <= 1.0
                assert view["shard-a"].epoch >= 1
                assert view["shard-a"].standbys == (), "the killed primary is not a standby"
                assert {v["shard-b"] for _, v in rec.calls} == {expected_roles(ha)["shard-b"]}
                assert roles.info_fields()["cluster_sentinel_events"] > 0
            finally:
                watch.cancel()
                await asyncio.gather(watch, return_exceptions=True)
                await roles.stop()
        run(scenario())
    except BaseException:
        print(ha.logs())
        raise
    finally:
        ha.stop()


def test_a_sentinel_down_at_start_still_gives_the_view_and_is_logged_once(shards):
    down = shards.sentinels[0]
    down.stop()

    async def scenario():
        log, lines = quiet_logger()
        roles = ShardRoles(sentinel_addrs(shards), MASTERS, lambda view: None, poll_s=0.1,
                           log=log)
        await roles.start()
        try:
            assert roles.roles() == expected_roles(shards)
            assert roles.info_fields()["cluster_sentinels_reachable"] == 2
            assert str(down.port) in roles.info_fields()["cluster_sentinel_last_error"]
            await asyncio.sleep(1.5)       # 15 polls, 3 resubscriptions
            warned = lines.at(logging.WARNING)
            assert len(warned) == 1 and str(down.port) in warned[0], warned
            assert lines.at(logging.INFO) == []
            down.start()
            async with asyncio.timeout(WAIT_S):
                while roles.info_fields()["cluster_sentinels_reachable"] < 3:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            back = lines.at(logging.INFO)
            assert len(back) == 1 and str(down.port) in back[0], back
            assert len(lines.at(logging.WARNING)) == 1
            assert roles.roles() == expected_roles(shards)
        finally:
            await roles.stop()
    run(scenario())


def test_with_every_sentinel_down_start_returns_at_once_and_the_view_fills_later(shards):
    for s in shards.sentinels:
        s.stop()

    async def scenario():
        rec = Recorder()
        log, _ = quiet_logger()
        roles = ShardRoles(sentinel_addrs(shards), MASTERS, rec, log=log)
        began = time.monotonic()
        await roles.start()
        took = time.monotonic() - began
        try:
            assert took < 2.0, took
            assert roles.roles() == {} and rec.calls == []
            assert roles.info_fields()["cluster_sentinels_reachable"] == 0
            for s in shards.sentinels:
                s.start()
            await rec.until(lambda v: v == expected_roles(shards), "the view to fill")
        finally:
            await roles.stop()
    run(scenario())


@pytest.fixture
def password_sentinel(tmp_path):
    """A redis-server primary (fl-0) and one sentinel with requirepass."""
    primary = Node("redis", free_port(), tmp_path, sys.executable, None, None, []).start()
    port = free_port()
    config = tmp_path / "sentinel.conf"
    config.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nrequirepass s3cret\n"
                      f"sentinel monitor fl-0 127.0.0.1 {primary.port} 1\n")
    proc = subprocess.Popen(["redis-sentinel", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: answers(port, "s3cret"), 20, "the sentinel")
        yield at(port), primary
    finally:
        terminate(proc)
        primary.stop()


def test_a_password_protected_sentinel_is_read_with_its_password(password_sentinel):
    sentinel, primary = password_sentinel

    async def scenario(password: bytes) -> tuple[dict, dict]:
        log, _ = quiet_logger()
        roles = ShardRoles([sentinel], {"shard-a": "fl-0"}, lambda view: None,
                           password=password, log=log)
        await roles.start()
        try:
            return roles.roles(), roles.info_fields()
        finally:
            await roles.stop()
    view, _ = run(scenario(b"s3cret"))
    assert view == {"shard-a": Roles(at(primary.port), (), 0)}
    view, info = run(scenario(b"wrong"))
    assert view == {} and info["cluster_sentinels_reachable"] == 0
    assert "invalid" in info["cluster_sentinel_last_error"].lower()


@pytest.fixture
def silent_sentinel():
    """An address that accepts TCP connections (the kernel's backlog) and
    never answers: a sentinel that hangs rather than refuses."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield at(s.getsockname()[1])


def test_a_sentinel_that_never_answers_costs_start_one_timeout(shards, silent_sentinel):
    async def scenario():
        log, lines = quiet_logger()
        roles = ShardRoles([silent_sentinel, *sentinel_addrs(shards)], MASTERS,
                           lambda view: None, timeout_s=0.3, log=log)
        began = time.monotonic()
        await roles.start()
        took = time.monotonic() - began
        try:
            assert 0.25 <= took < 1.5, took
            assert roles.roles() == expected_roles(shards)
            assert roles.info_fields()["cluster_sentinels_reachable"] == 3
            assert len(lines.at(logging.WARNING)) == 1
        finally:
            await roles.stop()

    async def alone():
        roles = ShardRoles([silent_sentinel], MASTERS, lambda view: None, timeout_s=0.3)
        began = time.monotonic()
        await roles.start()
        took = time.monotonic() - began
        await roles.stop()
        assert took < 1.5 and roles.roles() == {}
    run(scenario())
    run(alone())


def test_a_stopped_sentinel_is_noticed_and_costs_each_read_one_timeout(shards):
    """SIGSTOP: the sentinel's sockets stay open but nothing answers, so
    only the timeouts can tell (the subscription's PING, the queries)."""
    frozen = shards.sentinels[0]

    async def scenario():
        log, lines = quiet_logger()
        rec = Recorder()
        roles = ShardRoles(sentinel_addrs(shards), MASTERS, rec, poll_s=0.2, timeout_s=0.3,
                           log=log)
        await roles.start()
        try:
            frozen.proc.send_signal(signal.SIGSTOP)
            async with asyncio.timeout(10):
                while roles.info_fields()["cluster_sentinels_reachable"] > 2:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            assert len(lines.at(logging.WARNING)) == 1
            assert roles.roles() == expected_roles(shards) and len(rec.calls) == 1
            frozen.proc.send_signal(signal.SIGCONT)
            async with asyncio.timeout(10):
                while roles.info_fields()["cluster_sentinels_reachable"] < 3:
                    await asyncio.sleep(0.05)
            # Logged on change only: one line back for each line down.  A
            # sentinel just resumed may miss one more 0.3 s timeout on a
            # loaded machine (a real change, logged as one).
            assert len(lines.at(logging.INFO)) == len(lines.at(logging.WARNING)) >= 1
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
            await roles.stop()
    run(scenario())


@pytest.fixture
def garbage_sentinel():
    """A server that answers anything with bytes that are not RESP."""
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    done = threading.Event()

    def serve():
        conns = []
        while not done.is_set():
            try:
                conn, _ = listener.accept()
                conns.append(conn)
                conn.settimeout(1)
                if conn.recv(4096):
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            except OSError:
                continue
        for c in conns:
            c.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield at(listener.getsockname()[1])
    done.set()
    thread.join(5)
    listener.close()


def test_a_sentinel_answering_garbage_is_unreachable_and_the_others_decide(
        shards, garbage_sentinel):
    async def scenario():
        log, lines = quiet_logger()
        roles = ShardRoles([garbage_sentinel, *sentinel_addrs(shards)], MASTERS,
                           lambda view: None, poll_s=0.1, log=log)
        await roles.start()
        try:
            await asyncio.sleep(1.0)           # polls and resubscriptions keep failing
            assert roles.roles() == expected_roles(shards)
            info = roles.info_fields()
            assert info["cluster_sentinels_reachable"] == 3
            assert str(garbage_sentinel.port) in info["cluster_sentinel_last_error"]
            assert len(lines.at(logging.WARNING)) == 1
            assert lines.at(logging.ERROR) == [], "no traceback for bad input"
            assert all(not t.done() for t in roles._tasks)
        finally:
            await roles.stop()
    run(scenario())


def _sockets_to(ports: set[int]) -> dict[str, int]:
    """The inodes of this process's TCP sockets to one of ports, with the
    port each is connected to."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[9] in inodes and port in ports:
                    found[fields[9]] = port
    return found


async def _until(predicate, what: str, timeout_s: float = WAIT_S) -> None:
    """Waits, turning the loop, until predicate() holds; fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.01)


def test_stop_leaves_no_tasks_sockets_or_warnings(shards):
    problems: list[dict] = []

    async def scenario():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: problems.append(ctx))
        ports = {s.port for s in shards.sentinels}
        before = set(_sockets_to(ports))    # the rig's own clients may hold some

        def ours() -> dict[str, int]:
            return {inode: port for inode, port in _sockets_to(ports).items()
                    if inode not in before}

        roles = ShardRoles(sentinel_addrs(shards), MASTERS, lambda view: None, poll_s=0.05)
        await roles.start()
        # Something to leak: a connection to every sentinel (its queries'
        # and its subscription's), and polls in flight (every 50 ms).
        # Waited for, not slept: on a loaded machine they come later.
        await _until(lambda: set(ours().values()) == ports, "a connection to every sentinel")
        await asyncio.sleep(0.2)       # polls in flight when stop() comes
        await roles.stop()
        # Each closed transport closes its socket on a later turn of the
        # loop, not at close(): the turns are waited for, a bounded time.
        # A connection stop() does not close stays open (until the garbage
        # collector, which warns, below).
        await _until(lambda: not ours(), "every socket to a sentinel closed", 5.0)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    # Garbage the tests before this one left in this process (an unclosed
    # socket in a reference cycle: pytest-xdist runs many files in one
    # worker) is collected now, not inside the recording below, where its
    # ResourceWarning would be blamed on ShardRoles.
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(scenario())
        gc.collect()
    assert problems == []
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
