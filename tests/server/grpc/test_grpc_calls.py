"""ShouldRateLimit and Health/Check over real gRPC (grpcio), against a real
server deciding with the rls layer on grpcserver.py's RIG_YAML, or with
no configuration at all."""

from __future__ import annotations

import base64

import grpc
from grpcserver import RIG_YAML
from rls_messages import (
    DAY,
    MINUTE,
    OK,
    OVER_LIMIT,
    RLS_PATH,
    SECOND,
    descriptor,
    error_of,
    health_request,
    length_delimited,
    request,
    tag,
    uint_field,
)

KEY = descriptor([(b"api_key", b"alice")])
PATH = descriptor([(b"generic_key", b"per_path"), (b"path", b"/demo")])


def test_every_descriptor_gets_a_status_in_order_and_the_fourth_call_is_over(gs):
    for remaining in (2, 1, 0):
        resp = gs.should_rate_limit(request(b"rig", KEY, PATH))
        assert resp["overall"] == OK
        assert resp["statuses"] == [
            {"code": OK, "limit": (3, MINUTE, b"api_key"), "remaining": remaining, "reset": 60},
            {"code": OK, "limit": (1000, MINUTE, b"generic_key,path"),
             "remaining": 997 + remaining, "reset": 60}]
        assert resp["headers"] == []
    gs.client().execute_command("DEBUG", "CLOCK", "SET", "20500")
    resp = gs.should_rate_limit(request(b"rig", KEY, PATH))
    assert resp["overall"] == OVER_LIMIT
    assert [s["code"] for s in resp["statuses"]] == [OVER_LIMIT, OK]
    assert resp["statuses"][0]["remaining"] == 0
    assert resp["statuses"][0]["reset"] == 40          # the reference's: 60 - now_s % 60
    assert resp["headers"] == []
    gs.client().execute_command("DEBUG", "CLOCK", "SET", "60000")
    assert gs.should_rate_limit(request(b"rig", KEY))["overall"] == OK


def test_hits_addend_of_the_request_and_of_a_descriptor_and_zero_checks_only(gs):
    heavy = descriptor([(b"api_key", b"heavy")], hits_addend=2)
    assert gs.should_rate_limit(request(b"rig", heavy))["statuses"][0]["remaining"] == 1
    check_only = descriptor([(b"api_key", b"heavy")], hits_addend=0)
    assert gs.should_rate_limit(request(b"rig", check_only))["statuses"][0]["remaining"] == 1
    plain = descriptor([(b"api_key", b"heavy")])
    resp = gs.should_rate_limit(request(b"rig", plain, hits_addend=2))
    assert resp["overall"] == OVER_LIMIT and resp["statuses"][0]["remaining"] == 0


def test_the_descriptor_limit_override_reaches_the_service(gs):
    over = descriptor([(b"user", b"u1")], limit=(1, SECOND))
    status = gs.should_rate_limit(request(b"rig", over))["statuses"][0]
    assert status["limit"] == (1, SECOND, b"")          # an override has no name
    assert gs.should_rate_limit(request(b"rig", over))["overall"] == OVER_LIMIT
    day = descriptor([(b"user", b"u2")], limit=(5, DAY))
    assert gs.should_rate_limit(request(b"rig", day))["statuses"][0]["limit"] == (5, DAY, b"")


def unknown_fields() -> bytes:
    """One unknown field of each wire type proto3 sends."""
    return (uint_field(90, 7) + length_delimited(91, b"newer envoy") + tag(92, 1) + b"8bytes!!"
            + tag(93, 5) + b"4byt" + uint_field(2**29 - 1, 1))


def test_unknown_fields_at_every_level_are_skipped(gs):
    entry = length_delimited(1, unknown_fields() + length_delimited(1, b"api_key")
                             + length_delimited(2, b"bob") + unknown_fields())
    limit = length_delimited(2, uint_field(1, 9) + unknown_fields() + uint_field(2, MINUTE))
    hits = length_delimited(3, unknown_fields() + uint_field(1, 1))
    desc = unknown_fields() + entry + unknown_fields() + limit + hits
    message = unknown_fields() + length_delimited(1, b"rig") + length_delimited(2, desc) + \
        unknown_fields() + uint_field(3, 1)
    resp = gs.should_rate_limit(message)
    assert resp["overall"] == OK
    assert resp["statuses"][0]["limit"] == (9, MINUTE, b"")    # the override, decoded
    assert resp["statuses"][0]["remaining"] == 8


