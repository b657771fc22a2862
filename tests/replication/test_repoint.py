"""SLAVEOF <host> <port> as Sentinel sends it in a failover: a replica
re-pointed from one primary to another, and a primary demoted under
another, end with exactly the new primary's state (a full copy of it),
never a bucket or a rule only the old one had.

Real processes on manual clocks set to the same time, so buckets are
compared by peeks (COST 0) on each server.
"""

from __future__ import annotations

import json

from wire import wait_until

T0 = 1_000_000
WAIT = 20.0
RULE_A = {"match": {"resource": "GET /a"}, "capacity": 5, "refill_per_second": 1}
RULE_B = {"match": {"resource": "GET /a"}, "capacity": 9, "refill_per_second": 1}


def at_t0(server):
    c = server.client()
    c.execute_command("DEBUG", "CLOCK", "SET", T0)
    return c


def link_up_to(c, port) -> bool:
    info = c.info("replication")
    return info.get("master_port") == port and info.get("master_link_status") == "up"


def wait_link_up_to(c, port) -> None:
    wait_until(lambda: link_up_to(c, port), WAIT, f"the link to port {port} never came up")


def peek(c, key):
    return c.execute_command("CL.CHECK", key, 10, 1, "COST", 0)


def limit_peek(c, key):
    return c.execute_command("CL.LIMIT", key, "GET /a", "COST", 0, "DETAIL")


def state(c, keys) -> dict:
    """What a client sees of every key, plain and by rule, and the rules."""
    return {"dbsize": c.dbsize(),
            "rules": sorted(c.execute_command("CL.RULE", "LIST")),
            "rule_doc": c.execute_command("CL.RULE", "GET", "shared"),
            "buckets": {k: peek(c, k) for k in keys},
            "by_rule": {k: limit_peek(c, k) for k in keys}}


def write(c, prefix, costs, rule_id):
    c.execute_command("CL.RULE", "SET", rule_id, json.dumps(RULE_A))
    for i, cost in enumerate(costs):
        c.execute_command("CL.CHECK", f"{prefix}:{i}", 10, 1, "COST", cost)
        c.execute_command("CL.CHECK", f"both:{i}", 10, 1, "COST", cost)
        c.execute_command("CL.LIMIT", f"both:{i}", "GET /a")


KEYS = [f"{prefix}:{i}" for prefix in ("a", "b", "both") for i in range(20)]


def two_primaries(make_server):
    a, b = make_server("--manual-clock"), make_server("--manual-clock")
    ca, cb = at_t0(a), at_t0(b)
    write(ca, "a", [3] * 20, "only-a")
    ca.execute_command("CL.RULE", "SET", "shared", json.dumps(RULE_A))
    write(cb, "b", [1, 2] * 10, "only-b")
    cb.execute_command("CL.RULE", "SET", "shared", json.dumps(RULE_B))
    return a, b, ca, cb


def test_a_replica_repointed_ends_with_exactly_the_new_primarys_state(make_server):
    a, b, ca, cb = two_primaries(make_server)
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(a.port))
    r = at_t0(replica)
    wait_link_up_to(r, a.port)
    wait_until(lambda: state(r, KEYS) == state(ca, KEYS), WAIT, "the replica never had A's state")
    assert state(ca, KEYS) != state(cb, KEYS)

    assert r.execute_command("SLAVEOF", "127.0.0.1", b.port) is True
    wait_link_up_to(r, b.port)
    # As soon as the link says up, nothing of A's is left.
    assert state(r, KEYS) == state(cb, KEYS)
    # and it follows B from there
    cb.execute_command("CL.CHECK", "b:0", 10, 1, "COST", 5)
    wait_until(lambda: peek(r, "b:0") == peek(cb, "b:0"), WAIT, "B's later write never arrived")
    # A drops its follower when its own loop sees the socket r closed
    wait_until(lambda: ca.info("replication")["connected_slaves"] == 0, WAIT,
               "A to drop the re-pointed replica")


