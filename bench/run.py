#!/usr/bin/env python3
"""fastlimit vs redis-server + the token-bucket Lua script, side by side.

One run:
  1. starts fastlimit (this interpreter, ``-m fastlimit.server --port 0``) and
     a redis-server 7.0 on free loopback ports, loads bench/token_bucket.lua
     into redis with SCRIPT LOAD;
  2. runs redis-benchmark with identical settings against both, interleaved
     (fastlimit then redis for each row, the order flipping on every repeat):
     CL.CHECK vs EVALSHA of the Lua script and PING, at -P 1 and -P 16;
  3. measures bytes per key at 1,000,000 keys of 17 bytes on fresh servers;
  4. prints one markdown table plus the targets, and writes it to
     bench/results/latest.md.

It reports; it does not judge by exit code: a missed target still exits 0.
Only the standard library and redis-py are used.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
LUA_PATH = BENCH_DIR / "token_bucket.lua"
RESULTS = BENCH_DIR / "results" / "latest.md"
READY = re.compile(r"ready to accept connections on .* port (\d+)")
PAGE = os.sysconf("SC_PAGE_SIZE")

# Defaults: a few seconds per run on the 2-core machine.
DEFAULT_N1 = 200_000        # requests per run at -P 1
DEFAULT_N16 = 2_000_000     # requests per run at -P 16
QUICK_N1 = 40_000
QUICK_N16 = 300_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# servers

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the bench process dies, even
    by SIGKILL, so no server outlives it (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Server:
    """A child server process with its log in a temp file."""

    name = "server"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.logpath = workdir / f"{self.name}-{id(self)}.log"

    def _spawn(self, argv: list[str], env=None) -> None:
        self.logfile = open(self.logpath, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.logfile, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.workdir, env=env,
                                     preexec_fn=_die_with_parent)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.logpath.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, **kw) -> redis.Redis:
        kw.setdefault("socket_timeout", 60)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            if self._ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n" + self.log_tail())

    def _ready(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.logfile.close()
        self.proc = None


class Fastlimit(Server):
    name = "fastlimit"

    def __init__(self, workdir: Path, extra: list[str] = ()):
        super().__init__(workdir)
        env = dict(os.environ)
        # The installed package (make bench installs it into .venv) wins; a
        # development tree with an in-place build works too.
        probe = subprocess.run([sys.executable, "-c", "import fastlimit._core"],
                               capture_output=True, cwd=workdir)
        self.source = "installed package"
        if probe.returncode != 0 and (REPO / "src" / "fastlimit").is_dir():
            self.source = "src/ tree"
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
        # Nothing on disk: rules in memory, no snapshot at exit.
        self._spawn([sys.executable, "-m", "fastlimit.server", "--port", "0",
                     "--rules-db", "", "--snapshot-file", "", "--http-port", "0", "--grpc-port", "0",
                     *extra], env)

    def _ready(self) -> bool:
        m = READY.search(self.logpath.read_text(errors="replace"))
        if m:
            self.port = int(m.group(1))
            return True
        return False


class RedisServer(Server):
    name = "redis"

    def __init__(self, workdir: Path, binary: str, extra: list[str] = ()):
        super().__init__(workdir)
        self.port = free_port()
        self._spawn([binary, "--port", str(self.port), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--dir", str(workdir),
                     "--daemonize", "no", "--logfile", "", *extra])

    def _ready(self) -> bool:
        c = self.client(socket_timeout=1)
        try:
            return bool(c.ping())
        except redis.RedisError:
            return False
        finally:
            c.close()


# ---------------------------------------------------------------------------
# redis-benchmark

@dataclass
class Result:
    rps: float
    p50: float
    p99: float


@dataclass
class Row:
    label: str
    pipeline: int
    fl: list[Result] = field(default_factory=list)
    rd: list[Result] = field(default_factory=list)
    fl_errors: list[str] = field(default_factory=list)
    rd_errors: list[str] = field(default_factory=list)


def run_benchmark(binary: str, port: int, clients: int, n: int, pipeline: int,
                  command: list[str], random_keys: int | None, cluster: bool = False,
                  extra: list[str] = ()) -> Result:
    argv = [binary, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
            "-n", str(n), "-P", str(pipeline), "--csv", *(["--cluster"] if cluster else []),
            *extra]
    if random_keys:
        argv += ["-r", str(random_keys)]
    argv += command
    # generous: the slowest case (Lua at ~100k req/s) plus start-up
    timeout = 30 + n / 20_000
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_die_with_parent)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"redis-benchmark timed out after {timeout:.0f} s")
    # --cluster prints the masters it found before the CSV
    header = proc.stdout.find('"test",')
    rows = list(csv.DictReader(io.StringIO(proc.stdout[max(header, 0):])))
    if proc.returncode != 0 or not rows:
        err = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines()
               or ["no output"])
        raise RuntimeError(f"redis-benchmark exit {proc.returncode}: {err[-1][:200]}")
    r = rows[-1]
    return Result(float(r["rps"]), float(r["p50_latency_ms"]), float(r["p99_latency_ms"]))


def median_result(results: list[Result]) -> Result | None:
    if not results:
        return None
    return Result(statistics.median(r.rps for r in results),
                  statistics.median(r.p50 for r in results),
                  statistics.median(r.p99 for r in results))


# ---------------------------------------------------------------------------
# bytes per key

def keys_17(count: int):
    for i in range(count):
        yield b"key:%013d" % i           # 17 bytes


def fill(client: redis.Redis, count: int, make_args, batch: int) -> float:
    t0 = time.monotonic()
    keys = keys_17(count)
    done = 0
    while done < count:
        pipe = client.pipeline(transaction=False)
        n = min(batch, count - done)
        for _ in range(n):
            pipe.execute_command(*make_args(next(keys)))
        replies = pipe.execute(raise_on_error=True)
        if len(replies) != n:
            raise RuntimeError(f"expected {n} replies, got {len(replies)}")
        done += n
    return time.monotonic() - t0


def measure_memory(srv, count: int, batch: int, data_label: str, command_for) -> dict:
    """Fills a fresh server with `count` keys and reports its growth: RSS,
    and the server's own view (INFO memory field `data_label`).
    command_for(client) returns the key -> command function."""
    try:
        srv.wait_ready()
        c = srv.client()
        make_command = command_for(c)
        info0 = c.info("memory")
        rss0 = rss_bytes(srv.pid)
        secs = fill(c, count, make_command, batch)
        c.ping()
        rss1 = rss_bytes(srv.pid)
        info1 = c.info("memory")
        keys = c.dbsize()
        c.close()
    finally:
        srv.stop()
    d0, d1 = int(info0.get(data_label, 0)), int(info1.get(data_label, 0))
    return {"keys": keys, "secs": secs, "rss0": rss0, "rss1": rss1,
            "rss_per_key": (rss1 - rss0) / max(keys, 1),
            "data_label": data_label, "data0": d0, "data1": d1,
            "data_per_key": (d1 - d0) / max(keys, 1),
            "table_per_key": info1.get("bucket_table_bytes_per_key")}


def memory_fastlimit(workdir: Path, count: int, batch: int) -> dict:
    # The manual clock never moves, so no bucket refills and the sweep keeps all.
    return measure_memory(Fastlimit(workdir, ["--manual-clock"]), count, batch,
                          "used_memory_dataset",
                          lambda c: lambda k: ("CL.CHECK", k, 100, 1, "PERIOD", 3600000))


def memory_redis(workdir: Path, binary: str, lua: bytes, count: int, batch: int) -> dict:
    def command_for(c):
        sha = c.script_load(lua)
        # An explicit now_ms (ARGV[4]) makes the script use a 1-hour PEXPIRE,
        # so no key expires during the measurement; the hash and its expire
        # entry are the same as in production.
        now = int(time.time() * 1000)
        return lambda k: ("EVALSHA", sha, 1, k, 100, 1, 1, now)

    return measure_memory(RedisServer(workdir, binary), count, batch, "used_memory",
                          command_for)


# ---------------------------------------------------------------------------
# report

def fmt_rps(x: float | None) -> str:
    if x is None:
        return "–"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    return f"{x / 1e3:.0f}k"


def fmt_ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}×"


def target_line(text: str, value: float | None, goal: float, higher_is_better=True,
                unit: str = "×") -> str:
    if value is None:
        return f"- {text}: **not measured**"
    met = value >= goal if higher_is_better else value <= goal
    shown = f"{value:.2f}{unit}" if unit == "×" else f"{value:.1f} {unit}"
    return f"- {text}: {shown} — **{'met' if met else 'MISSED'}**"


def machine_line() -> str:
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model or platform.machine()}), Linux {platform.release()}"


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=REPO,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev + ("+dirty src" if dirty else "") if rev else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def tool_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=5).stdout
        m = re.search(r"v=(\S+)|(\d+\.\d+\.\d+)", out)
        return (m.group(1) or m.group(2)) if m else out.strip()
    except OSError:
        return "?"


def build_report(args, rows: list[Row], mem: dict, meta: dict) -> str:
    out = []
    out.append("## fastlimit vs redis-server (token-bucket Lua script)")
    out.append("")
    out.append(f"{meta['when']} · {meta['machine']} · fastlimit at git {meta['rev']} "
               f"({meta['fl_loop']}) · redis-server {meta['redis_version']} · "
               f"redis-benchmark -c {args.clients}, -n {args.n1:,} at P=1 / "
               f"{args.n16:,} at P=16, -r 1000000 for the checks · median of "
               f"{args.repeat} interleaved run(s) · {meta['elapsed']:.0f} s in total")
    out.append("")
    out.append("| command (fastlimit / redis) | P | fastlimit req/s | p50 ms | p99 ms "
               "| redis req/s | p50 ms | p99 ms | ratio |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = {}
    for row in rows:
        f, r = median_result(row.fl), median_result(row.rd)
        med[(row.label, row.pipeline)] = (f, r)
        out.append(f"| {row.label} | {row.pipeline} | {fmt_rps(f and f.rps)} | "
                   f"{fmt_ms(f and f.p50)} | {fmt_ms(f and f.p99)} | {fmt_rps(r and r.rps)} | "
                   f"{fmt_ms(r and r.p50)} | {fmt_ms(r and r.p99)} | "
                   f"{fmt_ratio(f and f.rps, r and r.rps)} |")
    out.append("")
    if args.repeat > 1:
        spread = []
        for row in rows:
            if row.fl and row.rd:
                spread.append(
                    f"{row.label.split(' ')[0]} P={row.pipeline}: fastlimit "
                    f"{fmt_rps(min(x.rps for x in row.fl))}–{fmt_rps(max(x.rps for x in row.fl))}, "
                    f"redis {fmt_rps(min(x.rps for x in row.rd))}–{fmt_rps(max(x.rps for x in row.rd))}")
        out.append("Spread of req/s over the runs: " + "; ".join(spread) + ".")
        out.append("")
    errors = [f"{row.label} P={row.pipeline} {who}: {e}" for row in rows
              for who, errs in (("fastlimit", row.fl_errors), ("redis", row.rd_errors))
              for e in errs]
    if errors:
        out.append("Failed runs (left out of the medians):")
        out += [f"- {e}" for e in errors]
        out.append("")

    def rps(label, p, side):
        f, r = med.get((label, p), (None, None))
        x = f if side == "fl" else r
        return x.rps if x else None

    def ratio(a, b):
        return a / b if a and b else None

    chk, ping = rows[0].label, rows[2].label
    out.append("Targets (ratios measured side by side in this run):")
    out.append(target_line("P=16: CL.CHECK ≥ 5× the Lua script's rate",
                           ratio(rps(chk, 16, "fl"), rps(chk, 16, "rd")), 5.0))
    out.append(target_line("P=16: CL.CHECK ≥ 0.5× redis-server's PING rate",
                           ratio(rps(chk, 16, "fl"), rps(ping, 16, "rd")), 0.5))
    out.append(target_line("P=1: CL.CHECK ≥ 1.0× the Lua script's rate",
                           ratio(rps(chk, 1, "fl"), rps(chk, 1, "rd")), 1.0))
    out.append(target_line("P=16: CL.LIMIT with two matching rules ≥ 0.5× CL.CHECK",
                           ratio(rps(LIMIT_ROW, 16, "fl"), rps(chk, 16, "fl")), 0.5))
    if mem.get("fastlimit"):
        m = mem["fastlimit"]
        out.append(target_line(
            f"bytes per key at {m['keys']:,} keys ≤ 64 (process RSS growth; bucket table "
            f"alone {m['table_per_key']} B/key)", m["rss_per_key"], 64.0,
            higher_is_better=False, unit="B/key"))
    else:
        out.append("- bytes per key ≤ 64: **not measured**" +
                   (f" ({mem['error']})" if mem.get("error") else " (--skip-memory)"))
    out.append("")

    if mem.get("fastlimit") or mem.get("redis"):
        out.append(f"Bytes per key, {args.keys:,} distinct 17-byte keys (`key:%013d`), fresh "
                   "servers, pipelined in batches of "
                   f"{args.batch:,}:")
        out.append("")
        out.append("| server | keys stored | RSS before → after | RSS Δ / key "
                   "| allocator view Δ / key | fill time |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for name, what in (("fastlimit", "fastlimit `CL.CHECK k 100 1 PERIOD 3600000`, "
                            "manual clock"),
                           ("redis", "redis-server + Lua (`EVALSHA`, hash + 1 h PEXPIRE)")):
            m = mem.get(name)
            if not m:
                continue
            out.append(f"| {what} | {m['keys']:,} | {m['rss0'] / 2**20:.1f} → "
                       f"{m['rss1'] / 2**20:.1f} MiB | {m['rss_per_key']:.1f} B | "
                       f"{m['data_per_key']:.1f} B (`{m['data_label']}`) | {m['secs']:.1f} s |")
        if mem.get("fastlimit") and mem.get("redis"):
            f, r = mem["fastlimit"], mem["redis"]
            out.append("")
            out.append(f"fastlimit uses {r['rss_per_key'] / f['rss_per_key']:.1f}× less RSS "
                       f"per key than redis + Lua." if f["rss_per_key"] > 0 else "")
        out.append("")
    if mem.get("error") and (mem.get("fastlimit") or mem.get("redis")):
        out.append(f"Memory measurement error: {mem['error']}")
        out.append("")
    out.append("Commands: fastlimit `CL.CHECK key:__rand_int__ 100 10`; redis "
               "`EVALSHA <sha of bench/token_bucket.lua> 1 key:__rand_int__ 100 10 1`; "
               "`PING` on both. Ratio = fastlimit req/s ÷ redis req/s on the same row. "
               f"CL.LIMIT row: `CL.LIMIT user:__rand_int__ \"{LIMIT_RESOURCE}\"` with the "
               "rules " + ", ".join(f"`{k}` {json.dumps(v)}" for k, v in LIMIT_RULES.items()) +
               "; its target compares it with CL.CHECK P=16 above.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"short run (-n {QUICK_N1:,}/{QUICK_N16:,}, 1 repeat): under ~40 s")
    p.add_argument("--repeat", type=int, help="interleaved runs per row, median taken "
                   "(default 3, 1 with --quick)")
    p.add_argument("--n1", type=int, help=f"requests per run at -P 1 (default {DEFAULT_N1:,})")
    p.add_argument("--n16", type=int, help=f"requests per run at -P 16 (default {DEFAULT_N16:,})")
    p.add_argument("--clients", type=int, default=50, help="redis-benchmark -c (default 50)")
    p.add_argument("--keys", type=int, default=1_000_000,
                   help="keys for the bytes-per-key measurement (default 1,000,000)")
    p.add_argument("--batch", type=int, default=10_000, help="pipeline batch for the fill")
    p.add_argument("--skip-memory", action="store_true", help="skip bytes per key")
    p.add_argument("--skip-throughput", action="store_true", help="skip redis-benchmark runs")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    p.add_argument("--output", type=Path, default=RESULTS,
                   help="also write the report here (default bench/results/latest.md)")
    args = p.parse_args(argv)
    args.n1 = args.n1 or (QUICK_N1 if args.quick else DEFAULT_N1)
    args.n16 = args.n16 or (QUICK_N16 if args.quick else DEFAULT_N16)
    args.repeat = max(1, args.repeat or (1 if args.quick else 3))
    return args


# CL.LIMIT with two rules matching one resource, against CL.CHECK on the
# same server: the cost of named rules (matching, two buckets, all or nothing).
LIMIT_ROW = "CL.LIMIT, 2 matching rules (fastlimit only)"
LIMIT_RESOURCE = "POST /orders"
LIMIT_RULES = {
    "orders-burst": {"match": {"resource": "POST /orders"}, "capacity": 100,
                     "refill_per_second": 10},
    "writes-hourly": {"match": {"resource": "POST *"}, "algorithm": "sliding_window",
                      "limit": 1000, "window_ms": 3600000},
}


def throughput(args, workdir: Path, lua: bytes, meta: dict) -> list[Row]:
    check, ping = "CL.CHECK vs EVALSHA token_bucket.lua", "PING"
    rows = [Row(check, 1), Row(check, 16), Row(ping, 1), Row(ping, 16), Row(LIMIT_ROW, 16)]
    fl = rd = None
    try:
        fl = Fastlimit(workdir)
        rd = RedisServer(workdir, args.redis_server)
        fl.wait_ready()
        rd.wait_ready()
        c = fl.client()
        m = re.search(r"\((\w+) loop", fl.log_tail(50))
        meta["fl_loop"] = f"{fl.source}, {m.group(1) if m else '?'} loop"
        reply = c.execute_command("CL.CHECK", "bench:probe", 100, 10)
        if len(reply) != 5:
            raise RuntimeError(f"fastlimit CL.CHECK replied {reply!r}")
        for rule_id, rule in LIMIT_RULES.items():
            c.execute_command("CL.RULE", "SET", rule_id, json.dumps(rule))
        reply = c.execute_command("CL.LIMIT", "bench:probe", LIMIT_RESOURCE, "DETAIL")
        if len(reply[5]) != len(LIMIT_RULES):
            raise RuntimeError(f"fastlimit CL.LIMIT matched {reply!r}")
        c.close()
        r = rd.client()
        sha = r.script_load(lua)
        reply = r.evalsha(sha, 1, "bench:probe", 100, 10, 1)
        if len(reply) != 5:
            raise RuntimeError(f"redis EVALSHA replied {reply!r}")
        r.delete("bench:probe")
        r.close()
        log(f"fastlimit on port {fl.port} (pid {fl.pid}), redis on port {rd.port} "
            f"(pid {rd.pid}), script sha {sha}")

        commands = {
            check: (["CL.CHECK", "key:__rand_int__", "100", "10"],
                    ["EVALSHA", sha, "1", "key:__rand_int__", "100", "10", "1"], 1_000_000),
            ping: (["PING"], ["PING"], None),
            LIMIT_ROW: (["CL.LIMIT", "user:__rand_int__", LIMIT_RESOURCE], None, 1_000_000),
        }
        # warm-up (not measured): connections, allocator, tables, caches
        warm = max(10_000, args.n16 // 20)
        for srv, cmd in ((fl, commands[check][0]), (rd, commands[check][1])):
            run_benchmark(args.redis_benchmark, srv.port, args.clients, warm, 16, cmd,
                          1_000_000)
            run_benchmark(args.redis_benchmark, srv.port, args.clients, warm, 16,
                          ["PING"], None)
        for rep in range(args.repeat):
            for row in rows:
                fl_cmd, rd_cmd, rand = commands[row.label]
                n = args.n1 if row.pipeline == 1 else args.n16
                order = [("fastlimit", fl, fl_cmd, row.fl, row.fl_errors),
                         ("redis", rd, rd_cmd, row.rd, row.rd_errors)]
                if rep % 2:
                    order.reverse()      # neither side always goes first
                for who, srv, cmd, results, errors in order:
                    if cmd is None:
                        continue     # a fastlimit-only row
                    t0 = time.monotonic()
                    try:
                        res = run_benchmark(args.redis_benchmark, srv.port, args.clients, n,
                                            row.pipeline, cmd, rand)
                    except RuntimeError as e:
                        errors.append(str(e))
                        log(f"  [{rep + 1}/{args.repeat}] {row.label.split()[0]} "
                            f"P={row.pipeline} {who}: FAILED {e}")
                        continue
                    results.append(res)
                    log(f"  [{rep + 1}/{args.repeat}] {row.label.split()[0]:8} "
                        f"P={row.pipeline:<2} {who:9} {fmt_rps(res.rps):>6} req/s  "
                        f"p50 {res.p50:.3f}  p99 {res.p99:.3f} ms  "
                        f"({time.monotonic() - t0:.1f} s)")
    finally:
        for srv in (fl, rd):
            if srv is not None:
                srv.stop()
    return rows


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM (a timeout, a CI cancel) unwinds like Ctrl-C, so every
    # try/finally stops its servers.
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    lua = LUA_PATH.read_bytes()
    for tool in (args.redis_server, args.redis_benchmark):
        if not shutil.which(tool):
            log(f"error: {tool} not found (make bench installs Debian's redis-server "
                "and redis-tools)")
            return 2
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "rev": git_rev(), "redis_version": tool_version(args.redis_server),
            "fl_loop": "?"}
    rows: list[Row] = []
    mem: dict = {}
    with tempfile.TemporaryDirectory(prefix="fastlimit-bench-") as tmp:
        workdir = Path(tmp)
        if not args.skip_throughput:
            log(f"== throughput: redis-benchmark -c {args.clients}, -n {args.n1:,} (P=1) / "
                f"{args.n16:,} (P=16), {args.repeat} repeat(s)")
            rows = throughput(args, workdir, lua, meta)
        else:
            rows = [Row("CL.CHECK vs EVALSHA token_bucket.lua", 1),
                    Row("CL.CHECK vs EVALSHA token_bucket.lua", 16),
                    Row("PING", 1), Row("PING", 16)]
        if not args.skip_memory:
            log(f"== bytes per key: {args.keys:,} keys of 17 bytes")
            try:
                mem["fastlimit"] = memory_fastlimit(workdir, args.keys, args.batch)
                m = mem["fastlimit"]
                log(f"  fastlimit: {m['keys']:,} keys, RSS Δ/key {m['rss_per_key']:.1f} B, "
                    f"table {m['table_per_key']} B/key ({m['secs']:.1f} s)")
                mem["redis"] = memory_redis(workdir, args.redis_server, lua, args.keys,
                                            args.batch)
                m = mem["redis"]
                log(f"  redis:     {m['keys']:,} keys, RSS Δ/key {m['rss_per_key']:.1f} B, "
                    f"used_memory Δ/key {m['data_per_key']:.1f} B ({m['secs']:.1f} s)")
            except (RuntimeError, redis.RedisError, OSError) as e:
                mem["error"] = f"{type(e).__name__}: {e}"
                log(f"  FAILED: {mem['error']}")
    meta["elapsed"] = time.monotonic() - started
    report = build_report(args, rows, mem, meta)
    publish(report, args.output)
    return 0


def publish(report: str, output: Path) -> None:
    """Prints the report and keeps a copy in bench/results/."""
    print(report)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(report)
        log(f"written to {output}")
    except OSError as e:
        log(f"could not write {output}: {e}")


def run_cli(main) -> None:
    """Runs a benchmark's main; Ctrl-C or SIGTERM ends it with servers
    stopped, a server's error with its text (exit 1)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        log(f"interrupted ({e or 'Ctrl-C'}); servers stopped")
        sys.exit(130)
    except redis.RedisError as e:
        log(f"error: {e}")
        sys.exit(1)


def report_meta() -> dict:
    """What a report's first lines say of its run: when, where, which
    build; its caller adds "elapsed"."""
    return {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "rev": git_rev()}


if __name__ == "__main__":
    run_cli(main)
