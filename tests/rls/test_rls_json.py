"""envoyproxy/ratelimit's HTTP /json endpoint and /healthcheck on a real
server: the golden vectors of notes §2.7 A-C and basic_config.yaml's edge
cases (the tables of rls_tables.py, which the decision's tests run
in-process) as protojson, with the manual clock; protojson's field names,
omissions and types; 200/429/400; auth; SIGTERM's unhealthy drain; the
global shadow mode."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time

import h2.config
import h2.connection
import pytest
from rls_tables import (
    BASIC,
    BASIC_MATCHES,
    D1,
    D2,
    EDGE_PER_IP,
    EXAMPLE7,
    MESSAGING,
    T0_MS,
)
from servers import ExtraPortServer, started_servers
from wire import free_port

from fastlimit.rls.config import UNIT_NAMES

BAD_REQUEST = b"Bad Request\n"


class RlsHttpServer(ExtraPortServer):
    """A server with its HTTP front on a free port, rls-config from a
    temporary file, the manual clock at T0_MS."""

    PORT_FLAG = "--http-port"

    def request(self, method: str, path: str, body=b"", headers=None):
        """(status, headers with lowercase names, body) on a new connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.extra_port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def json(self, doc, headers=None):
        """POST /json: (status, the response document); doc is sent as
        JSON, or as is when it is bytes.  Every answer but a 400 is
        protojson with Content-Type application/json."""
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        status, hdrs, raw = self.request("POST", "/json", body, headers)
        if status == 400:
            assert raw == BAD_REQUEST
            assert hdrs["content-type"] == "text/plain; charset=utf-8"
            return status, hdrs["fastlimit-error"]
        assert hdrs["content-type"] == "application/json", (status, raw)
        return status, json.loads(raw)

    def client(self, **kwargs):
        if "--requirepass" in self.args:
            kwargs.setdefault("password", self.args[self.args.index("--requirepass") + 1])
        return super().client(**kwargs)

    def clock(self, ms: int) -> None:
        self.client().execute_command("DEBUG", "CLOCK", "SET", str(T0_MS + ms))


@pytest.fixture
def rls_http(tmp_path):
    """make(yaml text or None, *args): a started RlsHttpServer."""
    with started_servers(RlsHttpServer) as make:
        def start(text, *args):
            config = []
            if text is not None:
                f = tmp_path / f"rls{len(list(tmp_path.iterdir()))}.yaml"
                f.write_text(text)
                config = ["--rls-config", str(f)]
            srv = make("--manual-clock", *config, *args)
            srv.clock(0)
            return srv
        yield start


def request(domain, *descriptors, **fields) -> dict:
    """A RateLimitRequest document; descriptors are (k, v) lists or
    documents."""
    return {"domain": domain, "descriptors": [d if isinstance(d, dict) else descriptor(d)
                                              for d in descriptors], **fields}


def descriptor(entries, **fields) -> dict:
    return {"entries": [{"key": k, "value": v} for k, v in entries], **fields}


def status(code, rpu=0, unit=0, name="", remaining=0, reset=None) -> dict:
    """A DescriptorStatus as protojson writes it: zero values left out."""
    out: dict = {"code": code}
    if unit:
        limit: dict = {}
        if name:
            limit["name"] = name
        if rpu:
            limit["requestsPerUnit"] = rpu
        limit["unit"] = UNIT_NAMES[unit]
        out["currentLimit"] = limit
    if remaining:
        out["limitRemaining"] = remaining
    if reset is not None:
        out["durationUntilReset"] = f"{reset}s"
    return out


def answer(overall, *statuses) -> dict:
    return {"overallCode": overall, "statuses": list(statuses)}


DAY_S = 86400
SECOND, MINUTE, DAY = 1, 2, 4


# ---- the golden vectors (notes §2.7) --------------------------------------------------

def test_json_messaging_counts_every_descriptor_even_when_another_is_over(rls_http):
    s = rls_http(MESSAGING)
    both = request("messaging", D1, D2)
    for i in range(5):
        assert s.json(both) == (200, answer(
            "OK", status("OK", 5, DAY, remaining=4 - i, reset=DAY_S),
            status("OK", 100, DAY, remaining=99 - i, reset=DAY_S)))
    assert s.json(both) == (429, answer(
        "OVER_LIMIT", status("OVER_LIMIT", 5, DAY, reset=DAY_S),
        status("OK", 100, DAY, remaining=94, reset=DAY_S)))
    assert s.json(request("messaging", D2)) == (200, answer(
        "OK", status("OK", 100, DAY, remaining=93, reset=DAY_S)))
    other = [("message_type", "marketing"), ("to_number", "2062222222")]
    assert s.json(request("messaging", other))[1]["statuses"][0]["limitRemaining"] == 4
    transactional = [("message_type", "transactional"), ("to_number", "2061111111")]
    assert s.json(request("messaging", transactional)) == (200, answer("OK", {"code": "OK"}))


