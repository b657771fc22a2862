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
from test_http_front import TOKEN_BUCKET, post_bytes, raw, set_rule

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
