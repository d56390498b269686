"""Helpers for the tests: the CLI binary, `tensorwire serve` as a child
process, a small ONNX model with several inputs and outputs of different
dtypes and dynamic dims, the digits sample, RSS."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "models" / "build"


def tensorwire_bin() -> Path:
    """The CLI: $TENSORWIRE_BIN, else target/debug (built if missing)."""
    env = os.environ.get("TENSORWIRE_BIN")
    if env:
        return Path(env)
    for profile in ("debug", "release"):
        p = ROOT / "target" / profile / "tensorwire"
        if p.is_file():
            return p
    subprocess.run(
        ["cargo", "build", "-q", "-p", "tensorwire-cli", "--bin", "tensorwire"],
        cwd=ROOT,
        check=True,
        timeout=900,
    )
    return ROOT / "target" / "debug" / "tensorwire"


def build_mixed_model(path: Path) -> None:
    """mixed.onnx: a float16[?,3], b bool[?], c int64[?,?] ->
    a2 = a*2 (float16), nb = not b (bool), c1 = c+1 (int64), s = sum(c) (int64)."""
    import onnx
    from onnx import TensorProto, helper

    two = helper.make_tensor("two", TensorProto.FLOAT16, [], [2.0])
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    nodes = [
        helper.make_node("Mul", ["a", "two"], ["a2"]),
        helper.make_node("Not", ["b"], ["nb"]),
        helper.make_node("Add", ["c", "one"], ["c1"]),
        helper.make_node("ReduceSum", ["c"], ["s"], keepdims=0),
    ]
    g = helper.make_graph(
        nodes,
        "mixed",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT16, ["n", 3]),
            helper.make_tensor_value_info("b", TensorProto.BOOL, ["m"]),
            helper.make_tensor_value_info("c", TensorProto.INT64, ["p", "q"]),
        ],
        [
            helper.make_tensor_value_info("a2", TensorProto.FLOAT16, ["n", 3]),
            helper.make_tensor_value_info("nb", TensorProto.BOOL, ["m"]),
            helper.make_tensor_value_info("c1", TensorProto.INT64, ["p", "q"]),
            helper.make_tensor_value_info("s", TensorProto.INT64, []),
        ],
        initializer=[two, one],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


class ServedAgent:
    """`tensorwire serve` in a child process, listening on shm, unix and tcp."""

    def __init__(self, tmp: Path, models: dict, extra_args: list | tuple = ()) -> None:
        tag = uuid.uuid4().hex[:10]
        self.uris = {
            "shm": f"shm://pytest-{tag}",
            "unix": f"unix://{tmp / 'agent.sock'}",
            "tcp": "tcp://127.0.0.1:0",
        }
        args = [str(tensorwire_bin()), "serve", "--grace", "1"]
        for uri in self.uris.values():
            args += ["--listen", uri]
        for name, path in models.items():
            args += ["--model", f"{name}={path}"]
        args += list(extra_args)
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )
        deadline = time.monotonic() + 60
        listening = []
        while len(listening) < 3 + list(extra_args).count("--listen"):
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read()
                raise RuntimeError(f"tensorwire serve exited: {err}")
            if line.startswith("listening on "):
                listening.append(line.split()[-1])
            if time.monotonic() > deadline:
                raise RuntimeError("tensorwire serve did not start in 60 s")
        self.uris["tcp"] = next(u for u in listening if u.startswith("tcp://"))
        # Every endpoint as the agent printed it (ports resolved).
        self.listening = listening

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def digits_sample():
    x = np.fromfile(BUILD / "digits_mlp_input.bin", dtype="<f4").reshape(-1, 64)
    y = np.fromfile(BUILD / "digits_mlp_expected.bin", dtype="<f4").reshape(x.shape[0], 10)
    return x, y


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class FrontDoorAgent:
    """`tensorwire serve` with KServe front doors on free loopback ports, in
    a child process. `scheme` is `grpc` or `http`, or a list of both (one
    agent behind both doors); `uris[scheme]` and `addresses[scheme]` (the
    `HOST:PORT` tritonclient takes) for each, and `uri` / `address` for the
    first. `extra_args` go to `serve` as given (more `--listen` URIs,
    `--metrics-listen http://HOST:PORT`, `--model-repository DIR`, ...);
    `listening` holds every URI it printed a `listening on` line for, and
    `metrics_uri` the `metrics on` one (None without `--metrics-listen`)."""

    def __init__(self, scheme, models: dict, extra_args: list | tuple = ()) -> None:
        schemes = [scheme] if isinstance(scheme, str) else list(scheme)
        args = [str(tensorwire_bin()), "serve", "--grace", "1"]
        for s in schemes:
            args += ["--listen", f"{s}://127.0.0.1:0"]
        for name, path in models.items():
            args += ["--model", f"{name}={path}"]
        args += list(extra_args)
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
        )
        deadline = time.monotonic() + 60
        self.uris = {}
        self.metrics_uri = None
        self.listening = []
        want_metrics = "--metrics-listen" in extra_args
        # The metrics line, when asked for, is printed after every listener's.
        while len(self.uris) < len(schemes) or (want_metrics and self.metrics_uri is None):
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"tensorwire serve exited: {self.proc.stderr.read()}")
            if line.startswith("listening on "):
                self.listening.append(line.split()[-1])
            for s in schemes:
                if line.startswith(f"listening on {s}://") and s not in self.uris:
                    self.uris[s] = line.split()[-1]
            if line.startswith("metrics on "):
                self.metrics_uri = line.split()[-1]
            if time.monotonic() > deadline:
                raise RuntimeError("tensorwire serve did not start in 60 s")
        self.addresses = {s: u.removeprefix(f"{s}://") for s, u in self.uris.items()}
        self.uri = self.uris[schemes[0]]
        self.address = self.addresses[schemes[0]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
