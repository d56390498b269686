"""Small helpers shared by the vision model builders (build_resnet50.py,
build_mobilenetv2.py, build_lenet.py).

What is here:

  * builder_hash / up_to_date / write_outputs: the build cache, in the style of
    build_digits_mlp.py (the JSON sidecar, written last, records the builder's
    hash; outputs are written atomically);
  * fold_bn / random_bn: BatchNorm folding into the preceding convolution, and
    seeded BatchNorm statistics for the random-weight models;
  * Graph: a tiny ONNX graph writer (Conv, Relu, Clip, Add, pools, Gemm) that
    keeps track of per-sample shapes, parameter count and multiply-accumulates;
  * ort_latency: the latency measurement used by the builders' --bench flag.

No function here draws random numbers on its own: callers pass their
numpy Generator, so the order of draws (hence the weights) is fixed by the
builder.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from pathlib import Path

import numpy as np

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17
BN_EPS = 1e-5  # torch.nn.BatchNorm2d's default

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "build"


# --------------------------------------------------------------------------- cache


def builder_hash(*paths: Path) -> str:
    """SHA-256 over the named source files (the builder and this module).

    A change to any of them invalidates the cached build.
    """
    h = hashlib.sha256()
    for p in sorted({Path(p).resolve() for p in paths}, key=lambda p: p.name):
        h.update(p.name.encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def source_hash(builder_file: str) -> str:
    """The cache key of a builder: its own source plus this module's."""
    return builder_hash(Path(builder_file), Path(__file__))


def up_to_date(files: dict[str, Path], key: str) -> bool:
    """Every output exists and the sidecar (role "info") records `key`."""
    if not all(p.is_file() for p in files.values()):
        return False
    try:
        info = json.loads(files["info"].read_text())
    except (OSError, ValueError):
        return False
    return info.get("builder_sha256") == key


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def json_bytes(info: dict) -> bytes:
    return (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()


def write_outputs(files: dict[str, Path], blobs: dict[str, bytes], info: dict) -> None:
    """Writes every blob, then the sidecar last: it is what marks the build complete."""
    files["info"].parent.mkdir(parents=True, exist_ok=True)
    for role, data in blobs.items():
        write_atomic(files[role], data)
    write_atomic(files["info"], json_bytes(info))


# --------------------------------------------------------------------------- BatchNorm


def fold_bn(
    weight: np.ndarray,
    bias: np.ndarray | None,
    gamma: np.ndarray,
    beta: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    eps: float = BN_EPS,
) -> tuple[np.ndarray, np.ndarray]:
    """Folds an inference-mode BatchNorm into the convolution before it.

    BN(conv(x)) = gamma * (W*x + b - mean) / sqrt(var + eps) + beta
                = (W * s) * x + (b - mean) * s + beta,   s = gamma / sqrt(var + eps)

    with s applied per output channel (axis 0 of `weight`, whatever the group
    count). Arithmetic in float64; returns float32 (weight, bias).
    """
    w = np.asarray(weight, dtype=np.float64)
    c_out = w.shape[0]
    for name, v in (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var)):
        if np.shape(v) != (c_out,):
            raise ValueError(f"BN {name} has shape {np.shape(v)}, want ({c_out},)")
    b = np.zeros(c_out) if bias is None else np.asarray(bias, dtype=np.float64)
    scale = np.asarray(gamma, np.float64) / np.sqrt(np.asarray(var, np.float64) + eps)
    w_folded = w * scale.reshape((c_out,) + (1,) * (w.ndim - 1))
    b_folded = (b - np.asarray(mean, np.float64)) * scale + np.asarray(beta, np.float64)
    return w_folded.astype(np.float32), b_folded.astype(np.float32)


def random_bn(rng: np.random.Generator, channels: int, gamma_range: tuple[float, float] = (0.8, 1.2)) -> dict:
    """Seeded BatchNorm statistics of the kind a trained network carries.

    gamma ~ U(gamma_range), beta ~ N(0, 0.05), running_mean ~ N(0, 0.1),
    running_var ~ U(0.8, 1.25). Drawn in that order.
    """
    gamma = rng.uniform(gamma_range[0], gamma_range[1], channels)
    beta = rng.normal(0.0, 0.05, channels)
    mean = rng.normal(0.0, 0.1, channels)
    var = rng.uniform(0.8, 1.25, channels)
    return {"gamma": gamma, "beta": beta, "mean": mean, "var": var}


