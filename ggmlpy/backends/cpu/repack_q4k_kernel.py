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


def _q4k_codegen(total):
    """The code of :func:`q4k_block` (``total`` False) and :func:`q4k_block_sum` (True)."""
    def codegen(context, builder, signature, args):
        wa, wo_, xa, xo_, xba, xbo_, oa = args
        tw, tx, txb, to = (signature.args[i] for i in (0, 2, 4, 6))
        i64 = ir.IntType(64)

        def ptr(aty, arr, off, vt):
            a = context.make_array(aty)(context, builder, arr)
            return builder.bitcast(builder.gep(a.data, [off]), vt.as_pointer())

        def c32(v):
            return ir.Constant(_I32, v)
        v32i8, v8i32 = ir.VectorType(_I8, 32), ir.VectorType(_I32, 8)
        u = builder.load(ptr(tw, wa, builder.add(wo_, ir.Constant(i64, 4)),
                             ir.VectorType(_I32, 3)), align=1)
        u0, u1, u2 = (builder.extract_element(u, c32(i)) for i in range(3))
        km1, km2, km3 = c32(0x3F3F3F3F), c32(0x0F0F0F0F), c32(0x03030303)
        u3 = builder.or_(builder.and_(builder.lshr(u2, c32(4)), km2),
                         builder.shl(builder.and_(builder.lshr(u1, c32(6)), km3), c32(4)))
        ua = builder.and_(u1, km1)
        u1n = builder.or_(builder.and_(u2, km2),
                          builder.shl(builder.and_(builder.lshr(u0, c32(6)), km3), c32(4)))
        u0n = builder.and_(u0, km1)
        v4 = ir.Constant(ir.VectorType(_I32, 4), ir.Undefined)
        for i, e in enumerate((u0n, u1n, ua, u3)):
            v4 = builder.insert_element(v4, e, c32(i))
        sm = builder.zext(builder.bitcast(v4, ir.VectorType(_I8, 16)), ir.VectorType(_I16, 16))
        mins = builder.zext(_vshuf(builder, sm, list(range(8, 16))), v8i32)
        bsum = builder.load(ptr(txb, xba, xbo_, v8i32), align=4)
        mb = builder.mul(mins, bsum)
        imin = builder.add(_vshuf(builder, mb, [0, 2, 4, 6]), _vshuf(builder, mb, [1, 3, 5, 7]))
        m4 = ir.Constant(v32i8, [15] * 32)
        sh4 = ir.Constant(v32i8, [4] * 32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [v8i32]), "llvm.vector.reduce.add.v8i32")
        a = context.make_array(to)(context, builder, oa)
        if total:
            tot = None
        for p in range(4):
            raw = builder.load(ptr(tw, wa, builder.add(wo_, ir.Constant(i64, 16 + 32 * p)),
                                   v32i8), align=1)
            acc = None
            for h, q in enumerate((builder.and_(raw, m4), builder.lshr(raw, sh4))):
                j = 2 * p + h
                vx = builder.load(ptr(tx, xa, builder.add(xo_, ir.Constant(i64, 32 * j)),
                                      v32i8), align=1)
                lanes = madd_wd(builder, maddubs(builder, q, vx), _vshuf(builder, sm, [j] * 16))
                acc = lanes if acc is None else builder.add(acc, lanes)
            if total:
                tot = acc if tot is None else builder.add(tot, acc)
                continue
            builder.store(builder.call(fn, [acc]), builder.gep(a.data, [ir.Constant(i64, p)]))
            builder.store(builder.extract_element(imin, c32(p)),
                          builder.gep(a.data, [ir.Constant(i64, 4 + p)]))
        if total:
            fn4 = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_I32, [ir.VectorType(_I32, 4)]),
                "llvm.vector.reduce.add.v4i32")
            builder.store(builder.call(fn, [tot]), builder.gep(a.data, [ir.Constant(i64, 0)]))
            builder.store(builder.call(fn4, [imin]), builder.gep(a.data, [ir.Constant(i64, 1)]))
        return context.get_dummy_value()
    return codegen


