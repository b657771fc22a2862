"""The command table: one entry per command (name, arity as in Redis,
flags, key positions, ACL categories, docs), the single source for
dispatch, arity checks, COMMAND replies and per-command statistics, as
Redis's server.c table.  The handlers live by area in the modules beside
this one (connection, client, server, config, introspection, buckets,
rules, replication); a new area is a new module and its entries here.

Commands with a ``fast`` id run entirely in the Cython connection
(_protocol.pyx); the others have a handler ``handler(conn, args) ->
reply`` where ``args[0]`` is the command name as sent, raising
``ReplyError`` for an error reply.
"""

from __future__ import annotations

from fastlimit._protocol import Command
from fastlimit.acl import commands as acl
from fastlimit.cluster import commands as cluster
from fastlimit.hotkeys import commands as hotkeys
from fastlimit.pubsub import commands as pubsub
from fastlimit.regions import commands as regions
from fastlimit.replication import commands as replication
from fastlimit.rls import commands as rls
from fastlimit.rules import commands as rules
from fastlimit.server.commands import (
    buckets,
    client,
    config,
    connection,
    introspection,
    server,
    transactions,
)
from fastlimit.server.commands.spec import command, container, ratelimit_command, sub
from fastlimit.windows import commands as windows

# The fast-path ids of _protocol.pxd's FastPath enum.
(FAST_CL_CHECK, FAST_CL_LIMIT, FAST_PING, FAST_MULTI, FAST_EXEC, FAST_DISCARD, FAST_QUIT,
 FAST_RESET) = range(1, 9)


