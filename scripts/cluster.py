#!/usr/bin/env python3
"""A local fastlimit cluster on 127.0.0.1, its files in one folder: N
shards (default 3), each a fastlimit primary and one standby in cluster
mode, and three redis-sentinels watching every shard as its own master
name (fl-0 .. fl-<N-1>), which is what fails a shard over.

    .venv/bin/python scripts/cluster.py start [--dir D] [--shards N] [--base-port P]
    .venv/bin/python scripts/cluster.py stop [--dir D]

``start`` writes the slot map (D/slots.toml: slots split evenly, shard i
``sentinel = "fl-<i>"``, the sentinels listed), starts every process in
its own session, prints the addresses and exits; each process's pid is in
its folder (D/node-<port>/pid, D/sentinel-<port>/pid), with its config
and log.  The nodes prove themselves to each other as the link user of
D/cluster.acl, whose password is made at each start.  Shard i's primary
listens on P+2i, its standby on P+2i+1, the sentinels on P+2N..P+2N+2.
``stop`` ends every process ``start`` left in D.  The default folder is
$TMPDIR/fastlimit-cluster, the default base port 7000.

From Python (tests), free ports and a temporary folder unless told::

    with LocalCluster(shards=3) as c:
        c.primaries(), c.sentinel_addresses(), c.map_path
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ha import HASet, Node, free_ports, wait_until  # noqa: E402

from fastlimit._cluster import SLOTS  # noqa: E402
from fastlimit.cluster import slot_map as clustermap  # noqa: E402
from fastlimit.cluster.slot_map import Address, Shard, SlotMap, SlotRange  # noqa: E402
from fastlimit.cluster.peers import LINK_PERMISSIONS  # noqa: E402

DEFAULT_DIR = Path(tempfile.gettempdir()) / "fastlimit-cluster"
DEFAULT_BASE_PORT = 7000
SENTINELS = 3
HOST = "127.0.0.1"
MAP_FILE = "slots.toml"
ACL_FILE = "cluster.acl"
CLUSTER_USER = "fl-cluster"
STOP_TIMEOUT_S = 10.0


def shard_name(i: int) -> str:
    return f"fl-{i}"


def slot_map(shards: int, sentinel_ports: list[int], version: int = 1) -> SlotMap:
    """Shard i owns slots i*16384/N .. (i+1)*16384/N - 1 and is Sentinel
    master fl-<i>."""
    return SlotMap.build(version, [
        Shard(shard_name(i), (SlotRange(i * SLOTS // shards, (i + 1) * SLOTS // shards - 1),),
              sentinel=shard_name(i))
        for i in range(shards)], [Address(HOST, p) for p in sentinel_ports])


class LocalCluster:
    """The rig the module docstring describes.  cluster_flags=False starts
    the nodes without cluster mode (the same processes and sentinels)."""

    def __init__(self, dir: str | Path | None = None, *, shards: int = 3,
                 base_port: int | None = None, python: str = sys.executable,
                 cluster_flags: bool = True, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 10_000, extra: list[str] | None = None,
                 detach: bool = False):
        if shards < 1:
            raise ValueError("a cluster needs at least one shard")
        self.own_dir = dir is None
        self.dir = Path(dir) if dir is not None else Path(tempfile.mkdtemp(
            prefix="fastlimit-cluster-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        if base_port is None:
            picked = free_ports(2 * shards + SENTINELS)
            ports, sentinel_ports = picked[:2 * shards], picked[2 * shards:]
        else:
            ports = list(range(base_port, base_port + 2 * shards))
            sentinel_ports = list(range(base_port + 2 * shards,
                                        base_port + 2 * shards + SENTINELS))
        self.slot_map = slot_map(shards, sentinel_ports)
        self.map_path = self.dir / MAP_FILE
        self.map_path.write_text(clustermap.dumps(self.slot_map))
        flags = (["--cluster-enabled", "yes", "--cluster-config-file", str(self.map_path),
                  "--cluster-announce-ip", HOST, *self._link_user()] if cluster_flags else [])
        self.ha = HASet("fastlimit", ports=ports, sentinel_ports=sentinel_ports, replicas=1,
                        sentinels=SENTINELS, down_after_ms=down_after_ms,
                        failover_timeout_ms=failover_timeout_ms, python=python,
                        extra=flags + (extra or []), workdir=str(self.dir),
                        services=[shard_name(i) for i in range(shards)], detach=detach)

    def _link_user(self) -> list[str]:
        """The nodes prove themselves to each other as CLUSTER_USER, with a
        password made for this cluster (in D/cluster.acl, beside the open
        default user the clients and sentinels use)."""
        password = secrets.token_hex(16)
        path = self.dir / ACL_FILE
        path.write_text(f"user default on nopass ~* &* +@all\n"
                        f"user {CLUSTER_USER} on >{password} {' '.join(LINK_PERMISSIONS)}\n")
        path.chmod(0o600)
        return ["--aclfile", str(path), "--cluster-user", CLUSTER_USER,
                "--cluster-password", password]

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        try:
            self.ha.start(timeout_s)
        except BaseException:
            print(self.ha.logs(), file=sys.stderr)
            self.ha.stop(keep_dir=True)
            raise
        for proc, folder in self._processes():
            (folder / "pid").write_text(f"{proc.pid}\n")
        return self

    def stop(self) -> None:
        self.ha.stop(keep_dir=True)
        for _, folder in self._processes():
            (folder / "pid").unlink(missing_ok=True)
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _processes(self):
        for p in [*self.ha.nodes, *self.ha.sentinels]:
            if p.proc is not None:
                yield p.proc, p.dir

    # -- what it is made of ---------------------------------------------------

    @property
    def shards(self) -> dict[str, list[Node]]:
        """Shard name -> [primary, standby] as started (Sentinel may have
        swapped them since)."""
        return self.ha.services

    def primaries(self) -> dict[str, int]:
        """Shard name -> the port the sentinels name as its primary now."""
        return {name: self.ha.primary_port(name) for name in self.shards}

    def sentinel_addresses(self) -> list[Address]:
        return list(self.slot_map.sentinels)

    def wait_state_ok(self, timeout_s: float = 30.0) -> None:
        """Every node answers CLUSTER INFO with cluster_state:ok (every
        shard's primary known)."""
        wait_until(lambda: all(cluster_state(n.port) == "ok" for n in self.ha.nodes),
                   timeout_s, "cluster_state:ok on every node", every_s=0.1)

    def describe(self) -> str:
        lines = []
        for shard in self.slot_map.shards:
            primary, standby = self.shards[shard.name]
            slots = ",".join(str(r) for r in shard.slots)
            lines.append(f"{shard.name}  slots {slots:<11}  primary {HOST}:{primary.port} "
                         f"(pid {primary.proc.pid})  standby {HOST}:{standby.port} "
                         f"(pid {standby.proc.pid})")
        lines += [f"sentinel  {HOST}:{s.port} (pid {s.proc.pid})" for s in self.ha.sentinels]
        lines.append(f"slot map  {self.map_path}; configs, logs and pids in {self.dir}")
        return "\n".join(lines)


def cluster_state(port: int) -> str | None:
    """CLUSTER INFO's cluster_state, None if the node does not say."""
    try:
        text = redis.Redis(host=HOST, port=port, socket_timeout=1).execute_command(
            "CLUSTER", "INFO")
    except redis.RedisError:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    fields = dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)
    return fields.get("cluster_state")


