"""YAML as go-yaml v2 reads it into envoyproxy/ratelimit's maps: PyYAML's
safe loader (its C one when built), except that a plain 2001-12-14 stays
a string, as it is there, and that a document whose aliases expand to too
much is refused as go-yaml (since v2.2.8) refuses it.  A module of its own
so PyYAML is imported only when a configuration file is read, not at
every server start."""

from __future__ import annotations

import yaml  # type: ignore[import-untyped]  # no stubs in the test set-up

YAMLError = yaml.YAMLError

# go-yaml's decode.go: a decode may be mostly alias expansion (99% of the
# nodes it visits) up to 400,000 nodes, and less and less of it (down to
# 10%) up to 4,000,000; past that, "document contains excessive aliasing".
# PyYAML shares an alias's node instead of copying it, but the
# configuration's tree walk would expand every alias: this bound is what
# keeps a 2 KB file from being a billion nodes.
ALIAS_RATIO_RANGE_LOW = 400_000
ALIAS_RATIO_RANGE_HIGH = 4_000_000
EXCESSIVE_ALIASING = "document contains excessive aliasing"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class DecodeError(yaml.YAMLError):
    """A document go-yaml's decoder refuses after parsing it."""


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    pass


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def parse(text: str):
    """The document; YAMLError when it is not YAML or aliases too much."""
    loader = _Loader(text)      # a safe loader
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if "&" in text:         # else no anchor, so no alias: nothing to count
            check_aliasing(node, text)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def allowed_alias_ratio(decoded: int) -> float:
    """go-yaml's allowedAliasRatio."""
    if decoded <= ALIAS_RATIO_RANGE_LOW:
        return 0.99
    if decoded >= ALIAS_RATIO_RANGE_HIGH:
        return 0.10
    return 0.99 - 0.89 * ((decoded - ALIAS_RATIO_RANGE_LOW)
                          / (ALIAS_RATIO_RANGE_HIGH - ALIAS_RATIO_RANGE_LOW))


def _excessive(decoded: int, aliased: int) -> bool:
    return aliased > 100 and decoded > 1000 and aliased / decoded > allowed_alias_ratio(decoded)


def _decoded_children(node) -> list:
    """The nodes go-yaml's decoder visits under node, in order (a merge
    key itself is not decoded, only its value)."""
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        out = []
        for key, value in node.value:
            if key.tag != _MERGE_TAG:
                out.append(key)
            out.append(value)
        return out
    return []


def check_aliasing(root, text: str) -> None:
    """Counts the nodes go-yaml's decode of the document into a map would
    visit, an alias's whole tree each time it is used, and raises
    DecodeError where go-yaml's check would fail.  Each node is walked
    once: an alias adds the size its node was found to have.  (go-yaml
    checks at every node; within an alias's expansion its ratio only
    grows while the allowed one only shrinks, so checking once after the
    expansion fails the same documents.)"""
    decoded, aliased = 1, 0         # the document node
    sizes: dict[int, int] = {}      # id(node) -> nodes one decode of it visits
    opened: set[int] = set()        # nodes being walked: an alias to one is a loop
    frames: list = []               # [node, children left, size so far]
    node = root
    while True:
        key = id(node)
        size = sizes.get(key)
        if size is not None:        # an alias: the alias node, then its tree again
            decoded += 1 + size
            aliased += size
            if _excessive(decoded, aliased):
                raise DecodeError(EXCESSIVE_ALIASING)
            frames[-1][2] += 1 + size
        elif key in opened:
            raise DecodeError(f"anchor '{_looping_anchor(text)}' value contains itself")
        else:
            decoded += 1
            if aliased and _excessive(decoded, aliased):
                raise DecodeError(EXCESSIVE_ALIASING)
            children = _decoded_children(node)
            if children:
                opened.add(key)
                frames.append([node, iter(children), 1])
            else:
                sizes[key] = 1
                if frames:
                    frames[-1][2] += 1
        while frames:
            following = next(frames[-1][1], None)
            if following is not None:
                node = following
                break
            done, _, size = frames.pop()
            sizes[id(done)] = size
            opened.discard(id(done))
            if frames:
                frames[-1][2] += size
        else:
            return


def _looping_anchor(text: str) -> str:
    """The first anchor used inside its own node (the error is rare, so
    the events are read again for its name rather than kept)."""
    open_anchors: list = []
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            open_anchors.append(event.anchor)
        elif isinstance(event, yaml.CollectionEndEvent):
            open_anchors.pop()
        elif isinstance(event, yaml.AliasEvent) and event.anchor in open_anchors:
            return event.anchor
    return ""


def problem(e: Exception) -> str:
    """The error as go-yaml words it."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or str(e)
    return f"yaml: line {mark.line + 1}: {what}" if mark is not None else f"yaml: {what}"
