#!/usr/bin/env python3
"""What a standby costs the primary, and how far behind it runs.

One run:
  1. starts two fastlimit primaries on free loopback ports, one alone and
     one with a replica attached (``--replicaof``);
  2. runs redis-benchmark ``-P 16 -c 50 CL.CHECK key:__rand_int__ 100 10``
     against both, interleaved (the order flipping on every repeat): the
     ratio of their medians is the cost of the standby;
  3. drives the primary with the standby at half the rate it reached, at a
     steady pace, for a few seconds, and reads the replica's lag histogram:
     for every change, the time from the primary's write (the oldest in its
     batch) to the batch being applied on the replica, both on this
     machine's wall clock, weighted by the records in the batch;
  4. prints a markdown report and writes it to bench/results/replication.md.

It reports; it does not judge by exit code.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "replication.md"

sys.path.insert(0, str(BENCH_DIR))
from run import (Fastlimit, _terminate, fmt_rps, git_rev, log, machine_line,  # noqa: E402
                 median_result, publish, run_benchmark, run_cli, target_line)

CHECK = ["CL.CHECK", "key:__rand_int__", "100", "10"]
RANDOM_KEYS = 1_000_000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="300,000 requests per run, 1 repeat, 3 s of lag")
    p.add_argument("--repeat", type=int, help="interleaved runs per side (default 3)")
    p.add_argument("--n16", type=int, help="requests per redis-benchmark run (default 2,000,000)")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--lag-seconds", type=float, help="steady load for the lag (default 8)")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.repeat = max(1, args.repeat or (1 if args.quick else 3))
    args.n16 = args.n16 or (300_000 if args.quick else 2_000_000)
    args.lag_seconds = args.lag_seconds or (3.0 if args.quick else 8.0)
    return args


def wait_link_up(replica: Fastlimit, timeout: float = 30.0) -> None:
    c = replica.client()
    deadline = time.monotonic() + timeout
    while c.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError("the replica never came up:\n" + replica.log_tail())
        time.sleep(0.05)
    c.close()


def throughput(args, alone: Fastlimit, primary: Fastlimit) -> dict:
    runs = {"alone": [], "standby": []}
    warm = max(10_000, args.n16 // 20)
    for srv in (alone, primary):
        run_benchmark(args.redis_benchmark, srv.port, args.clients, warm, 16, CHECK, RANDOM_KEYS)
    for rep in range(args.repeat):
        order = [("alone", alone), ("standby", primary)]
        if rep % 2:
            order.reverse()
        for who, srv in order:
            res = run_benchmark(args.redis_benchmark, srv.port, args.clients, args.n16, 16,
                                CHECK, RANDOM_KEYS)
            runs[who].append(res)
            log(f"  [{rep + 1}/{args.repeat}] P=16 {who:8} {fmt_rps(res.rps):>6} req/s  "
                f"p50 {res.p50:.3f}  p99 {res.p99:.3f} ms")
    return {who: median_result(results) for who, results in runs.items()} | {"runs": runs}


def paced_load(port: int, rate: float, seconds: float) -> tuple[int, int, float]:
    """CL.CHECKs on random keys at `rate` per second, sent in a pipelined
    burst every millisecond, replies read as they come.  Returns (sent,
    replies, seconds)."""
    rng = random.Random(1)
    per_ms = max(1, int(rate / 1000))
    bursts = [b"".join(_check(b"key:%012d" % rng.randrange(RANDOM_KEYS)) for _ in range(per_ms))
              for _ in range(64)]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    sent = replies = 0
    start = time.monotonic()
    end = start + seconds
    i = 0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        while sent < rate * (now - start):
            _send_all(sock, bursts[i % len(bursts)])
            sent += per_ms
            i += 1
        replies += _drain(sock)
        time.sleep(0.0005)
    deadline = time.monotonic() + 10
    while replies < sent and time.monotonic() < deadline:
        replies += _drain(sock)
        time.sleep(0.001)
    elapsed = time.monotonic() - start
    sock.close()
    return sent, replies, elapsed


def _check(key: bytes) -> bytes:
    args = [b"CL.CHECK", key, b"100", b"10"]
    return b"*4\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _send_all(sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            time.sleep(0.0002)


def _drain(sock: socket.socket) -> int:
    got = 0
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return got
        if not chunk:
            return got
        got += chunk.count(b"*5\r\n")


def lag(args, primary: Fastlimit, replica: Fastlimit, max_rate: float) -> dict:
    rate = max_rate / 2
    r = replica.client()
    r.config_resetstat()
    sent, replies, secs = paced_load(primary.port, rate, args.lag_seconds)
    time.sleep(0.2)     # the last batch
    info = r.info("replication")
    r.close()
    out = {"rate": rate, "sent": sent, "replies": replies, "secs": secs,
           "achieved": replies / secs}
    out.update({k: info[k] for k in ("repl_lag_p50_ms", "repl_lag_p99_ms", "repl_lag_max_ms",
                                     "repl_lag_records")})
    log(f"  lag at {fmt_rps(rate)} req/s (achieved {fmt_rps(out['achieved'])}): "
        f"p50 {out['repl_lag_p50_ms']} ms, p99 {out['repl_lag_p99_ms']} ms, "
        f"max {out['repl_lag_max_ms']} ms over {out['repl_lag_records']:,} records")
    return out


def build_report(args, tp: dict, lg: dict, meta: dict) -> str:
    alone, standby = tp["alone"], tp["standby"]
    ratio = standby.rps / alone.rps if alone and standby else None
    out = ["# fastlimit: a standby's cost and lag", "",
           f"{meta['when']} · {meta['machine']} · rev {meta['rev']} · "
           f"{meta['elapsed']:.0f} s", "",
           f"redis-benchmark `-c {args.clients} -P 16 -n {args.n16:,} -r {RANDOM_KEYS:,} "
           f"{' '.join(CHECK)}`, {args.repeat} interleaved run(s) per side, medians:", "",
           "| primary | req/s | p50 ms | p99 ms |", "|---|---:|---:|---:|",
           f"| alone | {fmt_rps(alone.rps)} | {alone.p50:.3f} | {alone.p99:.3f} |",
           f"| with a standby attached | {fmt_rps(standby.rps)} | {standby.p50:.3f} | "
           f"{standby.p99:.3f} |", "",
           "Spread: alone " + ", ".join(fmt_rps(x.rps) for x in tp["runs"]["alone"]) +
           "; with standby " + ", ".join(fmt_rps(x.rps) for x in tp["runs"]["standby"]) + ".",
           "",
           f"Lag: {lg['secs']:.1f} s of `CL.CHECK` on random keys paced at "
           f"{fmt_rps(lg['rate'])} req/s (half the rate above; achieved "
           f"{fmt_rps(lg['achieved'])}, {lg['replies']:,}/{lg['sent']:,} replies); the "
           f"replica's histogram over {lg['repl_lag_records']:,} changes: p50 "
           f"{lg['repl_lag_p50_ms']} ms, p99 {lg['repl_lag_p99_ms']} ms, max "
           f"{lg['repl_lag_max_ms']} ms.", "",
           "Targets (measured side by side in this run):",
           target_line("P=16 CL.CHECK with a standby ≥ 0.8× without", ratio, 0.8),
           target_line("99% of changes on the standby within 50 ms (p99 lag)",
                       lg["repl_lag_p99_ms"], 50.0, higher_is_better=False, unit="ms"),
           ""]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    if not shutil.which(args.redis_benchmark):
        log(f"error: {args.redis_benchmark} not found (make bench installs redis-tools)")
        return 2
    started = time.monotonic()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "rev": git_rev()}
    servers = []
    try:
        with tempfile.TemporaryDirectory(prefix="fastlimit-bench-repl-") as tmp:
            workdir = Path(tmp)
            alone = Fastlimit(workdir)
            primary = Fastlimit(workdir)
            servers += [alone, primary]
            alone.wait_ready()
            primary.wait_ready()
            replica = Fastlimit(workdir, ["--replicaof", "127.0.0.1", str(primary.port)])
            servers.append(replica)
            replica.wait_ready()
            wait_link_up(replica)
            log(f"== throughput: alone on {alone.port}, primary on {primary.port} with "
                f"replica on {replica.port}")
            tp = throughput(args, alone, primary)
            log("== lag at half the primary's rate")
            lg = lag(args, primary, replica, tp["standby"].rps)
    finally:
        for srv in servers:
            srv.stop()
    meta["elapsed"] = time.monotonic() - started
    publish(build_report(args, tp, lg, meta), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