def test_json_edge_proxy_specific_value_beats_key_only_and_zero_blocks(rls_http):
    s = rls_http(EDGE_PER_IP)
    # requests_per_unit 0 is protojson's zero value: left out of currentLimit
    assert s.json(request("edge_proxy_per_ip", [("remote_address", "50.0.0.5")])) == (
        429, answer("OVER_LIMIT", {"code": "OVER_LIMIT", "currentLimit": {"unit": "SECOND"},
                                   "durationUntilReset": "1s"}))
    one = request("edge_proxy_per_ip", [("remote_address", "50.0.0.1")])
    for i in range(10):
        assert s.json(one) == (200, answer("OK", status("OK", 10, SECOND, remaining=9 - i,
                                                        reset=1)))
    assert s.json(one) == (429, answer("OVER_LIMIT", status("OVER_LIMIT", 10, SECOND, reset=1)))
    s.clock(1000)
    assert s.json(one) == (200, answer("OK", status("OK", 10, SECOND, remaining=9, reset=1)))
    deeper = request("edge_proxy_per_ip", [("remote_address", "50.0.0.1"), ("path", "/x")])
    assert s.json(deeper) == (200, answer("OK", {"code": "OK"}))


def test_json_example7_replaces_drops_and_does_not_count_the_named_limit(rls_http):
    s = rls_http(EXAMPLE7)
    d1 = [("key_1", "value_1"), ("user", "bkthomps")]
    d2 = [("key_2", "value_2"), ("user", "bkthomps")]
    for i in range(5):
        assert s.json(request("example7", d1)) == (200, answer(
            "OK", status("OK", 5, SECOND, "specific_limit", remaining=4 - i, reset=1)))
    assert s.json(request("example7", d1))[0] == 429
    s.clock(1000)
    for i in range(10):
        assert s.json(request("example7", d1, d2)) == (200, answer(
            "OK", {"code": "OK"}, status("OK", 10, SECOND, remaining=9 - i, reset=1)))
    assert s.json(request("example7", d1, d2)) == (429, answer(
        "OVER_LIMIT", {"code": "OK"}, status("OVER_LIMIT", 10, SECOND, reset=1)))
    assert s.json(request("example7", d1)) == (200, answer(
        "OK", status("OK", 5, SECOND, "specific_limit", remaining=4, reset=1)))


def test_json_basic_config_matching(rls_http):
    s = rls_http(BASIC)
    for entries, expected in BASIC_MATCHES:
        got = s.json(request("test-domain", entries))[1]["statuses"][0]
        if expected is None:
            assert got == {"code": "OK"}, entries
        else:
            rpu, unit, _ = expected
            assert got["currentLimit"] == {"requestsPerUnit": rpu, "unit": UNIT_NAMES[unit]}, \
                entries


def test_json_unlimited_shadow_share_threshold_and_the_override(rls_http):
    s = rls_http(BASIC)
    assert s.json(request("test-domain", [("key6", "x")])) == (
        200, answer("OK", {"code": "OK", "limitRemaining": 4294967295}))
    for remaining in (1, 0, 0):
        assert s.json(request("test-domain", [("user", "user-a")])) == (
            200, answer("OK", status("OK", 2, SECOND, remaining=remaining, reset=1)))
    for name in ["files/a.pdf"] * 5 + ["files/b.csv"] * 5:
        assert s.json(request("test-domain", [("files", name)]))[0] == 200
    assert s.json(request("test-domain", [("files", "files/c.txt")]))[0] == 429
    # the override by unit name and by number: one counter
    by_name = descriptor([("unknown", "k")], limit={"requestsPerUnit": 3, "unit": "MINUTE"})
    by_number = descriptor([("unknown", "k")], limit={"requests_per_unit": 3, "unit": 2})
    results = [s.json(request("test-domain", d)) for d in (by_name, by_number, by_name,
                                                            by_number)]
    assert results == [
        (200, answer("OK", status("OK", 3, MINUTE, remaining=2, reset=60))),
        (200, answer("OK", status("OK", 3, MINUTE, remaining=1, reset=60))),
        (200, answer("OK", status("OK", 3, MINUTE, reset=60))),
        (429, answer("OVER_LIMIT", status("OVER_LIMIT", 3, MINUTE, reset=60)))]


