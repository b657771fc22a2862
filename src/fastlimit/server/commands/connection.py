"""The connection's own commands: ECHO, AUTH, HELLO, SELECT, QUIT, RESET."""

from __future__ import annotations

from fastlimit import __version__
from fastlimit._resp import ReplyError, SimpleString
from fastlimit.server.arguments import check_client_name, integer, lowercase
from fastlimit.server.commands.replies import OK, WRONGPASS

REDIS_COMPAT_VERSION = "7.0.0"

def cmd_echo(conn, args):
    return args[1]


def _authenticate(conn, username: bytes, password: bytes, args) -> None:
    """Redis's ACLAuthenticateUser: the connection runs as the user from
    now on, or WRONGPASS, counted (INFO stats acl_access_denied_auth) and
    in ACL LOG, not in the server's log: a client could otherwise write
    log lines as fast as it can send AUTH."""
    acl = conn.core.app.acl
    name = username.decode("utf-8", "surrogateescape")
    user = acl.authenticate(name, password)
    if user is None:
        conn.core.app.auth_failures += 1
        acl.log_denial(conn, "auth", args[0].decode("utf-8", "surrogateescape"),
                       conn.in_multi, username=name)
        raise ReplyError(WRONGPASS)
    conn.set_user(user, True)


def cmd_auth(conn, args):
    if len(args) > 3:
        raise ReplyError("ERR syntax error")
    if len(args) == 2:
        if conn.core.default_user.nopass:
            raise ReplyError("ERR AUTH <password> called without any password configured "
                             "for the default user. Are you sure your configuration is correct?")
        _authenticate(conn, b"default", args[1], args)
    else:
        _authenticate(conn, args[1], args[2], args)
    return OK


def cmd_hello(conn, args):
    proto = conn.proto
    if len(args) >= 2:
        proto = integer(args[1], "Protocol version")
        if proto not in (2, 3):
            raise ReplyError("NOPROTO unsupported protocol version")
    i, name = 2, None
    while i < len(args):
        option = lowercase(args[i])
        if option == "auth" and i + 2 < len(args):
            _authenticate(conn, args[i + 1], args[i + 2], args)
            i += 3
        elif option == "setname" and i + 1 < len(args):
            name = args[i + 1]
            check_client_name(name)
            i += 2
        else:
            option = args[i].decode(errors="replace")
            raise ReplyError(f"ERR Syntax error in HELLO option '{option}'")
    if not conn.authenticated:
        raise ReplyError("NOAUTH HELLO must be called with the client already authenticated, "
                         "otherwise the HELLO AUTH <user> <pass> option can be used "
                         "to authenticate the client and select the RESP protocol version "
                         "at the same time")
    if name is not None:
        conn.name = name or None
    conn.proto = proto
    return {"server": "fastlimit", "version": REDIS_COMPAT_VERSION, "proto": proto,
            "id": conn.id, "mode": "standalone",
            "role": "replica" if conn.core.readonly else "master", "modules": [],
            "fastlimit_version": __version__}


def cmd_select(conn, args):
    if integer(args[1]) != 0:
        raise ReplyError("ERR DB index is out of range")
    return OK


def cmd_quit(conn, args):
    conn.close_after_reply = True
    return OK


def cmd_reset(conn, args):
    conn.core.app.pubsub.forget(conn)
    conn.stop_monitor()
    conn.unwatch()
    conn.reply_mode = 0
    conn.multi_queue = None
    conn.proto = 2
    conn.name = None
    conn.set_user(conn.core.default_user, not conn.core.auth_required)
    return SimpleString("RESET")
