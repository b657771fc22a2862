#!/usr/bin/env python3
"""One hot key, three ways side by side: unsplit, split k ways (``SPLIT k``,
README "Splitting a hot key"), and pre-aggregated (the client's
``preaggregate=b``, README "What to do about a hot key today").

One run:
  1. throughput: one hot key on a 3-shard fastlimit cluster (a static slot
     map), driven by several redis-benchmark processes at -P 16 with direct
     connections to the shards: every check on the key's one shard
     (unsplit) against ``SPLIT 3`` with each process on one sub-key's shard
     (the key is picked so that its sub-keys #0..#2 hash to three distinct
     shards).  Checks/s counted by the servers (INFO commandstats), the
     ratio, and each shard's CPU per check from /proc; plus what
     fastlimit.Client in cluster mode (one thread) offers, for scale;
  2. accuracy of the split at a demand equal to the limit, on the manual
     clock (DEBUG CLOCK SET): L = 1,000 per window, k = 1 (a control), 4,
     16 and 32, each window's demand sent at once and answered by the
     server's random choice plus one retry: a token bucket (capacity L,
     refill L per window) and a fixed-window rule (``"split": k``, the
     README's measurement), next to the note's simulated table and the
     README's bound; then demand 2 L, and the most any window admitted;
  3. pre-aggregation against splitting on one bucket, the manual clock
     paced through each window: G gateways (fastlimit.Client with
     ``preaggregate=b``) against the exact bucket and SPLIT k, at a steady
     demand of L and of 2 L per window, and at a quiet window ended by a
     burst of 2 L: admitted against the exact bucket's, the most any
     interval admitted over the bucket's envelope (C + r·T) against G × b,
     the tokens taken and never spent, and the server's CL.CHECKs per
     admitted check;
  4. prints a markdown report and writes it to bench/results/hotkey_split.md.

It reports; it does not judge by exit code.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from fastlimit._cluster import keyslot
from fastlimit.client import Client
from fastlimit.client.split_keys import subkey

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "hotkey_split.md"
sys.path.insert(0, str(BENCH_DIR))
from cluster import cluster_nodes  # noqa: E402
from failover import cpu_seconds  # noqa: E402
from run import (  # noqa: E402
    Fastlimit,
    _die_with_parent,
    _terminate,
    fmt_rps,
    log,
    publish,
    report_meta,
    run_cli,
)

SHARDS = 3
SPLIT = 3                   # part 1: one sub-key per shard
HOT_CAPACITY = 10**12       # part 1: a limit no check reaches, so every check is allowed
WINDOW_MS = 1000
# ../shared/notes/next-features.md §3.3, "A simulation of the same process"
# (200 trials), L = 1,000: k -> (no retry, one retry, formula).
NOTE_TABLE = {4: (0.978, 0.989, 0.978), 16: (0.955, 0.978, 0.951), 32: (0.933, 0.967, 0.930)}
# README "The accuracy bound", measured on the engine (fixed windows), L = 1,000:
# k -> (mean, worst window).
README_TABLE = {4: (0.992, 0.974), 16: (0.977, 0.957), 32: (0.964, 0.947)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="every part in a few seconds at tiny sizes, 1 repeat")
    p.add_argument("--repeat", type=int, help="interleaved runs per side in part 1 (default 5)")
    p.add_argument("--seconds", type=float, help="measured seconds per part-1 run (default 4)")
    p.add_argument("--warmup", type=float, help="unmeasured seconds before each (default 1)")
    p.add_argument("--generators", type=int, default=3,
                   help="redis-benchmark processes in part 1 (default 3)")
    p.add_argument("--clients", type=int, default=16,
                   help="redis-benchmark -c of each process (default 16)")
    p.add_argument("--pipeline", type=int, default=16, help="redis-benchmark -P (default 16)")
    p.add_argument("--limit", type=int, default=1000, help="L, per window (default 1,000)")
    p.add_argument("--ks", default="4,16,32", help="splits measured in part 2")
    p.add_argument("--pa-ks", default="4,16", help="splits measured in part 3")
    p.add_argument("--windows", type=int,
                   help="part 2: windows at demand L per k (default 200)")
    p.add_argument("--over-windows", type=int,
                   help="part 2: windows at demand 2 L per k (default 50)")
    p.add_argument("--gateways", type=int, default=10, help="part 3: G (default 10)")
    p.add_argument("--batches", default="10,50,100", help="part 3: b of the gateways")
    p.add_argument("--pa-windows", type=int, help="part 3: windows per row (default 20)")
    p.add_argument("--steps", type=int, help="part 3: clock steps per window (default 50)")
    p.add_argument("--seed", type=int, default=1, help="part 3's demand sequence")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    q = args.quick
    defaults = {"repeat": (1, 5), "seconds": (1.0, 4.0), "warmup": (0.3, 1.0),
                "windows": (5, 200), "over_windows": (2, 50), "pa_windows": (2, 20),
                "steps": (10, 50)}
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    args.ks = [int(k) for k in args.ks.split(",") if k.strip()]
    args.pa_ks = [int(k) for k in args.pa_ks.split(",") if k.strip()]
    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    return args


# ---------------------------------------------------------------------------
# 1. throughput over a 3-shard cluster

def shard_of(slot: int, shards: int = SHARDS) -> int:
    """The shard of a slot in bench/cluster.py's map (slots split evenly)."""
    return max(i for i in range(shards) if i * 16384 // shards <= slot)


def pick_hot_key(k: int = SPLIT, shards: int = SHARDS) -> bytes:
    """The first hot:N whose k sub-keys (the client's naming) are on k distinct shards."""
    for n in range(100_000):
        key = b"hot:%d" % n
        if len({shard_of(keyslot(subkey(key, i)), shards) for i in range(k)}) == min(k, shards):
            return key
    raise RuntimeError("no key found whose sub-keys are on distinct shards")


def check_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_cl.check", {}).get("calls", 0))


def shed_checks(client: redis.Redis) -> int | None:
    """Checks the node shed under overload (INFO stats shed_checks_*), None
    from a build that does not shed."""
    found = [v for k, v in client.info("stats").items() if k.startswith("shed_checks")]
    return sum(int(v) for v in found) if found else None


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]                      # idle, iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks[:8]) - idle) / hz, sum(ticks[:8]) / hz


