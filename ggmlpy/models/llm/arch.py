"""Decoder architectures as data: GGUF hyperparameter keys, tensor names and per-layer rules.

One :class:`ArchSpec` per llama.cpp architecture this package runs (:data:`ARCHS`), and
:class:`HParams`, the hyperparameters read from a GGUF file's metadata with the keys llama.cpp's
``llama_model::load_hparams`` reads (``{arch}.block_count``, ``{arch}.embedding_length``, ...).
Mirrors the architecture tables of llama.cpp's ``llama-arch.cpp`` (``LLM_TENSOR_NAMES``) and the
per-architecture cases of ``llama_model::load_hparams`` in ``llama-model.cpp``:

* ``gemma3`` (``llm_build_gemma3``): embeddings scaled by ``sqrt(n_embd)``; per block
  ``attn_norm``, ``attn_q/k/v`` (no biases), per-head RMS norms ``attn_q_norm``/``attn_k_norm``,
  NEOX RoPE, ``attn_output``, ``post_attention_norm``, residual, ``ffn_norm``, GEGLU with the
  tanh GELU (``ffn_gate``, ``ffn_up``), ``ffn_down``, ``post_ffw_norm``, residual; sliding-window
  attention on every layer but each ``swa_pattern``-th (``hparams.set_swa_pattern(6)``: layers
  5, 11, 17 of 18 are global), local layers with RoPE base 10,000 (``rope_freq_base_train_swa``);
  queries scaled by ``1/sqrt(head_dim)`` (``f_attention_scale``; the 27B model's
  ``1/sqrt(n_embd/n_head)`` is not needed here); output tied to ``token_embd``.
* ``llama`` (``llm_build_llama``): ``attn_norm``, ``attn_q/k/v/output``, ``ffn_norm``, SwiGLU
  (``ffn_gate``, ``ffn_up``, ``ffn_down``), ``output_norm``, ``output`` (or tied); NORMAL RoPE.
* ``qwen2`` (``llm_build_qwen2``): the llama layout with biases on Q, K and V, NEOX RoPE.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ARCHS", "ArchSpec", "HParams", "arch_spec", "block_tensor_names"]

#: RoPE base when a file has no ``{arch}.rope.freq_base`` (llama.cpp's ``rope_freq_base_train``
#: default)
DEFAULT_ROPE_BASE = 10000.0

#: ggml's rope modes (``GGML_ROPE_TYPE_NEOX``), as ``ggmlpy.ops.ROPE_TYPE_*``
ROPE_NORMAL, ROPE_NEOX = 0, 2


@dataclass(frozen=True)
class ArchSpec:
    """One decoder architecture's graph rules (what llama.cpp's ``llm_build_<arch>`` hard-codes).

    Attributes:
        name: ``general.architecture`` (``"gemma3"``, ``"llama"``, ``"qwen2"``).
        ffn: ``"geglu"`` (tanh GELU of the gate times up; llama.cpp ``LLM_FFN_GELU`` +
            ``LLM_FFN_PAR``) or ``"swiglu"`` (``LLM_FFN_SILU`` + ``LLM_FFN_PAR``).
        rope_mode: ``ROPE_NORMAL`` (0) or ``ROPE_NEOX`` (2) (llama.cpp ``llama_model_rope_type``).
        embd_scale: multiply the token embeddings by ``sqrt(n_embd)`` (gemma).
        qk_norm: per-head RMS norms of Q and K (``attn_q_norm``, ``attn_k_norm``, ``[head_dim]``).
        post_norms: RMS norms after attention and after the FFN (``post_attention_norm``,
            ``post_ffw_norm``), before each residual add (gemma2/3).
        qkv_bias: Q, K and V have biases (``attn_q.bias`` ...; optional tensors for llama).
        swa_pattern: every ``swa_pattern``-th layer (``il % swa_pattern == swa_pattern - 1``) is
            global, the others use the sliding window; 0: no sliding window.
        rope_base_swa: RoPE base of the sliding-window layers (None: the global base).
        q_prescale: Q is multiplied by ``attn_scale`` (a SCALE node after RoPE) and the
            attention's own scale is 1 (llama.cpp's gemma3 graph), instead of the scale inside
            the softmax / flash attention.
        block_tensors: per-block tensor suffixes that must exist (``blk.{il}.<suffix>.weight``).
        optional_block_tensors: per-block suffixes that may exist (biases).
    """

    name: str
    ffn: str
    rope_mode: int
    embd_scale: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    qkv_bias: bool = False
    swa_pattern: int = 0
    rope_base_swa: float | None = None
    q_prescale: bool = False
    block_tensors: tuple[str, ...] = ()
    optional_block_tensors: tuple[str, ...] = ()

    def is_swa(self, il: int) -> bool:
        """True when layer ``il`` uses the sliding window (llama.cpp ``hparams.is_swa(il)`` after
        ``set_swa_pattern(n)``: ``il % n < n - 1``)."""
        n = self.swa_pattern
        return n > 0 and il % n < n - 1


_LLAMA_BLOCK = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                "ffn_down.weight")
_QKV_BIAS = ("attn_q.bias", "attn_k.bias", "attn_v.bias")

#: The architectures this package runs, by ``general.architecture``.
ARCHS: dict[str, ArchSpec] = {
    "gemma3": ArchSpec(
        name="gemma3", ffn="geglu", rope_mode=ROPE_NEOX, embd_scale=True, qk_norm=True,
        post_norms=True, swa_pattern=6, rope_base_swa=10000.0, q_prescale=True,
        block_tensors=_LLAMA_BLOCK + ("attn_q_norm.weight", "attn_k_norm.weight",
                                      "post_attention_norm.weight", "post_ffw_norm.weight")),
    "llama": ArchSpec(name="llama", ffn="swiglu", rope_mode=ROPE_NORMAL,
                      block_tensors=_LLAMA_BLOCK, optional_block_tensors=_QKV_BIAS),
    "qwen2": ArchSpec(name="qwen2", ffn="swiglu", rope_mode=ROPE_NEOX, qkv_bias=True,
                      block_tensors=_LLAMA_BLOCK + _QKV_BIAS),
}


def arch_spec(name: str) -> ArchSpec:
    """The :class:`ArchSpec` of ``general.architecture`` ``name``.

    Raises:
        ValueError: an architecture this package does not run (the message lists those it does).
    """
    try:
        return ARCHS[name]
    except KeyError:
        raise ValueError(f"architecture {name!r} is not supported (supported: "
                         f"{', '.join(ARCHS)})") from None


def block_tensor_names(spec: ArchSpec, il: int, optional: bool = False) -> list[str]:
    """GGUF names of block ``il``'s tensors (``blk.{il}.attn_q.weight`` ...): the required ones,
    or with ``optional`` the optional ones (llama.cpp's ``LLM_TENSOR_NAMES`` with ``%d = il``)."""
    suffixes = spec.optional_block_tensors if optional else spec.block_tensors
    return [f"blk.{il}.{s}" for s in suffixes]


@dataclass(frozen=True)
class HParams:
    """The hyperparameters of a decoder, from a GGUF file's ``{arch}.*`` keys (mirrors
    llama.cpp's ``llama_hparams`` as ``llama_model::load_hparams`` fills it).

    Attributes (element counts unless stated): ``arch`` (:class:`ArchSpec`), ``n_layer``
    (``block_count``), ``n_embd`` (``embedding_length``), ``n_head`` (``attention.head_count``),
    ``n_head_kv`` (``attention.head_count_kv``, default ``n_head``), ``head_dim_k``
    (``attention.key_length``, default ``n_embd / n_head``), ``head_dim_v``
    (``attention.value_length``, default ``head_dim_k``), ``n_ff`` (``feed_forward_length``),
    ``n_ctx_train`` (``context_length``), ``n_vocab`` (rows of ``token_embd``), ``n_rot``
    (``rope.dimension_count``, default ``head_dim_k``), ``rope_base`` (``rope.freq_base``),
    ``rope_base_swa``, ``eps`` (``attention.layer_norm_rms_epsilon``), ``n_swa``
    (``attention.sliding_window``, 0 without), ``attn_scale`` (the factor of Q before
    ``softmax(Q K^T)``: ``1/sqrt(head_dim_k)``).
    """

    arch: ArchSpec
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_ctx_train: int
    n_vocab: int
    n_rot: int
    rope_base: float
    rope_base_swa: float
    eps: float
    n_swa: int
    attn_scale: float = field(default=0.0)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], n_vocab: int,
                      where: str = "GGUF file") -> HParams:
        """Read the hyperparameters from ``metadata`` (key -> value, as ``GGUFModel.metadata``).

        Args:
            metadata: the file's key/value pairs; ``general.architecture`` names the arch.
            n_vocab: rows of the ``token_embd`` tensor (its ``ne[1]``).
            where: names the file in error messages.

        Raises:
            ValueError: an unsupported architecture, a required key missing (named), or values
                that do not fit together (``n_head`` not a multiple of ``n_head_kv``, a
                non-positive size).
        """
        name = metadata.get("general.architecture")
        if not isinstance(name, str):
            raise ValueError(f"{where}: no general.architecture key")
        spec = arch_spec(name)

        def get(key: str, default: Any = None, required: bool = False) -> Any:
            full = f"{name}.{key}"
            if full in metadata:
                v = metadata[full]
                if isinstance(v, (list, tuple, np.ndarray)):  # per-layer arrays: layer 0's
                    return v[0]
                return v
            if required:
                raise ValueError(f"{where}: missing key {full!r}")
            return default

        n_layer = int(get("block_count", required=True))
        n_embd = int(get("embedding_length", required=True))
        n_head = int(get("attention.head_count", required=True))
        n_head_kv = int(get("attention.head_count_kv", n_head))
        if min(n_layer, n_embd, n_head, n_head_kv, n_vocab) <= 0:
            raise ValueError(f"{where}: block_count, embedding_length, head counts and the "
                             "vocabulary must be positive")
        if n_head % n_head_kv:
            raise ValueError(f"{where}: head_count {n_head} is not a multiple of head_count_kv "
                             f"{n_head_kv}")
        head_k = int(get("attention.key_length", n_embd // n_head))
        head_v = int(get("attention.value_length", head_k))
        rope_base = float(get("rope.freq_base", DEFAULT_ROPE_BASE))
        n_rot = int(get("rope.dimension_count", head_k))
        if n_rot % 2 or not 0 < n_rot <= head_k:
            raise ValueError(f"{where}: rope.dimension_count {n_rot} must be even and in "
                             f"1..{head_k}")
        return cls(
            arch=spec, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
            head_dim_k=head_k, head_dim_v=head_v,
            n_ff=int(get("feed_forward_length", required=True)),
            n_ctx_train=int(get("context_length", 2048)), n_vocab=int(n_vocab), n_rot=n_rot,
            rope_base=rope_base,
            rope_base_swa=spec.rope_base_swa if spec.rope_base_swa is not None else rope_base,
            eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            n_swa=int(get("attention.sliding_window", 0)) if spec.swa_pattern else 0,
            attn_scale=1.0 / math.sqrt(head_k))

    def is_swa(self, il: int) -> bool:
        """True when layer ``il`` attends through the sliding window of ``n_swa`` tokens."""
        return self.n_swa > 0 and self.arch.is_swa(il)

    def layer_rope_base(self, il: int) -> float:
        """RoPE ``freq_base`` of layer ``il`` (llama.cpp ``llama_model::get_rope_freq_base``)."""
        return self.rope_base_swa if self.is_swa(il) else self.rope_base
