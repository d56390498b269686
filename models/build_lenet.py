#!/usr/bin/env python3
"""Builds models/build/lenet_digits.onnx: a small LeNet-like CNN, TRAINED
(with numpy, from a fixed seed) on scikit-learn's bundled 8x8 digits.

    x       float32 [batch, 1, 8, 8]   raw pixel intensities, 0..16, as load_digits gives them
    logits  float32 [batch, 10]

Graph: Mul(x, 1/16) -> Conv 3x3 pad 1 (1 -> 8) -> Relu -> Conv 3x3 pad 1
(8 -> 16) -> Relu -> MaxPool 2x2/2 -> Flatten (256) -> Gemm 256 -> 64 -> Relu
-> Gemm 64 -> 10.

Training is plain numpy written out here (im2col convolutions, hand-written
backward pass, softmax cross-entropy, Adam, mini-batches), in float64 with
BLAS limited to one thread, from a fixed seed on the fixed train/test split of
build_digits_mlp.load_split; the weights are cast to float32 at the end. The
same machine (and numpy/BLAS build) therefore produces the same bytes every
time; the test accuracy goes into lenet_digits.json.

Cached like build_digits_mlp.py (--force rebuilds); --bench measures ONNX
Runtime latency at batch 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnx_util as U  # noqa: E402
from build_digits_mlp import SEED as SPLIT_SEED  # noqa: E402
from build_digits_mlp import TEST_FRACTION, load_split  # noqa: E402

NAME = "lenet_digits"
SEED = 20240614
C1, C2, HIDDEN, CLASSES = 8, 16, 64, 10
SIDE = 8
PIXEL_MAX = 16.0
EPOCHS = 15
BATCH = 32
LEARNING_RATE = 2e-3
BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 1e-4  # L2, added to the gradient

DEFAULT_OUT = U.DEFAULT_OUT
PARAM_NAMES = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
               "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def builder_hash() -> str:
    """This script, onnx_util.py and build_digits_mlp.py (the split comes from it)."""
    here = Path(__file__).resolve().parent
    return U.builder_hash(Path(__file__), here / "onnx_util.py", here / "build_digits_mlp.py")


def load_images() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """build_digits_mlp's split, pixels reshaped to NCHW [n, 1, 8, 8] float32 (0..16)."""
    x_train, y_train, x_test, y_test = load_split()
    return x_train.reshape(-1, 1, SIDE, SIDE), y_train, x_test.reshape(-1, 1, SIDE, SIDE), y_test


# --------------------------------------------------------------------------- numpy CNN


def im2col3(x: np.ndarray) -> np.ndarray:
    """3x3, stride 1, pad 1 windows of x [n, c, h, w] as rows [n*h*w, c*9]
    (column index c*9 + i*3 + j, matching weight.reshape(c_out, c*9))."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # n c h w 3 3
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def col2im3(dcols: np.ndarray, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Adjoint of im2col3: sums the row gradients back onto the input."""
    n, c, h, w = shape
    d = dcols.reshape(n, h, w, c, 3, 3)
    dxp = np.zeros((n, c, h + 2, w + 2))
    for i in range(3):
        for j in range(3):
            dxp[:, :, i : i + h, j : j + w] += d[:, :, :, :, i, j].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1]


def conv3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """3x3 pad 1 conv; returns (y [n, c_out, h, w], the im2col rows for backward)."""
    n, _, h, wd = x.shape
    cols = im2col3(x)
    y = cols @ w.reshape(len(w), -1).T + b
    return y.reshape(n, h, wd, -1).transpose(0, 3, 1, 2), cols


def conv3_backward(dy: np.ndarray, cols: np.ndarray, w: np.ndarray, x_shape, need_dx: bool):
    c_out = len(w)
    dyr = dy.transpose(0, 2, 3, 1).reshape(-1, c_out)
    dw = (dyr.T @ cols).reshape(w.shape)
    db = dyr.sum(axis=0)
    dx = col2im3(dyr @ w.reshape(c_out, -1), x_shape) if need_dx else None
    return dx, dw, db


