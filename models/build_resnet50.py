#!/usr/bin/env python3
"""Builds models/build/resnet50.onnx: torchvision's ResNet-50 layout with
seeded RANDOM weights and BatchNorm folded into the convolutions.

    input   float32 [batch, 3, 224, 224]
    logits  float32 [batch, 1000]

Layout (torchvision.models.resnet50, "v1.5"): stem conv 7x7/2 (64) + ReLU,
maxpool 3x3/2; four stages of Bottleneck blocks [3, 4, 6, 3] with widths
64/128/256/512 (x4 expansion), stride 2 on the 3x3 conv of the first block of
stages 2-4, a 1x1 (strided) projection shortcut where the shape changes;
global average pool; fc 2048 -> 1000. Every conv is followed by a BatchNorm in
torchvision; here each BN is folded into its conv (onnx_util.fold_bn), so the
graph has Conv (with bias), Relu, Add, MaxPool, GlobalAveragePool, Flatten,
Gemm and no BatchNormalization node.

The weights are random, not trained: conv weights He-normal, BN statistics
drawn from a fixed seed (onnx_util.random_bn) and folded. The last BN of each
residual branch gets gamma in [0.1, 0.3] instead of [0.8, 1.2] (in the spirit
of torchvision's zero_init_residual) so the residual stream does not double in
variance at every block: activations stay O(1) and logits O(1-10), which keeps
float32 ONNX Runtime within 1e-4 of a float64 reference. The logits mean
nothing. ONNX Runtime's latency does not depend on weight values (dense float32
kernels, no sparsity or data-dependent paths), so the model stands in for a
trained ResNet-50 in latency and transport measurements.

Writes resnet50.onnx (~100 MB) and resnet50.json (layout, parameter count,
MACs, seed, hashes). The build is skipped when both exist and the JSON records
the current hash of this script and onnx_util.py (--force rebuilds anyway);
--bench measures ONNX Runtime latency at batch 1.
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

NAME = "resnet50"
SEED = 20240612
LAYERS = (3, 4, 6, 3)
WIDTH = 64  # stem width = first stage's bottleneck width
EXPANSION = 4
CLASSES = 1000
IMAGE = 224
MAIN_GAMMA = (0.8, 1.2)
RESIDUAL_GAMMA = (0.1, 0.3)  # last BN of each bottleneck branch
TORCHVISION_PARAMETERS = 25_557_032  # sum(p.numel() for p in torchvision.models.resnet50().parameters())

DEFAULT_OUT = U.DEFAULT_OUT


def builder_hash() -> str:
    return U.source_hash(__file__)


def make_graph(seed: int = SEED, layers=LAYERS, width: int = WIDTH, classes: int = CLASSES,
               image: int = IMAGE) -> U.Graph:
    """The network with its (seeded, folded) weights. Parameters are drawn in
    graph order from one Generator, so (seed, configuration) fixes every byte."""
    rng = np.random.default_rng(seed)
    g = U.Graph("input", (3, image, image))
    y = g.conv_bn(rng, "input", "conv1", width, 7, stride=2, gamma_range=MAIN_GAMMA)
    y = g.relu(y, "conv1.relu")
    y = g.maxpool(y, "maxpool", 3, 2, 1)
    for i, blocks in enumerate(layers, start=1):
        planes = width * 2 ** (i - 1)
        for j in range(blocks):
            pre = f"layer{i}.{j}"
            stride = 2 if (i > 1 and j == 0) else 1
            c_in = g.shapes[y][0]
            out = g.relu(g.conv_bn(rng, y, f"{pre}.conv1", planes, 1, gamma_range=MAIN_GAMMA), f"{pre}.relu1")
            out = g.relu(g.conv_bn(rng, out, f"{pre}.conv2", planes, 3, stride=stride, gamma_range=MAIN_GAMMA),
                         f"{pre}.relu2")
            out = g.conv_bn(rng, out, f"{pre}.conv3", planes * EXPANSION, 1, gamma_range=RESIDUAL_GAMMA)
            if stride != 1 or c_in != planes * EXPANSION:
                identity = g.conv_bn(rng, y, f"{pre}.downsample", planes * EXPANSION, 1, stride=stride,
                                     gamma_range=MAIN_GAMMA)
            else:
                identity = y
            y = g.relu(g.add(out, identity, f"{pre}.add"), f"{pre}.relu")
    y = g.flatten(g.global_avgpool(y, "avgpool"), "flatten")
    w, b = U.linear_uniform(rng, classes, g.shapes[y][0])
    g.gemm(y, "fc", w, b)
    return g


def make_model(seed: int = SEED, layers=LAYERS, width: int = WIDTH, classes: int = CLASSES, image: int = IMAGE):
    """(ModelProto, Graph). Spatial dims are fixed at `image`; batch is symbolic."""
    g = make_graph(seed, layers, width, classes, image)
    doc = (f"ResNet (torchvision layout, Bottleneck {list(layers)}, width {width}) with BatchNorm folded; "
           f"RANDOM weights (seed {seed}), not trained: for latency/transport measurement only")
    model = g.model(NAME, "fc", "logits", ["batch", 3, image, image], ["batch", classes],
                    "tensorwire models/build_resnet50.py", doc)
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
            "family": "torchvision.models.resnet50 (v1.5: stride on the 3x3 conv)",
            "stem": "conv 7x7/2 64 + ReLU, maxpool 3x3/2 pad 1",
            "block": "Bottleneck 1x1 -> 3x3 -> 1x1 (x4), projection shortcut when the shape changes",
            "layers": list(LAYERS),
            "widths": [WIDTH * 2**i for i in range(len(LAYERS))],
            "head": f"global average pool, fc {g.shapes['flatten'][0]} -> {CLASSES}",
            "batchnorm": "folded into the preceding conv (conv bias = folded BN shift)",
        },
        "weights": "random",
        "trained": False,
        "seed": SEED,
        "init": {
            "conv": "He normal N(0, 2/fan_in), bias-free, then its BatchNorm folded in",
            "batchnorm": "gamma U(0.8,1.2) (last BN of each residual branch: U(0.1,0.3)), beta N(0,0.05), "
                         "running_mean N(0,0.1), running_var U(0.8,1.25), eps 1e-5",
            "fc": "U(+-1/sqrt(2048)) weight and bias (torch.nn.Linear default)",
        },
        "note": "Weights are random, not trained: the logits are meaningless. ONNX Runtime latency does not "
                "depend on weight values, so this stands in for a trained ResNet-50 in latency measurements.",
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
