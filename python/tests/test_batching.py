"""Dynamic batching from Python: `tw.Agent(models={name: {"path": ..,
"max_batch": .., ...}})` serves a model that batches; requests sent at once
come back with their own rows, equal to the unbatched model's; a bad
setting raises AgentError naming it. (How batches form is tested in Rust:
crates/server/src/batcher.rs, tests/batching.rs.)"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import tensorwire as tw
from twtest import BUILD


def test_requests_sent_together_run_as_one_batch_with_their_own_rows():
    digits = str(BUILD / "digits_mlp.onnx")
    uri = f"inproc://pytest-batch-{os.getpid()}"
    # The first request waits (up to 10 s) until 4 rows are there.
    with tw.Agent(
        models={
            "plain": digits,
            "batched": {"path": digits, "max_batch": 4, "max_queue_delay_us": 10_000_000},
        },
        listen=[uri],
    ):
        rng = np.random.default_rng(7)
        xs = [rng.uniform(0, 16, size=(n, 64)).astype(np.float32) for n in (1, 1, 2)]
        got = [None] * len(xs)

        def call(i):
            c = tw.connect(uri)
            got[i] = c.model("batched").infer({"x": xs[i]})["logits"]

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        c = tw.connect(uri)
        for x, g in zip(xs, got):
            assert g is not None, "a batched call did not finish"
            alone = c.model("plain").infer({"x": x})["logits"]
            assert g.shape == alone.shape
            np.testing.assert_allclose(g, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"max_batch": 0}, "max_batch"),
        ({"max_batch": 4, "preferred_batch_sizes": [8]}, "preferred_batch_sizes"),
        ({"bogus": 1}, "bogus"),
        ({"max_batch": {"a": 1}}, "max_batch"),
    ],
)
def test_bad_settings_raise_agent_error_naming_them(settings, named):
    with pytest.raises(tw.AgentError, match=named):
        tw.Agent(
            models={"m": {"path": str(BUILD / "digits_mlp.onnx"), **settings}},
            listen=[f"inproc://pytest-badbatch-{os.getpid()}"],
        )


def test_settings_need_a_path():
    with pytest.raises(tw.AgentError, match="path"):
        tw.Agent(models={"m": {"max_batch": 4}}, listen=["inproc://pytest-nopath"])