class Counters:
    """CL.CHECK calls and CPU seconds of every node, of the load
    generators and of the machine, between two samples."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.clients = [n.client() for n in nodes]

    def sample(self, pids: list[int] = ()) -> tuple:
        return (time.monotonic(), [check_calls(c) for c in self.clients],
                [cpu_seconds(n.pid) for n in self.nodes], sum(cpu_seconds(p) for p in pids),
                machine_cpu_seconds(), [shed_checks(c) for c in self.clients])

    @staticmethod
    def delta(a, b) -> dict:
        return {"secs": b[0] - a[0], "checks": [y - x for x, y in zip(a[1], b[1], strict=True)],
                "cpu": [y - x for x, y in zip(a[2], b[2], strict=True)],
                "generators": b[3] - a[3], "busy": b[4][0] - a[4][0],
                "machine": b[4][1] - a[4][1],
                "shed": None if None in b[5] else sum(b[5]) - sum(a[5])}


def generator_load(args, nodes, counters: Counters, targets: list[tuple[int, list[str]]]) -> dict:
    """redis-benchmark processes, one per (shard, command), running; counted
    for args.seconds after args.warmup, then stopped."""
    procs = []
    try:
        for shard, command in targets:
            procs.append(subprocess.Popen(
                [args.redis_benchmark, "-h", "127.0.0.1", "-p", str(nodes[shard].port),
                 "-c", str(args.clients), "-n", "2000000000", "-P", str(args.pipeline), "-q",
                 *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent))
        time.sleep(args.warmup)
        pids = [proc.pid for proc in procs]
        first = counters.sample(pids)
        time.sleep(args.seconds)
        second = counters.sample(pids)
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-benchmark exited with {proc.returncode}: "
                                   f"{proc.stderr.read().decode(errors='replace')[-300:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
            proc.stderr.close()
    return Counters.delta(first, second)


def client_load(seconds: float, port: int, counters: Counters, key: bytes, split: int) -> dict:
    """fastlimit.Client in cluster mode, one thread, one check at a time."""
    with Client(cluster=f"127.0.0.1:{port}", timeout_ms=2000, breaker=None) as client:
        for _ in range(100):                    # the map and the connections
            client.check(key, HOT_CAPACITY, HOT_CAPACITY, split=split)
        first = counters.sample()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(50):
                client.check(key, HOT_CAPACITY, HOT_CAPACITY, on_failure="closed", split=split)
        second = counters.sample()
    return Counters.delta(first, second)


def hot_commands(key: bytes, k: int) -> list[list[str]]:
    cap = str(HOT_CAPACITY)
    if k == 1:
        return [["CL.CHECK", key.decode(), cap, cap]]
    return [["CL.CHECK", subkey(key, i).decode(), cap, cap, "SPLIT", str(k)] for i in range(k)]


def throughput(args, workdir: Path) -> dict:
    key = pick_hot_key()
    subs = [subkey(key, i) for i in range(SPLIT)]
    layout = {"key": key, "slot": keyslot(key), "shard": shard_of(keyslot(key)),
              "subs": [(s, keyslot(s), shard_of(keyslot(s))) for s in subs]}
    log(f"  hot key {key.decode()} (slot {layout['slot']}, fl-{layout['shard']}); sub-keys "
        + ", ".join(f"{s.decode()} (slot {slot}, fl-{shard})" for s, slot, shard in
                    layout["subs"]))
    nodes = cluster_nodes(workdir, SHARDS, "hot")
    try:
        counters = Counters(nodes)
        # each command is answered (allowed) by the shard it is sent to: no -MOVED
        plain = hot_commands(key, 1)[0]
        split = hot_commands(key, SPLIT)
        for shard, command in [(layout["shard"], plain),
                               *((sub[2], cmd) for sub, cmd in zip(layout["subs"], split,
                                                                   strict=True))]:
            reply = nodes[shard].client().execute_command(*command)
            if reply[0] != 1:
                raise RuntimeError(f"fl-{shard} answered {reply!r} to {' '.join(command)}")
        sides = {
            "unsplit": [(layout["shard"], plain)] * args.generators,
            f"SPLIT {SPLIT}": [(layout["subs"][i % SPLIT][2], split[i % SPLIT])
                               for i in range(args.generators)],
        }
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for rep in range(args.repeat):
            order = list(sides.items())[::-1 if rep % 2 else 1]
            for side, targets in order:
                d = generator_load(args, nodes, counters, targets)
                runs[side].append(d)
                log(f"  [{rep + 1}/{args.repeat}] {side:8} {fmt_rps(sum(d['checks']) / d['secs'])}"
                    f" checks/s, per shard {d['checks']}")
        client_secs = 0.3 if args.quick else 1.0
        client_runs = {side: client_load(client_secs, nodes[0].port, counters, key, k)
                       for side, k in (("unsplit", 1), (f"SPLIT {SPLIT}", SPLIT))}
    finally:
        for node in nodes:
            node.stop()
    return {"layout": layout, "runs": runs, "client": client_runs}


# ---------------------------------------------------------------------------
# 2. accuracy at demand = L on the manual clock

class Clock:
    """The server's manual clock, and the same time for the client's side."""

    def __init__(self, client: redis.Redis, start_ms: int = 0):
        self.client = client
        self.ms = start_ms
        self.set(start_ms)

    def set(self, ms: int) -> None:
        self.ms = ms
        self.client.execute_command("DEBUG", "CLOCK", "SET", ms)

    def seconds(self) -> float:
        return self.ms / 1000


def pipelined(client: redis.Redis, command: tuple, n: int) -> list:
    pipe = client.pipeline(transaction=False)
    for _ in range(n):
        pipe.execute_command(*command)
    return pipe.execute()


def windows_admitted(client: redis.Redis, clock: Clock, command: tuple, demand: int,
                     windows: int) -> list[int]:
    """Per window: the clock moves one window on, then demand checks at once."""
    out = []
    for _ in range(windows):
        clock.set(clock.ms + WINDOW_MS)
        out.append(sum(reply[0] for reply in pipelined(client, command, demand)))
    return out


def accuracy(args, workdir: Path) -> dict:
    node = Fastlimit(workdir, ["--manual-clock"])
    L = args.limit
    out: dict[tuple[str, int, int], list[int]] = {}
    try:
        node.wait_ready()
        c = node.client()
        clock = Clock(c)
        for k in [1, *args.ks]:
            split = ("SPLIT", k) if k > 1 else ()
            c.execute_command("CL.RULE", "SET", f"hot{k}", json.dumps(
                {"match": {"resource": f"acc{k}"}, "algorithm": "fixed_window", "limit": L,
                 "window_ms": WINDOW_MS, **({"split": k} if k > 1 else {})}))
            for mult, windows in ((1, args.windows), (2, args.over_windows)):
                tb = ("CL.CHECK", f"acc:tb:{k}:{mult}", L, L, *split)
                fw = ("CL.LIMIT", f"tenant-{mult}", f"acc{k}")
                for algo, command in (("token bucket", tb), ("fixed window", fw)):
                    got = windows_admitted(c, clock, command, mult * L, windows)
                    out[(algo, k, mult)] = got
                    log(f"  k={k:<2} {algo:12} demand {mult}L: mean {statistics.mean(got) / L:.3f}"
                        f", min {min(got)}, max {max(got)} ({windows} windows)")
    finally:
        node.stop()
    return out


# ---------------------------------------------------------------------------
# 3. pre-aggregation vs split, paced through each window

def envelope_excess(per_step: list[int], limit: int, steps: int) -> float:
    """The most any run of consecutive steps admitted over the bucket's
    envelope C + r·T (C = limit, r = limit per window, T the time from its
    first step to its last): max over s < t of A(t) - A(s) - L - L·(t-s-1)/S."""
    best = -math.inf
    cum, low = 0.0, 0.0                 # f(j) = A(j) - L·j/S; low = min over s < t
    for j, n in enumerate(per_step, 1):
        cum += n
        f = cum - limit * j / steps
        best = max(best, f - low - limit + limit / steps)
        low = min(low, f)
    return best


def shapes(args) -> dict[str, list[tuple[int, bool]]]:
    """Per window, per clock step: (checks, one per gateway in turn rather
    than each to a random one)."""
    L, S, G = args.limit, args.steps, args.gateways
    return {
        "steady, L": [(L // S, False)] * S,
        "steady, 2 L": [(2 * L // S, False)] * S,
        # every gateway sees one check early in the window, and takes a
        # batch; the bucket refills; then a burst at the window's end
        "quiet, then 2 L at once": [(G, True)] + [(0, False)] * (S - 2) + [(2 * L, False)],
    }


def paced(args, clock: Clock, window: list[tuple[int, bool]], answer) -> list[int]:
    """args.pa_windows windows of args.steps steps: at each step the clock
    moves on and answer(n, in_turn) admits some of the step's n checks."""
    dt = WINDOW_MS // args.steps
    out = []
    for _ in range(args.pa_windows):
        for n, in_turn in window:
            clock.set(clock.ms + dt)
            out.append(answer(n, in_turn) if n else 0)
    return out


