"""The versioned slot map: which shard owns each of the 16384 hash slots,
and how each shard's primary is found (a Sentinel master name, or a
static primary and standbys).

The map is read from a TOML file (``cluster-config-file``)::

    version = 3
    sentinels = ["10.0.0.9:26379"]       # needed when a shard names a sentinel

    [[shard]]
    name = "fl-0"
    slots = ["0-8191"]                   # "start-end" (inclusive) or "slot"
    sentinel = "fl-0"                    # the Sentinel master name

    [[shard]]
    name = "fl-1"
    slots = ["8192-16383"]
    primary = "10.0.0.3:7000"
    standbys = ["10.0.0.4:7000"]

    [nodes]                              # optional: pinned node ids
    "10.0.0.3:7000" = "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca"

A node's id is the pinned one, or else sha1("host:port"), so every node
derives the same 40-hex id for the same address (Redis clients match ids
across CLUSTER SLOTS and CLUSTER NODES).

The reply builders take the map plus who is primary of each shard now
(``Roles``; from Sentinel, or ``static_roles`` for static shards) and
return the Python structures the RESP writer encodes, in Redis 7.0's
shapes (cluster.c: clusterReplyMultiBulkSlots, clusterReplyShards,
clusterGenNodeDescription).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import tomllib
from array import array
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import tomlkit

from fastlimit._cluster import SLOTS
from fastlimit._resp import parse_integer

VERSION_MAX = 2**63 - 1
# What a map may hold, so that reading one (CL.CLUSTER MAP, a peer's, the
# cluster-config-file) is bounded work: Redis Cluster's advised most
# nodes is 1,000, and no slot is in two ranges.
MAX_MAP_BYTES = 1024**2
MAX_SHARDS = 1000
# Shard and Sentinel master names: printable, no spaces (they go into
# commands and logs as one word).
_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_NODE_ID = re.compile(r"[0-9a-f]{40}")


class MapError(ValueError):
    """A slot map that cannot be used; the message names the problem."""


@dataclass(frozen=True, order=True)
class Address:
    """A node's announced IP address and port (clients connect to it)."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: object, what: str) -> Address:
        """Reads "ip:port" or "[ipv6]:port"; MapError naming what otherwise."""
        if not isinstance(text, str):
            raise MapError(f"{what}: expected \"ip:port\", got {text!r}")
        host, sep, port_text = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        port = parse_integer(port_text)
        if not sep or port is None or not 1 <= port <= 65535:
            raise MapError(f"{what}: {text!r} is not \"ip:port\" with a port in 1..65535")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise MapError(f"{what}: {host!r} in {text!r} is not an IP address "
                           "(clients connect to what the map says)") from None
        if ip.is_unspecified:
            raise MapError(f"{what}: {text!r} is not an address a client can connect to")
        return cls(str(ip), port)

    @property
    def redis_form(self) -> str:
        """host:port as Redis writes it in CLUSTER NODES and MOVED (IPv6 bare)."""
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else self.redis_form


@dataclass(frozen=True, order=True)
class SlotRange:
    """Slots start..end, both included."""

    start: int
    end: int

    @classmethod
    def parse(cls, text: object, what: str) -> SlotRange:
        if not isinstance(text, str):
            raise MapError(f"{what}: a slot range is a string \"start-end\" or \"slot\", "
                           f"got {text!r}")
        first, sep, last = text.partition("-")
        start = parse_integer(first)
        end = parse_integer(last) if sep else start
        if start is None or end is None:
            raise MapError(f"{what}: {text!r} is not \"start-end\" or \"slot\"")
        if not (0 <= start <= end < SLOTS):
            raise MapError(f"{what}: range {text!r} is not within 0..{SLOTS - 1} "
                           "with start <= end")
        return cls(start, end)

    def __str__(self) -> str:
        return str(self.start) if self.start == self.end else f"{self.start}-{self.end}"


@dataclass(frozen=True)
class Shard:
    """A shard: its slots, and either a Sentinel master name or a static
    primary with its standbys."""

    name: str
    slots: tuple[SlotRange, ...]
    sentinel: str | None = None
    primary: Address | None = None
    standbys: tuple[Address, ...] = ()


@dataclass(frozen=True)
class Roles:
    """Who serves a shard now: its primary, its available standbys, and its
    config epoch (Sentinel's; 0 for a static shard)."""

    primary: Address
    standbys: tuple[Address, ...] = ()
    epoch: int = 0