def maxpool2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2x2/2 max pool; returns (y, index of the (first) max in each window)."""
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
    idx = win.argmax(axis=-1)
    return np.take_along_axis(win, idx[..., None], axis=-1)[..., 0], idx


def maxpool2_backward(dy: np.ndarray, idx: np.ndarray) -> np.ndarray:
    n, c, h2, w2 = dy.shape
    dwin = (np.arange(4) == idx[..., None]) * dy[..., None]
    return dwin.reshape(n, c, h2, w2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h2 * 2, w2 * 2)


def forward(p: dict[str, np.ndarray], x: np.ndarray, keep: bool = False):
    """Logits for raw pixels x [n, 1, 8, 8] (float64 arithmetic); with keep=True
    also the intermediate values backward() needs."""
    x0 = np.asarray(x, np.float64) / PIXEL_MAX
    a1, cols1 = conv3(x0, p["conv1.weight"], p["conv1.bias"])
    h1 = np.maximum(a1, 0.0)
    a2, cols2 = conv3(h1, p["conv2.weight"], p["conv2.bias"])
    h2 = np.maximum(a2, 0.0)
    pooled, idx = maxpool2(h2)
    f = pooled.reshape(len(x0), -1)
    a3 = f @ p["fc1.weight"].T + p["fc1.bias"]
    h3 = np.maximum(a3, 0.0)
    z = h3 @ p["fc2.weight"].T + p["fc2.bias"]
    if not keep:
        return z
    return z, dict(x0=x0, cols1=cols1, a1=a1, h1=h1, cols2=cols2, a2=a2, idx=idx, pooled=pooled, f=f, a3=a3, h3=h3)


def loss_and_grads(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray):
    """Mean softmax cross-entropy over the batch and its gradients (no weight decay)."""
    z, s = forward(p, x, keep=True)
    n = len(z)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(n), y].mean()
    dz = np.exp(logp)
    dz[np.arange(n), y] -= 1.0
    dz /= n
    g = {"fc2.weight": dz.T @ s["h3"], "fc2.bias": dz.sum(axis=0)}
    da3 = (dz @ p["fc2.weight"]) * (s["a3"] > 0.0)
    g["fc1.weight"] = da3.T @ s["f"]
    g["fc1.bias"] = da3.sum(axis=0)
    dpooled = (da3 @ p["fc1.weight"]).reshape(s["pooled"].shape)
    da2 = maxpool2_backward(dpooled, s["idx"]) * (s["a2"] > 0.0)
    dh1, g["conv2.weight"], g["conv2.bias"] = conv3_backward(da2, s["cols2"], p["conv2.weight"], s["h1"].shape, True)
    da1 = dh1 * (s["a1"] > 0.0)
    _, g["conv1.weight"], g["conv1.bias"] = conv3_backward(da1, s["cols1"], p["conv1.weight"], s["x0"].shape, False)
    return float(loss), g


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-normal weights, zero biases (float64)."""
    shapes = {
        "conv1.weight": (C1, 1, 3, 3),
        "conv2.weight": (C2, C1, 3, 3),
        "fc1.weight": (HIDDEN, C2 * (SIDE // 2) ** 2),
        "fc2.weight": (CLASSES, HIDDEN),
    }
    p = {}
    for name in PARAM_NAMES:
        if name.endswith(".weight"):
            shape = shapes[name]
            p[name] = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        else:
            p[name] = np.zeros(shapes[name.replace(".bias", ".weight")][0])
    return p


def train(x: np.ndarray, y: np.ndarray) -> tuple[dict[str, np.ndarray], list[float]]:
    """Adam on mini-batches; returns float32 weights and the mean loss per epoch.

    BLAS runs single-threaded for the duration (threadpoolctl, which
    scikit-learn depends on), whatever the process set before: the float64
    sums, hence the weights, do not depend on the thread count.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        rng = np.random.default_rng(SEED)
        p = init_params(rng)
        m = {k: np.zeros_like(v) for k, v in p.items()}
        v = {k: np.zeros_like(v) for k, v in p.items()}
        b1, b2 = BETAS
        step = 0
        losses = []
        for _ in range(EPOCHS):
            order = rng.permutation(len(x))
            total = 0.0
            for start in range(0, len(x), BATCH):
                idx = order[start : start + BATCH]
                loss, g = loss_and_grads(p, x[idx], y[idx])
                total += loss * len(idx)
                step += 1
                for k in PARAM_NAMES:
                    gk = g[k] + WEIGHT_DECAY * p[k] if k.endswith(".weight") else g[k]
                    m[k] = b1 * m[k] + (1 - b1) * gk
                    v[k] = b2 * v[k] + (1 - b2) * gk * gk
                    mhat = m[k] / (1 - b1**step)
                    vhat = v[k] / (1 - b2**step)
                    p[k] = p[k] - LEARNING_RATE * mhat / (np.sqrt(vhat) + ADAM_EPS)
            losses.append(total / len(x))
    return {k: p[k].astype(np.float32) for k in PARAM_NAMES}, losses


# --------------------------------------------------------------------------- ONNX


def make_model(weights: dict[str, np.ndarray], doc: str):
    g = U.Graph("x", (1, SIDE, SIDE))
    y = g.mul_const("x", "scale", 1.0 / PIXEL_MAX)  # 1/16: exact in float32
    y = g.relu(g.conv(y, "conv1", weights["conv1.weight"], weights["conv1.bias"]), "relu1")
    y = g.relu(g.conv(y, "conv2", weights["conv2.weight"], weights["conv2.bias"]), "relu2")
    y = g.flatten(g.maxpool(y, "pool", 2, 2, 0), "flatten")
    y = g.relu(g.gemm(y, "fc1", weights["fc1.weight"], weights["fc1.bias"]), "relu3")
    g.gemm(y, "fc2", weights["fc2.weight"], weights["fc2.bias"])
    model = g.model(NAME, "fc2", "logits", ["batch", 1, SIDE, SIDE], ["batch", CLASSES],
                    "tensorwire models/build_lenet.py", doc)
    return model, g


def outputs(out_dir: Path) -> dict[str, Path]:
    return {"model": out_dir / f"{NAME}.onnx", "info": out_dir / f"{NAME}.json"}


def up_to_date(out_dir: Path) -> bool:
    return U.up_to_date(outputs(out_dir), builder_hash())


def build(out_dir: Path = DEFAULT_OUT, force: bool = False, quiet: bool = False) -> dict:
    files = outputs(out_dir)
    if not force and up_to_date(out_dir):
        info = json.loads(files["info"].read_text())
        if not quiet:
            print(f"{files['model']}: up to date (test accuracy {info['test_accuracy']:.4f})")
        return info

    import onnx

    x_train, y_train, x_test, y_test = load_images()
    weights, losses = train(x_train, y_train)
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    accuracy = float((forward(w64, x_test).argmax(axis=1) == y_test).mean())
    train_accuracy = float((forward(w64, x_train).argmax(axis=1) == y_train).mean())
    model, g = make_model(
        weights, f"LeNet-like CNN on scikit-learn digits (8x8); trained, seed {SEED}; test accuracy {accuracy:.4f}"
    )
    onnx.checker.check_model(model)
    model_bytes = model.SerializeToString()
    info = {
        "name": NAME,
        "model": files["model"].name,
        "input": {"name": "x", "dtype": "float32", "shape": ["batch", 1, SIDE, SIDE],
                  "values": "raw load_digits pixels 0..16 (the graph scales by 1/16)"},
        "output": {"name": "logits", "dtype": "float32", "shape": ["batch", CLASSES]},
        "layout": [
            "Mul 1/16",
            f"Conv 3x3 pad 1, 1 -> {C1}", "Relu",
            f"Conv 3x3 pad 1, {C1} -> {C2}", "Relu",
            "MaxPool 2x2/2",
            f"Flatten ({C2 * (SIDE // 2) ** 2})",
            f"Gemm {C2 * (SIDE // 2) ** 2} -> {HIDDEN}", "Relu",
            f"Gemm {HIDDEN} -> {CLASSES}",
        ],
        "weights": "trained",
        "trained": True,
        "dataset": "sklearn.datasets.load_digits (bundled, 1797 8x8 images)",
        "test_accuracy": round(accuracy, 6),
        "train_accuracy": round(train_accuracy, 6),
        "final_train_loss": round(losses[-1], 6),
        "seed": SEED,
        "split": {"from": "build_digits_mlp.load_split", "seed": SPLIT_SEED, "test_fraction": TEST_FRACTION,
                  "train_size": int(len(x_train)), "test_size": int(len(x_test))},
        "training": {"optimizer": "Adam", "learning_rate": LEARNING_RATE, "betas": list(BETAS), "eps": ADAM_EPS,
                     "weight_decay": WEIGHT_DECAY, "epochs": EPOCHS, "batch": BATCH,
                     "loss": "softmax cross-entropy", "arithmetic": "float64, BLAS 1 thread; weights cast to float32"},
        "parameters": g.parameters(),
        "macs_per_image": int(g.macs),
        "ops": U.op_counts(model),
        "opset": U.OPSET,
        "onnx_bytes": len(model_bytes),
        "onnx_sha256": hashlib.sha256(model_bytes).hexdigest(),
        "builder_sha256": builder_hash(),
    }
    U.write_outputs(files, {"model": model_bytes}, info)
    if not quiet:
        print(f"{files['model']}: built, test accuracy {accuracy:.4f} ({len(x_test)} test digits)")
    return info


def bench(out_dir: Path, runs: int = 500, threads: int = 2) -> dict:
    _, _, x_test, _ = load_images()
    return U.ort_latency(outputs(out_dir)["model"], {"x": np.ascontiguousarray(x_test[:1])}, runs=runs,
                         threads=threads, warmup=50)


def main(argv: list[str] | None = None) -> int:
    return U.builder_main(__doc__, NAME, DEFAULT_OUT, build, bench, 500, argv)


if __name__ == "__main__":
    sys.exit(main())
