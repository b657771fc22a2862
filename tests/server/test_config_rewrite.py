"""CONFIG REWRITE: the running settings written back into the TOML file
the server was started with (--config), comments and layout kept, so a
restart comes up as the server was (above all: in the same replication
role); and the transaction Sentinel sends in a failover, pipelined as it
sends it.
"""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile

import pytest
import redis
from servers import ServerProcess
from wire import Wire, command, wait_until

from fastlimit.server import config as cfg

WAIT = 20.0
NO_CONFIG_FILE = b"-ERR The server is running without a config file\r\n"

FILE = """\
# fastlimit on box 3: edited by hand, rewritten by CONFIG REWRITE
[server]
maxclients = 100          # small box
proto_max_bulk_len = "512mb"
hz = 10

# replication: Sentinel moves this one
{replicaof}
[rules]
# kept for later
"""


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="fastlimit-rewrite-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def config_file(workdir, replicaof: str = "") -> str:
    path = os.path.join(workdir, "fastlimit.toml")
    with open(path, "w") as f:
        f.write(FILE.format(replicaof=replicaof))
    return path


def read(path) -> str:
    with open(path) as f:
        return f.read()


def role(c) -> str:
    return c.info("replication")["role"]


def test_without_a_config_file_the_error_is_redis_s(server, redis_server):
    with Wire.to(server.port) as w:
        assert w.call("CONFIG", "REWRITE") == NO_CONFIG_FILE
    with Wire.to(redis_server.port) as w:
        assert w.call("CONFIG", "REWRITE") == NO_CONFIG_FILE


def test_rewrite_keeps_the_operators_layout_and_writes_what_changed(make_server, workdir):
    path = config_file(workdir)
    srv = make_server("--config", path)
    c = srv.client()
    c.config_set("maxclients", "200")
    c.config_set("replica-priority", "7")
    assert c.execute_command("CONFIG", "REWRITE") == b"OK"
    # The command line's settings (the test harness's --port 0, --rules-db,
    # --snapshot-file, --http-port 0 and --grpc-port 0) are running settings
    # too, as in Redis.
    assert read(path) == """\
# fastlimit on box 3: edited by hand, rewritten by CONFIG REWRITE
[server]
maxclients = 200          # small box
proto_max_bulk_len = "512mb"
hz = 10

# replication: Sentinel moves this one
port = 0
snapshot-file = ""
rules-db = ""
replica-priority = 7
http-port = 0
grpc-port = 0

[rules]
# kept for later
"""
    # a second rewrite with nothing changed changes nothing
    c.execute_command("CONFIG", "REWRITE")
    assert read(path).count("maxclients") == 1
    assert dict(c.info("server"))["config_file"] == os.path.realpath(path)


def test_a_restart_on_the_rewritten_file_comes_up_in_the_same_role(make_server, workdir):
    primary = make_server()
    path = config_file(workdir)
    first = make_server("--config", path)
    c = first.client()
    c.execute_command("SLAVEOF", "127.0.0.1", primary.port)
    c.execute_command("CONFIG", "REWRITE")
    assert f'replicaof = "127.0.0.1 {primary.port}"' in read(path)
    first.stop()

    with ServerProcess("--config", path) as again:
        c = again.client()
        assert role(c) == "slave" and c.info("replication")["master_port"] == primary.port
        wait_until(lambda: c.info("replication")["master_link_status"] == "up", WAIT,
                   "the restarted replica's link")
        c.execute_command("REPLICAOF", "NO", "ONE")
        c.execute_command("CONFIG", "REWRITE")
    assert "replicaof" not in read(path)
    assert "# replication: Sentinel moves this one" in read(path)
    with ServerProcess("--config", path) as again:
        assert role(again.client()) == "master"


def test_replicaof_no_one_removes_the_line_the_file_started_with(make_server, workdir):
    primary = make_server()
    path = config_file(workdir, f'replicaof = "127.0.0.1 {primary.port}"   # by Sentinel')
    srv = make_server("--config", path)
    c = srv.client()
    assert role(c) == "slave"
    c.execute_command("REPLICAOF", "NO", "ONE")
    c.execute_command("CONFIG", "REWRITE")
    assert "replicaof" not in read(path)
    # re-pointed: the line comes back with the new primary
    other = make_server()
    c.execute_command("SLAVEOF", "127.0.0.1", other.port)
    c.execute_command("CONFIG", "REWRITE")
    assert f'replicaof = "127.0.0.1 {other.port}"' in read(path)
    assert cfg.from_args(["--config", path]).replicaof == ("127.0.0.1", other.port)


