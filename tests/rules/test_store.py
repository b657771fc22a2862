"""The rules database: what put() acknowledges survives a kill -9; a
database that cannot be read stops the start with a message naming it and
is left exactly as it was."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from fastlimit.rules.model import parse_rule
from fastlimit.rules.store import RuleStore, StoredRule, StoreError

TB = {"capacity": 20, "refill_per_second": 10}


def rule(rule_id, **fields):
    return parse_rule(rule_id, {**TB, **fields})


def test_put_load_delete(store):
    assert store.load() == []
    store.put(rule("b"), "command", 1000)
    store.put(rule("a", mode="shadow"), "file", 2000)
    assert store.load() == [StoredRule(rule("a", mode="shadow"), "file", 2000),
                            StoredRule(rule("b"), "command", 1000)]
    store.put(rule("b", capacity=5), "file", 3000)          # replaces
    assert store.load()[1] == StoredRule(rule("b", capacity=5), "file", 3000)
    assert store.delete("a") is True
    assert store.delete("a") is False
    assert [s.rule.id for s in store.load()] == ["b"]


def test_put_stamps_the_wall_clock(store):
    import time
    before = time.time_ns() // 1_000_000
    store.put(rule("a"), "command")
    assert before <= store.load()[0].updated_ms <= time.time_ns() // 1_000_000


def test_write_is_one_transaction(store):
    store.put(rule("keep"), "command", 1)
    store.put(rule("gone"), "file", 1)
    store.write(puts=[StoredRule(rule("new"), "file", 2)], deletes=["gone"])
    assert [s.rule.id for s in store.load()] == ["keep", "new"]

    def deletes_that_fail():   # the puts are written, then the disk fails
        yield "keep"
        raise sqlite3.OperationalError("disk I/O error")
    with pytest.raises(StoreError) as e:
        store.write(puts=[StoredRule(rule("other"), "file", 3)], deletes=deletes_that_fail())
    assert str(e.value) == (f"rules database {store.path}: cannot write (disk I/O error); "
                            "nothing was changed")
    assert [s.rule.id for s in store.load()] == ["keep", "new"]


def test_survives_reopen(db_path):
    with RuleStore(db_path) as s:
        s.put(rule("a", match={"resource": "GET /x/*"}), "command", 5)
    with RuleStore(db_path) as s:
        assert s.load() == [StoredRule(rule("a", match={"resource": "GET /x/*"}), "command", 5)]


def test_durable_settings(store):
    db = store._db
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2      # FULL
    assert db.execute("PRAGMA locking_mode").fetchone()[0] == "exclusive"


CHILD = textwrap.dedent("""
    import os, signal
    from fastlimit.rules.model import parse_rule
    from fastlimit.rules.store import RuleStore
    store = RuleStore({path!r})
    for i in range({n}):
        store.put(parse_rule(f"r{{i}}", {{"capacity": i + 1, "refill_per_second": 1}}), "command")
    store.delete("r0")
    # Killed the instant the last write returns: no close, no checkpoint.
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("n", [1, 50])
def test_put_survives_sigkill_right_after(db_path, n):
    child = subprocess.run([sys.executable, "-c", CHILD.format(path=db_path, n=n)],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert os.path.exists(db_path + "-wal")       # the log was never checkpointed
    with RuleStore(db_path) as s:                  # the kernel released the dead lock
        loaded = {r.rule.id: r.rule.params["capacity"] for r in s.load()}
    assert loaded == {f"r{i}": i + 1 for i in range(1, n)}


def test_a_second_opener_is_refused(db_path):
    with RuleStore(db_path):
        with pytest.raises(StoreError) as e:
            RuleStore(db_path)
        assert str(e.value) == (f"rules database {db_path} is in use by another process "
                                "(another fastlimit server?)")
        # The child is the interpreter running the tests, with fastlimit
        # installed (or PYTHONPATH pointing at an in-place build).
        code = "from fastlimit.rules.store import RuleStore, StoreError\n" \
               f"try:\n    RuleStore({db_path!r})\nexcept StoreError as e:\n    print(e)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60).stdout
        assert "is in use by another process" in out


def unreadable(path, reason):
    return (f"rules database {path} is unreadable ({reason}); it was left untouched: "
            "restore it from a backup, or move it aside to start without stored rules")


def test_not_a_database(tmp_path):
    path = str(tmp_path / "rules.db")
    garbage = b"these are not the rules you are looking for\n" * 200
    with open(path, "wb") as f:
        f.write(garbage)
    with pytest.raises(StoreError) as e:
        RuleStore(path)
    assert str(e.value) == unreadable(path, "file is not a database")
    with open(path, "rb") as f:
        assert f.read() == garbage
    assert sorted(os.listdir(tmp_path)) == ["rules.db"]


def test_damaged_page(db_path):
    with RuleStore(db_path) as s:
        for i in range(200):
            s.put(rule(f"r{i:03}", match={"resource": "GET /" + "x" * 500}), "command", 1)
    with open(db_path, "r+b") as f:
        f.seek(4096 * 3)
        f.write(b"\xab" * 300)
    with open(db_path, "rb") as f:
        damaged = f.read()
    with pytest.raises(StoreError) as e:
        RuleStore(db_path).load()
    assert str(e.value).startswith(f"rules database {db_path} is unreadable (")
    with open(db_path, "rb") as f:
        assert f.read() == damaged


def test_stored_rule_that_no_longer_validates(db_path):
    with RuleStore(db_path) as s:
        s.put(rule("good"), "command", 1)
    db = sqlite3.connect(db_path)
    db.execute("INSERT INTO rules (id, json, source, updated_ms) VALUES "
               "('bad', '{\"capacity\": 0, \"refill_per_second\": 1}', 'command', 1)")
    db.commit()
    db.close()
    with RuleStore(db_path) as s, pytest.raises(StoreError) as e:
        s.load()
    assert str(e.value) == (f"rules database {db_path}: stored invalid rule 'bad': "
                            "capacity: must be an integer from 1 to 10^15")


def test_a_schema_1_database_gains_the_version_column_and_keeps_its_rules(db_path):
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE rules (id TEXT PRIMARY KEY NOT NULL, json TEXT NOT NULL, "
               "source TEXT NOT NULL, updated_ms INTEGER NOT NULL)")
    db.execute("INSERT INTO rules VALUES ('old', ?, 'command', 5)", (rule("old").to_json(),))
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    with RuleStore(db_path) as s:
        assert [(r.rule.id, r.updated_ms, r.version) for r in s.load()] == [("old", 5, 0)]
        s.put(rule("new"), "command", 6)
    db = sqlite3.connect(db_path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert db.execute("SELECT id, version FROM rules ORDER BY id").fetchall() == [
        ("new", 0), ("old", 0)]
    db.close()


def test_newer_schema_is_refused(db_path):
    RuleStore(db_path).close()
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA user_version=7")
    db.close()
    with pytest.raises(StoreError, match=r"written by a newer fastlimit \(schema 7, this one reads 2\)"):
        RuleStore(db_path)


def test_missing_directory(tmp_path):
    path = str(tmp_path / "nowhere" / "rules.db")
    with pytest.raises(StoreError) as e:
        RuleStore(path)
    assert str(e.value) == f"cannot open rules database {path}: unable to open database file"