@intrinsic
def q4k_block(typingctx, w, wo, x, xo, xb, xbo, out8):
    """One Q4_K super-block against one Q8_K row, exact integers into ``out8[0:8]`` (int32):
    ``out8[p]`` = ``sc[2p] * (q4 . q8)_{2p} + sc[2p+1] * (q4 . q8)_{2p+1}`` and ``out8[4 + p]``
    = ``mn[2p] * bsum32[2p] + mn[2p+1] * bsum32[2p+1]`` for the pairs ``p`` of 32-element
    sub-blocks. ``w`` uint8: the block at ``wo`` (``d``, ``dmin``, ``scales[12]``, ``qs[128]``;
    qs byte ``32p + i`` holds element ``64p + i`` low and ``64p + 32 + i`` high); ``x`` int8
    (256 at ``xo``); ``xb`` int32 (the row's sums of 32 quants, 8 at ``xbo``). The 6-bit scales
    and mins are unpacked with 32-bit masks as ggml's AVX2 loops do (``kmask1..3``), the
    products summed as they do: ``maddubs`` pair sums in int16, ``madd`` with the scale into
    eight int32 lanes, the pair's lanes added and reduced."""
    return types.void(w, wo, x, xo, xb, xbo, out8), _q4k_codegen(False)


@intrinsic
def q4k_block_sum(typingctx, w, wo, x, xo, xb, xbo, out2):
    """:func:`q4k_block`'s sums added up (exact integers, so any order): ``out2[0]`` = ``sum_j
    sc[j] * (q4 . q8)_j`` and ``out2[1]`` = ``sum_j mn[j] * bsum32[j]`` over the super-block's
    8 sub-blocks (one horizontal sum each: the gemv's step, ``ggml_gemv_q4_K_8x8_q8_K``)."""
    return types.void(w, wo, x, xo, xb, xbo, out2), _q4k_codegen(True)


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
def gemm_q4k(w, xq, xd, xb, out, m0, m1, o0, y0, y1, nb, per_pair, tbl):  # pragma: no cover
    """``out[y, c - o0]`` for activation rows ``y0 <= y < y1`` and weight rows ``m0 <= c < m1``
    in ggml's repacked Q4_K order (arch/x86/repack.cpp): per step the exact integers ``sum_j
    sc[c,b,j] * dot(q4, q8)_j`` and ``sum_j mn[c,b,j] * bsum32[y,b,j]`` over its sub-blocks
    ``j`` (:func:`q4k_block`), then ``acc = fma(float(i), d*d8, acc)``, ``accm =
    fma(float(imin), dmin*d8, accm)``; the result ``acc - accm``. A step is a whole super-block
    (``ggml_gemv_q4_K_8x8_q8_K``) or, with ``per_pair``, each pair of sub-blocks
    (``ggml_gemm_q4_K_8x8_q8_K``).

    ``w`` uint8 ``(M, nb*144)`` the weight's blocks (read in place), ``xq`` int8 ``(N,
    nb*256)``, ``xd`` float32 ``(N, nb)``, ``xb`` int32 ``(N, nb*8)`` (sums of 32 quants),
    ``out`` float32 2-D C-contiguous, ``tbl`` the f16 -> float32 table."""
    r = np.zeros(8, np.int32)
    wf = w.reshape(-1)
    xf = xq.reshape(-1)
    bf = xb.reshape(-1)
    K = nb * 256
    row = w.shape[1]
    for c in range(m0, m1):
        for y in range(y0, y1):
            acc = F32(0.0)
            accm = F32(0.0)
            for b in range(nb):
                bo = c * row + b * 144
                if per_pair:
                    q4k_block(wf, bo, xf, y * K + b * 256, bf, y * nb * 8 + b * 8, r)
                else:
                    q4k_block_sum(wf, bo, xf, y * K + b * 256, bf, y * nb * 8 + b * 8, r)
                s = xd[y, b]
                ds = tbl[np.int64(wf[bo]) | (np.int64(wf[bo + 1]) << 8)] * s
                dms = tbl[np.int64(wf[bo + 2]) | (np.int64(wf[bo + 3]) << 8)] * s
                if per_pair:
                    for p in range(4):
                        acc = fma32(F32(r[p]), ds, acc)
                        accm = fma32(F32(r[4 + p]), dms, accm)
                else:
                    acc = fma32(F32(r[0]), ds, acc)
                    accm = fma32(F32(r[1]), dms, accm)
            out[y, c - o0] = acc - accm
