#!/usr/bin/env python3
"""The server's CPU per CL.CHECK of existing buckets, from /proc (utime +
stime over a redis-benchmark -P 16 run), for builds and settings side by
side, in interleaved repeats:

    bench/check_cpu.py --variant main=installed \\
        --variant off=src --variant 200mb=src:--maxmemory:200mb

A variant is LABEL=SOURCE[:ARG:ARG...]: SOURCE is ``installed`` (the
package this interpreter imports from site-packages) or a directory put
first on PYTHONPATH (a tree built in place); the args go to the server.
The buckets exist before the measured runs (a warm-up over the same
keys), so this is the hot path of a check, not of a new key.  It reports
the median per variant; the noise of a shared 2-core machine is several
percent, so compare medians of interleaved runs only.  ``--quick`` is a
smoke run of a second or so (--n 20,000, --keys 100, --repeat 1, unless
given).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY = re.compile(r"ready to accept connections on .* port (\d+)")
TICK = os.sysconf("SC_CLK_TCK")
# A bucket that neither runs out nor fills up again during a run: stored throughout.
CHECK = ["CL.CHECK", "key:__rand_int__", "1000000000000", "1"]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK      # utime, stime


def start(source: str, args: list[str], log: Path) -> tuple[subprocess.Popen, int]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if source != "installed":
        env["PYTHONPATH"] = str(Path(source).resolve())
    proc = subprocess.Popen([sys.executable, "-m", "fastlimit.server", "--port", "0",
                             "--rules-db", "", "--snapshot-file", "", "--http-port", "0",
                             "--grpc-port", "0", *args],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env,
                            cwd=log.parent)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = READY.search(log.read_text(errors="replace"))
        if m:
            return proc, int(m.group(1))
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(log.read_text())


def bench(port: int, n: int, keys: int) -> None:
    subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", "50",
                    "-P", "16", "-r", str(keys), "-n", str(n), "-q", *CHECK],
                   stdout=subprocess.DEVNULL, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", required=True)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: --n 20,000 --keys 100 --repeat 1 (unless given)")
    p.add_argument("--n", type=int, help="checks per measured run (default 2,000,000)")
    p.add_argument("--keys", type=int, help="default 1,000")
    p.add_argument("--repeat", type=int, help="default 3")
    p.add_argument("--warm", type=int, default=50,
                   help="warm-up checks per key before the measured run (default 50: every "
                        "bucket exists; 5 leaves 1%% of a million keys to the measured run)")
    args = p.parse_args()
    args.n = args.n or (20_000 if args.quick else 2_000_000)
    args.keys = args.keys or (100 if args.quick else 1000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    variants = []
    for text in args.variant:
        label, _, spec = text.partition("=")
        source, *extra = spec.split(":")
        variants.append((label, source, extra))
    results: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    with tempfile.TemporaryDirectory(prefix="check-cpu-") as tmp:
        for r in range(args.repeat):
            for label, source, extra in variants:
                proc, port = start(source, extra, Path(tmp) / f"{label}.log")
                try:
                    bench(port, args.keys * args.warm, args.keys)    # the buckets exist
                    before = cpu_seconds(proc.pid)
                    bench(port, args.n, args.keys)
                    ns = (cpu_seconds(proc.pid) - before) / args.n * 1e9
                finally:
                    proc.terminate()
                    proc.wait(timeout=10)
                results[label].append(ns)
                print(f"run {r + 1} {label}: {ns:.0f} ns", file=sys.stderr)
    print("| variant | server CPU per CL.CHECK (median) | runs |\n|---|---|---|")
    for label, values in results.items():
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {label} | {statistics.median(values):.0f} ns | {runs} |")


if __name__ == "__main__":
    main()
