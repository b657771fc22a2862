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

echo "== tests: release build"
FASTLIMIT_PYTHON=$PWD/.venv/bin/python .venv/bin/python -m pytest "$@"

echo "== tests: debug build, with line coverage"
# Cython.Coverage maps the .pyx lines through the generated C, which it
# looks for beside the .pyx: put the debug build's there (gitignored).
cp build/debug/cython/src/fastlimit/_*.c src/fastlimit/
rm -rf build/coverage && mkdir -p build/coverage     # [tool.coverage] in pyproject.toml
status=0
FASTLIMIT_PYTHON=$PWD/.venv-debug/bin/python .venv-debug/bin/python -m coverage run \
    -m pytest -m "not release_only" "$@" || status=$?
echo "== line coverage of the debug pass (untraced tests: UNTRACED in tests/conftest.py)"
.venv-debug/bin/python -m coverage combine -q
.venv-debug/bin/python -m coverage report
exit $status
