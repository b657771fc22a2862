"""CONFIG GET, SET, REWRITE and RESETSTAT, over fastlimit.server.config."""

from __future__ import annotations

from fastlimit._resp import ReplyError, Sliced
from fastlimit.server import config as cfg
from fastlimit.server.commands.replies import OK


def cmd_config_get(conn, args):
    return Sliced(cfg.get_matching(conn.core.app.settings, args[2:]))


def cmd_config_set(conn, args):
    if len(args) % 2:      # Redis 7.0: pairs or a syntax error
        raise ReplyError("ERR syntax error")
    # surrogateescape: every byte as sent (a password is its bytes, see
    # cfg.parse_secret), and an error names the argument as sent, as Redis's
    pairs = [(args[i].decode("utf-8", "surrogateescape"),
              args[i + 1].decode("utf-8", "surrogateescape")) for i in range(2, len(args), 2)]
    try:
        conn.core.app.config_set(pairs)
    except cfg.UnknownSetting as e:
        raise ReplyError(f"ERR Unknown option or number of arguments for CONFIG SET - "
                         f"'{e.name}'") from None
    except cfg.ConfigError as e:
        raise ReplyError(f"ERR CONFIG SET failed (possibly related to argument "
                         f"'{e.name}') - {e.reason}") from None
    return OK


def cmd_config_resetstat(conn, args):
    conn.core.app.reset_stats()
    return OK


def cmd_config_rewrite(conn, args):
    """Writes the running settings into the config file (see cfg.rewrite),
    as Sentinel's failover does after SLAVEOF so a restart keeps the role."""
    app = conn.core.app
    path = app.settings.config_file
    if path is None:
        raise ReplyError("ERR The server is running without a config file")
    try:
        cfg.rewrite(app.settings, path)
    except cfg.ConfigError as e:
        conn.core.log.warning("CONFIG REWRITE of %s failed: %s", path, e.reason)
        raise ReplyError(f"ERR Rewriting config file: {e.reason}") from None
    conn.core.log.info("CONFIG REWRITE executed with success.")
    return OK
