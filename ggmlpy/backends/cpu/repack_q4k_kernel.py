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
def q4k_pairs(typingctx, w, wo, x, xo, sc, out4):
    """The four exact int32 sums ``sc[2p] * (q4 . q8)_{2p} + sc[2p+1] * (q4 . q8)_{2p+1}`` of one
    Q4_K super-block's pairs of 32-element sub-blocks into ``out4[0:4]``: ``w`` the block's
    128 bytes of nibbles at ``wo`` (uint8; byte ``32p + i`` holds element ``64p + i`` low and
    ``64p + 32 + i`` high), ``x`` the Q8_K quants (int8, 256 at ``xo``), ``sc`` int32 scales (8
    at 0), ``out4`` int32. As ggml's kernels: ``maddubs`` pair sums in int16, ``madd`` with the
    scale to eight int32 lanes, the pair's lanes added, then reduced (integers: exact)."""
    sig = types.void(w, wo, x, xo, sc, out4)

    def codegen(context, builder, signature, args):
        wa, wo_, xa, xo_, sca, oa = args
        tw, tx, tsc, to = (signature.args[i] for i in (0, 2, 4, 5))

        def ptr(aty, arr, off, vt):
            a = context.make_array(aty)(context, builder, arr)
            return builder.bitcast(builder.gep(a.data, [off]), vt.as_pointer())

        v32i8 = ir.VectorType(_I8, 32)
        v8i32 = ir.VectorType(_I32, 8)
        zero = ir.Constant(ir.IntType(64), 0)
        scv = builder.trunc(builder.load(ptr(tsc, sca, zero, v8i32), align=4),
                            ir.VectorType(_I16, 8))
        m4 = ir.Constant(v32i8, [15] * 32)
        sh4 = ir.Constant(v32i8, [4] * 32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [v8i32]), "llvm.vector.reduce.add.v8i32")
        a = context.make_array(to)(context, builder, oa)
        for p in range(4):
            raw = builder.load(ptr(tw, wa, builder.add(wo_, ir.Constant(ir.IntType(64), 32 * p)),
                                   v32i8), align=1)
            acc = None
            for h, q in enumerate((builder.and_(raw, m4), builder.lshr(raw, sh4))):
                j = 2 * p + h
                o = ir.Constant(ir.IntType(64), 32 * j)
                vx = builder.load(ptr(tx, xa, builder.add(xo_, o), v32i8), align=1)
                lanes = madd_wd(builder, maddubs(builder, q, vx), _vshuf(builder, scv, [j] * 16))
                acc = lanes if acc is None else builder.add(acc, lanes)
            builder.store(builder.call(fn, [acc]),
                          builder.gep(a.data, [ir.Constant(ir.IntType(64), p)]))
        return context.get_dummy_value()
    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def scales_mins(q, o, sc, mn):  # pragma: no cover - compiled
    """ggml's ``get_scale_min_k4`` for the 8 sub-blocks: the 12 bytes ``q[o:o+12]`` to the
    6-bit scales ``sc[0:8]`` and mins ``mn[0:8]`` (int32)."""
    for j in range(4):
        sc[j] = np.int32(q[o + j]) & 63
        mn[j] = np.int32(q[o + j + 4]) & 63
        sc[j + 4] = (np.int32(q[o + j + 8]) & 0xF) | ((np.int32(q[o + j]) >> 6) << 4)
        mn[j + 4] = (np.int32(q[o + j + 8]) >> 4) | ((np.int32(q[o + j + 4]) >> 6) << 4)


@njit(cache=True, nogil=True, inline="always")
def f16(q, o, tbl):  # pragma: no cover - compiled
    # the little-endian f16 at q[o:o+2] widened to float32 (through the 65536-entry table)
    return tbl[np.int64(q[o]) | (np.int64(q[o + 1]) << 8)]


@njit(cache=True, nogil=True, error_model="numpy")
def gemm_q4k(w, xq, xd, xb, out, m0, m1, y0, y1, nb, per_pair, tbl):  # pragma: no cover
    """``out[y, c - m0]`` for activation rows ``y0 <= y < y1`` and weight rows ``m0 <= c < m1``
    in ggml's repacked Q4_K order (arch/x86/repack.cpp): per step the exact integers ``sum_j
    sc[c,b,j] * dot(q4, q8)_j`` and ``sum_j mn[c,b,j] * bsum32[y,b,j]`` over its sub-blocks
    ``j``, then ``acc = fma(float(i), d*d8, acc)``, ``accm = fma(float(imin), dmin*d8, accm)``;
    the result ``acc - accm``. A step is a whole super-block (``ggml_gemv_q4_K_8x8_q8_K``) or,
    with ``per_pair``, each pair of sub-blocks (``ggml_gemm_q4_K_8x8_q8_K``).

    ``w`` uint8 ``(M, nb*144)`` the weight's blocks (read in place), ``xq`` int8 ``(N,
    nb*256)``, ``xd`` float32 ``(N, nb)``, ``xb`` int32 ``(N, nb*8)`` (sums of 32 quants),
    ``out`` float32 2-D (row ``y``, column ``c - m0``), ``tbl`` the f16 -> float32 table."""
    pr = np.zeros(4, np.int32)
    sc = np.zeros(8, np.int32)
    mn = np.zeros(8, np.int32)
    Y = y1 - y0
    acc = np.zeros(Y, F32)
    accm = np.zeros(Y, F32)
    wf = w.reshape(-1)
    xf = xq.reshape(-1)
    K = nb * 256
    for c in range(m0, m1):
        for i in range(Y):
            acc[i] = F32(0.0)
            accm[i] = F32(0.0)
        for b in range(nb):
            bo = c * w.shape[1] + b * 144
            d = f16(wf, bo, tbl)
            dmin = f16(wf, bo + 2, tbl)
            scales_mins(wf, bo + 4, sc, mn)
            for i in range(Y):
                y = y0 + i
                q4k_pairs(wf, bo + 16, xf, y * K + b * 256, sc, pr)
                s = xd[y, b]
                ds = d * s
                dms = dmin * s
                if per_pair:
                    for p in range(4):
                        imin = mn[2 * p] * xb[y, b * 8 + 2 * p] + mn[2 * p + 1] * xb[y, b * 8 + 2 * p + 1]
                        acc[i] = fma32(F32(pr[p]), ds, acc[i])
                        accm[i] = fma32(F32(imin), dms, accm[i])
                else:
                    iacc = pr[0] + pr[1] + pr[2] + pr[3]
                    imin = 0
                    for j in range(8):
                        imin += mn[j] * xb[y, b * 8 + j]
                    acc[i] = fma32(F32(iacc), ds, acc[i])
                    accm[i] = fma32(F32(imin), dms, accm[i])
        for i in range(Y):
            out[y0 + i, c - m0] = acc[i] - accm[i]
