#!/usr/bin/env python3
"""The check path of each front alone, for counting instructions: N
requests, one per read (as a client waiting for each answer sends them),
through one connection with a stand-in transport, on a server built in
this process with one token-bucket rule:

    http   POST /v1/check through _http.HttpConnection
    resp   CL.LIMIT through _protocol.Connection

    valgrind --tool=callgrind --callgrind-out-file=cg.out \
        .venv/bin/python bench/http_path.py http 20000
    callgrind_annotate --inclusive=yes cg.out | grep data_received

Connection.data_received's inclusive count divided by N is the cost of one
request from the socket buffer to the reply buffer (no system calls).
``--quick`` anywhere: N is 320 unless given, a smoke run.
"""

from __future__ import annotations

import asyncio
import json
import sys

from fastlimit._http import HttpConnection
from fastlimit._protocol import Connection
from fastlimit.server import config as cfg
from fastlimit.server.app import Server

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from check_path import Transport  # noqa: E402

RULE = {"match": {"resource": "api"}, "algorithm": "token_bucket",
        "capacity": 10**9, "refill_per_second": 10**9}


def http_request(i: int) -> bytes:
    body = b'{"client_key": "user:%d", "resource": "api", "cost": 1}' % (i % 1000)
    return (b"POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1:8380\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def resp_request(i: int) -> bytes:
    key = b"user:%d" % (i % 1000)
    return b"*3\r\n$8\r\nCL.LIMIT\r\n$%d\r\n%s\r\n$3\r\napi\r\n" % (len(key), key)


async def feed(conn, reads: list[bytes]) -> None:
    for i, data in enumerate(reads):
        conn.data_received(data)
        if i % 16 == 15:
            await asyncio.sleep(0)     # a loop turn, as between reads


def main() -> None:
    # --quick: a smoke run (the test suite's), 320 requests unless N is given
    argv = [a for a in sys.argv if a != "--quick"]
    front = argv[1] if len(argv) > 1 else "http"
    n = int(argv[2]) if len(argv) > 2 else 320 if "--quick" in sys.argv else 20000
    server = Server(cfg.Settings(manual_clock=True, rules_db=None, snapshot_file=None,
                                 http_port=0).validate())
    server.rules.set("api", json.dumps(RULE))
    if front == "http":
        conn = HttpConnection(server.http.shared)
        make = http_request
    else:
        conn = Connection(server.core)
        make = resp_request
    conn.connection_made(Transport())
    asyncio.run(feed(conn, [make(i) for i in range(n)]))
    print(f"{n} {front} checks", file=sys.stderr)


if __name__ == "__main__":
    main()
