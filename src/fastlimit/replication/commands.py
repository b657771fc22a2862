"""Replication: REPLICAOF/SLAVEOF, ROLE, what a replica says to its primary
(REPLCONF), and CL.SYNC, which makes a connection a replica's."""

from __future__ import annotations

import asyncio

from fastlimit._resp import NO_REPLY, ReplyError, SimpleString
from fastlimit.replication.primary import Follower
from fastlimit.server import config as cfg
from fastlimit.server.arguments import integer, lowercase
from fastlimit.server.commands.replies import OK


def cmd_replicaof(conn, args):
    """REPLICAOF <host> <port> | NO ONE (SLAVEOF is the same command)."""
    repl = conn.core.app.replication
    if lowercase(args[1]) == "no" and lowercase(args[2]) == "one":
        repl.promote()
        return OK
    port = integer(args[2], "port")
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
    frames: a malformed REPLCONF there closes the link instead."""
    if conn.replica is None:
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
        option, value = lowercase(args[i]), args[i + 1]
        if option == "ack":
            conn.core.app.replication.acknowledge(conn, integer(value, "offset"))
            return NO_REPLY
        if option == "listening-port":
            port = integer(value, "port")
            if not 0 <= port <= 65535:
                raise ReplyError("ERR Invalid listening port")
            conn.replica_port = port
            if conn.replica is not None:
                conn.replica.port = port
        elif option == "ip-address":
            _announce_ip(conn, value)
        elif option not in ("capa", "getack"):
            raise ReplyError(f"ERR Unrecognized REPLCONF option: {option[:64]}")
    return OK


def _announce_ip(conn, value: bytes) -> None:
    """The address the primary lists a replica under (replica-announce-ip),
    in place of the link's own.  A fastlimit replica sends it after
    CL.SYNC, as the replica link is where it is kept."""
    if conn.replica is None:
        raise ReplyError("ERR REPLCONF ip-address is taken after CL.SYNC, on the replica link")
    try:
        ip = cfg.parse_announce_ip(value.decode("utf-8", "replace"))
    except cfg.ConfigError as e:
        raise ReplyError(f"ERR REPLCONF ip-address: {e.reason}") from None
    if ip is not None:
        conn.replica.ip = ip


def cmd_cl_sync(conn, args):
    """CL.SYNC: makes this connection a replica's: a full copy follows the
    reply, then the stream (see replication/stream.py); a replica in sync serves
    it too, relaying its primary's stream.  It only reads: nothing a
    client sends here can change a bucket.  Like any command it needs a
    user whose ACL allows it (a replica AUTHs as its masteruser); with
    repl-password set, only repl-user (the ACL user acl/users.py makes
    of the two) may sync, whatever other users may run."""
    app = conn.core.app
    settings = app.settings
    if settings.repl_password is not None and conn.user.name != settings.repl_user:
        raise ReplyError("NOPERM this primary requires replication credentials: "
                         "AUTH <repl-user> <repl-password>")
    link = app.replication.link
    if link is not None and link.state != "connected":   # a replica relays once in sync
        raise ReplyError("NOMASTERLINK Can't SYNC while not connected with my master")
    conn.replica = Follower(conn, conn.addr.rpartition(":")[0].strip("[]"), conn.replica_port)
    asyncio.get_running_loop().call_soon(app.replication.attach, conn)
    repl = app.replication
    replid, offset = (link.master_replid, link.offset) if link else (repl.replid, repl.offset)
    return SimpleString(f"FULLSYNC {replid} {offset}")
