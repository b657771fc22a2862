#!/usr/bin/env python3
"""fastlimit's HTTP check vs what a Python team would build instead, and
what the HTTP front and /metrics cost the check path.

One run:
  1. starts fastlimit (this interpreter, ``-m fastlimit.server --port 0
     --http-port <free>``), a ``redis-server --save "" --appendonly no`` and
     bench/starlette_limits_app.py (Starlette on uvicorn, one worker,
     uvloop and httptools when importable, checking through the ``limits``
     library against that redis-server), each with the same two rules: one
     generous (every check allowed) and one whose buckets are spent before
     its runs (every check denied);
  2. for each rule, side by side, interleaved (the order flips on every
     repeat), each run with 50 connections and a fixed duration:
     - ``wrk -t 1 -c 50`` with bench/http_check.lua, keep-alive
       ``POST /v1/check`` with ``{"client_key", "resource", "cost": 1}``, the
       client key drawn at random from a fixed set for every request, against
       fastlimit, against the Starlette app's same-answer route and against
       its allowed-flag-only route;
     - ``redis-benchmark -c 50 -P 1 CL.LIMIT key:__rand_int__ <resource>``
       against fastlimit (the same keys, the same buckets);
     requests/s, latency percentiles, the allowed share, and the server CPU
     per request from /proc/<pid>/stat (redis-server's apart);
  3. the cost of the HTTP front and /metrics on the check path:
     ``redis-benchmark -P 16 CL.CHECK`` against a fastlimit with
     ``--http-port 0`` and one with an HTTP port scraped at /metrics once a
     second, interleaved: server CPU per CL.CHECK; then the same two under
     callgrind: instructions per CL.CHECK in the RESP connection, which the
     machine's noise does not move (valgrind; left out with --quick);
  4. one /metrics scrape with 1,000 rules: the median time of many GETs;
  5. prints one markdown report and writes it to bench/results/http.md.

It reports; it does not judge by exit code: a missed target still exits 0.
Needs wrk, redis-server, redis-benchmark, and starlette, uvicorn and limits
(the ``test`` extra).  See bench/README.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "http.md"
LUA = BENCH_DIR / "http_check.lua"
APP = BENCH_DIR / "starlette_limits_app.py"
sys.path.insert(0, str(BENCH_DIR))
from failover import cpu_seconds  # noqa: E402
from run import (  # noqa: E402
    Fastlimit,
    RedisServer,
    Server,
    _die_with_parent,
    _terminate,
    fmt_rps,
    free_port,
    git_rev,
    log,
    machine_line,
    publish,
    run_benchmark,
    run_cli,
    target_line,
    tool_version,
)

CONNECTIONS = 50
ANSWER = {"allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "rule"}
# The same two rules on every side, in the form both understand: fastlimit's
# rule document is built from it, and limits gets RateLimitItemPerSecond(limit,
# window_ms / 1000) keyed by (rule id, client key).
RULES = {
    # generous: 1,000 per key per second, with 10,000 keys every check passes
    "items": {"resource": "GET /api/items", "limit": 1000, "window_ms": 1000},
    # spent before its runs (cost = limit on every key): every check is denied.
    # A day-long window, so no window boundary falls inside a run.
    "login": {"resource": "POST /api/login", "limit": 5, "window_ms": 86_400_000},
}
VARIANTS = [("allowed", "items"), ("denied", "login")]
CHECK = ["CL.CHECK", "key:__rand_int__", "100", "10"]
CHECK_KEYS = 1_000_000
METRICS_RULES = 1000
CALLGRIND_START_S = 180     # a server's start (imports) under callgrind takes ~20 s

# sides of the throughput part, in table order
FL_HTTP = "fastlimit HTTP `POST /v1/check`"
ST_FULL = "Starlette + limits, same answer"
ST_HIT = "Starlette + limits, allowed flag only"
FL_RESP = "fastlimit RESP `CL.LIMIT`, -P 1"


def short(e: BaseException) -> str:
    """An error in one line: a server's exit carries its log's tail, the
    last line of which says why."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"


def key_name(i: int) -> str:
    """redis-benchmark's key:__rand_int__ (12 digits), as http_check.lua sends it."""
    return f"key:{i:012d}"


def fastlimit_rule(rule: dict, algorithm: str) -> str:
    return json.dumps({"match": {"resource": rule["resource"]}, "algorithm": algorithm,
                       "limit": rule["limit"], "window_ms": rule["window_ms"]})


# ---------------------------------------------------------------------------
# HTTP

