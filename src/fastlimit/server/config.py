"""Server settings: defaults, the TOML config file, the command line, and
the CONFIG GET/SET view of them.

Names follow Redis where Redis has the setting (``maxclients``,
``proto-max-bulk-len``, ...).  In a TOML file either ``proto-max-bulk-len``
or ``proto_max_bulk_len`` may be used.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import ssl
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import tomlkit
import tomlkit.exceptions

from fastlimit._resp import parse_integer

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


class ConfigError(ValueError):
    """A setting has a value the server cannot use.  ``reason`` is worded
    as Redis words CONFIG SET errors; ``name`` is the setting, when known."""

    def __init__(self, reason: str, name: str | None = None):
        super().__init__(f"{name}: {reason}" if name else reason)
        self.reason = reason
        self.name = name


class UnknownSetting(ConfigError):
    """CONFIG SET names a setting the server does not have."""


INT64_MAX = 2**63 - 1

# The number part is read by the wire's integer parser (Redis's string2ll
# rules: no sign, spaces, underscores, leading zeros or non-ASCII digits).
_MEMORY = re.compile(r"([0-9]*)(b|k|kb|m|mb|g|gb)?", re.IGNORECASE | re.ASCII)
_UNPADDED_DIGITS = re.compile(r"[1-9][0-9]*")
_UNITS = {None: 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2,
          "g": 1000**3, "gb": 1024**3}
# Fractional settings (milliseconds, seconds): plain ASCII decimals only.
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?|\.[0-9]+")


def check_range(n, low, high, name: str | None = None):
    if not low <= n <= high:
        raise ConfigError(f"argument must be between {low} and {high} inclusive", name)
    return n


def parse_memory(value, low: int = 0, high: int = INT64_MAX, name: str | None = None) -> int:
    """Redis's memory notation: 1k = 1000 bytes, 1kb = 1024 bytes, ...
    (TOML integers are taken as they are), within [low, high]."""
    if isinstance(value, int) and not isinstance(value, bool):
        return check_range(value, low, high, name)
    m = _MEMORY.fullmatch(value) if isinstance(value, str) else None
    if not m:
        raise ConfigError("argument must be a memory value", name)
    digits, unit = m.groups()
    n = parse_integer(digits)
    if n is None:
        if not _UNPADDED_DIGITS.fullmatch(digits):
            raise ConfigError("argument must be a memory value", name)
        n = INT64_MAX + 1      # only too many digits: out of range, as Redis says
    return check_range(n * _UNITS[unit.lower() if unit else None], low, high, name)


def parse_int(value, low: int, high: int, name: str | None = None) -> int:
    """An integer by the wire's rules (TOML integers as they are) within
    [low, high]; never Python's int(), which takes "+5", " 5" and "5_0"."""
    if isinstance(value, bool):
        n = None
    elif isinstance(value, int):
        n = value
    else:
        n = parse_integer(value) if isinstance(value, (str, bytes)) else None
    if n is None:
        raise ConfigError("argument couldn't be parsed into an integer", name)
    return check_range(n, low, high, name)


