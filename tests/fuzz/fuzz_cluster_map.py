"""The cluster's slot map (cluster/slot_map.py): TOML text, parsed and checked.
MapError is the one clear error.  A map that loads must survive its own
dumps() unchanged and give CLUSTER SLOTS, SHARDS and NODES answers."""

import sys

import harness

with harness.instrumented():
    from fastlimit.cluster import slot_map as slot_map

ELSEWHERE = slot_map.Address.parse("127.0.0.1:1", "fuzz")


def one_input(data: bytes) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return      # load() refuses it before parsing, with MapError
    with harness.expect(slot_map.MapError):
        m = slot_map.loads(text)
        again = slot_map.loads(slot_map.dumps(m))
        if slot_map.dumps(again) != slot_map.dumps(m):
            raise harness.Finding(f"{slot_map.dumps(m)!r} does not read back the same")
        roles = slot_map.static_roles(m)
        slot_map.cluster_slots(m, roles)
        slot_map.cluster_shards(m, roles)
        for myself in [s.primary for s in m.shards if s.primary] + [ELSEWHERE]:
            slot_map.cluster_nodes(m, roles, myself)


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
