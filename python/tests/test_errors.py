"""Every bad input raises a typed exception before anything is sent, with
the message the CLI prints; the session goes on."""

from __future__ import annotations

import pickle
import subprocess

import numpy as np
import pytest

import tensorwire as tw
from twtest import ROOT, digits_sample, tensorwire_bin


def test_exceptions_are_tensorwire_errors():
    for e in [
        tw.ConnectError,
        tw.UnknownModel,
        tw.InvalidInput,
        tw.LimitExceeded,
        tw.Overloaded,
        tw.PermissionDenied,
        tw.Timeout,
        tw.Disconnected,
        tw.ShuttingDown,
        tw.EngineError,
        tw.ProtocolError,
        tw.ReleasedError,
        tw.ForkedError,
        tw.AgentError,
    ]:
        assert issubclass(e, tw.TensorwireError)
        # Named where users import them, so tracebacks say tensorwire.X
        # and an error raised in a worker process pickles back to the
        # parent (multiprocessing, ProcessPoolExecutor).
        assert e.__module__ == "tensorwire", e
        back = pickle.loads(pickle.dumps(e("the message")))
        assert type(back) is e and str(back) == "the message"
    assert issubclass(tw.ShuttingDown, tw.Disconnected)


@pytest.mark.parametrize(
    "inputs, words",
    [
        ({"x": np.zeros((1, 64))}, ['input "x" is float64, the model takes float32']),
        ({"x": np.zeros((1, 63), np.float32)}, ['input "x" has shape [1, 63]', "(?, 64)"]),
        ({"x": np.zeros((64,), np.float32)}, ['input "x" has shape [64]']),
        ({}, ['missing input "x"']),
        ({"y": np.zeros((1, 64), np.float32)}, ['missing input "x"']),
        ({"x": np.zeros((1, 64), np.float32), "z": 1}, ['unknown input "z"']),
        ([np.zeros((1, 64), np.float32)] * 2, ["2 inputs given, it takes 1"]),
        ({"x": np.zeros((1, 64), np.complex64)}, ['input "x" is', "does not carry"]),
        ({"x": np.array(["a"])}, ['input "x" is', "does not carry"]),
    ],
)
def test_bad_inputs_raise_invalid_input_naming_it(uri, inputs, words):
    c = tw.connect(uri)
    m = c.model("digits")
    requests = c.copy_stats()["requests"]
    with pytest.raises(tw.InvalidInput) as e:
        m.infer(inputs)
    for w in words:
        assert w in str(e.value)
    assert "digits" in str(e.value)
    assert c.copy_stats()["requests"] == requests  # nothing was sent
    x, y = digits_sample()
    np.testing.assert_allclose(m.infer({"x": x})["logits"], y, rtol=1e-5, atol=1e-5)


def test_unknown_model_says_what_the_cli_says(served, tmp_path):
    uri = served.uris["unix"]
    with pytest.raises(tw.UnknownModel) as e:
        tw.connect(uri).model("nosuch")
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    cli = subprocess.run(
        [str(tensorwire_bin()), "infer", "--connect", uri, "--model", "nosuch", "--input", f"x={tmp_path / 'x.npy'}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert cli.returncode != 0
    assert str(e.value) in cli.stderr, (str(e.value), cli.stderr)


def test_connecting_to_nothing_raises_connect_error(tmp_path):
    for uri in [f"unix://{tmp_path}/none.sock", "shm://no-such-agent-here", "tcp://127.0.0.1:1", "inproc://nobody"]:
        with pytest.raises(tw.ConnectError):
            tw.connect(uri, connect_timeout=2.0)
    with pytest.raises(tw.ConnectError):
        tw.connect("bogus://x")


def test_bad_arguments_raise_clear_errors(served):
    with pytest.raises(ValueError, match="timeout"):
        tw.connect(served.uris["unix"], timeout=-1)
    c = tw.connect(served.uris["shm"])
    with pytest.raises(tw.InvalidInput):
        c.empty((2, 2), np.complex128)
    with pytest.raises(tw.InvalidInput):
        c.empty((-1, 2))
    with pytest.raises(tw.LimitExceeded):
        c.empty((1 << 40,), np.uint8)  # larger than the arena and the limits
    with pytest.raises(ValueError):
        c.model("identity").infer({}, timeout=float("nan"))


def test_agent_errors_are_agent_error(tmp_path):
    with pytest.raises(tw.AgentError, match="nothing to listen on"):
        tw.Agent()
    with pytest.raises(tw.AgentError):
        tw.Agent(models={"m": str(tmp_path / "missing.onnx")}, listen=["inproc://bad-model"])
    with pytest.raises(tw.AgentError):
        tw.Agent(listen=["carrier-pigeon://x"])


def test_inputs_must_be_a_mapping_or_a_list_of_arrays(uri):
    from types import MappingProxyType

    c = tw.connect(uri)
    m = c.model("digits")
    x, y = digits_sample()
    # Any mapping works like a dict.
    np.testing.assert_allclose(m.infer(MappingProxyType({"x": x}))["logits"], y, rtol=1e-5, atol=1e-5)
    # An array, a string or bytes as the container is refused, not iterated.
    for bad in [x, "x", b"x", 3]:
        with pytest.raises(tw.InvalidInput, match="dict of name -> array"):
            c.model("identity").infer(bad)


def test_too_many_dims_are_refused_before_sending(uri):
    c = tw.connect(uri)
    requests = c.copy_stats()["requests"]
    with pytest.raises(tw.InvalidInput, match="9 dims, at most 8"):
        c.model("identity").infer({"t": np.zeros((1,) * 9, np.float32)})
    assert c.copy_stats()["requests"] == requests


def test_timeouts_out_of_range(served):
    for t in [0, -1, float("inf"), float("nan")]:
        with pytest.raises(ValueError, match="timeout"):
            tw.connect(served.uris["unix"], timeout=t)
    # A huge timeout is a long one, not an overflow.
    for transport in ["shm", "unix", "tcp"]:
        c = tw.connect(served.uris[transport], timeout=1e19)
        m = c.model("identity")
        assert list(m.infer({"a": np.ones(2)}, timeout=1e19)) == ["a"]
        assert list(m.submit({"a": np.ones(2)}).result(timeout=1e300)) == ["a"]


def test_empty_shapes_are_checked(served):
    c = tw.connect(served.uris["shm"])
    for bad in [(0, 2**63 + 1), (2**64,), (1.5, 2), "ab", None]:
        with pytest.raises(tw.InvalidInput):
            c.empty(bad, np.uint8)
    assert c.empty(np.int64(4), np.uint8).shape == (4,)