def parse_number(value, low: float, high: float, name: str | None = None,
                 above_low: bool = False) -> float:
    """A fractional setting: a plain decimal (or a TOML number) within
    [low, high], or (low, high] when above_low."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        x = float(value)
    elif isinstance(value, str) and _DECIMAL.fullmatch(value):
        x = float(value)
    else:
        raise ConfigError("argument couldn't be parsed into a number", name)
    if not (low < x if above_low else low <= x) or not x <= high:
        bound = "above" if above_low else "at least"
        raise ConfigError(f"argument must be {bound} {low} and at most {high}", name)
    return x


def parse_bool(value, name: str | None = None) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("yes", "true", "1", "on"):
        return True
    if text in ("no", "false", "0", "off"):
        return False
    raise ConfigError("argument must be 'yes' or 'no'", name)


# client-output-buffer-limit's classes as Redis names them (replica is
# also "slave", the name CONFIG GET shows); replicas are bounded by
# repl-buffer-limit, the replica class is kept for Redis's tools.
OUTPUT_CLASSES = {"normal": "normal", "replica": "replica", "slave": "replica",
                  "pubsub": "pubsub"}
DEFAULT_OUTPUT_LIMITS = {"normal": (32 * 1024**2, 8 * 1024**2, 60),
                         "replica": (256 * 1024**2, 64 * 1024**2, 60),
                         "pubsub": (32 * 1024**2, 8 * 1024**2, 60)}


def parse_output_limit(value) -> dict[str, tuple[int, int, int]]:
    """Redis's ``<class> <hard> <soft> <soft-seconds> ...`` (normal,
    replica or pubsub), or ``<hard> <soft> <soft-seconds>`` for normal, as
    one string, a list, or the dict this returns.  Only the classes given
    change (see apply)."""
    if isinstance(value, dict):
        value = [x for name, limits in value.items() for x in (name, *limits)]
    parts = value.split() if isinstance(value, str) else list(value)
    if len(parts) == 3 and not str(parts[0])[:1].isalpha():     # no class named: normal
        parts = ["normal", *parts]
    if not parts or len(parts) % 4:
        raise ConfigError("Wrong number of arguments in buffer limit configuration.")
    out = {}
    for i in range(0, len(parts), 4):
        name = OUTPUT_CLASSES.get(str(parts[i]).lower())
        if name is None:
            raise ConfigError("Invalid client class specified in buffer limit configuration.")
        try:
            out[name] = (parse_memory(parts[i + 1]), parse_memory(parts[i + 2]),
                         parse_int(parts[i + 3], 0, 10**9))
        except ConfigError:
            raise ConfigError("Error in hard, soft or soft_seconds setting in buffer "
                              "limit configuration.") from None
    return out


def format_output_limit(limits: dict[str, tuple[int, int, int]]) -> str:
    return " ".join("{} {} {} {}".format("slave" if name == "replica" else name, *limits[name])
                    for name in DEFAULT_OUTPUT_LIMITS)


def parse_shards(value) -> int:
    n = parse_int(value, 1, 65536)
    if n & (n - 1):
        raise ConfigError("argument must be a power of two from 1 to 65536")
    return n


# maxmemory-policy: fastlimit's own, and Redis's names that mean the same
# here (every bucket has an expiry, the moment it is full again: Redis's
# "volatile" keys are all of them, and the nearest expiry is the nearest
# full); the LRU and LFU policies need access times no record keeps.
MAXMEMORY_POLICIES = {"nearest-full": "nearest-full", "volatile-ttl": "nearest-full",
                      "allkeys-random": "allkeys-random", "volatile-random": "allkeys-random",
                      "noeviction": "noeviction"}


def parse_policy(value) -> str:
    policy = str(value).lower()
    if policy not in MAXMEMORY_POLICIES:
        raise ConfigError("argument(s) must be one of the following: "
                          + ", ".join(MAXMEMORY_POLICIES))
    return policy


def parse_loglevel(value) -> str:
    level = str(value).lower()
    if level not in LOGLEVELS:
        raise ConfigError("argument(s) must be one of the following: " + ", ".join(LOGLEVELS))
    return level


@dataclass
class Settings:
    bind: list[str] = field(default_factory=lambda: ["127.0.0.1"])
    port: int = DEFAULT_PORT
    requirepass: bytes | None = None
    aclfile: str | None = None
    acllog_max_len: int = 128
    protected_mode: bool = True
    shards: int = 256
    manual_clock: bool = False
    maxclients: int = 10000
    proto_max_bulk_len: int = 512 * 1024 * 1024
    max_multibulk_len: int = 1024 * 1024
    client_query_buffer_limit: int = 1024 * 1024 * 1024
    client_output_buffer_limit: dict[str, tuple[int, int, int]] = field(
        default_factory=lambda: dict(DEFAULT_OUTPUT_LIMITS))
    hz: int = 10
    sweep_budget_ms: float = 1.0
    denial_log_seconds: float = 10.0
    snapshot_file: str | None = DEFAULT_SNAPSHOT_FILE
    save_seconds: int = 0
    loglevel: str = "notice"
    config_file: str | None = None
    rules_db: str | None = DEFAULT_RULES_DB
    rules_file: str | None = None
    replicaof: tuple[str, int] | None = None
    masterauth: bytes | None = None
    masteruser: str | None = None
    replica_priority: int = 100
    replica_announce_ip: str | None = None
    replica_announce_port: int = 0
    replica_announced: bool = True
    repl_user: str = "replica"
    repl_password: bytes | None = None
    repl_max_full_copies: int = 2
    repl_timeout: int = 60
    repl_flush_ms: float = 2.0
    repl_buffer_limit: int = 256 * 1024**2
    rules_cache_size: int = 16 * 1024**2
    maxmemory: int = 0
    maxmemory_policy: str = "nearest-full"
    maxmemory_samples: int = 5
    cluster_enabled: bool = False
    cluster_config_file: str | None = None
    cluster_announce_ip: str | None = None
    cluster_announce_port: int = 0
    cluster_sentinel_password: bytes | None = None
    cluster_user: str | None = None
    cluster_password: bytes | None = None
    http_port: int | None = None      # None: follows port (front_port)
    http_metrics_auth: bool = True
    http_max_header_bytes: int = 16 * 1024
    http_max_body_bytes: int = 1024 * 1024
    http_header_timeout: float = 10.0
    http_body_timeout: float = 60.0
    http_body_memory: int = 64 * 1024 * 1024
    http_batch_max: int = 1000
    metrics_rule_labels: int = 1000
    rls_config: str | None = None
    rls_response_headers: bool = False
    rls_shadow_mode: bool = False
    rls_merge_domains: bool = False
    rls_max_config_bytes: int = 4 * 1024**2
    rls_max_descriptors: int = 100_000
    rls_xds_server: str | None = None
    rls_xds_node_id: str = "default"
    rls_xds_backoff: tuple[float, float] = (10.0, 60.0)
    rls_xds_tls: bool = False
    grpc_port: int | None = None
    grpc_max_concurrent_streams: int = 100
    grpc_max_descriptors: int = 256
    grpc_deadline_ms: float = 15.0
    tls_port: int = 0
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_key_file_pass: bytes | None = None
    tls_client_cert_file: str | None = None
    tls_client_key_file: str | None = None
    tls_client_key_file_pass: bytes | None = None
    tls_ca_cert_file: str | None = None
    tls_ca_cert_dir: str | None = None
    tls_auth_clients: str = "yes"
    tls_protocols: str | None = None
    tls_ciphers: str | None = None
    tls_ciphersuites: str | None = None
    tls_replication: bool = False
    tls_cluster: bool = False
    tls_http: bool = False
    tls_grpc: bool = False
    # Not a setting: moves on at each CONFIG SET of a tls-* setting, so
    # the files are read again even when the names are the same (server/tls.py).
    tls_generation: int = 0

    def validate(self) -> Settings:
        """Checks every value with the parser its setting has (so the
        bounds are the same however the settings were made) and
        normalises it; the empty password is no password."""
        for key, (parse, _) in _FIELDS.items():
            attr = attr_name(key)
            value = getattr(self, attr)
            if value is not None:
                setattr(self, attr, _parse(key, parse, value))
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
        for name in FRONT_PORT_OFFSETS:
            front_port(self, name)        # in range
        return self


def parse_front_port(value) -> int | None:
    """A front's port; "" for the default, which follows port."""
    return None if value == "" else parse_int(value, 0, 65535)


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


def file_for_port(default: str, port: int) -> str:
    """A state file's default name for a server on port: fastlimit.snap on
    6380 (and port 0), fastlimit-6381.snap on 6381."""
    if port in (DEFAULT_PORT, 0):
        return default
    stem, ext = os.path.splitext(default)
    return f"{stem}-{port}{ext}"


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


LOGLEVELS = {"debug": 10, "verbose": 15, "notice": 20, "warning": 30}


def parse_secret(value) -> bytes | None:
    """A password or passphrase is its bytes, whatever they are, as Redis
    takes binary passwords: CONFIG SET's and the command line's text carry
    them surrogateescaped, a TOML string is its UTF-8, and a TOML array of
    byte values (what CONFIG REWRITE writes for bytes that are not UTF-8)
    those bytes.  The empty secret is none."""
    if isinstance(value, bytes):
        secret = value
    elif isinstance(value, list):
        if not all(type(b) is int and 0 <= b <= 255 for b in value):
            raise ConfigError("argument must be a string or an array of byte values (0 to 255)")
        secret = bytes(value)
    else:
        secret = str(value).encode("utf-8", "surrogateescape")
    return secret or None


def format_secret(value: bytes | None) -> str:
    """As CONFIG GET shows a secret: its bytes again once the reply encodes
    the text (surrogateescape)."""
    return value.decode("utf-8", "surrogateescape") if value else ""

