"""The status page (``GET /``) and the snapshot it polls (``GET /v1/stats``).

``/v1/stats`` is one compact JSON object, cheap enough to ask for every
second: counters the engine already keeps, read as they are.  Rates are
the reader's business (the page keeps the minutes since it opened);
``?since=<ms>`` adds the samples of the totals taken after that time
(history.py: one a second for 10 minutes, one a minute for 24 hours,
fixed in size), so a page opened during an incident shows what led to it.  Every list in it is
bounded: the rules by RULES_CAP (the most denied first), the commands by
the command table, the replicas by the connections, the hot keys by
HOT_KEYS_SHOWN (the tracker's estimate, hotkeys/); the overload block
(overload/) is fixed in size: the level and the last window's figures,
the shed checks of each of the three priorities.
"""

from __future__ import annotations

import heapq
import time

from fastlimit import __version__
from fastlimit._load import PRIORITIES
from fastlimit._resp import ReplyError, parse_integer
from fastlimit.overload.subsystem import LEVEL_NAMES
from fastlimit.rules.registry import STAT_FIELDS
from fastlimit.server.arguments import integer
from fastlimit.server.http.routes import Request, Response, json_response, problem
from fastlimit.server.http.status_page import PAGE
from fastlimit.server.info import rss_bytes

RULES_CAP = 1000        # rules listed in one snapshot, at most (?rules=N asks for fewer)
HOT_KEYS_SHOWN = 10     # hot keys listed in one snapshot

_PAGE_BODY = PAGE.encode()


def page(req: Request) -> Response:
    # The page talks to nothing but this server: no script, style or
    # image from elsewhere, no frame of it anywhere else.
    return Response(200, _PAGE_BODY, "text/html; charset=utf-8", [
        ("Cache-Control", "no-cache"),
        ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
         "style-src 'unsafe-inline'; img-src data:; connect-src 'self'; "
         "frame-ancestors 'none'"),
        ("X-Content-Type-Options", "nosniff")])


def stats(req: Request) -> Response:
    try:
        cap = integer(req.query.get("rules", str(RULES_CAP)), "rules", 0, RULES_CAP)
    except ReplyError:
        return problem(400, "invalid request", f"rules must be an integer from 0 to {RULES_CAP}",
                       code="ERR", field="rules")
    out = snapshot(req.server, cap)
    if "since" in req.query:
        try:
            since = integer(req.query["since"], "since", 0, 2**62)
        except ReplyError:
            return problem(400, "invalid request", "since must be a time in ms, 0 or more",
                           code="ERR", field="since")
        out["history"] = req.server.status_history.since(since)
    return json_response(out)


def snapshot(server, rules_cap: int = RULES_CAP) -> dict:
    """What the status page shows, as of now (see the module docstring)."""
    core = server.core
    rss = rss_bytes()
    server.peak_rss = max(server.peak_rss, rss)     # as INFO memory keeps it
    return {
        "version": __version__,
        "time_ms": int(time.time() * 1000),
        "clock_ms": core.clock.now(),
        "uptime_s": int(time.monotonic() - server.started),
        "ops_per_sec": server.ops_per_sec,
        "total_commands": core.total_commands,
        "clients": {"connected": len(core.clients), "max": core.maxclients},
        "buckets": server.bucket_count(),
        "memory": {"rss_bytes": rss, "peak_rss_bytes": server.peak_rss,
                   "bucket_table_bytes": core.store.memory_bytes + core.rules.memory_bytes},
        "rules": rule_stats(server.rules, rules_cap),
        "latency": {"resp": command_latency(_resp_commands(core)),
                    "http": command_latency(server.http.endpoint_stats.items())},
        "replication": replication_state(server.replication.info()),
        "hotkeys": server.hotkeys.snapshot(HOT_KEYS_SHOWN),
        "overload": overload_state(server.overload.meter),
    }


def overload_state(meter) -> dict:
    """The saturation meter as INFO shedding shows it: the level (and its
    name: what it sheds), the last closed window's figures, and the shed
    checks by priority, each as allowed and denied."""
    f = meter.figures()
    counts = meter.shed_counts()
    return {
        "level": f["level"], "level_name": LEVEL_NAMES[f["level"]], "forced": bool(f["forced"]),
        "busy_percent": f["busy_percent"], "loop_lag_us": f["lag_us"],
        "held_input_wait_us": f["wait_us"], "held_input_bytes": f["pending_bytes"],
        "held_connections": f["pending_connections"],
        "shed": {name: {"allowed": counts[name][0], "denied": counts[name][1]}
                 for name in PRIORITIES},
    }


def rule_stats(registry, cap: int) -> dict:
    """Totals over every rule, and the ``cap`` most denied rules (enforced
    denials, then shadow ones, then id), each with its counters.  Some
    2 to 4 us a rule, most of it registry.stats(): 10,000 rules take
    20 to 40 ms."""
    rows = []
    totals = dict.fromkeys(STAT_FIELDS, 0)
    for rule in registry.list():
        counts = registry.stats(rule.id)
        for name in STAT_FIELDS:
            totals[name] += counts[name]
        # ids are unique: the tuples never compare past them
        rows.append((-counts["denied"], -counts["shadow_denied"], rule.id, rule, counts))
    top = heapq.nsmallest(cap, rows)
    return {
        "count": len(rows), "version": registry.version, "totals": totals,
        "listed": len(top), "cap": cap, "truncated": len(top) < len(rows),
        "order": "denied desc, shadow_denied desc, id",
        "top": [{"id": rule.id, "mode": rule.mode, "algorithm": rule.algorithm, **counts}
                for *_, rule, counts in top],
    }


def _resp_commands(core):
    """Each command, or its subcommands for a container (CL.RULE, CONFIG...):
    they hold the container's calls, told apart."""
    for cmd in core.commands.values():
        if cmd.subcommands:
            for sub in cmd.subcommands.values():
                yield sub.name, sub
        else:
            yield cmd.name, cmd


def command_latency(named) -> list[dict]:
    """Calls, errors and time spent of every command (or endpoint) that
    has any, as its counters hold them, the most called first."""
    rows = [{"name": name, "calls": c.calls, "failed": c.failed_calls,
             "rejected": c.rejected_calls, "nsec": c.nsec,
             "usec_per_call": round(c.nsec / c.calls / 1000, 2) if c.calls else 0}
            for name, c in named if c.calls or c.failed_calls or c.rejected_calls]
    rows.sort(key=lambda r: (-r["calls"], r["name"]))
    return rows


def replication_state(info: dict) -> dict:
    """INFO replication's fields, with each ``slave<i>`` line (ip=..,port=..)
    as an object in ``replicas``, its numbers as numbers."""
    out: dict = {"replicas": []}
    for name, value in info.items():
        if name.startswith("slave") and name[5:].isdigit():
            fields = (part.split("=", 1) for part in str(value).split(","))
            out["replicas"].append({k: _number_or_text(v) for k, v in fields})
        else:
            out[name] = value
    return out


def _number_or_text(text: str) -> int | str:
    n = parse_integer(text)
    return text if n is None else n


ROUTES = [("GET", "/", page), ("GET", "/v1/stats", stats)]
