"""redis-benchmark 7.0, unmodified, against fastlimit: short pipelined runs
of CL.CHECK over random keys and of PING.  No timing assertions: a run
must finish, report a positive rate, print no error, and leave the server
answering with the buckets it made (the manual clock is frozen at 0, so
nothing refills or expires)."""

from __future__ import annotations

import csv
import io
import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.untraced

TIMEOUT = 60
RATE = re.compile(r"^(?P<test>.+?): (?P<rps>[0-9.]+) requests per second")


CHECK = ["CL.CHECK", "key:__rand_int__", "100", "10"]


def bench(server, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), *args],
                          capture_output=True, timeout=TIMEOUT)
    # bytes, then decoded: text mode would turn the progress lines' \r into \n
    proc.stdout, proc.stderr = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, proc
    assert proc.stderr == "", proc.stderr   # e.g. "WARNING: Could not fetch server CONFIG"
    for bad in ("Error", "ERR", "WARN", "unknown"):
        assert bad not in proc.stdout, proc.stdout
    return proc


def final_lines(stdout: str) -> list[str]:
    """-q prints progress lines ended by \\r; the results end with \\n."""
    return [line.rsplit("\r", 1)[-1].strip() for line in stdout.split("\n") if line.strip()]


def rates(stdout: str) -> dict[str, float]:
    out = {}
    for line in final_lines(stdout):
        m = RATE.match(line)
        assert m, f"unexpected line {line!r} in {stdout!r}"
        out[m.group("test")] = float(m.group("rps"))
    return out


def settle(r, want_clients: int = 1, timeout: float = 10) -> int:
    """Waits until redis-benchmark's connections are gone."""
    deadline = time.monotonic() + timeout
    while True:
        n = r.info("clients")["connected_clients"]
        if n <= want_clients or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def test_cl_check_pipelined_random_keys(server, r):
    r.config_resetstat()
    proc = bench(server, "-c", "50", "-n", "20000", "-P", "16", "-r", "100000", "-q", *CHECK)
    got = rates(proc.stdout)
    assert list(got) == ["CL.CHECK key:__rand_int__ 100 10"]
    assert got["CL.CHECK key:__rand_int__ 100 10"] > 0
    assert r.ping() is True
    stats = r.info("commandstats")
    assert stats["cmdstat_cl.check"]["calls"] == 20000
    assert stats["cmdstat_cl.check"]["failed_calls"] == 0
    # every check was allowed (no key was hit 100 times), so every key used
    # holds a bucket; 20,000 draws from 100,000 keys give about 18,000
    keys = r.dbsize()
    assert 1000 < keys <= 20000
    assert r.info("keyspace")["db0"]["keys"] == keys
    assert settle(r) == 1
    assert server.alive()
    assert "Traceback" not in server.log()


def test_cl_check_csv(server, r):
    r.config_resetstat()
    proc = bench(server, "-c", "50", "-n", "20000", "-P", "16", "-r", "100000", "--csv", *CHECK)
    rows = list(csv.reader(io.StringIO(proc.stdout)))
    assert rows[0][:2] == ["test", "rps"]
    assert len(rows) == 2, rows
    name, rps = rows[1][0], float(rows[1][1])
    assert name == "CL.CHECK key:__rand_int__ 100 10"
    assert rps > 0
    assert all(float(x) >= 0 for x in rows[1][2:])
    assert r.info("commandstats")["cmdstat_cl.check"]["calls"] == 20000
    assert r.dbsize() > 0
    assert server.alive()


def test_one_key_is_limited_not_failed(server, r):
    # A limited request is a normal reply: redis-benchmark would stop at an
    # error.  One key, capacity 100: 100 of the 4,800 are allowed, the rest
    # limited.  (redis-benchmark sends whole pipelines: -n is a multiple of -P.)
    r.config_resetstat()
    proc = bench(server, "-c", "10", "-n", "4800", "-P", "16", "-q",
                 "CL.CHECK", "single", "100", "10")
    assert rates(proc.stdout)["CL.CHECK single 100 10"] > 0
    assert r.info("commandstats")["cmdstat_cl.check"]["calls"] == 4800
    assert r.execute_command("CL.CHECK", "single", 100, 10, "COST", 0) == [1, 100, 0, 0, 10000]
    assert r.execute_command("CL.CHECK", "single", 100, 10) == [0, 100, 0, 100, 10000]
    assert r.dbsize() == 1


def test_ping(server, r):
    proc = bench(server, "-t", "ping", "-n", "10000", "-q")
    got = rates(proc.stdout)
    assert set(got) == {"PING_INLINE", "PING_MBULK"}
    assert all(v > 0 for v in got.values())
    assert r.ping() is True
    assert settle(r) == 1
    assert server.alive()
