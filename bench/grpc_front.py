#!/usr/bin/env python3
"""fastlimit's gRPC front vs a grpc.aio server: Envoy's ShouldRateLimit
driven by h2load, side by side in one run.

One run:
  1. writes an envoyproxy/ratelimit YAML (domain ``bench``) to a temp
     directory and starts, on free loopback ports:
     - fastlimit (this interpreter, ``-m fastlimit.server --port 0
       --grpc-port <free> --rls-config <yaml>``);
     - bench/grpc_aio_rls.py: grpcio's asyncio server answering the same
       method with the same decision (fastlimit.rls.service over an
       in-process RuleEngine, the same YAML; the messages read and written
       in Python), so the two differ in the gRPC stack (and the messages'
       code: C in one, Python in the other); fastlimit with
       ``--grpc-deadline-ms 1000`` (see the report's note);
  2. calls each once per variant with grpcio and decodes the replies (the
     expected codes and limits, the same on both sides), so the runs cannot
     silently measure errors;
  3. for each variant (``ok``: two descriptors under a limit never reached;
     ``over``: one of those and one spent by the first call, so every call
     is OVER_LIMIT with half its statuses OVER_LIMIT) and each shape
     (``h2load -c 1 -m 32``: Envoy's one connection per worker, and ``-c 4
     -m 16``), the two servers interleaved (the order flips on every
     repeat): h2load with a prebuilt gRPC body (``-d``, ``te: trailers``,
     ``content-type: application/grpc``), a fixed request count sized to
     last about --seconds.  Per run: req/s, p50/p99 from h2load's
     per-request log, h2load's succeeded/failed counts, the server's own
     counts (every call answered with grpc-status 0 and decided), the
     server's CPU per call from /proc/<pid>/stat (utime+stime, all its
     threads) and h2load's;
  4. prints one markdown report and writes it to bench/results/grpc.md.

It reports; it does not judge by exit code: a missed target still exits 0.
Needs h2load (Debian's nghttp2-client) and grpcio (the ``test`` extra).
See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

# grpcio in this process (the reply checks, grpc.aio's counts) would note
# every h2load fork in the log; nothing here relies on its fork handlers.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
try:
    import grpc
except ImportError:         # main() says what is missing
    grpc = None

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "grpc.md"
AIO_SERVER = BENCH_DIR / "grpc_aio_rls.py"
CALL_PATH = BENCH_DIR / "grpc_path.py"
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "support"))
from failover import cpu_seconds  # noqa: E402
from http_front import ms, rate, short  # noqa: E402
from rls_messages import OK, OVER_LIMIT, RLS_PATH, decode_response, grpc_frame  # noqa: E402
from rls_workload import BIG_ENTRIES, DOMAIN, NEVER, RLS_YAML, VARIANTS  # noqa: E402
from run import (  # noqa: E402
    Fastlimit,
    Server,
    _die_with_parent,
    _terminate,
    free_port,
    git_rev,
    log,
    machine_line,
    publish,
    run_cli,
    target_line,
)

SHAPES = [(1, 32), (4, 16)]     # h2load -c, -m
FASTLIMIT, GRPC_AIO = "fastlimit", "grpc.aio"
WARM_N = 2000                   # requests of the unmeasured run that sizes the others
MIN_N, MAX_N = 2000, 3_000_000
DEADLINE_MS = 1000             # fastlimit's grpc-deadline-ms: see the report's note
CPU_TARGET_US = 5.0       # issue 28 (issue 14 asked 15)
RATIO_TARGET = 20.0


# ---------------------------------------------------------------------------
# the servers

@dataclass
class Counts:
    """A server's own counts: ShouldRateLimit calls, those not answered with
    grpc-status 0, and the decisions of domain bench (all, over limit)."""
    calls: int
    failed: int
    decided: int
    over: int

    def __sub__(self, o: Counts) -> Counts:
        return Counts(self.calls - o.calls, self.failed - o.failed,
                      self.decided - o.decided, self.over - o.over)


class GrpcTarget:
    """What the bench needs of either server: its gRPC port, calls with
    grpcio, its counts."""

    label = ""
    grpc_port = 0
    _channel = None

    def channel(self):
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        return self._channel

    def call(self, message: bytes, path: str = RLS_PATH, timeout: float = 10) -> bytes:
        """The reply's message; RuntimeError on a gRPC error."""
        try:
            return self.channel().unary_unary(path)(message, timeout=timeout)
        except grpc.RpcError as e:
            raise RuntimeError(f"{self.label} {path}: {e.code()} {e.details()}") from None

    def wait_grpc(self, timeout: float = 20) -> None:
        try:
            grpc.channel_ready_future(self.channel()).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise RuntimeError(f"{self.label}: no gRPC on port {self.grpc_port} after "
                               f"{timeout:.0f} s") from None

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


