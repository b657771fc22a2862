"""A real PostgreSQL for the tests: Debian's postgresql package's initdb
and pg_ctl, run as the unprivileged ``postgres`` user (initdb refuses
root), with a throw-away data directory, a free loopback port and its
socket in that directory, fsync off.  The directory lives in the
postgres user's home (it cannot enter pytest's basetemp, which is
root's, mode 0700) and is removed when the server is.

``stop("immediate")`` is a crash as PostgreSQL's own tests make one;
``start()`` again brings the same data back.  ``sql()`` runs statements
with psql, the real client a DBA would use.

tests/support/ is on sys.path: ``from postgres import PostgresServer``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import time

from wire import free_port

USER = "postgres"
START_TIMEOUT = 60


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"{name} not found: scripts/bootstrap.sh installs Debian's postgresql")
    return found[-1]


def _as_postgres(*argv: str, timeout: float = START_TIMEOUT, check: bool = True,
                 input: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    runuser = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin") or "runuser"
    return subprocess.run([runuser, "-u", USER, "--", *argv], capture_output=True,
                          text=True, timeout=timeout, check=check, env=env, input=input,
                          cwd="/")


class PostgresServer:
    def __init__(self, standby_of: PostgresServer | None = None):
        """A new cluster, or (standby_of) a hot standby of a running one,
        copied with pg_basebackup and streaming from it."""
        home = pwd.getpwnam(USER).pw_dir
        self.dir = _as_postgres("mktemp", "-d", f"{home}/fastlimit-test.XXXXXX").stdout.strip()
        self.data = f"{self.dir}/data"
        self.port = free_port()
        self.running = False
        try:
            if standby_of is not None:
                # -c fast: a checkpoint now, not spread over checkpoint_timeout
                _as_postgres(_bin("pg_basebackup"), "-D", self.data, "-R", "-X", "stream",
                             "-c", "fast", "-h", "127.0.0.1", "-p", str(standby_of.port),
                             "-U", USER)
            else:
                _as_postgres(_bin("initdb"), "-D", self.data, "-A", "trust", "-U", USER,
                             "--no-sync", "-E", "UTF8")
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str, port: int | None = None) -> str:
        return f"postgresql://{USER}@127.0.0.1:{port or self.port}/{database}"

    def start(self) -> PostgresServer:
        # fsync off: a crash of the server (stop("immediate")) still loses
        # nothing committed, only a crash of the machine would.  Not
        # synchronous_commit off, which loses the last commits in a crash.
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c full_page_writes=off -c max_connections=200")
        _as_postgres(_bin("pg_ctl"), "-D", self.data, "-l", f"{self.dir}/server.log", "-w",
                     "-t", str(START_TIMEOUT), "-o", options, "start")
        self.running = True
        return self

    def stop(self, mode: str = "fast") -> None:
        if self.running:
            _as_postgres(_bin("pg_ctl"), "-D", self.data, "-m", mode, "-w", "stop", check=False)
            self.running = False

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        try:
            with open(f"{self.dir}/server.log", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def sql(self, statements: str, database: str = "postgres") -> str:
        """Runs statements with psql (one transaction when they are one
        string with BEGIN/COMMIT); their output, unaligned, tuples only."""
        out = subprocess.run(
            [shutil.which("psql") or "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At",
             "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d", database],
            input=statements, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PGCONNECT_TIMEOUT": "10"})
        if out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def create_database(self) -> str:
        """A fresh database of its own for one test; its URI."""
        name = f"t{time.monotonic_ns()}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url_for(name)
