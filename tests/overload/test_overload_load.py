"""Overload under a real load (real processes, bounded in count and time;
the latencies are bench/overload.py's, never asserted here): pipelining
redis-benchmark clients, half of them PRIORITY low, and a critical client
checking one at a time.  What must hold whatever the machine's speed:
critical checks are never shed, every low check is either shed or counted
(the shed count and the bucket add up to what was sent), and the node's
memory does not grow with the load it refuses to queue."""

from __future__ import annotations

import shutil
import subprocess
import threading

import pytest

pytestmark = pytest.mark.untraced

CAPACITY = 10**12          # never empty: what a bucket lost is what was counted
PER_CLIENT = 100_000


def benchmark(port: int, key: str, priority: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["redis-benchmark", "-p", str(port), "-c", "20", "-P", "16", "-n", str(PER_CLIENT),
         "-q", "CL.CHECK", key, str(CAPACITY), "1", "PRIORITY", priority],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def counted(c, key: str) -> int:
    """Checks that spent from key's bucket (each cost 1)."""
    return CAPACITY - c.execute_command("CL.CHECK", key, CAPACITY, 1, "COST", 0)[2]


def test_under_load_low_checks_are_shed_or_counted_and_critical_ones_always_counted(
        make_server):
    if shutil.which("redis-benchmark") is None:
        pytest.fail("redis-benchmark is not installed (make test installs redis-tools)")
    # a low threshold: two pipelining clients saturate the node on any machine
    s = make_server("--manual-clock", "--shed-threshold", "30")
    c = s.client(protocol=2)
    c.execute_command("DEBUG", "CLOCK", "SET", 0)
    rss_before = s.rss_bytes()
    critical_replies: list[list[int]] = []
    done = threading.Event()

    def critical():
        with s.client(protocol=2) as cc:
            while not done.is_set() and len(critical_replies) < 20_000:
                critical_replies.append(cc.execute_command(
                    "CL.CHECK", "critical", CAPACITY, 1, "PRIORITY", "critical"))

    t = threading.Thread(target=critical)
    t.start()
    loads = [benchmark(s.port, "low", "low"), benchmark(s.port, "normal", "normal")]
    try:
        for p in loads:
            assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    finally:
        done.set()
        t.join(30)
        for p in loads:
            p.kill()
    shed_low = c.info("stats")["shed_checks_low"]
    assert shed_low > 0, c.info("shedding")
    assert shed_low + counted(c, "low") == PER_CLIENT           # nothing lost, nothing twice
    assert c.info("stats")["shed_checks_normal"] + counted(c, "normal") == PER_CLIENT
    assert critical_replies and all(r[2] != -2 for r in critical_replies)
    assert counted(c, "critical") == len(critical_replies)
    # what is held back is what the clients sent in one read each, not a queue
    assert s.rss_bytes() - rss_before < 64 * 1024 * 1024
    c.close()
