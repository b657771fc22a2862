"""What the HTTP front accepts of a request, against a real server over
real sockets (raw bytes where a client library would correct the
request, http.client and curl elsewhere): one JSON parse for every
endpoint that reads a body (nesting too deep is 400, a key twice is
400), exact query parameters, and RFC 9112's framing rules (Host, the
version, Expect)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time

import pytest
from http_calls import TOKEN_BUCKET, raw, set_rule

# Deeper than any recursion limit, within the rules API's 64 KB documents.
NESTED = b"[" * 50_000


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


# ---- one JSON parse path ------------------------------------------------------------------

# Every route that reads a JSON body, with a document it would take.
JSON_ROUTES = [
    ("POST", "/v1/check", b'{"client_key":"k","resource":"api","x":%s}'),
    ("POST", "/v1/limits/check", b'{"rule_id":"api","key":"k","x":%s}'),
    ("POST", "/v1/check/bucket", b'{"key":"k","capacity":5,"refill_per_sec":1,"x":%s}'),
    ("POST", "/v1/check/batch", b'{"checks":[{"client_key":"k","resource":"api","x":%s}]}'),
    ("PUT", "/v1/rules/deep", b'{"match":{"resource":"api"},"capacity":1,'
                              b'"refill_per_second":1,"x":%s}'),
    ("POST", "/json", b'{"domain":"d","descriptors":%s}'),
]


@pytest.mark.parametrize(("method", "path", "template"), JSON_ROUTES,
                         ids=[p for _, p, _ in JSON_ROUTES])
def test_json_nested_too_deeply_is_400_on_every_endpoint(hs, method, path, template):
    set_rule(hs.client(), "api", TOKEN_BUCKET)
    body = template % NESTED
    status, headers, reply = hs.request(method, path, body)
    assert status == 400, reply
    # /json writes the reason in a header, as envoyproxy/ratelimit's body is Go's http.Error
    reason = reply.decode() + headers.get("fastlimit-error", "")
    assert "nested too deeply" in reason or "recursion" in reason
    assert "Traceback" not in hs.log()
    assert hs.request("GET", "/livez")[0] == 200


CHECK_DOCS = [
    ("/v1/check", b'{"client_key":"k","resource":"api","cost":0,"cost":5}'),
    ("/v1/limits/check", b'{"rule_id":"api","key":"k","cost":0,"cost":5}'),
    ("/v1/check/bucket", b'{"key":"k","capacity":5,"refill_per_sec":1,"cost":0,"cost":5}'),
    ("/v1/check/batch", b'{"checks":[{"client_key":"k","resource":"api","cost":0,"cost":5}]}'),
]


@pytest.mark.parametrize(("path", "body"), CHECK_DOCS, ids=[p for p, _ in CHECK_DOCS])
def test_a_key_given_twice_is_refused_and_spends_nothing(hs, path, body):
    r = hs.client()
    set_rule(r, "api", TOKEN_BUCKET)
    status, _, reply = hs.request("POST", path, body)
    assert status == 400, reply
    assert json.loads(reply)["detail"] == "the body is not JSON: duplicate key 'cost'"
    # nothing was spent: the rule's bucket and the inline one are full
    assert r.execute_command("CL.LIMIT", "k", "api", "COST", "0")[2] == 3
    assert r.execute_command("CL.CHECK", "k", 5, 1, "COST", 0)[2] == 5


# ---- exact query parameters -----------------------------------------------------------------

def deny_once(hs) -> None:
    set_rule(hs.client(), "api", {**TOKEN_BUCKET, "capacity": 1})
    assert hs.post("/v1/check", {"client_key": "q", "resource": "api"})[2]["allowed"]


@pytest.mark.parametrize(("query", "status"), [
    ("enforce=1", 429), ("enforce=true", 429), ("a=b&enforce=1", 429), ("enforce=%31", 429),
    ("", 200), ("enforce=0", 200), ("enforce=false", 200), ("notenforce=1", 200),
    ("xenforce=true", 200), ("enforce_x=1", 200), ("a=enforce=1", 200),
])
def test_enforce_is_the_exact_parameter(hs, query, status):
    deny_once(hs)
    got, _, doc = hs.post("/v1/check?" + query, {"client_key": "q", "resource": "api"})
    assert (got, doc["allowed"]) == (status, False)


@pytest.mark.parametrize("query", ["enforce=yes", "enforce=", "enforce", "enforce=10"])
def test_an_enforce_value_not_documented_is_400_naming_it(hs, query):
    deny_once(hs)
    status, _, doc = hs.post("/v1/check?" + query, {"client_key": "q", "resource": "api"})
    assert (status, doc["field"]) == (400, "enforce")
    assert doc["detail"] == "enforce must be one of 1, true, 0, false"


# ---- RFC 9112's framing -----------------------------------------------------------------

@pytest.mark.parametrize("head", [
    b"GET /livez HTTP/1.1\r\n\r\n",
    b"GET /livez HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET /livez HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n",
], ids=["no-host", "two-hosts", "two-hosts-1.0"])
def test_a_request_without_exactly_one_host_is_400_and_closed(hs, head):
    reply = raw(hs.http_port, head + b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"exactly one Host header" in reply and b"Connection: close" in reply
    assert b"HTTP/1.1 200" not in reply            # the one after it is not answered
    assert hs.client().info("stats")["http_bad_requests"] == 1


def test_http_1_0_needs_no_host_and_1_1_one(hs):
    assert raw(hs.http_port, b"GET /livez HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 OK")
    assert raw(hs.http_port, b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
               ).startswith(b"HTTP/1.1 200 OK")


@pytest.mark.parametrize("extra", [b"", b"Connection: keep-alive\r\n"])
def test_an_unsupported_major_version_is_505(hs, extra):
    reply = raw(hs.http_port, b"GET /livez HTTP/2.0\r\nHost: x\r\n%s\r\n" % extra)
    assert reply.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n")
    assert b"HTTP/2.0 is not supported" in reply


def expect_head(body_len: int, extra: bytes = b"", expect: bytes = b"100-continue") -> bytes:
    return (b"POST /v1/check/bucket HTTP/1.1\r\nHost: x\r\nExpect: %s\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (expect, body_len, extra))


BUCKET_DOC = b'{"key":"e","capacity":5,"refill_per_sec":1}'


def test_expect_100_continue_gets_100_before_the_body_is_sent(hs):
    s = socket.create_connection(("127.0.0.1", hs.http_port), timeout=5)
    s.sendall(expect_head(len(BUCKET_DOC)))
    assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    s.sendall(BUCKET_DOC)
    reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b'"remaining":4' in reply
    s.close()


def test_curl_sending_expect_gets_its_answer_without_waiting(hs):
    """curl waits --expect100-timeout for a 100 before it sends the body:
    with the interim answer it never waits that long."""
    curl = shutil.which("curl")
    assert curl, "curl is part of the set-up"
    started = time.monotonic()
    out = subprocess.run(
        [curl, "-s", "--expect100-timeout", "30", "-H", "Expect: 100-continue",
         "--data-binary", BUCKET_DOC.decode(), f"http://127.0.0.1:{hs.http_port}/v1/check/bucket"],
        capture_output=True, timeout=60, check=True).stdout
    assert json.loads(out)["remaining"] == 4
    assert time.monotonic() - started < 20      # 30 s had it waited for the timeout


def test_expect_100_continue_without_credentials_gets_401_before_the_body(make_http_server):
    hs = make_http_server("--manual-clock", "--requirepass", "pw")
    s = socket.create_connection(("127.0.0.1", hs.http_port), timeout=5)
    s.sendall(expect_head(len(BUCKET_DOC)))
    reply = b""
    while chunk := s.recv(65536):
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    assert b"WWW-Authenticate: Basic" in reply and b"Connection: close" in reply
    s.close()
    # with the password, the same request gets its 100
    s = socket.create_connection(("127.0.0.1", hs.http_port), timeout=5)
    s.sendall(expect_head(len(BUCKET_DOC), b"Authorization: Bearer pw\r\n"))
    assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    s.close()


def test_an_expectation_other_than_100_continue_is_417(hs):
    reply = raw(hs.http_port, expect_head(len(BUCKET_DOC), expect=b"something-else"))
    assert reply.startswith(b"HTTP/1.1 417 Expectation Failed\r\n")
    assert b"Connection: close" in reply
    assert hs.client().execute_command("CL.CHECK", "e", 5, 1, "COST", 0)[2] == 5


def test_expect_without_a_body_gets_no_100(hs):
    reply = raw(hs.http_port, b"GET /livez HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                              b"Connection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
