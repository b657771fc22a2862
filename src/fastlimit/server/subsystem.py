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

from collections.abc import Mapping


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
