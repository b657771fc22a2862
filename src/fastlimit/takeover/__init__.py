"""Upgrades without a restart: a new process takes over the running one's
listening sockets and buckets (issue 30).

- wire: the handover's messages, the version check, descriptors passed
  with SCM_RIGHTS (no asyncio);
- donor: the running server's side of one takeover (Donation);
- heir: the new process's side (the offer taken before it starts, its
  replication link to the donor);
- subsystem: Takeover, through which every listener opens; the
  takeover-socket; copy, pause, flip.

Kernel parts used: ServerCore.pause_clients/resume_clients (_protocol.pyx),
the replication link and stream (replication/), the snapshot format's
version (server/snapshot.py)."""
