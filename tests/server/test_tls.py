"""TLS: tls-port beside the plain port, with unmodified redis-cli,
redis-benchmark, redis-py and fastlimit.Client; refused handshakes
(counted, harmless to the others); certificate renewal by CONFIG SET and
SIGHUP with clients connected; a replica over TLS; HTTPS and gRPC over TLS.
The certificates are made at test time (certs.py)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading

import grpc
import pytest
import redis
from certs import Certs, make_certs
from servers import ExtraPortServer, started_servers
from wire import free_port, wait_until

import fastlimit

HEALTH_PATH = "/grpc.health.v1.Health/Check"
SERVING = b"\x08\x01"          # HealthCheckResponse{status: SERVING}


class TlsServer(ExtraPortServer):
    """A fastlimit-server child with --tls-port on a free port."""

    PORT_FLAG = "--tls-port"

    @property
    def tls_port(self) -> int:
        return self.extra_port

    def tls_client(self, certs: Certs, client=True, **kwargs) -> redis.Redis:
        """redis-py over TLS, checking the host name, with the client
        certificate unless client is False."""
        if client:
            kwargs.setdefault("ssl_certfile", certs.client.cert)
            kwargs.setdefault("ssl_keyfile", certs.client.key)
        kwargs.setdefault("ssl_ca_certs", certs.ca)
        return redis.Redis(host="127.0.0.1", port=self.tls_port, ssl=True,
                           socket_timeout=10, **kwargs)

    def stats(self) -> dict:
        return self.client().info("stats")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


def tls_args(certs: Certs, *extra: str) -> list[str]:
    return ["--tls-cert-file", certs.server.cert, "--tls-key-file", certs.server.key,
            "--tls-ca-cert-file", certs.ca, *extra]


@pytest.fixture
def make_tls():
    with started_servers(TlsServer) as make:
        yield make


@pytest.fixture
def ts(make_tls, certs) -> TlsServer:
    """On the manual clock: the tests count what reached a bucket, and
    real time would refill it while they run (the handshake timeout and
    certificates' dates are real time still)."""
    return make_tls(*tls_args(certs, "--manual-clock"))


def client_context(certs: Certs, pair=None, ca=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca or certs.ca)
    if pair is not None:
        ctx.load_cert_chain(pair.cert, pair.key)
    return ctx


def tls_socket(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                           server_hostname="127.0.0.1")


def ping(sock: ssl.SSLSocket) -> bytes:
    """PING, and the reply; b"" when the server closed the connection
    (how a refused client certificate shows under TLS 1.3: after the
    handshake, at the first read)."""
    try:
        sock.sendall(b"PING\r\n")
        return sock.recv(64)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return b""


# ---- clients ------------------------------------------------------------------------------

def test_plain_and_tls_ports_serve_the_same_buckets(ts, certs):
    plain, tls = ts.client(), ts.tls_client(certs)
    assert tls.execute_command("CL.CHECK", "shared", 3, 1)[2] == 2
    assert plain.execute_command("CL.CHECK", "shared", 3, 1)[2] == 1
    assert tls.execute_command("CL.CHECK", "shared", 3, 1)[2] == 0
    assert ts.stats()["tls_port"] == ts.tls_port
    assert ts.stats()["tls_handshake_failures"] == 0


def test_redis_py_without_a_client_certificate_under_tls_auth_clients_no_and_optional(
        make_tls, certs):
    for mode in ("no", "optional"):
        server = make_tls(*tls_args(certs, "--tls-auth-clients", mode))
        assert server.tls_client(certs, client=False).ping()
        if mode == "optional":      # one sent is still checked, and passes
            assert server.tls_client(certs).ping()


def test_unmodified_redis_cli_over_tls(ts, certs):
    cli = ["redis-cli", "--tls", "--cacert", certs.ca, "--cert", certs.client.cert,
           "--key", certs.client.key, "-h", "127.0.0.1", "-p", str(ts.tls_port)]
    out = subprocess.run([*cli, "CL.CHECK", "cli", "5", "1"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.split()[:2] == ["1", "5"], out
    url = f"rediss://127.0.0.1:{ts.tls_port}"
    out = subprocess.run(["redis-cli", "--cacert", certs.ca, "--cert", certs.client.cert,
                          "--key", certs.client.key, "-u", url, "PING"],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "PONG", out


def test_a_tls12_renegotiation_is_refused_and_others_are_served(ts, certs):
    """openssl s_client's "R" asks for a TLS 1.2 renegotiation (a
    handshake's CPU again, on the client's word): refused, as Redis
    refuses it, and the server serves on."""
    script = subprocess.Popen(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{ts.tls_port}", "-tls1_2",
         "-CAfile", certs.ca, "-cert", certs.client.cert, "-key", certs.client.key],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = script.communicate(b"R\n", timeout=30)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert b"RENEGOTIATING" in out and b"no renegotiation" in out, out[-2000:]
    assert ts.tls_client(certs).ping()


def test_unmodified_redis_benchmark_over_tls(ts, certs):
    out = subprocess.run(
        ["redis-benchmark", "--tls", "--cacert", certs.ca, "--cert", certs.client.cert,
         "--key", certs.client.key, "-h", "127.0.0.1", "-p", str(ts.tls_port),
         "-n", "2000", "-c", "4", "-P", "4", "-q", "CL.CHECK", "bench", "1000000", "1"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "requests per second" in out.stdout, out
    # every request reached the same bucket
    left = ts.client().execute_command("CL.CHECK", "bench", 1000000, 1, "COST", 0)[2]
    assert 1000000 - left >= 2000


def test_fastlimit_client_passes_ssl_to_redis_py(ts, certs):
    client = fastlimit.Client(f"127.0.0.1:{ts.tls_port}", timeout_ms=10_000, ssl=True,
                              ssl_ca_certs=certs.ca,
                              ssl_certfile=certs.client.cert, ssl_keyfile=certs.client.key)
    try:
        first = client.check("lib", 2, 1)
        assert first.allowed and first.remaining == 1
    finally:
        client.close()
    assert ts.client().execute_command("CL.CHECK", "lib", 2, 1)[2] == 0


def test_fastlimit_async_client_passes_ssl_to_redis_py(ts, certs):
    async def main():
        client = fastlimit.AsyncClient(f"127.0.0.1:{ts.tls_port}", timeout_ms=10_000, ssl=True,
                                       ssl_ca_certs=certs.ca, ssl_certfile=certs.client.cert,
                                       ssl_keyfile=certs.client.key)
        try:
            return [await client.check("alib", 3, 1) for _ in range(2)]
        finally:
            await client.aclose()
    first, second = asyncio.run(main())
    assert (first.remaining, second.remaining) == (2, 1)


def test_a_long_pipeline_over_tls_is_answered_in_full(ts, certs):
    pipe = ts.tls_client(certs).pipeline(transaction=False)
    for i in range(5000):
        pipe.execute_command("CL.CHECK", f"pipe:{i % 100}", 1000, 1)
    replies = pipe.execute()
    assert len(replies) == 5000 and all(r[0] == 1 for r in replies)


# ---- refused handshakes ---------------------------------------------------------------------

def test_refused_handshakes_are_counted_and_leave_other_clients_alone(ts, certs):
    bystander = tls_socket(ts.tls_port, client_context(certs, certs.client))
    assert ping(bystander) == b"+PONG\r\n"
    refused = [
        ("no client certificate", client_context(certs)),
        ("expired client certificate", client_context(certs, certs.expired_client)),
        ("client certificate from another CA", client_context(certs, certs.stranger_client)),
    ]
    for what, ctx in refused:
        with tls_socket(ts.tls_port, ctx) as sock:
            assert ping(sock) == b"", what
    # a client that does not trust the server's CA refuses it
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_socket(ts.tls_port, client_context(certs, certs.client, ca=certs.other_ca))
    # plain bytes on the TLS port
    with socket.create_connection(("127.0.0.1", ts.tls_port), timeout=10) as raw:
        raw.sendall(b"PING\r\n")
        assert raw.recv(64) == b""
    wait_until(lambda: ts.stats()["tls_handshake_failures"] == len(refused) + 2, 10,
               "the refused handshakes were not all counted")
    assert ping(bystander) == b"+PONG\r\n"
    bystander.close()
    assert ts.tls_client(certs).ping() and ts.client().ping()


def test_expired_server_certificate_is_refused_by_clients(make_tls, certs):
    server = make_tls("--tls-cert-file", certs.expired_server.cert,
                      "--tls-key-file", certs.expired_server.key,
                      "--tls-ca-cert-file", certs.ca)
    with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        tls_socket(server.tls_port, client_context(certs, certs.client))
    wait_until(lambda: server.stats()["tls_handshake_failures"] == 1, 10,
               "the refused handshake was not counted")


def test_a_silent_client_on_the_tls_port_is_closed_after_the_handshake_timeout(make_tls, certs):
    server = make_tls(*tls_args(certs, "--http-header-timeout", "2"))   # the ping's handshake too
    with socket.create_connection(("127.0.0.1", server.tls_port), timeout=10) as raw:
        assert raw.recv(64) == b""     # closed by the server, well before our timeout
    assert server.tls_client(certs).ping()


def test_config_reset_stat_clears_tls_handshake_failures(ts, certs):
    with tls_socket(ts.tls_port, client_context(certs)) as sock:
        ping(sock)
    wait_until(lambda: ts.stats()["tls_handshake_failures"] == 1, 10, "not counted")
    ts.client().config_resetstat()
    assert ts.stats()["tls_handshake_failures"] == 0


# ---- renewal --------------------------------------------------------------------------------

def peer_cert(port: int, certs: Certs) -> bytes:
    with tls_socket(port, client_context(certs, certs.client)) as sock:
        return sock.getpeercert(binary_form=True)


def der(path: str) -> bytes:
    with open(path) as f:
        return ssl.PEM_cert_to_DER_cert(f.read())


def test_config_set_renews_the_certificate_for_new_clients_and_keeps_open_ones(ts, certs):
    kept = ts.tls_client(certs)
    assert kept.execute_command("CL.CHECK", "renew", 5, 1)[2] == 4
    assert peer_cert(ts.tls_port, certs) == der(certs.server.cert)
    assert ts.client().config_set("tls-cert-file", certs.renewed.cert,
                                  "tls-key-file", certs.renewed.key)
    assert peer_cert(ts.tls_port, certs) == der(certs.renewed.cert)
    assert kept.execute_command("CL.CHECK", "renew", 5, 1)[2] == 3    # same connection
    assert kept.client_id() == kept.client_id()


def test_renewal_under_load_drops_no_connection_and_no_request(ts, certs):
    """One client keeps checking on its connection and another connects
    anew for each check, while the certificate changes ten times."""
    done, errors, counts = threading.Event(), [], {"kept": 0, "new": 0}

    def kept():
        c = ts.tls_client(certs)
        while not done.is_set() and counts["kept"] < 50_000:
            c.execute_command("CL.CHECK", "load", 10**9, 1)
            counts["kept"] += 1

    def fresh():
        while not done.is_set() and counts["new"] < 500:
            with ts.tls_client(certs) as c:
                c.execute_command("CL.CHECK", "load", 10**9, 1)
            counts["new"] += 1

    def guarded(work):
        try:
            work()
        except Exception as e:       # reported below, with what it was
            errors.append(repr(e))

    threads = [threading.Thread(target=guarded, args=(w,)) for w in (kept, fresh)]
    for th in threads:
        th.start()
    try:
        admin = ts.client()
        for i in range(10):
            pair = certs.renewed if i % 2 == 0 else certs.server
            admin.config_set("tls-cert-file", pair.cert, "tls-key-file", pair.key)
            seen = counts["kept"] + counts["new"]
            wait_until(lambda seen=seen: counts["kept"] + counts["new"] > seen + 20, 20,
                       "no progress")
    finally:
        done.set()
        for th in threads:
            th.join(30)
    assert errors == []
    assert ts.stats()["tls_handshake_failures"] == 0
    left = ts.client().execute_command("CL.CHECK", "load", 10**9, 1, "COST", 0)[2]
    assert 10**9 - left >= counts["kept"] + counts["new"]


def test_config_set_of_the_same_file_rereads_it(ts, certs, tmp_path):
    cert, key = tmp_path / "live.crt", tmp_path / "live.key"
    shutil.copy(certs.server.cert, cert)
    shutil.copy(certs.server.key, key)
    c = ts.client()
    c.config_set("tls-cert-file", str(cert), "tls-key-file", str(key))
    shutil.copy(certs.renewed.cert, cert)
    shutil.copy(certs.renewed.key, key)
    assert peer_cert(ts.tls_port, certs) == der(certs.server.cert)   # not yet read
    c.config_set("tls-cert-file", str(cert))
    assert peer_cert(ts.tls_port, certs) == der(certs.renewed.cert)


def test_a_certificate_that_cannot_be_used_keeps_the_old_one_with_redis_error(ts, certs):
    c = ts.client()
    for pairs in (("tls-cert-file", "/nonexistent.crt"),
                  ("tls-cert-file", certs.renewed.cert),        # not its key
                  ("tls-ca-cert-file", "/nonexistent-ca.pem"),
                  ("tls-ciphers", "NO-SUCH-CIPHER")):
        with pytest.raises(redis.ResponseError) as e:
            c.config_set(*pairs)
        assert str(e.value) == (f"CONFIG SET failed (possibly related to argument "
                                f"'{pairs[0]}') - Unable to update TLS configuration. "
                                f"Check server logs.")
    assert c.config_get("tls-cert-file")["tls-cert-file"] == certs.server.cert
    assert peer_cert(ts.tls_port, certs) == der(certs.server.cert)
    assert "Failed to load certificate: /nonexistent.crt" in ts.log()


def test_sighup_rereads_the_files(ts, certs, tmp_path):
    cert, key = tmp_path / "hup.crt", tmp_path / "hup.key"
    shutil.copy(certs.server.cert, cert)
    shutil.copy(certs.server.key, key)
    ts.client().config_set("tls-cert-file", str(cert), "tls-key-file", str(key))
    kept = ts.tls_client(certs)
    assert kept.ping()
    shutil.copy(certs.renewed.cert, cert)
    shutil.copy(certs.renewed.key, key)
    ts.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: peer_cert(ts.tls_port, certs) == der(certs.renewed.cert), 10,
               "SIGHUP did not renew the certificate")
    assert kept.ping()
    # a broken file on SIGHUP: the old certificate stays
    with open(cert, "w") as f:
        f.write("not a certificate")
    ts.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "not reloaded on SIGHUP" in ts.log(), 10, "no log line")
    assert peer_cert(ts.tls_port, certs) == der(certs.renewed.cert)


# ---- settings -------------------------------------------------------------------------------

def test_tls_settings_have_redis_names_defaults_and_checks(server):
    c = server.client()
    got = c.config_get("tls-*")
    assert {k: got[k] for k in ("tls-port", "tls-auth-clients", "tls-replication",
                                "tls-protocols", "tls-cert-file")} == {
        "tls-port": "0", "tls-auth-clients": "yes", "tls-replication": "no",
        "tls-protocols": "", "tls-cert-file": ""}
    with pytest.raises(redis.ResponseError,
                       match="argument\\(s\\) must be one of the following: no, yes, optional"):
        c.config_set("tls-auth-clients", "maybe")
    with pytest.raises(redis.ResponseError, match="Invalid tls-protocols specified"):
        c.config_set("tls-protocols", "TLSv9")
    with pytest.raises(redis.ResponseError, match="can't set immutable config"):
        c.config_set("tls-port", "1234")
    if not hasattr(ssl.SSLContext, "set_ciphersuites"):
        with pytest.raises(redis.ResponseError, match="cannot choose TLSv1.3 ciphersuites"):
            c.config_set("tls-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256")


@pytest.mark.parametrize("args, reason", [
    (["--tls-cert-file", "X"], "No tls-key-file configured!"),
    (["--tls-key-file", "X"], "No tls-cert-file configured!"),
    (["--tls-cert-file", "X", "--tls-key-file", "Y"],
     "Either tls-ca-cert-file or tls-ca-cert-dir must be specified when tls-cluster, "
     "tls-replication or tls-auth-clients are enabled!"),
])
def test_start_refused_with_redis_reasons(args, reason):
    server = TlsServer(*args)
    with pytest.raises(RuntimeError, match="exited early") as e:
        server.start()
    assert reason in str(e.value)
    assert "Failed to configure TLS. Check logs for more info." in str(e.value)
    assert "Traceback" not in str(e.value)


def test_an_encrypted_key_needs_tls_key_file_pass_and_never_prompts(make_tls, certs, tmp_path):
    from cryptography.hazmat.primitives import serialization
    with open(certs.server.key, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), None)
    locked = tmp_path / "locked.key"
    locked.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(b"open sesame")))
    base = ["--tls-cert-file", certs.server.cert, "--tls-key-file", str(locked),
            "--tls-ca-cert-file", certs.ca]
    server = make_tls(*base, "--tls-key-file-pass", "open sesame")
    assert server.tls_client(certs).ping()
    with pytest.raises(RuntimeError, match="Failed to load certificate"):
        TlsServer(*base).start()


def test_tls_protocols_bounds_the_versions(make_tls, certs):
    server = make_tls(*tls_args(certs, "--tls-protocols", "TLSv1.3"))
    ctx = client_context(certs, certs.client)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError):
        tls_socket(server.tls_port, ctx)
    assert tls_socket(server.tls_port, client_context(certs, certs.client)).version() == "TLSv1.3"


