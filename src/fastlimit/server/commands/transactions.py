"""WATCH and UNWATCH (MULTI, EXEC and DISCARD run in the connection,
_protocol.pyx): a watched bucket key that a write names before EXEC makes
EXEC answer the null array, as Redis does for a touched key."""

from __future__ import annotations

from fastlimit._resp import ReplyError
from fastlimit.server.commands.replies import OK


def cmd_watch(conn, args):
    """A connection watches at most max-multibulk-len keys (Redis has no
    bound but memory; INFO clients shows total_watched_keys)."""
    if conn.in_multi:
        raise ReplyError("ERR WATCH inside MULTI is not allowed")
    limit = conn.core.max_multibulk_len
    watched = conn.watching or {}
    if conn.watched_count + len({k for k in args[1:] if k not in watched}) > limit:
        raise ReplyError(f"ERR a connection watches at most {limit} keys (max-multibulk-len)")
    conn.watch(args[1:])
    return OK


def cmd_unwatch(conn, args):
    conn.unwatch()
    return OK