def test_json_hits_addend_zero_checks_only_and_request_hits_zero_means_one(rls_http):
    s = rls_http(EDGE_PER_IP)
    ip = [("remote_address", "1.1.1.1")]

    def remaining(doc):
        return s.json(doc)[1]["statuses"][0].get("limitRemaining", 0)

    for check in (0, "0"):
        assert remaining(request("edge_proxy_per_ip", descriptor(ip, hitsAddend=check))) == 10
    assert remaining(request("edge_proxy_per_ip", ip, hitsAddend=0)) == 9
    assert remaining(request("edge_proxy_per_ip", ip, hitsAddend=4)) == 5
    assert remaining(request("edge_proxy_per_ip", descriptor(ip, hits_addend="3"),
                             hits_addend=4)) == 2


def test_json_unknown_domain_is_all_ok(rls_http):
    s = rls_http(EDGE_PER_IP)
    assert s.json(request("nope", [("a", "b")], [("c", "d")])) == (
        200, answer("OK", {"code": "OK"}, {"code": "OK"}))


# ---- protojson's reading ------------------------------------------------------------

def test_json_takes_proto_names_integers_as_strings_and_null_as_unset(rls_http):
    s = rls_http(EDGE_PER_IP)
    ip = [{"key": "remote_address", "value": "7.7.7.7"}]
    doc = {"domain": "edge_proxy_per_ip",
           "descriptors": [{"entries": ip, "limit": None, "hits_addend": None}],
           "hits_addend": "2"}
    assert s.json(doc)[1]["statuses"][0]["limitRemaining"] == 8
    # integers as protojson reads them: an exponent or a fraction of zeros is fine
    for hits in (b"1.0", b"1e0", b'"1.0"', b'"10e-1"', b"0.1e1", b"-0", b"100E-2"):
        body = b'{"domain": "edge_proxy_per_ip", "descriptors": [{"entries": [{"key": ' \
               b'"remote_address", "value": "7.7.7.7"}]}], "hitsAddend": ' + hits + b"}"
        assert s.json(body)[0] == 200, hits
    status_, body = s.json({"domain": "edge_proxy_per_ip", "descriptors": [{"entries": ip}],
                            "hitsAddend": None})
    # 2, then seven of 1 and this one (null is 1 too): the tenth, and 0 is left out
    assert body["statuses"][0] == status("OK", 10, SECOND, reset=1)


def test_json_the_largest_uint64_hits_addend_is_taken_and_is_over(rls_http):
    s = rls_http(EDGE_PER_IP)
    for hits in (18446744073709551615, "18446744073709551615", 1e19):
        doc = request("edge_proxy_per_ip", descriptor([("remote_address", "8.8.8.8")],
                                                      hitsAddend=hits))
        assert s.json(doc)[0] == 429


