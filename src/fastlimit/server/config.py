"""Server settings: defaults, the TOML config file, the command line, and
the CONFIG GET/SET view of them.

Names follow Redis where Redis has the setting (``maxclients``,
``proto-max-bulk-len``, ...).  In a TOML file either ``proto-max-bulk-len``
or ``proto_max_bulk_len`` may be used.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from dataclasses import dataclass, field

DEFAULT_PORT = 6380


class ConfigError(ValueError):
    """A setting has a value the server cannot use."""


_MEMORY = re.compile(r"^(\d+)(k|kb|m|mb|g|gb)?$", re.IGNORECASE)
_UNITS = {None: 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2,
          "g": 1000**3, "gb": 1024**3}


def parse_memory(value) -> int:
    """Redis's memory notation: 1k = 1000 bytes, 1kb = 1024 bytes, ..."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"negative size: {value}")
        return value
    m = _MEMORY.match(str(value).strip())
    if not m:
        raise ConfigError(f"not a size: {value!r} (use e.g. 1024, 64kb, 32mb)")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _UNITS[unit]


def parse_int(value, low: int, high: int, name: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not low <= n <= high:
        raise ConfigError(f"{name} must be from {low} to {high}, got {value!r}")
    return n


def parse_bool(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("yes", "true", "1", "on"):
        return True
    if text in ("no", "false", "0", "off"):
        return False
    raise ConfigError(f"{name} must be yes or no, got {value!r}")


def parse_output_limit(value) -> tuple[int, int, int]:
    """``<hard> <soft> <soft-seconds>``, as one string or a list."""
    parts = value.split() if isinstance(value, str) else list(value)
    if len(parts) == 4 and str(parts[0]).lower() == "normal":
        parts = parts[1:]
    if len(parts) != 3:
        raise ConfigError("client-output-buffer-limit takes <hard> <soft> <soft-seconds>")
    return (parse_memory(parts[0]), parse_memory(parts[1]),
            parse_int(parts[2], 0, 10**9, "client-output-buffer-limit soft seconds"))


@dataclass
class Settings:
    bind: list[str] = field(default_factory=lambda: ["127.0.0.1"])
    port: int = DEFAULT_PORT
    requirepass: str | None = None
    shards: int = 256
    manual_clock: bool = False
    maxclients: int = 10000
    proto_max_bulk_len: int = 512 * 1024 * 1024
    max_multibulk_len: int = 1024 * 1024
    client_query_buffer_limit: int = 1024 * 1024 * 1024
    client_output_buffer_limit: tuple[int, int, int] = (32 * 1024**2, 8 * 1024**2, 60)
    hz: int = 10
    sweep_budget_ms: float = 1.0
    denial_log_seconds: float = 10.0
    snapshot_file: str | None = "fastlimit.snap"
    save_seconds: int = 0
    loglevel: str = "notice"
    config_file: str | None = None
    rules_db: str | None = "fastlimit-rules.db"
    rules_file: str | None = None
    replicaof: tuple[str, int] | None = None
    masterauth: str | None = None
    masteruser: str | None = None
    repl_user: str = "replica"
    repl_password: str | None = None
    repl_max_full_copies: int = 2
    repl_timeout: int = 60
    repl_flush_ms: float = 2.0
    repl_buffer_limit: int = 256 * 1024**2

    def validate(self) -> "Settings":
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be from 0 to 65535, got {self.port}")
        if not self.bind:
            raise ConfigError("bind needs at least one address")
        if self.shards < 1 or self.shards > 65536 or self.shards & (self.shards - 1):
            raise ConfigError(f"shards must be a power of two from 1 to 65536, got {self.shards}")
        if not 1 <= self.maxclients <= 1_000_000:
            raise ConfigError(f"maxclients must be from 1 to 1000000, got {self.maxclients}")
        if not 1 <= self.hz <= 500:
            raise ConfigError(f"hz must be from 1 to 500, got {self.hz}")
        if not 1 <= self.proto_max_bulk_len <= 2**40:
            raise ConfigError("proto-max-bulk-len must be from 1 byte to 1 TB")
        if not 1 <= self.max_multibulk_len <= 2**31 - 1:
            raise ConfigError("max-multibulk-len must be from 1 to 2147483647")
        if self.loglevel not in LOGLEVELS:
            raise ConfigError(f"loglevel must be one of {', '.join(LOGLEVELS)}")
        if not 0 < self.sweep_budget_ms <= 100:
            raise ConfigError("sweep-budget-ms must be above 0 and at most 100")
        if not 0 < self.denial_log_seconds <= 86400:
            raise ConfigError("denial-log-seconds must be above 0 and at most 86400")
        if self.requirepass == "":
            self.requirepass = None
        if self.masterauth == "":
            self.masterauth = None
        if not 0.1 <= self.repl_flush_ms <= 1000:
            raise ConfigError("repl-flush-ms must be from 0.1 to 1000")
        if self.repl_buffer_limit < 1024:
            raise ConfigError("repl-buffer-limit must be at least 1kb")
        if not 1 <= self.repl_max_full_copies <= 64:
            raise ConfigError("repl-max-full-copies must be from 1 to 64")
        if self.repl_password == "":
            self.repl_password = None
        if self.masteruser == "":
            self.masteruser = None
        if not self.repl_user:
            raise ConfigError("repl-user must not be empty")
        if self.masteruser and not self.masterauth:
            raise ConfigError("masteruser needs masterauth (its password)")
        return self


LOGLEVELS = {"debug": 10, "verbose": 15, "notice": 20, "warning": 30}

# name -> (parse from text, format for CONFIG GET)
_FIELDS = {
    "bind": (lambda v: v.split() if isinstance(v, str) else list(v), " ".join),
    "port": (lambda v: parse_int(v, 0, 65535, "port"), str),
    "requirepass": (lambda v: str(v) or None, lambda v: v or ""),
    "shards": (lambda v: parse_int(v, 1, 65536, "shards"), str),
    "manual-clock": (lambda v: parse_bool(v, "manual-clock"), lambda v: "yes" if v else "no"),
    "maxclients": (lambda v: parse_int(v, 1, 1_000_000, "maxclients"), str),
    "proto-max-bulk-len": (parse_memory, str),
    "max-multibulk-len": (lambda v: parse_int(v, 1, 2**31 - 1, "max-multibulk-len"), str),
    "client-query-buffer-limit": (parse_memory, str),
    "client-output-buffer-limit": (
        parse_output_limit, lambda v: "normal {} {} {}".format(*v)),
    "hz": (lambda v: parse_int(v, 1, 500, "hz"), str),
    "sweep-budget-ms": (float, str),
    "denial-log-seconds": (float, str),
    "snapshot-file": (lambda v: str(v) or None, lambda v: v or ""),
    "save-seconds": (lambda v: parse_int(v, 0, 10**9, "save-seconds"), str),
    "loglevel": (lambda v: str(v).lower(), str),
    "rules-db": (lambda v: str(v) or None, lambda v: v or ""),
    "rules-file": (lambda v: str(v) or None, lambda v: v or ""),
    "replicaof": (lambda v: parse_replicaof(v), lambda v: f"{v[0]} {v[1]}" if v else ""),
    "masterauth": (lambda v: str(v) or None, lambda v: v or ""),
    "masteruser": (lambda v: str(v) or None, lambda v: v or ""),
    "repl-user": (str, str),
    "repl-password": (lambda v: str(v) or None, lambda v: v or ""),
    "repl-max-full-copies": (lambda v: parse_int(v, 1, 64, "repl-max-full-copies"), str),
    "repl-timeout": (lambda v: parse_int(v, 1, 86400, "repl-timeout"), str),
    "repl-flush-ms": (float, str),
    "repl-buffer-limit": (parse_memory, str),
}


def parse_replicaof(value) -> tuple[str, int] | None:
    """``<host> <port>``, as one string or a list; "" or "no one" for none."""
    parts = value.split() if isinstance(value, str) else [str(v) for v in value]
    if not parts or [p.lower() for p in parts] == ["no", "one"]:
        return None
    if len(parts) != 2:
        raise ConfigError("replicaof takes <host> <port>")
    return parts[0], parse_int(parts[1], 1, 65535, "replicaof port")

# Settings that CONFIG SET may change while the server runs.
RUNTIME_SETTABLE = {"denial-log-seconds", "save-seconds", "maxclients", "proto-max-bulk-len", "max-multibulk-len",
                    "client-query-buffer-limit", "client-output-buffer-limit",
                    "hz", "sweep-budget-ms", "loglevel", "requirepass", "masterauth",
                    "masteruser", "repl-user", "repl-password", "repl-max-full-copies",
                    "repl-timeout", "repl-flush-ms", "repl-buffer-limit"}

# Redis settings that clients ask about; fixed, because fastlimit keeps
# buckets in memory only (snapshots come with replication).
FIXED = {"save": "", "appendonly": "no", "databases": "1", "timeout": "0",
         "maxmemory": "0", "maxmemory-policy": "noeviction",
         "cluster-enabled": "no", "protected-mode": "no"}


def attr_name(name: str) -> str:
    return name.replace("-", "_")


def apply(settings: Settings, name: str, value) -> None:
    """Sets one setting from text or a TOML value, validating it."""
    key = name.lower().replace("_", "-")
    if key not in _FIELDS:
        raise ConfigError(f"unknown setting {name!r}")
    parse, _ = _FIELDS[key]
    try:
        setattr(settings, attr_name(key), parse(value))
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key}: {e}") from None


def get_all(settings: Settings) -> dict[str, str]:
    """Every setting as CONFIG GET shows it."""
    out = {key: fmt(getattr(settings, attr_name(key))) for key, (_, fmt) in _FIELDS.items()}
    out.update(FIXED)
    return out


def load_file(path: str, settings: Settings) -> None:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    section = data.get("server", data)
    for name, value in section.items():
        if isinstance(value, dict):
            continue   # other sections belong to later features
        apply(settings, name, value)
    settings.config_file = path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastlimit-server",
        description="Rate-limiting counter server that speaks the Redis protocol.")
    p.add_argument("--config", metavar="FILE", help="TOML config file (command line wins)")
    p.add_argument("--port", type=int, help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--bind", nargs="+", metavar="ADDR", help="addresses to listen on (default 127.0.0.1)")
    p.add_argument("--requirepass", metavar="PW", help="password clients must AUTH with")
    p.add_argument("--shards", type=int, help="bucket table shards, a power of two (default 256)")
    p.add_argument("--manual-clock", action="store_true", default=None,
                   help="start the clock at 0 and move it only with DEBUG CLOCK (tests)")
    p.add_argument("--maxclients", type=int)
    p.add_argument("--proto-max-bulk-len", metavar="SIZE")
    p.add_argument("--max-multibulk-len", type=int)
    p.add_argument("--client-query-buffer-limit", metavar="SIZE")
    p.add_argument("--client-output-buffer-limit", nargs=3, metavar=("HARD", "SOFT", "SECONDS"))
    p.add_argument("--hz", type=int, help="background task frequency (default 10)")
    p.add_argument("--sweep-budget-ms", type=float, help="time per tick for dropping idle buckets")
    p.add_argument("--denial-log-seconds", type=float,
                   help="denials by rules are logged as one line at most this often (default 10)")
    p.add_argument("--snapshot-file", metavar="PATH",
                   help="buckets are saved here at shutdown, by SAVE/BGSAVE and every "
                        "save-seconds, and loaded at start (default fastlimit.snap; '' for none)")
    p.add_argument("--save-seconds", type=int,
                   help="BGSAVE this often (default 0: only at shutdown and on request)")
    p.add_argument("--loglevel", choices=sorted(LOGLEVELS))
    p.add_argument("--rules-db", metavar="PATH",
                   help="SQLite file the named rules are kept in (default "
                        "fastlimit-rules.db; '' keeps them in memory only)")
    p.add_argument("--rules-file", metavar="PATH",
                   help="TOML or JSON rules file, loaded at start and reloaded on "
                        "SIGHUP and CL.RULE RELOAD")
    p.add_argument("--replicaof", nargs=2, metavar=("HOST", "PORT"),
                   help="start as a read-only replica of this primary")
    p.add_argument("--masterauth", metavar="PW",
                   help="password a replica gives its primary: its requirepass, or with "
                        "masteruser its repl-password")
    p.add_argument("--masteruser", metavar="USER",
                   help="a replica syncs as this repl-user (CL.SYNC <user> <masterauth>)")
    p.add_argument("--repl-user", metavar="USER",
                   help="user name replicas give with repl-password (default replica)")
    p.add_argument("--repl-password", metavar="PW",
                   help="CL.SYNC needs <repl-user> <repl-password>, which also stand in "
                        "for requirepass on that connection (default: none)")
    p.add_argument("--repl-max-full-copies", metavar="N",
                   help="full copies (a fork and a dataset-sized memory file each) in "
                        "flight at once; replicas arriving meanwhile share one (default 2)")
    p.add_argument("--repl-timeout", type=int,
                   help="seconds of silence after which a replication link is dropped (default 60)")
    p.add_argument("--repl-flush-ms", type=float,
                   help="a primary sends changed buckets to its replicas this often (default 2)")
    p.add_argument("--repl-buffer-limit", metavar="SIZE",
                   help="unsent replication output per replica (beyond its full copy) "
                        "past which it is dropped and resyncs (default 256mb)")
    return p


def from_args(argv=None) -> Settings:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = Settings()
    if args.config:
        load_file(args.config, settings)
    for action in parser._actions:
        if action.dest in ("help", "config"):
            continue
        value = getattr(args, action.dest)
        if value is not None:
            apply(settings, action.dest, value)
    return settings.validate()
