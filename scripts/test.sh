#!/usr/bin/env bash
# Builds everything, lints and type-checks src/ (ruff, mypy), and runs the
# whole test suite: first against the release build, then against the
# debug build (C assertions and Cython bounds checks on).  Extra arguments
# go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --debug

echo "== lint: ruff"
.venv/bin/ruff check src
echo "== types: mypy"
.venv/bin/mypy src/fastlimit

echo "== tests: release build"
FASTLIMIT_PYTHON=$PWD/.venv/bin/python .venv/bin/python -m pytest "$@"
echo "== tests: debug build"
FASTLIMIT_PYTHON=$PWD/.venv-debug/bin/python .venv-debug/bin/python -m pytest -m "not release_only" "$@"
