"""The Numba kernel behind :mod:`ggmlpy.backends.cpu.vec_dot_q6k` (imported by it on first use
only; importing this module imports Numba). A module-level function, so that Numba's on-disk
cache finds it again in a later process. One super-block of one dot product is one intrinsic
(LLVM vector IR): ggml's eight int32 lanes, exact, then one ``llvm.fma`` of eight float32 lanes
(the vec_dot order) or their exact sum (the tiled order).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.fma_ir import fma32
from ggmlpy.backends.cpu.repack_q4k_kernel import madd_wd, maddubs

F32 = np.float32
_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F = ir.FloatType()


def _v(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _ptr(context, builder, aty, arr, off, vt: ir.VectorType):
    a = context.make_array(aty)(context, builder, arr)
    return builder.bitcast(builder.gep(a.data, [off]), vt.as_pointer())


def _shuf(builder, v, idx: list[int]):
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                  ir.Constant(_v(_I32, len(idx)), idx))


def _q6k_lanes(context, builder, tw, wa, wo_, tx, xa, xo_, tbs, bsa, bo_):
    """The eight int32 lanes of one super-block (see :func:`q6k_block`) as ``<8 x i32>``, the
    6-bit values unpacked from the block's bytes as ggml's AVX2 loop does (``ql`` nibbles, two
    ``qh`` bits each)."""
    v32i8, v8i32 = _v(_I8, 32), _v(_I32, 8)
    i64 = ir.IntType(64)

    def at(off):
        return builder.add(wo_, ir.Constant(i64, off))

    def c8(v):
        return ir.Constant(v32i8, [v] * 32)
    sc8 = builder.load(_ptr(context, builder, tw, wa, at(192), _v(_I8, 16)), align=1)
    scv = builder.sext(sc8, _v(_I32, 16))
    sc16 = builder.sext(sc8, _v(_I16, 16))
    sumi = ir.Constant(v8i32, [0] * 8)
    for j in range(2):
        l1 = builder.load(_ptr(context, builder, tw, wa, at(64 * j), v32i8), align=1)
        l2 = builder.load(_ptr(context, builder, tw, wa, at(64 * j + 32), v32i8), align=1)
        qh = builder.load(_ptr(context, builder, tw, wa, at(128 + 32 * j), v32i8), align=1)
        qs = (builder.or_(builder.and_(l1, c8(15)), builder.shl(builder.and_(qh, c8(3)), c8(4))),
              builder.or_(builder.and_(l2, c8(15)),
                          builder.shl(builder.and_(builder.lshr(qh, c8(2)), c8(3)), c8(4))),
              builder.or_(builder.lshr(l1, c8(4)),
                          builder.shl(builder.and_(builder.lshr(qh, c8(4)), c8(3)), c8(4))),
              builder.or_(builder.lshr(l2, c8(4)),
                          builder.shl(builder.lshr(qh, c8(6)), c8(4))))
        for t in range(4):
            px = _ptr(context, builder, tx, xa,
                      builder.add(xo_, ir.Constant(i64, 128 * j + 32 * t)), v32i8)
            # maddubs (q6 0..63 unsigned, q8 signed: pair sums < 2**15), then madd with the
            # run's two 16-element scales: lane l = bytes 4l..4l+3, as ggml's
            k = 2 * (4 * j + t)
            s16 = _shuf(builder, sc16, [k] * 8 + [k + 1] * 8)
            lanes = madd_wd(builder, maddubs(builder, qs[t], builder.load(px, align=1)), s16)
            sumi = builder.add(sumi, lanes)
    bsv = builder.sext(builder.load(_ptr(context, builder, tbs, bsa, bo_, _v(_I16, 16)), align=1),
                       _v(_I32, 16))
    m = builder.mul(bsv, scv)
    corr = builder.add(_shuf(builder, m, list(range(0, 16, 2))),
                       _shuf(builder, m, list(range(1, 16, 2))))
    return builder.sub(sumi, builder.shl(corr, ir.Constant(v8i32, [5] * 8)))


@intrinsic
def q6k_block(typingctx, w, wo, x, xo, bs, bo, d, acc):
    """``acc[0:8] = fma(d, float(S), acc[0:8])`` for one Q6_K super-block: ``S`` the eight
    int32 lanes of ggml's AVX2 ``ggml_vec_dot_q6_K_q8_K``: lane ``l`` sums ``scale * q6 * q8``
    over bytes ``4l..4l+3`` of each 32-element run (element ``128 j + 32 t + b``, scale of its
    16-element half), minus ``32 * (bsum[2l] * scale[2l] + bsum[2l+1] * scale[2l+1])``.
    ``w`` the block's 210 bytes at ``wo`` (uint8: ``ql[128]``, ``qh[64]``, ``scales[16]``
    int8, ``d``), ``x`` int8 q8 (256 at ``xo``), ``bs`` int16 bsums (16 at ``bo``), ``d``
    float32 (``d8 * d``), ``acc`` float32 (8 lanes at 0, updated in place)."""
    sig = types.void(w, wo, x, xo, bs, bo, d, acc)

    def codegen(context, builder, signature, args):
        wa, wo_, xa, xo_, bsa, bo_, d_, acca = args
        ta = signature.args
        sumi = _q6k_lanes(context, builder, ta[0], wa, wo_, ta[2], xa, xo_, ta[4], bsa, bo_)
        fv = builder.sitofp(sumi, _v(_F, 8))
        dv = _shuf(builder, builder.insert_element(ir.Constant(_v(_F, 8), ir.Undefined), d_,
                                                    ir.Constant(_I32, 0)), [0] * 8)
        pacc = _ptr(context, builder, ta[7], acca, ir.Constant(ir.IntType(64), 0), _v(_F, 8))
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_v(_F, 8), [_v(_F, 8)] * 3), "llvm.fma.v8f32")
        builder.store(builder.call(fma, [dv, fv, builder.load(pacc, align=4)]), pacc, align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def q6k_sum(typingctx, w, wo, x, xo, bs, bo):
    """The exact integer ``sum_e scale * (q6 - 32) * q8`` of one super-block (the lanes of
    :func:`q6k_block` added), int32; arguments as :func:`q6k_block`'s."""
    sig = types.int32(w, wo, x, xo, bs, bo)

    def codegen(context, builder, signature, args):
        ta = signature.args
        sumi = _q6k_lanes(context, builder, ta[0], args[0], args[1], ta[2], args[2], args[3],
                          ta[4], args[4], args[5])
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [_v(_I32, 8)]), "llvm.vector.reduce.add.v8i32")
        return builder.call(fn, [sumi])
    return sig, codegen


