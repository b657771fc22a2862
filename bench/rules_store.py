#!/usr/bin/env python3
"""The PostgreSQL rules-store (rules-store postgresql://...), measured:
how fast a change reaches every node, what it costs a node's start, and
what it costs the check path.  Issue 25's benchmark.

One run, against a throw-away PostgreSQL (tests/support/postgres.py:
initdb and pg_ctl as the postgres user, removed however the run ends):

  1. propagation: 10 fastlimit-server processes (--nodes) on free loopback
     ports, each with --rules-store <uri> and its own --rules-db cache file;
     1,000 changes (--changes), each a plain-SQL UPDATE of one rule's
     capacity (asyncpg, autocommit, as another team's tooling would write
     it), while every node is polled with CL.RULE GET on a connection of
     its own (the next GET 1 ms after each answer, --poll-ms): a change's
     latency is from just before the UPDATE is sent to the moment the LAST
     node shows the new capacity.
     p50/p99/max, and each node's own INFO rules figures (commit to apply,
     by the trigger's timestamp);
  2. start with 10,000 rules (--rules): from the process's spawn to its
     "ready to accept connections" line, for a node whose rules-store holds
     them (with an empty cache, a new node, and with the cache holding them
     already, a restart) against a node whose --rules-db SQLite file holds
     the same rules, and one with no rules; median of 3 starts (--starts);
  3. the check path: two servers under valgrind --tool=callgrind, one with
     the store attached (and idle) and one on the SQLite rules-db, each
     sent 20,000 CL.LIMIT (--callgrind-n) for one rule, 16 per write: the
     instructions of the RESP connection's data_received and all it calls,
     per CL.LIMIT (bench/http_front.py's measure, on a real server).

Prints one markdown report (progress on stderr) and writes it to
bench/results/rules_store.md.  It reports; it does not judge by exit code:
a missed target still exits 0.  --quick: 3 nodes, 20 changes, 1,000 rules,
one start each, and no callgrind (two servers' start under callgrind alone
takes ~20 s) unless --callgrind-n is given.  Needs Debian's postgresql
(scripts/bootstrap.sh installs it), asyncpg and redis-py, valgrind for
part 3.  Run as root (initdb runs as the postgres user).  See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results" / "rules_store.md"


def _use_this_tree() -> None:
    """The servers (children) and this process run this tree's fastlimit
    when the installed one has no rules-store yet (an install older than
    the tree): src/ goes first on PYTHONPATH, which the children inherit."""
    probe = subprocess.run(
        [sys.executable, "-c", "import fastlimit._core, fastlimit.rules.follower"],
        capture_output=True, cwd="/")
    if probe.returncode != 0 and (REPO / "src" / "fastlimit").is_dir():
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, str(REPO / "src"))


_use_this_tree()
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO / "tests" / "support"))
import redis  # noqa: E402
from failover import cpu_seconds  # noqa: E402
from http_front import CALLGRIND_START_S, Callgrinded, data_received_ir  # noqa: E402
from postgres import PostgresServer  # noqa: E402
from run import (  # noqa: E402
    READY,
    Fastlimit,
    _die_with_parent,
    _terminate,
    git_rev,
    log,
    machine_line,
    publish,
    run_cli,
)

from fastlimit.rules.postgres import SCHEMA_DDL, TABLE  # noqa: E402

TARGET_P99_MS = 100.0
CHANGE_TIMEOUT_S = 10.0
RULES_SHARED = 10           # part 1: the changes go round these rules
CALLGRIND_RULE = {"match": {"resource": "api"}, "capacity": 10**9, "refill_per_second": 10**9}
BATCH = 16                  # CL.LIMITs per write in part 3, as redis-benchmark -P 16

# What the figure is compared with in part 1's second table.
DESIGN = ("issue 25's design", "\"every few seconds\"")
ENVOY = ("envoyproxy/ratelimit, file reload",
         "no poll interval: each node reloads every file on an inotify event (goruntime's "
         "fsnotify watch; its README, \"File Based Configuration Loading\", and "
         "lyft/goruntime loader/loader.go). Across a fleet it takes as long as the file takes "
         "to reach every disk: a Kubernetes ConfigMap volume, for one, takes up to the kubelet "
         "sync period (default 1 min) plus its cache's TTL (Kubernetes docs, \"Mounted "
         "ConfigMaps are updated automatically\")")

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="3 nodes, 20 changes, 1,000 rules, 1 start each, no callgrind")
    p.add_argument("--nodes", type=int, help="nodes following the store (default 10)")
    p.add_argument("--changes", type=int, help="plain-SQL changes timed (default 1,000)")
    p.add_argument("--rules", type=int, help="rules at start (default 10,000)")
    p.add_argument("--starts", type=int, help="starts per kind of node, median (default 3)")
    p.add_argument("--callgrind-n", type=int,
                   help="CL.LIMITs per server under callgrind (default 20,000; with --quick: "
                        "none unless given)")
    p.add_argument("--poll-ms", type=float, default=1.0,
                   help="pause after an answer before the next CL.RULE GET to that node "
                        "(default 1; 0: back to back, which on 2 cores starves PostgreSQL "
                        "and the nodes: see bench/README.md)")
    p.add_argument("--node-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for part 1's nodes, last (so it wins), e.g. "
                        "--node-arg=--rules-db= (no cache file); repeatable")
    p.add_argument("--parts", default="1,2,3", help="which parts to run (default 1,2,3)")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.nodes = max(1, args.nodes or (3 if args.quick else 10))
    args.changes = max(1, args.changes or (20 if args.quick else 1000))
    args.rules = max(1, args.rules or (1000 if args.quick else 10_000))
    args.starts = max(1, args.starts or (1 if args.quick else 3))
    if args.callgrind_n is None:
        args.callgrind_n = 0 if args.quick else 20_000
    return args


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def resp(*args: str | bytes) -> bytes:
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in parts)


def db_of(url: str) -> str:
    return url.rsplit("/", 1)[1]


def store_node(workdir: Path, url: str, cache: Path, *extra: str) -> Fastlimit:
    """A node following the store at url, its rules-db cache at cache (run.py's
    Fastlimit: --port 0 --http-port 0 --grpc-port 0 --snapshot-file '', and its
    --rules-db '' overridden: the last flag wins)."""
    return Fastlimit(workdir, ["--rules-store", url, "--rules-db", str(cache), *extra])


# ---------------------------------------------------------------------------
# 1. commit to enforced on every node

UPDATE = (f"UPDATE {TABLE} SET doc = jsonb_set(doc, '{{capacity}}', to_jsonb($1::bigint)) "
          "WHERE id = $2")


class Poller:
    """One node's connection, asking CL.RULE GET until the node shows a capacity."""

    def __init__(self, port: int):
        self.port = port

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def capacity(self, get: bytes) -> int | None:
        self.writer.write(get)
        header = await self.reader.readline()
        if header[:1] != b"$":
            raise RuntimeError(f"node on {self.port}: CL.RULE GET answered {header!r}")
        size = int(header[1:])
        if size < 0:
            return None
        return json.loads(await self.reader.readexactly(size + 2))["capacity"]

    async def until(self, get: bytes, capacity: int, pause_s: float) -> float:
        """perf_counter() when the node first answers with this capacity,
        asking again pause_s after each other answer."""
        while await self.capacity(get) != capacity:
            if pause_s:
                await asyncio.sleep(pause_s)
        return time.perf_counter()

    def close(self) -> None:
        self.writer.close()


