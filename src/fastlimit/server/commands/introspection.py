"""COMMAND: the table describing itself (COMMAND INFO, DOCS, LIST, COUNT,
GETKEYS), in Redis 7's reply shapes."""

from __future__ import annotations

from fastlimit._protocol import Command
from fastlimit._resp import ReplyError, SimpleString


def _key_specs(c: Command) -> list:
    if c.first_key == 0:
        return []
    flags = {SimpleString("RW"), SimpleString("update")} if c.is_write else {SimpleString("RO")}
    return [{"flags": flags,
             "begin_search": {"type": "index", "spec": {"index": c.first_key}},
             "find_keys": {"type": "range",
                           "spec": {"lastkey": c.last_key - c.first_key if c.last_key >= 0
                                    else c.last_key, "keystep": c.key_step, "limit": 0}}}]


def command_entry(c: Command) -> list:
    """A full Redis 7 COMMAND entry (10 elements)."""
    return [c.name, c.arity, {SimpleString(f) for f in c.flags},
            c.first_key, c.last_key, c.key_step,
            {SimpleString(a) for a in c.acl_categories}, [], _key_specs(c),
            [command_entry(s) for s in c.subcommands.values()]]


def _doc_arguments(arguments) -> list:
    out = []
    for arg in arguments:
        name, kind = arg[0], arg[1]
        entry = {"name": name, "type": kind}
        if kind == "key":
            entry["key_spec_index"] = 0
        if len(arg) > 2 and "token" in arg[2]:
            entry["token"] = arg[2]["token"]
        if len(arg) > 2 and arg[2].get("optional"):
            entry["flags"] = [SimpleString("optional")]
        if len(arg) > 2 and "arguments" in arg[2]:
            entry["arguments"] = _doc_arguments(arg[2]["arguments"])
        out.append(entry)
    return out


def command_doc(c: Command) -> dict:
    doc = {"summary": c.doc.get("summary", ""), "since": c.doc.get("since", "0.1.0"),
           "group": c.doc.get("group", "generic"),
           "complexity": c.doc.get("complexity", "O(1)")}
    if c.doc.get("arguments"):
        doc["arguments"] = _doc_arguments(c.doc["arguments"])
    if c.subcommands:
        doc["subcommands"] = {s.name: command_doc(s) for s in c.subcommands.values()}
    return doc


def _table(conn) -> dict:
    return conn.core.commands


def _find(conn, name: bytes):
    parent, _, sub = name.lower().partition(b"|")
    c = _table(conn).get(parent)
    if c is not None and sub:
        return c.subcommands.get(sub)
    return c


def cmd_command(conn, args):
    return [command_entry(c) for c in _table(conn).values()]


def cmd_command_count(conn, args):
    return len(_table(conn))


def cmd_command_info(conn, args):
    if len(args) == 2:
        return cmd_command(conn, args)
    return [command_entry(c) if (c := _find(conn, a)) is not None else None for a in args[2:]]


def cmd_command_docs(conn, args):
    commands = (_table(conn).values() if len(args) == 2
                else [c for a in args[2:] if (c := _find(conn, a)) is not None])
    return {c.name: command_doc(c) for c in commands}


def cmd_command_list(conn, args):
    return [c.name for c in _table(conn).values()]


def cmd_command_getkeys(conn, args):
    c = _find(conn, args[2])
    if c is None:
        raise ReplyError("ERR Invalid command specified")
    if not c.check_arity(len(args) - 2):
        raise ReplyError("ERR Invalid number of arguments specified for command")
    if c.first_key == 0:
        raise ReplyError("ERR The command has no key arguments")
    cmd_args = args[2:]
    last = c.last_key if c.last_key >= 0 else len(cmd_args) + c.last_key
    return cmd_args[c.first_key:last + 1:c.key_step]
