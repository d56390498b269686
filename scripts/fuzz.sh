#!/usr/bin/env bash
# Runs the cargo-fuzz campaigns of fuzz/ (not part of CI): decode (the wire
# decoder), shm_ring (the agent's shm session facing a hostile client) and
# agent_session (structured client sessions against a real AgentCore), one
# after the other, one job each (the cores are shared). Installs cargo-fuzz
# if it is missing; needs a nightly toolchain (`rustup toolchain install
# nightly`).
#
#   scripts/fuzz.sh                     # 10^7 executions per target
#   scripts/fuzz.sh --runs 1000000      # another count
#   scripts/fuzz.sh --quick             # 20 000 executions each (a smoke run)
#   scripts/fuzz.sh --max-time 900      # and at most 900 s per target
#   scripts/fuzz.sh decode shm_ring     # only these targets
#
# New inputs go to target/fuzz-corpus/<target>/ (seeded from the committed
# fuzz/corpus/<target>/, which is never written); crashes to
# fuzz/artifacts/<target>/. Prints one summary line per target:
# executions, seconds, execs/s, coverage (cov/ft), crashes. To refresh a
# committed corpus after a campaign:
#   cargo +nightly fuzz cmin <target> target/fuzz-corpus/<target>
# then copy it into fuzz/corpus/<target>/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

runs=10000000
max_time=0
targets=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) runs=20000; shift ;;
        --runs) runs="$2"; shift 2 ;;
        --max-time) max_time="$2"; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=(decode shm_ring agent_session)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

summaries=()
for t in "${targets[@]}"; do
    work="target/fuzz-corpus/$t"
    log="target/fuzz-$t.log"
    mkdir -p "$work"
    echo "== $t: $runs runs (log $log)"
    start=$(date +%s.%N)
    status=0
    cargo +nightly fuzz run "$t" "$work" "fuzz/corpus/$t" -- \
        -runs="$runs" -max_total_time="$max_time" -timeout=10 -print_final_stats=1 \
        >"$log" 2>&1 || status=$?
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    execs=$(grep -o 'number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    crashes=$(ls "fuzz/artifacts/$t" 2>/dev/null | grep -c '^crash-\|^timeout-\|^oom-' || true)
    line=$(printf '%-14s execs %-10s secs %-8.1f execs/s %-8s %-22s crashes %s (exit %s)' \
        "$t" "${execs:-?}" "$secs" "$( [[ -n "$execs" ]] && echo "$execs / $secs" | bc || echo '?')" \
        "${cov:-cov: ?}" "$crashes" "$status")
    echo "$line"
    summaries+=("$line")
done
echo "== summary"
printf '%s\n' "${summaries[@]}"
