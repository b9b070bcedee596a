"""Exact int16 GEMMs with AVX512-VNNI (``vpdpwssd``) for the K-quant integer steps.

The Q4_K and Q6_K products in llama.cpp's x86 orders (:mod:`.kquant_igemm_kernel`) take their
step sums from an int16 GEMM ``C[i, j] = sum_l A[i, l] * B[j, l]`` (``A`` the activations' int16
Q8_K quants, ``B`` the weight's int16 tile, int32 results; every partial sum stays in int32, so
any exact method gives the same integers). MKL's ``cblas_gemm_s16s16s32`` does it where MKL is
loaded, but a step is a small product (64 or 256 long) and MKL takes thousands of calls per
prompt batch, slowly on CPUs it does not tune for (on an AMD Zen 5 a 512-token Q4_K product
took 3.2x ggml's time). Here one compiled loop does it: the tile is first interleaved for
16 weight rows per 512-bit register (:func:`interleave_tile`), and each ``vpdpwssd`` adds two
products to each of 16 outputs, for 4 activation rows by 32 weight rows per tile (8 accumulator
registers), the results stored 16 contiguous outputs at a time (the last group of a chunk
masked).

Layouts: ``wi`` int16, flat: group ``g`` of 16 weight rows, pair ``p`` of tile columns
``2p, 2p + 1``, lane ``r``: ``wi[((g * (K / 2) + p) * 16 + r) * 2 + e] = B[16 g + r, 2 p + e]``
(0 past the chunk's rows). ``y`` int16 flat activation rows of stride ``ldy``; ``c`` int32 flat
with row stride ``ldc``. Only where :data:`ZMM` holds.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM
from ggmlpy.backends.cpu.qmatmul_ir import I32, _splat, _vec

__all__ = ["ZMM", "interleave_tile", "gemm16"]

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)
_DPWSSD = "llvm.x86.avx512.vpdpwssd.512"
_V16 = _vec(I32, 16)
I1 = ir.IntType(1)


def _codegen(R: int, G: int):
    def codegen(context, builder, sig, args):
        wi, wg, y, ya, ldy, npair, wlo, c, ca, ldc, left, half = args
        tw, ty, tc = sig.args[0], sig.args[2], sig.args[7]
        i64 = npair.type
        dw = context.make_array(tw)(context, builder, wi).data
        dy = context.make_array(ty)(context, builder, y).data
        dc = context.make_array(tc)(context, builder, c).data
        fn = cgutils.get_or_insert_function(builder.module,
                                            ir.FunctionType(_V16, [_V16, _V16, _V16]), _DPWSSD)
        acc = {(i, g): cgutils.alloca_once_value(builder, ir.Constant(_V16, [0] * 16))
               for i in range(R) for g in range(G)}
        p0 = builder.udiv(wlo, ir.Constant(i64, 2))
        with cgutils.for_range(builder, npair) as loop:
            p = loop.index
            ws = []
            for g in range(G):
                off = builder.mul(builder.add(builder.mul(builder.add(wg, ir.Constant(i64, g)),
                                                          half), builder.add(p0, p)),
                                  ir.Constant(i64, 32))
                ws.append(builder.load(builder.bitcast(builder.gep(dw, [off]),
                                                       _V16.as_pointer()), align=4))
            for i in range(R):
                off = builder.add(builder.add(ya, builder.mul(ir.Constant(i64, i), ldy)),
                                  builder.mul(p, ir.Constant(i64, 2)))
                yv = builder.load(builder.bitcast(builder.gep(dy, [off]), I32.as_pointer()),
                                  align=2)
                yb = _splat(builder, yv, 16)
                for g in range(G):
                    builder.store(builder.call(fn, [builder.load(acc[i, g]), ws[g], yb]),
                                  acc[i, g])
        store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_V16, _V16.as_pointer(), I32,
                                                            _vec(I1, 16)]),
            "llvm.masked.store.v16i32.p0v16i32")
        lanes = ir.Constant(_V16, list(range(16)))
        for g in range(G):
            rem = builder.trunc(builder.sub(left, ir.Constant(i64, 16 * g)), I32)
            mask = builder.icmp_signed("<", lanes, _splat(builder, rem, 16))
            for i in range(R):
                off = builder.add(builder.add(ca, builder.mul(ir.Constant(i64, i), ldc)),
                                  ir.Constant(i64, 16 * g))
                ptr = builder.bitcast(builder.gep(dc, [off]), _V16.as_pointer())
                builder.call(store, [builder.load(acc[i, g]), ptr, ir.Constant(I32, 4), mask])
        return context.get_dummy_value()
    return codegen


def _nothing(context, builder, sig, args):
    return context.get_dummy_value()


def _tile(R: int, G: int):
    def typer(typingctx, wi, wg, y, ya, ldy, npair, wlo, c, ca, ldc, left, half):
        return (types.none(wi, wg, y, ya, ldy, npair, wlo, c, ca, ldc, left, half),
                _codegen(R, G) if ZMM else _nothing)
    return typer


# tile_RG: R activation rows by G groups of 16 weight rows (``left`` rows of the chunk from
# the first group on: the lanes past them are not stored)
_tile42 = intrinsic(_tile(4, 2))
_tile41 = intrinsic(_tile(4, 1))
_tile12 = intrinsic(_tile(1, 2))
_tile11 = intrinsic(_tile(1, 1))


@njit(**_OPTS)
def interleave_tile(wt, mc, K, wi):  # pragma: no cover - compiled
    """``wi`` (flat int16, at least ``ceil(mc / 16) * 16 * K``) from the tile ``wt`` (int16
    ``(>= mc, K)``): the module docstring's layout, zeros past row ``mc``."""
    G = (mc + 15) // 16
    half = K // 2
    for g in range(G):
        for r in range(16):
            row = 16 * g + r
            base = (g * half * 16 + r) * 2
            if row < mc:
                for p in range(half):
                    wi[base + 32 * p] = wt[row, 2 * p]
                    wi[base + 32 * p + 1] = wt[row, 2 * p + 1]
            else:
                for p in range(half):
                    wi[base + 32 * p] = 0
                    wi[base + 32 * p + 1] = 0


@njit(**_OPTS)
def gemm16(nt, mc, k, y, yo, ldy, wi, K, wlo, c, co, ldc):  # pragma: no cover - compiled
    """``c[co + i*ldc + j] = sum_{l<k} y[yo + i*ldy + l] * B[j, wlo + l]`` for ``i < nt``,
    ``j < mc`` (int16 ``y`` flat; ``B`` the tile of ``K`` columns interleaved in ``wi``; int32
    ``c`` flat), exact: ``cblas_gemm_s16s16s32``'s result for MKL's call in
    :mod:`.kquant_igemm_kernel` (``k`` and ``wlo`` even)."""
    G = (mc + 15) // 16
    half = K // 2
    npair = k // 2
    n4 = nt - nt % 4
    i = 0
    while i < nt:  # 4 activation rows at a time, then one
        four = i < n4
        ya = yo + i * ldy
        ca = co + i * ldc
        g = 0
        while g < G:  # 2 groups of 16 weight rows at a time, then one
            two = g + 2 <= G
            a = (wi, g, y, ya, ldy, npair, wlo, c, ca + 16 * g, ldc, mc - 16 * g, half)
            if four and two:
                _tile42(*a)
            elif four:
                _tile41(*a)
            elif two:
                _tile12(*a)
            else:
                _tile11(*a)
            g += 2 if two else 1
        i += 4 if four else 1
