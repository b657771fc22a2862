#!/usr/bin/env python3
"""A local high-availability set on 127.0.0.1: a primary, two standbys and
three redis-sentinel processes watching them, for trying a failover by
hand (``make ha``) and for the tests and the failover benchmark, which
build the same set of fastlimit servers or of real redis-servers.  The
same sentinels can watch several services (shards), each its own primary
and standbys (``HASet(services=[...])``; scripts/cluster.py uses that).

    .venv/bin/python scripts/ha.py [--port 6380] [--sentinel-port 26380]

prints the addresses and waits; Ctrl-C stops everything.  Each process
gets a config file in a temporary directory: fastlimit's TOML (which
Sentinel's CONFIG REWRITE updates) and a copy of server/sentinel.conf with
the ports filled in.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
SENTINEL_TEMPLATE = ROOT / "server" / "sentinel.conf"
SERVICE = "limits"
START_TIMEOUT_S = 20.0


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports nothing listens on: the sockets are held
    until all are picked, or the kernel could hand out one twice."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_until(predicate, timeout_s: float, what: str, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def answers(port: int, password: str | None = None) -> bool:
    try:
        return bool(redis.Redis(port=port, password=password, socket_timeout=1).ping())
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return False


def terminate(proc: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 10 s; SIGCONT first, as a stopped
    process cannot exit."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Node:
    """One data server (fastlimit or redis-server) with its config file."""

    def __init__(self, kind: str, port: int, workdir: Path, python: str,
                 password: str | None, replicaof: int | None, extra: list[str],
                 detach: bool = False):
        self.kind, self.port, self.password = kind, port, password
        self.detach = detach
        self.dir = workdir / f"node-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "log"
        self.python = python
        self.replicaof = replicaof
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.config = self._write_config()

    def _write_config(self) -> Path:
        if self.kind == "redis":
            path = self.dir / "redis.conf"
            # no diskless-sync delay: a replica is in sync at once, not after 5 s
            lines = [f"port {self.port}", "bind 127.0.0.1", 'save ""', "appendonly no",
                     f"dir {self.dir}", "repl-diskless-sync-delay 0"]
            if self.password:
                lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
            if self.replicaof:
                lines.append(f"replicaof 127.0.0.1 {self.replicaof}")
        else:
            path = self.dir / "fastlimit.toml"
            lines = ["# written by scripts/ha.py; Sentinel's CONFIG REWRITE updates it",
                     "[server]", 'bind = ["127.0.0.1"]', f"port = {self.port}",
                     'snapshot-file = ""', 'rules-db = ""', "http-port = 0",
                     "grpc-port = 0"]
            if self.password:
                lines += [f'requirepass = "{self.password}"', f'masterauth = "{self.password}"']
            if self.replicaof:
                lines.append(f'replicaof = "127.0.0.1 {self.replicaof}"')
        path.write_text("\n".join(lines) + "\n")
        return path

    def command(self) -> list[str]:
        if self.kind == "redis":
            return ["redis-server", str(self.config), *self.extra]
        return [self.python, "-m", "fastlimit.server", "--config", str(self.config), *self.extra]

    def start(self) -> Node:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.dir,
                                     start_new_session=self.detach)
        log.close()
        wait_until(lambda: answers(self.port, self.password) or self._exited(),
                   START_TIMEOUT_S, f"{self.kind} on port {self.port}")
        if self._exited():
            raise RuntimeError(f"{self.kind} on port {self.port} exited:\n{self.log()}")
        return self

    def _exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, **kwargs) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis(port=self.port, password=self.password, **kwargs)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)

    def stop(self) -> None:
        terminate(self.proc)


def sentinel_config(port: int, workdir: Path, primaries: dict[str, int], quorum: int,
                    down_after_ms: int, failover_timeout_ms: int,
                    password: str | None) -> str:
    """server/sentinel.conf filled in; its per-service lines (those naming
    SERVICE) repeated for each service in primaries (name -> primary port)."""
    lines = []
    for line in SENTINEL_TEMPLATE.read_text().splitlines():
        if line.startswith("sentinel ") and f" {SERVICE} " in line:
            lines += [line.replace(f" {SERVICE} ", f" {name} ").replace(
                "{PRIMARY_PORT}", str(primary)) for name, primary in primaries.items()]
        else:
            lines.append(line)
    text = "\n".join(lines) + "\n"
    for name, value in (("PORT", port), ("DIR", workdir), ("QUORUM", quorum),
                        ("DOWN_AFTER_MS", down_after_ms),
                        ("FAILOVER_TIMEOUT_MS", failover_timeout_ms)):
        text = text.replace("{" + name + "}", str(value))
    if password:
        text += "".join(f"sentinel auth-pass {name} {password}\n" for name in primaries)
    return text


class Sentinel:
    """One redis-sentinel process, its config copied from server/sentinel.conf."""

    def __init__(self, port: int, workdir: Path, primaries: dict[str, int], quorum: int,
                 down_after_ms: int, failover_timeout_ms: int, password: str | None,
                 detach: bool = False):
        self.port = port
        self.detach = detach
        self.dir = workdir / f"sentinel-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "log"
        self.config = self.dir / "sentinel.conf"
        self.config.write_text(sentinel_config(port, self.dir, primaries, quorum, down_after_ms,
                                               failover_timeout_ms, password))
        self.proc: subprocess.Popen | None = None

    def start(self) -> Sentinel:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["redis-sentinel", str(self.config)], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=self.detach)
        log.close()
        wait_until(lambda: answers(self.port), START_TIMEOUT_S, f"sentinel on {self.port}")
        return self

    def client(self, **kwargs) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis(port=self.port, decode_responses=True, **kwargs)

    def primary(self, service: str = SERVICE) -> int | None:
        """The port this sentinel names as service's primary, None if it cannot say."""
        try:
            addr = self.client(socket_timeout=1).execute_command(
                "SENTINEL", "get-master-addr-by-name", service)
        except (redis.ConnectionError, redis.TimeoutError):
            return None
        return int(addr[1]) if addr else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        terminate(self.proc)