# name -> (parse from text or a TOML value, format for CONFIG GET).  Every
# size fits the C fields it ends in (int64); ConfigError says what is wrong.
_FIELDS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], str]]] = {
    "bind": (lambda v: v.split() if isinstance(v, str) else list(v), " ".join),
    "port": (lambda v: parse_int(v, 0, 65535), str),
    "requirepass": (parse_secret, format_secret),
    "aclfile": (lambda v: str(v) or None, lambda v: v or ""),
    "acllog-max-len": (lambda v: parse_int(v, 0, 2**31 - 1), str),
    "protected-mode": (parse_bool, lambda v: "yes" if v else "no"),
    "shards": (parse_shards, str),
    "manual-clock": (parse_bool, lambda v: "yes" if v else "no"),
    "maxclients": (lambda v: parse_int(v, 1, 1_000_000), str),
    "proto-max-bulk-len": (lambda v: parse_memory(v, 1), str),
    "max-multibulk-len": (lambda v: parse_int(v, 1, 2**31 - 1), str),
    "client-query-buffer-limit": (parse_memory, str),
    "client-output-buffer-limit": (parse_output_limit, format_output_limit),
    "hz": (lambda v: parse_int(v, 1, 500), str),
    "sweep-budget-ms": (lambda v: parse_number(v, 0, 100, above_low=True), str),
    "denial-log-seconds": (lambda v: parse_number(v, 0, 86400, above_low=True), str),
    "snapshot-file": (lambda v: str(v) or None, lambda v: v or ""),
    "save-seconds": (lambda v: parse_int(v, 0, 10**9), str),
    "loglevel": (parse_loglevel, str),
    "rules-db": (lambda v: str(v) or None, lambda v: v or ""),
    "rules-file": (lambda v: str(v) or None, lambda v: v or ""),
    "replicaof": (lambda v: parse_replicaof(v), lambda v: f"{v[0]} {v[1]}" if v else ""),
    "masterauth": (parse_secret, format_secret),
    "masteruser": (lambda v: str(v) or None, lambda v: v or ""),
    "replica-priority": (lambda v: parse_int(v, 0, 2**31 - 1), str),
    "replica-announce-ip": (lambda v: parse_announce_ip(v), lambda v: v or ""),
    "replica-announce-port": (lambda v: parse_int(v, 0, 65535), str),
    "replica-announced": (parse_bool, lambda v: "yes" if v else "no"),
    "repl-user": (str, str),
    "repl-password": (parse_secret, format_secret),
    "repl-max-full-copies": (lambda v: parse_int(v, 1, 64), str),
    "repl-timeout": (lambda v: parse_int(v, 1, 86400), str),
    "repl-flush-ms": (lambda v: parse_number(v, 0.1, 1000), str),
    "repl-buffer-limit": (lambda v: parse_memory(v, 1024), str),
    "rules-cache-size": (lambda v: parse_memory(v, 0, 2**40), str),
    "maxmemory": (parse_memory, str),
    "maxmemory-policy": (lambda v: parse_policy(v), str),
    "maxmemory-samples": (lambda v: parse_int(v, 1, 64), str),
    "cluster-enabled": (parse_bool, lambda v: "yes" if v else "no"),
    "cluster-config-file": (lambda v: str(v) or None, lambda v: v or ""),
    "cluster-announce-ip": (lambda v: parse_announce_ip(v), lambda v: v or ""),
    "cluster-announce-port": (lambda v: parse_int(v, 0, 65535), str),
    "cluster-sentinel-password": (parse_secret, format_secret),
    "cluster-user": (lambda v: str(v) or None, lambda v: v or ""),
    "cluster-password": (parse_secret, format_secret),
    "http-port": (parse_front_port, lambda v: "" if v is None else str(v)),
    "http-metrics-auth": (parse_bool, lambda v: "yes" if v else "no"),
    "http-max-header-bytes": (lambda v: parse_memory(v, 1024, 1024**2), str),
    "http-max-body-bytes": (lambda v: parse_memory(v, 1024, 512 * 1024**2), str),
    "http-header-timeout": (lambda v: parse_number(v, 0, 3600, above_low=True), str),
    "http-body-timeout": (lambda v: parse_number(v, 0, 3600, above_low=True), str),
    "http-body-memory": (lambda v: parse_memory(v, 1024 * 1024, 1024**4), str),
    "http-batch-max": (lambda v: parse_int(v, 1, 100_000), str),
    "metrics-rule-labels": (lambda v: parse_int(v, 0, 100_000), str),
    "rls-config": (lambda v: str(v) or None, lambda v: v or ""),
    "rls-response-headers": (parse_bool, lambda v: "yes" if v else "no"),
    "rls-shadow-mode": (parse_bool, lambda v: "yes" if v else "no"),
    "rls-merge-domains": (parse_bool, lambda v: "yes" if v else "no"),
    "rls-max-config-bytes": (lambda v: parse_memory(v, 1024, 1024**3), str),
    "rls-max-descriptors": (lambda v: parse_int(v, 1, 10_000_000), str),
    "rls-xds-server": (lambda v: parse_xds_server(v), lambda v: v or ""),
    "rls-xds-node-id": (str, str),
    "rls-xds-backoff": (lambda v: parse_backoff(v), lambda v: f"{v[0]:g} {v[1]:g}"),
    "rls-xds-tls": (parse_bool, lambda v: "yes" if v else "no"),
    "grpc-port": (parse_front_port, lambda v: "" if v is None else str(v)),
    "grpc-max-concurrent-streams": (lambda v: parse_int(v, 1, 2**31 - 1), str),
    "grpc-max-descriptors": (lambda v: parse_int(v, 1, 2**31 - 1), str),
    "grpc-deadline-ms": (lambda v: parse_number(v, 0, 60_000), str),
    "tls-port": (lambda v: parse_int(v, 0, 65535), str),
    **{name: (lambda v: str(v) or None, lambda v: v or "") for name in (
        "tls-cert-file", "tls-key-file", "tls-client-cert-file", "tls-client-key-file",
        "tls-ca-cert-file", "tls-ca-cert-dir", "tls-ciphers")},
    "tls-key-file-pass": (parse_secret, format_secret),
    "tls-client-key-file-pass": (parse_secret, format_secret),
    "tls-auth-clients": (lambda v: parse_tls_auth_clients(v), str),
    "tls-protocols": (lambda v: parse_tls_protocols(v), lambda v: v or ""),
    "tls-ciphersuites": (lambda v: parse_tls_ciphersuites(v), lambda v: v or ""),
    "tls-replication": (parse_bool, lambda v: "yes" if v else "no"),
    "tls-cluster": (parse_bool, lambda v: "yes" if v else "no"),
    "tls-http": (parse_bool, lambda v: "yes" if v else "no"),
    "tls-grpc": (parse_bool, lambda v: "yes" if v else "no"),
}

