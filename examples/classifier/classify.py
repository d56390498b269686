#!/usr/bin/env python3
"""The tweet classifier in Python: ``tensorwire classify``, line for line.

Every line of a text file is tokenized with the Hugging Face ``tokenizers``
package (the same ``tokenizer.json`` the Rust side reads, with the same
settings: padding off, truncation at 512 tokens) and classified with one
request (batch 1) through the tensorwire Python SDK, over any URI. The
client-side time of each line (tokenize + request + response) is printed in
the format of ``tensorwire classify``, so the two can be diffed::

    Processing 100 lines from: examples/classifier/tweets.txt
    Line 1: Duration: 8.61 ms Prediction: offensive-language
    ...
    Average (after 4th iteration): 8.50 ms

Usage (from the repository root, with the project's .venv)::

    # an agent embedded in this process (the default, as for the CLI)
    .venv/bin/python examples/classifier/classify.py -f examples/classifier/tweets.txt

    # a running agent that serves the model as `classifier`
    target/release/tensorwire serve --listen unix:///tmp/tw.sock \\
        --model classifier=models/build/tweet_classifier.onnx &
    .venv/bin/python examples/classifier/classify.py -f examples/classifier/tweets.txt \\
        --connect unix:///tmp/tw.sock

    # labels and logits of every line as JSON (the CLI's --json schema)
    .venv/bin/python examples/classifier/classify.py -f examples/classifier/tweets.txt --json
    target/release/tensorwire classify -f examples/classifier/tweets.txt --json

    # lines from standard input (`-f -`, or no -f with a pipe)
    printf 'you clown\\nnice weather today\\n' | .venv/bin/python examples/classifier/classify.py

``--connect``:

- ``inproc://[NAME]`` (the default, ``inproc://``): if no agent of that name
  runs in this process, one is started here (``tensorwire.Agent``) with the
  model loaded under ``--model-name``, and stopped at the end: the CLI's
  embedded agent.
- ``unix:///PATH``, ``tcp://HOST:PORT``, ``shm://NAME``: a running agent
  that serves the model as ``classifier`` (``--model-name`` for another
  name); ``tensorwire serve --model classifier=models/build/tweet_classifier.onnx``.
- ``local``: ONNX Runtime's Python API called directly, no agent (the CLI's
  ``local`` calls the same ONNX Runtime library from Rust).

The flags are the CLI's (``-m``, ``-t``, ``-f``, ``--connect``,
``--model-name``, ``--labels``, ``--json``, ``-v``, ``--intra-threads``),
with the same defaults; relative paths are looked up in the current
directory, then in this checkout. Differences: ``-f`` may be omitted or
``-`` (standard input; the CLI needs a file, e.g. ``-f /dev/stdin``);
``--compare`` is not offered; ``-v`` adds each line's tokenize time and token
count but not the agent's stage table (the SDK does not return the agent's
timeline). The label names come from the model's JSON sidecar
(``tweet_classifier.json``, field ``"labels"``), or ``--labels``.

Run against the same agent or model, the predictions are the CLI's and the
logits bit-identical (``examples/classifier/test_classify.py`` checks the
labels, and the logits to 1e-4); with ``--json`` the output is the CLI's byte
for byte apart from the timings. Needs ``tokenizers`` (pinned in
requirements-nodeps.txt), ``numpy`` and the ``tensorwire`` package.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

#: The repository root: this file is examples/classifier/classify.py.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
DEFAULT_MODEL = "models/build/tweet_classifier.onnx"
DEFAULT_TOKENIZER = "models/build/minilm_tokenizer.json"
DEFAULT_MODEL_NAME = "classifier"
SETUP_HINT = "run `bash scripts/setup.sh` to build it"
#: The most tokens one line may have (special tokens included): the model's
#: position-embedding limit. Longer lines are truncated, with a warning.
MAX_TOKENS = 512
#: How many first lines the average leaves out (warm-up).
WARMUP_LINES = 4
#: The model inputs a tokenizer makes.
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PROG = "classify.py"

# Rust's char::is_whitespace (Unicode White_Space), which decides what a
# blank line is in `tensorwire classify`; Python's str.isspace differs
# (it also counts U+001C..U+001F).
_RUST_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


class ClassifyError(Exception):
    """A failure reported as `classify.py: error: ...` with exit status 1."""


def resolve(path: str) -> str:
    """``path`` as given when it is absolute or exists here; else the same
    relative path in this checkout if that exists; else as given (so an
    error names what the user typed). As the CLI's ``paths::resolve``."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    in_repo = os.path.join(REPO_ROOT, path)
    return in_repo if os.path.exists(in_repo) else path