def preaggregation(args, workdir: Path) -> dict:
    if WINDOW_MS % args.steps or args.steps < 3:
        raise SystemExit(f"--steps must divide {WINDOW_MS} and be at least 3")
    node = Fastlimit(workdir, ["--manual-clock"])
    L, G = args.limit, args.gateways
    rows = []
    try:
        node.wait_ready()
        c = node.client()
        clock = Clock(c, 10 * WINDOW_MS)
        for shape, window in shapes(args).items():
            for scheme, k, b in ([("exact", 1, 0)] + [(f"SPLIT {k}", k, 0) for k in args.pa_ks]
                                 + [(f"G = {G}, b = {b}", 1, b) for b in args.batches]):
                key = f"pa:{scheme}:{shape}".replace(" ", "")
                calls0 = check_calls(c)
                extra = {}
                if b == 0:
                    command = ("CL.CHECK", key, L, L, *(("SPLIT", k) if k > 1 else ()))
                    per_step = paced(args, clock, window, lambda n, _, command=command: sum(
                        reply[0] for reply in pipelined(c, command, n)))
                else:
                    per_step, extra = gateways(args, node.port, clock, key, b, window)
                calls = check_calls(c) - calls0
                admitted = sum(per_step)
                demand = sum(n for n, _ in window) * args.pa_windows
                rows.append({"shape": shape, "scheme": scheme, "k": k, "b": b,
                             "demand": demand, "admitted": admitted,
                             "excess": envelope_excess(per_step, L, args.steps),
                             "calls": calls, **extra})
                log(f"  {shape:24} {scheme:16} admitted {admitted:,} of {demand:,}, "
                    f"{calls:,} CL.CHECKs, envelope excess {rows[-1]['excess']:+.0f}"
                    + (f", never spent {extra['stranded']:,}" if extra else ""))
    finally:
        node.stop()
    return {"rows": rows}


