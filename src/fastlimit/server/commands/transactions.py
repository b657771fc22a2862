"""WATCH and UNWATCH (MULTI, EXEC and DISCARD run in the connection,
_protocol.pyx): a watched bucket key that a write names before EXEC makes
EXEC answer the null array, as Redis does for a touched key."""

from __future__ import annotations

from fastlimit._resp import ReplyError
from fastlimit.server.commands.replies import OK


def cmd_watch(conn, args):
    if conn.in_multi:
        raise ReplyError("ERR WATCH inside MULTI is not allowed")
    conn.watch(args[1:])
    return OK


def cmd_unwatch(conn, args):
    conn.unwatch()
    return OK
