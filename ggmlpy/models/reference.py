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

from .loader import BertConfig

__all__ = ["erf", "erfc", "gelu_erf", "layer_norm", "pad_batch", "encoder_forward", "numpy_forward"]

# W. J. Cody's rational Chebyshev approximations ("Rational Chebyshev approximations for the error
# function", Math. Comp. 23 (1969) 631-637; the CALERF routine). _A/_B: erf on |x| <= 0.5.
# _C/_D: erfc(y) = exp(-y*y) * C(y)/D(y), fitted on [0.5, 4]; measured against math.erfc it stays
# within 5e-12 absolute on [0, 0.5] and 2e-16 absolute beyond 4 (where exp(-y*y) < 1.2e-7), so
# one rational serves every y >= 0.
_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03, 1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
      2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
      2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
      1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
      3.43936767414372164e03, 1.23033935480374942e03)
_ERFC_CLIP = 27.5  # exp(-27.5**2) underflows to 0: erfc(y) is 0 (and 2 at -y) beyond, exactly
_CHUNK = 1 << 15   # elements per step of the element-wise loops (keeps temporaries in cache)


def _erfc_nonneg(y: np.ndarray) -> np.ndarray:
    """erfc(y) for float64 ``y >= 0`` (a new array; in-place Horner to limit temporaries)."""
    y = np.minimum(y, _ERFC_CLIP)
    num = y * _C[8]
    den = y.copy()
    for i in range(7):
        num += _C[i]
        num *= y
        den += _D[i]
        den *= y
    num += _C[7]
    den += _D[7]
    num /= den
    num *= np.exp(-(y * y))
    return num


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function ``1 - erf(x)``, element-wise, in pure NumPy.

    Float64 evaluation of Cody's rational approximation: absolute error below 5e-12 everywhere
    (below 1e-15 for ``|x| >= 0.5``) and relative error below 5e-12 for ``x < 6``, far inside
    float32 rounding. ``erfc(-x) = 2 - erfc(x)``; ``erfc(+inf) = 0``, ``erfc(-inf) = 2``; NaN
    propagates.

    Args:
        x: array-like of any shape and real dtype.

    Returns:
        float64 ``np.ndarray`` of the same shape.
    """
    x = np.asarray(x, dtype=np.float64)
    r = _erfc_nonneg(np.abs(x))
    return np.where(x < 0, 2.0 - r, r)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, element-wise, in pure NumPy (mirrors C ``erf``).

    Float64 evaluation of Cody's rational approximations: an odd rational for ``|x| <= 0.5``
    (relative error ~1e-16, so tiny arguments keep full precision) and ``1 - erfc(|x|)`` beyond
    (absolute error below 1e-15). ``erf(+-inf) = +-1``; NaN propagates.

    Args:
        x: array-like of any shape and real dtype.

    Returns:
        float64 ``np.ndarray`` of the same shape.
    """
    x = np.asarray(x, dtype=np.float64)
    xs = np.clip(x, -0.5, 0.5)
    q = xs * xs
    num = _A[4] * q
    den = q.copy()
    for i in range(3):
        num = (num + _A[i]) * q
        den = (den + _B[i]) * q
    small = xs * (num + _A[3]) / (den + _B[3])
    large = np.copysign(1.0 - _erfc_nonneg(np.abs(x)), x)
    return np.where(np.abs(x) <= 0.5, small, large)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact GELU ``0.5 * x * (1 + erf(x / sqrt(2)))`` (mirrors ``ggml_gelu_erf``).

    Computed as ``0.5 * x * erfc(-x / sqrt(2))``, which has no cancellation for negative ``x``, in
    float64 chunks of 32768 elements, rounded once to float32: within 0.51 float32 ulp of the
    exact value over [-20, 20] (measured against ``math.erfc``). As in C, ``gelu_erf(-inf)`` is
    NaN (``-inf * 0``).

    Args:
        x: float32 array of any shape.

    Returns:
        float32 array of the same shape (a new array).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    xf, of = x.reshape(-1), out.reshape(-1)
    for s in range(0, xf.size, _CHUNK):
        xc = xf[s:s + _CHUNK].astype(np.float64)
        z = xc * -np.sqrt(0.5)
        r = _erfc_nonneg(np.abs(z))
        phi2 = np.where(z < 0, 2.0 - r, r)  # 1 + erf(x / sqrt(2))
        phi2 *= xc
        phi2 *= 0.5
        of[s:s + _CHUNK] = phi2
    return out


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
