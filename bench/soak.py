#!/usr/bin/env python3
"""The attacks of the hardening review, all at once, against one fastlimit,
while a well-behaved client measures its latency.

One run:
  1. starts fastlimit (this interpreter, ``-m fastlimit.server``) with the
     bounds under test, preloads buckets and rules;
  2. measures the well-behaved client alone (``idle``): one connection,
     one ``CL.CHECK`` every 2 ms, each round trip timed;
  3. starts every attack in its own process at nice 19 (so none shares the
     measuring client's GIL or CPU) and measures it again (``attacked``):
       - slow clients: a 1M-argument command, 200k arguments sent, then a
         byte every 2 ms (the quadratic re-parse);
       - a cache flood: ``CL.LIMIT`` with distinct 400 KB resources;
       - fake replicas: ``CL.SYNC`` on sockets that never read, reconnecting
         when dropped;
       - huge ``CONFIG GET``s: 40,000 patterns each;
       - rule churn: ``CL.RULE SET``/``DEL`` with 2,000 rules present;
       - a pipeliner that never reads its replies;
       - protocol-error connections, as fast as they can be opened;
       - an HTTP pipeliner: thousands of ``GET /metrics`` in one write,
         never read;
       - HTTP bodies that never complete: a declared 1 MB body trickled a
         byte at a time;
       - rls-config alias bombs: a 2 KB YAML file whose aliases expand to
         millions of descriptors, rewritten into the watched folder;
       - zero-window gRPC: connections that advertise a window of 0, send
         calls, and never let an answer out;
       - a fake cluster peer: a client that answers CL.PEERAUTH's challenge
         with a made-up proof and pushes a newer, empty set of rules;
  4. samples the server's RSS, its children's RSS and the machine's Shmem
     every 100 ms, and prints one markdown report: latency idle vs
     attacked (p50, p99, worst, and the p99 ratio; target <= 2x) and memory
     (peak vs the bound the settings give).

Every loop stops by itself at its deadline; traffic goes to 127.0.0.1 only.
It reports; it does not judge by exit code.  ``--quick`` is a smoke run of
a few seconds: 1 s per phase, 1,000 buckets and 50 rules preloaded (unless
given).  ``run_soak`` is also used by
tests/server/test_soak.py for a short run that checks the memory bound.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from run import Fastlimit, free_port, rss_bytes  # noqa: E402  (bench/ is not a package)

MB = 1024 * 1024
# The bounds under test: small enough that a breach shows, large enough for
# real clients.  The memory bound of a run is computed from these.
SETTINGS = {
    "client-query-buffer-limit": 16 * MB,
    "client-output-buffer-limit": (16 * MB, 4 * MB, 10),
    "repl-buffer-limit": 16 * MB,
}
PRELOAD_BUCKETS = 200_000
PRELOAD_RULES = 2_000
GOOD_INTERVAL_S = 0.002
GOOD_TIMEOUT_S = 5.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def frame(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def connect(port: int, rcvbuf: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_replies(s: socket.socket, count: int) -> None:
    """Reads until `count` top-level replies have arrived (a rough count of
    reply lines is enough for the attackers, which do not check answers)."""
    import hiredis
    reader = hiredis.Reader()
    got = 0
    while got < count:
        data = s.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        reader.feed(data)
        while reader.gets() is not False:
            got += 1


@dataclass
class Ports:
    """Where the attacks aim: the server's fronts and the folder its
    rls-config watches."""
    resp: int
    http: int
    grpc: int
    rls_dir: Path


def server_args(ports: Ports, workdir: Path) -> list[str]:
    """The fronts on fixed ports, and rls-config on a folder the bomb
    attack writes into."""
    (ports.rls_dir / "good.yaml").write_text(
        "domain: soak\ndescriptors:\n  - key: key\n"
        "    rate_limit: {unit: second, requests_per_unit: 1000000}\n")
    return ["--port", str(ports.resp), "--http-port", str(ports.http),
            "--grpc-port", str(ports.grpc), "--rls-config", str(ports.rls_dir)]


# ---- the attacks: each runs in its own process until `until` (monotonic) ----

def attack_slow_client(ports: Ports, until: float) -> None:
    while time.monotonic() < until:
        try:
            s = connect(ports.resp)
            s.sendall(b"*1000000\r\n" + b"$1\r\na\r\n" * 200_000)
            tail = b"$1\r\na\r\n" * 800_000
            i = 0
            while time.monotonic() < until:
                s.send(tail[i:i + 1])
                i += 1
                time.sleep(0.002)
        except OSError:
            time.sleep(0.05)


def attack_cache_flood(ports: Ports, until: float) -> None:
    big = b"y" * 400_000
    i = 0
    while time.monotonic() < until:
        try:
            s = connect(ports.resp)
            while time.monotonic() < until:
                batch = b"".join(frame(b"CL.LIMIT", b"c", b"%d" % (i + j) + big)
                                 for j in range(10))
                i += 10
                s.sendall(batch)
                read_replies(s, 10)
        except OSError:
            time.sleep(0.05)


def attack_fake_replicas(ports: Ports, until: float, count: int = 10) -> None:
    socks: list = [None] * count
    while time.monotonic() < until:
        for k in range(count):
            if socks[k] is None:
                try:
                    socks[k] = connect(ports.resp, rcvbuf=4096)
                    socks[k].sendall(b"CL.SYNC\r\n")
                    socks[k].setblocking(False)
                except OSError:
                    socks[k] = None
            else:
                try:   # only to notice a drop: never drains the copy
                    if socks[k].recv(1, socket.MSG_PEEK) == b"":
                        raise ConnectionError
                except BlockingIOError:
                    pass
                except OSError:
                    socks[k].close()
                    socks[k] = None
        time.sleep(0.2)


def attack_config_get(ports: Ports, until: float) -> None:
    big = frame(b"CONFIG", b"GET", *[b"zz%d*" % i for i in range(40_000)])
    while time.monotonic() < until:
        try:
            s = connect(ports.resp)
            s.settimeout(120)
            while time.monotonic() < until:
                s.sendall(big)
                read_replies(s, 1)
        except OSError:
            time.sleep(0.05)


def rule_doc(i: int) -> bytes:
    return (b'{"match":{"resource":"GET /api/v1/thing%d/*"},"capacity":%d,'
            b'"refill_per_second":1}' % (i, 10 + i))


def attack_rule_churn(ports: Ports, until: float) -> None:
    i = 0
    while time.monotonic() < until:
        try:
            s = connect(ports.resp)
            s.settimeout(60)
            while time.monotonic() < until:
                n = PRELOAD_RULES + i % 100
                s.sendall(frame(b"CL.RULE", b"SET", b"churn%d" % n, rule_doc(n)) +
                          frame(b"CL.RULE", b"DEL", b"churn%d" % (n - 50)))
                read_replies(s, 2)
                i += 1
        except OSError:
            time.sleep(0.05)


def attack_non_reader(ports: Ports, until: float) -> None:
    batch = frame(b"CL.CHECK", b"nr", b"10", b"1") * 1000
    while time.monotonic() < until:
        try:
            s = connect(ports.resp, rcvbuf=4096)
            while time.monotonic() < until:
                s.sendall(batch)
        except OSError:
            time.sleep(0.05)


def attack_protocol_errors(ports: Ports, until: float) -> None:
    while time.monotonic() < until:
        try:
            s = connect(ports.resp)
            s.sendall(b"*x\r\n")
            s.recv(100)
            s.close()
        except OSError:
            time.sleep(0.01)


def attack_http_pipeliner(ports: Ports, until: float) -> None:
    batch = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 3000
    while time.monotonic() < until:
        try:
            s = connect(ports.http, rcvbuf=4096)
            while time.monotonic() < until:
                s.sendall(batch)
        except OSError:
            time.sleep(0.05)


def attack_http_slow_bodies(ports: Ports, until: float, count: int = 20) -> None:
    head = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"
    socks: list = []
    while time.monotonic() < until:
        while len(socks) < count:
            try:
                s = connect(ports.http)
                s.sendall(head + b"x" * 65536)
                socks.append(s)
            except OSError:
                time.sleep(0.05)
                break
        for s in list(socks):
            try:
                s.send(b"x")
            except OSError:
                s.close()
                socks.remove(s)
        time.sleep(0.5)


def alias_bomb(width: int = 10, levels: int = 6) -> str:
    """The finding's 2 KB document: each level's list is `width` aliases of
    the level below, so it expands to width**levels descriptors."""
    text = ("domain: bomb\ndescriptors:\n  - key: anchor0\n    descriptors: &l0 "
            "[{key: leaf, rate_limit: {unit: second, requests_per_unit: 1}}]\n")
    for lv in range(1, levels + 1):
        items = ", ".join(f"{{key: k{lv}, value: v{j}, descriptors: *l{lv - 1}}}"
                          for j in range(width))
        text += f"  - key: anchor{lv}\n    descriptors: &l{lv} [{items}]\n"
    return text


def attack_alias_bombs(ports: Ports, until: float) -> None:
    bomb = alias_bomb()
    i = 0
    while time.monotonic() < until:
        # A new name each time, so the folder's poll sees a change.
        path = ports.rls_dir / f"bomb{i % 2}.yaml"
        path.write_text(bomb + f"# {i}\n")
        i += 1
        time.sleep(1.5)


def grpc_call() -> bytes:
    message = b"\x0a\x04soak" + b"\x12\x0c\x0a\x0a\x0a\x03key\x12\x03val" * 200
    return struct.pack(">BI", 0, len(message)) + message


def attack_grpc_zero_window(ports: Ports, until: float, count: int = 10) -> None:
    import h2.config
    import h2.connection
    import h2.settings
    body = grpc_call()
    socks: list = []
    while time.monotonic() < until:
        while len(socks) < count:
            try:
                s = connect(ports.grpc)
                conn = h2.connection.H2Connection(h2.config.H2Configuration(
                    client_side=True, header_encoding=None))
                conn.local_settings = h2.settings.Settings(client=True, initial_values={
                    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
                conn.initiate_connection()
                conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
                for _ in range(20):
                    sid = conn.get_next_available_stream_id()
                    conn.send_headers(sid, [
                        (b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"x"),
                        (b":path", b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
                        (b"content-type", b"application/grpc"), (b"te", b"trailers")])
                    window = conn.local_flow_control_window(sid)
                    conn.send_data(sid, body[:window], end_stream=len(body) <= window)
                s.sendall(conn.data_to_send())
                s.setblocking(False)
                socks.append(s)
            except Exception:   # h2's own refusals too: the attack goes on
                time.sleep(0.05)
                break
        for s in list(socks):
            try:   # only to notice a close: never opens its window
                if s.recv(1, socket.MSG_PEEK) == b"":
                    raise ConnectionError
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                socks.remove(s)
        time.sleep(0.2)


def attack_fake_peer(ports: Ports, until: float) -> None:
    """A process posing as a cluster node: asks for a challenge, answers it
    with a made-up proof, then pushes an empty set of rules with a newer
    version, over and over."""
    proof = b"f" * 64
    while time.monotonic() < until:
        try:
            s = connect(ports.resp)
            while time.monotonic() < until:
                s.sendall(frame(b"CL.PEERAUTH", b"CHALLENGE"))
                challenge = s.recv(4096).split(b"\r\n")[1] or b"x"
                s.sendall(frame(b"CL.PEERAUTH", b"PROVE", b"fl-cluster", challenge, b"n" * 32,
                                proof) +
                          frame(b"CL.CLUSTER", b"SETRULES", b"999999", b"f" * 40, b"[]"))
                read_replies(s, 2)
                time.sleep(0.01)
        except OSError:
            time.sleep(0.05)


def attacker(fn, ports: Ports, until: float) -> None:
    """Runs one attack at the lowest CPU priority: on this 2-core machine
    the attackers' own CPU would otherwise delay the measuring client's
    process, which in a real deployment they do not share a machine with.
    The server gets no such help: it serves them at full priority."""
    os.nice(19)
    fn(ports, until)


ATTACKS = {
    "slow clients (x2)": (attack_slow_client, 2),
    "cache flood": (attack_cache_flood, 1),
    "fake replicas (10)": (attack_fake_replicas, 1),
    "CONFIG GET x40k": (attack_config_get, 1),
    "rule churn": (attack_rule_churn, 1),
    "non-reading pipeliner": (attack_non_reader, 1),
    "protocol errors": (attack_protocol_errors, 1),
    "fake cluster peer": (attack_fake_peer, 1),
    "HTTP pipeliner": (attack_http_pipeliner, 1),
    "HTTP bodies never finished (20)": (attack_http_slow_bodies, 1),
    "rls-config alias bombs": (attack_alias_bombs, 1),
    "zero-window gRPC (10)": (attack_grpc_zero_window, 1),
}


# ---- measuring ---------------------------------------------------------------

def good_client(port: int, seconds: float) -> list[float]:
    """Round-trip times (ms) of one CL.CHECK every GOOD_INTERVAL_S.  A
    request that gets no answer within GOOD_TIMEOUT_S counts as that long,
    and the client reconnects."""
    times = []
    until = time.monotonic() + seconds
    i = 0
    s = None
    while time.monotonic() < until:
        req = frame(b"CL.CHECK", b"good:%d" % (i % 100), b"1000000", b"1000000")
        t = time.perf_counter()
        try:
            if s is None:
                s = connect(port)
                s.settimeout(GOOD_TIMEOUT_S)
            s.sendall(req)
            read_replies(s, 1)
        except OSError:
            if s is not None:
                s.close()
            s = None
        times.append((time.perf_counter() - t) * 1000)
        i += 1
        time.sleep(GOOD_INTERVAL_S)
    if s is not None:
        s.close()
    return times


def shmem_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def children_rss(pid: int) -> int:
    total = 0
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return 0
    for k in kids:
        try:
            total += rss_bytes(k)
        except OSError:
            pass
    return total


@dataclass
class MemorySamples:
    rss: list[int] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    shmem: list[int] = field(default_factory=list)


def sample_memory(pid: int, seconds: float, out: MemorySamples, base_shmem: int) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            out.rss.append(rss_bytes(pid))
        except OSError:
            return
        out.children.append(children_rss(pid))
        out.shmem.append(max(0, shmem_bytes() - base_shmem))
        time.sleep(0.1)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


@dataclass
class SoakResult:
    idle_ms: list[float]
    attacked_ms: list[float]
    memory: MemorySamples
    idle_rss: int
    bound: int
    bound_parts: dict
    alive: bool
    log_lines: int
    info_memory: dict
    rules_before: int
    rules_after: int

    @property
    def p99_ratio(self) -> float:
        return percentile(self.attacked_ms, 0.99) / max(1e-9, percentile(self.idle_ms, 0.99))

    @property
    def peak_total(self) -> int:
        return max(r + c + s for r, c, s in zip(self.memory.rss, self.memory.children,
                                                 self.memory.shmem, strict=False))


def memory_bound(idle_rss: int, attackers: dict, info: dict) -> dict:
    """What the settings allow the attacks to hold at once, on top of the
    idle server: every connection's query buffer and output limit, one
    full copy per sync the server allows at a time (as reported), the
    match cache's bound, and the replication output bound per replica."""
    conns = sum(n for _, n in attackers.values()) + 1
    parts = {
        "idle server": idle_rss,
        "query buffers": conns * SETTINGS["client-query-buffer-limit"],
        "output buffers": conns * SETTINGS["client-output-buffer-limit"][0],
        "replica links (10)": 10 * SETTINGS["repl-buffer-limit"],
    }
    for name in ("rules_cache_max_bytes", "repl_copy_max_bytes"):
        if name in info:
            parts[name] = int(info[name])
    return parts