def with_setup_hint(msg: str, resolved: str, given: str, default: str) -> str:
    """Adds the setup hint to an error about a missing default file."""
    if given == default and not os.path.exists(resolved):
        return f"{msg} ({SETUP_HINT})"
    return msg


# ---------------------------------------------------------------- input lines


class InputLine(NamedTuple):
    """A non-blank line: its 1-based number in the file, and its text."""

    number: int
    text: str


def split_lines(text: str) -> List[InputLine]:
    """The non-blank lines of ``text``, numbered from 1 (blank lines count).
    Lines end at ``\\n`` or ``\\r\\n``, as Rust's ``str::lines``: no other
    character ends a line (unlike ``str.splitlines``)."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()  # the text ended with a line ending
    out = []
    for i, part in enumerate(parts):
        if i < len(parts) - 1 or text.endswith("\n"):
            if part.endswith("\r"):
                part = part[:-1]
        if any(ch not in _RUST_WHITESPACE for ch in part):
            out.append(InputLine(i + 1, part))
    return out


def read_input(file: Optional[str]) -> Tuple[str, List[InputLine]]:
    """(the name to print, the non-blank lines) of FILE, or of standard input
    for ``-`` or no file. The text must be UTF-8."""
    if file is None or file == "-":
        if file is None and sys.stdin.isatty():
            raise ClassifyError("no input: give -f FILE, or pipe lines on standard input")
        name, data = "-", sys.stdin.buffer.read()
    else:
        name = resolve(file)
        try:
            with open(name, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ClassifyError(f"cannot read input {name}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ClassifyError(f"cannot read input {name}: not UTF-8 ({e})") from None
    return name, split_lines(text)


# ------------------------------------------------------------------ tokenizer


class Encoded(NamedTuple):
    """One tokenized line: ``rows``, int64 ``[3, len]``, holds the
    input_ids, attention_mask and token_type_ids (in ``TOKEN_INPUTS``
    order; ``rows[i:i+1]`` is input i as a C-contiguous ``[1, len]``
    view); ``truncated_from``: how many tokens the line had if it was
    truncated."""

    rows: np.ndarray
    truncated_from: Optional[int]


class TextTokenizer:
    """A ``tokenizer.json`` with padding off and truncation at ``max_tokens``
    (the file itself pads and truncates to 128): the settings of the Rust
    side's ``TextTokenizer``, and of the Python reference vectors
    (``tok.no_padding(); tok.enable_truncation(512)``)."""

    def __init__(self, path: str, max_tokens: int = MAX_TOKENS) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ClassifyError(
                "the `tokenizers` package is not installed "
                "(`.venv/bin/pip install --no-deps -r requirements-nodeps.txt`)"
            ) from None
        try:
            tok = Tokenizer.from_file(path)
            untruncated = Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a plain Exception
            reason = e.strerror if isinstance(e, OSError) else f"not a valid tokenizer.json: {e}"
            raise ClassifyError(f"cannot load tokenizer {path}: {reason}") from None
        added = tok.post_processor.num_special_tokens_to_add(False) if tok.post_processor else 0
        if max_tokens <= added:
            raise ClassifyError(
                f"cannot load tokenizer {path}: truncation at {max_tokens} tokens leaves "
                f"no room next to the {added} special tokens"
            )
        tok.no_padding()
        tok.enable_truncation(max_tokens)  # right, longest-first, stride 0: Rust's defaults
        untruncated.no_padding()
        untruncated.no_truncation()
        self.path = path
        self.max_tokens = max_tokens
        self._tok = tok
        self._untruncated = untruncated

    def encode(self, text: str, line: int) -> Encoded:
        """Tokenizes one line (special tokens added, no padding, truncated at
        ``max_tokens``); ``line`` only names it in an error."""
        try:
            enc = self._tok.encode(text)
        except Exception as e:
            raise ClassifyError(f"cannot tokenize line {line}: {e}") from None
        ids = enc.ids
        truncated_from = None
        if len(ids) == self.max_tokens and enc.overflowing:  # rare: count what was cut
            truncated_from = len(self._untruncated.encode(text).ids)
        # One array for the three inputs: a line costs one NumPy conversion.
        rows = np.array((ids, enc.attention_mask, enc.type_ids), dtype=np.int64)
        return Encoded(rows, truncated_from)


# --------------------------------------------------------------------- labels


def sidecar_path(model: str) -> str:
    """The model's JSON sidecar: the same path with the extension ``.json``."""
    return os.path.splitext(model)[0] + ".json"


