#!/usr/bin/env bash
# The long fuzzing run (`make fuzz`): every target of tests/fuzz/ (or the
# ones named: scripts/fuzz.sh resp http) for FUZZ_SECONDS each (default
# 300), on the fuzzing build (.venv-fuzz: clang, AddressSanitizer and
# libFuzzer's edge counters in the C code, see scripts/bootstrap.sh --fuzz),
# FUZZ_JOBS targets at a time (default 1).  Each target starts from its
# checked-in corpus and grows its own in build/fuzz-runs/<target>/corpus/
# (kept between runs); a crash, a hang (over 10 s on one input) or a
# finding stops the target and leaves its input in
# build/fuzz-runs/<target>/crashes/ and its report in .../log.  Then one
# line per target: executions, exec/s, coverage (libFuzzer's cov: edges
# and ft: features) and findings.  Exits 1 if any target found something.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${FUZZ_PYTHON:-}" ]; then
    scripts/bootstrap.sh --fuzz
    FUZZ_PYTHON=.venv-fuzz/bin/python
fi
seconds=${FUZZ_SECONDS:-300}
jobs=${FUZZ_JOBS:-1}
targets=("$@")
if ((${#targets[@]} == 0)); then
    for f in tests/fuzz/fuzz_*.py; do
        t=${f#tests/fuzz/fuzz_}
        targets+=("${t%.py}")
    done
fi

run_target() {  # run_target TARGET: libFuzzer's status
    local t=$1 work=build/fuzz-runs/$1
    mkdir -p "$work/corpus" "$work/crashes"
    "$FUZZ_PYTHON" "tests/fuzz/fuzz_$t.py" "$work/corpus" "tests/fuzz/corpus/$t" \
        -max_total_time="$seconds" -timeout=10 -artifact_prefix="$work/crashes/" \
        -print_final_stats=1 >"$work/log" 2>&1
}

summary() {  # summary TARGET STATUS: one line from the target's log
    local t=$1 status=$2 log=build/fuzz-runs/$1/log
    local runs rate last cov ft found
    runs=$(sed -n 's/^stat::number_of_executed_units: //p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: //p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    found=$(find "build/fuzz-runs/$t/crashes" -type f | wc -l)
    if ((status != 0)) && ((found == 0)); then found="status $status"; fi
    printf '%-12s %12s %8s %7s %7s   %s\n' "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" \
        "${ft:-?}" "$found"
}

echo "== fuzzing ${targets[*]}: ${seconds} s each, $jobs at a time, with $FUZZ_PYTHON"
declare -A status
pids=()
for t in "${targets[@]}"; do
    run_target "$t" & pids+=("$!:$t")
    if ((${#pids[@]} >= jobs)); then
        entry=${pids[0]}; pids=("${pids[@]:1}")
        rc=0; wait "${entry%%:*}" || rc=$?; status[${entry#*:}]=$rc
    fi
done
for entry in "${pids[@]}"; do
    rc=0; wait "${entry%%:*}" || rc=$?; status[${entry#*:}]=$rc
done

printf '%-12s %12s %8s %7s %7s   %s\n' target executions exec/s cov ft findings
failed=0
for t in "${targets[@]}"; do
    summary "$t" "${status[$t]}"
    ((status[$t] == 0)) || failed=1
done
((failed == 0)) || echo "findings: see build/fuzz-runs/<target>/log and crashes/"
exit $failed
