"""The Envoy rate limit service's counters are buckets like any rule's:
a restart from the snapshot keeps them, a standby has them when it is
promoted, and a standby counts nothing of its own."""

from __future__ import annotations

import os

import grpc
import pytest
from rls_messages import descriptor, error_of, request
from wire import wait_until

T0 = 1_767_830_400_000       # a Thursday at 00:00 UTC: every window starts here

LIMITS = """domain: d
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
"""
# LIMITS with one more limit: its counter's rule is reserved by a reload.
MORE = LIMITS + """  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: sliding_window}
"""
WAIT = 15.0        # real time: replication and the file poll run on their own




def remaining(srv, key: bytes, hits: int | None = None) -> int:
    reply = srv.should_rate_limit(request(b"d", descriptor([(key, b"alice")], hits_addend=hits)))
    return reply["statuses"][0]["remaining"]


def at_t0(srv):
    srv.client().execute_command("DEBUG", "CLOCK", "SET", T0)
    return srv


def rewrite(path, text: str) -> None:
    path.write_text(text)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def caught_up(primary, replica) -> bool:
    target = primary.client().info("replication")["master_repl_offset"]
    info = replica.client().info("replication")
    return info.get("master_link_status") == "up" and info["slave_repl_offset"] >= target


@pytest.mark.parametrize("key", [b"fixed", b"bucket"])
def test_the_counters_survive_a_restart_from_the_snapshot(make_grpc_server, tmp_path, key):
    config = tmp_path / "rls.yaml"
    config.write_text(LIMITS)
    args = ("--manual-clock", "--rls-config", str(config),
            "--snapshot-file", str(tmp_path / "fastlimit.snap"))
    first = at_t0(make_grpc_server(*args))
    assert [remaining(first, key) for _ in range(3)] == [4, 3, 2]
    first.client().save()
    first.stop()
    second = at_t0(make_grpc_server(*args))
    assert remaining(second, key) == 1


def test_a_promoted_standby_has_the_counters_and_a_standby_counts_nothing(
        make_grpc_server, tmp_path):
    config = tmp_path / "rls.yaml"
    config.write_text(LIMITS)
    args = ("--manual-clock", "--rls-config", str(config))
    primary = at_t0(make_grpc_server(*args))
    replica = at_t0(make_grpc_server(*args, "--replicaof", "127.0.0.1", str(primary.port)))
    assert [remaining(primary, b"fixed") for _ in range(3)] == [4, 3, 2]
    assert [remaining(primary, b"bucket") for _ in range(2)] == [4, 3]
    wait_until(lambda: caught_up(primary, replica), WAIT, what="the standby to catch up")
    assert error_of(lambda: remaining(replica, b"fixed")) == (grpc.StatusCode.UNKNOWN,
                                 "READONLY You can't write against a read only replica.")
    assert remaining(replica, b"fixed", hits=0) == 2      # a check that counts nothing
    replica.client().execute_command("REPLICAOF", "NO", "ONE")
    assert remaining(replica, b"fixed") == 1
    assert remaining(replica, b"bucket") == 2


def test_a_counter_reserved_by_a_reload_reaches_the_standby(make_grpc_server, tmp_path):
    primary_config, replica_config = tmp_path / "p.yaml", tmp_path / "r.yaml"
    primary_config.write_text(LIMITS)
    replica_config.write_text(LIMITS)
    primary = at_t0(make_grpc_server("--manual-clock", "--rls-config", str(primary_config)))
    replica = at_t0(make_grpc_server("--manual-clock", "--rls-config", str(replica_config),
                                     "--replicaof", "127.0.0.1", str(primary.port)))
    wait_until(lambda: caught_up(primary, replica), WAIT, what="the link")
    rewrite(primary_config, MORE)
    wait_until(lambda: primary.client().info("rls")["rls_limits"] == 3, WAIT,
               what="the primary's reload")
    assert [remaining(primary, b"sliding") for _ in range(2)] == [6, 5]
    # the standby reloads after the counts arrived: they wait for it
    rewrite(replica_config, MORE)
    wait_until(lambda: replica.client().info("rls")["rls_limits"] == 3, WAIT,
               what="the standby's reload")
    assert remaining(primary, b"sliding") == 4
    wait_until(lambda: caught_up(primary, replica), WAIT, what="the standby to catch up")
    replica.client().execute_command("REPLICAOF", "NO", "ONE")
    assert remaining(replica, b"sliding") == 3