def load_labels(path: str) -> List[str]:
    """The ``"labels"`` list (non-empty, of strings, in logit order) of the
    JSON object in ``path``."""

    def err(reason: str) -> ClassifyError:
        return ClassifyError(f"cannot read labels from {path}: {reason}")

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise err(e.strerror or str(e)) from None
    try:
        v = json.loads(text)
    except ValueError as e:
        raise err(f"not valid JSON: {e}") from None
    if not isinstance(v, dict) or "labels" not in v:
        raise err('no "labels" field')
    names = v["labels"]
    if not isinstance(names, list):
        raise err('"labels" is not a list')
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise err(f"label {i} is not a string: {json.dumps(n)}")
    if not names:
        raise err('"labels" is empty')
    return names


def argmax(logits: Sequence[float]) -> int:
    """The index of the largest logit, the first on a tie; a NaN never wins
    unless all are NaN (then 0). As the Rust side's ``labels::argmax``."""
    best = None
    for i, v in enumerate(logits):
        if best is None or v > best[1] or (math.isnan(best[1]) and not math.isnan(v)):
            best = (i, v)
    return 0 if best is None else best[0]


# -------------------------------------------------------------------- targets


class Plan(NamedTuple):
    """Which tokenizer tensor feeds each model input, and which output holds
    the logits."""

    inputs: List[str]
    output: str
    n_logits: Optional[int]

    def feeds(self) -> List[slice]:
        """For each model input in order, its row of ``Encoded.rows``."""
        return [slice(i, i + 1) for i in map(TOKEN_INPUTS.index, self.inputs)]


def make_plan(
    model: str,
    inputs: Sequence[Tuple[str, str, int]],
    outputs: Sequence[Tuple[str, str, int, Optional[int]]],
) -> Plan:
    """Checks a signature (inputs: name, dtype, rank; outputs: name, dtype,
    rank, dim 1): int64 ``[batch, seq]`` token inputs, a float32 ``[batch,
    labels]`` output named ``logits`` (or the only one)."""

    def bad(reason: str) -> ClassifyError:
        return ClassifyError(f"model {model}: {reason}")

    if not inputs:
        raise bad("takes any tensors (is this the identity model?), not token ids")
    for name, dtype, rank in inputs:
        if name not in TOKEN_INPUTS:
            raise bad(
                f"input '{name}' is not one a tokenizer makes "
                "(input_ids, attention_mask, token_type_ids)"
            )
        if dtype != "int64" or rank != 2:
            raise bad(f"input '{name}' is {dtype} of rank {rank}, not int64[batch, seq]")
    named = [o for o in outputs if o[0] == "logits"]
    if named:
        out = named[0]
    elif len(outputs) == 1:
        out = outputs[0]
    else:
        raise bad(f"has {len(outputs)} outputs and none is named 'logits'")
    if out[1] != "float32" or out[2] != 2:
        raise bad(f"output '{out[0]}' is {out[1]} of rank {out[2]}, not float32[batch, labels]")
    return Plan([i[0] for i in inputs], out[0], out[3])


