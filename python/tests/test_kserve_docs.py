"""docs/KSERVE.md's examples, run as written against a real agent: every
```python block (with the venv's interpreter) and every ```sh block (bash,
with `curl -f`, so an HTTP error fails), in document order, after the
page's ports (gRPC 8001, HTTP 8000, metrics 8002) are replaced by the
agent's. The agent serves the page's repository (digits with a
config.pbtxt, mixed) in explicit mode."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from twtest import ROOT, FrontDoorAgent
from test_kserve_repository import make_repository

pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed")
pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")

BLOCK = re.compile(r"^```(python|sh)\n(.*?)^```", re.S | re.M)


@pytest.fixture(scope="module")
def agent(tmp_path_factory, mixed_model):
    repo = make_repository(tmp_path_factory.mktemp("docs-repo"), mixed_model)
    a = FrontDoorAgent(
        ["grpc", "http"],
        {},
        [
            "--model-repository", str(repo),
            "--model-control-mode", "explicit",
            "--load-model", "digits",
            "--metrics-listen", "http://127.0.0.1:0",
        ],
    )
    yield a
    a.stop()


def test_every_example_runs(agent):
    text = (ROOT / "docs" / "KSERVE.md").read_text()
    blocks = BLOCK.findall(text)
    assert len(blocks) >= 5, "the page's examples were not found"
    metrics = agent.metrics_uri.removeprefix("http://")
    ports = {
        "127.0.0.1:8001": agent.addresses["grpc"],
        "127.0.0.1:8000": agent.addresses["http"],
        "localhost:8000": agent.addresses["http"],
        "localhost:8002": metrics,
        "127.0.0.1:8002": metrics,
    }
    for lang, code in blocks:
        for old, new in ports.items():
            code = code.replace(old, new)
        if lang == "python":
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        else:
            code = code.replace("curl -s ", "curl -sf ")
            p = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True, timeout=120
            )
        assert p.returncode == 0, f"{lang} block failed:\n{code}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
        if lang == "sh":
            assert p.stdout.strip(), f"no output from:\n{code}"
