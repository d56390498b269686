#!/usr/bin/env bash
# Core-path benchmark (docs/BENCHMARKS.md): tensorwire's round trips next to
# the raw socket floor and the engine called directly, all from one build in
# one run, REPEATS times, summarised as medians with the spread over repeats.
#   bash scripts/bench-core.sh            # N=20000 round trips per figure, 3 repeats
#   N=5000 REPEATS=3 bash scripts/bench-core.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${N:-20000}"
REPEATS="${REPEATS:-3}"
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
"$TW" serve --model "$MODEL" --listen "unix://$RUN/agent.sock" --listen tcp://127.0.0.1:0 \
    >"$RUN/agent.out" 2>"$RUN/agent.err" &
AGENT_PID=$!
for _ in $(seq 100); do
    [[ $(grep -c '^listening on' "$RUN/agent.out" 2>/dev/null) -ge 2 ]] && break
    sleep 0.1
done
UNIX="$(grep -o 'unix://.*' "$RUN/agent.out")"
TCP="$(grep -o 'tcp://.*' "$RUN/agent.out")"

rec() { # rec GROUP LABEL ARGS... : one ping --json, tagged, appended to results
    local group="$1" label="$2"; shift 2
    "$TW" ping --json "$@" | sed "s/^{/{\"group\":\"$group\",\"label\":\"$label\",\"repeat\":$rep,/" >> "$RESULTS"
}

for rep in $(seq "$REPEATS"); do
    echo "repeat $rep/$REPEATS"
    rec empty "tensorwire unix" --connect "$UNIX" -n "$N"
    rec empty "raw unix" --raw unix -n "$N"
    rec empty "tensorwire tcp" --connect "$TCP" -n "$N"
    rec empty "raw tcp" --raw tcp -n "$N"
    rec empty "tensorwire tcp?nodelay=0" --connect "$TCP?nodelay=0" -n "$N"
    rec empty "tensorwire inproc" --connect inproc:// -n "$N"
    rec empty "raw tcp split-writes" --raw tcp --split-writes --size 32 -n "$N"
    rec nagle "tensorwire tcp?nodelay=0 (32 B tensor)" --connect "$TCP?nodelay=0" --size 32 -n 2000 --warmup 100
    rec nagle "raw tcp nodelay=0 split-writes (32 B)" --raw tcp --nodelay 0 --split-writes --size 32 -n 20 --warmup 2
    rec model "digits local (engine, no transport)" --connect local --load "$MODEL" --model digits -n "$MODEL_N" --warmup 500
    rec model "digits inproc" --connect inproc:// --load "$MODEL" --model digits -n "$MODEL_N" --warmup 500
    rec model "digits unix" --connect "$UNIX" --model digits -n "$MODEL_N" --warmup 500
    rec model "digits tcp" --connect "$TCP" --model digits -n "$MODEL_N" --warmup 500
done
.venv/bin/python scripts/summarize_bench.py "$RESULTS"
