"""Tenants from Python: a token (argument or TENSORWIRE_TOKEN) names the
client's tenant; it sees and calls only that tenant's models, over every
transport; a token the agent does not accept raises PermissionDenied."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import tensorwire as tw
from twtest import BUILD, ServedAgent


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenants")
    tenants = tmp / "tenants.toml"
    tenants.write_text(
        f"""
[[tenant]]
name = "vision"
tokens_sha256 = ["{_digest('vision-token')}"]
models = ["digits"]

[[tenant]]
name = "echo"
tokens_sha256 = ["{_digest('echo-token')}"]
models = ["identity"]
"""
    )
    a = ServedAgent(
        tmp, {"digits": BUILD / "digits_mlp.onnx"}, ["--tenants", str(tenants)]
    )
    yield a
    a.stop()


@pytest.mark.parametrize("transport", ["shm", "unix", "tcp"])
def test_a_token_chooses_the_models_a_client_sees_and_calls(agent, transport):
    uri = agent.uris[transport]
    with tw.connect(uri, token="vision-token") as c:
        assert [m.name for m in c.models()] == ["digits"]
        x = np.zeros((1, 64), dtype=np.float32)
        out = c.model("digits").infer({"x": x})
        assert next(iter(out.values())).shape == (1, 10)
        with pytest.raises(tw.PermissionDenied, match="'vision' may not"):
            c.model("identity")
    with tw.connect(uri, token="echo-token") as c:
        assert [m.name for m in c.models()] == ["identity"]
        with pytest.raises(tw.PermissionDenied, match="'digits'"):
            c.model("digits")


def test_the_token_comes_from_the_environment_by_default(agent, monkeypatch):
    monkeypatch.setenv("TENSORWIRE_TOKEN", "echo-token")
    with tw.connect(agent.uris["unix"]) as c:
        assert [m.name for m in c.models()] == ["identity"]
    monkeypatch.delenv("TENSORWIRE_TOKEN")
    with tw.connect(agent.uris["tcp"]) as c:
        # No token over tcp: the default tenant, which this file leaves empty.
        assert c.models() == []


def test_an_unknown_token_is_refused_and_others_go_on(agent):
    for transport in ("shm", "unix", "tcp"):
        with pytest.raises(tw.PermissionDenied, match="not one the agent accepts"):
            tw.connect(agent.uris[transport], token="guess")
    with tw.connect(agent.uris["shm"], token="echo-token") as c:
        a = np.arange(4, dtype=np.uint8)
        assert (c.model("identity").infer({"t": a})["t"] == a).all()
