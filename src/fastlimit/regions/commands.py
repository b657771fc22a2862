"""CL.REGIONSYNC: what a peer region's link sends (regions/links.py)."""

from __future__ import annotations

from fastlimit.server.arguments import integer


def cmd_cl_regionsync(conn, args):
    """CL.REGIONSYNC <origin region> <run id> <seq> <batch>: the peer's
    spends of global rules, debited here once per sequence number; the
    reply is the sequence number, the link's acknowledgement."""
    seq = integer(args[3], "seq")
    return conn.core.app.regions_sync.receive(bytes(args[1]), bytes(args[2]), seq,
                                              bytes(args[4]))