# ---- replication, HTTP, gRPC ------------------------------------------------------------------

def test_a_replica_syncs_over_tls_replication(make_tls, certs):
    primary = make_tls(*tls_args(certs, "--manual-clock"))
    replica = make_tls(*tls_args(certs, "--manual-clock", "--tls-replication", "yes",
                                 "--replicaof", "127.0.0.1", str(primary.tls_port)))
    p, r = primary.client(), replica.client()
    for c in (p, r):
        c.execute_command("DEBUG", "CLOCK", "SET", 1_000_000)
    for i in range(50):
        p.execute_command("CL.CHECK", f"repl:{i}", 10, 1, "COST", 3)
    wait_until(lambda: r.info("replication").get("master_link_status") == "up", 20,
               "the link over TLS never came up")
    wait_until(lambda: all(r.execute_command("CL.CHECK", f"repl:{i}", 10, 1, "COST", 0)[2] == 7
                           for i in range(50)), 20, "the replica never caught up")
    assert primary.stats()["tls_handshake_failures"] == 0


def test_region_links_over_tls_regions(make_tls, certs):
    """A global rule's spends cross between regions over TLS (tls-regions:
    the links dial the peers' tls-port); a link without it is refused."""
    region = ["--manual-clock", "--regions", "eu", "us", "--region-sync-ms", "20"]
    eu = make_tls(*tls_args(certs, *region, "--region", "eu", "--tls-regions", "yes"))
    us = make_tls(*tls_args(certs, *region, "--region", "us", "--tls-regions", "yes"))
    plain = make_tls(*tls_args(certs, *region, "--region", "us"))
    rule = json.dumps({"match": {"resource": "api"}, "algorithm": "fixed_window",
                       "limit": 10, "window_ms": 60_000, "regions": "global"})
    for s in (eu, us, plain):
        s.client().execute_command("CL.RULE", "SET", "api", rule)
    eu.client().config_set("region-peers", f"us=127.0.0.1:{us.tls_port}")
    plain.client().config_set("region-peers", f"eu=127.0.0.1:{eu.tls_port}")
    for _ in range(3):
        eu.client().execute_command("CL.LIMIT", "u", "api")
    wait_until(lambda: us.client().execute_command("CL.LIMIT", "u", "api", "COST", 0)[2] == 7,
               20, "eu's spends never reached us over TLS")
    wait_until(lambda: eu.stats()["tls_handshake_failures"] >= 1, 20,
               "the plain link was not refused")
    assert plain.client().info("regions")["region_links_up"] == 0


