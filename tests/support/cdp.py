"""Headless Chromium driven over the Chrome DevTools Protocol, by hand.

``Chromium`` starts Debian's ``/usr/bin/chromium`` headless with a fresh
profile and a DevTools port on 127.0.0.1, and ``Chromium.page()`` opens a
``Session`` on its first tab: a minimal WebSocket client (RFC 6455 over a
plain socket, text frames only) that sends commands, waits for their
answers and keeps every event that came meanwhile in ``events``.  It is
just enough for the status page's test: no third-party package (no
playwright, no websockets), every wait bounded.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time

from wire import free_port

CHROMIUM = "/usr/bin/chromium"
START_TIMEOUT = 30.0
CALL_TIMEOUT = 20.0
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-address=127.0.0.1"]


class CDPError(Exception):
    """An error answer to a DevTools command, or a broken session."""


class Chromium:
    """A headless Chromium child process with its own profile directory."""

    def __init__(self, width: int = 1280, height: int = 1000):
        self.size = (width, height)
        self.proc: subprocess.Popen | None = None
        self.profile = tempfile.mkdtemp(prefix="fastlimit-chromium-")
        self.log_path = os.path.join(self.profile, "chromium.log")
        self.port = 0

    def start(self) -> Chromium:
        self.port = free_port()
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}",
             f"--remote-debugging-port={self.port}",
             f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited early:\n{self.log()}")
            try:
                self._get("/json/version")
                return self
            except (OSError, http.client.HTTPException):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"chromium did not open its DevTools port:\n{self.log()}")

    def page(self) -> Session:
        """A session on the first tab (the about:blank it started with)."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            pages = [t for t in self._get("/json/list") if t.get("type") == "page"]
            if pages:
                return Session(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.1)
        raise RuntimeError("chromium shows no tab")

    def _get(self, path: str):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_log", None) is not None:
            self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Session:
    """One DevTools WebSocket: ``call`` a method, read ``events``."""

    def __init__(self, ws_url: str):
        assert ws_url.startswith("ws://"), ws_url
        hostport, _, path = ws_url[5:].partition("/")
        host, _, port = hostport.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT)
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []
        self._handshake(hostport, "/" + path)

    # ---- the protocol ---------------------------------------------------------------

    def call(self, method: str, params: dict | None = None,
             timeout: float = CALL_TIMEOUT) -> dict:
        """Sends one command and returns its result (CDPError on an error)."""
        self.next_id += 1
        msg_id = self.next_id
        self._send_text(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            msg = self._next_message(deadline)
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def evaluate(self, expression: str, timeout: float = CALL_TIMEOUT):
        """The value of a JavaScript expression in the page (awaited if a
        promise); CDPError if it throws."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, timeout)
        if "exceptionDetails" in result:
            raise CDPError(f"evaluate {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, poll: float = 0.2):
        """Evaluates expression until it is truthy and returns that value;
        TimeoutError with the last value once timeout passed."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{expression!r} still {value!r} after {timeout} s")
            self.pump(poll)

    def pump(self, seconds: float) -> None:
        """Keeps the events that arrive for this long."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                msg = self._next_message(deadline)
            except TimeoutError:
                return
            if "method" in msg:
                self.events.append(msg)

    def screenshot(self, path: str) -> str:
        """The whole page as a PNG at path."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.call("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"],
                     "scale": 1}})
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self._send_frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- WebSocket, RFC 6455 ---------------------------------------------------------------

    def _handshake(self, hostport: str, path: str) -> None:
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        deadline = time.monotonic() + CALL_TIMEOUT
        while b"\r\n\r\n" not in self.buf:
            self._fill(deadline)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise CDPError(f"no WebSocket upgrade: {head[:200]!r}")

    def _send_text(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        # A client masks every frame it sends (RFC 6455 5.3).
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i & 3] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def _next_message(self, deadline: float) -> dict:
        """The next whole text message, as JSON; answers pings."""
        parts: list[bytes] = []
        while True:
            fin, opcode, payload = self._next_frame(deadline)
            if opcode == 0x9:
                self._send_frame(0xA, payload)
            elif opcode == 0x8:
                raise CDPError("chromium closed the DevTools session")
            elif opcode in (0x0, 0x1, 0x2):
                parts.append(payload)
                if fin:
                    return json.loads(b"".join(parts))

    def _next_frame(self, deadline: float) -> tuple[bool, int, bytes]:
        self._need(2, deadline)
        b0, b1 = self.buf[0], self.buf[1]
        n, at = b1 & 0x7F, 2
        if n == 126:
            self._need(4, deadline)
            n, at = struct.unpack_from("!H", self.buf, 2)[0], 4
        elif n == 127:
            self._need(10, deadline)
            n, at = struct.unpack_from("!Q", self.buf, 2)[0], 10
        if b1 & 0x80:
            raise CDPError("a masked frame from the server")
        self._need(at + n, deadline)
        payload, self.buf = self.buf[at:at + n], self.buf[at + n:]
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def _need(self, n: int, deadline: float) -> None:
        while len(self.buf) < n:
            self._fill(deadline)

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no DevTools message before the deadline")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            raise TimeoutError("no DevTools message before the deadline") from None
        if not chunk:
            raise CDPError("chromium closed the DevTools socket")
        self.buf += chunk


def console_problems(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and error log entries (failed
    loads, CSP violations...) among the events, as readable lines."""
    out = []
    for e in events:
        method, p = e["method"], e.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            out.append(f"console.{p['type']}: {args}")
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            entry = p["entry"]
            out.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}")
    return out
