"""The model repository (`tensorwire serve --model-repository DIR`) driven
by the stock `tritonclient.http` and `tritonclient.grpc`: Triton's layout
and config.pbtxt, the repository index, load / reload / unload in
explicit mode (one agent, both doors), the model configuration call, the
poll mode noticing new and removed models, and every refusal with a clear
error while the other models keep serving."""

from __future__ import annotations

import shutil
import subprocess
import time

import numpy as np
import pytest

from twtest import BUILD, FrontDoorAgent, digits_sample, tensorwire_bin

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
from tritonclient.utils import InferenceServerException  # noqa: E402

DIGITS_CONFIG = """
name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "logits", data_type: TYPE_FP32, dims: [ 10 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]
"""


def make_repository(root, mixed_model):
    (root / "digits" / "1").mkdir(parents=True)
    shutil.copy(BUILD / "digits_mlp.onnx", root / "digits" / "1" / "model.onnx")
    (root / "digits" / "config.pbtxt").write_text(DIGITS_CONFIG)
    (root / "mixed" / "2").mkdir(parents=True)
    shutil.copy(mixed_model, root / "mixed" / "2" / "model.onnx")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    (root / "badconfig" / "1").mkdir(parents=True)
    shutil.copy(BUILD / "digits_mlp.onnx", root / "badconfig" / "1" / "model.onnx")
    (root / "badconfig" / "config.pbtxt").write_text("optimization { priority: PRIORITY_MAX }")
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory, mixed_model):
    return make_repository(tmp_path_factory.mktemp("repository"), mixed_model)


@pytest.fixture(scope="module")
def agent(repo):
    a = FrontDoorAgent(
        ["http", "grpc"],
        {},
        ["--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "digits"],
    )
    yield a
    a.stop()


@pytest.fixture()
def http(agent):
    c = httpclient.InferenceServerClient(agent.addresses["http"])
    yield c
    c.close()


@pytest.fixture()
def grpc(agent):
    c = grpcclient.InferenceServerClient(agent.addresses["grpc"])
    yield c
    c.close()


def infer_digits(client, module):
    x, expected = digits_sample()
    i = module.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    r = client.infer("digits", [i])
    np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)


def states(http):
    return {m["name"]: (m.get("state", ""), m.get("version", ""), m.get("reason", "")) for m in http.get_model_repository_index()}


def test_index_and_explicit_start(http, grpc):
    s = states(http)
    assert s["digits"][:2] == ("READY", "1")
    assert s["mixed"] == ("", "", "") and s["broken"] == ("", "", "")
    idx = grpc.get_model_repository_index()
    assert {m.name: m.state for m in idx.models}["digits"] == "READY"
    assert "digits" in [m["name"] for m in grpc.get_model_repository_index(as_json=True)["models"]]
    assert http.is_server_ready() and grpc.is_server_ready()
    assert not http.is_model_ready("mixed")
    md = http.get_server_metadata()
    assert "model_repository" in md["extensions"] and "model_configuration" in md["extensions"]
    infer_digits(http, httpclient)
    infer_digits(grpc, grpcclient)