def configure(client) -> None:
    hard, soft, secs = SETTINGS["client-output-buffer-limit"]
    client.execute_command("CONFIG", "SET", "client-query-buffer-limit",
                           SETTINGS["client-query-buffer-limit"],
                           "client-output-buffer-limit", f"{hard} {soft} {secs}",
                           "repl-buffer-limit", SETTINGS["repl-buffer-limit"])


def preload(client, buckets: int, rules: int) -> None:
    p = client.pipeline(transaction=False)
    for i in range(buckets):
        p.execute_command("CL.CHECK", f"pre:{i}", 1000, 1, "COST", 500)
        if i % 10_000 == 9_999:
            p.execute()
    p.execute()
    for i in range(rules):
        p.execute_command("CL.RULE", "SET", f"r{i}", rule_doc(i))
        if i % 500 == 499:
            p.execute()
    p.execute()


def run_soak(seconds: float = 20.0, buckets: int = PRELOAD_BUCKETS, rules: int = PRELOAD_RULES,
             attacks: dict = ATTACKS, extra_args: list[str] = ()) -> SoakResult:
    with tempfile.TemporaryDirectory(prefix="fastlimit-soak-") as tmp:
        ports = Ports(free_port(), free_port(), free_port(), Path(tmp) / "rls")
        ports.rls_dir.mkdir()
        server = Fastlimit(Path(tmp), [*server_args(ports, Path(tmp)), *extra_args])
        try:
            server.wait_ready()
            client = server.client()
            configure(client)
            log(f"preloading {buckets} buckets and {rules} rules")
            preload(client, buckets, rules)
            rules_before = len(client.execute_command("CL.RULE", "LIST"))
            log(f"idle: the good client alone for {seconds:.0f} s")
            idle = good_client(server.port, seconds)
            idle_rss = rss_bytes(server.pid)
            base_shmem = shmem_bytes()
            ctx = mp.get_context("fork")
            until = time.monotonic() + seconds + 2
            procs = [ctx.Process(target=attacker, args=(fn, ports, until), daemon=True)
                     for fn, n in attacks.values() for _ in range(n)]
            for p in procs:
                p.start()
            time.sleep(1.0)   # let every attack get going
            log(f"attacked: the good client for {seconds:.0f} s with {len(procs)} attackers")
            memory = MemorySamples()
            ctx_sampler = __import__("threading").Thread(
                target=sample_memory, args=(server.pid, seconds, memory, base_shmem))
            ctx_sampler.start()
            attacked = good_client(server.port, seconds)
            ctx_sampler.join()
            for p in procs:
                p.join(timeout=max(0.1, until - time.monotonic() + 5))
                if p.is_alive():
                    p.kill()
            alive = server.proc.poll() is None
            info = client.info("memory") if alive else {}
            rules_after = len(client.execute_command("CL.RULE", "LIST")) if alive else 0
            parts = memory_bound(idle_rss, attacks, info)
            log_lines = len(server.logpath.read_text(errors="replace").splitlines())
            client.close()
            return SoakResult(idle, attacked, memory, idle_rss, sum(parts.values()), parts,
                              alive, log_lines, info, rules_before, rules_after)
        finally:
            server.stop()


