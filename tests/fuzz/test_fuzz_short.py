"""A short run of every fuzz target (tests/fuzz/fuzz_*.py): its checked-in
corpus (tests/fuzz/corpus/<target>/, the seeds and every crash found so
far), then a few seconds of new inputs.  A crash, a hang (-timeout) or an
input the target calls a finding fails the test with libFuzzer's report.

Each target runs in its own process (libFuzzer's), with the interpreter
under test (FASTLIMIT_PYTHON: the debug build in the debug pass), or
FASTLIMIT_FUZZ_PYTHON, the fuzzing build's (.venv-fuzz/bin/python, see
scripts/fuzz.sh), where the C code's coverage guides it too.  New inputs
go to a temporary directory: the corpus is read, never written.  The long
run is `make fuzz`."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest
import servers

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = sorted(os.path.basename(p)[len("fuzz_"):-len(".py")]
                 for p in glob.glob(os.path.join(HERE, "fuzz_*.py")))
PYTHON = os.environ.get("FASTLIMIT_FUZZ_PYTHON") or servers.PYTHON
SECONDS = 1            # of new inputs per target, after its corpus
MAX_RUNS = 20000       # or this many inputs, whichever comes first
HANG_S = 10            # an input running longer than this is a hang
# libFuzzer's RSS limit reads the peak RSS (getrusage), which a child keeps
# from the process that started it: a pytest worker that ran a large test
# before makes every target "out of memory" at its first input.  The short
# run bounds single allocations instead (where the sanitizers hook malloc);
# scripts/fuzz.sh, started from a shell, keeps libFuzzer's RSS limit.
MALLOC_LIMIT_MB = 2048


def fuzz(target: str, tmp_path) -> subprocess.CompletedProcess:
    fresh = tmp_path / "new"
    fresh.mkdir()
    return subprocess.run(
        [PYTHON, os.path.join(HERE, f"fuzz_{target}.py"), str(fresh),
         os.path.join(HERE, "corpus", target), f"-max_total_time={SECONDS}",
         f"-runs={MAX_RUNS}", f"-timeout={HANG_S}", f"-artifact_prefix={tmp_path}/",
         "-rss_limit_mb=0", f"-malloc_limit_mb={MALLOC_LIMIT_MB}",
         "-print_final_stats=1"],
        capture_output=True, text=True, errors="replace", timeout=120,
        env=servers.untraced_env(), stdin=subprocess.DEVNULL)


def test_every_target_has_a_corpus():
    assert len(TARGETS) >= 9, TARGETS
    for target in TARGETS:
        assert len(os.listdir(os.path.join(HERE, "corpus", target))) >= 5, target


@pytest.mark.parametrize("target", TARGETS)
def test_target_survives_its_corpus_and_a_short_run(target, tmp_path):
    result = fuzz(target, tmp_path)
    report = result.stderr[-6000:]
    assert result.returncode == 0, f"fuzz_{target} failed ({result.returncode}):\n{report}"
    assert not [p for p in os.listdir(tmp_path) if p != "new"], report   # no crash-* file
    inited = re.search(r"INITED cov: (\d+) ft: (\d+)", result.stderr)
    assert inited and int(inited.group(1)) > 0, report
    runs = re.search(r"stat::number_of_executed_units: (\d+)", result.stderr)
    corpus = len(os.listdir(os.path.join(HERE, "corpus", target)))
    assert runs and int(runs.group(1)) >= corpus, report
    print(f"fuzz_{target}: {runs.group(1)} runs, cov {inited.group(1)} after the corpus",
          file=sys.stderr)
