"""CL.RLS: the Envoy rate limit service's domains from redis-cli.

    CL.RLS LIST [<domain>]       one line per limit, as the reference's
                                 /rlconfig: "<domain>.<key_value>...: unit=..."
    CL.RLS DESCRIBE <domain> <key>=<value> [...]
                                 what ShouldRateLimit would answer for that
                                 descriptor, without counting it:
                                 [code, [requests_per_unit, unit, name] or
                                 nil, limit_remaining, duration_until_reset]

The service is ``conn.core.app.rls.service`` (fastlimit.rls.service).
"""

from __future__ import annotations

from fastlimit._protocol import Awaited
from fastlimit._resp import ReplyError
from fastlimit.rls.config import UNIT_NAMES, Node
from fastlimit.rls.service import OVER_LIMIT, RlsError, RlsHome, walk_limits

CODES = {1: b"OK", OVER_LIMIT: b"OVER_LIMIT"}


def _lines(root: Node):
    for limit in sorted(walk_limits(root), key=lambda lim: (lim.full_key, lim.index)):
        what = "unlimited" if limit.unlimited else (
            f"unit={UNIT_NAMES[limit.unit]} requests_per_unit={limit.requests_per_unit}")
        yield (f"{limit.full_key}: {what}, algorithm: {limit.algorithm}, "
               f"window_s: {limit.window_s}, shadow_mode: {str(limit.shadow_mode).lower()}, "
               f"quota_mode: {str(limit.quota_mode).lower()}").encode()


def cmd_rls_list(conn, args):
    if len(args) > 3:
        raise ReplyError("ERR syntax error: CL.RLS LIST [<domain>]")
    domains = conn.core.app.rls.service.config.domains
    wanted = [args[2]] if len(args) == 3 else sorted(domains)
    return [line for name in wanted if name in domains for line in _lines(domains[name].root)]


def cmd_rls_describe(conn, args):
    entries = []
    for arg in args[3:]:
        key, eq, value = arg.partition(b"=")
        if not eq:
            raise ReplyError("ERR descriptor entries are <key>=<value>")
        entries.append((key, value))
    try:
        _, statuses, _ = conn.core.app.rls.service.should_rate_limit(
            args[2], [(entries, None, 0)], 0)
    except RlsError as e:
        raise ReplyError(f"ERR {e}") from None
    except RlsHome as e:      # described by the region that counts it
        return Awaited(_described_at_home(conn, e.home, args[2], entries))
    return _described(statuses[0])


def _described(status) -> list:
    code, limit, remaining, reset = status
    shown = None if limit is None else [limit[0], UNIT_NAMES[limit[1]].encode(), limit[2]]
    return [CODES[code], shown, remaining, reset]


async def _described_at_home(conn, home: int, domain: bytes, entries) -> list:
    decision = await conn.core.app.regions_sync.ask_home_rls(home, domain,
                                                             [(entries, None, 0)], 0)
    if decision is None:
        raise ReplyError(f"ERR home region {conn.core.app.regions.names[home]} unreachable")
    return _described(decision[1][0])
