"""Tests of models/build_minilm.py (run with `.venv/bin/python -m pytest models`).

The graphs are built into a temporary directory (once, plus once more for the
determinism check), so the tests neither need nor touch models/build.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_minilm as minilm  # noqa: E402
import minilm_reference as ref  # noqa: E402

TOL = 1e-4
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Fixed token inputs (the shipped tokenizer's output): row 0 is the sentence
# pair "This is a test." / "It works great today!" ([CLS] a [SEP] b [SEP],
# token types 0/1), row 1 "You are a clown" padded with [PAD] = 0, so both the
# token-type path and masking are exercised.
IDS = np.array(
    [
        [101, 2023, 2003, 1037, 3231, 1012, 102, 2009, 2573, 2307, 2651, 999, 102],
        [101, 2017, 2024, 1037, 15912, 102, 0, 0, 0, 0, 0, 0, 0],
    ],
    np.int64,
)
MASK = np.array([[1] * 13, [1] * 6 + [0] * 7], np.int64)
TYPES = np.array([[0] * 7 + [1] * 6, [0] * 13], np.int64)
FEED = {"input_ids": IDS, "attention_mask": MASK, "token_type_ids": TYPES}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("minilm_a")
    minilm.build(out, force=True, quiet=True)
    return out


@pytest.fixture(scope="module")
def cfg() -> ref.Config:
    return ref.load_config()


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return ref.load_weights()


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def graph_weights(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The graph's own initializers, mapped back to the checkpoint's names and layout.

    Returns (encoder weights keyed like model.safetensors, the rest: head.*).
    """
    model = onnx.load(str(path))
    enc, rest = {}, {}
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if t.name.startswith("const."):
            continue
        if t.name.startswith("head."):
            rest[t.name] = a
        elif t.name.endswith(".weight.T"):
            enc[t.name[: -len(".T")]] = a.T
        else:
            enc[t.name] = a
    return enc, rest


def test_signature(built: Path) -> None:
    for name, outs in (
        ("minilm_l6.onnx", [("last_hidden_state", ["batch", "seq", 384]), ("sentence_embedding", ["batch", 384])]),
        ("tweet_classifier.onnx", [("logits", ["batch", 3])]),
    ):
        sess = session(built / name)
        assert [(i.name, i.type, i.shape) for i in sess.get_inputs()] == [
            (n, "tensor(int64)", ["batch", "seq"]) for n in INPUTS
        ]
        assert [(o.name, o.type, o.shape) for o in sess.get_outputs()] == [
            (n, "tensor(float)", shape) for n, shape in outs
        ]
        model = onnx.load(str(built / name), load_external_data=False)
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]


def test_graph_holds_every_weight(built: Path, weights: dict[str, np.ndarray]) -> None:
    enc, _ = graph_weights(built / "minilm_l6.onnx")
    # Not used by sentence-transformers: the position-id buffer and BERT's pooler.
    unused = {k for k in weights if k == "embeddings.position_ids" or k.startswith("pooler.")}
    assert unused == {"embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"}
    assert sorted(enc) == sorted(set(weights) - unused)
    for k, v in enc.items():
        assert np.array_equal(v, weights[k]), k


def test_encoder_matches_numpy(built: Path, cfg: ref.Config) -> None:
    """ORT vs the numpy forward pass on the graph's own initializers, padded batch of 2."""
    path = built / "minilm_l6.onnx"
    enc, _ = graph_weights(path)
    hidden, emb = session(path).run(None, FEED)
    want_hidden = ref.encode(enc, cfg, IDS, MASK, TYPES)
    want_emb = ref.pool_normalize(want_hidden, MASK)
    assert hidden.shape == (2, 13, 384) and emb.shape == (2, 384)
    assert np.max(np.abs(hidden - want_hidden)) <= TOL
    assert np.max(np.abs(emb - want_emb)) <= TOL
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_classifier_matches_numpy(built: Path, cfg: ref.Config) -> None:
    path = built / "tweet_classifier.onnx"
    enc, head = graph_weights(path)
    (logits,) = session(path).run(None, FEED)
    emb = ref.sentence_embedding(enc, cfg, IDS, MASK, TYPES)
    want = emb @ head["head.weight.T"].astype(np.float64) * float(head["head.scale"])
    assert logits.shape == (2, 3)
    assert np.max(np.abs(logits - want)) <= TOL


def test_embedding_matches_safetensors_reference(
    built: Path, cfg: ref.Config, weights: dict[str, np.ndarray]
) -> None:
    """The chain end to end: the checkpoint's tensors straight from model.safetensors."""
    hidden, emb = session(built / "minilm_l6.onnx").run(None, FEED)
    want_hidden = ref.encode(weights, cfg, IDS, MASK, TYPES)
    assert np.max(np.abs(hidden - want_hidden)) <= TOL
    assert np.max(np.abs(emb - ref.pool_normalize(want_hidden, MASK))) <= TOL


