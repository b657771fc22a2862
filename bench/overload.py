#!/usr/bin/env python3
"""Overload shedding with more load than the node can serve: what a
critical caller's latency, the throughput, the shed counts, the RSS and
the server CPU per check come to, with shedding on and off, side by side.

One run:
  1. starts two fastlimit nodes (this interpreter, ``-m fastlimit.server``)
     pinned to CPU 0 (``taskset -c 0``): one with the default settings
     (``--shed-threshold 90``), one with ``--shed-threshold 0`` (no
     shedding, no reading order);
  2. times a critical client alone on each (``CL.CHECK crit ... PRIORITY
     critical``, one connection, one check every 250 µs, on CPU 1 under
     ``chrt -f 50`` so its own scheduling does not dominate): the idle
     latency;
  3. calibrates the nodes with one priority at a forced level (``DEBUG
     SHED-LEVEL``): low checks counted (level 0: what the node can do),
     low checks shed and normal ones counted but read after the critical
     connections (level 1), each with the server CPU per check; and the
     generators against a redis-server that does next to nothing (what
     they can offer);
  4. loads each node in turn (``--repeat`` times, interleaved): redis-benchmark
     processes on CPU 1, half ``PRIORITY low`` and half ``PRIORITY normal``,
     each ``-c 25 -P 16 -r 1000000`` and bounded by ``-n``, while the critical
     client keeps timing its checks; INFO shedding is sampled every 250 ms,
     INFO stats, commandstats, DBSIZE and the RSS are read before and after,
     the loop thread's scheduling from /proc schedstat;
  5. prints a markdown report and writes it to bench/results/overload.md.

It reports; it does not judge by exit code.  Every subprocess has a timeout;
traffic goes to 127.0.0.1 only.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "overload.md"
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
from run import (  # noqa: E402  (bench/ is not a package)
    Fastlimit,
    RedisServer,
    _die_with_parent,
    _terminate,
    git_rev,
    log,
    machine_line,
    publish,
    rss_bytes,
    run_cli,
)

TICKS = os.sysconf("SC_CLK_TCK")
SERVER_CPU, CLIENT_CPU = 0, 1
KEYS = 1_000_000
CAPACITY = "1000000"            # never exhausted: every counted check touches a bucket
CRITICAL = ["CL.CHECK", "crit", CAPACITY, CAPACITY, "PRIORITY", "critical"]
SAMPLE_S = 0.25
SHED_REMAINING = -2
MAX_CRITICAL = 2_000_000        # the critical client's requests, at most


def generator_command(priority: str, name: str = "CL.CHECK") -> list[str]:
    return [name, "k:__rand_int__", CAPACITY, CAPACITY, "PRIORITY", priority]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS     # utime, stime


def schedstat(pid: int) -> tuple[int, int, int]:
    """The server's loop thread (its main thread): ns on the CPU, ns spent
    runnable but waiting for the CPU, and how many times it was scheduled
    (/proc/PID/task/PID/schedstat)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            on_cpu, waited, slices = f.read().split()[:3]
        return int(on_cpu), int(waited), int(slices)
    except (OSError, ValueError):
        return 0, 0, 0


@dataclass
class Sched:
    """The loop thread's scheduling over a span: shares of the wall time on
    the CPU and waiting for it, and the mean wait each time it was
    scheduled (how long a wake-up waited for CPU 0)."""
    on_cpu: float = 0.0
    waited: float = 0.0
    wait_per_slice_us: float = 0.0

    @staticmethod
    def between(a: tuple[int, int, int], b: tuple[int, int, int], wall_ns: int) -> Sched:
        slices = max(b[2] - a[2], 1)
        return Sched((b[0] - a[0]) / max(wall_ns, 1), (b[1] - a[1]) / max(wall_ns, 1),
                     (b[1] - a[1]) / slices / 1000.0)