def gateways(args, port: int, clock: Clock, key: str, b: int, window):
    """G clients with preaggregate=b; each check goes to a random one (or
    to each in turn).  Their pre-fetched tokens expire by the server's
    (manual) time, and each granted batch is counted, for the tokens taken
    and never spent."""
    rng = random.Random(args.seed)
    batches = [0] * args.gateways
    clients = []
    try:
        for g in range(args.gateways):
            client = Client(f"127.0.0.1:{port}", timeout_ms=2000, breaker=None,
                            preaggregate=b)
            prefetch = client._prefetch
            prefetch.clock = clock.seconds

            def counted(bucket, tokens, granted, g=g, keep=prefetch.keep):
                batches[g] += 1
                return keep(bucket, tokens, granted)

            prefetch.keep = counted
            clients.append(client)
        L, G = args.limit, args.gateways

        def answer(n: int, in_turn: bool) -> int:
            picks = (i % G for i in range(n)) if in_turn else (rng.randrange(G) for _ in range(n))
            return sum(clients[g].check(key, L, L, on_failure="closed").allowed for g in picks)

        per_step = paced(args, clock, window, answer)
        prefetched = sum(cl.stats.prefetched for cl in clients)
        failed = sum(cl.stats.errors + cl.stats.failed_open + cl.stats.failed_closed
                     for cl in clients)
    finally:
        for client in clients:
            client.close()
    # Each granted batch admits the call that took it and keeps b - 1;
    # what was kept and not spent from it later was taken for nothing.
    return per_step, {"stranded": sum(batches) * (b - 1) - prefetched,
                      "batches": sum(batches), "failed": failed}


