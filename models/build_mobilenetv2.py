#!/usr/bin/env python3
"""Builds models/build/mobilenetv2.onnx: torchvision's MobileNetV2 layout with
seeded RANDOM weights and BatchNorm folded into the convolutions.

    input   float32 [batch, 3, 224, 224]
    logits  float32 [batch, 1000]

Layout (torchvision.models.mobilenet_v2, width 1.0): stem conv 3x3/2 (32) +
ReLU6; inverted residual blocks with (expansion t, channels c, repeats n,
stride s) = [1,16,1,1] [6,24,2,2] [6,32,3,2] [6,64,4,2] [6,96,3,1] [6,160,3,2]
[6,320,1,1], each block 1x1 expand (absent when t = 1) + ReLU6, depthwise 3x3
(group = channels, the block's stride) + ReLU6, 1x1 linear projection, and a
residual add when stride 1 and channels in = out; last conv 1x1 320 -> 1280 +
ReLU6; global average pool; classifier fc 1280 -> 1000 (dropout is a no-op at
inference). ReLU6 is Clip(x, 0, 6). Every conv's BatchNorm is folded into it
(onnx_util.fold_bn).

The weights are random, not trained (He-normal convs, seeded BN statistics
folded in, torch.nn.Linear-style classifier init): the logits mean nothing.
ONNX Runtime's latency does not depend on weight values, so the model stands
in for a trained MobileNetV2 in latency and transport measurements.

Writes mobilenetv2.onnx (~14 MB) and mobilenetv2.json. Cached like
build_digits_mlp.py (--force rebuilds); --bench measures ONNX Runtime latency.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnx_util as U  # noqa: E402

NAME = "mobilenetv2"
SEED = 20240613
SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)
STEM = 32
LAST = 1280
CLASSES = 1000
IMAGE = 224
GAMMA = (0.8, 1.2)
TORCHVISION_PARAMETERS = 3_504_872  # sum(p.numel() for p in torchvision.models.mobilenet_v2().parameters())

DEFAULT_OUT = U.DEFAULT_OUT


def builder_hash() -> str:
    return U.source_hash(__file__)


def make_graph(seed: int = SEED, settings=SETTINGS, stem: int = STEM, last: int = LAST, classes: int = CLASSES,
               image: int = IMAGE) -> U.Graph:
    """The network with its (seeded, folded) weights, drawn in graph order."""
    rng = np.random.default_rng(seed)
    g = U.Graph("input", (3, image, image))
    y = g.relu6(g.conv_bn(rng, "input", "features.0", stem, 3, stride=2, gamma_range=GAMMA), "features.0.relu6")
    k = 1
    for t, c, n, s in settings:
        for i in range(n):
            stride = s if i == 0 else 1
            pre = f"features.{k}"
            c_in = g.shapes[y][0]
            hidden = int(round(c_in * t))
            h = y
            if t != 1:
                h = g.relu6(g.conv_bn(rng, h, f"{pre}.expand", hidden, 1, gamma_range=GAMMA), f"{pre}.expand.relu6")
            h = g.relu6(g.conv_bn(rng, h, f"{pre}.dw", hidden, 3, stride=stride, group=hidden, gamma_range=GAMMA),
                        f"{pre}.dw.relu6")
            h = g.conv_bn(rng, h, f"{pre}.project", c, 1, gamma_range=GAMMA)
            y = g.add(y, h, f"{pre}.add") if (stride == 1 and c_in == c) else h
            k += 1
    y = g.relu6(g.conv_bn(rng, y, f"features.{k}", last, 1, gamma_range=GAMMA), f"features.{k}.relu6")
    y = g.flatten(g.global_avgpool(y, "avgpool"), "flatten")
    w, b = U.linear_uniform(rng, classes, g.shapes[y][0])
    g.gemm(y, "classifier", w, b)
    return g


def make_model(seed: int = SEED, settings=SETTINGS, stem: int = STEM, last: int = LAST, classes: int = CLASSES,
               image: int = IMAGE):
    """(ModelProto, Graph). Spatial dims are fixed at `image`; batch is symbolic."""
    g = make_graph(seed, settings, stem, last, classes, image)
    doc = (f"MobileNetV2 (torchvision layout, width 1.0) with BatchNorm folded; RANDOM weights (seed {seed}), "
           "not trained: for latency/transport measurement only")
    model = g.model(NAME, "classifier", "logits", ["batch", 3, image, image], ["batch", classes],
                    "tensorwire models/build_mobilenetv2.py", doc)
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
            print(f"{files['model']}: up to date ({info['parameters']:,} parameters, random weights)")
        return info

    import onnx

    model, g = make_model()
    model_bytes = model.SerializeToString()
    onnx.checker.check_model(model)
    info = {
        "name": NAME,
        "model": files["model"].name,
        "input": {"name": "input", "dtype": "float32", "shape": ["batch", 3, IMAGE, IMAGE]},
        "output": {"name": "logits", "dtype": "float32", "shape": ["batch", CLASSES]},
        "layout": {
            "family": "torchvision.models.mobilenet_v2 (width 1.0)",
            "stem": f"conv 3x3/2 {STEM} + ReLU6",
            "block": "inverted residual: 1x1 expand (t != 1) + ReLU6, depthwise 3x3 (group = channels) + ReLU6, "
                     "1x1 linear projection, residual add when stride 1 and channels in == out",
            "settings_t_c_n_s": [list(s) for s in SETTINGS],
            "last_conv": f"1x1 {SETTINGS[-1][1]} -> {LAST} + ReLU6",
            "head": f"global average pool, fc {LAST} -> {CLASSES} (dropout omitted: inference)",
            "relu6": "Clip(x, 0, 6)",
            "batchnorm": "folded into the preceding conv (conv bias = folded BN shift)",
        },
        "weights": "random",
        "trained": False,
        "seed": SEED,
        "init": {
            "conv": "He normal N(0, 2/fan_in), bias-free, then its BatchNorm folded in",
            "batchnorm": "gamma U(0.8,1.2), beta N(0,0.05), running_mean N(0,0.1), running_var U(0.8,1.25), eps 1e-5",
            "classifier": f"U(+-1/sqrt({LAST})) weight and bias (torch.nn.Linear default)",
        },
        "note": "Weights are random, not trained: the logits are meaningless. ONNX Runtime latency does not "
                "depend on weight values, so this stands in for a trained MobileNetV2 in latency measurements.",
        "parameters": g.parameters(),
        "parameters_unfolded": g.parameters() + g.bn_channels,
        "torchvision_parameters": TORCHVISION_PARAMETERS,
        "macs_per_image": int(g.macs),
        "ops": U.op_counts(model),
        "opset": U.OPSET,
        "onnx_bytes": len(model_bytes),
        "onnx_sha256": hashlib.sha256(model_bytes).hexdigest(),
        "builder_sha256": builder_hash(),
    }
    U.write_outputs(files, {"model": model_bytes}, info)
    if not quiet:
        print(f"{files['model']}: built ({info['parameters']:,} parameters, {len(model_bytes) / 1e6:.1f} MB, "
              f"random weights, seed {SEED})")
    return info


def bench(out_dir: Path, runs: int = 30, threads: int = 2) -> dict:
    x = np.random.default_rng(1).standard_normal((1, 3, IMAGE, IMAGE)).astype(np.float32)
    return U.ort_latency(outputs(out_dir)["model"], {"input": x}, runs=runs, threads=threads)


def main(argv: list[str] | None = None) -> int:
    return U.builder_main(__doc__, NAME, DEFAULT_OUT, build, bench, 30, argv)


if __name__ == "__main__":
    sys.exit(main())
