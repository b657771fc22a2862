"""ACL users (acl/users.py, Connection.acl_denied): the same users given
to fastlimit and to a real redis-server answer the commands both have
byte for byte; CL.* permissions and key patterns on fastlimit alone;
MULTI, ACL LOG, DELUSER, CLIENT KILL USER, requirepass and the clients'
ways of passing a user name."""

from __future__ import annotations

import subprocess

import pytest
import redis
from wire import Wire, wait_until

# name -> rules, given alike to both servers.
USERS = {
    "conn": ["on", ">p-conn", "~*", "+@connection"],
    "nodanger": ["on", ">p-nodanger", "resetkeys", "+@all", "-@dangerous"],
    "picked": ["on", ">p-picked", "-@all", "+ping", "+config|get", "+client", "+multi",
               "+exec"],
    "most": ["on", ">p-most", "~*", "+@all", "-flushall", "-client|kill"],
}

# Commands both servers have; replies compared byte for byte when either
# is an error, or when the command answers the same on both.
COMMANDS = [
    (("PING",), True),
    (("ECHO", "hi"), True),
    (("INFO", "server"), False),
    (("CONFIG", "GET", "maxclients"), True),
    (("CONFIG", "SET", "maxclients", "10000"), True),
    (("CLIENT", "ID"), False),
    (("CLIENT", "LIST"), False),
    (("CLIENT", "KILL", "ID", "999999"), True),
    (("ACL", "WHOAMI"), True),
    (("DBSIZE",), True),
    (("FLUSHALL",), True),
    (("TIME",), False),
    (("LASTSAVE",), False),
    (("ACL", "CAT", "nosuch"), True),
]

# (user, command) -> allowed, the expectation both servers must meet.
EXPECTED_DENIED = {
    "conn": {"INFO", "CONFIG GET", "CONFIG SET", "ACL WHOAMI", "DBSIZE", "FLUSHALL", "TIME",
             "LASTSAVE", "ACL CAT"},
    "nodanger": {"INFO", "CONFIG GET", "CONFIG SET", "CLIENT LIST", "CLIENT KILL",
                 "FLUSHALL", "LASTSAVE"},
    "picked": {"ECHO", "INFO", "CONFIG SET", "ACL WHOAMI", "DBSIZE", "FLUSHALL", "TIME",
               "LASTSAVE", "ACL CAT"},
    "most": {"FLUSHALL", "CLIENT KILL"},
}


def _name(args) -> str:
    return " ".join(args[:2]) if args[0] in ("CONFIG", "CLIENT", "ACL") else args[0]


@pytest.fixture
def both(server, redis_server):
    """The users on both servers (RESP2 admin clients), removed after;
    both flushed, as they are shared with other tests (DBSIZE is compared)."""
    admins = [Wire.to(server.port), Wire.to(redis_server.port)]
    for w in admins:
        w.call("FLUSHALL")
        w.call("ACL", "LOG", "RESET")
        for name, rules in USERS.items():
            assert w.call("ACL", "SETUSER", name, "reset", *rules) == b"+OK\r\n"
    yield {"fastlimit": server.port, "redis": redis_server.port}, admins
    for w in admins:
        w.call("ACL", "DELUSER", *USERS)
        w.close()


def _as(port, user) -> Wire:
    w = Wire.to(port)
    assert w.call("AUTH", user, f"p-{user}") == b"+OK\r\n"
    return w


@pytest.mark.parametrize("user", sorted(USERS))
def test_users_by_commands_answer_as_redis(both, user):
    ports, _ = both
    fl, rd = _as(ports["fastlimit"], user), _as(ports["redis"], user)
    for args, same_reply in COMMANDS:
        got, want = fl.call(*args), rd.call(*args)
        denied = want.startswith(b"-NOPERM")
        assert denied == (_name(args) in EXPECTED_DENIED[user]), (user, args, want)
        if denied or got.startswith(b"-") or want.startswith(b"-") or same_reply:
            assert got == want, (user, args)
        else:
            assert not got.startswith(b"-"), (user, args, got)


