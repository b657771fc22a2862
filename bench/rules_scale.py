#!/usr/bin/env python3
"""Rules at scale: what a rule change, a match-cache miss and INFO cost
with 100, 1,000 and 10,000 rules in force.

For each size N, one fresh server (this interpreter, ``-m fastlimit.server
--port 0 --rules-db '' --snapshot-file ''``) on a free loopback port:

  1. load: N rules written to a rules file and applied with one
     CL.RULE RELOAD (the rules look like an API's: N - 3 of
     ``GET /api/v1/thing<i>/*`` plus the catch-alls ``GET /*``,
     ``POST /*`` and ``*`` for tier "free");
  2. change: --changes CL.RULE SET of new rules, then as many CL.RULE DEL,
     one at a time: median and p99 latency; and one SET of a rule that
     overlaps every other (``GET /a*``), the costliest kind to check;
  3. miss: CL.LIMIT on resources never seen before (each one misses the
     match cache), pipelined in batches of 100: time per call; and the same
     call on one cached resource for comparison;
  4. INFO (default sections) and INFO rules: time and size of the reply.

Prints one markdown table.  It reports; it does not judge by exit code.
Needs redis-py.  Example: ``.venv/bin/python bench/rules_scale.py``;
``--quick`` is a smoke run of a second or two (sizes 10 and 100, 5
changes, 100 misses, unless given).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import redis

READY = re.compile(rb"ready to accept connections on .* port (\d+)")
CATCH_ALLS = {"all-get": {"resource": "GET /*"}, "all-post": {"resource": "POST /*"},
              "free-tier": {"resource": "*", "tier": "free"}}


def rule_doc(match: dict, capacity: int) -> dict:
    return {"match": match, "capacity": capacity, "refill_per_second": 1}


def rules_file_doc(n: int) -> dict:
    rules = {f"thing{i}": rule_doc({"resource": f"GET /api/v1/thing{i}/*"}, 100 + i % 7)
             for i in range(n - len(CATCH_ALLS))}
    rules.update({rule_id: rule_doc(match, 1000) for rule_id, match in CATCH_ALLS.items()})
    return {"rules": rules}


class Server:
    def __init__(self, rules_file: str, workdir: str):
        self.log_path = os.path.join(workdir, "server.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fastlimit.server", "--bind", "127.0.0.1", "--port", "0",
             "--rules-db", "", "--snapshot-file", "", "--http-port", "0", "--grpc-port", "0",
             "--rules-file", rules_file],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                m = READY.search(f.read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the server did not start: " + open(self.log_path).read())

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=600)

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def raw_info(port: int, *sections: bytes) -> tuple[float, int]:
    """(seconds, bytes) of one INFO reply, read off the socket unparsed."""
    args = [b"INFO", *sections]
    command = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
    with socket.create_connection(("127.0.0.1", port)) as s:
        reader = s.makefile("rb")
        t = time.perf_counter()
        s.sendall(command)
        header = reader.readline()                  # $<length>
        reader.read(int(header[1:]) + 2)
        return time.perf_counter() - t, len(header) + int(header[1:]) + 2


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def measure(n: int, changes: int, misses: int) -> dict:
    workdir = tempfile.mkdtemp(prefix="fastlimit-rules-scale-")
    path = os.path.join(workdir, "rules.json")
    with open(path, "w") as f:
        json.dump({"rules": {}}, f)
    server = Server(path, workdir)
    try:
        r = server.client()
        with open(path, "w") as f:
            json.dump(rules_file_doc(n), f)
        cpu = server.cpu_seconds()
        load = timed(lambda: r.execute_command("CL.RULE", "RELOAD"))
        load_cpu = server.cpu_seconds() - cpu
        assert int(r.info("rules")["rules"]) == n
        sets, dels = [], []
        for i in range(changes):
            doc = json.dumps(rule_doc({"resource": f"GET /bench/{i}/*"}, 10))
            sets.append(timed(lambda i=i, doc=doc: r.execute_command("CL.RULE", "SET",
                                                                     f"bench{i}", doc)))
        for i in range(changes):
            dels.append(timed(lambda i=i: r.execute_command("CL.RULE", "DEL", f"bench{i}")))
        catch_all = timed(lambda: r.execute_command(
            "CL.RULE", "SET", "bench-all", json.dumps(rule_doc({"resource": "GET /a*"}, 10))))
        r.execute_command("CL.RULE", "DEL", "bench-all")
        rng = random.Random(n)
        resources = [f"GET /api/v1/thing{rng.randrange(n * 2)}/x{i}" for i in range(misses)]
        miss = 0.0
        for start in range(0, misses, 100):
            pipe = r.pipeline(transaction=False)
            for resource in resources[start:start + 100]:
                pipe.execute_command("CL.LIMIT", "ip:10.0.0.1", resource)
            miss += timed(pipe.execute)
        pipe = r.pipeline(transaction=False)
        for _ in range(misses):
            pipe.execute_command("CL.LIMIT", "ip:10.0.0.1", "GET /api/v1/thing1/x")
        hit = timed(pipe.execute)
        info_default, info_size = raw_info(server.port)
        info_rules, info_rules_size = raw_info(server.port, b"rules")
        return {"rules": n, "load_ms": ms(load), "load_cpu_ms": ms(load_cpu),
                "set_p50": ms(statistics.median(sets)), "set_p99": ms(p99(sets)),
                "del_p50": ms(statistics.median(dels)), "del_p99": ms(p99(dels)),
                "catch_all_ms": ms(catch_all),
                "miss_us": f"{miss / misses * 1e6:.1f}", "hit_us": f"{hit / misses * 1e6:.1f}",
                "info_ms": ms(info_default), "info_bytes": info_size,
                "info_rules_ms": ms(info_rules), "info_rules_bytes": info_rules_size}
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


COLUMNS = [("rules", "rules"), ("load_ms", "RELOAD of N rules, ms"),
           ("load_cpu_ms", "its server CPU, ms"),
           ("set_p50", "SET p50 ms"), ("set_p99", "SET p99 ms"),
           ("del_p50", "DEL p50 ms"), ("del_p99", "DEL p99 ms"),
           ("catch_all_ms", "SET of GET /a* (overlaps all), ms"),
           ("miss_us", "CL.LIMIT miss, µs/call"), ("hit_us", "CL.LIMIT cached, µs/call"),
           ("info_ms", "INFO ms"), ("info_bytes", "INFO bytes"),
           ("info_rules_ms", "INFO rules ms"), ("info_rules_bytes", "INFO rules bytes")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: --sizes 10,100 --changes 5 --misses 100 "
                             "(unless given)")
    parser.add_argument("--sizes", help="default 100,1000,10000")
    parser.add_argument("--changes", type=int,
                        help="CL.RULE SET (and DEL) calls per size (default 50)")
    parser.add_argument("--misses", type=int,
                        help="CL.LIMIT calls on new resources per size (default 2,000)")
    args = parser.parse_args()
    args.sizes = args.sizes or ("10,100" if args.quick else "100,1000,10000")
    args.changes = args.changes or (5 if args.quick else 50)
    args.misses = args.misses or (100 if args.quick else 2000)
    rows = [measure(int(n), args.changes, args.misses) for n in args.sizes.split(",")]
    print("| " + " | ".join(title for _, title in COLUMNS) + " |")
    print("|" + "---:|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row[key]) for key, _ in COLUMNS) + " |")


if __name__ == "__main__":
    main()
