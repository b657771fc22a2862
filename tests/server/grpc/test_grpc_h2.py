"""The gRPC front's HTTP/2 against bad and greedy clients: each gets a
GOAWAY, a reset or a gRPC error; memory stays bounded; other connections
(and the RESP port) never notice."""

from __future__ import annotations

import signal
import socket

import h2.events
import pytest
from grpcserver import RIG_YAML
from h2client import PREFACE, RawH2, frame, goaway_code, read_frames, read_until, request_block
from rls_messages import HEALTH_PATH, OK, RLS_PATH, descriptor, grpc_frame, request
from wire import wait_until

KEY = descriptor([(b"api_key", b"alice")])
CALL = grpc_frame(request(b"rig", KEY))
INTERNAL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM = 2, 6, 7


@pytest.fixture
def srv(make_grpc_server):
    """The stand-in decision; a deadline no slow test machine reaches
    between a test's writes (the tests of the deadline set their own)."""
    return make_grpc_server("--manual-clock", "--grpc-deadline-ms", "5000",
                            rls=RIG_YAML)


def others_still_served(srv) -> None:
    assert srv.should_rate_limit(request(b"rig", KEY))["overall"] == OK
    assert srv.client().ping()


def test_many_calls_in_one_write_are_all_answered(srv):
    h = RawH2(srv.grpc_port)
    sids = h.calls_in_one_write(RLS_PATH, CALL, 50)
    assert all(h.ended(sid)[b"grpc-status"] == b"0" for sid in sids)
    assert srv.info()["grpc_total_calls"] == 50


def test_a_garbage_preface_gets_closed_and_counted(srv):
    s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    read_frames(s)          # the server closes
    s.close()
    assert srv.info()["grpc_protocol_errors"] == 1
    others_still_served(srv)


def test_an_oversized_frame_gets_goaway_frame_size_error(srv):
    s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    s.sendall(PREFACE + frame(4, 0, 0, b"") + frame(0, 0, 1, b"x" * 100, length=1 << 20))
    assert goaway_code(read_frames(s)) == FRAME_SIZE_ERROR
    s.close()
    others_still_served(srv)


def test_streams_past_max_concurrent_streams_are_refused(make_grpc_server):
    srv = make_grpc_server("--grpc-max-concurrent-streams", "4", "--grpc-deadline-ms", "0")
    s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    # a client that ignores the server's SETTINGS: six calls at once
    s.sendall(PREFACE + frame(4, 0, 0, b"")
              + b"".join(frame(1, 0x4, sid, request_block(RLS_PATH))
                         for sid in (1, 3, 5, 7, 9, 11)))
    frames = read_until(s, lambda fs: sum(t == 3 for t, _, _ in fs) == 2)
    resets = {sid: int.from_bytes(p, "big") for t, sid, p in frames if t == 3}
    assert resets == {9: REFUSED_STREAM, 11: REFUSED_STREAM}
    s.sendall(frame(0, 0x1, 1, CALL))
    # the response's HEADERS, then its trailers
    read_until(s, lambda fs: sum(t == 1 and sid == 1 for t, sid, _ in fs) == 2)
    s.close()
    others_still_served(srv)


def test_a_call_whose_request_never_comes_fails_fast_with_unavailable(gs):
    srv = gs                                 # grpc-deadline-ms 15
    h = RawH2(srv.grpc_port)
    sid = h.start(RLS_PATH)
    h.send(sid, CALL[:7], end=False)         # and never the rest
    ended = h.ended(sid)                     # after grpc-deadline-ms (15)
    assert ended[b"grpc-status"] == b"14"
    assert b"grpc-deadline-ms" in ended[b"grpc-message"]
    wait_until(lambda: srv.info()["mem_grpc"] < 64 * 1024, what="the stream freed")


def test_the_clients_grpc_timeout_bounds_a_call_too(make_grpc_server):
    srv = make_grpc_server("--grpc-deadline-ms", "0")
    h = RawH2(srv.grpc_port)
    sid = h.start(RLS_PATH, extra=[(b"grpc-timeout", b"30m")])
    assert h.ended(sid)[b"grpc-status"] == b"4"


