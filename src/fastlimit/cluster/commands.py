"""Cluster mode's commands: CLUSTER SLOTS, SHARDS, NODES, INFO, MYID and
KEYSLOT in Redis 7.0's shapes, and READONLY, READWRITE and ASKING, from
the cluster subsystem (cluster/subsystem.py); CL.CLUSTER, through which the
nodes hand each other slot maps and rules, and CL.PEERAUTH, with which a
node calling another proves it knows cluster-user's password
(cluster/peers.py).  Without cluster-enabled they answer Redis's "cluster
support disabled" error."""

from __future__ import annotations

from fastlimit._cluster import keyslot
from fastlimit._core import SlotKeys
from fastlimit._protocol import Awaited
from fastlimit._resp import ReplyError, Verbatim
from fastlimit.cluster import slot_map as clustermap
from fastlimit.cluster.slot_map import MapError
from fastlimit.server.arguments import integer
from fastlimit.server.commands.replies import OK, WRONGPASS

DISABLED = "ERR This instance has cluster support disabled"


def _cluster(conn):
    cluster = conn.core.app.cluster
    if not cluster.enabled:
        raise ReplyError(DISABLED)
    return cluster


def cmd_cluster_slots(conn, args):
    cluster = _cluster(conn)
    return clustermap.cluster_slots(cluster.slot_map, cluster.roles)


def cmd_cluster_shards(conn, args):
    cluster = _cluster(conn)
    return clustermap.cluster_shards(cluster.slot_map, cluster.roles)


def cmd_cluster_nodes(conn, args):
    cluster = _cluster(conn)
    return Verbatim(clustermap.cluster_nodes(cluster.slot_map, cluster.roles,
                                             cluster.myself))


def cmd_cluster_myid(conn, args):
    cluster = _cluster(conn)
    return cluster.slot_map.node_id(cluster.myself)


def cmd_cluster_info(conn, args):
    fields = _cluster(conn).cluster_info()
    return Verbatim("".join(f"{k}:{v}\r\n" for k, v in fields.items()))


def cmd_cluster_keyslot(conn, args):
    _cluster(conn)
    return keyslot(args[2])


def cmd_readonly(conn, args):
    # A standby redirects every keyed command (clients handle MOVED alike),
    # so READONLY changes nothing; clients send it on replica connections.
    _cluster(conn)
    return OK


cmd_readwrite = cmd_readonly


def cmd_asking(conn, args):
    # fastlimit moves slots without ASK (copy, pause, flip), so no
    # command needs it; clients may still send it.
    _cluster(conn)
    return OK


# ---- CL.CLUSTER: slot maps and rules between nodes ------------------------------------

def cmd_cl_cluster_map(conn, args):
    return clustermap.dumps(_cluster(conn).slot_map)


def cmd_cl_cluster_setmap(conn, args):
    try:
        _cluster(conn).install_text(args[2].decode("utf-8", "replace"))
    except MapError as e:
        raise ReplyError(f"ERR {e}") from None
    return OK


def cmd_cl_cluster_push(conn, args):
    cluster = _cluster(conn)

    async def push():
        try:
            await cluster.push_map(args[2].decode("utf-8", "replace"))
        except MapError as e:
            raise ReplyError(f"ERR {e}") from None
        return OK

    return Awaited(push())


def cmd_cl_cluster_versions(conn, args):
    return _cluster(conn).versions()


def cmd_cl_cluster_rules(conn, args):
    return _cluster(conn).rules_state()


def cmd_cl_cluster_setrules(conn, args):
    cluster = _cluster(conn)
    if conn.core.readonly:
        raise ReplyError("ERR a standby takes its rules from its primary")
    counter = integer(args[2], "rules version", 0)
    return 1 if cluster.set_rules(counter, args[3], args[4]) else 0


# ---- CL.PEERAUTH: a calling node proves who it is (needs no AUTH before) -------------

def cmd_cl_peerauth_challenge(conn, args):
    return _cluster(conn).challenges.issue(conn.id)


def cmd_cl_peerauth_prove(conn, args):
    """As AUTH: the connection runs as cluster-user from now on, or
    WRONGPASS, counted and in ACL LOG (not the server's log, which a client
    could otherwise fill)."""
    cluster = _cluster(conn)
    name = args[2].decode("utf-8", "surrogateescape")
    proved = cluster.prove_peer(conn.id, name, args[3], args[4], args[5])
    if proved is None:
        conn.core.app.auth_failures += 1
        conn.core.app.acl.log_denial(conn, "auth", "cl.peerauth", conn.in_multi, username=name)
        raise ReplyError(WRONGPASS)
    user, mine = proved
    conn.set_user(user, True)
    return mine


def cluster_wide(handler):
    """A rule change (CL.RULE SET, DEL, RELOAD): in cluster mode it is in
    force on every primary before the reply, or refused
    (Cluster.rule_change); with a PostgreSQL rules-store it goes to the
    store's table, which every node follows."""
    def run(conn, args):
        cluster = conn.core.app.cluster
        if not cluster.enabled or conn.core.app.rules_store is not None:
            return handler(conn, args)      # (a shared store is how rules travel then)
        return Awaited(cluster.rule_change(lambda: handler(conn, args)))
    return run

# ---- keys of a slot ------------------------------------------------------------------
#
# fastlimit keeps no per-slot index (Redis does, one entry per key): each
# call scans the whole table in C, with no Python object per bucket.  The
# count is of buckets; the keys are the keys clients route by (a CL.CHECK
# key, or the client key of rule buckets), each once.

def _slot(value: bytes) -> int:
    return integer(value, "value")


def cmd_cluster_countkeysinslot(conn, args):
    _cluster(conn)
    slot = _slot(args[2])
    if not 0 <= slot < 16384:
        raise ReplyError("ERR Invalid slot")
    app = conn.core.app
    return sum(store.count_in_slot(slot) for store in app.stores)


def cmd_cluster_getkeysinslot(conn, args):
    _cluster(conn)
    slot = _slot(args[2])
    count = integer(args[3], "value")
    if not 0 <= slot < 16384 or count < 0:
        raise ReplyError("ERR Invalid slot or number of keys")
    app = conn.core.app
    keys = SlotKeys(count)
    for store in app.stores:
        store.keys_in_slot(keys, slot)
    return keys.keys()


# ---- moving slots (cluster/reshard.py) -------------------------------------------------

def cmd_cl_cluster_move(conn, args):
    _cluster(conn)
    try:
        slots = clustermap.SlotRange.parse(args[2].decode("utf-8", "replace"), "slot range")
    except MapError as e:
        raise ReplyError(f"ERR {e}") from None
    return Awaited(conn.core.app.reshard.move(slots, args[3].decode("utf-8", "replace")))


def cmd_cl_cluster_movestatus(conn, args):
    _cluster(conn)
    return conn.core.app.reshard.move_status()


def cmd_cl_cluster_import(conn, args):
    _cluster(conn)
    return conn.core.app.reshard.import_blob(args[2])