@njit(cache=True, nogil=True, error_model="numpy")
def mul_mat_q6k(w, xq, xd, xb, out, m0, m1, o0, nb, tiled, tbl):  # pragma: no cover - compiled
    """``out[y, c - o0]`` for every activation row ``y`` and weight rows ``m0 <= c < m1`` in one
    of ggml-cpu's two x86 orders. ``tiled`` False: the AVX2 ``ggml_vec_dot_q6_K_q8_K``, per
    super-block ``b`` :func:`q6k_block` with ``d8 * d``, then ``hsum_float_8`` (lanes ``i + 4``,
    then ``i + 2``, then ``0 + 1``). ``tiled`` True: the AVX-512 VNNI tiled kernel
    (tiled/tiled-kernel.cpp), per super-block ``acc = fma(float(S) * d, d8, acc)`` with ``S``
    the block's exact integer sum (:func:`q6k_sum`).

    ``w`` uint8 ``(M, nb*210)`` the weight's blocks (read in place), ``xq`` int8 ``(N,
    nb*256)``, ``xd`` float32 ``(N, nb)``, ``xb`` int16 ``(N, nb*16)``; ``out`` float32 2-D C-contiguous;
    ``tbl`` the f16 -> float32 table."""
    N = xq.shape[0]
    K = nb * 256
    acc = np.zeros(8, F32)
    wf = w.reshape(-1)
    xf = xq.reshape(-1)
    bf = xb.reshape(-1)
    for c in range(m0, m1):
        for y in range(N):
            if tiled:
                a = F32(0.0)
                for b in range(nb):
                    bo = c * w.shape[1] + b * 210
                    d = tbl[np.int64(wf[bo + 208]) | (np.int64(wf[bo + 209]) << 8)]
                    s = q6k_sum(wf, bo, xf, y * K + b * 256, bf, (y * nb + b) * 16)
                    a = fma32(F32(s) * d, xd[y, b], a)
                out[y, c - o0] = a
                continue
            for i in range(8):
                acc[i] = F32(0.0)
            for b in range(nb):
                bo = c * w.shape[1] + b * 210
                d = tbl[np.int64(wf[bo + 208]) | (np.int64(wf[bo + 209]) << 8)]
                q6k_block(wf, bo, xf, y * K + b * 256, bf, (y * nb + b) * 16, xd[y, b] * d, acc)
            r0 = acc[4] + acc[0]
            r1 = acc[5] + acc[1]
            r2 = acc[6] + acc[2]
            r3 = acc[7] + acc[3]
            out[y, c - o0] = (r0 + r2) + (r1 + r3)