def build_table() -> dict[bytes, Command]:
    # "no-auth": runs before AUTH (and, as in Redis, whatever the user's
    # commands). Only these four connection commands carry it, Redis's own:
    # anything else a connection may do needs a user and passes its ACL.
    conn_flags = ("noscript", "loading", "stale", "fast", "no-auth", "allow-busy")
    # Redis's: admin also keeps CONFIG SET requirepass out of MONITOR
    config_flags = ("admin", "noscript", "loading", "stale")
    commands = [
        command("cl.check", -4, ("write", "denyoom", "fast"), fast=FAST_CL_CHECK, keys=(1, 1, 1),
             replica_peeks=True,
             acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.1.0",
             summary="Spends COST tokens from a token bucket if it holds them; replies "
                     "[allowed, limit, remaining, retry_after_ms, reset_after_ms].",
             arguments=[("key", "key"), ("capacity", "integer"), ("refill_per_sec", "integer"),
                        ("cost", "integer", {"token": "COST", "optional": True}),
                        ("period", "integer", {"token": "PERIOD", "optional": True}),
                        ("split", "integer", {"token": "SPLIT", "optional": True}),
                        ("priority", "string", {"token": "PRIORITY", "optional": True})]),
        command("cl.reset", 2, ("write", "fast"), buckets.cmd_cl_reset,
             keys=(1, 1, 1), acl=("@write", "@admin", "@fast", "@dangerous"), group="ratelimit",
             summary="Forgets a bucket, so it is full again. Replies 1 if it existed.",
             arguments=[("key", "key")]),
        # the handler is for home rules' checks (rules/commands.py cmd_limit)
        command("cl.limit", -3, ("write", "denyoom", "fast"), rules.cmd_limit,
             fast=FAST_CL_LIMIT, keys=(1, 1, 1),
             replica_peeks=True,
             acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.1.0",
             summary="Checks every rule matching the client, resource and tier, all or "
                     "nothing; replies like CL.CHECK for the binding rule.",
             arguments=[("client_key", "key"), ("resource", "string"),
                        ("tier", "string", {"token": "TIER", "optional": True}),
                        ("cost", "integer", {"token": "COST", "optional": True}),
                        ("detail", "pure-token", {"token": "DETAIL", "optional": True}),
                        ("priority", "string", {"token": "PRIORITY", "optional": True})]),
        command("cl.throttle", -5, ("write", "denyoom", "fast"), buckets.cmd_cl_throttle,
             keys=(1, 1, 1),
             acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.1.0",
             summary="redis-cell's GCRA limiter: [limited, limit, remaining, "
                     "retry_after_s, reset_after_s].",
             arguments=[("key", "key"), ("max_burst", "integer"), ("count", "integer"),
                        ("period", "integer"), ("quantity", "integer", {"optional": True})]),
        command("ping", -1, ("fast", "sentinel"), fast=FAST_PING, acl=("@fast", "@connection"),
             when_subscribed=True, group="connection",
             summary="Returns the server's liveliness response.",
             arguments=[("message", "string", {"optional": True})]),
        command("echo", 2, ("fast",), connection.cmd_echo, acl=("@fast", "@connection"),
             group="connection",
             summary="Returns the given string.", arguments=[("message", "string")]),
        command("auth", -2, conn_flags + ("sentinel",), connection.cmd_auth,
             acl=("@fast", "@connection"),
             group="connection", summary="Authenticates the connection.",
             arguments=[("username", "string", {"optional": True}), ("password", "string")]),
        command("hello", -1, conn_flags + ("sentinel",), connection.cmd_hello,
             acl=("@fast", "@connection"),
             group="connection", summary="Handshakes with the server.",
             arguments=[("protover", "integer", {"optional": True})]),
        command("select", 2, ("loading", "stale", "fast"), connection.cmd_select,
             acl=("@fast", "@connection"),
             group="connection", summary="Changes the selected database (only 0 exists).",
             arguments=[("index", "integer")]),
        command("quit", -1, conn_flags, connection.cmd_quit, fast=FAST_QUIT,
             acl=("@fast", "@connection"), when_subscribed=True,
             group="connection", summary="Closes the connection."),
        command("reset", 1, conn_flags, connection.cmd_reset, fast=FAST_RESET,
             acl=("@fast", "@connection"), when_subscribed=True,
             group="connection", summary="Resets the connection."),
        command("multi", 1, ("noscript", "loading", "stale", "fast", "allow-busy"), fast=FAST_MULTI,
             acl=("@fast", "@transaction"), group="transactions", summary="Starts a transaction."),
        command("exec", 1, ("noscript", "loading", "stale", "skip-slowlog"), fast=FAST_EXEC,
             acl=("@slow", "@transaction"), group="transactions",
             summary="Executes all commands in a transaction."),
        command("discard", 1, ("noscript", "loading", "stale", "fast", "allow-busy"),
             fast=FAST_DISCARD, acl=("@fast", "@transaction"), group="transactions",
             summary="Discards a transaction."),
        command("watch", -2, ("noscript", "loading", "stale", "fast", "allow-busy"),
             transactions.cmd_watch, keys=(1, -1, 1), acl=("@fast", "@transaction"),
             group="transactions",
             summary="Watches bucket keys: EXEC aborts if a write names one of them first.",
             arguments=[("key", "key", {"multiple": True})]),
        command("unwatch", 1, ("noscript", "loading", "stale", "fast", "allow-busy"),
             transactions.cmd_unwatch, acl=("@fast", "@transaction"), group="transactions",
             summary="Forgets about all watched keys."),
        command("monitor", 1, ("admin", "noscript", "loading", "stale"), server.cmd_monitor,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Listens for all requests received by the server in real time."),
        command("dbsize", 1, ("readonly", "fast"), server.cmd_dbsize,
             acl=("@keyspace", "@read", "@fast"),
             group="server", summary="Returns the number of live buckets."),
        command("flushall", -1, ("write",), server.cmd_flushall,
             acl=("@keyspace", "@write", "@slow", "@dangerous"),
             group="server", summary="Removes every bucket.",
             arguments=[("flush-type", "string", {"optional": True})]),
        command("flushdb", -1, ("write",), server.cmd_flushall,
             acl=("@keyspace", "@write", "@slow", "@dangerous"),
             group="server", summary="Removes every bucket (there is one database).",
             arguments=[("flush-type", "string", {"optional": True})]),
        command("time", 1, ("loading", "stale", "fast"), server.cmd_time, acl=("@fast",),
             group="server",
             summary="Returns the server time (the manual clock when it is on)."),
        command("info", -1, ("loading", "stale", "sentinel"), server.cmd_info,
             acl=("@slow", "@dangerous"),
             group="server", summary="Returns information and statistics about the server.",
             arguments=[("section", "string", {"optional": True})]),
        command("save", 1, ("admin", "noscript", "no-async-loading", "no-multi"), server.cmd_save,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Writes the snapshot now, blocking."),
        command("bgsave", -1, ("admin", "noscript", "no-async-loading"), server.cmd_bgsave,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Writes the snapshot from a forked child."),
        command("lastsave", 1, ("loading", "stale", "fast"), server.cmd_lastsave,
             acl=("@admin", "@fast", "@dangerous"), group="server",
             summary="The Unix time of the last successful snapshot."),
        command("shutdown", -1, ("admin", "noscript", "loading", "stale", "no-multi", "sentinel"),
             server.cmd_shutdown, acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Stops the server."),
        command("debug", -2, ("admin", "noscript", "loading", "stale"), server.cmd_debug,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Debugging and test helpers (DEBUG HELP)."),
        command("replicaof", 3, ("admin", "noscript", "stale", "no-async-loading"),
             replication.cmd_replicaof,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="Follows a primary as its read-only replica, or with NO ONE stops "
                     "and takes writes.",
             arguments=[("host", "string"), ("port", "integer")]),
        command("slaveof", 3, ("admin", "noscript", "stale", "no-async-loading"),
             replication.cmd_replicaof,
             acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="The old name of REPLICAOF.",
             arguments=[("host", "string"), ("port", "integer")]),
        command("role", 1, ("noscript", "loading", "stale", "fast", "sentinel"),
             replication.cmd_role,
             acl=("@admin", "@fast", "@dangerous"), group="server",
             summary="Returns the replication role."),
        command("replconf", -1, ("admin", "noscript", "loading", "stale", "allow-busy"),
             replication.cmd_replconf, acl=("@admin", "@slow", "@dangerous"), group="server",
             summary="An internal command a replica sends its primary."),
        command("cl.sync", 1, ("admin", "noscript", "no-multi"), replication.cmd_cl_sync,
             acl=("@admin", "@slow", "@dangerous"), group="server", since="0.4.0",
             summary="An internal command: a replica asks for a full copy and the "
                     "stream of changes."),
        command("cl.regionsync", 5, ("write", "admin", "noscript", "no-multi"),
             regions.cmd_cl_regionsync, acl=("@admin", "@slow", "@dangerous"), group="server",
             since="0.9.0",
             summary="An internal command: a peer region's link sends the spends of global "
                     "rules there."),
        command("cl.regioncheck", -5, ("write", "admin", "noscript", "no-multi"),
             regions.cmd_cl_regioncheck, acl=("@admin", "@slow", "@dangerous"),
             group="server", since="0.9.0",
             summary="An internal command: another region asks this one, the home of the "
                     "check's key, to run a CL.LIMIT or CL.APPLY."),
        command("cl.regiondemand", 3, ("write", "admin", "noscript", "no-multi"),
             regions.cmd_cl_regiondemand, acl=("@admin", "@slow", "@dangerous"),
             group="server", since="0.9.0",
             summary="An internal command: a region tells the coordinator its demand for "
                     "rebalanced static rules."),
        command("cl.regionshares", 5, ("write", "admin", "noscript", "no-multi"),
             regions.cmd_cl_regionshares, acl=("@admin", "@slow", "@dangerous"),
             group="server", since="0.9.0",
             summary="An internal command: the coordinator's round of rebalanced static "
                     "shares."),
        client_container(),
        container("command", -1, ("loading", "stale"), [
            sub("command", "count", 2, introspection.cmd_command_count,
                "Returns a count of commands.", acl=CONNECTION),
            sub("command", "info", -2, introspection.cmd_command_info,
                "Returns information about commands.", acl=CONNECTION),
            sub("command", "docs", -2, introspection.cmd_command_docs,
                "Returns documentary information about commands.", acl=CONNECTION),
            sub("command", "list", -2, introspection.cmd_command_list,
                "Returns a list of command names.", acl=CONNECTION),
            sub("command", "getkeys", -3, introspection.cmd_command_getkeys,
                "Extracts the key names from a command.", acl=CONNECTION),
        ], {"summary": "Returns detailed information about all commands.", "group": "server"},
            default=introspection.cmd_command, acl=CONNECTION, help_acl=CONNECTION),
        *rule_check_commands(),
        *window_commands(),
        rule_container(),
        rls_container(),
        container("config", -2, (), [
            sub("config", "get", -3, config.cmd_config_get,
                "Returns the effective values of settings.", config_flags,
                arguments=[("parameter", "string")], acl=ADMIN),
            sub("config", "set", -4, config.cmd_config_set, "Sets settings at runtime.",
                config_flags, arguments=[("parameter", "string"), ("value", "string")],
                acl=ADMIN),
            sub("config", "rewrite", 2, config.cmd_config_rewrite,
                "Writes the running settings into the config file.",
                flags=("admin", "noscript", "loading", "stale"), acl=ADMIN),
            sub("config", "resetstat", 2, config.cmd_config_resetstat,
                "Resets the server's statistics.", config_flags, acl=ADMIN),
        ], {"summary": "A container for server configuration commands.", "group": "server"}),
        container("function", -2, (), [
            sub("function", "flush", -2, server.cmd_function_flush,
                "Deletes all functions (fastlimit has none).",
                ("write", "noscript"), [("flush-type", "string", {"optional": True})],
                acl=("@write", "@slow", "@scripting")),
        ], {"summary": "A container for function commands.", "group": "scripting"},
            acl=("@slow",)),
        acl_container(),
        hotkeys_container(),
        *pubsub_commands(),
        *cluster_commands(),
    ]
    return {c.name.encode(): c for c in commands}


ADMIN = ("@admin", "@slow", "@dangerous")
CONNECTION = ("@slow", "@connection")


def client_container() -> Command:
    """CLIENT, with Redis 7.0's flags and categories per subcommand (the
    admin ones stay out of MONITOR, as in Redis)."""
    admin = ADMIN + ("@connection",)
    admin_flags = ("admin", "noscript", "loading", "stale")
    return container("client", -2, ("sentinel",), [
        sub("client", "id", 2, client.cmd_client_id, "Returns the connection's unique ID.",
            acl=CONNECTION),
        sub("client", "getname", 2, client.cmd_client_getname,
            "Returns the connection's name.", acl=CONNECTION),
        sub("client", "setname", 3, client.cmd_client_setname, "Sets the connection's name.",
            arguments=[("connection-name", "string")], acl=CONNECTION),
        sub("client", "setinfo", 4, client.cmd_client_setinfo,
            "Sets information specific to the client library.",
            arguments=[("attr", "string"), ("value", "string")], acl=CONNECTION),
        sub("client", "list", -2, client.cmd_client_list, "Lists open connections.",
            admin_flags, acl=admin),
        sub("client", "info", 2, client.cmd_client_info,
            "Returns information about this connection.", acl=CONNECTION),
        sub("client", "kill", -3, client.cmd_client_kill, "Terminates open connections.",
            admin_flags, acl=admin),
        sub("client", "reply", 3, client.cmd_client_reply,
            "Instructs the server whether to reply to commands.",
            arguments=[("on|off|skip", "string")], acl=CONNECTION),
        sub("client", "no-evict", 3, client.cmd_client_ok, "Accepted for compatibility.",
            admin_flags, acl=admin),
        sub("client", "no-touch", 3, client.cmd_client_ok, "Accepted for compatibility.",
            acl=CONNECTION),
    ], {"summary": "A container for client connection commands.", "group": "connection"},
        help_acl=CONNECTION)


def hotkeys_container() -> Command:
    """HOTKEYS, with Redis 8.6's subcommands and categories (hotkeys/commands.py)."""
    admin_flags = ("admin", "noscript", "loading", "stale")

    def admin(name, arity, handler, summary, arguments=()):
        return sub("hotkeys", name, arity, handler, summary, admin_flags, arguments, acl=ADMIN)

    return container("hotkeys", -2, (), [
        admin("start", -2, hotkeys.cmd_hotkeys_start, "Starts hotkeys tracking.",
              # a block has its arguments: redis-cli crashes on one without
              [("metrics", "block", {"token": "METRICS", "arguments": [
                  ("count", "integer"), ("ops", "pure-token", {"token": "OPS"})]}),
               ("k", "integer", {"token": "COUNT", "optional": True}),
               ("seconds", "integer", {"token": "DURATION", "optional": True}),
               ("ratio", "integer", {"token": "SAMPLE", "optional": True})]),
        admin("stop", 2, hotkeys.cmd_hotkeys_stop, "Stops hotkeys tracking (the results stay "
              "available to GET)."),
        admin("get", 2, hotkeys.cmd_hotkeys_get, "Returns the top keys by checks per second "
              "and the tracking's metadata."),
        admin("reset", 2, hotkeys.cmd_hotkeys_reset, "Drops the results and goes back to "
              "continuous tracking (a session must have been stopped)."),
    ], {"summary": "A container for hotkeys tracking commands.", "group": "server",
        "since": "8.6.0"}, acl=("@slow",))


def acl_container() -> Command:
    """ACL, with Redis 7.0's arity, flags and categories."""
    admin_flags = ("admin", "noscript", "loading", "stale", "sentinel")
    flags = ("noscript", "loading", "stale", "sentinel")
    slow = ("@slow",)

    def admin(name, arity, handler, summary, arguments=()):
        return sub("acl", name, arity, handler, summary, admin_flags, arguments, acl=ADMIN)

    return container("acl", -2, ("sentinel",), [
        sub("acl", "cat", -2, acl.cmd_acl_cat,
            "Lists the ACL categories, or the commands inside a category.", flags,
            [("category", "string", {"optional": True})], acl=slow),
        admin("deluser", -3, acl.cmd_acl_deluser, "Deletes ACL users, and terminates their "
              "connections.", [("username", "string")]),
        admin("dryrun", -4, acl.cmd_acl_dryrun, "Simulates the execution of a command by a "
              "user, without executing the command.",
              [("username", "string"), ("command", "string")]),
        sub("acl", "genpass", -2, acl.cmd_acl_genpass, "Generates a pseudorandom, secure "
            "password that can be used to identify ACL users.", flags,
            [("bits", "integer", {"optional": True})], acl=slow),
        admin("getuser", 3, acl.cmd_acl_getuser, "Lists the ACL rules of a user.",
              [("username", "string")]),
        admin("list", 2, acl.cmd_acl_list, "Dumps the effective rules in ACL file format."),
        admin("load", 2, acl.cmd_acl_load, "Reloads the rules from the configured ACL file."),
        admin("log", -2, acl.cmd_acl_log, "Lists recent security events generated due to ACL "
              "rules.", [("count", "integer", {"optional": True})]),
        admin("save", 2, acl.cmd_acl_save, "Saves the effective ACL rules in the configured "
              "ACL file."),
        admin("setuser", -3, acl.cmd_acl_setuser, "Creates and modifies an ACL user and its "
              "rules.", [("username", "string"), ("rule", "string", {"optional": True})]),
        admin("users", 2, acl.cmd_acl_users, "Lists all ACL users."),
        sub("acl", "whoami", 2, acl.cmd_acl_whoami,
            "Returns the authenticated username of the current connection.", flags, acl=slow),
    ], {"summary": "A container for Access List Control commands.", "group": "server",
        "since": "0.7.0"})


def cluster_commands() -> list[Command]:
    """CLUSTER and the connection commands cluster clients send, with
    Redis 7.0's arity, flags and ACL categories."""
    stale = ("stale",)
    shown = ("loading", "stale")
    slow = ("@slow",)
    connection_flags = ("fast", "loading", "stale")
    admin = ("@admin", "@slow", "@dangerous")
    admin_flags = ("admin", "noscript", "loading", "stale")

    def connection_command(name, handler, summary):
        return command(name, 1, connection_flags, handler, acl=("@fast", "@connection"),
                       group="cluster", since="0.6.0", summary=summary)

    return [
        container("cluster", -2, (), [
            sub("cluster", "slots", 2, cluster.cmd_cluster_slots,
                "Returns the mapping of cluster slots to nodes.", shown, acl=slow),
            sub("cluster", "shards", 2, cluster.cmd_cluster_shards,
                "Returns the mapping of cluster slots to shards.", shown, acl=slow),
            sub("cluster", "nodes", 2, cluster.cmd_cluster_nodes,
                "Returns the cluster configuration for a node.", stale, acl=slow),
            sub("cluster", "info", 2, cluster.cmd_cluster_info,
                "Returns information about the state of a node.", stale, acl=slow),
            sub("cluster", "myid", 2, cluster.cmd_cluster_myid, "Returns the ID of a node.",
                stale, acl=slow),
            sub("cluster", "keyslot", 3, cluster.cmd_cluster_keyslot,
                "Returns the hash slot for a key.", stale, [("key", "string")], acl=slow),
            sub("cluster", "countkeysinslot", 3, cluster.cmd_cluster_countkeysinslot,
                "Returns the number of keys in a hash slot.", stale,
                [("slot", "integer")], acl=slow),
            sub("cluster", "getkeysinslot", 4, cluster.cmd_cluster_getkeysinslot,
                "Returns the key names in a hash slot.", stale,
                [("slot", "integer"), ("count", "integer")], acl=slow),
        ], {"summary": "A container for Redis Cluster commands.", "group": "cluster",
            "since": "0.6.0"}, acl=slow),
        container("cl.cluster", -2, (), [
            sub("cl.cluster", "map", 2, cluster.cmd_cl_cluster_map,
                "Returns the running slot map (TOML).", shown, acl=admin),
            sub("cl.cluster", "setmap", 3, cluster.cmd_cl_cluster_setmap,
                "Installs a newer slot map on this node.", admin_flags,
                [("map", "string")], acl=admin),
            sub("cl.cluster", "push", 3, cluster.cmd_cl_cluster_push,
                "Installs a newer slot map here and on every node of the cluster.",
                admin_flags, [("map", "string")], acl=admin),
            sub("cl.cluster", "versions", 2, cluster.cmd_cl_cluster_versions,
                "Returns [slot map version, rules version, rules origin].", shown, acl=admin),
            sub("cl.cluster", "rules", 2, cluster.cmd_cl_cluster_rules,
                "Returns [rules version, origin, rules] for a peer to catch up.", shown,
                acl=admin),
            sub("cl.cluster", "setrules", 5, cluster.cmd_cl_cluster_setrules,
                "Takes a newer cluster-wide rule set (sent by the node a rule changed on).",
                admin_flags, [("version", "integer"), ("origin", "string"),
                              ("rules", "string")], acl=admin),
            sub("cl.cluster", "move", 4, cluster.cmd_cl_cluster_move,
                "Moves a slot range from this primary to another shard (copy, pause, flip).",
                admin_flags, [("range", "string"), ("shard", "string")], acl=admin),
            sub("cl.cluster", "movestatus", 2, cluster.cmd_cl_cluster_movestatus,
                "Returns the state of the running or last slot move.", shown, acl=admin),
            sub("cl.cluster", "import", 3, cluster.cmd_cl_cluster_import,
                "Loads buckets of slots moving here (sent by CL.CLUSTER MOVE).",
                admin_flags, [("data", "string")], acl=admin),
        ], {"summary": "Slot maps and rules handed between the nodes of a fastlimit cluster.",
            "group": "cluster", "since": "0.6.0"}, acl=admin),
        # no-auth as AUTH is: it is how a node authenticates
        container("cl.peerauth", -2, ("noscript", "loading", "stale", "no-auth"), [
            sub("cl.peerauth", "challenge", 2, cluster.cmd_cl_peerauth_challenge,
                "Returns a challenge for a calling node to answer (this connection's, for "
                "10 s).", acl=("@slow", "@connection")),
            sub("cl.peerauth", "prove", 6, cluster.cmd_cl_peerauth_prove,
                "Authenticates a calling node as cluster-user by its answer to the "
                "challenge; returns this node's own proof.", arguments=[
                    ("username", "string"), ("challenge", "string"), ("nonce", "string"),
                    ("proof", "string")], acl=("@slow", "@connection")),
        ], {"summary": "How the nodes of a fastlimit cluster prove to each other that they "
                       "know cluster-user's password, without sending it.",
            "group": "cluster", "since": "0.6.0"}, acl=("@slow", "@connection")),
        connection_command("readonly", cluster.cmd_readonly,
                           "Enables read-only queries for a connection to a replica node."),
        connection_command("readwrite", cluster.cmd_readwrite,
                           "Enables read-write queries for a connection to a replica node."),
        connection_command("asking", cluster.cmd_asking,
                           "Signals that a cluster client is following an -ASK redirect."),
    ]


def pubsub_commands() -> list[Command]:
    """Pub/Sub, with Redis 7.0's arity, flags and ACL categories."""
    listen = ("pubsub", "noscript", "loading", "stale")
    read = ("pubsub", "loading", "stale")
    slow = ("@pubsub", "@slow")

    def listener(name, arity, handler, summary, what):
        return command(name, arity, listen, handler, acl=slow, when_subscribed=True,
                       group="pubsub", since="0.5.0", complexity=f"O(N) where N is the "
                       f"number of {what}s.", summary=summary,
                       arguments=[(what, "string", {"optional": arity == -1})])

    return [
        listener("subscribe", -2, pubsub.cmd_subscribe,
                 "Listens for messages published to the given channels.", "channel"),
        listener("unsubscribe", -1, pubsub.cmd_unsubscribe,
                 "Stops listening to the given channels (all when none is given).", "channel"),
        listener("psubscribe", -2, pubsub.cmd_psubscribe,
                 "Listens for messages published to channels matching the patterns.",
                 "pattern"),
        listener("punsubscribe", -1, pubsub.cmd_punsubscribe,
                 "Stops listening to the given patterns (all when none is given).", "pattern"),
        command("publish", 3, read + ("fast",), pubsub.cmd_publish, acl=("@pubsub", "@fast"),
                group="pubsub", since="0.5.0",
                complexity="O(N+M) where N is the channel's subscribers and M the patterns.",
                summary="Posts a message to a channel; replies with the number of receivers.",
                arguments=[("channel", "string"), ("message", "string")]),
        container("pubsub", -2, (), [
            sub("pubsub", "channels", -2, pubsub.cmd_pubsub_channels,
                "Returns the active channels, or those matching a pattern.", read,
                [("pattern", "pattern", {"optional": True})], acl=slow),
            sub("pubsub", "numsub", -2, pubsub.cmd_pubsub_numsub,
                "Returns the count of subscribers of channels.", read,
                [("channel", "string", {"optional": True})], acl=slow),
            sub("pubsub", "numpat", 2, pubsub.cmd_pubsub_numpat,
                "Returns the count of unique patterns subscribed to.", read, acl=slow),
        ], {"summary": "A container for Pub/Sub commands.", "group": "pubsub", "since": "0.5.0"},
            acl=("@slow",)),
    ]


def rule_check_commands() -> list[Command]:
    """CL.APPLY, CL.ACQUIRE and CL.RELEASE for the command table."""

    return [
        ratelimit_command("cl.apply", -3, rules.cmd_apply,
                          "Checks the named rules all or nothing; replies like CL.LIMIT.",
                          [("rule_ids", "string"), ("client_key", "key")], replica_peeks=True),
        ratelimit_command("cl.acquire", -3, rules.cmd_acquire,
                          "Takes a lease of a concurrency rule: [allowed, limit, remaining, "
                          "retry_after_ms, lease_id].",
                          [("rule_id", "string"), ("client_key", "key")]),
        ratelimit_command("cl.release", -4, rules.cmd_release,
                          "Gives a concurrency lease back. Replies 1 if it was held.",
                          [("rule_id", "string"), ("client_key", "key"),
                           ("lease_id", "integer")]),
    ]


def window_commands() -> list[Command]:
    """The `limits` library's windowed counters (windows/commands.py)."""
    def windowed(name, arity, handler, summary, arguments):
        # a replica answers their reads (amount 0: a strategy's test and stats)
        return command(name, arity, ("write", "denyoom", "fast"), handler, keys=(1, 1, 1),
                       replica_peeks=True,
                       acl=("@write", "@fast", "@ratelimit"), group="ratelimit", since="0.6.0",
                       summary=summary, arguments=arguments)
    amount = ("amount", "integer", {"optional": True})
    return [
        windowed("cl.fixed", -3, windows.cmd_fixed,
                 "Adds to a counter whose window starts at its first increment: "
                 "[count, expire_at_ms].",
                 [("key", "key"), ("window_ms", "integer"), amount]),
        windowed("cl.moving", -4, windows.cmd_moving,
                 "Logs amount entries if the moving window has room: "
                 "[allowed, start_ms, count].",
                 [("key", "key"), ("limit", "integer"), ("window_ms", "integer"), amount]),
        windowed("cl.sliding", -4, windows.cmd_sliding,
                 "Sliding window counter: [allowed, previous, previous_ttl_ms, current, "
                 "current_ttl_ms].",
                 [("key", "key"), ("limit", "integer"), ("window_ms", "integer"), amount]),
        # a change, as CL.RESET: not in @ratelimit, which is the checks only
        command("cl.winclear", -2, ("write", "fast"), windows.cmd_winclear, keys=(1, -1, 1),
                acl=("@write", "@admin", "@fast", "@dangerous"), group="ratelimit",
                since="0.6.0",
                summary="Forgets windowed counters; replies how many records went.",
                arguments=[("key", "key", {"multiple": True})]),
        command("cl.winflush", 2, ("write",), windows.cmd_winflush,
                acl=("@write", "@slow", "@dangerous"), group="ratelimit", since="0.6.0",
                summary="Forgets every windowed counter whose key starts with prefix.",
                arguments=[("prefix", "string")]),
    ]


def rule_subcommands() -> list[Command]:

    write = ("write", "noscript")
    read = ("readonly", "loading", "stale")
    # Rule changes are the operators' (as CONFIG SET); reading them is
    # anyone's; denials name other clients' keys, so they are the operators'.
    change = ("@write", "@admin", "@slow", "@dangerous")
    look = ("@read", "@slow")
    return [
        sub("cl.rule", "set", 4, cluster.cluster_wide(rules.cmd_rule_set),
            "Creates or replaces a named rule from its JSON document.", write,
            [("id", "string"), ("rule", "string")], acl=change),
        sub("cl.rule", "get", 3, rules.cmd_rule_get,
            "Returns a rule's JSON document, or null.", read, [("id", "string")], acl=look),
        sub("cl.rule", "del", 3, cluster.cluster_wide(rules.cmd_rule_del),
            "Deletes a rule and drops its buckets. Replies 1 if it existed.", write,
            [("id", "string")], acl=change),
        sub("cl.rule", "list", 2, rules.cmd_rule_list, "Returns the ids of all rules.", read,
            acl=look),
        sub("cl.rule", "reload", 2, cluster.cluster_wide(rules.cmd_rule_reload),
            "Re-reads the rules file, all or nothing.", write, acl=change),
        sub("cl.rule", "stats", -2, rules.cmd_rule_stats,
            "Returns allowed, denied and shadow-denied counts per rule.", read,
            [("id", "string", {"optional": True})], acl=look),
        sub("cl.rule", "denials", -2, rules.cmd_rule_denials,
            "Returns recent denials: [time_ms, rule_id, key, cost], newest first.", read,
            [("count", "integer", {"optional": True})], acl=ADMIN),
    ]


def rule_container() -> Command:

    return container("cl.rule", -2, (), rule_subcommands(),
                     {"summary": "A container for named rule commands.",
                      "group": "ratelimit", "since": "0.2.0"})


def rls_container() -> Command:
    """CL.RLS: the Envoy rate limit service's domains (rls/commands.py)."""
    read = ("readonly", "loading", "stale")
    return container("cl.rls", -2, (), [
        sub("cl.rls", "list", -2, rls.cmd_rls_list,
            "Lists the rate limit service's limits, of one domain or all.", read,
            [("domain", "string", {"optional": True})], acl=("@read", "@slow")),
        sub("cl.rls", "describe", -4, rls.cmd_rls_describe,
            "Answers as ShouldRateLimit would for one descriptor, without counting it.",
            read, [("domain", "string"), ("entry", "string")], acl=("@read", "@slow")),
    ], {"summary": "A container for the Envoy rate limit service's commands.",
        "group": "ratelimit", "since": "0.6.0"})
