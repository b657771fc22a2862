#!/usr/bin/env bash
# Installs what fastlimit needs on a fresh Debian machine and builds it:
#   - Debian's redis-server and redis-tools (the tests and bench use them)
#   - .venv: the release build, with test dependencies
#   - .venv-debug (with --debug): the debug build (assertions, line tracing)
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || need_apt+=(redis-tools)
if ((${#need_apt[@]})); then
    echo "== installing ${need_apt[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
PY=${PYTHON:-python3}

build_venv() {  # build_venv DIR [ENV=VALUE ...]
    local dir=$1; shift
    [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --upgrade pip >/dev/null
    echo "== building fastlimit into $dir ${*:-}"
    env "$@" "$dir/bin/python" -m pip install -q --no-cache-dir ".[test]"
}

build_venv .venv FASTLIMIT_DEBUG=0
if [ "${1:-}" = "--debug" ]; then
    build_venv .venv-debug FASTLIMIT_DEBUG=1
fi
