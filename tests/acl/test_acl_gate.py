"""One authorization gate: every command passes the same decision.  Only
Redis's connection commands (AUTH, HELLO, QUIT, RESET) run before
authentication, and "needs no authentication" never means "needs no
permission": an authenticated connection's every other command, the
replication ones (CL.SYNC, REPLCONF) included, is judged by its user's
ACL, refused with Redis's NOPERM and written to ACL LOG, on a replica
link too.  Replicas authenticate as an ACL user (masteruser, or the user
repl-user/repl-password make) whose rules say what a link may do."""

from __future__ import annotations

import hashlib
import time

import pytest
from wire import Wire, command, wait_until

WAIT = 20.0
# Redis 7.0's CMD_NO_AUTH commands
REDIS_BEFORE_AUTH = {"auth", "hello", "quit", "reset"}
# and fastlimit's node login, which Redis has no counterpart of
BEFORE_AUTH = REDIS_BEFORE_AUTH | {"cl.peerauth"}


def every_command(client) -> list[tuple[str, int]]:
    """(name, arity) of every command and subcommand COMMAND lists (a
    container by its subcommands)."""
    out = []
    for name, doc in client.execute_command("COMMAND").items():
        subs = [(s[0].decode(), s[1]) for s in doc["subcommands"]]
        out += subs or [(name, doc["arity"])]
    return sorted(out)


def invocation(name: str, arity: int) -> list[str]:
    """The command with as many arguments as its arity asks (at least)."""
    words = name.split("|")
    return words + ["x"] * max(0, abs(arity) - len(words))


def nothing_arrives(w: Wire, seconds: float = 0.5) -> bool:
    w.sock.settimeout(seconds)
    try:
        return w.sock.recv(1 << 16) == b"" and False
    except TimeoutError:
        return True
    finally:
        w.sock.settimeout(10)


def test_only_the_commands_redis_runs_before_auth_need_no_authentication(server, redis_server):
    def no_auth(client):      # (fastlimit spells COMMAND's flags with "-", Redis with "_")
        return {n for n, doc in client.execute_command("COMMAND").items()
                if "no_auth" in [f.replace("-", "_") for f in doc["flags"]]}
    ours = no_auth(server.client())
    assert ours == BEFORE_AUTH
    assert REDIS_BEFORE_AUTH == no_auth(redis_server.client()) & set(
        server.client().execute_command("COMMAND"))


def test_an_unauthenticated_connection_runs_nothing_but_auth_hello_quit_reset(make_server):
    s = make_server("--manual-clock", "--requirepass", "pw")
    names = every_command(s.client(password="pw"))
    assert ("cl.sync", 1) in names and ("replconf", -1) in names
    with Wire.to(s.port) as w:
        for name, arity in names:
            if name.split("|")[0] not in BEFORE_AUTH:
                assert w.call(*invocation(name, arity)) == \
                    b"-NOAUTH Authentication required.\r\n", name
    assert s.client(password="pw").info("replication")["connected_slaves"] == 0


def test_a_user_with_no_commands_is_refused_every_command_but_auth_hello_quit_reset(
        make_server):
    s = make_server("--manual-clock")
    admin = s.client()
    admin.execute_command("ACL", "SETUSER", "none", "on", ">p", "~*", "&*", "-@all")
    names = [(n, a) for n, a in every_command(admin) if n.split("|")[0] not in BEFORE_AUTH]
    with Wire.to(s.port) as w:
        assert w.call("AUTH", "none", "p") == b"+OK\r\n"
        for name, arity in names:
            assert w.call(*invocation(name, arity)) == (
                f"-NOPERM this user has no permissions to run the '{name}' command\r\n"
            ).encode(), name
        assert w.call("HELLO").startswith(b"*")        # these four need no permission
        assert w.call("RESET") == b"+RESET\r\n"
    logged = {e["object"] for e in admin.acl_log(count=1000) if e["username"] == "none"}
    assert logged == {name for name, _ in names}
    assert admin.info("replication")["connected_slaves"] == 0


@pytest.fixture
def restricted(server, redis_server):
    """A user that may run anything but @admin, on both servers (which
    are shared: removed after)."""
    admins = [Wire.to(server.port), Wire.to(redis_server.port)]
    for w in admins:
        w.call("ACL", "LOG", "RESET")
        assert w.call("ACL", "SETUSER", "noadmin", "reset", "on", ">pw", "~*", "&*", "+@all",
                      "-@admin") == b"+OK\r\n"
    yield {"fastlimit": server.port, "redis": redis_server.port}, admins
    for w in admins:
        w.call("ACL", "DELUSER", "noadmin")
        w.close()


