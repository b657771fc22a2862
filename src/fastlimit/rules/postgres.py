"""The PostgreSQL rules store: the table every node of a fleet reads its
rules from, and the SQL that reads and writes it.  No knowledge of the
registry or of the loop's subsystems here: follow.py drives it.

One table of rules, one row per rule: the document as jsonb, a version
from a sequence that a trigger takes again on every insert and update
(so a version is never used twice, even by a rule deleted and created
again), who wrote it (the database role and application_name) and when.
A second trigger sends NOTIFY on the channel with the id and version
only: a payload is limited to 8,000 bytes, so the document is read from
the table.  Rows written with plain SQL notify as ours do.  The DDL is
created on first use, under an advisory lock so that nodes starting
together do not race, and it is in the README for a DBA to run by hand.

asyncpg (by uvloop's authors, no libpq) is imported when a store is
first opened: a server on the embedded SQLite default never loads it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

TABLE = "fastlimit_rules"
CHANNEL = "fastlimit_rules"     # lower case: LISTEN folds the name, pg_notify does not
SCHEMA_VERSION = 1
# A row's document is read back as jsonb prints it; the rule model
# bounds a document's size, the column bounds what a hand insert can put.
MAX_DOCUMENT_BYTES = 64 * 1024
MAX_ID_CHARS = 128

SCHEMA_DDL = f"""
CREATE SEQUENCE IF NOT EXISTS {TABLE}_version;
CREATE TABLE IF NOT EXISTS {TABLE} (
    id          text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND {MAX_ID_CHARS}),
    doc         jsonb NOT NULL CHECK (octet_length(doc::text) <= {MAX_DOCUMENT_BYTES}),
    version     bigint NOT NULL DEFAULT 0,    -- set by {TABLE}_stamp()
    source      text NOT NULL DEFAULT 'sql',
    updated_by  text NOT NULL DEFAULT current_user,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {TABLE}_schema (version integer NOT NULL);
INSERT INTO {TABLE}_schema (version)
    SELECT {SCHEMA_VERSION} WHERE NOT EXISTS (SELECT 1 FROM {TABLE}_schema);

-- Every insert and update takes a new version and says who and when,
-- whoever wrote it (fastlimit, psql, a migration).
CREATE OR REPLACE FUNCTION {TABLE}_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := nextval('{TABLE}_version');
    NEW.updated_by := current_user
        || coalesce(' (' || nullif(current_setting('application_name', true), '') || ')', '');
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END $$;
CREATE OR REPLACE TRIGGER {TABLE}_stamp BEFORE INSERT OR UPDATE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION {TABLE}_stamp();

-- NOTIFY with the id and version only; it is delivered when (and if) the
-- transaction commits.  "at" is the change's time, for the lag from
-- commit to apply.  TRUNCATE names no rows: every node reads everything.
CREATE OR REPLACE FUNCTION {TABLE}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
    at bigint := floor(extract(epoch FROM clock_timestamp()) * 1000);
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('{CHANNEL}', json_build_object('op', 'resync', 'at', at)::text);
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    PERFORM pg_notify('{CHANNEL}', json_build_object(
        'id', r.id, 'v', r.version, 'op', lower(TG_OP), 'at', at)::text);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER {TABLE}_notify AFTER INSERT OR UPDATE OR DELETE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION {TABLE}_notify();
