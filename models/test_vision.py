"""Tests of the vision model builders (run with `.venv/bin/python -m pytest models`).

ResNet-50 and MobileNetV2 (random weights, BN folded) and the trained digits
LeNet are built into temporary directories (models/build is neither needed nor
touched) and checked against the independent numpy forward passes of
vision_reference.py.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_lenet as lenet  # noqa: E402
import build_mobilenetv2 as mnv2  # noqa: E402
import build_resnet50 as rn50  # noqa: E402
import onnx_util  # noqa: E402
import vision_reference as ref  # noqa: E402

TOL = 1e-4
BUILDERS = {"resnet50": rn50, "mobilenetv2": mnv2, "lenet_digits": lenet}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """name -> path of the .onnx, each built once (forced) into a temp dir."""
    out = tmp_path_factory.mktemp("vision")
    for mod in BUILDERS.values():
        mod.build(out, force=True, quiet=True)
    return {name: out / f"{name}.onnx" for name in BUILDERS}


def session(model) -> ort.InferenceSession:
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"])


def params_of(model) -> dict[str, np.ndarray]:
    """The graph's initializers (read back from the file), for the numpy reference."""
    if isinstance(model, Path):
        model = onnx.load(str(model))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def info_of(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


def image(batch: int, size: int = 224, seed: int = 11) -> np.ndarray:
    """A fixed, seeded, roughly ImageNet-normalized input."""
    return np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)


# --------------------------------------------------------------------------- signatures, checker, sidecars