def fastlimit_build(source: str) -> str:
    """Which fastlimit the nodes run: this tree's src/ (then its git
    revision says what was measured), or a package elsewhere (an install,
    a build on PYTHONPATH), named by its path."""
    env = dict(os.environ)
    if source == "src/ tree":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"),
                                                          env.get("PYTHONPATH")]))
    try:
        where = subprocess.run(
            [sys.executable, "-c", "import fastlimit, os; print(os.path.dirname("
             "os.path.realpath(fastlimit.__file__)))"],
            capture_output=True, text=True, timeout=30, env=env).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        where = ""
    here = str((REPO / "src").resolve())
    if where.startswith(here):
        return f"fastlimit from this tree's src/ at git {git_rev()}"
    return f"fastlimit from {where or '?'} (this tree: git {git_rev()})"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def vm_rss(pid: int) -> int:
    """VmRSS from /proc/PID/status, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return rss_bytes(pid)


def resp(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


# ---------------------------------------------------------------------------
# the critical client (a child process: `overload.py --critical-client ...`)

def critical_client(port: int, seconds: float, interval_us: int) -> int:
    """One connection, one CL.CHECK ... PRIORITY critical at a time, one
    sent every interval_us (or at once when the last answer took longer),
    until SIGTERM or `seconds`; prints one JSON line: the send time
    (CLOCK_MONOTONIC ns, as the parent's time.monotonic_ns) and the round
    trip of each request, and how many replies were not a counted check.
    Paced, because it runs real-time on the generators' CPU: back to back it
    would take that CPU from them."""
    stop = False

    def on_term(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    request = resp(*CRITICAL)
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent_at: list[int] = []
    took: list[int] = []
    bad = timeouts = 0
    clock = time.monotonic_ns
    # one request untimed, then "ready": the parent starts the load after it
    sock.sendall(request)
    warm = b""
    while warm.count(b"\r\n") < 6:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed by the server")
        warm += chunk
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    deadline = clock() + int(seconds * 1e9)
    interval = interval_us * 1000
    due = clock()
    try:
        while not stop and len(took) < MAX_CRITICAL:
            t0 = clock()
            if t0 >= deadline:
                break
            if t0 < due:
                time.sleep((due - t0) / 1e9)
                continue
            due = max(due + interval, t0)
            sock.sendall(request)
            buf = b""
            try:
                while buf.count(b"\r\n") < 6:      # *5 and five integers
                    chunk = sock.recv(4096)
                    if not chunk:
                        raise ConnectionError("closed by the server")
                    buf += chunk
            except TimeoutError:
                timeouts += 1
                break
            t1 = clock()
            sent_at.append(t0)
            took.append(t1 - t0)
            lines = buf.split(b"\r\n")
            if lines[0] != b"*5" or lines[1] != b":1" or lines[3] == b":%d" % SHED_REMAINING:
                bad += 1
    finally:
        sock.close()
    sys.stdout.write(json.dumps({"sent_at": sent_at, "took": took, "bad": bad,
                                 "timeouts": timeouts}))
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------------------
# pinning

def can_pin() -> bool:
    return {SERVER_CPU, CLIENT_CPU} <= os.sched_getaffinity(0) \
        and shutil.which("taskset") is not None


def can_chrt() -> bool:
    if not shutil.which("chrt"):
        return False
    try:
        return subprocess.run(["chrt", "-f", "50", "true"], capture_output=True,
                              timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class Pinning:
    def __init__(self, pin: bool, realtime: bool, nice: int = 0):
        self.pin, self.realtime, self.nice = pin, realtime, nice

    def server(self, argv: list[str]) -> list[str]:
        niced = ["nice", "-n", str(self.nice), *argv] if self.nice else argv
        return ["taskset", "-c", str(SERVER_CPU), *niced] if self.pin else niced

    def client(self, argv: list[str], realtime: bool = False) -> list[str]:
        rt = ["chrt", "-f", "50"] if realtime and self.realtime else []
        return [*(["taskset", "-c", str(CLIENT_CPU)] if self.pin else []), *rt, *argv]

    def describe(self) -> str:
        where = (f"server on CPU {SERVER_CPU}, clients on CPU {CLIENT_CPU} (taskset)"
                 if self.pin else "not pinned (fewer than 2 CPUs or no taskset)")
        rt = ("critical client under `chrt -f 50`" if self.realtime
              else "critical client at normal priority (chrt not allowed here)")
        nice = f"; servers at nice {self.nice}" if self.nice else ""
        return f"{where}; {rt}{nice}"


class Sink(RedisServer):
    """redis-server pinned like the nodes, answering the generators' load
    as `EXISTS` of the same arguments (an empty keyspace: next to no work),
    so the generators' own ceiling shows."""

    def __init__(self, workdir: Path, binary: str, pinning: Pinning):
        self.pinning = pinning
        super().__init__(workdir, binary)

    def _spawn(self, argv, env=None):
        super()._spawn(self.pinning.server(argv), env)


class Node(Fastlimit):
    """fastlimit pinned to the server's CPU."""

    pinning: Pinning

    def __init__(self, workdir: Path, label: str, extra: list[str], pinning: Pinning):
        self.label = label
        self.pinning = pinning
        super().__init__(workdir, extra)

    def _spawn(self, argv, env=None):
        super()._spawn(self.pinning.server(argv), env)

    def command(self, *args, timeout: float = 10.0):
        """One command on a fresh connection, its reply parsed by redis-py."""
        c = self.client(socket_timeout=timeout)
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def info(self, section: str) -> dict:
        c = self.client(socket_timeout=10)
        try:
            return c.info(section)
        finally:
            c.close()

    def counters(self) -> dict:
        stats = self.info("stats")
        cmd = self.info("commandstats").get("cmdstat_cl.check", {})
        shedding = self.info("shedding")
        return {"shed_low": int(stats.get("shed_checks_low", 0)),
                "shed_normal": int(stats.get("shed_checks_normal", 0)),
                "checks": int(cmd.get("calls", 0)) if isinstance(cmd, dict) else 0,
                "expired": int(stats.get("expired_keys", 0)),
                "buckets": int(self.command("DBSIZE")),
                "level_changes": int(shedding.get("shed_level_changes", 0))}


# ---------------------------------------------------------------------------
# one measured run

@dataclass
class Latency:
    n: int = 0
    p50: float = 0.0           # µs
    p99: float = 0.0
    p999: float = 0.0
    top: float = 0.0
    bad: int = 0
    timeouts: int = 0
    requests: int = 0          # all the client sent, in and out of the window
    sched: Sched | None = None  # the server's loop thread over the window
    p99_co: float = 0.0        # p99 corrected for coordinated omission


def quantile(xs: list[int], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] / 1000.0 if xs else 0.0


def summarise(out: dict, start_ns: int, end_ns: int, interval_us: int) -> Latency:
    took = sorted(t for s, t in zip(out["sent_at"], out["took"], strict=True)
                  if start_ns <= s < end_ns)
    # Corrected for coordinated omission (as HdrHistogram does): a check that
    # took L held back the ones due every interval meanwhile, which a caller
    # sending at its own pace would have sent and waited L - interval,
    # L - 2 interval, ... for.
    step = interval_us * 1000
    corrected = list(took)
    for t in took:
        corrected.extend(range(t - step, 0, -step))
    corrected.sort()
    return Latency(len(took), quantile(took, 0.50), quantile(took, 0.99),
                   quantile(took, 0.999), took[-1] / 1000.0 if took else 0.0,
                   out["bad"], out["timeouts"], len(out["took"]),
                   p99_co=quantile(corrected, 0.99))


class Critical:
    """The critical client as a child process."""

    def __init__(self, port: int, pinning: Pinning, seconds: float, interval_us: int):
        argv = pinning.client([sys.executable, str(Path(__file__).resolve()),
                               "--critical-client", str(port), str(seconds),
                               str(interval_us)], realtime=True)
        self.limit = seconds + 30
        # unbuffered: "ready" is read byte by byte, communicate() reads the rest
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, bufsize=0,
                                     preexec_fn=_die_with_parent)
        # its interpreter started and its first check answered
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        if not ready or self.proc.stdout.readline() != b"ready\n":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise RuntimeError("the critical client did not start: "
                               + err.decode(errors="replace")[-500:])

    def finish(self, stop: bool = True) -> dict:
        if stop and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = self.proc.communicate(timeout=self.limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=10)
            raise RuntimeError("the critical client did not finish") from None
        if self.proc.returncode != 0 or not stdout:
            raise RuntimeError("the critical client failed: "
                               + stderr.decode(errors="replace")[-500:])
        return json.loads(stdout)


