"""Numba intrinsics for the block dot products of :mod:`ggmlpy.backends.cpu.qmatmul_kernels`: each decodes one block of a
weight row from its bytes and multiplies it with 32 activation quants as LLVM vector IR.

Numba types every integer expression as int64, so a plain loop over int8 products vectorizes
with 64-bit lanes (or not at all); these intrinsics build the vectors at the widths the data
has (``<32 x i8>`` loaded, sign-extended, multiplied and reduced in ``i32``), which LLVM lowers
to the target's widening multiply-add instructions (x86: ``pmaddwd``). Everything here is
generic LLVM IR (no target intrinsics). Integer results are exact; the F16/BF16 helper sums its
16 float32 products in float64 in a fixed tree order.

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
        v = _nibbles(builder, b)
        q = builder.trunc(args[2], I32) if args[2].type.width > 32 else builder.zext(args[2], I32) \
            if args[2].type.width < 32 else args[2]
        bits = builder.lshr(_splat(builder, q, 32), ir.Constant(_vec(I32, 32), list(range(32))))
        bits = builder.and_(bits, ir.Constant(_vec(I32, 32), [1] * 32))
        hb = builder.shl(builder.trunc(bits, _vec(I8, 32)), ir.Constant(_vec(I8, 32), [4] * 32))
        v = builder.sub(builder.or_(v, hb), _splat(builder, _i8(builder, args[3]), 32))
        yv = _load(context, builder, sig.args[4], args[4], args[5], I8, 32)
        return _dot32(builder, v, yv)
    return types.int32(w, iw, qh, sub, y, iy), codegen


@intrinsic
def acc_k(typingctx, w, iq, nib, ih, hshift, hmask, sub, y, iy, s0, s1, aux):
    """K-quant lanes: 32 weight values ``v[j] = (((w[iq + j] >> 4 * nib) & 15) | (((w[ih + j]
    >> hshift) & hmask) << 4)) - sub`` times ``y[iy + j]``; the products of elements 0-15 times
    ``s0`` and of 16-31 times ``s1`` are added to ``aux[l]`` for ``l = j mod 8`` (ggml's
    ``aux32`` lanes of ``ggml_vec_dot_q{4,5,6}_K_q8_K_generic``). Returns nothing."""
    def codegen(context, builder, sig, args):
        (aw, aiq, anib, aih, ahs, ahm, asub, ay, aiy, as0, as1, aaux) = args
        q = _load(context, builder, sig.args[0], aw, aiq, I8, 32)
        sh = builder.mul(_i8(builder, anib), ir.Constant(I8, 4))
        q = builder.and_(builder.lshr(q, _splat(builder, sh, 32)),
                         ir.Constant(_vec(I8, 32), [15] * 32))
        h = _load(context, builder, sig.args[0], aw, aih, I8, 32)
        h = builder.and_(builder.lshr(h, _splat(builder, _i8(builder, ahs), 32)),
                         _splat(builder, _i8(builder, ahm), 32))
        v = builder.or_(q, builder.shl(h, ir.Constant(_vec(I8, 32), [4] * 32)))
        v = builder.sub(v, _splat(builder, _i8(builder, asub), 32))
        yv = _load(context, builder, sig.args[7], ay, aiy, I8, 32)
        p = builder.mul(builder.sext(v, _vec(I32, 32)), builder.sext(yv, _vec(I32, 32)))
        la = builder.add(_shuf(builder, p, p, list(range(0, 8))), _shuf(builder, p, p, list(range(8, 16))))
        lb = builder.add(_shuf(builder, p, p, list(range(16, 24))), _shuf(builder, p, p, list(range(24, 32))))

        def i32(x):
            return builder.trunc(x, I32) if x.type.width > 32 else x
        la = builder.mul(la, _splat(builder, i32(as0), 8))
        lb = builder.mul(lb, _splat(builder, i32(as1), 8))
        a = context.make_array(sig.args[11])(context, builder, aaux)
        pa = builder.bitcast(a.data, _vec(I32, 8).as_pointer())
        cur = builder.load(pa, align=4)
        builder.store(builder.add(cur, builder.add(la, lb)), pa, align=4)
        return context.get_dummy_value()
    return types.none(w, iq, nib, ih, hshift, hmask, sub, y, iy, s0, s1, aux), codegen


@intrinsic
def dot_h16(typingctx, w, iw, y, iy, bf):
    """float64 sum of 16 float32 products ``f(w[iw + j]) * y[iy + j]`` (``w`` uint16 F16 bits, or
    BF16 bits when ``bf``; ``y`` float32), the products widened to float64 and added as the tree
    ((0+8)+(4+12))... (halves folded four times): a fixed order."""
    def codegen(context, builder, sig, args):
        aw, aiw, ay, aiy, abf = args
        bits = _load(context, builder, sig.args[0], aw, aiw, I16, 16)
        xf = builder.fpext(builder.bitcast(bits, _vec(ir.HalfType(), 16)), _vec(ir.FloatType(), 16))
        xb = builder.bitcast(builder.shl(builder.zext(bits, _vec(I32, 16)),
                                         ir.Constant(_vec(I32, 16), [16] * 16)),
                             _vec(ir.FloatType(), 16))
        x = builder.select(builder.trunc(abf, ir.IntType(1)) if abf.type.width > 1 else abf, xb, xf)
        yv = _load(context, builder, sig.args[2], ay, aiy, ir.FloatType(), 16)
        p = builder.fpext(builder.fmul(x, yv), _vec(ir.DoubleType(), 16))
        n = 16
        while n > 1:
            n //= 2
            p = builder.fadd(_shuf(builder, p, p, list(range(n))),
                             _shuf(builder, p, p, list(range(n, 2 * n))))
        return builder.extract_element(p, ir.Constant(I32, 0))
    return types.float64(w, iw, y, iy, bf), codegen
