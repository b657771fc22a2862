"""What crosses between regions, no I/O: a batch of spends, and the
documents that rebalance static shares (demand, shares).

A batch is the spends of global rules one region made in one
region-sync-ms, summed per bucket, named by rule id (each node numbers
its rules its own way) and by the bucket's key less its rule number:

    <u16 n rules>{<u16 length><rule id>}*n
    <u32 n spends>{<u16 rule index><u32 key length><i64 cost><key>}*n

A region sends it as ``CL.REGIONSYNC <origin> <run id> <seq> <batch>``;
the receiver applies each sequence number once per run (a resend after a
reconnect is answered and skipped), so nothing is counted twice.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_ENTRY = struct.Struct("<HIq")

# A batch's most bytes: the sender cuts larger ones, the receiver refuses
# them, so one command is bounded work for the loop turn that applies it.
MAX_BATCH_BYTES = 64 * 1024


class WireError(ValueError):
    """A batch that cannot be read."""


def encode_batches(spends: Mapping[tuple[int, bytes], int],
                   rule_ids: Mapping[int, str],
                   most: int = MAX_BATCH_BYTES) -> Iterator[bytes]:
    """The spends {(rule number, key): cost} as batches of at most `most`
    bytes, rule numbers named by rule_ids (a spend of a number it does
    not name, a rule deleted meanwhile, is left out, and so is one whose
    key alone would not fit a batch: a client's 64 KB key must not stop a
    link)."""
    ids: dict[str, int] = {}
    head: list[bytes] = []
    body: list[bytes] = []
    size = 6
    count = 0
    for (num, key), cost in spends.items():
        rule_id = rule_ids.get(num)
        if rule_id is None:
            continue
        named = rule_id.encode("utf-8")
        if 6 + 2 + len(named) + _ENTRY.size + len(key) > most:
            continue        # a key too long for any batch: its spend stays here
        grow = _ENTRY.size + len(key) + (0 if rule_id in ids else 2 + len(named))
        if count and size + grow > most:
            yield _batch(head, body, count)
            ids, head, body, size, count = {}, [], [], 6, 0
            grow = _ENTRY.size + len(key) + 2 + len(named)
        if rule_id not in ids:
            ids[rule_id] = len(ids)
            head.append(_U16.pack(len(named)) + named)
        body.append(_ENTRY.pack(ids[rule_id], len(key), cost) + key)
        size += grow
        count += 1
    if count:
        yield _batch(head, body, count)


def route_key(key: bytes, per_resource: bool) -> bytes:
    """The key a spend's bucket key (less its rule number) is routed by in
    a cluster: its client key, as CL.LIMIT's (a per-resource bucket's key
    is <u16 client length><client><resource>)."""
    if not per_resource or len(key) < 2:
        return key
    return key[2:2 + _U16.unpack_from(key)[0]]


def _batch(head: list[bytes], body: list[bytes], count: int) -> bytes:
    return b"".join([_U16.pack(len(head)), *head, _U32.pack(count), *body])


def decode_batch(data: bytes) -> list[tuple[str, bytes, int]]:
    """[(rule id, key, cost), ...]; WireError if malformed."""
    if len(data) > MAX_BATCH_BYTES:
        raise WireError(f"a batch of {len(data)} bytes, over {MAX_BATCH_BYTES}")
    try:
        (nrules,), pos = _U16.unpack_from(data), _U16.size
        ids = []
        for _ in range(nrules):
            (n,) = _U16.unpack_from(data, pos)
            pos += _U16.size
            ids.append(data[pos:pos + n].decode("utf-8"))
            pos += n
        (nspends,) = _U32.unpack_from(data, pos)
        pos += _U32.size
        out = []
        for _ in range(nspends):
            index, n, cost = _ENTRY.unpack_from(data, pos)
            pos += _ENTRY.size
            key = data[pos:pos + n]
            pos += n
            if index >= nrules or len(key) != n or cost <= 0:
                raise WireError("a spend names no rule, runs past the end or is not positive")
            out.append((ids[index], key, cost))
    except (struct.error, UnicodeDecodeError) as e:
        raise WireError(f"unreadable batch: {e}") from None
    if pos != len(data):
        raise WireError("bytes after the last spend")
    return out


# ---- rebalancing static shares (regions/rebalance.py) -------------------------------------

MAX_DOC_BYTES = 64 * 1024
MAX_RULES = 10_000


def encode_demand(demand: Mapping[str, int]) -> bytes:
    """CL.REGIONDEMAND's document: {rule id: checks in the last interval}."""
    return json.dumps(demand, separators=(",", ":")).encode()