@dataclass(frozen=True)
class SlotMap:
    """A validated map; build it with ``SlotMap.build`` or ``load``."""

    version: int
    shards: tuple[Shard, ...]
    sentinels: tuple[Address, ...] = ()
    pinned_ids: Mapping[Address, str] = field(default_factory=dict)
    # owner[slot] is the index in shards of the slot's shard (a uint16
    # buffer, so the connection can route in C from a typed view of it).
    owner: array = field(default_factory=lambda: array("H"), repr=False)
    # (start, end, shard index) per contiguous run, in slot order.
    runs: tuple[tuple[int, int, int], ...] = field(default=(), repr=False)

    @classmethod
    def build(cls, version: int, shards: Iterable[Shard], sentinels: Iterable[Address] = (),
              pinned_ids: Mapping[Address, str] | None = None) -> SlotMap:
        """Validates everything; MapError names the first problem found."""
        shards = tuple(shards)
        sentinels = tuple(sentinels)
        pinned = dict(pinned_ids or {})
        _check_version(version)
        _check_shards(shards, sentinels)
        _check_pinned_ids(pinned)
        owner = _owner_array(shards)
        return cls(version, shards, sentinels, pinned, owner, _runs(owner))

    def shard_of(self, slot: int) -> Shard:
        """The shard owning slot (0..16383), in O(1)."""
        return self.shards[self.owner[slot]]

    def node_id(self, addr: Address) -> str:
        """The node's 40-hex id, the same on every node's view."""
        pinned = self.pinned_ids.get(addr)
        return pinned if pinned is not None else hashlib.sha1(
            addr.redis_form.encode()).hexdigest()

    def check_replaces(self, current: SlotMap) -> None:
        """Refuses a map that is not newer than the running one."""
        if self.version <= current.version:
            raise MapError(f"stale slot map: version {self.version} is not newer than the "
                           f"running version {current.version}")

    def shard_runs(self) -> Iterator[tuple[int, int, Shard]]:
        """Contiguous (start, end, shard) runs in slot order."""
        return ((start, end, self.shards[i]) for start, end, i in self.runs)


# -- validation ---------------------------------------------------------------

def _check_version(version: object) -> None:
    if type(version) is not int or not 0 <= version <= VERSION_MAX:
        raise MapError(f"slot map version must be an integer in 0..{VERSION_MAX}, "
                       f"got {version!r}")


def _check_shards(shards: tuple[Shard, ...], sentinels: tuple[Address, ...]) -> None:
    if not shards:
        raise MapError("slot map has no shards")
    names: set[str] = set()
    seen: dict[Address, str] = {}
    for shard in shards:
        if not _NAME.fullmatch(shard.name):
            raise MapError(f"shard name {shard.name!r}: use 1..64 of A-Z a-z 0-9 . _ : -")
        if shard.name in names:
            raise MapError(f"duplicate shard name {shard.name!r}")
        names.add(shard.name)
        if (shard.sentinel is None) == (shard.primary is None):
            raise MapError(f"shard {shard.name!r}: give either a sentinel master name or a "
                           "static primary, not both or neither")
        if shard.sentinel is not None:
            if shard.standbys:
                raise MapError(f"shard {shard.name!r}: standbys come from Sentinel when the "
                               "shard names a sentinel; list them only with a static primary")
            if not _NAME.fullmatch(shard.sentinel):
                raise MapError(f"shard {shard.name!r}: sentinel master name "
                               f"{shard.sentinel!r}: use 1..64 of A-Z a-z 0-9 . _ : -")
            if not sentinels:
                raise MapError(f"shard {shard.name!r} names sentinel master "
                               f"{shard.sentinel!r} but the map lists no sentinels")
        for addr in (shard.primary, *shard.standbys):
            if addr is None:
                continue
            if addr in seen:
                raise MapError(f"node {addr} is listed twice (shard {seen[addr]!r} and "
                               f"shard {shard.name!r})")
            seen[addr] = shard.name
    _check_coverage(shards)


def _check_coverage(shards: tuple[Shard, ...]) -> None:
    """No slot in two shards; every slot in one (cluster_state:ok needs it)."""
    ranges = sorted((r, s.name) for s in shards for r in s.slots)
    for (a, a_name), (b, b_name) in zip(ranges, ranges[1:], strict=False):
        if b.start <= a.end:
            raise MapError(f"slot range {b} of shard {b_name!r} overlaps range {a} of "
                           f"shard {a_name!r}")
    missing: list[SlotRange] = []
    next_slot = 0
    for r, _ in ranges:
        if r.start > next_slot:
            missing.append(SlotRange(next_slot, r.start - 1))
        next_slot = r.end + 1
    if next_slot < SLOTS:
        missing.append(SlotRange(next_slot, SLOTS - 1))
    if missing:
        count = sum(r.end - r.start + 1 for r in missing)
        shown = ", ".join(str(r) for r in missing[:10])
        more = f" and {len(missing) - 10} more ranges" if len(missing) > 10 else ""
        raise MapError(f"slots not covered by any shard ({count} slots): {shown}{more}; "
                       "every slot 0..16383 needs a shard")


