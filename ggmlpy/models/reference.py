"""Plain NumPy float32 forward pass of a sentence-transformers BERT encoder (reference, baseline).

This is the readable specification that ggmlpy's graph-based model (``ggmlpy.models.bert``) is
checked against, and the baseline of ``scripts/bench_minilm.py``. It uses only NumPy: no ggmlpy
tensors, graphs or backends.

The pass, for a batch of ``n`` token-id lists padded to the longest length ``L`` (hidden width
``H``, ``heads`` heads of size ``d = H / heads``; NumPy shapes, ggml ``ne`` is the reverse):

1. embeddings: ``word[ids] + position[0..L-1] + token_type[0]``, then LayerNorm -> ``[n, L, H]``;
2. per layer: self-attention (``softmax(q k^T / sqrt(d) + mask) v`` with an additive mask that is
   0 on real tokens and the float32 minimum on padding keys), output projection, residual +
   LayerNorm; feed-forward ``W2 gelu(W1 x)`` with the exact erf GELU, residual + LayerNorm;
3. pooling over real tokens (mean, or cls/max as the config says) -> ``[n, H]``;
4. L2 normalisation when ``config.normalize``.

Every tensor is float32; only the GELU's erfc is evaluated in float64 (see :func:`gelu_erf`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ggmlpy.core.special import erf, erfc, gelu_erf
from ggmlpy.models.loader import BertConfig

__all__ = ["erf", "erfc", "gelu_erf", "layer_norm", "pad_batch", "encoder_forward", "numpy_forward"]

def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis (mirrors ``ggml_norm`` then ``* weight + bias``).

    ``(x - mean) / sqrt(var + eps) * weight + bias`` with the biased variance, all in float32.

    Args:
        x: float32 ``[..., H]`` (ggml ``ne = [H, ...]``).
        weight, bias: float32 ``[H]``.
        eps: added to the variance (the config's ``layer_norm_eps``).

    Returns:
        float32 array shaped like ``x``.
    """
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
    xc = x - mean
    var = np.mean(xc * xc, axis=-1, keepdims=True, dtype=np.float32)
    return xc / np.sqrt(var + np.float32(eps)) * weight + bias


