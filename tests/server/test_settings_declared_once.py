"""Each setting is declared once, as a field of Settings
(fastlimit/server/config/schema.py), and what is told about it elsewhere
agrees with that declaration: the README's settings tables (every setting
in one row, with its default and whether CONFIG SET changes it), the
example config file (which says it shows the defaults), --help, and what
CONFIG SET refuses on a real server."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import redis
from servers import PYTHON

from fastlimit.server import config as cfg
from fastlimit.server.config.cli import help_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
EXAMPLE = os.path.join(ROOT, "server", "fastlimit.toml")
TABLE_HEAD = "| setting | default | `CONFIG SET` | meaning |"


def readme_rows() -> list[tuple[list[str], str, str]]:
    """(settings, default, CONFIG SET) of each row of the README's settings
    tables, the cells without their backticks."""
    rows, in_table = [], False
    with open(README, encoding="utf-8") as f:
        for line in f.read().splitlines():
            if line == TABLE_HEAD:
                in_table = True
            elif in_table and line.startswith("| `"):
                names, default, runtime = line.split(" | ")[:3]
                rows.append((re.findall(r"`([^`]+)`", names), default.replace("`", ""), runtime))
            elif not line.startswith("|"):
                in_table = False
    return rows


def per_setting(cell: str, names: list[str]) -> list[str]:
    """A cell gives one value for every setting of its row, or one each."""
    parts = cell.split(", ")
    return parts if len(parts) == len(names) else [cell] * len(names)


def test_the_readme_tables_give_every_setting_once_with_its_default_and_config_set():
    rows = readme_rows()
    named = [name for names, _, _ in rows for name in names]
    assert sorted(named) == sorted(cfg.SETTINGS), "each setting in exactly one row"
    for names, default, runtime in rows:
        for name, said, settable in zip(names, per_setting(default, names),
                                        per_setting(runtime, names), strict=True):
            spec = cfg.SETTINGS[name]
            assert said == spec.default_words(), name
            assert settable == ("yes" if spec.runtime else "no"), name


def test_the_example_config_file_holds_the_defaults():
    loaded = cfg.Settings()
    given = cfg.load_file(EXAMPLE, loaded)
    defaults = cfg.defaults_for(loaded)      # its port's, the fronts' ports follow it
    assert given
    for name in given:
        attr = cfg.attr_name(name)
        assert getattr(loaded, attr) == getattr(defaults, attr), name


def test_no_help_states_a_default_by_hand():
    for name, spec in cfg.SETTINGS.items():
        assert not re.search(r"[(;] ?default\b(?! '?\{default\})", spec.help), name


def test_the_help_lists_every_setting_with_its_declared_default():
    out = subprocess.run([PYTHON, "-m", "fastlimit.server", "--help"], capture_output=True,
                         text=True, check=True, timeout=60,
                         env={**os.environ, "COLUMNS": "100000"}).stdout     # help unwrapped
    options = out.split("\noptions:\n")[1]
    entries = {entry.split()[0]: " ".join(entry.split())
               for entry in re.split(r"\n(?=  -)", options)}
    # --config and --takeover name what to start from, once: not settings
    assert set(entries) == {"-h,", "--config", "--takeover"} | {f"--{name}"
                                                                 for name in cfg.SETTINGS}
    for name, spec in cfg.SETTINGS.items():
        assert entries[f"--{name}"].endswith(" ".join(help_text(spec).split())), name
        if spec.default is not None or spec.shown is not None:
            assert spec.default_words() in help_text(spec), name


@pytest.fixture
def client(make_server):
    return redis.Redis(port=make_server().port, decode_responses=True)


def test_config_set_refuses_exactly_the_settings_declared_fixed(client):
    refused = set()
    for name, value in client.config_get("*").items():
        try:
            client.config_set(name, value)     # its own value: nothing changes
        except redis.ResponseError as e:
            assert "can't set immutable config" in str(e), name
            refused.add(name)
    assert refused == {name for name, spec in cfg.SETTINGS.items() if not spec.runtime}