def decode_demand(data: bytes) -> dict[str, int]:
    doc = _document(data)
    if not all(type(v) is int and v >= 0 for v in doc.values()):
        raise WireError("a demand is a count of checks (an integer from 0)")
    return doc


def encode_shares(shares: Mapping[str, Mapping[str, int]]) -> bytes:
    """CL.REGIONSHARES's document: {rule id: {region: thousandths}}."""
    return json.dumps(shares, separators=(",", ":")).encode()


def decode_shares(data: bytes) -> dict[str, dict[str, int]]:
    doc = _document(data)
    for shares in doc.values():
        if not isinstance(shares, dict) or not all(
                isinstance(k, str) and type(v) is int and 0 <= v <= 1000
                for k, v in shares.items()) or sum(shares.values()) > 1000:
            raise WireError("shares are {region: thousandths}, at most 1000 together")
    return doc


def _document(data: bytes) -> dict:
    if len(data) > MAX_DOC_BYTES:
        raise WireError(f"a document of {len(data)} bytes, over {MAX_DOC_BYTES}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise WireError(f"unreadable document: {e}") from None
    if not isinstance(doc, dict) or len(doc) > MAX_RULES:
        raise WireError(f"a document is an object of at most {MAX_RULES} rules")
    return doc


# ---- the Envoy service's requests asked of their home region ------------------------------
#
# CL.REGIONCHECK <origin> RLS <domain> <request>: the request's descriptors
# and hits as JSON, each byte string as the Latin-1 text of its bytes (a
# bijection): {"h": hits_addend, "d": [[[[key, value], ...], override or
# null, hits or null], ...]}, override [requests_per_unit, unit].  The reply
# is the decision as RESP: [overall, [[code, requests_per_unit (-1: no
# limit), unit, name, remaining, reset_s], ...], [[name, value], ...]].

def encode_rls_request(descriptors, hits_addend: int) -> bytes:
    return json.dumps({"h": hits_addend, "d": [
        [[[k.decode("latin-1"), v.decode("latin-1")] for k, v in entries],
         list(override) if override is not None else None, hits]
        for entries, override, hits in descriptors]}, separators=(",", ":")).encode()


def decode_rls_request(data: bytes) -> tuple[list, int]:
    """(descriptors, hits_addend) as should_rate_limit takes them."""
    if len(data) > MAX_DOC_BYTES:
        raise WireError(f"a request of {len(data)} bytes, over {MAX_DOC_BYTES}")
    try:
        doc = json.loads(data)
        hits = doc["h"]
        descriptors = [([(_latin1(k), _latin1(v)) for k, v in entries],
                        _override(override), _count(d_hits, True))
                       for entries, override, d_hits in doc["d"]]
        return descriptors, _count(hits, False)
    except (ValueError, RecursionError, TypeError, KeyError) as e:
        raise WireError(f"unreadable request: {e}") from None


def _latin1(text) -> bytes:
    if not isinstance(text, str):
        raise TypeError("a descriptor entry is a pair of strings")
    return text.encode("latin-1")


def _count(value, optional: bool):
    if value is None and optional:
        return None
    if type(value) is not int or not 0 <= value < 2**64:
        raise ValueError("hits are an integer from 0")
    return value


def _override(value) -> tuple[int, int] | None:
    if value is None:
        return None
    rpu, unit = value
    return _count(rpu, False), _count(unit, False)


def encode_rls_reply(overall: int, statuses, headers) -> list:
    return [overall,
            [[code, limit[0] if limit else -1, limit[1] if limit else 0,
              limit[2] if limit else b"", remaining, reset]
             for code, limit, remaining, reset in statuses],
            [[name, value] for name, value in headers]]


def decode_rls_reply(reply) -> tuple[int, list, list]:
    """(overall, statuses, headers) as should_rate_limit gives them."""
    try:
        overall, statuses, headers = reply
        out = [(code, (rpu, unit, name) if rpu >= 0 else None, remaining, reset)
               for code, rpu, unit, name, remaining, reset in statuses]
        if type(overall) is not int or not all(
                type(x) is int for s in statuses for x in (s[0], s[1], s[2], s[4], s[5])):
            raise ValueError("not integers")
        return overall, out, [(bytes(n), bytes(v)) for n, v in headers]
    except (ValueError, TypeError) as e:
        raise WireError(f"unreadable decision: {e}") from None
