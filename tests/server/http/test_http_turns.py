"""The HTTP front's bounds on what one client costs the others, against
real server processes over real sockets: a connection's turn of the
event loop is bounded (pipelined requests are answered a share at a
time, resumed where they stopped), a client that does not read gets no
more responses made and is closed, and every phase that waits on the
client has a timeout and its memory an owner (the body: a deadline in
all and between reads, and one bound over every connection's body)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from http_calls import TOKEN_BUCKET, post_bytes, set_rule
from wire import Wire, wait_until

LIVEZ = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"


def read_until(s: socket.socket, predicate, timeout: float = 10) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while not predicate(data) and time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def closed_by_server(s: socket.socket, timeout: float = 10) -> bytes:
    """What the server sent until it closed; AssertionError if it did not."""
    s.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return data
        except TimeoutError:
            raise AssertionError(f"still open after {timeout} s: {data[:200]!r}") from None
        if not chunk:
            return data
        data += chunk


# ---- turns ------------------------------------------------------------------------------

def test_pipelined_requests_past_a_turn_are_all_answered_in_order(hs):
    """Far more than one turn's 16 KB in one write, bodies holding blank
    lines and chunked ones among them: every response, in order."""
    r = hs.client()
    set_rule(r, "api", {**TOKEN_BUCKET, "capacity": 1000})
    spaced = b'{"client_key":"p",\r\n\r\n"resource":"api"}'
    chunked = (b"POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"%x\r\n%s\r\n0\r\n\r\n" % (len(spaced), spaced))
    one_round = post_bytes("/v1/check", spaced) + LIVEZ + chunked
    rounds = 150
    s = socket.create_connection(("127.0.0.1", hs.http_port), timeout=10)
    s.sendall(one_round * rounds)
    data = read_until(s, lambda d: d.count(b"HTTP/1.1 ") >= 3 * rounds)
    s.close()
    parts = data.split(b"HTTP/1.1 ")[1:]
    assert len(parts) == 3 * rounds
    assert all(p.startswith(b"200 OK") for p in parts)
    checks = [json.loads(p[p.index(b"{"):]) for i, p in enumerate(parts) if i % 3 != 1]
    assert [c["remaining"] for c in checks] == list(range(999, 999 - 2 * rounds, -1))
    assert all(p.endswith(b"ok\n") for p in parts[1::3])


def test_requests_after_a_connection_close_are_not_answered(hs):
    s = socket.create_connection(("127.0.0.1", hs.http_port), timeout=10)
    s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" + LIVEZ * 5)
    assert closed_by_server(s).count(b"HTTP/1.1 200 OK") == 1
    s.close()


class Prober(threading.Thread):
    """A well-behaved RESP client: one PING at a time, every round trip kept."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.latencies, self.stopped, self.failed = port, [], False, None

    def run(self):
        try:
            with Wire.to(self.port) as w:
                while not self.stopped and len(self.latencies) < 100_000:
                    t = time.perf_counter()
                    assert w.call("PING") == b"+PONG\r\n"
                    self.latencies.append(time.perf_counter() - t)
                    time.sleep(0.002)
        except Exception as e:    # reported by stop()
            self.failed = e

    def stop(self) -> list[float]:
        self.stopped = True
        self.join(10)
        assert self.failed is None, self.failed
        return self.latencies