def test_writes_on_the_old_primary_never_reach_a_repointed_replica(make_server):
    """A partitioned old primary goes on taking writes during the failover;
    none of them (not even a batch in flight at the switch) may show on
    the replica once it follows the new primary."""
    a, b, ca, cb = two_primaries(make_server)
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(a.port))
    r = at_t0(replica)
    wait_link_up_to(r, a.port)
    pipe = ca.pipeline(transaction=False)
    for i in range(2000):
        pipe.execute_command("CL.CHECK", f"late:{i % 50}", 10, 1)
    pipe.execute()                 # a stream of batches is under way to the replica
    r.execute_command("SLAVEOF", "127.0.0.1", b.port)
    for i in range(200):
        ca.execute_command("CL.CHECK", f"late:{i % 50}", 10, 1)
    wait_link_up_to(r, b.port)
    late = [f"late:{i}" for i in range(50)]
    assert state(r, KEYS + late) == state(cb, KEYS + late)
    assert r.dbsize() == cb.dbsize()


def test_a_demoted_primary_and_its_replicas_converge_to_the_new_primary(make_server):
    """SLAVEOF <other> on a primary: what only it had is discarded, down
    the chain of its own replicas too."""
    a, b, ca, cb = two_primaries(make_server)
    below = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(a.port))
    s = at_t0(below)
    wait_link_up_to(s, a.port)
    wait_until(lambda: state(s, KEYS) == state(ca, KEYS), WAIT, "the replica never had A's state")

    assert ca.execute_command("SLAVEOF", "127.0.0.1", b.port) is True
    wait_link_up_to(ca, b.port)
    assert state(ca, KEYS) == state(cb, KEYS)
    # A's replica was dropped, came back for a copy of A's new state, and
    # follows B through A
    wait_until(lambda: s.info("replication")["master_link_status"] == "up"
               and state(s, KEYS) == state(cb, KEYS), WAIT,
               "A's replica never converged to B's state")
    cb.execute_command("CL.CHECK", "a:1", 10, 1, "COST", 7)
    wait_until(lambda: peek(s, "a:1") == peek(cb, "a:1"), WAIT, "B's write never went down")


def test_repointing_back_and_forth_keeps_only_the_current_primarys_state(make_server):
    a, b, ca, cb = two_primaries(make_server)
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(a.port))
    r = at_t0(replica)
    for target, c in [(b, cb), (a, ca), (b, cb)]:
        r.execute_command("SLAVEOF", "127.0.0.1", target.port)
        wait_link_up_to(r, target.port)
        assert state(r, KEYS) == state(c, KEYS), target.port


def test_a_failover_between_password_protected_servers_authenticates(make_server):
    """Sentinel's usual set-up: every server has requirepass and masterauth
    alike; promote B, re-point the replica and demote A to it."""
    auth = ("--requirepass", "pw", "--masterauth", "pw")
    a, b = make_server("--manual-clock", *auth), make_server("--manual-clock", *auth)
    replica = make_server("--manual-clock", *auth, "--replicaof", "127.0.0.1", str(a.port))
    ca, cb, r = (at_t0_with(s, "pw") for s in (a, b, replica))
    write(ca, "a", [3] * 20, "only-a")
    wait_link_up_to(r, a.port)
    cb.execute_command("SLAVEOF", "127.0.0.1", a.port)
    wait_link_up_to(cb, a.port)
    wait_until(lambda: state(cb, KEYS) == state(ca, KEYS), WAIT, "B never had A's state")

    cb.execute_command("SLAVEOF", "NO", "ONE")
    cb.execute_command("CL.CHECK", "after-failover", 10, 1, "COST", 6)
    r.execute_command("SLAVEOF", "127.0.0.1", b.port)
    ca.execute_command("SLAVEOF", "127.0.0.1", b.port)
    for c in (r, ca):
        wait_link_up_to(c, b.port)
        assert state(c, KEYS + ["after-failover"]) == state(cb, KEYS + ["after-failover"])
    wait_until(lambda: cb.info("replication")["connected_slaves"] == 2, WAIT,
               "both replicas attached to B")


def test_masterauth_set_at_runtime_is_used_by_the_next_link(make_server):
    protected = make_server("--manual-clock", "--requirepass", "s3cret")
    replica = make_server("--manual-clock")
    r = at_t0(replica)
    r.execute_command("SLAVEOF", "127.0.0.1", protected.port)
    wait_until(lambda: "NOAUTH" in replica.log(), WAIT, "the refused handshake in the log")
    assert r.info("replication")["master_link_status"] == "down"
    r.config_set("masterauth", "s3cret")
    wait_link_up_to(r, protected.port)      # the retry after it authenticates


def at_t0_with(server, password):
    c = server.client(password=password)
    c.execute_command("DEBUG", "CLOCK", "SET", T0)
    return c
