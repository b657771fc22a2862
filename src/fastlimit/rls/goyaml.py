"""YAML as go-yaml v2 reads it into envoyproxy/ratelimit's maps: PyYAML's
safe loader (its C one when built), except that a plain 2001-12-14 stays
a string, as it is there.  A module of its own so PyYAML is imported only
when a configuration file is read, not at every server start."""

from __future__ import annotations

import yaml  # type: ignore[import-untyped]  # no stubs in the test set-up

YAMLError = yaml.YAMLError


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    pass


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def parse(text: str):
    """The document; YAMLError when it is not YAML."""
    return yaml.load(text, Loader=_Loader)     # a safe loader


def problem(e: Exception) -> str:
    """The error as go-yaml words it."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e)
    return f"yaml: line {mark.line + 1}: {what}" if mark is not None else f"yaml: {what}"
