"""Fixtures: real `tensorwire serve` agents (shm, unix, tcp) as child
processes, an in-process agent (inproc://), the mixed-dtype model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from twtest import BUILD, ServedAgent, build_mixed_model


@pytest.fixture(scope="session")
def mixed_model(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("models") / "mixed.onnx"
    build_mixed_model(p)
    return p


@pytest.fixture(scope="session")
def served(tmp_path_factory, mixed_model):
    """One agent for the session, serving digits, mixed and identity."""
    a = ServedAgent(
        tmp_path_factory.mktemp("agent"),
        {"digits": BUILD / "digits_mlp.onnx", "mixed": mixed_model},
    )
    yield a
    a.stop()


@pytest.fixture(scope="session")
def inproc_agent(mixed_model):
    """An agent in this process (tw.Agent) on inproc://."""
    import tensorwire as tw

    a = tw.Agent(
        models={"digits": str(BUILD / "digits_mlp.onnx"), "mixed": str(mixed_model)},
        listen=[f"inproc://pytest-{os.getpid()}"],
    )
    yield a
    a.stop()


@pytest.fixture(params=["shm", "unix", "tcp", "inproc"])
def uri(request, served, inproc_agent) -> str:
    """Every transport, against a real agent."""
    if request.param == "inproc":
        return inproc_agent.endpoints[0]
    return served.uris[request.param]
