"""A raw HTTP/2 client for the gRPC front's framing tests: python-hyper's
h2 state machine over a blocking socket (every read has a deadline), and
frames by hand for what h2 would refuse to send."""

from __future__ import annotations

import socket
import struct
import time

import h2.config
import h2.connection
import h2.events
import h2.settings

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GOAWAY = 7


class RawH2:
    def __init__(self, port: int, timeout: float = 10, window: int | None = None):
        """window: the SETTINGS_INITIAL_WINDOW_SIZE this client advertises
        (0: the server may send no DATA)."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None))
        if window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.conn.initiate_connection()
        self.flush()
        self.events: list = []
        self.closed = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def start(self, path: str, *, end: bool = False, extra=()) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                     (b":path", path.encode()), (b":authority", b"test"),
                                     (b"content-type", b"application/grpc"),
                                     (b"te", b"trailers"), *extra], end_stream=end)
        self.flush()
        return sid

    def calls_in_one_write(self, path: str, body: bytes, n: int) -> list[int]:
        """n whole calls sent with one write (within the server's windows);
        their stream ids."""
        sids = []
        for _ in range(n):
            sid = self.conn.get_next_available_stream_id()
            self.conn.send_headers(sid, [(b":method", b"POST"), (b":scheme", b"http"),
                                         (b":path", path.encode()), (b":authority", b"t"),
                                         (b"content-type", b"application/grpc")])
            self.conn.send_data(sid, body, end_stream=True)
            sids.append(sid)
        self.flush()
        return sids

    def send(self, sid: int, body: bytes, end: bool = True) -> None:
        self.conn.send_data(sid, body, end_stream=end)
        self.flush()

    def send_all(self, sid: int, body: bytes) -> None:
        """body as DATA ending the stream, as the server's windows let it
        through (waiting for its WINDOW_UPDATEs)."""
        sent = 0
        while True:
            room = min(self.conn.local_flow_control_window(sid),
                       self.conn.max_outbound_frame_size, len(body) - sent)
            if room <= 0 and sent < len(body):
                seen = len(self.events)
                self.wait(lambda ev, seen=seen: len(ev) > seen)
                continue
            last = sent + room == len(body)
            self.conn.send_data(sid, body[sent:sent + room], end_stream=last)
            self.flush()
            sent += room
            if last:
                return

    def call(self, path: str, body: bytes) -> int:
        """A whole call (HEADERS, then its DATA as windows let it)."""
        sid = self.start(path)
        self.send_all(sid, body)
        return sid

    def answered(self, sid: int) -> bool:
        """Whether the response's HEADERS for sid came."""
        return any(isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid
                   for e in self.events)

    def wait(self, predicate, timeout: float = 10):
        """Reads until predicate(events) holds, the server closes, or the
        deadline (AssertionError); returns the events so far."""
        deadline = time.monotonic() + timeout
        while not predicate(self.events):
            if self.closed:
                raise AssertionError(f"closed before the condition: {self.events}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting: {self.events}")
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                self.closed = True
                continue
            self.events += self.conn.receive_data(data)
            self.flush()
        return self.events

    def ended(self, sid: int):
        """The headers (trailers-only) or trailers that ended stream sid."""
        def done(events):
            return any(isinstance(e, h2.events.StreamEnded | h2.events.StreamReset)
                       and e.stream_id == sid for e in events)
        self.wait(done)
        if not any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid
                   for e in self.events):
            return {"reset": next(e.error_code for e in self.events
                                  if isinstance(e, h2.events.StreamReset) and e.stream_id == sid)}
        blocks = [dict(e.headers) for e in self.events
                  if isinstance(e, h2.events.ResponseReceived | h2.events.TrailersReceived)
                  and e.stream_id == sid]
        return blocks[-1]

    def close(self) -> None:
        self.sock.close()


def frame(frame_type: int, flags: int, sid: int, payload: bytes, length=None) -> bytes:
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([frame_type, flags]) + struct.pack(">I", sid) + payload


def request_block(path: str) -> bytes:
    """A request's header block by hand (HPACK, no Huffman): POST, http,
    :authority t, :path, content-type application/grpc."""
    return (bytes([0x83, 0x86, 0x41, 0x01, ord("t"), 0x04, len(path)]) + path.encode()
            + bytes([0x5F, 16]) + b"application/grpc")


def parse_frames(data: bytes) -> list[tuple[int, int, bytes]]:
    frames, i = [], 0
    while i + 9 <= len(data):
        n = int.from_bytes(data[i:i + 3], "big")
        frames.append((data[i + 3], int.from_bytes(data[i + 5:i + 9], "big") & 0x7FFFFFFF,
                       data[i + 9:i + 9 + n]))
        i += 9 + n
    return frames


def read_until(sock: socket.socket, predicate, timeout: float = 10):
    """The frames read until predicate(frames) holds (AssertionError at
    the deadline or if the server closes first)."""
    deadline = time.monotonic() + timeout
    data = b""
    while not predicate(parse_frames(data)):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {parse_frames(data)}")
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            raise AssertionError(f"closed: {parse_frames(data)}")
        data += chunk
    return parse_frames(data)


def read_frames(sock: socket.socket, timeout: float = 10) -> list[tuple[int, int, bytes]]:
    """(type, stream id, payload) of every frame until the server closes."""
    deadline = time.monotonic() + timeout
    data = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    else:
        raise AssertionError("the server did not close the connection")
    return parse_frames(data)


def goaway_code(frames) -> int | None:
    for frame_type, _, payload in frames:
        if frame_type == GOAWAY:
            return int.from_bytes(payload[4:8], "big")
    return None
