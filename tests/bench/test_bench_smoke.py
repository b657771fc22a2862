"""Every benchmark in bench/ gets a smoke run: ``bench/<script> --quick``
(with the counts and durations cut further where the script takes them),
as a child process with a timeout, must exit 0 and print its report, and
the report must parse: its tables there with their rows, and numbers in
the cells that hold figures.  Nothing here judges a figure (a run of a
second on a shared machine means little): a bench that no test runs
rots, and this is only so that `make bench` does not stop on one that
broke (bench/grpc_front.py did: issue 28).

What a bench writes goes to the test's own directory: ``--output`` where
the script takes one (its report, which must be what it printed), TMPDIR
for its temporary files (which must be gone when it ends), and it runs
with that directory as its working directory; nothing may appear in, or
change in, bench/results.

Scripts of bench/ with no run here, and why:

- bench/rules_store.py, bench/hotkey_split.py and bench/overload.py: their
  smoke runs of --quick are tests/server/test_rules_store_bench.py,
  tests/split/test_split_bench.py and tests/overload/test_overload_bench.py
  (test_every_bench_script_is_smoke_run checks that they still are);
- bench/grpc_aio_rls.py: the grpc.aio server that bench/grpc_front.py
  starts and measures beside fastlimit's front, run by its smoke run;
- bench/starlette_limits_app.py: the Starlette + limits app that
  bench/http_front.py starts and measures, run by its smoke run;
- bench/rls_workload.py: a module, the YAML and requests that
  grpc_front.py, grpc_path.py and envoy_e2e.py import.

The runs are `untraced` (so `serial`: scripts/test.sh runs them alone,
on the release build, as the other bench smoke runs): a bench loads both
cores, and under the debug pass's line tracing its servers would crawl.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from servers import untraced_env

BENCH = Path(__file__).resolve().parents[2] / "bench"
RESULTS = BENCH / "results"
PYTHON = os.environ.get("FASTLIMIT_PYTHON", sys.executable)

pytestmark = pytest.mark.untraced

# A figure as the reports print it: 1,234 / 0.511 / -3 / 64k / 4.07M / 1.57× /
# 100% / 56.2 B / 2.29 s / 1000 ns / 81.2 MB / 0.40× less.
FIGURE = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:[kM]|×|x|%)?"
                    r"(?: ?(?:ns|µs|ms|s|B|MB|MiB|GiB|req/s))?(?: less| more)?")
DASH = "–"
TARGET = re.compile(r"— \*\*(met|MISSED)\*\*")


def is_figure(cell: str) -> bool:
    return FIGURE.fullmatch(cell) is not None


def figure(cell: str) -> float:
    """The number at the start of a cell that must hold one."""
    assert is_figure(cell), f"not a figure: {cell!r}"
    return float(re.match(r"[+-]?\d[\d,]*(?:\.\d+)?", cell).group().replace(",", ""))


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table(text: str, header_start: str) -> list[list[str]]:
    """The rows of the first markdown table whose header line starts with
    header_start (the header and the |---| line left out)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start) and i + 1 < len(lines) \
                and lines[i + 1].startswith("|-"):
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append(cells(body))
            assert rows, f"table {header_start!r} has no rows"
            return rows
    raise AssertionError(f"no table whose header starts {header_start!r}:\n{text[-3000:]}")


def figures(row: list[str], columns, dash_ok: bool = False) -> list[float]:
    """The cells of row at columns, each a figure (or – where dash_ok)."""
    got = []
    for c in columns:
        if dash_ok and row[c] == DASH:
            continue
        got.append(figure(row[c]))
    return got


def targets(text: str, count: int) -> None:
    assert len(TARGET.findall(text)) == count, text[-3000:]


# ---- what each report must hold ---------------------------------------------------------


def check_run(out: str, err: str) -> None:
    rows = table(out, "| command (fastlimit / redis) | P |")
    assert [(r[0].split(",")[0].split()[0], r[1]) for r in rows] == [
        ("CL.CHECK", "1"), ("CL.CHECK", "16"), ("PING", "1"), ("PING", "16"), ("CL.LIMIT", "16")]
    for r in rows:
        assert min(figures(r, range(2, 5))) > 0, r
        figures(r, range(5, 9), dash_ok=r[0].startswith("CL.LIMIT"))
    mem = table(out, "| server | keys stored |")
    assert len(mem) == 2
    for r in mem:
        assert figure(r[1]) > 0 and re.fullmatch(r"[\d.]+ → [\d.]+ MiB", r[2]), r
        figures(r, (3, 5))
        assert is_figure(r[4].split(" (")[0]), r
    targets(out, 5)