def test_denials_are_in_acl_log_with_redis_fields(both):
    ports, admins = both
    for port, admin in zip(ports.values(), admins, strict=True):
        w = _as(port, "conn")
        w.call("CONFIG", "GET", "maxclients")
        w.call("CONFIG", "GET", "maxclients")
        w.call("FLUSHALL")
        fl_log = admin.call("ACL", "LOG")
        assert fl_log.startswith(b"*2\r\n*14\r\n$5\r\ncount\r\n:1\r\n$6\r\nreason\r\n$7\r\ncommand"
                                 b"\r\n$7\r\ncontext\r\n$8\r\ntoplevel\r\n$6\r\nobject\r\n$8\r\n"
                                 b"flushall\r\n$8\r\nusername\r\n$4\r\nconn\r\n$11\r\n"
                                 b"age-seconds\r\n"), fl_log
        assert b"$6\r\nobject\r\n$10\r\nconfig|get\r\n" in fl_log
        assert b"count\r\n:2\r\n" in fl_log          # the same denial twice is one entry
        assert admin.call("ACL", "LOG", "1").startswith(b"*1\r\n")
        assert admin.call("ACL", "LOG", "RESET") == b"+OK\r\n"
        assert admin.call("ACL", "LOG") == b"*0\r\n"
        w.close()


def test_multi_refuses_a_denied_command_at_queue_time_and_at_exec(both):
    ports, admins = both
    for port, admin in zip(ports.values(), admins, strict=True):
        w = _as(port, "picked")
        replies = [w.call("MULTI"), w.call("PING"), w.call("ECHO", "x"), w.call("EXEC")]
        assert replies == [b"+OK\r\n", b"+QUEUED\r\n",
                           b"-NOPERM this user has no permissions to run the 'echo' command\r\n",
                           b"-EXECABORT Transaction discarded because of previous errors.\r\n"]
        assert w.call("MULTI") == b"+OK\r\n"
        assert w.call("PING") == b"+QUEUED\r\n"
        assert admin.call("ACL", "SETUSER", "picked", "-ping") == b"+OK\r\n"
        assert w.call("EXEC") == (
            b"*1\r\n-NOPERM ACLs rules changed between the moment the transaction was "
            b"accumulated and the EXEC call. This command is no longer allowed for the following "
            b"reason: no permission to execute the command or subcommand\r\n")
        assert b"$7\r\ncontext\r\n$5\r\nmulti\r\n" in admin.call("ACL", "LOG", "1")
        w.close()


def test_setuser_errors_and_replies_as_redis(both):
    ports, admins = both
    cases = [
        ("ACL", "SETUSER", "bad", "+nosuchcmd"),
        ("ACL", "SETUSER", "bad", "nonsense"),
        ("ACL", "SETUSER", "bad", "#abc"),
        ("ACL", "SETUSER", "bad", "~*", "~x"),
        ("ACL", "SETUSER", "bad", "<nothere"),
        ("ACL", "SETUSER", "bad", "+@nosuchcat"),
        ("ACL", "SETUSER", "bad", "+config|"),
        ("ACL", "SETUSER", "bad", "+config|get|x"),
        ("ACL", "SETUSER", "has space", "on"),
        ("ACL", "DELUSER", "default"),
        ("ACL", "DELUSER", "nosuch", "bad"),
        ("ACL", "GETUSER", "nosuch"),
        ("ACL", "USERS"),
        ("ACL", "GENPASS", "0"),
        ("ACL", "LOAD"),
        ("ACL", "SAVE"),
        ("ACL", "DRYRUN", "picked", "echo", "x"),
        ("ACL", "DRYRUN", "picked", "ping"),
        ("ACL", "DRYRUN", "nosuch", "ping"),
        ("ACL", "DRYRUN", "picked", "nosuchcmd"),
        ("ACL", "DRYRUN", "picked", "config", "set", "a"),
        ("ACL", "SETUSER", "tiny", "on", "nopass", "-@all", "+ping"),
        ("ACL", "GETUSER", "tiny"),
        ("ACL", "DELUSER", "tiny"),
        ("CLIENT", "KILL", "USER", "nosuch"),
        ("AUTH", "nosuch", "x"),
        ("AUTH", "most", "wrong"),
    ]
    fl, rd = admins
    for args in cases:
        assert fl.call(*args) == rd.call(*args), args
    assert len(fl.call("ACL", "GENPASS")) == len(rd.call("ACL", "GENPASS")) == 71