class RemoteTarget:
    """The model served by an agent, called through the tensorwire SDK;
    starts an in-process agent first for an ``inproc://`` URI no agent in
    this process listens on (the CLI's embedded agent)."""

    def __init__(self, uri: str, name: str, model_path: str, intra_threads: int) -> None:
        import tensorwire as tw

        self._agent = None
        client = None
        if uri.startswith("inproc://"):
            try:
                client = tw.connect(uri)  # an agent of that name already runs here
            except tw.ConnectError:
                self._agent = tw.Agent(
                    models={name: model_path}, listen=[uri], intra_threads=intra_threads
                )
        try:
            if client is None:
                client = tw.connect(uri)
            self._client = client
            try:
                self._model = client.model(name)
            except tw.UnknownModel:
                raise ClassifyError(
                    f"the agent at {uri} serves no model '{name}': start it with "
                    f"`tensorwire serve --model {name}=PATH.onnx ...`, or pass --model-name"
                ) from None
        except BaseException:
            self.close()
            raise
        self.plan = make_plan(
            name,
            [(t.name, t.dtype.name, len(t.shape)) for t in self._model.inputs],
            [
                (t.name, t.dtype.name, len(t.shape), t.shape[1] if len(t.shape) > 1 else None)
                for t in self._model.outputs
            ],
        )
        self._feeds = self.plan.feeds()

    def infer(self, rows: np.ndarray) -> List[float]:
        # The inputs in signature order. The outputs are freed (over shm:
        # the arena block goes back) as soon as `out` goes, on return.
        out = self._model.infer([rows[s] for s in self._feeds])
        return out[self.plan.output].ravel().tolist()

    def close(self) -> None:
        client, self._client = getattr(self, "_client", None), None
        self._model = None
        if client is not None:
            client.close()
        agent, self._agent = self._agent, None
        if agent is not None:
            agent.stop(5.0)


class LocalTarget:
    """``--connect local``: ONNX Runtime's Python API, no agent."""

    def __init__(self, model_path: str, intra_threads: int) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise ClassifyError("--connect local needs the onnxruntime package") from None
        so = ort.SessionOptions()
        so.intra_op_num_threads = intra_threads
        so.inter_op_num_threads = 1
        try:
            self._sess = ort.InferenceSession(
                model_path, so, providers=["CPUExecutionProvider"]
            )
        except Exception as e:
            raise ClassifyError(f"cannot load model {model_path}: {e}") from None
        ort_types = {"tensor(int64)": "int64", "tensor(float)": "float32"}

        def dim1(shape: Sequence[object]) -> Optional[int]:
            return shape[1] if len(shape) > 1 and isinstance(shape[1], int) else None

        self.plan = make_plan(
            model_path,
            [(i.name, ort_types.get(i.type, i.type), len(i.shape)) for i in self._sess.get_inputs()],
            [
                (o.name, ort_types.get(o.type, o.type), len(o.shape), dim1(o.shape))
                for o in self._sess.get_outputs()
            ],
        )
        self._feeds = self.plan.feeds()

    def infer(self, rows: np.ndarray) -> List[float]:
        feed = {n: rows[s] for n, s in zip(self.plan.inputs, self._feeds)}
        (out,) = self._sess.run([self.plan.output], feed)
        return out.ravel().tolist()

    def close(self) -> None:
        self._sess = None


# ------------------------------------------------------------------- the run


class LineResult(NamedTuple):
    """One classified line."""

    line: int
    tokens: int
    truncated_from: Optional[int]
    tokenize_ns: int
    total_ns: int
    prediction: int
    logits: List[float]


