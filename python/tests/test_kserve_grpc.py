"""The agent's KServe v2 gRPC front door (`tensorwire serve --listen
grpc://HOST:PORT`) driven by the stock, unmodified `tritonclient.grpc`:
health, metadata, digits against the reference logits, identity with
several dtypes, a model with mixed dtypes, and errors as
InferenceServerException. Needs tritonclient[grpc] (skipped without it)."""

from __future__ import annotations


import numpy as np
import pytest

from twtest import BUILD, FrontDoorAgent, digits_sample

grpcclient = pytest.importorskip(
    "tritonclient.grpc",
    reason="tritonclient[grpc] is not installed (pip install 'tritonclient[grpc]')",
)
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def grpc_agent(mixed_model):
    a = FrontDoorAgent("grpc", {"digits": BUILD / "digits_mlp.onnx", "mixed": mixed_model})
    yield a
    a.stop()


@pytest.fixture()
def client(grpc_agent):
    c = grpcclient.InferenceServerClient(grpc_agent.address)
    yield c
    c.close()


def make_input(name, array, datatype):
    i = grpcclient.InferInput(name, list(array.shape), datatype)
    i.set_data_from_numpy(array)
    return i


def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("digits")
    assert not client.is_model_ready("no-such-model")
    meta = client.get_server_metadata()
    assert meta.name == "tensorwire"


def test_model_metadata(client):
    md = client.get_model_metadata("digits")
    assert md.name == "digits"
    assert list(md.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [("x", "FP32", [-1, 64])]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] == [
        ("logits", "FP32", [-1, 10])
    ]
    md = client.get_model_metadata("identity", model_version="1")
    assert len(md.inputs) == 0 and len(md.outputs) == 0
    as_json = client.get_model_metadata("digits", as_json=True)
    assert as_json["inputs"][0]["name"] == "x"


def test_digits_matches_reference(client):
    x, expected = digits_sample()
    assert x.shape == (4, 64)
    r = client.infer("digits", [make_input("x", x, "FP32")], request_id="r1")
    np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    assert r.get_response().id == "r1"
    # A requested output, and the explicit version.
    r = client.infer(
        "digits",
        [make_input("x", x, "FP32")],
        model_version="1",
        outputs=[grpcclient.InferRequestedOutput("logits")],
    )
    np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "dtype,datatype",
    [
        (np.bool_, "BOOL"),
        (np.int8, "INT8"),
        (np.int16, "INT16"),
        (np.int32, "INT32"),
        (np.int64, "INT64"),
        (np.uint8, "UINT8"),
        (np.uint16, "UINT16"),
        (np.uint32, "UINT32"),
        (np.uint64, "UINT64"),
        (np.float16, "FP16"),
        (np.float32, "FP32"),
        (np.float64, "FP64"),
    ],
)
def test_identity_round_trips(client, dtype, datatype):
    a = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    b = np.array([5, 6], dtype=dtype)
    r = client.infer("identity", [make_input("a", a, datatype), make_input("b", b, datatype)])
    for name, want in (("a", a), ("b", b)):
        got = r.as_numpy(name)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_mixed_dtypes_model(client):
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float16)
    b = np.array([True, False, True])
    c = np.array([[1, 2], [3, 4]], dtype=np.int64)
    r = client.infer(
        "mixed",
        [make_input("a", a, "FP16"), make_input("b", b, "BOOL"), make_input("c", c, "INT64")],
    )
    np.testing.assert_array_equal(r.as_numpy("a2"), a * 2)
    np.testing.assert_array_equal(r.as_numpy("nb"), ~b)
    np.testing.assert_array_equal(r.as_numpy("c1"), c + 1)
    assert r.as_numpy("s") == c.sum()


def test_errors_raise_and_the_agent_keeps_serving(client):
    x, expected = digits_sample()
    with pytest.raises(InferenceServerException, match="no-such-model") as e:
        client.infer("no-such-model", [make_input("x", x, "FP32")])
    assert "NOT_FOUND" in str(e.value.status())
    with pytest.raises(InferenceServerException, match="'x'") as e:
        client.infer("digits", [make_input("x", x.astype(np.float64), "FP64")])
    assert "INVALID_ARGUMENT" in str(e.value.status())
    with pytest.raises(InferenceServerException, match="'y'"):
        client.infer("digits", [make_input("y", x, "FP32")])
    with pytest.raises(InferenceServerException, match="BYTES"):
        client.infer("identity", [make_input("s", np.array([b"ab"], dtype=np.object_), "BYTES")])
    with pytest.raises(InferenceServerException, match="version"):
        client.infer("digits", [make_input("x", x, "FP32")], model_version="2")
    r = client.infer("digits", [make_input("x", x, "FP32")])
    np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
