"""Agents that die, forks, timeouts, memory over many calls, and the
in-process agent."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import tensorwire as tw
from twtest import BUILD, ServedAgent, digits_sample, rss_kib


@pytest.mark.parametrize("transport", ["shm", "unix", "tcp"])
def test_agent_killed_mid_call_raises_disconnected(tmp_path, transport):
    agent = ServedAgent(tmp_path, {"resnet": BUILD / "resnet50.onnx"})
    try:
        c = tw.connect(agent.uris[transport], timeout=20.0)
        m = c.model("resnet")
        x = np.zeros((1, 3, 224, 224), np.float32)
        m.infer({m.inputs[0].name: x})  # warm
        result = {}

        def call():
            t = time.monotonic()
            try:
                for _ in range(1000):
                    m.infer({m.inputs[0].name: x})
            except tw.TensorwireError as e:
                result["error"] = e
            result["seconds"] = time.monotonic() - t

        th = threading.Thread(target=call)
        th.start()
        time.sleep(0.3)  # mid-call: a resnet50 run takes ~100 ms here
        killed = time.monotonic()
        agent.kill()
        th.join(timeout=30)
        assert not th.is_alive()
        assert isinstance(result.get("error"), tw.Disconnected), result
        assert time.monotonic() - killed < 10.0
        with pytest.raises(tw.Disconnected):
            m.infer({m.inputs[0].name: x})
    finally:
        agent.kill()


def test_a_wait_that_times_out_gives_the_request_up(tmp_path):
    agent = ServedAgent(tmp_path, {"resnet": BUILD / "resnet50.onnx"})
    try:
        for transport in ["shm", "unix", "tcp"]:
            c = tw.connect(agent.uris[transport])
            m = c.model("resnet")
            x = {m.inputs[0].name: np.zeros((1, 3, 224, 224), np.float32)}
            fut = m.submit(x)
            with pytest.raises(tw.Timeout):
                fut.result(timeout=0.001)
            with pytest.raises(tw.Timeout):
                fut.result()  # given up for good
            with pytest.raises(tw.Timeout):
                m.infer(x, timeout=0.001)
            assert m.infer(x, timeout=30.0)[m.outputs[0].name].shape[0] == 1
    finally:
        agent.stop()


def test_a_forked_child_cannot_use_its_parents_client(served):
    c = tw.connect(served.uris["shm"])
    m = c.model("digits")
    x, y = digits_sample()
    out = m.infer({"x": x})
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, exit without cleanup
        code = 0
        try:
            try:
                m.infer({"x": x})
                code = 1
            except tw.ForkedError:
                pass
            try:
                c.models()
                code = 2
            except tw.ForkedError:
                pass
            # A connection of its own works.
            got = tw.connect(served.uris["shm"]).model("digits").infer({"x": x})["logits"]
            if not np.allclose(got, y, rtol=1e-5, atol=1e-5):
                code = 3
        except BaseException:  # noqa: BLE001 - any failure is reported as 4
            code = 4
        os.write(w, bytes([code]))
        os._exit(0)
    os.close(w)
    wait_child(pid)
    code = os.read(r, 1)
    os.close(r)
    assert code == b"\x00", code
    # The parent's session is intact.
    np.testing.assert_allclose(m.infer({"x": x})["logits"], y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["logits"], y, rtol=1e-5, atol=1e-5)


def wait_child(pid, limit=60.0):
    """waitpid with a deadline: a child stuck after fork() fails the test
    instead of hanging it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"child {pid} did not exit within {limit} s")


def test_a_child_that_drops_its_parents_objects_leaves_the_session_intact(served):
    c = tw.connect(served.uris["shm"])
    m = c.model("digits")
    x, y = digits_sample()
    # Outputs in the agent's region: dropping them sends Release messages
    # (in batches), which from the child would land in the parent's ring.
    outs = [m.infer({"x": x}) for _ in range(40)]
    buf = c.empty(1024, np.float32)
    buf[:] = 3
    ident = c.model("identity")
    aliased = ident.infer({"b": buf})
    pid = os.fork()
    if pid == 0:
        # Garbage-collect everything inherited: the forgotten Rust halves
        # must neither free arena blocks nor say anything on the session.
        del outs, aliased, buf, ident, m, c
        import gc

        gc.collect()
        os._exit(0)
    wait_child(pid)
    for _ in range(200):  # the agent reuses whatever it was told is free
        m.infer({"x": x * 0 + 1})
    for o in outs:
        np.testing.assert_allclose(o["logits"], y, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(aliased["b"], 3)
    np.testing.assert_array_equal(ident.infer({"b": buf})["b"], 3)


def test_many_calls_with_1mib_tensors_keep_rss_flat(served):
    c = tw.connect(served.uris["shm"])
    m = c.model("identity")
    buf = c.empty(1 << 20, np.uint8)
    buf[:] = 1
    x = np.ones(1 << 20, np.uint8)

    def run(n, arr):
        for _ in range(n):
            out = m.infer({"t": arr})
            assert out["t"].shape == (1 << 20,)

    run(5_000, buf)
    run(500, x)
    before = rss_kib()
    run(100_000, buf)  # in the arena: nothing copied
    run(5_000, x)  # copied into the arena each time
    grown = rss_kib() - before
    assert grown < 16 * 1024, f"RSS grew {grown} KiB over 10^5 calls"


def test_inproc_agent_serves_this_process(inproc_agent):
    assert inproc_agent.running
    c = tw.connect(inproc_agent.endpoints[0])
    x, y = digits_sample()
    np.testing.assert_allclose(c.model("digits").infer({"x": x})["logits"], y, rtol=1e-5, atol=1e-5)
    assert inproc_agent.stats()["responses"] >= 1


def test_python_agent_serves_other_transports(tmp_path):
    sock = tmp_path / "a.sock"
    with tw.Agent(models={"digits": str(BUILD / "digits_mlp.onnx")}, listen=[f"unix://{sock}", f"shm://py-agent-{os.getpid()}", "tcp://127.0.0.1:0"]) as a:
        assert a.endpoints[2] != "tcp://127.0.0.1:0"
        x, y = digits_sample()
        for uri in a.endpoints:
            with tw.connect(uri) as c:
                np.testing.assert_allclose(c.model("digits").infer({"x": x})["logits"], y, rtol=1e-5, atol=1e-5)
    assert not a.running
    with pytest.raises(tw.ConnectError):
        tw.connect(f"unix://{sock}")