class FastlimitGrpc(Fastlimit, GrpcTarget):
    label = FASTLIMIT

    def __init__(self, workdir: Path, rls_config: Path, deadline_ms: int | None = DEADLINE_MS):
        """deadline_ms None: the server's default grpc-deadline-ms."""
        self.grpc_port = free_port()
        deadline = [] if deadline_ms is None else ["--grpc-deadline-ms", str(deadline_ms)]
        super().__init__(workdir, ["--grpc-port", str(self.grpc_port),
                                   "--rls-config", str(rls_config), *deadline])
        self.resp: redis.Redis | None = None

    def counts(self) -> Counts:
        if self.resp is None:
            self.resp = self.client()
        info = self.resp.info("everything")
        bench = info.get("rls_domain_bench", {})
        if isinstance(bench, str):          # redis-py splits "a=1,b=2" into a dict
            bench = dict(kv.split("=", 1) for kv in bench.split(","))
        return Counts(int(info["grpc_total_calls"]), int(info["grpc_failed_calls"]),
                      int(bench.get("calls", 0)), int(bench.get("over_limit", 0)))

    def stop(self) -> None:
        self.close_channel()
        if self.resp is not None:
            self.resp.close()
            self.resp = None
        super().stop()


class GrpcAio(Server, GrpcTarget):
    name = "grpc-aio"
    label = GRPC_AIO
    READY = re.compile(r"grpc\.aio ready on port (\d+) \((.*)\)")

    def __init__(self, workdir: Path, rls_config: Path):
        super().__init__(workdir)
        self.grpc_port = free_port()
        self._spawn([sys.executable, str(AIO_SERVER), "--port", str(self.grpc_port),
                     "--rls-config", str(rls_config)])

    def _ready(self) -> bool:
        return bool(self.READY.search(self.logpath.read_text(errors="replace")))

    def counts(self) -> Counts:
        doc = json.loads(self.call(b"", "/fastlimit.bench.Stats/Get"))
        bench = doc["domains"].get(DOMAIN.decode(), {})
        return Counts(doc["calls"], doc["failed"], bench.get("calls", 0),
                      bench.get("over_limit", 0))

    def banner(self) -> str:
        m = self.READY.search(self.logpath.read_text(errors="replace"))
        return m.group(2) if m else "grpcio ?"

    def stop(self) -> None:
        self.close_channel()
        super().stop()


# ---------------------------------------------------------------------------
# the replies' content, checked before any run

def check_reply(target: GrpcTarget, variant: str) -> dict:
    """One call of the variant, decoded; RuntimeError unless it carries the
    expected overall code and, per descriptor, code and current_limit."""
    v = VARIANTS[variant]
    reply = decode_response(target.call(v.message))
    got = tuple((s["code"], s["limit"]) for s in reply["statuses"])
    if reply["overall"] != v.overall or got != v.statuses:
        raise RuntimeError(f"{target.label} answered {variant} with {reply}; expected "
                           f"overall {v.overall}, statuses {v.statuses}")
    return reply


def check_replies(targets: list[GrpcTarget]) -> dict:
    """Each variant on each target (twice for over: its first call spends
    the day's one); the decoded replies must agree on the codes and limits
    (remaining and reset depend on each one's counts and clock)."""
    answers = {}
    for variant in VARIANTS:
        for t in targets:
            if variant == "over":
                t.call(VARIANTS[variant].message)      # spends the day's one
            answers[(t.label, variant)] = check_reply(t, variant)
        seen = {label: [(s["code"], s["limit"]) for s in r["statuses"]] + [r["overall"]]
                for (label, v), r in answers.items() if v == variant}
        if len(set(map(repr, seen.values()))) > 1:
            raise RuntimeError(f"the servers disagree on {variant}: {seen}")
    return answers


