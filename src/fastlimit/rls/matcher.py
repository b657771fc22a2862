"""The reference's GetLimit (rateLimitConfigImpl.GetLimit), exactly:

    per entry (k, v): the exact key_value child, else the first wildcard
    child in load order matching "k_v" (each '*' any run of bytes), else
    the key-only child k; a limit counts only at the descriptor's last
    entry; a child without children ends the walk (deeper entries: no
    limit); no backtracking.

The tree is config.Node, built once per load; a lookup builds one bytes
object per entry ("k_v") and nothing else unless share_threshold applies.
"""

from __future__ import annotations

from fastlimit.rls.config import Node


def wildcard_match(parts: tuple, value: bytes) -> bool:
    """wildcardMatch: value against a pattern split on '*'."""
    if len(parts) == 1:
        return parts[0] == value
    first, last = parts[0], parts[-1]
    if not value.startswith(first) or not value.endswith(last):
        return False
    if len(value) < sum(len(p) for p in parts):
        return False
    end = len(value) - len(last)
    pos = len(first)
    for part in parts[1:-1]:
        i = value.find(part, pos, end)
        if i < 0:
            return False
        pos = i + len(part)
    return True


def find_limit(root: Node, entries) -> tuple[Node | None, tuple | None]:
    """(the node with limits the descriptor lands on, or None; the
    share_threshold value patterns by entry index, or None)."""
    node = root
    last = len(entries) - 1
    found = None
    shares = None
    for i, (k, v) in enumerate(entries):
        child = node.children.get(k + b"_" + v)
        if child is None and node.wildcards:
            joined = k + b"_" + v
            for parts, candidate in node.wildcards:
                if wildcard_match(parts, joined):
                    child = candidate
                    if candidate.share_pattern is not None:
                        if shares is None:
                            shares = [None] * len(entries)
                        shares[i] = candidate.share_pattern
                    break
        if child is None:
            child = node.children.get(k)
        if child is None:
            break
        if i == last and child.limits:
            found = child
        if not child.children:
            break
        node = child
    return found, (tuple(shares) if shares is not None and found is not None else None)
