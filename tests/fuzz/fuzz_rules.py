"""Rule documents (rules/model.py, rules/files.py): a CL.RULE SET document,
or a rules file in JSON, in TOML or by its first character (the first
byte picks which).  RuleError is the one clear error.  A rule that loads
must read back the same from its own JSON, and be accepted by the rule
engine (RuleRegistry.set compiles it)."""

import os
import sys
import tempfile

import harness

with harness.instrumented():
    from fastlimit.rules.files import load_rules_file
    from fastlimit.rules.model import RuleError, parse_rule

SERVER = harness.server()
DIR = tempfile.mkdtemp(prefix="fuzz-rules-")
NAMES = ["rules.json", "rules.toml", "rules.conf"]


def from_file(name: str, text: bytes):
    path = os.path.join(DIR, name)
    with open(path, "wb") as f:
        f.write(text)
    return load_rules_file(path)


def one_input(data: bytes) -> None:
    mode, text = (data[0] % 4, data[1:]) if data else (0, b"")
    with harness.expect(RuleError):
        rules = {"fuzz": parse_rule("fuzz", text)} if mode == 0 else from_file(NAMES[mode - 1],
                                                                                text)
        for rule_id, rule in rules.items():
            again = parse_rule(rule_id, rule.to_json())
            if again != rule:
                raise harness.Finding(f"{rule!r} reads back as {again!r}")
            SERVER.rules.set(rule_id, rule.to_json())
    harness.reset(SERVER)


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
