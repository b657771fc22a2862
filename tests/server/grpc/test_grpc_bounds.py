"""The gRPC front's bounds on work and memory: descriptors per call, the
calls one connection has answered per event-loop turn, the request bodies
and replies an answered call holds, and how long each phase of a
connection may wait on its client."""

from __future__ import annotations

import socket

import grpc
import h2.events
import h2.settings
from h2client import RawH2
from rls_messages import OK, RLS_PATH, descriptor, error_of, grpc_frame, request

KEY = descriptor([(b"api_key", b"alice")])


def many(n: int, entries: int = 1) -> bytes:
    return request(b"rig", *[descriptor([(b"k%d" % j, b"v%d" % i) for j in range(entries)])
                             for i in range(n)])


def test_a_call_past_grpc_max_descriptors_is_resource_exhausted_and_one_at_it_is_answered(
        make_grpc_server):
    srv = make_grpc_server()
    assert len(srv.should_rate_limit(many(256))["statuses"]) == 256      # the default
    assert error_of(lambda: srv.call(RLS_PATH, many(257))) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "the request has more descriptors than grpc-max-descriptors (256)")
    srv.client().config_set("grpc-max-descriptors", "2")
    assert error_of(lambda: srv.call(RLS_PATH, many(3)))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert srv.should_rate_limit(many(2))["overall"] == OK
    assert srv.client().config_get("grpc-max-descriptors") == {"grpc-max-descriptors": "2"}


def test_a_descriptor_with_too_many_entries_is_resource_exhausted(make_grpc_server):
    srv = make_grpc_server()
    assert srv.should_rate_limit(many(1, entries=32))["overall"] == OK
    assert error_of(lambda: srv.call(RLS_PATH, many(1, entries=33))) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "a descriptor has more than 32 entries")


def test_large_calls_in_one_read_are_answered_over_several_turns(make_grpc_server):
    """A turn answers at most 256 descriptors of one connection (and at
    least one call): eight calls at the bound, sent in one write, leave
    calls for later turns, and every one is answered."""
    srv = make_grpc_server("--grpc-deadline-ms", "0")
    h = RawH2(srv.grpc_port)
    sids = h.calls_in_one_write(RLS_PATH, grpc_frame(many(256)), 8)   # 8 x 3 kB
    assert all(h.ended(sid)[b"grpc-status"] == b"0" for sid in sids)
    info = srv.info()
    assert info["grpc_total_calls"] == 8
    assert info["grpc_deferred_calls"] >= 1
    assert srv.client().ping()
    assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in h.events)


# ---- what an answered call holds while its client does not take the answer -------------

# 60 kB of request answered with a few bytes (no rls layer: every descriptor OK)
BIG = grpc_frame(request(b"d" * 60_000, KEY))
ENHANCE_YOUR_CALM = 11


def greeted(h: RawH2) -> RawH2:
    h.wait(lambda ev: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in ev))
    return h


def goaway_of(h: RawH2):
    h.wait(lambda ev: any(isinstance(e, h2.events.ConnectionTerminated) for e in ev))
    return next(e for e in h.events if isinstance(e, h2.events.ConnectionTerminated))


def test_answered_calls_free_their_requests_while_the_clients_window_is_shut(make_grpc_server):
    srv = make_grpc_server("--grpc-deadline-ms", "0")
    h = greeted(RawH2(srv.grpc_port, window=0))
    baseline = srv.info()["mem_grpc"]
    sids = [h.call(RLS_PATH, BIG) for _ in range(10)]
    h.wait(lambda ev: all(h.answered(sid) for sid in sids))
    # the ten answers wait on the window; the 600 kB they answer are gone
    assert srv.info()["mem_grpc"] - baseline < 10 * 2048
    h.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
    h.flush()
    assert all(h.ended(sid)[b"grpc-status"] == b"0" for sid in sids)
    assert srv.info()["mem_grpc"] - baseline < 2048         # the streams are gone too


def test_a_client_whose_window_stays_shut_is_closed_after_the_header_timeout(make_grpc_server):
    """Real time is the point: the bound is http-header-timeout."""
    srv = make_grpc_server("--grpc-deadline-ms", "0", "--http-header-timeout", "1")
    other = greeted(RawH2(srv.grpc_port))
    h = greeted(RawH2(srv.grpc_port, window=0))
    sid = h.call(RLS_PATH, BIG)
    h.wait(lambda ev: h.answered(sid))
    assert goaway_of(h).error_code == ENHANCE_YOUR_CALM
    info = srv.info()
    assert info["grpc_stall_timeouts"] == 1 and info["grpc_connected_clients"] == 1
    assert other.ended(other.call(RLS_PATH, BIG))[b"grpc-status"] == b"0"
    assert "answers not taken within http-header-timeout" in srv.log()


def test_a_client_past_the_output_limit_is_closed_and_others_are_not(make_grpc_server):
    srv = make_grpc_server("--grpc-deadline-ms", "0",
                           "--client-output-buffer-limit", "normal", "4kb", "0", "0")
    other = greeted(RawH2(srv.grpc_port))
    h = greeted(RawH2(srv.grpc_port, window=0))
    answer_of_1kb = grpc_frame(many(256))
    for _ in range(8):
        if any(isinstance(e, h2.events.ConnectionTerminated) for e in h.events):
            break
        h.call(RLS_PATH, answer_of_1kb)
    assert goaway_of(h).error_code == ENHANCE_YOUR_CALM
    assert srv.info()["grpc_output_limit_disconnections"] == 1
    assert other.ended(other.call(RLS_PATH, answer_of_1kb))[b"grpc-status"] == b"0"
    assert srv.client().ping()


# ---- every phase of a connection that waits on the client has a timeout ------------------

def test_a_request_that_never_ends_fails_after_the_header_timeout(make_grpc_server):
    """With no grpc-deadline-ms and no grpc-timeout, http-header-timeout
    still bounds a request's body (real time: that is the bound)."""
    srv = make_grpc_server("--grpc-deadline-ms", "0", "--http-header-timeout", "1")
    h = greeted(RawH2(srv.grpc_port))
    baseline = srv.info()["mem_grpc"]
    sid = h.start(RLS_PATH)
    h.send(sid, BIG[:16_000], end=False)          # and never the rest
    ended = h.ended(sid)
    assert ended[b"grpc-status"] == b"14"
    assert ended[b"grpc-message"] == b"the request did not end within http-header-timeout"
    info = srv.info()
    assert info["grpc_request_timeouts"] == 1
    assert info["mem_grpc"] - baseline < 2048
    # the connection serves on: a call in one write, whole within the timeout
    # (BIG would wait for the window the first one spent)
    assert h.ended(h.call(RLS_PATH, grpc_frame(request(b"rig", KEY))))[b"grpc-status"] == b"0"


def test_a_silent_client_on_a_tls_grpc_port_is_closed_after_the_header_timeout(
        make_grpc_server, tmp_path):
    from certs import make_certs
    certs = make_certs(str(tmp_path))
    srv = make_grpc_server("--tls-grpc", "yes", "--tls-cert-file", certs.server.cert,
                           "--tls-key-file", certs.server.key, "--tls-ca-cert-file", certs.ca,
                           "--http-header-timeout", "0.3")
    with socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10) as raw:
        assert raw.recv(64) == b""     # closed by the server, well before our timeout
    assert srv.client().ping()