TLS_PROTOCOLS = {"tlsv1": ssl.TLSVersion.TLSv1, "tlsv1.1": ssl.TLSVersion.TLSv1_1,
                 "tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}


def parse_tls_auth_clients(value) -> str:
    text = "yes" if value is True else "no" if value is False else str(value).lower()
    if text not in ("no", "yes", "optional"):
        raise ConfigError("argument(s) must be one of the following: no, yes, optional")
    return text


def parse_tls_protocols(value) -> str | None:
    """Redis's list of TLSv1, TLSv1.1, TLSv1.2, TLSv1.3 (any case); "" for
    its default, TLSv1.2 and TLSv1.3."""
    text = " ".join(value) if isinstance(value, list) else str(value)
    if any(name.lower() not in TLS_PROTOCOLS for name in text.split()):
        raise ConfigError("Invalid tls-protocols specified. Use a combination of 'TLSv1', "
                          "'TLSv1.1', 'TLSv1.2' and 'TLSv1.3'.")
    return text or None


def parse_tls_ciphersuites(value) -> str | None:
    """TLSv1.3's suites need SSLContext.set_ciphersuites, which Python's ssl
    module lacks before 3.15: refused there rather than silently ignored."""
    text = str(value)
    if text and not hasattr(ssl.SSLContext, "set_ciphersuites"):
        raise ConfigError("this Python's ssl module cannot choose TLSv1.3 ciphersuites (no "
                          "SSLContext.set_ciphersuites); leave tls-ciphersuites empty and "
                          "set them in OpenSSL's configuration (OPENSSL_CONF) instead")
    return text or None


def parse_replicaof(value) -> tuple[str, int] | None:
    """``<host> <port>``, as one string or a list; "" or "no one" for none."""
    parts = value.split() if isinstance(value, str) else [str(v) for v in value]
    if not parts or [p.lower() for p in parts] == ["no", "one"]:
        return None
    if len(parts) != 2:
        raise ConfigError("replicaof takes <host> <port>")
    return parts[0], parse_int(parts[1], 1, 65535)


_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.%A-Za-z]+\]", re.ASCII)


def parse_xds_server(value) -> str | None:
    """``host:port`` of an xDS management server ([v6]:port too), as
    gRPC's target; "" for none."""
    text = str(value)
    if not text:
        return None
    host, _, port = text.rpartition(":")
    if not _HOST.fullmatch(host):
        raise ConfigError("argument must be <host>:<port>")
    parse_int(port, 1, 65535)
    return text


def parse_backoff(value) -> tuple[float, float]:
    """``<first> <longest>``: seconds before the first reconnection and
    the most any later one waits (each doubles the last)."""
    parts = value.split() if isinstance(value, str) else list(value)
    if len(parts) != 2:
        raise ConfigError("argument must be <first-seconds> <longest-seconds>")
    first, longest = (parse_number(p, 0, 86400, above_low=True) for p in parts)
    if longest < first:
        raise ConfigError("the longest wait must be at least the first")
    return first, longest


# Redis's NET_HOST_STR_LEN: the longest address a primary takes in
# REPLCONF ip-address.
MAX_ANNOUNCE_IP = 255
# An IP address or a host name: it goes into INFO's slave<N> line
# ("ip=<this>,port=..."), where a comma or a line break would forge fields.
_ANNOUNCE_IP = re.compile(r"[A-Za-z0-9.:_%-]*", re.ASCII)


def parse_announce_ip(value) -> str | None:
    """The address a replica asks its primary to list it under (INFO's
    slave<N> line, which is how Sentinel finds replicas); "" for none."""
    text = str(value)
    if len(text) > MAX_ANNOUNCE_IP or not _ANNOUNCE_IP.fullmatch(text):
        raise ConfigError(f"argument must be an IP address or host name of at most "
                          f"{MAX_ANNOUNCE_IP} bytes")
    return text or None


def is_loopback(host: str) -> bool:
    """Whether an address (a bind address, a node's) is this host's own
    loopback: only processes on this host reach it."""
    try:
        return ipaddress.ip_address(host.lstrip("-")).is_loopback
    except ValueError:
        return host == "localhost"


# Settings that CONFIG SET may change while the server runs.
RUNTIME_SETTABLE = {"bind", "port", "denial-log-seconds", "save-seconds", "maxclients",
                    "proto-max-bulk-len", "max-multibulk-len",
                    "client-query-buffer-limit", "client-output-buffer-limit",
                    "hz", "sweep-budget-ms", "loglevel", "requirepass", "masterauth",
                    "acllog-max-len", "protected-mode",
                    "masteruser", "replica-priority", "replica-announce-ip",
                    "replica-announce-port", "replica-announced", "repl-user",
                    "repl-password", "repl-max-full-copies", "repl-timeout", "repl-flush-ms",
                    "repl-buffer-limit", "rules-cache-size", "maxmemory", "maxmemory-policy",
                    "maxmemory-samples", "cluster-announce-ip", "cluster-user",
                    "cluster-password",
                    "cluster-announce-port", "http-metrics-auth", "http-max-header-bytes",
                    "http-max-body-bytes", "http-header-timeout", "http-body-timeout",
                    "http-body-memory", "http-batch-max",
                    "metrics-rule-labels",
                    "rls-response-headers", "rls-shadow-mode", "rls-merge-domains",
                    "rls-max-config-bytes", "rls-max-descriptors",
                    "rls-xds-server", "rls-xds-node-id", "rls-xds-backoff",
                    "rls-xds-tls", "grpc-max-concurrent-streams", "grpc-max-descriptors",
                    "grpc-deadline-ms",
                    "tls-cert-file", "tls-key-file", "tls-key-file-pass", "tls-client-cert-file",
                    "tls-client-key-file", "tls-client-key-file-pass", "tls-ca-cert-file",
                    "tls-ca-cert-dir", "tls-auth-clients", "tls-protocols", "tls-ciphers",
                    "tls-ciphersuites", "tls-replication"}

# Redis settings that clients ask about; fixed, because fastlimit keeps
# buckets in memory only (snapshots come with replication).
FIXED = {"save": "", "appendonly": "no", "databases": "1", "timeout": "0",
         "daemonize": "no"}   # never: CONFIG SET daemonize yes is Redis's immutable error


def attr_name(name: str) -> str:
    return name.replace("-", "_")


def _parse(key: str, parse, value):
    try:
        return parse(value)
    except ConfigError as e:
        raise ConfigError(e.reason, e.name or key) from None


def apply(settings: Settings, name: str, value, parse=None) -> str:
    """Sets one setting from text or a TOML value, validating it (with
    parse instead of the setting's own parser when given); returns its
    name."""
    key = name.lower().replace("_", "-")
    if key not in _FIELDS:
        raise UnknownSetting(f"unknown setting {name!r}", name)
    parsed = _parse(key, parse or _FIELDS[key][0], value)
    if isinstance(parsed, dict):     # a setting in parts (output limit classes): those given change
        parsed = {**getattr(settings, attr_name(key)), **parsed}
    setattr(settings, attr_name(key), parsed)
    return key


