"""The HTTP front's listener and check endpoints (fastlimit._http,
server/http/listener.py): the same decisions as CL.LIMIT, CL.APPLY and
CL.CHECK for the same keys at the same manual times, the RateLimit
headers, bounds against bad clients, keep-alive and pipelining, auth."""

from __future__ import annotations

import base64
import json
import re
import socket
import time

import pytest
from http_calls import TOKEN_BUCKET, post_bytes, raw, set_rule
from wire import wait_until


def five(d: dict) -> list[int]:
    return [int(d["allowed"]), d["limit"], d["remaining"], d["retry_after_ms"],
            d["reset_after_ms"]]


# ---- the same decisions as over RESP ------------------------------------------------------

def test_check_answers_as_cl_limit_at_the_same_manual_times(hs):
    r = hs.client()
    set_rule(r, "api", TOKEN_BUCKET)
    for step in range(8):
        _, _, http_doc = hs.post("/v1/check", {"client_key": "h", "resource": "api"})
        resp = r.execute_command("CL.LIMIT", "h-resp", "api")
        assert five(http_doc) == resp, step
        assert http_doc["rule"] == "api"
        if step % 3 == 2:
            r.execute_command("DEBUG", "CLOCK", "ADVANCE", "700")


def test_http_and_resp_spend_one_bucket(hs):
    r = hs.client()
    set_rule(r, "api", TOKEN_BUCKET)
    hs.post("/v1/check", {"client_key": "u", "resource": "api", "cost": 2})
    assert r.execute_command("CL.LIMIT", "u", "api") == [1, 3, 0, 0, 3000]
    _, _, doc = hs.post("/v1/check", {"client_key": "u", "resource": "api"})
    assert doc == {"allowed": False, "limit": 3, "remaining": 0, "retry_after_ms": 1000,
                   "reset_after_ms": 3000, "rule": "api"}


def test_tier_selects_the_rules_as_cl_limit_tier(hs):
    r = hs.client()
    set_rule(r, "free", {"match": {"resource": "api", "tier": "free"},
                         "algorithm": "fixed_window", "limit": 1, "window_ms": 60000})
    set_rule(r, "paid", {"match": {"resource": "api", "tier": "paid"},
                         "algorithm": "fixed_window", "limit": 100, "window_ms": 60000})
    for tier in ("free", "paid"):
        _, _, doc = hs.post("/v1/check", {"client_key": "t", "resource": "api", "tier": tier})
        assert doc["rule"] == tier
        assert five(doc) == r.execute_command("CL.LIMIT", "t2", "api", "TIER", tier)


def test_no_matching_rule_is_allowed_and_names_none(hs):
    status, headers, doc = hs.post("/v1/check", {"client_key": "x", "resource": "none"})
    assert status == 200
    assert doc == {"allowed": True, "limit": -1, "remaining": -1, "retry_after_ms": 0,
                   "reset_after_ms": 0, "rule": None}
    assert "ratelimit" not in headers


def test_limits_check_answers_as_cl_apply(hs):
    r = hs.client()
    set_rule(r, "a", {"match": {"resource": "*"}, "algorithm": "gcra", "burst": 2, "count": 1,
                      "period_ms": 1000})
    set_rule(r, "b", {"match": {"resource": "*"}, "algorithm": "fixed_window", "limit": 2,
                      "window_ms": 10000})
    for step in range(4):
        _, _, doc = hs.post("/v1/limits/check", {"rule_id": ["a", "b"], "key": "k"})
        assert five(doc) == r.execute_command("CL.APPLY", "a,b", "k2"), step
    _, _, doc = hs.post("/v1/limits/check", {"rule_id": "a", "key": "k3", "cost": 0})
    assert five(doc) == r.execute_command("CL.APPLY", "a", "k4", "COST", "0")


def test_check_bucket_answers_as_cl_check(hs):
    r = hs.client()
    for step in range(5):
        _, _, doc = hs.post("/v1/check/bucket", {"key": "b", "capacity": 3,
                                                 "refill_per_sec": 2, "period_ms": 2000})
        assert five(doc) == r.execute_command("CL.CHECK", "b2", 3, 2, "PERIOD", 2000), step
        assert doc["rule"] is None


