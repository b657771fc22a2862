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
import gc
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
            with collector_paused():
                outcome: tuple = (work(), None)
        except Exception as e:          # handed to done, which says what failed
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(done, *outcome)
        except RuntimeError:            # the loop is closed: the server is exiting
            pass

    threading.Thread(target=run, name=name, daemon=True).start()


# collector_paused(): how many are in force, and whether the collector
# was on before the first of them.
_pauses = [0, True]
_pauses_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a document is made into
    objects (it makes few cycles).  Millions of new objects otherwise set
    off full collections one after another, each holding the GIL, and so
    the loop, for hundreds of milliseconds: a 1.3 MB configuration took
    5 s to read with them, stalling the loop 0.8 s at a time, and 1 s
    without.  Counted, so that readings in several threads overlap."""
    with _pauses_lock:
        if _pauses[0] == 0:
            _pauses[1] = gc.isenabled()
            gc.disable()
        _pauses[0] += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses[0] -= 1
            if _pauses[0] == 0 and _pauses[1]:
                gc.enable()
