"""Bucket commands with a Python handler (CL.CHECK and CL.LIMIT run in the
Cython connection): redis-cell's CL.THROTTLE and CL.RESET."""

from __future__ import annotations

from fastlimit._resp import ReplyError
from fastlimit._rules import throttle_params_error
from fastlimit.server.arguments import integer


def cmd_cl_throttle(conn, args):
    """redis-cell's CL.THROTTLE <key> <max_burst> <count> <period> [<quantity>]"""
    if len(args) > 6:
        raise ReplyError("ERR wrong number of arguments for 'cl.throttle' command")
    numbers = [integer(a, name) for a, name in zip(
        args[2:], ("max_burst", "count per period", "period", "quantity"), strict=False)]
    burst, count, period = numbers[:3]
    quantity = numbers[3] if len(numbers) > 3 else 1
    error = throttle_params_error(burst, count, period, quantity)
    if error:
        raise ReplyError(f"ERR {error}")
    try:
        return list(conn.core.rules.throttle(args[1], burst, count, period, quantity))
    except ValueError as e:
        raise ReplyError(f"ERR {e}") from None


def cmd_cl_reset(conn, args):
    return int(conn.core.store.reset(args[1]))