def check_clients(out: str, err: str) -> None:
    rows = table(out, "| part | contender |")
    assert len(rows) == 8 and sum(r[0].startswith("networked") for r in rows) == 4, rows
    for r in rows:
        assert figure(r[3]) > 0 and re.fullmatch(r"\d+%", r[5]), r
        figures(r, (4, 6), dash_ok=True)
    targets(out, 6)


def check_replication(out: str, err: str) -> None:
    rows = table(out, "| primary | req/s |")
    assert [r[0] for r in rows] == ["alone", "with a standby attached"]
    for r in rows:
        assert min(figures(r, (1, 2, 3))) > 0, r
    assert re.search(r"the replica's histogram over [\d,]+ changes: p50 \d+ ms, p99 \d+ ms, "
                     r"max \d+ ms", out), out
    targets(out, 2)


def check_failover(out: str, err: str) -> None:
    rows = table(out, "| rig | client | median | worst |")
    assert [r[0] for r in rows] == ["redis-server", "fastlimit", "fastlimit"]
    for r in rows:           # "none": the new primary never answered
        assert min(figures(r, (2, 3))) > 0, r
    assert re.search(r"Overshoot per run \([^)]*\): -?\d+\.", out), out
    rows = table(out, "| primary | req/s | server CPU µs/req |")
    assert [r[0] for r in rows] == ["alone", "three sentinels attached"]
    for r in rows:
        figures(r, (1, 2))
    targets(out, 2)


def check_cluster(out: str, err: str) -> None:
    rows = table(out, "| node | req/s |")
    assert [r[0] for r in rows] == ["standalone", "cluster mode"]
    for r in rows:
        figures(r, (1, 2))
    rows = table(out, "| -P | fastlimit req/s |")
    assert [r[0] for r in rows] == ["1", "16"]
    for r in rows:
        assert min(figures(r, (1, 2))) > 0, r
        figures(r, range(3, 7))
    move = {r[0]: r[1] for r in table(out, "| | |")}
    assert move["state"] == "done", move
    for name in ("copy (source keeps answering)", "pause (the moving slots' commands wait)",
                 "the whole MOVE command", "benchmark across the move"):
        figure(move[name])
    sizing = table(out, "| load | primaries |")
    assert len(sizing) == 2 and all(figure(r[1]) > 0 for r in sizing), sizing
    targets(out, 1)


def check_http_front(out: str, err: str) -> None:
    rows = table(out, "| rule | side |")
    assert len(rows) == 8, rows
    for r in rows:
        assert figure(r[2]) > 0, r
        figures(r, range(3, 8), dash_ok=True)
        assert re.fullmatch(r"\d+%", r[8]), r
    ratios = table(out, "| rule | HTTP ÷ Starlette (same answer) |")
    assert [r[0] for r in ratios] == ["allowed", "denied"]
    for r in ratios:
        figures(r, range(1, 5))
    cost = table(out, "| server | req/s | server CPU µs/CL.CHECK |")
    assert len(cost) == 2
    for r in cost:
        figures(r, (1, 2))
    (scrape,) = table(out, "| median ms | p90 ms |")
    figures(scrape, range(0, 7))
    targets(out, 8)
    assert "FAILED" not in err, err[-3000:]


def check_grpc_front(out: str, err: str) -> None:
    rows = table(out, "| variant | h2load | server |")
    assert [(r[0], r[2]) for r in rows] == [
        (v, s) for v in ("ok", "over") for _ in range(2) for s in ("fastlimit", "grpc.aio")]
    for r in rows:
        assert min(figures(r, (3, 4, 5, 6, 9))) > 0, r
        assert figure(r[7]) == 0 and figure(r[8]) == 0, r       # failed, grpc-status ≠ 0
    ratios = table(out, "| variant | h2load | req/s fastlimit ÷ grpc.aio |")
    assert len(ratios) == 4
    for r in ratios:
        figures(r, (2, 3))
    assert "grpc.aio's reply to `over` (a separate grpcio call, decoded): OVER_LIMIT" in out
    targets(out, 12)
    assert "FAILED" not in err, err[-3000:]