def test_a_replica_without_tls_replication_cannot_sync_from_the_tls_port(make_tls, certs):
    primary = make_tls(*tls_args(certs))
    replica = make_tls(*tls_args(certs, "--replicaof", "127.0.0.1", str(primary.tls_port)))
    wait_until(lambda: primary.stats()["tls_handshake_failures"] >= 1, 20,
               "the plain link was not refused")
    assert replica.client().info("replication")["master_link_status"] == "down"


def test_https_on_http_port_with_tls_http(make_tls, certs):
    http_port = free_port()
    server = make_tls(*tls_args(certs, "--tls-http", "yes", "--http-port", str(http_port)))
    conn = http.client.HTTPSConnection("127.0.0.1", http_port, timeout=10,
                                       context=client_context(certs, certs.client))
    conn.request("GET", "/livez")
    assert conn.getresponse().status == 200
    conn.close()
    assert server.stats()["tls_handshake_failures"] == 0


def test_grpc_over_tls_on_grpc_port_with_tls_grpc(make_tls, certs):
    grpc_port = free_port()
    make_tls(*tls_args(certs, "--tls-grpc", "yes", "--grpc-port", str(grpc_port)))
    with open(certs.ca, "rb") as ca, open(certs.client.cert, "rb") as cert, \
            open(certs.client.key, "rb") as key:
        creds = grpc.ssl_channel_credentials(ca.read(), key.read(), cert.read())
    with grpc.secure_channel(f"localhost:{grpc_port}", creds) as channel:
        assert channel.unary_unary(HEALTH_PATH)(b"", timeout=10) == SERVING


def test_tls_files_are_not_checked_in():
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = [os.path.join(d, f) for d, _, files in os.walk(tests) for f in files
             if f.endswith((".pem", ".crt", ".key"))]
    assert found == []