# CONFIG SET may not take these below Redis's minimums: a lower value can
# leave no command that fits (proto-max-bulk-len 1, a query buffer of 0,
# max-multibulk-len below "CONFIG SET x y"), and only a restart would
# undo it.  The command line and config file may go lower.
RUNTIME_PARSERS = {"proto-max-bulk-len": lambda v: parse_memory(v, 1024**2),
                   "client-query-buffer-limit": lambda v: parse_memory(v, 1024**2),
                   "max-multibulk-len": lambda v: parse_int(v, 1024, 2**31 - 1)}


def set_at_runtime(settings: Settings, pairs) -> Settings:
    """CONFIG SET's checks, in Redis's order: every name known, changeable
    and given once; then every value.  Returns a checked copy with the
    pairs applied; settings itself is not touched.  pairs are (name as
    sent, value) strings."""
    keys = []
    for name, value in pairs:
        key = name.lower()
        if key not in _FIELDS and key not in FIXED:
            raise UnknownSetting("unknown setting", name)
        # these two name the argument as sent, value errors the setting (as Redis)
        if key not in RUNTIME_SETTABLE and FIXED.get(key) != value:
            raise ConfigError("can't set immutable config", name)
        if key in keys:
            raise ConfigError("duplicate parameter", name)
        keys.append(key)
    trial = replace(settings)
    for key, (_, value) in zip(keys, pairs, strict=True):
        if key in RUNTIME_SETTABLE:
            apply(trial, key, value, RUNTIME_PARSERS.get(key))
    if any(key.startswith("tls-") for key in keys):
        trial.tls_generation += 1
    return trial.validate()


def get_all(settings: Settings) -> dict[str, str]:
    """Every setting as CONFIG GET shows it."""
    out = {key: fmt(getattr(settings, attr_name(key))) for key, (_, fmt) in _FIELDS.items()}
    out.update(FIXED)
    return out


PATTERNS_PER_SLICE = 128


def get_matching(settings: Settings, patterns):
    """CONFIG GET <pattern> ...: the settings any pattern matches, as Redis
    answers, as a generator for fastlimit._resp.Sliced.  It yields every
    PATTERNS_PER_SLICE patterns, so a command with a million of them is
    answered between other clients' commands instead of stalling them, and
    returns the reply (see SettingsQuery)."""
    query = SettingsQuery(settings)
    for start in range(0, len(patterns), PATTERNS_PER_SLICE):
        if query.take(patterns[start:start + PATTERNS_PER_SLICE]):
            break
        yield
    return query.answer()


class SettingsQuery:
    """A pattern without ``*``, ``?`` or ``[`` names one setting (any case)
    and is answered under the name as sent; the others are globs.  Linear
    in the patterns' size, whatever they hold: each distinct pattern is
    read once (see NameMatcher), and reading stops when every setting has
    matched."""

    def __init__(self, settings: Settings):
        self.values = get_all(settings)
        self.matcher = _matcher()
        self.found: dict[str, bytes | str] = {}      # setting -> the name to answer with
        self.tried: set[bytes] = set()
        self.classes: dict = {}

    def take(self, patterns) -> bool:
        """Matches some patterns; True once every setting has matched."""
        values, found = self.values, self.found
        for pattern in patterns:
            if len(found) == len(values):
                return True
            if not _GLOB_CHARS.search(pattern):
                key = pattern.lower().decode("utf-8", "replace")
                if key in values and key not in found:
                    found[key] = pattern
            elif pattern not in self.tried:
                self.tried.add(pattern)
                for key in self.matcher.match(pattern, self.classes):
                    found.setdefault(key, key)
        return len(found) == len(values)

    def answer(self) -> dict:
        return {name: self.values[key] for key, name in self.found.items()}


_GLOB_CHARS = re.compile(rb"[*?\[]")


@cache
def _matcher() -> NameMatcher:
    return NameMatcher(list(_FIELDS) + list(FIXED))


class NameMatcher:
    """Which of a fixed set of names a pattern matches, by the rules of
    Redis's stringmatchlen with nocase (``*``, ``?``, ``[...]`` with ``^``,
    ranges and ``\\`` escapes, ``\\`` outside classes), in time linear in
    the pattern.

    Redis backtracks (with a guard against going exponential on
    ``*a*a*a...b``); here every name is followed at once, bit-parallel.
    Bit ``p`` of the state is one position in one name: "the tokens read so
    far match that name up to here".  The names' positions sit in one
    integer, each name followed by a gap wider than the longest name, so
    that the shifts below never carry from one name into the next.  A token
    costs a few integer operations, and a state with no bit left can match
    nothing: as every token but ``*`` consumes one character, that happens
    within longest-name + 1 of them, so even a huge pattern is read only as
    far as it can matter."""

    def __init__(self, names: list[str]):
        longest = max(map(len, names))
        # 1, 2, 4...: together they fill a whole name, and none jumps a gap
        self.fill_shifts = [1 << k for k in range(longest.bit_length())]
        self.start = self.ends = self.valid = 0
        self.next_char: dict[int, int] = {}     # byte -> positions it follows
        self.end_of: dict[int, str] = {}        # end position -> name
        offset = 0
        for name in names:
            self.start |= 1 << offset
            self.end_of[offset + len(name)] = name
            self.ends |= 1 << (offset + len(name))
            self.valid |= ((1 << (len(name) + 1)) - 1) << offset
            for i, ch in enumerate(name.encode()):
                self.next_char[ch] = self.next_char.get(ch, 0) | 1 << (offset + i)
            offset += len(name) + 1 + longest + 1
        self.any_char = self.valid & ~self.ends
        self.with_lower: dict[int, list[int]] = {}     # lowered byte -> the names' bytes
        for ch in self.next_char:
            self.with_lower.setdefault(_lower(ch), []).append(ch)
        self.literal = [self._positions(self.with_lower.get(_lower(b), ())) for b in range(256)]

    def _positions(self, chars) -> int:
        """Positions followed by one of chars."""
        out = 0
        for ch in chars:
            out |= self.next_char[ch]
        return out

    def match(self, pattern: bytes, classes: dict) -> list[str]:
        """The names pattern matches; classes caches class tokens' positions
        (for one command: it grows with what the client sent)."""
        state, i, n = self.start, 0, len(pattern)
        while i < n and state:
            ch = pattern[i]
            if ch == _STAR:
                i = _must_match(_STARS, pattern, i).end()
                for shift in self.fill_shifts:
                    state |= (state << shift) & self.valid
                continue
            if ch == _QUESTION:
                positions, i = self.any_char, i + 1
            elif ch == _OPEN:
                positions, i = self._class(pattern, i, classes)
            else:
                if ch == _BACKSLASH and i + 1 < n:
                    i += 1
                positions, i = self.literal[pattern[i]], i + 1
            state = (state & positions) << 1
        state &= self.ends
        return [name for end, name in self.end_of.items() if state >> end & 1]

    def _class(self, pattern: bytes, i: int, classes: dict) -> tuple[int, int]:
        """The positions the ``[...]`` token at pattern[i] admits, and
        where the token ends."""
        end = _must_match(_CLASS, pattern, i).end()
        text = pattern[i:end]
        end += pattern[end:end + 1] == b"]"      # a closing "]"; else the pattern ended
        positions = classes.get(text)
        if positions is None:
            positions = classes[text] = self._positions(self._class_chars(text))
        return positions, end

    def _class_chars(self, text: bytes) -> set[int]:
        """The names' bytes a class token (without its closing "]") admits:
        escaped bytes compare exactly, other bytes and ranges without case,
        a reversed range is swapped first, all as stringmatchlen does."""
        negate = text[1:2] == b"^"
        exact, folded, ranges = set(), set(), set()     # a long class repeats itself
        for m in _CLASS_ITEMS.finditer(text, 2 if negate else 1):
            escaped, low, high, plain = m.groups()
            if escaped is not None:
                exact.add(escaped[0])
            elif plain is not None:
                folded.add(_lower(plain[0]))
            else:
                ranges.add(tuple(map(_lower, sorted((low[0], high[0])))))
        chars = exact & self.next_char.keys()
        for f in folded:
            chars.update(self.with_lower.get(f, ()))
        for low, high in ranges:
            chars.update(c for c in self.next_char if low <= _lower(c) <= high)
        return self.next_char.keys() - chars if negate else chars


