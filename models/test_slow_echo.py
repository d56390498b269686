"""Tests of build_slow_echo.py (run with `.venv/bin/python -m pytest models`):
the echo is exact for any length, the scalar is the numpy chain's, and the
run takes long enough to aim at (it does not fold away at load)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_slow_echo as slow  # noqa: E402


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("slow_echo")
    slow.build(out, force=True, quiet=True)
    return out / "slow_echo.onnx"


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("n", [1, 64, 1 << 20])
def test_echo_and_chain(model_path: Path, n: int) -> None:
    x = (np.arange(n, dtype=np.float32) % 7) + 0.5
    y, z = session(model_path).run(None, {"x": x})
    assert y.shape == (n,) and np.array_equal(y, x)
    w = slow.orthogonal(np.random.default_rng(slow.SEED), slow.D)
    _, want = slow.forward(w, x)
    assert z.shape == (1, 1)
    np.testing.assert_allclose(z, want, rtol=1e-3, atol=1e-7)


def test_the_run_is_slow_whatever_the_input(model_path: Path) -> None:
    sess = session(model_path)
    x = np.ones(4, dtype=np.float32)
    sess.run(None, {"x": x})
    t0 = time.perf_counter()
    sess.run(None, {"x": x * 2})
    # ~140 ms on the project's machine; a folded graph would take microseconds.
    assert time.perf_counter() - t0 > 0.02
