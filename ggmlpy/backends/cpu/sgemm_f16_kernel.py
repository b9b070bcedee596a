"""The Numba kernels behind :mod:`ggmlpy.backends.cpu.sgemm_f16` (imported by it on first use
only; importing this module imports Numba). Module-level functions, so that Numba's on-disk
cache finds them again in a later process. :func:`tinyblas` also computes the tinyBLAS order
of :mod:`ggmlpy.backends.cpu.sgemm_f32` (its operands are float32 arrays either way).

Each dot product (or register tile of them) is one intrinsic (LLVM vector IR) that keeps ggml's
float32 lanes as LLVM vectors: ``<16 x float>`` for llamafile's tinyBLAS (one AVX-512 register
per output, 4 x 4 outputs at a time) and ``<64 x float>`` for ``ggml_vec_dot_f16`` (its four
registers of 16 lanes, :func:`ggmlpy.backends.cpu.fma_ir.fma_lanes_dot`), each lane adding its
products in turn with ``llvm.fma`` (ggml's ``madd``/``_mm512_fmadd_ps``), then the lanes reduced
as ``_mm512_reduce_add_ps`` (halves added: lanes ``i`` and ``i + 8``, then ``i + 4``, ``i + 2``,
``i + 1``). For f16 values widened to float32 every product is exact, so a fused and a separate
multiply-add round alike; no fast-math flags: LLVM keeps every addition where it is.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.fma_ir import fma_lanes_dot, reduce512, vload, vtype

F32, F64 = np.float32, np.float64
_I64 = ir.IntType(64)


_dot64 = fma_lanes_dot(64)


def _fma16(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(vtype(16), [vtype(16)] * 3),
                                        "llvm.fma.v16f32")
    return builder.call(fn, [a, b, c])


def _tile16(rm: int, rn: int):
    """An intrinsic ``tile(a, ao, b, bo, K, nv, out, oo, M)``: the ``rm x rn`` outputs
    ``out[oo + r*M + p]`` (``p < rm``, ``r < rn``) of rows ``ao + p*K`` of ``a`` and ``bo + r*K``
    of ``b``, each in tinyBLAS's order: 16 float32 lanes, lane ``l`` a fused multiply-add of the
    products ``k = 16 j + l`` for ``j < nv`` in turn, then :func:`reduce512`. The ``rm * rn``
    accumulators stay in registers (llamafile's ``RM x RN`` register blocks), each ``a`` row's
    vector loaded once for ``rn`` outputs and each ``b`` row's for ``rm``. ``a``, ``b``, ``out``:
    1-D float32 C-contiguous arrays; the caller guarantees the bounds."""

    @intrinsic
    def tile(typingctx, a, ao, b, bo, K, nv, out, oo, M):
        sig = types.none(a, ao, b, bo, K, nv, out, oo, M)

        def codegen(context, builder, signature, args):
            aarr, ao_, barr, bo_, K_, nv_, oarr, oo_, M_ = args
            aty, bty, oty = signature.args[0], signature.args[2], signature.args[6]
            acc = [[cgutils.alloca_once_value(builder, ir.Constant(vtype(16), [0.0] * 16))
                    for _ in range(rn)] for _ in range(rm)]
            arow = [builder.add(ao_, builder.mul(K_, ir.Constant(_I64, p))) for p in range(rm)]
            brow = [builder.add(bo_, builder.mul(K_, ir.Constant(_I64, r))) for r in range(rn)]
            with cgutils.for_range(builder, nv_) as loop:
                off = builder.mul(loop.index, ir.Constant(_I64, 16))
                va = [vload(context, builder, aty, aarr, builder.add(x, off), 16) for x in arow]
                vb = [vload(context, builder, bty, barr, builder.add(x, off), 16) for x in brow]
                for p in range(rm):
                    for r in range(rn):
                        builder.store(_fma16(builder, va[p], vb[r], builder.load(acc[p][r])),
                                      acc[p][r])
            o = context.make_array(oty)(context, builder, oarr)
            for p in range(rm):
                for r in range(rn):
                    i = builder.add(oo_, builder.add(builder.mul(M_, ir.Constant(_I64, r)),
                                                     ir.Constant(_I64, p)))
                    builder.store(reduce512(builder, builder.load(acc[p][r])),
                                  builder.gep(o.data, [i]))
            return context.get_dummy_value()
        return sig, codegen
    return tile


_tile44 = _tile16(4, 4)
_tile14 = _tile16(1, 4)
_tile41 = _tile16(4, 1)
_tile11 = _tile16(1, 1)
#: weight rows (``a``) per cache block of :func:`tinyblas` (32 rows of 256 float32: 32 KiB)
_MBLOCK = 32


@njit(cache=True, nogil=True, error_model="numpy")
def tinyblas(a, b, out, A2, A3, M, K, B2, B3, N):  # pragma: no cover - compiled
    """``out[i3, i2, n, m] = sum_k a[i3/r3, i2/r2, m, k] * b[i3, i2, n, k]`` in tinyBLAS's
    order (16 lanes, ``K % 16 == 0``): ``a``, ``b``, ``out`` the 1-D C-contiguous float32 data
    of ``(A3, A2, M, K)``, ``(B3, B2, N, K)``, ``(B3, B2, N, M)`` arrays. Blocks of
    :data:`_MBLOCK` ``a`` rows, in each 4 x 4 output tiles (:func:`_tile16`), the rows left
    over in 1 x 4, 4 x 1 and 1 x 1 tiles: every output's operations are the same in each."""
    r2, r3 = B2 // A2, B3 // A3
    nv = K // 16
    N4 = N - N % 4
    for i3 in range(B3):
        for i2 in range(B2):
            a0 = ((i3 // r3) * A2 + i2 // r2) * M * K
            b0 = (i3 * B2 + i2) * N * K
            o0 = (i3 * B2 + i2) * N * M
            for mb in range(0, M, _MBLOCK):
                me = min(M, mb + _MBLOCK)
                m4 = me - (me - mb) % 4
                for n in range(0, N4, 4):
                    for m in range(mb, m4, 4):
                        _tile44(a, a0 + m * K, b, b0 + n * K, K, nv, out, o0 + n * M + m, M)
                    for m in range(m4, me):
                        _tile14(a, a0 + m * K, b, b0 + n * K, K, nv, out, o0 + n * M + m, M)
                for n in range(N4, N):
                    for m in range(mb, m4, 4):
                        _tile41(a, a0 + m * K, b, b0 + n * K, K, nv, out, o0 + n * M + m, M)
                    for m in range(m4, me):
                        _tile11(a, a0 + m * K, b, b0 + n * K, K, nv, out, o0 + n * M + m, M)


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
