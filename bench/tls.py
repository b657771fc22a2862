#!/usr/bin/env python3
"""What TLS costs: fastlimit's CL.CHECK and PING over its tls-port against
its plain port, side by side with redis-server 7.0 over its tls-port and
plain port (PING and EVALSHA of bench/token_bucket.lua), with the same
redis-benchmark settings, at -P 1 and -P 16.  Prints a markdown table
with each side's TLS/plain ratio; the target (issue 15) is that TLS costs
fastlimit no larger a share of its throughput than it costs redis-server.

Certificates: ECDSA P-256 from the openssl CLI, made in a temporary
directory (never checked in); tls-auth-clients no, so the handshake is
server-only (redis-benchmark keeps its connections: handshakes are not
what is measured).  Reports; does not judge by exit code.

    .venv/bin/python bench/tls.py [--n1 N] [--n16 N] [--repeat N]
    .venv/bin/python bench/tls.py --quick     # a smoke run: 2,000 / 20,000 requests, 1 repeat
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import LUA_PATH, Fastlimit, RedisServer, free_port, log, run_benchmark  # noqa: E402


def make_certs(d: Path) -> tuple[str, str, str]:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-sha256"]
    openssl("req", "-x509", "-new", *ec, "-days", "2", "-subj", "/CN=bench CA",
            "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-new", *ec, "-subj", "/CN=localhost", "-keyout", "server.key",
            "-out", "server.csr")
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "server.ext", "-out", "server.crt")
    return str(d / "ca.crt"), str(d / "server.crt"), str(d / "server.key")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run, a few seconds: "
                   "--n1 2,000, --n16 20,000, --repeat 1 (unless given)")
    p.add_argument("--n1", type=int, help="requests per run at -P 1 (default 40,000)")
    p.add_argument("--n16", type=int, help="requests per run at -P 16 (default 300,000)")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--repeat", type=int,
                   help="runs per cell; the median is shown (default 3)")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--redis-benchmark",
                   default=shutil.which("redis-benchmark") or "redis-benchmark")
    args = p.parse_args(argv)
    args.n1 = args.n1 or (2_000 if args.quick else 40_000)
    args.n16 = args.n16 or (20_000 if args.quick else 300_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    work = Path(tempfile.mkdtemp(prefix="fastlimit-tls-bench-"))
    ca, cert, key = make_certs(work)
    common = ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca,
              "--tls-auth-clients", "no"]
    fl_tls, rd_tls = free_port(), free_port()
    fl = rd = None
    try:
        fl = Fastlimit(work, ["--tls-port", str(fl_tls), *common])
        rd = RedisServer(work, args.redis_server, ["--tls-port", str(rd_tls), *common])
        fl.wait_ready()
        rd.wait_ready()
        r = rd.client()
        sha = r.script_load(LUA_PATH.read_bytes())
        r.close()
        tls = ["--tls", "--cacert", ca]
        sides = {"fastlimit": (fl.port, fl_tls), "redis": (rd.port, rd_tls)}
        rows = [("fastlimit", "CL.CHECK", ["CL.CHECK", "key:__rand_int__", "100", "10"]),
                ("redis", "EVALSHA token_bucket.lua",
                 ["EVALSHA", sha, "1", "key:__rand_int__", "100", "10", "1"]),
                ("fastlimit", "PING", ["PING"]), ("redis", "PING", ["PING"])]
        print("| server | command | P | plain rps | TLS rps | TLS / plain |")
        print("|---|---|---|---|---|---|")
        for who, label, cmd in rows:
            for pipeline in (1, 16):
                n = args.n1 if pipeline == 1 else args.n16
                got = {False: [], True: []}
                for rep in range(args.repeat):
                    for over_tls in ((False, True) if rep % 2 == 0 else (True, False)):
                        port = sides[who][over_tls]
                        res = run_benchmark(args.redis_benchmark, port, args.clients, n,
                                            pipeline, cmd, 1_000_000,
                                            extra=tls if over_tls else [])
                        got[over_tls].append(res.rps)
                plain, over = statistics.median(got[False]), statistics.median(got[True])
                log(f"{who} {label} P={pipeline}: plain {plain:,.0f} TLS {over:,.0f}")
                print(f"| {who} | {label} | {pipeline} | {plain:,.0f} | {over:,.0f} | "
                      f"{over / plain:.2f} |", flush=True)
    finally:
        for srv in (fl, rd):
            if srv is not None:
                srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
