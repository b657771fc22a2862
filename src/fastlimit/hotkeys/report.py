"""The hot-key tracker's counters as entries a person can read: the key a
CL.CHECK counts, or a named rule's bucket (the rule's id, the client and,
for a rule with a bucket per resource, the resource) that CL.LIMIT and the
HTTP check endpoints count, with estimated checks per second.

Space-Saving's guarantee, scaled by the sample: a key's sampled checks lie
between count - error and count, so its rate between ``ops_min`` and
``ops``.  No asyncio: INFO, HOTKEYS GET, /metrics and the status page all
read entries from here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from fastlimit._hotkeys import BUCKET, KEY_MAX, RULE, HotKeys
from fastlimit._rules import MAX_RULE_NUMBER

# How many characters of a key INFO, /metrics and the status page show:
# the tracker keeps KEY_MAX bytes, and a label longer than that helps nobody.
SHOWN_KEY_CHARS = KEY_MAX


@dataclass(frozen=True)
class Entry:
    source: str          # "bucket" (CL.CHECK) or "rule" (CL.LIMIT, /v1/check)
    key: bytes           # CL.CHECK's key; for a rule, client (and resource) as below
    truncated: bool      # the tracker kept only the first KEY_MAX bytes
    rule: str | None     # the rule's id
    client: bytes | None
    resource: bytes | None
    count: int           # sampled checks (halved with time in continuous mode)
    error: int           # Space-Saving's bound on what count overstates
    ops: float           # estimated checks per second
    ops_min: float       # the guaranteed part: (count - error) scaled

    @property
    def name(self) -> bytes:
        """One line's name: the key, or ``rule:client`` and ``rule:client:resource``
        for a rule's bucket (the parts are also given apart)."""
        if self.source == "bucket":
            return self.key
        parts = [(self.rule or "?").encode(), self.client or b""]
        if self.resource is not None:
            parts.append(self.resource)
        return b":".join(parts)


def _rule_parts(key: bytes, full_len: int, scope_of: Callable[[int], str | None]):
    """A rule bucket's key as the engine composes it (_rules.pyx compose_key):
    <u32 rule number><client>, or <u32><u16 client length><client><resource>."""
    if len(key) < 4:
        return None, key, None
    num = struct.unpack_from("<I", key)[0] & MAX_RULE_NUMBER   # the high byte: a split epoch
    scope = scope_of(num)
    rest = key[4:]
    if scope == "client+resource" and len(rest) >= 2:
        clen = struct.unpack_from("<H", rest)[0]
        return num, rest[2:2 + clen], rest[2 + clen:]
    return num, rest, None


def entries(tracker: HotKeys, now_ms: int, rule_id: Callable[[int], str] = str,
            scope_of: Callable[[int], str | None] = lambda num: None,
            limit: int | None = None) -> list[Entry]:
    """The tracker's counters, most checked first (at most `limit`)."""
    covered = tracker.covered_ms(now_ms)
    scale = tracker.sample * 1000 / covered if covered > 0 else 0.0
    out = []
    for kind, key, full_len, count, error in tracker.entries(now_ms)[:limit]:
        if count == 0:
            continue
        truncated = full_len > len(key)
        rule = client = resource = None
        if kind == RULE:
            num, client, resource = _rule_parts(key, full_len, scope_of)
            rule = rule_id(num) if num is not None else None
        out.append(Entry("bucket" if kind == BUCKET else "rule", key, truncated, rule,
                         client, resource, count, error, count * scale,
                         (count - error) * scale))
    return out


def shown(name: bytes) -> str:
    """A key as INFO and the status page show it: printable ASCII as is,
    anything else (and the quote and backslash) escaped as \\xNN, at most
    SHOWN_KEY_CHARS bytes of it."""
    out = []
    for b in name[:SHOWN_KEY_CHARS]:
        c = chr(b)
        out.append(c if 0x20 <= b < 0x7f and c not in '"\\,:=' else f"\\x{b:02x}")
    return "".join(out)


def info_lines(es: list[Entry]) -> dict[str, str]:
    """INFO hotkeys' per-key lines: hotkey_<rank>:key="...",ops=...,ops_min=...,..."""
    lines = {}
    for i, e in enumerate(es):
        fields = [f'key="{shown(e.name)}"', f"source={e.source}"]
        if e.rule is not None:
            fields.append(f'rule="{shown(e.rule.encode())}"')
        fields += [f"ops={e.ops:.1f}", f"ops_min={e.ops_min:.1f}", f"count={e.count}",
                   f"error={e.error}", f"truncated={int(e.truncated)}"]
        lines[f"hotkey_{i}"] = ",".join(fields)
    return lines


def text(name: bytes) -> str:
    """A key for JSON (the status page): UTF-8, other bytes as \\xNN."""
    return name[:SHOWN_KEY_CHARS].decode("utf-8", "backslashreplace")


def as_json(e: Entry) -> dict:
    """One entry for /v1/stats."""
    out: dict = {"name": text(e.name), "source": e.source, "ops": round(e.ops, 1),
                 "ops_min": round(e.ops_min, 1), "truncated": e.truncated}
    if e.rule is not None:
        out["rule"] = e.rule
    return out
