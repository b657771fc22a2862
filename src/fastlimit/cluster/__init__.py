"""Cluster mode, everything about it in one folder (Redis's cluster.c).

- slot_map: the versioned slot map and the CLUSTER replies built from it
  (no asyncio, no server wiring);
- subsystem: the server's cluster subsystem (the map in force, CLUSTER
  SLOTS/SHARDS, -MOVED routing switched on in the connection);
- sentinel_roles: who is primary of each shard, from Sentinel;
- reshard: slot moves between shards (CL.CLUSTER MOVE: buckets copied,
  slots paused then handed over, nothing reset);
- peers: calls to other nodes, authenticated (CL.PEERAUTH);
- commands: the CLUSTER and cluster-only commands' handlers;
- client: the client library's side (slot table, per-node pipelines).

Compiled parts it uses: _cluster.pyx (CRC16 and hash tags), _core.pyx's
"cluster slots" section (per-slot scans), _rules.pyx's, and
_protocol.pyx's routing (serves_key, redirect, wait_for_slot)."""
