#!/usr/bin/env python3
"""fastlimit's Python clients vs the ``limits`` library, side by side.

One run:
  1. starts fastlimit (this interpreter, ``-m fastlimit.server --port 0
     --rules-db ''``) and a ``redis-server --save "" --appendonly no`` on free
     loopback ports;
  2. networked: from this one process, 100 asyncio tasks on one event loop
     (uvloop if importable) each loop check calls on random keys of a fixed
     key space, all with the same limit, for a fixed time: ``AsyncClient``
     against fastlimit vs ``limits``' async Redis storage (redis-py) against
     redis-server, for each of limits' strategies; interleaved, repeated,
     median taken;
  3. embedded: ``Limiter.check`` vs ``limits``' ``MemoryStorage`` with each
     strategy, in a tight single-threaded loop over the same keys;
  4. prints one markdown table plus the targets, and writes it to
     bench/results/clients.md.

It reports; it does not judge by exit code: a missed target still exits 0.
Needs redis-py and ``limits`` (both in the ``test`` extra).  See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results" / "clients.md"

sys.path.insert(0, str(BENCH_DIR))
# Server start/stop, formatting and machine details are shared with run.py.
from run import (Fastlimit, RedisServer, _terminate, fmt_rps, git_rev, log,  # noqa: E402
                 machine_line, publish, run_cli, target_line, tool_version)

try:
    import fastlimit  # noqa: F401
except ImportError:     # a development tree with an in-place build (make build)
    sys.path.insert(0, str(REPO / "src"))

from fastlimit import AsyncClient, Limiter  # noqa: E402

try:
    import limits
    import limits.aio.storage
    import limits.aio.strategies
    import limits.storage
    import limits.strategies
except ImportError:
    limits = None

try:
    import uvloop
except ImportError:
    uvloop = None

# Defaults: about 2 minutes in all on the 2-core machine.
DEFAULT_ASYNC_S, QUICK_ASYNC_S = 4.0, 1.5          # measured seconds per networked run
DEFAULT_EMBEDDED_S, QUICK_EMBEDDED_S = 2.5, 1.0    # ... per embedded run
ASYNC_WARM_S = 0.5       # unmeasured start of each networked run (connections, keys)
EMBEDDED_WARM_S = 0.3
KEY_SEQUENCE = 100_000   # precomputed random key order, cycled through
CHUNK = 10_000           # embedded loop: the clock is read once per chunk

# limits' strategies, the comparable one first.  A token bucket (capacity C,
# refill C per second) and a sliding window counter both forget past calls
# continuously (tokens come back, the previous window's weight decays) with
# O(1) state per key and no reset at window boundaries; a fixed window resets
# all at once on the boundary, a moving window logs every call (O(C) per key).
STRATEGIES = [
    ("SlidingWindowCounter", "sliding window counter"),
    ("FixedWindow", "fixed window"),
    ("MovingWindow", "moving window"),
]
MAIN = STRATEGIES[0][0]


# ---------------------------------------------------------------------------
# measurements

@dataclass
class Side:
    """One contender in one part: its runs and what they saw."""

    name: str                   # "fastlimit" or a limits strategy
    label: str                  # table text
    backend: str
    rates: list[float] = field(default_factory=list)
    calls: int = 0
    allowed: int = 0
    degraded: int = 0           # calls the backend did not answer (networked)
    errors: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None


def key_sequence(keys: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [f"key:{rng.randrange(keys)}" for _ in range(KEY_SEQUENCE)]


async def run_tasks(call, seq: list[str], tasks: int, warm_s: float, measure_s: float,
                    side: Side, is_allowed) -> float:
    """``tasks`` tasks loop ``await call(key)``; calls/s over the measured
    window, counted when a call completes.  The window starts after
    ``warm_s`` (connections opened, keys created) and ends before the tasks
    are told to stop, so it sees the steady state."""
    done = [0, 0, 0]            # calls, allowed, not answered by the backend
    stop = False
    n = len(seq)

    async def worker(i: int) -> None:
        j = (i * n) // tasks
        while not stop:
            try:
                ok = is_allowed(await call(seq[j]))
            except Exception as e:  # noqa: BLE001 - counted, shown in the report
                done[2] += 1
                if len(side.errors) < 3:
                    side.errors.append(f"{type(e).__name__}: {e}")
                await asyncio.sleep(0.001)
                continue
            j = j + 1 if j + 1 < n else 0
            done[0] += 1
            if ok:
                done[1] += 1
            elif ok is None:
                # Not the backend's answer (fastlimit timed out, or its breaker
                # is open and the call returned at once without yielding):
                # counted apart, and this task yields so it cannot starve the
                # loop and this function's clock.
                done[2] += 1
                await asyncio.sleep(0.001)

    workers = [asyncio.ensure_future(worker(i)) for i in range(tasks)]
    try:
        await asyncio.sleep(warm_s)
        c0, t0 = done[:], time.perf_counter()
        await asyncio.sleep(measure_s)
        c1, t1 = done[:], time.perf_counter()
    finally:
        stop = True
        _, pending = await asyncio.wait(workers, timeout=10)
        for w in pending:          # a backend that stopped answering
            w.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    calls = c1[0] - c0[0]
    side.calls += calls
    side.allowed += c1[1] - c0[1]
    side.degraded += c1[2] - c0[2]
    # Only answered calls count: a fastlimit call that failed open (timeout)
    # or a limits call that raised is not a rate-limit decision.
    return (calls - (c1[2] - c0[2])) / (t1 - t0)


async def networked(args, fl_port: int, rd_port: int, meta: dict) -> list[Side]:
    seq = key_sequence(args.keys)
    cap = refill = args.limit
    client = AsyncClient(servers=f"127.0.0.1:{fl_port}", timeout_ms=args.timeout_ms)
    item = limits.RateLimitItemPerSecond(args.limit)
    fl_check = client.check
    sides = [Side("fastlimit", "fastlimit `AsyncClient.check` (token bucket)",
                  "fastlimit server")]
    calls = {"fastlimit": (lambda k: fl_check(k, cap, refill),
                           lambda d: d.allowed if d.source == "server" else None)}
    storages = []
    for name, text in STRATEGIES:
        # One storage (pool) per strategy, each under its own key prefix:
        # fixed and moving window would otherwise share keys of different types.
        storage = limits.aio.storage.RedisStorage(
            f"async+redis://127.0.0.1:{rd_port}", implementation="redispy",
            key_prefix=f"LIMITS-{name}", socket_timeout=5, socket_connect_timeout=5)
        storages.append(storage)
        hit = getattr(limits.aio.strategies, f"{name}RateLimiter")(storage).hit
        sides.append(Side(name, f"limits async `RedisStorage`, {text}"
                          + (" (comparable)" if name == MAIN else ""), "redis-server"))
        calls[name] = (lambda k, hit=hit: hit(item, k), bool)
    try:
        for _ in range(50):     # the first call also connects, within timeout_ms
            d = await client.check("bench:probe", cap, refill)
            if d.source == "server":
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"fastlimit did not answer the probe: {d}")
        for name, _ in STRATEGIES:
            if not await calls[name][0]("bench:probe"):
                raise RuntimeError(f"limits {name} on redis denied the probe")
        for rep in range(args.repeat):
            order = sides if rep % 2 == 0 else sides[::-1]   # neither side always first
            for side in order:
                call, is_allowed = calls[side.name]
                gc.collect()
                rate = await run_tasks(call, seq, args.tasks, args.warm_async, args.async_s,
                                       side, is_allowed)
                side.rates.append(rate)
                log(f"  [{rep + 1}/{args.repeat}] async    {side.name:22} "
                    f"{fmt_rps(rate):>6} calls/s")
        stats = client.stats.as_dict()
        meta["round_trips"] = stats["round_trips"]
        meta["commands_sent"] = stats["commands_sent"]
    finally:
        await client.aclose()
        for storage in storages:
            redis_client = getattr(getattr(storage, "bridge", None), "storage", None)
            if redis_client is not None:
                await redis_client.aclose()
    return sides


def _loop_limiter(check, seq, cap, refill, deadline):
    calls = 0
    clock = time.perf_counter
    n = len(seq)
    while True:
        for start in range(0, n, CHUNK):
            chunk = seq[start:start + CHUNK]
            for k in chunk:
                check(k, cap, refill)
            calls += len(chunk)
            if clock() >= deadline:
                return calls


def _loop_limits(hit, item, seq, deadline):
    calls = 0
    clock = time.perf_counter
    n = len(seq)
    while True:
        for start in range(0, n, CHUNK):
            chunk = seq[start:start + CHUNK]
            for k in chunk:
                hit(item, k)
            calls += len(chunk)
            if clock() >= deadline:
                return calls


def embedded(args) -> list[Side]:
    seq = key_sequence(args.keys)
    cap = refill = args.limit
    item = limits.RateLimitItemPerSecond(args.limit)
    sides = [Side("fastlimit", "fastlimit `Limiter.check` (token bucket)", "in process")]
    for name, text in STRATEGIES:
        sides.append(Side(name, f"limits `MemoryStorage`, {text}"
                          + (" (comparable)" if name == MAIN else ""), "in process"))
    sample = seq[:CHUNK]
    for rep in range(args.repeat):
        order = sides if rep % 2 == 0 else sides[::-1]
        for side in order:
            storage = None
            if side.name == "fastlimit":
                check = Limiter().check
                def loop(deadline, check=check):
                    return _loop_limiter(check, seq, cap, refill, deadline)
                def allowed(check=check):
                    return sum(check(k, cap, refill).allowed for k in sample)
            else:
                storage = limits.storage.MemoryStorage()
                hit = getattr(limits.strategies, f"{side.name}RateLimiter")(storage).hit
                def loop(deadline, hit=hit):
                    return _loop_limits(hit, item, seq, deadline)
                def allowed(hit=hit):
                    return sum(bool(hit(item, k)) for k in sample)
            try:
                gc.collect()
                loop(time.perf_counter() + args.warm_embedded)    # creates the keys
                t0 = time.perf_counter()
                calls = loop(t0 + args.embedded_s)
                rate = calls / (time.perf_counter() - t0)
                # allowed share: one more chunk at the same pace, counted
                side.allowed += allowed()
                side.calls += len(sample)
            finally:
                if storage is not None:
                    storage.timer.cancel()      # limits' expiry thread
            side.rates.append(rate)
            log(f"  [{rep + 1}/{args.repeat}] embedded {side.name:22} "
                f"{fmt_rps(rate):>6} calls/s")
    return sides


# ---------------------------------------------------------------------------
# report

def spread(side: Side) -> str:
    if len(side.rates) < 2:
        return "–"
    return f"{fmt_rps(min(side.rates))}–{fmt_rps(max(side.rates))}"


def build_report(args, net: list[Side], emb: list[Side], meta: dict) -> str:
    out = ["## fastlimit clients vs the `limits` library", ""]
    out.append(
        f"{meta['when']} · {meta['machine']} · fastlimit at git {meta['rev']} "
        f"({meta['fl_source']}) · limits {meta['limits']} · redis-py {meta['redis_py']} · "
        f"redis-server {meta['redis_version']} · {meta['loop']} event loop · "
        f"{args.keys:,} keys, limit {args.limit:,}/s (capacity {args.limit:,}, refill "
        f"{args.limit:,}/s) · networked: {args.tasks} tasks, {args.async_s:g} s per run · "
        f"embedded: 1 thread, {args.embedded_s:g} s per run · median of {args.repeat} "
        f"interleaved run(s) · {meta['elapsed']:.0f} s in total")
    out.append("")
    out.append("| part | contender | backend | calls/s | spread | allowed "
               "| fastlimit ÷ contender |")
    out.append("|---|---|---|---:|---:|---:|---:|")
    ratios: dict[tuple[str, str], float | None] = {}
    for part, sides in ((f"networked, {args.tasks} asyncio tasks", net),
                        ("embedded, 1 thread", emb)):
        if not sides:
            continue
        fl = sides[0].median
        for side in sides:
            r = None if side is sides[0] or not fl or not side.median else fl / side.median
            ratios[(part.split(",")[0], side.name)] = r
            answered = side.calls - side.degraded
            share = f"{100 * side.allowed / answered:.0f}%" if answered else "–"
            out.append(f"| {part} | {side.label} | {side.backend} | {fmt_rps(side.median)} | "
                       f"{spread(side)} | {share} | "
                       f"{'–' if r is None else f'{r:.2f}×'} |")
    out.append("")

    out.append("Targets (ratios of medians measured side by side in this run; the "
               f"comparable strategy is {MAIN}, the others are shown for honesty):")
    for part, goal, what in (("networked", 3.0, "`AsyncClient` on fastlimit ≥ 3× limits "
                              "on redis-server"),
                             ("embedded", 10.0, "`Limiter` ≥ 10× limits `MemoryStorage`")):
        for name, _ in STRATEGIES:
            if (part, name) not in ratios:
                out.append(f"- {part}: {what}, {name}: **not measured**")
                continue
            mark = " (comparable, the target)" if name == MAIN else ""
            out.append(target_line(f"{part}: {what}, {name}{mark}", ratios[(part, name)],
                                   goal))
    out.append("")

    notes = [meta["error"]] if meta.get("error") else []
    if net and meta.get("round_trips"):
        notes.append(f"`AsyncClient` pipelined {meta['commands_sent']:,} checks into "
                     f"{meta['round_trips']:,} round trips "
                     f"({meta['commands_sent'] / meta['round_trips']:.0f} per pipeline); "
                     "limits sends one command per call, each task on its own pooled "
                     "connection.")
    for side in net + emb:
        if side.degraded:
            notes.append(f"{side.label}: {side.degraded:,} call(s) not answered by the "
                         "backend (timed out, failed open or raised), left out of calls/s"
                         + (f" ({'; '.join(side.errors)})" if side.errors else "") + ".")
    notes.append(
        "Each contender is called through its public API with the same str keys, "
        "`check(key, L, L)` and `hit(RateLimitItemPerSecond(L), key)`. "
        f"{MAIN} is the comparable strategy: like a token bucket it frees capacity "
        "continuously (a sliding window counter's previous window decays linearly), keeps "
        "O(1) state per key and has no all-at-once reset at window boundaries; "
        "FixedWindow is limits' cheapest (one counter), MovingWindow its most exact "
        "(a log of every call). Allowed: the share of calls allowed (networked: all "
        "measured calls; embedded: one extra counted chunk of "
        f"{CHUNK:,} calls after each run). Embedded `MemoryStorage` runs include limits' "
        "own expiry timer thread, as in production.")
    out += [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"short run ({QUICK_ASYNC_S:g} s / {QUICK_EMBEDDED_S:g} s per run, "
                   "1 repeat): under ~40 s")
    p.add_argument("--repeat", type=int,
                   help="interleaved runs per contender, median taken (default 3, 1 with "
                   "--quick)")
    p.add_argument("--async-seconds", dest="async_s", type=float,
                   help=f"measured seconds per networked run (default {DEFAULT_ASYNC_S:g})")
    p.add_argument("--embedded-seconds", dest="embedded_s", type=float,
                   help=f"measured seconds per embedded run (default {DEFAULT_EMBEDDED_S:g})")
    p.add_argument("--tasks", type=int, default=100, help="concurrent asyncio tasks (100)")
    p.add_argument("--keys", type=int, default=10_000, help="key space (10,000)")
    p.add_argument("--limit", type=int, default=1000,
                   help="calls per second per key: capacity and refill (1000)")
    p.add_argument("--timeout-ms", type=float, default=5,
                   help="AsyncClient timeout_ms (5, the client's default)")
    p.add_argument("--skip-networked", action="store_true")
    p.add_argument("--skip-embedded", action="store_true")
    p.add_argument("--no-uvloop", action="store_true", help="plain asyncio loop")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--output", type=Path, default=RESULTS,
                   help="also write the report here (default bench/results/clients.md)")
    args = p.parse_args(argv)
    args.repeat = max(1, args.repeat or (1 if args.quick else 3))
    args.async_s = args.async_s or (QUICK_ASYNC_S if args.quick else DEFAULT_ASYNC_S)
    args.embedded_s = args.embedded_s or (QUICK_EMBEDDED_S if args.quick
                                          else DEFAULT_EMBEDDED_S)
    args.warm_async = min(ASYNC_WARM_S, args.async_s / 3)
    args.warm_embedded = min(EMBEDDED_WARM_S, args.embedded_s / 3)
    return args


def planned_seconds(args) -> float:
    sides = 1 + len(STRATEGIES)
    total = 0.0
    if not args.skip_networked:
        total += 5 + args.repeat * sides * (args.warm_async + args.async_s)
    if not args.skip_embedded:
        total += args.repeat * sides * (args.warm_embedded + args.embedded_s + 0.2)
    return total


WATCHDOG = "watchdog: the run took more than twice its planned time plus a minute"
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)


def _watchdog(signum, frame):
    raise KeyboardInterrupt(WATCHDOG)


def run_networked(args, workdir: Path, meta: dict) -> list[Side]:
    fl = rd = None
    try:
        fl = Fastlimit(workdir, ["--rules-db", ""])
        rd = RedisServer(workdir, args.redis_server)
        fl.wait_ready()
        rd.wait_ready()
        meta["fl_source"] = fl.source
        log(f"fastlimit on port {fl.port} (pid {fl.pid}), redis on port {rd.port} "
            f"(pid {rd.pid})")
        use_uvloop = uvloop is not None and not args.no_uvloop
        meta["loop"] = "uvloop" if use_uvloop else "asyncio"
        loop = uvloop.new_event_loop() if use_uvloop else asyncio.new_event_loop()
        # While the loop runs, SIGTERM, Ctrl-C and the watchdog cancel the
        # measurement, so the tasks stop and the clients close before the
        # servers are stopped; then they unwind as KeyboardInterrupt.
        task = loop.create_task(networked(args, fl.port, rd.port, meta))
        caught: list[int] = []

        def interrupt(signum: int) -> None:
            caught.append(signum)
            task.cancel()

        handlers = {sig: signal.getsignal(sig) for sig in INTERRUPTS}
        for sig in INTERRUPTS:
            loop.add_signal_handler(sig, interrupt, sig)
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if caught:
                raise KeyboardInterrupt(WATCHDOG if caught[0] == signal.SIGALRM
                                        else f"signal {caught[0]}") from None
            raise
        finally:
            for sig, handler in handlers.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)
            loop.close()
    finally:
        for srv in (fl, rd):
            if srv is not None:
                srv.stop()


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)     # unwinds like Ctrl-C: servers stop
    started = time.monotonic()
    # A watchdog for the total time: twice the planned time plus a minute,
    # then it unwinds like Ctrl-C too (servers stopped, exit 130).
    budget = int(2 * planned_seconds(args) + 60)
    signal.signal(signal.SIGALRM, _watchdog)
    signal.alarm(budget)
    if limits is None:
        log("error: the `limits` library is missing: .venv/bin/pip install limits "
            "(it is in fastlimit's `test` extra)")
        return 2
    if not args.skip_networked and not shutil.which(args.redis_server):
        log(f"error: {args.redis_server} not found (make bench installs Debian's "
            "redis-server)")
        return 2
    import redis
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "rev": git_rev(), "redis_version": tool_version(args.redis_server),
            "limits": limits.__version__, "redis_py": redis.__version__,
            "fl_source": "in-process only", "loop": "no"}
    net: list[Side] = []
    emb: list[Side] = []
    with tempfile.TemporaryDirectory(prefix="fastlimit-bench-clients-") as tmp:
        if not args.skip_networked:
            log(f"== networked: {args.tasks} tasks, {args.async_s:g} s per run, "
                f"{args.repeat} repeat(s)")
            try:
                net = run_networked(args, Path(tmp), meta)
            except Exception as e:  # noqa: BLE001 - reported, the other part still runs
                meta["error"] = f"networked part failed: {type(e).__name__}: {e}"
                log(meta["error"])
    if not args.skip_embedded:
        log(f"== embedded: 1 thread, {args.embedded_s:g} s per run, {args.repeat} repeat(s)")
        emb = embedded(args)
    signal.alarm(0)
    meta["elapsed"] = time.monotonic() - started
    report = build_report(args, net, emb, meta)
    publish(report, args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
