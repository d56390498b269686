"""Requests' priority levels and queue timeouts (`priority=`,
`queue_timeout=` on infer, submit and infer_async) against real agents
whose digits model has two levels (TOML `priority_levels = 2`): a level the
model does not have raises InvalidInput naming it, the levels it has give
the same outputs, and bad arguments raise ValueError (or TypeError) before
anything is sent; with ``preempt`` a high-priority request stops a slow
run in progress and is answered first. (How the agent orders and bounds
its queue is tested in Rust: tests/queue_policy.rs,
crates/server/src/queue.rs.)"""

from __future__ import annotations

import asyncio
import math
import signal
import subprocess
import time
import uuid

import numpy as np
import pytest

import tensorwire as tw
from twtest import BUILD, ROOT, digits_sample, tensorwire_bin


def _config(tmp, listen) -> str:
    path = tmp / "agent.toml"
    path.write_text(
        f"listen = {listen!r}\n".replace("'", '"')
        + "\n[[model]]\n"
        + 'name = "digits"\n'
        + f'path = "{BUILD / "digits_mlp.onnx"}"\n'
        + "priority_levels = 2\n"
        + "queue_timeout_ms = 5000\n"
    )
    return str(path)


@pytest.fixture(scope="module")
def served_config(tmp_path_factory):
    """`tensorwire serve --config` on shm, unix and tcp."""
    tmp = tmp_path_factory.mktemp("prio")
    listen = [f"shm://pytest-prio-{uuid.uuid4().hex[:10]}", f"unix://{tmp / 'agent.sock'}", "tcp://127.0.0.1:0"]
    proc = subprocess.Popen(
        [str(tensorwire_bin()), "serve", "--grace", "1", "--config", _config(tmp, listen)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    uris = {}
    deadline = time.monotonic() + 60
    while len(uris) < 3:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tensorwire serve exited: {proc.stderr.read()}")
        if line.startswith("listening on "):
            u = line.split()[-1]
            uris[u.split("://")[0]] = u
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("tensorwire serve did not start in 60 s")
    yield uris
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def inproc_config(tmp_path_factory):
    """The same configuration in this process: tw.Agent(config=path)."""
    tmp = tmp_path_factory.mktemp("prio-inproc")
    with tw.Agent(config=_config(tmp, [f"inproc://pytest-prio-{uuid.uuid4().hex[:10]}"])) as a:
        yield a.endpoints[0]


@pytest.fixture(params=["shm", "unix", "tcp", "inproc"])
def uri(request, served_config, inproc_config) -> str:
    if request.param == "inproc":
        return inproc_config
    return served_config[request.param]


def test_a_level_the_model_does_not_have_is_refused_naming_it(uri):
    c = tw.connect(uri)
    m = c.model("digits")
    x, y = digits_sample()
    with pytest.raises(tw.InvalidInput) as e:
        m.infer({"x": x}, priority=3)
    msg = str(e.value)
    assert "priority 3" in msg and "digits" in msg, msg
    assert "..= 2" in msg, msg  # the model's levels
    fut = m.submit({"x": x}, priority=255)
    with pytest.raises(tw.InvalidInput, match="priority 255"):
        fut.result(timeout=10)
    with pytest.raises(tw.InvalidInput, match="priority 3"):
        asyncio.run(m.infer_async({"x": x}, priority=3))
    # The identity model has one level.
    ident = c.model("identity")
    with pytest.raises(tw.InvalidInput, match="priority 2"):
        ident.infer({"a": np.arange(4, dtype=np.int32)}, priority=2)
    out = ident.infer({"a": np.arange(4, dtype=np.int32)}, priority=1)
    np.testing.assert_array_equal(out["a"], np.arange(4, dtype=np.int32))
    # The session goes on.
    np.testing.assert_allclose(m.infer({"x": x})["logits"], y, rtol=1e-5, atol=1e-5)


def test_every_level_gives_the_same_outputs(uri):
    c = tw.connect(uri)
    m = c.model("digits")
    x, y = digits_sample()
    first = np.array(m.infer({"x": x})["logits"])
    np.testing.assert_allclose(first, y, rtol=1e-5, atol=1e-5)
    for priority in (0, 1, 2, np.uint8(2)):
        for queue_timeout in (None, 0, 0.5, 2, 1e-7, 4294.9):
            out = m.infer({"x": x}, priority=priority, queue_timeout=queue_timeout)
            np.testing.assert_array_equal(out["logits"], first)
        out = m.submit({"x": x}, priority=priority, queue_timeout=1.0).result(timeout=10)
        np.testing.assert_array_equal(out["logits"], first)
        out = asyncio.run(m.infer_async({"x": x}, 10.0, priority=priority, queue_timeout=1.0))
        np.testing.assert_array_equal(out["logits"], first)
    # Many in flight at once, at mixed levels: each gets its own answer.
    futs = [m.submit({"x": x[i : i + 1]}, priority=1 + i % 2, queue_timeout=5.0) for i in range(len(x))]
    for i, f in enumerate(futs):
        np.testing.assert_array_equal(f.result(timeout=10)["logits"], first[i : i + 1])


def test_bad_arguments_raise_before_anything_is_sent(uri):
    c = tw.connect(uri)
    m = c.model("digits")
    x, _ = digits_sample()
    requests = c.copy_stats()["requests"]
    calls = [
        lambda **kw: m.infer({"x": x}, **kw),
        lambda **kw: m.submit({"x": x}, **kw),
        lambda **kw: asyncio.run(m.infer_async({"x": x}, **kw)),
    ]
    for call in calls:
        for p in (-1, 256, 1000, 2**70, -(2**70)):
            with pytest.raises(ValueError, match="priority must be 0..=255") as e:
                call(priority=p)
            assert str(p) in str(e.value)
        for t in (-0.001, -1, math.inf, -math.inf, math.nan, 4294.968, 1e9):
            with pytest.raises(ValueError, match="queue_timeout"):
                call(queue_timeout=t)
        for p in (1.5, "1", [1]):
            with pytest.raises(TypeError, match="priority"):
                call(priority=p)
        with pytest.raises(TypeError):
            call(queue_timeout="1")
    assert c.copy_stats()["requests"] == requests  # nothing was sent


def test_the_cli_says_what_python_raises(served_config, tmp_path):
    uri = served_config["unix"]
    x, _ = digits_sample()
    with pytest.raises(tw.InvalidInput) as e:
        tw.connect(uri).model("digits").infer({"x": x}, priority=3)
    np.save(tmp_path / "x.npy", x)
    cli = subprocess.run(
        [
            str(tensorwire_bin()),
            "infer",
            "--connect",
            uri,
            "--model",
            "digits",
            "--input",
            f"x={tmp_path / 'x.npy'}",
            "--priority",
            "3",
            "--queue-timeout-ms",
            "100",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert cli.returncode != 0
    assert str(e.value) in cli.stderr, (str(e.value), cli.stderr)


@pytest.mark.parametrize("preempt", [True, False])
def test_preempt_lets_a_high_priority_request_finish_before_the_run_it_stopped(preempt, tmp_path):
    """slow_echo (100-300 ms a run) with two levels: a level-1 request sent
    while a level-2 run is in progress. With ``preempt`` it stops that run and
    is answered first (the low one runs again and is still answered its own
    echo); without, the low one, which started first, finishes first."""
    import threading

    sock = str(tmp_path / "agent.sock")
    settings = {"path": str(BUILD / "slow_echo.onnx"), "priority_levels": 2, "preempt": preempt}
    finished = []
    with tw.Agent(models={"slow_echo": settings}, listen=[f"unix://{sock}"], intra_threads=1) as agent:
        with tw.connect(f"unix://{sock}") as low_client, tw.connect(f"unix://{sock}") as high_client:
            out = {}

            def call(client, name, x, priority):
                out[name] = client.model("slow_echo").infer({"x": x}, priority=priority)["y"].tolist()
                finished.append(name)

            low = threading.Thread(target=call, args=(low_client, "low", np.arange(4, dtype=np.float32), 2))
            low.start()
            deadline = time.monotonic() + 10
            while agent.stats()["in_flight"] < 1:  # the low request has arrived: it runs
                assert time.monotonic() < deadline, "the low request never arrived"
                time.sleep(0.001)
            time.sleep(0.02)
            call(high_client, "high", np.ones(1, np.float32), 1)
            low.join(timeout=30)
    assert out == {"low": [0.0, 1.0, 2.0, 3.0], "high": [1.0]}
    assert finished == (["high", "low"] if preempt else ["low", "high"])
