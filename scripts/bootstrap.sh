#!/usr/bin/env bash
# Installs what fastlimit needs on a fresh Debian machine and builds it,
# each virtualenv only when its sources changed since it was built:
#   --serve   .venv-serve: the release build and its runtime dependencies only
#             (what `make serve` runs; no apt, no test packages)
#   (none)    .venv: the release build with the test dependencies, plus
#             Debian's redis-server, redis-tools, redis-sentinel, prometheus,
#             chromium, wrk, valgrind, nghttp2-client and postgresql (the tests
#             and bench use them); both install libnghttp2-dev, which the gRPC front builds on
#   --debug   as (none), plus .venv-debug: the debug build (assertions, line tracing)
#   --fuzz    as (none), plus .venv-fuzz: the debug build compiled by Debian's
#             clang-14 with AddressSanitizer and libFuzzer's edge counters
#             (libclang-rt-14-dev), with atheris: what scripts/fuzz.sh runs
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mode=${1:-}

apt_install() {  # apt_install PACKAGE...
    echo "== installing $* with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "$@" >/dev/null
}

# What the build itself needs: the gRPC front is built on libnghttp2, the
# listeners' TLS on OpenSSL's libssl (the one Python's ssl module uses).
install_build_deps() {
    [ -e /usr/include/nghttp2/nghttp2.h ] || apt_install libnghttp2-dev
    [ -e /usr/include/openssl/ssl.h ] || apt_install libssl-dev
}

install_debian_tools() {
    local need_apt=()
    command -v redis-server >/dev/null || need_apt+=(redis-server)
    command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || need_apt+=(redis-tools)
    command -v redis-sentinel >/dev/null || need_apt+=(redis-sentinel)
    # The HTTP front's tests scrape it with a real Prometheus (and lint it
    # with promtool), load its status page in headless Chromium; the bench
    # drives it with wrk.
    command -v prometheus >/dev/null && command -v promtool >/dev/null || need_apt+=(prometheus)
    command -v chromium >/dev/null || need_apt+=(chromium)
    command -v wrk >/dev/null || need_apt+=(wrk)
    command -v valgrind >/dev/null || need_apt+=(valgrind)   # the benches count instructions
    command -v h2load >/dev/null && command -v nghttp >/dev/null || need_apt+=(nghttp2-client)
    # The PostgreSQL rules-store's tests start a real server of their own
    # (tests/support/postgres.py: initdb and pg_ctl, as the postgres user).
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v psql >/dev/null \
        || need_apt+=(postgresql)
    if ((${#need_apt[@]})); then
        apt_install "${need_apt[@]}"
    fi
}

# Everything a build reads: a change to any of these makes the next
# bootstrap rebuild; nothing else does.
sources_stamp() {
    find src setup.py pyproject.toml -type f \
        \( -name '*.py' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.pyi' -o -name '*.h' \
           -o -name 'py.typed' -o -name '*.toml' \) -print0 \
        | sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1
}

build_venv() {  # build_venv DIR EXTRAS [ENV=VALUE ...]
    local dir=$1 extras=$2; shift 2
    local stamp
    stamp="$(sources_stamp) $extras $*"
    if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.fastlimit-built" 2>/dev/null)" = "$stamp" ]; then
        echo "== $dir is up to date"
        return
    fi
    [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
    echo "== building fastlimit into $dir ${*:-}"
    env "$@" "$dir/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check ".$extras"
    echo "$stamp" > "$dir/.fastlimit-built"
}

# The fuzzing build's compiler and sanitizer runtimes (tests/fuzz/).
install_fuzz_deps() {
    command -v clang-14 >/dev/null \
        && ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.asan-x86_64.so >/dev/null 2>&1 \
        || apt_install clang-14 libclang-rt-14-dev
}

case "$mode" in
    --serve)
        install_build_deps
        build_venv .venv-serve "" FASTLIMIT_DEBUG=0 ;;
    ""|--debug|--fuzz)
        install_build_deps
        install_debian_tools
        build_venv .venv "[test]" FASTLIMIT_DEBUG=0
        # the limits project's own tests, which tests/limits_storage runs against fastlimit
        .venv/bin/python tests/limits_storage/sdist.py >/dev/null
        if [ "$mode" = "--debug" ]; then
            build_venv .venv-debug "[test]" FASTLIMIT_DEBUG=1
        fi
        if [ "$mode" = "--fuzz" ]; then
            install_fuzz_deps
            build_venv .venv-fuzz "[fuzz]" FASTLIMIT_FUZZ=1 CC=clang-14 "LDSHARED=clang-14 -shared"
        fi ;;
    *)
        echo "usage: $0 [--serve | --debug | --fuzz]" >&2; exit 2 ;;
esac