@pytest.mark.parametrize("body, reason", [
    (b"", "the body is not JSON"),
    (b"{", "the body is not JSON"),
    (b'{"domain": "d"} x', "the body is not JSON"),
    (b"[]", "RateLimitRequest must be an object"),
    (b"null", "RateLimitRequest must be an object"),
    (b'{"domain": NaN}', "the body is not JSON"),
    (b'{"domain": "\xff"}', "the body is not JSON"),
    (b'{"domain": "\\ud800", "descriptors": [{}]}', "domain holds an invalid escape code"),
    (b"[" * 100_000 + b"]" * 100_000, "the body is not JSON"),
    (b'{"domain": 5}', "domain must be a string"),
    (b'{"domain": "d", "descriptors": {}}', "descriptors must be an array"),
    (b'{"domain": "d", "descriptors": [null]}', "RateLimitDescriptor must be an object"),
    (b'{"domain": "d", "descriptors": [{"entries": "x"}]}', "entries must be an array"),
    (b'{"domain": "d", "descriptors": [{"entries": [{"key": 1}]}]}', "key must be a string"),
    (b'{"domain": "d", "bogus": 1}', 'unknown field "bogus" in RateLimitRequest'),
    (b'{"domain": "d", "Domain": "e"}', 'unknown field "Domain" in RateLimitRequest'),
    (b'{"domain": "d", "descriptors": [{"isNegativeHits": true}]}',
     'unknown field "isNegativeHits" in RateLimitDescriptor'),
    (b'{"domain": "d", "domain": "e"}', 'duplicate field "domain" in RateLimitRequest'),
    (b'{"hitsAddend": 1, "hits_addend": 1}', 'duplicate field "hits_addend"'),
    (b'{"domain": "d", "hitsAddend": -1}', "invalid value for hitsAddend: -1"),
    (b'{"domain": "d", "hitsAddend": 1.5}', "invalid value for hitsAddend: 1.5"),
    (b'{"domain": "d", "hitsAddend": true}', "invalid value for hitsAddend: true"),
    (b'{"domain": "d", "hitsAddend": " 1"}', 'invalid value for hitsAddend: " 1"'),
    (b'{"domain": "d", "hitsAddend": "+1"}', 'invalid value for hitsAddend: "+1"'),
    (b'{"domain": "d", "hitsAddend": 4294967296}', "invalid value for hitsAddend: 4294967296"),
    (b'{"domain": "d", "hitsAddend": 1e400}', "invalid value for hitsAddend: 1e400"),
    (b'{"domain": "d", "hitsAddend": 1' + b"0" * 5000 + b"}", "invalid value for hitsAddend"),
    (b'{"domain": "d", "descriptors": [{"hitsAddend": 18446744073709551616}]}',
     "invalid value for hitsAddend: 18446744073709551616"),
    (b'{"domain": "d", "descriptors": [{"limit": {"unit": "WEEK"}}]}',
     'invalid value for enum field unit: "WEEK"'),
    (b'{"domain": "d", "descriptors": [{"limit": {"unit": "2"}}]}',
     'invalid value for enum field unit: "2"'),
    (b'{"domain": "d", "descriptors": [{"limit": {"unit": 2147483648}}]}',
     "invalid value for enum field unit: 2147483648"),
    # the service's errors
    (b'{"descriptors": [{"entries": [{"key": "a"}]}]}', "rate limit domain must not be empty"),
    (b'{"domain": "d"}', "rate limit descriptor list must not be empty"),
    (b'{"domain": "d", "descriptors": []}', "rate limit descriptor list must not be empty"),
    (b'{"domain": "edge_proxy_per_ip", "descriptors": [{"entries": [{"key": "a"}], '
     b'"limit": {}}]}',
     "invalid rate limit unit 0 in the descriptor's limit"),
])
def test_json_refuses_what_protojson_or_the_service_refuses_with_a_400(
        rls_http, body, reason):
    s = rls_http(EDGE_PER_IP)
    status_, why = s.json(body)
    assert status_ == 400
    assert why.startswith(reason), why
    assert s.client().ping()


def test_json_get_without_a_body_is_a_400_and_other_methods_a_405(rls_http):
    s = rls_http(EDGE_PER_IP)
    status_, hdrs, body = s.request("GET", "/json")
    assert (status_, body, hdrs["x-content-type-options"]) == (400, BAD_REQUEST, "nosniff")
    status_, hdrs, _ = s.request("PUT", "/json", b"{}")
    assert (status_, hdrs["allow"]) == (405, "GET, POST")


def test_json_a_body_over_http_max_body_bytes_is_refused(rls_http):
    s = rls_http(EDGE_PER_IP, "--http-max-body-bytes", "1kb")
    big = request("edge_proxy_per_ip", [("remote_address", "x" * 2000)])
    status_, _, _ = s.request("POST", "/json", json.dumps(big).encode())
    assert status_ == 413


def test_json_with_response_headers_and_a_global_shadow_without_retry_after(rls_http):
    s = rls_http(EDGE_PER_IP, "--rls-response-headers", "yes")
    blocked = request("edge_proxy_per_ip", [("remote_address", "50.0.0.5")])
    policy = {"key": "RateLimit-Policy", "value": '"edge_proxy_per_ip.remote_address_50.0.0.5"'
                                                  ';q=0;w=1'}
    limit = {"key": "RateLimit", "value": '"edge_proxy_per_ip.remote_address_50.0.0.5";r=0;t=1'}
    assert s.json(blocked)[1]["responseHeadersToAdd"] == [
        policy, limit, {"key": "Retry-After", "value": "1"}]
    s.client().config_set("rls-shadow-mode", "yes")
    assert s.json(blocked)[1]["responseHeadersToAdd"] == [policy, limit]


# ---- auth -----------------------------------------------------------------------------

def test_json_needs_the_password_and_healthcheck_does_not(rls_http):
    s = rls_http(EDGE_PER_IP, "--requirepass", "sesame")
    body = json.dumps(request("edge_proxy_per_ip", [("remote_address", "9.9.9.9")])).encode()
    status_, hdrs, _ = s.request("POST", "/json", body)
    assert status_ == 401 and "Bearer" in hdrs["www-authenticate"]
    assert s.request("POST", "/json", body, {"Authorization": "Bearer wrong"})[0] == 401
    assert s.json(body, {"Authorization": "Bearer sesame"})[0] == 200
    assert s.json(body, {"Authorization": "Basic dXNlcjpzZXNhbWU="})[0] == 200   # user:sesame
    assert s.request("GET", "/healthcheck")[::2] == (200, b"OK")


