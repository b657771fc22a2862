#!/usr/bin/env python3
"""The `limits` library on fastlimit against `limits` on redis-server:
each strategy's ``hit`` per second on one connection, with fastlimit's
storage (``fastlimit://``, ``import fastlimit.limits_storage``) and with
limits' own Redis storage (``redis://``, its Lua scripts) against a
redis-server, side by side in one run, and the server CPU per hit of each
(utime+stime from /proc/<pid>/stat over the run, divided by the hits).

One run:
  1. a fastlimit server and a redis-server (no persistence) on free
     loopback ports;
  2. per repeat, per strategy (fixed window, moving window, sliding window
     counter), per side, interleaved: the storage's reset(), then --hits
     calls of ``limiter.hit(item, key)`` on one synchronous connection,
     keys cycling over --keys, item --limit (default 100 per minute): both
     sides make the same calls, allowed and denied, and the report shows
     how many each allowed (the same figure, or nearly: the fixed window
     starts at a key's first hit on each);
  3. the median of the repeats; fastlimit ÷ redis per strategy (target
     from issue 29: at least 2x the hits per second);
  4. prints a markdown report and writes it to bench/results/limits_storage.md.

It reports; it does not judge by exit code.  See bench/README.md.

    .venv/bin/python bench/limits_storage.py [--hits N] [--repeat N]
    .venv/bin/python bench/limits_storage.py --quick    # a smoke run, a second or so
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (  # noqa: E402  (bench/ is not a package)
    REPO,
    Fastlimit,
    RedisServer,
    fmt_ratio,
    log,
    publish,
    report_meta,
    run_cli,
    target_line,
)

RESULTS = Path(__file__).resolve().parent / "results" / "limits_storage.md"
TICKS = os.sysconf("SC_CLK_TCK")
STRATEGIES = {"fixed window": "FixedWindowRateLimiter",
              "moving window": "MovingWindowRateLimiter",
              "sliding window counter": "SlidingWindowCounterRateLimiter"}
TARGET = 2.0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS     # utime, stime


@dataclass
class Run:
    rate: float           # hits per second
    cpu_us: float         # server CPU per hit, µs
    allowed: int


def measure(limiter, item, storage, pid: int, hits: int, keys: int) -> Run:
    storage.reset()
    names = [f"k{i}" for i in range(keys)]
    for name in names[:min(keys, 100)]:           # connections made, scripts loaded
        limiter.test(item, name)
    allowed = 0
    cpu = cpu_seconds(pid)
    began = time.perf_counter()
    for i in range(hits):
        allowed += limiter.hit(item, names[i % keys])
    took = time.perf_counter() - began
    cpu = cpu_seconds(pid) - cpu
    return Run(hits / took, cpu / hits * 1e6, allowed)


def median_run(runs: list[Run]) -> Run:
    return Run(statistics.median(r.rate for r in runs), statistics.median(r.cpu_us for r in runs),
               runs[0].allowed)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: --hits 300, --repeat 1 (unless given)")
    p.add_argument("--hits", type=int, help="hits per run (default 30,000)")
    p.add_argument("--repeat", type=int, help="interleaved runs per side (default 3)")
    p.add_argument("--keys", type=int, default=1000, help="keys the hits cycle over (1,000)")
    p.add_argument("--limit", default="100/minute", help="the rate limit item (100/minute)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--output", type=Path, default=RESULTS,
                   help="also write the report here (default bench/results/limits_storage.md)")
    args = p.parse_args(argv)
    args.hits = args.hits or (300 if args.quick else 30_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import limits
        import limits.strategies
    except ImportError:
        log("the `limits` package is needed: pip install 'fastlimit[limits]'")
        return 1
    meta = report_meta()
    started = time.monotonic()
    results: dict[tuple[str, str], list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="fastlimit-limits-bench-") as tmp:
        fl = Fastlimit(Path(tmp))
        rd = RedisServer(Path(tmp), args.redis_server)
        try:
            fl.wait_ready()
            rd.wait_ready()
            if fl.source != "installed package":
                sys.path.insert(0, str(REPO / "src"))
            import fastlimit.limits_storage  # noqa: F401  (registers fastlimit://)
            meta["fl_source"], meta["limits"] = fl.source, limits.__version__
            storages = {"fastlimit": (f"fastlimit://127.0.0.1:{fl.port}", fl.pid),
                        "redis": (f"redis://127.0.0.1:{rd.port}", rd.pid)}
            opened = {side: limits.storage.storage_from_string(uri)
                      for side, (uri, _) in storages.items()}
            item = limits.parse(args.limit)
            for rep in range(args.repeat):
                for strategy, cls in STRATEGIES.items():
                    for side, storage in opened.items():
                        limiter = getattr(limits.strategies, cls)(storage)
                        run = measure(limiter, item, storage, storages[side][1], args.hits,
                                      args.keys)
                        results.setdefault((strategy, side), []).append(run)
                        log(f"[{rep + 1}/{args.repeat}] {strategy}, {side}: "
                            f"{run.rate:,.0f} hits/s, {run.cpu_us:.1f} µs server CPU/hit, "
                            f"{run.allowed} allowed")
        finally:
            fl.stop()
            rd.stop()
    meta["elapsed"] = time.monotonic() - started
    publish(build_report(args, {k: median_run(v) for k, v in results.items()}, meta),
            args.output)
    return 0


def build_report(args, runs: dict[tuple[str, str], Run], meta: dict) -> str:
    out = ["# `limits` on fastlimit vs `limits` on redis-server", "",
           f"{meta['when']} · {meta['machine']} · {meta['rev']} · fastlimit: "
           f"{meta['fl_source']} · limits {meta['limits']} · {meta['elapsed']:.0f} s", "",
           f"`limiter.hit(item, key)` on one synchronous connection, item `{args.limit}`, "
           f"{args.hits:,} hits per run over {args.keys:,} keys, median of {args.repeat} "
           "interleaved run(s). fastlimit: `fastlimit://` (CL.FIXED, CL.MOVING, CL.SLIDING); "
           "redis: limits' `redis://` storage (its Lua scripts) on redis-server.", "",
           "| strategy | storage | hits/s | server CPU µs/hit | allowed |",
           "|---|---|---|---|---|"]
    for strategy in STRATEGIES:
        for side in ("fastlimit", "redis"):
            r = runs[(strategy, side)]
            out.append(f"| {strategy} | {side} | {r.rate:,.0f} | {r.cpu_us:.1f} | "
                       f"{r.allowed:,} |")
    out += ["", "| strategy | hits/s fastlimit ÷ redis | server CPU per hit redis ÷ fastlimit |",
            "|---|---|---|"]
    for strategy in STRATEGIES:
        f, r = runs[(strategy, "fastlimit")], runs[(strategy, "redis")]
        cpu = fmt_ratio(r.cpu_us, f.cpu_us) if f.cpu_us > 0 else "–"
        out.append(f"| {strategy} | {fmt_ratio(f.rate, r.rate)} | {cpu} |")
    out += ["", "Targets (issue 29):", ""]
    for strategy in STRATEGIES:
        f, r = runs[(strategy, "fastlimit")], runs[(strategy, "redis")]
        out.append(target_line(f"{strategy}: hits/s fastlimit ÷ redis",
                                      f.rate / r.rate, TARGET))
    out += ["", "Server CPU comes in clock ticks (10 ms): a short run's figures are coarse. "
            "The client's own work (limits, redis-py, one round trip a hit) is the same on "
            "both sides, so the hit rate's ratio is smaller than the servers' CPU ratio."]
    return "\n".join(out)


if __name__ == "__main__":
    run_cli(main)
