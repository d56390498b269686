#!/usr/bin/env bash
# Shared-memory benchmark (docs/BENCHMARKS.md, issue 3), one agent listening
# on shm, unix and tcp at once:
#   1. empty request over shm next to the raw shm floor (two processes
#      spinning on a cache line), REPEATS times, interleaved;
#   2. round trips of 1 KiB, 1 MiB, 16 MiB and 64 MiB through `identity`
#      over shm, unix and tcp (over shm the tensor is allocated once in the
#      arena and re-sent; identity's outputs alias its inputs);
#   3. agent CPU over 10 s with 10 idle connected shm clients (/proc);
#   4. agent memory per additional connected shm client (/proc/PID/status:
#      RssAnon = private memory; RssShmem = arena pages it touched).
#   bash scripts/bench-shm.sh          # REPEATS=3
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REPEATS="${REPEATS:-3}"
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p tensorwire-cli 2>&1 | tail -1
TW="$ROOT/target/release/tensorwire"
OUT="$ROOT/target/bench-shm"
mkdir -p "$OUT"
RES="$OUT/results.jsonl"
: > "$RES"
RUN="$(mktemp -d)"
export TENSORWIRE_SHM_DIR="$RUN/shm"
NAME="bench$$"
"$TW" serve --listen "shm://$NAME" --listen "unix://$RUN/a.sock" --listen tcp://127.0.0.1:0 \
    >"$RUN/out" 2>"$RUN/err" &
AGENT=$!
trap 'kill $AGENT 2>/dev/null; wait $AGENT 2>/dev/null; rm -rf "$RUN"' EXIT
for _ in $(seq 100); do [[ $(grep -c '^listening on' "$RUN/out" 2>/dev/null) -ge 3 ]] && break; sleep 0.1; done
SHM="shm://$NAME"
UNIX="$(grep -o 'unix://.*' "$RUN/out")"
TCP="$(grep -o 'tcp://.*' "$RUN/out")"
rec() { # rec GROUP LABEL ARGS...
    local group="$1" label="$2"; shift 2
    "$TW" ping --json "$@" | sed "s/^{/{\"group\":\"$group\",\"label\":\"$label\",\"repeat\":$rep,/" >> "$RES"
}
echo "== empty request: shm vs the raw shm floor"
for rep in $(seq "$REPEATS"); do
    rec empty "raw shm" --raw shm -n 200000 --warmup 10000
    rec empty "tensorwire shm" --connect "$SHM" -n 200000 --warmup 10000
    rec empty "raw unix" --raw unix -n 20000
    rec empty "tensorwire unix" --connect "$UNIX" -n 20000
done
echo "== sizes"
for rep in $(seq "$REPEATS"); do
    for size in 1024 1048576 16777216 67108864; do
        n=$(( size >= 16777216 ? 30 : (size >= 1048576 ? 300 : 5000) ))
        w=$(( n / 10 ))
        for t in shm unix tcp; do
            case $t in shm) uri=$SHM ;; unix) uri=$UNIX ;; tcp) uri=$TCP ;; esac
            rec "size-$t" "$t $size" --connect "$uri" --size "$size" -n "$n" --warmup "$w"
        done
    done
done
echo "== idle agent CPU with 10 connected shm clients"
"$TW" hold --connect "$SHM" --clients 10 --seconds 14 > "$RUN/hold" &
HOLD=$!
for _ in $(seq 100); do grep -q holding "$RUN/hold" 2>/dev/null && break; sleep 0.1; done
sleep 1
tck=$(getconf CLK_TCK)
t0=$(awk '{print $14+$15}' /proc/$AGENT/stat); s0=$(date +%s.%N)
sleep 10
t1=$(awk '{print $14+$15}' /proc/$AGENT/stat); s1=$(date +%s.%N)
wait $HOLD
idle_pct=$(echo "$t0 $t1 $s0 $s1 $tck" | awk '{printf "%.3f", 100*($2-$1)/$5/($4-$3)}')
echo "{\"group\":\"idle\",\"clients\":10,\"cpu_pct\":$idle_pct,\"ticks\":$((t1-t0)),\"seconds\":10}" >> "$RES"
echo "== agent memory per connected shm client"
mem() { awk -v k="$1" '$1==k":" {print $2}' /proc/$AGENT/status; }
a0=$(mem RssAnon); h0=$(mem RssShmem)
"$TW" hold --connect "$SHM" --clients 50 --seconds 3 > "$RUN/hold2" &
HOLD=$!
for _ in $(seq 200); do grep -q holding "$RUN/hold2" 2>/dev/null && break; sleep 0.1; done
a1=$(mem RssAnon); h1=$(mem RssShmem)
wait $HOLD
echo "{\"group\":\"rss\",\"clients\":50,\"anon_kib_per_client\":$(( (a1-a0)/50 )),\"shmem_kib_per_client\":$(( (h1-h0)/50 )),\"anon_before_kib\":$a0,\"anon_with_kib\":$a1}" >> "$RES"
.venv/bin/python scripts/summarize_shm.py "$RES"