def test_padding_does_not_change_results(built: Path) -> None:
    """Batch 1 unpadded == that row inside the padded batch (classifier and encoder)."""
    n = int(MASK[1].sum())
    single = {k: v[1:2, :n] for k, v in FEED.items()}
    (batch_logits,) = session(built / "tweet_classifier.onnx").run(None, FEED)
    (one_logits,) = session(built / "tweet_classifier.onnx").run(None, single)
    assert np.max(np.abs(one_logits[0] - batch_logits[1])) <= TOL
    enc = session(built / "minilm_l6.onnx")
    batch_hidden, batch_emb = enc.run(None, FEED)
    one_hidden, one_emb = enc.run(None, single)
    assert np.max(np.abs(one_emb[0] - batch_emb[1])) <= TOL
    assert np.max(np.abs(one_hidden[0] - batch_hidden[1, :n])) <= TOL


def test_head_is_zero_shot(built: Path, cfg: ref.Config, weights: dict[str, np.ndarray]) -> None:
    """The head's rows are the model's own embeddings of the class descriptions."""
    _, head = graph_weights(built / "tweet_classifier.onnx")
    rows = head["head.weight.T"].T
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-6)
    assert np.max(np.abs(rows - minilm.head_rows(weights, cfg, minilm.CLASS_DESCRIPTIONS))) <= 1e-6
    assert float(head["head.scale"]) == minilm.SCALE
    info = json.loads((built / "tweet_classifier.json").read_text())
    assert info["labels"] == ["offensive-language", "hate-speech", "neither"]
    assert info["zero_shot"] is True
    assert info["class_descriptions"] == minilm.CLASS_DESCRIPTIONS
    assert info["scale"] == minilm.SCALE
    assert info["sample"] == "examples/classifier/tweets.txt"


def test_accuracy_on_sample(built: Path) -> None:
    """ORT on the sample agrees with the accuracy and confusion matrix recorded in the JSON."""
    lines, truth = minilm.read_sample()
    sess = session(built / "tweet_classifier.onnx")
    pred = []
    for v in minilm.token_vectors(lines):
        (logits,) = sess.run(None, {k: np.array([v[k]], np.int64) for k in INPUTS})
        pred.append(int(logits[0].argmax()))
    ev = minilm.evaluate(pred, truth)
    info = json.loads((built / "tweet_classifier.json").read_text())
    assert info["accuracy_on_sample"] == ev["accuracy"]
    assert info["confusion_on_sample"]["matrix"] == ev["confusion"]["matrix"]
    assert info["sample_size"] == len(lines) >= 90
    assert ev["accuracy"] > 0.5  # well above chance (1/3)


def test_tokenizer_copied(built: Path) -> None:
    shipped = minilm.model_files()["tokenizer"].read_bytes()
    assert (built / "minilm_tokenizer.json").read_bytes() == shipped


def test_token_vectors_up_to_date() -> None:
    """examples/classifier/tweets.tokens.json == a fresh run of `tokenizers` (no padding, truncation 512)."""
    lines = minilm.read_lines(minilm.SAMPLE)
    fresh = minilm.token_vectors_bytes(lines)
    committed = minilm.TOKEN_VECTORS.read_bytes()
    assert json.loads(committed) == json.loads(fresh), "run: .venv/bin/python models/build_minilm.py --write-token-vectors"
    assert committed == fresh
    entries = json.loads(committed)
    assert [e["text"] for e in entries] == lines
    for e in entries:
        n = len(e["input_ids"])
        assert e["input_ids"][0] == 101 and e["input_ids"][-1] == 102  # [CLS] ... [SEP]
        assert 0 not in e["input_ids"]  # no [PAD]: padding is off
        assert e["attention_mask"] == [1] * n and e["token_type_ids"] == [0] * n


def test_deterministic(built: Path, tmp_path: Path) -> None:
    minilm.build(tmp_path, force=True, quiet=True)
    for p in minilm.outputs(built).values():
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), p.name


def test_cache(built: Path) -> None:
    files = minilm.outputs(built)
    before = {k: p.stat().st_mtime_ns for k, p in files.items()}
    assert minilm.up_to_date(built)
    minilm.build(built, quiet=True)
    assert {k: p.stat().st_mtime_ns for k, p in files.items()} == before
    # A different builder hash (changed script, weights, tokenizer or sample) forces a rebuild.
    assert not minilm.up_to_date(built, key="0" * 64)
