"""Secrets are bytes: whatever bytes CONFIG SET, the command line or the
config file gives requirepass, masterauth or repl-password is the secret,
byte for byte, as Redis takes binary passwords; CONFIG GET shows them as
set and CONFIG REWRITE writes them so that a restart reads them back."""

from __future__ import annotations

from contextlib import contextmanager

from servers import ServerProcess
from wire import Wire, wait_until

WAIT = 20.0
# 16 bytes that are no UTF-8 (as a byte generator's password may be)
PW = bytes([0xff, 0xfe, 0x80, 0x81, 0x90, 0xa0, 0xc0, 0xf5] * 2)
# what they were taken as when decoded with "replace"
REPLACED = "\ufffd".encode() * 16
# the command line's form of PW: argv carries undecodable bytes surrogateescaped
PW_ARG = PW.decode("utf-8", "surrogateescape")
WRONGPASS = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"


def binary_password_session(port: int) -> list[bytes]:
    """CONFIG SET requirepass PW, then what AUTH makes of PW and of its
    replaced form; the password is unset again after."""
    with Wire.to(port) as admin:      # authenticated before there is a password
        out = [admin.call("CONFIG", "SET", "requirepass", PW),
               admin.call("CONFIG", "GET", "requirepass")]
        try:
            for args in (("AUTH", PW), ("AUTH", REPLACED), ("AUTH", "default", PW)):
                with Wire.to(port) as w:
                    out.append(w.call(*args))
            out += [admin.call("CONFIG", "SET", "masterauth", PW),
                    admin.call("CONFIG", "GET", "masterauth")]
        finally:
            out += [admin.call("CONFIG", "SET", "requirepass", ""),
                    admin.call("CONFIG", "SET", "masterauth", "")]
    return out


def test_a_binary_requirepass_is_its_bytes_as_in_redis(server, redis_server):
    ours, redis = binary_password_session(server.port), binary_password_session(
        redis_server.port)
    assert ours == redis
    assert ours[1] == b"*2\r\n$11\r\nrequirepass\r\n$16\r\n" + PW + b"\r\n"
    assert ours[2:5] == [b"+OK\r\n", WRONGPASS, b"+OK\r\n"]
    assert ours[6] == b"*2\r\n$10\r\nmasterauth\r\n$16\r\n" + PW + b"\r\n"


def test_a_binary_requirepass_on_the_command_line_starts_and_is_its_bytes(make_server):
    s = make_server("--manual-clock", "--requirepass", "\udcff\udcfe")
    with Wire.to(s.port) as w:
        assert w.call("AUTH", "\ufffd\ufffd") == WRONGPASS
        assert w.call("AUTH", b"\xff\xfe") == b"+OK\r\n"
        assert w.call("CONFIG", "GET", "requirepass") == \
            b"*2\r\n$11\r\nrequirepass\r\n$2\r\n\xff\xfe\r\n"


def wait_link_up(client) -> None:
    wait_until(lambda: client.info("replication")["master_link_status"] == "up", WAIT,
               "link up")


def test_replicas_authenticate_with_binary_masterauth(make_server):
    by_requirepass = make_server("--manual-clock", "--requirepass", PW_ARG)
    wait_link_up(make_server("--manual-clock", "--replicaof", "127.0.0.1",
                             str(by_requirepass.port), "--masterauth", PW_ARG).client())
    by_repl_password = make_server("--manual-clock", "--repl-password", PW_ARG)
    wait_link_up(make_server("--manual-clock", "--replicaof", "127.0.0.1",
                             str(by_repl_password.port), "--masteruser", "replica",
                             "--masterauth", PW_ARG).client())
    with Wire.to(by_repl_password.port) as w:
        assert w.call("AUTH", "replica", REPLACED) == WRONGPASS


FILE = "[server]\nmaxclients = 100\n"


@contextmanager
def running(path):
    """A raw connection to a server started with the config file at path,
    stopped cleanly after."""
    s = ServerProcess("--manual-clock", "--config", str(path)).start()
    try:
        with Wire.to(s.port) as w:
            yield w
    finally:
        assert s.stop() == 0, s.log()


def test_config_rewrite_writes_a_binary_secret_that_a_restart_reads_back(tmp_path):
    path = tmp_path / "fastlimit.toml"
    path.write_text(FILE)
    with running(path) as w:
        assert w.call("CONFIG", "SET", "requirepass", PW, "masterauth",
                      "pässwörd".encode()) == b"+OK\r\n"
        assert w.call("CONFIG", "REWRITE") == b"+OK\r\n"
    text = path.read_text()
    assert f"requirepass = {list(PW)}\n" in text and 'masterauth = "pässwörd"\n' in text
    with running(path) as w:
        assert w.call("AUTH", PW) == b"+OK\r\n"
        assert w.call("CONFIG", "GET", "masterauth") == \
            b"*2\r\n$10\r\nmasterauth\r\n$10\r\n" + "pässwörd".encode() + b"\r\n"
        assert w.call("CONFIG", "REWRITE") == b"+OK\r\n"
    assert path.read_text() == text        # what the file says is what runs


def test_config_rewrite_refuses_text_a_toml_file_cannot_hold(tmp_path):
    path = tmp_path / "fastlimit.toml"
    path.write_text(FILE)
    with running(path) as w:
        assert w.call("CONFIG", "SET", "masteruser", b"u\xff", "masterauth", "pw") == b"+OK\r\n"
        assert w.call("CONFIG", "GET", "masteruser") == \
            b"*2\r\n$10\r\nmasteruser\r\n$2\r\nu\xff\r\n"
        assert w.call("CONFIG", "REWRITE") == (
            b"-ERR Rewriting config file: masteruser is not UTF-8 text, which a TOML file "
            b"cannot hold\r\n")
    assert path.read_text() == FILE
