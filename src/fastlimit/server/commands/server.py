"""The server's administration: DBSIZE, FLUSHALL, SAVE, BGSAVE, LASTSAVE,
TIME, INFO, SHUTDOWN, DEBUG (the manual clock, the sweep) and FUNCTION
FLUSH and MONITOR."""

from __future__ import annotations

from fastlimit._resp import NO_REPLY, ReplyError, SimpleString, Verbatim
from fastlimit.server.arguments import integer, lowercase
from fastlimit.server.commands.replies import OK
from fastlimit.server.info import render_info
from fastlimit.server.snapshot import SnapshotError


def cmd_dbsize(conn, args):
    return conn.core.app.key_count()


def cmd_flushall(conn, args):
    if len(args) > 2 or (len(args) == 2 and lowercase(args[1]) not in ("sync", "async")):
        raise ReplyError("ERR syntax error")
    conn.core.touch_all_watched()
    conn.core.app.flush_buckets()
    return OK


def cmd_function_flush(conn, args):
    """FUNCTION FLUSH [ASYNC|SYNC]: fastlimit has no functions, so there is
    nothing to remove (Redis's test harness sends it before each block)."""
    if len(args) > 3 or (len(args) == 3 and lowercase(args[2]) not in ("sync", "async")):
        raise ReplyError("ERR FUNCTION FLUSH only supports SYNC|ASYNC option")
    return OK


def cmd_monitor(conn, args):
    """MONITOR: every command's line from now on (see Connection.feed_monitors);
    a second MONITOR answers nothing, as in Redis."""
    if conn.monitoring:
        return NO_REPLY
    conn.start_monitor()
    return OK


def cmd_save(conn, args):
    try:
        conn.core.app.snapshots.save()
    except (OSError, SnapshotError) as e:
        raise ReplyError(f"ERR {e}") from None
    return OK


def cmd_bgsave(conn, args):
    try:
        started = conn.core.app.snapshots.background_save()
    except (OSError, SnapshotError) as e:
        raise ReplyError(f"ERR {e}") from None
    if not started:
        raise ReplyError("ERR Background save already in progress")
    return SimpleString("Background saving started")


def cmd_lastsave(conn, args):
    return conn.core.app.snapshots.last_save_time


def cmd_time(conn, args):
    ms = conn.core.clock.now()
    return [str(ms // 1000).encode(), str((ms % 1000) * 1000).encode()]


def cmd_info(conn, args):
    sections = [lowercase(a) for a in args[1:]]
    return Verbatim(render_info(conn.core, sections))


def cmd_shutdown(conn, args):
    options = {lowercase(a) for a in args[1:]}
    unknown = options - {"nosave", "save", "now", "force", "abort"}
    if unknown:
        raise ReplyError("ERR syntax error")
    if "abort" in options:
        raise ReplyError("ERR No shutdown in progress.")
    conn.core.log.warning("user requested shutdown (client id=%d addr=%s)", conn.id, conn.addr)
    conn.core.app.request_shutdown(save="nosave" not in options)
    conn.close_after_reply = True
    return NO_REPLY   # as Redis: success is the connection closing


def cmd_debug(conn, args):
    sub = lowercase(args[1])
    if sub == "clock":
        return _debug_clock(conn, args)
    if sub == "help":
        return [SimpleString(line) for line in (
            "DEBUG CLOCK GET -- the server clock in ms",
            "DEBUG CLOCK SET <ms> -- set the manual clock",
            "DEBUG CLOCK ADVANCE <ms> -- move the manual clock forward",
            "DEBUG SWEEP [budget-ms] -- run the idle-bucket sweep now",
            "DEBUG SHED-LEVEL <0|1|2|AUTO> -- hold the overload level (1: shed low checks, "
            "2: low and normal), or measure it again")]
    if sub == "shed-level":
        return _debug_shed_level(conn, args)
    if sub == "sweep":
        budget = float(integer(args[2], "budget-ms")) if len(args) > 2 else 100.0
        # CL.CHECK's buckets and the windowed counters (the rules' tables
        # are the server's sweep's alone)
        removed, scanned = conn.core.store.sweep(budget_ms=budget)
        w_removed, w_scanned = conn.core.app.windows.store.sweep(budget_ms=budget)
        return [removed + w_removed, scanned + w_scanned]
    raise ReplyError(f"ERR unknown subcommand '{args[1].decode(errors='replace')}'. "
                     "Try DEBUG HELP.")


def _debug_shed_level(conn, args):
    """As Envoy's tests inject pressure with a fake resource monitor: the
    level -> action mapping tested without load."""
    if len(args) != 3:
        raise ReplyError("ERR syntax error: DEBUG SHED-LEVEL <0|1|2|AUTO>")
    word = lowercase(args[2])
    level = -1 if word == "auto" else {"0": 0, "1": 1, "2": 2}.get(word)
    if level is None:
        raise ReplyError("ERR the level must be 0, 1, 2 or AUTO")
    conn.core.load_meter.force(level)
    return OK


def _debug_clock(conn, args):
    clock = conn.core.clock
    action = lowercase(args[2]) if len(args) > 2 else "get"
    if action == "get" and len(args) <= 3:
        return clock.now()
    if action not in ("set", "advance") or len(args) != 4:
        raise ReplyError("ERR syntax error: DEBUG CLOCK GET | SET <ms> | ADVANCE <ms>")
    if not clock.manual:
        raise ReplyError("ERR DEBUG CLOCK SET/ADVANCE need the server started with --manual-clock")
    value = integer(args[3], "milliseconds")
    try:
        clock.set(value) if action == "set" else clock.advance(value)
    except ValueError as e:
        raise ReplyError(f"ERR {e}") from None
    return clock.now()
