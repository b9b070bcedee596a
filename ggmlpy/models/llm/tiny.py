"""Tiny random-weight decoder GGUF files for tests (every architecture of :mod:`.arch`).

:func:`write_tiny_gguf` writes a complete llama.cpp-style file with :func:`ggmlpy.gguf_save`:
the ``{arch}.*`` hyperparameters, a minimal tokenizer section (``tokenizer.ggml.model``
``"llama"`` with ``n_vocab`` tokens: ``<pad> <eos> <bos> <unk>``, the 256 byte tokens ``<0x00>``..
``<0xFF>`` (so any text encodes, through byte fallback), then ``\u2581`` and ``\u2581t<i>``
pieces; scores and token types; bos/eos/unk/pad ids) and the tensors, quantized to the types the real models use
(:data:`QUANT_TYPES`) or all F32. The weights are N(0, 1/fan_in) matrices and ``1 + 0.1 N(0, 1)``
norm weights from ``numpy.random.default_rng(seed)``, so the same call writes the same file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ggmlpy.core.types import Type
from ggmlpy.models.llm.arch import arch_spec

__all__ = ["TinyConfig", "TINY", "QUANT_TYPES", "write_tiny_gguf"]


@dataclass(frozen=True)
class TinyConfig:
    """Sizes of a tiny model (element counts): ``n_layer``, ``n_embd``, ``n_head``,
    ``n_head_kv``, ``head_dim`` (may differ from ``n_embd / n_head``, as in gemma3), ``n_ff``,
    ``n_vocab``, ``n_ctx_train``, ``n_swa`` (sliding window, gemma3 only), ``tied`` (no
    ``output.weight``: the output reuses ``token_embd``)."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int = 320
    n_ctx_train: int = 512
    n_swa: int = 0
    tied: bool = True


#: The default tiny shape per architecture. gemma3: 7 layers, so that layer 5 is global and
#: 0-4 and 6 are local; a window of 8 tokens; 4 query heads on 2 KV heads of 64 (q rows 256 !=
#: n_embd 64, as the real model's 1024 != 640); ``n_ff`` and ``n_head * head_dim`` of 256 so
#: that ``attn_output``/``ffn_down`` can take the K-quants (256-element blocks).
TINY: dict[str, TinyConfig] = {
    "gemma3": TinyConfig(n_layer=7, n_embd=64, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
                         n_swa=8, tied=True),
    "llama": TinyConfig(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
                        tied=False),
    "qwen2": TinyConfig(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
                        tied=True),
}

#: RoPE base written per architecture (the real models' values: Gemma 3 and Qwen2 1e6)
ROPE_BASE: dict[str, float] = {"gemma3": 1e6, "llama": 10000.0, "qwen2": 1e6}

#: Tensor types of the quantized tiny files (by suffix; the real gemma3 270M Q4_K_M file's mix).
#: A type whose block does not divide ``ne[0]`` falls back to Q8_0, then F16.
QUANT_TYPES: dict[str, Type] = {
    "token_embd.weight": Type.Q8_0, "output.weight": Type.Q8_0,
    "attn_q.weight": Type.Q5_0, "attn_k.weight": Type.Q5_0, "attn_v.weight": Type.Q8_0,
    "attn_output.weight": Type.Q4_K, "ffn_gate.weight": Type.Q5_0, "ffn_up.weight": Type.Q5_0,
    "ffn_down.weight": Type.Q6_K,
}


def _type_for(name: str, ne0: int, quantized: bool) -> Type:
    if not quantized or name.endswith(("norm.weight", ".bias")):
        return Type.F32
    t = QUANT_TYPES.get(name.split(".", 2)[-1] if name.startswith("blk.") else name, Type.F16)
    for cand in (t, Type.Q8_0, Type.F16):
        if ne0 % cand.blck_size == 0:
            return cand
    return Type.F32  # pragma: no cover - F16's block is 1


def _tokenizer_metadata(n_vocab: int) -> dict[str, Any]:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    n_bytes = min(256, n_vocab - len(specials))
    n_words = n_vocab - len(specials) - n_bytes
    tokens = (specials + [f"<0x{b:02X}>" for b in range(n_bytes)]
              + ["\u2581"] + [f"\u2581t{i}" for i in range(n_words - 1)])[:n_vocab]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * (4 + n_bytes) + [-float(i) for i in range(n_words)],
        # llama.cpp's token types: 1 normal, 2 unknown, 3 control, 6 byte
        "tokenizer.ggml.token_type": [3, 3, 3, 2] + [6] * n_bytes + [1] * n_words,
        "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False,
    }