def test_ratelimit_users_check_their_own_keys_only(server):
    admin = server.client(protocol=2)
    admin.execute_command("ACL", "SETUSER", "tenant-a", "reset", "on", ">pa", "~tenant-a:*",
                          "+@ratelimit")
    admin.execute_command("ACL", "SETUSER", "ops", "reset", "on", ">po", "~*", "+@admin",
                          "+@ratelimit")
    try:
        app = server.client(protocol=2, username="tenant-a", password="pa")
        allowed = [("CL.CHECK", "tenant-a:1", 10, 1), ("CL.THROTTLE", "tenant-a:2", 5, 10, 60),
                   ("CL.LIMIT", "tenant-a:3", "api")]
        for args in allowed:
            app.execute_command(*args)
        key_denied = [("CL.CHECK", "tenant-b:1", 10, 1), ("CL.LIMIT", "tenant-b:1", "api"),
                      ("CL.APPLY", "r1", "tenant-b:1"), ("CL.ACQUIRE", "r1", "tenant-b:1"),
                      ("CL.RELEASE", "r1", "tenant-b:1", 1)]
        for args in key_denied:
            with pytest.raises(redis.exceptions.NoPermissionError, match="one of the keys"):
                app.execute_command(*args)
        command_denied = [(("CL.RESET", "tenant-a:1"), "cl.reset"),
                          (("CL.RULE", "SET", "r", "{}"), "cl.rule|set"),
                          (("CL.RULE", "DEL", "r"), "cl.rule|del"),
                          (("FLUSHALL",), "flushall"),
                          (("CONFIG", "SET", "hz", "10"), "config|set"),
                          (("DEBUG", "CLOCK", "SET", "0"), "debug"),
                          (("SHUTDOWN",), "shutdown"),
                          (("REPLICAOF", "NO", "ONE"), "replicaof"),
                          (("CL.CLUSTER", "MAP"), "cl.cluster|map"), (("PING",), "ping")]
        for args, name in command_denied:
            with pytest.raises(redis.exceptions.NoPermissionError,
                               match=f"no permissions to run the '{name}' command"):
                app.execute_command(*args)
        ops = server.client(protocol=2, username="ops", password="po")
        assert ops.execute_command("CL.RESET", "tenant-b:1") == 0
        ops.execute_command("CL.CHECK", "tenant-b:1", 10, 1)
        assert ops.execute_command("CONFIG", "GET", "hz") == [b"hz", b"10"]
        cat = {c.decode() for c in admin.execute_command("ACL", "CAT", "ratelimit")}
        assert cat == {"cl.check", "cl.limit", "cl.apply", "cl.acquire", "cl.release",
                       "cl.throttle", "cl.fixed", "cl.moving", "cl.sliding"}
        assert {"cl.reset", "cl.rule|set", "cl.rule|del", "flushall", "config|set", "debug",
                "shutdown", "replicaof", "cl.cluster|setmap"} <= {
            c.decode() for c in admin.execute_command("ACL", "CAT", "dangerous")}
        info = admin.info("stats")
        assert info["acl_access_denied_key"] >= len(key_denied)
        assert info["acl_access_denied_cmd"] >= len(command_denied)
    finally:
        admin.execute_command("ACL", "DELUSER", "tenant-a", "ops")


