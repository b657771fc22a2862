"""Idle buckets vanish on their own (the background sweep, and DEBUG
SWEEP), and the process's memory comes back down after they do."""

from __future__ import annotations

import socket
import time

import pytest

from wire import wait_until

pytestmark = pytest.mark.untraced  # sweeps against a time budget


def info_field(r, section: str, name: str) -> int:
    return int(r.info(section)[name])


def create_buckets(r, n: int, prefix: str, args) -> None:
    p = r.pipeline(transaction=False)
    for i in range(n):
        p.execute_command("CL.CHECK", f"{prefix}:{i}", *args(i))
    assert all(reply[0] == 1 for reply in p.execute())


def test_background_sweep_drops_idle_buckets(r):
    n_fast, n_slow = 5000, 500
    # refill within 1..5 s
    create_buckets(r, n_fast, "fast", lambda i: (10, 1, "COST", 1 + i % 5))
    # 1 token an hour: full again only after 5 hours
    create_buckets(r, n_slow, "slow", lambda i: (10, 1, "COST", 5, "PERIOD", 3600000))
    assert r.dbsize() == n_fast + n_slow
    expired_before = info_field(r, "stats", "expired_keys")

    # Not refilled yet: several sweep ticks (hz 10) keep every bucket.
    r.execute_command("DEBUG", "CLOCK", "SET", 999)
    time.sleep(0.35)
    assert r.dbsize() == n_fast + n_slow

    r.execute_command("DEBUG", "CLOCK", "SET", 5000 + 1000)
    wait_until(lambda: r.dbsize() == n_slow, timeout=10,
               what=f"DBSIZE to reach {n_slow} after the fast buckets refilled")
    assert info_field(r, "stats", "expired_keys") - expired_before == n_fast
    # The live buckets kept their state (6 s at 1/hour: 1.7 milli-tokens).
    assert r.execute_command("CL.CHECK", "slow:7", 10, 1, "COST", 0, "PERIOD", 3600000) == [
        1, 10, 5, 0, 18000000 - 6000]
    assert r.execute_command("CL.CHECK", "fast:7", 10, 1, "COST", 0) == [1, 10, 10, 0, 0]

    r.execute_command("DEBUG", "CLOCK", "SET", 5 * 3600 * 1000)
    wait_until(lambda: r.dbsize() == 0, timeout=10, what="DBSIZE to reach 0")


def test_debug_sweep(r):
    n = 3000
    create_buckets(r, n, "d", lambda i: (10, 1, "COST", 1 + i % 3))
    removed, scanned = r.execute_command("DEBUG", "SWEEP")
    assert removed == 0 and scanned >= n
    # One read: the background sweep cannot run between these, and it sees
    # the clock at 0 again afterwards.
    p = r.pipeline(transaction=False)
    p.execute_command("DEBUG", "CLOCK", "SET", 2500)
    p.execute_command("DEBUG", "SWEEP", 100)
    p.execute_command("DEBUG", "CLOCK", "SET", 3000)
    p.execute_command("DEBUG", "SWEEP", 100)
    p.execute_command("DBSIZE")
    p.execute_command("DEBUG", "CLOCK", "SET", 0)
    t1, (removed1, scanned1), t2, (removed2, scanned2), dbsize, t0 = p.execute()
    assert (t1, t2, t0) == (2500, 3000, 0)
    # at 2500 ms only the buckets that spent 1 or 2 tokens are full again
    assert removed1 == 2000 and scanned1 >= n
    assert removed2 == 1000 and scanned2 >= 1000
    assert dbsize == 0
    assert r.execute_command("DEBUG", "SWEEP")[0] == 0


def test_debug_sweep_arguments(r):
    assert r.execute_command("DEBUG", "SWEEP", 1)[0] == 0
    with pytest.raises(Exception, match="budget"):
        r.execute_command("DEBUG", "SWEEP", "lots")


# ---- memory ----------------------------------------------------------------------------------

KEYS = 500_000
CHUNK = 10_000
COMMAND = b"*6\r\n$8\r\nCL.CHECK\r\n$11\r\nmem:%07d\r\n$2\r\n10\r\n$1\r\n1\r\n$6\r\nPERIOD\r\n$5\r\n60000\r\n"
# 1 token a minute: a bucket that spent one token is full again after 60 s
REPLY = b"*5\r\n:1\r\n:10\r\n:9\r\n:0\r\n:60000\r\n"


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


@pytest.mark.release_only
def test_memory_comes_back_after_the_sweep(make_server):
    s = make_server("--manual-clock")
    r = s.client(protocol=2)
    sock = s.connect()
    try:
        # Warm up the connection paths once, then take the baseline.
        sock.sendall(b"".join(COMMAND % i for i in range(CHUNK)))
        assert recv_exactly(sock, CHUNK * len(REPLY)) == REPLY * CHUNK
        r.flushall()
        time.sleep(0.2)
        baseline = s.rss_bytes()

        for start in range(0, KEYS, CHUNK):
            sock.sendall(b"".join(COMMAND % i for i in range(start, start + CHUNK)))
            got = recv_exactly(sock, CHUNK * len(REPLY))
            assert got == REPLY * CHUNK, f"unexpected reply in chunk at {start}"
        assert r.dbsize() == KEYS
        full = s.rss_bytes()
        growth = full - baseline
        assert growth > KEYS * 20, f"RSS grew by only {growth} bytes for {KEYS} buckets"

        r.execute_command("DEBUG", "CLOCK", "SET", 120_000)
        wait_until(lambda: r.dbsize() == 0, timeout=20,
                   what="DBSIZE to reach 0 after every bucket refilled")
        target = baseline + growth // 2
        wait_until(lambda: s.rss_bytes() <= target, timeout=10, interval=0.2,
                   what=f"RSS to fall to {target} (it was {baseline} before, {full} "
                        f"with {KEYS} buckets)")
    finally:
        sock.close()
        r.close()