# ---- denials, enforcement and the RateLimit headers --------------------------------------

def test_a_denial_is_data_and_enforce_makes_it_a_429(hs):
    r = hs.client()
    set_rule(r, "api", TOKEN_BUCKET)
    for _ in range(3):
        status, headers, _ = hs.post("/v1/check", {"client_key": "d", "resource": "api"})
        assert status == 200
    status, headers, doc = hs.post("/v1/check", {"client_key": "d", "resource": "api"})
    assert (status, doc["allowed"]) == (200, False)
    assert "retry-after" not in headers
    assert headers["ratelimit-policy"] == '"api";q=3;w=3'
    assert headers["ratelimit"] == '"api";r=0;t=1'
    status, headers, doc = hs.post("/v1/check?enforce=1", {"client_key": "d", "resource": "api"})
    assert (status, doc["allowed"]) == (429, False)
    assert headers["retry-after"] == "1"
    assert headers["ratelimit"] == '"api";r=0;t=1'


def test_ratelimit_headers_describe_each_algorithm(hs):
    r = hs.client()
    set_rule(r, "fw", {"match": {"resource": "fw"}, "algorithm": "fixed_window", "limit": 10,
                       "window_ms": 60000})
    set_rule(r, "g", {"match": {"resource": "g"}, "algorithm": "gcra", "burst": 4, "count": 5,
                      "period_ms": 10000})
    set_rule(r, "fast", {"match": {"resource": "fast"}, "algorithm": "fixed_window",
                         "limit": 10, "window_ms": 100})
    _, h, _ = hs.post("/v1/check", {"client_key": "c", "resource": "fw"})
    assert (h["ratelimit-policy"], h["ratelimit"]) == ('"fw";q=10;w=60', '"fw";r=9;t=60')
    _, h, _ = hs.post("/v1/check", {"client_key": "c", "resource": "g"})
    assert (h["ratelimit-policy"], h["ratelimit"]) == ('"g";q=5;w=10', '"g";r=4;t=2')
    # a window under a second cannot be advertised (w is whole seconds)
    _, h, _ = hs.post("/v1/check", {"client_key": "c", "resource": "fast"})
    assert (h["ratelimit-policy"], h["ratelimit"]) == ('"fast";q=10', '"fast";r=9;t=1')


def test_a_changed_rule_changes_the_headers(hs):
    r = hs.client()
    set_rule(r, "api", TOKEN_BUCKET)
    hs.post("/v1/check", {"client_key": "c", "resource": "api"})
    set_rule(r, "api", {**TOKEN_BUCKET, "capacity": 7})
    _, h, _ = hs.post("/v1/check", {"client_key": "c2", "resource": "api"})
    assert h["ratelimit-policy"] == '"api";q=7;w=7'


# ---- batches ----------------------------------------------------------------------------------

def test_batch_answers_each_check_in_order(hs):
    r = hs.client()
    set_rule(r, "api", TOKEN_BUCKET)
    status, _, doc = hs.post("/v1/check/batch", {"checks": [
        {"client_key": "b1", "resource": "api", "cost": 3},
        {"client_key": "b1", "resource": "api"},
        {"rule_id": "api", "key": "b2"},
        {"rule_id": "missing", "key": "b2"},
        {"client_key": 7, "resource": "api"},
        "not an object"]})
    assert status == 200
    results = doc["results"]
    assert five(results[0]) == [1, 3, 0, 0, 3000]
    assert five(results[1]) == [0, 3, 0, 1000, 3000]
    assert results[2]["rule"] == "api"
    assert results[3] == {"error": {"status": 404, "detail": "no such rule 'missing'",
                                    "field": "rule_id"}}
    assert results[4] == {"error": {"status": 400, "detail": "client_key must be a string",
                                    "field": "client_key"}}
    assert results[5] == {"error": {"status": 400, "detail": "a check must be a JSON object"}}