def test_a_call_past_its_grpc_timeout_is_never_answered_late(srv):
    # 1 ns: spent before the call can be answered, whatever the machine
    h = RawH2(srv.grpc_port)
    sid = h.start(RLS_PATH, extra=[(b"grpc-timeout", b"1n")])
    h.send(sid, CALL)
    assert h.ended(sid)[b"grpc-status"] == b"4"


def test_an_hpack_bomb_resets_its_stream_and_the_connection_serves_on(srv):
    h = RawH2(srv.grpc_port)
    big = b"v" * 4000              # indexed once, then referenced: 40 kB of headers
    sid = h.start(RLS_PATH, extra=[(b"x-bomb", big)] * 10, end=True)
    assert h.ended(sid) == {"reset": 2}
    sid = h.start(RLS_PATH)
    h.send(sid, CALL)
    assert h.ended(sid)[b"grpc-status"] == b"0"


def test_an_oversized_message_is_resource_exhausted(srv):
    h = RawH2(srv.grpc_port)
    sid = h.start(RLS_PATH)
    body = grpc_frame(b"\x0a\x00" * (600 * 1024))          # 1.2 MB
    sent = 0
    while sent < len(body) and not h.closed:
        window = min(h.conn.local_flow_control_window(sid), h.conn.max_outbound_frame_size)
        if window <= 0:
            seen = len(h.events)
            h.wait(lambda ev, seen=seen: len(ev) > seen)
            if any(isinstance(e, h2.events.StreamEnded) for e in h.events):
                break
            continue
        h.conn.send_data(sid, body[sent:sent + window])
        h.flush()
        sent += window
    ended = h.ended(sid)
    assert ended[b"grpc-status"] == b"8"
    others_still_served(srv)


def test_rst_stream_mid_call_frees_the_call(srv):
    h = RawH2(srv.grpc_port)
    sid = h.start(RLS_PATH)
    h.send(sid, CALL[:10] * 1000, end=False)
    h.conn.reset_stream(sid)
    h.flush()
    sid = h.start(HEALTH_PATH)
    h.send(sid, grpc_frame(b""))
    assert h.ended(sid)[b"grpc-status"] == b"0"
    assert srv.info()["mem_grpc"] < 64 * 1024


def test_an_rst_stream_storm_gets_a_goaway(srv):
    s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    h = RawH2(srv.grpc_port)
    out = [PREFACE, frame(4, 0, 0, b"")]
    # HEADERS (:method POST, :path /, :scheme http, :authority from the static table)
    # then RST_STREAM CANCEL, 3000 times
    block = bytes([0x83, 0x84, 0x86, 0x41, 0x01, ord("t")])
    for i in range(3000):
        sid = 1 + 2 * i
        out.append(frame(1, 0x4, sid, block) + frame(3, 0, sid, (8).to_bytes(4, "big")))
    try:
        s.sendall(b"".join(out))
    except (BrokenPipeError, ConnectionResetError):
        pass
    # nghttp2's limit on incoming resets (CVE-2023-44487) ends it with INTERNAL_ERROR
    assert goaway_code(read_frames(s)) == INTERNAL_ERROR
    s.close()
    sid = h.start(RLS_PATH)
    h.send(sid, CALL)
    assert h.ended(sid)[b"grpc-status"] == b"0"


@pytest.mark.serial
def test_a_client_that_never_reads_holds_bounded_memory_and_others_are_served(srv):
    s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(PREFACE + frame(4, 0, 0, b""))
    s.settimeout(0.5)
    sid = 1
    try:
        for _ in range(400):              # 20,000 health checks, never a byte read
            batch = []
            for _ in range(50):
                batch.append(frame(1, 0x4, sid, request_block(HEALTH_PATH))
                             + frame(0, 0x1, sid, grpc_frame(b"")))
                sid += 2
            s.sendall(b"".join(batch))
    except TimeoutError:
        pass                              # the server stopped reading: it pushes back
    info = srv.info()
    assert info["grpc_total_calls"] < 20000          # not all answered into a buffer
    assert info["mem_grpc"] < 1024 * 1024
    others_still_served(srv)
    s.close()
    wait_until(lambda: srv.info()["grpc_connected_clients"] <= 1, what="the reader gone")