def test_a_malformed_message_is_internal_and_the_connection_serves_on(gs):
    for bad in (b"\x0a\x05rig",                       # a length past the end
                b"\x0a",                              # a tag with no value
                b"\x12\x02\x0a\x09",                  # an entry's length past its descriptor
                b"\x0b\x00",                          # a group (wire type 3)
                b"\x00\x01",                          # field number 0
                b"\x18" + b"\xff" * 10 + b"\x01"):    # a varint of 11 bytes
        assert error_of(lambda bad=bad: gs.call(RLS_PATH, bad)) == (
            grpc.StatusCode.INTERNAL, "the RateLimitRequest cannot be parsed")
    assert gs.should_rate_limit(request(b"rig", KEY))["overall"] == OK


def test_the_services_refusal_is_unknown_with_its_message(gs):
    assert error_of(lambda: gs.call(RLS_PATH, request(b"", KEY))) == (
        grpc.StatusCode.UNKNOWN, "rate limit domain must not be empty")
    assert error_of(lambda: gs.call(RLS_PATH, request(b"rig"))) == (
        grpc.StatusCode.UNKNOWN, "rate limit descriptor list must not be empty")


def test_without_an_rls_layer_every_descriptor_is_ok(make_grpc_server):
    srv = make_grpc_server()
    resp = srv.should_rate_limit(request(b"any", KEY, PATH, KEY))
    assert resp == {"overall": OK, "headers": [], "statuses": [
        {"code": OK, "limit": None, "remaining": 0, "reset": None}] * 3}


def test_health_check_serves_the_server_and_the_rls_and_knows_no_other(gs):
    assert gs.health() == 1
    assert gs.health(health_request(b"envoy.service.ratelimit.v3.RateLimitService")) == 1
    assert gs.health(health_request(b"ratelimit")) == 1          # the reference's name
    assert error_of(lambda: gs.health(health_request(b"ratelimitx"))) == (
        grpc.StatusCode.NOT_FOUND, "unknown service")
    assert error_of(lambda: gs.health(health_request(b"other.Service"))) == (
        grpc.StatusCode.NOT_FOUND, "unknown service")


def test_other_methods_are_unimplemented(gs):
    for path in ("/envoy.service.ratelimit.v3.RateLimitService/Other",
                 "/grpc.health.v1.Health/Watch", "/x"):
        assert error_of(lambda path=path: gs.call(path, b"")) == (
            grpc.StatusCode.UNIMPLEMENTED, "unknown service or method")


def test_a_compressed_message_is_refused_as_grpc_does(gs):
    def raw(body: bytes, *headers: str) -> str:
        import subprocess
        done = subprocess.run(
            ["curl", "-s", "--http2-prior-knowledge", "-X", "POST", "--data-binary", "@-",
             "-H", "content-type: application/grpc", "-H", "te: trailers",
             *[a for h in headers for a in ("-H", h)], "-D", "-", "-o", "/dev/null",
             gs.url + RLS_PATH], input=body, capture_output=True, timeout=30)
        return done.stdout.decode()
    message = request(b"rig", KEY)
    framed = b"\x01" + len(message).to_bytes(4, "big") + message
    out = raw(framed, "grpc-encoding: gzip")
    assert "grpc-status: 12" in out and "compressed messages are not supported" in out
    out = raw(framed)
    assert "grpc-status: 13" in out
    out = raw(b"\x00" + len(message).to_bytes(4, "big") + message)
    assert "grpc-status: 0" in out


def test_a_request_that_is_not_grpc_gets_415(gs):
    import subprocess
    done = subprocess.run(
        ["curl", "-s", "--http2-prior-knowledge", "-X", "POST", "--data-binary", "x",
         "-H", "content-type: application/json", "-D", "-", "-o", "/dev/null",
         gs.url + RLS_PATH], capture_output=True, timeout=30)
    assert done.stdout.startswith(b"HTTP/2 415")


def test_a_call_within_its_grpc_timeout_is_answered(gs):
    # (one past it: test_grpc_h2.py, which controls the header; grpcio's own
    # 1 us deadline raced its answer on a loaded machine)
    assert gs.should_rate_limit(request(b"rig", KEY), timeout=5)["overall"] == OK


def test_info_counts_connections_and_calls(gs):
    gs.should_rate_limit(request(b"rig", KEY))
    gs.health()
    error_of(lambda: gs.call("/x", b""))
    info = gs.info()
    assert info["grpc_port"] == gs.grpc_port
    assert info["grpc_connected_clients"] == 1
    assert info["grpc_total_connections_received"] == 1
    assert info["grpc_total_calls"] == 3 and info["grpc_failed_calls"] == 1
    assert info["mem_grpc"] > 0
    assert info["grpc_protocol_errors"] == 0