def test_a_rewrite_that_cannot_write_says_why_and_changes_nothing(make_server, workdir):
    sub = os.path.join(workdir, "gone")
    os.mkdir(sub)
    path = os.path.join(sub, "fastlimit.toml")
    with open(path, "w") as f:
        f.write("maxclients = 100\n")
    srv = make_server("--config", path)
    shutil.rmtree(sub)
    with Wire.to(srv.port) as w:
        assert w.call("CONFIG", "REWRITE") == \
            b"-ERR Rewriting config file: No such file or directory\r\n"
        assert w.call("PING") == b"+PONG\r\n"
    assert "CONFIG REWRITE of" in srv.log()


def test_every_setting_survives_a_rewrite_and_a_reload(workdir):
    """Each setting at a value other than its default, written into an
    empty file, reads back the same."""
    path = os.path.join(workdir, "all.toml")
    open(path, "w").close()
    argv = ["--config", path, "--port", "7001", "--bind", "127.0.0.1", "::1",
            "--requirepass", "pw", "--aclfile", "users.acl", "--acllog-max-len", "7",
            "--protected-mode", "no", "--shards", "64", "--manual-clock", "--maxclients", "50",
            "--proto-max-bulk-len", "2mb", "--max-multibulk-len", "5000",
            "--client-query-buffer-limit", "3mb",
            "--client-output-buffer-limit", "1000", "500", "9", "--hz", "20",
            "--sweep-budget-ms", "0.5", "--denial-log-seconds", "2.5",
            "--snapshot-file", "", "--save-seconds", "60", "--loglevel", "warning",
            "--rules-db", "r.db", "--rules-file", "rules.toml",
            "--rules-store", "postgresql://fleet:pw@db.example:5433/rules?sslmode=require",
            "--rules-store-resync", "12.5", "--rules-store-heartbeat", "3",
            "--rules-store-timeout", "0.5", "--rules-store-required", "yes",
            "--rules-store-max-staleness", "60",
            "--hotkeys-top-k", "64", "--hotkeys-sample", "8", "--hotkeys-metrics-keys", "5",
            "--shed-threshold", "80", "--shed-lag-ms", "7", "--shed-normal-lag-ms", "30",
            "--region", "eu", "--regions", "us", "eu", "ap", "--region-peers", "us=[::1]:7005",
            "ap=sentinel:svc@127.0.0.1:26379,[::1]:26380",
            "--region-user", "reg", "--region-password", "regpw", "--region-sync-ms", "20",
            "--region-partition-ms", "500", "--region-buffer-limit", "2mb",
            "--region-rebalance-ms", "300", "--region-rebalance-step", "40",
            "--region-home-timeout-ms", "250",
            "--tls-regions", "yes",
            "--replicaof", "10.0.0.1", "6379", "--masterauth", "m", "--masteruser", "u",
            "--replica-priority", "0", "--replica-announce-ip", "10.0.0.9",
            "--replica-announce-port", "7002", "--replica-announced", "no",
            "--repl-user", "ru", "--repl-password", "rp", "--repl-max-full-copies", "3",
            "--repl-timeout", "30", "--repl-flush-ms", "5", "--repl-buffer-limit", "1mb",
            "--rules-cache-size", "0", "--maxmemory", "200mb",
            "--maxmemory-policy", "allkeys-random", "--maxmemory-samples", "9",
            "--cluster-enabled", "yes",
            "--cluster-config-file", "map.toml", "--cluster-announce-ip", "10.0.0.8",
            "--cluster-announce-port", "7003", "--cluster-sentinel-password", "sp",
            "--cluster-user", "cu", "--cluster-password", "cp",
            "--http-port", "8000", "--http-metrics-auth", "no", "--http-max-header-bytes", "8kb",
            "--http-max-body-bytes", "64kb", "--http-header-timeout", "2.5",
            "--http-body-timeout", "30", "--http-body-memory", "32mb",
            "--http-batch-max", "10", "--metrics-rule-labels", "5",
            "--rls-config", "rls.yaml", "--rls-response-headers", "yes",
            "--rls-shadow-mode", "yes", "--rls-merge-domains", "yes",
            "--rls-max-config-bytes", "2mb", "--rls-max-descriptors", "500",
            "--rls-xds-server", "127.0.0.1:18001", "--rls-xds-node-id", "eg",
            "--rls-xds-backoff", "1 5.5", "--rls-xds-tls", "yes",
            "--grpc-port", "8001", "--grpc-max-concurrent-streams", "7",
            "--grpc-deadline-ms", "2.5", "--grpc-max-descriptors", "64",
            "--tls-port", "7004", "--tls-cert-file", "s.crt", "--tls-key-file", "s.key",
            "--tls-key-file-pass", "kp", "--tls-client-cert-file", "c.crt",
            "--tls-client-key-file", "c.key", "--tls-client-key-file-pass", "ckp",
            "--tls-ca-cert-file", "ca.pem", "--tls-ca-cert-dir", "cas",
            "--tls-auth-clients", "optional", "--tls-protocols", "TLSv1.3",
            "--tls-ciphers", "HIGH", "--tls-replication", "yes", "--tls-http", "yes",
            "--tls-grpc", "yes", "--tls-cluster", "yes", "--takeover-socket", "takeover.sock"]
    # Python's ssl cannot set TLSv1.3 suites before 3.15: the setting refuses any
    if hasattr(ssl.SSLContext, "set_ciphersuites"):
        argv += ["--tls-ciphersuites", "TLS_AES_128_GCM_SHA256"]
    settings = cfg.from_args(argv)
    defaults = cfg.Settings()
    unchanged = [name for name in cfg.get_all(settings)
                 if name not in cfg.FIXED and
                 getattr(settings, cfg.attr_name(name)) == getattr(defaults, cfg.attr_name(name))]
    # the test covers every setting (that this Python can take)
    assert unchanged == ([] if hasattr(ssl.SSLContext, "set_ciphersuites")
                         else ["tls-ciphersuites"])
    cfg.rewrite(settings, path)
    assert cfg.from_args(["--config", path]) == settings


