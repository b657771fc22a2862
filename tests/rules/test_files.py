"""The rules file, TOML and JSON: the same rules either way, and errors
that name the file, the rule and the field."""

from __future__ import annotations

import json

import pytest

from fastlimit.rules import files
from fastlimit.rules.files import load_rules_file
from fastlimit.rules.model import RuleError, parse_rule

TOML = """\
# Limits for the public API.
[rules.orders]
match = { resource = "POST /orders", tier = "free" }
capacity = 20
refill_per_second = 10

[rules."reports/hourly"]
capacity = 1000
refill = 1000
period_ms = 3600000
key = "client+resource"

[rules."login:ip"]
algorithm = "gcra"
burst = 4
count = 5
period_ms = 60000
on_failure = "closed"

[rules."login:ip".match]
resource = "POST /login"
client = "ip:*"
"""

EXPECTED = {
    "orders": parse_rule("orders", {"match": {"resource": "POST /orders", "tier": "free"},
                                    "capacity": 20, "refill_per_second": 10}),
    "reports/hourly": parse_rule("reports/hourly", {"capacity": 1000, "refill": 1000,
                                                    "period_ms": 3600000,
                                                    "key": "client+resource"}),
    "login:ip": parse_rule("login:ip", {"algorithm": "gcra", "burst": 4, "count": 5,
                                        "period_ms": 60000, "on_failure": "closed",
                                        "match": {"resource": "POST /login",
                                                  "client": "ip:*"}}),
}


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8") if isinstance(text, str) else path.write_bytes(text)
    return str(path)


def as_json(rules: dict) -> str:
    return json.dumps({"rules": {rule_id: r.to_dict() for rule_id, r in rules.items()}},
                      indent=2)


def test_toml(tmp_path):
    rules = load_rules_file(write(tmp_path, "rules.toml", TOML))
    assert rules == EXPECTED
    assert list(rules) == ["orders", "reports/hourly", "login:ip"]   # file order


def test_json_gives_the_same_rules(tmp_path):
    assert load_rules_file(write(tmp_path, "rules.json", as_json(EXPECTED))) == EXPECTED


def test_format_by_content_when_the_name_does_not_say(tmp_path):
    assert load_rules_file(write(tmp_path, "rules", TOML)) == EXPECTED
    assert load_rules_file(write(tmp_path, "rules.conf", as_json(EXPECTED))) == EXPECTED


def test_utf8_bom_is_fine(tmp_path):
    assert load_rules_file(write(tmp_path, "rules.toml", "\ufeff" + TOML)) == EXPECTED


def test_empty_rules_table_means_no_rules(tmp_path):
    assert load_rules_file(write(tmp_path, "rules.toml", "[rules]\n")) == {}
    assert load_rules_file(write(tmp_path, "rules.json", '{"rules": {}}')) == {}


def error_of(path) -> str:
    with pytest.raises(RuleError) as e:
        load_rules_file(path)
    return str(e.value)


def test_invalid_rule_names_file_rule_and_field(tmp_path):
    path = write(tmp_path, "rules.toml", TOML.replace("capacity = 20", "capacity = 0"))
    assert error_of(path) == (f"rules file {path}: invalid rule 'orders': capacity: "
                              "must be an integer from 1 to 10^15")
    path = write(tmp_path, "rules.json", '{"rules": {"a": {"capacity": 5, "refil": 1}}}')
    assert error_of(path) == (f"rules file {path}: invalid rule 'a': refil: unknown field")


def test_invalid_rule_id(tmp_path):
    path = write(tmp_path, "rules.toml", '[rules."bad id"]\ncapacity = 1\nrefill_per_second = 1\n')
    assert error_of(path) == (f"rules file {path}: invalid rule id 'bad id': must be 1 to 128 "
                              "characters of A-Z a-z 0-9 _ . : / -")


def test_rule_that_is_not_a_table(tmp_path):
    path = write(tmp_path, "rules.toml", '[rules]\norders = 5\n')
    assert error_of(path) == f"rules file {path}: invalid rule 'orders': must be an object"


def test_toml_types_are_checked(tmp_path):
    path = write(tmp_path, "rules.toml", '[rules.a]\ncapacity = 2.5\nrefill_per_second = 1\n')
    assert error_of(path) == (f"rules file {path}: invalid rule 'a': capacity: must be an "
                              "integer from 1 to 10^15")
    path = write(tmp_path, "rules.toml", '[rules.a]\ncapacity = 5\nrefill_per_second = 1\n'
                                         'match = { tier = 1979-05-27 }\n')
    assert error_of(path) == (f"rules file {path}: invalid rule 'a': match.tier: must be a "
                              "string of 1 to 1024 characters")


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.toml")
    assert error_of(path) == f"cannot read rules file {path}: No such file or directory"


def test_syntax_errors(tmp_path):
    path = write(tmp_path, "rules.toml", "[rules.a]\ncapacity = \n")
    assert error_of(path) == (f"rules file {path} is not valid TOML: Invalid value "
                              "(at line 2, column 12)")
    path = write(tmp_path, "rules.json", '{"rules": {"a": {"capacity": 5,}}}')
    assert error_of(path).startswith(f"rules file {path} is not valid JSON: Expecting "
                                     "property name enclosed in double quotes")
    path = write(tmp_path, "rules.json", '{"rules": {"a": {}, "a": {}}}')
    assert error_of(path) == f"rules file {path} is not valid JSON: duplicate key 'a'"
    path = write(tmp_path, "rules.toml", b"[rules]\n# caf\xe9\n")
    assert error_of(path) == f"rules file {path} is not valid UTF-8 (at byte offset 13)"


@pytest.mark.parametrize("text", ["", "# everything commented out\n", "[rule.orders]\n"])
def test_a_file_without_the_rules_table_is_an_error(tmp_path, text):
    path = write(tmp_path, "rules.toml", text)
    assert error_of(path) == (f"rules file {path}: no rules table (write [rules.<id>] "
                              'tables in TOML or {"rules": {"<id>": {...}}} in JSON; '
                              "[rules] alone for none)")


def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, "rules.toml", "[rules]\n[server]\nport = 1\n")
    assert error_of(path) == f"rules file {path}: unknown top-level key 'server' (only rules)"
    path = write(tmp_path, "rules.json", '{"rules": []}')
    assert error_of(path) == f"rules file {path}: rules must be a table of rules by id"
    path = write(tmp_path, "rules.json", '[1]')
    assert "no rules table" in error_of(path)


def test_a_rules_file_larger_than_its_bound_is_refused_unread(tmp_path, monkeypatch):
    text = as_json(EXPECTED)
    path = write(tmp_path, "rules.json", text)
    monkeypatch.setattr(files, "MAX_FILE_BYTES", len(text))
    assert load_rules_file(path) == EXPECTED
    monkeypatch.setattr(files, "MAX_FILE_BYTES", len(text) - 1)
    assert error_of(path) == (f"rules file {path} is larger than the {len(text) - 1} bytes "
                              "a rules file may have")


def test_a_rules_file_with_more_rules_than_its_bound_is_refused(tmp_path, monkeypatch):
    path = write(tmp_path, "rules.toml", TOML)
    monkeypatch.setattr(files, "MAX_FILE_RULES", 3)
    assert load_rules_file(path) == EXPECTED
    monkeypatch.setattr(files, "MAX_FILE_RULES", 2)
    assert error_of(path) == f"rules file {path} has 3 rules, more than the 2 a rules file may have"
