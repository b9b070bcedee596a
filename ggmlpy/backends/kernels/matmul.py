"""Matrix products: MUL_MAT (``dst = b @ a^T`` with ggml's block-repeat broadcast over dims 2/3)
and OUT_PROD. F16 operands are computed in float32; the result is F32.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ...opcodes import Op
from ...tensor import Tensor
from ...types import Type
from .common import F32, FLOATS, as_f32, as_strided, c_contig, is_numpy, src_of
from .registry import Step, kernel


# ---------------------------------------------------------------------------------------------
# support


def _sup_mul_mat(node: Tensor, xp: Any) -> bool:
    a, b = src_of(node, 0), src_of(node, 1)
    if a is None or b is None or node.type != Type.F32:
        return False
    if a.type not in FLOATS or b.type not in FLOATS:
        return False
    if node.op == Op.MUL_MAT:
        shape_ok = (a.ne[0] == b.ne[0] and node.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3]))
    else:
        shape_ok = (a.ne[1] == b.ne[1] and node.ne == (a.ne[0], b.ne[0], b.ne[2], b.ne[3]))
    return shape_ok and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


# ---------------------------------------------------------------------------------------------
# kernels


def _mm_views(xp: Any, a: Any, b: Any, d: Any) -> tuple[Any, Any, Any]:
    """Views for ``d = b @ A^T`` with ggml's block-repeat broadcast of ``a`` over dims 2/3.

    ``a`` (A3, A2, M, K), ``b`` (B3, B2, N, K), ``d`` (B3, B2, N, M) NumPy shapes, with
    ``B2 = r2*A2``, ``B3 = r3*A3``. Batch axes are split into (A, r) blocks (``a`` gets stride 0
    on the r axes); trailing broadcast batch axes whose strides allow it are folded into the row
    axis N so one large GEMM replaces many small ones. Returns (aT, bv, dv) with
    ``matmul(bv, aT, out=dv)`` computing the product.
    """
    A3, A2, M, K = a.shape
    B3, B2, N, _ = b.shape
    r2, r3 = B2 // A2, B3 // A3
    sa, sb, sd = a.strides, b.strides, d.strides
    # batch axes: (size, a_stride, b_stride, d_stride)
    batch = [(A3, sa[0], sb[0] * r3, sd[0] * r3), (r3, 0, sb[0], sd[0]),
             (A2, sa[1], sb[1] * r2, sd[1] * r2), (r2, 0, sb[1], sd[1])]
    batch = [x for x in batch if x[0] != 1]
    rows, b_row, d_row = N, sb[2], sd[2]
    while batch:
        n, s_a, s_b, s_d = batch[-1]
        if s_a == 0 and s_b == rows * b_row and s_d == rows * d_row:
            rows *= n
            batch.pop()
        else:
            break
    shp = tuple(x[0] for x in batch)
    aT = as_strided(xp, a, shp + (K, M), tuple(x[1] for x in batch) + (sa[3], sa[2]))
    bv = as_strided(xp, b, shp + (rows, K), tuple(x[2] for x in batch) + (b_row, sb[3]))
    dv = as_strided(xp, d, shp + (rows, M), tuple(x[3] for x in batch) + (d_row, sd[3]))
    return aT, bv, dv


def _matmul_step(xp: Any, a: Any, b: Any, dst: Any) -> Step:
    """A closure for ``dst = b @ a^T`` (ggml MUL_MAT layout) over F32/F16 inputs.

    CuPy's ``matmul`` makes both operands C-contiguous first (``ascontiguousarray`` in
    ``cupy/_core/_routines_linalg.pyx``), i.e. it would copy the transposed weight ``a^T`` on every
    call. When the product folds into one 2-D GEMM with a C-contiguous output, CuPy gets ``dot``
    instead, which hands transposed (F-contiguous) operands to cuBLAS as they are
    (``_mat_to_cublas_contiguous``) and requires exactly that output layout."""
    matmul = xp.matmul
    if a.dtype == F32 and b.dtype == F32:
        aT, bv, dv = _mm_views(xp, a, b, dst)
        if (not is_numpy(xp) and aT.ndim == 2 and dv.dtype == F32 and c_contig(dv)
                and (aT.flags.f_contiguous or c_contig(aT))):
            return partial(xp.dot, bv, aT, out=dv)
        return partial(matmul, bv, aT, out=dv)

    def run() -> None:
        a32 = as_f32(xp, a)
        b32 = as_f32(xp, b)
        aT, bv, dv = _mm_views(xp, a32, b32, dst)
        matmul(bv, aT, out=dv)
    return run


@kernel(Op.MUL_MAT, supports=_sup_mul_mat)
def _k_mul_mat(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    return _matmul_step(xp, srcs[0], srcs[1], dst)


@kernel(Op.OUT_PROD, supports=_sup_mul_mat)
def _k_out_prod(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # out_np = b^T @ A  ==  MUL_MAT(a^T, b^T) in NumPy layout
    a, b = srcs[0], srcs[1]
    return _matmul_step(xp, a.swapaxes(-1, -2), b.swapaxes(-1, -2), dst)