def test_a_deleted_user_is_disconnected_and_client_kill_user(both):
    ports, admins = both
    for port, admin in zip(ports.values(), admins, strict=True):
        victim, other = _as(port, "most"), _as(port, "conn")
        second = _as(port, "conn")
        assert victim.call("PING") == b"+PONG\r\n"
        assert admin.call("ACL", "DELUSER", "most") == b":1\r\n"
        victim.read_until_closed()
        assert other.is_open()
        assert admin.call("CLIENT", "KILL", "USER", "conn") == b":2\r\n"
        other.read_until_closed()
        second.read_until_closed()
        assert admin.call("PING") == b"+PONG\r\n"


def test_off_user_cannot_log_in_but_its_sessions_stay(both):
    ports, admins = both
    for port, admin in zip(ports.values(), admins, strict=True):
        w = _as(port, "conn")
        assert admin.call("ACL", "SETUSER", "conn", "off") == b"+OK\r\n"
        assert w.call("PING") == b"+PONG\r\n"
        assert Wire.to(port).call("AUTH", "conn", "p-conn") == \
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
        assert b"$6\r\nreason\r\n$4\r\nauth\r\n" in admin.call("ACL", "LOG", "1")
        w.close()


def test_hello_auth_and_redis_py_and_redis_cli_pass_a_user(server):
    admin = server.client(protocol=2)
    admin.execute_command("ACL", "SETUSER", "app", "reset", "on", ">pw", "~k:*", "+@ratelimit",
                          "+acl|whoami", "+client|info")
    try:
        for protocol in (2, 3):
            c = server.client(protocol=protocol, username="app", password="pw")
            assert c.execute_command("ACL", "WHOAMI") in (b"app", "app")
            assert b"user=app" in c.execute_command("CLIENT", "INFO")
        with pytest.raises(redis.exceptions.AuthenticationError):
            server.client(protocol=3, username="app", password="no").ping()
        w = Wire.to(server.port)
        assert w.call("HELLO", "3", "AUTH", "app", "no") == \
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
        assert w.call("HELLO", "3", "AUTH", "app", "pw").startswith(b"%")
        out = subprocess.run(["redis-cli", "-p", str(server.port), "--user", "app", "--pass",
                              "pw", "--no-auth-warning", "CL.CHECK", "k:1", "5", "1"],
                             capture_output=True, text=True, timeout=10)
        assert out.stdout.split() == ["1", "5", "4", "0", "1000"], out
        out = subprocess.run(["redis-cli", "-p", str(server.port), "--user", "app", "--pass",
                              "pw", "--no-auth-warning", "CL.CHECK", "x:1", "5", "1"],
                             capture_output=True, text=True, timeout=10)
        assert "NOPERM" in out.stdout + out.stderr
    finally:
        admin.execute_command("ACL", "DELUSER", "app")


def test_requirepass_is_the_default_users_password(make_server, redis_server):
    s = make_server("--requirepass", "s3cret")
    assert Wire.to(redis_server.port).call("CONFIG", "SET", "requirepass", "s3cret") == \
        b"+OK\r\n"
    fl, rd = Wire.to(s.port), Wire.to(redis_server.port)
    try:
        for w in (fl, rd):
            assert w.call("PING") == b"-NOAUTH Authentication required.\r\n"
            assert w.call("AUTH", "s3cret") == b"+OK\r\n"
        assert fl.call("ACL", "LIST") == rd.call("ACL", "LIST")
        for w in (fl, rd):
            assert w.call("CONFIG", "SET", "requirepass", "") == b"+OK\r\n"
        assert fl.call("ACL", "LIST") == rd.call("ACL", "LIST") == \
            b"*1\r\n$34\r\nuser default on nopass ~* &* +@all\r\n"
        assert Wire.to(s.port).call("PING") == b"+PONG\r\n"
        assert fl.call("AUTH", "x") == rd.call("AUTH", "x")
    finally:
        rd.call("CONFIG", "SET", "requirepass", "")


