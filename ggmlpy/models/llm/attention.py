"""The attention of one decoder block over the KV cache (llama.cpp ``llm_graph_context::
build_attn_mha``), in its two forms:

* ``flash_attn=True``: one ``flash_attn_ext(permute(Q), K, V, mask, scale)`` node (llama.cpp with
  ``-fa on``). ggmlpy's kernels compute it as an exact float32 softmax of float32 products;
  ggml's CPU kernel (ggml-cpu ops.cpp ``ggml_compute_forward_flash_attn_ext_f16``) also rounds Q
  to f16 for an F16 K and accumulates V in f16 for an F16 V, which is not reproduced.
* ``flash_attn=False``: ``KQ = mul_mat(K, Q)``, ``soft_max_ext(KQ, mask, scale)``, ``KQV =
  mul_mat(V^T, KQ)``, as llama.cpp with ``-fa off``. With an F16 cache, ggml's CPU MUL_MAT
  converts its F32 ``src1`` to F16 first (the ``vec_dot_type`` of F16, ggml-cpu.c
  ``ggml_compute_forward_mul_mat``): Q is rounded to f16 before KQ and the softmax probabilities
  before KQV. Those two conversions are explicit ``cast`` nodes here, so every backend computes
  the same values as llama.cpp's CPU (f16 x f16 products are exact in float32; only the float32
  summation order differs). V is transposed with ``cont`` (llama.cpp's path for a V cache that
  is not stored transposed).

Shapes (ggml ``ne``; NumPy is the reverse): ``q`` F32 ``[d, n_head, T]``, the cache views ``k``
``[d, n_kv, n_head_kv]`` and ``v`` ``[dv, n_kv, n_head_kv]`` (F16 or F32), ``mask`` F32 ``[n_kv,
T]`` (0 or -inf); the result F32 ``[dv*n_head, T]``.
"""

from __future__ import annotations

from ggmlpy import ops
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type

__all__ = ["build_attn"]


def build_attn(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               scale: float, flash_attn: bool) -> Tensor:
    """The attention output ``softmax(scale * Q K^T + mask) V`` of every head, heads concatenated.

    Args:
        ctx: the graph's context.
        q: F32 ``[d, n_head, T]`` (roped queries).
        k: ``[d, n_kv, n_head_kv]`` view of the K cache (F16 or F32).
        v: ``[dv, n_kv, n_head_kv]`` view of the V cache (the same type as ``k`` or not).
        mask: F32 ``[n_kv, T]`` (0: visible, -inf: masked) or None.
        scale: the factor of ``Q K^T`` inside the softmax.
        flash_attn: one FLASH_ATTN_EXT node, else MUL_MAT / SOFT_MAX / MUL_MAT (module doc).

    Returns:
        F32 ``[dv*n_head, T]``.

    Raises:
        ValueError: shapes that do not fit (from the ops).
    """
    n_head, T = q.ne[1], q.ne[2]
    dv = v.ne[0]
    qp = ops.permute(ctx, q, 0, 2, 1, 3)                          # [d, T, n_head]
    if flash_attn:
        attn = ops.flash_attn_ext(ctx, qp, k, v, mask, scale, 0.0, 0.0)   # [dv, n_head, T]
        return ops.reshape_2d(ctx, attn, dv * n_head, T)
    if k.type == Type.F16:
        qp = ops.cast(ctx, qp, Type.F16)                          # ggml's vec_dot_type of F16
    kq = ops.mul_mat(ctx, k, qp)                                  # [n_kv, T, n_head]
    kq = ops.soft_max_ext(ctx, kq, mask, scale, 0.0)
    vt = ops.cont(ctx, ops.transpose(ctx, v))                     # [n_kv, dv, n_head_kv]
    if vt.type == Type.F16:
        kq = ops.cast(ctx, kq, Type.F16)
    kqv = ops.mul_mat(ctx, vt, kq)                                # [dv, T, n_head]
    return ops.cont_2d(ctx, ops.permute(ctx, kqv, 0, 2, 1, 3), dv * n_head, T)
