"""The windowed counters' commands (``fastlimit._windows.WindowStore``):

    CL.FIXED <key> <window_ms> [<amount>]            -> [count, expire_at_ms]
    CL.MOVING <key> <limit> <window_ms> [<amount>]   -> [allowed, start_ms, count]
    CL.SLIDING <key> <limit> <window_ms> [<amount>]  -> [allowed, previous,
                                                        previous_ttl_ms, current,
                                                        current_ttl_ms]
    CL.WINCLEAR <key> [<key> ...]                    -> records removed
    CL.WINFLUSH <prefix>                             -> records removed

amount defaults to 1; 0 reads without writing (which a replica answers too).  Times are the server's
clock in milliseconds (``*_at_ms`` and ``start_ms`` absolute, ``*_ttl_ms``
from now).
"""

from __future__ import annotations

from fastlimit._protocol import READONLY_ERROR
from fastlimit._resp import ReplyError
from fastlimit._windows import MAX_AMOUNT, MAX_LENGTH_MS, MAX_LIMIT
from fastlimit.server.arguments import integer


def _store(conn):
    return conn.core.app.windows.store


def _amount(conn, args: list[bytes], at: int) -> int:
    if len(args) > at + 1:
        name = args[0].decode(errors="replace").lower()
        raise ReplyError(f"ERR wrong number of arguments for '{name}' command")
    amount = 1 if len(args) == at else _bounded(args[at], "amount", 0, MAX_AMOUNT)
    if amount and conn.core.readonly:
        raise ReplyError(READONLY_ERROR)     # a replica answers reads only
    return amount


def _bounded(value: bytes, name: str, low: int, high: int) -> int:
    n = integer(value, name)
    if not low <= n <= high:
        raise ReplyError(f"ERR {name} must be an integer from {low} to {high}")
    return n


def cmd_fixed(conn, args):
    window = _bounded(args[2], "window_ms", 1, MAX_LENGTH_MS)
    return _store(conn).fixed(args[1], window, _amount(conn, args, 3))


def cmd_moving(conn, args):
    limit = _bounded(args[2], "limit", 1, MAX_LIMIT)
    window = _bounded(args[3], "window_ms", 1, MAX_LENGTH_MS)
    try:
        return _store(conn).moving(args[1], limit, window, _amount(conn, args, 4))
    except OverflowError as e:      # more distinct hit times in one window than a log holds
        raise ReplyError(f"ERR {e}") from None


def cmd_sliding(conn, args):
    limit = _bounded(args[2], "limit", 1, MAX_LIMIT)
    window = _bounded(args[3], "window_ms", 1, MAX_LENGTH_MS)
    return _store(conn).sliding(args[1], limit, window, _amount(conn, args, 4))


def cmd_winclear(conn, args):
    store = _store(conn)
    return sum(store.clear(key) for key in args[1:])


def cmd_winflush(conn, args):
    if not args[1]:
        raise ReplyError("ERR prefix must not be empty (FLUSHALL forgets everything)")
    return _store(conn).clear_prefix(args[1])
