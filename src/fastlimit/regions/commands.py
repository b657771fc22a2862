"""What a peer region's link sends (regions/links.py): CL.REGIONSYNC (its
spends), CL.REGIONDEMAND and CL.REGIONSHARES (rebalancing static shares),
CL.REGIONCHECK (a check whose key lives here)."""

from __future__ import annotations

from fastlimit._resp import ReplyError
from fastlimit.regions.wire import WireError, decode_rls_request, encode_rls_reply
from fastlimit.rls.service import RlsError
from fastlimit.server.arguments import integer
from fastlimit.server.commands.replies import OK


def cmd_cl_regionsync(conn, args):
    """CL.REGIONSYNC <origin region> <run id> <seq> <batch>: the peer's
    spends of global rules, debited here once per sequence number; the
    reply is the sequence number, the link's acknowledgement."""
    seq = integer(args[3], "seq")
    return conn.core.app.regions_sync.receive(bytes(args[1]), bytes(args[2]), seq,
                                              bytes(args[4]))


def cmd_cl_regiondemand(conn, args):
    """CL.REGIONDEMAND <origin region> <document>: a region's checks of
    each rebalanced rule since its last word, on the coordinator."""
    conn.core.app.regions_sync.receive_demand(bytes(args[1]), bytes(args[2]))
    return OK


def cmd_cl_regionshares(conn, args):
    """CL.REGIONSHARES <origin region> <version> shrink|commit <document>:
    a round of new shares from the coordinator; the reply is the version,
    its acknowledgement."""
    version = integer(args[2], "version")
    return conn.core.app.regions_sync.receive_shares(bytes(args[1]), version,
                                                     bytes(args[3]).lower(), bytes(args[4]))


HOME_CHECKS = (b"cl.limit", b"cl.apply")


def cmd_cl_regioncheck(conn, args):
    """CL.REGIONCHECK <origin region> CL.LIMIT|CL.APPLY <its arguments>:
    another region's check of a home rule whose key lives here, run here
    whatever the homes of its rules (so a check is never passed on twice).
    The asking region checked its client's permissions; this one trusts
    the authenticated link."""
    regions = conn.core.app.regions_sync
    regions.peer_name(bytes(args[1]), "CL.REGIONCHECK")
    name = bytes(args[2]).lower()
    if name == b"rls":
        return _home_rls(conn, args)
    if name not in HOME_CHECKS:
        raise ReplyError("ERR CL.REGIONCHECK runs CL.LIMIT, CL.APPLY or RLS")
    key = args[3] if name == b"cl.limit" else args[4] if len(args) > 4 else b""
    moved = conn.core.route_error(bytes(key))     # a cluster's: another shard's key
    if moved is not None:
        raise ReplyError(moved)
    rules = conn.core.rules
    rules.home_local = True
    try:
        reply = conn.core.commands[name].handler(conn, [bytes(a) for a in args[2:]])
    finally:
        rules.home_local = False
    regions.checks_served += 1
    return reply


def _home_rls(conn, args):
    """CL.REGIONCHECK <origin> RLS <domain> <request>: another region's
    Envoy request (wire.py) with a home limit whose descriptor lives here,
    decided here whatever the homes of its other limits."""
    if len(args) != 5:
        raise ReplyError("ERR CL.REGIONCHECK <origin> RLS <domain> <request>")
    try:
        descriptors, hits = decode_rls_request(bytes(args[4]))
    except WireError as e:
        raise ReplyError(f"ERR CL.REGIONCHECK: {e}") from None
    service = conn.core.app.rls.service
    service.home_local = True
    try:
        decision = service.should_rate_limit(bytes(args[3]), descriptors, hits)
    except RlsError as e:
        raise ReplyError(f"ERR {e}") from None
    finally:
        service.home_local = False
    conn.core.app.regions_sync.checks_served += 1
    return encode_rls_reply(*decision)
