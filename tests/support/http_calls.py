"""What the tests of the HTTP front share: raw requests on a fresh
connection, a rule set over RESP, and the README's console examples run
as written against a server's ports."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"

TOKEN_BUCKET = {"match": {"resource": "api"}, "algorithm": "token_bucket",
                "capacity": 3, "refill_per_second": 1}


def set_rule(r, rule_id: str, doc: dict) -> None:
    assert r.execute_command("CL.RULE", "SET", rule_id, json.dumps(doc)) == b"OK"


def raw(port: int, data: bytes, *, read_until_close=True, timeout=5.0) -> bytes:
    """Sends data on a fresh connection and reads what comes back until the
    server closes (or the timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
            if not read_until_close:
                break
        return out
    finally:
        s.close()


def post_bytes(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n").encode() + extra + b"\r\n" + body


def http_examples(heading: str = "## HTTP front") -> list[tuple[str, str]]:
    """(command, expected output) of the first console block of the
    README's section under `heading`."""
    text = README.read_text()
    section = text[text.index(heading):]
    block = re.search(r"```console\n(.*?)```", section, re.S).group(1)
    examples: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            examples.append((line[2:], []))
        else:
            examples[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in examples]


def run_examples(hs, examples: list[tuple[str, str]]) -> None:
    """Runs each command against hs's ports, comparing its output."""
    for cmd, expected in examples:
        cmd = cmd.replace("localhost:8380", f"127.0.0.1:{hs.http_port}").replace(
            "-p 6380", f"-p {hs.port}")
        done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
        assert done.stdout.replace("\r\n", "\n").rstrip("\n") == expected, cmd
