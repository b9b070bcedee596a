"""Numba kernels behind the integer-GEMM form of the Q4_K and Q6_K products in llama.cpp's x86
orders (:mod:`.repack_q4k`, :mod:`.vec_dot_q6k`; imported on first use only: importing this
module imports Numba). Module-level functions, so that Numba's on-disk cache finds them again.

Both orders take per step an exact integer sum and then apply float32 operations in a fixed
order. Integers have no order, so the step sums may come from any exact integer product: here
MKL's ``cblas_gemm_s16s16s32`` (int16 operands, int32 accumulation and result), called by
address from compiled code (:func:`gemm_s16`), over int16 tiles built from the weight's bytes:

* Q4_K, a step of 64 elements (a pair of 32-element sub-blocks, ``ggml_gemm_q4_K_8x8_q8_K``'s
  step): the tile holds ``sc_j * q4`` (6-bit scale times 4-bit value, at most 945), the
  activations are the Q8_K quants; ``iacc = sum_j sc_j (q4 . q8)_j`` is one GEMM output,
  ``|iacc| <= 64 * 128 * 945 < 2**23``. The min term ``imin = sum_j mn_j * bsum32_j`` (two
  products per step) is summed in the combining pass.
* Q6_K, a step of one super-block (256 elements, the tiled kernel's step): the tile holds
  ``scale * (q6 - 32)`` (int8 scale of the element's 16, at most ``128 * 32 = 4096`` in
  magnitude), ``|S| <= 256 * 128 * 4096 = 2**27``, exact in int32.

No partial sum can leave int32 (pairs of int16 products sum to at most ``2**21``), so every
integer equals the one ggml's SIMD loops compute (with alpha 1 and beta 0 MKL returns the
int32 sums as they are: the tests check the bounds themselves). The int16 GEMM is both faster
here than a float32 one and exact for Q6_K's ``2**27`` (float32 holds integers to ``2**24``).

Layout, per chunk of ``mc`` weight rows (the unit a thread claims): the tile ``(mc, K)``
int16, and for each tile of at most :data:`N_TILE` activation rows one GEMM per step writing
``cb[y, s, r]`` (int32 ``(min(N_TILE, N), S, mc)``, ``ldc = S * mc``), so that one activation row's
steps for the chunk lie together. The combining pass then runs ggml's float32 steps per output
in ggml's order: sixteen weight rows at a time in LLVM vector IR (:func:`q4k_out16`,
:func:`q6k_out16`: ``llvm.fma.v16f32``, one rounding per lane as
:func:`~ggmlpy.backends.cpu.fma_ir.fma32`; each lane its own output, the accumulators in
registers across the steps), the chunk's last ``mc % 16`` rows one by one with ``fma32``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.fma_ir import fma32
from ggmlpy.backends.cpu.repack_q4k_kernel import gemm_q4k, scales_mins
from ggmlpy.backends.cpu.s16_vnni_ir import gemm16, interleave_tile

F32 = np.float32
_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)
_I16, _I32 = ir.IntType(16), ir.IntType(32)
#: CBLAS enums: row major, no transpose, transpose, a fixed C offset (MKL's ``CblasFixOffset``)
_ROW_MAJOR, _NO_TRANS, _TRANS, _FIX_OFFSET = 101, 111, 112, 173
#: activation rows per tile of the integer products (one GEMM call per step and tile)
N_TILE = 256
#: the ``gemm`` address that selects the compiled AVX512-VNNI int16 GEMM
#: (:func:`.s16_vnni_ir.gemm16`) instead of a CBLAS function
VNNI_GEMM = -1


@intrinsic
def gemm_s16(typingctx, fn, m, n, k, a, ao, lda, b, bo, ldb, c, co, ldc, zero):
    """``c[co + i*ldc + j] = sum_l a[ao + i*lda + l] * b[bo + j*ldb + l]`` for ``i < m``, ``j <
    n``, ``l < k`` (int16 ``a``, ``b``; int32 ``c``; offsets and strides in elements): MKL's
    ``cblas_gemm_s16s16s32`` (row major, ``B`` transposed, alpha 1, beta 0, a fixed zero C
    offset ``zero[0]``) at address ``fn`` (int64, LP64 interface). Exact while no sum leaves
    int32."""
    sig = types.void(fn, m, n, k, a, ao, lda, b, bo, ldb, c, co, ldc, zero)

    def codegen(context, builder, signature, args):
        fa, ma, na, ka, aa, aoa, ldaa, ba, boa, ldba, ca, coa, ldca, za = args
        ta = signature.args
        i8p = ir.IntType(8).as_pointer()

        def ptr(i, arr, off):
            d = context.make_array(ta[i])(context, builder, arr).data
            return builder.bitcast(builder.gep(d, [off]), i8p)

        def i32(v):
            return builder.trunc(v, _I32)
        f = ir.FloatType()
        fnty = ir.FunctionType(ir.VoidType(), [_I32] * 7 + [f, i8p, _I32, _I16, i8p, _I32, _I16,
                                                          f, i8p, _I32, i8p])
        fp = builder.inttoptr(fa, fnty.as_pointer())
        zero = ir.Constant(_I32, 0)

        def k32(v):
            return ir.Constant(_I32, v)
        builder.call(fp, [k32(_ROW_MAJOR), k32(_NO_TRANS), k32(_TRANS), k32(_FIX_OFFSET),
                          i32(ma), i32(na), i32(ka), ir.Constant(f, 1.0),
                          ptr(4, aa, aoa), i32(ldaa), ir.Constant(_I16, 0),
                          ptr(7, ba, boa), i32(ldba), ir.Constant(_I16, 0),
                          ir.Constant(f, 0.0), ptr(10, ca, coa), i32(ldca),
                          ptr(13, za, zero)])
        return context.get_dummy_value()
    return sig, codegen


@njit(inline="always", **_OPTS)
def _step_sums(gemm, nt, mc, k, y16, yf, yo, K, wt, wi, wo, cbf, co, ldc,
               zero):  # pragma: no cover - compiled
    """``cbf[co + i*ldc + j] = sum_{l<k} y16[yo + i*K + l] * wt[j, wo + l]`` (``i < nt``, ``j <
    mc``): the compiled VNNI GEMM over the interleaved tile ``wi`` when ``gemm`` is
    :data:`VNNI_GEMM` (``yf``: ``y16`` flat), else the CBLAS function at address ``gemm``."""
    if gemm == VNNI_GEMM:
        gemm16(nt, mc, k, yf, yo, K, wi, K, wo, cbf, co, ldc)
    else:
        gemm_s16(gemm, nt, mc, k, y16, yo, K, wt, wo, K, cbf, co, ldc, zero)


@njit(**_OPTS)
def widen_rows(yq, y16, n1):  # pragma: no cover - compiled
    """``y16[:n1] = yq[:n1]`` (int8 ``(N, K)`` to int16)."""
    K = yq.shape[1]
    for n in range(n1):
        for e in range(K):
            y16[n, e] = yq[n, e]


@intrinsic
def q4k_pair_tile(typingctx, w, wo, s0, s1, wt, to):
    """One pair of Q4_K sub-blocks into a tile: the 32 bytes ``w[wo:wo+32]`` (uint8; element
    ``i`` low nibble, ``32 + i`` high) as ``wt[to + i] = s0 * (byte_i & 15)`` and ``wt[to + 32 +
    i] = s1 * (byte_i >> 4)`` (int16; ``s0``, ``s1`` the sub-blocks' 6-bit scales)."""
    sig = types.void(w, wo, s0, s1, wt, to)

    def codegen(context, builder, signature, args):
        f = _Flat(context, builder, signature.args, args)
        v8, v16 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(_I16, 32)
        q = f.vec(0, args[1], v8)
        lo = builder.zext(builder.and_(q, ir.Constant(v8, [15] * 32)), v16)
        hi = builder.zext(builder.lshr(q, ir.Constant(v8, [4] * 32)), v16)
        for k, (h, sc) in enumerate(((lo, args[2]), (hi, args[3]))):
            sv = _splat(builder, builder.trunc(sc, _I16), v16)
            dst = f.ptr(4, builder.add(args[5], ir.Constant(args[5].type, 32 * k)), v16)
            builder.store(builder.mul(h, sv), dst, align=2)
        return context.get_dummy_value()
    return sig, codegen


@njit(**_OPTS)
def q4k_tile(w, m0, m1, wt, dT, dmT, mnT, tbl):  # pragma: no cover - compiled
    """Weight rows ``m0 <= c < m1`` of a Q4_K weight (``w`` uint8 ``(M, nb*144)``) as int16
    ``wt[c - m0, e] = sc_j * q4_e`` (``(>= m1-m0, nb*256)``, ``j = e // 32``), and per block
    ``b``: ``dT[b, c - m0] = d``, ``dmT[b, c - m0] = dmin`` (float32), ``mnT[8b + j, c - m0]``
    the 6-bit mins (int32)."""
    row = w.shape[1]
    nb = row // 144
    K = nb * 256
    sc = np.empty(8, np.int32)
    mn = np.empty(8, np.int32)
    wf = w.reshape(-1)
    tf = wt.reshape(-1)
    for c in range(m0, m1):
        r = c - m0
        for b in range(nb):
            o = c * row + b * 144
            scales_mins(wf, o + 4, sc, mn)
            dT[b, r] = tbl[np.int64(wf[o]) | (np.int64(wf[o + 1]) << 8)]
            dmT[b, r] = tbl[np.int64(wf[o + 2]) | (np.int64(wf[o + 3]) << 8)]
            for j in range(8):
                mnT[8 * b + j, r] = mn[j]
            for p in range(4):
                q4k_pair_tile(wf, o + 16 + 32 * p, sc[2 * p], sc[2 * p + 1], tf,
                              r * K + b * 256 + 64 * p)


def _fma(builder, a, b, c):
    # llvm.fma on <16 x float>: one rounding per lane, as fma32
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3),
                                        "llvm.fma.v16f32")
    return builder.call(fn, [a, b, c])


