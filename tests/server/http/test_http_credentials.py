"""The HTTP front asks the users as they are at each request: a password
rotated by ACL SETUSER or CONFIG SET requirepass, a user switched off,
deleted or replaced by ACL LOAD counts on the next request, on a
connection already open too; and a password is its bytes, whatever they
are, as on RESP."""

from __future__ import annotations

import base64
import http.client

from wire import Wire

PW = bytes([0xff, 0xfe, 0x80, 0x81, 0x90, 0xa0, 0xc0, 0xf5] * 2)
REPLACED = "\ufffd".encode() * 16


def basic(user: bytes, password: bytes) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(user + b":" + password).decode()}


def bearer(password: bytes) -> dict[str, bytes]:
    return {"Authorization": b"Bearer " + password}


def status(conn: http.client.HTTPConnection, headers) -> int:
    """GET /v1/info (which needs a user) on an open connection."""
    conn.request("GET", "/v1/info", headers=headers)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def test_basic_credentials_follow_the_user_at_once(make_http_server):
    hs = make_http_server("--manual-clock", "--requirepass", "adminpw")
    admin = hs.client(password="adminpw")
    admin.execute_command("ACL", "SETUSER", "u", "on", ">one", "~*", "+@all")
    conn = hs.http()
    try:
        assert status(conn, basic(b"u", b"one")) == 200
        admin.execute_command("ACL", "SETUSER", "u", "resetpass", ">two")
        assert status(conn, basic(b"u", b"one")) == 401
        assert status(conn, basic(b"u", b"two")) == 200
        admin.execute_command("ACL", "SETUSER", "u", "off")
        assert status(conn, basic(b"u", b"two")) == 401
        admin.execute_command("ACL", "SETUSER", "u", "on")
        assert status(conn, basic(b"u", b"two")) == 200
        admin.execute_command("ACL", "DELUSER", "u")
        assert status(conn, basic(b"u", b"two")) == 401
    finally:
        conn.close()


def test_bearer_follows_requirepass_and_the_default_user_switched_off(make_http_server):
    hs = make_http_server("--manual-clock", "--requirepass", "one")
    conn = hs.http()
    try:
        assert status(conn, bearer(b"one")) == 200
        hs.client(password="one").config_set("requirepass", "two")
        assert status(conn, bearer(b"one")) == 401
        assert status(conn, bearer(b"two")) == 200
        hs.client(password="two").execute_command("ACL", "SETUSER", "default", "off")
        assert status(conn, bearer(b"two")) == 401
        assert status(conn, {}) == 401
    finally:
        conn.close()


def test_acl_load_replaces_the_users_the_http_front_asks(make_http_server, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on >adminpw ~* &* +@all\nuser u on >one ~* +@all\n")
    hs = make_http_server("--manual-clock", "--aclfile", str(aclfile))
    conn = hs.http()
    try:
        assert status(conn, basic(b"u", b"one")) == 200
        aclfile.write_text("user default on >adminpw ~* &* +@all\nuser u on >two ~* +@all\n")
        assert hs.client(password="adminpw").execute_command("ACL", "LOAD") in (b"OK", True)
        assert status(conn, basic(b"u", b"one")) == 401
        assert status(conn, basic(b"u", b"two")) == 200
    finally:
        conn.close()


def test_a_binary_password_is_its_bytes_on_http(make_http_server):
    hs = make_http_server("--manual-clock")
    with Wire.to(hs.port) as w:
        assert w.call("CONFIG", "SET", "requirepass", PW) == b"+OK\r\n"
    conn = hs.http()
    try:
        assert status(conn, basic(b"", PW)) == 200
        assert status(conn, basic(b"", REPLACED)) == 401
        assert status(conn, bearer(PW)) == 200
        assert status(conn, bearer(REPLACED)) == 401
    finally:
        conn.close()