def he_normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """N(0, 2/fan_in) conv weights (fan_in = in_channels/groups * kh * kw): keeps
    the second moment of ReLU activations roughly constant from layer to layer."""
    fan_in = int(np.prod(shape[1:]))
    return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)


def linear_uniform(rng: np.random.Generator, out_features: int, in_features: int) -> tuple[np.ndarray, np.ndarray]:
    """torch.nn.Linear's default initialization: weight and bias ~ U(+-1/sqrt(in))."""
    bound = 1.0 / np.sqrt(in_features)
    w = rng.uniform(-bound, bound, (out_features, in_features))
    b = rng.uniform(-bound, bound, out_features)
    return w, b


# --------------------------------------------------------------------------- graph writer


def _out_size(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


class Graph:
    """Accumulates ONNX nodes and float32 initializers for an NCHW network.

    Tensor names double as node names. `shapes` maps each tensor to its
    per-sample shape (batch left out), which the writer uses to count
    multiply-accumulates (`macs`) and to check wiring as it goes.
    """

    def __init__(self, input_name: str, input_shape: tuple[int, ...]):
        self.input_name = input_name
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {input_name: tuple(input_shape)}
        self.macs = 0
        self.bn_channels = 0  # BatchNorm channels folded away (for the unfolded parameter count)

    # ----- primitives
    def const(self, name: str, array: np.ndarray) -> str:
        if name in self.inits:
            raise ValueError(f"duplicate initializer {name}")
        self.inits[name] = np.ascontiguousarray(array, dtype=np.float32)
        return name

    def node(self, op: str, inputs: list[str], out: str, shape: tuple[int, ...], **attrs) -> str:
        from onnx import helper

        if out in self.shapes:
            raise ValueError(f"duplicate tensor {out}")
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        self.shapes[out] = tuple(shape)
        return out

    # ----- layers
    def conv(self, x: str, name: str, w: np.ndarray, b: np.ndarray, stride: int = 1, group: int = 1) -> str:
        """Conv with 'same'-style padding k//2 (as every conv in these models)."""
        c_in, h, wd = self.shapes[x]
        c_out, cg, kh, kw = w.shape
        if cg * group != c_in or c_out % group:
            raise ValueError(f"{name}: weight {w.shape} with group {group} does not fit input {c_in} channels")
        pad = kh // 2
        oh, ow = _out_size(h, kh, stride, pad), _out_size(wd, kw, stride, pad)
        wn = self.const(f"{name}.weight", w)
        bn = self.const(f"{name}.bias", b)
        self.macs += c_out * oh * ow * cg * kh * kw
        return self.node(
            "Conv",
            [x, wn, bn],
            name,
            (c_out, oh, ow),
            kernel_shape=[kh, kw],
            strides=[stride, stride],
            pads=[pad, pad, pad, pad],
            dilations=[1, 1],
            group=group,
        )

    def conv_bn(self, rng, x: str, name: str, c_out: int, k: int, stride: int = 1, group: int = 1,
                gamma_range=(0.8, 1.2)) -> str:
        """A bias-free conv followed by BatchNorm (as torchvision), folded.

        Draws, in order: the conv weight (He normal), then the BN statistics.
        """
        c_in = self.shapes[x][0]
        w = he_normal(rng, (c_out, c_in // group, k, k))
        bn = random_bn(rng, c_out, gamma_range)
        wf, bf = fold_bn(w, None, **bn)
        self.bn_channels += c_out
        return self.conv(x, name, wf, bf, stride=stride, group=group)

    def relu(self, x: str, out: str) -> str:
        return self.node("Relu", [x], out, self.shapes[x])

    def relu6(self, x: str, out: str) -> str:
        """ReLU6 as Clip(x, 0, 6) (opset >= 11 takes the bounds as inputs)."""
        if "relu6.min" not in self.inits:
            self.const("relu6.min", np.array(0.0, np.float32))
            self.const("relu6.max", np.array(6.0, np.float32))
        return self.node("Clip", [x, "relu6.min", "relu6.max"], out, self.shapes[x])

    def add(self, a: str, b: str, out: str) -> str:
        if self.shapes[a] != self.shapes[b]:
            raise ValueError(f"{out}: adding {self.shapes[a]} and {self.shapes[b]}")
        return self.node("Add", [a, b], out, self.shapes[a])

    def mul_const(self, x: str, name: str, value: float) -> str:
        c = self.const(f"{name}.scale", np.array(value, np.float32))
        return self.node("Mul", [x, c], name, self.shapes[x])

    def maxpool(self, x: str, out: str, k: int, stride: int, pad: int) -> str:
        c, h, w = self.shapes[x]
        shape = (c, _out_size(h, k, stride, pad), _out_size(w, k, stride, pad))
        return self.node(
            "MaxPool", [x], out, shape, kernel_shape=[k, k], strides=[stride, stride], pads=[pad, pad, pad, pad]
        )

    def global_avgpool(self, x: str, out: str) -> str:
        return self.node("GlobalAveragePool", [x], out, (self.shapes[x][0], 1, 1))

    def flatten(self, x: str, out: str) -> str:
        return self.node("Flatten", [x], out, (int(np.prod(self.shapes[x])),), axis=1)

    def gemm(self, x: str, name: str, w: np.ndarray, b: np.ndarray) -> str:
        """y = x @ w.T + b with w [out, in], as torch.nn.Linear stores it."""
        (n_in,) = self.shapes[x]
        if w.shape[1] != n_in:
            raise ValueError(f"{name}: weight {w.shape} does not fit input {n_in}")
        wn = self.const(f"{name}.weight", w)
        bn = self.const(f"{name}.bias", b)
        self.macs += w.shape[0] * w.shape[1]
        return self.node("Gemm", [x, wn, bn], name, (w.shape[0],), transB=1)

    # ----- result
    def parameters(self) -> int:
        """Elements of every initializer except the Clip/Mul scalar constants."""
        return int(sum(a.size for k, a in self.inits.items() if k.endswith((".weight", ".bias"))))

    def model(self, graph_name: str, output: str, output_name: str, input_dims: list, output_dims: list,
              producer: str, doc: str):
        """The ONNX ModelProto; the last tensor is renamed to `output_name`."""
        from onnx import TensorProto, helper, numpy_helper

        # Rename the last node's output to the public name.
        last = self.nodes[-1]
        if last.output[0] != output:
            raise ValueError("the output must be the last node's")
        last.output[0] = output_name
        graph = helper.make_graph(
            self.nodes,
            graph_name,
            [helper.make_tensor_value_info(self.input_name, TensorProto.FLOAT, input_dims)],
            [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, output_dims)],
            initializer=[numpy_helper.from_array(a, name=k) for k, a in self.inits.items()],
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=producer,
            producer_version="1",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        return model


def op_counts(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in model.graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return dict(sorted(counts.items()))


# --------------------------------------------------------------------------- latency


def ort_latency(path: Path, feeds: dict[str, np.ndarray], runs: int, threads: int = 2, warmup: int = 10) -> dict:
    """ONNX Runtime latency of one `run` (default graph optimizations,
    `threads` intra-op threads, sequential execution): median and spread in ms."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        sess.run(None, feeds)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    times.sort()
    return {
        "runs": runs,
        "threads": threads,
        "median_ms": statistics.median(times),
        "p10_ms": times[len(times) // 10],
        "p90_ms": times[(len(times) * 9) // 10],
        "min_ms": times[0],
    }


def builder_main(doc: str, name: str, default_out: Path, build, bench, default_runs: int,
                 argv: list[str] | None = None) -> int:
    """The command line every model builder shares: build (cached unless
    --force) into --out-dir, then optionally time ONNX Runtime at batch 1."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=default_out, help="where to write (default: models/build)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cached build is current")
    ap.add_argument("--bench", type=int, metavar="RUNS", nargs="?", const=default_runs,
                    help=f"then time ONNX Runtime at batch 1, 2 threads (median of RUNS, default {default_runs})")
    args = ap.parse_args(argv)
    build(args.out_dir, force=args.force)
    if args.bench:
        r = bench(args.out_dir, args.bench)
        # Sub-millisecond models read better in microseconds.
        scale, unit = (1000, "us") if r["median_ms"] < 1 else (1, "ms")
        print(f"{name}: ORT batch 1, {r['threads']} threads: median {r['median_ms'] * scale:.2f} {unit} "
              f"(p10 {r['p10_ms'] * scale:.2f}, p90 {r['p90_ms'] * scale:.2f}, {r['runs']} runs)")
    return 0