def many_rules(r, count: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        pipe.execute_command("CL.RULE", "SET", f"r{i}", json.dumps(
            {"match": {"resource": f"GET /api/v1/thing{i}/*"}, "capacity": 5,
             "refill_per_second": 1}))
    assert all(reply == b"OK" for reply in pipe.execute())


@pytest.mark.untraced
def test_thousands_of_pipelined_metrics_never_read_cost_the_others_nothing(make_http_server):
    """The finding's shape: 3,000 GET /metrics of a server with 1,000 rules
    in one write, never read.  Responses are made only while the client
    takes them, so the server makes a few, holds little, closes the
    client after http-header-timeout, and the RESP prober is answered
    throughout."""
    hs = make_http_server("--http-header-timeout", "3")
    r = hs.client()
    many_rules(r, 1000)
    rss = hs.rss_bytes()
    prober = Prober(hs.port)
    prober.start()
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect(("127.0.0.1", hs.http_port))
    hog.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 3000)
    wait_until(lambda: r.info("stats")["http_total_requests"] > 0, what="the first /metrics")
    wait_until(lambda: r.info("clients")["http_connected_clients"] == 0, timeout=20,
               what="the server to close the client that does not read")
    latencies = prober.stop()
    answered = r.info("stats")["http_total_requests"]
    grown = hs.rss_bytes() - rss
    print(f"{answered} of 3000 /metrics read; RSS +{grown >> 20} MB; "
          f"PING n={len(latencies)} max={max(latencies) * 1e3:.1f} ms")
    assert answered < 100                 # made only while the client took them
    assert grown < 64 * 1024 * 1024       # 1.2 GB when every response was made at once
    assert len(latencies) > 100 and max(latencies) < 1.0   # 7.9 s when one turn did it all
    assert "has not read its responses" in hs.log()
    assert hs.request("GET", "/livez")[0] == 200
    hog.close()


def test_a_client_past_the_output_hard_limit_is_dropped(make_http_server):
    """Below the transport's 64 KB high-water mark, so the limit is passed
    whatever the kernel's buffers took."""
    hs = make_http_server("--client-output-buffer-limit", "normal", "32kb", "0", "0")
    r = hs.client()
    many_rules(r, 1000)          # a /metrics response of 200 KB
    hog = socket.socket()
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hog.connect(("127.0.0.1", hs.http_port))
    hog.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
    wait_until(lambda: r.info("stats")["http_total_requests"] > 0, what="the first /metrics")
    wait_until(lambda: r.info("clients")["http_connected_clients"] == 0, timeout=10,
               what="the client past the hard limit to be dropped")
    assert "over the hard limit" in hs.log()
    hog.close()


# ---- the body: timeouts and one memory bound --------------------------------------------------

def partial_body(port: int, declared: int, sent: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
              % (declared, sent))
    return s


def test_a_body_that_stops_coming_gets_408_and_frees_its_slot(make_http_server):
    hs = make_http_server("--manual-clock", "--maxclients", "4", "--http-header-timeout", "0.5")
    stalled = [partial_body(hs.http_port, 1000, b'{"client_key":') for _ in range(4)]
    for s in stalled:
        reply = closed_by_server(s)
        assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert b"within http-header-timeout" in reply
        s.close()
    assert hs.request("GET", "/livez")[0] == 200     # the slots are free again


def test_a_trickled_body_gets_408_at_the_body_timeout(make_http_server):
    # a read due within 2 s, a byte every 0.3 s: a stall of either process
    # short of 1.7 s does not turn this into the other 408
    hs = make_http_server("--manual-clock", "--http-header-timeout", "2",
                          "--http-body-timeout", "4")
    s = partial_body(hs.http_port, 1000, b"{")
    started = time.monotonic()
    s.settimeout(0.3)
    reply = b""
    while time.monotonic() - started < 20:      # a byte every 0.3 s: never idle for 2 s
        try:
            s.sendall(b" ")
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        if not chunk:
            break
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert b"did not arrive within http-body-timeout" in reply
    assert 3.5 < time.monotonic() - started < 16
    s.close()


def test_bodies_being_read_share_one_memory_bound_shown_in_info(make_http_server):
    hs = make_http_server("--manual-clock", "--http-body-memory", "1mb")
    r = hs.client()
    held = [partial_body(hs.http_port, 1024 * 1024, b" " * 400_000) for _ in range(2)]
    wait_until(lambda: r.info("memory")["mem_http_bodies"] == 800_000,
               what="both bodies to be read")
    third = partial_body(hs.http_port, 1024 * 1024, b" " * 400_000)
    reply = closed_by_server(third)
    assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"http-body-memory" in reply
    assert r.info("memory")["mem_http_bodies"] == 800_000
    for s in held:
        s.close()
    wait_until(lambda: r.info("memory")["mem_http_bodies"] == 0, what="the bodies to be freed")
    assert hs.post("/v1/check/bucket", {"key": "k", "capacity": 5,
                                        "refill_per_sec": 1})[0] == 200