CREATE OR REPLACE TRIGGER {TABLE}_truncate AFTER TRUNCATE ON {TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION {TABLE}_notify();
"""

_COLUMNS = "id, doc::text, version, source, (extract(epoch FROM updated_at) * 1000)::bigint"
SELECT_ALL = f"SELECT {_COLUMNS} FROM {TABLE}"
SELECT_SOME = f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = ANY($1::text[])"
SELECT_VERSIONS = f"SELECT id, version FROM {TABLE}"
# Many rules in one statement; a row whose document and source are
# already there is left alone (no new version, no notification).
UPSERT_MANY = (f"INSERT INTO {TABLE} AS r (id, doc, source) "
               "SELECT i, d::jsonb, s "
               "FROM unnest($1::text[], $2::text[], $3::text[]) AS u(i, d, s) "
               "ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, source = excluded.source "
               "WHERE r.doc IS DISTINCT FROM excluded.doc "
               "OR r.source IS DISTINCT FROM excluded.source "
               f"RETURNING {_COLUMNS}")
DELETE_MANY = f"DELETE FROM {TABLE} WHERE id = ANY($1::text[])"
CREATE_ONLY = (f"INSERT INTO {TABLE} (id, doc, source) VALUES ($1, $2::jsonb, $3) "
               f"ON CONFLICT (id) DO NOTHING RETURNING {_COLUMNS}")
UPDATE_IF = (f"UPDATE {TABLE} SET doc = $2::jsonb, source = $3 WHERE id = $1 AND version = $4 "
             f"RETURNING {_COLUMNS}")
DELETE_IF = f"DELETE FROM {TABLE} WHERE id = $1 AND version = $2 RETURNING id"


class PostgresError(Exception):
    """The store cannot be reached or used; the text says why."""


class Conflict(Exception):
    """A conditional write whose precondition no longer holds: the row
    changed (or appeared, or went) since the version the writer saw."""


@dataclass(frozen=True)
class Row:
    """A rule as the table holds it; doc None: there is no such row."""
    id: str
    doc: str | None
    version: int
    source: str
    updated_ms: int


@dataclass(frozen=True)
class Write:
    """One rule change of a write.  doc None deletes.  expect: None
    writes whatever is there; a version: only over that version; 0
    (with a doc): only where there is no such rule (create only)."""
    id: str
    doc: str | None
    source: str = "command"
    expect: int | None = None


def is_postgres_url(value: str) -> bool:
    return urlsplit(value).scheme in ("postgresql", "postgres")


def redacted(url: str) -> str:
    """The URI as INFO, logs and CONFIG GET show it: the password, if
    any, replaced, so that it never leaves the node."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _row(record) -> Row:
    return Row(record[0], record[1], record[2], record[3], record[4])


def probe_payload(nonce: str) -> str:
    """What a node sends itself after connecting (Postgres.probe)."""
    return json.dumps({"op": "probe", "nonce": nonce})


def parse_notification(payload: str) -> tuple[str | None, int | None] | None:
    """(id, commit time in ms) of a notification; id None: read every
    rule (a TRUNCATE, or a payload this version does not know); None: a
    node's probe, which changes nothing.  Bad text (someone else's NOTIFY
    on our channel) means a full read."""
    try:
        note = json.loads(payload)
    except ValueError:
        return None, None
    if not isinstance(note, dict):
        return None, None
    if note.get("op") == "probe":
        return None
    at = note.get("at")
    at = at if isinstance(at, int) else None
    rule_id = note.get("id")
    if note.get("op") in ("insert", "update", "delete") and isinstance(rule_id, str):
        return rule_id, at
    return None, at


class Postgres:
    """Two connections to one database: the listener (LISTEN, in
    autocommit, never in a transaction, so NOTIFY's queue never waits on
    it) and the worker, which runs every read and write one after
    another, so what it applies is in the order the database saw it.
    Every call is bounded by timeout_s; a call that fails or times out
    raises PostgresError, and the caller closes and reconnects."""

    def __init__(self, url: str, timeout_s: float, application_name: str):
        self.url = url
        self.timeout_s = timeout_s
        self.application_name = application_name
        self.listener: Any = None
        self.worker: Any = None
        # One statement at a time (an asyncpg connection runs one), in the
        # order they were asked for.
        self._turn = asyncio.Lock()

    async def open(self, on_notify, on_lost) -> None:
        """Connects both, makes the schema if missing, then LISTENs: a
        change committed after this returns is notified (read everything
        after it, not before: see the LISTEN notes in the module docs)."""
        import asyncpg  # type: ignore[import-untyped]  # noqa: PLC0415 - only with a store

        try:
            self.worker = await self._connect(asyncpg)
            await self._ensure_schema()
            self.listener = await self._connect(asyncpg)
            self.listener.add_termination_listener(lambda _conn: on_lost())
            self.worker.add_termination_listener(lambda _conn: on_lost())
            await self.listener.add_listener(
                CHANNEL, lambda _c, _pid, _channel, payload: on_notify(payload))
        except PostgresError:
            self.close()
            raise
        except _failures(asyncpg) as e:
            self.close()
            raise PostgresError(_reason(e)) from None

    async def _connect(self, asyncpg):
        try:
            return await asyncpg.connect(
                self.url, timeout=self.timeout_s, command_timeout=self.timeout_s,
                server_settings={"application_name": self.application_name})
        except (*_failures(asyncpg), ValueError) as e:   # ValueError: a URI asyncpg cannot use
            raise PostgresError(_reason(e)) from None

    async def _ensure_schema(self) -> None:
        if await self.worker.fetchval("SELECT pg_is_in_recovery()"):
            raise PostgresError("the server is a hot standby, which refuses LISTEN and "
                                "writes: point rules-store at the primary (or add "
                                "target_session_attrs read-write with every host)")
        async with self.worker.transaction():
            await self.worker.execute("SELECT pg_advisory_xact_lock(hashtext($1))", TABLE)
            found = await self.worker.fetchval(
                "SELECT to_regclass($1) IS NOT NULL", f"{TABLE}_schema")
            if found:
                version = await self.worker.fetchval(f"SELECT max(version) FROM {TABLE}_schema")
                if version is not None and version > SCHEMA_VERSION:
                    raise PostgresError(
                        f"table {TABLE} was made by a newer fastlimit (schema {version}, "
                        f"this one reads {SCHEMA_VERSION})")
            await self.worker.execute(SCHEMA_DDL)

    def close(self) -> None:
        """Drops both connections at once, without a goodbye that a
        stalled network would hold up."""
        for conn in (self.listener, self.worker):
            if conn is not None and not conn.is_closed():
                conn.terminate()
        self.listener = self.worker = None

    async def probe(self, nonce: str) -> None:
        """Sends a notification on the channel, for the listener to see
        come back (StoreFollower checks it does)."""
        payload = probe_payload(nonce)
        await self._call(lambda c: c.execute("SELECT pg_notify($1, $2)", CHANNEL, payload))

    # ---- reading --------------------------------------------------------------------

    async def heartbeat(self) -> None:
        """A round trip on the listener: a half-open connection, which
        would otherwise look healthy for minutes, is found within one."""
        await self._call(lambda c: c.fetchval("SELECT 1"), on_listener=True)

    async def read_all(self) -> list[Row]:
        """Every rule, in one statement: one consistent snapshot."""
        return [_row(r) for r in await self._call(lambda c: c.fetch(SELECT_ALL))]

    async def read_versions(self) -> dict[str, int]:
        return dict(await self._call(lambda c: c.fetch(SELECT_VERSIONS)))

    async def read(self, ids: list[str]) -> list[Row]:
        """The rows of these ids; one that is gone comes back with doc None."""
        found = {r[0]: _row(r) for r in await self._call(
            lambda c: c.fetch(SELECT_SOME, ids))}
        return [found.get(rule_id, Row(rule_id, None, 0, "", 0)) for rule_id in ids]

    # ---- writing ----------------------------------------------------------------------

    async def write(self, writes: list[Write]) -> list[Row]:
        """Makes the writes in one transaction, all or nothing; returns
        each rule's row as it now is (doc None: deleted).  Raises
        Conflict (nothing written) when an expected version does not
        hold, PostgresError when the database fails or does not answer
        in time: then the change may or may not have committed, and
        every node applies it if it did."""
        async def run(conn):
            async with conn.transaction():
                rows = [await _write_one(conn, w) for w in writes if w.expect is not None]
                puts = [w for w in writes if w.expect is None and w.doc is not None]
                if puts:
                    rows += await _upsert(conn, puts)
                gone = [w.id for w in writes if w.expect is None and w.doc is None]
                if gone:
                    await conn.execute(DELETE_MANY, gone)
                    rows += [Row(rule_id, None, 0, "", 0) for rule_id in gone]
                return rows
        try:
            return await self._call(run)
        except _ConflictAt as e:
            raise Conflict(e.rule_id) from None

    async def _call(self, work, on_listener: bool = False):
        """work(connection) on the worker (or the listener), bounded by
        timeout_s, after the calls before it; the connection is the one
        in place when it begins, whatever close() does meanwhile."""
        import asyncpg  # noqa: PLC0415 - loaded by open()

        async with self._turn:
            if self.worker is None or self.listener is None:
                raise PostgresError("not connected")
            conn = self.listener if on_listener else self.worker
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await work(conn)
            except _ConflictAt:
                raise
            except _failures(asyncpg) as e:
                raise PostgresError(_reason(e)) from None


def _failures(asyncpg) -> tuple[type[BaseException], ...]:
    """What a connection's failure may raise: the network, the server, the
    driver's view of a closed connection, and its InternalClientError (an
    operation still in progress on a connection that was cut under it)."""
    return (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
            asyncpg.exceptions.InternalClientError)


async def _upsert(conn, puts: list[Write]) -> list[Row]:
    """Unconditional puts, one statement; each rule's row as it now is."""
    rows = [_row(r) for r in await conn.fetch(
        UPSERT_MANY, [w.id for w in puts], [w.doc for w in puts], [w.source for w in puts])]
    unchanged = [w.id for w in puts if w.id not in {r.id for r in rows}]
    if unchanged:
        rows += [_row(r) for r in await conn.fetch(SELECT_SOME, unchanged)]
    return rows


async def _write_one(conn, w: Write) -> Row:
    """A conditional write (w.expect set)."""
    if w.doc is None:
        if await conn.fetchval(DELETE_IF, w.id, w.expect) is None:
            raise _ConflictAt(w.id)
        return Row(w.id, None, 0, w.source, 0)
    if w.expect == 0:
        record = await conn.fetchrow(CREATE_ONLY, w.id, w.doc, w.source)
    else:
        record = await conn.fetchrow(UPDATE_IF, w.id, w.doc, w.source, w.expect)
    if record is None:
        raise _ConflictAt(w.id)
    return _row(record)


class _ConflictAt(Exception):
    def __init__(self, rule_id: str):
        super().__init__(rule_id)
        self.rule_id = rule_id


def _reason(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "no answer in time"
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:200]