async def _propagation(url: str, ports: list[int], changes: int, pause_s: float) -> dict:
    import asyncpg  # type: ignore[import-untyped]  # noqa: PLC0415 - a runtime dependency

    conn = await asyncpg.connect(url, server_settings={"application_name": "bench"})
    pollers = [Poller(port) for port in ports]
    for poller in pollers:
        await poller.open()
    ids = [f"shared{j}" for j in range(RULES_SHARED)]
    gets = {rule_id: resp("CL.RULE", "GET", rule_id) for rule_id in ids}
    out: dict = {"latency": [], "first": [], "commit": [], "after_commit": [], "missed": 0}
    try:
        for poller in pollers:              # every node has every rule before the first change
            for rule_id in ids:
                deadline = time.monotonic() + 30
                while await poller.capacity(gets[rule_id]) != 1:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"node on {poller.port} never got {rule_id}")
                    await asyncio.sleep(0.01)

        async def update(capacity: int, rule_id: str) -> float:
            await conn.execute(UPDATE, capacity, rule_id)
            return time.perf_counter()

        for i in range(changes):
            rule_id, capacity = ids[i % len(ids)], 1000 + i
            t0 = time.perf_counter()
            committed = asyncio.ensure_future(update(capacity, rule_id))
            watches = [asyncio.ensure_future(p.until(gets[rule_id], capacity, pause_s))
                       for p in pollers]
            _, pending = await asyncio.wait(watches, timeout=CHANGE_TIMEOUT_S)
            commit = await asyncio.wait_for(committed, 60)     # PostgreSQL's commit
            out["commit"].append((commit - t0) * 1e3)
            if pending:
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                out["missed"] += 1
                # the cancelled GETs' replies are still on their way: start over
                for poller in pollers:
                    poller.close()
                    await poller.open()
                continue
            seen = [task.result() for task in watches]
            out["latency"].append((max(seen) - t0) * 1e3)
            out["first"].append((min(seen) - t0) * 1e3)
            out["after_commit"].append((max(seen) - commit) * 1e3)
            if (i + 1) % max(1, changes // 10) == 0:
                log(f"  {i + 1:,}/{changes:,} changes, last {out['latency'][-1]:.1f} ms")
    finally:
        for poller in pollers:
            poller.close()
        await conn.close()
    return out


def propagation(args, pg: PostgresServer, workdir: Path) -> dict:
    url = pg.create_database()
    db = db_of(url)
    pg.sql(SCHEMA_DDL, db)
    pg.sql(f"INSERT INTO {TABLE} (id, doc) SELECT 'shared' || j, jsonb_build_object('match', "
           "jsonb_build_object('resource', 'shared/' || j), 'capacity', 1, "
           f"'refill_per_second', 1) FROM generate_series(0, {RULES_SHARED - 1}) j", db)
    nodes: list[Fastlimit] = []
    try:
        for n in range(args.nodes):       # all spawned, then waited for: they start together
            nodes.append(store_node(workdir, url, workdir / f"node{n}.db", *args.node_arg))
        for node in nodes:
            node.wait_ready(timeout=60)
        log(f"  {len(nodes)} nodes ready on ports {', '.join(str(n.port) for n in nodes)}")
        cpu0 = [cpu_seconds(n.pid) for n in nodes]
        own0, wall0 = time.process_time(), time.monotonic()
        out = asyncio.run(_propagation(url, [n.port for n in nodes], args.changes,
                                       args.poll_ms / 1e3))
        out["wall_s"] = time.monotonic() - wall0
        out["bench_cpu_s"] = time.process_time() - own0
        out["nodes_cpu_s"] = sum(cpu_seconds(n.pid) - c for n, c in zip(nodes, cpu0, strict=True))
        out["info"] = []
        for node in nodes:
            c = node.client()
            out["info"].append((node.port, c.info("rules")))
            c.close()
        out["queue"] = pg.sql("SELECT pg_notification_queue_usage()", db)
    finally:
        for node in nodes:
            node.stop()
    return out


def propagation_lines(args, out: dict) -> list[str]:
    lat, first, commit = out["latency"], out["first"], out["commit"]
    poll = f"the next GET {args.poll_ms:g} ms after each answer" if args.poll_ms else \
        "GETs back to back"
    lines = [f"## 1. Commit to enforced on every node ({args.nodes} nodes)", "",
             f"{args.changes:,} changes, each a plain-SQL `UPDATE {TABLE} SET doc = jsonb_set(doc, "
             "'{capacity}', …) WHERE id = …` of one of "
             f"{RULES_SHARED} rules (asyncpg, autocommit), one after another; every node polled "
             f"with `CL.RULE GET` on a connection of its own ({poll}). A change's latency: "
             "from just before the UPDATE is sent to the last node answering with the new "
             "capacity (the registry and the rule engine change in one step: what GET shows is "
             "what CL.LIMIT enforces).", ""]
    if not lat:
        return lines + [f"- **not measured**: no change was seen on every node within "
                        f"{CHANGE_TIMEOUT_S:.0f} s", ""]
    lines += ["| | p50 ms | p99 ms | max ms | mean ms |", "|---|---:|---:|---:|---:|"]
    for label, values in (("UPDATE sent → committed (its reply)", commit),
                          ("UPDATE sent → the first node shows it", first),
                          (f"**UPDATE sent → every node shows it** (n = {len(lat):,})", lat),
                          ("committed (its reply) → every node shows it", out["after_commit"])):
        lines.append(f"| {label} | {pct(values, 50):.2f} | {pct(values, 99):.2f} | "
                     f"{max(values):.2f} | {statistics.fmean(values):.2f} |")
    lines += ["", f"The {out['wall_s']:.1f} s of changes took {out['nodes_cpu_s']:.1f} s of the "
                  f"nodes' CPU (utime+stime, all {args.nodes}) and {out['bench_cpu_s']:.1f} s of "
                  f"this script's ({poll}), on {os.cpu_count()} CPUs: most of it is the "
                  "polling, which competes with PostgreSQL and the nodes for the same cores."]
    if out["missed"]:
        lines += ["", f"**{out['missed']} change(s) not seen on every node within "
                      f"{CHANGE_TIMEOUT_S:.0f} s** (left out of the figures above)"]
    lines += ["", "Each node's own view (`INFO rules`: the lag is from the trigger's "
                  "`clock_timestamp()` at the change, in whole ms, to the rows applied here; "
                  "`rules_store_lag_ms` is the last change's):", "",
              "| node | state | notifications | rules_store_lag_ms | rules_store_max_lag_ms | "
              "full reads | connects | rows applied |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    fields = ("state", "notifications", "lag_ms", "max_lag_ms", "full_reads", "connects",
              "rows_applied")
    for port, info in out["info"]:
        lines.append(f"| :{port} | " + " | ".join(str(info.get(f"rules_store_{name}"))
                                                 for name in fields) + " |")
    p99 = pct(lat, 99)
    met = p99 <= TARGET_P99_MS and not out["missed"]
    lines += ["", f"`pg_notification_queue_usage()` at the end: {out['queue']}.", "",
              "| how a change reaches every node | commit (or file change) to in force |",
              "|---|---|",
              f"| fastlimit, PostgreSQL rules-store, measured here ({args.nodes} nodes) | p50 "
              f"{pct(lat, 50):.1f} ms, p99 {p99:.1f} ms, max {max(lat):.1f} ms |",
              f"| {DESIGN[0]} | {DESIGN[1]} |",
              f"| {ENVOY[0]} | {ENVOY[1]} |", "",
              f"- target: p99 ≤ {TARGET_P99_MS:.0f} ms on every node: {p99:.1f} ms — "
              f"**{'met' if met else 'MISSED'}**", ""]
    return lines


# ---------------------------------------------------------------------------
# 2. start with N rules

def timed_start(workdir: Path, extra: list[str], rules: int, store: bool) -> float:
    """Seconds from the spawn to the ready line; the node is checked (every
    rule in force, the store connected) and stopped."""
    argv = [sys.executable, "-m", "fastlimit.server", "--port", "0", "--snapshot-file", "",
            "--http-port", "0", "--grpc-port", "0", *extra]
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=workdir, preexec_fn=_die_with_parent)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    seen, port, ready = [], 0, 0.0
    try:
        for line in proc.stdout:
            text = line.decode(errors="replace")
            seen.append(text)
            m = READY.search(text)
            if m:
                ready = time.perf_counter() - began
                port = int(m.group(1))
                break
        if not port:
            raise RuntimeError("the node never became ready:\n" + "".join(seen[-20:]))
        c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
        info = c.info("rules")
        c.close()
        if info["rules"] != rules or (store and info["rules_store_state"] != "connected"):
            raise RuntimeError(f"started with {info['rules']} rules (expected {rules}), "
                               f"store {info.get('rules_store_state')}")
        return ready
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def fill_sqlite(workdir: Path, path: Path, rules: int) -> float:
    """rules CL.RULE SETs, pipelined, into a node on the SQLite file at path."""
    node = Fastlimit(workdir, ["--rules-db", str(path)])
    try:
        node.wait_ready(timeout=60)
        c = node.client(socket_timeout=600)
        began = time.perf_counter()
        for start in range(1, rules + 1, 1000):
            pipe = c.pipeline(transaction=False)
            for i in range(start, min(rules, start + 999) + 1):
                pipe.execute_command("CL.RULE", "SET", f"bulk{i}", json.dumps(
                    {"match": {"resource": f"r{i}"}, "capacity": 5, "refill_per_second": 1}))
            pipe.execute()
        took = time.perf_counter() - began
        assert c.info("rules")["rules"] == rules
        c.close()
        return took
    finally:
        node.stop()