SIGNATURES = {
    "resnet50": (("input", ["batch", 3, 224, 224]), ("logits", ["batch", 1000])),
    "mobilenetv2": (("input", ["batch", 3, 224, 224]), ("logits", ["batch", 1000])),
    "lenet_digits": (("x", ["batch", 1, 8, 8]), ("logits", ["batch", 10])),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_signature(built, name: str) -> None:
    sess = session(built[name])
    (inp,) = sess.get_inputs()
    (out,) = sess.get_outputs()
    (in_name, in_shape), (out_name, out_shape) = SIGNATURES[name]
    assert (inp.name, inp.type, inp.shape) == (in_name, "tensor(float)", in_shape)
    assert (out.name, out.type, out.shape) == (out_name, "tensor(float)", out_shape)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_checker(built, name: str) -> None:
    onnx.checker.check_model(str(built[name]), full_check=True)
    model = onnx.load(str(built[name]))
    assert model.opset_import[0].version == onnx_util.OPSET
    assert "BatchNormalization" not in {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_sidecar(built, name: str) -> None:
    path = built[name]
    info = info_of(path)
    mod = BUILDERS[name]
    data = path.read_bytes()
    assert info["onnx_sha256"] == hashlib.sha256(data).hexdigest()
    assert info["onnx_bytes"] == len(data)
    assert info["builder_sha256"] == mod.builder_hash()
    assert info["seed"] == mod.SEED
    (in_name, in_shape), (out_name, out_shape) = SIGNATURES[name]
    assert info["input"]["name"] == in_name and info["input"]["shape"] == in_shape
    assert info["output"]["name"] == out_name and info["output"]["shape"] == out_shape
    p = params_of(path)
    assert info["parameters"] == sum(v.size for k, v in p.items() if k.endswith((".weight", ".bias")))
    if name == "lenet_digits":
        assert info["weights"] == "trained" and info["trained"] is True
    else:
        assert info["weights"] == "random" and info["trained"] is False
        assert "random" in info["note"] and "latency does not depend on weight values" in info["note"]
        # Folded count + one BN shift per folded channel = torchvision's own count:
        # the layout matches torchvision's to the parameter.
        assert info["parameters_unfolded"] == info["torchvision_parameters"] == mod.TORCHVISION_PARAMETERS


def test_known_sizes(built) -> None:
    """Multiply-accumulates as torchvision publishes them (4.09 G and 0.30 G)."""
    assert info_of(built["resnet50"])["macs_per_image"] == pytest.approx(4.09e9, rel=0.01)
    assert info_of(built["mobilenetv2"])["macs_per_image"] == pytest.approx(0.30e9, rel=0.02)
    ops = info_of(built["resnet50"])["ops"]
    assert ops["Conv"] == 53 and ops["Add"] == 16  # 49 + 4 projection shortcuts; 16 blocks
    ops = info_of(built["mobilenetv2"])["ops"]
    assert ops["Conv"] == 52 and ops["Add"] == 10 and ops["Clip"] == 35


# --------------------------------------------------------------------------- ORT == numpy


def test_resnet50_matches_numpy(built) -> None:
    path = built["resnet50"]
    x = image(1)
    (got,) = session(path).run(None, {"input": x})
    want = ref.resnet50_forward(params_of(path), x)
    assert got.shape == want.shape == (1, 1000)
    assert np.all(np.isfinite(got))
    # The residual-branch BN scaling keeps the logits O(1-10), where float32 meets 1e-4.
    assert 1.0 < np.max(np.abs(want)) < 50.0
    assert np.max(np.abs(got - want)) <= TOL


def test_mobilenetv2_matches_numpy(built) -> None:
    path = built["mobilenetv2"]
    x = image(1)
    (got,) = session(path).run(None, {"input": x})
    want = ref.mobilenetv2_forward(params_of(path), x)
    assert got.shape == want.shape == (1, 1000)
    assert 1.0 < np.max(np.abs(want)) < 50.0
    assert np.max(np.abs(got - want)) <= TOL


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
def test_batch_is_dynamic(built, name: str) -> None:
    """Batch 2 gives, row by row, what batch 1 gives."""
    sess = session(built[name])
    x = image(2, seed=5)
    (both,) = sess.run(None, {"input": x})
    for i in range(2):
        (one,) = sess.run(None, {"input": x[i : i + 1]})
        assert np.max(np.abs(both[i] - one[0])) <= 1e-5


SMALL_RESNET = dict(layers=(2, 1, 2, 1), width=8, classes=10, image=32)
SMALL_MNV2 = dict(settings=((1, 8, 1, 1), (6, 12, 2, 2), (4, 16, 3, 2), (6, 24, 1, 1)), stem=8, last=32,
                  classes=10, image=32)


def test_small_configs_match_numpy_batched() -> None:
    """The same builders at toy sizes, batch 3 (exercises every block kind)."""
    model, _ = rn50.make_model(seed=1, **SMALL_RESNET)
    onnx.checker.check_model(model)
    x = image(3, size=32)
    (got,) = session(model).run(None, {"input": x})
    want = ref.resnet50_forward(params_of(model), x, layers=SMALL_RESNET["layers"])
    assert got.shape == (3, 10) and np.max(np.abs(got - want)) <= TOL

    model, _ = mnv2.make_model(seed=1, **SMALL_MNV2)
    onnx.checker.check_model(model)
    (got,) = session(model).run(None, {"input": x})
    want = ref.mobilenetv2_forward(params_of(model), x, settings=SMALL_MNV2["settings"])
    assert got.shape == (3, 10) and np.max(np.abs(got - want)) <= TOL


def test_lenet_matches_numpy(built) -> None:
    path = built["lenet_digits"]
    p = params_of(path)
    _, _, x_test, _ = lenet.load_images()
    rng = np.random.default_rng(7)
    cases = [
        x_test[:1],
        x_test,
        rng.uniform(0.0, 16.0, (5, 1, 8, 8)).astype(np.float32),
        np.zeros((2, 1, 8, 8), np.float32),
    ]
    sess = session(path)
    for x in cases:
        (got,) = sess.run(None, {"x": x})
        want = ref.lenet_forward(p, x)
        assert got.shape == want.shape == (len(x), 10)
        assert np.max(np.abs(got - want)) <= TOL
    # The builder's own (training) forward pass agrees with the reference too.
    assert np.max(np.abs(lenet.forward({k: v.astype(np.float64) for k, v in p.items()}, x_test)
                         - ref.lenet_forward(p, x_test))) <= 1e-9


@pytest.mark.parametrize(
    "c_in,c_out,k,stride,groups",
    [(3, 5, 7, 2, 1), (4, 6, 3, 1, 2), (6, 6, 3, 2, 6), (5, 7, 1, 2, 1), (8, 8, 3, 1, 8)],
)
def test_reference_conv_matches_ort(c_in, c_out, k, stride, groups) -> None:
    """vision_reference.conv2d itself against a one-node ONNX Conv."""
    rng = np.random.default_rng(c_in * 100 + c_out * 10 + k)
    x = rng.standard_normal((2, c_in, 11, 9)).astype(np.float32)
    w = rng.standard_normal((c_out, c_in // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(c_out).astype(np.float32)
    pad = k // 2
    model = small_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[stride, stride],
                          pads=[pad] * 4, group=groups)],
        {"w": w, "b": b},
    )
    (got,) = session(model).run(None, {"x": x})
    want = ref.conv2d(x, w, b, stride=stride, pad=pad, groups=groups)
    assert got.shape == want.shape and np.max(np.abs(got - want)) <= 1e-4


# --------------------------------------------------------------------------- BatchNorm folding


def small_model(nodes: list, inits: dict[str, np.ndarray]):
    """A graph of `nodes` from "x" to "y" (shapes left to ORT) with float32 initializers."""
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.asarray(v, np.float32), name=k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_util.OPSET)])
    model.ir_version = onnx_util.IR_VERSION
    return model


