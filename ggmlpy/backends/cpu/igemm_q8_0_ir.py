"""Q8_0 prompt-batch tiles as an integer GEMM: one output per 32-bit lane, whole-block integer sums.

The legacy tiles of :mod:`ggmlpy.backends.cpu.legacy_zmm_ir` keep each output in 8 float32
lanes (ggml-cpu's AVX order): per block they pay a conversion, a scale product and a fused
multiply-add for every 64 products, as many vector operations per product as a float32 GEMM.
Here a 512-bit register holds one output in each of its 16 lanes, 16 activation rows against one
weight row, so that a block's 32 products of each output are summed in integers by 8
``vpdpbusd`` (4 products per lane each) before the one float step of the block: about 12 vector
operations per 512 products instead of 32.

The operands (``ggmlpy.backends.cpu.igemm_q8_0``):

* ``arep`` uint8 ``(G, nb * 512)``: the Q8_0 activation quants of 16 rows per group ``g``,
  interleaved 4 at a time: byte ``b * 512 + q * 64 + 4 * l + j`` is row ``16 g + l``'s quant
  ``32 b + 4 q + j`` plus 128 (unsigned, for ``vpdpbusd``; rows past the last hold 128: zero);
* ``drep`` float32 ``(G, nb * 16)``: those rows' block scales (f16 values; 0 past the last);
* the weight's Q8_0 rows as they lie (``w`` uint8 ``(M, nb * 34)``), each 4 quants broadcast
  to the 16 lanes from memory;
* ``csum`` int32 ``(RW, nb)``: ``-128 * sum(quants)`` of each weight row's block, where each
  lane's block sum starts (the 128 added to the activations, taken out exactly).

Numerics: per output, block by block, ``sumf += float(sumi) * (d_w * d_y)`` with ``sumi`` the
block's exact integer sum and no fused multiply-add: ggml's scalar ``ggml_vec_dot_q8_0_q8_0``
(its generic C, ggml-cpu/quants.c) bit for bit, the order of
:func:`ggmlpy.quants.vec_dot.dot_unpacked` (tested). Not the 8-lane AVX order of llama.cpp on
x86 (the legacy tiles of the default ``GGMLPY_QUANT_MATMUL=ggml``), but within the float32
rounding of a summation order of it; used in the ``fast`` mode only
(:func:`ggmlpy.backends.cpu.qmatmul.igemm_applies`).

Only where :data:`ZMM` holds (AVX512-F, -BW, -VNNI); the intrinsics compile to nothing elsewhere.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM, _dpbusd16
from ggmlpy.backends.cpu.qmatmul_ir import F32T, I8, I16, I32, _at, _elem_ptr, _shuf, _splat, _vec

__all__ = ["ZMM", "RW", "GROUP", "itile_q8_0_1", "itile_q8_0_2", "itile_q8_0_3",
           "itile1_q8_0_1", "itile1_q8_0_2", "itile1_q8_0_3"]

#: weight rows of a full tile (its 16-lane groups of activation rows: 1 to 3)
RW = 4
#: activation rows per lane group (one 512-bit register of int32 or float32)
GROUP = 16


def _codegen(rw: int, ng: int):
    def codegen(context, builder, sig, args):
        w, r0, arep, drep, csum, g0, out, mc, nrow, tbl, nb = args
        tw, ta, td, tc, tout, ttbl = (sig.args[i] for i in (0, 2, 3, 4, 6, 9))
        i64 = nb.type
        v16f = _vec(F32T, 16)

        def c64(v):
            return ir.Constant(i64, v)

        wrows = [builder.add(r0, ir.Constant(r0.type, i)) for i in range(rw)]
        grows = [builder.add(g0, ir.Constant(g0.type, g)) for g in range(ng)]
        acc = {(i, g): cgutils.alloca_once_value(builder, ir.Constant(v16f, [0.0] * 16))
               for i in range(rw) for g in range(ng)}
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            o = builder.mul(b, c64(34))
            dw, s = [], {}
            for i, wr in enumerate(wrows):
                bits = builder.load(builder.bitcast(_at(context, builder, tw, w, wr, o),
                                                    I16.as_pointer()), align=1)
                dw.append(_splat(builder, builder.load(_elem_ptr(
                    context, builder, ttbl, tbl, builder.zext(bits, i64))), 16))
                c = builder.load(_at(context, builder, tc, csum, ir.Constant(i64, i), b))
                for g in range(ng):
                    s[i, g] = _splat(builder, c, 16)
            ab = builder.mul(b, c64(512))
            for q in range(8):
                av = [builder.load(builder.bitcast(
                    _at(context, builder, ta, arep, gr, builder.add(ab, c64(64 * q))),
                    _vec(I8, 64).as_pointer()), align=4) for gr in grows]
                for i, wr in enumerate(wrows):
                    wq = builder.load(builder.bitcast(
                        _at(context, builder, tw, w, wr, builder.add(o, c64(2 + 4 * q))),
                        I32.as_pointer()), align=1)
                    wv = builder.bitcast(_splat(builder, wq, 16), _vec(I8, 64))
                    for g in range(ng):
                        s[i, g] = _dpbusd16(builder, s[i, g], av[g], wv)
            for g, gr in enumerate(grows):
                dy = builder.load(builder.bitcast(
                    _at(context, builder, td, drep, gr, builder.mul(b, c64(16))),
                    v16f.as_pointer()), align=4)
                for i in range(rw):
                    d = builder.fmul(dw[i], dy)  # d_w * d_y, then float(sumi) * that, then +
                    t = builder.fmul(builder.sitofp(s[i, g], v16f), d)
                    builder.store(builder.fadd(builder.load(acc[i, g]), t), acc[i, g])
        _store(context, builder, tout, out, {k: builder.load(v) for k, v in acc.items()},
               rw, ng, g0, mc, nrow)
        return context.get_dummy_value()
    return codegen


def _store(context, builder, tout, out, acc: dict, rw: int, ng: int, g0, mc, nrow) -> None:
    """``out[16 (g0 + g) + l, mc + i] = acc[i, g][l]`` for the rows below ``nrow``: the tile
    transposed, one ``rw``-float store per activation row where ``out``'s rows are contiguous."""
    a = context.make_array(tout)(context, builder, out)
    stride1 = cgutils.unpack_tuple(builder, a.strides, 2)[1]
    contiguous = builder.icmp_signed("==", stride1, ir.Constant(stride1.type, 4))
    base = builder.mul(g0, ir.Constant(g0.type, 16))
    for g in range(ng):
        regs = [acc[i, g] for i in range(rw)]
        while len(regs) & (len(regs) - 1):  # a power of two of registers for the concatenation
            regs.append(regs[0])
        while len(regs) > 1:
            regs = [_shuf(builder, regs[k], regs[k + 1], list(range(2 * regs[k].type.count)))
                    for k in range(0, len(regs), 2)]
        flat = regs[0]
        for lane in range(16):
            n = builder.add(base, ir.Constant(base.type, 16 * g + lane))
            with builder.if_then(builder.icmp_signed("<", n, nrow), likely=True):
                row = _shuf(builder, flat, flat, [16 * i + lane for i in range(rw)])
                with builder.if_else(contiguous) as (then, otherwise):
                    with then:
                        p = _at(context, builder, tout, out, n, mc)
                        builder.store(row, builder.bitcast(p, row.type.as_pointer()), align=4)
                    with otherwise:
                        for i in range(rw):
                            builder.store(builder.extract_element(row, ir.Constant(I32, i)),
                                          _at(context, builder, tout, out, n,
                                              builder.add(mc, ir.Constant(mc.type, i))))


def _nothing(context, builder, sig, args):
    return context.get_dummy_value()


def _tile(rw: int, ng: int):
    def typer(typingctx, w, r0, arep, drep, csum, g0, out, mc, nrow, tbl, nb):
        return (types.none(w, r0, arep, drep, csum, g0, out, mc, nrow, tbl, nb),
                _codegen(rw, ng) if ZMM else _nothing)
    return typer


# itile_q8_0_G: RW weight rows by G groups of 16 activation rows; itile1_*: one weight row (the
# rows left over past a multiple of RW)
itile_q8_0_1 = intrinsic(_tile(RW, 1))
itile_q8_0_2 = intrinsic(_tile(RW, 2))
itile_q8_0_3 = intrinsic(_tile(RW, 3))
itile1_q8_0_1 = intrinsic(_tile(1, 1))
itile1_q8_0_2 = intrinsic(_tile(1, 2))
itile1_q8_0_3 = intrinsic(_tile(1, 3))