_STAR, _QUESTION, _OPEN, _BACKSLASH = b"*?[\\"
_STARS = re.compile(rb"\*+")


def _must_match(regex: re.Pattern[bytes], text: bytes, pos: int) -> re.Match[bytes]:
    """regex.match where the caller knows it matches (the token starts there)."""
    m = regex.match(text, pos)
    assert m is not None
    return m


# A class as stringmatchlen reads it: "[", an optional "^", then items in
# this order of preference: an escaped byte, a range "a-z" (whose end may
# be "]" or "\\"), any byte but "]"; then "]", or the end of the pattern.
_CLASS_ITEM = rb"\\(.)|([^\]\\])-(.)|([^\]])"
_CLASS_ITEMS = re.compile(_CLASS_ITEM, re.DOTALL)
_CLASS = re.compile(rb"\[\^?(?:\\.|[^\]\\]-.|[^\]])*+", re.DOTALL)


def _lower(c: int) -> int:
    return c + 32 if 65 <= c <= 90 else c


def load_file(path: str, settings: Settings) -> set[str]:
    """Applies the settings of a TOML file; returns the names it gave."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    section = data.get("server", data)
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: [server] must be a table of settings")
    given = set()
    for name, value in section.items():
        if isinstance(value, dict):
            continue   # other sections belong to later features
        given.add(apply(settings, name, value))
    settings.config_file = os.path.abspath(path)   # as Redis shows it, and CONFIG REWRITE writes
    return given


def rewrite(settings: Settings, path: str) -> None:
    """CONFIG REWRITE: writes the running settings into the TOML file at
    path, as Redis rewrites its config file.  The operator's comments,
    order and spelling stay: a setting the file has keeps its line, given
    a new value only when the running one differs from what the line
    says; one it lacks is added when it differs from the default; one
    that is off and off by default (``replicaof`` after REPLICAOF NO ONE)
    is removed.  The file is replaced whole (a new file, renamed over
    it), so a crash never leaves half of one.  ConfigError says what went
    wrong."""
    target = os.path.realpath(path)
    doc = _read_for_rewrite(target)
    table = doc["server"] if "server" in doc else doc
    defaults = defaults_for(settings)
    for key, (parse, fmt) in _FIELDS.items():
        value = getattr(settings, attr_name(key))
        lines = [name for name in dict.fromkeys((key, attr_name(key))) if name in table]
        if lines and _says(parse, table[lines[0]], value):
            continue
        for name in lines[1:]:
            del table[name]
        if value is None and getattr(defaults, attr_name(key)) is None:
            if lines:
                del table[lines[0]]
        elif lines or value != getattr(defaults, attr_name(key)):
            table[lines[0] if lines else key] = _toml_value(key, value, fmt)
    replace_file(target, tomlkit.dumps(doc).encode())


def _read_for_rewrite(path: str) -> tomlkit.TOMLDocument:
    """The file as tomlkit keeps it (a missing file is an empty one, as
    Redis takes it)."""
    try:
        with open(path, encoding="utf-8") as f:
            return tomlkit.parse(f.read())
    except FileNotFoundError:
        return tomlkit.document()
    except OSError as e:
        raise ConfigError(e.strerror or str(e)) from None
    except (UnicodeDecodeError, tomlkit.exceptions.ParseError) as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None


def _says(parse, item, value) -> bool:
    """Whether a line of the file already gives value."""
    try:
        return parse(item.unwrap() if hasattr(item, "unwrap") else item) == value
    except ConfigError:
        return False


def _toml_value(key: str, value, fmt):
    """A running value as TOML: numbers, booleans, strings and the address
    list as themselves, a secret as its text or, when it is not UTF-8, its
    bytes (an array parse_secret reads back), anything else (replicaof,
    the output limit) in the text CONFIG GET shows, which its parser reads
    back.  Text that is not UTF-8 (CONFIG SET takes any bytes) has no TOML
    form: ConfigError."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return list(value)
    out = value if isinstance(value, (bool, int, float, str, list)) else fmt(value)
    texts = [t for t in (out if isinstance(out, list) else [out]) if isinstance(t, str)]
    try:
        for text in texts:
            text.encode()
    except UnicodeEncodeError:
        raise ConfigError(f"{key} is not UTF-8 text, which a TOML file cannot hold") from None
    return out


