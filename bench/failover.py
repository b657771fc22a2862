#!/usr/bin/env python3
"""Failover through Redis Sentinel, fastlimit against real redis-servers.

One run:
  1. for each side, `--runs` times, interleaved: a primary, two standbys
     and three sentinels (scripts/ha.py, down-after-milliseconds 1000);
     a Sentinel-aware client (redis-py's ``Sentinel.master_for``) asks
     every 5 ms; the primary is killed with SIGKILL; the time from the kill
     to the first answer from the new primary is the failover time.  On
     the fastlimit side ``fastlimit.Client(sentinels=...)`` is timed too,
     and a third thread spends one key as fast as it can to count the
     overshoot: requests allowed on top of the capacity because the old
     primary had not yet sent them to its standbys;
  2. redis-benchmark ``-P 16 CL.CHECK`` against a primary with the three
     sentinels attached and one alone, interleaved, with the server CPU
     per request from /proc;
  3. prints a markdown report and writes it to bench/results/failover.md.

It reports; it does not judge by exit code.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import redis
import redis.sentinel

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "failover.md"
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "scripts"))
from ha import SERVICE, HASet  # noqa: E402
from run import (  # noqa: E402
    _terminate,
    fmt_rps,
    git_rev,
    log,
    machine_line,
    median_result,
    publish,
    run_benchmark,
    run_cli,
    target_line,
)

import fastlimit  # noqa: E402

CHECK = ["CL.CHECK", "key:__rand_int__", "100", "10"]
RANDOM_KEYS = 1_000_000
POLL_S = 0.005
GIVE_UP_S = 60.0
HOT_CAPACITY = 10_000_000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, help="failovers per side (default 5, 2 with --quick)")
    p.add_argument("--quick", action="store_true", help="2 failovers per side, short benchmark")
    p.add_argument("--n16", type=int, help="requests per redis-benchmark run (default 1,000,000)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved benchmark runs per side")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeat = 1
    args.runs = args.runs or (2 if args.quick else 5)
    args.n16 = args.n16 or (200_000 if args.quick else 1_000_000)
    return args


def ask(client: redis.Redis, kind: str):
    if kind == "redis":
        return client.incr("failover:probe")
    return client.execute_command("CL.CHECK", "failover:probe", 1_000_000, 1000)


class Poller(threading.Thread):
    """Asks every POLL_S and notes the first answer after `killed` is set."""

    def __init__(self, call, killed: threading.Event):
        super().__init__(daemon=True)
        self.call, self.killed = call, killed
        self.answered_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                ok = self.call()
            except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
                ok = False
            if ok and self.killed.is_set():
                self.answered_at = time.monotonic()
                return
            time.sleep(POLL_S)


class Spender(threading.Thread):
    """Spends one key on the primary as fast as one connection can."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.client = redis.Redis(port=port, socket_timeout=1)
        self.allowed = 0

    def run(self) -> None:
        while True:
            try:
                self.allowed += self.client.execute_command(
                    "CL.CHECK", "hot", HOT_CAPACITY, 1, "PERIOD", 3_600_000)[0]
            except (redis.ConnectionError, redis.TimeoutError):
                return


def one_failover(kind: str) -> dict:
    ha = HASet(kind, python=sys.executable)
    try:
        ha.start(timeout_s=60)
        old = ha.nodes[0]
        killed = threading.Event()
        sentinels = [("127.0.0.1", s.port) for s in ha.sentinels]
        py = redis.sentinel.Sentinel(sentinels, socket_timeout=0.2).master_for(
            SERVICE, socket_timeout=0.2)
        pollers = {"redis-py": Poller(lambda: ask(py, kind), killed)}
        fl = None
        spender = None
        if kind == "fastlimit":
            fl = fastlimit.Client(sentinels=sentinels, service=SERVICE, timeout_ms=200)
            pollers["fastlimit.Client"] = Poller(
                lambda: fl.check("failover:probe2", 1_000_000, 1000).source == "server", killed)
            spender = Spender(old.port)
            spender.start()
        for p in pollers.values():
            p.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        old.signal(signal.SIGKILL)
        killed.set()
        deadline = t0 + GIVE_UP_S
        for p in pollers.values():
            p.join(max(0.0, deadline - time.monotonic()))
            p.stop.set()
        out = {name: (p.answered_at - t0) if p.answered_at else None
               for name, p in pollers.items()}
        if spender is not None:
            spender.join(5)
            new_port = ha.primary_port()
            if new_port:
                remaining = ha.node(new_port).client().execute_command(
                    "CL.CHECK", "hot", HOT_CAPACITY, 1, "PERIOD", 3_600_000, "COST", 0)[2]
                out["overshoot"] = spender.allowed - (HOT_CAPACITY - remaining)
                out["spent"] = spender.allowed
        if fl is not None:
            fl.close()
        return out
    finally:
        ha.stop()