# ---------------------------------------------------------------------------
# h2load

H2_FINISHED = re.compile(r"finished in [\d.]+m?s, ([\d.]+) req/s")
H2_REQUESTS = re.compile(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                         r"(\d+) failed, (\d+) errored, (\d+) timeout")
H2_STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")


@dataclass
class Run:
    rps: float
    p50: float              # ms
    p99: float
    succeeded: int
    failed: int             # h2load's failed + errored + timeout, and non-2xx
    grpc_errors: int        # calls the server answered with a grpc-status other than 0
    cpu: float              # server µs per call
    h2load_cpu: float       # h2load µs per call
    problems: list[str] = field(default_factory=list)


def h2load(port: int, body: Path, n: int, connections: int, streams: int,
           log_file: Path, timeout: float) -> dict:
    """One h2load run: its counts, req/s, latency percentiles (from the
    per-request log) and its own CPU seconds."""
    argv = ["h2load", "-n", str(n), "-c", str(connections), "-m", str(streams), "-t", "1",
            "-d", str(body), "-H", "te: trailers", "-H", "content-type: application/grpc",
            "--log-file", str(log_file), f"http://127.0.0.1:{port}{RLS_PATH}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_die_with_parent)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"h2load did not end {timeout:.0f} s after starting") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    fin, req, st = (r.search(proc.stdout) for r in (H2_FINISHED, H2_REQUESTS, H2_STATUS))
    if proc.returncode != 0 or not (fin and req and st):
        err = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise RuntimeError(f"h2load exit {proc.returncode}: {err[:200]}")
    _, _, _, succeeded, failed, errored, timed_out = map(int, req.groups())
    ok_2xx = int(st.group(1))
    latencies = sorted(int(line.split("\t")[2]) for line in
                       log_file.read_text().splitlines() if line.count("\t") >= 2)
    log_file.unlink()
    if not latencies:
        raise RuntimeError("h2load logged no request")
    return {"succeeded": succeeded,
            "failed": failed + errored + timed_out + (succeeded - ok_2xx),
            "rps": float(fin.group(1)),
            "p50": latencies[len(latencies) // 2] / 1e3,
            "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1e3,
            "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}


@dataclass
class Side:
    target: str
    variant: str
    shape: tuple[int, int]
    runs: list[Run] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def median(self, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.runs]
        return statistics.median(values) if values else None


class Bench:
    def __init__(self, args, workdir: Path, targets: dict[str, GrpcTarget]):
        self.args = args
        self.workdir = workdir
        self.targets = targets
        self.bodies = {}
        for variant, v in VARIANTS.items():
            self.bodies[variant] = workdir / f"{variant}.bin"
            self.bodies[variant].write_bytes(grpc_frame(v.message))
        self.n: dict[tuple[str, str, tuple[int, int]], int] = {}

    def drive(self, side: Side, n: int) -> tuple[dict, Counts, float]:
        t = self.targets[side.target]
        c0 = t.counts()
        cpu0 = cpu_seconds(t.pid)
        res = h2load(t.grpc_port, self.bodies[side.variant], n, *side.shape,
                     self.workdir / "h2load.log", timeout=self.args.seconds * 10 + 60)
        cpu = cpu_seconds(t.pid) - cpu0
        return res, t.counts() - c0, cpu

    def warm(self, side: Side) -> None:
        """Unmeasured: connections, caches; sizes the measured runs."""
        res, _, _ = self.drive(side, WARM_N)
        self.n[(side.target, side.variant, side.shape)] = self.size(res["rps"])

    def size(self, rps: float) -> int:
        return max(MIN_N, min(MAX_N, int(rps * self.args.seconds)))

    def measure(self, side: Side) -> Run:
        key = (side.target, side.variant, side.shape)
        n = self.n[key]
        res, counts, cpu = self.drive(side, n)
        self.n[key] = self.size(res["rps"])
        problems = []
        if res["succeeded"] != n or res["failed"]:
            problems.append(f"h2load: {res['succeeded']:,} of {n:,} succeeded, "
                            f"{res['failed']:,} failed")
        over = n if VARIANTS[side.variant].overall == OVER_LIMIT else 0
        if counts.calls != n or counts.failed or counts.decided != n or counts.over != over:
            problems.append(f"server: {counts.calls:,} calls, {counts.failed:,} not grpc-status "
                            f"0, {counts.decided:,} decided, {counts.over:,} over limit; "
                            f"expected {n:,}, 0, {n:,}, {over:,}")
        return Run(rps=res["rps"], p50=res["p50"], p99=res["p99"],
                   succeeded=res["succeeded"], failed=res["failed"], grpc_errors=counts.failed,
                   cpu=cpu / max(1, counts.calls) * 1e6, h2load_cpu=res["cpu"] / n * 1e6,
                   problems=problems)


def throughput(args, workdir: Path, meta: dict) -> list[Side]:
    config = workdir / "rls" / "bench.yaml"
    config.parent.mkdir()
    config.write_text(RLS_YAML)
    targets: dict[str, GrpcTarget] = {}
    sides: list[Side] = []
    try:
        targets[FASTLIMIT] = FastlimitGrpc(workdir, config.parent)
        targets[GRPC_AIO] = GrpcAio(workdir, config.parent)
        for t in targets.values():
            t.wait_ready()
            t.wait_grpc()
        meta["grpcio"] = targets[GRPC_AIO].banner()
        log(f"fastlimit gRPC {targets[FASTLIMIT].grpc_port} (pid {targets[FASTLIMIT].pid}), "
            f"grpc.aio {targets[GRPC_AIO].grpc_port} (pid {targets[GRPC_AIO].pid}, "
            f"{meta['grpcio']})")
        meta["answers"] = check_replies(list(targets.values()))
        bench = Bench(args, workdir, targets)
        for variant in VARIANTS:
            for shape in SHAPES:
                pair = [Side(label, variant, shape) for label in targets]
                sides += pair
                for side in pair:
                    bench.warm(side)
                for rep in range(args.repeat):
                    for side in (pair if rep % 2 == 0 else pair[::-1]):
                        try:
                            run = bench.measure(side)
                        except (RuntimeError, OSError, redis.RedisError) as e:
                            side.failures.append(short(e))
                            log(f"  [{rep + 1}/{args.repeat}] {variant} -c {shape[0]} -m "
                                f"{shape[1]} {side.target}: FAILED {e}")
                            continue
                        side.runs.append(run)
                        log(f"  [{rep + 1}/{args.repeat}] {variant:4} -c {shape[0]} -m "
                            f"{shape[1]:2} {side.target:9} {rate(run.rps):>6} req/s  p50 "
                            f"{run.p50:.2f}  p99 {run.p99:.2f} ms  server CPU "
                            f"{run.cpu:.1f} µs/call  h2load {run.h2load_cpu:.1f}"
                            + "".join(f"  PROBLEM {p}" for p in run.problems))
    finally:
        for t in targets.values():
            t.stop()
    return sides


# ---------------------------------------------------------------------------
# where fastlimit's CPU goes: instructions per call (--callgrind)

DATA_RECEIVED = re.compile(r"^\s*([\d,]+) .*_grpc\.c:__pyx_pw_\w*GrpcConnection_\d+data_received"
                           r" ", re.M)
PATH_MODES = ("decide", "canned", "big")


def callgrind_split(args, workdir: Path) -> dict:
    """bench/grpc_path.py under callgrind with the service's decision and
    for an unconfigured domain, both at once: instructions per call of
    GrpcConnection.data_received and all it calls."""
    for tool in ("valgrind", "callgrind_annotate"):
        if not shutil.which(tool):
            return {"error": f"{tool} not installed (Debian's valgrind)"}
    procs = {}
    for mode in PATH_MODES:
        out = workdir / f"callgrind-{mode}.out"
        procs[mode] = (out, subprocess.Popen(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             str(CALL_PATH), mode, str(args.callgrind_n)], stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, preexec_fn=_die_with_parent))
    try:
        return {"ir": {mode: instructions_per_call(args, mode, *procs[mode])
                       for mode in PATH_MODES}}
    finally:
        for _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def instructions_per_call(args, mode: str, out: Path, proc: subprocess.Popen) -> float:
    try:
        _, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"grpc_path.py {mode} under callgrind took over 900 s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"grpc_path.py {mode} exit {proc.returncode}: "
                           f"{err.decode(errors='replace').strip()[-200:]}")
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no", str(out)],
                          capture_output=True, text=True, timeout=120, check=True).stdout
    m = DATA_RECEIVED.search(text)
    if not m:
        raise RuntimeError(f"no GrpcConnection.data_received in {out.name}")
    ir = int(m.group(1).replace(",", "")) / args.callgrind_n
    log(f"  callgrind {mode}: {ir:,.0f} instructions per call")
    return ir


