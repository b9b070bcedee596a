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


def _host_has(feature: str) -> bool:
    # whether Numba compiles for this CPU (no NUMBA_CPU_NAME/FEATURES) and it has `feature`
    from llvmlite import binding
    from numba.core import config

    if config.CPU_NAME or config.CPU_FEATURES:
        return False
    try:
        return bool(binding.get_host_cpu_features().get(feature))
    except RuntimeError:
        return False


_AVX2 = _host_has("avx2")


def _vshuf(builder, v, idx):
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def maddubs(builder, u, s8):
    """<16 x i16> adjacent pair sums of ``u * s8`` (<32 x i8>, ``u`` unsigned, ``s8`` signed;
    callers keep each pair sum inside int16): AVX2's ``vpmaddubsw`` where Numba compiles for
    an AVX2 CPU, else the same sums in generic IR."""
    t32 = ir.VectorType(_I8, 32)
    if _AVX2:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VectorType(_I16, 16), [t32, t32]),
            "llvm.x86.avx2.pmadd.ub.sw")
        return builder.call(fn, [u, s8])
    p = builder.mul(builder.zext(u, ir.VectorType(_I16, 32)), builder.sext(s8, ir.VectorType(_I16, 32)))
    return builder.add(_vshuf(builder, p, list(range(0, 32, 2))),
                       _vshuf(builder, p, list(range(1, 32, 2))))


def madd_wd(builder, a16, b16):
    """<8 x i32> adjacent pair sums of ``a16 * b16`` (<16 x i16> each): AVX2's ``vpmaddwd``
    where available, else generic IR (exact either way)."""
    if _AVX2:
        t16 = ir.VectorType(_I16, 16)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VectorType(_I32, 8), [t16, t16]),
            "llvm.x86.avx2.pmadd.wd")
        return builder.call(fn, [a16, b16])
    p = builder.mul(builder.sext(a16, ir.VectorType(_I32, 16)),
                    builder.sext(b16, ir.VectorType(_I32, 16)))
    return builder.add(_vshuf(builder, p, list(range(0, 16, 2))),
                       _vshuf(builder, p, list(range(1, 16, 2))))


@intrinsic
def dot32_i8(typingctx, w, wo, x, xo):
    """``sum(w[wo:wo+32] * x[xo:xo+32])`` as int32: ``w``, ``x`` 1-D int8 C-contiguous arrays
    (the caller guarantees the bounds); exact for int8 values whose products fit int16 (not
    both -128)."""
    sig = types.int32(w, wo, x, xo)

    def codegen(context, builder, signature, args):
        wa, wo_, xa, xo_ = args
        v32 = ir.VectorType(_I8, 32)

        def load(aty, arr, off):
            a = context.make_array(aty)(context, builder, arr)
            p = builder.gep(a.data, [off])
            return builder.load(builder.bitcast(p, v32.as_pointer()), align=1)
        # |w * x| <= 127 * 128: int16 products (vpmullw), then widened and summed
        vw = builder.sext(load(signature.args[0], wa, wo_), ir.VectorType(_I16, 32))
        vx = builder.sext(load(signature.args[2], xa, xo_), ir.VectorType(_I16, 32))
        p = builder.sext(builder.mul(vw, vx), ir.VectorType(_I32, 32))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [ir.VectorType(_I32, 32)]),
            "llvm.vector.reduce.add.v32i32")
        return builder.call(fn, [p])
    return sig, codegen


@intrinsic
def q4k_pairs(typingctx, w, wo, x, xo, sc, so, out4):
    """The four exact int32 sums ``sc[2p] * (w . x)_{2p} + sc[2p+1] * (w . x)_{2p+1}`` of one
    super-block's pairs of 32-element sub-blocks into ``out4[0:4]``: ``w`` the 4-bit values
    (0..15) and ``x`` int8 (256 at ``wo``/``xo``), ``sc`` int32 6-bit scales (8 at ``so``),
    ``out4`` int32. As ggml's kernels: ``maddubs`` pair sums in int16, ``madd`` with the scale
    to eight int32 lanes, the pair's lanes added, then reduced (integers: exact)."""
    sig = types.void(w, wo, x, xo, sc, so, out4)

    def codegen(context, builder, signature, args):
        wa, wo_, xa, xo_, sca, so_, oa = args
        tw, tx, tsc, to = signature.args[0], signature.args[2], signature.args[4], \
            signature.args[6]

        def ptr(aty, arr, off, vt):
            a = context.make_array(aty)(context, builder, arr)
            return builder.bitcast(builder.gep(a.data, [off]), vt.as_pointer())

        def shuf(v, idx):
            return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                          ir.Constant(ir.VectorType(_I32, len(idx)), idx))
        v32i8 = ir.VectorType(_I8, 32)
        v8i32 = ir.VectorType(_I32, 8)
        scv = builder.trunc(builder.load(ptr(tsc, sca, so_, v8i32), align=4),
                            ir.VectorType(_I16, 8))
        res = []
        for p in range(4):
            acc = None
            for h in range(2):
                j = 2 * p + h
                o = ir.Constant(ir.IntType(64), 32 * j)
                vw = builder.load(ptr(tw, wa, builder.add(wo_, o), v32i8), align=1)
                vx = builder.load(ptr(tx, xa, builder.add(xo_, o), v32i8), align=1)
                q = madd_wd(builder, maddubs(builder, vw, vx), shuf(scv, [j] * 16))
                acc = q if acc is None else builder.add(acc, q)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_I32, [v8i32]), "llvm.vector.reduce.add.v8i32")
            res.append(builder.call(fn, [acc]))
        a = context.make_array(to)(context, builder, oa)
        for p in range(4):
            builder.store(res[p], builder.gep(a.data, [ir.Constant(ir.IntType(64), p)]))
        return context.get_dummy_value()
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
    pr = np.zeros(4, np.int32)
    for y in range(Y):
        for c in range(C):
            acc = F32(0.0)
            accm = F32(0.0)
            for b in range(nb):
                so = (c * nb + b) * 8
                bo = (y * nb + b) * 8
                q4k_pairs(w4, (c * nb + b) * 256, xq, (y * nb + b) * 256, sc, so, pr)
                s = xd[y * nb + b]
                ds = dw[c * nb + b] * s
                dms = dmw[c * nb + b] * s
                if per_pair:
                    for p in range(4):
                        imin = mn[so + 2 * p] * xb[bo + 2 * p] + mn[so + 2 * p + 1] * xb[bo + 2 * p + 1]
                        acc = fma32(F32(pr[p]), ds, acc)
                        accm = fma32(F32(imin), dms, accm)
                else:
                    iacc = 0
                    imin = 0
                    for p in range(4):
                        iacc += pr[p]
                    for j in range(8):
                        imin += mn[so + j] * xb[bo + j]
                    acc = fma32(F32(iacc), ds, acc)
                    accm = fma32(F32(imin), dms, accm)
            out[y * C + c] = acc - accm
