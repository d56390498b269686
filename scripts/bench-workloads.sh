#!/usr/bin/env bash
# Workload benchmark (docs/BENCHMARKS.md, issue 4): the vAccel tweet-classifier
# table, REPEATS times, and the vision models (ResNet-50, MobileNetV2, LeNet)
# with the engine called directly ("local") vs through each transport, every
# transport run right after its local baseline in the same repeat.
#   bash scripts/bench-workloads.sh          # REPEATS=3
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REPEATS="${REPEATS:-3}"
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p tensorwire-cli 2>&1 | tail -1
TW="$ROOT/target/release/tensorwire"
OUT="$ROOT/target/bench-workloads"
mkdir -p "$OUT"
: > "$OUT/classify.jsonl"
: > "$OUT/results.jsonl"

echo "== classifier: $REPEATS repeats of classify --compare"
for rep in $(seq "$REPEATS"); do
    "$TW" classify -f examples/classifier/tweets.txt --compare "inproc,shm,unix,tcp,tcp?nodelay=0" --json 2>/dev/null |
        .venv/bin/python -c "import json,sys; [print(json.dumps(dict(r, repeat=$rep))) for r in json.load(sys.stdin)]" >> "$OUT/classify.jsonl"
done

echo "== vision models"
B=models/build
MODELS=(resnet50=$B/resnet50.onnx mobilenetv2=$B/mobilenetv2.onnx lenet=$B/lenet_digits.onnx)
RUN="$(mktemp -d)"
"$TW" serve "${MODELS[@]/#/--model=}" --listen "unix://$RUN/a.sock" --listen tcp://127.0.0.1:0 \
    >"$RUN/out" 2>"$RUN/err" &
AGENT=$!
trap 'kill $AGENT 2>/dev/null; wait $AGENT 2>/dev/null; rm -rf "$RUN"' EXIT
for _ in $(seq 200); do [[ $(grep -c '^listening on' "$RUN/out" 2>/dev/null) -ge 2 ]] && break; sleep 0.1; done
UNIX="$(grep -o 'unix://.*' "$RUN/out")"
TCP="$(grep -o 'tcp://.*' "$RUN/out")"
rec() { # rec LABEL ARGS...
    local label="$1"; shift
    "$TW" ping --json "$@" | sed "s/^{/{\"group\":\"vision\",\"label\":\"$label\",\"repeat\":$rep,/" >> "$OUT/results.jsonl"
}
for rep in $(seq "$REPEATS"); do
    for spec in "resnet50 30 5" "mobilenetv2 300 30" "lenet 5000 500"; do
        set -- $spec
        m=$1 n=$2 w=$3
        path=$(printf '%s\n' "${MODELS[@]}" | grep "^$m=")
        rec "$m local" --connect local --load "$path" --model "$m" -n "$n" --warmup "$w"
        rec "$m inproc" --connect inproc:// --load "$path" --model "$m" -n "$n" --warmup "$w"
        rec "$m unix" --connect "$UNIX" --model "$m" -n "$n" --warmup "$w"
        rec "$m tcp" --connect "$TCP" --model "$m" -n "$n" --warmup "$w"
    done
done
.venv/bin/python scripts/summarize_bench.py "$OUT/results.jsonl" --classify "$OUT/classify.jsonl"
