"""The TOML config file (--config): its settings take effect, the command
line wins over it, and a file the server cannot use stops it at start
with exit status 2 and one line naming the problem, never a traceback.
"""

from __future__ import annotations

import subprocess

import pytest

from servers import PYTHON, ServerProcess

CONFIG = """\
# a comment, as operators write them
[server]
hz = 50
maxclients = 77
manual-clock = true
denial_log_seconds = 2.5
client-output-buffer-limit = ["normal", "1mb", "512kb", 10]
bind = ["127.0.0.1"]

[rules]   # sections other than [server] belong to other features
anything = "is ignored"
"""


def start_with(tmp_path, text: str, *args: str) -> ServerProcess:
    path = tmp_path / "fastlimit.toml"
    path.write_text(text)
    return ServerProcess("--config", str(path), *args).start()


def test_config_file_settings_take_effect_and_the_command_line_wins(tmp_path):
    s = start_with(tmp_path, CONFIG, "--maxclients", "88")
    try:
        c = s.client(decode_responses=True)
        got = c.config_get("*")
        assert got["hz"] == "50"
        assert got["maxclients"] == "88"                       # the command line's
        assert got["denial-log-seconds"] == "2.5"
        assert got["client-output-buffer-limit"] == (
            "normal 1048576 524288 10 slave 268435456 67108864 60 pubsub 33554432 8388608 60")
        assert c.info("server")["config_file"] == str(tmp_path / "fastlimit.toml")
        c.execute_command("DEBUG", "CLOCK", "SET", 1234)    # manual-clock from the file
        assert c.info("server")["clock_ms"] == 1234
    finally:
        assert s.stop() == 0, s.log()


def test_a_config_file_without_a_server_section_is_read_whole(tmp_path):
    s = start_with(tmp_path, "hz = 25\nmaxclients = 9\n")
    try:
        got = s.client(decode_responses=True).config_get("*")
        assert (got["hz"], got["maxclients"]) == ("25", "9")
    finally:
        assert s.stop() == 0, s.log()


def run_with_config(tmp_path, text: str | bytes | None,
                    *args: str) -> subprocess.CompletedProcess:
    """The server started with a config file (None: a file that is not
    there); it is expected to refuse before serving."""
    path = tmp_path / "fastlimit.toml"
    if text is not None:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return subprocess.run(
        [PYTHON, "-m", "fastlimit.server", "--port", "0", "--http-port", "0", "--grpc-port", "0",
         "--rules-db", "", "--snapshot-file", "", "--config", str(path), *args],
        capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("text,error", [
    (None, "cannot read config file {path}: No such file or directory"),
    ("hz = = 5\n", "config file {path} is not valid TOML: "),
    (b"hz = \"\xff\"\n", "config file {path} is not valid TOML: "),
    ("server = 1\n", "config file {path}: [server] must be a table of settings"),
    ("[server]\nnosuch = 1\n", "nosuch: unknown setting 'nosuch'"),
    ("hz = 0\n", "hz: argument must be between 1 and 500 inclusive"),
    ("hz = true\n", "hz: argument couldn't be parsed into an integer"),
    ("maxclients = \"12x\"\n", "maxclients: argument couldn't be parsed into an integer"),
    ("hz = 5.0\n", "hz: argument couldn't be parsed into an integer"),
    ("shards = 3\n", "shards: argument must be a power of two from 1 to 65536"),
    ("manual-clock = \"maybe\"\n", "manual-clock: argument must be 'yes' or 'no'"),
    ("proto-max-bulk-len = \"12 mb\"\n", "proto-max-bulk-len: argument must be a memory value"),
    ("repl-flush-ms = 0.01\n", "repl-flush-ms: argument must be at least 0.1 and at most 1000"),
    ("sweep-budget-ms = 0\n", "sweep-budget-ms: argument must be above 0 and at most 100"),
    ("client-output-buffer-limit = \"foo 1mb 1mb 0\"\n",
     "Invalid client class specified in buffer limit configuration."),
    ("client-output-buffer-limit = [1, 2]\n",
     "Wrong number of arguments in buffer limit configuration."),
    ("replicaof = \"127.0.0.1\"\n", "replicaof: replicaof takes <host> <port>"),
    ("replicaof = [\"127.0.0.1\", 0]\n", "replicaof: argument must be between 1 and 65535"),
    ("loglevel = \"loud\"\n", "loglevel: argument(s) must be one of the following: "),
    ("bind = []\n", "bind needs at least one address"),
    ("repl-user = \"\"\n", "repl-user must not be empty"),
    ("masteruser = \"sync\"\n", "masteruser needs masterauth (its password)"),
    ("requirepass = [255, 256]\n",
     "requirepass: argument must be a string or an array of byte values (0 to 255)"),
    # a TOML value of the wrong type for a setting of several words
    ("bind = 5\n", "bind: argument must be a string or an array of strings"),
    ("bind = [true]\n", "bind: argument must be a string or an array of strings"),
    ("client-output-buffer-limit = 5\n",
     "client-output-buffer-limit: argument must be a string or an array of strings"),
    ("replicaof = true\n", "replicaof: argument must be a string or an array of strings"),
    ("rls-xds-backoff = 1.5\n", "rls-xds-backoff: argument must be a string or an array of strings"),
    ("tls-protocols = [true]\n", "tls-protocols: argument must be a string or an array of strings"),
])
def test_a_config_file_the_server_cannot_use_stops_it_with_one_clear_line(tmp_path, text, error):
    done = run_with_config(tmp_path, text)
    assert done.returncode == 2, done
    assert done.stderr.startswith("fastlimit-server: "), done.stderr
    assert error.format(path=tmp_path / "fastlimit.toml") in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert "ready to accept" not in done.stdout + done.stderr


def test_the_command_line_can_mend_what_the_config_file_lacks(tmp_path):
    # the cross-setting checks run on the merged settings, not the file's
    s = start_with(tmp_path, "masteruser = \"sync\"\n", "--masterauth", "pw")
    try:
        assert s.client(decode_responses=True).config_get("masteruser") == {"masteruser": "sync"}
    finally:
        assert s.stop() == 0, s.log()