def report(r: SoakResult, seconds: float) -> str:
    mb = lambda n: f"{n / MB:.0f} MB"  # noqa: E731
    lines = [
        f"# Soak: every attack at once for {seconds:.0f} s",
        "",
        "| good client (CL.CHECK every 2 ms) | requests | p50 ms | p99 ms | worst ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, t in (("idle server", r.idle_ms), ("under all attacks", r.attacked_ms)):
        lines.append(f"| {name} | {len(t)} | {statistics.median(t):.3f} | "
                     f"{percentile(t, 0.99):.3f} | {max(t):.3f} |")
    lines += ["", f"p99 attacked / idle: **{r.p99_ratio:.2f}x** (target <= 2x)", "",
              "| memory | peak |", "|---|---:|",
              f"| server RSS | {mb(max(r.memory.rss))} |",
              f"| its children's RSS (full-copy forks) | {mb(max(r.memory.children))} |",
              f"| Shmem growth (memory files) | {mb(max(r.memory.shmem))} |",
              f"| all three at once | {mb(r.peak_total)} |",
              f"| bound from the settings | {mb(r.bound)} |", "",
              "Bound: " + ", ".join(f"{k} {mb(v)}" for k, v in r.bound_parts.items()), "",
              f"Server alive at the end: {r.alive}; log lines: {r.log_lines}; "
              f"rules in force before the attacks {r.rules_before}, after {r.rules_after} "
              "(the fake peer offers none)."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: --seconds 1 --buckets 1000 --rules 50 (unless given)")
    ap.add_argument("--seconds", type=float, help="each phase's length (default 20)")
    ap.add_argument("--buckets", type=int, help=f"preloaded (default {PRELOAD_BUCKETS:,})")
    ap.add_argument("--rules", type=int, help=f"preloaded (default {PRELOAD_RULES:,})")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="an extra fastlimit-server argument (repeatable)")
    ap.add_argument("--only", action="append", default=[], metavar="TEXT",
                    help="run only the attacks whose name contains TEXT (repeatable): "
                         "to see which one costs the good client its latency")
    args = ap.parse_args()
    if args.seconds is None:
        args.seconds = 1.0 if args.quick else 20.0
    if args.buckets is None:
        args.buckets = 1_000 if args.quick else PRELOAD_BUCKETS
    if args.rules is None:
        args.rules = 50 if args.quick else PRELOAD_RULES
    attacks = {name: a for name, a in ATTACKS.items()
               if not args.only or any(t in name for t in args.only)}
    result = run_soak(args.seconds, args.buckets, args.rules, attacks, args.server_arg)
    print(report(result, args.seconds))


if __name__ == "__main__":
    main()
