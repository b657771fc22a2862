"""The Prometheus text exposition read back, strictly, for the tests."""

from __future__ import annotations

import re

SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of (label, value)): value}; every sample
    line must be well formed and unique."""
    out: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.fullmatch(line)
        assert m, line
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        key = (m.group(1), labels)
        assert key not in out, f"duplicate series {line}"
        out[key] = float(m.group(3))
    return out


def value(series: dict, name: str, **labels: str) -> float:
    return series[(name, frozenset(labels.items()))]


def named(series: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in series.items() if n == name}