def run_lines(
    target, tok: TextTokenizer, labels: List[str], lines: Sequence[InputLine],
    on_line: Callable[[LineResult], None],
) -> List[LineResult]:
    """Classifies each line with one request, timing tokenize + request +
    response on this thread (``on_line`` runs after, outside the time)."""
    n = target.plan.n_logits
    if n is not None and n != len(labels):
        raise ClassifyError(
            f"model: output '{target.plan.output}' has {n} logits but the labels name {len(labels)}"
        )
    clock = time.perf_counter_ns
    results = []
    for line in lines:
        t0 = clock()
        enc = tok.encode(line.text, line.number)
        t1 = clock()
        logits = target.infer(enc.rows)
        t2 = clock()
        if len(logits) != len(labels):
            raise ClassifyError(
                f"model gave {len(logits)} logits for line {line.number}, "
                f"but the labels name {len(labels)}"
            )
        r = LineResult(
            line.number, enc.rows.shape[1], enc.truncated_from, t1 - t0, t2 - t0,
            argmax(logits), logits,
        )
        on_line(r)
        results.append(r)
    return results


def avg_ms(results: Sequence[LineResult], skip: int = WARMUP_LINES) -> Optional[float]:
    """The mean time (ms) of the lines after the first ``skip``."""
    rest = results[skip:]
    if not rest:
        return None
    return sum(r.total_ns for r in rest) / 1e6 / len(rest)


# ---------------------------------------------------- JSON as serde_json writes it


def _json_float(v: float) -> str:
    """A float as serde_json (ryu) writes it: shortest round-trip digits,
    scientific only below 1e-5 or from 1e16 (``1e-7``, ``1.5e16``); NaN and
    infinities as null."""
    if not math.isfinite(v):
        return "null"
    r = repr(float(v))
    sign = "-" if r.startswith("-") else ""
    mant, _, exp = r.lstrip("-").partition("e")
    whole, _, frac = mant.partition(".")
    digits = whole + frac
    # value = 0.DIGITS * 10**kk, DIGITS without leading or trailing zeros
    kk = len(whole) + int(exp or 0) - (len(digits) - len(digits.lstrip("0")))
    digits = digits.strip("0")
    if not digits:
        return sign + "0.0"
    if len(digits) <= kk <= 16:
        return sign + digits + "0" * (kk - len(digits)) + ".0"
    if 0 < kk <= 16:
        return sign + digits[:kk] + "." + digits[kk:]
    if -5 < kk <= 0:
        return sign + "0." + "0" * -kk + digits
    m = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{m}e{kk - 1}"


def to_json(v: object) -> str:
    """Compact JSON with sorted keys, as ``serde_json::Value``'s Display."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _json_float(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "{" + ",".join(f"{to_json(k)}:{to_json(v[k])}" for k in sorted(v)) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(to_json(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def single_json(config: str, file: str, results: Sequence[LineResult], labels: List[str]) -> str:
    """The run as the CLI's ``--json``: the summary and every line."""
    return to_json(
        {
            "config": config,
            "file": file,
            "first_ms": results[0].total_ns / 1e6 if results else None,
            "avg_ms": avg_ms(results),
            "lines": [
                {
                    "line": r.line,
                    "ms": r.total_ns / 1e6,
                    "tokenize_ms": r.tokenize_ns / 1e6,
                    "tokens": r.tokens,
                    "truncated_from": r.truncated_from,
                    "prediction": labels[r.prediction] if r.prediction < len(labels) else "?",
                    "logits": r.logits,
                }
                for r in results
            ],
        }
    )


