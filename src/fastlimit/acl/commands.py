"""ACL ...: users and their rules (acl/users.py keeps them), with Redis
7.0's replies."""

from __future__ import annotations

import os
import time

from fastlimit._resp import ReplyError
from fastlimit.acl.users import NO_ACLFILE, RuleError
from fastlimit.server.arguments import integer, lowercase
from fastlimit.server.commands.replies import OK

GENPASS_MAX_BITS = 4096


class _Flags(frozenset):
    """A set reply (RESP3 ~) in the order Redis writes its flags."""

    def __new__(cls, items):
        self = super().__new__(cls, items)
        self.order = list(items)
        return self

    def __iter__(self):
        return iter(self.order)


def _acl(conn):
    return conn.core.app.acl


def _name(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


def cmd_acl_setuser(conn, args):
    try:
        _acl(conn).setuser(_name(args[2]), list(args[3:]))
    except RuleError as e:
        raise ReplyError(f"ERR {e}") from None
    return OK


def cmd_acl_deluser(conn, args):
    try:
        return _acl(conn).deluser([_name(a) for a in args[2:]])
    except RuleError as e:
        raise ReplyError(f"ERR {e}") from None


def cmd_acl_getuser(conn, args):
    user = _acl(conn).users.get(_name(args[2]))
    if user is None:
        return None
    return {"flags": _Flags(user.flags()), "passwords": list(user.passwords),
            "commands": user.commands_text(), "keys": user.keys_text(),
            "channels": user.channels_text(), "selectors": []}


def cmd_acl_list(conn, args):
    return [f"user {u.name} {u.describe()}" for u in _acl(conn).sorted_users()]


def cmd_acl_users(conn, args):
    return [u.name for u in _acl(conn).sorted_users()]


def cmd_acl_whoami(conn, args):
    return conn.user.name


def cmd_acl_cat(conn, args):
    acl = _acl(conn)
    if len(args) == 2:
        return list(acl.commands.categories)
    name = lowercase(args[2])
    members = acl.commands.categories.get(name)
    if members is None:
        raise ReplyError(f"ERR Unknown category '{_name(args[2])[:128]}'")
    return [c.name for c in members]


def cmd_acl_genpass(conn, args):
    bits = 256
    if len(args) == 3:
        bits = integer(args[2])
    if bits <= 0 or bits > GENPASS_MAX_BITS:
        raise ReplyError(f"ERR ACL GENPASS argument must be the number of bits for the output "
                         f"password, a positive number up to {GENPASS_MAX_BITS}")
    chars = (bits + 3) // 4
    return os.urandom((chars + 1) // 2).hex()[:chars]


def cmd_acl_log(conn, args):
    acl = _acl(conn)
    count = 10
    if len(args) == 3:
        if lowercase(args[2]) == "reset":
            acl.entries.clear()
            return OK
        count = max(integer(args[2]), 0)
    now_ms = time.time() * 1000
    return [{"count": e.count, "reason": e.reason, "context": e.context, "object": e.object,
             "username": e.username, "age-seconds": (now_ms - e.created_ms) / 1000,
             "client-info": e.client_info} for e in acl.entries[:count]]


def _with_aclfile(conn):
    acl = _acl(conn)
    if not acl.aclfile:
        raise ReplyError(NO_ACLFILE)
    return acl


def cmd_acl_load(conn, args):
    error = _with_aclfile(conn).load_file()
    if error is not None:
        raise ReplyError(f"ERR {error}")
    return OK


def cmd_acl_save(conn, args):
    if not _with_aclfile(conn).save_file():
        raise ReplyError("ERR There was an error trying to save the ACLs. Please check the "
                         "server logs for more information")
    return OK


def cmd_acl_dryrun(conn, args):
    acl = _acl(conn)
    user = acl.users.get(_name(args[2]))
    if user is None:
        raise ReplyError(f"ERR User '{_name(args[2])}' not found")
    verdict = acl.dry_run(user, list(args[3:]))
    return OK if verdict is None else verdict
