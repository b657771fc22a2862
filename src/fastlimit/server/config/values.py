"""The settings' values: how each kind is read from text (the command
line, CONFIG SET) or a TOML value, shown by CONFIG GET, and put in words
as a default (--help, the README), and the error a bad one raises."""

from __future__ import annotations

import ipaddress
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastlimit._resp import parse_integer
from fastlimit.regions.shares import MAX_REGIONS, REGION_NAME, PeerAddress


class ConfigError(ValueError):
    """A setting has a value the server cannot use.  ``reason`` is worded
    as Redis words CONFIG SET errors; ``name`` is the setting, when known."""

    def __init__(self, reason: str, name: str | None = None):
        super().__init__(f"{name}: {reason}" if name else reason)
        self.reason = reason
        self.name = name


class UnknownSetting(ConfigError):
    """CONFIG SET names a setting the server does not have."""


@dataclass(frozen=True)
class Kind:
    """What a setting's values are.  ``parse`` reads text or a TOML value
    (ConfigError says what is wrong; every size fits the C fields it ends
    in, int64), ``show`` is the text CONFIG GET answers, ``words`` a
    default as --help and the README give it (``show``'s when None), and
    ``metavar`` how --help writes a value of the kind."""

    parse: Callable[[Any], Any]
    show: Callable[[Any], str] = str
    words: Callable[[Any], str] | None = None
    metavar: str = "VALUE"

    def describe(self, value) -> str:
        return (self.words or self.show)(value)


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


def memory_words(n: int) -> str:
    """A size in the largest of Redis's binary units that holds it whole
    (16kb, 512mb, 1gb), as a config file would say it."""
    for unit in ("gb", "mb", "kb"):
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


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


def integer(low: int, high: int) -> Kind:
    return Kind(lambda v: parse_int(v, low, high), metavar="N")


def memory(low: int = 0, high: int = INT64_MAX) -> Kind:
    return Kind(lambda v: parse_memory(v, low, high), words=memory_words, metavar="SIZE")


def number(low: float, high: float, above_low: bool = False) -> Kind:
    return Kind(lambda v: parse_number(v, low, high, above_low=above_low),
                words=lambda x: f"{x:g}", metavar="N")


def optional_text(value) -> str | None:
    return str(value) or None


def parse_rules_store(value) -> str:
    """rules-store: "" (the SQLite file rules-db), sqlite:<file>, or a
    PostgreSQL URI (postgresql:// or postgres://, as libpq takes it)."""
    text = str(value)
    if text == "" or text.startswith("sqlite:"):
        return text
    if text.split("://", 1)[0] in ("postgresql", "postgres") and "://" in text:
        return text
    raise ConfigError("must be sqlite:<file> or a PostgreSQL URI "
                      "(postgresql://user:password@host:port/database)")


RULES_STORE = Kind(parse_rules_store, metavar="URI")


def show_optional(value) -> str:
    return value or ""


def words(value) -> list[str]:
    """A setting of several words, as one string (the command line, CONFIG
    SET) or a TOML array of strings and numbers; any other TOML value is
    an error that says so, not a crash."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float))
                                       and not isinstance(v, bool) for v in value):
        return [str(v) for v in value]
    raise ConfigError("argument must be a string or an array of strings")


BOOL = Kind(parse_bool, lambda v: "yes" if v else "no", metavar="yes|no")
TEXT = Kind(str)
# a path, a user name...: "" for none
OPTIONAL_TEXT = Kind(optional_text, show_optional)
ADDRESSES = Kind(lambda v: words(v), " ".join)


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
    parts = words(value)
    if len(parts) == 3 and not parts[0][:1].isalpha():     # no class named: normal
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


def format_output_limit(limits: dict[str, tuple[int, int, int]],
                        size: Callable[[int], str] = str) -> str:
    return " ".join("{} {} {} {}".format("slave" if name == "replica" else name,
                                         size(limits[name][0]), size(limits[name][1]),
                                         limits[name][2])
                    for name in DEFAULT_OUTPUT_LIMITS)


OUTPUT_LIMITS = Kind(parse_output_limit, format_output_limit,
                     lambda limits: format_output_limit(limits, memory_words))


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


LOGLEVELS = {"debug": 10, "verbose": 15, "notice": 20, "warning": 30}


def parse_loglevel(value) -> str:
    level = str(value).lower()
    if level not in LOGLEVELS:
        raise ConfigError("argument(s) must be one of the following: " + ", ".join(LOGLEVELS))
    return level


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


SECRET = Kind(parse_secret, format_secret, metavar="PW")


def parse_front_port(value) -> int | None:
    """A front's port; "" for the default, which follows port."""
    return None if value == "" else parse_int(value, 0, 65535)


