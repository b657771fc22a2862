"""What every fuzz target (tests/fuzz/fuzz_*.py) shares.

A target is one small file: it imports this module first, imports what it
fuzzes inside ``instrumented()``, defines ``one_input(data: bytes)`` that
feeds the bytes to a parser and raises on anything but the parser's own
clear error, and ends with ``harness.main(one_input)``.  Its seed corpus
is tests/fuzz/corpus/<name>/ (written by tests/fuzz/seeds.py).  The short
run of tests/fuzz/test_fuzz_short.py and scripts/fuzz.sh find it by its
file name; nothing else lists it.

The C parsers are covered when fastlimit is the fuzzing build
(scripts/bootstrap.sh --fuzz: clang, AddressSanitizer and libFuzzer's edge
counters, see setup.py).  Such a build needs the sanitizer runtime loaded
before anything else, so importing this module re-executes the target
with atheris's ASan+libFuzzer runtime in LD_PRELOAD when the build is the
fuzzing one and it is not there yet.  On an ordinary build (the debug
build's assertions and bounds checks) only the Python code is
instrumented; the C code still runs, and a crash is still a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import importlib.util
import logging
import os
import sys

RUNTIME = "asan_with_fuzzer.so"
# Python leaks at exit by design; an allocation over the fuzzer's malloc
# limit is reported by libFuzzer itself, not ASan.  With ASan's default
# allocation stacks (30 frames) and quarantine (256 MB) the interpreter's
# deep, varied stacks fill ASan's stack store by some 19 MB per input and
# each input runs 20-40 times slower than without ASan (a 2-shard slot map:
# 45 ms without, up to 2 s with, 1.1 GB after 60 inputs); with these the
# memory stays flat (180 MB) and it is 4-6 times slower.  A crash's own
# stack is whole either way.
ASAN_OPTIONS = ("detect_leaks=0:allocator_may_return_null=1:handle_abort=1:"
                "malloc_context_size=5:quarantine_size_mb=16")


def sanitized_build() -> bool:
    """Whether the fastlimit that will be imported is the fuzzing build
    (its extensions call into ASan), found without importing it."""
    spec = importlib.util.find_spec("fastlimit")
    if spec is None or not spec.submodule_search_locations:
        return False
    for path in glob.glob(os.path.join(spec.submodule_search_locations[0], "_resp*.so")):
        with open(path, "rb") as f:
            return b"__asan_init" in f.read()
    return False


def _preload_runtime() -> None:
    if RUNTIME in os.environ.get("LD_PRELOAD", "") or not sanitized_build():
        return
    spec = importlib.util.find_spec("atheris")
    assert spec is not None and spec.origin, "atheris is not installed"
    runtime = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), RUNTIME)
    env = dict(os.environ, LD_PRELOAD=runtime,
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", ASAN_OPTIONS))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


_preload_runtime()

import atheris  # noqa: E402  (after the runtime is in place)


def instrumented():
    """Imports inside this are instrumented for coverage (fastlimit's
    Python modules; the compiled ones carry their own counters)."""
    return atheris.instrument_imports(include=["fastlimit"])


# tests/support/: the stand-in transport the in-process tests use (wire.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from wire import RecordingTransport as Transport  # noqa: E402


class Finding(AssertionError):
    """What a target raises for a bug that did not raise by itself."""


class _Unexpected(logging.Handler):
    """Keeps each record logged with a traceback: the server logs a bug
    it survived that way ("internal error", "failed unexpectedly")."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        if record.exc_info:
            self.records.append(record)


_UNEXPECTED = _Unexpected()


def quiet_logs() -> None:
    """The server's expected errors say nothing during a run; the
    unexpected ones are kept for raise_logged_bugs()."""
    root = logging.getLogger()
    root.handlers[:] = [_UNEXPECTED]
    root.setLevel(logging.DEBUG)


def raise_logged_bugs() -> None:
    """Raises Finding with the first traceback logged since the last call."""
    records, _UNEXPECTED.records = _UNEXPECTED.records, []
    if records:
        r = records[0]
        text = logging.Formatter().formatException(r.exc_info) if r.exc_info else ""
        raise Finding(f"logged as a bug: {r.getMessage()}\n{text}")


_LOOP: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    """One event loop for the whole run (a target's protocol objects call
    call_soon and call_later on it)."""
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
        asyncio.set_event_loop(_LOOP)
    return _LOOP


def run(coro):
    return loop().run_until_complete(coro)


def feed(conn, reads: list[bytes]) -> None:
    """The reads given to a connection (RESP, HTTP or gRPC, on a stand-in
    transport) as they arrive, the loop turning between them, until it
    closes; then the client is gone."""
    async def go():
        transport = Transport()
        conn.connection_made(transport)
        try:
            for read in reads:
                if transport.closed:
                    break
                conn.data_received(read)
                await turns()
        finally:
            conn.connection_lost(None)
    run(go())


async def turns(n: int = 3) -> None:
    """Lets what the protocol scheduled run (slices, next turns)."""
    for _ in range(n):
        await asyncio.sleep(0)


def server(**settings):
    """A whole server in this process, listening nowhere: manual clock,
    no rules database, no snapshot file."""
    from fastlimit.server import config as cfg
    from fastlimit.server.app import Server

    quiet_logs()
    base = dict(manual_clock=True, rules_db=None, snapshot_file=None, http_port=0, grpc_port=0)
    base.update(settings)
    return Server(cfg.Settings(**base).validate())


def reset(srv) -> None:
    """Forgets what one input left on a server: its buckets and rules."""
    srv.flush_buckets()
    for rule in srv.rules.list():
        srv.rules.delete(rule.id)


def split(data: bytes, parts: int = 3) -> list[bytes]:
    """data cut in up to `parts` reads at points its first byte picks,
    so that the fuzzer explores reads cut anywhere; the first byte is
    not part of the reads."""
    if not data:
        return []
    seed, body = data[0], data[1:]
    cuts = sorted({(seed * (i + 1) * 7919) % (len(body) + 1) for i in range(parts - 1)})
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(body[start:cut])
        start = cut
    pieces.append(body[start:])
    return [p for p in pieces if p]


def main(one_input) -> None:
    """Runs the fuzzer on one_input (instrumented too: its own checks are
    coverage, and a build without counters in C has no other for a C
    parser) with libFuzzer's command line."""
    atheris.Setup(sys.argv, atheris.instrument_func(one_input))
    atheris.Fuzz()


@contextlib.contextmanager
def expect(*errors: type[BaseException]):
    """The parser's clear errors pass; anything else is a finding (it
    propagates, and atheris reports it with the input)."""
    try:
        yield
    except errors:
        pass