# ---------------------------------------------------------------------- main


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Classify the lines of a text file (the tweet classifier) through "
        "tensorwire, as `tensorwire classify` does, with the same output.",
    )
    p.add_argument(
        "-m", "--model", metavar="MODEL", default=DEFAULT_MODEL,
        help="the classifier ONNX file, loaded into the embedded agent (inproc://) or by "
        "--connect local; its JSON sidecar names the labels (default: %(default)s)",
    )
    p.add_argument(
        "-t", "--tokenizer", metavar="TOKENIZER", default=DEFAULT_TOKENIZER,
        help="a Hugging Face tokenizer.json; padding is turned off and truncation set to "
        f"{MAX_TOKENS} tokens (default: %(default)s)",
    )
    p.add_argument(
        "-f", "--file", metavar="FILE",
        help="the text to classify, one item per line (blank lines are skipped); "
        "'-' or none: standard input",
    )
    p.add_argument(
        "--connect", metavar="URI", default="inproc://",
        help="where the model runs: inproc://[NAME] (an agent started in this process, the "
        "model loaded into it), local (ONNX Runtime directly, no agent), or a running agent "
        "at unix:///PATH, tcp://HOST:PORT or shm://NAME that serves the model as "
        "--model-name (default: %(default)s)",
    )
    p.add_argument(
        "--model-name", metavar="NAME", default=DEFAULT_MODEL_NAME,
        help="the model's name on the agent (default: %(default)s)",
    )
    p.add_argument(
        "--labels", metavar="FILE",
        help='the label names (JSON with a "labels" list in logit order; default: MODEL '
        "with the extension .json)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument(
        "-v", "--verbose", action="store_true",
        help="also print each line's tokenize time and token count",
    )
    p.add_argument(
        "--intra-threads", type=int, default=2, metavar="N",
        help="ONNX Runtime intra-op threads of the embedded agent or local (default: %(default)s)",
    )
    a = p.parse_args(argv)
    if not 1 <= a.intra_threads <= 256:
        p.error("--intra-threads must be in 1..=256")
    return a


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names an agent this script does not start."""
    return uri.startswith(("unix://", "tcp://", "shm://"))


def run(a: argparse.Namespace) -> None:
    file, lines = read_input(a.file)
    if not lines:
        print(f"No lines to classify in {file}", file=sys.stderr if a.json else sys.stdout)
        return
    model = resolve(a.model)
    tok_path = resolve(a.tokenizer)
    try:
        tok = TextTokenizer(tok_path)
    except ClassifyError as e:
        raise ClassifyError(with_setup_hint(str(e), tok_path, a.tokenizer, DEFAULT_TOKENIZER))
    if not is_remote(a.connect) and not os.path.isfile(model):
        raise ClassifyError(
            with_setup_hint(f"cannot load model {model}: no such file", model, a.model, DEFAULT_MODEL)
        )
    labels_path = resolve(a.labels) if a.labels else sidecar_path(model)
    try:
        labels = load_labels(labels_path)
    except ClassifyError as e:
        raise ClassifyError(with_setup_hint(str(e), model, a.model, DEFAULT_MODEL))
    # Every line once up front: warns about truncation, fails early on a line
    # that cannot be tokenized, and warms the tokenizer (as the CLI does).
    for line in lines:
        n = tok.encode(line.text, line.number).truncated_from
        if n is not None:
            print(
                f"{PROG}: warning: line {line.number} of {file} has {n} tokens; "
                f"truncated to {tok.max_tokens}",
                file=sys.stderr,
            )

    if a.connect == "local":
        target = LocalTarget(model, a.intra_threads)
    else:
        target = RemoteTarget(a.connect, a.model_name, model, a.intra_threads)
    try:
        if not a.json:
            print(f"Processing {len(lines)} lines from: {file}", flush=True)

        out = sys.stdout

        def print_line(r: LineResult) -> None:
            if a.json:
                return
            s = f"Line {r.line}: Duration: {r.total_ns / 1e6:.2f} ms Prediction: {labels[r.prediction]}"
            if a.verbose:
                s += f" (tokenize {r.tokenize_ns / 1e6:.3f} ms, {r.tokens} tokens)"
            out.write(s + "\n")  # one write per line, as the CLI's println!
            out.flush()

        results = run_lines(target, tok, labels, lines, print_line)
    finally:
        target.close()
    if a.json:
        print(single_json(a.connect, file, results, labels))
        return
    avg = avg_ms(results)
    if avg is None:
        print(f"Average (after {WARMUP_LINES}th iteration): n/a (only {len(results)} lines)")
    else:
        print(f"Average (after {WARMUP_LINES}th iteration): {avg:.2f} ms")


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    try:
        run(a)
    except BrokenPipeError:  # `| head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ClassifyError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:
        tw = sys.modules.get("tensorwire")
        if tw is None or not isinstance(e, tw.TensorwireError):
            raise
        print(f"{PROG}: error: {e}", file=sys.stderr)  # ConnectError, Timeout, ...
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
