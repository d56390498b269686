#!/usr/bin/env bash
# Core-path benchmark (docs/BENCHMARKS.md). Every tensorwire figure is paired
# with its baseline measured right before it (the raw socket floor with the
# same bytes and the same CPU placement; the engine called directly for
# models), REPEATS times, interleaved so machine drift hits both alike. The
# summary gives medians, the spread over repeats, and the median of the
# per-pair ratios.
#   bash scripts/bench-core.sh                      # N=20000, REPEATS=5
#   N=5000 REPEATS=3 bash scripts/bench-core.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${N:-20000}"
REPEATS="${REPEATS:-5}"
MODEL_N="${MODEL_N:-5000}"

bash scripts/setup.sh >/dev/null
cargo build --release --locked -p tensorwire-cli 2>&1 | tail -1
TW="$ROOT/target/release/tensorwire"
MODEL="digits=models/build/digits_mlp.onnx"
OUT="$ROOT/target/bench-core"
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
RUN="$(mktemp -d)"
AGENT_PID=""
cleanup() {
    [[ -n "$AGENT_PID" ]] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
    rm -rf "$RUN"
}
trap cleanup EXIT

# start_agent [taskset prefix...]: an agent on unix + tcp serving the digits model.
start_agent() {
    cleanup; RUN="$(mktemp -d)"
    "$@" "$TW" serve --model "$MODEL" --listen "unix://$RUN/agent.sock" --listen tcp://127.0.0.1:0 \
        >"$RUN/agent.out" 2>"$RUN/agent.err" &
    AGENT_PID=$!
    for _ in $(seq 100); do
        [[ $(grep -c '^listening on' "$RUN/agent.out" 2>/dev/null) -ge 2 ]] && break
        sleep 0.1
    done
    UNIX="$(grep -o 'unix://.*' "$RUN/agent.out")"
    TCP="$(grep -o 'tcp://.*' "$RUN/agent.out")"
}

rec() { # rec GROUP LABEL [taskset...] -- PING ARGS: one `ping --json`, tagged, appended
    local group="$1" label="$2"; shift 2
    local pre=()
    while [[ "$1" != "--" ]]; do pre+=("$1"); shift; done
    shift
    "${pre[@]}" "$TW" ping --json "$@" |
        sed "s/^{/{\"group\":\"$group\",\"label\":\"$label\",\"repeat\":$rep,/" >> "$RESULTS"
}

# Placement: unpinned (as users run it), agent and client on one core, and on
# different cores (the raw echo peer pinned like the agent: --peer-cpu).
for placement in unpinned same-core cross-core; do
    case "$placement" in
        unpinned)   AG=(env); CL=(env); PEER=() ;;
        same-core)  AG=(taskset -c 0); CL=(taskset -c 0); PEER=(--peer-cpu 0) ;;
        cross-core) AG=(taskset -c 0); CL=(taskset -c 1); PEER=(--peer-cpu 0) ;;
    esac
    start_agent "${AG[@]}"
    echo "placement $placement"
    for rep in $(seq "$REPEATS"); do
        rec "$placement" "raw unix" "${CL[@]}" -- --raw unix -n "$N" "${PEER[@]}"
        rec "$placement" "tensorwire unix" "${CL[@]}" -- --connect "$UNIX" -n "$N"
        rec "$placement" "raw tcp" "${CL[@]}" -- --raw tcp -n "$N" "${PEER[@]}"
        rec "$placement" "tensorwire tcp" "${CL[@]}" -- --connect "$TCP" -n "$N"
        rec "$placement" "tensorwire tcp?nodelay=0" "${CL[@]}" -- --connect "$TCP?nodelay=0" -n "$N"
        rec "$placement" "tensorwire inproc" "${CL[@]}" -- --connect inproc:// -n "$N"
    done
done

start_agent env
for rep in $(seq 3); do
    rec nagle "raw tcp split-writes (header, then body)" env -- --raw tcp --split-writes --size 32 -n "$N"
    rec nagle "raw tcp nodelay=0 split-writes" env -- --raw tcp --nodelay 0 --split-writes --size 32 -n 20 --warmup 2
    rec nagle "tensorwire tcp?nodelay=0 (one sendmsg)" env -- --connect "$TCP?nodelay=0" --size 32 -n 2000 --warmup 100
done
for rep in $(seq "$REPEATS"); do
    rec model "digits local (engine, no transport)" env -- --connect local --load "$MODEL" --model digits -n "$MODEL_N" --warmup 500
    rec model "digits inproc" env -- --connect inproc:// --load "$MODEL" --model digits -n "$MODEL_N" --warmup 500
    rec model "digits unix" env -- --connect "$UNIX" --model digits -n "$MODEL_N" --warmup 500
    rec model "digits tcp" env -- --connect "$TCP" --model digits -n "$MODEL_N" --warmup 500
done
.venv/bin/python scripts/summarize_bench.py "$RESULTS"
echo
echo "raw results: $RESULTS"
