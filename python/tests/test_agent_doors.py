"""The embedded agent's KServe v2 front doors: `tw.Agent(listen=[...])`
with `grpc://` and `http://` URIs (or a config file listing them) starts
the doors beside its own endpoints, `endpoints` names them with their real
ports, stock `tritonclient.grpc` / `tritonclient.http` get identity and
digits answers from them, `stop()` closes them, and a bad or unbindable
front-door URI raises AgentError naming it and leaves nothing running.
Needs tritonclient[grpc,http] (skipped without it)."""

from __future__ import annotations

import socket
import uuid

import numpy as np
import pytest

import tensorwire as tw
from twtest import BUILD, digits_sample

grpcclient = pytest.importorskip(
    "tritonclient.grpc",
    reason="tritonclient[grpc] is not installed (pip install 'tritonclient[grpc]')",
)
httpclient = pytest.importorskip(
    "tritonclient.http",
    reason="tritonclient[http] is not installed (pip install 'tritonclient[http]')",
)

DIGITS = str(BUILD / "digits_mlp.onnx")


def doors(agent: tw.Agent) -> dict:
    """scheme -> HOST:PORT of the agent's front doors."""
    out = {}
    for uri in agent.endpoints:
        scheme, _, addr = uri.partition("://")
        if scheme in ("grpc", "http"):
            out[scheme] = addr
    return out


def refuses(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.fixture(scope="module")
def agent():
    shm = f"shm://pytest-doors-{uuid.uuid4().hex[:8]}"
    a = tw.Agent(
        models={"digits": DIGITS},
        listen=["grpc://127.0.0.1:0", "http://127.0.0.1:0", shm],
    )
    yield a
    a.stop()


def test_endpoints_name_the_doors_with_their_ports(agent):
    eps = agent.endpoints
    assert len(eps) == 3, eps
    # The agent's own endpoints first, then gRPC, then HTTP.
    assert eps[0].startswith("shm://pytest-doors-"), eps
    assert eps[1].startswith("grpc://127.0.0.1:"), eps
    assert eps[2].startswith("http://127.0.0.1:"), eps
    assert not any(e.endswith(":0") for e in eps), eps
    assert "grpc://" in repr(agent)
    assert agent.running


def test_grpc_door_with_tritonclient(agent):
    c = grpcclient.InferenceServerClient(doors(agent)["grpc"])
    try:
        assert c.is_server_live()
        assert c.is_server_ready()
        assert c.is_model_ready("digits")
        a = np.arange(12, dtype=np.int32).reshape(3, 4)
        i = grpcclient.InferInput("t", list(a.shape), "INT32")
        i.set_data_from_numpy(a)
        r = c.infer("identity", [i])
        np.testing.assert_array_equal(r.as_numpy("t"), a)
        x, expected = digits_sample()
        i = grpcclient.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = c.infer("digits", [i])
        np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    finally:
        c.close()


def test_http_door_with_tritonclient(agent):
    c = httpclient.InferenceServerClient(doors(agent)["http"])
    try:
        assert c.is_server_live()
        assert c.is_server_ready()
        assert c.is_model_ready("digits")
        a = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
        i = httpclient.InferInput("t", list(a.shape), "FP32")
        i.set_data_from_numpy(a, binary_data=False)
        r = c.infer("identity", [i], outputs=[httpclient.InferRequestedOutput("t")])
        np.testing.assert_array_equal(r.as_numpy("t"), a)
        x, expected = digits_sample()
        i = httpclient.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = c.infer("digits", [i])
        np.testing.assert_allclose(r.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
    finally:
        c.close()


def test_doors_and_native_clients_share_one_agent(agent):
    x, expected = digits_sample()
    native = tw.connect(agent.endpoints[0])
    try:
        out = native.model("digits").infer({"x": x})
        np.testing.assert_allclose(out["logits"], expected, rtol=1e-5, atol=1e-5)
    finally:
        native.close()
    # The doors count the native request with theirs: one core.
    h = httpclient.InferenceServerClient(doors(agent)["http"])
    try:
        stats = h.get_inference_statistics("digits")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] >= 1
    finally:
        h.close()


def test_stop_closes_the_doors():
    a = tw.Agent(listen=["grpc://127.0.0.1:0", "http://127.0.0.1:0"])
    d = doors(a)
    assert set(d) == {"grpc", "http"}
    assert grpcclient.InferenceServerClient(d["grpc"]).is_server_ready()
    assert httpclient.InferenceServerClient(d["http"]).is_server_ready()
    assert a.stop() == 0
    assert not a.running
    for addr in d.values():
        assert refuses(addr), f"{addr} still accepts connections after stop()"
    assert a.stop() == 0  # twice is fine


def test_doors_from_a_config_file(tmp_path):
    cfg = tmp_path / "agent.toml"
    cfg.write_text('listen = ["http://127.0.0.1:0", "grpc://127.0.0.1:0"]\n')
    with tw.Agent(config=str(cfg)) as a:
        d = doors(a)
        # gRPC doors are listed first, whatever the file's order.
        assert [e.split("://")[0] for e in a.endpoints] == ["grpc", "http"]
        assert httpclient.InferenceServerClient(d["http"]).is_server_ready()
        assert grpcclient.InferenceServerClient(d["grpc"]).is_server_ready()
    for addr in d.values():
        assert refuses(addr)


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("grpc://nohost", "port"),
        ("http://127.0.0.1:8000/v2", "path"),
        ("ftp://127.0.0.1:1", "unknown scheme 'ftp'"),
        # tw.Agent takes no TLS files: a TLS door names what it lacks.
        ("https://127.0.0.1:1", "--tls-cert"),
    ],
)
def test_a_bad_front_door_uri_raises_and_starts_nothing(tmp_path, bad, needle):
    sock = tmp_path / "agent.sock"
    with pytest.raises(tw.AgentError) as e:
        tw.Agent(listen=[f"unix://{sock}", "http://127.0.0.1:0", bad])
    assert bad in str(e.value) and needle in str(e.value), str(e.value)
    assert not sock.exists(), "the agent's socket was bound"


def test_a_door_that_cannot_bind_stops_everything_again(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = "http://127.0.0.1:%d" % taken.getsockname()[1]
    sock = tmp_path / "agent.sock"
    try:
        with pytest.raises(tw.AgentError) as e:
            tw.Agent(listen=[f"unix://{sock}", "grpc://127.0.0.1:0", busy])
        assert busy in str(e.value), str(e.value)
        # The agent had started: it is stopped again, its socket removed.
        assert not sock.exists()
        # And the same endpoints start fine once the port is free.
        taken.close()
        with tw.Agent(listen=[f"unix://{sock}", busy]) as a:
            assert a.endpoints[1] == busy
            assert httpclient.InferenceServerClient(busy[len("http://"):]).is_server_live()
    finally:
        taken.close()
