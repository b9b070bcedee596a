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


def _q6k_lanes(context, builder, tw, wa, wo_, tx, xa, xo_, tsc, sca, so_, tbs, bsa, bo_):
    """The eight int32 lanes of one super-block (see :func:`q6k_block`) as ``<8 x i32>``."""
    v32i8, v8i32 = _v(_I8, 32), _v(_I32, 8)
    sc8 = builder.load(_ptr(context, builder, tsc, sca, so_, _v(_I8, 16)), align=1)
    scv = builder.sext(sc8, _v(_I32, 16))
    sc16 = builder.sext(sc8, _v(_I16, 16))
    sumi = ir.Constant(v8i32, [0] * 8)
    for j in range(2):
        for t in range(4):
            o = ir.Constant(ir.IntType(64), 128 * j + 32 * t)
            pw = _ptr(context, builder, tw, wa, builder.add(wo_, o), v32i8)
            px = _ptr(context, builder, tx, xa, builder.add(xo_, o), v32i8)
            # maddubs (q6 0..63 unsigned, q8 signed: pair sums < 2**15), then madd with the
            # run's two 16-element scales: lane l = bytes 4l..4l+3, as ggml's
            k = 2 * (4 * j + t)
            s16 = _shuf(builder, sc16, [k] * 8 + [k + 1] * 8)
            lanes = madd_wd(builder, maddubs(builder, builder.load(pw, align=1),
                                             builder.load(px, align=1)), s16)
            sumi = builder.add(sumi, lanes)
    bsv = builder.sext(builder.load(_ptr(context, builder, tbs, bsa, bo_, _v(_I16, 16)), align=1),
                       _v(_I32, 16))
    m = builder.mul(bsv, scv)
    corr = builder.add(_shuf(builder, m, list(range(0, 16, 2))),
                       _shuf(builder, m, list(range(1, 16, 2))))
    return builder.sub(sumi, builder.shl(corr, ir.Constant(v8i32, [5] * 8)))


@intrinsic
def q6k_block(typingctx, w, wo, x, xo, sc, so, bs, bo, d, acc):
    """``acc[0:8] = fma(d, float(S), acc[0:8])`` for one Q6_K super-block: ``S`` the eight
    int32 lanes of ggml's AVX2 ``ggml_vec_dot_q6_K_q8_K``: lane ``l`` sums ``scale * q6 * q8``
    over bytes ``4l..4l+3`` of each 32-element run (element ``128 j + 32 t + b``, scale of its
    16-element half), minus ``32 * (bsum[2l] * scale[2l] + bsum[2l+1] * scale[2l+1])``.
    ``w`` int8 q6 values 0..63 (256 at ``wo``), ``x`` int8 q8 (256 at ``xo``), ``sc`` int8
    scales (16 at ``so``), ``bs`` int16 bsums (16 at ``bo``), ``d`` float32, ``acc`` float32 (8
    lanes at 0, updated in place)."""
    sig = types.void(w, wo, x, xo, sc, so, bs, bo, d, acc)

    def codegen(context, builder, signature, args):
        wa, wo_, xa, xo_, sca, so_, bsa, bo_, d_, acca = args
        ta = signature.args
        sumi = _q6k_lanes(context, builder, ta[0], wa, wo_, ta[2], xa, xo_, ta[4], sca, so_,
                          ta[6], bsa, bo_)
        fv = builder.sitofp(sumi, _v(_F, 8))
        dv = _shuf(builder, builder.insert_element(ir.Constant(_v(_F, 8), ir.Undefined), d_,
                                                    ir.Constant(_I32, 0)), [0] * 8)
        pacc = _ptr(context, builder, ta[9], acca, ir.Constant(ir.IntType(64), 0), _v(_F, 8))
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_v(_F, 8), [_v(_F, 8)] * 3), "llvm.fma.v8f32")
        builder.store(builder.call(fma, [dv, fv, builder.load(pacc, align=4)]), pacc, align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def q6k_sum(typingctx, w, wo, x, xo, sc, so, bs, bo):
    """The exact integer ``sum_e scale * (q6 - 32) * q8`` of one super-block (the lanes of
    :func:`q6k_block` added), int32; arguments as :func:`q6k_block`'s."""
    sig = types.int32(w, wo, x, xo, sc, so, bs, bo)

    def codegen(context, builder, signature, args):
        ta = signature.args
        sumi = _q6k_lanes(context, builder, ta[0], args[0], args[1], ta[2], args[2], args[3],
                          ta[4], args[4], args[5], ta[6], args[6], args[7])
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_I32, [_v(_I32, 8)]), "llvm.vector.reduce.add.v8i32")
        return builder.call(fn, [sumi])
    return sig, codegen


@njit(cache=True, nogil=True, error_model="numpy")
def mul_mat_q6k(w6, sc, dw, xq, xd, xb, out, Y, C, nb, tiled):  # pragma: no cover - compiled
    """``out[y*C + c]``, the product of weight row ``c`` and activation row ``y`` in one of
    ggml-cpu's two x86 orders. ``tiled`` False: the AVX2 ``ggml_vec_dot_q6_K_q8_K``, per
    super-block ``b`` :func:`q6k_block` with ``d = xd[y,b] * dw[c,b]``, then ``hsum_float_8``
    (lanes ``i + 4``, then ``i + 2``, then ``0 + 1``). ``tiled`` True: the AVX-512 VNNI tiled
    kernel (tiled/tiled-kernel.cpp), per super-block ``acc = fma(float(S) * dw[c,b], xd[y,b],
    acc)`` with ``S`` the block's exact integer sum (:func:`q6k_sum`).
    ``w6`` int8 ``C*nb*256`` (q6 values 0..63 in element order), ``sc`` int8 ``C*nb*16``, ``dw``
    float32 ``C*nb``; ``xq`` int8 ``Y*nb*256``, ``xd`` float32 ``Y*nb``, ``xb`` int16
    ``Y*nb*16``; ``out`` float32 ``Y*C``; all 1-D C-contiguous."""
    acc = np.zeros(8, F32)
    for y in range(Y):
        for c in range(C):
            if tiled:
                a = F32(0.0)
                for b in range(nb):
                    s = q6k_sum(w6, (c * nb + b) * 256, xq, (y * nb + b) * 256, sc,
                                (c * nb + b) * 16, xb, (y * nb + b) * 16)
                    a = fma32(F32(s) * dw[c * nb + b], xd[y * nb + b], a)
                out[y * C + c] = a
                continue
            for i in range(8):
                acc[i] = F32(0.0)
            for b in range(nb):
                q6k_block(w6, (c * nb + b) * 256, xq, (y * nb + b) * 256, sc, (c * nb + b) * 16,
                          xb, (y * nb + b) * 16, xd[y * nb + b] * dw[c * nb + b], acc)
            r0 = acc[4] + acc[0]
            r1 = acc[5] + acc[1]
            r2 = acc[6] + acc[2]
            r3 = acc[7] + acc[3]
            out[y * C + c] = (r0 + r2) + (r1 + r3)