KINDS = [("none", "no rules (an empty `--rules-db`)"),
         ("sqlite", "`--rules-db` SQLite file holding them"),
         ("pg-cold", "`--rules-store` PostgreSQL holding them, empty cache (a new node)"),
         ("pg-warm", "`--rules-store` PostgreSQL holding them, cache holding them (a restart)")]


def starts(args, pg: PostgresServer, workdir: Path) -> dict:
    url = pg.create_database()
    db = db_of(url)
    pg.sql(SCHEMA_DDL, db)
    began = time.perf_counter()
    pg.sql(f"INSERT INTO {TABLE} (id, doc) SELECT 'bulk' || i, jsonb_build_object('match', "
           "jsonb_build_object('resource', 'r' || i), 'capacity', 5, 'refill_per_second', 1) "
           f"FROM generate_series(1, {args.rules}) i", db)
    out: dict = {"insert_s": time.perf_counter() - began, "times": {k: [] for k, _ in KINDS}}
    sqlite, warm = workdir / "rules.db", workdir / "warm-cache.db"
    out["fill_s"] = fill_sqlite(workdir, sqlite, args.rules)
    log(f"  {args.rules:,} rules: INSERT … SELECT {out['insert_s']:.2f} s, {args.rules:,} "
        f"pipelined CL.RULE SET into SQLite {out['fill_s']:.2f} s")
    fresh = iter(range(10**6))

    def extra(kind: str) -> tuple[list[str], int, bool]:
        if kind == "none":
            return ["--rules-db", str(workdir / f"empty{next(fresh)}.db")], 0, False
        if kind == "sqlite":
            return ["--rules-db", str(sqlite)], args.rules, False
        cache = warm if kind == "pg-warm" else workdir / f"cold{next(fresh)}.db"
        return ["--rules-store", url, "--rules-db", str(cache)], args.rules, True

    # unmeasured: fills the warm cache, and brings the files and the
    # database's pages into memory for every kind alike
    for kind in ("pg-warm", "sqlite", "pg-cold"):
        timed_start(workdir, *extra(kind))
    for rep in range(args.starts):
        order = [k for k, _ in KINDS]
        order = order[rep % len(order):] + order[:rep % len(order)]
        for kind in order:
            t = timed_start(workdir, *extra(kind))
            out["times"][kind].append(t)
            log(f"  [{rep + 1}/{args.starts}] {kind:8} ready in {t * 1e3:.0f} ms")
    return out