FRONT_PORT = Kind(parse_front_port, lambda v: "" if v is None else str(v), metavar="N")


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
    text = " ".join(words(value))
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


def parse_region(value) -> str | None:
    """A region's name, "" for none."""
    text = str(value)
    if text and not REGION_NAME.fullmatch(text):
        raise ConfigError("a region's name is 1 to 64 characters of A-Z a-z 0-9 _ -")
    return text or None


def parse_regions(value) -> list[str]:
    """Region names, each once, sorted (every region lists the same ones)."""
    names = words(value)
    for name in names:
        parse_region(name)
    if len(set(names)) != len(names):
        raise ConfigError("regions names a region twice")
    if len(names) > MAX_REGIONS:
        raise ConfigError(f"at most {MAX_REGIONS} regions")
    return sorted(names)


def parse_replicaof(value) -> tuple[str, int] | None:
    """``<host> <port>``, as one string or a list; "" or "no one" for none."""
    parts = words(value)
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


def parse_region_peers(value) -> dict[str, PeerAddress]:
    """``<region>=<host>:<port> ...`` ([v6]:port too), or for a region whose
    primary Sentinel watches ``<region>=sentinel:<service>@<host>:<port>[,...]``
    (its sentinels), or for a region whose tier is a cluster
    ``<region>=cluster:<host>:<port>[,...]`` (seeds): where each peer
    region's tier is reached."""
    if isinstance(value, dict):         # parsed already (Settings.validate)
        value = show_region_peers(value)
    peers: dict[str, PeerAddress] = {}
    for word in words(value):
        name, _, address = word.partition("=")
        if name in peers:
            raise ConfigError(f"region-peers names region '{name}' twice")
        peers[parse_region(name) or ""] = _peer_address(address)
    return peers


def _peer_address(text: str) -> PeerAddress:
    service = None
    cluster = text.startswith("cluster:")
    if cluster:
        text = text[len("cluster:"):]
    elif text.startswith("sentinel:"):
        service, at, text = text[len("sentinel:"):].partition("@")
        if not at or not service:
            raise ConfigError("argument must be <region>=sentinel:<service>@<host>:<port>"
                              "[,<host>:<port>...]")
    addresses = []
    for part in text.split(",") if service or cluster else [text]:
        host, _, port = part.rpartition(":")
        if not _HOST.fullmatch(host):
            raise ConfigError("argument must be <region>=<host>:<port> (or "
                              "<region>=sentinel:<service>@<host>:<port>,... or "
                              "<region>=cluster:<host>:<port>,...) ...")
        addresses.append((host.strip("[]"), parse_int(port, 1, 65535)))
    if cluster:
        return PeerAddress("", 0, None, tuple(addresses), cluster=True)
    if service:
        return PeerAddress("", 0, service, tuple(addresses))
    return PeerAddress(*addresses[0])


def show_region_peers(peers: dict[str, PeerAddress]) -> str:
    return " ".join(f"{name}={address}" for name, address in peers.items())


def parse_backoff(value) -> tuple[float, float]:
    """``<first> <longest>``: seconds before the first reconnection and
    the most any later one waits (each doubles the last)."""
    parts = words(value)
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