def pad_batch(token_ids_batch: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token-id lists to the longest one.

    Args:
        token_ids_batch: ``n`` non-empty lists of token ids.
        pad_id: id written into padding positions.

    Returns:
        ``(ids, mask)``: int64 ``[n, L]`` ids and float32 ``[n, L]`` mask (1 real token, 0 padding),
        ``L`` the longest length (ggml ``ne = [L, n]``).

    Raises:
        ValueError: the batch is empty or holds an empty list.
    """
    n = len(token_ids_batch)
    if n == 0:
        raise ValueError("token_ids_batch is empty")
    lengths = [len(t) for t in token_ids_batch]
    if min(lengths) == 0:
        raise ValueError(f"token_ids_batch[{lengths.index(0)}] is empty")
    length = max(lengths)
    ids = np.full((n, length), pad_id, dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.float32)
    for i, t in enumerate(token_ids_batch):
        ids[i, : len(t)] = t
        mask[i, : len(t)] = 1.0
    return ids, mask


def _linear(x: np.ndarray, w: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """``x @ W.T + b`` for the PyTorch-layout linear layer ``name`` (weight ``[out, in]``).

    ``x`` ``[..., in]`` is multiplied as one 2-D matrix (a single GEMM, faster than NumPy's
    batched matmul) and reshaped back to ``[..., out]``.
    """
    weight = w[name + ".weight"]
    y = x.reshape(-1, x.shape[-1]) @ weight.T
    y += w[name + ".bias"]
    return y.reshape(*x.shape[:-1], weight.shape[0])


def encoder_forward(weights: Mapping[str, np.ndarray], config: BertConfig, ids: np.ndarray,
                    mask: np.ndarray, collect: list[np.ndarray] | None = None) -> np.ndarray:
    """BERT embeddings + encoder layers: the ``last_hidden_state``.

    Args:
        weights: float32 arrays named as in :func:`ggmlpy.models.loader.load_weights`.
        config: the model's :class:`BertConfig` (``hidden_act`` must be ``"gelu"``).
        ids: int ``[n, L]`` token ids (ggml ``ne = [L, n]``); token types are all 0 and
            positions ``0..L-1``.
        mask: float32 ``[n, L]``, 1 on real tokens and 0 on padding.
        collect: if a list, the embedding output and each layer's output (float32 ``[n, L, H]``)
            are appended to it, for layer-by-layer debugging.

    Returns:
        float32 ``[n, L, H]`` (ggml ``ne = [H, L, n]``); rows at padding positions are computed
        but meaningless.

    Raises:
        ValueError: ``hidden_act`` is not ``"gelu"``, ``L`` exceeds ``max_position_embeddings``,
            ``ids``/``mask`` shapes differ, or an id is outside ``[0, vocab_size)``.
    """
    if config.hidden_act != "gelu":
        raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (only exact 'gelu')")
    if ids.ndim != 2 or ids.shape != mask.shape:
        raise ValueError(f"ids {ids.shape} and mask {mask.shape} must both be [n, L]")
    n, length = ids.shape
    if length > config.max_position_embeddings:
        raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}")
    if ids.size and (ids.min() < 0 or ids.max() >= config.vocab_size):
        raise ValueError(f"token ids must lie in [0, {config.vocab_size}), got "
                         f"[{ids.min()}, {ids.max()}]")
    heads, d, hidden, eps = (config.num_attention_heads, config.head_size, config.hidden_size,
                             config.layer_norm_eps)
    w = weights

    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][:length]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    if collect is not None:
        collect.append(x)

    # additive key mask [n, 1, 1, L]: 0 for real tokens, float32 min for padding (as transformers)
    neg = np.finfo(np.float32).min
    key_bias = np.where(mask > 0, np.float32(0.0), neg).astype(np.float32)[:, None, None, :]
    scale = np.float32(1.0 / np.sqrt(d))

    def split_heads(t: np.ndarray) -> np.ndarray:  # [n, L, H] -> [n, heads, L, d]
        return t.reshape(n, length, heads, d).transpose(0, 2, 1, 3)

    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."
        q = split_heads(_linear(x, w, p + "attention.self.query"))
        k = split_heads(_linear(x, w, p + "attention.self.key"))
        v = split_heads(_linear(x, w, p + "attention.self.value"))
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale + key_bias       # [n, heads, L, L]
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(n, length, hidden)
        attn = _linear(ctx, w, p + "attention.output.dense")
        x = layer_norm(attn + x, w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"], eps)
        h = gelu_erf(_linear(x, w, p + "intermediate.dense"))
        h = _linear(h, w, p + "output.dense")
        x = layer_norm(h + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        if collect is not None:
            collect.append(x)
    return x


def _pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """Pool ``[n, L, H]`` over real tokens to ``[n, H]`` as sentence-transformers' Pooling does."""
    if mode == "cls":
        return hidden[:, 0, :]
    if mode == "max":
        masked = np.where(mask[:, :, None] > 0, hidden, np.float32(-1e9))
        return masked.max(axis=1)
    if mode == "mean":
        summed = (hidden * mask[:, :, None]).sum(axis=1, dtype=np.float32)
        counts = np.maximum(mask.sum(axis=1, keepdims=True, dtype=np.float32), np.float32(1e-9))
        return summed / counts
    raise ValueError(f"pooling mode {mode!r} is not one of 'mean', 'cls', 'max'")


def numpy_forward(weights: Mapping[str, np.ndarray], config: BertConfig,
                  token_ids_batch: Sequence[Sequence[int]]) -> np.ndarray:
    """Sentence embeddings of a batch of token-id lists, in plain NumPy float32 (synchronous).

    Pads to the longest list (pad id ``config.pad_token_id``), runs :func:`encoder_forward`,
    pools as ``config.pooling_mode`` says (mean over real tokens for MiniLM) and, when
    ``config.normalize``, divides each row by ``max(||row||_2, 1e-12)``.

    Args:
        weights: float32 arrays from :func:`ggmlpy.models.loader.load_weights`.
        config: the model's :class:`BertConfig`.
        token_ids_batch: ``n`` lists of ids with [CLS]/[SEP], each at most
            ``max_position_embeddings`` long (e.g. from ``BertTokenizer.encode_batch``).

    Returns:
        float32 ``[n, hidden_size]`` (ggml ``ne = [hidden_size, n]``).

    Raises:
        ValueError: empty batch or sequence, a sequence too long, an id outside the vocabulary,
            or an unsupported config.
    """
    ids, mask = pad_batch(token_ids_batch, config.pad_token_id)
    hidden = encoder_forward(weights, config, ids, mask)
    emb = _pool(hidden, mask, config.pooling_mode)
    if config.normalize:
        norm = np.sqrt(np.sum(emb * emb, axis=1, keepdims=True, dtype=np.float32))
        emb = emb / np.maximum(norm, np.float32(1e-12))
    return np.ascontiguousarray(emb, dtype=np.float32)
