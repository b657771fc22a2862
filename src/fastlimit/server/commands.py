"""The command table: one entry per command (name, arity as in Redis,
flags, key positions, docs) driving dispatch, arity checks, COMMAND
replies and per-command statistics.  Commands with a ``fast`` id run
entirely in the Cython connection; the others have a handler here.

A handler is ``handler(conn, args) -> reply`` where ``args[0]`` is the
command name as sent; it raises ``ReplyError`` for an error reply.
"""

from __future__ import annotations

import asyncio
import hmac
import time

from fastlimit import __version__
from fastlimit._protocol import READONLY_ERROR, Command
from fastlimit._resp import NO_REPLY, ReplyError, SimpleString, Sliced, Verbatim
from fastlimit._rules import throttle_params_error
from fastlimit.server import config as cfg
from fastlimit.server.arguments import integer
from fastlimit.server.info import render_info
from fastlimit.server.replication import Follower
from fastlimit.server.rule_commands import build_rule_command, rule_check_commands
from fastlimit.server.snapshot import SnapshotError

# The fast-path ids of _protocol.pxd's FastPath enum.
(FAST_CL_CHECK, FAST_CL_LIMIT, FAST_PING, FAST_MULTI, FAST_EXEC, FAST_DISCARD, FAST_QUIT,
 FAST_RESET) = range(1, 9)

REDIS_COMPAT_VERSION = "7.0.0"
OK = SimpleString("OK")


def _int(value: bytes, what: str = "value") -> int:
    return integer(value, what)


def _lower(value: bytes) -> str:
    return value.decode("utf-8", "replace").lower()


# ---- connection ---------------------------------------------------------------

def cmd_echo(conn, args):
    return args[1]


def _password_ok(conn, username: bytes | None, password: bytes) -> bool:
    expected = conn.core.requirepass
    if expected is None:
        return False
    user_ok = username is None or username == b"default"
    return hmac.compare_digest(password, expected) and user_ok


def _wrong_password(conn):
    """Counted (INFO stats acl_access_denied_auth), not logged, as in Redis:
    a client could otherwise write log lines as fast as it can send AUTH."""
    conn.core.app.auth_failures += 1
    raise ReplyError("WRONGPASS invalid username-password pair or user is disabled.")


def cmd_auth(conn, args):
    if len(args) > 3:
        raise ReplyError("ERR syntax error")
    if conn.core.requirepass is None:
        raise ReplyError("ERR AUTH <password> called without any password configured "
                         "for the default user. Are you sure your configuration is correct?")
    username, password = (None, args[1]) if len(args) == 2 else (args[1], args[2])
    if not _password_ok(conn, username, password):
        _wrong_password(conn)
    conn.authenticated = True
    return OK


def _validate_client_name(name: bytes) -> None:
    if any(c < 33 or c > 126 for c in name):
        raise ReplyError("ERR Client names cannot contain spaces, newlines or special characters.")


def cmd_hello(conn, args):
    proto = conn.proto
    if len(args) >= 2:
        proto = _int(args[1], "Protocol version")
        if proto not in (2, 3):
            raise ReplyError("NOPROTO unsupported protocol version")
    i, name, authed = 2, None, False
    while i < len(args):
        option = _lower(args[i])
        if option == "auth" and i + 2 < len(args):
            if conn.core.requirepass is None and args[i + 1] == b"default":
                authed = True   # Redis accepts any password when none is set
            elif not _password_ok(conn, args[i + 1], args[i + 2]):
                _wrong_password(conn)
            authed = True
            i += 3
        elif option == "setname" and i + 1 < len(args):
            name = args[i + 1]
            _validate_client_name(name)
            i += 2
        else:
            option = args[i].decode(errors="replace")
            raise ReplyError(f"ERR Syntax error in HELLO option '{option}'")
    if not conn.authenticated and not authed:
        raise ReplyError("NOAUTH HELLO must be called with the client already authenticated, "
                         "otherwise the HELLO AUTH <user> <pass> option can be used "
                         "to authenticate the client and select the RESP protocol version "
                         "at the same time")
    if authed:
        conn.authenticated = True
    if name is not None:
        conn.name = name or None
    conn.proto = proto
    return {"server": "fastlimit", "version": REDIS_COMPAT_VERSION, "proto": proto,
            "id": conn.id, "mode": "standalone",
            "role": "replica" if conn.core.readonly else "master", "modules": [],
            "fastlimit_version": __version__}


