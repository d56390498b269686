#!/usr/bin/env bash
# The main job: set up everything on a fresh machine (Python venv with ONNX
# Runtime, the models, the release binary), then reproduce the vAccel
# experiment: the BERT-style tweet classifier (MiniLM-L6, real weights, a
# zero-shot head) run in-process and through an agent over every transport,
# with the RPC tax of each and a bit-exact check against in-process. Then the
# smaller tour: the digits model through the embedded agent and an agent
# process, and each transport's round trip next to a bare socket.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh
echo "== building the release binary"
cargo build --release --locked -p tensorwire-cli
TW="$ROOT/target/release/tensorwire"

echo
echo "== the tweet classifier: in-process vs through an agent on each transport"
"$TW" classify -f examples/classifier/tweets.txt --compare "inproc,shm,unix,tcp,tcp?nodelay=0"

MODEL="digits=models/build/digits_mlp.onnx"
SAMPLE=models/build/digits_sample.npy
.venv/bin/python models/make_digits_sample.py "$SAMPLE"

echo
echo "== embedded agent (inproc://, no server running)"
"$TW" infer --load "$MODEL" --model digits --input "x=$SAMPLE" --timeline

RUN="$(mktemp -d)"
AGENT_PID=""
cleanup() {
    [[ -n "$AGENT_PID" ]] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null
    rm -rf "$RUN"
}
trap cleanup EXIT
echo
echo "== agent process on unix and tcp"
"$TW" serve --model "$MODEL" --listen "unix://$RUN/agent.sock" --listen tcp://127.0.0.1:0 \
    >"$RUN/agent.out" 2>"$RUN/agent.err" &
AGENT_PID=$!
for _ in $(seq 100); do
    [[ $(grep -c '^listening on' "$RUN/agent.out" 2>/dev/null) -ge 2 ]] && break
    sleep 0.1
done
cat "$RUN/agent.out"
UNIX="$(grep -o 'unix://.*' "$RUN/agent.out")"
TCP="$(grep -o 'tcp://.*' "$RUN/agent.out")"
"$TW" models --connect "$UNIX"
for uri in "$UNIX" "$TCP"; do
    "$TW" infer --connect "$uri" --model digits --input "x=$SAMPLE"
done
echo
echo "== the same agent from Python (the tensorwire package, python/README.md)"
.venv/bin/python examples/python/digits.py "$UNIX" "$TCP"

echo
echo "== round trips (µs; same run, nothing pinned; raw = bare socket, no framework,"
echo "   both ends polling 200 µs before they block as tensorwire's client and agent do;"
echo "   each line names its placement)"
N="${N:-20000}"
"$TW" ping --connect inproc:// -n "$N"
"$TW" ping --connect "$UNIX" -n "$N"
"$TW" ping --raw unix -n "$N"
"$TW" ping --connect "$TCP" -n "$N"
"$TW" ping --connect "$TCP?nodelay=0" -n "$N"
"$TW" ping --raw tcp -n "$N"
echo
echo "== the digits model: engine called directly vs through each transport"
"$TW" ping --connect local --load "$MODEL" --model digits -n 5000 --warmup 500
"$TW" ping --connect inproc:// --load "$MODEL" --model digits -n 5000 --warmup 500
"$TW" ping --connect "$UNIX" --model digits -n 5000 --warmup 500
"$TW" ping --connect "$TCP" --model digits -n 5000 --warmup 500
kill -TERM "$AGENT_PID"
wait "$AGENT_PID"
AGENT_PID=""
echo
echo "agent stopped cleanly: $(tail -1 "$RUN/agent.err")"
