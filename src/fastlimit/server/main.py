"""``fastlimit-server``: parse settings, set up logging, run."""

from __future__ import annotations

import logging
import sys

from fastlimit.server import config as cfg
from fastlimit.server.logs import setup_logging


def main(argv=None) -> None:
    try:
        settings = cfg.from_args(argv)
    except cfg.ConfigError as e:
        print(f"fastlimit-server: {e}", file=sys.stderr)
        sys.exit(2)
    setup_logging(settings.loglevel)
    from fastlimit.cluster.slot_map import MapError
    from fastlimit.rls.config import ConfigError as RlsConfigError
    from fastlimit.rules.model import RuleError
    from fastlimit.server.app import run
    from fastlimit.takeover.heir import TakeoverError
    try:
        run(settings)
    except (OSError, RuleError, MapError, RlsConfigError, cfg.ConfigError, TakeoverError) as e:
        logging.getLogger("fastlimit").error("cannot start: %s", e)
        sys.exit(1)


if __name__ == "__main__":
    main()