def start_lines(args, out: dict) -> list[str]:
    times = out["times"]
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    lines = [f"## 2. Start with {args.rules:,} rules", "",
             "From the spawn of `fastlimit-server` (`python -m fastlimit.server`) to its "
             "`ready to accept connections` line, every rule in force (checked with "
             f"`INFO rules` after), median of {args.starts} start(s) per kind, interleaved. "
             f"The rules: `INSERT … SELECT generate_series` of {args.rules:,} rows with distinct "
             f"resources ({out['insert_s']:.2f} s); the SQLite file made by {args.rules:,} "
             f"pipelined `CL.RULE SET` into a node on it ({out['fill_s']:.1f} s), then "
             "restarted.", "",
             "| node | ready, median ms | starts, ms | vs SQLite | minus no rules, ms |",
             "|---|---:|---|---:|---:|"]
    for kind, label in KINDS:
        runs = ", ".join(f"{t * 1e3:.0f}" for t in times[kind])
        ratio = f"{med[kind] / med['sqlite']:.2f}×" if kind != "none" else "–"
        lines.append(f"| {label} | {med[kind]:.0f} | {runs} | {ratio} | "
                     f"{med[kind] - med['none']:.0f} |")
    extra_cold = med["pg-cold"] - med["none"]
    extra_sqlite = med["sqlite"] - med["none"]
    lines += ["", f"- PostgreSQL (new node) ÷ SQLite: **{med['pg-cold'] / med['sqlite']:.2f}×** "
                  f"the whole start; the rules' own part (minus the start with none): "
                  f"{extra_cold:.0f} ms against {extra_sqlite:.0f} ms"
                  + (f" ({extra_cold / extra_sqlite:.2f}×)" if extra_sqlite > 0 else "") + ".",
              ""]
    return lines


