"""Float64 NumPy forward pass of the decoder architectures of :mod:`.arch` (the tests' referee).

No ggmlpy tensors, graphs or backends: the weights are dequantized once with
:func:`ggmlpy.quants.dequantize` and every step is a float64 NumPy expression of what llama.cpp's
graph computes (``llm_build_gemma3``, ``llm_build_llama``, ``llm_build_qwen2`` in llama.cpp's
``src/models/``). For ``T`` tokens at positions ``pos`` (NumPy shapes; ggml ``ne`` is the
reverse):

1. ``x = token_embd[tokens]`` ``(T, n_embd)``, times ``sqrt(n_embd)`` for gemma;
2. per block ``il``: ``h = rms_norm(x) * attn_norm``; ``q = h Wq^T (+ bq)`` ``(T, n_head, d)``,
   ``k``, ``v`` likewise with ``n_head_kv`` heads; gemma: ``q = rms_norm(q) * attn_q_norm`` and the
   same for ``k`` (per head, over ``d``); RoPE (mode and base of the layer) on q and k;
   ``a = softmax(attn_scale * q k^T + mask) v`` per head, head ``h`` reading KV head
   ``h // (n_head / n_head_kv)``, the mask ``-inf`` where the key comes after the query and, on
   sliding-window layers, where ``pos_q - pos_k >= n_swa`` (llama.cpp ``is_masked_swa``,
   ``LLAMA_SWA_TYPE_STANDARD``); ``o = a Wo^T``; gemma: ``o = rms_norm(o) * post_attention_norm``;
   ``x = x + o``; ``h = rms_norm(x) * ffn_norm``; ``f = Wdown (act(Wgate h) * (Wup h))`` with
   ``act`` the tanh GELU (gemma) or SiLU (llama/qwen2); gemma: ``f = rms_norm(f) *
   post_ffw_norm``; ``x = x + f``;
3. ``logits = (rms_norm(x) * output_norm) Wout^T`` with ``Wout = output`` or ``token_embd``
   (tied), ``(T, n_vocab)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ggmlpy.models.llm.arch import ROPE_NEOX, HParams, block_tensor_names

__all__ = ["rms_norm", "rope", "gelu_tanh", "silu", "attention", "forward", "load_weights_f64"]


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps)`` over the last axis, float64 (mirrors ``ggml_rms_norm``)."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, mode: int) -> np.ndarray:
    """Rotary position embedding of ``x`` ``(T, n_head, d)`` at positions ``pos`` ``(T,)``
    (mirrors ``ggml_rope_ext`` without YaRN, freq_scale 1): the first ``n_rot`` elements of each
    head rotate by ``pos * base^(-2i/n_rot)``, pairs ``(2i, 2i+1)`` in NORMAL mode and
    ``(i, i + n_rot/2)`` in NEOX mode; the rest pass through. float64 result."""
    x = np.asarray(x, np.float64)
    half = n_rot // 2
    theta = np.asarray(pos, np.float64)[:, None] * base ** (-2.0 * np.arange(half) / n_rot)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]      # (T, 1, half)
    out = x.copy()
    if mode == ROPE_NEOX:
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return out


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (ggml's ``gelu``), float64."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x: np.ndarray) -> np.ndarray:
    """``x / (1 + exp(-x))`` (ggml's ``silu``), float64."""
    return x / (1.0 + np.exp(-x))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos_q: np.ndarray,
              pos_k: np.ndarray, scale: float, n_swa: int = 0) -> np.ndarray:
    """Grouped-query causal attention, float64.

    Args:
        q: ``(T, n_head, d_k)``; k: ``(S, n_head_kv, d_k)``; v: ``(S, n_head_kv, d_v)``
            (``n_head % n_head_kv == 0``; head ``h`` reads KV head ``h // (n_head/n_head_kv)``).
        pos_q, pos_k: positions ``(T,)`` and ``(S,)``; a key is visible when ``pos_k <= pos_q``
            and, with ``n_swa > 0``, ``pos_q - pos_k < n_swa``.
        scale: factor of ``q k^T`` before the softmax.

    Returns:
        ``(T, n_head * d_v)``: the heads side by side (as llama.cpp's ``cur`` before ``wo``).
    """
    n_head, n_kv = q.shape[1], k.shape[1]
    g = n_head // n_kv
    kk = np.repeat(k, g, axis=1)                                   # (S, n_head, d)
    vv = np.repeat(v, g, axis=1)
    s = np.einsum("thd,shd->hts", q, kk) * scale                   # (n_head, T, S)
    pq, pk = np.asarray(pos_q)[:, None], np.asarray(pos_k)[None, :]
    visible = pk <= pq
    if n_swa > 0:
        visible &= (pq - pk) < n_swa
    s = np.where(visible[None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", p, vv)                         # (T, n_head, d_v)
    return out.reshape(out.shape[0], -1)


def forward(hp: HParams, weights: Mapping[str, np.ndarray], tokens: Sequence[int],
            pos: Sequence[int] | None = None) -> np.ndarray:
    """Logits of every token of one sequence, float64 (see the module docstring).

    Args:
        hp: the hyperparameters (:meth:`HParams.from_metadata`).
        weights: GGUF tensor name -> float64/float32 array of NumPy shape ``ne[::-1]`` (e.g.
            ``blk.0.attn_q.weight`` ``(n_head*d, n_embd)``), as :func:`load_weights_f64` gives.
        tokens: ``T`` token ids (rows of ``token_embd``).
        pos: their positions (default ``0..T-1``).

    Returns:
        float64 ``(T, n_vocab)`` (ggml ``ne = [n_vocab, T]``).

    Raises:
        KeyError: a tensor the architecture needs is missing from ``weights``.
        IndexError: a token id outside the vocabulary.
    """
    spec = hp.arch
    tokens = np.asarray(tokens, np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= hp.n_vocab):
        raise IndexError(f"token ids must be in 0..{hp.n_vocab - 1}")
    pos = np.arange(len(tokens)) if pos is None else np.asarray(pos, np.int64)
    w = {n: np.asarray(a, np.float64) for n, a in weights.items()}
    T, d, dv = len(tokens), hp.head_dim_k, hp.head_dim_v
    x = w["token_embd.weight"][tokens]
    if spec.embd_scale:
        x = x * math.sqrt(hp.n_embd)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        h = rms_norm(x, hp.eps) * w[b + "attn_norm.weight"]
        q, k, v = (h @ w[b + f"attn_{n}.weight"].T for n in "qkv")
        for n, t in (("q", q), ("k", k), ("v", v)):
            bias = w.get(b + f"attn_{n}.bias")
            if bias is not None:
                t += bias
        q = q.reshape(T, hp.n_head, d)
        k = k.reshape(T, hp.n_head_kv, d)
        v = v.reshape(T, hp.n_head_kv, dv)
        if spec.qk_norm:
            q = rms_norm(q, hp.eps) * w[b + "attn_q_norm.weight"]
            k = rms_norm(k, hp.eps) * w[b + "attn_k_norm.weight"]
        base = hp.layer_rope_base(il)
        q = rope(q, pos, hp.n_rot, base, spec.rope_mode)
        k = rope(k, pos, hp.n_rot, base, spec.rope_mode)
        a = attention(q, k, v, pos, pos, hp.attn_scale, hp.n_swa if hp.is_swa(il) else 0)
        o = a @ w[b + "attn_output.weight"].T
        if spec.post_norms:
            o = rms_norm(o, hp.eps) * w[b + "post_attention_norm.weight"]
        x = x + o
        h = rms_norm(x, hp.eps) * w[b + "ffn_norm.weight"]
        gate = h @ w[b + "ffn_gate.weight"].T
        up = h @ w[b + "ffn_up.weight"].T
        act = gelu_tanh(gate) if spec.ffn == "geglu" else silu(gate)
        f = (act * up) @ w[b + "ffn_down.weight"].T
        if spec.post_norms:
            f = rms_norm(f, hp.eps) * w[b + "post_ffw_norm.weight"]
        x = x + f
    x = rms_norm(x, hp.eps) * w["output_norm.weight"]
    out = w.get("output.weight", w["token_embd.weight"])
    return x @ out.T


def load_weights_f64(path: str, names: Sequence[str] | None = None) -> tuple[HParams, dict[str, np.ndarray]]:
    """The hyperparameters and the dequantized float64 weights of a GGUF decoder file.

    Args:
        path: the ``.gguf`` file (read with gguf-py's ``GGUFReader``, memory-mapped).
        names: tensors to dequantize (default: all).

    Returns:
        ``(hp, weights)``: weights by GGUF name, float64 arrays of NumPy shape ``ne[::-1]``.

    Raises:
        ValueError: an unsupported architecture or a missing key. ImportError: no ``gguf``.
    """
    from ggmlpy.models.llm.gguf_file import read_decoder_gguf
    from ggmlpy.quants import dequantize

    meta, tensors = read_decoder_gguf(path)
    hp = HParams.from_metadata(meta, tensors["token_embd.weight"].ne[1], path)
    want = list(tensors) if names is None else list(names)
    weights = {n: dequantize(tensors[n].data, tensors[n].type, tensors[n].ne).astype(np.float64)
               for n in want}
    for il in range(hp.n_layer):
        for n in block_tensor_names(hp.arch, il):
            if names is None and n not in weights:
                raise ValueError(f"{path}: missing tensor {n!r}")
    return hp, weights
