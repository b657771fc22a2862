"""Replication (Redis's replication.c), cut where its two sides meet.

- primary: the primary's side (Replication: full copies by a forked
  child, batches of changed buckets, followers and their limits);
- replica: the replica's side (PrimaryLink: handshake, full copy, batches,
  reconnects with backoff);
- stream: the stream's frames and their parsing (no asyncio);
- commands: REPLICAOF, ROLE, REPLCONF, CL.SYNC.

Full copies are snapshots (server/snapshot.py); the tables' change logs
are _core.pyx's and _rules.pyx's."""
