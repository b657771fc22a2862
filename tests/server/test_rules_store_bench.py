"""bench/rules_store.py's quick mode, as a smoke run (the full run and its
figures are in bench/README.md): against a real throw-away PostgreSQL,
three nodes follow 20 plain-SQL changes, nodes start with 1,000 rules
from the store and from SQLite, and every table comes out with numbers.
Part 3 (callgrind) is left out by --quick, and says so."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rules_store.py"
NUMBER = r"(\d[\d,]*(?:\.\d+)?)"

pytestmark = pytest.mark.untraced


def test_the_quick_run_prints_every_table_with_numbers(tmp_path):
    began = time.monotonic()
    run = subprocess.run([sys.executable, str(BENCH), "--quick",
                          "--output", str(tmp_path / "rules_store.md")],
                         capture_output=True, text=True, timeout=60)
    took = time.monotonic() - began
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert out == (tmp_path / "rules_store.md").read_text() + "\n"
    assert took < 60

    # 1. every change reached the three nodes, with p50 <= p99 <= max
    assert "## 1. Commit to enforced on every node (3 nodes)" in out
    row = re.search(r"\| \*\*UPDATE sent → every node shows it\*\* \(n = 20\) \| "
                    + r" \| ".join([NUMBER] * 4) + r" \|", out)
    assert row, out
    p50, p99, top = (float(v) for v in row.groups()[:3])
    assert 0 < p50 <= p99 <= top
    for label in ("UPDATE sent → committed (its reply)", "UPDATE sent → the first node shows it",
                  "committed (its reply) → every node shows it"):
        assert re.search(re.escape(f"| {label} |") + r" -?" + NUMBER, out), label
    nodes = re.findall(r"^\| :\d+ \| connected \| 20 \| \d+ \| \d+ \| \d+ \| 1 \| \d+ \|$", out,
                       re.M)
    assert len(nodes) == 3, out
    assert "not seen on every node" not in out
    assert re.search(r"target: p99 ≤ 100 ms on every node: [\d.]+ ms — \*\*(met|MISSED)\*\*",
                     out)

    # 2. four kinds of start, each with its time and a ratio to SQLite
    assert "## 2. Start with 1,000 rules" in out
    starts = re.findall(r"^\| (?:no rules|`--rules-db`|`--rules-store`)[^|]* \| (\d+) \| (\d+) \| ",
                        out, re.M)
    assert len(starts) == 4 and all(int(median) > 0 for median, _ in starts), out
    assert re.search(r"PostgreSQL \(new node\) ÷ SQLite: \*\*[\d.]+×\*\*", out)

    # 3. left out, with the reason
    assert re.search(r"## 3\. .*\n\n- \*\*not measured\*\*: left out with --quick", out)
