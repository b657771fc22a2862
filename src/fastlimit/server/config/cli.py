"""The command line: one flag per setting, made from its declaration
(schema.py), and the settings a command line and its --config file give."""

from __future__ import annotations

import argparse
from typing import Any

from fastlimit.server.config.file import load_file
from fastlimit.server.config.schema import (
    PORT_NAMED_FILES,
    SETTINGS,
    Settings,
    Spec,
    apply,
    attr_name,
    file_for_port,
)


def help_text(spec: Spec) -> str:
    """The flag's help with its default in words: where the help puts
    ``{default}``, else at the end; a default of none goes without saying."""
    words = spec.default_words()
    if "{default}" in spec.help:
        return spec.help.replace("{default}", words)
    if spec.default is None and spec.shown is None:
        return spec.help
    return f"{spec.help} (default {words})"


def flag_options(spec: Spec) -> dict[str, Any]:
    """argparse's keywords for the setting's flag."""
    if spec.switch:      # present: on; absent: None, so that the config file's value stands
        return {"action": "store_true", "default": None, "help": help_text(spec)}
    options: dict[str, Any] = {"metavar": spec.metavar or spec.kind.metavar,
                               "help": help_text(spec)}
    if spec.choices is not None:
        options = {"choices": spec.choices, "help": options["help"]}
    if spec.nargs is not None:
        options["nargs"] = spec.nargs
    return options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastlimit-server",
        description="Rate-limiting counter server that speaks the Redis protocol.")
    p.add_argument("--config", metavar="FILE", help="TOML config file (command line wins)")
    p.add_argument("--takeover", metavar="SOCKET",
                   help="take over from the server whose takeover-socket this is: its "
                        "listeners and buckets, then it exits")
    for name, spec in SETTINGS.items():
        p.add_argument(f"--{name}", **flag_options(spec))
    return p


def from_args(argv=None) -> Settings:
    args = build_parser().parse_args(argv)
    settings = Settings()
    settings.takeover_from = args.takeover
    given = load_file(args.config, settings) if args.config else set()
    for name in SETTINGS:
        value = getattr(args, attr_name(name))
        if value is not None:
            given.add(apply(settings, name, value))
    for name, default in PORT_NAMED_FILES.items():
        if name not in given:
            setattr(settings, attr_name(name), file_for_port(default, settings.port))
    return settings.validate()