def test_acl_log_is_bounded_by_acllog_max_len(make_server):
    s = make_server("--acllog-max-len", "3")
    admin = s.client(protocol=2)
    admin.execute_command("ACL", "SETUSER", "u", "on", "nopass", "-@all")
    w = _as_nopass(s.port, "u")
    for i in range(10):
        w.call("ECHO", str(i))          # the same entry, counted
        w.call("AUTH", f"nosuch{i}", "x")     # ten different ones
    log = admin.execute_command("ACL", "LOG", "100")
    assert len(log) == 3
    assert admin.info("memory")["acl_log_entries"] == 3
    assert admin.info("memory")["acllog_max_len"] == 3
    admin.config_set("acllog-max-len", "1")
    assert len(admin.execute_command("ACL", "LOG", "100")) == 1
    admin.config_set("acllog-max-len", "0")
    w.call("ECHO", "x")
    assert admin.execute_command("ACL", "LOG") == []


def _as_nopass(port, user) -> Wire:
    w = Wire.to(port)
    assert w.call("AUTH", user, "anything") == b"+OK\r\n"
    return w


def test_aclfile_load_save_round_trip_and_a_bad_file(make_server, tmp_path, redis_server):
    path = tmp_path / "users.acl"
    path.write_text("user app on >pw ~tenant-a:* resetchannels -@all +@ratelimit\n"
                    "user default on nopass ~* &* +@all\n")
    s = make_server("--aclfile", str(path))
    admin = s.client(protocol=2)
    assert sorted(admin.execute_command("ACL", "USERS")) == [b"app", b"default"]
    app = Wire.to(s.port)
    assert app.call("AUTH", "app", "pw") == b"+OK\r\n"
    admin.execute_command("ACL", "SETUSER", "ops", "on", ">po", "~*", "+@admin")
    assert admin.execute_command("ACL", "SAVE") == b"OK"
    saved = path.read_text()
    assert "user ops on #" in saved and ">pw" not in saved
    assert saved.splitlines()[0].startswith("user app on #30c952fab122c3f9759f02a6d95c3758")
    # A bad file: nothing changes, and the error says where, as Redis's does.
    path.write_text(saved + "user broken on +nosuchcmd\nnot a user line\n")
    with pytest.raises(redis.ResponseError) as bad:
        admin.execute_command("ACL", "LOAD")
    assert str(bad.value) == (
        f"{path}:4: Error in applying operation '+nosuchcmd': Unknown command or category name "
        f"in ACL. {path}:5 should start with user keyword followed by the username. WARNING: "
        f"ACL errors detected, no change to the previously active ACL rules was performed")
    assert sorted(admin.execute_command("ACL", "USERS")) == [b"app", b"default", b"ops"]
    assert app.call("PING").startswith(b"-NOPERM")        # still connected, as before
    # The same file, loaded by ACL LOAD after a fix: the old users' sessions end.
    path.write_text(saved.replace("+@admin", "+@admin +@ratelimit"))
    assert admin.execute_command("ACL", "LOAD") == b"OK"
    app.read_until_closed()
    assert "+@ratelimit" in admin.execute_command("ACL", "GETUSER", "ops")[5].decode()
    assert admin.config_get("aclfile") == {"aclfile": str(path)}
    with pytest.raises(redis.ResponseError, match="can't set immutable config"):
        admin.config_set("aclfile", "other.acl")


def test_a_bad_aclfile_at_start_stops_the_server(tmp_path):
    from servers import ServerProcess
    path = tmp_path / "users.acl"
    path.write_text("user app on +nosuchcmd\n")
    s = ServerProcess("--aclfile", str(path))
    with pytest.raises(RuntimeError):
        s.start()
    wait_until(lambda: "Unknown command or category name in ACL" in s.log(),
               what="the reason in the log")


