"""The Numba kernel behind :mod:`ggmlpy.backends.cpu.repack_q4k` (imported by it on first use
only; importing this module imports Numba). A module-level function, so that Numba's on-disk
cache finds it again in a later process. The integer sums are exact (``<32 x i8>`` products in
LLVM vector IR, summed in int32); the float32 steps are ggml's, each FMA one
:func:`~ggmlpy.backends.cpu.fma_ir.fma32`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.fma_ir import fma32

F32 = np.float32
_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


@intrinsic
def dot32_i8(typingctx, w, wo, x, xo):
    """``sum(w[wo:wo+32] * x[xo:xo+32])`` as int32: ``w``, ``x`` 1-D int8 C-contiguous arrays
    (the caller guarantees the bounds); exact for any int8 values."""
    sig = types.int32(w, wo, x, xo)

    def codegen(context, builder, signature, args):
        wa, wo_, xa, xo_ = args
        v32 = ir.VectorType(_I8, 32)

        def load(aty, arr, off):
            a = context.make_array(aty)(context, builder, arr)
            p = builder.gep(a.data, [off])
            return builder.load(builder.bitcast(p, v32.as_pointer()), align=1)
        vw = builder.sext(load(signature.args[0], wa, wo_), ir.VectorType(_I16, 32))
        vx = builder.sext(load(signature.args[2], xa, xo_), ir.VectorType(_I16, 32))
        p = builder.sext(builder.mul(vw, vx), ir.VectorType(_I32, 32))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [ir.VectorType(_I32, 32)]),
            "llvm.vector.reduce.add.v32i32")
        return builder.call(fn, [p])
    return sig, codegen


@njit(cache=True, nogil=True, error_model="numpy")
def gemm_q4k(w4, sc, mn, dw, dmw, xq, xd, xb, out, Y, C, nb, per_pair):  # pragma: no cover
    """``out[y*C + c]`` for ``y < Y``, ``c < C`` in ggml's repacked Q4_K order
    (arch/x86/repack.cpp): the exact integers ``sum_j sc[c,b,j] * dot(q4, q8)_j`` and ``sum_j
    mn[c,b,j] * bsum32[y,b,j]`` over the sub-blocks ``j`` of a step, then ``acc = fma(float(i),
    dw[c,b]*xd[y,b], acc)``, ``accm = fma(float(imin), dmw[c,b]*xd[y,b], accm)``; the result
    ``acc - accm``. A step is a whole super-block (``ggml_gemv_q4_K_8x8_q8_K``) or, with
    ``per_pair``, each pair of sub-blocks (``ggml_gemm_q4_K_8x8_q8_K``).

    ``w4`` int8 ``C*nb*256`` (4-bit values in element order), ``sc``/``mn`` int32 ``C*nb*8``,
    ``dw``/``dmw`` float32 ``C*nb``; ``xq`` int8 ``Y*nb*256``, ``xd`` float32 ``Y*nb``, ``xb``
    int32 ``Y*nb*8`` (sums of 32 quants); ``out`` float32 ``Y*C``; all 1-D C-contiguous."""
    step = 2 if per_pair else 8
    for y in range(Y):
        for c in range(C):
            acc = F32(0.0)
            accm = F32(0.0)
            for b in range(nb):
                wo = (c * nb + b) * 256
                xo = (y * nb + b) * 256
                so = (c * nb + b) * 8
                bo = (y * nb + b) * 8
                s = xd[y * nb + b]
                ds = dw[c * nb + b] * s
                dms = dmw[c * nb + b] * s
                for j0 in range(0, 8, step):
                    iacc = 0
                    imin = 0
                    for j in range(j0, j0 + step):
                        iacc += sc[so + j] * dot32_i8(w4, wo + 32 * j, xq, xo + 32 * j)
                        imin += mn[so + j] * xb[bo + j]
                    acc = fma32(F32(iacc), ds, acc)
                    accm = fma32(F32(imin), dms, accm)
            out[y * C + c] = acc - accm
