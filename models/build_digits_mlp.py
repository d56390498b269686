#!/usr/bin/env python3
"""Builds models/build/digits_mlp.onnx: a small, real, deterministic model.

An MLP classifying scikit-learn's bundled 8x8 handwritten digits (load_digits:
no network needed):

    x       float32 [batch, 64]   raw pixel intensities, 0..16, as load_digits gives them
    hidden  = Relu(x @ W1 + b1)   64 units (the 1/16 input scaling is folded into W1)
    logits  float32 [batch, 10]   = hidden @ W2 + b2

It is trained with plain numpy (minibatch SGD with momentum, softmax
cross-entropy) from a fixed seed on a fixed train/test split, so every run
produces the same bytes. Alongside the model it writes:

    digits_mlp.json           test accuracy, seed, split, hyper-parameters, hashes
    digits_mlp_input.bin      a fixed input: raw little-endian float32 [4, 64]
    digits_mlp_expected.bin   the logits numpy computes for it: float32 [4, 10]

The Rust engine's integration test runs the model through ONNX Runtime on the
input and compares against the expected logits.

The build is skipped when every output exists and the JSON records this
script's current hash (use --force to rebuild anyway).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

# One BLAS thread: floating-point sums then do not depend on the machine's
# core count, and the weights (hence the file) are the same on every machine.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

NAME = "digits_mlp"
SEED = 20240611
TEST_FRACTION = 0.2
HIDDEN = 64
CLASSES = 10
FEATURES = 64
PIXEL_MAX = 16.0
EPOCHS = 60
BATCH = 32
LEARNING_RATE = 0.05
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4
OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17
REFERENCE_ROWS = 4  # rows of the test set written as the fixed input

DEFAULT_OUT = Path(__file__).resolve().parent / "build"


def builder_hash() -> str:
    """SHA-256 of this script: the cache key of everything it writes."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits data (float32 pixels 0..16, int labels), split by a fixed permutation."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    n_test = int(round(len(x) * TEST_FRACTION))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def train(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Trains the MLP in float64; returns float32 weights taking raw (0..16) pixels."""
    rng = np.random.default_rng(SEED + 1)
    xs = x.astype(np.float64) / PIXEL_MAX
    w1 = rng.normal(0.0, np.sqrt(2.0 / FEATURES), (FEATURES, HIDDEN))
    b1 = np.zeros(HIDDEN)
    w2 = rng.normal(0.0, np.sqrt(2.0 / HIDDEN), (HIDDEN, CLASSES))
    b2 = np.zeros(CLASSES)
    params = [w1, b1, w2, b2]
    velocity = [np.zeros_like(p) for p in params]
    onehot = np.eye(CLASSES)[y]
    for _ in range(EPOCHS):
        order = rng.permutation(len(xs))
        for start in range(0, len(xs), BATCH):
            idx = order[start : start + BATCH]
            xb, tb = xs[idx], onehot[idx]
            h_pre = xb @ w1 + b1
            h = np.maximum(h_pre, 0.0)
            z = h @ w2 + b2
            z -= z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            dz = (p - tb) / len(idx)
            dw2 = h.T @ dz + WEIGHT_DECAY * w2
            db2 = dz.sum(axis=0)
            dh = (dz @ w2.T) * (h_pre > 0.0)
            dw1 = xb.T @ dh + WEIGHT_DECAY * w1
            db1 = dh.sum(axis=0)
            for p_, v, g in zip(params, velocity, (dw1, db1, dw2, db2)):
                v *= MOMENTUM
                v -= LEARNING_RATE * g
                p_ += v
    return {
        # Fold the input scaling into the first layer: the model takes raw pixels.
        "W1": (w1 / PIXEL_MAX).astype(np.float32),
        "b1": b1.astype(np.float32),
        "W2": w2.astype(np.float32),
        "b2": b2.astype(np.float32),
    }


def forward(weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The model's forward pass in numpy (float64 arithmetic, float32 result)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    h = np.maximum(x.astype(np.float64) @ w["W1"] + w["b1"], 0.0)
    return (h @ w["W2"] + w["b2"]).astype(np.float32)


def make_model(weights: dict[str, np.ndarray], doc: str):
    """The ONNX graph: MatMul, Add, Relu, MatMul, Add; batch dimension symbolic."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(weights[k], name=k) for k in ("W1", "b1", "W2", "b2")]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h_mm"], name="fc1_matmul"),
        helper.make_node("Add", ["h_mm", "b1"], ["h_pre"], name="fc1_bias"),
        helper.make_node("Relu", ["h_pre"], ["h"], name="relu"),
        helper.make_node("MatMul", ["h", "W2"], ["z_mm"], name="fc2_matmul"),
        helper.make_node("Add", ["z_mm", "b2"], ["logits"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        NAME,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="tensorwire models/build_digits_mlp.py",
        producer_version="1",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    return model


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def outputs(out_dir: Path) -> dict[str, Path]:
    """Every file the builder writes, by role."""
    return {
        "model": out_dir / f"{NAME}.onnx",
        "info": out_dir / f"{NAME}.json",
        "input": out_dir / f"{NAME}_input.bin",
        "expected": out_dir / f"{NAME}_expected.bin",
    }


def up_to_date(out_dir: Path) -> bool:
    files = outputs(out_dir)
    if not all(p.is_file() for p in files.values()):
        return False
    try:
        info = json.loads(files["info"].read_text())
    except (OSError, ValueError):
        return False
    return info.get("builder_sha256") == builder_hash()


def build(out_dir: Path = DEFAULT_OUT, force: bool = False, quiet: bool = False) -> dict:
    """Builds (or, when cached, reads) the model and returns its info record."""
    files = outputs(out_dir)
    if not force and up_to_date(out_dir):
        info = json.loads(files["info"].read_text())
        if not quiet:
            print(f"{files['model']}: up to date (test accuracy {info['test_accuracy']:.4f})")
        return info

    import onnx

    x_train, y_train, x_test, y_test = load_split()
    weights = train(x_train, y_train)
    test_logits = forward(weights, x_test)
    accuracy = float((test_logits.argmax(axis=1) == y_test).mean())
    model = make_model(
        weights,
        f"MLP 64-64-10 on scikit-learn digits; seed {SEED}; test accuracy {accuracy:.4f}",
    )
    onnx.checker.check_model(model)
    model_bytes = model.SerializeToString()

    ref_input = np.ascontiguousarray(x_test[:REFERENCE_ROWS], dtype="<f4")
    ref_expected = np.ascontiguousarray(forward(weights, ref_input), dtype="<f4")

    info = {
        "name": NAME,
        "model": files["model"].name,
        "input": {"name": "x", "dtype": "float32", "shape": ["batch", FEATURES]},
        "output": {"name": "logits", "dtype": "float32", "shape": ["batch", CLASSES]},
        "test_accuracy": round(accuracy, 6),
        "seed": SEED,
        "train_size": int(len(x_train)),
        "test_size": int(len(x_test)),
        "test_fraction": TEST_FRACTION,
        "hidden": HIDDEN,
        "epochs": EPOCHS,
        "batch": BATCH,
        "learning_rate": LEARNING_RATE,
        "momentum": MOMENTUM,
        "weight_decay": WEIGHT_DECAY,
        "opset": OPSET,
        "reference": {
            "input_file": files["input"].name,
            "expected_file": files["expected"].name,
            "rows": REFERENCE_ROWS,
            "input_shape": list(ref_input.shape),
            "expected_shape": list(ref_expected.shape),
            "dtype": "float32 little-endian",
            "test_labels": [int(v) for v in y_test[:REFERENCE_ROWS]],
        },
        "onnx_sha256": hashlib.sha256(model_bytes).hexdigest(),
        "builder_sha256": builder_hash(),
    }

    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(files["model"], model_bytes)
    write_atomic(files["input"], ref_input.tobytes())
    write_atomic(files["expected"], ref_expected.tobytes())
    # The info file goes last: it is what marks the build complete.
    write_atomic(files["info"], (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
    if not quiet:
        print(f"{files['model']}: built, test accuracy {accuracy:.4f} ({len(x_test)} test digits)")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="where to write (default: models/build)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cached build is current")
    args = ap.parse_args(argv)
    build(args.out_dir, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
