"""Runs shell lines as a user types them, one directory for all, and prints
what happened as JSON: ``python run_lines.py WORKDIR LINE...``.

A ``fastlimit-server ...`` line starts a server (this checkout's, with its
arguments exactly as written) and waits until it is ready or has exited;
once all are started, a standby (``--replicaof``) is waited for until its
link is up; any other line then runs in a shell.  Used through
servers.run_in_fresh_network, so that the lines' own ports are free.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import redis

READY = re.compile(r"ready to accept connections on .* port (\d+)")
TIMEOUT_S = 20.0
PYTHON = os.environ.get("FASTLIMIT_PYTHON", sys.executable)


def start(line: str, workdir: str, n: int) -> dict:
    args = shlex.split(line)[1:]
    log_path = os.path.join(workdir, f"server-{n}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([PYTHON, "-m", "fastlimit.server", *args], cwd=workdir,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None and not READY.search(read(log_path)):
        time.sleep(0.05)
    port = int(args[args.index("--port") + 1]) if "--port" in args else 6380
    return {"line": line, "proc": proc, "log_path": log_path, "port": port,
            "standby": "--replicaof" in args}


def read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


SHOWN = ("tcp_port", "http_port", "grpc_port", "role", "master_link_status")


def info(port: int) -> dict:
    with redis.Redis(port=port, socket_timeout=5) as r:
        everything = r.info("everything")
    return {name: everything[name] for name in SHOWN if name in everything}


def link_up(port: int) -> bool:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if info(port).get("master_link_status") == "up":
            return True
        time.sleep(0.1)
    return False


def main(workdir: str, lines: list[str]) -> dict:
    servers = [start(line, workdir, n) for n, line in enumerate(lines)
               if line.startswith("fastlimit-server")]
    out: dict = {"servers": [], "commands": []}
    try:
        running = all(s["proc"].poll() is None for s in servers)
        out["links_up"] = running and all(link_up(s["port"]) for s in servers if s["standby"])
        for line in (line for line in lines if not line.startswith("fastlimit-server")):
            done = subprocess.run(line, shell=True, cwd=workdir, capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
            out["commands"].append({"line": line, "rc": done.returncode,
                                    "out": done.stdout + done.stderr})
        for s in servers:
            alive = s["proc"].poll() is None
            out["servers"].append({"line": s["line"], "alive": alive,
                                   "info": info(s["port"]) if alive else None})
    finally:
        for s in servers:
            s["proc"].terminate()
            s["proc"].wait(TIMEOUT_S)
    for s, seen in zip(servers, out["servers"], strict=True):
        seen["log"] = read(s["log_path"])
    out["files"] = sorted(os.listdir(workdir))
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:]), default=str))
