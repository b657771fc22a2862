#!/usr/bin/env python3
"""The check path against the protocol's ceiling (issue 31): CL.CHECK on a
million random keys against redis-server's PING, and the server CPU a
check costs against redis-server's INCR on the same keys, at -P 1, 16 and
64, side by side in one run.

fastlimit (bench/run.py's Fastlimit) and a redis-server on free loopback
ports; per pipeline depth, redis-benchmark -c 50 -r 1,000,000 runs, in an
order that flips on every repeat:

    fastlimit  CL.CHECK key:__rand_int__ 100 10     the check
    fastlimit  PING                                  its own protocol ceiling
    redis      PING                                  the protocol's ceiling
    redis      INCR key:__rand_int__                 a write to a random key

Each run's server CPU (utime+stime from /proc, over the run) divided by
the requests is beside its req/s; medians of --repeat (5) runs.  Targets:
CL.CHECK ÷ redis PING ≥ 0.95× at -P 1 and ≥ 0.75× at -P 16, and CPU per
check ÷ redis's CPU per INCR ≤ 0.5×.  It reports; it does not judge by
exit code.  ``--quick``: tiny counts, one repeat (tests/bench).

    .venv/bin/python bench/ceiling.py          # about 3 minutes
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from failover import cpu_seconds  # noqa: E402
from run import (  # noqa: E402
    Fastlimit,
    RedisServer,
    fmt_rps,
    report_meta,
    run_benchmark,
    target_line,
)

KEYS = 1_000_000
CLIENTS = 50
PIPELINES = (1, 16, 64)
# (server, name, command, random keys)
CASES = (("fastlimit", "CL.CHECK", ["CL.CHECK", "key:__rand_int__", "100", "10"], True),
         ("fastlimit", "PING", ["PING"], False),
         ("redis", "PING", ["PING"], False),
         ("redis", "INCR", ["INCR", "key:__rand_int__"], True))


@dataclass
class Runs:
    rps: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)     # server CPU per request

    def median(self, what: str) -> float | None:
        values = getattr(self, what)
        return statistics.median(values) if values else None


def requests_for(pipeline: int, args) -> int:
    return args.n1 if pipeline == 1 else args.n16 * (2 if pipeline == 64 else 1)


def measure(args) -> dict:
    runs: dict = {(server, name, p): Runs() for server, name, _, _ in CASES
                  for p in PIPELINES}
    with tempfile.TemporaryDirectory(prefix="fastlimit-ceiling-") as tmp:
        servers = {"fastlimit": Fastlimit(Path(tmp)),
                   "redis": RedisServer(Path(tmp), args.redis_server)}
        try:
            for s in servers.values():
                s.wait_ready()
            for repeat in range(args.repeat):
                for p in PIPELINES:
                    cases = CASES if repeat % 2 == 0 else CASES[::-1]
                    for server, name, command, random_keys in cases:
                        srv = servers[server]
                        n = requests_for(p, args)
                        before = cpu_seconds(srv.pid)
                        result = run_benchmark(args.redis_benchmark, srv.port, CLIENTS, n, p,
                                               command, KEYS if random_keys else None)
                        used = cpu_seconds(srv.pid) - before
                        runs[(server, name, p)].rps.append(result.rps)
                        runs[(server, name, p)].cpu_us.append(used / n * 1e6)
                        print(f"  [{repeat + 1}/{args.repeat}] P={p} {server} {name}: "
                              f"{fmt_rps(result.rps)} req/s, {used / n * 1e6:.2f} µs CPU/req",
                              file=sys.stderr)
        finally:
            for s in servers.values():
                s.stop()
    return runs


def ratio(a, b):
    return a / b if a and b else None


def report(args, runs: dict, elapsed: float) -> str:
    meta = report_meta()
    out = ["# The check path against the protocol's ceiling", "",
           f"{meta['when']} · {meta['machine']} · rev {meta['rev']} · redis-benchmark -c "
           f"{CLIENTS}, -r {KEYS:,} for CL.CHECK and INCR · median of {args.repeat} "
           f"interleaved run(s) · {elapsed:.0f} s", "",
           "| P | server | command | req/s | spread | server CPU µs/request |",
           "|---:|---|---|---:|---|---:|"]
    for p in PIPELINES:
        for server, name, _, _ in CASES:
            r = runs[(server, name, p)]
            spread = f"{fmt_rps(min(r.rps))}–{fmt_rps(max(r.rps))}" if r.rps else "–"
            cpu = r.median("cpu_us")
            out.append(f"| {p} | {server} | {name} | {fmt_rps(r.median('rps'))} | {spread} | "
                       f"{'–' if cpu is None else f'{cpu:.3f}'} |")
    out += ["", "| P | CL.CHECK ÷ redis PING | fastlimit PING ÷ redis PING "
            "| CPU per CL.CHECK ÷ redis's per INCR |", "|---:|---:|---:|---:|"]
    ratios = {}
    for p in PIPELINES:
        med = {k[:2]: v for k, v in runs.items() if k[2] == p}
        ratios[p] = (ratio(med[("fastlimit", "CL.CHECK")].median("rps"),
                           med[("redis", "PING")].median("rps")),
                     ratio(med[("fastlimit", "PING")].median("rps"),
                           med[("redis", "PING")].median("rps")),
                     ratio(med[("fastlimit", "CL.CHECK")].median("cpu_us"),
                           med[("redis", "INCR")].median("cpu_us")))
        out.append(f"| {p} | " + " | ".join("–" if x is None else f"{x:.2f}×"
                                             for x in ratios[p]) + " |")
    out += ["", "Targets (issue 31):",
            target_line("P=1: CL.CHECK ≥ 0.95× redis-server's PING", ratios[1][0], 0.95),
            target_line("P=16: CL.CHECK ≥ 0.75× redis-server's PING", ratios[16][0], 0.75),
            target_line("P=16: server CPU per CL.CHECK ≤ 0.5× redis-server's per INCR",
                        ratios[16][2], 0.5, higher_is_better=False), ""]
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny counts, one repeat")
    p.add_argument("--repeat", type=int, default=None, help="runs per row (default 5)")
    p.add_argument("--n1", type=int, default=None, help="requests per run at -P 1 (200,000)")
    p.add_argument("--n16", type=int, default=None,
                   help="requests per run at -P 16, twice that at -P 64 (2,000,000)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    p.add_argument("--output", default=str(BENCH_DIR / "results" / "ceiling.md"))
    args = p.parse_args()
    args.repeat = args.repeat or (1 if args.quick else 5)
    args.n1 = args.n1 or (2_000 if args.quick else 200_000)
    args.n16 = args.n16 or (20_000 if args.quick else 2_000_000)
    started = time.monotonic()
    text = report(args, measure(args), time.monotonic() - started)
    print(text)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
