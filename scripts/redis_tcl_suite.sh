#!/usr/bin/env bash
# Runs six units of Redis 7.0.15's own Tcl test suite (protocol,
# info-command, introspection, multi, auth, pubsub) against a fresh
# fastlimit started from this checkout, or against a redis-server with
# --redis, and prints the passes and failures of each unit (issue 16).
#
#   scripts/redis_tcl_suite.sh REDIS [--redis] [UNIT...]
#
# REDIS is either a git checkout (or bare git dir) of redis/redis, whose
# tag 7.0.15 is unpacked (its tests/ only) into a scratch directory, or a
# directory that already holds that tests/.  Needs tclsh.  Against
# the tests that cannot apply to fastlimit (CANNOT_APPLY below, with the
# reasons) are skipped on both servers; ALL=1 runs them too.  Nothing of the
# suite is copied into this repository.  Logs: $OUT (default
# build/tcl-suite), one file per unit.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: $0 REDIS_CHECKOUT_OR_TESTS_DIR [--redis] [UNIT...]}; shift
against=fastlimit
if [ "${1:-}" = --redis ]; then against=redis; shift; fi
units=("$@")
((${#units[@]})) || units=(protocol info-command introspection multi auth pubsub)
TAG=${TAG:-7.0.15}
OUT=${OUT:-$PWD/build/tcl-suite}
if [ ! -e "$src" ]; then
    cat >&2 <<EOF
$0: no Redis sources at $src.  The suite is Redis's own, not part of this
repository; get its tag $TAG there (or name another place with REDIS_SRC=):
    git clone --depth 1 --branch $TAG https://github.com/redis/redis.git $src
EOF
    exit 2
fi
PY=${FASTLIMIT_PYTHON:-python3}
src_dir=$PWD/src
mkdir -p "$OUT"

if [ -f "$src/tests/test_helper.tcl" ]; then
    suite=$src
else
    gitdir=$src
    [ -d "$src/.git" ] && gitdir=$src/.git
    suite=$OUT/redis-$TAG
    rm -rf "$suite" && mkdir -p "$suite"
    git --git-dir="$gitdir" archive "$TAG" tests | tar -x -C "$suite"
fi

port=$(${PY} -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if [ "$against" = redis ]; then
    rm -rf "$OUT/data" && mkdir -p "$OUT/data"
    (cd "$OUT/data" && exec redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --enable-debug-command yes \
        ) >"$OUT/server.log" 2>&1 &
else
    # In its own directory: its rules database and snapshot are files there.
    rm -rf "$OUT/data" && mkdir -p "$OUT/data"
    (cd "$OUT/data" && PYTHONPATH=$src_dir${PYTHONPATH:+:$PYTHONPATH} exec "$PY" -m fastlimit.server \
        --port "$port" --bind 127.0.0.1) >"$OUT/server.log" 2>&1 &
fi
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
done

# Tests that cannot apply to fastlimit, skipped against either server (so
# the counts compare; ALL=1 runs them too): each needs a data-type command (SET, DEL, SADD, LPUSH...), DEBUG
# PROTOCOL, scripting or functions, MIGRATE, keyspace notifications, SYNC
# or a Redis-only setting.  Skipped, they no longer leave a connection in
# MULTI for the tests after them (the harness stops a test at its first
# error).
CANNOT_APPLY=(
    "raw protocol response" "raw protocol response - deferred"
    "raw protocol response - multiline" "RESP3 attributes" "RESP3 attributes readraw"
    "RESP3 attributes on RESP2" "test big number parsing" "test bool parsing"
    "test verbatim str parsing" "test large number of args"
    "test argument rewriting - issue 9598" "Regression for a crash with blocking ops and pipelining"
    "MONITOR can log executed commands" "MONITOR can log commands issued by the scripting engine"
    "MONITOR can log commands issued by functions" "MONITOR supports redacting command arguments"
    "MONITOR correctly handles multi-exec cases"
    "CONFIG sanity" "CONFIG SET with multiple args" "CONFIG SET rollback on set error"
    "CONFIG SET rollback on apply error" "CONFIG SET duplicate configs"
    "CONFIG GET hidden configs" "CONFIG GET multiple args"
    "/^MULTI / EXEC basics$" "DISCARD" "MULTI where commands alter argc/argv"
    "/^EXEC fails if there are errors while queueing commands" "If EXEC aborts, the client MULTI state is cleared"
    "/^EXEC fail on" "/^WATCH stale keys" "/^Delete WATCHed stale keys" "/^FLUSHDB while watching"
    "/^After (successful|failed) EXEC" "It is possible to UNWATCH" "/^FLUSH(ALL|DB) (is able|does not)"
    "/^WATCH will consider" "/^DISCARD should" "/^MULTI / EXEC (is|with)" "/OOM" "/use-memory" "/script timeout"
    "/^exec with" "Blocking commands ignores the timeout" "/^MULTI propagation of"
    "MULTI with SAVE" "MULTI with SHUTDOWN" "MULTI with config error"
    "Flushall while watching several keys by one client" "/^Keyspace notifications"
)
skips=()
if [ "${ALL:-}" != 1 ]; then
    for t in "${CANNOT_APPLY[@]}"; do skips+=(--skiptest "$t"); done
fi

total_ok=0 total_err=0
for unit in "${units[@]}"; do
    log=$OUT/$against-$unit.log
    # The harness exits non-zero on any failure; the counts are the result.
    (cd "$suite" && timeout 600 tclsh tests/test_helper.tcl --host 127.0.0.1 --port "$port" \
        --singledb --durable --single "unit/$unit" --clients 1 "${skips[@]}" 2>&1 \
        | sed 's/\x1b\[[0-9;]*m//g') >"$log" || true
    ok=$(grep -c '^\[ok\]' "$log" || true)
    err=$(grep -cE '^\[(err|exception)\]' "$log" || true)
    total_ok=$((total_ok + ok)) total_err=$((total_err + err))
    printf '%-14s %s: %3d ok, %3d failed   (%s)\n' "$unit" "$against" "$ok" "$err" "$log"
    grep -E '^\[(err|exception)\]' "$log" | sed 's/^/    /' || true
done
printf '%-14s %s: %3d ok, %3d failed\n' total "$against" "$total_ok" "$total_err"