def _check_pinned_ids(pinned: Mapping[Address, str]) -> None:
    owners: dict[str, Address] = {}
    for addr, node_id in pinned.items():
        if not isinstance(node_id, str) or not _NODE_ID.fullmatch(node_id):
            raise MapError(f"node id of {addr}: {node_id!r} is not 40 lowercase hex digits")
        if node_id in owners:
            raise MapError(f"node id {node_id} is pinned for both {owners[node_id]} and {addr}")
        owners[node_id] = addr


def _runs(owner: array) -> tuple[tuple[int, int, int], ...]:
    """Adjacent ranges of one shard merged, as Redis walks its slots for
    CLUSTER SLOTS; computed once per map, not per reply."""
    runs = []
    start = 0
    for slot in range(1, SLOTS + 1):
        if slot == SLOTS or owner[slot] != owner[start]:
            runs.append((start, slot - 1, owner[start]))
            start = slot
    return tuple(runs)


def _owner_array(shards: tuple[Shard, ...]) -> array:
    owner = array("H", bytes(2 * SLOTS))
    for index, shard in enumerate(shards):
        for r in shard.slots:
            owner[r.start:r.end + 1] = array("H", [index]) * (r.end - r.start + 1)
    return owner


# -- the TOML file ------------------------------------------------------------

_SHARD_KEYS = {"name", "slots", "sentinel", "primary", "standbys"}
_TOP_KEYS = {"version", "sentinels", "shard", "nodes"}


def loads(text: str, source: str = "slot map") -> SlotMap:
    """Parses and validates a map; MapError says what is wrong and where."""
    if len(text) > MAX_MAP_BYTES:
        raise MapError(f"{source} is larger than the {MAX_MAP_BYTES} bytes a slot map may have")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MapError(f"{source} is not valid TOML: {e}") from None
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise MapError(f"{source}: unknown key(s) {', '.join(sorted(unknown))} "
                       f"(known: {', '.join(sorted(_TOP_KEYS))})")
    if "version" not in data:
        raise MapError(f"{source}: no version")
    raw_shards = data.get("shard", [])
    if not isinstance(raw_shards, list):
        raise MapError(f"{source}: write each shard as a [[shard]] table")
    if len(raw_shards) > MAX_SHARDS:
        raise MapError(f"{source}: {len(raw_shards)} shards, more than the {MAX_SHARDS} "
                       "a slot map may have")
    sentinels = tuple(Address.parse(a, f"{source}: sentinels")
                      for a in _string_list(data.get("sentinels", []), f"{source}: sentinels"))
    nodes = data.get("nodes", {})
    if not isinstance(nodes, dict):
        raise MapError(f"{source}: [nodes] maps \"ip:port\" to a node id")
    pinned = {Address.parse(a, f"{source}: [nodes]"): i for a, i in nodes.items()}
    shards = [_shard_from_table(t, f"{source}: shard #{n + 1}")
              for n, t in enumerate(raw_shards)]
    ranges = sum(len(shard.slots) for shard in shards)
    if ranges > SLOTS:
        raise MapError(f"{source}: {ranges} slot ranges, more than the {SLOTS} slots: "
                       "some overlap")
    return SlotMap.build(data["version"], shards, sentinels, pinned)


def load(path: str) -> SlotMap:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_MAP_BYTES + 1)     # loads refuses a larger one
    except (OSError, UnicodeDecodeError) as e:
        raise MapError(f"cannot read slot map {path}: {e}") from None
    return loads(text, path)


