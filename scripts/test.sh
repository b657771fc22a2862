#!/usr/bin/env bash
# Builds everything, lints and type-checks src/ (ruff, mypy), and runs the
# whole test suite: first against the release build, then against the
# debug build (C assertions and Cython bounds checks on) under coverage,
# whose per-module table (the .py and the .pyx modules) ends the run.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --debug

echo "== lint: ruff"
.venv/bin/ruff check src
echo "== types: mypy"
.venv/bin/mypy src/fastlimit
echo "== layers: import-linter ([tool.importlinter] in pyproject.toml)"
.venv/bin/lint-imports --no-cache

# Each pass runs on $WORKERS pytest-xdist workers (a test file per worker),
# then the "serial" tests (see tests/conftest.py) alone.  pytest's status 5 is
# "no test selected" (arguments naming only one kind): not a failure.
pass_of() {  # pass_of PYTHON [coverage run] -- MARKS -- pytest arguments
    local runner=() marks rc=0 rc2=0
    while [[ $1 != -- ]]; do runner+=("$1"); shift; done; shift
    marks=$1; shift 2
    "${runner[@]}" -m pytest -n "$WORKERS" --dist loadfile -m "($marks) and not serial" $DURATIONS "$@" || rc=$?
    "${runner[@]}" -m pytest -m "($marks) and serial" $DURATIONS "$@" || rc2=$?
    ((rc == 5)) && rc=0
    ((rc2 == 5)) && rc2=0
    return $((rc || rc2))
}

# The slowest tests of each part, so that a log shows where the suite's
# minutes go (it is over its 20-minute aim).
DURATIONS=--durations=15
status=0
echo "== tests: release build"
# Its tests wait on real time (servers starting, timeouts, failovers): with
# a worker per core the machine was 30-55% idle, and a third worker took
# this part from 290 s to 228 s.
WORKERS=3
FASTLIMIT_PYTHON=$PWD/.venv/bin/python pass_of .venv/bin/python -- "not no_such_mark" -- "$@" \
    || status=$?

echo "== tests: debug build, with line coverage"
# The serial tests (volume and time bounds, real-time failovers) ran on the
# release build above; they run untraced, so here they would add no
# coverage, only their minutes: `make test-debug-serial` runs them on this
# build.
# Cython.Coverage maps the .pyx lines through the generated C, which it
# looks for beside the .pyx: put the debug build's there (gitignored).
cp build/debug/cython/src/fastlimit/_*.c src/fastlimit/
rm -rf build/coverage && mkdir -p build/coverage     # [tool.coverage] in pyproject.toml
# Line tracing keeps this part busy (about 10% idle): a worker per core.
WORKERS=auto
FASTLIMIT_PYTHON=$PWD/.venv-debug/bin/python pass_of .venv-debug/bin/python -m coverage run \
    -- "not release_only and not serial" -- "$@" || status=$?
echo "== line coverage of the debug pass (untraced tests: UNTRACED in tests/conftest.py)"
.venv-debug/bin/python -m coverage combine -q
.venv-debug/bin/python -m coverage report
exit $status