def test_a_restricted_user_cannot_cl_sync_or_replconf_as_redis_refuses_sync(restricted):
    ports, (fl_admin, rd_admin) = restricted
    sync = {"fastlimit": "CL.SYNC", "redis": "SYNC"}
    replies = {}
    for server, port in ports.items():
        with Wire.to(port) as w:
            assert w.call("AUTH", "noadmin", "pw") == b"+OK\r\n"
            replies[server] = [w.call(sync[server]),
                               w.call("REPLCONF", "listening-port", "4321"),
                               w.call("REPLCONF", "ACK", "0"),
                               w.call("PING")]
    assert replies["fastlimit"] == [r.replace(b"'sync'", b"'cl.sync'") for r in replies["redis"]]
    assert replies["fastlimit"][:2] == [
        b"-NOPERM this user has no permissions to run the 'cl.sync' command\r\n",
        b"-NOPERM this user has no permissions to run the 'replconf' command\r\n"]
    # ACL LOG: the same entries (newest first), and ACL DRYRUN the same sentences
    fl_log = fl_admin.call("ACL", "LOG")
    rd_log = rd_admin.call("ACL", "LOG")
    for reply in (fl_log, rd_log):
        assert reply.startswith(b"*2\r\n*14\r\n$5\r\ncount\r\n:2\r\n$6\r\nreason\r\n$7\r\n"
                                b"command\r\n$7\r\ncontext\r\n$8\r\ntoplevel\r\n$6\r\nobject\r\n"
                                b"$8\r\nreplconf\r\n$8\r\nusername\r\n$7\r\nnoadmin\r\n")
    assert b"$6\r\nobject\r\n$7\r\ncl.sync\r\n$8\r\nusername\r\n$7\r\nnoadmin\r\n" in fl_log
    assert b"$6\r\nobject\r\n$4\r\nsync\r\n$8\r\nusername\r\n$7\r\nnoadmin\r\n" in rd_log
    assert fl_admin.call("ACL", "DRYRUN", "noadmin", "CL.SYNC") == \
        rd_admin.call("ACL", "DRYRUN", "noadmin", "SYNC").replace(b"$54\r\n", b"$57\r\n") \
        .replace(b"'sync'", b"'cl.sync'")
    assert fl_admin.call("ACL", "DRYRUN", "noadmin", "REPLCONF", "ACK", "1") == \
        rd_admin.call("ACL", "DRYRUN", "noadmin", "REPLCONF", "ACK", "1")
    assert b"connected_slaves:0" in fl_admin.call("INFO", "replication")


def test_a_tenant_gets_no_copy_of_other_tenants_keys_and_rules(make_server):
    """Finding 1 as reported: a user that may check its own keys asks for a
    full copy."""
    s = make_server("--manual-clock", "--requirepass", "adminpw")
    admin = s.client(password="adminpw")
    admin.execute_command("ACL", "SETUSER", "tenant-a", "on", ">tpw", "~tenant-a:*",
                          "+@ratelimit")
    admin.execute_command("CL.CHECK", "tenant-b:secret-user-42", 10, 1)
    admin.execute_command("CL.RULE", "SET", "private-rule",
                          '{"match":{"resource":"POST /admin"},"capacity":5,'
                          '"refill_per_second":1}')
    with Wire.to(s.port) as w:
        w.send(command("AUTH", "tenant-a", "tpw") + command("CL.SYNC") +
               command("REPLCONF", "listening-port", "1"))
        assert [w.read_reply() for _ in range(3)] == [
            b"+OK\r\n",
            b"-NOPERM this user has no permissions to run the 'cl.sync' command\r\n",
            b"-NOPERM this user has no permissions to run the 'replconf' command\r\n"]
        assert nothing_arrives(w)
        assert w.call("CL.CHECK", "tenant-a:1", 10, 1).startswith(b"*5\r\n:1\r\n")
    info = admin.info("replication")
    assert info["connected_slaves"] == 0 and info["repl_full_copies_written"] == 0
    assert [e["object"] for e in admin.acl_log()][:2] == ["replconf", "cl.sync"]


def sync_as(port: int, user: str, password: str) -> Wire:
    """A hand-made replica link: AUTH, CL.SYNC, REPLCONF, the stream's
    first frames read."""
    w = Wire.to(port)
    assert w.call("AUTH", user, password) == b"+OK\r\n"
    w.send(command("CL.SYNC") + command("REPLCONF", "listening-port", "4321"))
    assert w.read_reply().startswith(b"+FULLSYNC ")
    return w


