"""bench/hotkey_split.py's quick mode, as a smoke run (the full run and its
figures are in bench/README.md): a hot key on a real 3-shard cluster
unsplit and split, the split's accuracy on the manual clock, and
pre-aggregating gateways against the split, every table printed with
numbers.  Nothing here judges a number: no timed assertions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from servers import untraced_env

BENCH = Path(__file__).resolve().parents[2] / "bench" / "hotkey_split.py"
PYTHON = os.environ.get("FASTLIMIT_PYTHON", sys.executable)
NUM = r"[+-]?\d[\d,]*(?:\.\d+)?"
RATE = r"\d+(?:\.\d+)?[kM]"

pytestmark = pytest.mark.untraced


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def table(out: str, heading: str, header_start: str) -> list[list[str]]:
    """The rows of the first table after heading whose header starts so."""
    part = out[out.index(heading):]
    start = part.index("\n" + header_start) + 1
    rows = []
    for line in part[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return rows


def is_number(cell: str) -> bool:
    return re.fullmatch(NUM, cell) is not None


def test_the_quick_run_prints_every_table_with_numbers(tmp_path):
    if shutil.which("redis-benchmark") is None:
        pytest.fail("redis-benchmark is not installed (make test installs redis-tools)")
    report = tmp_path / "hotkey_split.md"
    run = subprocess.run([PYTHON, str(BENCH), "--quick", "--output", str(report)],
                         capture_output=True, text=True, timeout=240, env=untraced_env())
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert out == report.read_text() + "\n"

    # 1. the hot key's three sub-keys on three distinct shards, both sides measured
    h1 = "## 1. Throughput: one hot key on a 3-shard cluster"
    assert h1 in out
    subs = re.findall(r"`hot:\d+#(\d)` \(slot (\d+), fl-(\d)\)", out)
    assert [s[0] for s in subs] == ["0", "1", "2"] and len({s[2] for s in subs}) == 3, out
    rows = {r[0]: r for r in table(out, h1, "| key | checks/s")}
    assert set(rows) == {"unsplit", "SPLIT 3"}, out
    for row in rows.values():
        assert re.fullmatch(RATE, row[1]), row
        assert all(is_number(c) for c in row[7:9]), row    # all servers, busiest shard
        assert sum(is_number(c) for c in row[4:7]) >= 1, row
    assert all(is_number(c) for c in rows["SPLIT 3"][4:7]), rows["SPLIT 3"]
    cores = table(out, h1, "| key | the 3 servers")
    assert [r[0] for r in cores] == ["unsplit", "SPLIT 3"]
    for r in cores:
        assert all(re.match(NUM + " (of " + NUM + " )?cores", c) for c in r[1:]), r
    assert re.search(r"\*\*SPLIT 3 ÷ unsplit: \d+\.\d\d×\*\*", out)
    assert re.search(r"unsplit " + RATE + r"/s, split " + RATE + r"/s \(\*\*\d+\.\d\d×\*\*", out)
    clients = table(out, h1, "| client | checks/s")
    assert [r[0] for r in clients] == ["Client, unsplit", "Client, SPLIT 3"], out
    assert all(re.fullmatch(RATE, r[1]) for r in clients), clients

    # 2. accuracy per k, both algorithms, next to the note's table and the bound
    h2 = "## 2. Accuracy of a split at demand = the limit"
    assert h2 in out
    acc = table(out, h2, "| k | per sub-bucket")
    assert [r[0] for r in acc] == ["1", "4", "16", "32"], out
    for r in acc:
        assert all(is_number(c) for c in r[2:7]), r
    for r in acc[1:]:
        assert all(is_number(c) for c in r[7:11]), r       # the note's and the README's figures
    assert [r[7:9] for r in acc[1:3]] == [["0.978", "0.989"], ["0.955", "0.978"]]
    upper = table(out, h2, "| k | demand 2 L")
    assert [r[0] for r in upper] == ["1", "4", "16", "32"], out
    assert all(is_number(c) for r in upper for c in r[1:]), upper
    assert re.search(r"Most admitted in any window of any run: \*\*" + NUM + r"\*\* against L = "
                     r"1,000: \*\*(never more than L|MORE THAN L)\*\*\.", out)

    # 3. pre-aggregation and split on the same demand, every shape
    h3 = "## 3. Pre-aggregation against splitting, one bucket"
    assert h3 in out
    pa = table(out, h3, "| demand per window")
    schemes = ["exact", "SPLIT 4", "SPLIT 16", "G = 10, b = 10", "G = 10, b = 50",
               "G = 10, b = 100"]
    shapes = ["steady, L", "steady, 2 L", "quiet, then 2 L at once"]
    assert [(r[0], r[1]) for r in pa] == [(s, k) for s in shapes for k in schemes], out
    for r in pa:
        assert all(is_number(c) for c in (r[2], r[3], r[4], r[7])), r
        assert r[5] == "0" or re.fullmatch(r"G × b = " + NUM, r[5]), r
        assert r[6] == "–" if r[1] == "exact" or r[1].startswith("SPLIT") else is_number(r[6]), r
    assert re.search(r"Rows over their bound: .+\.", out)
    assert re.search(r"Gateways' failed or unanswered calls: \d+", out)