def test_model_config_from_config_pbtxt(http, grpc):
    c = http.get_model_config("digits")
    assert c["max_batch_size"] == 8
    assert c["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [64], "optional": False}]
    assert c["instance_group"][0]["count"] == 2 and c["instance_group"][0]["kind"] == "KIND_CPU"
    g = grpc.get_model_config("digits").config
    assert g.max_batch_size == 8 and g.platform == "onnxruntime_onnx"
    assert [(o.name, list(o.dims)) for o in g.output] == [("logits", [10])]
    # A model that came with no config gets one derived from its signature.
    ident = grpc.get_model_config("identity").config
    assert ident.name == "identity" and ident.max_batch_size == 0


def test_load_unload_across_doors(http, grpc):
    grpc.load_model("mixed")
    assert http.is_model_ready("mixed")
    assert http.get_model_metadata("mixed")["versions"] == ["2"]
    c = np.arange(6, dtype=np.int64).reshape(2, 3)
    i = httpclient.InferInput("c", [2, 3], "INT64")
    i.set_data_from_numpy(c)
    a = httpclient.InferInput("a", [1, 3], "FP16")
    a.set_data_from_numpy(np.ones((1, 3), np.float16))
    b = httpclient.InferInput("b", [2], "BOOL")
    b.set_data_from_numpy(np.array([True, False]))
    r = http.infer("mixed", [a, b, i], model_version="2")
    np.testing.assert_array_equal(r.as_numpy("c1"), c + 1)
    http.unload_model("mixed")
    assert not grpc.is_model_ready("mixed")
    assert states(http)["mixed"][0] == "UNAVAILABLE"
    assert "unloaded" in states(http)["mixed"][2]
    with pytest.raises(InferenceServerException, match="unknown model 'mixed'"):
        http.infer("mixed", [a, b, i])
    infer_digits(grpc, grpcclient)


def test_reload_picks_up_a_changed_config(http, grpc, repo):
    (repo / "digits" / "config.pbtxt").write_text(DIGITS_CONFIG.replace("count: 2", "count: 1"))
    try:
        http.load_model("digits")
        assert grpc.get_model_config("digits").config.instance_group[0].count == 1
        infer_digits(http, httpclient)
    finally:
        (repo / "digits" / "config.pbtxt").write_text(DIGITS_CONFIG)
        http.load_model("digits")
    assert grpc.get_model_config("digits").config.instance_group[0].count == 2


@pytest.mark.parametrize(
    "name, message",
    [
        ("broken", "failed to load model 'broken'"),
        ("badconfig", "optimization"),
        ("nothere", "not in the model repository"),
        ("identity", "built-in model"),
    ],
)
def test_bad_loads_are_refused_and_others_keep_serving(http, grpc, name, message):
    with pytest.raises(InferenceServerException, match=message):
        http.load_model(name)
    with pytest.raises(InferenceServerException, match=message):
        grpc.load_model(name)
    assert http.is_server_ready(), "a failed explicit load leaves the server ready"
    infer_digits(http, httpclient)
    if name in ("broken", "badconfig"):
        assert states(http)[name][0] == "UNAVAILABLE"


def test_load_parameters_and_unknown_unloads_are_refused(http, grpc):
    with pytest.raises(InferenceServerException, match="parameter 'config' is not supported"):
        http.load_model("mixed", config='{"max_batch_size": 4}')
    with pytest.raises(InferenceServerException, match="parameter 'config' is not supported"):
        grpc.load_model("mixed", config='{"max_batch_size": 4}')
    with pytest.raises(InferenceServerException, match="not in the model repository"):
        grpc.unload_model("nothere")
    with pytest.raises(InferenceServerException, match="built-in model"):
        http.unload_model("identity")


def test_poll_mode_notices_new_and_removed_models(tmp_path, mixed_model):
    root = tmp_path / "repo"
    (root / "digits" / "1").mkdir(parents=True)
    shutil.copy(BUILD / "digits_mlp.onnx", root / "digits" / "1" / "model.onnx")
    a = FrontDoorAgent(
        "http",
        {},
        ["--model-repository", str(root), "--model-control-mode", "poll", "--repository-poll-secs", "1"],
    )
    try:
        c = httpclient.InferenceServerClient(a.address)
        assert c.is_model_ready("digits")
        with pytest.raises(InferenceServerException, match="model control mode is 'poll'"):
            c.load_model("digits")
        (root / "mixed" / "1").mkdir(parents=True)
        shutil.copy(mixed_model, root / "mixed" / "1" / "model.onnx")
        shutil.rmtree(root / "digits")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if c.is_model_ready("mixed") and not c.is_model_ready("digits"):
                break
            time.sleep(0.2)
        assert c.is_model_ready("mixed")
        assert not c.is_model_ready("digits")
        assert states(c)["digits"][0] == "UNAVAILABLE"
        c.close()
    finally:
        a.stop()


def test_a_model_that_cannot_load_stops_the_start(repo):
    p = subprocess.run(
        [str(tensorwire_bin()), "serve", "--listen", "http://127.0.0.1:0", "--model-repository", str(repo)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    assert "failed to load model 'badconfig'" in p.stderr or "failed to load model 'broken'" in p.stderr
    p = subprocess.run(
        [str(tensorwire_bin()), "serve", "--listen", "http://127.0.0.1:0", "--load-model", "digits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0 and "need --model-repository" in p.stderr