# ---------------------------------------------------------------------------
# 3. instructions per CL.LIMIT with the store attached

def limit_burst(port: int, n: int) -> int:
    """n CL.LIMIT for one rule, BATCH per write, every reply read and
    checked (the rule's limit, no error); the replies counted."""
    import socket  # noqa: PLC0415

    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        got = 0
        for start in range(0, n, BATCH):
            count = min(BATCH, n - start)
            s.sendall(b"".join(resp("CL.LIMIT", b"user:%d" % ((start + j) % 1000), "api")
                               for j in range(count)))
            data = b""
            while data.count(b"*5\r\n") < count:
                chunk = s.recv(1 << 16)
                if not chunk:
                    raise RuntimeError("the server closed the connection")
                data += chunk
            if data.count(b":%d\r\n" % CALLGRIND_RULE["capacity"]) != count or b"-" in data:
                raise RuntimeError(f"unexpected CL.LIMIT replies: {data[:200]!r}")
            got += count
        return got


def callgrind_part(args, pg: PostgresServer, workdir: Path) -> dict:
    url = pg.create_database()
    db = db_of(url)
    rule = json.dumps(CALLGRIND_RULE)
    # The rule is in place before the measured servers start, so nothing but
    # CL.LIMIT ever reaches their data_received.
    pg.sql(SCHEMA_DDL, db)
    pg.sql(f"INSERT INTO {TABLE} (id, doc) VALUES ('api', '{rule}')", db)
    sqlite = workdir / "cg-sqlite.db"
    node = Fastlimit(workdir, ["--rules-db", str(sqlite)])
    try:
        node.wait_ready(timeout=60)
        c = node.client()
        c.execute_command("CL.RULE", "SET", "api", rule)
        c.close()
    finally:
        node.stop()
    sides = {"sqlite": ["--rules-db", str(sqlite)],
             # the timeout: a statement under callgrind takes far longer than 2 s
             "postgresql": ["--rules-store", url, "--rules-db", str(workdir / "cg-cache.db"),
                            "--rules-store-timeout", "120"]}
    servers: dict[str, Callgrinded] = {}
    out: dict = {"ir": {}, "calls": {}}
    try:
        for who, extra in sides.items():    # both start at once: ~20 s each under callgrind
            servers[who] = Callgrinded(workdir, workdir / f"callgrind-{who}.out", extra)
        for srv in servers.values():
            srv.wait_ready(timeout=CALLGRIND_START_S)
        for who, srv in servers.items():
            began = time.monotonic()
            out["calls"][who] = limit_burst(srv.port, args.callgrind_n)
            log(f"  callgrind {who}: {out['calls'][who]:,} CL.LIMIT in "
                f"{time.monotonic() - began:.1f} s")
        for who, srv in servers.items():
            srv.stop_and_dump()
            out["ir"][who] = data_received_ir(srv.callgrind_out) / out["calls"][who]
            log(f"  callgrind {who}: {out['ir'][who]:,.1f} instructions per CL.LIMIT")
    finally:
        for srv in servers.values():
            srv.stop()
    return out


