"""Real server processes for the tests: fastlimit-server and redis-server
children on free loopback ports, talked to over sockets.

``FASTLIMIT_PYTHON`` selects the interpreter whose installed fastlimit is
tested (the release or the debug build's virtualenv); it defaults to the
interpreter running pytest.  The fixtures in conftest.py use these; a test
that needs a process with its own working directory or lifecycle imports
them from here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import pytest
import redis
from wire import free_port, wait_until

PYTHON = os.environ.get("FASTLIMIT_PYTHON", sys.executable)
# Under `coverage run` (the debug pass of scripts/test.sh) children started
# with this variable set measure themselves; conftest.py clears TRACED for
# the tests that run untraced (marked `untraced`, see conftest.py).
COVERAGE_ENV = "COVERAGE_PROCESS_CONFIG"
TRACED = True
READY = re.compile(r"ready to accept connections on .* port (\d+)")
START_TIMEOUT = 20.0
# Set on a test's item when it fails (conftest.py's report hook): fixtures
# print their processes' logs only then.
FAILED = pytest.StashKey[bool]()


def failed(request) -> bool:
    """Whether the test of this fixture request has failed so far."""
    return request.node.stash.get(FAILED, False)


def process_state(pid) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, T, Z...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def untraced_env() -> dict[str, str]:
    """The environment less what starts coverage in a child."""
    return {k: v for k, v in os.environ.items() if k != COVERAGE_ENV}


class ServerProcess:
    """A fastlimit-server child process with its log in a temp file."""

    # What the interpreter runs: a subclass may run a test's own launcher.
    entry = ["-m", "fastlimit.server"]
    prefix: list[str] = []      # what runs the interpreter (prlimit ...)
    # Unless a test gives them: rules and buckets in memory only (no files
    # in the working directory), no HTTP or gRPC front (each would take a
    # free port the test does not use).
    DEFAULTS = {"--rules-db": "", "--snapshot-file": "", "--http-port": "0", "--grpc-port": "0"}

    def __init__(self, *args: str):
        self.args = list(args)
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = ""

    def start(self) -> ServerProcess:
        # under pytest's basetemp: conftest.py points the temp dir there
        fd, self.log_path = tempfile.mkstemp(prefix="fastlimit-", suffix=".log")
        self._log = os.fdopen(fd, "wb")
        defaults = [arg for flag, value in self.DEFAULTS.items() if flag not in self.args
                    for arg in (flag, value)]
        self.proc = subprocess.Popen(
            [*self.prefix, PYTHON, *self.entry, "--port", "0", *defaults, *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=None if TRACED else untraced_env())
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            m = READY.search(self.log())
            if m:
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"fastlimit-server exited early:\n{self.log()}")
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"fastlimit-server did not become ready:\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def client(self, **kwargs) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 10)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def connect(self) -> socket.socket:
        """A raw socket, for speaking the wire protocol by hand."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def stop(self, sig=signal.SIGTERM, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class RedisServerProcess:
    """A real redis-server, persistence off, for side-by-side tests."""

    def __init__(self):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                redis.Redis(port=self.port).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class ExtraPortServer(ServerProcess):
    """A server with another listener (HTTP, gRPC) on a port the test
    picks: the RESP port is the kernel's pick and cannot be lost, this one
    can be taken by another process before the server binds it, so a start
    that loses it is tried again on a new one."""

    PORT_FLAG = ""
    ATTEMPTS = 3

    def __init__(self, *args: str):
        self.extra_port = free_port()
        super().__init__(self.PORT_FLAG, str(self.extra_port), *args)

    def start(self) -> ServerProcess:
        for attempt in range(self.ATTEMPTS):
            try:
                return super().start()
            except RuntimeError as e:
                if "address already in use" not in str(e) or attempt == self.ATTEMPTS - 1:
                    raise
                self.extra_port = free_port()
                self.args[self.args.index(self.PORT_FLAG) + 1] = str(self.extra_port)
        raise AssertionError("unreachable")


def wait_caught_up(primary: redis.Redis, replica: redis.Redis, timeout: float = 20.0) -> None:
    """The replica has applied everything its primary sent so far: its offset
    reaches the one the primary's INFO gives (INFO flushes the pending batch
    first)."""
    target = primary.info("replication")["master_repl_offset"]
    wait_until(lambda: replica.info("replication")["slave_repl_offset"] >= target, timeout,
               "the replica to reach the primary's offset")


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within timeout."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


@contextmanager
def started_servers(server_class):
    """A make(*args, **kw) that starts server_class processes; every one
    started is stopped when the block ends (the make_* fixtures)."""
    started = []

    def make(*args, **kw):
        srv = server_class(*args, **kw).start()
        started.append(srv)
        return srv

    try:
        yield make
    finally:
        for srv in started:
            srv.stop()


RUN_LINES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_lines.py")


def fresh_network_available() -> bool:
    """Whether this process may make a network namespace of its own
    (root, unshare, ip): one where every port is free."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def readme_block(heading: str) -> list[str]:
    """The shell lines of the first ```sh block under heading, comments cut."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(heading):]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block, f"no ```sh block under {heading!r} in README.md"
    lines = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    return [shlex.join(words) for words in lines if words]


def run_lines(workdir, lines: list[str]) -> dict:
    """Runs shell lines as a user types them (run_lines.py), in a fresh
    network namespace when one can be made, so that the ports they name
    (the README's 6380, 8380...) are free whatever else runs on the machine
    or beside in pytest-xdist; else on the machine's own loopback."""
    command = [PYTHON, RUN_LINES, str(workdir), *lines]
    if fresh_network_available():
        command = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env=None if TRACED else untraced_env())
    assert done.returncode == 0, f"{lines} could not be run:\n{done.stdout}{done.stderr}"
    return json.loads(done.stdout)