def write_tiny_gguf(path: str | os.PathLike[str], arch: str, seed: int = 0,
                    quantized: bool = True, config: TinyConfig | None = None,
                    extra_metadata: Mapping[str, Any] | None = None) -> TinyConfig:
    """Write a tiny random-weight decoder of architecture ``arch`` to ``path``.

    Args:
        path: the ``.gguf`` file to write (replaced).
        arch: ``"gemma3"``, ``"llama"`` or ``"qwen2"``.
        seed: the random generator's seed.
        quantized: tensor types of :data:`QUANT_TYPES` (norms and biases F32); False: all F32.
        config: the sizes (default ``TINY[arch]``).
        extra_metadata: keys added to (or replacing) the written metadata.

    Returns:
        The :class:`TinyConfig` written.

    Raises:
        ValueError: an unknown architecture, or ``n_head`` not a multiple of ``n_head_kv``.
        ImportError: the ``gguf`` package is missing.
    """
    from ggmlpy.gguf.weights import gguf_save

    spec = arch_spec(arch)
    cfg = config or TINY[arch]
    if cfg.n_head % cfg.n_head_kv:
        raise ValueError(f"write_tiny_gguf: n_head {cfg.n_head} is not a multiple of "
                         f"n_head_kv {cfg.n_head_kv}")
    rng = np.random.default_rng(seed)
    E, hd, V = cfg.n_embd, cfg.head_dim, cfg.n_vocab
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, E), "output_norm.weight": (E,)}
    if not cfg.tied:
        shapes["output.weight"] = (V, E)
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": (E,), b + "attn_q.weight": (cfg.n_head * hd, E),
            b + "attn_k.weight": (cfg.n_head_kv * hd, E), b + "attn_v.weight": (cfg.n_head_kv * hd, E),
            b + "attn_output.weight": (E, cfg.n_head * hd), b + "ffn_norm.weight": (E,),
            b + "ffn_gate.weight": (cfg.n_ff, E), b + "ffn_up.weight": (cfg.n_ff, E),
            b + "ffn_down.weight": (E, cfg.n_ff)})
        if spec.qk_norm:
            shapes[b + "attn_q_norm.weight"] = (hd,)
            shapes[b + "attn_k_norm.weight"] = (hd,)
        if spec.post_norms:
            shapes[b + "post_attention_norm.weight"] = (E,)
            shapes[b + "post_ffw_norm.weight"] = (E,)
        if spec.qkv_bias:
            shapes[b + "attn_q.bias"] = (cfg.n_head * hd,)
            shapes[b + "attn_k.bias"] = (cfg.n_head_kv * hd,)
            shapes[b + "attn_v.bias"] = (cfg.n_head_kv * hd,)
    tensors: dict[str, Any] = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif name == "token_embd.weight" and spec.embd_scale:
            a = rng.standard_normal(shape) / np.sqrt(E)  # scaled back up by sqrt(n_embd)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        a = a.astype(np.float32)
        t = _type_for(name, shape[-1], quantized)
        tensors[name] = a if t == Type.F32 else (t, a)
    meta: dict[str, Any] = {
        "general.architecture": arch, "general.name": f"tiny-{arch}",
        f"{arch}.context_length": cfg.n_ctx_train, f"{arch}.embedding_length": E,
        f"{arch}.block_count": cfg.n_layer, f"{arch}.feed_forward_length": cfg.n_ff,
        f"{arch}.attention.head_count": cfg.n_head, f"{arch}.attention.head_count_kv": cfg.n_head_kv,
        f"{arch}.attention.key_length": hd, f"{arch}.attention.value_length": hd,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6 if arch == "gemma3" else 1e-5,
        f"{arch}.rope.freq_base": ROPE_BASE[arch],
    }
    if arch == "llama":
        meta[f"{arch}.rope.dimension_count"] = hd
        meta[f"{arch}.vocab_size"] = V
    if spec.swa_pattern:
        meta[f"{arch}.attention.sliding_window"] = cfg.n_swa
    meta.update(_tokenizer_metadata(V))
    meta.update(extra_metadata or {})
    gguf_save(path, tensors, meta)
    return cfg
