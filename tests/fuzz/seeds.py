"""Writes the seed corpora of tests/fuzz/corpus/<target>/: real protocol
examples (the commands, requests and documents the README and the tests
use; a replication stream and snapshots written by fastlimit's own
writers), a few dozen small files per target.  Run it from the worktree
with the in-place build and the test dependencies (h2 makes the gRPC
seeds):

    PYTHONPATH=src python tests/fuzz/seeds.py

The files are named by the hash of their bytes, as libFuzzer names what
it adds, so a rerun rewrites the same files and keeps the others (crash
inputs added by hand or by scripts/fuzz.sh)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))   # the gRPC message helpers, rls_tables

EVEN = b"\x00"      # a first byte that asks a target for its default framing


def resp(*args: bytes | str) -> bytes:
    parts = [a.encode() if isinstance(a, str) else a for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def write(target: str, seeds: list[bytes]) -> None:
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    for seed in seeds:
        with open(os.path.join(folder, hashlib.sha1(seed).hexdigest()), "wb") as f:
            f.write(seed)
    print(f"{target}: {len(seeds)} seeds")


RULE_DOCS = [
    {"match": {"resource": "POST /orders", "tier": "free"}, "capacity": 20,
     "refill_per_second": 10},
    {"match": {"resource": "api", "client": "ip:10.*"}, "algorithm": "token_bucket",
     "capacity": 1000, "refill": 1000, "period_ms": 3600000, "mode": "shadow"},
    {"match": {"resource": "GET /search"}, "algorithm": "fixed_window", "limit": 100,
     "window_ms": 60000, "on_failure": "closed"},
    {"match": {"resource": "login"}, "algorithm": "sliding_window", "limit": 5,
     "window_ms": 900000, "key": "client+resource"},
    {"match": {"tier": "pro"}, "algorithm": "gcra", "burst": 10, "count": 50, "period_ms": 1000},
    {"match": {"resource": "export"}, "algorithm": "concurrency", "limit": 3,
     "lease_ms": 30000},
]


def command_stream() -> list[bytes]:
    """What clients send: the README's commands and Redis's own."""
    rule = json.dumps(RULE_DOCS[0])
    conc = json.dumps(RULE_DOCS[5])
    return [
        resp("PING"), resp("PING", "hello"), b"PING\r\n", b"ECHO \"a\\x41\\n\" 'b c'\r\n",
        resp("CL.CHECK", "user:1", "10", "5") * 3,
        resp("CL.CHECK", "user:1", "10", "5", "COST", "3", "PERIOD", "60000"),
        resp("CL.THROTTLE", "user123", "15", "30", "60", "1"),
        resp("CL.FIXED", "LIMITS:a", "60000", "2") + resp("CL.FIXED", "LIMITS:a", "60000", "0")
        + resp("CL.MOVING", "LIMITS:m", "5", "1000", "2") + resp("CL.SLIDING", "LIMITS:s", "5",
                                                                 "1000", "3")
        + resp("CL.WINCLEAR", "LIMITS:a", "LIMITS:m") + resp("CL.WINFLUSH", "LIMITS:"),
        resp("CL.RULE", "SET", "orders", rule) + resp("CL.LIMIT", "user:7", "POST /orders",
                                                       "TIER", "free", "COST", "2", "DETAIL"),
        resp("CL.RULE", "SET", "export", conc) + resp("CL.ACQUIRE", "export", "user:7")
        + resp("CL.RELEASE", "export", "user:7", "1"),
        resp("CL.RULE", "SET", "orders", rule) + resp("CL.APPLY", "orders", "user:7",
                                                       "RESOURCE", "POST /orders", "DETAIL")
        + resp("CL.RULE", "GET", "orders") + resp("CL.RULE", "LIST") + resp("CL.RULE", "DEL",
                                                                             "orders"),
        resp("MULTI") + resp("CL.CHECK", "k", "2", "1") + resp("CL.RESET", "k") + resp("EXEC"),
        resp("MULTI") + resp("PING") + resp("DISCARD"),
        resp("HELLO", "3") + resp("CL.CHECK", "k", "2", "1") + resp("INFO", "memory"),
        resp("HELLO", "3", "SETNAME", "app") + resp("CLIENT", "INFO"),
        resp("CLIENT", "SETNAME", "worker-1") + resp("CLIENT", "LIST") + resp("CLIENT", "ID"),
        resp("SUBSCRIBE", "news") + resp("PING") + resp("UNSUBSCRIBE"),
        resp("PUBLISH", "news", "hello") + resp("PUBSUB", "CHANNELS"),
        resp("COMMAND", "DOCS", "CL.CHECK") + resp("COMMAND", "COUNT"),
        resp("CONFIG", "GET", "maxclients") + resp("INFO") + resp("DBSIZE") + resp("TIME"),
        resp("DEBUG", "CLOCK", "ADVANCE", "1000") + resp("DEBUG", "SWEEP"),
        resp("AUTH", "secret") + resp("SELECT", "0") + resp("ROLE") + resp("LASTSAVE"),
        resp("CLUSTER", "INFO") + resp("READONLY") + resp("READWRITE"),
        resp("CL.RLS", "LIST") + resp("FLUSHALL") + resp("RESET"),
        b"*3\r\n$8\r\nCL.CHECK\r\n$1\r\nk\r\n$2\r\n", b"*1\r\n$4\r\nPI",
        b"*-1\r\n*0\r\n" + resp("PING"), b"*2\r\n$4\r\nECHO\r\n$-5\r\n",
        b"*1\r\n+PING\r\n", b"\"unbalanced\r\n", resp("QUIT") + resp("PING"),
    ]


def resp_seeds() -> list[bytes]:
    return [EVEN + s for s in command_stream()] + [b"\x01" + resp("CL.CHECK", "a" * 40, "9", "9")]


def http_request(method: str, path: str, body: bytes = b"", headers: str = "") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method in ("POST", "PUT") else ""
    return (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{headers}{length}\r\n".encode()
            + body)


def http_seeds() -> list[bytes]:
    check = json.dumps({"client_key": "user:7", "resource": "POST /orders", "tier": "free",
                        "cost": 1}).encode()
    bucket = b'{"key": "ip:10.1.2.3", "capacity": 10, "refill_per_sec": 5}'
    batch = (b'{"checks": [{"client_key": "user:7", "resource": "api"}, '
             b'{"rule_id": "nope", "key": "k"}]}')
    limits = b'{"rule_id": ["orders"], "key": "user:7", "resource": "POST /orders", "cost": 2}'
    rls = json.dumps({"domain": "fuzz", "descriptors": [
        {"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]}).encode()
    chunked = (b"POST /v1/check/bucket HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n0\r\n\r\n" % (len(bucket), bucket))
    reqs = [
        http_request("GET", "/livez"), http_request("GET", "/readyz"),
        http_request("GET", "/healthz") + http_request("GET", "/healthcheck"),
        http_request("GET", "/v1/info"), http_request("GET", "/metrics"),
        http_request("GET", "/"), http_request("GET", "/v1/stats"),
        http_request("POST", "/v1/check", check),
        http_request("POST", "/v1/check?enforce=1", check),
        http_request("POST", "/v1/check/bucket", bucket) * 2,
        http_request("POST", "/v1/check/batch", batch),
        http_request("POST", "/v1/limits/check", limits),
        http_request("PUT", "/rules/orders", json.dumps(RULE_DOCS[0]).encode())
        + http_request("GET", "/rules/orders") + http_request("GET", "/rules")
        + http_request("DELETE", "/rules/orders", headers="If-Match: \"x\"\r\n"),
        http_request("POST", "/json", rls), http_request("GET", "/json"),
        http_request("GET", "/v1/check", headers="Authorization: Basic ZGVmYXVsdDpwdw==\r\n"),
        chunked, http_request("POST", "/v1/check", b"{not json"),
        http_request("POST", "/v1/check/bucket", b'{"key": 1, "capacity": -1}'),
        b"GET /livez HTTP/1.0\r\n\r\n", b"GET /livez HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 200 + b"\r\n\r\n",
        b"BREW /pot HTTP/1.1\r\n\r\n", b"GET /livez HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
    ]
    return [EVEN + r for r in reqs]


def grpc_seeds() -> list[bytes]:
    import h2.config
    import h2.connection
    import rls_messages as m

    def stream(path: str, messages: list[bytes], extra=()) -> bytes:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None))
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                (b":path", path.encode()), (b":authority", b"rls"),
                                (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                                *extra])
        body = b"".join(b"\x00" + struct.pack(">I", len(msg)) + msg for msg in messages)
        conn.send_data(sid, body, end_stream=True)
        conn.ping(b"12345678")
        return conn.data_to_send()

    ip = m.descriptor([(b"remote_address", b"10.0.0.1")])
    nested = m.descriptor([(b"path", b"/api"), (b"user", b"u7")], hits_addend=3)
    override = m.descriptor([(b"path", b"/api")], limit=(7, m.MINUTE))
    rls = [m.request(b"fuzz", ip), m.request(b"fuzz", ip, nested, hits_addend=2),
           m.request(b"fuzz", override), m.request(b"other", ip), m.request(b""),
           m.request(b"fuzz", *[ip] * 5)]
    preface = len(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    seeds = [EVEN + stream(m.RLS_PATH, [r])[preface:] for r in rls]
    seeds += [EVEN + stream(m.RLS_PATH, rls[:3])[preface:],
              EVEN + stream(m.RLS_PATH, [rls[0]], [(b"grpc-timeout", b"100m")])[preface:],
              EVEN + stream(m.HEALTH_PATH, [b""])[preface:],
              EVEN + stream(m.HEALTH_PATH, [m.length_delimited(
                  1, b"envoy.service.ratelimit.v3.RateLimitService")])[preface:],
              EVEN + stream("/no.such.Service/Method", [b""])[preface:],
              b"\x01" + stream(m.RLS_PATH, [rls[1]]), b"\x01GET / HTTP/1.1\r\n\r\n"]
    return seeds


def _server():
    from fastlimit.server import config as cfg
    from fastlimit.server.app import Server

    return Server(cfg.Settings(manual_clock=True, rules_db=None, snapshot_file=None,
                               http_port=0, grpc_port=0).validate())


def _run(srv, *commands: bytes) -> None:
    from fastlimit._protocol import Connection

    class Sink:
        def get_extra_info(self, name, default=None):
            return ("127.0.0.1", 1)

        def write(self, data):
            pass

        def pause_reading(self):
            pass

        def resume_reading(self):
            pass

        def get_write_buffer_size(self):
            return 0

        def close(self):
            pass

    conn = Connection(srv.core)
    conn.connection_made(Sink())
    conn.data_received(b"".join(commands))
    conn.connection_lost(None)


def _filled_server():
    srv = _server()
    for n, doc in enumerate(RULE_DOCS):
        srv.rules.set(f"r{n}", json.dumps(doc))
    return srv


def _snapshot_bytes(srv) -> bytes:
    from fastlimit.server import snapshot

    with tempfile.TemporaryFile() as f:
        snapshot.write_to(f.fileno(), srv.store, srv.rule_engine,
                          snapshot.rule_numbers(srv.rules), srv.clock.now(), srv.windows.store)
        f.seek(0)
        return f.read()


def _traffic() -> list[bytes]:
    return [resp("CL.CHECK", f"user:{i}", "10", "5") for i in range(3)] + [
        resp("CL.LIMIT", "user:7", "POST /orders", "TIER", "free"),
        resp("CL.APPLY", "r2", "user:7", "RESOURCE", "GET /search"),
        resp("CL.APPLY", "r3", "user:7", "RESOURCE", "login"),
        resp("CL.APPLY", "r4", "user:7"), resp("CL.ACQUIRE", "r5", "user:7"),
        resp("CL.THROTTLE", "t", "15", "30", "60")]


def _window_traffic() -> list[bytes]:
    """The limits storage's windowed counters: a counter, a sliding window,
    and moving-window logs of one run and of several (a larger size class)."""
    advance = resp("DEBUG", "CLOCK", "ADVANCE", "7")
    return [resp("CL.FIXED", "LIMITS:f", "60000", "3"),
            resp("CL.SLIDING", "LIMITS:s", "10", "60000", "2"),
            resp("CL.MOVING", "LIMITS:m1", "10", "60000", "2"),
            b"".join(advance + resp("CL.MOVING", "LIMITS:m5", "10", "60000") for _ in range(5))]


def snapshot_seeds() -> list[bytes]:
    from fastlimit.server import snapshot

    trailer = 4 + len(snapshot.FOOTER)
    srv = _filled_server()
    seeds = []
    for traffic in (_traffic()[:1], _traffic()[:4], _traffic() + _window_traffic()):
        _run(srv, *traffic)
        whole = _snapshot_bytes(srv)
        seeds += [EVEN + whole[len(snapshot.MAGIC):-trailer], b"\x01" + whole]
    seeds.append(EVEN + _snapshot_bytes(_server())[len(snapshot.MAGIC):-trailer])
    return seeds


def replstream_seeds() -> list[bytes]:
    from fastlimit.replication import stream as rs

    srv = _filled_server()
    for store in srv.stores:
        store.track_changes(1 << 20)
    registry = srv.rules
    rules = rs.frame(rs.RULES, rs.rules_payload(
        [(registry.num_for(rule_id), rule_id, doc, source, updated)
         for rule_id, doc, source, updated in registry.export()]))
    _run(srv, *_traffic()[:2])
    full = rs.frame(rs.SNAPSHOT, rs.snapshot_payload(0, _snapshot_bytes(srv)))
    for store in srv.stores:
        store.drain_changes()
    batches = []
    for traffic in (_traffic()[2:5], _traffic()[5:] + _window_traffic()):
        _run(srv, *traffic)
        sections = [part for store in srv.stores for part in store.drain_changes()]
        batches.append(rs.frame(rs.BATCH, rs.batch_head(1_700_000_000_000,
                                                        srv.rule_engine.lease_generations()),
                                *sections))
    heartbeat = rs.frame(rs.BATCH, rs.batch_head(1_700_000_000_000, {}))
    flush = rs.frame(rs.FLUSH)
    streams = [rules, rules + full, rules + full + batches[0], rules + full + b"".join(batches),
               rules + full + heartbeat + flush + batches[1], full, batches[0], batches[1],
               rules + heartbeat * 3, rs.frame(rs.RULES, b"[]") + flush]
    seeds = [EVEN + s for s in streams]
    seeds += [b"\x01+FULLSYNC abc 0\r\n" + rules + batches[0], b"\x01-ERR no\r\n",
              b"\x01+FULLSYNC\r\n" + heartbeat]
    return seeds


def rules_seeds() -> list[bytes]:
    docs = [json.dumps(d).encode() for d in RULE_DOCS]
    as_json = json.dumps({"rules": {f"r{n}": d for n, d in enumerate(RULE_DOCS)}}).encode()
    as_toml = b"""\