def check_envoy_e2e(out: str, err: str) -> None:
    rows = table(out, "| variant | Envoy with |")
    assert len(rows) == 6 and [r[0] for r in rows] == ["ok"] * 3 + ["over"] * 3, rows
    for r in rows:
        assert min(figures(r, (2, 3, 4, 5))) > 0, r
        assert re.fullmatch(r"[\d,]+ [2-5]xx(?:, [\d,]+ [2-5]xx)*", r[6]), r
        figures(r, (7, 8, 9), dash_ok=True)
    ratios = table(out, "| variant | global ÷ local req/s |")
    assert [r[0] for r in ratios] == ["ok", "over"]
    for r in ratios:
        figures(r, range(1, 5))
    targets(out, 3)
    assert "FAILED" not in err, err[-3000:]


def check_acl(out: str, err: str) -> None:
    rows = table(out, "| user | server CPU us/check |")
    assert [r[0] for r in rows] == ["default", "tenant"]
    for r in rows:
        figures(r, (1, 3))
    assert re.search(r"restricted / default CPU per check: [\d.]+x \(target <= 1.03x\)", out)


def check_tls(out: str, err: str) -> None:
    rows = table(out, "| server | command | P |")
    assert [(r[0], r[2]) for r in rows] == [
        (s, p) for s in ("fastlimit", "redis", "fastlimit", "redis") for p in ("1", "16")]
    for r in rows:
        assert min(figures(r, (3, 4, 5))) > 0, r


def check_rules_scale(out: str, err: str) -> None:
    rows = table(out, "| rules |")
    assert [r[0] for r in rows] == ["10", "100"]
    for r in rows:
        figures(r, range(len(r)))


def check_rls_reload(out: str, err: str) -> None:
    rows = table(out, "| case |")
    assert [r[0] for r in rows] == ["idle", "CONFIG GET *", "CL.RULE RELOAD", "file changed"]
    for r in rows:
        figures(r, range(1, len(r)), dash_ok=True)
    assert figure(rows[0][1]) > 0, rows          # the idle client's pings were timed


def check_ceiling(out: str, err: str) -> None:
    rows = table(out, "| P | server | command |")
    assert [(r[0], r[2]) for r in rows] == [
        (p, c) for p in ("1", "16", "64") for c in ("CL.CHECK", "PING", "PING", "INCR")], rows
    for r in rows:
        figures(r, (3, 5))
    ratios = table(out, "| P | CL.CHECK ÷ redis PING |")
    assert [r[0] for r in ratios] == ["1", "16", "64"]
    for r in ratios:
        figures(r, (1, 2))
        figures(r, (3,), dash_ok=True)     # a tiny run may use no CPU tick (10 ms)
    judged = re.findall(r"^- P=\d+: .*(?:— \*\*(?:met|MISSED)\*\*|\*\*not measured\*\*)$",
                        out, re.M)
    assert len(judged) == 3, out[-2000:]


def check_keyflood(out: str, err: str) -> None:
    rows = table(out, "| run | flood / victims |")
    assert [r[0] for r in rows] == ["maxmemory 200mb", "no maxmemory",
                                    "slow refill, maxmemory 200mb"]
    for r in rows:
        assert figure(r[2]) > 0 and figure(r[4]) > 0, r         # new keys/s, keys at end
        assert re.fullmatch(r"[\d,]+\.\.[\d,]+", r[3]), r
        figures(r, (5, 6, 7, 8))
        assert re.fullmatch(r"[\d.]+ / [\d.]+ / [\d.]+", r[9]), r
        assert re.fullmatch(r"[\d,]+ of [\d,]+", r[10]), r
        assert re.fullmatch(r"\d+ of 100", r[11]), r
    assert len(re.findall(r"\*\*Slack \(.*\)\*\*: peak RSS [\d.]+ MB", out)) == 2, out
    assert out.count("## Over time: ") == 3


