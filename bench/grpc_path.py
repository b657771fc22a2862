#!/usr/bin/env python3
"""The gRPC front's call path alone, for counting instructions: N
ShouldRateLimit calls (32 per read, as ``h2load -m 32`` sends them)
through one GrpcConnection with a stand-in transport, on a server built in
this process with bench/grpc_front.py's YAML and its ``ok`` request:

    decide   the answer of the rls service (the decision in C, _rls.pyx), as
             served
    canned   the same calls for a domain no configuration has: the transport
             (HTTP/2, the messages in C) and the decision's least work (the
             domain's lookup, statuses without limits)
    big      decide, with BIG_ENTRIES more descriptors in the domain's tree:
             half exact values beside the calls' own, half wildcards in a
             subtree of their own (the calls' entries are found by their
             hash, whatever the tree's size)

    valgrind --tool=callgrind --callgrind-out-file=cg.out \
        .venv/bin/python bench/grpc_path.py decide 20000
    callgrind_annotate --inclusive=yes cg.out | grep data_received

GrpcConnection.data_received's inclusive count divided by N is the cost of
one call from the socket buffer to the reply buffer (no system calls); the
two modes' difference is the decision's.  ``--quick`` anywhere: N is
320 unless given, a smoke run.  The requests' headers are HPACK
encoded once (python-hyper's h2) and then repeated from its dynamic table,
as a long-lived Envoy or h2load connection sends them.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import h2.config
import h2.connection
import h2.settings

from fastlimit._grpc import GrpcConnection
from fastlimit.server import config as cfg
from fastlimit.server.app import Server

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "support"))
from check_path import Transport  # noqa: E402
from rls_messages import RLS_PATH, grpc_frame  # noqa: E402
from rls_workload import RLS_YAML, VARIANTS, big_tree  # noqa: E402

PER_READ = 32
HEADERS = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", RLS_PATH.encode()),
           (b":authority", b"127.0.0.1"), (b"content-type", b"application/grpc"),
           (b"te", b"trailers")]


def with_stream_id(frames: bytes, stream_id: int) -> bytes:
    """The same frames, each on stream_id (its 9-byte frame header's last 4)."""
    out = bytearray(frames)
    i = 0
    while i < len(out):
        length = int.from_bytes(out[i:i + 3], "big")
        out[i + 5:i + 9] = stream_id.to_bytes(4, "big")
        i += 9 + length
    return bytes(out)


def client_reads(message: bytes, n: int) -> tuple[bytes, list[bytes]]:
    """The connection's preface (with windows no reply fills) and n calls,
    PER_READ per read."""
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                             header_encoding=None))
    c.initiate_connection()
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    c.increment_flow_control_window(2**31 - 1 - 65535)
    preface = c.data_to_send()
    calls = []
    for _ in range(2):        # the second finds every header in the dynamic table
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, HEADERS)
        c.send_data(sid, grpc_frame(message), end_stream=True)
        calls.append(c.data_to_send())
    calls += [with_stream_id(calls[1], 1 + 2 * i) for i in range(2, n)]
    return preface, [b"".join(calls[i:i + PER_READ]) for i in range(0, n, PER_READ)]


async def feed(shared, preface: bytes, reads: list[bytes]) -> None:
    # in the loop, as the listener does (server/grpc/listener.py): the
    # connection's timers (the greeting's, the deadlines') are the loop's
    shared.loop = asyncio.get_running_loop()
    conn = GrpcConnection(shared)
    conn.connection_made(Transport())
    conn.data_received(preface)
    for data in reads:
        conn.data_received(data)
        await asyncio.sleep(0)     # a loop turn, as between reads


def main() -> None:
    # --quick: a smoke run (the test suite's), 320 calls unless N is given
    argv = [a for a in sys.argv if a != "--quick"]
    mode = argv[1] if len(argv) > 1 else "decide"
    n = int(argv[2]) if len(argv) > 2 else 320 if "--quick" in sys.argv else 20000
    variant = VARIANTS["ok"]
    with tempfile.TemporaryDirectory(prefix="fastlimit-grpc-path-") as tmp:
        if mode != "canned":
            (Path(tmp) / "bench.yaml").write_text(RLS_YAML + (big_tree() if mode == "big" else ""))
        server = Server(cfg.Settings(manual_clock=True, rules_db=None, snapshot_file=None,
                                     rls_config=tmp, grpc_deadline_ms=0).validate())
    server.grpc.apply_settings(server.settings)
    preface, reads = client_reads(variant.message, n)
    asyncio.run(feed(server.grpc.shared, preface, reads))
    stats = server.grpc.shared.endpoint_stats["should_rate_limit"]
    print(f"{stats.calls} ShouldRateLimit calls ({mode}), {stats.failed_calls} failed",
          file=sys.stderr)


if __name__ == "__main__":
    main()
