"""Shared fixtures: real fastlimit server processes and a real
redis-server (see tests/servers.py), started on free loopback ports and
talked to over sockets.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile

import pytest

# tests/wire.py (RESP encoding and reply framing by hand) is shared by the
# tests here and in tests/server/, which are not packages: put tests/ on
# sys.path so ``import wire`` works whatever pytest's import mode is.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

import servers  # noqa: E402  (needs the path above)
from servers import RedisServerProcess, ServerProcess, started_servers  # noqa: E402

# ---- coverage ------------------------------------------------------------------------------
# The debug pass of scripts/test.sh runs under `coverage run`.  Line tracing
# makes the Cython hot path some 30 times slower, so the tests that exist to
# push volume (hundreds of thousands of operations) or that bound CPU time or
# latency run untraced, in this process and in the servers they start: what
# they test is unchanged, and the paths they take smaller tests take too.
UNTRACED = (
    "tests/test_core.py::test_many_keys_across_table_growth_and_deletes",
    "tests/rules/test_server_rule_limits.py::"
    "test_ten_thousand_rules_load_change_and_miss_within_generous_cpu_bounds",
    "tests/server/test_config.py::test_config_get_with_many_patterns_is_cheap",
    # 60,000 loaded buckets evicted down to 1 MB, a tick's time budget at a time
    "tests/server/test_maxmemory.py::test_a_snapshot_larger_than_the_bound_loads_whole_then_is_evicted",
    "tests/server/test_partial_commands.py::test_partial_command_is_not_reparsed_from_the_start",
    "tests/server/test_protocol.py::test_big_pipeline_in_one_write",     # 20,000 commands
    "tests/test_embedded.py::test_many_threads",        # tracing lets threads into a check
    "tests/test_resp.py::test_huge_declared_lengths_are_just_incomplete",  # bounds time
    "tests/test_resp.py::test_random_and_mutated_input_never_crashes_and_is_consistent",
    "tests/test_resp.py::test_pipelines_in_random_reads_parse_as_in_one_read",
    "tests/server/test_sweep.py",                       # sweeps against a time budget
    "tests/rules/test_server_rules.py::test_rules_change_under_load",
    "tests/server/test_replication_limits.py::"
    "test_an_online_replica_that_stops_reading_is_dropped_at_repl_buffer_limit",
    "tests/server/test_fairness.py",
    # 3,000 pipelined /metrics of 1,000 rules while a prober's latency is bounded
    "tests/server/http/test_http_turns.py::"
    "test_thousands_of_pipelined_metrics_never_read_cost_the_others_nothing",
    "tests/server/test_redis_benchmark.py",
    "tests/server/test_soak.py",
    "tests/server/test_snapshot.py::test_bgsave_status_lastsave_and_a_second_bgsave_while_one_runs",
    "tests/server/test_snapshot.py::test_the_server_answers_while_a_bgsave_runs",
    "tests/server/test_snapshot.py::test_a_killed_bgsave_child_is_reported",
    "tests/server/test_snapshot.py::test_a_signal_to_the_bgsave_child_does_not_stop_the_server",
    "tests/server/test_snapshot.py::"
    "test_a_bgsave_running_at_shutdown_does_not_replace_the_final_snapshot",
    "tests/server/test_replication_limits.py::test_replicas_arriving_together_share_one_full_copy",
    "tests/server/test_replication_limits.py::test_full_copies_in_flight_are_capped",
    "tests/server/test_replication_limits.py::"
    "test_a_replica_that_never_reads_its_full_copy_is_dropped_at_repl_buffer_limit",
    "tests/server/test_replication_faults.py::"
    "test_paused_standby_is_dropped_at_the_buffer_limit_then_resyncs",
    "tests/server/test_pubsub.py::test_hostile_patterns_are_matched_in_bounded_time",
    "tests/server/test_pubsub.py::test_glob_without_recursion_takes_a_million_stars",
    # tens of thousands of commands or buckets across a cluster
    "tests/cluster/test_cluster_mode.py::test_redis_py_cluster_answers_as_one_standalone_server",
    "tests/cluster/test_cluster_mode.py::"
    "test_redis_benchmark_cluster_finishes_with_no_error_reply",
    "tests/cluster/test_client_cluster.py::test_sync_cluster_client_answers_as_one_standalone_server",
    "tests/cluster/test_client_cluster.py::"
    "test_async_cluster_client_answers_as_one_standalone_server_pipelined_per_node",
    "tests/cluster/test_reshard.py",
    "tests/cluster/test_slots_data.py",
    # configurations of thousands of descriptors or rules read while a client is timed
    "tests/rls/test_rls_server.py::test_the_server_answers_while_a_large_configuration_is_read",
    "tests/rls/test_rls_server.py::"
    "test_a_reload_puts_the_new_configuration_in_force_in_one_step",
    "tests/rules/test_server_rules.py::"
    "test_the_server_answers_while_a_large_rules_file_is_read_on_sighup",
    # CPU bounds on whole responses over many rules
    "tests/server/http/test_http_metrics.py::test_a_scrape_with_1000_rules_is_cheap",
    "tests/server/http/test_http_status_page.py::"
    "test_stats_of_two_thousand_rules_list_a_thousand_within_a_generous_cpu_bound",
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "untraced: runs without coverage's line tracing (see UNTRACED in conftest.py)")


def pytest_collection_modifyitems(items):
    # The tests that bound CPU time or latency (the untraced ones) and the
    # real-time failovers must not share the cores with other tests:
    # scripts/test.sh runs them alone, after the parallel part.
    for item in items:
        if item.nodeid.startswith(UNTRACED):
            item.add_marker("untraced")
        if item.nodeid.startswith(UNTRACED) or item.get_closest_marker("release_only"):
            item.add_marker("serial")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Notes a failed test on its item, for fixtures that print their
    processes' logs only then (servers.failed)."""
    report = yield
    if report.failed:
        item.stash[servers.FAILED] = True
    return report


