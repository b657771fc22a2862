"""Named rules: the rule document and its validation (model), the SQLite
rules database (store), the rules file (files) and the registry that keeps
the engine, the database and the file in step (registry); the PostgreSQL
store a fleet follows (postgres: the table and its SQL; follower: the
subsystem that keeps the rules in force equal to the table).  Also:
matching (the match index), commands (CL.RULE, CL.APPLY, CL.ACQUIRE,
CL.RELEASE), http_api (/v1/rules), subsystem (SIGHUP, INFO, the denial
log).  Kernel parts: _rules.pyx (the engine)."""

from fastlimit.rules.model import Match, Rule, RuleError, parse_rule

__all__ = ["Match", "Rule", "RuleError", "parse_rule"]