def test_max_concurrent_streams_and_deadline_are_settings(gs):
    c = gs.client()
    assert c.config_get("grpc-*") == {"grpc-port": str(gs.grpc_port),
                                      "grpc-max-concurrent-streams": "100",
                                      "grpc-max-descriptors": "256",
                                      "grpc-deadline-ms": "15.0"}
    c.config_set("grpc-deadline-ms", "40")
    assert c.config_get("grpc-deadline-ms") == {"grpc-deadline-ms": "40.0"}
    assert gs.should_rate_limit(request(b"rig", KEY))["overall"] == OK



def test_with_requirepass_a_call_needs_it_as_a_bearer_token_and_health_does_not(
        make_grpc_server):
    gs = make_grpc_server("--manual-clock", "--requirepass", "s3cret",
                          rls=RIG_YAML)
    message = request(b"rig", KEY)
    for metadata in (None, [("authorization", "Bearer wrong")], [("authorization", "s3cret")]):
        code, details = error_of(lambda md=metadata: gs.should_rate_limit(message, metadata=md))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert details.startswith("NOAUTH")
    resp = gs.should_rate_limit(message, metadata=[("authorization", "Bearer s3cret")])
    assert resp["overall"] == OK
    assert gs.health() == 1
    # a changed password applies to the next call
    gs.client(password="s3cret").config_set("requirepass", "other")
    code, _ = error_of(lambda: gs.should_rate_limit(
        message, metadata=[("authorization", "Bearer s3cret")]))
    assert code == grpc.StatusCode.UNAUTHENTICATED


def basic(user: str, password: str) -> list[tuple[str, str]]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return [("authorization", f"Basic {token}")]


def test_acl_users_call_with_basic_auth_and_count_only_the_domains_their_keys_allow(
        make_grpc_server):
    gs = make_grpc_server("--manual-clock", "--requirepass", "s3cret",
                          rls=RIG_YAML)
    admin = gs.client(password="s3cret")
    admin.execute_command("ACL", "SETUSER", "edge", "on", ">pw", "~rig*", "+@ratelimit")
    admin.execute_command("ACL", "SETUSER", "viewer", "on", ">pw", "allkeys", "+info")
    assert gs.should_rate_limit(request(b"rig", KEY), metadata=basic("edge", "pw"))["statuses"][
        0]["remaining"] == 2
    code, details = error_of(lambda: gs.should_rate_limit(request(b"rig", KEY),
                                                          metadata=basic("edge", "wrong")))
    assert (code, details.split()[0]) == (grpc.StatusCode.UNAUTHENTICATED, "NOAUTH")
    code, details = error_of(lambda: gs.should_rate_limit(request(b"other", KEY),
                                                          metadata=basic("edge", "pw")))
    assert (code, details) == (grpc.StatusCode.PERMISSION_DENIED, "NOPERM this user has no "
                               "permissions to access one of the keys used as arguments")
    code, details = error_of(lambda: gs.should_rate_limit(request(b"rig", KEY),
                                                          metadata=basic("viewer", "pw")))
    assert (code, details) == (grpc.StatusCode.PERMISSION_DENIED, "NOPERM this user has no "
                               "permissions to run the 'cl.limit' command")
    entries = admin.acl_log()
    assert [(e["username"], e["reason"], e["object"]) for e in entries[:2]] == [
        ("viewer", "command", "cl.limit"), ("edge", "key", "other")]
    # key=value pairs, as redis-py's parser reads a client's line
    assert entries[0]["client-info"]["front"] == "grpc"
    assert entries[0]["client-info"]["addr"].startswith("127.0.0.1:")
    # A user deleted, or its password changed, is refused from the next call.
    admin.execute_command("ACL", "DELUSER", "edge")
    code, _ = error_of(lambda: gs.should_rate_limit(request(b"rig", KEY),
                                                    metadata=basic("edge", "pw")))
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_a_default_password_set_by_acl_alone_is_needed_by_grpc_calls_too(make_grpc_server):
    gs = make_grpc_server("--manual-clock", rls=RIG_YAML)
    assert gs.should_rate_limit(request(b"rig", KEY))["overall"] == OK     # no password yet
    gs.client().execute_command("ACL", "SETUSER", "default", ">pw")
    code, _ = error_of(lambda: gs.should_rate_limit(request(b"rig", KEY)))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert gs.should_rate_limit(request(b"rig", KEY), metadata=basic("", "pw"))[
        "overall"] == OK
    assert gs.should_rate_limit(request(b"rig", KEY), metadata=[
        ("authorization", "Bearer pw")])["overall"] == OK