def warmed(out: dict, start_ns: int, end_ns: int) -> int:
    """Where a window's measurement starts: after the first 10% of what the
    client sent in it (the connection and the interpreter warming up, the
    level rising)."""
    first = next((t for t in out["sent_at"] if t >= start_ns), end_ns)
    return first + (min(end_ns, out["sent_at"][-1] if out["sent_at"] else end_ns) - first) // 10


def idle_latency(node: Node, pinning: Pinning, seconds: float, interval_us: int) -> Latency:
    began = time.monotonic_ns()
    sched0 = schedstat(node.pid)
    out = Critical(node.port, pinning, seconds, interval_us).finish(stop=False)
    lat = summarise(out, warmed(out, began, 1 << 62), 1 << 62, interval_us)
    lat.sched = Sched.between(sched0, schedstat(node.pid), time.monotonic_ns() - began)
    return lat


@dataclass
class Generator:
    priority: str
    n: int
    proc: subprocess.Popen | None = None
    ended_ns: int = 0
    rps: float = 0.0
    p99: float = 0.0            # ms, its own (redis-benchmark's) latency
    error: str = ""


def start_generators(port: int, pinning: Pinning, plan: list[tuple[str, int]], clients: int,
                     pipeline: int, name: str = "CL.CHECK") -> list[Generator]:
    gens = []
    for priority, n in plan:
        argv = pinning.client(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port),
                               "-c", str(clients), "-P", str(pipeline), "-n", str(n),
                               "-r", str(KEYS), "--csv", *generator_command(priority, name)])
        g = Generator(priority, n)
        g.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, text=True,
                                  preexec_fn=_die_with_parent)
        gens.append(g)
    return gens


def wait_generators(gens: list[Generator], timeout: float) -> None:
    """Notes when each generator ends; kills what is still running at the
    timeout (its run then counts as failed)."""
    deadline = time.monotonic() + timeout
    while any(g.ended_ns == 0 for g in gens):
        for g in gens:
            if g.ended_ns == 0 and g.proc.poll() is not None:
                g.ended_ns = time.monotonic_ns()
        if time.monotonic() > deadline:
            for g in gens:
                if g.ended_ns == 0:
                    g.proc.kill()
                    g.ended_ns = time.monotonic_ns()
                    g.error = f"killed after {timeout:.0f} s"
            break
        time.sleep(0.005)
    for g in gens:
        stdout, stderr = g.proc.communicate(timeout=10)
        rows = [line for line in stdout.splitlines()
                if line.startswith('"') and not line.startswith('"test"')]
        if g.proc.returncode != 0 or not rows:
            g.error = g.error or (f"exit {g.proc.returncode}: "
                                  + (stderr.strip().splitlines() or ["no output"])[-1][:200])
            continue
        cells = [c.strip('"') for c in rows[-1].split('","')]
        # "test","rps","avg","min","p50","p95","p99","max"
        g.rps, g.p99 = float(cells[1]), float(cells[6])