def test_shutdown_says_not_serving_then_goaway(make_grpc_server):
    srv = make_grpc_server("--grpc-deadline-ms", "0")
    h = RawH2(srv.grpc_port)
    pending = h.start(RLS_PATH)          # a call whose request is still coming
    h.wait(lambda ev: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in ev))
    srv.proc.send_signal(signal.SIGTERM)
    h.wait(lambda ev: any(isinstance(e, h2.events.ConnectionTerminated) for e in ev))
    notice = next(e for e in h.events if isinstance(e, h2.events.ConnectionTerminated))
    assert notice.error_code == 0 and notice.last_stream_id == 2**31 - 1
    # h2 takes the notice as the end; a new stream is still what the server takes
    sid = pending + 2
    h.sock.sendall(frame(1, 0x4, sid, request_block(HEALTH_PATH))
                   + frame(0, 0x1, sid, grpc_frame(b"")))
    frames = read_frames(h.sock)
    data = [p for t, s, p in frames if t == 0 and s == sid]
    assert data and data[0][5:] == b"\x08\x02"            # NOT_SERVING
    goaways = [p for t, _, p in frames if t == 7]
    assert int.from_bytes(goaways[-1][:4], "big") == sid  # the last GOAWAY
    assert srv.proc.wait(10) == 0


def test_connections_past_maxclients_get_goaway_with_nothing_processed(make_grpc_server):
    srv = make_grpc_server("--maxclients", "2", "--grpc-deadline-ms", "0")   # no deadline
    first = RawH2(srv.grpc_port)
    first.wait(lambda ev: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in ev))
    resp = srv.connect()        # one budget for every front: a RESP client fills it
    resp.sendall(b"PING\r\n")    # answered, so admitted before the gRPC one arrives
    assert resp.recv(64) == b"+PONG\r\n"
    s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    s.sendall(PREFACE + frame(4, 0, 0, b""))
    goaways = [p for t, _, p in read_frames(s) if t == 7]
    assert goaways and goaways[0][:8] == bytes(8)     # last stream 0, NO_ERROR
    assert b"too many connections" in goaways[0]
    sid = first.start(HEALTH_PATH)
    first.send(sid, grpc_frame(b""))
    assert first.ended(sid)[b"grpc-status"] == b"0"
    resp.close()
    assert wait_until(lambda: srv.info()["grpc_rejected_connections"] == 1)


@pytest.mark.parametrize("sent", [b"", PREFACE], ids=["nothing", "the magic alone"])
def test_a_client_that_never_sends_its_preface_is_closed_after_the_header_timeout(
        make_grpc_server, sent):
    """Real time is the point: the bound is http-header-timeout."""
    srv = make_grpc_server("--http-header-timeout", "0.3")
    s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    s.sendall(sent)
    read_frames(s, timeout=5)       # the server's SETTINGS, then it closes
    s.close()
    assert srv.info()["grpc_greeting_timeouts"] == 1
    others_still_served_by(srv)


def test_an_idle_connection_that_greeted_stays_open(make_grpc_server):
    """Envoy keeps one quiet connection per worker for hours."""
    # a second to read the greeting even on a traced, busy server; silence
    # well past it
    srv = make_grpc_server("--http-header-timeout", "1", "--grpc-deadline-ms", "5000")
    h = RawH2(srv.grpc_port)
    h.sock.settimeout(2.5)
    with pytest.raises(TimeoutError):
        while h.sock.recv(65536):    # the server's SETTINGS and ACK, then silence
            pass
    sid = h.start(HEALTH_PATH)
    h.conn.send_data(sid, grpc_frame(b""), end_stream=True)
    h.flush()
    h.sock.settimeout(10)
    assert h.ended(sid)[b"grpc-status"] == b"0"
    assert srv.info()["grpc_greeting_timeouts"] == 0


def others_still_served_by(srv) -> None:
    assert srv.health() == 1
    assert srv.client().ping()
