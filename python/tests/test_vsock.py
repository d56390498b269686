"""vsock://CID:PORT from Python (issue 17): URIs pass through unchanged to
the Rust client and the embedded agent. Binding and the errors run
wherever the kernel has vsock; the round trip only where vsock://1 (the
vsock_loopback module) answers, else it is skipped saying so."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

import tensorwire as tw
from twtest import BUILD, ServedAgent, digits_sample


def _vsock_here() -> bool:
    if not hasattr(socket, "AF_VSOCK"):
        return False
    try:
        with socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM) as s:
            s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _vsock_here(), reason="no vsock on this machine")


@pytest.fixture(scope="module")
def vsock_agent(tmp_path_factory):
    a = ServedAgent(
        tmp_path_factory.mktemp("vsock"),
        {"digits": BUILD / "digits_mlp.onnx"},
        extra_args=["--listen", "vsock://-1:-1"],
    )
    yield a, next(u for u in a.listening if u.startswith("vsock://"))
    a.stop()


def test_an_agent_listens_on_vsock(vsock_agent):
    _, uri = vsock_agent
    assert uri.startswith("vsock://-1:") and not uri.endswith(":-1"), uri
    # An embedded agent on the same port is refused, naming it.
    with pytest.raises(tw.TensorwireError, match=r"vsock port \d+ is in use"):
        tw.Agent(models={}, listen=[uri])


@pytest.mark.parametrize("cid", [2, 1])
def test_unreachable_cids_fail_promptly_and_clearly(cid):
    t0 = time.monotonic()
    with pytest.raises(tw.ConnectError) as e:
        tw.connect(f"vsock://{cid}:1", connect_timeout=0.5)
    took = time.monotonic() - t0
    assert f"connect to vsock://{cid}:1: " in str(e.value) and f"CID {cid}" in str(e.value)
    assert took < 1.5, (took, str(e.value))


def test_any_cid_is_a_listeners():
    with pytest.raises(tw.ConnectError, match="for listeners"):
        tw.connect("vsock://-1:5000")


def test_round_trip_over_vsock_loopback(vsock_agent):
    _, uri = vsock_agent
    local = "vsock://1:" + uri.rsplit(":", 1)[1]
    try:
        c = tw.connect(local, connect_timeout=1.0)
    except tw.ConnectError as e:
        pytest.skip(f"no vsock loopback here ({e}); on a host: sudo modprobe vsock_loopback")
    with c:
        x, want = digits_sample()
        out = c.model("digits").infer({"x": x})
        np.testing.assert_allclose(out["logits"], want, rtol=1e-4, atol=1e-4)
