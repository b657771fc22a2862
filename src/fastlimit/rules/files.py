"""The rules file: rules declared at start-up and on reload, in TOML

    [rules.orders]
    match = { resource = "POST /orders", tier = "free" }
    capacity = 20
    refill_per_second = 10

    [rules."reports/hourly"]
    algorithm = "token_bucket"
    capacity = 1000
    refill = 1000
    period_ms = 3600000

or in JSON, ``{"rules": {"orders": {...}, ...}}``, each rule the same
document as CL.RULE SET takes.  A file ending in .json is JSON, .toml is
TOML; any other name is JSON if it starts with "{" and TOML otherwise.

The file must have the rules table, even empty (``[rules]`` or
``{"rules": {}}``): an empty or truncated file (an editor caught
mid-save) then fails to load instead of deleting every file rule.

A file is bounded (MAX_FILE_BYTES, MAX_FILE_RULES): it is read and
checked in a thread on SIGHUP, but its changed rules are put in force on
the event loop, which a bounded number of rules keeps short.
"""

from __future__ import annotations

import tomllib

from fastlimit.rules.model import NESTED_TOO_DEEPLY, Rule, RuleError, load_json, parse_rule, show

MAX_FILE_BYTES = 16 * 1024**2
MAX_FILE_RULES = 50_000


def load_rules_file(path: str) -> dict[str, Rule]:
    """Every rule of the file, by id in file order; RuleError naming the
    file (and the rule and field) if any of it is unusable."""
    text = _read(path)
    data = _parse(path, text)
    rules = _rules_table(path, data)
    if len(rules) > MAX_FILE_RULES:
        raise RuleError(f"rules file {path} has {len(rules)} rules, more than the "
                        f"{MAX_FILE_RULES} a rules file may have")
    out = {}
    for rule_id, doc in rules.items():
        try:
            out[rule_id] = parse_rule(rule_id, doc)
        except RuleError as e:
            raise RuleError(f"rules file {path}: {e}") from None
    return out


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise RuleError(f"cannot read rules file {path}: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise RuleError(f"rules file {path} is larger than the {MAX_FILE_BYTES} bytes "
                        "a rules file may have")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RuleError(f"rules file {path} is not valid UTF-8 "
                        f"(at byte offset {e.start})") from None


def is_json(path: str, text: str) -> bool:
    lowered = path.lower()
    if lowered.endswith(".json"):
        return True
    if lowered.endswith(".toml"):
        return False
    return text.lstrip().startswith("{")


def _parse(path: str, text: str):
    json_text = is_json(path, text)
    try:
        return load_json(text) if json_text else tomllib.loads(text)
    except (ValueError, RecursionError) as e:    # TOMLDecodeError is a ValueError
        reason = NESTED_TOO_DEEPLY if isinstance(e, RecursionError) else show(str(e), 200)
        raise RuleError(f"rules file {path} is not valid {'JSON' if json_text else 'TOML'}: "
                        f"{reason}") from None


def _rules_table(path: str, data) -> dict:
    if not isinstance(data, dict) or "rules" not in data:
        raise RuleError(f"rules file {path}: no rules table (write [rules.<id>] tables in "
                        'TOML or {"rules": {"<id>": {...}}} in JSON; [rules] alone for none)')
    for key in data:
        if key != "rules":
            raise RuleError(f"rules file {path}: unknown top-level key '{show(str(key))}' "
                            "(only rules)")
    rules = data["rules"]
    if not isinstance(rules, dict):
        raise RuleError(f"rules file {path}: rules must be a table of rules by id")
    return rules
