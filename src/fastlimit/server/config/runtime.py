"""CONFIG SET and CONFIG GET over the settings: Redis's checks and error
texts, and its pattern matching."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache

from fastlimit.server.config.name_matcher import NameMatcher
from fastlimit.server.config.schema import SETTINGS, Settings, apply, attr_name
from fastlimit.server.config.values import ConfigError, UnknownSetting

# Redis settings that clients ask about; fixed, because fastlimit keeps
# buckets in memory only (snapshots come with replication).
FIXED = {"save": "", "appendonly": "no", "databases": "1", "timeout": "0",
         "daemonize": "no"}   # never: CONFIG SET daemonize yes is Redis's immutable error


def set_at_runtime(settings: Settings, pairs) -> Settings:
    """CONFIG SET's checks, in Redis's order: every name known, changeable
    and given once; then every value.  Returns a checked copy with the
    pairs applied; settings itself is not touched.  pairs are (name as
    sent, value) strings."""
    keys = []
    for name, value in pairs:
        key = name.lower()
        if key not in SETTINGS and key not in FIXED:
            raise UnknownSetting("unknown setting", name)
        # these two name the argument as sent, value errors the setting (as Redis)
        if not _runtime(key) and FIXED.get(key) != value:
            raise ConfigError("can't set immutable config", name)
        if key in keys:
            raise ConfigError("duplicate parameter", name)
        keys.append(key)
    trial = replace(settings)
    for key, (_, value) in zip(keys, pairs, strict=True):
        if _runtime(key):
            apply(trial, key, value, SETTINGS[key].at_runtime)
    if any(key.startswith("tls-") for key in keys):
        trial.tls_generation += 1
    return trial.validate()


def _runtime(key: str) -> bool:
    """Whether CONFIG SET may change the setting key."""
    spec = SETTINGS.get(key)
    return spec is not None and spec.runtime


def get_all(settings: Settings) -> dict[str, str]:
    """Every setting as CONFIG GET shows it."""
    out = {key: spec.kind.show(getattr(settings, attr_name(key)))
           for key, spec in SETTINGS.items()}
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
    return NameMatcher(list(SETTINGS) + list(FIXED))