def cmd_select(conn, args):
    if _int(args[1]) != 0:
        raise ReplyError("ERR DB index is out of range")
    return OK


def cmd_quit(conn, args):
    conn.close_after_reply = True
    return OK


def cmd_reset(conn, args):
    conn.multi_queue = None
    conn.proto = 2
    conn.name = None
    conn.authenticated = conn.core.requirepass is None
    return SimpleString("RESET")


# ---- CLIENT -----------------------------------------------------------------------

def cmd_client_id(conn, args):
    return conn.id


def cmd_client_getname(conn, args):
    return conn.name


def cmd_client_setname(conn, args):
    _validate_client_name(args[2])
    conn.name = args[2] or None
    return OK


def cmd_client_setinfo(conn, args):
    attr = _lower(args[2])
    if attr not in ("lib-name", "lib-ver"):
        raise ReplyError(f"ERR Unrecognized option '{args[2].decode(errors='replace')}'")
    _validate_client_name(args[3])
    setattr(conn, attr.replace("-", "_"), args[3])
    return OK


def _positive_id(value: bytes, error: str) -> int:
    try:
        n = _int(value)
    except ReplyError:
        raise ReplyError(error) from None
    if n < 1:
        raise ReplyError(error)
    return n


def _text(value) -> str:
    return value.decode("utf-8", "replace") if value else ""


def client_line(c, now: float) -> str:
    flags = "S" if c.replica is not None else "x" if c.in_multi else "N"
    return (f"id={c.id} addr={c.addr} laddr={c.laddr} fd=-1 name={_text(c.name)} "
            f"age={int(now - c.created)} idle={int(now - c.last_interaction)} flags={flags} "
            f"db=0 sub=0 psub=0 ssub=0 multi={len(c.multi_queue) if c.in_multi else -1} "
            f"qbuf={c.query_buffer_len} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 "
            f"obl=0 oll=0 omem={c.output_buffer_len} tot-mem=0 events=r "
            f"cmd={c.last_command} user=default redir=-1 resp={c.proto} "
            f"lib-name={_text(c.lib_name)} lib-ver={_text(c.lib_ver)}")


def cmd_client_list(conn, args):
    clients = list(conn.core.clients.values())
    i = 2
    while i < len(args):
        option = _lower(args[i])
        if option == "type" and i + 1 < len(args):
            kind = _lower(args[i + 1])
            if kind not in ("normal", "master", "replica", "slave", "pubsub"):
                raise ReplyError(f"ERR Unknown client type '{kind}'")
            clients = [c for c in clients if _client_type(c) == kind.replace("slave", "replica")]
            i += 2
        elif option == "id" and i + 1 < len(args):
            ids = {_positive_id(a, "ERR Invalid client ID") for a in args[i + 1:]}
            clients = [c for c in clients if c.id in ids]
            break
        else:
            raise ReplyError("ERR syntax error")
    now = time.monotonic()
    return Verbatim("".join(client_line(c, now) + "\n" for c in clients))


def _client_type(c) -> str:
    return "replica" if c.replica is not None else "normal"


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
        option, value = _lower(args[i]), args[i + 1]
        if option == "id":
            wanted = _positive_id(value, "ERR client-id should be greater than 0")
            victims = [c for c in victims if c.id == wanted]
        elif option == "addr":
            victims = [c for c in victims if c.addr == value.decode(errors="replace")]
        elif option == "laddr":
            victims = [c for c in victims if c.laddr == value.decode(errors="replace")]
        elif option == "skipme":
            skipme = _lower(value) == "yes"
        elif option == "type":
            kind = _lower(value).replace("slave", "replica")
            victims = [c for c in victims if _client_type(c) == kind]
        else:
            raise ReplyError("ERR syntax error")
    if skipme:
        victims = [c for c in victims if c is not conn]
    for c in victims:
        c.close()
    return len(victims)


