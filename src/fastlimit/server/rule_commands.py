"""CL.RULE: named rules at runtime.

    CL.RULE SET <id> <json>      OK, or an error naming the field and why
    CL.RULE GET <id>             the rule's canonical JSON document, or null
    CL.RULE DEL <id>             1 if the rule existed, else 0
    CL.RULE LIST                 the ids, sorted
    CL.RULE RELOAD               re-reads the rules file: OK, or why not
    CL.RULE STATS [<id>]         {allowed, denied, shadow_denied} of one
                                 rule (null if none), or {id: {...}} of all
    CL.RULE DENIALS [<count>]    recent denials, newest first:
                                 [time_ms, rule_id, key, cost] each

The registry is ``conn.core.app.rules`` (fastlimit.rules.RuleRegistry).
``build_rule_command()`` gives the container command for the table; it
imports the table helpers when called, so that commands.py may import
this module at its top without an import cycle.
"""

from __future__ import annotations

from fastlimit._resp import ReplyError, SimpleString
from fastlimit.rules.model import RuleError

OK = SimpleString("OK")


def _rules(conn):
    return conn.core.app.rules


def _rule_id(arg: bytes) -> str:
    # Invalid UTF-8 becomes U+FFFD, which no rule id may hold, so such an
    # id is refused (SET) or simply not found (GET, DEL, STATS).
    return arg.decode("utf-8", "replace")


def _reply_error(e: RuleError) -> ReplyError:
    return ReplyError(f"ERR {e}")


def _count(arg: bytes) -> int:
    try:
        n = int(arg.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        n = 0
    if not 1 <= n <= 1_000_000 or arg.decode("ascii", "replace") != str(n):
        raise ReplyError("ERR count must be a positive integer")
    return n


def cmd_rule_set(conn, args):
    try:
        _rules(conn).set(_rule_id(args[2]), args[3])
    except RuleError as e:
        raise _reply_error(e) from None
    return OK


def cmd_rule_get(conn, args):
    rule = _rules(conn).get(_rule_id(args[2]))
    return rule.to_json().encode("utf-8") if rule is not None else None


def cmd_rule_del(conn, args):
    try:
        return int(_rules(conn).delete(_rule_id(args[2])))
    except RuleError as e:
        raise _reply_error(e) from None


def cmd_rule_list(conn, args):
    return [rule.id.encode() for rule in _rules(conn).list()]


def cmd_rule_reload(conn, args):
    try:
        _rules(conn).reload()
    except RuleError as e:
        raise _reply_error(e) from None
    return OK


def cmd_rule_stats(conn, args):
    registry = _rules(conn)
    if len(args) > 3:
        raise ReplyError("ERR syntax error: CL.RULE STATS [<id>]")
    if len(args) == 3:
        return registry.stats(_rule_id(args[2]))
    return {rule.id: registry.stats(rule.id) for rule in registry.list()}


def cmd_rule_denials(conn, args):
    if len(args) > 3:
        raise ReplyError("ERR syntax error: CL.RULE DENIALS [<count>]")
    count = _count(args[2]) if len(args) == 3 else None
    return [[time_ms, rule_id.encode(), key, cost]
            for time_ms, rule_id, key, cost in _rules(conn).denials(count)]


def rule_subcommands() -> list:
    """The CL.RULE subcommands as fastlimit._protocol.Command objects."""
    from fastlimit.server.commands import sub

    write = ("write", "noscript")
    read = ("readonly", "loading", "stale")
    return [
        sub("cl.rule", "set", 4, cmd_rule_set,
            "Creates or replaces a named rule from its JSON document.", write,
            [("id", "string"), ("rule", "string")]),
        sub("cl.rule", "get", 3, cmd_rule_get,
            "Returns a rule's JSON document, or null.", read, [("id", "string")]),
        sub("cl.rule", "del", 3, cmd_rule_del,
            "Deletes a rule and drops its buckets. Replies 1 if it existed.", write,
            [("id", "string")]),
        sub("cl.rule", "list", 2, cmd_rule_list, "Returns the ids of all rules.", read),
        sub("cl.rule", "reload", 2, cmd_rule_reload,
            "Re-reads the rules file, all or nothing.", write),
        sub("cl.rule", "stats", -2, cmd_rule_stats,
            "Returns allowed, denied and shadow-denied counts per rule.", read,
            [("id", "string", {"optional": True})]),
        sub("cl.rule", "denials", -2, cmd_rule_denials,
            "Returns recent denials: [time_ms, rule_id, key, cost], newest first.", read,
            [("count", "integer", {"optional": True})]),
    ]


def build_rule_command():
    """The CL.RULE container command, ready for the command table."""
    from fastlimit.server.commands import container

    return container("cl.rule", -2, (), rule_subcommands(),
                     {"summary": "A container for named rule commands.",
                      "group": "ratelimit", "since": "0.2.0"})
