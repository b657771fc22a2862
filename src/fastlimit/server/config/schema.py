"""Every setting, declared once: a field of Settings whose metadata (see
setting()) says how its values are read and shown, whether CONFIG SET may
change it, and its help.  The command line (cli.py), the config file
(file.py), CONFIG GET/SET/REWRITE (runtime.py, file.py) and the README's
settings tables (checked by tests/server/test_settings_declared_once.py)
are derived from these declarations.

The order of the fields is the order CONFIG GET * answers in, --help lists
and a rewritten file adds settings in.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, TypeVar

from fastlimit.regions.shares import PeerAddress
from fastlimit.server.config.values import (
    ADDRESSES,
    BOOL,
    DEFAULT_OUTPUT_LIMITS,
    FRONT_PORT,
    LOGLEVELS,
    OPTIONAL_TEXT,
    OUTPUT_LIMITS,
    RULES_STORE,
    SECRET,
    TEXT,
    ConfigError,
    Kind,
    UnknownSetting,
    integer,
    is_loopback,
    memory,
    number,
    parse_announce_ip,
    parse_backoff,
    parse_loglevel,
    parse_policy,
    parse_region,
    parse_region_peers,
    parse_regions,
    parse_replicaof,
    parse_shards,
    parse_tls_auth_clients,
    parse_tls_ciphersuites,
    parse_tls_protocols,
    parse_xds_server,
    show_optional,
    show_region_peers,
)

DEFAULT_PORT = 6380
# The fronts' ports, when not given, follow the RESP port as Redis's cluster
# bus port follows its port (port + 10000), so that two servers on one
# machine need only different ports.  The offsets keep 6380's 8380 and
# 8081, envoyproxy/ratelimit's gRPC port, which Envoy's configs point at.
FRONT_PORT_OFFSETS = {"http-port": 2000, "grpc-port": 1701}
# Files of one server's own state: on another port than DEFAULT_PORT (and
# 0), their names carry the port, for the same reason.
DEFAULT_SNAPSHOT_FILE = "fastlimit.snap"
DEFAULT_RULES_DB = "fastlimit-rules.db"
PORT_NAMED_FILES = {"snapshot-file": DEFAULT_SNAPSHOT_FILE, "rules-db": DEFAULT_RULES_DB}


def file_for_port(default: str, port: int | str) -> str:
    """A state file's default name for a server on port: fastlimit.snap on
    6380 (and port 0), fastlimit-6381.snap on 6381 (fastlimit-<port>.snap
    for the port "<port>", as the help says it)."""
    if port in (DEFAULT_PORT, 0):
        return default
    stem, ext = os.path.splitext(default)
    return f"{stem}-{port}{ext}"


@dataclass(frozen=True)
class Spec:
    """One setting's declaration, but for its name and type (the field's).
    ``at_runtime`` is the stricter kind CONFIG SET reads it with, when it
    has one; ``shown`` the default in words where the value does not say it
    (a default of none that means something); ``metavar``, ``nargs``,
    ``choices`` and ``switch`` (a flag that takes no value) are how the
    command line takes it."""

    default: Any
    kind: Kind
    runtime: bool
    help: str
    at_runtime: Kind | None = None
    shown: str | None = None
    metavar: str | tuple[str, ...] | None = None
    nargs: int | str | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False

    def default_words(self) -> str:
        """The default as --help and the README say it ("none": not set)."""
        if self.shown is not None:
            return self.shown
        return "none" if self.default is None else self.kind.describe(self.default)


SPEC = "fastlimit.setting"
T = TypeVar("T")


def setting(default: T, kind: Kind, *, runtime: bool, help: str, at_runtime: Kind | None = None,
            shown: str | None = None, metavar: str | tuple[str, ...] | None = None,
            nargs: int | str | None = None, choices: tuple[str, ...] | None = None,
            switch: bool = False) -> T:
    """A Settings field and its declaration (see Spec).  help may say
    where the default goes with ``{default}``; without it the default is
    added at the end (see cli.help_text)."""
    metadata = {SPEC: Spec(default, kind, runtime, help, at_runtime, shown, metavar, nargs,
                           choices, switch)}
    if isinstance(default, (list, dict)):      # each Settings its own
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default),
                                 metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _front_port_help(name: str, what: str, none: str) -> str:
    offset = FRONT_PORT_OFFSETS[name]
    return (f"{what} (default {{default}}, {DEFAULT_PORT + offset} beside {DEFAULT_PORT}; "
            f"0: {none})")


def _port_named_help(name: str, what: str, empty: str) -> str:
    pattern = file_for_port(PORT_NAMED_FILES[name], "<port>")
    return f"{what} (default {{default}}, on another port than {DEFAULT_PORT} {pattern}; {empty})"


MEGABYTE = 1024**2

@dataclass
class Settings:
    bind: list[str] = setting(
        ["127.0.0.1"], ADDRESSES, runtime=True, metavar="ADDR", nargs="+",
        help="addresses to listen on")
    port: int = setting(
        DEFAULT_PORT, integer(0, 65535), runtime=True,
        help="TCP port (default {default}; 0 picks a free one)")
    requirepass: bytes | None = setting(
        None, SECRET, runtime=True,
        help="the default user's password, which clients AUTH with")
    aclfile: str | None = setting(
        None, OPTIONAL_TEXT, runtime=False, metavar="PATH",
        help="ACL users, one 'user <name> <rules>' line each (Redis's format), loaded at "
             "start and by ACL LOAD, written by ACL SAVE")
    acllog_max_len: int = setting(
        128, integer(0, 2**31 - 1), runtime=True,
        help="entries ACL LOG keeps")
    protected_mode: bool = setting(
        True, BOOL, runtime=True,
        help="while the default user has no password, refuse clients from other addresses "
             "than 127.0.0.1 and ::1")
    shards: int = setting(
        256, Kind(parse_shards, metavar="N"), runtime=False,
        help="bucket table shards, a power of two")
    manual_clock: bool = setting(
        False, BOOL, runtime=False, switch=True,
        help="tests: start the clock at 0 and move it only with DEBUG CLOCK")
    maxclients: int = setting(
        10000, integer(1, 1_000_000), runtime=True,
        help="connections at once, RESP, HTTP and gRPC together")
    # CONFIG SET may not take these three below Redis's minimums: a lower
    # value can leave no command that fits (proto-max-bulk-len 1, a query
    # buffer of 0, max-multibulk-len below "CONFIG SET x y"), and only a
    # restart would undo it.  The command line and config file may go lower.
    proto_max_bulk_len: int = setting(
        512 * MEGABYTE, memory(1), runtime=True, at_runtime=memory(MEGABYTE),
        help="longest bulk string accepted")
    max_multibulk_len: int = setting(
        1024 * 1024, integer(1, 2**31 - 1), runtime=True, at_runtime=integer(1024, 2**31 - 1),
        help="most arguments in one command")
    client_query_buffer_limit: int = setting(
        1024 * MEGABYTE, memory(), runtime=True, at_runtime=memory(MEGABYTE),
        help="a client whose unparsed input grows past this is disconnected")
    client_output_buffer_limit: dict[str, tuple[int, int, int]] = setting(
        DEFAULT_OUTPUT_LIMITS, OUTPUT_LIMITS, runtime=True, metavar="LIMIT", nargs="+",
        help="[CLASS] HARD SOFT SECONDS, repeated per class (normal, replica, pubsub); "
             "without a class, normal")
    hz: int = setting(
        10, integer(1, 500), runtime=True,
        help="background task frequency")
    sweep_budget_ms: float = setting(
        1.0, number(0, 100, above_low=True), runtime=True,
        help="time per tick for dropping idle buckets")
    denial_log_seconds: float = setting(
        10.0, number(0, 86400, above_low=True), runtime=True,
        help="denials by rules are logged as one line at most this often")
    snapshot_file: str | None = setting(
        DEFAULT_SNAPSHOT_FILE, OPTIONAL_TEXT, runtime=False, metavar="PATH",
        help=_port_named_help("snapshot-file", "buckets are saved here at shutdown, by "
                              "SAVE/BGSAVE and every save-seconds, and loaded at start",
                              "'' for none"))
    save_seconds: int = setting(
        0, integer(0, 10**9), runtime=True,
        help="BGSAVE this often (default {default}: only at shutdown and on request)")
    loglevel: str = setting(
        "notice", Kind(parse_loglevel), runtime=True, choices=tuple(sorted(LOGLEVELS)),
        help="how much is logged, to stderr")
    # Not a setting: the file --config named (CONFIG REWRITE writes it).
    config_file: str | None = None
    # Not a setting: --takeover's socket, where the running server this one
    # replaces hands over (takeover/); once, at start.
    takeover_from: str | None = None
    rules_db: str | None = setting(
        DEFAULT_RULES_DB, OPTIONAL_TEXT, runtime=False, metavar="PATH",
        help=_port_named_help("rules-db", "SQLite file the named rules are kept in",
                              "'' keeps them in memory only"))
    rules_store: str = setting(
        "", RULES_STORE, runtime=False, metavar="URI", shown="sqlite:<rules-db>",
        help="where the named rules live: sqlite:<file> (the same as rules-db <file>), or a "
             "PostgreSQL URI (postgresql://user:password@host:port/db, as libpq reads it) "
             "whose table every node of a fleet follows through LISTEN/NOTIFY; rules-db is "
             "then this node's cache of the last rules applied")
    rules_store_resync: float = setting(
        30.0, number(0.05, 86400), runtime=True,
        help="seconds between full compares with a PostgreSQL rules-store, the backstop for "
             "notifications lost")
    rules_store_heartbeat: float = setting(
        5.0, number(0.05, 3600), runtime=True,
        help="seconds between round trips on the PostgreSQL listener's connection, which "
             "find a connection that went silent")
    rules_store_timeout: float = setting(
        2.0, number(0.01, 600), runtime=False,
        help="seconds a PostgreSQL rules-store has to connect or to answer one statement")
    rules_store_required: bool = setting(
        False, BOOL, runtime=False,
        help="refuse to start when the PostgreSQL rules-store cannot be reached and no rules "
             "are cached in rules-db")
    rules_store_max_staleness: float = setting(
        0.0, number(0, 10**9), runtime=True,
        help="/readyz reports not ready once the PostgreSQL rules-store has been out of "
             "reach this many seconds (default {default}: always ready)")
    rules_file: str | None = setting(
        None, OPTIONAL_TEXT, runtime=False, metavar="PATH",
        help="TOML or JSON rules file, loaded at start and reloaded on SIGHUP and "
             "CL.RULE RELOAD")
    replicaof: tuple[str, int] | None = setting(
        None, Kind(parse_replicaof, lambda v: f"{v[0]} {v[1]}" if v else ""), runtime=False,
        metavar=("HOST", "PORT"), nargs=2,
        help="start as a read-only replica of this primary")
    masterauth: bytes | None = setting(
        None, SECRET, runtime=True,
        help="password a replica AUTHs to its primary with: the default user's "
             "(requirepass), or masteruser's")
    masteruser: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True, metavar="USER",
        help="the primary's ACL user a replica AUTHs as (AUTH <user> <masterauth>), which "
             "needs +cl.sync +replconf")
    replica_priority: int = setting(
        100, integer(0, 2**31 - 1), runtime=True,
        help="Sentinel promotes the replica with the lowest priority first; 0: never")
    replica_announce_ip: str | None = setting(
        None, Kind(parse_announce_ip, show_optional), runtime=True, metavar="ADDR",
        help="address a replica asks its primary to list it under (INFO replication), where "
             "Sentinel finds it (default {default}: the link's own)")
    replica_announce_port: int = setting(
        0, integer(0, 65535), runtime=True,
        help="port a replica asks its primary to list it under (default {default}: the port "
             "it listens on)")
    replica_announced: bool = setting(
        True, BOOL, runtime=True,
        help="whether Sentinel lists this replica")
    repl_user: str = setting(
        "replica", TEXT, runtime=True, metavar="USER",
        help="the ACL user repl-password makes for replicas")
    repl_password: bytes | None = setting(
        None, SECRET, runtime=True,
        help="makes repl-user an ACL user with this password that may only replicate "
             "(+cl.sync +replconf), and the only one CL.SYNC serves (default {default})")
    repl_max_full_copies: int = setting(
        2, integer(1, 64), runtime=True,
        help="full copies (a fork and a dataset-sized memory file each) in flight at once; "
             "replicas arriving meanwhile share one")
    repl_timeout: int = setting(
        60, integer(1, 86400), runtime=True,
        help="seconds of silence after which a replication link is dropped")
    repl_flush_ms: float = setting(
        2.0, number(0.1, 1000), runtime=True,
        help="a primary sends changed buckets to its replicas this often")
    repl_buffer_limit: int = setting(
        256 * MEGABYTE, memory(1024), runtime=True,
        help="unsent replication output per replica (beyond its full copy) past which it is "
             "dropped and resyncs")
    takeover_socket: str | None = setting(
        None, OPTIONAL_TEXT, runtime=False, metavar="PATH",
        help="a Unix socket where a new fastlimit-server started with --takeover PATH takes "
             "over this one's listeners and buckets (README, 'Upgrades without a restart')")
    rules_cache_size: int = setting(
        16 * MEGABYTE, memory(0, 2**40), runtime=True,
        help="bytes the CL.LIMIT match cache may hold (default {default}; 0: no cache)")
    maxmemory: int = setting(
        0, memory(), runtime=True,
        help="bytes the bucket tables may hold (e.g. 200mb; default {default}: no bound)")
    maxmemory_policy: str = setting(
        "nearest-full", Kind(parse_policy), runtime=True, metavar="POLICY",
        help="at the bound: nearest-full evicts the sampled bucket least spent for its limit, "
             "allkeys-random any, noeviction refuses new buckets with -OOM")
    maxmemory_samples: int = setting(
        5, integer(1, 64), runtime=True,
        help="buckets looked at per eviction")
    hotkeys_top_k: int = setting(
        32, integer(0, 1024), runtime=True,
        help="counters of the hot-key tracker (HOTKEYS GET, INFO hotkeys): the keys checked "
             "most often, estimated in fixed memory (0: off)")
    hotkeys_sample: int = setting(
        16, integer(1, 1000000), runtime=True,
        help="the hot-key tracker counts one check in this many, on average")
    hotkeys_metrics_keys: int = setting(
        0, integer(0, 1024), runtime=True,
        help="hot keys /metrics names in fastlimit_hotkey_ops_per_second (0: none, only "
             "the counts)")
    shed_threshold: int = setting(
        90, integer(0, 100), runtime=True,
        help="the loop thread's busy percent at which the node is saturated: it sheds "
             "PRIORITY low checks and reads critical connections first (0: never sheds)")
    shed_lag_ms: int = setting(
        5, integer(1, 60000), runtime=True,
        help="a loop turn, or held-back input, this late also means saturated")
    shed_normal_lag_ms: int = setting(
        0, integer(0, 60000), runtime=True,
        help="a loop turn, or held-back input, this late for 100 ms sheds normal checks too, "
             "which then pass uncounted if they fail open (e.g. 20; default {default}: "
             "normal checks are never shed; critical ones never are)")
    region: str | None = setting(
        None, Kind(parse_region, show_optional), runtime=False, metavar="NAME",
        help="this tier's region: a static rule enforces this region's share of its limit "
             "(default {default}: no regions, every rule whole)")
    regions: list[str] = setting(
        [], Kind(parse_regions, " ".join), runtime=False, metavar="NAME", nargs="+",
        shown="the region alone",
        help="every region of the fleet, this one among them, the same in each: a static "
             "rule without shares gives each an equal share (default {default})")
    region_peers: dict[str, PeerAddress] = setting(
        {}, Kind(parse_region_peers, show_region_peers), runtime=True,
        metavar="REGION=HOST:PORT", nargs="+", shown="none",
        help="where each other region's tier is reached (or sentinel:SERVICE@HOST:PORT,... "
             "for one whose primary Sentinel watches, cluster:HOST:PORT,... for one that is "
             "a cluster): this tier links to each (default {default})")
    region_user: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True, metavar="USER",
        help="the ACL user this tier's region links AUTH as at the peers (which needs "
             "+cl.regionsync; repl-user has it), with region-password")
    region_password: bytes | None = setting(
        None, SECRET, runtime=True,
        help="the password the region links AUTH with (region-user's, else the default "
             "user's)")
    region_sync_ms: int = setting(
        50, integer(1, 60_000), runtime=True,
        help="a global rule's spends are sent to the peer regions this often")
    region_partition_ms: int = setting(
        1000, integer(1, 3_600_000), runtime=True,
        help="a peer region unreachable this long puts global rules under their partition "
             "policy (a static share, or the whole limit)")
    region_home_timeout_ms: int = setting(
        1000, integer(1, 60_000), runtime=True,
        help="a home rule's check asked of its home region that has no answer in this long "
             "is answered by its rules' failure policy")
    region_rebalance_ms: int = setting(
        1000, integer(10, 3_600_000), runtime=True,
        help="rebalanced static rules: each region sends its demand to the first region, "
             "which moves the shares, this often")
    region_rebalance_step: int = setting(
        100, integer(1, 1000), runtime=True,
        help="the most a rebalanced share moves in one round, in thousandths of the rule")
    region_buffer_limit: int = setting(
        64 * MEGABYTE, memory(1024), runtime=True,
        help="unacknowledged spends kept per peer region while its link is down or slow; "
             "past it the oldest are dropped (INFO regions counts them)")
    tls_regions: bool = setting(
        False, BOOL, runtime=False,
        help="the region links connect to the peers' tls-port over TLS")
    cluster_enabled: bool = setting(
        False, BOOL, runtime=False,
        help="serve the hash slots the slot map gives this node's shard, and redirect the "
             "others with -MOVED")
    cluster_config_file: str | None = setting(
        None, OPTIONAL_TEXT, runtime=False, metavar="PATH",
        help="the slot map (TOML), needed with cluster-enabled")
    cluster_announce_ip: str | None = setting(
        None, Kind(parse_announce_ip, show_optional), runtime=True, metavar="ADDR",
        help="this node's address in the slot map and in CLUSTER replies (default "
             "{default}: the first bind address)")
    cluster_announce_port: int = setting(
        0, integer(0, 65535), runtime=True,
        help="this node's port there (default {default}: the port it listens on)")
    cluster_sentinel_password: bytes | None = setting(
        None, SECRET, runtime=False,
        help="password of the map's sentinels, when they require one")
    cluster_user: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True, metavar="NAME",
        help="the ACL user the nodes of a cluster call each other as")
    cluster_password: bytes | None = setting(
        None, SECRET, runtime=True,
        help="cluster-user's password, which each node proves it knows without sending it "
             "(CL.PEERAUTH); needed unless bound to loopback only")
    http_port: int | None = setting(
        None, FRONT_PORT, runtime=False, shown=f"port + {FRONT_PORT_OFFSETS['http-port']}",
        help=_front_port_help("http-port", "HTTP port for the JSON check and rule APIs, "
                              "/metrics, health and the status page, on the bind addresses",
                              "no HTTP"))
    http_metrics_auth: bool = setting(
        True, BOOL, runtime=True,
        help="with requirepass, /metrics needs it too")
    http_max_header_bytes: int = setting(
        16 * 1024, memory(1024, MEGABYTE), runtime=True,
        help="request line and headers past this get 431")
    http_max_body_bytes: int = setting(
        MEGABYTE, memory(1024, 512 * MEGABYTE), runtime=True,
        help="request bodies past this get 413")
    http_header_timeout: float = setting(
        10.0, number(0, 3600, above_low=True), runtime=True,
        help="seconds a request's headers may take to arrive before 408, and a gRPC "
             "client's HTTP/2 preface before it is closed; also the most between two reads "
             "of an HTTP body, for an idle keep-alive connection and for a client that "
             "reads none of its responses")
    http_body_timeout: float = setting(
        60.0, number(0, 3600, above_low=True), runtime=True,
        help="seconds an HTTP request's body may take in all before 408")
    http_body_memory: int = setting(
        64 * MEGABYTE, memory(MEGABYTE, 1024**4), runtime=True,
        help="request bodies being read, all HTTP connections together; a body past it "
             "gets 503")
    http_batch_max: int = setting(
        1000, integer(1, 100_000), runtime=True,
        help="checks in one POST /v1/check/batch")
    metrics_rule_labels: int = setting(
        1000, integer(0, 100_000), runtime=True,
        help="rules with a rule label of their own in /metrics; the rest are summed as "
             "__other__ (default {default}; 0: no per-rule series)")
    rls_config: str | None = setting(
        None, OPTIONAL_TEXT, runtime=False, metavar="PATH",
        help="envoyproxy/ratelimit's YAML for the Envoy rate limit service: a file or a "
             "directory of *.yaml (default {default}: no domains)")
    rls_response_headers: bool = setting(
        False, BOOL, runtime=True,
        help="the rate limit service adds the RateLimit-Policy, RateLimit and (when over) "
             "Retry-After headers to its answers")
    rls_shadow_mode: bool = setting(
        False, BOOL, runtime=True,
        help="the rate limit service answers OK to every request it would refuse, and "
             "counts it, as the reference's SHADOW_MODE")
    rls_merge_domains: bool = setting(
        False, BOOL, runtime=True,
        help="files of rls-config with the same domain are merged, as the reference's "
             "MERGE_DOMAIN_CONFIG; otherwise a duplicate domain is an error")
    rls_max_config_bytes: int = setting(
        4 * MEGABYTE, memory(1024, 1024**3), runtime=True,
        help="the most bytes the rate limit service's configuration may take, rls-config's "
             "files together or an xDS response")
    rls_max_descriptors: int = setting(
        100_000, integer(1, 10_000_000), runtime=True,
        help="the most descriptors it may have, every domain together, aliases expanded")
    rls_xds_server: str | None = setting(
        None, Kind(parse_xds_server, show_optional), runtime=True, metavar="HOST:PORT",
        help="take the rate limit service's configuration from this xDS server (ADS, State "
             "of the World, RateLimitConfig resources, as Envoy Gateway serves them) "
             "instead of rls-config (default {default})")
    rls_xds_node_id: str = setting(
        "default", TEXT, runtime=True, metavar="ID",
        help="the node id the xDS server knows this server by")
    rls_xds_backoff: tuple[float, float] = setting(
        (10.0, 60.0), Kind(parse_backoff, lambda v: f"{v[0]:g} {v[1]:g}"), runtime=True,
        metavar="'FIRST LONGEST'",
        help="seconds before reconnecting to the xDS server, doubling from FIRST up to "
             "LONGEST, with jitter (default '{default}')")
    rls_xds_tls: bool = setting(
        False, BOOL, runtime=True,
        help="the xDS stream over TLS: the server's certificate must chain to "
             "tls-ca-cert-file (and name its host); this end shows tls-client-cert-file, "
             "else tls-cert-file")
    grpc_port: int | None = setting(
        None, FRONT_PORT, runtime=False, shown=f"port + {FRONT_PORT_OFFSETS['grpc-port']}",
        help=_front_port_help("grpc-port", "gRPC port (cleartext HTTP/2) for Envoy's rate "
                              "limit service (ShouldRateLimit) and the gRPC health check, on "
                              "the bind addresses", "no gRPC"))
    grpc_max_concurrent_streams: int = setting(
        100, integer(1, 2**31 - 1), runtime=True,
        help="calls one gRPC connection may have open at once, as HTTP/2's "
             "SETTINGS_MAX_CONCURRENT_STREAMS (default {default}; new connections)")
    grpc_max_descriptors: int = setting(
        256, integer(1, 2**31 - 1), runtime=True,
        help="descriptors one ShouldRateLimit call may have; more get RESOURCE_EXHAUSTED "
             "(default {default}; Envoy sends one per rate limit of the route)")
    grpc_deadline_ms: float = setting(
        15.0, number(0, 60_000), runtime=True,
        help="a gRPC call not answered within this many milliseconds fails with "
             "UNAVAILABLE, so Envoy's failure mode decides before its own timeout (default "
             "{default}; 0: only the client's grpc-timeout)")
    tls_port: int = setting(
        0, integer(0, 65535), runtime=False,
        help="TLS port for the Redis protocol, beside --port (default {default}: none)")
    tls_cert_file: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True,
        help="the server's certificate (PEM)")
    tls_key_file: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True,
        help="its private key (PEM)")
    tls_client_cert_file: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True,
        help="the certificate the replication link shows (default {default}: tls-cert-file)")
    tls_client_key_file: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True,
        help="its private key")
    tls_ca_cert_file: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True,
        help="CA certificates that client and primary certificates must chain to")
    tls_ca_cert_dir: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True,
        help="a directory of them (OpenSSL's c_rehash layout)")
    tls_ciphers: str | None = setting(
        None, OPTIONAL_TEXT, runtime=True, shown="OpenSSL's",
        help="OpenSSL cipher list for TLSv1.2 and below")
    tls_key_file_pass: bytes | None = setting(
        None, SECRET, runtime=True, metavar="VALUE",
        help="the private key's passphrase")
    tls_client_key_file_pass: bytes | None = setting(
        None, SECRET, runtime=True, metavar="VALUE",
        help="that key's passphrase")
    tls_auth_clients: str = setting(
        "yes", Kind(parse_tls_auth_clients), runtime=True, metavar="yes|no|optional",
        help="client certificates: required, not asked for, or checked if sent")
    tls_protocols: str | None = setting(
        None, Kind(parse_tls_protocols, show_optional), runtime=True, metavar="LIST",
        shown="TLSv1.2 TLSv1.3",
        help='TLS versions, e.g. "{default}" (the default)')
    tls_ciphersuites: str | None = setting(
        None, Kind(parse_tls_ciphersuites, show_optional), runtime=True, metavar="LIST",
        shown="OpenSSL's",
        help="TLSv1.3 suites; only where Python's ssl can set them")
    tls_replication: bool = setting(
        False, BOOL, runtime=True,
        help="a replica connects to its primary's tls-port over TLS")
    tls_cluster: bool = setting(
        False, BOOL, runtime=False,
        help="the cluster's nodes are known by their tls-port and call each other over TLS")
    tls_http: bool = setting(
        False, BOOL, runtime=False,
        help="http-port speaks HTTPS, with the tls-* certificate")
    tls_grpc: bool = setting(
        False, BOOL, runtime=False,
        help="grpc-port speaks gRPC over TLS (ALPN h2), with the tls-* certificate")
    # Not a setting: moves on at each CONFIG SET of a tls-* setting, so
    # the files are read again even when the names are the same (server/tls.py).
    tls_generation: int = 0

    def validate(self) -> Settings:
        """Checks every value with the parser its setting has (so the
        bounds are the same however the settings were made) and
        normalises it; the empty password is no password."""
        for key, spec in SETTINGS.items():
            attr = attr_name(key)
            value = getattr(self, attr)
            if value is not None:
                setattr(self, attr, parse_as(key, spec.kind, value))
        if not self.bind:
            raise ConfigError("bind needs at least one address")
        if not self.repl_user:
            raise ConfigError("repl-user must not be empty")
        if self.masteruser and not self.masterauth:
            raise ConfigError("masteruser needs masterauth (its password)")
        if self.cluster_enabled and not self.cluster_config_file:
            raise ConfigError("cluster-enabled needs cluster-config-file (the slot map)")
        if bool(self.cluster_user) != bool(self.cluster_password):
            raise ConfigError("cluster-user and cluster-password go together: the user the "
                              "nodes of a cluster prove themselves as, and its password")
        if self.cluster_enabled and not self.cluster_password and not all(
                is_loopback(host) for host in self.bind):
            raise ConfigError("cluster mode on an address other than loopback needs "
                              "cluster-user and cluster-password: the nodes prove to each "
                              "other that they know them")
        if self.tls_cluster and not self.tls_port:
            raise ConfigError("tls-cluster needs tls-port (the port the cluster knows this "
                              "node by)")
        self.check_regions()
        for name in FRONT_PORT_OFFSETS:
            front_port(self, name)        # in range
        if self.rules_store.startswith("sqlite:"):      # an alias of rules-db
            self.rules_db = self.rules_store.removeprefix("sqlite:") or None
        return self

    def check_regions(self) -> None:
        if (self.regions or self.region_peers) and self.region is None:
            raise ConfigError("regions and region-peers need region (which region this "
                              "tier is)")
        if self.regions and self.region not in self.regions:
            raise ConfigError(f"region '{self.region}' is not among regions "
                              f"({' '.join(self.regions)})")
        for name in self.region_peers:
            if name == self.region or name not in self.regions:
                raise ConfigError(f"region-peers: '{name}' must be another of regions "
                                  f"({' '.join(self.regions) or 'none given'})")

    @property
    def shared_rules_store(self) -> str | None:
        """The PostgreSQL URI of rules-store, if it is one."""
        return None if self.rules_store == "" or self.rules_store.startswith("sqlite:") \
            else self.rules_store


def attr_name(name: str) -> str:
    return name.replace("-", "_")


# name (as CONFIG GET and the command line spell it) -> its declaration
SETTINGS: dict[str, Spec] = {f.name.replace("_", "-"): f.metadata[SPEC]
                             for f in dataclasses.fields(Settings) if SPEC in f.metadata}


def parse_as(key: str, kind: Kind, value):
    """kind's value of value, a ConfigError naming the setting key unless
    it names one already."""
    try:
        return kind.parse(value)
    except ConfigError as e:
        raise ConfigError(e.reason, e.name or key) from None


def front_port(settings: Settings, name: str) -> int | None:
    """The port the front ``name`` (http-port, grpc-port) listens on: the
    one given (0: no such front, None), or, not given, port plus the
    front's offset; 0 (a free port) when port is 0, whose free port is
    not known before it is bound.  A port above 65535 is an error that
    names the setting, as Redis refuses a port whose cluster bus port
    would not fit."""
    given = getattr(settings, attr_name(name))
    if given is not None:
        return given or None
    if not settings.port:
        return 0
    port = settings.port + FRONT_PORT_OFFSETS[name]
    if port > 65535:
        raise ConfigError(f"port {settings.port} + {FRONT_PORT_OFFSETS[name]} is above 65535; "
                          f"give {name} (0: none)", name)
    return port


def defaults_for(settings: Settings) -> Settings:
    """The defaults, as CONFIG REWRITE compares with them, of a server on
    settings' port: the fronts' ports and the state files follow it."""
    defaults, port = Settings(), settings.port
    if port:      # a free port is not a default CONFIG REWRITE can write
        for name in FRONT_PORT_OFFSETS:
            setattr(defaults, attr_name(name), front_port(Settings(port=port), name))
    for name, default in PORT_NAMED_FILES.items():
        setattr(defaults, attr_name(name), file_for_port(default, port))
    return defaults


def apply(settings: Settings, name: str, value, kind: Kind | None = None) -> str:
    """Sets one setting from text or a TOML value, validating it (as kind
    instead of the setting's own when given); returns its name."""
    key = name.lower().replace("_", "-")
    if key not in SETTINGS:
        raise UnknownSetting(f"unknown setting {name!r}", name)
    parsed = parse_as(key, kind or SETTINGS[key].kind, value)
    if isinstance(parsed, dict):     # a setting in parts (output limit classes): those given change
        parsed = {**getattr(settings, attr_name(key)), **parsed}
    setattr(settings, attr_name(key), parsed)
    return key