def check_takeover(out: str, err: str) -> None:
    (row,) = table(out, "| buckets | pause ms |")
    assert figure(row[0]) == 20_000, row
    figures(row, (1, 2, 3, 4, 8))
    assert row[5] == "yes" and row[6] == "0", row     # every bucket there; the old one exited 0
    assert re.fullmatch(r"\d+ / \d+", row[7]), row     # connections passed / closed
    targets(out, 1)
    ways = table(out, "| buckets | way |")
    assert [r[1] for r in ways] == ["takeover", "restart (SIGTERM)", "crash (SIGKILL)"], ways
    for way in ways:
        figures(way, (0, 2, 3, 4, 6))
        assert re.fullmatch(r"[\d,]+ of 10,000", way[5]), way   # sampled buckets lost
    assert ways[0][3:6] == ["0", "0", "0 of 10,000"], ways[0]   # nothing cut, reset or lost


def check_regions(out: str, err: str) -> None:
    rows = table(out, "| scope | d |")
    assert [r[0] for r in rows] == ["regional", "static", "global", "home"], rows
    for r in rows:
        assert min(figures(r, range(1, 9))) >= 0, r
        assert figure(r[2]) <= figure(r[4]), r          # admitted within the bound
    links = table(out, "| keys | checks/s")
    assert [figure(r[0]) for r in links] == [100, 10_000], links
    for link in links:
        assert min(figures(link, range(4))) > 0, link
    (apart,) = table(out, "| L | admitted while apart |")
    assert figure(apart[1]) <= figure(apart[0]), apart
    figures(apart, (2, 3))


def check_soak(out: str, err: str) -> None:
    rows = table(out, "| good client")
    assert [r[0] for r in rows] == ["idle server", "under all attacks"]
    for r in rows:
        assert figure(r[1]) > 0, r
        figures(r, (2, 3, 4))
    assert re.search(r"p99 attacked / idle: \*\*[\d.]+x\*\*", out), out
    memory = {r[0]: r[1] for r in table(out, "| memory | peak |")}
    assert len(memory) == 5 and all(figure(v) >= 0 for v in memory.values()), memory
    assert "Server alive at the end: True" in out


def check_limits_storage(out: str, err: str) -> None:
    rows = table(out, "| strategy | storage | hits/s |")
    assert [(r[0], r[1]) for r in rows] == [
        (s, side) for s in ("fixed window", "moving window", "sliding window counter")
        for side in ("fastlimit", "redis")], rows
    for r in rows:
        assert figure(r[2]) > 0 and figure(r[4]) > 0, r
        figures(r, (3,))
    ratios = table(out, "| strategy | hits/s fastlimit ÷ redis |")
    assert len(ratios) == 3
    for r in ratios:
        figures(r, (1, 2), dash_ok=True)
    targets(out, 3)


def check_check_cpu(out: str, err: str) -> None:
    (row,) = table(out, "| variant | server CPU per CL.CHECK (median) |")
    assert row[0] == "installed", row
    figures(row, (1, 2))


def stderr_count(pattern: str) -> Callable[[str, str], None]:
    """A callgrind driver's one line on stderr: the requests it fed, 320."""
    def check(out: str, err: str) -> None:
        m = re.search(pattern, err)
        assert m, err[-3000:]
        assert int(m.group(1)) == 320, m.group()
    return check


@dataclass
class Smoke:
    script: str
    check: Callable[[str, str], None]
    args: list[str] = field(default_factory=list)     # after --quick
    output: bool = True           # takes --output FILE and writes its report there
    timeout: float = 60