class HASet:
    """For each of `services` (one, SERVICE, unless told) a primary and
    `replicas` standbys, all watched by `sentinels` sentinels; fastlimit
    servers (kind "fastlimit") or real redis-servers (kind "redis").
    `ports` lists the data nodes service by service, each primary first;
    `nodes` is all of them, `services[name]` one service's."""

    def __init__(self, kind: str = "fastlimit", *, ports: list[int] | None = None,
                 sentinel_ports: list[int] | None = None, replicas: int = 2,
                 sentinels: int = 3, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 10_000, password: str | None = None,
                 python: str = sys.executable, extra: list[str] | None = None,
                 workdir: str | None = None, services: list[str] | None = None,
                 detach: bool = False):
        self.kind = kind
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"ha-{kind}-"))
        names = services or [SERVICE]
        if not ports or not sentinel_ports:
            split = len(names) * (replicas + 1)
            picked = free_ports(split + sentinels)
            ports = ports or picked[:split]
            sentinel_ports = sentinel_ports or picked[split:]
        per = len(ports) // len(names)
        if per < 1 or per * len(names) != len(ports):
            raise ValueError(f"{len(ports)} ports do not split evenly over {len(names)} services")
        self.password = password
        self.services: dict[str, list[Node]] = {}
        for n, name in enumerate(names):
            group = ports[n * per:(n + 1) * per]
            self.services[name] = [Node(kind, port, self.workdir, python, password,
                                        None if i == 0 else group[0], extra or [], detach)
                                   for i, port in enumerate(group)]
        self.nodes = [node for group in self.services.values() for node in group]
        quorum = len(sentinel_ports) // 2 + 1
        primaries = {name: group[0].port for name, group in self.services.items()}
        self.sentinels = [Sentinel(port, self.workdir, primaries, quorum, down_after_ms,
                                   failover_timeout_ms, password, detach)
                          for port in sentinel_ports]

    def start(self, timeout_s: float = 30.0) -> HASet:
        for node in self.nodes:
            node.start()
        for group in self.services.values():
            self.wait_replicas_online(group[0], len(group) - 1, timeout_s)
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_discovered(timeout_s)
        return self

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def wait_replicas_online(self, primary: Node, count: int, timeout_s: float) -> None:
        def online() -> bool:
            try:
                info = primary.client(socket_timeout=1).info("replication")
            except (redis.ConnectionError, redis.TimeoutError):
                return False
            return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                       and v.get("state") == "online") >= count
        wait_until(online, timeout_s, f"{count} replicas online at {primary.port}")

    def wait_discovered(self, timeout_s: float) -> None:
        """Every sentinel knows every replica and every other sentinel of
        every service."""
        def known_by(s: Sentinel, name: str, group: list[Node]) -> bool:
            try:
                c = s.client(socket_timeout=1)
                replicas = c.execute_command("SENTINEL", "replicas", name)
                others = c.execute_command("SENTINEL", "sentinels", name)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                return False
            return len(replicas) >= len(group) - 1 and len(others) >= len(self.sentinels) - 1

        def known() -> bool:
            return all(known_by(s, name, group) for s in self.sentinels
                       for name, group in self.services.items())
        wait_until(known, timeout_s, "the sentinels to discover the set", every_s=0.2)

    def primary_port(self, service: str = SERVICE) -> int | None:
        """The primary of service every answering sentinel agrees on, else None."""
        seen = {s.primary(service) for s in self.sentinels}
        seen.discard(None)
        return seen.pop() if len(seen) == 1 else None

    def logs(self) -> str:
        parts = [f"--- {n.kind} {n.port}\n{n.log()[-4000:]}" for n in self.nodes]
        parts += [f"--- sentinel {s.port}\n{s.log()[-4000:]}" for s in self.sentinels]
        return "\n".join(parts)

    def stop(self, keep_dir: bool = False) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for node in self.nodes:
            node.stop()
        if not keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> HASet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=["fastlimit", "redis"], default="fastlimit")
    p.add_argument("--port", type=int, default=6380, help="the primary's; standbys follow")
    p.add_argument("--sentinel-port", type=int, default=26380, help="the first sentinel's")
    p.add_argument("--down-after-ms", type=int, default=1000)
    p.add_argument("--requirepass", default=None)
    args = p.parse_args()
    ha = HASet(args.kind, ports=[args.port + i for i in range(3)],
               sentinel_ports=[args.sentinel_port + i for i in range(3)],
               down_after_ms=args.down_after_ms, password=args.requirepass,
               workdir=tempfile.mkdtemp(prefix="fastlimit-ha-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        ha.start()
        print(f"primary   127.0.0.1:{args.port} (pid {ha.nodes[0].proc.pid})")
        for n in ha.nodes[1:]:
            print(f"standby   127.0.0.1:{n.port} (pid {n.proc.pid})")
        for s in ha.sentinels:
            print(f"sentinel  127.0.0.1:{s.port}")
        print(f"files and logs in {ha.workdir}")
        print(f"try: kill -9 {ha.nodes[0].proc.pid}; then\n"
              f"     redis-cli -p {args.sentinel_port} SENTINEL get-master-addr-by-name "
              f"{SERVICE}\nCtrl-C stops everything.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        ha.stop(keep_dir=os.environ.get("HA_KEEP_DIR") == "1")


if __name__ == "__main__":
    main()
