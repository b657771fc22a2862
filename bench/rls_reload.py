#!/usr/bin/env python3
"""What a reload of a large Envoy rate limit configuration costs the other
clients: the longest wait of a client pinging the server back to back
while the configuration (bench/rls_workload.py's domain with BIG_ENTRIES
descriptors more, about 10,000) is reloaded, against the same client
while another one reads a large sliced reply (``CONFIG GET *``, 0.5 ms a
slice) and while nothing else happens.

One fastlimit server (bench/run.py's Fastlimit) with ``--rls-config`` on
that file; one pinging thread (redis-py, one connection) records every
round trip; the main thread, on another connection, runs each case
--repeat times:

    idle          nothing
    CONFIG GET *  a sliced reply (GET_PATTERNS), the yardstick the issue names
    CL.RULE RELOAD  the file read, checked and compiled off the loop,
                  put in force on it
    file changed  the same through the server's poll of the file

Reported per case: the pinging client's p50, p99 and longest round trip
while it ran, and how long the case itself took.  ``--quick``: 1,000
descriptors, one repeat, a smoke run (tests/bench).  It reports; it does
not judge by exit code.

    .venv/bin/python bench/rls_reload.py          # about 30 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from rls_workload import RLS_YAML, big_tree  # noqa: E402
from run import Fastlimit, report_meta  # noqa: E402

CASES = ("idle", "CONFIG GET *", "CL.RULE RELOAD", "file changed")
# CONFIG GET's patterns: a reply of many slices (128 patterns a slice)
GET_PATTERNS = ["*"] + [f"*{i}*" for i in range(20_000)]


class Pinger(threading.Thread):
    """PING back to back on one connection; the round trips of a window."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.client = server.client()
        self.times: list[float] = []
        self.recording = False
        self.stopped = False

    def run(self) -> None:
        while not self.stopped:
            t = time.perf_counter()
            self.client.ping()
            if self.recording:
                self.times.append(time.perf_counter() - t)

    def window(self, work) -> tuple[list[float], float]:
        """The round trips recorded while work() ran, and its duration."""
        self.times = []
        self.recording = True
        t = time.perf_counter()
        work()
        took = time.perf_counter() - t
        self.recording = False
        return self.times, took


def reloaded_by_poll(client, path: Path, text: str) -> None:
    """Rewrites the file and waits until the poll's reload is in force."""
    before = client.info("rls")["rls_reloads"]
    path.write_text(text + f"# rewritten {time.monotonic_ns()}\n")
    deadline = time.monotonic() + 60
    while client.info("rls")["rls_reloads"] == before:
        if time.monotonic() > deadline:
            raise RuntimeError("the poll did not reload the file within 60 s")
        time.sleep(0.005)


def measure(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="fastlimit-rls-reload-") as tmp:
        workdir = Path(tmp)
        config = workdir / "rls.yaml"
        text = RLS_YAML + big_tree(args.descriptors)
        config.write_text(text)
        server = Fastlimit(workdir, ["--rls-config", str(config)])
        try:
            server.wait_ready(120)
            client = server.client()
            descriptors = client.info("rls")["rls_descriptors"]
            pinger = Pinger(server)
            pinger.start()
            work = {"idle": lambda: time.sleep(0.5),
                    "CONFIG GET *": lambda: client.execute_command("CONFIG", "GET", *GET_PATTERNS),
                    "CL.RULE RELOAD": lambda: client.execute_command("CL.RULE", "RELOAD"),
                    "file changed": lambda: reloaded_by_poll(client, config, text)}
            results: dict = {case: {"times": [], "took": []} for case in CASES}
            for _ in range(args.repeat):
                for case in CASES:
                    times, took = pinger.window(work[case])
                    results[case]["times"] += times
                    results[case]["took"].append(took)
            pinger.stopped = True
            pinger.join(10)
            return {"descriptors": descriptors, "results": results}
        finally:
            server.stop()


def report(args, m: dict) -> str:
    meta = report_meta()
    out = [f"# A reload of {m['descriptors']:,} descriptors: the other clients' wait", "",
           f"{meta['when']} · {meta['machine']} · rev {meta['rev']}", "",
           "| case | pings | p50 µs | p99 µs | longest µs | the case took, ms (median) |",
           "|---|---:|---:|---:|---:|---:|"]
    for case in CASES:
        times = sorted(m["results"][case]["times"])
        if not times:
            out.append(f"| {case} | 0 | – | – | – | – |")
            continue
        p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
        out.append(f"| {case} | {len(times):,} | {statistics.median(times) * 1e6:,.0f} | "
                   f"{p99 * 1e6:,.0f} | {times[-1] * 1e6:,.0f} | "
                   f"{statistics.median(m['results'][case]['took']) * 1e3:,.1f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--descriptors", type=int, default=None,
                   help="descriptors added to the domain (default 10,000; 1,000 --quick)")
    p.add_argument("--repeat", type=int, default=None, help="runs of each case (default 5)")
    p.add_argument("--quick", action="store_true", help="a smoke run")
    p.add_argument("--output", default=str(BENCH_DIR / "results" / "rls_reload.md"))
    args = p.parse_args()
    args.descriptors = args.descriptors or (1000 if args.quick else 10_000)
    args.repeat = args.repeat or (1 if args.quick else 5)
    text = report(args, measure(args))
    print(text)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