def _running_coverage():
    """The Coverage measuring this process, if any."""
    try:
        import coverage
    except ImportError:
        return None
    return coverage.Coverage.current()


@pytest.fixture(autouse=True)
def _untraced(request):
    """Pauses coverage for an untraced test; autouse fixtures come first,
    so the servers the test starts see servers.TRACED cleared."""
    cov = _running_coverage() if request.node.get_closest_marker("untraced") else None
    if cov is None:
        yield
        return
    cov.stop()
    servers.TRACED = False
    try:
        yield
    finally:
        servers.TRACED = True
        cov.start()



@pytest.fixture(scope="session", autouse=True)
def _temp_dir_under_pytests(tmp_path_factory):
    """The temporary files of the whole run go under pytest's basetemp
    (which pytest prunes to its last runs), none into the system's temp
    dir: the tests' own (tempfile) and their children's (TMPDIR: the
    servers, redis-server, chromium, the bench scripts).  First of the
    session fixtures (autouse), so every process the tests start sees it."""
    tmp = str(tmp_path_factory.mktemp("tmp", numbered=False))
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = tmp
    yield tmp
    if saved[0] is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]


@pytest.fixture(scope="session")
def shared_servers():
    """The manual-clock servers shared by the tests that reset them (see
    r): one traced, and, started when first needed, one untraced for the
    untraced tests (see UNTRACED)."""
    started: dict[bool, ServerProcess] = {}

    def get() -> ServerProcess:
        if servers.TRACED not in started:
            started[servers.TRACED] = ServerProcess("--manual-clock").start()
        return started[servers.TRACED]

    yield get
    for s in started.values():
        assert s.stop() in (0, -signal.SIGTERM), s.log()


@pytest.fixture
def server(shared_servers):
    """One manual-clock server shared by the tests that reset it (see r)."""
    return shared_servers()


@pytest.fixture
def r(server):
    """A RESP2 redis-py client on a flushed server with the clock at 0."""
    client = server.client(protocol=2)
    client.flushall()
    client.execute_command("DEBUG", "CLOCK", "SET", 0)
    yield client
    client.close()
    assert server.alive(), server.log()


@pytest.fixture
def make_server():
    """Starts extra servers with their own settings; stops them after."""
    with started_servers(ServerProcess) as make:
        yield make


@pytest.fixture(scope="session")
def redis_server():
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (make test installs it)")
    s = RedisServerProcess()
    yield s
    s.stop()
