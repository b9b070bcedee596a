"""The Numba kernels behind :mod:`ggmlpy.backends.cpu.sgemm_f16` (imported by it on first use
only; importing this module imports Numba). Module-level functions, so that Numba's on-disk
cache finds them again in a later process.

Each dot product is one intrinsic (LLVM vector IR) that keeps ggml's float32 lanes as LLVM
vectors: ``<16 x float>`` for llamafile's tinyBLAS (one AVX-512 register per output) and
``<64 x float>`` for ``ggml_vec_dot_f16`` (its four registers of 16 lanes), each lane adding its
products in turn, then the lanes reduced as ``_mm512_reduce_add_ps`` (halves added: lanes ``i``
and ``i + 8``, then ``i + 4``, ``i + 2``, ``i + 1``). The operands are f16 values widened to
float32, so every product is exact and ggml's fused multiply-adds round as the separate multiply
and add written here (no fast-math flags: LLVM keeps every addition where it is).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

F32, F64 = np.float32, np.float64
_F = ir.FloatType()
_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _vt(n: int) -> ir.VectorType:
    return ir.VectorType(_F, n)


def _half(builder: ir.IRBuilder, v: ir.Value, n: int, hi: bool) -> ir.Value:
    idx = list(range(n // 2, n)) if hi else list(range(n // 2))
    return builder.shuffle_vector(v, ir.Constant(_vt(n), ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, n // 2), idx))


def _reduce512(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """``_mm512_reduce_add_ps``: upper half + lower half down to one lane."""
    n = 16
    while n > 1:
        v = builder.fadd(_half(builder, v, n, True), _half(builder, v, n, False))
        n //= 2
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _vload(context, builder, aty, arr, off, n: int) -> ir.Value:
    a = context.make_array(aty)(context, builder, arr)
    p = builder.gep(a.data, [off])
    return builder.load(builder.bitcast(p, _vt(n).as_pointer()), align=4)


def _lanes_dot(width: int):
    """An intrinsic ``dot(a, ao, b, bo, nv)``: ``width`` float32 lanes, lane ``l`` adding
    ``a[ao + width*j + l] * b[bo + width*j + l]`` for ``j < nv`` in turn; returns the lanes as a
    float32 vector reduced: 16 lanes by :func:`_reduce512`, 64 lanes as ``GGML_F32x16_REDUCE``
    (registers 0+2 and 1+3, then 0+1, then :func:`_reduce512`). ``a``, ``b``: 1-D float32
    C-contiguous arrays; the caller guarantees the bounds."""

    @intrinsic
    def dot(typingctx, a, ao, b, bo, nv):
        sig = types.float32(a, ao, b, bo, nv)

        def codegen(context, builder, signature, args):
            aarr, ao_, barr, bo_, nv_ = args
            aty, bty = signature.args[0], signature.args[2]
            acc = cgutils.alloca_once_value(builder, ir.Constant(_vt(width), [0.0] * width))
            w = ir.Constant(_I64, width)
            with cgutils.for_range(builder, nv_) as loop:
                off = builder.mul(loop.index, w)
                va = _vload(context, builder, aty, aarr, builder.add(ao_, off), width)
                vb = _vload(context, builder, bty, barr, builder.add(bo_, off), width)
                builder.store(builder.fadd(builder.load(acc), builder.fmul(va, vb)), acc)
            v = builder.load(acc)
            if width == 64:
                r = [builder.shuffle_vector(v, ir.Constant(_vt(64), ir.Undefined),
                                            ir.Constant(ir.VectorType(_I32, 16),
                                                        list(range(16 * j, 16 * j + 16))))
                     for j in range(4)]
                v = builder.fadd(builder.fadd(r[0], r[2]), builder.fadd(r[1], r[3]))
            return _reduce512(builder, v)
        return sig, codegen
    return dot


_dot16 = _lanes_dot(16)
_dot64 = _lanes_dot(64)


@njit(cache=True, nogil=True, error_model="numpy")
def tinyblas(a, b, out, A2, A3, M, K, B2, B3, N):  # pragma: no cover - compiled
    """``out[i3, i2, n, m] = sum_k a[i3/r3, i2/r2, m, k] * b[i3, i2, n, k]`` in tinyBLAS's
    order (16 lanes, ``K % 16 == 0``): ``a``, ``b``, ``out`` the 1-D C-contiguous float32 data
    of ``(A3, A2, M, K)``, ``(B3, B2, N, K)``, ``(B3, B2, N, M)`` arrays."""
    r2, r3 = B2 // A2, B3 // A3
    nv = K // 16
    for i3 in range(B3):
        for i2 in range(B2):
            a0 = ((i3 // r3) * A2 + i2 // r2) * M * K
            b0 = (i3 * B2 + i2) * N * K
            o0 = (i3 * B2 + i2) * N * M
            for n in range(N):
                for m in range(M):
                    out[o0 + n * M + m] = _dot16(a, a0 + m * K, b, b0 + n * K, nv)


@njit(cache=True, nogil=True, error_model="numpy")
def vec_dot(a, b, out, A2, A3, M, K, B2, B3, N):  # pragma: no cover - compiled
    """The same product in ``ggml_vec_dot_f16``'s order: :func:`_dot64` over ``K - K % 64``,
    the leftover products added one by one in float64, rounded to float32 at the end."""
    r2, r3 = B2 // A2, B3 // A3
    nv = K // 64
    np_ = nv * 64
    for i3 in range(B3):
        for i2 in range(B2):
            a0 = ((i3 // r3) * A2 + i2 // r2) * M * K
            b0 = (i3 * B2 + i2) * N * K
            o0 = (i3 * B2 + i2) * N * M
            for n in range(N):
                for m in range(M):
                    ao, bo = a0 + m * K, b0 + n * K
                    s = F64(_dot64(a, ao, b, bo, nv))
                    for k in range(np_, K):
                        s += F64(a[ao + k] * b[bo + k])
                    out[o0 + n * M + m] = F32(s)
