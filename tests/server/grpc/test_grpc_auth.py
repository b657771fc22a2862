"""gRPC calls authenticate as the users say now, not as a copy of a
setting: a password rotated, a user switched off, an aclfile loaded take
effect on the next call of a connection already open (one grpcio channel
throughout each test is one HTTP/2 connection)."""

from __future__ import annotations

import grpc
from rls_messages import OK, descriptor, error_of, request

KEY = descriptor([(b"api_key", b"alice")])
MESSAGE = request(b"rig", KEY)


def bearer(password: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {password}")]


def call_status(srv, password: str) -> grpc.StatusCode:
    code, _ = error_of(lambda: srv.should_rate_limit(MESSAGE, metadata=bearer(password)))
    return code


def test_a_rotated_default_password_refuses_the_old_one_on_an_open_connection(
        make_grpc_server):
    srv = make_grpc_server("--requirepass", "oldpw")
    assert srv.should_rate_limit(MESSAGE, metadata=bearer("oldpw"))["overall"] == OK
    srv.client(password="oldpw").execute_command("ACL", "SETUSER", "default", "resetpass",
                                                 ">newpw")
    assert call_status(srv, "oldpw") == grpc.StatusCode.UNAUTHENTICATED
    assert srv.should_rate_limit(MESSAGE, metadata=bearer("newpw"))["overall"] == OK
    info = srv.client(password="newpw").info("everything")
    assert info["grpc_total_connections_received"] == 1


def test_the_default_user_switched_off_refuses_grpc_calls_on_an_open_connection(
        make_grpc_server):
    srv = make_grpc_server("--requirepass", "pw")
    admin = srv.client(password="pw")
    admin.execute_command("ACL", "SETUSER", "admin", "on", ">adminpw", "+@all", "~*")
    assert srv.should_rate_limit(MESSAGE, metadata=bearer("pw"))["overall"] == OK
    admin.execute_command("ACL", "SETUSER", "default", "off")
    assert call_status(srv, "pw") == grpc.StatusCode.UNAUTHENTICATED
    # and with no password at all, as a nopass default user switched off
    admin.execute_command("ACL", "SETUSER", "default", "nopass")
    code, _ = error_of(lambda: srv.should_rate_limit(MESSAGE))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    admin.execute_command("ACL", "SETUSER", "default", "on")
    assert srv.should_rate_limit(MESSAGE)["overall"] == OK


def test_with_an_aclfile_the_configs_requirepass_does_not_open_grpc(make_grpc_server, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on >aclpw ~* &* +@all\n")
    srv = make_grpc_server("--aclfile", str(aclfile), "--requirepass", "oldpw")
    assert call_status(srv, "oldpw") == grpc.StatusCode.UNAUTHENTICATED
    assert srv.should_rate_limit(MESSAGE, metadata=bearer("aclpw"))["overall"] == OK
    # ACL LOAD of a changed file: the next call already has its users
    aclfile.write_text("user default on >loadedpw ~* &* +@all\n")
    srv.client(password="aclpw").execute_command("ACL", "LOAD")
    assert call_status(srv, "aclpw") == grpc.StatusCode.UNAUTHENTICATED
    assert srv.should_rate_limit(MESSAGE, metadata=bearer("loadedpw"))["overall"] == OK


def test_config_set_requirepass_with_an_aclfile_is_the_default_users_password_on_grpc(
        make_grpc_server, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on >aclpw ~* &* +@all\n")
    srv = make_grpc_server("--aclfile", str(aclfile))
    srv.client(password="aclpw").config_set("requirepass", "setpw")
    assert call_status(srv, "aclpw") == grpc.StatusCode.UNAUTHENTICATED
    assert srv.should_rate_limit(MESSAGE, metadata=bearer("setpw"))["overall"] == OK
