"""The TOML config file: loading it, CONFIG REWRITE's rewrite of it, and
the all-or-nothing file write that uses (the cluster's slot map too)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import tomllib

import tomlkit
import tomlkit.exceptions

from fastlimit.server.config.schema import SETTINGS, Settings, apply, attr_name, defaults_for
from fastlimit.server.config.values import ConfigError


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
    for key, spec in SETTINGS.items():
        value = getattr(settings, attr_name(key))
        lines = [name for name in dict.fromkeys((key, attr_name(key))) if name in table]
        if lines and _says(spec.kind.parse, table[lines[0]], value):
            continue
        for name in lines[1:]:
            del table[name]
        if value is None and getattr(defaults, attr_name(key)) is None:
            if lines:
                del table[lines[0]]
        elif lines or value != getattr(defaults, attr_name(key)):
            table[lines[0] if lines else key] = _toml_value(key, value, spec.kind.show)
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
