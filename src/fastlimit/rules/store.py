"""The rules database: one SQLite table of (id, json, source, updated_ms,
version).  With a PostgreSQL rules-store (postgres.py) it is that node's
cache of the last rules it applied, which it starts from when the
database is down; version is then the row's version in PostgreSQL (0
for rules that never came from there).

Durability: every write is one transaction committed with
``synchronous=FULL`` in WAL mode, so when ``put()`` returns the rule is in
the write-ahead log and fsync'ed: a kill -9 (or a power loss) right after
cannot lose it.  WAL rather than the rollback journal because a WAL commit
is one append and one fsync, where DELETE mode writes and syncs a journal,
the database and the directory; rule changes then cost about one fsync.

The database is opened with an exclusive lock held for the life of the
server: two servers writing one rules database would silently diverge, so
the second one refuses to start instead.

A database that cannot be read (not SQLite, damaged pages, a rule that no
longer validates) is never repaired, truncated or moved: opening it raises
``StoreError`` naming the file, and the server refuses to start, so no
rule is ever lost without an operator deciding it.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from fastlimit.rules.model import Rule, RuleError, parse_rule

SCHEMA_VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS rules (
    id TEXT PRIMARY KEY NOT NULL,
    json TEXT NOT NULL,
    source TEXT NOT NULL,
    updated_ms INTEGER NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
)
"""
# What each older schema needs to become this one (schema 1 had no version).
MIGRATIONS = {1: "ALTER TABLE rules ADD COLUMN version INTEGER NOT NULL DEFAULT 0"}


class StoreError(RuleError):
    """The rules database cannot be opened, read or written."""


@dataclass(frozen=True)
class StoredRule:
    rule: Rule
    source: str           # "command" (CL.RULE SET), "file" (the rules file), "sql"
    updated_ms: int
    version: int = 0      # the row's version in a PostgreSQL store, else 0


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class RuleStore:
    def __init__(self, path: str, cache: bool = False):
        """cache: the file only caches a PostgreSQL store's table (which is
        compared again at every connect), so a commit need not wait for
        the disk: synchronous=NORMAL, one fsync per WAL checkpoint rather
        than one per change, which every node would otherwise make on its
        event loop for every change of the fleet's rules."""
        self.path = path
        self.cache = cache
        self._db = self._open()

    # ---- opening -----------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: no implicit transactions; each write
            # below says where its transaction begins and ends.
            db = sqlite3.connect(self.path, isolation_level=None, timeout=0)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open rules database {self.path}: {e}") from None
        try:
            self._configure(db)
            self._check_integrity(db)
            self._create_schema(db)
        except sqlite3.OperationalError as e:
            db.close()
            if "locked" in str(e):
                raise StoreError(f"rules database {self.path} is in use by another "
                                 "process (another fastlimit server?)") from None
            raise self._unreadable(e) from None
        except sqlite3.DatabaseError as e:
            db.close()
            raise self._unreadable(e) from None
        except StoreError:
            db.close()
            raise
        return db

    def _unreadable(self, reason) -> StoreError:
        return StoreError(f"rules database {self.path} is unreadable ({reason}); it was "
                          "left untouched: restore it from a backup, or move it aside "
                          "to start without stored rules")

    def _configure(self, db: sqlite3.Connection) -> None:
        # Exclusive locking must be chosen before WAL is entered; with it
        # the WAL index lives in process memory, not in a -shm file.
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        db.execute("PRAGMA journal_mode=WAL").fetchone()
        db.execute("PRAGMA synchronous=NORMAL" if self.cache else "PRAGMA synchronous=FULL")
        # Take the lock now, at start, rather than at the first rule change.
        db.execute("BEGIN EXCLUSIVE")
        db.execute("COMMIT")

    def _check_integrity(self, db: sqlite3.Connection) -> None:
        problems = [row[0] for row in db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise self._unreadable("; ".join(problems[:3]))
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"rules database {self.path} was written by a newer "
                             f"fastlimit (schema {version}, this one reads "
                             f"{SCHEMA_VERSION})")

    @staticmethod
    def _create_schema(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        found = db.execute("PRAGMA user_version").fetchone()[0]
        if found in MIGRATIONS and db.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'rules'").fetchone():
            db.execute(MIGRATIONS[found])
        db.execute(SCHEMA)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        db.execute("COMMIT")

    # ---- reading -----------------------------------------------------------------

    def load(self) -> list[StoredRule]:
        """Every stored rule, validated, in id order."""
        try:
            rows = self._db.execute(
                "SELECT id, json, source, updated_ms, version FROM rules ORDER BY id").fetchall()
        except sqlite3.DatabaseError as e:
            raise self._unreadable(e) from None
        out = []
        for rule_id, text, source, updated_ms, version in rows:
            try:
                rule = parse_rule(rule_id, text)
            except RuleError as e:
                raise StoreError(f"rules database {self.path}: stored {e}") from None
            out.append(StoredRule(rule, source, updated_ms, version))
        return out

    # ---- writing -----------------------------------------------------------------

    def put(self, rule: Rule, source: str, updated_ms: int | None = None) -> None:
        self.write(puts=[StoredRule(rule, source, wall_ms() if updated_ms is None else updated_ms)])

    def delete(self, rule_id: str) -> bool:
        """Removes a rule; whether it was there."""
        return self.write(deletes=[rule_id]) > 0

    def write(self, puts=(), deletes=()) -> int:
        """Stores `puts` (StoredRule) and removes `deletes` (ids) in one
        transaction: all of them are durable when this returns, or none
        (StoreError).  Returns how many rows were deleted."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT INTO rules (id, json, source, updated_ms, version) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                    "json = excluded.json, source = excluded.source, "
                    "updated_ms = excluded.updated_ms, version = excluded.version",
                    [(s.rule.id, s.rule.to_json(), s.source, s.updated_ms, s.version)
                     for s in puts])
                deleted = db.executemany("DELETE FROM rules WHERE id = ?",
                                         [(rule_id,) for rule_id in deletes]).rowcount
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except Exception as e:   # sqlite3.Error, or a row it cannot hold
            raise StoreError(f"rules database {self.path}: cannot write ({e}); "
                             "nothing was changed") from None
        return max(deleted, 0)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> RuleStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
