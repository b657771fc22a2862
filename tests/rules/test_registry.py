"""The registry keeps engine, database and rules file in step: set, get,
delete, list and reload semantics, all-or-nothing batches, version bumps,
rule numbers and the matcher.  Against a recording stand-in for the engine
(its contract), and the real engine in test_registry_engine.py."""

from __future__ import annotations

import pytest

from fastlimit.rules.matching import compile_glob
from fastlimit.rules.model import RuleError, parse_rule
from fastlimit.rules.registry import RuleRegistry
from fastlimit.rules.store import RuleStore, StoreError

TB = {"capacity": 20, "refill_per_second": 10}


def tb(**fields):
    return {**TB, **fields}


@pytest.fixture
def reg(fake_engine, store, registry_factory):
    return registry_factory(fake_engine, store)


def write_rules(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


# ---- one rule at a time -------------------------------------------------------------

def test_set_get_list_delete(reg, store, fake_engine):
    assert reg.list() == [] and reg.get("orders") is None
    rule = reg.set("orders", '{"capacity": 20, "refill_per_second": 10}')
    assert rule == parse_rule("orders", TB)
    assert reg.get("orders") == rule
    reg.set("auth", tb(match={"resource": "POST /login"}))
    assert [r.id for r in reg.list()] == ["auth", "orders"]
    assert [s.rule.id for s in store.load()] == ["auth", "orders"]
    assert reg.entry("orders").source == "command"
    assert reg.delete("orders") is True
    assert reg.delete("orders") is False
    assert reg.get("orders") is None
    assert [s.rule.id for s in store.load()] == ["auth"]
    assert len(reg) == 1


def test_version_and_last_change(reg):
    assert reg.version == 0
    reg.set("a", TB)
    v1, t1 = reg.version, reg.last_change_ms
    assert v1 == 1 and t1 > 0
    reg.set("a", TB)                      # the same rule again: no change
    assert reg.version == v1 and reg.last_change_ms == t1
    reg.set("a", tb(capacity=5))
    assert reg.version == 2 and reg.last_change_ms > t1
    reg.delete("a")
    assert reg.version == 3
    reg.delete("a")                       # nothing to delete: no change
    assert reg.version == 3


def test_an_invalid_rule_changes_nothing(reg, store, fake_engine):
    reg.set("a", TB)
    before = (reg.version, reg.list(), store.load(), list(fake_engine.calls))
    with pytest.raises(RuleError, match="invalid rule 'a': capacity: must be an integer"):
        reg.set("a", tb(capacity=0))
    with pytest.raises(RuleError, match="invalid rule id 'b c'"):
        reg.set("b c", TB)
    assert (reg.version, reg.list(), store.load(), fake_engine.calls) == before


def test_a_rule_the_engine_refuses_changes_nothing(reg, store, fake_engine):
    reg.set("a", TB)
    num = reg.num_by_id["a"]
    before = (reg.version, reg.list(), store.load())
    fake_engine.refuse = lambda n, spec: "capacity: too big" if spec["capacity"] == 7 else None
    with pytest.raises(RuleError) as e:
        reg.set("a", tb(capacity=7))
    assert str(e.value) == "invalid rule 'a': capacity: too big"
    with pytest.raises(RuleError):
        reg.set("new", tb(capacity=7))
    assert (reg.version, reg.list(), store.load()) == before
    assert fake_engine.specs[num]["capacity"] == 20
    assert set(fake_engine.live()) == {num}


class FailingStore:
    """A RuleStore whose writes fail (disk full)."""

    def __init__(self, inner):
        self.inner, self.path = inner, inner.path
        self.fail = False

    def load(self):
        return self.inner.load()

    def write(self, puts=(), deletes=()):
        if self.fail:
            raise StoreError(f"rules database {self.path}: cannot write (database or disk "
                             "is full); nothing was changed")
        return self.inner.write(puts, deletes)


def test_a_failed_write_changes_nothing(fake_engine, store, registry_factory):
    failing = FailingStore(store)
    reg = registry_factory(fake_engine, failing)
    reg.set("a", TB)
    reg.set("b", TB)
    num_a = reg.num_by_id["a"]
    failing.fail = True
    version, live = reg.version, fake_engine.live()
    with pytest.raises(StoreError, match="disk is full"):
        reg.set("a", tb(capacity=5))           # update: the old spec is put back
    with pytest.raises(StoreError):         # new number for a new algorithm: forgotten
        reg.set("a", {"algorithm": "fixed_window", "limit": 5, "window_ms": 1000})
    with pytest.raises(StoreError):
        reg.set("c", TB)                       # new: its number is forgotten
    with pytest.raises(StoreError):
        reg.delete("b")
    assert reg.version == version
    assert reg.get("a") == parse_rule("a", TB) and reg.get("b") is not None
    assert fake_engine.live() == live and fake_engine.specs[num_a]["capacity"] == 20
    failing.fail = False
    assert [s.rule.id for s in store.load()] == ["a", "b"]


def test_without_a_store_rules_live_in_memory(fake_engine, registry_factory):
    reg = registry_factory(fake_engine)
    reg.set("a", TB)
    assert reg.get("a") is not None and reg.delete("a")


def test_acknowledged_rules_are_loaded_at_start(db_path, registry_factory, FakeEngine):
    with RuleStore(db_path) as s:
        reg = registry_factory(FakeEngine(), s)
        reg.set("a", TB)
        reg.set("b", tb(mode="shadow"))
        reg.delete("a")
    with RuleStore(db_path) as s:
        engine = FakeEngine()
        reg = registry_factory(engine, s)
        assert [r.id for r in reg.list()] == ["b"]
        assert engine.specs[reg.num_by_id["b"]]["shadow"] is True
        assert reg.version == 1


def test_a_stored_rule_the_engine_refuses_stops_the_start(db_path, registry_factory, FakeEngine):
    with RuleStore(db_path) as s:
        s.put(parse_rule("a", TB), "command")
    engine = FakeEngine()
    engine.refuse = lambda n, spec: "algorithm: not built in"
    with RuleStore(db_path) as s, pytest.raises(StoreError) as e:
        registry_factory(engine, s)
    assert str(e.value) == (f"rules database {db_path}: invalid rule 'a': "
                            "algorithm: not built in")


# ---- rule numbers ---------------------------------------------------------------------

def test_numbers_keep_buckets_only_when_they_mean_the_same(reg, fake_engine):
    reg.set("a", TB)
    first = reg.num_by_id["a"]
    for change in (tb(capacity=5), tb(capacity=5, mode="shadow"),
                   tb(capacity=5, match={"resource": "GET /*"}), tb(on_failure="closed")):
        reg.set("a", change)
        assert reg.num_by_id["a"] == first      # numbers, match, mode: same buckets
    reg.set("a", tb(key="client+resource"))    # the key scope changes the buckets
    second = reg.num_by_id["a"]
    assert second != first and fake_engine.forgotten == [first]
    reg.set("a", {"algorithm": "gcra", "burst": 1, "count": 1, "period_ms": 1000})
    third = reg.num_by_id["a"]
    assert third not in (first, second) and fake_engine.forgotten == [first, second]
    assert reg.rule_by_num == {third: reg.get("a")}
    # Publication order: the new number is defined, the cache cleared, and
    # only then the old number retired.
    assert fake_engine.calls[-3:] == [("define", third), ("invalidate",), ("forget", second)]


def test_a_deleted_rule_is_never_revived(reg, fake_engine):
    reg.set("a", TB)
    old = reg.num_by_id["a"]
    reg.delete("a")
    assert fake_engine.calls[-2:] == [("invalidate",), ("forget", old)]
    reg.set("a", TB)
    assert reg.num_by_id["a"] != old
    assert reg.rule_id(old) == "a"


def test_numbers_are_never_reused(reg, fake_engine):
    seen = set()
    for i in range(30):
        reg.set(f"r{i % 4}", tb(key="client+resource" if i % 3 else "client"))
        if i % 5 == 0:
            reg.delete(f"r{(i + 1) % 4}")
        nums = set(reg.num_by_id.values())
        seen |= nums
    assert max(seen) == len(seen)               # 1, 2, 3, ... each given once
    assert not set(fake_engine.forgotten) & set(reg.num_by_id.values())


# ---- matching -------------------------------------------------------------------------

def test_matcher(reg, fake_engine):
    assert fake_engine.matcher == reg.matcher
    reg.set("z-any", TB)
    reg.set("orders", tb(match={"resource": "POST /orders"}))
    reg.set("products", tb(match={"resource": "GET /products/*"}))
    reg.set("free", tb(match={"tier": "free"}))
    reg.set("free-ip", tb(match={"tier": "free", "client": "ip:10.*", "resource": "*"}))
    reg.set("everyone", tb(match={"client": "*"}))
    n = reg.num_by_id

    def ids(resource, tier=None):
        return [(reg.rule_id(num), glob) for num, glob in reg.matcher(resource, tier)]

    assert ids(b"POST /orders") == [("everyone", None), ("orders", None), ("z-any", None)]
    assert ids(b"POST /orders", b"free") == [("everyone", None), ("free", None),
                                             ("free-ip", b"ip:10.*"), ("orders", None),
                                             ("z-any", None)]
    assert ids(b"GET /products/42", b"paid") == [("everyone", None), ("products", None),
                                                 ("z-any", None)]
    assert ids(b"GET /products") == [("everyone", None), ("z-any", None)]
    assert ids(b"post /orders") == [("everyone", None), ("z-any", None)]   # case-sensitive
    assert ids(b"POST /orders ") == [("everyone", None), ("z-any", None)]  # whole string
    assert ids(b"") == [("everyone", None), ("z-any", None)]
    assert all(isinstance(num, int) for num, _ in reg.matcher(b"x", None))
    assert n["orders"] in [num for num, _ in reg.matcher(b"POST /orders", None)]


def test_matcher_follows_every_change(reg, fake_engine):
    reg.set("a", tb(match={"resource": "GET /a"}))
    before = fake_engine.invalidations
    assert reg.matcher(b"GET /a", None) == [(reg.num_by_id["a"], None)]
    reg.set("a", tb(match={"resource": "GET /b"}))
    assert fake_engine.invalidations == before + 1
    assert reg.matcher(b"GET /a", None) == []
    assert reg.matcher(b"GET /b", None) == [(reg.num_by_id["a"], None)]
    reg.delete("a")
    assert fake_engine.invalidations == before + 2
    assert reg.matcher(b"GET /b", None) == []


@pytest.mark.parametrize("glob, yes, no", [
    ("GET /products/*", [b"GET /products/1", b"GET /products/", b"GET /products/a/b"],
     [b"GET /products", b"get /products/1"]),
    ("GET /v?/x", [b"GET /v1/x", b"GET /v2/x"], [b"GET /v10/x"]),
    ("GET /[ab]*", [b"GET /a", b"GET /bcd"], [b"GET /c"]),
    ("GET /[!ab]", [b"GET /c"], [b"GET /a"]),
    ("GET /caf\u00e9/*", ["GET /café/1".encode()], [b"GET /cafe/1"]),
    ("a.b+c(d)", [b"a.b+c(d)"], [b"aXb+c(d)"]),           # regex characters are literal
    ("line*", [b"line1\nline2"], []),                      # * crosses newlines, as fnmatch
])
def test_globs(glob, yes, no):
    import fnmatch
    match = compile_glob(glob.encode())
    for s in yes:
        assert match(s) and fnmatch.fnmatchcase(s, glob.encode())
    for s in no:
        assert not match(s) and not fnmatch.fnmatchcase(s, glob.encode())


# ---- the rules file ---------------------------------------------------------------------

FILE_V1 = """
[rules.orders]
match = { resource = "POST /orders" }
capacity = 20
refill_per_second = 10

[rules.search]
capacity = 100
refill_per_second = 50
"""


@pytest.fixture
def rules_file(tmp_path):
    return write_rules(tmp_path / "rules.toml", FILE_V1)


def test_start_loads_the_file(fake_engine, store, rules_file, registry_factory):
    reg = registry_factory(fake_engine, store, rules_file)
    assert [r.id for r in reg.list()] == ["orders", "search"]
    assert {s.rule.id: s.source for s in store.load()} == {"orders": "file", "search": "file"}
    assert reg.entry("orders").source == "file"


def test_reload(fake_engine, store, rules_file, registry_factory):
    reg = registry_factory(fake_engine, store, rules_file)
    reg.set("mine", TB)                                   # by command: not the file's
    orders = reg.num_by_id["orders"]
    version = reg.version
    assert reg.reload() == {"added": 0, "updated": 0, "deleted": 0, "unchanged": 2}
    assert reg.version == version                         # nothing changed
    write_rules(rules_file, FILE_V1.replace("capacity = 20", "capacity = 30")
                .replace("[rules.search]", "[rules.browse]")
                + '\n[rules.mine]\ncapacity = 1\nrefill_per_second = 1\n')
    assert reg.reload() == {"added": 1, "updated": 2, "deleted": 1, "unchanged": 0}
    assert reg.version == version + 1                     # one batch, one version
    assert [r.id for r in reg.list()] == ["browse", "mine", "orders"]
    assert reg.get("orders").params["capacity"] == 30
    assert reg.num_by_id["orders"] == orders              # same buckets
    assert reg.get("mine").params["capacity"] == 1        # the file wins for its ids
    assert {s.rule.id: s.source for s in store.load()} == {
        "browse": "file", "mine": "file", "orders": "file"}


def test_command_rules_not_in_the_file_stay(fake_engine, store, rules_file, registry_factory):
    reg = registry_factory(fake_engine, store, rules_file)
    reg.set("mine", TB)
    reg.set("search", tb(capacity=1))       # a file rule changed by command is the command's
    write_rules(rules_file, "[rules]\n")
    assert reg.reload() == {"added": 0, "updated": 0, "deleted": 1, "unchanged": 0}
    assert [r.id for r in reg.list()] == ["mine", "search"]


@pytest.mark.parametrize("broken", [
    "[rules.orders]\ncapacity = \n",                                  # not TOML
    FILE_V1 + "\n[rules.bad]\ncapacity = 0\nrefill_per_second = 1\n",  # one invalid rule
    "",                                                               # emptied by an editor
])
def test_a_failed_reload_keeps_the_old_rules(fake_engine, store, rules_file, registry_factory,
                                             broken):
    reg = registry_factory(fake_engine, store, rules_file)
    reg.set("mine", TB)
    before = (reg.version, reg.list(), store.load(), fake_engine.live())
    write_rules(rules_file, broken)
    with pytest.raises(RuleError) as e:
        reg.reload()
    assert str(e.value).startswith(f"rules file {rules_file}")
    assert (reg.version, reg.list(), store.load(), fake_engine.live()) == before


def test_a_reload_the_engine_refuses_is_undone(fake_engine, store, rules_file, registry_factory):
    reg = registry_factory(fake_engine, store, rules_file)
    before = (reg.version, reg.list(), store.load(), fake_engine.live())
    write_rules(rules_file, FILE_V1.replace("capacity = 20", "capacity = 21")
                .replace("capacity = 100", "capacity = 7"))
    fake_engine.refuse = lambda n, spec: "capacity: not 7" if spec["capacity"] == 7 else None
    with pytest.raises(RuleError) as e:
        reg.reload()
    assert str(e.value) == "invalid rule 'search': capacity: not 7"
    # orders was staged with capacity 21 before search was refused: put back.
    assert (reg.version, reg.list(), store.load(), fake_engine.live()) == before


def test_reload_without_a_file(reg):
    with pytest.raises(RuleError) as e:
        reg.reload()
    assert str(e.value) == "no rules file is configured (rules-file)"


def test_a_bad_file_stops_the_start(fake_engine, store, tmp_path, registry_factory):
    path = write_rules(tmp_path / "rules.toml", "[rules.x]\ncapacity = 1\n")
    with pytest.raises(RuleError) as e:
        registry_factory(fake_engine, store, path)
    assert str(e.value) == (f"rules file {path}: invalid rule 'x': refill_per_second: "
                            "required (or refill with period_ms)")


def test_start_database_then_file(db_path, rules_file, registry_factory, FakeEngine):
    with RuleStore(db_path) as s:
        reg = registry_factory(FakeEngine(), s, rules_file)
        reg.set("mine", TB)
        reg.set("orders", tb(capacity=99))          # overridden by the file at the next start
    write_rules(rules_file, FILE_V1.replace("[rules.search]", "[rules.browse]"))
    with RuleStore(db_path) as s:
        reg = registry_factory(FakeEngine(), s, rules_file)
        # search left the file while the server was down: gone; orders is the file's.
        assert [r.id for r in reg.list()] == ["browse", "mine", "orders"]
        assert reg.get("orders").params["capacity"] == 20
    with RuleStore(db_path) as s:                    # no rules file configured: all kept
        reg = registry_factory(FakeEngine(), s)
        assert [r.id for r in reg.list()] == ["browse", "mine", "orders"]


# ---- observing -----------------------------------------------------------------------------

def test_stats_survive_a_change_of_algorithm(reg, fake_engine):
    assert reg.stats("a") is None
    reg.set("a", TB)
    num = reg.num_by_id["a"]
    fake_engine.counts[num] = {"allowed": 5, "denied": 2, "shadow_denied": 1}
    assert reg.stats("a") == {"allowed": 5, "denied": 2, "shadow_denied": 1}
    reg.set("a", {"algorithm": "fixed_window", "limit": 5, "window_ms": 1000})
    fake_engine.counts[reg.num_by_id["a"]] = {"allowed": 1, "denied": 0, "shadow_denied": 0}
    assert reg.stats("a") == {"allowed": 6, "denied": 2, "shadow_denied": 1}
    reg.delete("a")
    reg.set("a", TB)                                   # a new rule: counts from zero
    assert reg.stats("a") == {"allowed": 0, "denied": 0, "shadow_denied": 0}


def test_denials_name_rules_newest_first(reg, fake_engine):
    reg.set("a", TB)
    reg.set("b", TB)
    a, b = reg.num_by_id["a"], reg.num_by_id["b"]
    fake_engine.recent = [(100, a, b"user:1", 1), (300, b, b"user:2", 5), (200, a, b"u", 0)]
    reg.delete("a")
    assert reg.denials() == [(300, "b", b"user:2", 5), (200, "a", b"u", 0),
                             (100, "a", b"user:1", 1)]
    assert reg.denials(1) == [(300, "b", b"user:2", 5)]


def test_info(reg, fake_engine):
    reg.set("api:orders", TB)
    reg.set("b", tb(mode="shadow"))
    fake_engine.counts[reg.num_by_id["b"]] = {"allowed": 3, "denied": 0, "shadow_denied": 2}
    assert "rule0" not in reg.info()
    info = reg.info(per_rule=True)
    assert info == {
        "rules": 2, "rules_version": 2, "rules_last_change_ms": reg.last_change_ms,
        "rules_file": "", "rules_db": reg.store.path,
        "rule0": "id=api:orders,algorithm=token_bucket,mode=enforce,source=command,"
                 "allowed=0,denied=0,shadow_denied=0",
        "rule1": "id=b,algorithm=token_bucket,mode=shadow,source=command,"
                 "allowed=3,denied=0,shadow_denied=2"}
    assert all(":" not in key for key in info)


def test_registry_needs_start_for_the_matcher(fake_engine):
    reg = RuleRegistry(fake_engine)
    assert fake_engine.matcher is None
    reg.start()
    assert fake_engine.matcher == reg.matcher


def test_numbers_and_ids(reg):
    reg.set("a", TB)
    num = reg.num_for("a")
    assert num == reg.num_by_id["a"] and reg.rule_id(num) == "a"
    assert reg.num_for("nope") is None
    assert reg.rule_id(999) == "999"


def test_reload_from_signal_logs_and_never_raises(fake_engine, store, rules_file,
                                                  registry_factory, caplog):
    reg = registry_factory(fake_engine, store, rules_file)
    caplog.set_level("INFO", logger="fastlimit.rules")
    write_rules(rules_file, FILE_V1.replace("capacity = 20", "capacity = 21"))
    assert reg.reload_from_signal() is True
    assert f"rules file {rules_file} reloaded: 0 added, 1 updated, 0 deleted, 1 unchanged" \
        in caplog.text
    write_rules(rules_file, "[rules.x]\n")
    assert reg.reload_from_signal() is False
    assert "rules reload failed, the rules in force are unchanged: rules file" in caplog.text
    assert [r.id for r in reg.list()] == ["orders", "search"]
    reg.rules_file = None
    assert reg.reload_from_signal() is False
    assert "SIGHUP: no rules file is configured" in caplog.text
