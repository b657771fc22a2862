"""Named rules: the rule document and its validation (model), the SQLite
rules database (store), the rules file (files) and the registry that keeps
the engine, the database and the file in step (registry)."""

from fastlimit.rules.model import Match, Rule, RuleError, parse_rule

__all__ = ["Match", "Rule", "RuleError", "parse_rule"]
