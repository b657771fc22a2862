"""bench/overload.py's quick mode, as a smoke run (the full run and its
figures are in bench/README.md): two nodes (shedding on, and off with
--shed-threshold 0), a critical client timed idle and under low and
normal load, the calibration at forced levels, and every table comes out
with numbers.  It judges nothing about speed: the figures of a run of a
few seconds on a shared machine mean little."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "overload.py"
PYTHON = os.environ.get("FASTLIMIT_PYTHON", sys.executable)
N = r"(-?\d[\d,]*(?:\.\d+)?)"       # a number as the report prints it

pytestmark = pytest.mark.untraced


def rows(out: str, first_cell: str) -> list[list[str]]:
    """The cells of the table rows that start with first_cell."""
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in out.splitlines() if line.startswith(f"| {first_cell} |")]


def number(cell: str) -> float:
    m = re.match(N, cell)
    assert m, cell
    return float(m.group(1).replace(",", ""))


def test_the_quick_run_prints_every_table_with_numbers(tmp_path):
    began = time.monotonic()
    run = subprocess.run([PYTHON, str(BENCH), "--quick",
                          "--output", str(tmp_path / "overload.md")],
                         capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert out == (tmp_path / "overload.md").read_text() + "\n"
    assert took < 120
    assert "--quick: tiny counts" in out

    # 1. calibration: low counted at level 0 on both nodes, every low check shed at
    # level 1, normal counted at level 1
    assert "### 1. What the node can do, what the generators offer, CPU per check" in out
    on, off = rows(out, "shedding on"), rows(out, "shedding off")
    cal = [r for r in on + off if r[1] in ("`low`", "`normal`")]
    assert [(r[0], r[1], r[2]) for r in cal] == [
        ("shedding on", "`low`", "0: counted"), ("shedding on", "`low`", "1: every check shed"),
        ("shedding on", "`normal`", "1: counted, read after critical connections"),
        ("shedding off", "`low`", "0: counted")], out
    for r in cal:
        checks, shed = number(r[3]), number(r[4])
        assert checks > 0 and number(r[6].rstrip("k")) > 0 and number(r[8]) >= 0
        assert shed == (checks if "shed" in r[2] else 0), r
    assert re.search(r"when every check is shed the node answers \*\*[\d,]+k\*\* \([\d.]+×\)",
                     out)
    # the generators' ceiling against redis-server, or why it was not measured
    assert re.search(r"- what the generators offer: (\*\*[\d,]+k\*\* checks/s .* "
                     r"\*\*[\d.]+×\*\* the node's capacity|\*\*not measured\*\* \()", out)
    assert re.search(r"server CPU per shed check \*\*[\d.]+ µs\*\* against \*\*[\d.]+ µs\*\*",
                     out)
    assert re.search(r"read after the critical connections .* costs \*\*[\d.]+ µs\*\* of server "
                     r"CPU, \*\*[\d.]+×\*\*", out)

    # 2. the critical client: idle and one load run on each node, in µs
    assert "### 2. The critical client's latency" in out
    for name in ("shedding on", "shedding off"):
        kinds = [r[1] for r in rows(out, name) if r[1] in ("idle", "load #1")]
        assert kinds == ["idle", "load #1"], out
        for r in rows(out, name):
            if r[1] in ("idle", "load #1"):
                requests, p50, p99, p999, top = (number(c) for c in r[2:7])
                assert requests > 0 and 0 < p50 <= p99 <= p999 <= top, r
                assert 0 < number(r[8]) <= top, r   # corrected for coordinated omission
                assert r[9] == "0 / 0", r          # every reply a counted check, no timeout
                assert number(r[10]) >= 0, r
    assert re.search(r"- target: critical p99 under load with shedding on ≤ 2× its idle p99: "
                     r"[\d,]+ µs ÷ [\d,]+ µs = [\d.]+× — \*\*(met|MISSED)\*\*", out)

    # 3. throughput and shed counts: what the node counted adds up to what was sent
    assert "### 3. Throughput and shed counts" in out
    for name in ("shedding on", "shedding off"):
        (r,) = [r for r in rows(out, name) if r[1] == "#1" and len(r) == 12]
        wall, rate = number(r[2]), number(r[3].rstrip("k"))
        low_sent, low_shed, normal_sent, normal_shed = (number(c) for c in r[5:9])
        assert wall > 0 and rate > 0
        assert 0 <= low_shed <= low_sent and 0 <= normal_shed <= normal_sent, r
        assert r[11] == "yes", r
        if name == "shedding off":
            assert low_shed == normal_shed == 0, r

    # 4. the meter's figures, 5. RSS before and after
    assert "### 4. The meter during the load runs" in out
    for name in ("shedding on", "shedding off"):
        (r,) = [r for r in rows(out, name) if r[1] == "#1" and len(r) == 14]
        assert all(re.fullmatch(r"[\d,]+ / [\d,]+", c) for c in r[3:8]), r
        assert all(number(c) >= 0 for c in r[8:11]), r
        assert re.fullmatch(r"[\d.]+ / [\d.]+", r[11]), r
        assert number(r[12]) >= 0 and number(r[13]) >= 0, r
    assert "### 5. RSS (VmRSS from /proc/PID/status)" in out
    for name in ("shedding on", "shedding off"):
        (r,) = [r for r in rows(out, name) if r[1] == "#1" and len(r) == 6]
        assert re.fullmatch(r"[\d,]+ → [\d,]+", r[2]), r
        assert number(r[3]) > 0 and number(r[4]) > 0 and re.fullmatch(r"[+-]\d+\.\d", r[5]), r
        (start,) = [r for r in rows(out, name) if r[1] == "start"]
        (settled,) = [r for r in rows(out, name) if r[1] == "settled"]
        assert number(start[4]) > 0 and number(settled[4]) > 0, (start, settled)
