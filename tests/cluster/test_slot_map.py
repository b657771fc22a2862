"""The slot map (fastlimit.cluster.slot_map): the TOML file, its validation,
slot lookup, and the CLUSTER SLOTS/SHARDS/NODES shapes compared field by
field with a real 3-master redis-server cluster."""

from __future__ import annotations

import textwrap

import pytest

from fastlimit._cluster import SLOTS
from fastlimit.cluster.slot_map import (
    MAX_MAP_BYTES,
    MAX_SHARDS,
    Address,
    MapError,
    Roles,
    cluster_nodes,
    cluster_shards,
    cluster_slots,
    dumps,
    load,
    loads,
    static_roles,
)

TWO_STATIC = """
version = 1
[[shard]]
name = "a"
slots = ["0-8191"]
primary = "127.0.0.1:7000"
standbys = ["127.0.0.1:7001"]
[[shard]]
name = "b"
slots = ["8192-16383"]
primary = "127.0.0.1:7002"
"""


def toml(text: str) -> str:
    return textwrap.dedent(text)


def two_shards(a_slots='["0-8191"]', b_slots='["8192-16383"]', a_extra="", b_extra="",
               top="version = 1") -> str:
    return (f'{top}\n[[shard]]\nname = "a"\nslots = {a_slots}\nprimary = "127.0.0.1:7000"\n'
            f'{a_extra}\n[[shard]]\nname = "b"\nslots = {b_slots}\n'
            f'primary = "127.0.0.1:7002"\n{b_extra}\n')