class Sampler(threading.Thread):
    """INFO shedding every SAMPLE_S, on a critical connection (read first
    while the node is saturated, so the sampling is not held back)."""

    def __init__(self, node: Node):
        super().__init__(daemon=True)
        self.node = node
        self.samples: list[dict] = []
        self.halt = threading.Event()

    def run(self) -> None:
        c = self.node.client(socket_timeout=10)
        try:
            c.execute_command("CL.CHECK", "sampler", CAPACITY, CAPACITY, "PRIORITY", "critical")
            while not self.halt.wait(SAMPLE_S):
                info = c.info("shedding")
                info["_sweep_ms"] = float(c.info("stats").get("sweep_last_budget_ms", 0))
                info["_cpu"] = cpu_seconds(self.node.pid)
                info["_t"] = time.monotonic()
                self.samples.append(info)
        except Exception as e:      # a sample lost is reported as no samples
            log(f"  sampler: {type(e).__name__}: {e}")
        finally:
            c.close()


@dataclass
class LoadRun:
    node: str
    rep: int
    wall: float = 0.0
    sent: dict = field(default_factory=dict)          # priority -> requests
    gens: list = field(default_factory=list)
    latency: Latency | None = None
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    rss0: int = 0
    rss1: int = 0
    cpu: float = 0.0
    sched: Sched = field(default_factory=Sched)
    samples: list = field(default_factory=list)
    errors: list = field(default_factory=list)