def test_batch_is_capped(make_http_server):
    hs = make_http_server("--manual-clock", "--http-batch-max", "3")
    status, _, doc = hs.post("/v1/check/batch", {"checks": [
        {"client_key": "x", "resource": "r"}] * 4})
    assert status == 413
    assert doc["field"] == "checks" and doc["detail"] == "at most 3 checks in one batch"


# ---- bad requests ---------------------------------------------------------------------------

@pytest.mark.parametrize("body,field,detail", [
    (b'{"client_key": "a"', None, "the body is not JSON"),
    (b'[1, 2]', None, "the body must be a JSON object"),
    (b'{"resource": "r"}', "client_key", "client_key is required"),
    (b'{"client_key": 5, "resource": "r"}', "client_key", "client_key must be a string"),
    (b'{"client_key": "a", "resource": "r", "tier": []}', "tier", "tier must be a string"),
    (b'{"client_key": "a", "resource": "r", "cost": true}', "cost",
     "cost must be an integer from 0 to 1000000000000000"),
    (b'{"client_key": "a", "resource": "r", "cost": -1}', "cost",
     "cost must be an integer from 0 to 1000000000000000"),
    (b'{"client_key": "a", "resource": "r", "cost": 1e3}', "cost",
     "cost must be an integer from 0 to 1000000000000000"),
    (b'{"client_key": "a", "resource": "r", "cost": 99999999999999999999999}', "cost",
     "cost must be an integer from 0 to 1000000000000000"),
    (b'\xff\xfe', None, "the body is not JSON"),
])
def test_bad_check_documents_get_a_problem_naming_the_field(hs, body, field, detail):
    status, headers, raw_body = hs.request("POST", "/v1/check", body)
    assert status == 400
    assert headers["content-type"] == "application/problem+json"
    doc = json.loads(raw_body)
    assert doc["status"] == 400 and doc["code"] == "ERR"
    assert doc.get("field") == field
    assert doc["detail"].startswith(detail)


def test_a_key_too_long_is_the_engines_error(hs):
    status, _, doc = hs.post("/v1/check/bucket", {"key": "k" * 70000, "capacity": 1,
                                                  "refill_per_sec": 1})
    assert status == 400
    assert doc["detail"] == "ERR key is longer than 65535 bytes"