def _string_list(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MapError(f"{what}: expected a list of strings, got {value!r}")
    return value


def _shard_from_table(table: object, what: str) -> Shard:
    if not isinstance(table, dict):
        raise MapError(f"{what}: not a table")
    unknown = set(table) - _SHARD_KEYS
    if unknown:
        raise MapError(f"{what}: unknown key(s) {', '.join(sorted(unknown))} "
                       f"(known: {', '.join(sorted(_SHARD_KEYS))})")
    name = table.get("name")
    if not isinstance(name, str):
        raise MapError(f"{what}: no name")
    what = f"shard {name!r}"
    slots = tuple(SlotRange.parse(r, what) for r in _string_list(table.get("slots", []), what))
    sentinel = table.get("sentinel")
    if sentinel is not None and not isinstance(sentinel, str):
        raise MapError(f"{what}: sentinel is a Sentinel master name, got {sentinel!r}")
    primary = table.get("primary")
    return Shard(
        name, slots, sentinel,
        Address.parse(primary, f"{what}: primary") if primary is not None else None,
        tuple(Address.parse(a, f"{what}: standbys")
              for a in _string_list(table.get("standbys", []), what)))


def dumps(slot_map: SlotMap) -> str:
    """The map as TOML that ``loads`` reads back to an equal map."""
    doc = tomlkit.document()
    doc["version"] = slot_map.version
    if slot_map.sentinels:
        doc["sentinels"] = [str(a) for a in slot_map.sentinels]
    shards = tomlkit.aot()
    for shard in slot_map.shards:
        t = tomlkit.table()
        t["name"] = shard.name
        t["slots"] = [str(r) for r in shard.slots]
        if shard.sentinel is not None:
            t["sentinel"] = shard.sentinel
        if shard.primary is not None:
            t["primary"] = str(shard.primary)
        if shard.standbys:
            t["standbys"] = [str(a) for a in shard.standbys]
        shards.append(t)
    doc["shard"] = shards
    if slot_map.pinned_ids:
        nodes = tomlkit.table()
        for addr, node_id in sorted(slot_map.pinned_ids.items()):
            nodes[str(addr)] = node_id
        doc["nodes"] = nodes
    return tomlkit.dumps(doc)


# -- replies ------------------------------------------------------------------

def static_roles(slot_map: SlotMap) -> dict[str, Roles]:
    """Roles of the static shards, as the map lists them."""
    return {s.name: Roles(s.primary, s.standbys)
            for s in slot_map.shards if s.primary is not None}


def cluster_slots(slot_map: SlotMap, roles: Mapping[str, Roles]) -> list[list]:
    """CLUSTER SLOTS: [start, end, primary, standby...] per contiguous run,
    each node [ip, port, id, {}] (the map is empty: the endpoint is the ip).
    A shard whose primary is not known (not in roles) is left out, as Redis
    leaves out slots no node serves; so are its slots in SHARDS and NODES."""

    def node(addr: Address) -> list:
        return [addr.host, addr.port, slot_map.node_id(addr), {}]

    return [[start, end, *(node(a) for a in (roles[s.name].primary, *roles[s.name].standbys))]
            for start, end, s in slot_map.shard_runs() if s.name in roles]


def cluster_shards(slot_map: SlotMap, roles: Mapping[str, Roles],
                   offsets: Mapping[Address, int] | None = None) -> list[dict]:
    """CLUSTER SHARDS: per shard {"slots": [s1, e1, ...], "nodes": [...]},
    each node map in Redis 7.0's field order."""
    offsets = offsets or {}

    def node(addr: Address, role: str) -> dict:
        return {"id": slot_map.node_id(addr), "port": addr.port, "ip": addr.host,
                "endpoint": addr.host, "role": role,
                "replication-offset": offsets.get(addr, 0), "health": "online"}

    by_shard: dict[str, list[int]] = {s.name: [] for s in slot_map.shards}
    for start, end, s in slot_map.shard_runs():
        by_shard[s.name] += [start, end]
    return [{"slots": by_shard[s.name],
             "nodes": [node(roles[s.name].primary, "master"),
                       *(node(a, "replica") for a in roles[s.name].standbys)]}
            for s in slot_map.shards if s.name in roles]


def cluster_nodes(slot_map: SlotMap, roles: Mapping[str, Roles], myself: Address) -> str:
    """CLUSTER NODES as seen from myself: one line per node, each ending in
    "\\n" only (Lettuce fails on "\\r\\n").  fastlimit has no cluster bus, so
    the bus port is 0; ping and pong times are 0.  A node in no shard is
    shown as Redis shows an empty master, so there is always a myself line."""
    ranges: dict[str, list[str]] = {s.name: [] for s in slot_map.shards}
    for start, end, s in slot_map.shard_runs():
        ranges[s.name].append(str(SlotRange(start, end)))

    def line(addr: Address, role: str, master: str, epoch: int, slots: list[str]) -> str:
        flags = f"myself,{role}" if addr == myself else role
        return " ".join([slot_map.node_id(addr), f"{addr.redis_form}@0", flags, master,
                         "0", "0", str(epoch), "connected", *slots]) + "\n"

    lines = []
    listed = False
    for s in slot_map.shards:
        if s.name not in roles:
            continue
        r = roles[s.name]
        primary_id = slot_map.node_id(r.primary)
        lines.append(line(r.primary, "master", "-", r.epoch, ranges[s.name]))
        lines += [line(a, "slave", primary_id, r.epoch, []) for a in r.standbys]
        listed = listed or myself == r.primary or myself in r.standbys
    if not listed:
        lines.append(line(myself, "master", "-", 0, []))
    return "".join(lines)
