"""CLIENT: what a connection says about itself, and listing and closing
connections."""

from __future__ import annotations

import time

from fastlimit._resp import NO_REPLY, ReplyError, Verbatim
from fastlimit.server.arguments import check_client_name, integer, lowercase
from fastlimit.server.clients import client_line
from fastlimit.server.commands.replies import OK


def cmd_client_id(conn, args):
    return conn.id


def cmd_client_getname(conn, args):
    return conn.name


def cmd_client_setname(conn, args):
    check_client_name(args[2])
    conn.name = args[2] or None
    return OK


def cmd_client_setinfo(conn, args):
    attr = lowercase(args[2])
    if attr not in ("lib-name", "lib-ver"):
        raise ReplyError(f"ERR Unrecognized option '{args[2].decode(errors='replace')}'")
    check_client_name(args[3])
    setattr(conn, attr.replace("-", "_"), args[3])
    return OK


def _positive_id(value: bytes, error: str) -> int:
    try:
        n = integer(value)
    except ReplyError:
        raise ReplyError(error) from None
    if n < 1:
        raise ReplyError(error)
    return n


def cmd_client_list(conn, args):
    clients = list(conn.core.clients.values())
    i = 2
    while i < len(args):
        option = lowercase(args[i])
        if option == "type" and i + 1 < len(args):
            kind = _kind_argument(args[i + 1])
            clients = [c for c in clients if _client_type(c) == kind]
            i += 2
        elif option == "id" and i + 1 < len(args):
            ids = {_positive_id(a, "ERR Invalid client ID") for a in args[i + 1:]}
            clients = [c for c in clients if c.id in ids]
            break
        else:
            raise ReplyError("ERR syntax error")
    now = time.monotonic()
    return Verbatim("".join(client_line(c, now) + "\n" for c in clients))


def _kind_argument(value: bytes) -> str:
    """TYPE's argument as _client_type names it; Redis's error if unknown.
    (A replica's link to its primary, Redis's "master" client, is not
    among the clients here, so TYPE master matches none.)"""
    kind = lowercase(value)
    if kind not in ("normal", "master", "replica", "slave", "pubsub"):
        raise ReplyError(f"ERR Unknown client type '{value.decode(errors='replace')}'")
    return "replica" if kind == "slave" else kind


def _client_type(c) -> str:
    """As Redis's getClientType: a client with a subscription is pubsub."""
    if c.replica is not None:
        return "replica"
    return "pubsub" if c.subscribed else "normal"


def cmd_client_info(conn, args):
    return Verbatim(client_line(conn, time.monotonic()) + "\n")


def cmd_client_kill(conn, args):
    clients = conn.core.clients.values()
    if len(args) == 3:   # old form: CLIENT KILL addr:port
        target = args[2].decode(errors="replace")
        victims = [c for c in clients if c.addr == target]
        if not victims:
            raise ReplyError("ERR No such client")
        victims[0].close()
        return OK
    if len(args) % 2:
        raise ReplyError("ERR syntax error")
    victims = list(clients)
    skipme = True
    for i in range(2, len(args), 2):
        option, value = lowercase(args[i]), args[i + 1]
        if option == "id":
            wanted = _positive_id(value, "ERR client-id should be greater than 0")
            victims = [c for c in victims if c.id == wanted]
        elif option == "addr":
            victims = [c for c in victims if c.addr == value.decode(errors="replace")]
        elif option == "laddr":
            victims = [c for c in victims if c.laddr == value.decode(errors="replace")]
        elif option == "skipme":
            skipme = _yes_no(value)
        elif option == "type":
            kind = _kind_argument(value)
            victims = [c for c in victims if _client_type(c) == kind]
        elif option == "user":
            user = conn.core.app.acl.users.get(value.decode("utf-8", "surrogateescape"))
            if user is None:
                raise ReplyError(f"ERR No such user '{value.decode(errors='replace')}'")
            victims = [c for c in victims if c.user is user]
        else:
            raise ReplyError("ERR syntax error")
    if skipme:
        victims = [c for c in victims if c is not conn]
    for c in victims:
        c.close()
    return len(victims)


def _yes_no(value: bytes) -> bool:
    """SKIPME's argument; anything but yes or no is Redis's syntax error
    (before any client is killed)."""
    answer = lowercase(value)
    if answer not in ("yes", "no"):
        raise ReplyError("ERR syntax error")
    return answer == "yes"


# CLIENT REPLY's modes, as _protocol.pyx numbers them (REPLY_ON ...).
_REPLY_MODES = {"on": 0, "off": 1, "skip": 3}


def cmd_client_reply(conn, args):
    """CLIENT REPLY ON|OFF|SKIP: the connection silences the replies
    (Connection.execute_silenced); only ON answers, as in Redis, and SKIP
    under OFF changes nothing."""
    mode = _REPLY_MODES.get(lowercase(args[2]))
    if mode is None:
        raise ReplyError("ERR syntax error")
    if mode == 0:
        conn.reply_mode = 0
        return OK
    if not (mode == 3 and conn.reply_mode == 1):
        conn.reply_mode = mode
    return NO_REPLY


def cmd_client_ok(conn, args):
    return OK