def refused(port: int, request: bytes, timeout: float = 10.0) -> tuple[bytes, bytes]:
    """(head, body) of the one response to a request refused before it is
    all read, read on a fresh connection until the server closes it.  The
    server closes with the rest of the request unread, in its socket or
    still arriving (whether it is depends on how the kernels split the
    writes), and then its kernel closes with a reset instead of a FIN: the
    reset counts as the close here, as the response before it is whole
    (the body its Content-Length says) or the test fails.  The reset is the
    server's (no lingering close, RFC 9112 section 9.6), not this test's."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    with s:
        try:
            s.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass        # refused and reset while sending: the response is still to be read
        reply = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError(f"still open after {timeout} s: {reply[:300]!r}") from None
            if not chunk:
                break
            reply += chunk
    head, blank, body = reply.partition(b"\r\n\r\n")
    assert blank, f"no whole head before the close: {reply[:300]!r}"
    length = re.search(rb"\r\nContent-Length: (\d+)\r\n", head + b"\r\n")
    assert length and int(length.group(1)) == len(body), f"a cut response: {reply!r}"
    return head, body


def test_a_huge_body_gets_413_and_the_connection_closes(make_http_server):
    hs = make_http_server("--manual-clock", "--http-max-body-bytes", "4kb")
    head, _ = refused(hs.http_port, post_bytes("/v1/check", b"{" + b" " * 10000 + b"}"))
    assert head.startswith(b"HTTP/1.1 413 Content Too Large\r\n")
    assert b"Connection: close" in head
    # a declared length past the bound is refused without waiting for the body
    reply = raw(hs.http_port, b"POST /v1/check HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n{",
                timeout=3)
    assert reply.startswith(b"HTTP/1.1 413 Content Too Large\r\n")
    assert b"the body exceeds 4096 bytes" in reply


def test_ten_thousand_headers_get_431(hs):
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(10000))
    head, body = refused(hs.http_port, b"GET /livez HTTP/1.1\r\n" + headers + b"\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"\r\nConnection: close" in head
    assert json.loads(body)["detail"] == ("at most 100 headers and 16384 bytes of request "
                                          "line and headers")
    assert hs.request("GET", "/livez")[0] == 200


def test_pipelined_garbage_gets_400_after_the_good_requests(hs):
    good = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
    reply = raw(hs.http_port, good * 2 + b"\x00\x01garbage\r\n\r\n" + good)
    assert reply.count(b"HTTP/1.1 200 OK") == 2
    assert b"HTTP/1.1 400 Bad Request" in reply
    assert reply.rstrip().endswith(b"}")       # the problem document, then the close


def test_a_slow_client_gets_408_and_others_are_served(make_http_server):
    hs = make_http_server("--manual-clock", "--http-header-timeout", "0.3")
    slow = socket.create_connection(("127.0.0.1", hs.http_port), timeout=5)
    idle = socket.create_connection(("127.0.0.1", hs.http_port), timeout=5)
    slow.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")      # never finishes its headers
    assert hs.request("GET", "/livez")[0] == 200
    reply = slow.recv(65536)
    assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert idle.recv(10) == b""      # an idle connection is closed without a word
    slow.close()
    idle.close()


def test_a_client_that_never_reads_is_not_read_and_resp_clients_never_notice(hs):
    r = hs.client()
    set_rule(r, "api", TOKEN_BUCKET)
    hog = socket.create_connection(("127.0.0.1", hs.http_port), timeout=5)
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request = post_bytes("/v1/check", b'{"client_key":"hog","resource":"api"}')
    hog.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sent < 64 * 1024 * 1024:
        try:
            sent += hog.send(request * 100)
        except BlockingIOError:
            time.sleep(0.05)
            try:
                hog.send(request)
            except BlockingIOError:
                break        # the server stopped reading it: both ways are full
    rss = hs.rss_bytes()
    for _ in range(100):
        assert r.execute_command("CL.LIMIT", "good", "api")[1] == 3
    assert hs.request("GET", "/livez")[0] == 200
    assert sent < 64 * 1024 * 1024          # the server stopped taking its requests
    assert hs.rss_bytes() < rss + 16 * 1024 * 1024
    hog.close()


def test_an_unknown_path_and_a_wrong_method(hs):
    status, _, body = hs.request("GET", "/nope")
    assert status == 404 and json.loads(body)["detail"] == "no endpoint /nope"
    status, headers, _ = hs.request("DELETE", "/livez")
    assert status == 405 and headers["allow"] == "GET"


def test_upgrade_is_ignored_and_the_connection_closed_after_the_response(hs):
    reply = raw(hs.http_port, b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                              b"Upgrade: websocket\r\n\r\nwebsocket bytes")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\nok\n")


# ---- keep-alive and pipelining --------------------------------------------------------------

def test_pipelined_checks_are_answered_in_order_on_one_connection(hs):
    r = hs.client()
    set_rule(r, "api", {**TOKEN_BUCKET, "capacity": 50})
    one = post_bytes("/v1/check", b'{"client_key":"p","resource":"api"}')
    s = socket.create_connection(("127.0.0.1", hs.http_port), timeout=5)
    s.sendall(one * 60)
    data = b""
    deadline = time.monotonic() + 5
    while data.count(b"HTTP/1.1 ") < 60 and time.monotonic() < deadline:
        data += s.recv(65536)
    s.close()
    bodies = [json.loads(part[part.index(b"{"):]) for part in data.split(b"HTTP/1.1 ")[1:]]
    assert [b["remaining"] for b in bodies] == list(range(49, -1, -1)) + [0] * 10
    assert [b["allowed"] for b in bodies] == [True] * 50 + [False] * 10


def test_keep_alive_serves_many_requests_on_one_connection(hs):
    conn = hs.http()
    for _ in range(20):
        conn.request("GET", "/livez")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"ok\n")
    conn.close()


def test_http_1_0_without_keep_alive_is_closed_after_the_response(hs):
    reply = raw(hs.http_port, b"GET /livez HTTP/1.0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Connection: close\r\n" in reply and reply.endswith(b"ok\n")


def test_head_has_the_headers_and_no_body(hs):
    reply = raw(hs.http_port, b"HEAD /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 3\r\n" in reply and reply.endswith(b"\r\n\r\n")


# ---- authentication -----------------------------------------------------------------------

def test_with_requirepass_everything_but_the_probes_needs_it(make_http_server):
    hs = make_http_server("--manual-clock", "--requirepass", "s3cret")
    body = {"client_key": "a", "resource": "r"}
    status, headers, doc = hs.post("/v1/check", body)
    assert status == 401 and doc["code"] == "NOAUTH"
    assert headers["www-authenticate"].startswith('Basic realm="fastlimit"')
    assert hs.post("/v1/check", body, {"Authorization": "Bearer wrong"})[0] == 401
    assert hs.request("GET", "/v1/info")[0] == 401
    assert hs.post("/v1/check", body, {"Authorization": "Bearer s3cret"})[0] == 200
    basic = base64.b64encode(b"anyone:s3cret").decode()
    assert hs.post("/v1/check", body, {"Authorization": f"Basic {basic}"})[0] == 200
    assert hs.post("/v1/check", body, {"Authorization": "Basic %%%"})[0] == 401
    for probe in ("/livez", "/healthz", "/readyz"):
        assert hs.request("GET", probe)[0] == 200


def test_a_changed_password_takes_effect_on_open_connections(make_http_server):
    hs = make_http_server("--manual-clock", "--requirepass", "one")
    conn = hs.http()
    conn.request("GET", "/v1/info", headers={"Authorization": "Bearer one"})
    assert conn.getresponse().read() and True
    hs.client(password="one").config_set("requirepass", "two")
    conn.request("GET", "/v1/info", headers={"Authorization": "Bearer one"})
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 401
    conn.close()


# ---- health and info -------------------------------------------------------------------------

def test_livez_readyz_and_info(hs):
    assert hs.request("GET", "/livez")[::2] == (200, b"ok\n")
    assert hs.request("GET", "/healthz")[::2] == (200, b"ok\n")
    assert hs.request("GET", "/readyz?verbose")[::2] == (
        200, b"[+]loaded ok\nreadyz check passed\n")
    status, headers, body = hs.request("GET", "/v1/info")
    assert status == 200 and headers["content-type"] == "application/json"
    info = json.loads(body)
    assert info["server"]["tcp_port"] == hs.port
    assert info["stats"]["http_port"] == hs.http_port
    assert "commandstats" in info
    info = json.loads(hs.request("GET", "/v1/info?section=memory,clients")[2])
    assert sorted(info) == ["clients", "memory"]
    assert info["clients"]["http_connected_clients"] >= 1


def test_a_replica_without_its_copy_is_not_ready(make_http_server):
    from wire import free_port
    hs = make_http_server("--manual-clock", "--replicaof", "127.0.0.1", str(free_port()))
    status, _, body = hs.request("GET", "/readyz?verbose")
    assert status == 503
    assert b"[-]replication failed: the replica has no copy of its primary yet" in body
    assert hs.request("GET", "/livez")[0] == 200
    # and a replica refuses a check that spends, as READONLY does
    status, headers, doc = hs.post("/v1/check", {"client_key": "a", "resource": "r"})
    assert status == 503 and doc["code"] == "READONLY"
    assert headers["retry-after"] == "1"
    assert hs.post("/v1/check", {"client_key": "a", "resource": "r", "cost": 0})[0] == 200


def test_a_replica_becomes_ready_when_synced(make_http_server):
    primary = make_http_server("--manual-clock")
    replica = make_http_server("--manual-clock", "--replicaof", "127.0.0.1", str(primary.port))
    wait_until(lambda: replica.request("GET", "/readyz")[0] == 200, 15, "the replica's sync")


def test_the_http_port_in_use_stops_the_start(make_http_server):
    hs = make_http_server("--manual-clock")
    from servers import ServerProcess
    with pytest.raises(RuntimeError, match="address already in use"):
        ServerProcess("--http-port", str(hs.http_port)).start()


def test_http_port_0_turns_the_front_off():
    from servers import ServerProcess
    with ServerProcess("--manual-clock") as srv:
        info = srv.client().info("stats")
        assert info["http_port"] == 0


# ---- cluster mode -------------------------------------------------------------------------

def test_in_cluster_mode_a_key_of_another_shard_gets_421_naming_its_node(
        make_http_server, tmp_path):
    from wire import free_port
    mine, other = free_port(), free_port()        # the other shard's node is not started
    path = tmp_path / "map.toml"
    path.write_text(f"""version = 1