# (what, map text, words the error must contain)
BAD_MAPS = [
    ("overlapping ranges", two_shards(a_slots='["0-8200"]'),
     ["8192-16383", "'b'", "overlaps", "0-8200", "'a'"]),
    ("overlap within one shard", two_shards(a_slots='["0-8191", "100-200"]'),
     ["100-200", "overlaps", "0-8191"]),
    ("a gap", two_shards(a_slots='["0-99", "200-8191"]'),
     ["not covered", "100 slots", "100-199"]),
    ("gaps at both ends", two_shards(a_slots='["5-8191"]', b_slots='["8192-16380"]'),
     ["not covered", "0-4", "16381-16383"]),
    ("a single missing slot", two_shards(b_slots='["8192-16382"]'),
     ["not covered", "(1 slots): 16383"]),
    ("slot past 16383", two_shards(b_slots='["8192-16384"]'),
     ["'b'", "8192-16384", "0..16383"]),
    ("single slot past 16383", two_shards(b_slots='["8192-16383", "20000"]'), ["'20000'"]),
    ("negative slot", two_shards(a_slots='["-1-8191"]'), ["'-1-8191'", "not \"start-end\""]),
    ("start after end", two_shards(a_slots='["8191-0"]'), ["'8191-0'", "start <= end"]),
    ("slot with a plus sign", two_shards(a_slots='["+0-8191"]'), ["'+0-8191'"]),
    ("slot with spaces", two_shards(a_slots='["0 - 8191"]'), ["'0 - 8191'"]),
    ("slots as integers", two_shards(a_slots="[0, 8191]"), ["list of strings"]),
    ("duplicate shard names", two_shards().replace('name = "b"', 'name = "a"'),
     ["duplicate shard name 'a'"]),
    ("a shard name with a space", two_shards().replace('name = "b"', 'name = "b c"'),
     ["'b c'"]),
    ("a hostname", two_shards().replace("127.0.0.1:7002", "localhost:7002"),
     ["'localhost'", "not an IP address"]),
    ("no port", two_shards().replace("127.0.0.1:7002", "127.0.0.1"), ["'127.0.0.1'", "port"]),
    ("port 0", two_shards().replace("127.0.0.1:7002", "127.0.0.1:0"), ["1..65535"]),
    ("port past 65535", two_shards().replace("127.0.0.1:7002", "127.0.0.1:65536"),
     ["1..65535"]),
    ("port with a leading zero", two_shards().replace("127.0.0.1:7002", "127.0.0.1:07002"),
     ["'127.0.0.1:07002'"]),
    ("the unspecified address", two_shards().replace("127.0.0.1:7002", "0.0.0.0:7002"),
     ["'0.0.0.0:7002'", "connect"]),
    ("a standby that is not an address", two_shards(b_extra='standbys = ["x"]'),
     ["shard 'b': standbys", "'x'"]),
    ("one node in two shards", two_shards(b_extra='standbys = ["127.0.0.1:7000"]'),
     ["127.0.0.1:7000", "twice", "'a'", "'b'"]),
    ("sentinel and primary", two_shards(b_extra='sentinel = "fl-1"',
                                        top='version = 1\nsentinels = ["127.0.0.1:26379"]'),
     ["shard 'b'", "not both"]),
    ("neither sentinel nor primary", two_shards().replace('primary = "127.0.0.1:7002"\n', ""),
     ["shard 'b'", "either"]),
    ("a sentinel shard without sentinels",
     two_shards().replace('primary = "127.0.0.1:7002"', 'sentinel = "fl-1"'),
     ["'fl-1'", "lists no sentinels"]),
    ("standbys on a sentinel shard",
     two_shards(top='version = 1\nsentinels = ["127.0.0.1:26379"]',
                b_extra='standbys = ["127.0.0.1:7003"]').replace(
         'primary = "127.0.0.1:7002"', 'sentinel = "fl-1"'),
     ["shard 'b'", "standbys come from Sentinel"]),
    ("a bad sentinel address", two_shards(top='version = 1\nsentinels = ["127.0.0.1"]'),
     ["sentinels", "'127.0.0.1'"]),
    ("no version", two_shards(top=""), ["no version"]),
    ("a negative version", two_shards(top="version = -1"), ["version", "-1"]),
    ("a version past int64", two_shards(top="version = 9223372036854775807")
     .replace("9223372036854775807", "9223372036854775808"), ["version"]),
    ("a boolean version", two_shards(top="version = true"), ["version", "True"]),
    ("a string version", two_shards(top='version = "3"'), ["version", "'3'"]),
    ("no shards", "version = 1\n", ["no shards"]),
    ("an unknown top-level key", two_shards(top="version = 1\nshards = []"),
     ["unknown key(s) shards"]),
    ("an unknown shard key", two_shards(b_extra='replicas = ["127.0.0.1:7003"]'),
     ["unknown key(s) replicas"]),
    ("a shard without a name", two_shards().replace('name = "b"\n', ""), ["shard #2", "no name"]),
    ("not TOML", "version = \n[[", ["not valid TOML"]),
    ("a node id that is not 40 hex",
     two_shards() + '[nodes]\n"127.0.0.1:7000" = "abc"\n', ["127.0.0.1:7000", "'abc'", "40"]),
    ("an upper-case node id",
     two_shards() + f'[nodes]\n"127.0.0.1:7000" = "{"A" * 40}"\n', ["40 lowercase hex"]),
    ("one node id pinned twice",
     two_shards() + f'[nodes]\n"127.0.0.1:7000" = "{"a" * 40}"\n'
     f'"127.0.0.1:7002" = "{"a" * 40}"\n', ["pinned for both"]),
]


@pytest.mark.parametrize("what,text,words", BAD_MAPS, ids=[c[0] for c in BAD_MAPS])
def test_a_bad_map_is_refused_naming_the_problem(what, text, words):
    with pytest.raises(MapError) as e:
        loads(text)
    for word in words:
        assert word in str(e.value), (what, str(e.value))


def test_uncovered_slots_are_listed_and_counted_when_there_are_many_gaps():
    text = two_shards(a_slots="[" + ", ".join(f'"{2 * i}"' for i in range(4096)) + "]")
    with pytest.raises(MapError) as e:
        loads(text)
    message = str(e.value)
    assert "(4096 slots): 1, 3, 5," in message and "and 4086 more ranges" in message


