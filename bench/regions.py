#!/usr/bin/env python3
"""Several regions, one budget (README "Regions"): each scope of a rule
measured with three fastlimit tiers on this machine, their region links
through TCP proxies that add a one-way delay d to every byte (40 ms, then
100 ms), as `tc netem delay` would between regions.

One run:
  1. per scope (regional, static, global, home) and delay: one user who hops
     regions on every request, at most --rate (1,000) checks a second in
     each, asks 3 L of a fixed-window rule of L per window (the manual
     clock holds the window; the links run in real time): what the fleet admitted against L and
     against the README's bound for the scope (global: L + (R - 1) *
     lambda * (sync interval + d), lambda measured per region; home, with
     every key's home in eu: L), and the check's latency in the caller's
     region (p50/p99: a home rule's checks outside eu wait a round trip);
  2. the links' traffic: a global rule, one client per region checking
     random keys of K for a few seconds: checks/s against bytes/s on each
     link (how well the spends of one interval aggregate per key);
  3. a partition (every link stalled) with the share policy and its
     healing: what the fleet admitted while apart against L, and how long
     until every region's count is the fleet's again;
  4. prints a markdown report and writes it to bench/results/regions.md.

It reports; it does not judge by exit code.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "regions.md"
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "support"))
from proxy import Proxy  # noqa: E402
from run import Fastlimit, _terminate, log, publish, report_meta, run_cli  # noqa: E402

REGIONS = ("ap", "eu", "us")
SYNC_MS = 50
WINDOW_MS = 3_600_000          # a window no run reaches the end of (manual clock)


class Fleet:
    """Three tiers, each linked to the other two through a delaying proxy."""

    def __init__(self, workdir: Path, delay_s: float, partition_ms: int = 1000):
        self.tiers = {name: Fastlimit(workdir, [
            "--manual-clock", "--region", name, "--regions", *REGIONS,
            "--region-sync-ms", str(SYNC_MS), "--region-partition-ms", str(partition_ms)])
            for name in REGIONS}
        self.proxies: list[Proxy] = []
        for t in self.tiers.values():
            t.wait_ready()
        self.c = {name: t.client() for name, t in self.tiers.items()}
        for name, c in self.c.items():
            peers = []
            for other in REGIONS:
                if other != name:
                    proxy = Proxy(self.tiers[other].port, delay=delay_s)
                    self.proxies.append(proxy)
                    peers.append(f"{other}=127.0.0.1:{proxy.port}")
            c.config_set("region-peers", " ".join(peers))
        self.wait(lambda: all(self.info(n)["region_links_up"] == 2 for n in REGIONS),
                  "the links up")

    def info(self, name: str) -> dict:
        return self.c[name].info("regions")

    @staticmethod
    def wait(predicate, what: str, timeout: float = 30.0) -> float:
        start = time.monotonic()
        while not predicate():
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.005)
        return time.monotonic() - start

    def set_rule(self, doc: dict) -> None:
        for c in self.c.values():
            c.execute_command("CL.RULE", "SET", "api", json.dumps(doc))

    def remaining(self, client: str) -> set[int]:
        return {c.execute_command("CL.LIMIT", client, "api", "COST", 0)[2]
                for c in self.c.values()}

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
        for t in self.tiers.values():
            t.stop()


def rule(scope: str, limit: int, **extra) -> dict:
    doc = {"match": {"resource": "api"}, "algorithm": "fixed_window", "limit": limit,
           "window_ms": WINDOW_MS, **extra}
    return doc if scope == "regional" else dict(doc, regions=scope)


def hop(fleet: Fleet, client: str, requests: int,
        rate: float) -> tuple[int, float, list[float]]:
    """(allowed, seconds, latencies in ms) of one user asking in each region
    in turn, at most `rate` checks a second in each."""
    allowed, latencies = 0, []
    start = time.monotonic()
    for i in range(requests):
        ahead = start + i / (3 * rate) - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        t0 = time.perf_counter()
        allowed += fleet.c[REGIONS[i % 3]].execute_command("CL.LIMIT", client, "api")[0]
        latencies.append((time.perf_counter() - t0) * 1000)
    return allowed, time.monotonic() - start, latencies


def scopes(args, workdir: Path) -> list[dict]:
    rows = []
    for delay_ms in args.delays:
        fleet = Fleet(workdir, delay_ms / 1000)
        try:
            for scope in ("regional", "static", "global", "home"):
                # a home rule's checks outside eu take a round trip each: fewer of them
                limit = min(args.limit, args.home_limit) if scope == "home" else args.limit
                fleet.set_rule(rule(scope, limit, **({"home": "eu"} if scope == "home"
                                                     else {})))
                client = f"user:{scope}:{delay_ms}"
                allowed, seconds, lat = hop(fleet, client, 3 * limit, args.rate)
                rate = 3 * limit / 3 / seconds               # checks/s in each region
                bound = {"regional": 3 * limit, "static": limit, "home": limit,
                         "global": min(3 * limit, limit + 2 * rate
                                       * (SYNC_MS + delay_ms) / 1000)}[scope]
                lat.sort()
                rows.append({"scope": scope, "delay_ms": delay_ms, "allowed": allowed,
                             "limit": limit, "bound": bound, "rate": rate,
                             "p50": statistics.median(lat), "p99": lat[int(len(lat) * 0.99)]})
                log(f"  {scope:8} d={delay_ms} ms: {allowed} admitted of L={limit}, "
                    f"bound {bound:.0f}")
        finally:
            fleet.close()
    return rows


def traffic(args, workdir: Path) -> list[dict]:
    """Each region checks random keys of K as fast as one client goes, per K."""
    fleet = Fleet(workdir, args.delays[0] / 1000)
    try:
        return [link_traffic(args, fleet, keys) for keys in args.keys]
    finally:
        fleet.close()


def link_traffic(args, fleet: Fleet, keys: int) -> dict:
    """One row: checks/s against the bytes every link carries."""
    fleet.set_rule(rule("global", 10**9))
    sent_before = {n: sum(int(v["bytes_sent"]) for k, v in fleet.info(n).items()
                          if k.startswith("peer")) for n in REGIONS}
    counts = dict.fromkeys(REGIONS, 0)
    stop = time.monotonic() + args.seconds

    def drive(name: str) -> None:
        c, rng, n = fleet.tiers[name].client(), random.Random(name), 0
        pipe = c.pipeline(transaction=False)
        while time.monotonic() < stop:
            for _ in range(50):
                pipe.execute_command("CL.LIMIT", f"k{keys}:{rng.randrange(keys)}", "api")
            pipe.execute()
            n += 50
        counts[name] = n
        c.close()

    start = time.monotonic()
    threads = [threading.Thread(target=drive, args=(n,)) for n in REGIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - start
    time.sleep(3 * SYNC_MS / 1000 + args.delays[0] / 500)     # the last batches
    sent = {n: sum(int(v["bytes_sent"]) for k, v in fleet.info(n).items()
                   if k.startswith("peer")) - sent_before[n] for n in REGIONS}
    return {"keys": keys, "seconds": seconds,
            "checks_per_s": sum(counts.values()) / seconds,
            "bytes_per_s_per_link": sum(sent.values()) / 6 / seconds,
            "bytes_per_check": sum(sent.values()) / 2 / max(1, sum(counts.values()))}


def partition(args, workdir: Path) -> dict:
    fleet = Fleet(workdir, args.delays[0] / 1000, partition_ms=300)
    try:
        fleet.set_rule(rule("global", args.limit))
        for proxy in fleet.proxies:
            proxy.stall()
        fleet.wait(lambda: all(fleet.info(n)["region_partitioned"] for n in REGIONS),
                   "the partition seen")
        apart = sum(fleet.c[n].execute_command("CL.LIMIT", "u", "api")[0]
                    for n in REGIONS for _ in range(args.limit))
        for proxy in fleet.proxies:
            proxy.restore()
        # whole again (every peer answering), and every count the fleet's
        converge = fleet.wait(lambda: not any(fleet.info(n)["region_partitioned"]
                                              for n in REGIONS)
                              and fleet.remaining("u") == {max(0, args.limit - apart)},
                              "every count at the fleet's")
        overdrawn = sum(fleet.info(n)["region_tokens_overdrawn"] for n in REGIONS)
        return {"apart": apart, "limit": args.limit, "converge_s": converge,
                "overdrawn": overdrawn}
    finally:
        fleet.close()


def build_report(args, rows: list[dict], trs: list[dict], pt: dict, meta: dict) -> str:
    out = [f"# Regions: one budget across three tiers ({meta['when']})", "",
           f"{meta['machine']}; fastlimit {meta['rev']}; region-sync-ms {SYNC_MS}; "
           f"{meta['elapsed']:.0f} s. One user hops regions on every request, 3 L requests "
           f"at most {args.rate:,.0f} a second per region; each link through a proxy adding "
           "d one way.", "",
           "| scope | d | admitted | L | bound | admitted ÷ L | checks/s per region | "
           "p50 | p99 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['scope']} | {r['delay_ms']} ms | {r['allowed']:,} | {r['limit']:,} | "
                   f"{r['bound']:,.0f} | {r['allowed'] / r['limit']:.3f} | {r['rate']:,.0f} | "
                   f"{r['p50']:.3f} ms | {r['p99']:.3f} ms |")
    out += ["", "The bound: regional R × L; static L (overshoot 0); global L + (R − 1) · λ · "
            "(Δ + d) with λ the measured checks/s per region (README \"Regions\"); home L. "
            "Only a home rule's check waits for a link (two thirds of these, asked of eu); "
            "the others' latency is the caller's region's alone.", "",
            "## Link traffic (global rule)", "",
            "| keys | checks/s (3 regions) | bytes/s per link | bytes per check per link |",
            "|---|---|---|---|",
            *(f"| {tr['keys']:,} | {tr['checks_per_s']:,.0f} | "
              f"{tr['bytes_per_s_per_link']:,.0f} | {tr['bytes_per_check']:.1f} B |"
              for tr in trs), "",
            "Each check's spend crosses every link once per interval per key: with few keys "
            "the spends of one region-sync-ms aggregate into one entry each.", "",
            "## Partition and healing (global rule, share policy)", "",
            "| L | admitted while apart | converged after healing | overdrawn |",
            "|---|---|---|---|",
            f"| {pt['limit']:,} | {pt['apart']:,} | {pt['converge_s']:.3f} s | "
            f"{pt['overdrawn']:,} |", ""]
    return "\n".join(out)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few seconds, one delay")
    p.add_argument("--limit", type=int, help="L per window (default 1,000)")
    p.add_argument("--delays", help="one-way delays in ms (default 40,100)")
    p.add_argument("--seconds", type=float, help="part 2's run (default 3)")
    p.add_argument("--rate", type=float, default=1000.0,
                   help="part 1: the hopping user's most checks/s per region (default 1,000)")
    p.add_argument("--keys", default="100,10000", help="part 2's K, each a row (default "
                                                       "100,10000)")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    q = args.quick
    args.limit = args.limit or (60 if q else 1000)
    args.delays = [int(d) for d in (args.delays or ("40" if q else "40,100")).split(",")]
    args.seconds = args.seconds or (0.5 if q else 3.0)
    args.keys = [int(k) for k in args.keys.split(",")]
    args.home_limit = 10 if q else 50      # part 1's L for the home rule
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    meta = report_meta()
    with tempfile.TemporaryDirectory(prefix="fastlimit-bench-regions-") as tmp:
        workdir = Path(tmp)
        log("== 1. each scope, a user hopping regions")
        rows = scopes(args, workdir)
        log("== 2. link traffic")
        tr = traffic(args, workdir)
        log("== 3. partition and healing")
        pt = partition(args, workdir)
    meta["elapsed"] = time.monotonic() - started
    publish(build_report(args, rows, tr, pt, meta), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
