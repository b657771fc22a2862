"""Cluster mode's commands: CLUSTER SLOTS, SHARDS, NODES, INFO, MYID and
KEYSLOT in Redis 7.0's shapes, and READONLY, READWRITE and ASKING, from
the cluster subsystem (server/cluster.py).  Without cluster-enabled they
answer Redis's "cluster support disabled" error."""

from __future__ import annotations

from fastlimit._cluster import keyslot
from fastlimit._core import SlotKeys
from fastlimit._resp import ReplyError, Verbatim
from fastlimit.cluster import map as clustermap
from fastlimit.server.arguments import integer
from fastlimit.server.commands.replies import OK

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
    return app.store.count_in_slot(slot) + app.rule_engine.count_in_slot(slot)


def cmd_cluster_getkeysinslot(conn, args):
    _cluster(conn)
    slot = _slot(args[2])
    count = integer(args[3], "value")
    if not 0 <= slot < 16384 or count < 0:
        raise ReplyError("ERR Invalid slot or number of keys")
    app = conn.core.app
    keys = SlotKeys(count)
    app.store.keys_in_slot(keys, slot)
    app.rule_engine.keys_in_slot(keys, slot)
    return keys.keys()
