"""The gRPC front's bounds on work and memory: descriptors per call, the
calls one connection has answered per event-loop turn, the request bodies
and replies an answered call holds, and how long each phase of a
connection may wait on its client."""

from __future__ import annotations

import grpc
import h2.events
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
    body = grpc_frame(many(256))
    sids = []
    for _ in range(8):                        # 8 x 3 kB: within the first window
        sid = h.conn.get_next_available_stream_id()
        h.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                  (b":path", RLS_PATH.encode()), (b":authority", b"t"),
                                  (b"content-type", b"application/grpc")])
        h.conn.send_data(sid, body, end_stream=True)
        sids.append(sid)
    h.flush()
    assert all(h.ended(sid)[b"grpc-status"] == b"0" for sid in sids)
    info = srv.info()
    assert info["grpc_total_calls"] == 8
    assert info["grpc_deferred_calls"] >= 1
    assert srv.client().ping()
    assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in h.events)