def callgrind_lines(args, grind: dict) -> list[str]:
    title = "## Where fastlimit's CPU per call goes (callgrind)"
    if not grind.get("ir"):
        return [title, "", f"- **not measured** ({grind.get('error', 'run with --callgrind')})",
                ""]
    decide, canned = grind["ir"]["decide"], grind["ir"]["canned"]
    return [title, "",
            f"bench/grpc_path.py: {args.callgrind_n:,} `ok` calls, 32 per read, through one "
            "GrpcConnection with a stand-in transport; instructions of its `data_received` "
            "and everything it calls, per call (no system calls, no event loop):", "",
            "| path | instructions per call | share |", "|---|---:|---:|",
            f"| the whole call, as served (the rls service decides) | {decide:,.0f} | 100% |",
            f"| the transport and the least decision (a domain not configured): HTTP/2, "
            f"the messages in C | {canned:,.0f} | {canned / decide:.0%} |",
            f"| the decision's walk and counting (_rls.pyx, C), the difference | "
            f"{decide - canned:,.0f} | {(decide - canned) / decide:.0%} |", "",
            f"With {BIG_ENTRIES:,} more descriptors in the domain (grpc_path.py `big`: exact "
            f"values beside the calls' own, wildcards in a subtree of their own): "
            f"{grind['ir']['big']:,.0f} instructions per call, "
            f"{grind['ir']['big'] / decide:.3f}× the tree of {len(RLS_YAML.splitlines())} "
            "lines (target: within 1.10×).", ""]