def test_the_two_shard_map_is_valid():
    assert len(loads(TWO_STATIC).shards) == 2


# (version of the running map, version of the new one, accepted)
VERSIONS = [(1, 2, True), (1, 1, False), (5, 4, False), (0, 9223372036854775807, True)]


@pytest.mark.parametrize("current,new,accepted", VERSIONS)
def test_a_map_replaces_the_running_one_only_with_a_higher_version(current, new, accepted):
    running = loads(two_shards(top=f"version = {current}"))
    candidate = loads(two_shards(top=f"version = {new}"))
    if accepted:
        candidate.check_replaces(running)
    else:
        with pytest.raises(MapError, match=f"stale slot map: version {new} is not newer "
                                           f"than the running version {current}"):
            candidate.check_replaces(running)


# (slot, owning shard) in a map with a shard of two non-adjacent ranges.
LOOKUPS = [(0, "a"), (99, "a"), (100, "b"), (8191, "b"), (8192, "a"), (16383, "a")]


@pytest.mark.parametrize("slot,shard", LOOKUPS)
def test_every_slot_finds_its_shard(slot, shard):
    m = loads(two_shards(a_slots='["0-99", "8192-16383"]', b_slots='["100-8191"]'))
    assert m.shard_of(slot).name == shard


def test_the_slot_lookup_is_one_array_entry_per_slot():
    m = loads(two_shards(a_slots='["0-99", "8192-16383"]', b_slots='["100-8191"]'))
    assert m.owner.typecode == "H" and len(m.owner) == SLOTS
    assert [m.owner[s] for s in (0, 99, 100, 8191, 8192, 16383)] == [0, 0, 1, 1, 0, 0]


FULL = toml("""
    version = 7
    sentinels = ["10.0.0.9:26379", "[fe80::1]:26379"]

    [[shard]]
    name = "fl-0"
    slots = ["0-99", "200-5000"]
    sentinel = "fl-0"

    [[shard]]
    name = "fl-1"
    slots = ["100-199", "5001", "5002-16383"]
    primary = "[::1]:7002"
    standbys = ["10.0.0.4:7000", "10.0.0.5:7000"]

    [nodes]
    "10.0.0.4:7000" = "0123456789abcdef0123456789abcdef01234567"
""")


def test_a_map_written_back_reads_as_the_same_map():
    m = loads(FULL)
    again = loads(dumps(m))
    assert again == m
    assert dumps(again) == dumps(m)