def wait_http(port: int, path: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Until GET path answers at all (any status): the listener is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server on HTTP port {port} exited with {proc.returncode}")
        try:
            http_call(port, "GET", path, timeout=1)
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing answers HTTP on port {port} after {timeout:.0f} s")


def http_call(port: int, method: str, path: str, body: dict | None = None,
              timeout: float = 10, conn: http.client.HTTPConnection | None = None):
    """One request: (status, body bytes).  With conn, on that keep-alive connection."""
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        c.request(method, path, body=data, headers=headers)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        if own:
            c.close()


def probe_check(port: int, path: str, resource: str, key: str) -> dict:
    status, body = http_call(port, "POST", path, {"client_key": key, "resource": resource,
                                                 "cost": 1})
    if status != 200:
        raise RuntimeError(f"POST {path} on port {port} answered {status}: {body[:200]!r}")
    return json.loads(body)


# ---------------------------------------------------------------------------
# servers

class StarletteApp(Server):
    name = "starlette"

    def __init__(self, workdir: Path, redis_port: int, strategy: str):
        super().__init__(workdir)
        self.port = free_port()
        self._spawn([sys.executable, str(APP), "--port", str(self.port),
                     "--redis-url", f"redis://127.0.0.1:{redis_port}",
                     "--rules", json.dumps(RULES), "--strategy", strategy])

    def _ready(self) -> bool:
        try:
            return http_call(self.port, "GET", "/stats", timeout=1)[0] == 200
        except OSError:
            return False

    def banner(self) -> str:
        m = re.search(r"starlette_limits_app: (.*)", self.log_tail(50))
        return m.group(1) if m else "?"

    def counts(self) -> tuple[int, int]:
        doc = json.loads(http_call(self.port, "GET", "/stats")[1])
        return doc["allowed"], doc["denied"]


def fastlimit_http(workdir: Path, extra: list[str] = ()) -> tuple[Fastlimit, int]:
    port = free_port()
    fl = Fastlimit(workdir, ["--http-port", str(port), *extra])
    try:
        fl.wait_ready()
        wait_http(port, "/livez", fl.proc)
    except RuntimeError:
        fl.stop()
        raise
    return fl, port


def rule_counts(c: redis.Redis, rule_id: str) -> tuple[int, int]:
    reply = c.execute_command("CL.RULE", "STATS", rule_id)
    if isinstance(reply, list):              # RESP2: a flat list of pairs
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    stats = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in reply.items()}
    return stats["allowed"], stats["denied"]


# ---------------------------------------------------------------------------
# load generators

@dataclass
class Run:
    rps: float
    p50: float              # ms
    p90: float | None
    p99: float
    cpu: float              # server µs per request
    redis_cpu: float | None  # redis-server µs per request (the Starlette stack)
    allowed: float | None   # share of checks allowed
    errors: int = 0


