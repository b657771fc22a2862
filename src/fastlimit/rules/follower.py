"""Every node follows the PostgreSQL rules store (rules-store
postgresql://...): the subsystem that keeps the rules in force equal to
the table, and writes rule changes through to it.

On every connect, in this order (a change committed between two steps
is never lost): LISTEN, then read every rule in one statement and apply
the difference, then apply each notification by reading the rows it
names.  Notifications sent while the node was away are lost, so a
reconnect always reads everything again, and so does a periodic full
compare (rules-store-resync), the backstop for anything missed.  A
heartbeat on the listener (rules-store-heartbeat) finds a half-open
connection, which TCP alone may not report for minutes.

Whatever the database does, checks go on with the last rules applied:
a connection lost, refused or stalled only changes ``state`` and starts
reconnecting with backoff; rule changes are then refused (TRYAGAIN),
with nothing changed anywhere.  The registry's SQLite file (rules-db) is
the cache of the last rules applied, which a node started while the
database is down runs with.

A row that does not validate is not applied (its rule keeps its
previous version in force, or stays absent) and is named, with the
reason, in INFO rules, /metrics and the log; the others still apply.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Iterable

from fastlimit._resp import ReplyError
from fastlimit.rules.model import Rule, RuleError, parse_rule, show
from fastlimit.rules.postgres import (
    Conflict,
    Postgres,
    PostgresError,
    Row,
    Write,
    parse_notification,
    redacted,
)
from fastlimit.rules.registry import parse_stored
from fastlimit.rules.store import StoreError, wall_ms
from fastlimit.server.subsystem import Subsystem, collector_paused, info_text

log = logging.getLogger("fastlimit.rules")

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
# Ids waiting to be read (a burst of notifications); past this many, one
# full read instead.
MAX_PENDING = 10_000
# Rejected rows named in INFO and /metrics; past it they are counted only.
MAX_REJECTED_SHOWN = 100
# Rows validated on the loop; more are validated in a thread.
PARSE_IN_THREAD = 200


class StoreUnavailable(ReplyError):
    """A rule change refused because the store cannot take it now."""


class StoreFollower(Subsystem):
    def __init__(self, registry, settings, name: str):
        self.registry = registry
        self.url = settings.rules_store
        self.shown_url = redacted(self.url)
        self.pg = Postgres(self.url, settings.rules_store_timeout, f"fastlimit {name}")
        self.required = settings.rules_store_required
        self.apply_settings(settings)
        self.state = "connecting"       # connected, reconnecting, down
        self.last_error = ""
        self.pending: dict[str, int | None] = {}    # id -> commit time (ms) of its notification
        self.full_read_wanted = False
        self._wake = asyncio.Event()
        self._lost = False
        self._probe: tuple[str, asyncio.Event] | None = None
        self._task: asyncio.Task | None = None
        self.file_import_pending = bool(registry.rules_file)
        # observed
        self.notifications = 0
        self.full_reads = 0
        self.rows_applied = 0
        self.rows_rejected = 0
        self.connects = 0
        self.last_version = 0
        self.lag_ms = 0
        self.max_lag_ms = 0
        self.synced_at = 0.0            # monotonic: when the node last knew it was in step
        self.rejected: dict[str, tuple[int, str]] = {}   # id -> (version, reason)

    def apply_settings(self, settings) -> None:
        self.resync_s = settings.rules_store_resync
        self.heartbeat_s = settings.rules_store_heartbeat
        self.max_staleness_s = settings.rules_store_max_staleness

    # ---- connecting ---------------------------------------------------------------

    async def start(self) -> None:
        """The first connect and full read, before the listeners serve
        (bounded by rules-store-timeout); when the database cannot be
        reached the node starts with the cached rules, or refuses to start
        without any if rules-store-required says so."""
        try:
            await self._connect()
        except Exception as e:          # noqa: BLE001 - as _run's: never the end of the node
            e = _expected(e)
            self._failed(e)
            if self.required and len(self.registry) == 0:
                raise StoreError(f"rules store {self.shown_url} cannot be reached ({e}) and "
                                 "there are no cached rules (rules-store-required yes)") from None
            log.warning("rules store %s cannot be reached (%s); serving the %d cached rules "
                        "until it can", self.shown_url, e, len(self.registry))
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.pg.close()

    async def _connect(self) -> None:
        self._lost = False
        self.pending.clear()
        await self.pg.open(self._notified, self._connection_lost)
        await self._probe_channel()
        self.connects += 1
        await self._full_read()
        self.state = "connected"
        self.last_error = ""
        log.warning("rules store %s connected: %d rules, version %d", self.shown_url,
                    len(self.registry), self.last_version)
        if self.file_import_pending:
            await self._import_rules_file()

    async def _probe_channel(self) -> None:
        """A notification this node sends itself must come back within
        rules-store-timeout: else the listener would hear nothing, ever,
        as behind a transaction-pooling PgBouncer, and the node would
        follow changes only at each full compare."""
        nonce = os.urandom(8).hex()
        self._probe = (nonce, asyncio.Event())
        try:
            await self.pg.probe(nonce)
            async with asyncio.timeout(self.pg.timeout_s):
                await self._probe[1].wait()
        except TimeoutError:
            raise PostgresError(
                "a notification sent on the channel did not come back: LISTEN does not "
                "work on this connection (a transaction pooler such as PgBouncer in "
                "transaction mode between?); rules-store needs a session of its own") from None
        finally:
            self._probe = None

    def _failed(self, e: Exception, state: str = "down") -> None:
        """A connect that failed (down), or a connection lost
        (reconnecting, until an attempt fails)."""
        self.pg.close()
        self.state = state
        self.last_error = str(e)

    async def _run(self) -> None:
        """Follows for as long as the server runs: whatever a connection
        does, the loop goes on (an error it did not foresee is logged with
        its trace and handled as a lost connection, never the end of it)."""
        delay = BACKOFF_FIRST_S
        while True:
            if self.state != "connected":
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                try:
                    await self._connect()
                    delay = BACKOFF_FIRST_S
                except Exception as e:      # noqa: BLE001 - see the docstring
                    self._failed(_expected(e))
                    delay = min(delay * 2, BACKOFF_MAX_S)
                    continue
            try:
                await self._follow()
            except Exception as e:          # noqa: BLE001 - see the docstring
                e = _expected(e)
                log.warning("rules store %s lost (%s); checks go on with the %d rules in "
                            "force, reconnecting", self.shown_url, e, len(self.registry))
                self._failed(e, "reconnecting")
                delay = BACKOFF_FIRST_S

    def _connection_lost(self) -> None:
        self._lost = True
        self._wake.set()

    # ---- following -----------------------------------------------------------------

    def _notified(self, payload: str) -> None:
        if self._probe is not None and self._probe[0] in payload:
            self._probe[1].set()
            return
        parsed = parse_notification(payload)
        if parsed is None:
            return              # another node's probe
        self.notifications += 1
        rule_id, at = parsed
        if rule_id is None or len(self.pending) >= MAX_PENDING:
            self.full_read_wanted = True
        else:
            self.pending.setdefault(rule_id, at)
        self._wake.set()

    async def _follow(self) -> None:
        """Applies notifications as they come, and the full compare and
        the heartbeat when they are due; returns never, raises
        PostgresError when the connection is lost."""
        loop = asyncio.get_running_loop()
        next_resync = loop.time() + self.resync_s
        next_beat = loop.time() + self.heartbeat_s
        while True:
            timeout = max(0.0, min(next_resync, next_beat) - loop.time())
            try:
                # not wait_for: on 3.11 it returns, and the stop's cancel
                # is lost, when the event is set as the cancel comes (a
                # change's own notification at shutdown: the stop hung)
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if self._lost:
                raise PostgresError("the connection was closed")
            now = loop.time()
            if self.full_read_wanted or now >= next_resync:
                await self._full_read()
                next_resync = loop.time() + self.resync_s
            if self.pending:
                await self._read_pending()
            if now >= next_beat:
                await self.pg.heartbeat()
                self.synced_at = time.monotonic()
                next_beat = loop.time() + self.heartbeat_s

    async def _read_pending(self) -> None:
        pending, self.pending = self.pending, {}
        rows = await self.pg.read(list(pending))
        await self._apply(rows)
        stamps = [at for at in pending.values() if at is not None]
        if stamps:
            self.lag_ms = max(0, wall_ms() - min(stamps))
            self.max_lag_ms = max(self.max_lag_ms, self.lag_ms)

    async def _full_read(self) -> None:
        """Every rule compared by version, and the documents read of those
        that differ (the whole table when nothing is in force yet)."""
        self.full_read_wanted = False
        self.full_reads += 1
        if len(self.registry) == 0:
            rows = await self.pg.read_all()
        else:
            versions = await self.pg.read_versions()
            differ = [rule_id for rule_id, version in versions.items()
                      if self._version_here(rule_id) != version]
            rows = await self.pg.read(differ) if differ else []
            here = {e.rule.id for e in self.registry.entries()}
            rows += [Row(rule_id, None, 0, "", 0) for rule_id in here - versions.keys()]
        await self._apply(rows)
        self.synced_at = time.monotonic()

    def _version_here(self, rule_id: str) -> int | None:
        entry = self.registry.entry(rule_id)
        if entry is not None:
            return entry.version
        held = self.rejected.get(rule_id)
        return held[0] if held is not None else None

    async def _apply(self, rows: Iterable[Row], known: dict[str, Rule] | None = None) -> None:
        """Applies rows read from the table.  Their documents are validated
        in a thread when there are many (a bulk change), so that clients
        are served meanwhile; known: rules this node just wrote, already
        validated."""
        rows = list(rows)
        known = known or {}

        def prepare():
            with collector_paused():
                return [(r.id, known.get(r.id) if r.doc is not None and r.id in known
                         else parse_stored(r.id, r.doc), r.version, r.source, r.updated_ms)
                        for r in rows]
        many = sum(r.id not in known for r in rows) > PARSE_IN_THREAD
        prepared = await asyncio.to_thread(prepare) if many else prepare()
        # what each row changes here, told before it is applied: a row
        # already in force (a node's own write, read back) applies nothing
        changes = {r.id for r in rows
                   if (r.doc is None) != (self.registry.entry(r.id) is None)
                   or (r.doc is not None and self._version_here(r.id) != r.version)}
        rejected = self.registry.apply_stored(prepared)
        refused = {rule_id for rule_id, _, _ in rejected}
        for r in rows:
            if r.id not in refused:
                self.rejected.pop(r.id, None)
                self.rows_applied += r.id in changes
                self.last_version = max(self.last_version, r.version)
        for rule_id, version, reason in rejected:
            if self.rejected.get(rule_id, (None,))[0] == version:
                continue            # said already
            self.rows_rejected += 1
            if len(self.rejected) < MAX_REJECTED_SHOWN or rule_id in self.rejected:
                self.rejected[rule_id] = (version, reason)
            log.warning("rules store: rule %s version %d not applied, %s in force: %s",
                        show(rule_id), version,
                        "its previous version" if self.registry.entry(rule_id) else "none",
                        show(reason, 200))

    # ---- writing -------------------------------------------------------------------

    async def write(self, writes: list[Write]) -> list[Row]:
        """Writes rule changes to the table (validated here first, so that
        what commits is what every node can apply) and applies them here
        at once: the writer reads its own writes.  Raises RuleError for a
        change that would not apply, Conflict when a version precondition
        fails (this node then reads the current rows), StoreUnavailable
        when the store cannot take it."""
        known = {w.id: parse_rule(w.id, w.doc) for w in writes if w.doc is not None}
        self.registry.vet(list(known.values()))
        if self.state != "connected":
            raise self._unavailable(self.last_error or self.state)
        try:
            rows = await self.pg.write(writes)
        except Conflict:
            await self._catch_up([w.id for w in writes])
            raise
        except PostgresError as e:
            self._lost = True
            self._wake.set()
            raise self._unavailable(f"{e}; the change may or may not have been stored, and "
                                    "every node applies it if it was") from None
        await self._apply(rows, known)
        return rows

    async def _catch_up(self, ids: list[str]) -> None:
        try:
            await self._apply(await self.pg.read(ids))
        except PostgresError:
            pass        # the follower's next turn finds the connection gone

    def _unavailable(self, why: str) -> StoreUnavailable:
        return StoreUnavailable(f"TRYAGAIN rules store {self.shown_url} is unavailable "
                                f"({why}); nothing changed")

    async def _import_rules_file(self) -> None:
        """rules-file with a shared store: its rules are written to the
        table (as CL.RULE RELOAD does), once, at the first connect."""
        try:
            await self.reload_file()
        except (RuleError, ReplyError) as e:
            log.warning("rules file %s not written to the rules store: %s",
                        self.registry.rules_file, e)
        self.file_import_pending = False

    async def reload_file(self, read=None) -> dict:
        """CL.RULE RELOAD and SIGHUP: the rules file's changes written to the
        table in one transaction (rules that came from it and are gone from
        it are deleted); counts as RuleRegistry.reload gives them.  read:
        as RuleRegistry.reload's."""
        puts, deletes, summary = self.registry.file_plan(read)
        writes = [Write(rule.id, rule.to_json(), "file") for rule in puts]
        writes += [Write(rule_id, None, "file") for rule_id in deletes]
        if writes:
            await self.write(writes)
        return summary

    # ---- observing -----------------------------------------------------------------

    def staleness_s(self) -> float:
        """Seconds since the node last knew its rules equal the table's (0
        while connected)."""
        if self.state == "connected":
            return 0.0
        return time.monotonic() - self.synced_at if self.synced_at else float("inf")

    def ready(self) -> tuple[bool, str]:
        stale = self.staleness_s()
        if self.max_staleness_s and stale > self.max_staleness_s:
            return False, (f"the rules store has been {self.state} for more than "
                           f"{self.max_staleness_s:g} s (rules-store-max-staleness)")
        return True, ""

    def info_sections(self, sections, named):
        stale = self.staleness_s()
        fields = {
            "rules_store": self.shown_url,
            "rules_store_state": self.state,
            "rules_store_version": self.last_version,
            "rules_store_lag_ms": self.lag_ms,
            "rules_store_max_lag_ms": self.max_lag_ms,
            "rules_store_stale_seconds": -1 if stale == float("inf") else round(stale, 3),
            "rules_store_connects": self.connects,
            "rules_store_notifications": self.notifications,
            "rules_store_full_reads": self.full_reads,
            "rules_store_rows_applied": self.rows_applied,
            "rules_store_rows_rejected": self.rows_rejected,
            "rules_store_rejected_now": len(self.rejected),
            "rules_store_last_error": info_text(self.last_error, 200),
        }
        if "rules" in named:
            for i, (rule_id, (version, reason)) in enumerate(sorted(self.rejected.items())):
                fields[f"rejected{i}"] = (f"id={rule_id},version={version},"
                                          f"reason={info_text(reason, 200)}")
        return {"rules": fields}


def _expected(e: Exception) -> PostgresError:
    """A PostgresError as it is; anything else logged with its trace (a bug
    to fix) and made one."""
    if isinstance(e, PostgresError):
        return e
    log.error("rules store: unexpected %s", type(e).__name__, exc_info=e)
    return PostgresError(f"unexpected {type(e).__name__}: {e}")
