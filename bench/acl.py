#!/usr/bin/env python3
"""What an ACL user costs on the hot path: server CPU per CL.CHECK for a
restricted user (``~tenant-a:* +@ratelimit``: a permission byte and a key
pattern checked in C on every command) against the default user (one
bint test), with the same redis-benchmark load (-P 16), runs interleaved
so drift hits both alike.  CPU is the server's utime+stime from
/proc/<pid>/stat over each run, divided by the checks it answered.  The
target (issue 15) is at most 1.03x.  Reports; does not judge by exit code.

    .venv/bin/python bench/acl.py [--n N] [--repeat N] [--pipeline P]
    .venv/bin/python bench/acl.py --quick     # a smoke run: 100,000 checks, 1 run per user
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import Fastlimit, run_benchmark  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS     # utime, stime


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a smoke run, a second or so: --n 100,000, --repeat 1 (unless given)")
    p.add_argument("--n", type=int, help="checks per run (default 400,000)")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--pipeline", type=int, default=16)
    p.add_argument("--repeat", type=int, help="runs per user, interleaved (default 5)")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    args = p.parse_args(argv)
    args.n = args.n or (100_000 if args.quick else 400_000)
    args.repeat = args.repeat or (1 if args.quick else 5)
    work = Path(tempfile.mkdtemp(prefix="fastlimit-acl-bench-"))
    fl = Fastlimit(work)
    try:
        fl.wait_ready()
        admin = fl.client()
        # CONFIG GET: redis-benchmark reads two settings when it starts.
        admin.execute_command("ACL", "SETUSER", "tenant", "on", ">pw", "~tenant-a:*",
                              "+@ratelimit", "+config|get")
        admin.close()
        command = ["CL.CHECK", "tenant-a:__rand_int__", "1000000", "1000000"]
        users = {"default": [], "tenant": ["--user", "tenant", "-a", "pw"]}
        cpu: dict[str, list[float]] = {u: [] for u in users}
        rps: dict[str, list[float]] = {u: [] for u in users}
        for _ in range(args.repeat):
            for user, extra in users.items():
                before = cpu_seconds(fl.pid)
                result = run_benchmark(args.redis_benchmark, fl.port, args.clients, args.n,
                                       args.pipeline, command, 100_000, extra=extra)
                cpu[user].append((cpu_seconds(fl.pid) - before) / args.n * 1e6)
                rps[user].append(result.rps)
        med = {u: statistics.median(v) for u, v in cpu.items()}
        print(f"CL.CHECK, redis-benchmark -c {args.clients} -P {args.pipeline} -n {args.n:,}, "
              f"{args.repeat} interleaved runs per user (median)")
        print("| user | server CPU us/check | runs | requests/s |")
        print("|---|---|---|---|")
        for user in users:
            runs = " ".join(f"{v:.3f}" for v in cpu[user])
            print(f"| {user} | {med[user]:.3f} | {runs} | {statistics.median(rps[user]):,.0f} |")
        print(f"\nrestricted / default CPU per check: {med['tenant'] / med['default']:.3f}x "
              f"(target <= 1.03x)")
    finally:
        fl.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