def _from(address: str, port: int) -> Wire:
    """A connection to 127.0.0.1:port from a chosen local source address."""
    import socket
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    return Wire(sock)


def test_protected_mode_refuses_other_addresses_as_redis(make_server, redis_server):
    """Redis 7.0's rule: while the default user has no password, a peer
    other than exactly 127.0.0.1 or ::1 gets -DENIED and is closed,
    whatever bind says (127.0.0.2 is on the loopback interface but not
    the loopback address Redis allows, so the test needs no network)."""
    s = make_server()
    refused = {}
    for name, port in (("fastlimit", s.port), ("redis", redis_server.port)):
        refused[name] = _from("127.0.0.2", port).read_until_closed()
        assert _from("127.0.0.1", port).call("PING") == b"+PONG\r\n"
    assert refused["fastlimit"] == refused["redis"]
    assert refused["fastlimit"].startswith(b"-DENIED Redis is running in protected mode")
    admin = s.client(protocol=2)
    assert admin.info("stats")["rejected_connections"] == 1
    admin.config_set("requirepass", "pw")       # a password lifts it
    assert _from("127.0.0.2", s.port).call("PING") == b"-NOAUTH Authentication required.\r\n"
    admin = s.client(protocol=2, password="pw")
    admin.config_set("requirepass", "")
    assert _from("127.0.0.2", s.port).read_until_closed().startswith(b"-DENIED")
    admin.config_set("protected-mode", "no")   # and so does turning it off
    assert _from("127.0.0.2", s.port).call("PING") == b"+PONG\r\n"
    assert admin.config_get("protected-mode") == {"protected-mode": "no"}


@pytest.mark.parametrize("pattern", [b"a:*", b"a*", b"**", b"a?*", b"[ab]*", b"a\\*", b"a*b",
                                     b"a:", b"*:1"])
def test_prefix_patterns_match_as_the_glob_matcher(pattern):
    """A pattern like tenant-a:* is compared as a prefix on the hot path
    (acl.split_patterns): it must admit exactly the keys Redis's
    stringmatchlen (glob) admits."""
    from fastlimit._protocol import acl_check, glob
    from fastlimit.acl.users import Commands, User
    from fastlimit.server.commands.table import build_table
    commands = Commands(build_table())
    user = User("u", commands.size)
    for rule in (b"on", b"+@ratelimit", b"~" + pattern):
        user.apply(rule, commands)
    user.update_grant()
    check = commands.by_name["cl.check"]
    for key in (b"", b"a", b"a:", b"a:1", b"b:1", b"a*", b"ab", b"a*b", b"b", b"x:1"):
        admitted = acl_check(user.grant, check, [b"CL.CHECK", key, b"1", b"1"]) == 0
        assert admitted == glob(pattern, key), (pattern, key)


@pytest.mark.parametrize("proto", [2, 3])
def test_getuser_and_list_answer_as_redis_for_rules_it_keeps_as_given(both, proto):
    """Redis 7.0 rebuilds the command rules from its bitmap (7.2 keeps them
    as written, as fastlimit does): for these users both are the same."""
    _, admins = both
    for w in admins:
        assert w.call("HELLO", proto).startswith(b"%" if proto == 3 else b"*")
        assert w.call("ACL", "SETUSER", "t", "reset", "on", "nopass", "~a:*", "~b:*", "&ch",
                      "-@all", "+ping") == b"+OK\r\n"
    fl, rd = admins
    for args in (("ACL", "GETUSER", "conn"), ("ACL", "GETUSER", "nodanger"),
                 ("ACL", "GETUSER", "t"), ("ACL", "GETUSER", "default"), ("ACL", "WHOAMI"),
                 ("ACL", "LOG", "RESET")):
        assert fl.call(*args) == rd.call(*args), args
    for w in admins:
        w.call("ACL", "DELUSER", "t")


