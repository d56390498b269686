"""The agent's KServe v2 HTTP/REST front door (`tensorwire serve --listen
http://HOST:PORT`) driven by the stock, unmodified `tritonclient.http`:
health, metadata, digits against the reference logits with and without
binary tensor data, identity with several dtypes, and errors as
InferenceServerException. Needs tritonclient[http] (skipped without it)."""

from __future__ import annotations


import numpy as np
import pytest

from twtest import BUILD, FrontDoorAgent

httpclient = pytest.importorskip(
    "tritonclient.http",
    reason="tritonclient[http] is not installed (pip install 'tritonclient[http]')",
)
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def http_agent():
    a = FrontDoorAgent("http", {"digits": BUILD / "digits_mlp.onnx"})
    yield a
    a.stop()
    assert a.proc.returncode == 0, a.proc.stderr.read()


@pytest.fixture()
def client(http_agent):
    c = httpclient.InferenceServerClient(http_agent.address)
    yield c
    c.close()


def digits_arrays():
    x = np.fromfile(BUILD / "digits_mlp_input.bin", dtype="<f4").reshape(4, 64)
    want = np.fromfile(BUILD / "digits_mlp_expected.bin", dtype="<f4").reshape(4, 10)
    return x, want


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "tensorwire"


def test_model_metadata_and_ready(client):
    assert client.is_model_ready("digits")
    assert client.is_model_ready("digits", "1")
    assert not client.is_model_ready("nope")
    assert not client.is_model_ready("digits", "2")
    meta = client.get_model_metadata("digits")
    assert meta["name"] == "digits"
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]


@pytest.mark.parametrize("binary", [True, False])
def test_digits(client, binary):
    x, want = digits_arrays()
    i = httpclient.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    o = httpclient.InferRequestedOutput("logits", binary_data=binary)
    r = client.infer("digits", [i], outputs=[o])
    got = r.as_numpy("logits")
    assert got.shape == (4, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # No outputs named: all of them come back.
    r = client.infer("digits", [i], model_version="1")
    np.testing.assert_allclose(r.as_numpy("logits"), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "datatype,dtype",
    [
        ("BOOL", np.bool_),
        ("INT8", np.int8),
        ("INT32", np.int32),
        ("INT64", np.int64),
        ("UINT16", np.uint16),
        ("FP16", np.float16),
        ("FP32", np.float32),
        ("FP64", np.float64),
    ],
)
@pytest.mark.parametrize("binary", [True, False])
def test_identity_dtypes(client, datatype, dtype, binary):
    if datatype == "FP16" and not binary:
        pytest.skip("FP16 travels as binary data only")
    rng = np.random.default_rng(7)
    if dtype is np.bool_:
        a = rng.integers(0, 2, size=(3, 5)).astype(np.bool_)
    elif np.issubdtype(dtype, np.integer):
        a = rng.integers(0, 100, size=(3, 5)).astype(dtype)
    else:
        a = rng.standard_normal((3, 5)).astype(dtype)
    i = httpclient.InferInput("t", list(a.shape), datatype)
    i.set_data_from_numpy(a, binary_data=binary)
    o = httpclient.InferRequestedOutput("t", binary_data=binary)
    r = client.infer("identity", [i], outputs=[o])
    got = r.as_numpy("t")
    assert got.dtype == a.dtype
    np.testing.assert_array_equal(got, a)


def test_errors(client):
    x, _ = digits_arrays()
    i = httpclient.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nope", [i])
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("nope")
    bad = httpclient.InferInput("x", [4, 63], "FP32")
    bad.set_data_from_numpy(x[:, :63].copy())
    with pytest.raises(InferenceServerException):
        client.infer("digits", [bad])
    # Still serving after the refusals.
    assert client.is_server_ready()
    r = client.infer("digits", [i])
    assert r.as_numpy("logits").shape == (4, 10)