def cmd_client_ok(conn, args):
    return OK


# ---- server -----------------------------------------------------------------------

def cmd_dbsize(conn, args):
    return conn.core.app.bucket_count()


def cmd_flushall(conn, args):
    if len(args) > 2 or (len(args) == 2 and _lower(args[1]) not in ("sync", "async")):
        raise ReplyError("ERR syntax error")
    conn.core.app.flush_buckets()
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


# ---- replication ----------------------------------------------------------------------

def cmd_replicaof(conn, args):
    """REPLICAOF <host> <port> | NO ONE (SLAVEOF is the same command)."""
    repl = conn.core.app.replication
    if _lower(args[1]) == "no" and _lower(args[2]) == "one":
        repl.promote()
        return OK
    port = _int(args[2], "port")
    if not 1 <= port <= 65535:
        raise ReplyError("ERR Invalid master port")
    host = args[1].decode("utf-8", "replace")
    if not repl.follow(host, port):
        return SimpleString("OK Already connected to specified master")
    return OK


def cmd_role(conn, args):
    return conn.core.app.replication.role_reply()


def cmd_replconf(conn, args):
    """REPLCONF <option> <value> ...: what a replica tells its primary.
    ACK <offset> gets no reply, as in Redis.  On a replica link (after
    CL.SYNC) nothing does, as a reply would land amid the stream's
    frames: a malformed REPLCONF there closes the link instead.  It runs
    before AUTH only on a link CL.SYNC opened with replication
    credentials."""
    if conn.replica is None:
        if not conn.authenticated:
            raise ReplyError("NOAUTH Authentication required.")
        return _replconf(conn, args)
    try:
        _replconf(conn, args)
    except ReplyError:
        conn.close()
    return NO_REPLY


def _replconf(conn, args):
    if len(args) % 2 == 0:
        raise ReplyError("ERR syntax error")
    for i in range(1, len(args), 2):
        option, value = _lower(args[i]), args[i + 1]
        if option == "ack":
            conn.core.app.replication.acknowledge(conn, _int(value, "offset"))
            return NO_REPLY
        if option == "listening-port":
            port = _int(value, "port")
            if not 0 <= port <= 65535:
                raise ReplyError("ERR Invalid listening port")
            conn.replica_port = port
            if conn.replica is not None:
                conn.replica.port = port
        elif option not in ("ip-address", "capa", "getack"):
            raise ReplyError(f"ERR Unrecognized REPLCONF option: {option[:64]}")
    return OK


WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."


def cmd_cl_sync(conn, args):
    """CL.SYNC [<repl-user> <repl-password>]: makes this connection a
    replica's: a full copy follows the reply, then the stream (see
    replstream.py); a replica in sync serves it too, relaying its
    primary's stream.  It only reads: nothing a client sends here can
    change a bucket.  With repl-password set, the credentials are
    required; they stand in for requirepass for CL.SYNC and REPLCONF on
    this connection, and for nothing else."""
    app = conn.core.app
    settings = app.settings
    if len(args) not in (1, 3):
        raise ReplyError("ERR syntax error")
    if len(args) == 3:
        if not _replication_credentials_ok(settings, args[1], args[2]):
            raise ReplyError(WRONGPASS)
    elif not conn.authenticated:
        raise ReplyError("NOAUTH Authentication required.")
    elif settings.repl_password is not None:
        raise ReplyError("NOPERM this primary requires replication credentials: "
                         "CL.SYNC <repl-user> <repl-password>")
    link = app.replication.link
    if link is not None and link.state != "connected":   # a replica relays once in sync
        raise ReplyError("NOMASTERLINK Can't SYNC while not connected with my master")
    if conn.replica is not None:
        raise ReplyError("ERR this connection is already a replica's")
    conn.replica = Follower(conn, conn.addr.rpartition(":")[0], conn.replica_port)
    asyncio.get_running_loop().call_soon(app.replication.attach, conn)
    repl = app.replication
    replid, offset = (link.master_replid, link.offset) if link else (repl.replid, repl.offset)
    return SimpleString(f"FULLSYNC {replid} {offset}")


