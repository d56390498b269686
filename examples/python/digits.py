#!/usr/bin/env python3
"""The digits model from Python, over each URI given (default: an agent
embedded in this process on inproc://).

    .venv/bin/python examples/python/digits.py unix:///tmp/tw.sock shm://demo
    .venv/bin/python examples/python/digits.py            # embedded agent

Prints the model's signature, the predicted digit of each sample row, and
the median round trip of the empty request (through `identity`) and of
the digits model, timed here in Python.
"""

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import tensorwire as tw

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "build" / "digits_mlp.onnx"
SAMPLE = ROOT / "models" / "build" / "digits_mlp_input.bin"


def p50_us(call, n=5000):
    for _ in range(500):
        call()
    t = []
    for _ in range(n):
        a = time.perf_counter_ns()
        call()
        t.append(time.perf_counter_ns() - a)
    return statistics.median(t) / 1e3


def main(uris):
    agent = None
    if not uris:
        agent = tw.Agent(models={"digits": str(MODEL)}, listen=["inproc://digits-example"])
        uris = agent.endpoints
    x = np.fromfile(SAMPLE, dtype="<f4").reshape(-1, 64)
    for uri in uris:
        with tw.connect(uri) as c:
            m = c.model("digits")
            print(f"{uri}: {m.name} {[(t.name, str(t.dtype), t.shape) for t in m.inputs]} -> "
                  f"{[(t.name, str(t.dtype), t.shape) for t in m.outputs]}")
            out = m.infer({"x": x})
            print(f"  predicted digits: {out['logits'].argmax(axis=1).tolist()}")
            empty = c.model("identity")
            print(f"  p50 round trip, Python: empty request {p50_us(lambda: empty.infer({})):.2f} µs, "
                  f"digits batch 1 {p50_us(lambda: m.infer({'x': x[:1]})):.2f} µs")
    if agent is not None:
        agent.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
