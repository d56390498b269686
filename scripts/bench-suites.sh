#!/usr/bin/env bash
# The three `tensorwire bench` suites (docs/BENCHMARKS.md, issue 5), each
# regenerating one published experiment with tensorwire's rows in it:
#   vaccel     empty-RPC round trip: tensorwire vs raw floor vs ttrpc vs
#              gRPC over unix / tcp / tcp-nagle, plus the classifier table
#   breakdown  identity 588 KiB, MobileNetV2, ResNet-50, MiniLM over every
#              transport, 1 -> 16 clients, stage breakdown
#   load       open-loop Poisson sweep of offered load per transport
# Each writes results.json, results.csv, report.md and SVG/PNG plots to
# target/bench/<suite>/ (OUT=dir to change). QUICK=1 runs the <1 min versions.
#   bash scripts/bench-suites.sh                 # all three, full (~25 min)
#   bash scripts/bench-suites.sh vaccel load     # some of them
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh >/dev/null
cargo build --release --locked -p tensorwire-cli 2>&1 | tail -1
TW="$ROOT/target/release/tensorwire"
OUT="${OUT:-$ROOT/target/bench}"
SUITES=("$@")
[[ ${#SUITES[@]} -eq 0 ]] && SUITES=(vaccel breakdown load)
EXTRA=()
[[ "${QUICK:-0}" == 1 ]] && EXTRA+=(--quick)
for s in "${SUITES[@]}"; do
    echo "== suite $s"
    start=$(date +%s)
    "$TW" bench --suite "$s" "${EXTRA[@]}" --out "$OUT/$s"
    echo "suite $s took $(( $(date +%s) - start )) s; report: $OUT/$s/report.md"
done