def callgrind_lines(args, out: dict | None, reason: str = "") -> list[str]:
    lines = ["## 3. Instructions per CL.LIMIT, the store attached and idle", ""]
    if out is None:
        return lines + [f"- **not measured**: {reason}", ""]
    sqlite, store = out["ir"]["sqlite"], out["ir"]["postgresql"]
    ratio = store / sqlite
    lines += [f"Two servers under `valgrind --tool=callgrind`, started together, each with one "
              f"rule loaded at start (`{json.dumps(CALLGRIND_RULE)}`): one on the SQLite "
              "rules-db, one following a PostgreSQL rules-store (connected, its heartbeat and "
              f"resync running). Each sent {args.callgrind_n:,} `CL.LIMIT user:<i mod 1000> api`, "
              f"{BATCH} per write, every reply read; nothing else reaches their RESP "
              "connections. Instructions of `Connection.data_received` and all it calls "
              "(`callgrind_annotate --inclusive=yes`), per CL.LIMIT:", "",
              "| rules | instructions per CL.LIMIT | ratio |", "|---|---:|---:|",
              f"| SQLite `--rules-db` (the default) | {sqlite:,.1f} | 1.000 |",
              f"| PostgreSQL `--rules-store`, attached and idle | {store:,.1f} | {ratio:.4f} |", "",
              f"- the check path with the store attached: {ratio:.4f}× — "
              f"**{'unchanged' if abs(ratio - 1) <= 0.01 else 'CHANGED'}** (within 1%)", ""]
    return lines


# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    grind_reason = ""
    if args.callgrind_n and "3" in args.parts:
        missing = [t for t in ("valgrind", "callgrind_annotate") if not shutil.which(t)]
        if missing:
            log(f"error: {', '.join(missing)} not found (Debian's valgrind); part 3 needs it "
                "(--quick leaves it out)")
            return 2
    else:
        grind_reason = ("left out with --quick (two servers' start under callgrind alone takes "
                        "~20 s); run without --quick, or give --callgrind-n")
    started = time.monotonic()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "rev": git_rev(), "load": " ".join(open("/proc/loadavg").read().split()[:3])}
    parts = set(args.parts.split(","))
    report: list[str] = []
    pg = None
    try:
        with tempfile.TemporaryDirectory(prefix="fastlimit-bench-store-") as tmp:
            workdir = Path(tmp)
            log("== a throw-away PostgreSQL")
            pg = PostgresServer().start()
            meta["pg"] = pg.sql("SHOW server_version")
            if "1" in parts:
                log(f"== 1. {args.changes:,} plain-SQL changes, {args.nodes} nodes")
                report += propagation_lines(args, propagation(args, pg, workdir))
            if "2" in parts:
                log(f"== 2. start with {args.rules:,} rules, {args.starts} start(s) per kind")
                report += start_lines(args, starts(args, pg, workdir))
            if "3" in parts:
                if args.callgrind_n:
                    log(f"== 3. callgrind: {args.callgrind_n:,} CL.LIMIT, SQLite vs the store")
                    report += callgrind_lines(args, callgrind_part(args, pg, workdir))
                else:
                    log(f"== 3. not measured: {grind_reason}")
                    report += callgrind_lines(args, None, grind_reason)
    finally:
        if pg is not None:
            pg.remove()
    meta["elapsed"] = time.monotonic() - started
    head = ["# fastlimit: the PostgreSQL rules-store", "",
            f"{meta['when']} · {meta['machine']} · load average {meta['load']} at the start · "
            f"rev {meta['rev']} · PostgreSQL {meta['pg']} (fsync off, loopback) · "
            f"{meta['elapsed']:.0f} s", ""]
    publish("\n".join(head + report), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
