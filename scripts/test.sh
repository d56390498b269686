#!/usr/bin/env bash
# Runs every tensorwire test on a fresh or warm machine:
#   setup (Python venv with ONNX Runtime, built models), formatting and lint
#   checks, the Rust workspace tests (unit tests, wire test vectors, fuzz seed
#   corpus, integration tests against real agents on real sockets), and the
#   Python model tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo doc (warnings are errors: broken or private intra-doc links, bare URLs, ...)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
echo "== cargo test"
cargo test --workspace --locked 2>&1 | tee target/test-output.txt
echo "== pytest models, python/tests (the tensorwire package), examples"
.venv/bin/python -m pytest -q models python/tests examples
