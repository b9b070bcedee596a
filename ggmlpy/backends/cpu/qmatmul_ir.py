"""Numba intrinsics for the block dot products of :mod:`ggmlpy.backends.cpu.qmatmul_kernels`: each decodes one block of a
weight row from its bytes and multiplies it with 32 activation quants as LLVM vector IR.

Numba types every integer expression as int64, so a plain loop over int8 products vectorizes
with 64-bit lanes (or not at all); these intrinsics build the vectors at the widths the data
has (``<32 x i8>`` loaded, sign-extended, multiplied and reduced in ``i32``), which LLVM lowers
to the target's widening multiply-add instructions (x86: ``pmaddwd``). Everything here is
generic LLVM IR (no target intrinsics). Integer results are exact; the F16/BF16 helper adds its
16 float32 products to 16 float64 lanes.

Arguments named ``w``/``y``/``aux`` are 1-D NumPy arrays (uint8/int8 bytes, int32 ``aux``),
``i*`` element offsets into them; callers guarantee the bounds.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _splat(builder: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    vt = _vec(v.type, n)
    u = builder.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(I32, 0))
    return builder.shuffle_vector(u, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(_vec(I32, n), [0] * n))


def _shuf(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, idx: list[int]) -> ir.Value:
    return builder.shuffle_vector(a, b, ir.Constant(_vec(I32, len(idx)), idx))


def _load(context, builder, aty, arr, off, elt: ir.Type, n: int) -> ir.Value:
    a = context.make_array(aty)(context, builder, arr)
    p = builder.gep(a.data, [off])
    return builder.load(builder.bitcast(p, _vec(elt, n).as_pointer()), align=1)


def _reduce_add(builder: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I32, [_vec(I32, n)]),
                                        f"llvm.vector.reduce.add.v{n}i32")
    return builder.call(fn, [v])


def _dot32(builder: ir.IRBuilder, v: ir.Value, y: ir.Value) -> ir.Value:
    """sum(sext(v) * sext(y)) over two <32 x i8> vectors, as i32."""
    p = builder.mul(builder.sext(v, _vec(I32, 32)), builder.sext(y, _vec(I32, 32)))
    return _reduce_add(builder, p, 32)


def _nibbles(builder: ir.IRBuilder, b16: ir.Value) -> ir.Value:
    """16 bytes -> <32 x i8>: the low nibbles (elements 0-15), then the high ones (16-31)."""
    lo = builder.and_(b16, ir.Constant(_vec(I8, 16), [15] * 16))
    hi = builder.lshr(b16, ir.Constant(_vec(I8, 16), [4] * 16))
    return _shuf(builder, lo, hi, list(range(32)))


def _i8(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return builder.trunc(v, I8) if v.type.width > 8 else v


@intrinsic
def dot_q8(typingctx, w, iw, y, iy):
    """int32 ``sum(int8(w[iw + j]) * y[iy + j] for j < 32)``."""
    def codegen(context, builder, sig, args):
        v = _load(context, builder, sig.args[0], args[0], args[1], I8, 32)
        yv = _load(context, builder, sig.args[2], args[2], args[3], I8, 32)
        return _dot32(builder, v, yv)
    return types.int32(w, iw, y, iy), codegen


@intrinsic
def dot_q4(typingctx, w, iw, sub, y, iy):
    """int32 dot of a 4-bit block (16 bytes at ``iw``: element j < 16 the low nibble of byte j,
    element 16 + j its high nibble, each minus ``sub``) with 32 int8 activations."""
    def codegen(context, builder, sig, args):
        b = _load(context, builder, sig.args[0], args[0], args[1], I8, 16)
        v = builder.sub(_nibbles(builder, b), _splat(builder, _i8(builder, args[2]), 32))
        yv = _load(context, builder, sig.args[3], args[3], args[4], I8, 32)
        return _dot32(builder, v, yv)
    return types.int32(w, iw, sub, y, iy), codegen


@intrinsic
def dot_q5(typingctx, w, iw, qh, sub, y, iy):
    """As :func:`dot_q4` with a fifth bit per element: bit j of the uint32 ``qh`` is bit 4 of
    element j (Q5_0/Q5_1 layout)."""
    def codegen(context, builder, sig, args):
        b = _load(context, builder, sig.args[0], args[0], args[1], I8, 16)
        q = args[2] if args[2].type.width <= 32 else builder.trunc(args[2], I32)
        q = q if q.type.width == 32 else builder.zext(q, I32)
        v = builder.or_(_nibbles(builder, b), _fifth_bits(builder, q))
        v = builder.sub(v, _splat(builder, _i8(builder, args[3]), 32))
        yv = _load(context, builder, sig.args[4], args[4], args[5], I8, 32)
        return _dot32(builder, v, yv)
    return types.int32(w, iw, qh, sub, y, iy), codegen


def _block_vals(context, builder, aty, w, off, kind: int, qh=None, sub=None) -> ir.Value:
    """One legacy block's 32 weight values as <32 x i8>: ``kind`` 0 Q8_0 (32 int8 at ``off``),
    1 4-bit (16 bytes of nibbles), 2 5-bit (nibbles and the uint32 ``qh``); ``sub`` subtracted
    (kinds 1, 2)."""
    if kind == 0:
        return _load(context, builder, aty, w, off, I8, 32)
    v = _nibbles(builder, _load(context, builder, aty, w, off, I8, 16))
    if kind == 2:
        v = builder.or_(v, _fifth_bits(builder, qh))
    return builder.sub(v, _splat(builder, sub, 32))


def _fifth_bits(builder: ir.IRBuilder, qh: ir.Value) -> ir.Value:
    """<32 x i8>: 16 where bit j of the 32-bit ``qh`` (an i32, or its 4 little-endian bytes as
    <4 x i8>) is set, else 0: each byte spread over 8 lanes, tested against its lane's bit (byte
    operations only)."""
    b4 = qh if isinstance(qh.type, ir.VectorType) else builder.bitcast(
        qh if qh.type.width == 32 else builder.trunc(qh, I32), _vec(I8, 4))
    spread = _shuf(builder, b4, b4, [j // 8 for j in range(32)])
    hit = builder.and_(spread, ir.Constant(_vec(I8, 32), [1 << (j % 8) for j in range(32)]))
    set_ = builder.icmp_unsigned("!=", hit, ir.Constant(_vec(I8, 32), [0] * 32))
    return builder.select(set_, ir.Constant(_vec(I8, 32), [16] * 32),
                          ir.Constant(_vec(I8, 32), [0] * 32))


def _pairs(builder: ir.IRBuilder, v: ir.Value, y: ir.Value) -> ir.Value:
    """<16 x i32>: sums of the adjacent products of two <32 x i8> (the ``pmaddwd`` shape)."""
    p = builder.mul(builder.sext(v, _vec(I32, 32)), builder.sext(y, _vec(I32, 32)))
    return builder.add(_shuf(builder, p, p, list(range(0, 32, 2))),
                       _shuf(builder, p, p, list(range(1, 32, 2))))


def _sum4(builder: ir.IRBuilder, q: list[ir.Value]) -> ir.Value:
    """<4 x i32> of the sums of four <16 x i32> (a transposing tree: 15 shuffles and adds for
    the four, instead of four full reductions)."""
    def half(a, b, lo, hi):
        return builder.add(_shuf(builder, a, b, lo), _shuf(builder, a, b, hi))
    p01 = half(q[0], q[1], list(range(8)) + list(range(16, 24)),
               list(range(8, 16)) + list(range(24, 32)))
    p23 = half(q[2], q[3], list(range(8)) + list(range(16, 24)),
               list(range(8, 16)) + list(range(24, 32)))
    lo = [i + o for o in (0, 8, 16, 24) for i in range(4)]
    r = half(p01, p23, lo, [i + 4 for i in lo])
    s = half(r, r, [0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15])
    return half(s, s, [0, 2, 4, 6], [1, 3, 5, 7])


def _dot4_codegen(kind: int):
    def codegen(context, builder, sig, args):
        w, iw, bsz, y, iy, qo, qhs, sub, out, io = args
        aty = sig.args[0]
        q = []
        for k in range(4):
            ko = ir.Constant(iw.type, k)
            off = builder.add(builder.add(iw, builder.mul(ko, bsz)), qo)
            qh = None
            if kind == 2:
                ho = builder.add(builder.add(iw, builder.mul(ko, bsz)), qhs)
                qh = _load(context, builder, aty, w, ho, I8, 4)
            v = _block_vals(context, builder, aty, w, off, kind, qh, _i8(builder, sub))
            yo = builder.add(iy, ir.Constant(iy.type, 32 * k))
            yv = _load(context, builder, sig.args[3], y, yo, I8, 32)
            q.append(_pairs(builder, v, yv))
        u = _sum4(builder, q)
        a = context.make_array(sig.args[8])(context, builder, out)
        p = builder.gep(a.data, [io])
        builder.store(u, builder.bitcast(p, _vec(I32, 4).as_pointer()), align=4)
        return context.get_dummy_value()
    return codegen


def _dot4(kind: int):
    def typer(typingctx, w, iw, bsz, y, iy, qo, qhs, sub, out, io):
        return types.none(w, iw, bsz, y, iy, qo, qhs, sub, out, io), _dot4_codegen(kind)
    return typer


# dot4_q8 / dot4_q4 / dot4_q5(w, iw, bsz, y, iy, qo, qhs, sub, out, io): integer sums of four
# consecutive legacy blocks with the activation quants. Block k (k < 4) starts at byte
# iw + k * bsz of w, its quants at + qo (5-bit: its qh word at + qhs), values minus sub;
# activations y[iy + 32 k:]; the four int32 sums are stored at out[io:io + 4].
dot4_q8 = intrinsic(_dot4(0))
dot4_q4 = intrinsic(_dot4(1))
dot4_q5 = intrinsic(_dot4(2))


@intrinsic
def acc_h16(typingctx, w, iw, y, iy, bf, acc):
    """``acc[0:16] += float64(f(w[iw + j]) * y[iy + j])`` for 16 F16 (``bf`` False) or BF16 bits
    ``w`` and float32 ``y`` (float32 products, float64 lanes)."""
    def codegen(context, builder, sig, args):
        aw, aiw, ay, aiy, abf, aacc = args
        bits = _load(context, builder, sig.args[0], aw, aiw, I16, 16)
        xf = builder.fpext(builder.bitcast(bits, _vec(ir.HalfType(), 16)), _vec(ir.FloatType(), 16))
        xb = builder.bitcast(builder.shl(builder.zext(bits, _vec(I32, 16)),
                                         ir.Constant(_vec(I32, 16), [16] * 16)),
                             _vec(ir.FloatType(), 16))
        x = builder.select(abf if abf.type.width == 1 else builder.trunc(abf, ir.IntType(1)), xb, xf)
        yv = _load(context, builder, sig.args[2], ay, aiy, ir.FloatType(), 16)
        p = builder.fpext(builder.fmul(x, yv), _vec(ir.DoubleType(), 16))
        a = context.make_array(sig.args[5])(context, builder, aacc)
        pa = builder.bitcast(a.data, _vec(ir.DoubleType(), 16).as_pointer())
        builder.store(builder.fadd(builder.load(pa, align=8), p), pa, align=8)
        return context.get_dummy_value()
    return types.none(w, iw, y, iy, bf, acc), codegen


def _kblock_codegen(kind: int):
    """One K-quant super-block's eight ``aux32`` lanes, kept in registers: ``kind`` 0 Q4_K,
    1 Q5_K, 2 Q6_K (the byte layouts of ggml-common.h's ``block_q{4,5,6}_K``)."""
    def codegen(context, builder, sig, args):
        w, o, y, p, sc, isc, aux = args
        aty, yty = sig.args[0], sig.args[2]
        scarr = context.make_array(sig.args[4])(context, builder, sc)

        def c64(v):
            return ir.Constant(o.type, v)

        def scale(j):
            ptr = builder.gep(scarr.data, [builder.add(isc, ir.Constant(isc.type, j))])
            return _splat(builder, builder.load(ptr), 8)

        def const8(v):
            return ir.Constant(_vec(I8, 32), [v] * 32)

        acc = ir.Constant(_vec(I32, 8), [0] * 8)
        groups = []
        if kind < 2:
            qo = 48 if kind == 1 else 16
            for c in range(4):
                q = _load(context, builder, aty, w, builder.add(o, c64(qo + 32 * c)), I8, 32)
                for nib in range(2):
                    v = builder.and_(builder.lshr(q, const8(4 * nib)), const8(15)) if nib else \
                        builder.and_(q, const8(15))
                    if kind == 1:
                        h = _load(context, builder, aty, w, builder.add(o, c64(16)), I8, 32)
                        h = builder.and_(builder.lshr(h, const8(2 * c + nib)), const8(1))
                        v = builder.or_(v, builder.shl(h, const8(4)))
                    groups.append((v, 64 * c + 32 * nib, 2 * c + nib, 2 * c + nib))
        else:
            for hh in range(2):
                qh = _load(context, builder, aty, w, builder.add(o, c64(128 + 32 * hh)), I8, 32)
                for g in range(4):
                    ql = _load(context, builder, aty, w, builder.add(o, c64(64 * hh + 32 * (g & 1))),
                               I8, 32)
                    lo = builder.lshr(ql, const8(4)) if g >> 1 else ql
                    v = builder.and_(lo, const8(15))
                    hb = builder.and_(builder.lshr(qh, const8(2 * g)), const8(3)) if g else \
                        builder.and_(qh, const8(3))
                    v = builder.sub(builder.or_(v, builder.shl(hb, const8(4))), const8(32))
                    groups.append((v, 128 * hh + 32 * g, 8 * hh + 2 * g, 8 * hh + 2 * g + 1))
        for v, e, j0, j1 in groups:
            yv = _load(context, builder, yty, y, builder.add(p, ir.Constant(p.type, e)), I8, 32)
            # int16 products and pair sums: |q8 * v| <= 128 * 63 and two of them fit int16
            prod = builder.mul(builder.sext(v, _vec(I16, 32)), builder.sext(yv, _vec(I16, 32)))
            la = builder.add(_shuf(builder, prod, prod, list(range(8))),
                             _shuf(builder, prod, prod, list(range(8, 16))))
            lb = builder.add(_shuf(builder, prod, prod, list(range(16, 24))),
                             _shuf(builder, prod, prod, list(range(24, 32))))
            la = builder.mul(builder.sext(la, _vec(I32, 8)), scale(j0))
            lb = builder.mul(builder.sext(lb, _vec(I32, 8)), scale(j1))
            acc = builder.add(acc, builder.add(la, lb))
        a = context.make_array(sig.args[6])(context, builder, aux)
        builder.store(acc, builder.bitcast(a.data, _vec(I32, 8).as_pointer()), align=4)
        return context.get_dummy_value()
    return codegen


def _kblock(kind: int):
    def typer(typingctx, w, o, y, p, sc, isc, aux):
        return types.none(w, o, y, p, sc, isc, aux), _kblock_codegen(kind)
    return typer


# kblock_q4/q5/q6(w, o, y, p, sc, isc, aux): aux[0:8] = the super-block's aux32 lanes (ggml's
# ggml_vec_dot_q{4,5,6}_K_q8_K_generic) for the block at byte o of w and the activation quants
# y[p:p + 256]; sc: int32 scales, the block's first at flat index isc (8 for Q4_K/Q5_K, 16 Q6_K).
kblock_q4 = intrinsic(_kblock(0))
kblock_q5 = intrinsic(_kblock(1))
kblock_q6 = intrinsic(_kblock(2))