def _splat(builder, v, vt):
    """``v`` (a scalar of ``vt``'s element type) in every lane of ``vt``."""
    x = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(x, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, vt.count), [0] * vt.count))


class _Flat:
    """Element and vector loads from the 1-D arrays among an intrinsic's arguments."""

    def __init__(self, context, builder, sig_args, args):
        self.b = builder
        self.data = [context.make_array(t)(context, builder, a).data
                     if isinstance(t, types.Array) else None for t, a in zip(sig_args, args)]

    def ptr(self, i, off, vt=None):
        p = self.b.gep(self.data[i], [off])
        return p if vt is None else self.b.bitcast(p, vt.as_pointer())

    def vec(self, i, off, vt):
        return self.b.load(self.ptr(i, off, vt), align=4)

    def scalar(self, i, off):
        return self.b.load(self.ptr(i, off))


_VI = ir.VectorType(_I32, 16)
_VF = ir.VectorType(ir.FloatType(), 16)


@intrinsic
def q4k_out16(typingctx, cb, cbo, mc, yd, ydo, b32, bo, dT, dmT, mnT, r, nb, out, oo):
    """Sixteen outputs of the repacked Q4_K gemm (one activation row, weight rows ``r ..
    r+15`` of a chunk of ``mc``; each lane its own output) over the flat arrays of
    :func:`q4k_combine`: per super-block ``b`` and pair ``p`` (step ``s = 4b + p``, ``j0 = 8b +
    2p``) ``acc = fma(float(cb[cbo + s*mc + l]), dT[b*mc + r + l] * yd[ydo + b], acc)`` and
    ``accm = fma(float(mnT[j0*mc + r + l] * b32[bo + j0] + mnT[(j0+1)*mc + r + l] * b32[bo +
    j0 + 1]), dmT[b*mc + r + l] * yd[ydo + b], accm)``; then ``out[oo + l] = acc - accm``.
    The accumulators stay in registers."""
    sig = types.void(cb, cbo, mc, yd, ydo, b32, bo, dT, dmT, mnT, r, nb, out, oo)

    def codegen(context, builder, signature, args):
        f = _Flat(context, builder, signature.args, args)
        cbo_, mc_, ydo_, bo_, r_, nb_, oo_ = (args[i] for i in (1, 2, 4, 6, 10, 11, 13))
        i64 = cbo_.type
        acc = cgutils.alloca_once_value(builder, ir.Constant(_VF, None))
        accm = cgutils.alloca_once_value(builder, ir.Constant(_VF, None))
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index
            s8 = _splat(builder, f.scalar(3, builder.add(ydo_, b)), _VF)
            bmc = builder.add(builder.mul(b, mc_), r_)
            ds = builder.fmul(f.vec(7, bmc, _VF), s8)
            dms = builder.fmul(f.vec(8, bmc, _VF), s8)
            for p in range(4):
                j0 = builder.add(builder.mul(b, ir.Constant(i64, 8)), ir.Constant(i64, 2 * p))
                j1 = builder.add(j0, ir.Constant(i64, 1))
                st = builder.add(builder.mul(b, ir.Constant(i64, 4)), ir.Constant(i64, p))
                i = builder.sitofp(f.vec(0, builder.add(cbo_, builder.mul(st, mc_)), _VI), _VF)
                builder.store(_fma(builder, i, ds, builder.load(acc)), acc)
                bj0 = _splat(builder, f.scalar(5, builder.add(bo_, j0)), _VI)
                bj1 = _splat(builder, f.scalar(5, builder.add(bo_, j1)), _VI)
                m0 = f.vec(9, builder.add(builder.mul(j0, mc_), r_), _VI)
                m1 = f.vec(9, builder.add(builder.mul(j1, mc_), r_), _VI)
                im = builder.add(builder.mul(m0, bj0), builder.mul(m1, bj1))
                builder.store(_fma(builder, builder.sitofp(im, _VF), dms, builder.load(accm)),
                              accm)
        builder.store(builder.fsub(builder.load(acc), builder.load(accm)),
                      f.ptr(12, oo_, _VF), align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def q6k_out16(typingctx, cb, cbo, mc, yd, ydo, dT, r, nb, out, oo):
    """Sixteen outputs of the tiled Q6_K order (one activation row, weight rows ``r .. r+15``
    of a chunk of ``mc``; each lane its own output): per super-block ``b`` ``acc =
    fma(float(cb[cbo + b*mc + l]) * dT[b*mc + r + l], yd[ydo + b], acc)``; then ``out[oo + l]
    = acc``. The accumulator stays in registers."""
    sig = types.void(cb, cbo, mc, yd, ydo, dT, r, nb, out, oo)

    def codegen(context, builder, signature, args):
        f = _Flat(context, builder, signature.args, args)
        cbo_, mc_, ydo_, r_, nb_, oo_ = (args[i] for i in (1, 2, 4, 6, 7, 9))
        acc = cgutils.alloca_once_value(builder, ir.Constant(_VF, None))
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index
            s8 = _splat(builder, f.scalar(3, builder.add(ydo_, b)), _VF)
            i = builder.sitofp(f.vec(0, builder.add(cbo_, builder.mul(b, mc_)), _VI), _VF)
            d = f.vec(5, builder.add(builder.mul(b, mc_), r_), _VF)
            builder.store(_fma(builder, builder.fmul(i, d), s8, builder.load(acc)), acc)
        builder.store(builder.load(acc), f.ptr(8, oo_, _VF), align=4)
        return context.get_dummy_value()
    return sig, codegen


@njit(**_OPTS)
def q4k_combine(cb, yd, b32, dT, dmT, mnT, out, n0, nt, mc, col0, acc, accm, ds,
                dms):  # pragma: no cover - compiled
    """ggml's float32 steps of the repacked gemm for activation rows ``n0 <= y < n0 + nt`` and
    ``mc`` weight rows: ``cb`` int32 ``(nt, 4*nb, mc)`` the steps' ``iacc``; per step ``acc =
    fma(float(iacc), d*d8, acc)``, ``accm = fma(float(imin), dmin*d8, accm)`` with ``imin =
    mn_2p * bsum32_2p + mn_2p+1 * bsum32_2p+1``; ``out[y, col0 + r] = acc - accm`` (``out``
    C-contiguous). Sixteen weight rows at a time (:func:`q4k_out16`), the rest one by one
    (``acc``, ``accm``, ``ds``, ``dms``: float32 scratch of ``mc``): the same operations per
    output."""
    nb = yd.shape[1]
    S = 4 * nb
    m16 = mc - mc % 16
    cbf, mnf, ydf, bf = cb.reshape(-1), mnT.reshape(-1), yd.reshape(-1), b32.reshape(-1)
    dTf, dmTf, of = dT.reshape(-1), dmT.reshape(-1), out.reshape(-1)
    ldo = out.shape[1]
    for yy in range(nt):
        y = n0 + yy
        for r in range(0, m16, 16):
            q4k_out16(cbf, yy * S * mc + r, mc, ydf, y * nb, bf, y * nb * 8, dTf, dmTf, mnf, r,
                      nb, of, y * ldo + col0 + r)
        if m16 == mc:
            continue
        for r in range(m16, mc):
            acc[r] = F32(0.0)
            accm[r] = F32(0.0)
        for b in range(nb):
            s8 = yd[y, b]
            for r in range(m16, mc):
                ds[r] = dT[b, r] * s8
                dms[r] = dmT[b, r] * s8
            for p in range(4):
                j0 = 8 * b + 2 * p
                bj0 = b32[y, j0]
                bj1 = b32[y, j0 + 1]
                co = (yy * S + 4 * b + p) * mc
                for r in range(m16, mc):
                    acc[r] = fma32(F32(cbf[co + r]), ds[r], acc[r])
                    im = mnT[j0, r] * bj0 + mnT[j0 + 1, r] * bj1
                    accm[r] = fma32(F32(im), dms[r], accm[r])
        for r in range(m16, mc):
            out[y, col0 + r] = acc[r] - accm[r]


@njit(**_OPTS)
def q4k_rows_igemm(gemm, w, y16, yq, yd, b32, out, ng, m0, m1, o0, tbl,
                   scratch16, scratch32):  # pragma: no cover - compiled
    """``out[:, c - o0]`` for weight rows ``m0 <= c < m1`` of a Q4_K weight: activation rows
    below ``ng`` in the repacked gemm's order through the integer GEMMs at address ``gemm``
    (:func:`gemm_s16` over ``y16``, the int16 Q8_K quants of those rows, and the tile of
    :func:`q4k_tile`), the rest in the gemv order (:func:`~.repack_q4k_kernel.gemm_q4k`).
    ``scratch16``/``scratch32``: from :func:`q4k_scratch` for ``m1 - m0`` rows."""
    N, K = yq.shape
    nb = K // 256
    mc = m1 - m0
    S = 4 * nb
    wt = scratch16[:mc * K].reshape(mc, K)
    wi = scratch16[mc * K:]
    o = 0
    ntile = max(1, min(N_TILE, ng))
    cb = scratch32[o:o + ntile * S * mc].reshape(ntile, S, mc)
    o += ntile * S * mc
    mnT = scratch32[o:o + 8 * nb * mc].reshape(8 * nb, mc)
    o += 8 * nb * mc
    fs = scratch32[o:].view(np.float32)
    dT = fs[:nb * mc].reshape(nb, mc)
    dmT = fs[nb * mc:2 * nb * mc].reshape(nb, mc)
    f0 = 2 * nb * mc
    acc, accm = fs[f0:f0 + mc], fs[f0 + mc:f0 + 2 * mc]
    ds, dms = fs[f0 + 2 * mc:f0 + 3 * mc], fs[f0 + 3 * mc:f0 + 4 * mc]
    zero = np.zeros(1, np.int32)
    if ng > 0:
        q4k_tile(w, m0, m1, wt, dT, dmT, mnT, tbl)
        if gemm == VNNI_GEMM:
            interleave_tile(wt, mc, K, wi)
        cbf = cb.reshape(-1)
        yf = y16.reshape(-1)
        for n0 in range(0, ng, ntile):
            nt = min(ntile, ng - n0)
            for s in range(S):
                _step_sums(gemm, nt, mc, 64, y16, yf, n0 * K + 64 * s, K, wt, wi, 64 * s,
                           cbf, s * mc, S * mc, zero)
            q4k_combine(cb, yd, b32, dT, dmT, mnT, out, n0, nt, mc, m0 - o0, acc, accm, ds,
                        dms)
    if ng < N:
        gemm_q4k(w, yq, yd, b32, out, m0, m1, o0, ng, N, nb, False, tbl)


@njit(**_OPTS)
def q4k_scratch(mc, K, n):  # pragma: no cover - compiled
    """The scratch of :func:`q4k_rows_igemm` for chunks of ``mc`` weight rows of ``K``
    elements and ``n`` grouped activation rows: int16 (the tile, then its interleaved form for
    :data:`VNNI_GEMM`) and int32 (the GEMM outputs
    of ``min(N_TILE, n)`` rows, the mins, float32 scales and accumulators)."""
    nb = K // 256
    return (np.empty(mc * K + 16 * ((mc + 15) // 16) * K, np.int16),
            np.empty(max(1, min(N_TILE, n)) * 4 * nb * mc + 8 * nb * mc + 2 * nb * mc + 4 * mc,
                     np.int32))


@intrinsic
def q6k_block_tile(typingctx, w, wo, wt, to):
    """One Q6_K super-block into a tile: its 210 bytes at ``w[wo]`` (uint8: ``ql[128]``,
    ``qh[64]``, ``scales[16]`` int8, ``d``) as ``wt[to + e] = scale_{e // 16} * (q6_e - 32)``
    (int16, element order; the 6-bit values unpacked as :func:`.vec_dot_q6k.decode_q6_k`)."""
    sig = types.void(w, wo, wt, to)

    def codegen(context, builder, signature, args):
        f = _Flat(context, builder, signature.args, args)
        v8, v16 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(_I16, 32)
        wo_, to_ = args[1], args[3]
        i64 = wo_.type

        def at(off):
            return builder.add(wo_, ir.Constant(i64, off))

        def c8(v):
            return ir.Constant(v8, [v] * 32)
        scales = builder.sext(f.vec(0, at(192), ir.VectorType(ir.IntType(8), 16)),
                              ir.VectorType(_I16, 16))
        for j in range(2):
            l1 = f.vec(0, at(64 * j), v8)
            l2 = f.vec(0, at(64 * j + 32), v8)
            qh = f.vec(0, at(128 + 32 * j), v8)
            qs = (builder.or_(builder.and_(l1, c8(15)), builder.shl(builder.and_(qh, c8(3)), c8(4))),
                  builder.or_(builder.and_(l2, c8(15)),
                              builder.shl(builder.and_(builder.lshr(qh, c8(2)), c8(3)), c8(4))),
                  builder.or_(builder.lshr(l1, c8(4)),
                              builder.shl(builder.and_(builder.lshr(qh, c8(4)), c8(3)), c8(4))),
                  builder.or_(builder.lshr(l2, c8(4)), builder.shl(builder.lshr(qh, c8(6)), c8(4))))
            for t in range(4):
                k = 8 * j + 2 * t                   # the scales of elements 16k.. and 16(k+1)..
                sv = builder.shuffle_vector(scales, ir.Constant(scales.type, ir.Undefined),
                                            ir.Constant(ir.VectorType(_I32, 32),
                                                        [k] * 16 + [k + 1] * 16))
                v = builder.sub(builder.zext(qs[t], v16), ir.Constant(v16, [32] * 32))
                dst = f.ptr(2, builder.add(to_, ir.Constant(i64, 128 * j + 32 * t)), v16)
                builder.store(builder.mul(v, sv), dst, align=2)
        return context.get_dummy_value()
    return sig, codegen


@njit(**_OPTS)
def q6k_tile(w, m0, m1, wt, dT, tbl):  # pragma: no cover - compiled
    """Weight rows ``m0 <= c < m1`` of a Q6_K weight (``w`` uint8 ``(M, nb*210)``) as int16
    ``wt[c - m0, e] = scale_{e // 16} * (q6_e - 32)`` and ``dT[b, c - m0] = d`` (float32)."""
    row = w.shape[1]
    nb = row // 210
    K = nb * 256
    wf = w.reshape(-1)
    tf = wt.reshape(-1)
    for c in range(m0, m1):
        r = c - m0
        for b in range(nb):
            o = c * row + b * 210
            dT[b, r] = tbl[np.int64(wf[o + 208]) | (np.int64(wf[o + 209]) << 8)]
            q6k_block_tile(wf, o, tf, r * K + b * 256)


@njit(**_OPTS)
def q6k_combine(cb, yd, dT, out, n0, nt, mc, col0, acc):  # pragma: no cover - compiled
    """The tiled kernel's float32 steps for activation rows ``n0 <= y < n0 + nt`` and ``mc``
    weight rows: ``cb`` int32 ``(nt, nb, mc)`` the blocks' exact ``S``; per block ``acc =
    fma(float(S) * d, d8, acc)``; ``out[y, col0 + r] = acc`` (``out`` C-contiguous). Sixteen
    weight rows at a time (:func:`q6k_out16`), the rest one by one (``acc``: float32 scratch
    of ``mc``): the same operations per output."""
    nb = yd.shape[1]
    m16 = mc - mc % 16
    cbf, ydf, dTf, of = cb.reshape(-1), yd.reshape(-1), dT.reshape(-1), out.reshape(-1)
    ldo = out.shape[1]
    for yy in range(nt):
        y = n0 + yy
        for r in range(0, m16, 16):
            q6k_out16(cbf, yy * nb * mc + r, mc, ydf, y * nb, dTf, r, nb, of,
                      y * ldo + col0 + r)
        for r in range(m16, mc):
            acc[r] = F32(0.0)
        for b in range(nb):
            s8 = yd[y, b]
            co = (yy * nb + b) * mc
            for r in range(m16, mc):
                acc[r] = fma32(F32(cbf[co + r]) * dT[b, r], s8, acc[r])
        for r in range(m16, mc):
            out[y, col0 + r] = acc[r]


@njit(**_OPTS)
def q6k_rows_igemm(gemm, w, y16, yd, out, m0, m1, o0, tbl, scratch16,
                   scratch32):  # pragma: no cover - compiled
    """``out[:, c - o0]`` for weight rows ``m0 <= c < m1`` of a Q6_K weight in the tiled
    kernel's order, the block sums from the integer GEMMs at address ``gemm`` over ``y16``
    (int16 Q8_K quants) and the tile of :func:`q6k_tile`. Scratch from :func:`q6k_scratch`."""
    N, K = y16.shape
    nb = K // 256
    mc = m1 - m0
    wt = scratch16[:mc * K].reshape(mc, K)
    wi = scratch16[mc * K:]
    ntile = max(1, min(N_TILE, N))
    cb = scratch32[:ntile * nb * mc].reshape(ntile, nb, mc)
    fs = scratch32[ntile * nb * mc:].view(np.float32)
    dT = fs[:nb * mc].reshape(nb, mc)
    acc = fs[nb * mc:nb * mc + mc]
    zero = np.zeros(1, np.int32)
    q6k_tile(w, m0, m1, wt, dT, tbl)
    if gemm == VNNI_GEMM:
        interleave_tile(wt, mc, K, wi)
    cbf = cb.reshape(-1)
    yf = y16.reshape(-1)
    for n0 in range(0, N, ntile):
        nt = min(ntile, N - n0)
        for b in range(nb):
            _step_sums(gemm, nt, mc, 256, y16, yf, n0 * K + 256 * b, K, wt, wi, 256 * b,
                       cbf, b * mc, nb * mc, zero)
        q6k_combine(cb, yd, dT, out, n0, nt, mc, m0 - o0, acc)


@njit(**_OPTS)
def q6k_scratch(mc, K, n):  # pragma: no cover - compiled
    """The scratch of :func:`q6k_rows_igemm` for chunks of ``mc`` weight rows of ``K``
    elements and ``n`` activation rows: int16 (the tile, then its interleaved form for
    :data:`VNNI_GEMM`) and int32 (the GEMM outputs of
    ``min(N_TILE, n)`` rows, float32 scales and accumulator)."""
    nb = K // 256
    nt = max(1, min(N_TILE, n))
    return (np.empty(mc * K + 16 * ((mc + 15) // 16) * K, np.int16),
            np.empty(nt * nb * mc + nb * mc + mc, np.int32))
