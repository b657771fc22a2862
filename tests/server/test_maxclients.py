"""maxclients is one budget for every front (RESP, HTTP, gRPC and TLS
connections in their handshake), fitted at start to the open file limit
as Redis fits it, and refused in each front's words when reached."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
import redis
from certs import make_certs
from servers import ServerProcess, started_servers
from wire import free_port, wait_until

H2_GREETING = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\x04\0\0\0\0\0"   # preface, SETTINGS
GOAWAY = 7
MAX_CLIENTS_REPLY = b"-ERR max number of clients reached\r\n"
NOFILE = 64           # Redis keeps 32 of them: maxclients 32


class FrontsServer(ServerProcess):
    """With its HTTP and gRPC fronts on free ports (a taken one is retried
    by the kernel's pick: port 0 follows)."""

    DEFAULTS = {**ServerProcess.DEFAULTS, "--http-port": "", "--grpc-port": ""}

    def stats(self) -> dict:
        with self.client() as c:     # closed: it would hold a place of maxclients
            return c.info("everything")


class LimitedServer(FrontsServer):
    prefix = ["prlimit", f"--nofile={NOFILE}:{NOFILE}"]


@pytest.fixture
def make_fronts():
    with started_servers(FrontsServer) as make:
        yield make


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def reply(sock: socket.socket) -> bytes:
    """What the server sends before it closes."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def frame_types(data: bytes) -> list[int]:
    types = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        types.append(data[3])
        data = data[9 + length:]
    return types


def held_resp(port: int) -> socket.socket:
    """A RESP connection, answered once (so admitted) and left open."""
    s = connect(port)
    s.sendall(b"PING\r\n")
    assert s.recv(100) == b"+PONG\r\n"
    return s


def held_http(port: int) -> socket.socket:
    """An HTTP keep-alive connection, answered once and left open."""
    s = connect(port)
    s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(1000).startswith(b"HTTP/1.1 200")
    return s


def held_grpc(port: int) -> socket.socket:
    """A gRPC connection that greeted and idles, as Envoy's do."""
    s = connect(port)
    s.sendall(H2_GREETING)
    s.recv(1000)
    return s


def start_redis(*prefix: str, args=()) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([*prefix, "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: _answers(port), 20, "redis-server")
    return proc, port


def _answers(port: int) -> bool:
    try:
        return redis.Redis(port=port).ping()
    except redis.ConnectionError:
        return False


def stop_redis(proc: subprocess.Popen) -> str:
    proc.terminate()
    return proc.communicate(timeout=10)[0]


def test_maxclients_is_fitted_to_the_open_file_limit_as_redis_fits_it():
    proc, port = start_redis("prlimit", f"--nofile={NOFILE}:{NOFILE}")
    try:
        r = redis.Redis(port=port)
        expected = r.config_get("maxclients")
        with pytest.raises(redis.ResponseError) as redis_refusal:
            r.config_set("maxclients", "1000")
    finally:
        redis_log = stop_redis(proc)
    with LimitedServer() as srv:
        c = srv.client()
        # 32 where the hard limit cannot be raised (no CAP_SYS_RESOURCE): the same as Redis
        assert c.config_get("maxclients") == expected
        with pytest.raises(redis.ResponseError) as refusal:
            c.config_set("maxclients", "1000")
        assert str(refusal.value) == str(redis_refusal.value)
        c.config_set("maxclients", "10")           # lower is always possible
        log = srv.log()
    line = (f"Current maximum open files is {NOFILE}. maxclients has been reduced to "
            f"{expected['maxclients']} to compensate for low ulimit. If you need higher "
            "maxclients increase 'ulimit -n'.")
    assert (line in redis_log) == (line in log) == (expected == {"maxclients": "32"})


def test_one_budget_counts_every_front_and_each_refuses_in_its_words(make_fronts, redis_server):
    srv = make_fronts("--maxclients", "3")
    stats = srv.stats()
    held = [held_resp(srv.port), held_http(stats["http_port"]), held_grpc(stats["grpc_port"])]
    with connect(srv.port) as s:
        fastlimit_refusal = reply(s)
    rs = redis_server.client()
    rs.config_set("maxclients", "1")
    try:
        with connect(redis_server.port) as s:
            redis_refusal = reply(s)
    finally:
        rs.config_set("maxclients", "10000")
    assert fastlimit_refusal == redis_refusal == MAX_CLIENTS_REPLY
    with connect(stats["http_port"]) as s:      # answered at once, before any request
        assert reply(s).startswith(b"HTTP/1.1 503")
    with connect(stats["grpc_port"]) as s:
        assert GOAWAY in frame_types(reply(s))
    held.pop().close()
    wait_until(lambda: b"+PONG" in _ping(srv.port), 10, "a place freed by a closed gRPC client")
    for s in held:
        s.close()
    wait_until(lambda: srv.stats()["maxclients_in_use"] == 1, 10, "the places freed")
    info = srv.stats()
    assert (info["rejected_connections"], info["http_rejected_connections"],
            info["grpc_rejected_connections"]) >= (1, 1, 1)
    assert srv.log().count("maxclients (3) reached") == 1       # at most every 10 s


def _ping(port: int) -> bytes:
    with connect(port) as s:
        s.sendall(b"PING\r\n")
        return s.recv(100)


def test_tls_connections_count_from_their_accept_and_over_the_budget_get_no_handshake(
        make_fronts, tmp_path):
    certs = make_certs(str(tmp_path))
    tls_port = free_port()
    srv = make_fronts("--maxclients", "3", "--tls-port", str(tls_port), "--tls-cert-file",
                      certs.server.cert, "--tls-key-file", certs.server.key,
                      "--tls-ca-cert-file", certs.ca, "--http-header-timeout", "30")
    c = srv.client(single_connection_client=True)       # holds one place
    silent = [connect(tls_port), connect(tls_port)]      # TCP only, no ClientHello
    wait_until(lambda: c.info("clients")["tls_handshaking_clients"] == 2, 10, "two handshakes")
    assert c.info("clients")["maxclients_in_use"] == 3
    with connect(srv.port) as s:
        assert reply(s) == MAX_CLIENTS_REPLY
    started = time.monotonic()
    with connect(tls_port) as s:        # over the budget: closed at accept, no handshake
        assert reply(s) == b""
    assert time.monotonic() - started < 5
    for s in silent:
        s.close()
    wait_until(lambda: c.info("clients")["maxclients_in_use"] == 1, 10, "the handshakes ended")
    assert c.info("clients")["tls_handshaking_clients"] == 0
    c.close()
