"""Server settings: defaults, the TOML config file, the command line, and
the CONFIG GET/SET view of them.

Each setting is declared once, as a field of ``Settings`` (schema.py):
its kind of value (values.py), whether CONFIG SET may change it and its
help.  The command line (cli.py), the config file and CONFIG REWRITE
(file.py), and CONFIG GET/SET (runtime.py) are made from those
declarations.

Names follow Redis where Redis has the setting (``maxclients``,
``proto-max-bulk-len``, ...).  In a TOML file either ``proto-max-bulk-len``
or ``proto_max_bulk_len`` may be used.
"""

from fastlimit.server.config.cli import build_parser, from_args
from fastlimit.server.config.file import load_file, replace_file, rewrite
from fastlimit.server.config.runtime import FIXED, get_all, get_matching, set_at_runtime
from fastlimit.server.config.schema import (
    DEFAULT_PORT,
    SETTINGS,
    Settings,
    apply,
    attr_name,
    defaults_for,
    front_port,
)
from fastlimit.server.config.values import (
    LOGLEVELS,
    MAXMEMORY_POLICIES,
    TLS_PROTOCOLS,
    ConfigError,
    UnknownSetting,
    is_loopback,
    parse_announce_ip,
    parse_bool,
    parse_int,
    parse_memory,
    parse_number,
    parse_secret,
)

__all__ = [
    "DEFAULT_PORT", "FIXED", "LOGLEVELS", "MAXMEMORY_POLICIES", "SETTINGS", "TLS_PROTOCOLS",
    "ConfigError", "Settings", "UnknownSetting", "apply", "attr_name", "build_parser",
    "defaults_for", "from_args", "front_port", "get_all", "get_matching", "is_loopback",
    "load_file", "parse_announce_ip", "parse_bool", "parse_int", "parse_memory",
    "parse_number", "parse_secret", "replace_file", "rewrite", "set_at_runtime",
]