[[shard]]
name = "a"
slots = ["0-8191"]
primary = "127.0.0.1:{mine}"
[[shard]]
name = "b"
slots = ["8192-16383"]
primary = "127.0.0.1:{other}"
""")
    hs = make_http_server("--manual-clock", "--port", str(mine), "--cluster-enabled", "yes",
                          "--cluster-config-file", str(path))
    here, there = "{b}", "{a}"       # hash slots 3300 and 15495
    assert hs.client().execute_command("CLUSTER", "KEYSLOT", there) == 15495
    status, _, doc = hs.post("/v1/check/bucket", {"key": here, "capacity": 1,
                                                  "refill_per_sec": 1})
    assert status == 200
    for path_, doc_ in (("/v1/check", {"client_key": there, "resource": "r"}),
                        ("/v1/check/bucket", {"key": there, "capacity": 1,
                                              "refill_per_sec": 1})):
        status, _, doc = hs.post(path_, doc_)
        assert status == 421
        assert (doc["code"], doc["detail"]) == ("MOVED", f"MOVED 15495 127.0.0.1:{other}")


# ---- fuzzing ----------------------------------------------------------------------------------

def mutations(seed: int, count: int):
    """Valid requests with bytes flipped, cut, doubled or spliced, in the
    same way every run (a fixed seed)."""
    import random
    rng = random.Random(seed)
    samples = [post_bytes("/v1/check", b'{"client_key":"f","resource":"api","cost":1}'),
               post_bytes("/v1/check/batch", b'{"checks":[{"client_key":"f","resource":"a"}]}'),
               b"GET /readyz?verbose HTTP/1.1\r\nHost: x\r\n\r\n",
               b"POST /v1/check HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\n{\"a\":\r\n0\r\n\r\n"]
    for _ in range(count):
        data = bytearray(rng.choice(samples) * rng.randint(1, 3))
        for _ in range(rng.randint(1, 6)):
            op = rng.randrange(4)
            at = rng.randrange(len(data))
            if op == 0:
                data[at] = rng.randrange(256)
            elif op == 1:
                del data[at:at + rng.randint(1, 20)]
            elif op == 2:
                data[at:at] = data[at:at + rng.randint(1, 40)]
            elif data:
                data[at:at] = rng.choice(samples)[: rng.randint(0, 60)]
        yield bytes(data)


def test_mutated_requests_never_crash_or_hang_the_server(make_http_server):
    hs = make_http_server("--manual-clock", "--http-header-timeout", "0.5")
    r = hs.client()
    set_rule(r, "api", TOKEN_BUCKET)
    for data in mutations(1234, 300):
        s = socket.create_connection(("127.0.0.1", hs.http_port), timeout=5)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        finally:
            s.close()
        # whatever came back is whole HTTP responses
        assert reply == b"" or reply.startswith(b"HTTP/1.1 "), data
    assert r.execute_command("CL.LIMIT", "after", "api")[0] == 1
    assert hs.request("GET", "/livez")[0] == 200
    assert "Traceback" not in hs.log()


def test_config_resetstat_clears_the_http_counters(hs):
    hs.request("GET", "/livez")
    hs.post("/v1/check", {"client_key": "a", "resource": "r"})
    r = hs.client()
    assert r.info("stats")["http_total_requests"] == 2
    r.config_resetstat()
    stats = r.info("stats")
    assert stats["http_total_requests"] == 0 and stats["http_total_connections_received"] == 0
    metrics = hs.request("GET", "/metrics")[2].decode()
    assert 'cmd="check"' not in metrics
