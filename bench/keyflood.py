#!/usr/bin/env python3
"""A flood of new random keys against fastlimit, with and without
maxmemory, while a real client whose buckets were exhausted before the
flood keeps checking them.

One run per setting (``--maxmemory 200mb`` and none):
  1. starts fastlimit (this interpreter, ``-m fastlimit.server``) and
     exhausts GOOD_KEYS buckets of a real client;
  2. floods it with redis-benchmark: ``CL.CHECK key:__rand_int__ 10 1
     PERIOD 3600000`` over 10^8 random keys, pipelined, for ``--seconds``
     (a bucket spent once stays an hour, so only eviction makes room);
  3. meanwhile the real client checks its exhausted keys every 5 ms, each
     round trip timed, and every second the sampler reads the server's RSS
     (/proc) and INFO (used_memory_dataset, keys, evicted_keys, commands);
  4. prints one markdown report (and writes bench/results/keyflood.md):
     throughput and memory over time, the real client's latency and how
     many of its answers were still "denied", how many of its buckets
     were found full again at the end ("victims reset"), and the slack of
     RSS over the bound.

A third run (``--slow-refill-seconds``, under the bound) floods with a
slower refill than the victims': new keys of a daily quota (``10 10
PERIOD 86400000``, each full again only after 2.4 hours) against victims
exhausted under 5 logins per 10 minutes (full again after 10 minutes, a
token back every 2), the mix that made nearest-full reset every victim
when it ranked buckets by their time to full.

``--quick`` is a smoke run of a few seconds: each of the three runs
floods for 1 s (unless --seconds or --slow-refill-seconds are given).

Without a bound the run also stops when RSS passes ``--unbounded-cap``
(the machine's memory is not the subject).  Every loop stops by itself;
traffic goes to 127.0.0.1 only.  It reports; it does not judge by exit
code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from run import Fastlimit, rss_bytes  # noqa: E402  (bench/ is not a package)

MB = 1024 * 1024
GOOD_KEYS = 100
GOOD_INTERVAL_S = 0.005
FLOOD = ["CL.CHECK", "key:__rand_int__", "10", "1", "PERIOD", "3600000"]
GOOD = ("10", "1", "PERIOD", "3600000")
# The slow-refill run: a daily quota's new keys against exhausted logins.
SLOW_FLOOD = ["CL.CHECK", "key:__rand_int__", "10", "10", "PERIOD", "86400000"]
LOGIN = ("5", "5", "PERIOD", "600000")


@dataclass
class Sample:
    t: float
    rss: int
    dataset: int
    keys: int
    evicted: int
    commands: int


@dataclass
class Run:
    name: str
    maxmemory: int
    flood: list[str]
    good: tuple[str, ...]
    samples: list[Sample] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)    # seconds, during the flood
    denied: int = 0
    answers: int = 0
    reset: int = 0          # victims whose bucket was full again at the end
    stopped_by: str = "time"


def good_client(srv, stop: threading.Event, run: Run) -> None:
    """Checks the exhausted keys in turn; each should answer denied."""
    c = srv.client(socket_timeout=10)
    i = 0
    while not stop.is_set():
        started = time.perf_counter()
        reply = c.execute_command("CL.CHECK", f"good:{i % GOOD_KEYS}", *run.good)
        run.latencies.append(time.perf_counter() - started)
        run.answers += 1
        run.denied += reply[0] == 0
        i += 1
        time.sleep(GOOD_INTERVAL_S)


def sample(srv, started: float) -> Sample:
    c = srv.client(socket_timeout=10)
    info = c.info()
    return Sample(time.monotonic() - started, rss_bytes(srv.pid), info["used_memory_dataset"],
                  c.dbsize(), info["evicted_keys"], info["total_commands_processed"])


def victims_reset(srv, good: tuple[str, ...]) -> int:
    """How many of the victims' buckets hold tokens again (peeks)."""
    pipe = srv.client(socket_timeout=10).pipeline(transaction=False)
    for i in range(GOOD_KEYS):
        pipe.execute_command("CL.CHECK", f"good:{i}", *good, "COST", "0")
    return sum(reply[2] != 0 for reply in pipe.execute())


