"""The HTTP front authenticates as the ACL users (Basic user:password;
Bearer <password> is the default user's) and refuses what their rules
refuse, as RESP does: 403 with the NOPERM text, in ACL LOG."""

from __future__ import annotations

import base64

RULE = {"match": {"resource": "GET /x"}, "capacity": 2, "refill_per_second": 1}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _users(hs) -> None:
    admin = hs.client(protocol=2)
    admin.execute_command("ACL", "SETUSER", "tenant", "on", ">pa", "~tenant-a:*", "+@ratelimit")
    admin.execute_command("ACL", "SETUSER", "ops", "on", ">po", "~*", "+@all")
    admin.execute_command("ACL", "SETUSER", "nochecks", "on", ">pn", "~*", "+@all",
                          "-@ratelimit")


def test_a_tenant_checks_its_own_keys_only(hs):
    _users(hs)
    tenant = basic("tenant", "pa")
    bucket = {"key": "tenant-a:1", "capacity": 5, "refill_per_sec": 1}
    assert hs.post("/v1/check/bucket", bucket, tenant)[0] == 200
    status, _, doc = hs.post("/v1/check/bucket", {**bucket, "key": "tenant-b:1"}, tenant)
    assert status == 403 and doc["code"] == "NOPERM"
    assert doc["detail"] == ("NOPERM this user has no permissions to access one of the keys "
                             "used as arguments")
    assert hs.post("/v1/check", {"client_key": "tenant-b:1", "resource": "r"}, tenant)[0] == 403
    assert hs.post("/v1/check", {"client_key": "tenant-a:1", "resource": "r"}, tenant)[0] == 200
    status, _, doc = hs.post("/v1/check/bucket", bucket, basic("nochecks", "pn"))
    assert status == 403
    assert doc["detail"] == "NOPERM this user has no permissions to run the 'cl.check' command"
    log = hs.client(protocol=2).execute_command("ACL", "LOG")
    assert [e[3] for e in log[:2]] == [b"command", b"key"]        # reason
    assert log[0][9] == b"nochecks" and log[1][7] == b"tenant-b:1"
    # client-info is key=value pairs, as redis-py's ACL LOG parser reads a client's line
    info = hs.client(protocol=2).acl_log()[0]["client-info"]
    assert info["front"] == "http" and info["addr"].startswith("127.0.0.1:")


def test_the_rules_api_and_metrics_follow_the_users_commands(hs):
    _users(hs)
    status, _, doc = hs.post("/v1/check/bucket", {"key": "x", "capacity": 1,
                                                 "refill_per_sec": 1}, basic("ops", "po"))
    assert status == 200
    assert hs.request("PUT", "/v1/rules/r1", RULE, basic("tenant", "pa"))[0] == 403
    assert hs.request("GET", "/metrics", None, basic("tenant", "pa"))[0] == 403
    assert hs.request("PUT", "/v1/rules/r1", RULE, basic("ops", "po"))[0] == 201
    assert hs.request("GET", "/livez", None, basic("tenant", "pa"))[0] == 200


def test_with_a_password_a_wrong_user_or_password_is_401(make_http_server):
    hs = make_http_server("--manual-clock", "--requirepass", "s3cret")
    admin = hs.client(protocol=2, password="s3cret")
    admin.execute_command("ACL", "SETUSER", "tenant", "on", ">pa", "~tenant-a:*", "+@ratelimit")
    bucket = {"key": "tenant-a:1", "capacity": 5, "refill_per_sec": 1}
    assert hs.post("/v1/check/bucket", bucket, basic("tenant", "pa"))[0] == 200
    assert hs.post("/v1/check/bucket", bucket, basic("tenant", "s3cret"))[0] == 401
    assert hs.post("/v1/check/bucket", bucket, {"Authorization": "Bearer s3cret"})[0] == 200
    assert hs.post("/v1/check/bucket", bucket)[0] == 401
    # An open connection sees the user's new rules, as RESP does.
    conn = hs.http()
    headers = {**basic("tenant", "pa"), "Content-Type": "application/json"}
    conn.request("POST", "/v1/check/bucket", body=b'{"key":"tenant-a:2","capacity":5,'
                 b'"refill_per_sec":1}', headers=headers)
    assert conn.getresponse().read() and True
    admin.execute_command("ACL", "SETUSER", "tenant", "resetkeys", "~tenant-c:*")
    conn.request("POST", "/v1/check/bucket", body=b'{"key":"tenant-a:2","capacity":5,'
                 b'"refill_per_sec":1}', headers=headers)
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 403
    conn.close()
