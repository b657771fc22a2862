"""How a part of the server plugs into the event-loop layer.

``app.Server`` owns the listeners, the clients and the loop's timers;
everything else it runs (the sweep, rules, replication, snapshots, and
next pub/sub, the cluster bus, each extra listener) is a ``Subsystem``
held in ``Server.subsystems`` and driven through the same calls, in the
order of that list (stop in reverse):

    apply_settings(s)   at construction and after every CONFIG SET that
                        passed validation; raise ValueError to refuse a
                        value the subsystem cannot use (CONFIG SET then
                        fails and nothing changes)
    await start()       once the loop runs and the listeners are up
    tick()              every 1/hz seconds: short, bounded work
    cron()              once a second
    info_sections(sections, named)
                        {section: {field: value}} added to INFO, for the
                        sections being rendered; named holds those the
                        client asked for by name, for detail too large
                        for every poll
    await stop()        at shutdown, after the listeners stopped taking
                        connections

A subsystem overrides only what it needs.  Its settings live in
config.py (a field, a parser, whether CONFIG SET may change it); its
commands in a module of server/commands/ and entries in the table.  See
ARCHITECTURE.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping


class Subsystem:
    def apply_settings(self, settings) -> None:
        """Takes the settings in force (see the module docstring)."""

    async def start(self) -> None:
        """Begins the work that needs the running loop."""

    def tick(self) -> None:
        """Short periodic work, hz times a second."""

    def cron(self) -> None:
        """Once-a-second work."""

    def info_sections(self, sections: frozenset[str],
                      named: frozenset[str]) -> Mapping[str, Mapping[str, object]]:
        """Fields for INFO, by section."""
        return {}

    async def stop(self) -> None:
        """Ends the work and releases what start() took."""


async def start_accepting(server: asyncio.Server) -> None:
    """Starts a listener bound earlier (start_serving=False), raising
    OSError if one of its sockets is not listening after all.  Between
    the bind and the listen another socket may bind the same port (both
    with SO_REUSEADDR, neither listening yet: another process, or another
    front of this server given the same port) and listen first; uvloop's
    start_serving then swallows its own listen's EADDRINUSE (and closes
    the socket), and the server would say it is ready on a port something
    else answers."""
    names = [sock.getsockname()[:2] for sock in server.sockets]
    await server.start_serving()
    for name, sock in zip(names, server.sockets, strict=True):
        if sock.fileno() < 0 or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise OSError(errno.EADDRINUSE, f"error while attempting to listen on address "
                                            f"{name!r}: address already in use")


def info_text(text: str, limit: int = 256) -> str:
    """A string from outside (a server's error, a client's key) as one INFO
    field or log line: one line, printable, no commas (INFO's readers split
    fields on them), bounded."""
    return "".join(c if c.isprintable() else " " for c in " ".join(text.split())) \
        .replace(",", ";")[:limit]


def off_loop(work: Callable[[], object], done: Callable[[object, Exception | None], None],
             name: str) -> None:
    """Runs work() in a thread of its own and calls done(result, None), or
    done(None, exception), on the running loop: for work that grows with
    its input (a configuration read and checked), so that clients are
    served meanwhile.  A daemon thread: a shutdown never waits for it, and
    done is then never called."""
    loop = asyncio.get_running_loop()

    def run() -> None:
        try:
            with collector_paused(), gil_shared_finely():
                outcome: tuple = (work(), None)
                # What it made goes to the oldest generation unscanned: else
                # the first young collection after the pause scans it all
                # on the loop (10 ms for 10,000 descriptors); its objects
                # are long-lived, and any garbage among them is found by a
                # full collection as before.
                gc.freeze()
                gc.unfreeze()
        except Exception as e:          # handed to done, which says what failed
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(done, *outcome)
        except RuntimeError:            # the loop is closed: the server is exiting
            pass

    threading.Thread(target=run, name=name, daemon=True).start()


class WhileAny:
    """A process-wide setting changed while at least one user needs it:
    counted, so that users in several threads overlap; the first changes
    it (change() returns what it was), the last puts it back."""

    def __init__(self, change: Callable[[], object], restore: Callable[[object], None]):
        self.change, self.restore = change, restore
        self.users = 0
        self.saved: object = None
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self.lock:
            if self.users == 0:
                self.saved = self.change()
            self.users += 1
        try:
            yield
        finally:
            with self.lock:
                self.users -= 1
                if self.users == 0:
                    self.restore(self.saved)


def _collector_off() -> bool:
    was = gc.isenabled()
    gc.disable()
    return was


# Python's cyclic garbage collector off while a document is made into
# objects (it makes few cycles).  Millions of new objects otherwise set off
# full collections one after another, each holding the GIL, and so the
# loop, for hundreds of milliseconds: a 1.3 MB configuration took 5 s to
# read with them, stalling the loop 0.8 s at a time, and 1 s without.
collector_paused = WhileAny(_collector_off, lambda was: gc.enable() if was else None)

# How long a thread reading a document may hold the GIL while the loop
# waits for it: a sliced reply's budget (_protocol.SLICE_BUDGET_S), where
# Python's default is 5 ms.  Only while such a thread runs.
READER_SWITCH_S = 0.0005


def _short_switches() -> float:
    was = sys.getswitchinterval()
    sys.setswitchinterval(READER_SWITCH_S)
    return was


gil_shared_finely = WhileAny(_short_switches, lambda was: sys.setswitchinterval(float(was)))  # type: ignore[arg-type]