def test_a_map_file_is_read_or_refused_naming_the_file(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(FULL)
    assert load(str(path)) == loads(FULL)
    with pytest.raises(MapError, match="cannot read slot map .*missing.toml"):
        load(str(tmp_path / "missing.toml"))
    path.write_bytes(b"version = 1\n\xff")
    with pytest.raises(MapError, match="cannot read slot map .*cluster.toml"):
        load(str(path))
    path.write_text("version = [")
    with pytest.raises(MapError, match="cluster.toml is not valid TOML"):
        load(str(path))


def test_a_node_id_is_pinned_or_derived_from_the_address_the_same_everywhere():
    m = loads(FULL)
    assert m.node_id(Address("10.0.0.4", 7000)) == "0123456789abcdef0123456789abcdef01234567"
    derived = m.node_id(Address("10.0.0.5", 7000))
    assert len(derived) == 40 and int(derived, 16) >= 0
    assert derived == loads(dumps(m)).node_id(Address("10.0.0.5", 7000))
    assert derived != m.node_id(Address("10.0.0.5", 7001))


def test_a_shard_with_no_known_primary_is_left_out_of_every_reply():
    m = loads(FULL)
    roles = static_roles(m)
    assert "fl-0" not in roles       # a Sentinel shard Sentinel has not answered for yet
    owned = {s.name: s for s in m.shards}
    assert {slot for e in cluster_slots(m, roles) for slot in range(e[0], e[1] + 1)} == {
        slot for r in owned["fl-1"].slots for slot in range(r.start, r.end + 1)}
    assert len(cluster_shards(m, roles)) == len(roles)
    myself = next(iter(roles.values())).primary
    assert all(str(r) not in cluster_nodes(m, roles, myself).split()
               for r in owned["fl-0"].slots)


def test_adjacent_ranges_of_one_shard_are_one_cluster_slots_entry():
    m = loads(FULL)
    roles = {**static_roles(m), "fl-0": Roles(Address("10.0.0.1", 7000))}
    assert [(e[0], e[1], e[2][0]) for e in cluster_slots(m, roles)] == [
        (0, 99, "10.0.0.1"), (100, 199, "::1"), (200, 5000, "10.0.0.1"),
        (5001, 16383, "::1")]


def test_cluster_nodes_shows_a_node_in_no_shard_as_an_empty_master(redis_cluster_node):
    m = loads(TWO_STATIC)
    me = Address("127.0.0.1", 7009)
    ours = cluster_nodes(m, static_roles(m), me).splitlines()[-1].split(" ")
    theirs = redis_cluster_node.raw("CLUSTER", "NODES").decode().splitlines()[0].split(" ")
    assert ours[0] == m.node_id(me) and ours[1] == "127.0.0.1:7009@0"
    assert ours[2:] == theirs[2:] == ["myself,master", "-", "0", "0", "0", "connected"]


# -- against a real 3-master cluster -------------------------------------------

def on_the_wire(value, protocol: int):
    """Our reply structure as redis-py reads it after the RESP writer."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):
        return [on_the_wire(v, protocol) for v in value]
    if isinstance(value, dict):
        pairs = [(on_the_wire(k, protocol), on_the_wire(v, protocol)) for k, v in value.items()]
        return dict(pairs) if protocol == 3 else [x for pair in pairs for x in pair]
    return value


def as_map(flat: list) -> dict:
    """A RESP2 map (a flat array of keys and values) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def node_lines(text: str) -> dict[str, list[str]]:
    """CLUSTER NODES by node id, each line's fields."""
    return {line.split(" ")[0]: line.split(" ") for line in text.split("\n") if line}


@pytest.fixture(scope="module")
def mirrored(redis_cluster):
    """The real cluster as a fastlimit map: the same ranges, addresses and
    (pinned) node ids, and Roles with the same primaries, replicas and
    config epochs."""
    slots = redis_cluster[0].raw("CLUSTER", "SLOTS")
    epochs = {f[0]: f[6] for f in node_lines(
        redis_cluster[0].raw("CLUSTER", "NODES").decode()).values()}
    shards, nodes, roles = [], [], {}
    for n, (start, end, primary, *replicas) in enumerate(slots):
        addrs = [f"127.0.0.1:{node[1]}" for node in (primary, *replicas)]
        shards.append(f'[[shard]]\nname = "s{n}"\nslots = ["{start}-{end}"]\n'
                      f'primary = "{addrs[0]}"\nstandbys = {addrs[1:]!r}\n'.replace("'", '"'))
        nodes += [f'"{a}" = "{node[2].decode()}"'
                  for a, node in zip(addrs, (primary, *replicas), strict=True)]
        roles[f"s{n}"] = Roles(Address("127.0.0.1", primary[1]),
                               tuple(Address("127.0.0.1", r[1]) for r in replicas),
                               int(epochs[primary[2].decode()]))
    m = loads("version = 1\n" + "".join(shards) + "[nodes]\n" + "\n".join(nodes) + "\n")
    return m, roles


@pytest.mark.parametrize("protocol", [2, 3])
def test_cluster_slots_equals_redis(redis_cluster, mirrored, protocol):
    m, roles = mirrored
    theirs = redis_cluster[0].raw("CLUSTER", "SLOTS", protocol=protocol)
    assert any(len(entry) == 4 for entry in theirs)      # a replica is listed
    assert on_the_wire(cluster_slots(m, roles), protocol) == theirs


@pytest.mark.parametrize("protocol", [2, 3])
def test_cluster_shards_equals_redis_but_for_replication_offsets(redis_cluster, mirrored,
                                                                 protocol):
    m, roles = mirrored
    theirs = redis_cluster[0].raw("CLUSTER", "SHARDS", protocol=protocol)
    key = b"replication-offset"
    offsets = {}
    for shard in (theirs if protocol == 3 else [as_map(s) for s in theirs]):
        for node in shard[b"nodes"]:
            fields = node if protocol == 3 else as_map(node)
            offsets[Address(fields[b"ip"].decode(), fields[b"port"])] = fields[key]
    ours = on_the_wire(cluster_shards(m, roles, offsets), protocol)

    def first_slot(shard):
        return shard[b"slots"][0] if protocol == 3 else shard[1][0]
    assert sorted(ours, key=first_slot) == sorted(theirs, key=first_slot)


def test_cluster_nodes_equals_redis_from_every_node_but_for_times_and_bus_ports(
        redis_cluster, mirrored):
    m, roles = mirrored
    for node in redis_cluster:
        theirs_text = node.raw("CLUSTER", "NODES").decode()
        ours_text = cluster_nodes(m, roles, Address("127.0.0.1", node.port))
        assert "\r" not in ours_text and ours_text.endswith("\n")
        assert "\r" not in theirs_text and theirs_text.endswith("\n")
        theirs, ours = node_lines(theirs_text), node_lines(ours_text)
        assert ours.keys() == theirs.keys()
        for node_id, fields in ours.items():
            real = theirs[node_id]
            assert fields[1].split("@")[0] == real[1].split("@")[0]   # ip:port
            assert fields[1].endswith("@0")                           # no cluster bus
            assert fields[2:4] == real[2:4], node_id                  # flags, master id
            assert fields[4:6] == ["0", "0"]                          # ping sent, pong received
            assert fields[6:] == real[6:], node_id                    # epoch, link, slots


# ---- a map is bounded work to read ---------------------------------------------------------

def test_a_map_larger_than_its_bound_is_refused():
    padded = TWO_STATIC + "#" * (MAX_MAP_BYTES - len(TWO_STATIC)) + "\n"
    with pytest.raises(MapError) as e:
        loads(padded, "the new slot map")
    assert str(e.value) == (f"the new slot map is larger than the {MAX_MAP_BYTES} bytes a "
                            "slot map may have")
    assert loads(padded[:MAX_MAP_BYTES - 1] + "\n") == loads(TWO_STATIC)


def test_a_map_with_more_shards_than_its_bound_is_refused():
    def shards(count: int) -> str:
        every_slot = '"0-16383"'
        return "version = 1\n" + "".join(
            f'[[shard]]\nname = "s{i}"\nslots = [{every_slot if i == 0 else ""}]\n'
            f'primary = "10.0.{i // 250}.{i % 250 + 1}:7000"\n' for i in range(count))
    assert len(loads(shards(MAX_SHARDS)).shards) == MAX_SHARDS
    with pytest.raises(MapError) as e:
        loads(shards(MAX_SHARDS + 1))
    assert str(e.value) == (f"slot map: {MAX_SHARDS + 1} shards, more than the {MAX_SHARDS} "
                            "a slot map may have")


def test_more_slot_ranges_than_slots_are_refused_before_they_are_sorted():
    text = ('version = 1\n[[shard]]\nname = "a"\nslots = [' + ", ".join(['"0"'] * (SLOTS + 1))
            + ']\nprimary = "127.0.0.1:7000"\n')
    with pytest.raises(MapError) as e:
        loads(text)
    assert str(e.value) == f"slot map: {SLOTS + 1} slot ranges, more than the {SLOTS} slots: " \
                           "some overlap"
