"""Starting as a new user does: the README's lines as written, servers
side by side with only different ports, a start that fails saying what
failed in one line, and the fronts' ports following the RESP port."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess

import pytest
from servers import PYTHON, fresh_network_available, readme_block, run_lines
from wire import free_port

from fastlimit.server import config as cfg

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def ports_note() -> str:
    return ("" if fresh_network_available() else
            " (no fresh network namespace here: another process may hold the ports)")


def test_the_readmes_replication_lines_work_as_written(tmp_path):
    lines = readme_block("### Replication")
    assert [line.split()[0] for line in lines] == ["fastlimit-server", "fastlimit-server",
                                                   "redis-cli"], lines
    seen = run_lines(tmp_path, lines)
    primary, standby = seen["servers"]
    assert primary["alive"] and standby["alive"], f"{seen}{ports_note()}"
    assert seen["links_up"], seen
    assert [c["rc"] for c in seen["commands"]] == [0] and seen["commands"][0]["out"] == "OK\n"
    assert primary["info"]["role"] == "master"
    assert standby["info"]["role"] == "master"      # promoted by the README's last line
    assert (primary["info"]["http_port"], standby["info"]["http_port"]) == (8380, 8381)
    assert (primary["info"]["grpc_port"], standby["info"]["grpc_port"]) == (8081, 8082)


def test_two_servers_with_only_different_ports_both_start_in_one_directory(tmp_path):
    seen = run_lines(tmp_path, ["fastlimit-server --port 6390", "fastlimit-server --port 6391"])
    assert all(s["alive"] for s in seen["servers"]), f"{seen}{ports_note()}"
    assert [(s["info"]["tcp_port"], s["info"]["http_port"], s["info"]["grpc_port"])
            for s in seen["servers"]] == [(6390, 8390, 8091), (6391, 8391, 8092)]
    assert {"fastlimit-6390.snap", "fastlimit-6391.snap", "fastlimit-rules-6390.db",
            "fastlimit-rules-6391.db"} <= set(seen["files"])
    for s in seen["servers"]:
        assert "ERROR" not in s["log"], s["log"]


def test_the_default_port_keeps_its_file_names():
    settings = cfg.from_args([])
    assert (settings.snapshot_file, settings.rules_db) == ("fastlimit.snap",
                                                           "fastlimit-rules.db")
    assert cfg.from_args(["--port", "6381", "--snapshot-file", "s.snap"]).snapshot_file == \
        "s.snap"


def test_front_ports_past_65535_stop_the_start_naming_the_setting():
    done = subprocess.run([PYTHON, "-m", "fastlimit.server", "--port", "64000"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("fastlimit-server: http-port: port 64000 + 2000 is above 65535; "
                           "give http-port (0: none)\n")
    settings = cfg.from_args(["--port", "64000", "--http-port", "0", "--grpc-port", "9000"])
    assert (cfg.front_port(settings, "http-port"), cfg.front_port(settings, "grpc-port")) == \
        (None, 9000)


def test_port_0_puts_the_fronts_not_given_on_free_ports(make_server):
    srv = make_server("--http-port", "", "--grpc-port", "")     # as if not given
    stats = srv.client().info("stats")
    assert stats["http_port"] and stats["grpc_port"]
    assert len({srv.port, stats["http_port"], stats["grpc_port"]}) == 3
    assert srv.client().config_get("*-port")["http-port"] == str(stats["http_port"])
    with socket.create_connection(("127.0.0.1", stats["http_port"]), timeout=10) as s:
        s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 200")


def test_config_rewrite_leaves_out_the_ports_and_files_that_follow_the_port(tmp_path):
    path = str(tmp_path / "fastlimit.toml")
    settings = cfg.from_args(["--port", "6381"])
    settings.http_port, settings.grpc_port = 8381, 8082      # as the fronts bound them
    cfg.rewrite(settings, path)
    assert open(path).read() == "port = 6381\n"
    settings.http_port = 9000
    cfg.rewrite(settings, path)
    assert open(path).read() == "port = 6381\nhttp-port = 9000\n"


def test_a_failed_start_says_what_failed_in_one_line_and_stops_its_tasks(make_server):
    primary = make_server()
    taken = socket.socket()
    taken.bind(("127.0.0.1", free_port()))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        # the standby's link to its primary is running when the HTTP front fails
        done = subprocess.run(
            [PYTHON, "-m", "fastlimit.server", "--port", "0", "--replicaof", "127.0.0.1",
             str(primary.port), "--http-port", str(port), "--snapshot-file", "",
             "--rules-db", ""], capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, log
    assert errors[0].endswith(f"ERROR cannot start: [Errno 98] error while attempting to bind "
                              f"on address ('127.0.0.1', {port}): address already in use"), log
    assert "Traceback" not in log and "Task was destroyed" not in log, log


@pytest.mark.parametrize("flag", ["--port", "--http-port", "--grpc-port"])
def test_a_port_given_and_taken_is_a_start_error(flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = {"--port": "0", "--http-port": "0", "--grpc-port": "0", flag: port}
        done = subprocess.run(
            [PYTHON, "-m", "fastlimit.server", *[a for kv in args.items() for a in kv],
             "--snapshot-file", "", "--rules-db", ""], capture_output=True, text=True,
            timeout=60)
    assert done.returncode == 1
    assert f"('127.0.0.1', {port}): address already in use" in done.stderr


@pytest.mark.parametrize("front", ["--http-port", "--grpc-port"])
def test_a_front_given_the_resp_port_is_a_start_error_not_a_ready_server(front):
    # The RESP port is bound first and listened on only once the
    # subsystems are up; a front given the same port binds it meanwhile
    # (SO_REUSEADDR, neither listening) and listens first.  uvloop then
    # swallowed the RESP listen's EADDRINUSE: the server said it was ready
    # on a port its HTTP front answered (CI: a redis client read "H").
    port = str(free_port())
    args = {"--port": port, "--http-port": "0", "--grpc-port": "0", front: port}
    done = subprocess.run(
        [PYTHON, "-m", "fastlimit.server", *[a for kv in args.items() for a in kv],
         "--snapshot-file", "", "--rules-db", ""], capture_output=True, text=True, timeout=60)
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    assert "ready to accept connections" not in log, log
    assert f"('127.0.0.1', {port}): address already in use" in log, log