def replace_file(path: str, data: bytes) -> None:
    """Writes data to path all or nothing (a temporary file renamed over
    it, both made durable), keeping path's permissions; ConfigError says
    what failed."""
    directory = os.path.dirname(path)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600           # it may hold passwords
    except OSError as e:
        raise ConfigError(e.strerror or str(e)) from None
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    except OSError as e:
        raise ConfigError(e.strerror or str(e)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ConfigError(e.strerror or str(e)) from None
    with contextlib.suppress(OSError):     # the rename itself made durable
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastlimit-server",
        description="Rate-limiting counter server that speaks the Redis protocol.")
    p.add_argument("--config", metavar="FILE", help="TOML config file (command line wins)")
    p.add_argument("--port", metavar="N",
                   help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--bind", nargs="+", metavar="ADDR",
                   help="addresses to listen on (default 127.0.0.1)")
    p.add_argument("--requirepass", metavar="PW",
                   help="the default user's password, which clients AUTH with")
    p.add_argument("--aclfile", metavar="PATH",
                   help="ACL users, one 'user <name> <rules>' line each (Redis's format), "
                        "loaded at start and by ACL LOAD, written by ACL SAVE")
    p.add_argument("--acllog-max-len", metavar="N",
                   help="entries ACL LOG keeps (default 128)")
    p.add_argument("--protected-mode", metavar="yes|no",
                   help="while the default user has no password, refuse clients from other "
                        "addresses than 127.0.0.1 and ::1 (default yes)")
    p.add_argument("--shards", metavar="N",
                   help="bucket table shards, a power of two (default 256)")
    p.add_argument("--manual-clock", action="store_true", default=None,
                   help="start the clock at 0 and move it only with DEBUG CLOCK (tests)")
    p.add_argument("--maxclients", metavar="N")
    p.add_argument("--proto-max-bulk-len", metavar="SIZE")
    p.add_argument("--max-multibulk-len", metavar="N")
    p.add_argument("--client-query-buffer-limit", metavar="SIZE")
    p.add_argument("--client-output-buffer-limit", nargs="+", metavar="LIMIT",
                   help="[CLASS] HARD SOFT SECONDS, repeated per class (normal, replica, "
                        "pubsub); without a class, normal")
    p.add_argument("--hz", metavar="N", help="background task frequency (default 10)")
    p.add_argument("--sweep-budget-ms", metavar="N", help="time per tick for dropping idle buckets")
    p.add_argument("--denial-log-seconds", metavar="N",
                   help="denials by rules are logged as one line at most this often (default 10)")
    p.add_argument("--snapshot-file", metavar="PATH",
                   help="buckets are saved here at shutdown, by SAVE/BGSAVE and every "
                        "save-seconds, and loaded at start (default fastlimit.snap, on another "
                        "port than 6380 fastlimit-<port>.snap; '' for none)")
    p.add_argument("--save-seconds", metavar="N",
                   help="BGSAVE this often (default 0: only at shutdown and on request)")
    p.add_argument("--loglevel", choices=sorted(LOGLEVELS))
    p.add_argument("--rules-db", metavar="PATH",
                   help="SQLite file the named rules are kept in (default "
                        "fastlimit-rules.db, on another port than 6380 "
                        "fastlimit-rules-<port>.db; '' keeps them in memory only)")
    p.add_argument("--rules-file", metavar="PATH",
                   help="TOML or JSON rules file, loaded at start and reloaded on "
                        "SIGHUP and CL.RULE RELOAD")
    p.add_argument("--replicaof", nargs=2, metavar=("HOST", "PORT"),
                   help="start as a read-only replica of this primary")
    p.add_argument("--masterauth", metavar="PW",
                   help="password a replica AUTHs to its primary with: the default user's "
                        "(requirepass), or masteruser's")
    p.add_argument("--masteruser", metavar="USER",
                   help="the primary's ACL user a replica AUTHs as (AUTH <user> "
                        "<masterauth>), which needs +cl.sync +replconf")
    p.add_argument("--replica-priority", metavar="N",
                   help="Sentinel promotes the replica with the lowest priority first; "
                        "0: never (default 100)")
    p.add_argument("--replica-announce-ip", metavar="ADDR",
                   help="address a replica asks its primary to list it under (INFO "
                        "replication), where Sentinel finds it (default: the link's own)")
    p.add_argument("--replica-announce-port", metavar="N",
                   help="port a replica asks its primary to list it under "
                        "(default 0: the port it listens on)")
    p.add_argument("--replica-announced", metavar="yes|no",
                   help="whether Sentinel lists this replica (default yes)")
    p.add_argument("--repl-user", metavar="USER",
                   help="the ACL user repl-password makes for replicas (default replica)")
    p.add_argument("--repl-password", metavar="PW",
                   help="makes repl-user an ACL user with this password that may only "
                        "replicate (+cl.sync +replconf), and the only one CL.SYNC "
                        "serves (default: none)")
    p.add_argument("--repl-max-full-copies", metavar="N",
                   help="full copies (a fork and a dataset-sized memory file each) in "
                        "flight at once; replicas arriving meanwhile share one (default 2)")
    p.add_argument("--repl-timeout", metavar="N",
                   help="seconds of silence after which a replication link is dropped (default 60)")
    p.add_argument("--repl-flush-ms", metavar="N",
                   help="a primary sends changed buckets to its replicas this often (default 2)")
    p.add_argument("--repl-buffer-limit", metavar="SIZE",
                   help="unsent replication output per replica (beyond its full copy) "
                        "past which it is dropped and resyncs (default 256mb)")
    p.add_argument("--rules-cache-size", metavar="SIZE",
                   help="bytes the CL.LIMIT match cache may hold (default 16mb; 0: no cache)")
    p.add_argument("--maxmemory", metavar="SIZE",
                   help="bytes the bucket tables may hold (e.g. 200mb; default 0: no bound)")
    p.add_argument("--maxmemory-policy", metavar="POLICY",
                   help="at the bound: nearest-full evicts the sampled bucket soonest full "
                        "again (the default), allkeys-random any, noeviction refuses new "
                        "buckets with -OOM")
    p.add_argument("--maxmemory-samples", metavar="N",
                   help="buckets looked at per eviction (default 5)")
    p.add_argument("--cluster-enabled", metavar="yes|no",
                   help="serve the hash slots the slot map gives this node's shard, "
                        "and redirect the others with -MOVED (default no)")
    p.add_argument("--cluster-config-file", metavar="PATH",
                   help="the slot map (TOML), needed with cluster-enabled")
    p.add_argument("--cluster-announce-ip", metavar="ADDR",
                   help="this node's address in the slot map and in CLUSTER replies "
                        "(default: the first bind address)")
    p.add_argument("--cluster-announce-port", metavar="N",
                   help="this node's port there (default 0: the port it listens on)")
    p.add_argument("--cluster-sentinel-password", metavar="PW",
                   help="password of the map's sentinels, when they require one")
    p.add_argument("--cluster-user", metavar="NAME",
                   help="the ACL user the nodes of a cluster call each other as")
    p.add_argument("--cluster-password", metavar="PW",
                   help="cluster-user's password, which each node proves it knows without "
                        "sending it (CL.PEERAUTH); needed unless bound to loopback only")
    p.add_argument("--http-port", metavar="N",
                   help=f"HTTP port for the JSON check and rule APIs, /metrics, health "
                        f"and the status page, on the bind addresses (default port + "
                        f"{FRONT_PORT_OFFSETS['http-port']}, 8380 beside 6380; 0: no HTTP)")
    p.add_argument("--http-metrics-auth", metavar="yes|no",
                   help="with requirepass, /metrics needs it too (default yes)")
    p.add_argument("--http-max-header-bytes", metavar="SIZE",
                   help="request line and headers past this get 431 (default 16kb)")
    p.add_argument("--http-max-body-bytes", metavar="SIZE",
                   help="request bodies past this get 413 (default 1mb)")
    p.add_argument("--http-header-timeout", metavar="N",
                   help="seconds a request's headers may take to arrive before 408, and a "
                        "gRPC client's HTTP/2 preface before it is closed; also the most "
                        "between two reads of an HTTP body, for an idle keep-alive "
                        "connection and for a client that reads none of its responses "
                        "(default 10)")
    p.add_argument("--http-body-timeout", metavar="N",
                   help="seconds an HTTP request's body may take in all before 408 "
                        "(default 60)")
    p.add_argument("--http-body-memory", metavar="SIZE",
                   help="request bodies being read, all HTTP connections together; a body "
                        "past it gets 503 (default 64mb)")
    p.add_argument("--http-batch-max", metavar="N",
                   help="checks in one POST /v1/check/batch (default 1000)")
    p.add_argument("--metrics-rule-labels", metavar="N",
                   help="rules with a rule label of their own in /metrics; the rest "
                        "are summed as __other__ (default 1000; 0: no per-rule series)")
    p.add_argument("--rls-config", metavar="PATH",
                   help="envoyproxy/ratelimit's YAML for the Envoy rate limit service: a "
                        "file or a directory of *.yaml (default none: no domains)")
    p.add_argument("--rls-xds-server", metavar="HOST:PORT",
                   help="take the rate limit service's configuration from this xDS server "
                        "(ADS, State of the World, RateLimitConfig resources, as Envoy "
                        "Gateway serves them) instead of rls-config (default none)")
    p.add_argument("--rls-xds-node-id", metavar="ID",
                   help="the node id the xDS server knows this server by (default default)")
    p.add_argument("--rls-xds-backoff", metavar="'FIRST LONGEST'",
                   help="seconds before reconnecting to the xDS server, doubling from FIRST "
                        "up to LONGEST, with jitter (default '10 60')")
    p.add_argument("--rls-xds-tls", metavar="yes|no",
                   help="the xDS stream over TLS: the server's certificate must chain to "
                        "tls-ca-cert-file (and name its host); this end shows "
                        "tls-client-cert-file, else tls-cert-file (default no)")
    p.add_argument("--rls-response-headers", metavar="yes|no",
                   help="the rate limit service adds the RateLimit-Policy, RateLimit and "
                        "(when over) Retry-After headers to its answers (default no)")
    p.add_argument("--rls-shadow-mode", metavar="yes|no",
                   help="the rate limit service answers OK to every request it would "
                        "refuse, and counts it, as the reference's SHADOW_MODE (default no)")
    p.add_argument("--rls-merge-domains", metavar="yes|no",
                   help="files of rls-config with the same domain are merged, as the "
                        "reference's MERGE_DOMAIN_CONFIG; otherwise a duplicate domain is an "
                        "error (default no)")
    p.add_argument("--rls-max-config-bytes", metavar="SIZE",
                   help="the most bytes the rate limit service's configuration may take, "
                        "rls-config's files together or an xDS response (default 4mb)")
    p.add_argument("--rls-max-descriptors", metavar="N",
                   help="the most descriptors it may have, every domain together, aliases "
                        "expanded (default 100000)")
    p.add_argument("--grpc-port", metavar="N",
                   help=f"gRPC port (cleartext HTTP/2) for Envoy's rate limit service "
                        f"(ShouldRateLimit) and the gRPC health check, on the bind addresses "
                        f"(default port + {FRONT_PORT_OFFSETS['grpc-port']}, 8081 beside 6380; "
                        f"0: no gRPC)")
    p.add_argument("--grpc-max-concurrent-streams", metavar="N",
                   help="calls one gRPC connection may have open at once, as HTTP/2's "
                        "SETTINGS_MAX_CONCURRENT_STREAMS (default 100; new connections)")
    p.add_argument("--grpc-max-descriptors", metavar="N",
                   help="descriptors one ShouldRateLimit call may have; more get "
                        "RESOURCE_EXHAUSTED (default 256; Envoy sends one per rate limit "
                        "of the route)")
    p.add_argument("--grpc-deadline-ms", metavar="N",
                   help="a gRPC call not answered within this many milliseconds fails "
                        "with UNAVAILABLE, so Envoy's failure mode decides before its own "
                        "timeout (default 15; 0: only the client's grpc-timeout)")
    p.add_argument("--tls-port", metavar="N",
                   help="TLS port for the Redis protocol, beside --port (default 0: none)")
    for name, what in (("cert-file", "the server's certificate (PEM)"),
                       ("key-file", "its private key (PEM)"),
                       ("key-file-pass", "the private key's passphrase"),
                       ("client-cert-file", "the certificate the replication link shows "
                                            "(default: tls-cert-file)"),
                       ("client-key-file", "its private key"),
                       ("client-key-file-pass", "that key's passphrase"),
                       ("ca-cert-file", "CA certificates that client and primary "
                                        "certificates must chain to"),
                       ("ca-cert-dir", "a directory of them (OpenSSL's c_rehash layout)"),
                       ("ciphers", "OpenSSL cipher list for TLSv1.2 and below")):
        p.add_argument(f"--tls-{name}", metavar="VALUE", help=what)
    p.add_argument("--tls-auth-clients", metavar="yes|no|optional",
                   help="client certificates: required, not asked for, or checked if sent "
                        "(default yes)")
    p.add_argument("--tls-protocols", metavar="LIST",
                   help='TLS versions, e.g. "TLSv1.2 TLSv1.3" (the default)')
    p.add_argument("--tls-ciphersuites", metavar="LIST",
                   help="TLSv1.3 suites; only where Python's ssl can set them")
    p.add_argument("--tls-replication", metavar="yes|no",
                   help="a replica connects to its primary's tls-port over TLS (default no)")
    p.add_argument("--tls-cluster", metavar="yes|no",
                   help="the cluster's nodes are known by their tls-port and call each "
                        "other over TLS (default no)")
    p.add_argument("--tls-http", metavar="yes|no",
                   help="http-port speaks HTTPS, with the tls-* certificate (default no)")
    p.add_argument("--tls-grpc", metavar="yes|no",
                   help="grpc-port speaks gRPC over TLS (ALPN h2), with the tls-* "
                        "certificate (default no)")
    return p


def from_args(argv=None) -> Settings:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = Settings()
    given = load_file(args.config, settings) if args.config else set()
    for action in parser._actions:
        if action.dest in ("help", "config"):
            continue
        value = getattr(args, action.dest)
        if value is not None:
            given.add(apply(settings, action.dest, value))
    for name, default in PORT_NAMED_FILES.items():
        if name not in given:
            setattr(settings, attr_name(name), file_for_port(default, settings.port))
    return settings.validate()