[rules.orders]
match = { resource = "POST /orders", tier = "free" }
capacity = 20
refill_per_second = 10

[rules."reports/hourly"]
algorithm = "token_bucket"
capacity = 1000
refill = 1000
period_ms = 3600000

[rules.search]
match = { resource = "GET /search", client = "ip:10.*" }
algorithm = "sliding_window"
limit = 100
window_ms = 60000
mode = "shadow"
"""
    seeds = [b"\x00" + d for d in docs]
    seeds += [b"\x01" + as_json, b"\x01{\"rules\": {}}", b"\x02" + as_toml, b"\x02[rules]\n",
              b"\x03" + as_json, b"\x03" + as_toml, b"\x00{\"capacity\": 1e400}",
              b"\x00" + b"[" * 50 + b"]" * 50, b"\x02[rules.a]\ncapacity = 1979-05-27\n"]
    return seeds


def cluster_map_seeds() -> list[bytes]:
    two_static = b"""\
version = 1
[[shard]]
name = "a"
slots = ["0-8191"]
primary = "127.0.0.1:7000"
standbys = ["127.0.0.1:7001"]
[[shard]]
name = "b"
slots = ["8192-16383"]
primary = "127.0.0.1:7002"
"""
    sentinel = b"""\
version = 7
sentinels = ["127.0.0.1:26379", "[::1]:26380"]
[[shard]]
name = "a"
slots = ["0-5460"]
sentinel = "fl-a"
[[shard]]
name = "b"
slots = ["5461-10922"]
sentinel = "fl-b"
[[shard]]
name = "c"
slots = ["10923-16383"]
primary = "10.0.0.3:6380"
standbys = ["10.0.0.4:6380", "10.0.0.5:6380"]
[nodes]
"10.0.0.3:6380" = "0123456789abcdef0123456789abcdef01234567"
"""
    one = b'version = 0\n[[shard]]\nname = "all"\nslots = ["0-16383"]\nprimary = "127.0.0.1:6380"\n'
    split = (b'version = 2\n[[shard]]\nname = "a"\nslots = ["0-99", "200-16383"]\n'
             b'primary = "127.0.0.1:7000"\n[[shard]]\nname = "b"\nslots = ["100-199"]\n'
             b'primary = "127.0.0.1:7002"\n')
    return [two_static, sentinel, one, split, two_static.replace(b"8192", b"8190"),
            b"version = 1\n", b"", b"version = -1\n", sentinel.replace(b"[nodes]", b"[x]")]


def rls_config_seeds() -> list[bytes]:
    import rls_tables

    texts = [getattr(rls_tables, name) for name in dir(rls_tables)
             if name.isupper() and isinstance(getattr(rls_tables, name), str)
             and "domain:" in getattr(rls_tables, name)][:20]
    seeds = [EVEN + t.encode() for t in texts]
    if len(texts) >= 2:
        seeds.append(b"\x01" + "\n---8<---\n".join(texts[:2]).encode())
    seeds += [b"\x00domain: d\ndescriptors:\n  - key: a\n    rate_limit: "
              b"{unit: second, requests_per_unit: 1, unit_multiplier: 10}\n",
              b"\x00domain: d\ndescriptors:\n  - key: k\n    value: v*\n    shadow_mode: true\n"
              b"    rate_limit: {unit: hour, requests_per_unit: 3, name: n}\n",
              b"\x00a: &x [1]\nb: *x\n", b"\x00domain: [\n",
              EVEN + rls_tables.alias_bomb(10, 3).encode(),        # accepted, expanded
              EVEN + rls_tables.alias_bomb(10, 6).encode(),        # excessive aliasing
              b"\x00domain: d\ndescriptors: &x\n  - key: a\n    descriptors: *x\n"]
    return seeds


def acl_seeds() -> list[bytes]:
    """Rules as ACL SETUSER and aclfile lines take them (the README's and
    Redis's examples), and some that must be refused."""
    return [b"on >secret ~tenant-a:* +@ratelimit", b"reset on nopass allkeys allcommands",
            b"on #" + b"a" * 64 + b" ~* &* -@all +cl.check +config|get -@dangerous",
            b"off resetpass <secret !" + b"b" * 64, b"on >p %R~x (+get ~y) +select|0",
            b"on >p &chan:* resetchannels allchannels +@pubsub -publish +client|list",
            b"on >a >b <a ~a ~b* resetkeys ~c? +@admin -@all +@read +@write",
            b"skip-sanitize-payload sanitize-payload ~* ~x +nosuchcommand +@nosuchcat"]


TARGETS = {"resp": resp_seeds, "acl": acl_seeds,
           "protocol": lambda: [EVEN + s for s in command_stream()],
           "http": http_seeds, "grpc": grpc_seeds, "replstream": replstream_seeds,
           "snapshot": snapshot_seeds, "rules": rules_seeds,
           "cluster_map": cluster_map_seeds, "rls_config": rls_config_seeds}


def main() -> None:
    import logging

    logging.disable(logging.CRITICAL)
    for target in sys.argv[1:] or TARGETS:
        write(target, TARGETS[target]())


if __name__ == "__main__":
    main()