def flood_one(args, workdir: Path, name: str, maxmemory: int, seconds: float,
              flood: list[str] = FLOOD, good: tuple[str, ...] = GOOD) -> Run:
    extra = ["--maxmemory", str(maxmemory)] if maxmemory else []
    srv = Fastlimit(workdir, extra)
    srv.wait_ready()
    run = Run(name, maxmemory, flood, good)
    try:
        c = srv.client()
        pipe = c.pipeline(transaction=False)
        for i in range(GOOD_KEYS):
            pipe.execute_command("CL.CHECK", f"good:{i}", *good, "COST", good[0])
        pipe.execute()
        started = time.monotonic()
        run.samples.append(sample(srv, started))
        bench = subprocess.Popen(
            [args.redis_benchmark, "-h", "127.0.0.1", "-p", str(srv.port), "-c", "20",
             "-P", str(args.pipeline), "-r", "100000000", "-n", str(2**31 - 1), "-q", *flood],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop = threading.Event()
        checker = threading.Thread(target=good_client, args=(srv, stop, run), daemon=True)
        checker.start()
        try:
            while time.monotonic() - started < seconds:
                time.sleep(1.0)
                s = sample(srv, started)
                run.samples.append(s)
                print(f"{name}: {s.t:5.1f} s rss {s.rss / MB:7.1f} MB keys {s.keys:>10,} "
                      f"evicted {s.evicted:>11,}", file=sys.stderr)
                if not maxmemory and s.rss > args.unbounded_cap:
                    run.stopped_by = f"RSS past {args.unbounded_cap // MB} MB"
                    break
        finally:
            bench.terminate()        # our own child, by its pid
            bench.wait(timeout=10)
            stop.set()
            checker.join(timeout=10)
        run.reset = victims_reset(srv, good)
    finally:
        srv.stop()
    return run


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def report(runs: list[Run], args) -> str:
    lines = ["# Key flood: fastlimit with and without maxmemory", "",
             f"redis-benchmark `-c 20 -P {args.pipeline} -r 100000000 <flood>` per run; a "
             f"real client checks {GOOD_KEYS} buckets it exhausted before the flood, one every "
             f"{GOOD_INTERVAL_S * 1000:.0f} ms, and at the end peeks at each: \"victims reset\" "
             "counts those full again. 2 shared cores: client and server compete.", ""]
    lines += ["| run | flood / victims | new keys/s (mean) | keys/s min..max per second "
              "| keys at end | evicted | peak RSS | RSS at end | tables at end "
              "| real client p50 / p99 / max ms | its answers denied | victims reset |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        s0, s1 = r.samples[0], r.samples[-1]
        rates = [(b.commands - a.commands) / (b.t - a.t)
                 for a, b in zip(r.samples, r.samples[1:], strict=False) if b.t > a.t]
        mean = (s1.commands - s0.commands) / (s1.t - s0.t) if s1.t > s0.t else 0
        lat = [x * 1000 for x in r.latencies]
        spread = f"{min(rates, default=0):,.0f}..{max(rates, default=0):,.0f}"
        good = (f"{percentile(lat, 0.5):.2f} / {percentile(lat, 0.99):.2f} / "
                f"{max(lat, default=0):.2f}")
        lines.append(
            f"| {r.name} | `{' '.join(r.flood[2:])}` / `{' '.join(r.good)}` "
            f"| {mean:,.0f} | {spread} "
            f"| {s1.keys:,} | {s1.evicted:,} | {max(s.rss for s in r.samples) / MB:.1f} MB "
            f"| {s1.rss / MB:.1f} MB | {s1.dataset / MB:.1f} MB "
            f"| {good} | {r.denied:,} of {r.answers:,} | {r.reset} of {GOOD_KEYS} |")
    for r in runs:
        if not r.maxmemory:
            continue
        base = r.samples[0].rss
        peak = max(s.rss for s in r.samples)
        lines += ["", f"**Slack ({r.name})**: peak RSS {peak / MB:.1f} MB = the bound "
                  f"{r.maxmemory / MB:.0f} MB + {(peak - r.maxmemory) / MB:.1f} MB; the process "
                  f"held {base / MB:.1f} MB before the flood (interpreter, code, empty tables), "
                  f"so the tables and buffers grew by {(peak - base) / MB:.1f} MB. "
                  f"Tables at most {max(s.dataset for s in r.samples) / MB:.2f} MB."]
    for r in runs:
        lines += ["", f"## Over time: {r.name} (stopped by {r.stopped_by})", "",
                  "| s | RSS MB | tables MB | keys | evicted | commands/s |",
                  "|---|---|---|---|---|---|"]
        for a, b in zip(r.samples, r.samples[1:], strict=False):
            rate = (b.commands - a.commands) / (b.t - a.t) if b.t > a.t else 0
            lines.append(f"| {b.t:.0f} | {b.rss / MB:.1f} | {b.dataset / MB:.1f} | {b.keys:,} "
                         f"| {b.evicted:,} | {rate:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1 s per run (unless --seconds and "
                        "--slow-refill-seconds are given)")
    p.add_argument("--seconds", type=float, help="flood length per run (default 90)")
    p.add_argument("--maxmemory", default="200mb", help="the bound of the bounded run")
    p.add_argument("--pipeline", type=int, default=64, help="redis-benchmark -P")
    p.add_argument("--unbounded-cap", type=int, default=2048 * MB,
                   help="RSS (bytes) at which the run without a bound stops")
    p.add_argument("--skip-unbounded", action="store_true")
    p.add_argument("--slow-refill-seconds", type=float,
                   help="length of the slow-refill run (0: none; default 60)")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    p.add_argument("--output", default=str(BENCH_DIR / "results" / "keyflood.md"))
    args = p.parse_args()
    if args.seconds is None:
        args.seconds = 1.0 if args.quick else 90.0
    if args.slow_refill_seconds is None:
        args.slow_refill_seconds = 1.0 if args.quick else 60.0
    units = {"kb": 1024, "mb": MB, "gb": 1024 * MB}
    text = args.maxmemory.lower()
    unit = next((u for u in units if text.endswith(u)), None)
    maxmemory = int(text[:-2]) * units[unit] if unit else int(text)
    runs = []
    with tempfile.TemporaryDirectory(prefix="keyflood-") as tmp:
        runs.append(flood_one(args, Path(tmp), f"maxmemory {args.maxmemory}", maxmemory,
                              args.seconds))
        if not args.skip_unbounded:
            runs.append(flood_one(args, Path(tmp), "no maxmemory", 0, args.seconds))
        if args.slow_refill_seconds:
            runs.append(flood_one(args, Path(tmp), f"slow refill, maxmemory {args.maxmemory}",
                                  maxmemory, args.slow_refill_seconds, SLOW_FLOOD, LOGIN))
    text = report(runs, args)
    print(text)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    Path(args.output).write_text(text)
    for r in runs:           # the headlines, for a terminal
        print(f"{r.name}: {r.denied} of {r.answers} answers denied, "
              f"victims reset {r.reset} of {GOOD_KEYS}", file=sys.stderr)


if __name__ == "__main__":
    main()