# ---------------------------------------------------------------------------
# report

def throughput_lines(args, tp: dict) -> list[str]:
    lay = tp["layout"]
    lines = ["## 1. Throughput: one hot key on a 3-shard cluster", "",
             f"Three fastlimit primaries, a static slot map (16384 slots split evenly, as "
             f"bench/cluster.py). The hot key `{lay['key'].decode()}` is in slot {lay['slot']} "
             f"(fl-{lay['shard']}); its sub-keys "
             + ", ".join(f"`{s.decode()}` (slot {slot}, fl-{shard})"
                         for s, slot, shard in lay["subs"])
             + " are on three distinct shards (`fastlimit._cluster.keyslot`). Load: "
             f"{args.generators} redis-benchmark processes, each `-c {args.clients} "
             f"-P {args.pipeline}` on direct connections, `CL.CHECK <key> 10^12 10^12` "
             "(a limit no check reaches: every check allowed): unsplit, all on the key's "
             f"shard; `SPLIT {SPLIT}`, process i on sub-key #i's shard with "
             f"`CL.CHECK <key>#i 10^12 10^12 SPLIT {SPLIT}`. Checks counted by the servers "
             f"(`INFO commandstats`) over {args.seconds:g} s after {args.warmup:g} s of warm-up, "
             f"{args.repeat} interleaved run(s) per side; CPU is each server's utime+stime "
             "(/proc) over the same interval, per check it served.", "",
             "| key | checks/s (median) | min–max | checks per shard fl-0 / fl-1 / fl-2 | "
             "CPU µs/check fl-0 | fl-1 | fl-2 | all servers | busiest shard's CPU per "
             "hot-key check |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    med = {}
    for side, runs in tp["runs"].items():
        rates = [sum(r["checks"]) / r["secs"] for r in runs]
        checks = [sum(r["checks"][i] for r in runs) for i in range(SHARDS)]
        cpu = [sum(r["cpu"][i] for r in runs) for i in range(SHARDS)]
        total = sum(checks)
        per = [f"{cpu[i] / checks[i] * 1e6:.3f}" if checks[i] > total / 100 else "–"
               for i in range(SHARDS)]
        busiest = max(cpu) / total * 1e6
        med[side] = (statistics.median(rates), busiest)
        share = " / ".join(f"{x / total:.0%}" for x in checks)
        lines.append(f"| {side} | {fmt_rps(med[side][0])} | {fmt_rps(min(rates))}–"
                     f"{fmt_rps(max(rates))} | {share} | {' | '.join(per)} | "
                     f"{sum(cpu) / total * 1e6:.3f} | {busiest:.3f} |")
    lines += ["", "Where the 2 cores went over the same intervals (medians of the runs; /proc):",
              "", "| key | the 3 servers | the redis-benchmark processes | whole machine busy "
              "| anything else (this script, other work on the machine) |",
              "|---|---:|---:|---:|---:|"]
    for side, runs in tp["runs"].items():
        def cores(f, runs=runs):
            return statistics.median(f(r) / r["secs"] for r in runs)
        servers, gens = cores(lambda r: sum(r["cpu"])), cores(lambda r: r["generators"])
        busy = cores(lambda r: r["busy"])
        total = cores(lambda r: r["machine"])
        lines.append(f"| {side} | {servers:.2f} cores | {gens:.2f} cores | {busy:.2f} of "
                     f"{total:.2f} cores | {busy - servers - gens:.2f} cores |")
    (u_rate, u_busy), (s_rate, s_busy) = med["unsplit"], med[f"SPLIT {SPLIT}"]
    shed = {side: [r["shed"] for r in runs] for side, runs in tp["runs"].items()}
    lines += ["",
              "- Checks shed under overload (`INFO stats` `shed_checks_*`, counted among the "
              "checks above though they touch no bucket): "
              + ("not reported by this build" if any(None in v for v in shed.values()) else
                 "; ".join(f"{side} {sum(v):,}" for side, v in shed.items())) + ".",
              f"- **SPLIT {SPLIT} ÷ unsplit: {s_rate / u_rate:.2f}×** the checks/s on this "
              "machine, where the generators and the three servers share 2 cores.",
              f"- The key's ceiling with one core per shard (1 s ÷ the busiest shard's CPU per "
              f"check of the key): unsplit {fmt_rps(1e6 / u_busy)}/s, split "
              f"{fmt_rps(1e6 / s_busy)}/s (**{u_busy / s_busy:.2f}×**, derived, not measured).",
              ""]
    lines += ["For scale, fastlimit.Client in cluster mode (`check(key, ..., split=k)`: a "
              "random sub-key, routed by the slot map), one thread, one check per round trip:",
              "", "| client | checks/s | checks per shard fl-0 / fl-1 / fl-2 |",
              "|---|---:|---|"]
    for side, d in tp["client"].items():
        total = sum(d["checks"])
        lines.append(f"| Client, {side} | {fmt_rps(total / d['secs'])} | "
                     + " / ".join(f"{x / max(total, 1):.0%}" for x in d["checks"]) + " |")
    lines += ["", "redis-benchmark processes, not the Client, are what offers the highest load "
              "here; the Client row shows its own split path spreading the key over the "
              "shards.", ""]
    return lines


def accuracy_lines(args, acc: dict) -> list[str]:
    L = args.limit
    lines = ["## 2. Accuracy of a split at demand = the limit", "",
             f"One node on the manual clock. L = {L:,} per {WINDOW_MS} ms window; each window "
             f"the clock moves one window on (`DEBUG CLOCK SET`) and the window's demand is "
             "sent at once, a plain key, so the server draws the sub-bucket and retries one "
             "other when it is empty. Token bucket: `CL.CHECK <key> "
             f"{L} {L} SPLIT k` (capacity L, refill L per window; a sub-bucket gets "
             "C div k, +1 for the first C mod k, and refills L/k per window). Fixed window: "
             f"a rule `{{\"algorithm\": \"fixed_window\", \"limit\": {L}, \"window_ms\": "
             f"{WINDOW_MS}, \"split\": k}}` over `CL.LIMIT` (the README's setting). "
             f"{args.windows} windows at demand L and {args.over_windows} at 2 L, per k and "
             "algorithm.", "",
             "| k | per sub-bucket | token bucket: mean | worst window | fixed window: mean "
             "| worst window | no retry, formula 1 − 0.4·√((k−1)/L) | note's simulation: no "
             "retry | one retry | README measured (fixed window): mean | worst |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in [1, *args.ks]:
        tb, fw = acc[("token bucket", k, 1)], acc[("fixed window", k, 1)]
        note = NOTE_TABLE.get(k) if L == 1000 else None
        readme = README_TABLE.get(k) if L == 1000 else None
        formula = 1 - 0.4 * math.sqrt((k - 1) / L)
        lines.append(
            f"| {k} | {L // k}{'–' + str(L // k + 1) if L % k else ''} | "
            f"{statistics.mean(tb) / L:.3f} | {min(tb) / L:.3f} | "
            f"{statistics.mean(fw) / L:.3f} | {min(fw) / L:.3f} | {formula:.3f} | "
            + (f"{note[0]:.3f} | {note[1]:.3f} |" if note else "– | – |")
            + (f" {readme[0]:.3f} | {readme[1]:.3f} |" if readme else " – | – |"))
    most = max(max(v) for v in acc.values())
    lines += ["", "The upper bound (README: \"at most the limit, always\"; the shares add up "
              "to L, the rates to L per window):", "",
              "| k | demand 2 L, token bucket: mean | min | max | fixed window: mean | min | "
              "max | most admitted in any window, every run of this k |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in [1, *args.ks]:
        tb, fw = acc[("token bucket", k, 2)], acc[("fixed window", k, 2)]
        top = max(max(acc[(a, k, m)]) for a in ("token bucket", "fixed window") for m in (1, 2))
        lines.append(f"| {k} | {statistics.mean(tb) / L:.3f} | {min(tb):,} | {max(tb):,} | "
                     f"{statistics.mean(fw) / L:.3f} | {min(fw):,} | {max(fw):,} | {top:,} |")
    lines += ["", f"- Most admitted in any window of any run: **{most:,}** against L = {L:,}: "
              + ("**never more than L**." if most <= L else "**MORE THAN L**."), ""]
    return lines


def preaggregation_lines(args, pa: dict) -> list[str]:
    L, G, S = args.limit, args.gateways, args.steps
    dt = WINDOW_MS // S
    lines = ["## 3. Pre-aggregation against splitting, one bucket", "",
             f"One node on the manual clock; a token bucket of capacity C = L = {L:,}, refill "
             f"r = L per {WINDOW_MS} ms. {args.pa_windows} windows per row, the clock moved in "
             f"{S} steps of {dt} ms per window, each step's checks sent at that instant. "
             f"exact: `CL.CHECK key {L} {L}`; SPLIT k: the same with `SPLIT k` (a plain key: "
             f"the server draws, one retry; on one node every sub-bucket is within reach of the "
             f"retry); G = {G} gateways: one `fastlimit.Client(preaggregate=b)` each (the "
             "default 1 s `preaggregate_ttl_ms`, its expiry read from the server's manual "
             "time). A gateway takes b tokens with one `CL.CHECK ... COST b` and spends them "
             "locally; once a batch is refused it asks for one token per check until the ttl "
             "passes. Demand per window:", "",
             f"- *steady, L* and *steady, 2 L*: L/{S} (2 L/{S}) checks at every step, each to a "
             f"random gateway (seed {args.seed});",
             "- *quiet, then 2 L at once*: one check per gateway at the window's first step "
             "(each takes a batch), nothing while the bucket refills, then 2 L checks at its "
             "last step, each to a random gateway: the case the G × b bound is about.", "",
             "Columns: *admitted ÷ exact's*, against the exact bucket on the same demand; "
             "*envelope excess*, the most any run of consecutive steps admitted over what the "
             "bucket itself can give in that time, C + r·T (0 or less is exact; "
             "pre-aggregation's bound is G × b: tokens taken before the run, spent in it); "
             "*taken, never spent*, tokens the server granted in batches that no check used "
             "(expired in a gateway, or held at the end), per window; *CL.CHECKs per admitted*, "
             "the server's `CL.CHECK` count over the row ÷ the checks admitted (denied checks "
             "cost one too).", "",
             "| demand per window | scheme | admitted ÷ demand | admitted ÷ exact's | envelope "
             "excess, most | bound | taken, never spent, per window | CL.CHECKs per admitted "
             "check |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    exact = {r["shape"]: r["admitted"] for r in pa["rows"] if r["scheme"] == "exact"}
    for r in pa["rows"]:
        bound = f"G × b = {G * r['b']:,}" if r["b"] else "0"
        stranded = (f"{r['stranded'] / args.pa_windows:,.1f}" if r["b"] else "–")
        lines.append(f"| {r['shape']} | {r['scheme']} | {r['admitted'] / r['demand']:.3f} | "
                     f"{r['admitted'] / exact[r['shape']]:.3f} | {r['excess']:+,.0f} | {bound} | "
                     f"{stranded} | {r['calls'] / max(r['admitted'], 1):.3f} |")
    failed = sum(r.get("failed", 0) for r in pa["rows"])
    over = [r for r in pa["rows"] if r["excess"] > (G * r["b"] if r["b"] else 0)]
    lines += ["", "- Rows over their bound: "
              + (", ".join(f"{r['shape']} / {r['scheme']}" for r in over) if over else "none")
              + ".",
              f"- Gateways' failed or unanswered calls: {failed} (each call waits up to "
              "2 s and fails closed, so no check is admitted without the server).",
              "- `CL.ACQUIRE` is the concurrency-lease command (a lease given back with "
              "`CL.RELEASE`), not a batch of tokens: fastlimit's pre-aggregation is the "
              "client's `preaggregate=b`, measured here.", ""]
    return lines


def build_report(args, tp: dict, acc: dict, pa: dict, meta: dict) -> str:
    lines = ["# fastlimit: a hot key, split against unsplit and against pre-aggregation", "",
             f"{meta['when']} · {meta['machine']} · rev {meta['rev']} · "
             f"{meta['elapsed']:.0f} s{' · --quick' if args.quick else ''}", "",
             *throughput_lines(args, tp), *accuracy_lines(args, acc),
             *preaggregation_lines(args, pa)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    if not shutil.which(args.redis_benchmark):
        log(f"error: {args.redis_benchmark} not found (make bench installs redis-tools)")
        return 2
    started = time.monotonic()
    meta = report_meta()
    with tempfile.TemporaryDirectory(prefix="fastlimit-bench-hotkey-") as tmp:
        workdir = Path(tmp)
        log(f"== 1. a hot key on {SHARDS} shards: unsplit vs SPLIT {SPLIT}")
        tp = throughput(args, workdir)
        log("== 2. accuracy at demand = L, manual clock")
        acc = accuracy(args, workdir)
        log(f"== 3. pre-aggregation (G = {args.gateways}) vs split, paced")
        pa = preaggregation(args, workdir)
    meta["elapsed"] = time.monotonic() - started
    publish(build_report(args, tp, acc, pa, meta), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
