"""The KV cache of one sequence: per layer K and V in persistent buffers on the layer's device.

Mirrors llama.cpp's ``llama_kv_cache`` (``src/llama-kv-cache.cpp``) for a single sequence whose
cell ``c`` holds position ``c``:

* per layer ``il`` a K tensor ``[head_dim_k, n_head_kv, n_ctx]`` and a V tensor ``[head_dim_v,
  n_head_kv, n_ctx]`` (NumPy ``(n_ctx, n_head_kv, head_dim)``; ``type_k``/``type_v`` F32 or F16),
  allocated once per device in one buffer of that device's default buffer type (llama.cpp's
  per-buffer-type KV contexts) and cleared to zero, so that masked cells never hold NaN;
* :meth:`KVCache.store` adds the graph nodes that write a micro-batch's ``K_cur``/``V_cur`` rows
  at its cells (``cpy_k``/``cpy_v``), :meth:`KVCache.view_k`/:meth:`KVCache.view_v` the views of
  the first ``n_kv`` cells the attention reads (``get_k``/``get_v``), ``n_kv`` padded to
  :data:`KV_PAD` cells (llama.cpp's ``get_padding``) so that decode graphs keep their shape for
  ``KV_PAD`` steps; cells past the sequence are masked by the caller;
* :meth:`KVCache.clear` (``llama_memory_clear``) and :meth:`KVCache.truncate`
  (``llama_memory_seq_rm(seq, n, -1)``: drop positions ``n..``).

Every layer keeps ``n_ctx`` cells, sliding-window layers included, the window applied by the mask
only: llama.cpp's ``swa_full = true`` (the default of ``llama_context_default_params``, which
llama-cpp-python keeps; ``llama-cli`` defaults to false and gives those layers a ring of
``n_swa + n_ubatch`` cells, ``llama_kv_cache_iswa``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import Backend, Buffer
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.models.llm.arch import HParams

__all__ = ["KVCache", "KV_PAD"]

#: The attention reads the first ``n_kv`` cells, ``n_kv`` a multiple of this (llama.cpp pads to
#: 256 cells: decode graphs keep one shape for 256 tokens).
KV_PAD = 256


def _pad(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class KVCache:
    """K and V of every layer for one sequence of up to ``n_ctx`` tokens.

    Args:
        hp: the model's hyperparameters.
        n_ctx: cells per layer (rounded up to a multiple of :data:`KV_PAD`).
        layer_backends: the backend of each layer (``len == hp.n_layer``); a layer's K and V live
            in that backend's default buffer type.
        type_k, type_v: element types of the cache, F32 or F16 (llama.cpp's ``-ctk``/``-ctv``).

    Attributes: ``n_ctx``, ``n_past`` (tokens stored: the next token's position and cell),
    ``k``/``v`` (per layer tensors), ``buffers`` (one per device).

    Raises:
        ValueError: ``n_ctx < 1``, a wrong number of layer backends, a type other than F32/F16.
        OutOfMemoryError: a device cannot hold its layers' cache.
    """

    def __init__(self, hp: HParams, n_ctx: int, layer_backends: Sequence[Backend],
                 type_k: Type = Type.F32, type_v: Type = Type.F32) -> None:
        if n_ctx < 1:
            raise ValueError(f"KVCache: n_ctx must be >= 1, got {n_ctx}")
        if len(layer_backends) != hp.n_layer:
            raise ValueError(f"KVCache: {len(layer_backends)} layer backends for "
                             f"{hp.n_layer} layers")
        for name, t in (("type_k", type_k), ("type_v", type_v)):
            if t not in (Type.F32, Type.F16):
                raise ValueError(f"KVCache: {name} must be F32 or F16, got {t!r}")
        self.hp = hp
        self.n_ctx = _pad(n_ctx, KV_PAD)
        self.n_past = 0
        self.type_k, self.type_v = type_k, type_v
        self.buffers: list[Buffer] = []
        ctxs: dict[int, tuple[Backend, Context]] = {}
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        for il, be in enumerate(layer_backends):
            _, ctx = ctxs.setdefault(id(be), (be, Context()))
            self.k.append(ctx.new_tensor(type_k, (hp.head_dim_k, hp.n_head_kv, self.n_ctx))
                          .set_name(f"cache_k_l{il}"))
            self.v.append(ctx.new_tensor(type_v, (hp.head_dim_v, hp.n_head_kv, self.n_ctx))
                          .set_name(f"cache_v_l{il}"))
        try:
            for be, ctx in ctxs.values():
                buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
                if buf is not None:
                    buf.clear(0)
                    self.buffers.append(buf)
        except BaseException:
            self.free()
            raise

    # ------------------------------------------------------------------------------------------

    def n_kv(self, n_tokens: int) -> int:
        """Cells the attention of a micro-batch of ``n_tokens`` new tokens reads: ``n_past +
        n_tokens`` rounded up to :data:`KV_PAD`, at most ``n_ctx``.

        Raises:
            ValueError: the tokens do not fit (``n_past + n_tokens > n_ctx``).
        """
        end = self.n_past + n_tokens
        if end > self.n_ctx:
            raise ValueError(f"KVCache: {n_tokens} more tokens after {self.n_past} exceed the "
                             f"context of {self.n_ctx} cells")
        return min(self.n_ctx, _pad(end, KV_PAD))

    def store(self, ctx: Context, il: int, k_cur: Tensor, v_cur: Tensor,
              cells: Tensor) -> tuple[Tensor, Tensor]:
        """Graph nodes writing layer ``il``'s new K and V rows at the cells ``cells``.

        Args:
            ctx: the graph's context.
            k_cur: F32 ``[head_dim_k, n_head_kv, T]``; v_cur: F32 ``[head_dim_v, n_head_kv, T]``.
            cells: I64 ``[T]``, the cell of each token (its position).

        Returns:
            The two SET_ROWS nodes (views of the cache tensors, mirroring llama.cpp's
            ``cpy_k``/``cpy_v``); the caller expands them into the graph before the attention.
        """
        hp = self.hp
        k2 = ops.reshape_2d(ctx, self.k[il], hp.head_dim_k * hp.n_head_kv, self.n_ctx)
        v2 = ops.reshape_2d(ctx, self.v[il], hp.head_dim_v * hp.n_head_kv, self.n_ctx)
        kc = ops.reshape_2d(ctx, k_cur, hp.head_dim_k * hp.n_head_kv, k_cur.ne[2])
        vc = ops.reshape_2d(ctx, v_cur, hp.head_dim_v * hp.n_head_kv, v_cur.ne[2])
        return ops.set_rows(ctx, k2, kc, cells), ops.set_rows(ctx, v2, vc, cells)

    def view_k(self, ctx: Context, il: int, n_kv: int) -> Tensor:
        """Layer ``il``'s K of the first ``n_kv`` cells as ``[head_dim_k, n_kv, n_head_kv]`` (a
        view: heads along dim 2, as the attention's K; llama.cpp ``get_k``)."""
        k = self.k[il]
        return ops.view_3d(ctx, k, k.ne[0], n_kv, k.ne[1], k.nb[2], k.nb[1], 0)

    def view_v(self, ctx: Context, il: int, n_kv: int) -> Tensor:
        """Layer ``il``'s V of the first ``n_kv`` cells as ``[head_dim_v, n_kv, n_head_kv]`` (a
        view; llama.cpp ``get_v`` without the transposed V layout)."""
        v = self.v[il]
        return ops.view_3d(ctx, v, v.ne[0], n_kv, v.ne[1], v.nb[2], v.nb[1], 0)

    def clear(self) -> None:
        """Forget every token and zero the buffers (llama.cpp ``llama_memory_clear(mem, true)``)."""
        self.n_past = 0
        for b in self.buffers:
            b.clear(0)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens, drop the rest (llama.cpp
        ``llama_memory_seq_rm(mem, 0, n, -1)``); their cells are masked from now on.

        Raises:
            ValueError: ``n`` outside ``0..n_past``.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.n_past:
            raise ValueError(f"KVCache.truncate: n must be an int in 0..{self.n_past}, got {n!r}")
        self.n_past = n

    def free(self) -> None:
        """Free the cache buffers. Idempotent."""
        for b in self.buffers:
            b.free()
        self.buffers = []