# ---- the failover transaction ------------------------------------------------------------

def sentinel_transaction(*slaveof) -> bytes:
    """What Sentinel writes, in one go, and never reads the replies of."""
    return b"".join([command("MULTI"), command("SLAVEOF", *slaveof), command("CONFIG", "REWRITE"),
                     command("CLIENT", "KILL", "TYPE", "normal"),
                     command("CLIENT", "KILL", "TYPE", "pubsub"), command("EXEC")])


def test_sentinels_failover_transaction_promotes_and_rewrites(make_server, workdir):
    primary = make_server()
    path = config_file(workdir, f'replicaof = "127.0.0.1 {primary.port}"')
    replica = make_server("--config", path)
    c = replica.client()
    wait_until(lambda: c.info("replication")["master_link_status"] == "up", WAIT, "the link")
    bystander = c.connection_pool.get_connection()    # an application's (c's own)
    with Wire.to(replica.port) as w:
        w.send(command("CLIENT", "SETNAME", "sentinel-1a2b3c4d-cmd") +
               sentinel_transaction("NO", "ONE"))
        assert w.read_reply() == b"+OK\r\n"
        assert [w.read_reply() for _ in range(5)] == [b"+OK\r\n"] + [b"+QUEUED\r\n"] * 4
        # the bystander is killed; no pub/sub clients yet
        assert w.read_reply() == b"*4\r\n+OK\r\n+OK\r\n:1\r\n:0\r\n"
        assert w.call("PING") == b"+PONG\r\n"       # not the caller itself
    with pytest.raises(redis.ConnectionError):
        bystander.send_command("PING")
        bystander.read_response()
    assert role(c) == "master"
    assert "replicaof" not in read(path)


def test_sentinels_failover_transaction_repoints_a_replica(make_server, workdir):
    old, new = make_server(), make_server()
    path = config_file(workdir, f'replicaof = "127.0.0.1 {old.port}"')
    replica = make_server("--config", path)
    with Wire.to(replica.port) as w:
        w.send(sentinel_transaction("127.0.0.1", str(new.port)))
        replies = [w.read_reply() for _ in range(6)]
    assert replies[:5] == [b"+OK\r\n"] + [b"+QUEUED\r\n"] * 4
    assert replies[5].startswith(b"*4\r\n+OK\r\n+OK\r\n:")
    c = replica.client()
    wait_until(lambda: c.info("replication")["master_link_status"] == "up"
               and c.info("replication")["master_port"] == new.port, WAIT, "the new link")
    assert f'replicaof = "127.0.0.1 {new.port}"' in read(path)
    # a replica's own link to its new primary is no normal client: it lives
    assert new.client().info("replication")["connected_slaves"] == 1


def test_the_failover_transaction_without_a_config_file_still_fails_over(make_server):
    """Sentinel ignores the replies: CONFIG REWRITE's error inside EXEC
    must not stop the rest of the transaction."""
    primary = make_server()
    replica = make_server("--replicaof", "127.0.0.1", str(primary.port))
    with Wire.to(replica.port) as w:
        w.send(sentinel_transaction("NO", "ONE"))
        replies = [w.read_reply() for _ in range(6)]
    assert replies[5] == b"*4\r\n+OK\r\n" + NO_CONFIG_FILE + b":0\r\n:0\r\n"
    assert role(replica.client()) == "master"