# ---- /healthcheck ---------------------------------------------------------------------

def test_healthcheck_is_ok_while_serving(rls_http):
    s = rls_http(None)
    status_, hdrs, body = s.request("GET", "/healthcheck")
    assert (status_, body, hdrs["content-type"]) == (200, b"OK", "text/plain; charset=utf-8")


def open_unanswered_call(port: int) -> socket.socket:
    """An h2c connection to the gRPC front with a ShouldRateLimit call
    begun (its headers) and never finished."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "test"),
                          (":path", "/envoy.service.ratelimit.v3.RateLimitService/"
                                    "ShouldRateLimit"),
                          ("content-type", "application/grpc"), ("te", "trailers")])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(conn.data_to_send())
    return sock


def test_healthcheck_fails_once_sigterm_begins_the_shutdown(rls_http):
    """Real time is the point: the gRPC front waits up to a second for a
    call it began (no grpc-deadline-ms here) while the HTTP port still
    answers, and /healthcheck then says 500."""
    grpc_port = free_port()
    s = rls_http(None, "--grpc-port", str(grpc_port), "--grpc-deadline-ms", "0")
    sock = open_unanswered_call(grpc_port)
    try:
        wait_for(lambda: s.client().info("clients")["grpc_connected_clients"] == 1)
        time.sleep(0.1)          # the call's headers are read before the signal
        assert s.request("GET", "/healthcheck")[0] == 200
        s.proc.send_signal(signal.SIGTERM)
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and 500 not in seen:
            status_, _, body = s.request("GET", "/healthcheck")
            seen.append(status_)
            time.sleep(0.01)
        assert seen[-1] == 500 and body == b"", seen
    finally:
        sock.close()


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ---- the global shadow mode -----------------------------------------------------------

def test_json_global_shadow_mode_answers_200_with_the_status_still_over(rls_http):
    s = rls_http(EDGE_PER_IP)
    blocked = request("edge_proxy_per_ip", [("remote_address", "50.0.0.5")])
    over = {"code": "OVER_LIMIT", "currentLimit": {"unit": "SECOND"}, "durationUntilReset": "1s"}
    assert s.json(blocked) == (429, answer("OVER_LIMIT", over))
    s.client().config_set("rls-shadow-mode", "yes")
    assert s.json(blocked) == (200, answer("OK", over))
    assert s.client().info("rls")["rls_global_shadow_mode"] == 1
    s.client().config_set("rls-shadow-mode", "no")
    assert s.json(blocked)[0] == 429


# ---- shedding (README "Overload") ------------------------------------------------------

PRIO = "x-fastlimit-priority"


def test_json_a_priority_entry_sheds_by_the_level_and_is_not_matched(rls_http):
    s = rls_http(EDGE_PER_IP)
    c = s.client()
    one = [("remote_address", "50.0.0.1")]
    low = request("edge_proxy_per_ip", one + [(PRIO, "low")])
    # not saturated: the entry is taken out before matching, so it counts as `one`
    assert s.json(low) == (200, answer("OK", status("OK", 10, SECOND, remaining=9, reset=1)))
    c.execute_command("DEBUG", "SHED-LEVEL", 1)
    shed = answer("OK", {"code": "OK"})
    shed["responseHeadersToAdd"] = [{"key": "x-fastlimit-shed", "value": "1"}]
    assert s.json(low) == (200, shed)
    # normal (no entry) and critical are counted at level 1; normal is shed at 2
    assert s.json(request("edge_proxy_per_ip", one))[1]["statuses"][0]["limitRemaining"] == 8
    critical = request("edge_proxy_per_ip", one, [(PRIO, "critical")])
    assert s.json(critical)[1]["statuses"][0]["limitRemaining"] == 7
    c.execute_command("DEBUG", "SHED-LEVEL", 2)
    assert s.json(request("edge_proxy_per_ip", one)) == (200, {**shed, "statuses": [
        {"code": "OK"}]})
    assert s.json(critical)[1]["statuses"][0]["limitRemaining"] == 6
    assert (c.info("stats")["shed_checks_low"], c.info("stats")["shed_checks_normal"]) == (1, 1)
    # a value that is not a priority is the request's error
    status_code, error = s.json(request("edge_proxy_per_ip", [(PRIO, "urgent")]))
    assert status_code == 400 and "x-fastlimit-priority must be low, normal or critical" in error