def test_a_replica_link_whose_user_may_no_longer_replconf_is_closed_and_logged(make_server):
    s = make_server("--manual-clock")
    admin = s.client()
    admin.execute_command("ACL", "SETUSER", "link", "on", ">lpw", "+cl.sync", "+replconf")
    with sync_as(s.port, "link", "lpw") as w:
        wait_until(lambda: admin.info("replication")["connected_slaves"] == 1, WAIT, "attached")
        w.send(command("REPLCONF", "ACK", "0"))
        time.sleep(0.2)
        assert admin.info("replication")["connected_slaves"] == 1     # still allowed
        admin.execute_command("ACL", "SETUSER", "link", "-replconf")
        w.send(command("REPLCONF", "ACK", "0"))
        wait_until(lambda: admin.info("replication")["connected_slaves"] == 0, WAIT,
                   "the link closed")
    entry = admin.acl_log()[0]
    assert (entry["object"], entry["username"], entry["reason"]) == ("replconf", "link", "command")


def wait_link_up(client) -> None:
    wait_until(lambda: client.info("replication")["master_link_status"] == "up", WAIT,
               "link up")


def test_a_replica_authenticates_as_its_masteruser_acl_user(make_server):
    primary = make_server("--manual-clock", "--requirepass", "adminpw")
    p = primary.client(password="adminpw")
    p.execute_command("ACL", "SETUSER", "sync", "on", ">spw", "+cl.sync", "+replconf")
    p.execute_command("CL.CHECK", "k", 10, 1, "COST", 4)
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(primary.port),
                          "--masteruser", "sync", "--masterauth", "spw")
    wait_link_up(replica.client())
    wait_until(lambda: replica.client().dbsize() == 1, WAIT, "the copy")
    assert [c["user"] for c in p.client_list() if "S" in c["flags"]] == ["sync"]


def test_repl_password_makes_an_acl_user_that_may_only_replicate(make_server):
    s = make_server("--manual-clock", "--repl-password", "replpw")
    admin = s.client(decode_responses=True)
    digest = hashlib.sha256(b"replpw").hexdigest()
    assert admin.acl_list() == ["user default on nopass ~* &* +@all",
                                f"user replica on sanitize-payload #{digest} resetchannels "
                                f"-@all +cl.sync +replconf +cl.regionsync +cl.regiondemand "
                                f"+cl.regionshares +cl.regioncheck +ping"]
    with Wire.to(s.port) as w:        # the default user (no password) may not sync
        assert w.call("CL.SYNC") == (b"-NOPERM this primary requires replication credentials: "
                                     b"AUTH <repl-user> <repl-password>\r\n")
    with Wire.to(s.port) as w:
        assert w.call("AUTH", "replica", "replpw") == b"+OK\r\n"
        assert w.call("DBSIZE") == \
            b"-NOPERM this user has no permissions to run the 'dbsize' command\r\n"
    with sync_as(s.port, "replica", "replpw"):
        wait_until(lambda: admin.info("replication")["connected_slaves"] == 1, WAIT, "attached")
        admin.config_set("repl-password", "other")            # its link goes on
        time.sleep(0.2)
        assert admin.info("replication")["connected_slaves"] == 1
    with Wire.to(s.port) as w:
        assert w.call("AUTH", "replica", "replpw").startswith(b"-WRONGPASS")
        assert w.call("AUTH", "replica", "other") == b"+OK\r\n"
    admin.config_set("repl-user", "rep2")
    assert admin.acl_getuser("replica") is None and admin.acl_getuser("rep2") is not None
    with pytest.raises(Exception, match="an ACL user name other than default"):
        admin.config_set("repl-user", "default")
    admin.config_set("repl-password", "")
    assert admin.acl_users() == ["default"]


def test_acl_load_keeps_the_replication_user_and_its_replicas(make_server, tmp_path):
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on nopass ~* &* +@all\nuser replica off\n")
    primary = make_server("--manual-clock", "--aclfile", str(aclfile),
                          "--repl-password", "replpw")
    p = primary.client(decode_responses=True)
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(primary.port),
                          "--masteruser", "replica", "--masterauth", "replpw")
    wait_link_up(replica.client())
    assert p.execute_command("ACL", "LOAD") == "OK"
    assert p.acl_getuser("replica")["flags"][0] == "on"        # the settings', not the file's
    time.sleep(1.5)      # real time: a closed link would have come back by now, with a new copy
    assert p.info("replication")["repl_full_copies_written"] == 1
    assert p.info("replication")["connected_slaves"] == 1