def run_wrk(port: int, path: str, seconds: int, keys: int, resource: str) -> dict:
    argv = ["wrk", "-t", "1", "-c", str(CONNECTIONS), "-d", f"{seconds}s",
            "--timeout", "5s", "-s", str(LUA), f"http://127.0.0.1:{port}{path}",
            "--", str(keys), resource, "1"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60,
                              preexec_fn=_die_with_parent)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"wrk did not end {seconds + 60:.0f} s after starting") from None
    m = re.search(r"^WRK_JSON (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        err = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise RuntimeError(f"wrk exit {proc.returncode}: {err[:200]}")
    doc = json.loads(m.group(1))
    if not doc["requests"]:
        raise RuntimeError("wrk completed no request")
    return doc


@dataclass
class Side:
    name: str
    runs: list[Run] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def median(self, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.runs if getattr(r, attr) is not None]
        return statistics.median(values) if values else None


class Throughput:
    """The servers of part 1 and one measured run of each side."""

    def __init__(self, args, workdir: Path):
        self.args = args
        self.fl = self.rd = self.app = None
        self.no_front = ""
        self.resp_n: dict[str, int] = {}
        try:
            self._start(workdir)
        except BaseException:
            self.stop()
            raise

    def _start(self, workdir: Path) -> None:
        try:
            self.fl, self.fl_http = fastlimit_http(workdir)
        except RuntimeError as e:
            # a build without the HTTP front: the other sides still run
            self.no_front = short(e)
            self.fl, self.fl_http = Fastlimit(workdir), None
            self.fl.wait_ready()
        self.rd = RedisServer(workdir, self.args.redis_server)
        self.rd.wait_ready()
        self.app = StarletteApp(workdir, self.rd.port, self.args.strategy)
        self.app.wait_ready()
        self.c = self.fl.client()
        for rule_id, rule in RULES.items():
            self.c.execute_command("CL.RULE", "SET", rule_id,
                                   fastlimit_rule(rule, self.args.strategy))

    def stop(self) -> None:
        if getattr(self, "c", None) is not None:
            self.c.close()
        for srv in (self.fl, self.rd, self.app):
            if srv is not None:
                srv.stop()

    def check_answers(self) -> dict:
        """Both sides answer the same JSON for the same check before any run."""
        out = {}
        for rule_id, rule in RULES.items():
            for who, port in (("fastlimit", self.fl_http), ("starlette", self.app.port)):
                if port is None:
                    continue
                doc = probe_check(port, "/v1/check", rule["resource"], "probe")
                if not ANSWER <= doc.keys() or doc.get("rule") != rule_id:
                    raise RuntimeError(f"{who} answered {doc} for rule {rule_id}")
                out[(who, rule_id)] = doc
        return out

    def spend(self, rule_id: str) -> None:
        """Spends every key's bucket of rule_id on both stacks (cost = limit)."""
        import limits.storage
        import limits.strategies
        rule = RULES[rule_id]
        pipe = self.c.pipeline(transaction=False)
        for i in range(self.args.keys):
            pipe.execute_command("CL.LIMIT", key_name(i), rule["resource"], "COST",
                                 rule["limit"])
        pipe.execute()
        storage = limits.storage.RedisStorage(f"redis://127.0.0.1:{self.rd.port}")
        limiter = {"fixed_window": limits.strategies.FixedWindowRateLimiter,
                   "sliding_window": limits.strategies.SlidingWindowCounterRateLimiter,
                   }[self.args.strategy](storage)
        item = limits.RateLimitItemPerSecond(rule["limit"], rule["window_ms"] // 1000)
        for i in range(self.args.keys):
            limiter.hit(item, rule_id, key_name(i), cost=rule["limit"])
        for port in filter(None, (self.fl_http, self.app.port)):
            doc = probe_check(port, "/v1/check", rule["resource"], key_name(0))
            if doc["allowed"]:
                raise RuntimeError(f"a spent key is still allowed on port {port}: {doc}")

    def counts(self, side: str, rule_id: str) -> tuple[int, int]:
        if side in (ST_FULL, ST_HIT):
            return self.app.counts()
        return rule_counts(self.c, rule_id)

    def pids(self, side: str) -> tuple[int, int | None]:
        if side in (ST_FULL, ST_HIT):
            return self.app.pid, self.rd.pid
        return self.fl.pid, None

    def load(self, side: str, rule_id: str, seconds: int) -> tuple[int, dict]:
        """Drives one side for about `seconds`: (requests done, latency figures)."""
        resource = RULES[rule_id]["resource"]
        if side == FL_RESP:
            n = self.resp_n.get(rule_id) or 20_000
            res = run_benchmark(self.args.redis_benchmark, self.fl.port, CONNECTIONS, n, 1,
                                ["CL.LIMIT", "key:__rand_int__", resource], self.args.keys)
            # the next run lasts about `seconds`, at this run's rate
            self.resp_n[rule_id] = max(20_000, int(res.rps * self.args.seconds))
            return n, {"rps": res.rps, "p50": res.p50, "p90": None, "p99": res.p99,
                       "errors": 0}
        if side == FL_HTTP and self.fl_http is None:
            raise RuntimeError(f"no HTTP front in this build: {self.no_front}")
        port, path = {FL_HTTP: (self.fl_http, "/v1/check"),
                      ST_FULL: (self.app.port, "/v1/check"),
                      ST_HIT: (self.app.port, "/v1/check/hit-only")}[side]
        doc = run_wrk(port, path, seconds, self.args.keys, resource)
        lat = doc["latency_us"]
        errors = doc["errors"]["status"] + sum(doc["errors"][k] for k in
                                               ("connect", "read", "write", "timeout"))
        return doc["requests"], {"rps": doc["requests"] / (doc["duration_us"] / 1e6),
                                 "p50": lat["p50"] / 1e3, "p90": lat["p90"] / 1e3,
                                 "p99": lat["p99"] / 1e3, "errors": errors}

    def measure(self, side: str, rule_id: str) -> Run:
        pid, redis_pid = self.pids(side)
        a0, d0 = self.counts(side, rule_id)
        cpu0 = cpu_seconds(pid)
        rcpu0 = cpu_seconds(redis_pid) if redis_pid else 0.0
        requests, lat = self.load(side, rule_id, self.args.seconds)
        cpu = cpu_seconds(pid) - cpu0
        rcpu = cpu_seconds(redis_pid) - rcpu0 if redis_pid else None
        a1, d1 = self.counts(side, rule_id)
        decided = (a1 - a0) + (d1 - d0)
        return Run(rps=lat["rps"], p50=lat["p50"], p90=lat["p90"], p99=lat["p99"],
                   cpu=cpu / requests * 1e6,
                   redis_cpu=None if rcpu is None else rcpu / requests * 1e6,
                   allowed=(a1 - a0) / decided if decided else None, errors=lat["errors"])


def throughput(args, workdir: Path, meta: dict) -> dict[str, list[Side]]:
    sides_of: dict[str, list[Side]] = {}
    t = Throughput(args, workdir)
    try:
        meta["starlette"] = t.app.banner()
        meta["answers"] = t.check_answers()
        log(f"fastlimit RESP {t.fl.port} HTTP {t.fl_http} (pid {t.fl.pid}), redis "
            f"{t.rd.port} (pid {t.rd.pid}), starlette {t.app.port} (pid {t.app.pid}): "
            f"{meta['starlette']}")
        for variant, rule_id in VARIANTS:
            if rule_id == "login":
                t.spend(rule_id)
            sides = [Side(FL_HTTP), Side(ST_FULL), Side(ST_HIT), Side(FL_RESP)]
            sides_of[variant] = sides
            for side in sides if args.warm else ():   # unmeasured: connections, keys, caches
                try:
                    t.load(side.name, rule_id, args.warm)
                except RuntimeError as e:
                    log(f"  warm-up {variant} {side.name}: FAILED {e}")
            for rep in range(args.repeat):
                for side in (sides if rep % 2 == 0 else sides[::-1]):
                    try:
                        run = t.measure(side.name, rule_id)
                    except (RuntimeError, OSError, redis.RedisError) as e:
                        side.failures.append(short(e))
                        log(f"  [{rep + 1}/{args.repeat}] {variant} {side.name}: FAILED {e}")
                        continue
                    side.runs.append(run)
                    log(f"  [{rep + 1}/{args.repeat}] {variant:7} {side.name:40} "
                        f"{rate(run.rps):>6} req/s  p50 {run.p50:.2f}  p99 "
                        f"{run.p99:.2f} ms  CPU {run.cpu:.1f}"
                        + (f" + redis {run.redis_cpu:.1f}" if run.redis_cpu else "")
                        + " µs/req  allowed "
                        + ("–" if run.allowed is None else f"{run.allowed:.0%}"))
    finally:
        t.stop()
    return sides_of


# ---------------------------------------------------------------------------
# the cost of the front and /metrics on the check path

class Scraper(threading.Thread):
    """GET /metrics once a second, as Prometheus would; any status is noted."""

    def __init__(self, port: int, every: float = 1.0):
        super().__init__(daemon=True)
        self.port, self.every = port, every
        self.statuses: dict[int | str, int] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.every):
            try:
                status = http_call(self.port, "GET", "/metrics", timeout=5)[0]
            except OSError as e:
                status = type(e).__name__
            self.statuses[status] = self.statuses.get(status, 0) + 1

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def check_path_cost(args, workdir: Path) -> dict:
    off = on = scraper = None
    runs: dict[str, list[float]] = {"off": [], "on": []}
    rates: dict[str, list[float]] = {"off": [], "on": []}
    try:
        off = Fastlimit(workdir, ["--http-port", "0"])
        off.wait_ready()
        on, on_http = fastlimit_http(workdir)
        scraper = Scraper(on_http)
        scraper.start()
        sides = {"off": off, "on": on}
        for srv in sides.values():
            run_benchmark(args.redis_benchmark, srv.port, CONNECTIONS, 50_000, 16, CHECK,
                          CHECK_KEYS)
        for rep in range(args.check_repeat):
            for who, srv in list(sides.items())[::-1 if rep % 2 else 1]:
                cpu0 = cpu_seconds(srv.pid)
                res = run_benchmark(args.redis_benchmark, srv.port, CONNECTIONS, args.n16,
                                    16, CHECK, CHECK_KEYS)
                cpu = (cpu_seconds(srv.pid) - cpu0) / args.n16 * 1e6
                runs[who].append(cpu)
                rates[who].append(res.rps)
                log(f"  [{rep + 1}/{args.check_repeat}] P=16 http {who:3} "
                    f"{fmt_rps(res.rps):>6} req/s, {cpu:.3f} µs CPU/req")
    finally:
        if scraper is not None:
            scraper.stop()
        for srv in (off, on):
            if srv is not None:
                srv.stop()
    return {"cpu": runs, "rps": rates, "scrapes": scraper.statuses if scraper else {}}


class Callgrinded(Fastlimit):
    """A fastlimit under callgrind, which writes its counts when the server exits."""

    def __init__(self, workdir: Path, out: Path, extra: list[str]):
        self.callgrind_out = out
        super().__init__(workdir, extra)

    def _spawn(self, argv: list[str], env=None) -> None:
        super()._spawn(["valgrind", "--tool=callgrind",
                        f"--callgrind-out-file={self.callgrind_out}", *argv], env)

    def stop_and_dump(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=CALLGRIND_START_S)
        self.stop()


DATA_RECEIVED = re.compile(r"^\s*([\d,]+) .*_protocol\.c:__pyx_pw_\w*Connection_\d+data_received"
                           r" ", re.M)


def data_received_ir(out: Path) -> int:
    """Instructions in the RESP connection's data_received and all it calls."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no", str(out)],
                          capture_output=True, text=True, timeout=120, check=True).stdout
    m = DATA_RECEIVED.search(text)
    if not m:
        raise RuntimeError(f"no Connection.data_received in {out.name}")
    return int(m.group(1).replace(",", ""))


def callgrind_check_path(args, workdir: Path) -> dict:
    """Instructions per CL.CHECK in the RESP connection (callgrind), with the
    HTTP front off and on (scraped once a second): the noise does not move them."""
    for tool in ("valgrind", "callgrind_annotate"):
        if not shutil.which(tool):
            return {"error": f"{tool} not installed (Debian's valgrind)"}
    http_port = free_port()
    servers: dict[str, Callgrinded] = {}
    scraper = None
    out: dict = {"calls": {}, "ir": {}}
    try:
        # both start at once: each takes ~20 s to import under callgrind
        for who, port in (("off", 0), ("on", http_port)):
            servers[who] = Callgrinded(workdir, workdir / f"callgrind-{who}.out",
                                       ["--http-port", str(port)])
        for srv in servers.values():
            srv.wait_ready(timeout=CALLGRIND_START_S)
        wait_http(http_port, "/livez", servers["on"].proc, timeout=CALLGRIND_START_S)
        scraper = Scraper(http_port)
        scraper.start()
        for who, srv in servers.items():
            run_benchmark(args.redis_benchmark, srv.port, CONNECTIONS, args.callgrind_n, 16,
                          CHECK, CHECK_KEYS)
            c = srv.client()
            out["calls"][who] = c.info("commandstats")["cmdstat_cl.check"]["calls"]
            c.close()
        scraper.stop()
        out["scrapes"] = scraper.statuses
        for who, srv in servers.items():
            srv.stop_and_dump()
            out["ir"][who] = data_received_ir(srv.callgrind_out) / out["calls"][who]
            log(f"  callgrind http {who:3} {out['ir'][who]:,.0f} instructions per CL.CHECK")
    finally:
        if scraper is not None:
            scraper.stop()
        for srv in servers.values():
            srv.stop()
    return out


def metrics_scrape(args, workdir: Path) -> dict:
    """One /metrics scrape with METRICS_RULES rules, each with decisions counted."""
    fl, port = fastlimit_http(workdir)
    try:
        c = fl.client()
        pipe = c.pipeline(transaction=False)
        for i in range(METRICS_RULES):
            pipe.execute_command("CL.RULE", "SET", f"r{i:04d}", json.dumps(
                {"match": {"resource": f"GET /api/r{i:04d}"}, "capacity": 100,
                 "refill_per_second": 10}))
        pipe.execute()
        pipe = c.pipeline(transaction=False)
        for i in range(METRICS_RULES):
            pipe.execute_command("CL.LIMIT", "scraper", f"GET /api/r{i:04d}")
        pipe.execute()
        rules = len(c.execute_command("CL.RULE", "LIST"))
        c.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, body = http_call(port, "GET", "/metrics", conn=conn)
        if status != 200:
            return {"status": status, "rules": rules}
        for _ in range(3):                       # warm
            http_call(port, "GET", "/metrics", conn=conn)
        times = []
        cpu0 = cpu_seconds(fl.pid)
        for _ in range(args.scrapes):
            t0 = time.perf_counter()
            status, body = http_call(port, "GET", "/metrics", conn=conn)
            times.append((time.perf_counter() - t0) * 1000)
            if status != 200:
                return {"status": status, "rules": rules}
        cpu_ms = (cpu_seconds(fl.pid) - cpu0) / args.scrapes * 1000
        conn.close()
        lines = body.decode("utf-8", "replace").splitlines()
        samples = sum(1 for line in lines if line and not line.startswith("#"))
        rule_series = len({m.group(1) for m in
                           re.finditer(r'rule="([^"]*)"', body.decode("utf-8", "replace"))})
        return {"status": 200, "rules": rules, "median_ms": statistics.median(times),
                "p90_ms": sorted(times)[int(0.9 * (len(times) - 1))], "max_ms": max(times),
                "cpu_ms": cpu_ms, "bytes": len(body), "samples": samples,
                "rule_labels": rule_series}
    finally:
        fl.stop()


# ---------------------------------------------------------------------------
# report

def rate(x: float | None) -> str:
    """req/s: the Starlette stack's thousands need more digits than fmt_rps gives."""
    return fmt_rps(x) if x is None or x >= 10_000 else f"{x:,.0f}"


def ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def us(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


def build_report(args, sides_of: dict, cost: dict, scrape: dict, meta: dict) -> str:
    out = ["# fastlimit: the HTTP front", "",
           f"{meta['when']} · {meta['machine']} · rev {meta['rev']} · wrk {meta['wrk']} · "
           f"redis-server {meta['redis_version']} · {meta.get('starlette', '?')} · "
           f"{meta['elapsed']:.0f} s in total", ""]
    out += throughput_lines(args, sides_of, meta)
    out += check_path_lines(args, cost)
    out += scrape_lines(args, scrape)
    return "\n".join(out) + "\n"


def throughput_lines(args, sides_of: dict, meta: dict) -> list[str]:
    title = "## `POST /v1/check`: fastlimit vs Starlette + limits + redis-server"
    if not sides_of:
        return [title, "", "- **not measured** ("
                + meta.get("error", "--skip-throughput") + ")", ""]
    out = [title, "",
           f"{CONNECTIONS} keep-alive connections (`wrk -t 1 -c {CONNECTIONS}` with "
           f"bench/http_check.lua; redis-benchmark `-c {CONNECTIONS} -P 1` for RESP), "
           f"{args.seconds:g} s per run, {args.keys:,} client keys drawn at random per "
           f"request, `{args.strategy}` on both stacks, median of {args.repeat} "
           "interleaved run(s). CPU: the server process's user+system time per request "
           "(/proc); the Starlette stack's redis-server apart.", "",
           "| rule | side | req/s | p50 ms | p90 ms | p99 ms | server CPU µs/req "
           "| + redis-server µs/req | allowed |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    med: dict[tuple[str, str], Side] = {}
    for variant, rule_id in VARIANTS:
        for side in sides_of.get(variant, []):
            med[(variant, side.name)] = side
            share = side.median("allowed")
            out.append(f"| {variant} (`{rule_id}`) | {side.name} | "
                       f"{rate(side.median('rps'))} | {ms(side.median('p50'))} | "
                       f"{ms(side.median('p90'))} | {ms(side.median('p99'))} | "
                       f"{us(side.median('cpu'))} | {us(side.median('redis_cpu'))} | "
                       f"{'–' if share is None else f'{share:.0%}'} |")

    def ratio(variant, a, b):
        sa, sb = med.get((variant, a)), med.get((variant, b))
        x, y = sa and sa.median("rps"), sb and sb.median("rps")
        return x / y if x and y else None

    def stack_cpu(variant, name):
        s = med.get((variant, name))
        return s and s.median("cpu") and s.median("cpu") + (s.median("redis_cpu") or 0)

    out += ["", "| rule | HTTP ÷ Starlette (same answer) | HTTP ÷ Starlette (flag only) "
            "| HTTP ÷ RESP P1 | Starlette stack CPU ÷ fastlimit HTTP CPU |",
            "|---|---:|---:|---:|---:|"]
    for variant, _ in VARIANTS:
        cpu_full, cpu_fl = stack_cpu(variant, ST_FULL), stack_cpu(variant, FL_HTTP)
        out.append(f"| {variant} | {fmt_x(ratio(variant, FL_HTTP, ST_FULL))} | "
                   f"{fmt_x(ratio(variant, FL_HTTP, ST_HIT))} | "
                   f"{fmt_x(ratio(variant, FL_HTTP, FL_RESP))} | "
                   f"{fmt_x(cpu_full / cpu_fl if cpu_full and cpu_fl else None)} |")
    out += ["", "Targets (ratios of req/s measured side by side in this run):"]
    for variant, _ in VARIANTS:
        out.append(target_line(f"{variant}: fastlimit HTTP ≥ 5× Starlette + limits (same "
                               "answer, the target)", ratio(variant, FL_HTTP, ST_FULL), 5.0))
        out.append(target_line(f"{variant}: fastlimit HTTP ≥ 5× Starlette + limits (allowed "
                               "flag only, shown for honesty)",
                               ratio(variant, FL_HTTP, ST_HIT), 5.0))
        out.append(target_line(f"{variant}: fastlimit HTTP ≥ 0.5× fastlimit RESP CL.LIMIT "
                               "-P 1", ratio(variant, FL_HTTP, FL_RESP), 0.5))
    out.append("")
    out += [f"- {n}" for n in throughput_notes(args, sides_of, meta)]
    out.append("")
    return out


def throughput_notes(args, sides_of: dict, meta: dict) -> list[str]:
    notes = []
    for side in (s for sides in sides_of.values() for s in sides):
        errors = sum(r.errors for r in side.runs)
        if errors:
            notes.append(f"{side.name}: {errors:,} non-200 responses or socket errors.")
        for f in dict.fromkeys(side.failures):
            notes.append(f"{side.name}: failed run(s), left out: {f}")
    if meta.get("error"):
        notes.append(meta["error"])
    for (who, rule_id), doc in meta.get("answers", {}).items():
        notes.append(f"{who}'s answer to the first check of a key under `{rule_id}`: "
                     f"`{json.dumps(doc)}`")
    notes.append(
        "Rules: " + "; ".join(f"`{rid}` {r['limit']:,} per {r['window_ms'] // 1000:,} s "
                              f"per key on `{r['resource']}`" for rid, r in RULES.items()) +
        f". fastlimit: `{args.strategy}` rules set with `CL.RULE SET`; limits: "
        f"`{STRATEGY_NAMES[args.strategy]}` with `RateLimitItemPerSecond(limit, window)` "
        "keyed by (rule id, client key), `limits.aio.storage.RedisStorage` (redis-py). "
        + STRATEGY_WHY[args.strategy] +
        " The denied rule's buckets are spent on both stacks before its runs (cost = limit "
        "on every key), so every check there is a denial.")
    notes.append(
        "Same answer: the Starlette app parses the same JSON and answers `allowed, limit, "
        "remaining, retry_after_ms, reset_after_ms, rule` with `hit` then "
        "`get_window_stats` (the calls Flask-Limiter and SlowAPI make to send rate-limit "
        "headers; with the fixed window three Redis round trips); flag only: one `hit`, "
        "answering `allowed, limit, rule`. One uvicorn worker, no access log; "
        "fastlimit is one process too.")
    notes.append(
        "Nothing is pinned to a core: wrk or redis-benchmark, the server, and for the "
        "Starlette stack redis-server share the 2 CPUs, as in the other benches. Allowed: "
        "the share of checks decided in the run (fastlimit's `CL.RULE STATS`, the app's "
        "own counters).")
    return notes


def check_path_lines(args, cost: dict) -> list[str]:
    out = ["## The cost of the HTTP front and /metrics on the check path", ""]
    out += proc_cpu_lines(args, cost)
    return out + callgrind_lines(args, cost.get("callgrind", {}))


def proc_cpu_lines(args, cost: dict) -> list[str]:
    off, on = cost.get("cpu", {}).get("off"), cost.get("cpu", {}).get("on")
    if not (off and on):
        why = f" ({cost['error']})" if cost.get("error") else ""
        return [f"- CPU per CL.CHECK with the HTTP front ≤ 1.03× without: "
                f"**not measured**{why}", ""]
    out = [f"redis-benchmark `-c {CONNECTIONS} -P 16 -n {args.n16:,} -r {CHECK_KEYS:,} "
           f"{' '.join(CHECK)}`, {args.check_repeat} interleaved run(s) per side, medians; "
           "the front-on server's /metrics is scraped once a second throughout:", "",
           "| server | req/s | server CPU µs/CL.CHECK | spread |", "|---|---:|---:|---:|"]
    for who, label in (("off", "`--http-port 0`"),
                       ("on", "`--http-port <port>`, /metrics scraped every second")):
        cpu, rps = cost["cpu"][who], cost["rps"][who]
        out.append(f"| {label} | {fmt_rps(statistics.median(rps))} | "
                   f"{statistics.median(cpu):.3f} | {min(cpu):.3f}–{max(cpu):.3f} |")
    return out + [
        "", target_line("CPU per CL.CHECK with the HTTP front and scraping ≤ 1.03× without",
                        statistics.median(on) / statistics.median(off), 1.03,
                        higher_is_better=False),
        f"- Scrapes during the runs: {scrape_text(cost.get('scrapes', {}))}.", ""]


def callgrind_lines(args, grind: dict) -> list[str]:
    what = "instructions per CL.CHECK with the HTTP front and scraping ≤ 1.03× without"
    if not grind.get("ir"):
        return [f"- {what}: **not measured** ({grind.get('error', '--skip-callgrind')})", ""]
    off, on = grind["ir"]["off"], grind["ir"]["on"]
    return [f"Under callgrind, two servers each given `redis-benchmark -c {CONNECTIONS} -P 16 "
            f"-n {args.callgrind_n:,}` of the same CL.CHECK; instructions of the RESP "
            "connection's `data_received` and everything it calls, per CL.CHECK (the "
            "counts do not move with the machine's noise):", "",
            "| server | instructions per CL.CHECK |", "|---|---:|",
            f"| `--http-port 0` | {off:,.0f} |",
            f"| `--http-port <port>`, /metrics scraped every second | {on:,.0f} |", "",
            target_line(what, on / off, 1.03, higher_is_better=False),
            f"- Scrapes during the callgrind run: {scrape_text(grind.get('scrapes', {}))}.",
            ""]


def scrape_text(statuses: dict) -> str:
    shown = ", ".join(f"{n}× {s}" for s, n in sorted(statuses.items(), key=str))
    return (shown or "none") + (" (404: /metrics has not landed in this build, so each "
                                "scrape costs only the front's routing)"
                                if 404 in statuses else "")


def scrape_lines(args, scrape: dict) -> list[str]:
    out = [f"## One /metrics scrape with {METRICS_RULES:,} rules", ""]
    what = f"a scrape with {METRICS_RULES:,} rules < 50 ms"
    if scrape.get("status") != 200:
        why = (f"GET /metrics answered {scrape['status']}" if scrape.get("status")
               else scrape.get("error", "not run"))
        if scrape.get("status") == 404:
            why += ": /metrics has not landed in this build"
        return out + [f"- {what}: **not measured** ({why})", ""]
    return out + [
        f"{scrape['rules']:,} token-bucket rules set with `CL.RULE SET`, each with one "
        f"decision counted; {args.scrapes} GETs on one keep-alive connection after 3 "
        "unmeasured ones:", "",
        "| median ms | p90 ms | max ms | server CPU ms/scrape | bytes | samples "
        "| rule label values (`__other__` too) |", "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {scrape['median_ms']:.2f} | {scrape['p90_ms']:.2f} | {scrape['max_ms']:.2f} | "
        f"{scrape['cpu_ms']:.2f} | {scrape['bytes']:,} | {scrape['samples']:,} | "
        f"{scrape['rule_labels']:,} |", "",
        target_line(f"{what} (median)", scrape["median_ms"], 50.0, higher_is_better=False,
                    unit="ms"), ""]


def fmt_x(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


STRATEGY_NAMES = {"fixed_window": "FixedWindowRateLimiter",
                  "sliding_window": "SlidingWindowCounterRateLimiter"}
STRATEGY_WHY = {
    "fixed_window": "The fixed window is the closest pair: one counter per key and window "
                    "on both sides, and the default strategy of Flask-Limiter and SlowAPI "
                    "(fastlimit aligns windows to the clock, limits starts one at a key's "
                    "first hit). limits' moving window logs every hit, which fastlimit has "
                    "no rule for.",
    "sliding_window": "The sliding window counter is the same algorithm on both sides "
                      "(the previous window's count weighted by the part of it still "
                      "inside the window, plus the current one).",
}


# ---------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="2 s runs, 1 repeat, short check-path and scrape parts: about 40 s")
    p.add_argument("--seconds", type=int, help="seconds per measured run (default 6; wrk "
                   "takes whole seconds)")
    p.add_argument("--warm", type=int, default=1, help="unmeasured seconds per side before "
                   "a rule's runs (default 1; 0: none, for a smoke run)")
    p.add_argument("--repeat", type=int, help="interleaved runs per side (default 2)")
    p.add_argument("--keys", type=int, default=10_000, help="client keys (default 10,000)")
    p.add_argument("--strategy", choices=sorted(STRATEGY_NAMES), default="fixed_window",
                   help="the rules' algorithm on both stacks (default fixed_window)")
    p.add_argument("--n16", type=int, help="requests per -P 16 CL.CHECK run of the "
                   "check-path part (default 1,000,000)")
    p.add_argument("--check-repeat", type=int, help="interleaved runs per side of the "
                   "check-path part (default 5)")
    p.add_argument("--scrapes", type=int, help="timed /metrics GETs (default 50)")
    p.add_argument("--callgrind-n", type=int, default=32_000,
                   help="CL.CHECKs per server under callgrind (default 32,000)")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-check-path", action="store_true")
    p.add_argument("--skip-callgrind", action="store_true",
                   help="leave out the instruction counts (about 40 s; off with --quick)")
    p.add_argument("--skip-scrape", action="store_true")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    p.add_argument("--output", type=Path, default=RESULTS,
                   help="also write the report here (default bench/results/http.md)")
    args = p.parse_args(argv)
    q = args.quick
    args.seconds = max(1, args.seconds or (2 if q else 6))
    args.warm = max(0, args.warm)
    args.repeat = max(1, args.repeat or (1 if q else 2))
    args.n16 = args.n16 or (200_000 if q else 1_000_000)
    args.check_repeat = max(1, args.check_repeat or (1 if q else 5))
    args.scrapes = args.scrapes or (10 if q else 50)
    args.skip_callgrind = args.skip_callgrind or q
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)     # unwinds like Ctrl-C: servers stop
    for tool in ("wrk", args.redis_server, args.redis_benchmark):
        if not shutil.which(tool):
            log(f"error: {tool} not found (Debian's wrk, redis-server and redis-tools)")
            return 2
    try:
        import limits  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        log(f"error: {e.name} is missing: it is in fastlimit's `test` extra")
        return 2
    started = time.monotonic()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "rev": git_rev(), "redis_version": tool_version(args.redis_server),
            "wrk": wrk_version()}
    sides_of: dict = {}
    cost: dict = {}
    scrape: dict = {}
    with tempfile.TemporaryDirectory(prefix="fastlimit-bench-http-") as tmp:
        workdir = Path(tmp)
        if not args.skip_throughput:
            log(f"== POST /v1/check: {args.seconds:g} s runs, {args.repeat} repeat(s)")
            try:
                sides_of = throughput(args, workdir, meta)
            except (RuntimeError, OSError, redis.RedisError) as e:
                meta["error"] = f"the throughput part failed: {short(e)}"
                log(meta["error"])
        if not args.skip_check_path:
            log("== CPU per CL.CHECK: --http-port 0 vs a scraped HTTP front")
            try:
                cost = check_path_cost(args, workdir)
            except (RuntimeError, OSError, redis.RedisError) as e:
                cost = {"error": short(e)}
                log(cost["error"])
        if not args.skip_callgrind:
            log(f"== callgrind: {args.callgrind_n:,} CL.CHECK, --http-port 0 vs a scraped front")
            try:
                cost["callgrind"] = callgrind_check_path(args, workdir)
            except (RuntimeError, OSError, redis.RedisError, subprocess.SubprocessError) as e:
                cost["callgrind"] = {"error": short(e)}
                log(cost["callgrind"]["error"])
        if not args.skip_scrape:
            log(f"== /metrics with {METRICS_RULES:,} rules")
            try:
                scrape = metrics_scrape(args, workdir)
            except (RuntimeError, OSError, redis.RedisError) as e:
                scrape = {"error": short(e)}
                log(scrape["error"])
    meta["elapsed"] = time.monotonic() - started
    publish(build_report(args, sides_of, cost, scrape, meta), args.output)
    return 0


def wrk_version() -> str:
    out = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"wrk (\S+)", out)
    return m.group(1) if m else "?"


if __name__ == "__main__":
    run_cli(main)
