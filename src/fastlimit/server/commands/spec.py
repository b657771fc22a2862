"""How a table entry is built: plain commands, commands of the ratelimit
group, and containers whose second argument names a subcommand (CLIENT
LIST), with their dispatch and HELP."""

from __future__ import annotations

import time

from fastlimit._protocol import READONLY_ERROR, Command
from fastlimit._resp import ReplyError, SimpleString


def container(name: str, arity: int, flags, subcommands, doc, default=None,
              acl=(), help_acl=("@slow",)) -> Command:
    """A command whose second argument names a subcommand (CLIENT LIST);
    `default` answers the bare command, where Redis allows one.  ACL
    permissions of a subcommand are checked before this runs (Connection.
    acl_denied reads the subcommand as this does)."""
    holder: list[Command] = []

    def dispatch(conn, args):
        if len(args) == 1:
            return default(conn, args)
        parent = holder[0]
        sub = parent.subcommands.get(args[1].lower())
        if sub is None:
            raise ReplyError(f"ERR unknown subcommand '{args[1].decode(errors='replace')[:128]}'. "
                             f"Try {name.upper()} HELP.")
        if not sub.check_arity(len(args)):
            sub.rejected_calls += 1
            raise ReplyError(f"ERR wrong number of arguments for '{sub.name}' command")
        if sub.is_write and conn.core.readonly:
            sub.rejected_calls += 1
            raise ReplyError(READONLY_ERROR)
        conn.last_subcommand = sub.name
        started = time.perf_counter_ns()
        try:
            return sub.handler(conn, args)
        except ReplyError:
            sub.failed_calls += 1
            raise
        finally:
            sub.record(time.perf_counter_ns() - started)

    def help_lines(conn, args):
        return [SimpleString(f"{name.upper()} <subcommand> [<arg> ...]. Subcommands are:")] + [
            SimpleString(f"{s.name.split('|')[1].upper()} -- {s.doc.get('summary', '')}")
            for s in holder[0].subcommands.values()]

    subs = list(subcommands) + [
        Command(f"{name}|help", 2, ("loading", "stale"), help_lines,
                doc={"summary": "Shows helpful text about the different subcommands."},
                acl_categories=help_acl)]
    cmd = Command(name, arity, flags, dispatch, subcommands=subs, doc=doc, acl_categories=acl)
    holder.append(cmd)
    return cmd


def sub(parent: str, name: str, arity: int, handler, summary: str, flags=(), arguments=(),
        acl=()):
    return Command(f"{parent}|{name}", arity, flags, handler,
                   doc={"summary": summary, "arguments": list(arguments)}, acl_categories=acl)


def ratelimit_command(name: str, arity: int, handler, summary: str, arguments,
                      replica_peeks: bool = False) -> Command:
    """A write command of the ratelimit group whose key is its second argument;
    replica_peeks when its handler answers a COST 0 peek on a replica."""
    return command(name, arity, ("write", "denyoom", "fast"), handler, keys=(2, 2, 1),
                   acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.2.0",
                   replica_peeks=replica_peeks, summary=summary, arguments=arguments)


def command(name, arity, flags, handler=None, *, fast=0, keys=(0, 0, 0), acl=(),
            replica_peeks=False, when_subscribed=False, **doc) -> Command:
    """One entry: keys is (first, last, step) as in COMMAND's reply, acl the
    ACL categories, when_subscribed whether a subscribed RESP2 client may
    send it, and the keywords left over its COMMAND DOCS."""
    return Command(name, arity, flags, handler, first_key=keys[0], last_key=keys[1],
                   key_step=keys[2], fast=fast, doc=doc, acl_categories=acl,
                   replica_peeks=replica_peeks, when_subscribed=when_subscribed)
