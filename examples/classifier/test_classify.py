"""classify.py against `tensorwire classify`: the same labels, the same
logits (within 1e-4; in practice bit-identical), the same output format.

Runs both on the first lines of examples/classifier/tweets.txt (plus a blank
line and an over-long line, which both must skip / truncate alike) over
inproc:// (each its own embedded agent) and over unix:// (one `tensorwire
serve` started here, stopped at the end).

The binary: $TENSORWIRE_BIN, else target/debug/tensorwire, else
target/release/tensorwire. Skipped, with the reason, when the `tokenizers`
or `tensorwire` package, the binary or the built model is missing.

    .venv/bin/python -m pytest -q examples/classifier/test_classify.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip(
    "tokenizers",
    reason="the `tokenizers` package is not installed "
    "(`.venv/bin/pip install --no-deps -r requirements-nodeps.txt`)",
    exc_type=ImportError,
)
pytest.importorskip(
    "tensorwire",
    reason="the tensorwire Python package is not installed (bash scripts/setup.sh)",
    exc_type=ImportError,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPT = HERE / "classify.py"
MODEL = ROOT / "models/build/tweet_classifier.onnx"
TOKENIZER = ROOT / "models/build/minilm_tokenizer.json"
TWEETS = HERE / "tweets.txt"
N_LINES = 10
TOLERANCE = 1e-4
RUN_TIMEOUT = 60


def _binary() -> Path:
    env = os.environ.get("TENSORWIRE_BIN")
    if env:
        if not Path(env).is_file():
            pytest.fail(f"TENSORWIRE_BIN={env} is not a file")
        return Path(env)
    for p in (ROOT / "target/debug/tensorwire", ROOT / "target/release/tensorwire"):
        if p.is_file():
            return p
    pytest.skip("no tensorwire binary: set TENSORWIRE_BIN or run `cargo build -p tensorwire-cli`")


@pytest.fixture(scope="module")
def binary() -> Path:
    return _binary()


@pytest.fixture(scope="module")
def lines_file():
    if not (MODEL.is_file() and TOKENIZER.is_file()):
        pytest.skip(f"{MODEL.name} or {TOKENIZER.name} not built (bash scripts/setup.sh)")
    d = Path(tempfile.mkdtemp(prefix="twcls-"))
    tweets = [l for l in TWEETS.read_text(encoding="utf-8").splitlines() if l.strip()][:N_LINES]
    # A blank line (skipped, but counted in the line numbers) and a line over
    # 512 tokens (truncated, with a warning).
    text = "\n".join(tweets[:3] + ["   "] + tweets[3:] + ["ha " * 600]) + "\n"
    f = d / "lines.txt"
    f.write_text(text, encoding="utf-8")
    yield f
    shutil.rmtree(d, ignore_errors=True)


def _run(cmd, what: str) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert p.returncode == 0, f"{what} failed ({p.returncode}):\n{p.stderr}"
    return p


def _both(binary: Path, lines_file: Path, uri: str, *extra: str):
    args = ["-f", lines_file, "--connect", uri, *extra]
    cli = _run([binary, "classify", *args], f"tensorwire classify --connect {uri}")
    py = _run([sys.executable, SCRIPT, *args], f"classify.py --connect {uri}")
    return cli, py


def _assert_same_json(cli: subprocess.CompletedProcess, py: subprocess.CompletedProcess) -> None:
    a, b = json.loads(cli.stdout), json.loads(py.stdout)
    assert sorted(a) == sorted(b)
    assert (a["config"], a["file"]) == (b["config"], b["file"])
    assert len(a["lines"]) == N_LINES + 1
    assert [l["line"] for l in a["lines"]] == [l["line"] for l in b["lines"]]
    assert [l["tokens"] for l in a["lines"]] == [l["tokens"] for l in b["lines"]]
    assert [l["truncated_from"] for l in a["lines"]] == [l["truncated_from"] for l in b["lines"]]
    assert a["lines"][-1]["truncated_from"] is not None, "the long line must be truncated"
    assert [l["prediction"] for l in a["lines"]] == [l["prediction"] for l in b["lines"]]
    for la, lb in zip(a["lines"], b["lines"]):
        assert len(la["logits"]) == len(lb["logits"]) == 3, la["line"]
        diff = max(abs(x - y) for x, y in zip(la["logits"], lb["logits"]))
        assert diff <= TOLERANCE, f"line {la['line']}: {la['logits']} vs {lb['logits']}"
    # Both warn about the truncated line, naming it.
    n = a["lines"][-1]["line"]
    for p in (cli, py):
        assert re.search(rf"warning: line {n} of .* tokens; truncated to 512", p.stderr), p.stderr


def _without_times(text: str) -> str:
    text = re.sub(r"Duration: \d+\.\d\d ms", "Duration: T ms", text)
    return re.sub(r"\): \d+\.\d\d ms$", "): T ms", text, flags=re.M)


def test_inproc_same_labels_logits_and_format(binary, lines_file):
    cli, py = _both(binary, lines_file, "inproc://", "--json")
    _assert_same_json(cli, py)
    cli, py = _both(binary, lines_file, "inproc://")
    assert _without_times(py.stdout) == _without_times(cli.stdout)
    assert py.stdout.startswith(f"Processing {N_LINES + 1} lines from: ")


@pytest.fixture(scope="module")
def unix_agent(binary):
    d = Path(tempfile.mkdtemp(prefix="twcls-"))
    uri = f"unix://{d / 'agent.sock'}"
    log = d / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(binary), "serve", "--model", f"classifier={MODEL}", "--listen", uri],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while f"listening on {uri}" not in log.read_text():
            if proc.poll() is not None:
                pytest.fail(f"tensorwire serve exited ({proc.returncode}):\n{log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"tensorwire serve did not listen within 30 s:\n{log.read_text()}")
            time.sleep(0.05)
        yield uri
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def test_unix_same_labels_and_logits(binary, lines_file, unix_agent):
    cli, py = _both(binary, lines_file, unix_agent, "--json")
    _assert_same_json(cli, py)


def test_unknown_model_on_the_agent_is_an_error(lines_file, unix_agent):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "-f", str(lines_file), "--connect", unix_agent,
         "--model-name", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    assert p.returncode == 1
    assert "serves no model 'nope'" in p.stderr, p.stderr
