"""Tests of the shipped model builders (run with `.venv/bin/python -m pytest models`).

They build into temporary directories, so they neither need nor touch
models/build.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_digits_mlp as digits  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digits_a")
    digits.build(out, force=True, quiet=True)
    return out


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def numpy_forward(model_path: Path, x: np.ndarray) -> np.ndarray:
    """Independent reference: the graph's own initializers, applied with numpy."""
    model = onnx.load(str(model_path))
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    assert sorted(w) == ["W1", "W2", "b1", "b2"]
    h = np.maximum(x.astype(np.float64) @ w["W1"] + w["b1"], 0.0)
    return h @ w["W2"] + w["b2"]


def test_signature(built: Path) -> None:
    sess = session(built / "digits_mlp.onnx")
    (inp,) = sess.get_inputs()
    (out,) = sess.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("x", "tensor(float)", ["batch", 64])
    assert (out.name, out.type, out.shape) == ("logits", "tensor(float)", ["batch", 10])


def test_ort_matches_numpy(built: Path) -> None:
    path = built / "digits_mlp.onnx"
    rng = np.random.default_rng(7)
    _, _, x_test, _ = digits.load_split()
    cases = [
        x_test[:1],
        x_test[:37],
        rng.uniform(0.0, 16.0, (5, 64)).astype(np.float32),
        np.zeros((2, 64), np.float32),
    ]
    sess = session(path)
    for x in cases:
        (got,) = sess.run(None, {"x": x})
        want = numpy_forward(path, x)
        assert got.shape == want.shape
        assert np.max(np.abs(got - want)) <= 1e-4


def test_accuracy(built: Path) -> None:
    _, _, x_test, y_test = digits.load_split()
    (logits,) = session(built / "digits_mlp.onnx").run(None, {"x": x_test})
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    assert accuracy >= 0.9
    info = json.loads((built / "digits_mlp.json").read_text())
    assert info["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert info["seed"] == digits.SEED


def test_reference_files(built: Path) -> None:
    """The files the Rust integration test reads agree with the model."""
    x = np.fromfile(built / "digits_mlp_input.bin", dtype="<f4").reshape(4, 64)
    expected = np.fromfile(built / "digits_mlp_expected.bin", dtype="<f4").reshape(4, 10)
    (got,) = session(built / "digits_mlp.onnx").run(None, {"x": x})
    assert np.max(np.abs(got - expected)) <= 1e-4


def test_deterministic(built: Path, tmp_path: Path) -> None:
    digits.build(tmp_path, force=True, quiet=True)
    for name in ("digits_mlp.onnx", "digits_mlp.json", "digits_mlp_input.bin", "digits_mlp_expected.bin"):
        assert (tmp_path / name).read_bytes() == (built / name).read_bytes(), name


def test_cache(tmp_path: Path) -> None:
    digits.build(tmp_path, force=True, quiet=True)
    model = tmp_path / "digits_mlp.onnx"
    before = model.stat().st_mtime_ns
    assert digits.up_to_date(tmp_path)
    digits.build(tmp_path, quiet=True)
    assert model.stat().st_mtime_ns == before
    # A stale builder hash forces a rebuild.
    info_path = tmp_path / "digits_mlp.json"
    info = json.loads(info_path.read_text())
    info["builder_sha256"] = "0" * 64
    info_path.write_text(json.dumps(info))
    assert not digits.up_to_date(tmp_path)
