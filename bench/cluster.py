#!/usr/bin/env python3
"""Cluster mode: what it costs a node, and a 3-shard fastlimit cluster
against a 3-master Redis Cluster running the token-bucket Lua script.

One run:
  1. the cost of cluster mode on the check path: one fastlimit node
     standalone and one in cluster mode owning every slot (so nothing is
     redirected), redis-benchmark ``-P 16 CL.CHECK`` against each,
     interleaved, with the server CPU per request from /proc;
  2. ``redis-benchmark --cluster`` against three fastlimit primaries
     (a static slot map) and a three-master ``redis-server
     --cluster-enabled yes`` cluster with bench/token_bucket.lua loaded on
     every master, same keys (``rl:{tag}:__rand_int__``), interleaved, at
     -P 1 and -P 16: throughput and the CPU of all three servers per
     request;
  3. a reshard: two fastlimit primaries, --reshard-keys buckets in the
     slots that move, CL.CLUSTER MOVE while redis-benchmark --cluster runs
     against both: the pause, the copy time, and the benchmark's throughput
     against a run with no move;
  4. from those figures and the bytes per key of a filled node, the
     processes, machines and memory for the design's 500,000 checks/s
     over 10 million keys, and for ten times that;
  5. prints a markdown report and writes it to bench/results/cluster.md.

It reports; it does not judge by exit code.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastlimit._cluster import keyslot

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "cluster.md"
sys.path.insert(0, str(BENCH_DIR))
from failover import cpu_seconds  # noqa: E402
from run import (  # noqa: E402
    LUA_PATH,
    Fastlimit,
    RedisServer,
    _terminate,
    fill,
    fmt_rps,
    free_port,
    log,
    publish,
    report_meta,
    run_benchmark,
    run_cli,
    target_line,
)

CHECK = ["CL.CHECK", "key:__rand_int__", "100", "10"]
TAGGED_CHECK = ["CL.CHECK", "rl:{tag}:__rand_int__", "100", "10"]
RANDOM_KEYS = 1_000_000
SHARDS = 3
CLIENTS = 50
DESIGN_RPS = 500_000
DESIGN_KEYS = 10_000_000
# A machine is sized with headroom: 70 % of its cores busy at the design rate.
CORE_BUSY = 0.7


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short runs, 1 repeat")
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs per side")
    p.add_argument("--n16", type=int, help="requests per -P 16 run (default 1,000,000)")
    p.add_argument("--n1", type=int, help="requests per -P 1 run (default 200,000)")
    p.add_argument("--keys", type=int, default=1_000_000, help="keys for bytes per key")
    p.add_argument("--reshard-keys", type=int, default=200_000,
                   help="buckets in the slots that move (default 200,000)")
    p.add_argument("--cores-per-machine", type=int, default=16,
                   help="cores of a machine in the sizing (default 16)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeat = 1
    args.n16 = args.n16 or (200_000 if args.quick else 1_000_000)
    args.n1 = args.n1 or (40_000 if args.quick else 200_000)
    return args


def map_text(ports: list[int]) -> str:
    """A static map: the slots split evenly over one primary per port."""
    n = len(ports)
    out = ["version = 1"]
    for i, port in enumerate(ports):
        out += ["", "[[shard]]", f'name = "fl-{i}"',
                f'slots = ["{i * 16384 // n}-{(i + 1) * 16384 // n - 1}"]',
                f'primary = "127.0.0.1:{port}"']
    return "\n".join(out) + "\n"


def cluster_nodes(workdir: Path, shards: int, tag: str) -> list[Fastlimit]:
    ports = [free_port() for _ in range(shards)]
    path = workdir / f"map-{tag}.toml"
    path.write_text(map_text(ports))
    nodes = [Fastlimit(workdir, ["--port", str(p), "--cluster-enabled", "yes",
                                 "--cluster-config-file", str(path)]) for p in ports]
    for n in nodes:
        n.wait_ready()
    return nodes


def redis_cluster(workdir: Path, binary: str, shards: int) -> list[RedisServer]:
    nodes = []
    for _ in range(shards):
        node = RedisServer(workdir, binary, ["--cluster-enabled", "yes",
                                             "--cluster-port", str(free_port()),
                                             "--cluster-config-file", f"nodes-{free_port()}.conf"])
        nodes.append(node)
    for n in nodes:
        n.wait_ready()
    subprocess.run(["redis-cli", "--cluster", "create",
                    *(f"127.0.0.1:{n.port}" for n in nodes), "--cluster-yes"],
                   check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + 30
    while not all(b"cluster_state:ok" in n.client().execute_command("CLUSTER", "INFO")
                  for n in nodes):
        if time.monotonic() > deadline:
            raise RuntimeError("the Redis cluster did not reach cluster_state:ok")
        time.sleep(0.1)
    return nodes


def measured(args, nodes, n: int, pipeline: int, command: list[str], cluster: bool):
    """One redis-benchmark run: (its result, server CPU µs per request over
    every node)."""
    before = sum(cpu_seconds(node.pid) for node in nodes)
    res = run_benchmark(args.redis_benchmark, nodes[0].port, CLIENTS, n, pipeline, command,
                        RANDOM_KEYS, cluster=cluster)
    return res, (sum(cpu_seconds(node.pid) for node in nodes) - before) / n * 1e6


def check_path_cost(args, workdir: Path) -> dict:
    """P=16 CL.CHECK on a standalone node and on a cluster node owning every slot."""
    standalone = Fastlimit(workdir)
    single = None
    out: dict[str, list] = {"standalone": [], "cluster mode": []}
    try:
        standalone.wait_ready()
        single = cluster_nodes(workdir, 1, "one")[0]
        sides = {"standalone": standalone, "cluster mode": single}
        for node in sides.values():
            run_benchmark(args.redis_benchmark, node.port, CLIENTS, 50_000, 16, CHECK,
                          RANDOM_KEYS)
        for rep in range(args.repeat):
            order = list(sides.items())[::-1 if rep % 2 else 1]
            for who, node in order:
                res, cpu = measured(args, [node], args.n16, 16, CHECK, cluster=False)
                out[who].append((res, cpu))
                log(f"  [{rep + 1}/{args.repeat}] P=16 {who:12} {fmt_rps(res.rps):>6} req/s, "
                    f"{cpu:.3f} µs CPU/req")
    finally:
        standalone.stop()
        if single is not None:
            single.stop()
    return out


def versus_redis_cluster(args, workdir: Path) -> dict:
    lua = LUA_PATH.read_bytes()
    fl = cluster_nodes(workdir, SHARDS, "three")
    rd: list[RedisServer] = []
    out: dict[tuple[str, int], list] = {}
    try:
        rd = redis_cluster(workdir, args.redis_server, SHARDS)
        sha = None
        for node in rd:
            sha = node.client().script_load(lua)
        evalsha = ["EVALSHA", sha, "1", "rl:{tag}:__rand_int__", "100", "10", "1"]
        sides = {"fastlimit": (fl, TAGGED_CHECK), "redis": (rd, evalsha)}
        for nodes, command in sides.values():
            run_benchmark(args.redis_benchmark, nodes[0].port, CLIENTS, 50_000, 16, command,
                          RANDOM_KEYS, cluster=True)
        for pipeline, n in ((1, args.n1), (16, args.n16)):
            for rep in range(args.repeat):
                order = list(sides.items())[::-1 if rep % 2 else 1]
                for who, (nodes, command) in order:
                    res, cpu = measured(args, nodes, n, pipeline, command, cluster=True)
                    out.setdefault((who, pipeline), []).append((res, cpu))
                    log(f"  [{rep + 1}/{args.repeat}] --cluster P={pipeline:<2} {who:9} "
                        f"{fmt_rps(res.rps):>7} req/s, {cpu:.2f} µs CPU/req (3 servers)")
    finally:
        for node in [*fl, *rd]:
            node.stop()
    return out


MOVING = (0, 1023)      # of shard fl-0's 0-8191


def moving_keys(count: int) -> list[bytes]:
    """count keys whose slots are in MOVING."""
    out: list[bytes] = []
    i = 0
    while len(out) < count:
        key = b"move:%d" % i
        if MOVING[0] <= keyslot(key) <= MOVING[1]:
            out.append(key)
        i += 1
    return out


def reshard(args, workdir: Path) -> dict:
    """CL.CLUSTER MOVE of MOVING from fl-0 to fl-1 under redis-benchmark --cluster."""
    nodes = cluster_nodes(workdir, 2, "move")
    try:
        source = nodes[0].client()
        keys = moving_keys(args.reshard_keys)
        fill(source, len(keys), lambda k: ("CL.CHECK", keys[int(k[4:])], 100, 1), 10_000)
        n = args.n16
        base = run_benchmark(args.redis_benchmark, nodes[0].port, CLIENTS, n, 16, TAGGED_CHECK,
                             RANDOM_KEYS, cluster=True)
        bench = subprocess.Popen(
            [args.redis_benchmark, "-h", "127.0.0.1", "-p", str(nodes[0].port), "--cluster",
             "-c", str(CLIENTS), "-n", str(n), "-P", "16", "-r", str(RANDOM_KEYS), "--csv",
             *TAGGED_CHECK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        started = time.monotonic()
        source.execute_command("CL.CLUSTER", "MOVE", f"{MOVING[0]}-{MOVING[1]}", "fl-1")
        took = time.monotonic() - started
        out, err = bench.communicate(timeout=120)
        status = source.execute_command("CL.CLUSTER", "MOVESTATUS")
        status = dict(zip(status[::2], status[1::2], strict=True)) if isinstance(status, list) \
            else status
        rows = [line for line in out.splitlines() if line.startswith('"CL.CHECK')]
        during = float(rows[-1].split('","')[1]) if rows else None
        return {"status": {_text(k): _text(v) for k, v in status.items()},
                "move_s": took, "base_rps": base.rps, "during_rps": during,
                "bench_errors": err.strip()[-200:]}
    finally:
        for node in nodes:
            node.stop()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def bytes_per_key(args, workdir: Path) -> float:
    node = Fastlimit(workdir, ["--manual-clock"])
    try:
        node.wait_ready()
        c = node.client()
        fill(c, args.keys, lambda k: ("CL.CHECK", k, 100, 1, "PERIOD", 3600000), 10_000)
        return float(c.info("memory")["bucket_table_bytes_per_key"])
    finally:
        node.stop()


def _median(runs: list, i: int) -> float:
    return statistics.median(r[i] if i else r[0].rps for r in runs)


def sizing(cpu_p1: float, per_key: float, cores: int) -> list[str]:
    """Processes, machines and memory from the measured CPU per request at
    P=1 (gateways mostly do not pipeline) and bytes per key."""
    per_process = 1e6 / cpu_p1 * CORE_BUSY     # checks/s one process takes, with headroom
    rows = []
    for scale in (1, 10):
        rps, keys = DESIGN_RPS * scale, DESIGN_KEYS * scale
        primaries = max(2, math.ceil(rps / per_process))
        processes = primaries * 2                  # each with its standby
        machines = max(2, math.ceil(processes / cores))
        memory = keys * per_key * 2 / 1024**3      # primary and standby copies
        rows.append(f"| {rps:,} checks/s, {keys:,} keys | {primaries} | {processes} | "
                    f"{machines} × {cores} cores | {memory:.1f} GiB of tables "
                    f"({keys * per_key / primaries / 1024**2:.0f} MiB per primary) |")
    return rows


def reshard_lines(args, rs: dict) -> list[str]:
    st = rs["status"]
    during = rs["during_rps"]
    return ["## Resharding", "",
            f"Slots {MOVING[0]}-{MOVING[1]} of two primaries' 0-8191 / 8192-16383, holding "
            f"{args.reshard_keys:,} buckets, moved by `CL.CLUSTER MOVE` while "
            f"`redis-benchmark --cluster -P 16 -n {args.n16:,}` ran against both:", "",
            "| | |", "|---|---:|",
            f"| state | {st.get('state')} |",
            f"| buckets copied (the filled ones and the benchmark's), changes after | "
            f"{st.get('buckets')}, {st.get('changes')} |",
            f"| copy (source keeps answering) | {st.get('copy_ms')} ms |",
            f"| pause (the moving slots' commands wait) | {st.get('pause_ms')} ms |",
            f"| of which the map installs | {st.get('flip_ms')} ms |",
            f"| the whole MOVE command | {rs['move_s'] * 1000:.0f} ms |",
            f"| benchmark with no move | {fmt_rps(rs['base_rps'])} req/s |",
            f"| benchmark across the move | {fmt_rps(during) if during else 'n/a'} req/s |", ""]


def build_report(args, cost: dict, vs: dict, rs: dict, per_key: float, meta: dict) -> str:
    sa = statistics.median(c for _, c in cost["standalone"])
    cm = statistics.median(c for _, c in cost["cluster mode"])
    lines = ["# fastlimit: cluster mode", "",
             f"{meta['when']} · {meta['machine']} · rev {meta['rev']} · "
             f"{meta['elapsed']:.0f} s", "",
             "## The check path in cluster mode", "",
             f"redis-benchmark `-c {CLIENTS} -P 16 -n {args.n16:,} -r {RANDOM_KEYS:,} "
             f"{' '.join(CHECK)}`, {args.repeat} interleaved run(s) per side, medians; "
             "the cluster node owns every slot, so each request is routed and served:", "",
             "| node | req/s | server CPU µs/req |", "|---|---:|---:|",
             f"| standalone | {fmt_rps(_median(cost['standalone'], 0))} | {sa:.3f} |",
             f"| cluster mode | {fmt_rps(_median(cost['cluster mode'], 0))} | {cm:.3f} |", "",
             target_line("CPU per CL.CHECK in cluster mode ≤ 1.05× standalone", cm / sa, 1.05,
                         higher_is_better=False), "",
             "## redis-benchmark --cluster: 3 fastlimit primaries vs a 3-master Redis Cluster",
             "",
             "fastlimit: `CL.CHECK rl:{tag}:__rand_int__ 100 10`; Redis: `EVALSHA "
             "<token_bucket.lua> 1 rl:{tag}:__rand_int__ 100 10 1`; `-c 50 -r 1,000,000`; "
             "CPU is the sum of the three servers' per request. redis-benchmark 7.0 pins "
             "each client to one master and, before 7.4, to one slot of it.", "",
             "| -P | fastlimit req/s | Redis req/s | ratio | fastlimit CPU µs/req | "
             "Redis CPU µs/req | CPU ratio |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for p in (1, 16):
        f, r = vs[("fastlimit", p)], vs[("redis", p)]
        lines.append(f"| {p} | {fmt_rps(_median(f, 0))} | {fmt_rps(_median(r, 0))} | "
                     f"{_median(f, 0) / _median(r, 0):.2f}× | {_median(f, 1):.2f} | "
                     f"{_median(r, 1):.2f} | {_median(r, 1) / _median(f, 1):.2f}× less |")
    cpu_p1 = _median(vs[("fastlimit", 1)], 1)
    lines += ["", *reshard_lines(args, rs), "## Sizing, on paper", "",
              f"From the measured {cpu_p1:.2f} µs of server CPU per check at -P 1 (gateways "
              f"mostly do not pipeline), one process taking at most {CORE_BUSY:.0%} of its "
              f"core, each primary with one standby, and {per_key:.1f} bytes of table per key "
              f"({args.keys:,} keys filled):", "",
              "| load | primaries | processes | machines | memory |", "|---|---:|---:|---:|---|",
              *sizing(cpu_p1, per_key, args.cores_per_machine), ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    for tool in (args.redis_server, args.redis_benchmark, "redis-cli"):
        if not shutil.which(tool):
            log(f"error: {tool} not found (make bench installs redis-server and redis-tools)")
            return 2
    started = time.monotonic()
    meta = report_meta()
    with tempfile.TemporaryDirectory(prefix="fastlimit-bench-cluster-") as tmp:
        workdir = Path(tmp)
        log("== the check path: standalone vs cluster mode")
        cost = check_path_cost(args, workdir)
        log("== redis-benchmark --cluster: fastlimit vs Redis Cluster + Lua")
        vs = versus_redis_cluster(args, workdir)
        log(f"== a reshard of {args.reshard_keys:,} buckets under redis-benchmark --cluster")
        rs = reshard(args, workdir)
        log(f"  {rs['status']}")
        log(f"== bytes per key: {args.keys:,} keys")
        per_key = bytes_per_key(args, workdir)
    meta["elapsed"] = time.monotonic() - started
    publish(build_report(args, cost, vs, rs, per_key, meta), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