# ---------------------------------------------------------------------------
# report

def shape_text(shape: tuple[int, int]) -> str:
    return f"-c {shape[0]} -m {shape[1]}"


def build_report(args, sides: list[Side], grind: dict, meta: dict) -> str:
    out = ["# fastlimit: the gRPC front (Envoy's ShouldRateLimit) vs grpc.aio", "",
           f"{meta['when']} · {meta['machine']} · rev {meta['rev']} · {meta['h2load']} · "
           f"{meta.get('grpcio', 'grpcio ?')} · {meta['elapsed']:.0f} s in total", ""]
    out += throughput_lines(args, sides, meta)
    out += callgrind_lines(args, grind)
    return "\n".join(out) + "\n"


def throughput_lines(args, sides: list[Side], meta: dict) -> list[str]:
    out = ["## ShouldRateLimit under h2load", ""]
    if not sides:
        return out + ["- **not measured** (" + meta.get("error", "?") + ")", ""]
    out += [f"h2load `-t 1` with a prebuilt gRPC body (`-d`, `te: trailers`, `content-type: "
            f"application/grpc`), a fixed count sized to last about {args.seconds:g} s, median "
            f"of {args.repeat} interleaved run(s) per row. Server CPU: the process's "
            "utime+stime (all threads) per call counted by the server; h2load's own CPU "
            "per call beside it.", "",
            "| variant | h2load | server | req/s | p50 ms | p99 ms | succeeded | failed "
            "| grpc-status ≠ 0 | server CPU µs/call | spread | server cores busy "
            "| h2load CPU µs/call |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(s.target, s.variant, s.shape): s for s in sides}
    for s in sides:
        cpus = [r.cpu for r in s.runs]
        spread = f"{min(cpus):.1f}–{max(cpus):.1f}" if cpus else "–"
        out.append(f"| {s.variant} | `{shape_text(s.shape)}` | {s.target} | "
                   f"{rate(s.median('rps'))} | {ms(s.median('p50'))} | {ms(s.median('p99'))} | "
                   f"{sum(r.succeeded for r in s.runs):,} | {sum(r.failed for r in s.runs):,} | "
                   f"{sum(r.grpc_errors for r in s.runs):,} | {cpu_text(s.median('cpu'))} | "
                   f"{spread} | {busy_text(s)} | {cpu_text(s.median('h2load_cpu'))} |")
    out += ["", "| variant | h2load | req/s fastlimit ÷ grpc.aio "
            "| server CPU/call grpc.aio ÷ fastlimit |", "|---|---|---:|---:|"]
    ratios = {}
    for variant in VARIANTS:
        for shape in SHAPES:
            fl, aio = by.get((FASTLIMIT, variant, shape)), by.get((GRPC_AIO, variant, shape))
            ratios[(variant, shape)] = (ratio(fl and fl.median("rps"), aio and aio.median("rps")),
                                        ratio(aio and aio.median("cpu"), fl and fl.median("cpu")))
            rps_x, cpu_x = ratios[(variant, shape)]
            out.append(f"| {variant} | `{shape_text(shape)}` | {fmt_x(rps_x)} | {fmt_x(cpu_x)} |")
    out += ["", "Targets (issue 28 for the CPU per call, issue 14 for the ratios):"]
    for variant in VARIANTS:
        for shape in SHAPES:
            fl = by.get((FASTLIMIT, variant, shape))
            what = f"{variant}, `{shape_text(shape)}`"
            out.append(target_line(f"{what}: fastlimit server CPU ≤ {CPU_TARGET_US:g} µs per "
                                   "call", fl and fl.median("cpu"), CPU_TARGET_US,
                                   higher_is_better=False, unit="µs"))
            rps_x, cpu_x = ratios[(variant, shape)]
            out.append(target_line(f"{what}: server CPU per call, grpc.aio ÷ fastlimit ≥ "
                                   f"{RATIO_TARGET:g}×", cpu_x, RATIO_TARGET))
            out.append(target_line(f"{what}: req/s, fastlimit ÷ grpc.aio ≥ {RATIO_TARGET:g}× "
                                   "(on the shared cores: see below)", rps_x, RATIO_TARGET))
    return out + ["", *[f"- {n}" for n in notes(sides, meta)], ""]


def notes(sides: list[Side], meta: dict) -> list[str]:
    out = []
    for s in sides:
        where = f"{s.variant} `{shape_text(s.shape)}` {s.target}"
        for p in dict.fromkeys(p for r in s.runs for p in r.problems):
            out.append(f"**{where}: {p}** (the run is in the table).")
        for f in dict.fromkeys(s.failures):
            out.append(f"{where}: failed run(s), left out: {f}")
    if not any(r.problems for s in sides for r in s.runs):
        out.append("Every measured call succeeded in h2load (HTTP 200), and each server "
                   "counted exactly the calls h2load sent, none failed (grpc-status 0), each "
                   "decided in domain `bench` (OVER_LIMIT for every `over` call).")
    for (label, variant), reply in meta.get("answers", {}).items():
        statuses = "; ".join(f"{code_name(st['code'])} limit {st['limit'][0]:,}/"
                             f"{UNIT_NAMES.get(st['limit'][1], st['limit'][1])} remaining "
                             f"{st['remaining']:,} reset {st['reset']} s"
                             for st in reply["statuses"])
        out.append(f"{label}'s reply to `{variant}` (a separate grpcio call, decoded): "
                   f"{code_name(reply['overall'])}, [{statuses}].")
    out.append("Variants: `ok` sends `api_key=k1` and `generic_key=per_path, path=/demo` "
               f"(limits of {NEVER:,} per second and per minute, never reached); `over` sends "
               "`api_key=k1` and `spent=yes` (1 per day, spent before the runs): every call "
               "is OVER_LIMIT, one status OK and one OVER_LIMIT. envoyproxy/ratelimit's YAML "
               "(fixed windows, the reference's counting) loaded by both servers.")
    out.append("grpc.aio side: bench/grpc_aio_rls.py, grpcio's asyncio server (default event "
               "loop, one process) with a raw-bytes unary handler; the decision is "
               "fastlimit's own in C (fastlimit.rls.service's Decider) over an in-process "
               "RuleEngine (the same code and YAML as fastlimit's front), reached from "
               "Python, the messages decoded and encoded in Python. So the "
               "gap is the gRPC stack: grpcio's C core plus its Python per call, against "
               "fastlimit's libnghttp2 driven from Cython with the messages in C.")
    out.append("Nothing is pinned to a core: h2load (one thread), the server and the "
               "machine's other work share the 2 CPUs. Server cores busy (req/s × CPU per "
               "call) is how much CPU each server got: fastlimit runs on one thread, so at "
               "most one core, less when h2load and other work take theirs; grpc.aio's C-core "
               "threads can use both. Where fastlimit's is under 1 the req/s ratio understates "
               "the gap per core; the server CPU per call does not depend on the share each "
               "got (it still moves by 10–30% with the machine's load: caches, clock).")
    out.append(f"fastlimit runs with `--grpc-deadline-ms {DEADLINE_MS}` (default 15): on "
               "this shared machine a stall of the server past 15 ms turns the calls waiting "
               "in its socket into fast UNAVAILABLE answers, by design; the bench measures "
               "calls that are decided (grpc.aio has no such deadline either).")
    return out


UNIT_NAMES = {1: "s", 2: "min", 3: "h", 4: "day", 5: "month", 6: "year", 7: "week"}


def code_name(code: int) -> str:
    return {0: "UNKNOWN", OK: "OK", OVER_LIMIT: "OVER_LIMIT"}.get(code, str(code))


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def fmt_x(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}×"


def busy_text(s: Side) -> str:
    """The server's CPU seconds per second in its runs (median): under 1, it
    did not get a core of its own."""
    busy = [r.rps * r.cpu / 1e6 for r in s.runs]
    return f"{statistics.median(busy):.2f}" if busy else "–"


def cpu_text(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"


# ---------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1.5 s runs, 1 repeat: about 30 s")
    p.add_argument("--seconds", type=float, help="about how long each measured run lasts "
                   "(default 3)")
    p.add_argument("--repeat", type=int, help="interleaved runs per row (default 3)")
    p.add_argument("--callgrind", action="store_true",
                   help="also count instructions per call with and without the decision "
                   "(bench/grpc_path.py under valgrind: about 2 more minutes)")
    p.add_argument("--callgrind-n", type=int, default=20_000,
                   help="calls per callgrind run (default 20,000)")
    p.add_argument("--output", type=Path, default=RESULTS,
                   help="also write the report here (default bench/results/grpc.md)")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (1.5 if args.quick else 3.0)
    args.repeat = max(1, args.repeat or (1 if args.quick else 3))
    return args


def h2load_version() -> str:
    out = subprocess.run(["h2load", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"nghttp2/(\S+)", out)
    return f"h2load {m.group(1) if m else '?'}"


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)     # unwinds like Ctrl-C: servers stop
    if not shutil.which("h2load"):
        log("error: h2load not found (Debian's nghttp2-client; scripts/bootstrap.sh installs it)")
        return 2
    if grpc is None:
        log("error: grpcio is missing: it is in fastlimit's `test` extra")
        return 2
    started = time.monotonic()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "rev": git_rev(), "h2load": h2load_version()}
    sides: list[Side] = []
    grind: dict = {}
    log(f"== ShouldRateLimit: h2load {', '.join(map(shape_text, SHAPES))}, "
        f"{args.seconds:g} s runs, {args.repeat} repeat(s)")
    with tempfile.TemporaryDirectory(prefix="fastlimit-bench-grpc-") as tmp:
        try:
            sides = throughput(args, Path(tmp), meta)
        except (RuntimeError, OSError, redis.RedisError) as e:
            meta["error"] = f"the run failed: {short(e)}"
            log(meta["error"])
        if args.callgrind:
            log(f"== callgrind: {args.callgrind_n:,} calls, the decision vs an unconfigured domain")
            try:
                grind = callgrind_split(args, Path(tmp))
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                grind = {"error": short(e)}
                log(grind["error"])
    meta["elapsed"] = time.monotonic() - started
    publish(build_report(args, sides, grind, meta), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