def test_fold_bn_by_hand() -> None:
    # 1x1 conv, weight 2; BN gamma 3, var + eps = 4 (scale 1.5), mean 0.5, beta 1.
    w, b = onnx_util.fold_bn(np.full((1, 1, 1, 1), 2.0), None, np.array([3.0]), np.array([1.0]), np.array([0.5]),
                             np.array([4.0 - onnx_util.BN_EPS]))
    assert w.dtype == b.dtype == np.float32
    assert w.ravel().tolist() == [3.0] and b.tolist() == [1.0 - 0.5 * 1.5]
    # An existing conv bias is shifted and scaled too: (b - mean) * s + beta.
    _, b = onnx_util.fold_bn(np.ones((1, 1, 1, 1)), np.array([2.0]), np.array([3.0]), np.array([1.0]),
                             np.array([0.5]), np.array([4.0 - onnx_util.BN_EPS]))
    assert b.tolist() == [(2.0 - 0.5) * 1.5 + 1.0]


@pytest.mark.parametrize(
    "c_in,c_out,k,stride,groups,with_bias",
    [(3, 8, 7, 2, 1, False), (8, 16, 3, 1, 1, True), (12, 12, 3, 2, 12, False), (16, 4, 1, 1, 1, True)],
)
def test_bn_folding(c_in, c_out, k, stride, groups, with_bias) -> None:
    """conv + BatchNorm computed unfolded (numpy, and ONNX Conv + BatchNormalization
    in ORT) equals the single folded conv."""
    rng = np.random.default_rng(c_in + 31 * c_out + k)
    x = rng.standard_normal((2, c_in, 13, 13)).astype(np.float32)
    w = onnx_util.he_normal(rng, (c_out, c_in // groups, k, k))
    b = rng.standard_normal(c_out) if with_bias else None
    # Wider statistics than the builders use, so a wrong formula cannot hide.
    bn = {"gamma": rng.uniform(0.2, 3.0, c_out), "beta": rng.normal(0, 1.0, c_out),
          "mean": rng.normal(0, 1.0, c_out), "var": rng.uniform(0.05, 4.0, c_out)}
    pad = k // 2

    unfolded = ref.batchnorm(ref.conv2d(x, w, b, stride=stride, pad=pad, groups=groups), **bn)
    wf, bf = onnx_util.fold_bn(w, b, **bn)
    folded = ref.conv2d(x, wf, bf, stride=stride, pad=pad, groups=groups)
    scale = np.max(np.abs(unfolded))
    assert np.max(np.abs(folded - unfolded)) <= 1e-6 * max(scale, 1.0)

    # ORT: the unfolded pair of ONNX nodes vs the folded Conv node.
    conv_attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)
    conv_in = ["x", "w", "b"] if with_bias else ["x", "w"]
    inits = {"w": w, "gamma": bn["gamma"], "beta": bn["beta"], "mean": bn["mean"], "var": bn["var"]}
    if with_bias:
        inits["b"] = b
    pair = small_model(
        [helper.make_node("Conv", conv_in, ["c"], **conv_attrs),
         helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"],
                          epsilon=onnx_util.BN_EPS)],
        inits,
    )
    single = small_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **conv_attrs)], {"w": wf, "b": bf})
    # ORT would fold the pair itself at the default optimization level: turn that off.
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (y_pair,) = ort.InferenceSession(pair.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    (y_single,) = session(single).run(None, {"x": x})
    assert np.max(np.abs(y_pair - unfolded)) <= 1e-4 * max(scale, 1.0)
    assert np.max(np.abs(y_single - unfolded)) <= 1e-4 * max(scale, 1.0)


# --------------------------------------------------------------------------- LeNet: accuracy, training


def test_lenet_accuracy(built) -> None:
    path = built["lenet_digits"]
    _, _, x_test, y_test = lenet.load_images()
    (logits,) = session(path).run(None, {"x": x_test})
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    assert accuracy >= 0.95
    info = info_of(path)
    assert info["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert info["split"]["test_size"] == len(y_test)


def test_lenet_gradients() -> None:
    """The hand-written backward pass agrees with central finite differences."""
    rng = np.random.default_rng(3)
    p = lenet.init_params(rng)
    for k in p:
        if k.endswith(".bias"):  # nonzero biases keep pre-activations off the ReLU kink
            p[k] = rng.normal(0, 0.1, p[k].shape)
    _, _, x_test, y_test = lenet.load_images()
    x, y = x_test[:6], y_test[:6]
    _, grads = lenet.loss_and_grads(p, x, y)
    eps = 1e-6
    for k in lenet.PARAM_NAMES:
        flat = p[k].reshape(-1)
        for i in rng.choice(flat.size, size=min(6, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + eps
            up, _ = lenet.loss_and_grads(p, x, y)
            flat[i] = old - eps
            down, _ = lenet.loss_and_grads(p, x, y)
            flat[i] = old
            numeric = (up - down) / (2 * eps)
            assert grads[k].reshape(-1)[i] == pytest.approx(numeric, rel=1e-4, abs=1e-7), (k, i)


# --------------------------------------------------------------------------- determinism, cache


def test_lenet_deterministic(built, tmp_path: Path) -> None:
    """Rebuilding (training again) gives the same bytes, whatever BLAS thread
    count the caller had set."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        lenet.build(tmp_path, force=True, quiet=True)
    for suffix in (".onnx", ".json"):
        assert (tmp_path / f"lenet_digits{suffix}").read_bytes() == built["lenet_digits"].with_suffix(
            suffix).read_bytes(), suffix


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
def test_random_models_deterministic(built, name: str, tmp_path: Path) -> None:
    """The full-size build again: same bytes. A different seed: different weights."""
    BUILDERS[name].build(tmp_path, force=True, quiet=True)
    for suffix in (".onnx", ".json"):
        assert (tmp_path / f"{name}{suffix}").read_bytes() == built[name].with_suffix(suffix).read_bytes(), suffix


def test_weight_generation_seeded() -> None:
    a = rn50.make_graph(seed=1, **SMALL_RESNET).inits
    b = rn50.make_graph(seed=1, **SMALL_RESNET).inits
    c = rn50.make_graph(seed=2, **SMALL_RESNET).inits
    assert list(a) == list(b) == list(c)
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert all(a[k].tobytes() != c[k].tobytes() for k in a if a[k].size > 1)


def test_cache(built, tmp_path: Path) -> None:
    # The fixture's builds are current: a plain build() reads the sidecar, writes nothing.
    for name, mod in BUILDERS.items():
        out = built[name].parent
        assert mod.up_to_date(out), name
        before = built[name].stat().st_mtime_ns
        assert mod.build(out, quiet=True) == info_of(built[name])
        assert built[name].stat().st_mtime_ns == before, name
    # A stale builder hash, or a missing output, forces a rebuild.
    mnv2.build(tmp_path, force=True, quiet=True)
    info_path = tmp_path / "mobilenetv2.json"
    info = json.loads(info_path.read_text())
    info["builder_sha256"] = "0" * 64
    info_path.write_text(json.dumps(info))
    assert not mnv2.up_to_date(tmp_path)
    mnv2.build(tmp_path, quiet=True)
    assert mnv2.up_to_date(tmp_path)
    (tmp_path / "mobilenetv2.onnx").unlink()
    assert not mnv2.up_to_date(tmp_path)
