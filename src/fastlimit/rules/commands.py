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

Checks by rule id (the {rule_id, key, cost} form of other limiters) and
the concurrency limiter's leases:

    CL.APPLY <id>[,<id>...] <client_key> [RESOURCE r] [COST n] [DETAIL] [PRIORITY p]
                                 like CL.LIMIT, for the named rules
    CL.ACQUIRE <id> <client_key> [RESOURCE r]
                                 [allowed, limit, remaining, retry_after_ms,
                                 lease_id], lease_id -1 when denied
    CL.RELEASE <id> <client_key> <lease_id> [RESOURCE r]
                                 1 if the lease was held, else 0

The registry is ``conn.core.app.rules`` (fastlimit.rules.RuleRegistry).
With a PostgreSQL rules-store (``conn.core.app.rules_store``) SET, DEL and
RELOAD write to its table instead, and reply once the table has the
change and it is in force here (rules/follower.py).
"""

from __future__ import annotations

from fastlimit._load import priority_value
from fastlimit._protocol import READONLY_ERROR, Awaited
from fastlimit._resp import ReplyError, parse_integer
from fastlimit._rules import HomeElsewhere
from fastlimit.rls.config import ConfigError as RlsConfigError
from fastlimit.rules.model import E15, RuleError, parse_rule
from fastlimit.rules.postgres import Write
from fastlimit.rules.registry import SOURCE_COMMAND
from fastlimit.server.arguments import integer
from fastlimit.server.commands.replies import OK


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


def _shared(conn):
    """The PostgreSQL rules-store every node follows, or None."""
    return conn.core.app.rules_store


async def _written(conn, writes: list[Write], reply=OK):
    """A rule change through the shared store: in force here when the
    table has it (read-your-writes), on the other nodes as they read it."""
    try:
        await _shared(conn).write(writes)
    except RuleError as e:
        raise _reply_error(e) from None
    return reply


def cmd_rule_set(conn, args):
    rule_id = _rule_id(args[2])
    try:
        if _shared(conn) is not None:
            doc = parse_rule(rule_id, args[3]).to_json()
            return Awaited(_written(conn, [Write(rule_id, doc, SOURCE_COMMAND)]))
        _rules(conn).set(rule_id, args[3])
    except RuleError as e:
        raise _reply_error(e) from None
    return OK


def cmd_rule_get(conn, args):
    rule = _rules(conn).get(_rule_id(args[2]))
    return rule.document if rule is not None else None


def cmd_rule_del(conn, args):
    rule_id = _rule_id(args[2])
    if _shared(conn) is not None:
        existed = _rules(conn).entry(rule_id) is not None
        return Awaited(_written(conn, [Write(rule_id, None, SOURCE_COMMAND)], int(existed)))
    try:
        return int(_rules(conn).delete(rule_id))
    except RuleError as e:
        raise _reply_error(e) from None


def cmd_rule_list(conn, args):
    return [rule.id.encode() for rule in _rules(conn).list()]


def cmd_rule_reload(conn, args):
    if conn.core.app.rls.path:
        # the Envoy rate limit service's YAML (rls-config), read off the loop
        return Awaited(_reloaded_with_rls(conn))
    if _shared(conn) is not None:
        return Awaited(_reloaded_into_store(conn))
    return _reloaded_here(conn)


def _reloaded_here(conn):
    try:
        _rules(conn).reload()
    except RuleError as e:
        raise ReplyError(f"ERR {e}") from None
    return OK


async def _reloaded_with_rls(conn):
    try:
        await conn.core.app.rls.reload_off_loop("CL.RULE RELOAD")
    except RlsConfigError as e:
        raise ReplyError(f"ERR {e}") from None
    if not _rules(conn).rules_file:
        return OK
    if _shared(conn) is not None:
        return await _reloaded_into_store(conn)
    return _reloaded_here(conn)


async def _reloaded_into_store(conn):
    try:
        await _shared(conn).reload_file()
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


def _options(args, start: int, allowed: set[str]) -> dict:
    """Trailing KEYWORD value options (and the flag DETAIL)."""
    options, i = {}, start
    while i < len(args):
        name = args[i].decode("utf-8", "replace").lower()
        if name == "detail" and "detail" in allowed:
            options["detail"], i = True, i + 1
            continue
        if name not in allowed or i + 1 >= len(args):
            raise ReplyError(f"ERR syntax error at '{args[i].decode('utf-8', 'replace')}'")
        options[name], i = args[i + 1], i + 2
    return options


def _number(conn, rule_id: str) -> int:
    num = _rules(conn).num_for(rule_id)
    if num is None:
        raise ReplyError(f"ERR no such rule '{rule_id}'")
    return num


def _cost(options: dict) -> int:
    # The same rules and text as CL.LIMIT's COST.
    cost = parse_integer(options.get("cost", b"1"))
    if cost is None or not 0 <= cost <= E15:
        raise ReplyError("ERR COST must be an integer from 0 to 10^15")
    return cost


def cmd_apply(conn, args):
    options = _options(args, 3, {"resource", "cost", "detail", "priority"})
    ids = [_rule_id(part) for part in args[1].split(b",")]
    nums = [_number(conn, rule_id) for rule_id in ids]
    cost = _cost(options)
    if conn.core.readonly and cost != 0:
        raise ReplyError(READONLY_ERROR)    # a replica answers peeks only
    priorities = conn.priorities(_priority(options))
    detail = options.get("detail", False)
    try:
        shed = conn.core.shed_rules(nums, *priorities)
    except ValueError as e:
        raise ReplyError(f"ERR {e}") from None
    if shed is not None:
        return [*shed, []] if detail else list(shed)
    resource = options.get("resource", b"")
    return _checked(conn, args, detail, (args[2], resource, cost), lambda: conn.core.rules.apply(
        nums, args[2], cost, resource, detail=detail))


def cmd_limit(conn, args):
    """CL.LIMIT in Python, for the checks of home rules (README, "Home
    rules"): the fast path (cl_limit, _protocol_checks.pxi) runs every
    other one, and comes here when the check's key lives in another
    region; a region asked by another runs it here (CL.REGIONCHECK)."""
    options = _options(args, 3, {"tier", "cost", "detail", "priority"})
    cost = _cost(options)
    _priority(options)
    if conn.core.readonly and cost != 0:
        raise ReplyError(READONLY_ERROR)
    detail = options.get("detail", False)
    return _checked(conn, args, detail, (args[1], args[2], cost), lambda: conn.core.rules.limit(
        args[1], args[2], options.get("tier"), cost, detail=detail))


def _checked(conn, args, detail: bool, counted: tuple[bytes, bytes, int], check):
    """The reply of a rules check (CL.LIMIT, CL.APPLY): its five integers,
    with DETAIL the rules' steps; one whose key lives in another region
    is answered as regions/subsystem.py answer_elsewhere says (that
    region's reply, an Awaited one), counted (client key, resource,
    cost) against the home allowances while it is unreachable."""
    try:
        result = check()
    except HomeElsewhere as e:
        answer = conn.core.app.regions_sync.answer_elsewhere(e, list(args), *counted, detail)
        return answer if isinstance(answer, list) else Awaited(answer)
    except ValueError as e:
        raise ReplyError(f"ERR {e}") from None
    if not detail:
        return list(result)
    five, steps = result
    return [*five, conn.core.app.rules_detail(steps)]


def _priority(options: dict) -> int | None:
    """PRIORITY's value (fastlimit._load.PRIORITIES), or None; the same
    text as CL.LIMIT's."""
    if "priority" not in options:
        return None
    value = priority_value(options["priority"])
    if value is None:
        raise ReplyError("ERR PRIORITY must be low, normal or critical")
    return value


def _lease_rule(conn, arg: bytes) -> int:
    num = _number(conn, _rule_id(arg))
    if _rules(conn).rule_for_num(num).algorithm != "concurrency":
        raise ReplyError(f"ERR rule '{_rule_id(arg)}' is not a concurrency rule")
    return num


def cmd_acquire(conn, args):
    options = _options(args, 3, {"resource"})
    num = _lease_rule(conn, args[1])
    return list(conn.core.rules.acquire(num, args[2], options.get("resource", b"")))


def cmd_release(conn, args):
    options = _options(args, 4, {"resource"})
    num = _lease_rule(conn, args[1])
    lease_id = integer(args[3], "lease id")
    return int(conn.core.rules.release(num, args[2], lease_id, options.get("resource", b"")))