def failovers(args) -> dict:
    runs: dict[str, list[dict]] = {"redis": [], "fastlimit": []}
    for i in range(args.runs):
        order = ["redis", "fastlimit"] if i % 2 == 0 else ["fastlimit", "redis"]
        for kind in order:
            result = one_failover(kind)
            runs[kind].append(result)
            log(f"  [{i + 1}/{args.runs}] {kind:9} " + ", ".join(
                f"{k} {v:.2f} s" if isinstance(v, float) else f"{k} {v}"
                for k, v in result.items()))
    return runs


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_sentinels(args) -> dict:
    """P=16 CL.CHECK on a primary watched by three sentinels and on one alone."""
    watched = HASet("fastlimit", replicas=0, python=sys.executable)
    alone = HASet("fastlimit", replicas=0, sentinels=0, python=sys.executable)
    runs: dict[str, list] = {"alone": [], "sentinels": []}
    cpu: dict[str, list[float]] = {"alone": [], "sentinels": []}
    try:
        watched.start(timeout_s=60)
        alone.start(timeout_s=60)
        sides = {"alone": alone.nodes[0], "sentinels": watched.nodes[0]}
        for node in sides.values():
            run_benchmark(args.redis_benchmark, node.port, 50, 50_000, 16, CHECK, RANDOM_KEYS)
        for rep in range(args.repeat):
            order = list(sides.items())
            if rep % 2:
                order.reverse()
            for who, node in order:
                before = cpu_seconds(node.proc.pid)
                res = run_benchmark(args.redis_benchmark, node.port, 50, args.n16, 16, CHECK,
                                    RANDOM_KEYS)
                cpu[who].append((cpu_seconds(node.proc.pid) - before) / args.n16 * 1e6)
                runs[who].append(res)
                log(f"  [{rep + 1}/{args.repeat}] P=16 {who:9} {fmt_rps(res.rps):>6} req/s, "
                    f"{cpu[who][-1]:.2f} µs CPU/req")
    finally:
        watched.stop()
        alone.stop()
    return {"runs": runs, "cpu": cpu,
            "median": {who: median_result(r) for who, r in runs.items()}}


def _stats(values: list[float | None]) -> tuple[float | None, float | None]:
    got = [v for v in values if v is not None]
    return (statistics.median(got), max(got)) if got else (None, None)


def _s(x: float | None) -> str:
    return f"{x:.2f} s" if x is not None else "none"


def build_report(args, fo: dict, ws: dict, meta: dict) -> str:
    rd_med, rd_max = _stats([r["redis-py"] for r in fo["redis"]])
    fl_med, fl_max = _stats([r["redis-py"] for r in fo["fastlimit"]])
    flc_med, flc_max = _stats([r.get("fastlimit.Client") for r in fo["fastlimit"]])
    overshoot = [r.get("overshoot") for r in fo["fastlimit"]]
    alone, watched = ws["median"]["alone"], ws["median"]["sentinels"]
    ratio = watched.rps / alone.rps if alone and watched else None
    cpu_a, cpu_s = statistics.median(ws["cpu"]["alone"]), statistics.median(ws["cpu"]["sentinels"])
    out = ["# fastlimit: failover by Redis Sentinel", "",
           f"{meta['when']} · {meta['machine']} · rev {meta['rev']} · "
           f"{meta['elapsed']:.0f} s", "",
           f"A primary, two standbys and three sentinels on 127.0.0.1 "
           f"(`down-after-milliseconds 1000`), {args.runs} interleaved `kill -9` runs per "
           f"side; time from the kill to the first answer from the new primary:", "",
           "| rig | client | median | worst |", "|---|---|---:|---:|",
           f"| redis-server | redis-py `Sentinel.master_for` | {_s(rd_med)} | {_s(rd_max)} |",
           f"| fastlimit | redis-py `Sentinel.master_for` | {_s(fl_med)} | {_s(fl_max)} |",
           f"| fastlimit | `fastlimit.Client(sentinels=...)` | {_s(flc_med)} | {_s(flc_max)} |",
           "",
           "Overshoot per run (one connection spending one key as fast as it can; "
           "allowed on top of the capacity across the failover): "
           + ", ".join(str(o) for o in overshoot) + ".", "",
           f"redis-benchmark `-c 50 -P 16 -n {args.n16:,} -r {RANDOM_KEYS:,} "
           f"{' '.join(CHECK)}`, {args.repeat} interleaved run(s) per side, medians:", "",
           "| primary | req/s | server CPU µs/req |", "|---|---:|---:|",
           f"| alone | {fmt_rps(alone.rps)} | {cpu_a:.2f} |",
           f"| three sentinels attached | {fmt_rps(watched.rps)} | {cpu_s:.2f} |", "",
           "Targets (measured side by side in this run):",
           target_line("failover time ≤ 1.1× Redis's (median, redis-py client)",
                       fl_med / rd_med if fl_med and rd_med else None, 1.1,
                       higher_is_better=False),
           target_line("P=16 CL.CHECK with three sentinels ≥ 0.97× without", ratio, 0.97),
           ""]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    if not shutil.which("redis-sentinel"):
        log("error: redis-sentinel not found (make bench installs it)")
        return 2
    started = time.monotonic()
    log("failovers:")
    fo = failovers(args)
    log("P=16 with and without sentinels:")
    ws = with_sentinels(args)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine_line(), "rev": git_rev(),
            "elapsed": time.monotonic() - started}
    publish(build_report(args, fo, ws, meta), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