SMOKES = [
    # redis-benchmark runs of 20,000 requests at -P 16 take a few hundredths of a
    # second; where a report divides by a server's CPU ticks (10 ms each), 100,000
    Smoke("run.py", check_run,
          ["--n1", "2000", "--n16", "20000", "--keys", "20000", "--batch", "5000"]),
    Smoke("clients.py", check_clients, ["--async-seconds", "0.15", "--embedded-seconds", "0.1"]),
    Smoke("replication.py", check_replication, ["--n16", "20000", "--lag-seconds", "0.5"]),
    # two sentinel rigs' kill -9 (a rig's sentinels take ~2 s to find each other)
    Smoke("failover.py", check_failover, ["--runs", "1", "--n16", "100000"], timeout=120),
    Smoke("cluster.py", check_cluster,
          ["--n16", "100000", "--n1", "2000", "--keys", "5000", "--reshard-keys", "1000"]),
    # wrk takes whole seconds: 8 runs of 1 s
    Smoke("http_front.py", check_http_front,
          ["--seconds", "1", "--warm", "0", "--n16", "100000", "--scrapes", "3"]),
    Smoke("grpc_front.py", check_grpc_front, ["--seconds", "0.3"]),
    # Envoy, and wrk's whole seconds: 6 runs of 1 s
    Smoke("envoy_e2e.py", check_envoy_e2e, ["--seconds", "1"], timeout=120),
    Smoke("acl.py", check_acl, output=False),
    Smoke("tls.py", check_tls, output=False),
    Smoke("rules_scale.py", check_rules_scale, output=False),
    Smoke("rls_reload.py", check_rls_reload, ["--descriptors", "200"]),
    Smoke("keyflood.py", check_keyflood),
    Smoke("soak.py", check_soak, ["--seconds", "0.5"], output=False),
    Smoke("regions.py", check_regions),
    Smoke("takeover.py", check_takeover),
    # limits' strategies on fastlimit:// and on redis:// (300 hits a run)
    Smoke("limits_storage.py", check_limits_storage),
    Smoke("ceiling.py", check_ceiling),
    Smoke("check_cpu.py", check_check_cpu, ["--variant", "installed=installed"], output=False),
    Smoke("check_path.py", stderr_count(r"(\d+) CL\.CHECK run"), output=False),
    Smoke("grpc_path.py", stderr_count(r"(\d+) ShouldRateLimit calls \(decide\), 0 failed"),
          output=False),
    Smoke("http_path.py", stderr_count(r"(\d+) http checks"), output=False),
]

# Smoke-run by their own tests (see the docstring).
ELSEWHERE = {
    "rules_store.py": "tests/server/test_rules_store_bench.py",
    "hotkey_split.py": "tests/split/test_split_bench.py",
    "overload.py": "tests/overload/test_overload_bench.py",
}
# Not benchmarks: run by the smoke runs of the benches that use them.
NOT_BENCHMARKS = {
    "grpc_aio_rls.py": "grpc_front.py",
    "starlette_limits_app.py": "http_front.py",
    "rls_workload.py": "grpc_front.py",
}


def results_state() -> dict[str, tuple[int, int]]:
    if not RESULTS.exists():
        return {}
    return {str(p.relative_to(RESULTS)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in RESULTS.rglob("*")}


@pytest.mark.parametrize("smoke", SMOKES, ids=[s.script for s in SMOKES])
def test_the_quick_run_prints_a_report_that_parses(smoke: Smoke, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    report = tmp_path / "report.md"
    argv = [PYTHON, str(BENCH / smoke.script), "--quick", *smoke.args]
    if smoke.output:
        argv += ["--output", str(report)]
    env = untraced_env()
    env["TMPDIR"] = str(tmp)
    before = results_state()
    began = time.monotonic()
    run = subprocess.run(argv, capture_output=True, text=True, timeout=smoke.timeout, env=env,
                         cwd=tmp_path, stdin=subprocess.DEVNULL)
    took = time.monotonic() - began
    assert run.returncode == 0, f"{' '.join(argv)}: exit {run.returncode}\n{run.stderr[-5000:]}"
    print(f"{smoke.script} --quick: {took:.1f} s")
    if smoke.output:
        assert run.stdout == report.read_text() + "\n"
    smoke.check(run.stdout, run.stderr)
    assert results_state() == before, "the bench wrote to bench/results"
    assert not list(tmp.iterdir()), f"left in TMPDIR: {sorted(p.name for p in tmp.iterdir())}"
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("tmp", "report.md"))
    assert not left, f"written to its working directory: {left}"


def test_every_bench_script_is_smoke_run():
    """A new bench script gets a smoke run here (or says where it has one)."""
    scripts = {p.name for p in BENCH.glob("*.py")}
    here = {s.script for s in SMOKES}
    assert scripts == here | set(ELSEWHERE) | set(NOT_BENCHMARKS), \
        scripts ^ (here | set(ELSEWHERE) | set(NOT_BENCHMARKS))
    root = BENCH.parent
    for script, test in ELSEWHERE.items():
        text = (root / test).read_text()
        assert f'"bench" / "{script}"' in text and '"--quick"' in text, (script, test)
    for module, user in NOT_BENCHMARKS.items():
        assert user in here
        assert module.removesuffix(".py") in (BENCH / user).read_text(), (module, user)
