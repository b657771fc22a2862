"""Upgrades without a restart: a new process takes over the running one's
listening sockets, buckets and client connections (issue 30).

- wire: the handover's messages, the version check, descriptors passed
  with SCM_RIGHTS (no asyncio);
- donor: the running server's side of one takeover (Donation);
- heir: the new process's side (the offer taken before it starts, its
  replication link to the donor);
- subsystem: Takeover, through which every listener opens; the
  takeover-socket; copy, pause, flip;
- connections: the client connections passed after the flip, each at a
  command boundary with its state.

Kernel parts used: ServerCore.pause_clients/resume_clients and
Connection.export_state/restore_state (_protocol.pyx), PubSub.restore,
the replication link and stream (replication/), the snapshot format's
version (server/snapshot.py)."""