def load_run(node: Node, pinning: Pinning, args, per_generator: int, rep: int) -> LoadRun:
    run = LoadRun(node.label, rep)
    plan = [("low", per_generator)] * (args.generators // 2) + \
           [("normal", per_generator)] * (args.generators - args.generators // 2)
    run.sent = {"low": sum(n for p, n in plan if p == "low"),
                "normal": sum(n for p, n in plan if p == "normal")}
    run.before = node.counters()
    run.rss0 = vm_rss(node.pid)
    forced = args.force_level is not None and node.label == "shedding on"
    if forced:
        node.command("DEBUG", "SHED-LEVEL", str(args.force_level))
    sampler = Sampler(node)
    sampler.start()
    critical = Critical(node.port, pinning, args.max_seconds, args.critical_interval_us)
    cpu0 = cpu_seconds(node.pid)
    sched0 = schedstat(node.pid)
    began = time.monotonic_ns()
    gens = start_generators(node.port, pinning, plan, args.clients, args.pipeline)
    try:
        wait_generators(gens, args.max_seconds)
    finally:
        out = critical.finish()
        sampler.halt.set()
        sampler.join(timeout=15)
    ended = max(g.ended_ns for g in gens)
    first_end = min(g.ended_ns for g in gens)
    run.wall = (ended - began) / 1e9
    run.cpu = cpu_seconds(node.pid) - cpu0
    sched1 = schedstat(node.pid)
    run.sched = Sched.between(sched0, sched1, ended - began)
    run.gens = gens
    run.errors = [f"{g.priority}: {g.error}" for g in gens if g.error]
    # The critical client's latency while every generator runs, after a
    # warm-up of 10% of that span (connections opening, the level rising).
    run.latency = summarise(out, warmed(out, began, first_end), first_end,
                            args.critical_interval_us)
    run.samples = [s for s in sampler.samples if s["_t"] * 1e9 < first_end]
    if forced:
        node.command("DEBUG", "SHED-LEVEL", "AUTO")
    time.sleep(0.3)         # the level falls (it holds 100 ms) before INFO and RSS
    run.after = node.counters()
    run.rss1 = vm_rss(node.pid)
    run.after["critical"] = out
    return run


@dataclass
class Calibration:
    node: str
    priority: str
    level: int
    requests: int
    seconds: float
    cpu: float
    shed: int

    @property
    def what(self) -> str:
        if self.shed:
            return "every check shed"
        return "counted, read after critical connections" if self.level else "counted"

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_us(self) -> float:
        return self.cpu / self.requests * 1e6 if self.requests else 0.0


def calibrate(node: Node, pinning: Pinning, args, priority: str, level: int,
              per_generator: int) -> Calibration:
    """Load of one priority at a forced level: at 0 every check is counted;
    at 1 every low one is shed, and a normal one counted but read after the
    critical connections (held back, at most FL_LOAD_DRAIN_NS a turn)."""
    node.command("DEBUG", "SHED-LEVEL", str(level))
    try:
        before = node.counters()
        cpu0 = cpu_seconds(node.pid)
        t0 = time.monotonic()
        gens = start_generators(node.port, pinning, [(priority, per_generator)] * args.generators,
                                args.clients, args.pipeline)
        wait_generators(gens, args.max_seconds)
        seconds = time.monotonic() - t0
        cpu = cpu_seconds(node.pid) - cpu0
        after = node.counters()
    finally:
        node.command("DEBUG", "SHED-LEVEL", "AUTO")
    failed = [g.error for g in gens if g.error]
    if failed:
        raise RuntimeError("calibration: " + "; ".join(failed))
    requests = after["checks"] - before["checks"]
    return Calibration(node.label, priority, level, requests, seconds, cpu,
                       after[f"shed_{priority}"] - before[f"shed_{priority}"])


def generators_ceiling(workdir: Path, pinning: Pinning, args,
                       per_generator: int) -> tuple[float, str]:
    """The generators' own rate (checks/s) against a server that does next
    to nothing per request: what they can offer.  (0, why) when redis-server
    is missing or the run failed."""
    binary = shutil.which("redis-server")
    if not binary:
        return 0.0, "redis-server not found"
    sink = Sink(workdir, binary, pinning)
    try:
        sink.wait_ready()
        t0 = time.monotonic()
        gens = start_generators(sink.port, pinning, [("low", per_generator)] * args.generators,
                                args.clients, args.pipeline, name="EXISTS")
        wait_generators(gens, args.max_seconds)
        seconds = time.monotonic() - t0
    except RuntimeError as e:
        return 0.0, str(e)
    finally:
        sink.stop()
    failed = [g.error for g in gens if g.error]
    if failed:
        return 0.0, "; ".join(failed)
    return per_generator * args.generators / seconds, ""


# ---------------------------------------------------------------------------
# the report

def us(x: float) -> str:
    return f"{x:,.0f}"


def kps(x: float) -> str:
    return f"{x / 1e3:,.0f}k"


def mib(x: int) -> str:
    return f"{x / 2**20:.1f}"


def sample_stats(samples: list[dict], key: str) -> tuple[float, float]:
    xs = [float(s.get(key, 0)) for s in samples]
    return (statistics.median(xs), max(xs)) if xs else (0.0, 0.0)


def build_report(args, meta: dict, idle: dict, cal: list[Calibration],
                 runs: list[LoadRun], ceiling: tuple[float, str]) -> str:
    out: list[str] = []
    add = out.append
    add("## Overload shedding: a critical caller under overload, shedding on and off")
    add("")
    add(f"{meta['when']} · {meta['machine']} · {meta['build']} · {meta['pinning']} · "
        f"{args.generators} redis-benchmark "
        f"generators (half `PRIORITY low`, half `normal`), each `-c {args.clients} "
        f"-P {args.pipeline} -r {KEYS:,}` · {args.repeat} load run(s) per node, "
        f"interleaved · {meta['elapsed']:.0f} s in total · load average "
        f"{meta['load_before']} before, {meta['load_after']} after"
        + (" · **--quick: tiny counts, the figures are only a smoke test**"
           if args.quick else ""))
    add("")
    nodes = ["shedding on", "shedding off"]
    flags = {"shedding on": "default (`--shed-threshold 90`)",
             "shedding off": "`--shed-threshold 0`"}

    # 1. capacity and the generators' ceiling, CPU per check
    add("### 1. What the node can do, what the generators offer, CPU per check")
    add("")
    add(f"Load of one priority ({args.generators} generators), the level forced with "
        "`DEBUG SHED-LEVEL`. Server CPU is utime+stime from /proc/PID/stat over the run, "
        "divided by the checks it answered (INFO commandstats).")
    add("")
    add("| node | load | level | checks | shed (INFO) | seconds | checks/s | server CPU s "
        "| CPU µs / check |")
    add("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for c in cal:
        add(f"| {c.node} | `{c.priority}` | {c.level}: {c.what} | {c.requests:,} | {c.shed:,} | "
            f"{c.seconds:.2f} | {kps(c.rps)} | {c.cpu:.2f} | {c.cpu_us:.2f} |")
    add("")
    counted = [c for c in cal if c.level == 0 and c.node == "shedding on"]
    shed = [c for c in cal if c.level == 1 and c.priority == "low"]
    held = [c for c in cal if c.level == 1 and c.priority == "normal"]
    if counted and shed:
        capacity = counted[0].rps
        offered, why = ceiling
        add(f"- capacity (counted checks/s at level 0): **{kps(capacity)}**; when every check "
            f"is shed the node answers **{kps(shed[0].rps)}** "
            f"({shed[0].rps / capacity:.2f}×).")
        add(f"- what the generators offer: **{kps(offered)}** checks/s against a "
            "redis-server that does next to nothing per request (the same load as `EXISTS` "
            "of the same arguments, on an empty keyspace, pinned like the nodes): "
            f"**{offered / capacity:.2f}×** the node's capacity. They are closed-loop "
            f"({args.generators} × {args.clients} connections × {args.pipeline} pipelined = "
            f"{args.generators * args.clients * args.pipeline:,} checks in flight)."
            if offered else f"- what the generators offer: **not measured** ({why})")
        add(f"- server CPU per shed check **{shed[0].cpu_us:.2f} µs** against "
            f"**{counted[0].cpu_us:.2f} µs** per counted one: "
            f"**{shed[0].cpu_us / counted[0].cpu_us:.2f}×**." if counted[0].cpu_us else
            "- server CPU per check: not measured")
        if held and counted[0].cpu_us:
            add(f"- a counted check read after the critical connections (`normal` at level 1: "
                f"its connection's reads held back and drained) costs **{held[0].cpu_us:.2f} "
                f"µs** of server CPU, **{held[0].cpu_us / counted[0].cpu_us:.2f}×** one read "
                "in turn: the price of the reading order.")
        add("")

    # 2. the critical client
    add("### 2. The critical client's latency")
    add("")
    add(f"`{' '.join(CRITICAL)}`, one connection, one request at a time, one every "
        f"{args.critical_interval_us} µs (at once when the last took longer), round trips timed "
        "by the client (µs); under load only while every generator runs (after a 10% "
        "warm-up). Ratio: p99 ÷ the same node's idle p99. CO-corrected: with the checks a "
        "caller at this pace would have sent while one was stuck (coordinated omission), "
        "each counted as waiting the rest of the stall. Server wait: the loop thread's "
        "mean wait for CPU 0 each time it was scheduled (/proc schedstat): other processes "
        "on that core, not the node's own work.")
    add("")
    add("| node | run | requests | p50 µs | p99 µs | p99.9 µs | max µs | p99 ÷ idle p99 "
        "| p99 µs, CO-corrected | not counted / timeouts | server wait µs / wake-up |")
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    med: dict[str, float] = {}
    for name in nodes:
        lat = idle.get(name)
        if lat:
            add(f"| {name} | idle | {lat.n:,} | {us(lat.p50)} | {us(lat.p99)} | "
                f"{us(lat.p999)} | {us(lat.top)} | 1.00× | {us(lat.p99_co)} | "
                f"{lat.bad} / {lat.timeouts} | "
                f"{lat.sched.wait_per_slice_us:,.1f} |")
    for name in nodes:
        mine = [r for r in runs if r.node == name and r.latency and r.latency.n]
        for r in mine:
            lat = r.latency
            base = idle[name].p99 if idle.get(name) else 0
            add(f"| {name} | load #{r.rep + 1} | {lat.n:,} | {us(lat.p50)} | {us(lat.p99)} | "
                f"{us(lat.p999)} | {us(lat.top)} | "
                f"{lat.p99 / base if base else 0:.2f}× | {us(lat.p99_co)} | "
                f"{lat.bad} / {lat.timeouts} | "
                f"{r.sched.wait_per_slice_us:,.1f} |")
        if mine:
            med[name] = statistics.median(r.latency.p99 for r in mine)
    add("")
    base_on = idle["shedding on"].p99 if idle.get("shedding on") else 0
    if base_on and "shedding on" in med:
        ratio = med["shedding on"] / base_on
        add(f"- target: critical p99 under load with shedding on ≤ 2× its idle p99: "
            f"{us(med['shedding on'])} µs ÷ {us(base_on)} µs = {ratio:.2f}× — "
            f"**{'met' if ratio <= 2 else 'MISSED'}**")
    if "shedding off" in med and "shedding on" in med and med["shedding on"]:
        add(f"- shedding off: critical p99 {us(med['shedding off'])} µs, "
            f"{med['shedding off'] / med['shedding on']:.1f}× the shedding-on p99 "
            "(the cost of queueing behind the load).")
    add("")

    # 3. throughput and shed counts
    add("### 3. Throughput and shed counts")
    add("")
    add("Each generator sends `-n` checks (redis-benchmark's count); throughput is all "
        "generators' checks ÷ the wall time from the first start to the last exit. Shed counts "
        "are the INFO stats deltas (`shed_checks_low`, `shed_checks_normal`); \"adds up\" "
        "compares INFO commandstats `cl.check` calls with what the generators and the "
        "critical client sent. Normal p99 is the normal generators' own (redis-benchmark, "
        "worst of them).")
    add("")
    add("| node | run | wall s | checks/s | counted/s | low sent | low shed | normal sent "
        "| normal shed | normal p99 ms | server CPU % | adds up |")
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in runs:
        shed_low = r.after["shed_low"] - r.before["shed_low"]
        shed_normal = r.after["shed_normal"] - r.before["shed_normal"]
        total = r.sent["low"] + r.sent["normal"]
        crit = r.after["critical"]
        seen = r.after["checks"] - r.before["checks"]
        # + the critical client's untimed first check and the sampler's one
        expect = total + len(crit["took"]) + 2
        normal_p99 = max((g.p99 for g in r.gens if g.priority == "normal"), default=0)
        adds = ("yes" if seen == expect else f"no: {seen:,} seen, {expect:,} sent "
                f"({seen - expect:+,})")
        add(f"| {r.node} | #{r.rep + 1} | {r.wall:.2f} | {kps(total / r.wall)} | "
            f"{kps((total - shed_low - shed_normal) / r.wall)} | {r.sent['low']:,} | "
            f"{shed_low:,} ({100 * shed_low / max(r.sent['low'], 1):.0f}%) | "
            f"{r.sent['normal']:,} | {shed_normal:,} "
            f"({100 * shed_normal / max(r.sent['normal'], 1):.0f}%) | {normal_p99:.2f} | "
            f"{100 * r.cpu / r.wall:.0f} | {adds} |")
    add("")
    errors = [f"{r.node} #{r.rep + 1} {e}" for r in runs for e in r.errors]
    if errors:
        add("Failed generators (their counts are in the table as sent, not received):")
        out.extend(f"- {e}" for e in errors)
        add("")

    # 4. the meter during the runs
    add("### 4. The meter during the load runs (INFO shedding every 250 ms)")
    add("")
    add("Median / max over the samples taken while every generator ran. With "
        "`--shed-threshold 0` the meter still measures; it only never sets a level. The "
        "last two columns are the loop thread's share of the run's wall time on CPU 0 and "
        "runnable but waiting for it (/proc schedstat): a loop lag with much waiting is "
        "other processes on the core, not the node's own turns. Level changes, buckets "
        "swept (`expired_keys`) are INFO deltas over the whole run; sweep budget is "
        "`sweep_last_budget_ms` (1 ms a tick, 25× that after a tick that found much to drop).")
    add("")
    add("| node | run | samples | level | busy % | loop lag µs | held-back wait µs "
        "| held connections | deferred reads | level changes | buckets swept "
        "| sweep budget ms | on CPU % | waiting for CPU % |")
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        s = r.samples
        cells = []
        for key in ("shed_level", "shed_busy_percent", "shed_loop_lag_us", "shed_wait_us",
                    "shed_pending_connections"):
            m, top = sample_stats(s, key)
            cells.append(f"{m:,.0f} / {top:,.0f}")
        deferred = (int(s[-1]["shed_deferred_reads"]) - int(s[0]["shed_deferred_reads"])
                    if len(s) > 1 else 0)
        sweep = sample_stats(s, "_sweep_ms")
        add(f"| {r.node} | #{r.rep + 1} | {len(s)} | " + " | ".join(cells) + f" | {deferred:,} | "
            f"{r.after['level_changes'] - r.before['level_changes']:,} | "
            f"{r.after['expired'] - r.before['expired']:,} | {sweep[0]:g} / {sweep[1]:g} | "
            f"{100 * r.sched.on_cpu:.0f} | {100 * r.sched.waited:.0f} |")
    add("")

    # 5. memory
    add("### 5. RSS (VmRSS from /proc/PID/status) before and after each load run")
    add("")
    add("Buckets: DBSIZE. Counted checks store buckets (and the sweep drops them once full "
        "again); shed checks store none. \"start\" is before any load, \"settled\" after the "
        "last run once the sweep has emptied the tables.")
    add("")
    add("| node | run | buckets before → after | RSS before MiB | after MiB | Δ MiB |")
    add("|---|---|---:|---:|---:|---:|")
    for name in nodes:
        start, settled = meta["rss"].get((name, "start")), meta["rss"].get((name, "settled"))
        if start:
            add(f"| {name} | start | {start[1]:,} | – | {mib(start[0])} | – |")
        for r in runs:
            if r.node == name:
                add(f"| {name} | #{r.rep + 1} | {r.before['buckets']:,} → "
                    f"{r.after['buckets']:,} | {mib(r.rss0)} | {mib(r.rss1)} | "
                    f"{(r.rss1 - r.rss0) / 2**20:+.1f} |")
        if start and settled:
            add(f"| {name} | settled | {settled[1]:,} | {mib(start[0])} | {mib(settled[0])} | "
                f"{(settled[0] - start[0]) / 2**20:+.1f} |")
    add("")
    if args.server_arg:
        add(f"Both nodes also ran with `{' '.join(args.server_arg)}`.")
        add("")
    if args.force_level is not None:
        add(f"The shedding node's load runs held the level at {args.force_level} "
            "(`DEBUG SHED-LEVEL`), not measured.")
        add("")
    add("Nodes: " + "; ".join(f"{n}: {flags[n]}" for n in nodes) + ". Generators: "
        f"`{' '.join(generator_command('low|normal'))}`.")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------

def whole(args, n: float) -> int:
    """n rounded up to whole pipelines of every connection: redis-benchmark
    sends its -n in whole pipelines (-n 56031 at -P 16 sends 56032), so the
    counts it reports then match what the node saw."""
    step = args.clients * args.pipeline
    return max(1, -(-int(n) // step)) * step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a smoke run of a few seconds: tiny counts, one load run per node")
    p.add_argument("--repeat", type=int, help="load runs per node, interleaved (default 3, "
                   "1 with --quick)")
    p.add_argument("--seconds", type=float,
                   help="about how long a load run lasts without shedding (default 6, 1 "
                   "with --quick): sets each generator's -n from the measured capacity")
    p.add_argument("--idle-seconds", type=float, help="idle critical timing (default 3)")
    p.add_argument("--calibrate-n", type=int,
                   help="checks per generator in each calibration run (default 250,000)")
    p.add_argument("--generators", type=int, default=4,
                   help="redis-benchmark processes, half low, half normal (default 4)")
    p.add_argument("--clients", type=int, default=25, help="redis-benchmark -c per generator")
    p.add_argument("--pipeline", type=int, default=16, help="redis-benchmark -P")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="a run's bound: generators still running are killed (default 60)")
    p.add_argument("--server-nice", type=int, default=0,
                   help="run the servers under `nice -n N` (a diagnosis on a shared machine: "
                   "-20 keeps other processes from taking CPU 0 from them; default 0)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for both nodes, repeatable (a diagnosis: "
                   "--server-arg=--sweep-budget-ms=0.5)")
    p.add_argument("--force-level", type=int, choices=(0, 1, 2),
                   help="hold the shedding node at this level (DEBUG SHED-LEVEL) during its "
                   "load runs, instead of measuring it (a diagnosis)")
    p.add_argument("--output", type=Path, default=RESULTS)
    p.add_argument("--critical-interval-us", type=int, default=250,
                   help="the critical client sends one check every this many µs (default 250)")
    p.add_argument("--critical-client", nargs=3, metavar=("PORT", "SECONDS", "INTERVAL_US"),
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick
    args.repeat = max(1, args.repeat or (1 if q else 3))
    args.seconds = args.seconds or (1.0 if q else 6.0)
    args.idle_seconds = args.idle_seconds or (0.5 if q else 3.0)
    args.calibrate_n = args.calibrate_n or (10_000 if q else 250_000)
    args.generators = max(2, args.generators)
    if q:
        args.max_seconds = min(args.max_seconds, 20.0)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.critical_client:
        port, seconds, interval = args.critical_client
        return critical_client(int(port), float(seconds), int(interval))
    signal.signal(signal.SIGTERM, _terminate)
    if not shutil.which("redis-benchmark"):
        log("error: redis-benchmark not found (make bench installs redis-tools)")
        return 2
    started = time.monotonic()
    pinning = Pinning(can_pin(), can_chrt(), args.server_nice)
    if pinning.pin:
        # this script's own threads (the INFO sampler) stay off the server's core
        os.sched_setaffinity(0, {CLIENT_CPU})
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "build": "?", "pinning": pinning.describe(),
            "load_before": loadavg(), "rss": {}}
    idle: dict[str, Latency] = {}
    cal: list[Calibration] = []
    runs: list[LoadRun] = []
    ceiling: tuple[float, str] = (0.0, "not run")
    with tempfile.TemporaryDirectory(prefix="fastlimit-overload-bench-") as tmp:
        nodes: dict[str, Node] = {}
        try:
            extra = list(args.server_arg)
            nodes["shedding on"] = Node(Path(tmp), "shedding on", extra, pinning)
            nodes["shedding off"] = Node(Path(tmp), "shedding off",
                                         [*extra, "--shed-threshold", "0"], pinning)
            for node in nodes.values():
                node.wait_ready()
            meta["build"] = fastlimit_build(nodes["shedding on"].source)
            for name, node in nodes.items():
                meta["rss"][(name, "start")] = (vm_rss(node.pid), int(node.command("DBSIZE")))
            log("nodes: " + ", ".join(f"{n.label} port {n.port} pid {n.pid}"
                                       for n in nodes.values()) + f"; {pinning.describe()}")

            log(f"== idle: the critical client alone, {args.idle_seconds:g} s per node")
            for name, node in nodes.items():
                idle[name] = idle_latency(node, pinning, args.idle_seconds,
                                          args.critical_interval_us)
                log(f"  {name:12} p50 {us(idle[name].p50)} µs  p99 {us(idle[name].p99)} µs "
                    f"({idle[name].n:,} requests)")

            log(f"== calibration: {args.generators} generators x {args.calibrate_n:,}")
            for name, priority, level in (("shedding off", "low", 0), ("shedding on", "low", 0),
                                          ("shedding on", "low", 1),
                                          ("shedding on", "normal", 1)):
                c = calibrate(nodes[name], pinning, args, priority, level,
                              whole(args, args.calibrate_n))
                cal.append(c)
                log(f"  {name:12} {priority:6} level {level}: {kps(c.rps)} checks/s, "
                    f"{c.cpu_us:.2f} CPU µs/check, {c.shed:,} shed")
            capacity = min(c.rps for c in cal if c.level == 0)
            ceiling = generators_ceiling(Path(tmp), pinning, args, whole(args, args.calibrate_n))
            log(f"  redis-server EXISTS: {kps(ceiling[0])} requests/s {ceiling[1]}")
            per_generator = whole(args, capacity * args.seconds / args.generators)

            log(f"== load: {args.generators} generators x {per_generator:,} checks, "
                f"{args.repeat} run(s) per node")
            for rep in range(args.repeat):
                order = list(nodes.values())
                if rep % 2:
                    order.reverse()        # neither node always goes first
                for node in order:
                    r = load_run(node, pinning, args, per_generator, rep)
                    runs.append(r)
                    lat = r.latency
                    log(f"  [{rep + 1}/{args.repeat}] {node.label:12} {r.wall:.1f} s, critical "
                        f"p50 {us(lat.p50)} p99 {us(lat.p99)} µs ({lat.n:,}), shed low "
                        f"{r.after['shed_low'] - r.before['shed_low']:,} normal "
                        f"{r.after['shed_normal'] - r.before['shed_normal']:,}"
                        + (f"; errors: {r.errors}" if r.errors else ""))
            # the sweep drops the buckets of the last run (all full again at once)
            deadline = time.monotonic() + (3 if args.quick else 10)
            while time.monotonic() < deadline and any(
                    int(n.command("DBSIZE")) for n in nodes.values()):
                time.sleep(0.2)
            for name, node in nodes.items():
                meta["rss"][(name, "settled")] = (vm_rss(node.pid),
                                                  int(node.command("DBSIZE")))
        finally:
            for node in nodes.values():
                node.stop()
    meta["elapsed"] = time.monotonic() - started
    meta["load_after"] = loadavg()
    publish(build_report(args, meta, idle, cal, runs, ceiling), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