def _replication_credentials_ok(settings, user: bytes, password: bytes) -> bool:
    expected = settings.repl_password
    if expected is None:
        return False
    # both compared, so the time taken says nothing about which was wrong
    user_ok = hmac.compare_digest(user, settings.repl_user.encode())
    return hmac.compare_digest(password, expected.encode()) and user_ok


def cmd_cl_throttle(conn, args):
    """redis-cell's CL.THROTTLE <key> <max_burst> <count> <period> [<quantity>]"""
    if len(args) > 6:
        raise ReplyError("ERR wrong number of arguments for 'cl.throttle' command")
    numbers = [_int(a, name) for a, name in zip(
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


def cmd_time(conn, args):
    ms = conn.core.clock.now()
    return [str(ms // 1000).encode(), str((ms % 1000) * 1000).encode()]


def cmd_info(conn, args):
    sections = [_lower(a) for a in args[1:]]
    return Verbatim(render_info(conn.core, sections))


def cmd_shutdown(conn, args):
    options = {_lower(a) for a in args[1:]}
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
    sub = _lower(args[1])
    if sub == "clock":
        return _debug_clock(conn, args)
    if sub == "help":
        return [SimpleString(line) for line in (
            "DEBUG CLOCK GET -- the server clock in ms",
            "DEBUG CLOCK SET <ms> -- set the manual clock",
            "DEBUG CLOCK ADVANCE <ms> -- move the manual clock forward",
            "DEBUG SWEEP [budget-ms] -- run the idle-bucket sweep now")]
    if sub == "sweep":
        budget = float(_int(args[2], "budget-ms")) if len(args) > 2 else 100.0
        removed, scanned = conn.core.store.sweep(budget_ms=budget)
        return [removed, scanned]
    raise ReplyError(f"ERR unknown subcommand '{args[1].decode(errors='replace')}'. "
                     "Try DEBUG HELP.")


def _debug_clock(conn, args):
    clock = conn.core.clock
    action = _lower(args[2]) if len(args) > 2 else "get"
    if action == "get" and len(args) <= 3:
        return clock.now()
    if action not in ("set", "advance") or len(args) != 4:
        raise ReplyError("ERR syntax error: DEBUG CLOCK GET | SET <ms> | ADVANCE <ms>")
    if not clock.manual:
        raise ReplyError("ERR DEBUG CLOCK SET/ADVANCE need the server started with --manual-clock")
    value = _int(args[3], "milliseconds")
    try:
        clock.set(value) if action == "set" else clock.advance(value)
    except ValueError as e:
        raise ReplyError(f"ERR {e}") from None
    return clock.now()


# ---- CONFIG ----------------------------------------------------------------------

def cmd_config_get(conn, args):
    return Sliced(cfg.get_matching(conn.core.app.settings, args[2:]))


def cmd_config_set(conn, args):
    if len(args) % 2:
        raise ReplyError("ERR wrong number of arguments for 'config|set' command")
    pairs = [(args[i].decode("utf-8", "replace"), args[i + 1].decode("utf-8", "replace"))
             for i in range(2, len(args), 2)]
    try:
        conn.core.app.config_set(pairs)
    except cfg.UnknownSetting as e:
        raise ReplyError(f"ERR Unknown option or number of arguments for CONFIG SET - "
                         f"'{e.name}'") from None
    except cfg.ConfigError as e:
        raise ReplyError(f"ERR CONFIG SET failed (possibly related to argument "
                         f"'{e.name}') - {e.reason}") from None
    return OK


def cmd_config_resetstat(conn, args):
    conn.core.app.reset_stats()
    return OK


# ---- COMMAND ----------------------------------------------------------------------

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


# ---- subcommand containers ----------------------------------------------------------

def container(name: str, arity: int, flags, subcommands, doc, default=None) -> Command:
    """A command whose second argument names a subcommand (CLIENT LIST);
    `default` answers the bare command, where Redis allows one."""
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
        sub.calls += 1
        conn.last_subcommand = sub.name
        started = time.perf_counter_ns()
        try:
            return sub.handler(conn, args)
        except ReplyError:
            sub.failed_calls += 1
            raise
        finally:
            sub.nsec += time.perf_counter_ns() - started

    def help_lines(conn, args):
        return [SimpleString(f"{name.upper()} <subcommand> [<arg> ...]. Subcommands are:")] + [
            SimpleString(f"{s.name.split('|')[1].upper()} -- {s.doc.get('summary', '')}")
            for s in holder[0].subcommands.values()]

    subs = list(subcommands) + [
        Command(f"{name}|help", 2, ("loading", "stale"), help_lines,
                doc={"summary": "Shows helpful text about the different subcommands."})]
    cmd = Command(name, arity, flags, dispatch, subcommands=subs, doc=doc)
    holder.append(cmd)
    return cmd


def sub(parent: str, name: str, arity: int, handler, summary: str, flags=(), arguments=()):
    return Command(f"{parent}|{name}", arity, flags, handler,
                   doc={"summary": summary, "arguments": list(arguments)})


# ---- the table --------------------------------------------------------------------

def ratelimit_command(name: str, arity: int, handler, summary: str, arguments,
                      replica_peeks: bool = False) -> Command:
    """A write command of the ratelimit group whose key is its second argument;
    replica_peeks when its handler answers a COST 0 peek on a replica."""
    return _cmd(name, arity, ("write", "denyoom", "fast"), handler, keys=(2, 2, 1),
                acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.2.0",
                replica_peeks=replica_peeks, summary=summary, arguments=arguments)


def _cmd(name, arity, flags, handler=None, *, fast=0, keys=(0, 0, 0), acl=(),
         replica_peeks=False, **doc):
    return Command(name, arity, flags, handler, first_key=keys[0], last_key=keys[1],
                   key_step=keys[2], fast=fast, doc=doc, acl_categories=acl,
                   replica_peeks=replica_peeks)


def build_table() -> dict[bytes, Command]:
    conn_flags = ("noscript", "loading", "stale", "fast", "no-auth", "allow-busy")
    commands = [
        _cmd("cl.check", -4, ("write", "denyoom", "fast"), fast=FAST_CL_CHECK, keys=(1, 1, 1),
             replica_peeks=True,
             acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.1.0",
             summary="Spends COST tokens from a token bucket if it holds them; replies "
                     "[allowed, limit, remaining, retry_after_ms, reset_after_ms].",
             arguments=[("key", "key"), ("capacity", "integer"), ("refill_per_sec", "integer"),
                        ("cost", "integer", {"token": "COST", "optional": True}),
                        ("period", "integer", {"token": "PERIOD", "optional": True})]),
        _cmd("cl.reset", 2, ("write", "fast"), lambda c, a: int(c.core.store.reset(a[1])),
             keys=(1, 1, 1), acl=("@write", "@fast", "@ratelimit"), group="ratelimit",
             summary="Forgets a bucket, so it is full again. Replies 1 if it existed.",
             arguments=[("key", "key")]),
        _cmd("cl.limit", -3, ("write", "denyoom", "fast"), fast=FAST_CL_LIMIT, keys=(1, 1, 1),
             replica_peeks=True,
             acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.1.0",
             summary="Checks every rule matching the client, resource and tier, all or "
                     "nothing; replies like CL.CHECK for the binding rule.",
             arguments=[("client_key", "key"), ("resource", "string"),
                        ("tier", "string", {"token": "TIER", "optional": True}),
                        ("cost", "integer", {"token": "COST", "optional": True}),
                        ("detail", "pure-token", {"token": "DETAIL", "optional": True})]),
        _cmd("cl.throttle", -5, ("write", "denyoom", "fast"), cmd_cl_throttle, keys=(1, 1, 1),
             acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.1.0",
             summary="redis-cell's GCRA limiter: [limited, limit, remaining, "
                     "retry_after_s, reset_after_s].",
             arguments=[("key", "key"), ("max_burst", "integer"), ("count", "integer"),
                        ("period", "integer"), ("quantity", "integer", {"optional": True})]),
        _cmd("ping", -1, ("fast", "sentinel"), fast=FAST_PING, acl=("@fast", "@connection"),
             group="connection", summary="Returns the server's liveliness response.",
             arguments=[("message", "string", {"optional": True})]),
        _cmd("echo", 2, ("fast",), cmd_echo, acl=("@fast", "@connection"), group="connection",
             summary="Returns the given string.", arguments=[("message", "string")]),
        _cmd("auth", -2, conn_flags + ("sentinel",), cmd_auth, acl=("@fast", "@connection"),
             group="connection", summary="Authenticates the connection.",
             arguments=[("username", "string", {"optional": True}), ("password", "string")]),
        _cmd("hello", -1, conn_flags + ("sentinel",), cmd_hello, acl=("@fast", "@connection"),
             group="connection", summary="Handshakes with the server.",
             arguments=[("protover", "integer", {"optional": True})]),
        _cmd("select", 2, ("loading", "stale", "fast"), cmd_select, acl=("@fast", "@connection"),
             group="connection", summary="Changes the selected database (only 0 exists).",
             arguments=[("index", "integer")]),
        _cmd("quit", -1, conn_flags, cmd_quit, fast=FAST_QUIT, acl=("@fast", "@connection"),
             group="connection", summary="Closes the connection."),
        _cmd("reset", 1, conn_flags, cmd_reset, fast=FAST_RESET, acl=("@fast", "@connection"),
             group="connection", summary="Resets the connection."),
        _cmd("multi", 1, ("noscript", "loading", "stale", "fast", "allow-busy"), fast=FAST_MULTI,
             acl=("@fast", "@transaction"), group="transactions", summary="Starts a transaction."),
        _cmd("exec", 1, ("noscript", "loading", "stale", "skip-slowlog"), fast=FAST_EXEC,
             acl=("@slow", "@transaction"), group="transactions",
             summary="Executes all commands in a transaction."),
        _cmd("discard", 1, ("noscript", "loading", "stale", "fast", "allow-busy"),
             fast=FAST_DISCARD, acl=("@fast", "@transaction"), group="transactions",
             summary="Discards a transaction."),
        _cmd("dbsize", 1, ("readonly", "fast"), cmd_dbsize, acl=("@keyspace", "@read", "@fast"),
             group="server", summary="Returns the number of live buckets."),
        _cmd("flushall", -1, ("write",), cmd_flushall, acl=("@keyspace", "@write", "@slow"),
             group="server", summary="Removes every bucket.",
             arguments=[("flush-type", "string", {"optional": True})]),
        _cmd("flushdb", -1, ("write",), cmd_flushall, acl=("@keyspace", "@write", "@slow"),
             group="server", summary="Removes every bucket (there is one database).",
             arguments=[("flush-type", "string", {"optional": True})]),
        _cmd("time", 1, ("loading", "stale", "fast"), cmd_time, acl=("@fast",), group="server",
             summary="Returns the server time (the manual clock when it is on)."),
        _cmd("info", -1, ("loading", "stale", "sentinel"), cmd_info, acl=("@slow", "@dangerous"),
             group="server", summary="Returns information and statistics about the server.",
             arguments=[("section", "string", {"optional": True})]),
        _cmd("save", 1, ("admin", "noscript", "no-async-loading", "no-multi"), cmd_save,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Writes the snapshot now, blocking."),
        _cmd("bgsave", -1, ("admin", "noscript", "no-async-loading"), cmd_bgsave,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Writes the snapshot from a forked child."),
        _cmd("lastsave", 1, ("loading", "stale", "fast"), cmd_lastsave,
             acl=("@fast", "@dangerous"), group="server",
             summary="The Unix time of the last successful snapshot."),
        _cmd("shutdown", -1, ("admin", "noscript", "loading", "stale", "no-multi", "sentinel"),
             cmd_shutdown, acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Stops the server."),
        _cmd("debug", -2, ("admin", "noscript", "loading", "stale"), cmd_debug,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Debugging and test helpers (DEBUG HELP)."),
        _cmd("replicaof", 3, ("admin", "noscript", "stale", "no-async-loading"), cmd_replicaof,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Follows a primary as its read-only replica, or with NO ONE stops "
                     "and takes writes.",
             arguments=[("host", "string"), ("port", "integer")]),
        _cmd("slaveof", 3, ("admin", "noscript", "stale", "no-async-loading"), cmd_replicaof,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="The old name of REPLICAOF.",
             arguments=[("host", "string"), ("port", "integer")]),
        _cmd("role", 1, ("noscript", "loading", "stale", "fast", "sentinel"), cmd_role,
             acl=("@admin", "@fast", "@dangerous"), group="server",
             summary="Returns the replication role."),
        _cmd("replconf", -1,
             ("admin", "noscript", "loading", "stale", "allow-busy", "no-auth"),
             cmd_replconf, acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="An internal command a replica sends its primary."),
        _cmd("cl.sync", -1, ("admin", "noscript", "no-multi", "no-auth"), cmd_cl_sync,
             acl=("@admin", "@slow", "@dangerous"), group="server", since="0.4.0",
             summary="An internal command: a replica asks for a full copy and the "
                     "stream of changes.",
             arguments=[("repl-user", "string", {"optional": True}),
                        ("repl-password", "string", {"optional": True})]),
        container("client", -2, ("sentinel",), [
            sub("client", "id", 2, cmd_client_id, "Returns the connection's unique ID."),
            sub("client", "getname", 2, cmd_client_getname, "Returns the connection's name."),
            sub("client", "setname", 3, cmd_client_setname, "Sets the connection's name.",
                arguments=[("connection-name", "string")]),
            sub("client", "setinfo", 4, cmd_client_setinfo,
                "Sets information specific to the client library.",
                arguments=[("attr", "string"), ("value", "string")]),
            sub("client", "list", -2, cmd_client_list, "Lists open connections."),
            sub("client", "info", 2, cmd_client_info, "Returns information about this connection."),
            sub("client", "kill", -3, cmd_client_kill, "Terminates open connections."),
            sub("client", "no-evict", 3, cmd_client_ok, "Accepted for compatibility."),
            sub("client", "no-touch", 3, cmd_client_ok, "Accepted for compatibility."),
        ], {"summary": "A container for client connection commands.", "group": "connection"}),
        container("command", -1, ("loading", "stale"), [
            sub("command", "count", 2, cmd_command_count, "Returns a count of commands."),
            sub("command", "info", -2, cmd_command_info, "Returns information about commands."),
            sub("command", "docs", -2, cmd_command_docs,
                "Returns documentary information about commands."),
            sub("command", "list", -2, cmd_command_list, "Returns a list of command names."),
            sub("command", "getkeys", -3, cmd_command_getkeys,
                "Extracts the key names from a command."),
        ], {"summary": "Returns detailed information about all commands.", "group": "server"},
            default=cmd_command),
        build_rule_command(),
        *rule_check_commands(),
        container("config", -2, (), [
            sub("config", "get", -3, cmd_config_get, "Returns the effective values of settings.",
                arguments=[("parameter", "string")]),
            sub("config", "set", -4, cmd_config_set, "Sets settings at runtime.",
                arguments=[("parameter", "string"), ("value", "string")]),
            sub("config", "resetstat", 2, cmd_config_resetstat, "Resets the server's statistics."),
        ], {"summary": "A container for server configuration commands.", "group": "server"}),
    ]
    return {c.name.encode(): c for c in commands}
