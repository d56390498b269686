#!/usr/bin/env python3
"""Builds models/build/slow_echo.onnx: a model that computes for a while and
echoes its input, so a test can aim at a request while it is in the engine.

`tensorwire torture` kills clients at a chosen stage of a request (queued,
computing, being answered). That needs an engine run long enough to see and
hit (~100-300 ms here), and payloads of any size (256 B to 64 MiB) without
the run time growing with them. The graph:

    x       float32 [n]         any length (the payload)
    y       float32 [n]         = x (Identity: the answer is as large as the request)
    s       = x[0:1]            a scalar taken from the input, so nothing folds at load
    h0      = W * s             [D, D]
    h_k     = h_{k-1} @ W       LAYERS times (one orthogonal W, shared: a small file;
                                norms are kept, so values stay finite)
    z       float32 [1, 1]      = mean(h_LAYERS)

The cost is LAYERS multiplications of D x D matrices (D^3 multiply-adds each),
whatever n is. Weights are seeded; the sidecar JSON records them and the
run time ONNX Runtime took here with one intra-op thread (`--bench`).

The build is skipped when every output exists and the JSON records this
script's current hash (use --force to rebuild anyway).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

from onnx_util import DEFAULT_OUT, IR_VERSION, OPSET, json_bytes, source_hash, up_to_date, write_outputs

NAME = "slow_echo"
SEED = 20261127
D = 512
LAYERS = 96


def outputs(out_dir: Path) -> dict[str, Path]:
    """Every file the builder writes, by role."""
    return {"model": out_dir / f"{NAME}.onnx", "info": out_dir / f"{NAME}.json"}


def orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    """A random orthogonal d x d matrix (QR of a Gaussian one, signs fixed)."""
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


def forward(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The graph in numpy: (y, z)."""
    h = w.astype(np.float64) * float(x[0])
    for _ in range(LAYERS):
        h = h @ w
    return x.copy(), np.array([[h.mean()]], dtype=np.float32)


def make_model(w: np.ndarray):
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(w, name="W"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), name="start"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), name="end"),
    ]
    nodes = [
        helper.make_node("Identity", ["x"], ["y"], name="echo"),
        helper.make_node("Slice", ["x", "start", "end"], ["s"], name="first"),
        helper.make_node("Mul", ["W", "s"], ["h0"], name="scale"),
    ]
    for k in range(1, LAYERS + 1):
        nodes.append(helper.make_node("MatMul", [f"h{k - 1}", "W"], [f"h{k}"], name=f"matmul{k}"))
    nodes.append(helper.make_node("ReduceMean", [f"h{LAYERS}"], ["z"], name="mean", axes=[0, 1], keepdims=1))
    graph = helper.make_graph(
        nodes,
        NAME,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1]),
        ],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="tensorwire-models",
        producer_version="1",
        doc_string=f"echo of x beside {LAYERS} MatMuls of {D}x{D} (seed {SEED}): a slow model to aim kills at",
    )
    model.ir_version = IR_VERSION
    return model


def bench(model_bytes: bytes, runs: int = 5) -> float:
    """Median ms of one run on ONNX Runtime, one intra-op thread."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    x = np.ones(64, dtype=np.float32)
    sess.run(None, {"x": x})
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, {"x": x})
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def build(out_dir: Path = DEFAULT_OUT, force: bool = False, quiet: bool = False, measure: bool = False) -> dict:
    """Builds (or, when cached, reads) the model and returns its info record."""
    import json

    files = outputs(out_dir)
    key = source_hash(__file__)
    if not force and up_to_date(files, key):
        info = json.loads(files["info"].read_text())
        if not quiet:
            print(f"{files['model']}: up to date")
        return info

    import onnx

    w = orthogonal(np.random.default_rng(SEED), D)
    model = make_model(w)
    onnx.checker.check_model(model)
    model_bytes = model.SerializeToString()
    info = {
        "name": NAME,
        "model": files["model"].name,
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["n"]}],
        "outputs": [
            {"name": "y", "dtype": "float32", "shape": ["n"]},
            {"name": "z", "dtype": "float32", "shape": [1, 1]},
        ],
        "weights": "random (seeded orthogonal)",
        "seed": SEED,
        "d": D,
        "layers": LAYERS,
        "macs": LAYERS * D**3,
        "opset": OPSET,
        "onnx_sha256": hashlib.sha256(model_bytes).hexdigest(),
        "builder_sha256": key,
    }
    if measure:
        info["ort_ms_one_thread"] = round(bench(model_bytes), 1)
    write_outputs(files, {"model": model_bytes}, info)
    if not quiet:
        extra = f", {info['ort_ms_one_thread']} ms a run on one thread" if measure else ""
        print(f"{files['model']}: built ({LAYERS} x {D}^3 multiply-adds{extra})")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="where to write (default: models/build)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cached build is current")
    ap.add_argument("--bench", action="store_true", help="time a run on ONNX Runtime (recorded in the JSON)")
    args = ap.parse_args(argv)
    build(args.out_dir, force=args.force, measure=args.bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
