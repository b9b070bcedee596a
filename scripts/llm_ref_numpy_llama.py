"""A float64 NumPy forward pass of ``tests/data/tiny_llama_bpe.gguf``, to cross-check llama.cpp.

Reference-tool code for ``make_llm_reference.py`` only (never imported by ggmlpy). It spells out
the ``llama`` graph that llama.cpp builds (llama.cpp src/models/llama.cpp, llm_build_llama) for
this F32 file: RMSNorm (eps from the file) times the norm weight, RoPE in NORM mode (rotating
adjacent pairs (x[2i], x[2i+1]) by pos * base**(-2i/head_dim)), grouped-query attention (query head
h reads KV head h // (n_head / n_head_kv)), causal softmax with scale 1/sqrt(head_dim), SwiGLU FFN
(silu(gate) * up, then down), final RMSNorm and the output tied to ``token_embd``.
"""

from __future__ import annotations

import numpy as np


def load_weights(path: str) -> dict[str, np.ndarray]:
    """Tensors of the GGUF as float64 arrays in NumPy order (ne reversed)."""
    import gguf

    reader = gguf.GGUFReader(path)
    return {t.name: np.array(t.data, dtype=np.float64) for t in reader.tensors}


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_norm(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    d = x.shape[-1]
    theta = pos[:, None] * base ** (-2.0 * np.arange(d // 2) / d)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def forward(w: dict[str, np.ndarray], ids: np.ndarray, hp: dict) -> np.ndarray:
    """Logits (n_tokens, n_vocab) float64 for ``ids`` at positions 0..n_tokens-1."""
    t = len(ids)
    nh, nkv, hd = hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    eps, base = hp["rms_eps"], hp["rope_base"]
    pos = np.arange(t, dtype=np.float64)
    x = w["token_embd.weight"][np.asarray(ids)]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for layer in range(hp["n_layer"]):
        p = f"blk.{layer}."
        h = _rms(x, w[p + "attn_norm.weight"], eps)
        q = _rope_norm((h @ w[p + "attn_q.weight"].T).reshape(t, nh, hd), pos, base)
        k = _rope_norm((h @ w[p + "attn_k.weight"].T).reshape(t, nkv, hd), pos, base)
        v = (h @ w[p + "attn_v.weight"].T).reshape(t, nkv, hd)
        k = np.repeat(k, nh // nkv, axis=1)
        v = np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(t, nh * hd)
        x = x + o @ w[p + "attn_output.weight"].T
        h = _rms(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
    return _rms(x, w["output_norm.weight"], eps) @ w["token_embd.weight"].T
