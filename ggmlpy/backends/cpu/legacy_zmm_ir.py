"""The legacy block kernels' prompt-batch tiles in 512-bit vectors: two weight rows per register.

ggml-cpu's ``vec_dot`` for the legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 against Q8_0/Q8_1;
ggml-cpu/arch/x86/quants.c, and llamafile's ``tinyBLAS_Q0_AVX`` tiles, which sum the same way)
keeps each output in 8 float32 lanes: per block, the 32 integer products summed 4 at a time
into 8 exact int32 lanes, converted to float32, and added to the lanes with one fused
multiply-add by the block's scale ``d_w * d_y``; the lanes are added as a fixed tree at the end
(:mod:`ggmlpy.backends.cpu.qmatmul_ir`). Here one 512-bit register holds two such outputs, the
same activation row against two weight rows (lanes 0-7: the first weight row, 8-15: the
second), so every vector instruction does the work of two 256-bit ones while each output keeps
its own 8 lanes and its own operations in ggml's order: the results are bit for bit those of
the 256-bit tiles (``qmatmul_ir.row44_*``; tested). At the end each output's 8 lanes are added
as ggml's ``hsum_float_8`` tree for all the tile's outputs at once (:func:`_tree_regs`). On CPUs
with two 512-bit multiply-add units (Intel server cores) the legacy products of prompt batches
are 1.3x (Q4_0/Q5_0/Q8_0) to 1.5-1.9x (Q4_1/Q5_1) faster at 512 rows, 1.2-1.4x at 100-364
(one thread; docs/quant_matmul.md); elsewhere ``GGMLPY_CPU_ZMM=0`` keeps the 256-bit tiles.

A tile is ``2 * PZ`` weight rows by ``R`` activation rows (``2 PZ x R / 2`` accumulator
registers): each weight block pair decoded once for the ``R`` activation rows (Q4/Q5 nibbles
of both blocks in one GFNI instruction, Q5's fifth bits of both through one 64-bit mask), each
activation block broadcast to both halves by its load. With VNNI the unsigned quants meet the
activations in one ``vpdpbusd`` started from the activations' offset sums
(``qmatmul_ir.legacy_offsets``), as in the 256-bit rows.

Arguments as ``qmatmul_ir``'s legacy rows: ``(w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb)``;
callers guarantee the bounds (``m + 2 PZ <= M``, ``n0 + R <= N``). Used only where
:data:`ZMM` holds.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.qmatmul_ir import (
    _GFNI,
    _LEGACY_LAYOUT,
    _VNNI_SUB,
    F32T,
    I8,
    I32,
    I64,
    LEGACY_PREFETCH_ROWS,
    VNNI,
    _at,
    _elem_ptr,
    _fma,
    _host_has,
    _prefetch,
    _shuf,
    _splat,
    _vec,
    legacy_array_types,
    legacy_value_kind,
)

__all__ = ["ZMM", "zrow84_q4_0", "zrow44_q4_1", "zrow84_q5_0", "zrow44_q5_1", "zrow84_q8_0"]

#: whether Numba compiles for this CPU and it has 512-bit ``vpdpbusd`` and byte masks
#: (AVX512-F, -BW and -VNNI): the tiles here can run
ZMM = VNNI and all(_host_has(f) for f in ("avx512f", "avx512bw", "avx512vnni"))

_DPBUSD512 = "llvm.x86.avx512.vpdpbusd.512"


def _dpbusd16(builder: ir.IRBuilder, acc: ir.Value, u: ir.Value, s8: ir.Value) -> ir.Value:
    """<16 x i32>: ``acc[i] + sum_{j<4} u[4i+j] * s8[4i+j]`` (<64 x i8> ``u`` unsigned, ``s8``
    signed; exact)."""
    v = _vec(I32, 16)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v, [v, v, v]),
                                        _DPBUSD512)
    return builder.call(fn, [acc, builder.bitcast(u, v), builder.bitcast(s8, v)])


def _nibbles2(builder: ir.IRBuilder, b0: ir.Value, b1: ir.Value) -> ir.Value:
    """Two blocks' 16 bytes -> <64 x i8>: block 0's low nibbles (elements 0-15), its high ones
    (16-31), then block 1's: with GFNI each 16 bytes doubled and shifted by 0 and 4 in one
    instruction (as ``qmatmul_ir._nibbles``, in 512 bits)."""
    if _GFNI:
        t = _vec(I8, 64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, I8]),
                                            "llvm.x86.vgf2p8affineqb.512")
        lo, hi = 0x0102040800000000, 0x1020408000000000
        mat = ir.Constant(_vec(I64, 8), [lo, lo, hi, hi] * 2)
        src = _shuf(builder, b0, b1, list(range(16)) * 2 + list(range(16, 32)) * 2)
        return builder.call(fn, [src, builder.bitcast(mat, t), ir.Constant(I8, 0)])
    c15, c4 = ir.Constant(_vec(I8, 16), [15] * 16), ir.Constant(_vec(I8, 16), [4] * 16)
    a = _shuf(builder, builder.and_(b0, c15), builder.lshr(b0, c4), list(range(32)))
    b = _shuf(builder, builder.and_(b1, c15), builder.lshr(b1, c4), list(range(32)))
    return _shuf(builder, a, b, list(range(64)))


def _fifth_bits2(builder: ir.IRBuilder, q0: ir.Value, q1: ir.Value) -> ir.Value:
    """<64 x i8>: 16 where bit j of the i32 ``q0`` (j < 32) or bit j - 32 of ``q1`` is set,
    else 0 (the two blocks' ``qh`` as one 64-lane mask)."""
    c16, c0 = ir.Constant(_vec(I8, 64), [16] * 64), ir.Constant(_vec(I8, 64), [0] * 64)
    m = builder.or_(builder.zext(q0, I64),
                    builder.shl(builder.zext(q1, I64), ir.Constant(I64, 32)))
    return builder.select(builder.bitcast(m, _vec(ir.IntType(1), 64)), c16, c0)


def _codegen(kind: int, R: int, PZ: int):
    bsz, qo, qhs, _sub, has_min = _LEGACY_LAYOUT[kind]
    vkind = legacy_value_kind(kind)

    def codegen(context, builder, sig, args):
        w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb = args
        aw, ayq, ayd, ayx, ayo, aout, atbl = legacy_array_types(sig)
        i64 = nb.type
        v16, v2 = _vec(F32T, 16), _vec(F32T, 2)

        def c64(v):
            return ir.Constant(i64, v)

        wrows = [builder.add(m, ir.Constant(m.type, p)) for p in range(2 * PZ)]
        rows = [builder.add(n0, ir.Constant(n0.type, r)) for r in range(R)]
        acc = {(z, r): cgutils.alloca_once_value(builder, ir.Constant(v16, [0.0] * 16))
               for z in range(PZ) for r in range(R)}
        accm = {(z, r): cgutils.alloca_once_value(builder, ir.Constant(v2, [0.0] * 2))
                for z in range(PZ) for r in range(R)} if has_min else {}
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            o = builder.mul(b, c64(bsz))

            def wptr(wm, off):
                return _at(context, builder, aw, w, wm, builder.add(o, c64(off)))

            def load(wm, off, n):
                return builder.load(builder.bitcast(wptr(wm, off), _vec(I8, n).as_pointer()),
                                    align=1)

            def half_at(wm, off):
                bits = builder.load(builder.bitcast(wptr(wm, off), ir.IntType(16).as_pointer()),
                                    align=1)
                return builder.load(_elem_ptr(context, builder, atbl, tbl,
                                              builder.zext(bits, i64)))

            def pair2(a, b):
                v = builder.insert_element(ir.Constant(v2, ir.Undefined), a, ir.Constant(I32, 0))
                return builder.insert_element(v, b, ir.Constant(I32, 1))

            for wm in wrows:  # the same block LEGACY_PREFETCH_ROWS rows ahead (a hint)
                _prefetch(builder, _at(context, builder, aw, w, builder.add(
                    wm, ir.Constant(wm.type, LEGACY_PREFETCH_ROWS)), o))
            pairs = []
            for z in range(PZ):
                w0, w1 = wrows[2 * z], wrows[2 * z + 1]
                if vkind == 0:  # Q8_0: x + 128 (the offset 128)
                    vals = _shuf(builder, load(w0, qo, 32), load(w1, qo, 32), list(range(64)))
                    vals = builder.xor(vals, ir.Constant(_vec(I8, 64), [-128] * 64))
                else:
                    vals = _nibbles2(builder, load(w0, qo, 16), load(w1, qo, 16))
                    if vkind == 2:
                        q0, q1 = (builder.load(builder.bitcast(wptr(x, qhs), I32.as_pointer()),
                                               align=1) for x in (w0, w1))
                        vals = builder.or_(vals, _fifth_bits2(builder, q0, q1))
                d2 = pair2(half_at(w0, 0), half_at(w1, 0))
                mw = pair2(half_at(w0, 2), half_at(w1, 2)) if has_min else None
                pairs.append((vals, _shuf(builder, d2, d2, [0] * 8 + [1] * 8), mw))
            for r, n in enumerate(rows):
                dy16 = _splat(builder, builder.load(_at(context, builder, ayd, yd, n, b)), 16)
                yp = _at(context, builder, ayq, yq, n, builder.mul(b, c64(32)))
                y = builder.load(builder.bitcast(yp, _vec(I8, 32).as_pointer()), align=1)
                y2 = _shuf(builder, y, y, list(range(32)) * 2)
                a0 = ir.Constant(_vec(I32, 16), [0] * 16)
                if _VNNI_SUB[kind]:  # the lanes start from -offset * the activations' sums of 4
                    op = _at(context, builder, ayo, yo, n, builder.mul(b, c64(8)))
                    a8 = builder.load(builder.bitcast(op, _vec(I32, 8).as_pointer()), align=4)
                    a0 = _shuf(builder, a8, a8, list(range(8)) * 2)
                sy = (_splat(builder, builder.load(_at(context, builder, ayx, yx, n, b)), 2)
                      if has_min else None)
                for z, (vals, dw16, mw) in enumerate(pairs):
                    s32 = _dpbusd16(builder, a0, vals, y2)
                    d16 = builder.fmul(dw16, dy16)  # lane-wise d_w * d_y: one rounding each
                    builder.store(_fma(builder, builder.sitofp(s32, v16), d16,
                                       builder.load(acc[z, r])), acc[z, r])
                    if has_min:
                        builder.store(_fma(builder, mw, sy, builder.load(accm[z, r])),
                                      accm[z, r])
        regs = [(builder.load(acc[z, r]), [((2 * z + i // 8, r), i % 8) for i in range(16)])
                for z in range(PZ) for r in range(R)]
        # the final registers in the order of _tree_regs: PZ = 4: rows (0, 1), then (2, 3), each
        # row's 8 weight rows in order; PZ = 2: rows 0..3, each row's 4 weight rows
        sums = _tree_regs(builder, regs, PZ, R)
        if has_min:
            mins = [builder.load(accm[z, r]) for z in range(PZ) for r in range(R)]
            idx = {(2 * z + h, r): 2 * (z * R + r) + h for z in range(PZ) for r in range(R)
                   for h in range(2)}
            flat = _concat(builder, mins)
            sums = [(builder.fadd(v, _shuf(builder, flat, flat,
                                           [idx[o] for o, _ in lanes])), lanes)
                    for v, lanes in sums]
        for v, lanes in sums:
            _store_sums(context, builder, aout, out, v, lanes, rows, mc)
        return context.get_dummy_value()
    return codegen


def _concat(builder: ir.IRBuilder, vs: list[ir.Value]) -> ir.Value:
    """The vectors ``vs`` (equal types, a power of two of them) end to end as one vector."""
    while len(vs) > 1:
        n = vs[0].type.count
        vs = [_shuf(builder, vs[i], vs[i + 1], list(range(2 * n))) for i in range(0, len(vs), 2)]
    return vs[0]


def _tree_regs(builder: ir.IRBuilder, regs: list, PZ: int, R: int) -> list:
    """Every output's 8 lanes added as ggml's ``hsum_float_8`` tree (lane ``j`` plus lane ``j +
    4``, then ``j`` plus ``j + 2``, then 0 plus 1: the additions of ``qmatmul_ir._tree_sum``
    for each output), for all the tile's accumulators at once: at each level two registers'
    partial sums are paired by two two-source shuffles and one addition (instead of three
    shuffles and three additions per output). ``regs``: ``(value, lanes)`` with ``lanes[i] =
    (output, tree position)`` of lane ``i`` (<16 x float> each, an output's 8 positions in one
    register). Returns ``(value, lanes)`` with one position (0) per lane, grouped so that each
    register holds whole rows of the tile: registers of the same activation row are combined
    first."""
    half = 4
    while half >= 1:
        # the registers paired at this level: same activation row first, then neighbouring rows
        regs = sorted(regs, key=lambda rl: (rl[1][0][0][1] // (2 if len(regs) <= R else 1),
                                            rl[1][0][0][1], rl[1][0][0][0]))
        nxt = []
        for a, b in zip(regs[0::2], regs[1::2]):
            pos = {lane: i for i, lane in enumerate(a[1])}
            pos.update({lane: 16 + i for i, lane in enumerate(b[1])})
            pairs = sorted({(o, j % half) for o, j in pos if j % (2 * half) < half},
                           key=lambda oj: (oj[0][1], oj[0][0], oj[1]))
            x = _shuf(builder, a[0], b[0], [pos[o, j] for o, j in pairs])
            y = _shuf(builder, a[0], b[0], [pos[o, j + half] for o, j in pairs])
            nxt.append((builder.fadd(x, y), pairs))
        regs = nxt
        half //= 2
    return regs


def _store_sums(context, builder, aout, out, v: ir.Value, lanes: list, rows: list,
                mc: ir.Value) -> None:
    """Store lane ``i`` of ``v`` (``lanes[i] = ((weight row p, activation row r), 0)``) to
    ``out[rows[r], mc + p]``: one vector store per activation row where ``out``'s rows are
    contiguous and the row's outputs consecutive, else element by element."""
    a = context.make_array(aout)(context, builder, out)
    stride1 = cgutils.unpack_tuple(builder, a.strides, 2)[1]
    contiguous = builder.icmp_signed("==", stride1, ir.Constant(stride1.type, 4))
    by_row: dict[int, list[tuple[int, int]]] = {}
    for i, ((p, r), _) in enumerate(lanes):
        by_row.setdefault(r, []).append((p, i))
    with builder.if_else(contiguous) as (then, otherwise):
        with then:
            for r, ps in by_row.items():
                p0 = ps[0][0]
                if [p for p, _ in ps] != list(range(p0, p0 + len(ps))):
                    raise AssertionError("a row's outputs are not consecutive")
                seg = _shuf(builder, v, v, [i for _, i in ps])
                ptr = _at(context, builder, aout, out, rows[r],
                          builder.add(mc, ir.Constant(mc.type, p0)))
                builder.store(seg, builder.bitcast(ptr, seg.type.as_pointer()), align=4)
        with otherwise:
            for i, ((p, r), _) in enumerate(lanes):
                builder.store(builder.extract_element(v, ir.Constant(I32, i)),
                              _at(context, builder, aout, out, rows[r],
                                  builder.add(mc, ir.Constant(mc.type, p))))


def _nothing(context, builder, sig, args):
    return context.get_dummy_value()


def _tile(kind: int, R: int, PZ: int):
    # without ZMM the tile compiles to nothing (LLVM could not lower its 512-bit instructions
    # there): legacy_rows calls it only for kinds with its ZMM_FLAG, which are not made then
    def typer(typingctx, w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb):
        return (types.none(w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb),
                _codegen(kind, R, PZ) if ZMM else _nothing)
    return typer


# zrow84_*: 8 weight rows (m..m+7) by 4 activation rows (16 accumulator registers); zrow44_*:
# 4 by 4 for Q4_1/Q5_1, whose min terms take registers too (8 x 8 spills there). Measured on
# the Gemma 3 shapes at 512 rows, one thread: 4 x 8 beat 4 x 4, 4 x 6, 2 x 8 and 3 x 6 for
# Q4_0/Q5_0/Q8_0; 4 x 4 beat 4 x 8 for Q4_1/Q5_1.
zrow84_q4_0 = intrinsic(_tile(0, 4, 4))
zrow44_q4_1 = intrinsic(_tile(1, 4, 2))
zrow84_q5_0 = intrinsic(_tile(2, 4, 4))
zrow44_q5_1 = intrinsic(_tile(3, 4, 2))
zrow84_q8_0 = intrinsic(_tile(4, 4, 4))