# -- stop from the pidfiles ----------------------------------------------------

def _ours(pid: int, folder: Path) -> bool:
    """pid is alive and runs in folder, as every process start started
    does (a node's cwd, a sentinel's "dir"): not a reused pid.  The
    command line cannot tell: redis-sentinel rewrites its own."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")) == folder.resolve()
    except OSError:
        return False


def running(dir: Path) -> list[tuple[int, Path]]:
    """(pid, folder) of each process a start left running in dir."""
    found = []
    for pidfile in sorted(dir.glob("*/pid")):
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if _ours(pid, pidfile.parent):
            found.append((pid, pidfile.parent))
    return found


def stop_dir(dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Stops the sentinels first (so they fail nothing over), then the
    nodes: SIGTERM, SIGKILL after timeout_s.  Returns how many it stopped."""
    procs = running(dir)
    for group in ([p for p in procs if p[1].name.startswith("sentinel-")],
                  [p for p in procs if not p[1].name.startswith("sentinel-")]):
        for pid, _ in group:
            _signal(pid, signal.SIGCONT)      # a stopped process cannot exit
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while any(_ours(pid, f) for pid, f in group) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid, folder in group:
            if _ours(pid, folder):
                _signal(pid, signal.SIGKILL)
    for _, folder in procs:
        (folder / "pid").unlink(missing_ok=True)
    return len(procs)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass                                  # it exited meanwhile


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a cluster and exit, leaving it running")
    start.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    start.add_argument("--shards", type=int, default=3)
    start.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT)
    start.add_argument("--down-after-ms", type=int, default=1000,
                       help="Sentinel's down-after-milliseconds")
    start.add_argument("--no-cluster", action="store_true",
                       help="start the nodes without cluster mode")
    stop = sub.add_parser("stop", help="stop what start left running in --dir")
    stop.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = p.parse_args(argv)

    if args.command == "stop":
        count = stop_dir(args.dir)
        print(f"stopped {count} process(es) in {args.dir}")
        return 0
    if running(args.dir):
        print(f"a cluster is already running in {args.dir}; "
              f"stop it first: {sys.argv[0]} stop --dir {args.dir}", file=sys.stderr)
        return 1
    if args.shards < 1 or not 1 <= args.base_port <= 65535 - 2 * args.shards - SENTINELS:
        print("--shards must be >= 1 and every port below 65536", file=sys.stderr)
        return 2
    cluster = LocalCluster(args.dir.resolve(), shards=args.shards, base_port=args.base_port,
                           down_after_ms=args.down_after_ms,
                           cluster_flags=not args.no_cluster, detach=True).start()
    print(cluster.describe())
    first = cluster.shards[shard_name(0)][0].port
    print(f"try:  redis-cli -c -p {first} CL.CHECK user:42 10 1\n"
          f"      redis-cli -p {cluster.ha.sentinels[0].port} SENTINEL "
          f"get-master-addr-by-name {shard_name(0)}\n"
          f"stop: {sys.argv[0]} stop --dir {args.dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