@pytest.fixture
def redis_with_aclfile(tmp_path):
    """A redis-server and the aclfile it was started with (its users)."""
    from wire import free_port
    path = tmp_path / "users.acl"
    path.write_text("user app on >pw ~tenant-a:* resetchannels -@all +@connection\n"
                    "user default on nopass ~* &* +@all\n")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                             "--aclfile", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _pings(port), what="redis-server")
        yield port, path
    finally:
        proc.terminate()
        proc.wait(10)


def _pings(port) -> bool:
    try:
        return Wire.to(port).call("PING") == b"+PONG\r\n"
    except OSError:
        return False


def test_acl_load_and_save_answer_as_redis_on_the_same_file(make_server, redis_with_aclfile):
    rd_port, path = redis_with_aclfile
    s = make_server("--aclfile", str(path))
    fl, rd = Wire.to(s.port), Wire.to(rd_port)
    assert fl.call("ACL", "LIST") == rd.call("ACL", "LIST")
    good = path.read_text()
    for bad in (good + "user broken on +nosuchcmd\n",
                good + "not a user line\n",
                good + "user x on #abc\n",
                good + "user app on\n"):
        path.write_text(bad)
        assert fl.call("ACL", "LOAD") == rd.call("ACL", "LOAD"), bad
        assert fl.call("ACL", "LIST") == rd.call("ACL", "LIST")
    path.write_text(good)
    assert fl.call("ACL", "SETUSER", "ops", "on", ">po", "~*", "+@admin") == b"+OK\r\n"
    assert fl.call("ACL", "SAVE") == b"+OK\r\n"
    assert rd.call("ACL", "LOAD") == b"+OK\r\n"     # what fastlimit saved, as Redis reads it
    assert fl.call("ACL", "LIST") == rd.call("ACL", "LIST")


def test_channel_patterns_restrict_pubsub_as_redis(both):
    """&pattern: PUBLISH and SUBSCRIBE channels matched against the
    patterns, PSUBSCRIBE patterns compared literally; a subscriber whose
    channels the new rules drop is disconnected (ACLKillPubsubClientsIfNeeded)."""
    ports, admins = both
    for w in admins:
        assert w.call("ACL", "SETUSER", "chan", "reset", "on", ">p-chan", "~*", "&news.*",
                      "+@all") == b"+OK\r\n"
    cases = [("PUBLISH", "news.a", "x"), ("PUBLISH", "sports", "x"), ("SUBSCRIBE", "sports"),
             ("SUBSCRIBE", "news.a", "sports"), ("PSUBSCRIBE", "news.a*"),
             ("SUBSCRIBE", "news.b"), ("PSUBSCRIBE", "news.*")]
    got = {}
    for name, port in ports.items():
        replies = []
        for args in cases:
            w = _as(port, "chan")
            replies.append(w.call(*args))
            w.close()
        got[name] = replies
    assert got["fastlimit"] == got["redis"]
    assert got["redis"][1] == (b"-NOPERM this user has no permissions to access one of the "
                               b"channels used as arguments\r\n")
    fl, rd = admins
    for args in (("ACL", "DRYRUN", "chan", "publish", "sports", "x"),
                 ("ACL", "DRYRUN", "chan", "subscribe", "news.a"),
                 ("ACL", "DRYRUN", "chan", "psubscribe", "news.a*")):
        assert fl.call(*args) == rd.call(*args), args
    subscribers = []
    for port in ports.values():
        w = _as(port, "chan")
        assert w.call("SUBSCRIBE", "news.a").startswith(b"*3\r\n")
        subscribers.append(w)
    for w in admins:
        assert w.call("ACL", "SETUSER", "chan", "resetchannels", "&other") == b"+OK\r\n"
    for w in subscribers:
        w.read_until_closed()
    for w in admins:
        assert b"$7\r\nchannel\r\n" in w.call("ACL", "LOG", "1")
        w.call("ACL", "DELUSER", "chan")
