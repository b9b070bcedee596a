"""Numba intrinsics for the dot products of :mod:`ggmlpy.backends.cpu.qmatmul_kernels`: each
computes one weight row's dot product with one activation row (all its blocks, a loop in LLVM
IR), decoding the blocks from their bytes as LLVM vector IR.

Numba types every integer expression as int64, so a plain loop over int8 products vectorizes
with 64-bit lanes (or not at all); these intrinsics build the vectors at the widths the data
has (``<32 x i8>`` loaded, multiplied and pair-summed in ``i16`` and ``i32``), which LLVM
lowers to the target's widening multiply-add instructions (x86: ``pmaddwd``). The block sums
are exact integers; they are converted to float32 and accumulated in 8 float32 lanes with
``llvm.fma`` (one rounding per multiply-add), the lanes added as a fixed tree at the end: the
shape of ggml's SIMD ``vec_dot`` loops (ggml-cpu/arch/x86/quants.c), whose error bound against
the scalar referee :mod:`ggmlpy.backends.cpu.qmatmul` states. Everything here is generic LLVM IR
but for target intrinsics used where Numba compiles for a CPU that has them: AVX2's
``vpmaddubsw`` and ``vpmaddwd`` (:func:`_maddubs`, :func:`_mul_small`; elsewhere the same
integer results in generic IR) and the spin-loop hint of :mod:`ggmlpy.backends.cpu.spin`. No
vector is wider than 256 bits (on CPUs with 512-bit units a 512-bit instruction slows the
vector work around it). The F16/BF16 helper (:func:`row_h16`) adds its float32 products to
4 x 16 float32 lanes with fused multiply-adds.

Arguments named ``w``/``y`` are 1-D NumPy arrays (uint8/int8 bytes), ``i*``/``wo`` element
offsets into them; callers guarantee the bounds.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32T = ir.FloatType()


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


def _nibbles(builder: ir.IRBuilder, b16: ir.Value) -> ir.Value:
    """16 bytes -> <32 x i8>: the low nibbles (elements 0-15), then the high ones (16-31)."""
    lo = builder.and_(b16, ir.Constant(_vec(I8, 16), [15] * 16))
    hi = builder.lshr(b16, ir.Constant(_vec(I8, 16), [4] * 16))
    return _shuf(builder, lo, hi, list(range(32)))


def _i8(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return builder.trunc(v, I8) if v.type.width > 8 else v


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


#: F16/BF16 rows: elements per step of :func:`row_h16` and float32 lanes per accumulator chain
H16_STEP = 64
_H16_LANES = 8


@intrinsic
def row_h16(typingctx, w, y, n64, bf):
    """The float32 dot product of ``64 * n64`` F16 (``bf`` False) or BF16 weight bits (uint16
    ``w``) with float32 ``y``, in the shape of ggml's AVX512 ``ggml_vec_dot_f16`` loop
    (ggml-cpu/vec.cpp, ``GGML_F16_STEP`` 64 = 4 accumulators of 16 float32 lanes): element
    ``k`` of each step of 64 goes to lane ``k mod 16`` of accumulator ``(k mod 64) // 16``,
    added with one fused multiply-add; at the end accumulator 0 += 2, 1 += 3, 0 += 1
    (``GGML_F32x16_REDUCE``), then its 16 lanes as a fixed tree (lane ``j`` + ``j + 8``, and so
    on). The 16-lane accumulators are held as pairs of 8-lane vectors (eight independent chains
    of fused multiply-adds; no 512-bit instructions); the F16/BF16 choice is made once, outside
    the loop."""
    def codegen(context, builder, sig, args):
        aw, ay, an, abf = args
        v8 = _vec(F32T, _H16_LANES)
        is_bf = abf if abf.type.width == 1 else builder.trunc(abf, ir.IntType(1))
        acc = [cgutils.alloca_once_value(builder, ir.Constant(v8, [0.0] * 8)) for _ in range(8)]

        def body(bf16: bool) -> None:
            with cgutils.for_range(builder, an) as loop:
                base = builder.mul(loop.index, ir.Constant(an.type, H16_STEP))
                for c in range(8):
                    k = builder.add(base, ir.Constant(an.type, 8 * c))
                    bits = _load(context, builder, sig.args[0], aw, k, I16, 8)
                    if bf16:
                        x = builder.bitcast(builder.shl(builder.zext(bits, _vec(I32, 8)),
                                                        ir.Constant(_vec(I32, 8), [16] * 8)), v8)
                    else:
                        x = builder.fpext(builder.bitcast(bits, _vec(ir.HalfType(), 8)), v8)
                    yv = _load(context, builder, sig.args[1], ay, k, F32T, 8)
                    builder.store(_fma(builder, x, yv, builder.load(acc[c])), acc[c])

        with builder.if_else(is_bf) as (then, otherwise):
            with then:
                body(True)
            with otherwise:
                body(False)
        a = [builder.load(p) for p in acc]  # accumulator j = chains 2j (lanes 0-7), 2j + 1
        for lo, hi in ((0, 4), (1, 5), (2, 6), (3, 7), (0, 2), (1, 3)):
            a[lo] = builder.fadd(a[lo], a[hi])
        return _tree_sum(builder, builder.fadd(a[0], a[1]), 8)
    return types.float32(w, y, n64, bf), codegen


def _kgroups(context, builder, aty, w, o, kind: int,
             offset6: bool = True) -> list[tuple[ir.Value, int, int, int]]:
    """A K-quant super-block's 8 groups of 32 values (``kind`` 0 Q4_K, 1 Q5_K, 2 Q6_K; the byte
    layouts of ggml-common.h's ``block_q{4,5,6}_K``, the block at byte ``o`` of ``w``): per group
    ``(<32 x i8> values, first element, scale index of elements 0-15, of elements 16-31)``.
    Q6_K's values are ``q - 32`` (``offset6``) or the unsigned ``q`` (0..63)."""
    def c64(v):
        return ir.Constant(o.type, v)

    def const8(v):
        return ir.Constant(_vec(I8, 32), [v] * 32)

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
                v = builder.or_(v, builder.shl(hb, const8(4)))
                v = builder.sub(v, const8(32)) if offset6 else v
                groups.append((v, 128 * hh + 32 * g, 8 * hh + 2 * g, 8 * hh + 2 * g + 1))
    return groups


@intrinsic
def f16_round(typingctx, x):
    """float32 ``x`` rounded to the nearest float16 (ties to even; overflow to inf, NaN kept),
    returned as float32 (LLVM ``fptrunc``/``fpext``, as NumPy's ``astype(float16)``)."""
    def codegen(context, builder, sig, args):
        h = builder.fptrunc(args[0], ir.HalfType())
        return builder.fpext(h, ir.FloatType())
    return types.float32(x), codegen



def _fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """``a * b + c`` with one rounding (``llvm.fma``), scalars or vectors of float."""
    t = a.type
    suffix = f"v{t.count}f32" if isinstance(t, ir.VectorType) else "f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, t]),
                                        f"llvm.fma.{suffix}")
    return builder.call(fn, [a, b, c])


def _tree_sum(builder: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    """The float lanes of ``v`` (``n`` a power of 2) added as a fixed tree: lane ``j`` plus lane
    ``j + n/2``, and so on down to one value."""
    while n > 1:
        h = n // 2
        v = builder.fadd(_shuf(builder, v, v, list(range(h))),
                         _shuf(builder, v, v, list(range(h, n))))
        n = h
    return builder.extract_element(v, ir.Constant(I32, 0))


def _elem_ptr(context, builder, aty, arr, idx):
    a = context.make_array(aty)(context, builder, arr)
    return builder.gep(a.data, [idx])


def _host_has(feature: str) -> bool:
    """Whether Numba compiles for this CPU (no ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES``) and
    it has ``feature`` (LLVM's name, e.g. ``avx2``)."""
    from llvmlite import binding
    from numba.core import config

    if config.CPU_NAME or config.CPU_FEATURES:
        return False
    try:
        return bool(binding.get_host_cpu_features().get(feature))
    except RuntimeError:  # LLVM cannot query this CPU
        return False


#: x86 AVX2's ``vpmaddubsw`` (u8 x s8 products, adjacent pairs summed to i16) for
#: :func:`_maddubs`; elsewhere the same sums in generic IR
_MADDUBS = "llvm.x86.avx2.pmadd.ub.sw" if _host_has("avx2") else None


def _maddubs(builder: ir.IRBuilder, u: ir.Value, s8: ir.Value) -> ir.Value:
    """<16 x i16>: adjacent pair sums of ``u * s8`` for <32 x i8> ``u`` read as unsigned and
    ``s8`` as signed. Callers keep ``|u0 s0 + u1 s1| < 2**15`` (so the instruction's saturation
    never acts and both forms agree)."""
    if _MADDUBS is not None:
        t = _vec(I8, 32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_vec(I16, 16), [t, t]),
                                            _MADDUBS)
        return builder.call(fn, [u, s8])
    p = builder.mul(builder.zext(u, _vec(I16, 32)), builder.sext(s8, _vec(I16, 32)))
    return builder.add(_shuf(builder, p, p, list(range(0, 32, 2))),
                       _shuf(builder, p, p, list(range(1, 32, 2))))


def _madd_ones(builder: ir.IRBuilder, p16: ir.Value) -> ir.Value:
    """<8 x i32>: adjacent pair sums of the <16 x i16> ``p16`` (``pmaddwd`` with ones)."""
    p = builder.sext(p16, _vec(I32, 16))
    return builder.add(_shuf(builder, p, p, list(range(0, 16, 2))),
                       _shuf(builder, p, p, list(range(1, 16, 2))))


def _madd_scales(builder: ir.IRBuilder, p16: ir.Value, s0: ir.Value, s1: ir.Value) -> ir.Value:
    """<8 x i32>: adjacent pair sums of ``p16 * s`` (<16 x i16> pair sums of a group's 32
    products; ``s`` the i16 scale ``s0`` for lanes 0-7 (elements 0-15), ``s1`` for 8-15): the
    ``pmaddwd`` shape."""
    sc = _shuf(builder, _splat(builder, s0, 8), _splat(builder, s1, 8), list(range(16)))
    p = builder.mul(builder.sext(p16, _vec(I32, 16)), builder.sext(sc, _vec(I32, 16)))
    return builder.add(_shuf(builder, p, p, list(range(0, 16, 2))),
                       _shuf(builder, p, p, list(range(1, 16, 2))))


# per legacy kind (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): block bytes, quants offset, qh offset (5-bit),
# value offset subtracted, whether the block has a min (Q4_1/Q5_1)
_LEGACY_LAYOUT = {0: (18, 2, 0, 8, False), 1: (20, 4, 0, 0, True), 2: (22, 6, 2, 16, False),
                  3: (24, 8, 4, 0, True), 4: (34, 2, 0, 0, False)}


def _at(context, builder, aty, arr, *idx) -> ir.Value:
    """Pointer to ``arr[idx]`` (any layout, no bounds check)."""
    a = context.make_array(aty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, aty, a, list(idx))


def _row_legacy_codegen(kind: int, R: int):
    bsz, qo, qhs, sub, has_min = _LEGACY_LAYOUT[kind]
    vkind = 0 if kind == 4 else 2 if kind in (2, 3) else 1

    def codegen(context, builder, sig, args):
        w, wo, yq, yd, yx, n0, out, m, tbl, nb = args
        aw, ayq, ayd, ayx, aout, atbl = (sig.args[0], sig.args[2], sig.args[3], sig.args[4],
                                         sig.args[6], sig.args[8])
        i64 = wo.type
        v8 = _vec(F32T, 8)
        rows = [builder.add(n0, ir.Constant(n0.type, r)) for r in range(R)]
        acc = [cgutils.alloca_once_value(builder, ir.Constant(v8, [0.0] * 8)) for _ in rows]
        accm = [cgutils.alloca_once_value(builder, ir.Constant(F32T, 0.0)) for _ in rows]
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            o = builder.add(wo, builder.mul(b, ir.Constant(i64, bsz)))

            def half_at(off):
                p = _elem_ptr(context, builder, aw, w, builder.add(o, ir.Constant(i64, off)))
                bits = builder.load(builder.bitcast(p, ir.IntType(16).as_pointer()), align=1)
                return builder.load(_elem_ptr(context, builder, atbl, tbl,
                                              builder.zext(bits, i64)))
            dw = half_at(0)
            qh = None
            if vkind == 2:
                qh = _load(context, builder, aw, w, builder.add(o, ir.Constant(i64, qhs)), I8, 4)
            # unsigned values (4-bit: 0..15, 5-bit: 0..31), the offset taken off after the
            # products; Q8_0's signed values as |x| with x's sign moved onto the activations
            vals = _block_vals(context, builder, aw, w, builder.add(o, ir.Constant(i64, qo)),
                               vkind, qh, ir.Constant(I8, 0))
            neg = None
            if vkind == 0:
                neg = builder.icmp_signed("<", vals, ir.Constant(_vec(I8, 32), [0] * 32))
                vals = builder.select(neg, builder.sub(ir.Constant(_vec(I8, 32), [0] * 32), vals),
                                      vals)
            mw = half_at(2) if has_min else None
            for r, n in enumerate(rows):  # the decoded block serves every activation row
                d = builder.fmul(dw, builder.load(_at(context, builder, ayd, yd, n, b)))
                yp = _at(context, builder, ayq, yq, n, builder.mul(b, ir.Constant(i64, 32)))
                yv = builder.load(builder.bitcast(yp, _vec(I8, 32).as_pointer()), align=1)
                if neg is not None:
                    yv = builder.select(neg, builder.sub(ir.Constant(_vec(I8, 32), [0] * 32), yv),
                                        yv)
                # |pair| <= 2 * 128 * 127 < 2**15 (activations are within +-127)
                p16 = _maddubs(builder, vals, yv)
                if sub:
                    p16 = builder.sub(p16, _maddubs(builder, ir.Constant(_vec(I8, 32), [sub] * 32),
                                                    yv))
                p = builder.sitofp(_madd_ones(builder, p16), v8)
                builder.store(_fma(builder, p, _splat(builder, d, 8), builder.load(acc[r])),
                              acc[r])
                if has_min:
                    sy = builder.load(_at(context, builder, ayx, yx, n, b))
                    builder.store(_fma(builder, mw, sy, builder.load(accm[r])), accm[r])
        for r, n in enumerate(rows):
            v = _tree_sum(builder, builder.load(acc[r]), 8)
            if has_min:
                v = builder.fadd(v, builder.load(accm[r]))
            builder.store(v, _at(context, builder, aout, out, n, m))
        return context.get_dummy_value()
    return codegen


def _row_legacy(kind: int, R: int):
    def typer(typingctx, w, wo, yq, yd, yx, n0, out, m, tbl, nb):
        return (types.none(w, wo, yq, yd, yx, n0, out, m, tbl, nb),
                _row_legacy_codegen(kind, R))
    return typer


# row_q*/row4_q*(w, wo, yq, yd, yx, n0, out, m, tbl, nb): out[n0 + r, m] for r < R, the dot products
# of one weight row (its nb blocks from byte wo of the uint8 array w) with activation rows
# n0 + r (int8 quants yq (N, K), float32 scales yd (N, nb), Q8_1 sums yx (N, nb)), each block
# decoded once for the R rows. ggml's SIMD shape: every block's 32 integer products in 8 exact
# int32 lane sums (the unsigned quants times the activations by _maddubs, the offset taken off
# as offset * the activations' pair sums, Q8_0 by the sign trick; then pmaddwd with ones),
# converted to float and added to 8 float32 lanes with one fused multiply-add by the block's
# scale d_w * d_y (d_w read from the f16 table tbl); the lanes then
# summed as a fixed tree; Q4_1/Q5_1 add their m_w * s_y terms in one more float32 accumulator
# (fused multiply-adds in block order) after the tree. row_*: R = 1, row4_*: R = 4.
row_q4_0 = intrinsic(_row_legacy(0, 1))
row4_q4_0 = intrinsic(_row_legacy(0, 4))
row_q4_1 = intrinsic(_row_legacy(1, 1))
row4_q4_1 = intrinsic(_row_legacy(1, 4))
row_q5_0 = intrinsic(_row_legacy(2, 1))
row4_q5_0 = intrinsic(_row_legacy(2, 4))
row_q5_1 = intrinsic(_row_legacy(3, 1))
row4_q5_1 = intrinsic(_row_legacy(3, 4))
row_q8_0 = intrinsic(_row_legacy(4, 1))
row4_q8_0 = intrinsic(_row_legacy(4, 4))


_KQ_BYTES = (144, 176, 210)


def _k4_scales_mins(builder: ir.IRBuilder, s12: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Q4_K/Q5_K's 8 six-bit scales and 8 mins (<8 x i8> each) from the 12 ``scales`` bytes
    (<12 x i8>; ``get_scale_min_k4`` in ggml-quants.c: ``j < 4``: ``q[j] & 63``,
    ``q[j + 4] & 63``; else ``(q[j + 4] & 15) | (q[j - 4] >> 6) << 4``,
    ``(q[j + 4] >> 4) | (q[j] >> 6) << 4``)."""
    def c8(v):
        return ir.Constant(_vec(I8, 8), [v] * 8)

    low4 = ir.Constant(_vec(ir.IntType(1), 8), [1] * 4 + [0] * 4)
    a = _shuf(builder, s12, s12, [0, 1, 2, 3, 8, 9, 10, 11])
    b = _shuf(builder, s12, s12, [0, 1, 2, 3, 0, 1, 2, 3])
    c = _shuf(builder, s12, s12, [4, 5, 6, 7, 8, 9, 10, 11])
    e = _shuf(builder, s12, s12, [0, 1, 2, 3, 4, 5, 6, 7])
    top_b = builder.shl(builder.lshr(b, c8(6)), c8(4))
    top_e = builder.shl(builder.lshr(e, c8(6)), c8(4))
    sc = builder.select(low4, builder.and_(a, c8(63)),
                        builder.or_(builder.and_(a, c8(15)), top_b))
    mn = builder.select(low4, builder.and_(c, c8(63)),
                        builder.or_(builder.lshr(c, c8(4)), top_e))
    return sc, mn


#: x86 AVX2's ``vpmaddwd`` (i16 x i16 products, adjacent pairs summed to i32) for
#: :func:`_mul_small`; elsewhere an i32 multiply
_PMADDWD = "llvm.x86.avx2.pmadd.wd" if _host_has("avx2") else None


def _mul_small(builder: ir.IRBuilder, v: ir.Value, s: ir.Value) -> ir.Value:
    """<8 x i32> ``v * s`` for ``|v| < 2**15`` and ``0 <= s < 2**15`` or ``s`` an i16 value
    zero-extended (``s`` then read as that signed i16): ``pmaddwd`` on the lanes' 16-bit halves,
    the high half of ``s`` being 0 (one cheap instruction where an i32 multiply is two slow
    ones)."""
    if _PMADDWD is None:
        return builder.mul(v, builder.sext(builder.trunc(s, _vec(I16, 8)), _vec(I32, 8)))
    t = _vec(I16, 16)
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(_vec(I32, 8), [t, t]), _PMADDWD)
    return builder.call(fn, [builder.bitcast(v, t), builder.bitcast(s, t)])


def _bsums(context, builder, abs_, bs, n, b) -> tuple[ir.Value, ir.Value]:
    """Q8_K row ``n``'s 16 ``bsums`` of super-block ``b`` (int32, each within +-16 * 128) as two
    <8 x i32> halves (256-bit loads: a 512-bit operation would slow the vector instructions
    around it on CPUs that run 512-bit work on fused ports)."""
    bp_ = _at(context, builder, abs_, bs, n, builder.mul(b, ir.Constant(b.type, 16)))
    return tuple(builder.load(builder.bitcast(builder.gep(bp_, [ir.Constant(I64, 8 * h)]),
                                              _vec(I32, 8).as_pointer()), align=4)
                 for h in range(2))


def _pairs(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """<8 x i32>: adjacent pair sums of the 16 lanes of ``a`` then ``b``."""
    return builder.add(_shuf(builder, a, b, list(range(0, 16, 2))),
                       _shuf(builder, a, b, list(range(1, 16, 2))))


def _zext16(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """<8 x i32> holding the i16 lanes of ``v`` (<8 x i16>) in their low halves, zeros above."""
    return builder.zext(v, _vec(I32, 8))


def _row_kquant_codegen(kind: int, R: int):
    bsz = _KQ_BYTES[kind]

    def codegen(context, builder, sig, args):
        w, wo, yq, yd, bs, n0, out, m, tbl, nb = args
        aw, ayq, ayd, abs_, aout, atbl = (sig.args[0], sig.args[2], sig.args[3], sig.args[4],
                                          sig.args[6], sig.args[8])
        i64 = wo.type
        v8 = _vec(F32T, 8)
        v4 = _vec(F32T, 4)
        rows = [builder.add(n0, ir.Constant(n0.type, r)) for r in range(R)]
        acc = [cgutils.alloca_once_value(builder, ir.Constant(v8, [0.0] * 8)) for _ in rows]
        # Q4_K: 4 float32 lanes for the min terms; Q5_K: one float32 accumulator
        accm = [cgutils.alloca_once_value(builder, ir.Constant(v4, [0.0] * 4) if kind == 0
                                          else ir.Constant(F32T, 0.0)) for _ in rows]

        def c64(v):
            return ir.Constant(i64, v)

        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            o = builder.add(wo, builder.mul(b, c64(bsz)))

            def half_at(off):
                p = _elem_ptr(context, builder, aw, w, builder.add(o, c64(off)))
                bits = builder.load(builder.bitcast(p, ir.IntType(16).as_pointer()), align=1)
                return builder.load(_elem_ptr(context, builder, atbl, tbl,
                                              builder.zext(bits, i64)))

            if kind == 2:
                sc8 = _load(context, builder, aw, w, builder.add(o, c64(192)), I8, 16)
                sc = builder.sext(sc8, _vec(I16, 16))
                sc32 = [_zext16(builder, _shuf(builder, sc, sc, list(range(8 * h, 8 * h + 8))))
                        for h in range(2)]
                mn = None
            else:
                sc8, mn8 = _k4_scales_mins(
                    builder, _load(context, builder, aw, w, builder.add(o, c64(4)), I8, 12))
                sc = builder.zext(sc8, _vec(I16, 8))
                mn = builder.zext(mn8, _vec(I32, 8))

            def scale(j):
                return builder.extract_element(sc, ir.Constant(I32, j))

            groups = _kgroups(context, builder, aw, w, o, kind, offset6=False)
            dw = half_at(208 if kind == 2 else 0)
            dmw = half_at(2) if kind < 2 else None
            for r, n in enumerate(rows):  # the decoded super-block serves every activation row
                dy = builder.load(_at(context, builder, ayd, yd, n, b))
                sumi = ir.Constant(_vec(I32, 8), [0] * 8)
                for v, e, j0, j1 in groups:
                    yp = _at(context, builder, ayq, yq, n,
                             builder.add(builder.mul(b, c64(256)), c64(e)))
                    yv = builder.load(builder.bitcast(yp, _vec(I8, 32).as_pointer()), align=1)
                    # unsigned values (0..15, 0..31, Q6_K 0..63): |pair| <= 2 * 63 * 128 < 2**15
                    p16 = _maddubs(builder, v, yv)
                    sumi = builder.add(sumi, _madd_scales(builder, p16, scale(j0), scale(j1)))
                if kind == 2:
                    # Q6_K's -32: lane i less 32 * (sc[2i] bsum[2i] + sc[2i+1] bsum[2i+1])
                    lo, hi = _bsums(context, builder, abs_, bs, n, b)
                    off = _pairs(builder, _mul_small(builder, lo, sc32[0]),
                                 _mul_small(builder, hi, sc32[1]))
                    sumi = builder.sub(sumi, builder.shl(off, ir.Constant(_vec(I32, 8), [5] * 8)))
                d = builder.fmul(dw, dy)
                builder.store(_fma(builder, builder.sitofp(sumi, v8), _splat(builder, d, 8),
                                   builder.load(acc[r])), acc[r])
                if kind < 2:
                    # the mins: lane i = min[2i] (bsum[4i] + bsum[4i+1])
                    #                    + min[2i+1] (bsum[4i+2] + bsum[4i+3])
                    bp = _pairs(builder, *_bsums(context, builder, abs_, bs, n, b))
                    pm = _mul_small(builder, bp, mn)
                    prod = builder.add(_shuf(builder, pm, pm, [0, 2, 4, 6]),
                                       _shuf(builder, pm, pm, [1, 3, 5, 7]))
                    dm = builder.fneg(builder.fmul(dmw, dy))
                    if kind == 0:
                        builder.store(_fma(builder, _splat(builder, dm, 4),
                                           builder.sitofp(prod, v4), builder.load(accm[r])),
                                      accm[r])
                    else:
                        summ = _reduce_add(builder, prod, 4)
                        builder.store(_fma(builder, dm, builder.sitofp(summ, F32T),
                                           builder.load(accm[r])), accm[r])
        for r, n in enumerate(rows):
            v = _tree_sum(builder, builder.load(acc[r]), 8)
            if kind == 0:
                v = builder.fadd(v, _tree_sum(builder, builder.load(accm[r]), 4))
            elif kind == 1:
                v = builder.fadd(v, builder.load(accm[r]))
            builder.store(v, _at(context, builder, aout, out, n, m))
        return context.get_dummy_value()
    return codegen


def _row_kquant(kind: int, R: int):
    def typer(typingctx, w, wo, yq, yd, bs, n0, out, m, tbl, nb):
        return (types.none(w, wo, yq, yd, bs, n0, out, m, tbl, nb),
                _row_kquant_codegen(kind, R))
    return typer


# row_q4_K/q5_K/q6_K and row4_*(w, wo, yq, yd, bs, n0, out, m, tbl, nb): out[n0 + r, m] for
# r < R (1; row4_*: 4), one weight row (nb super-blocks from byte wo of w) with Q8_K activation
# rows n0 + r (int8 quants yq (N, K), float32 scales yd (N, nb), int32 bsums bs (N, K / 16)),
# each super-block decoded once for the R rows, in ggml's SIMD shape: each super-block's integer
# sums, its sub-block scales (decoded here from the block's bytes) applied, in 8 exact int32
# lanes, converted and added to 8 float32 lanes with one fused multiply-add by d_w * d_y;
# Q4_K/Q5_K's min terms -(dmin_w * d_y) * sum_j min_j bsum_j (an exact int32) in one more
# float32 accumulator (fused multiply-adds in super-block order), added after the lanes' fixed
# tree. tbl: the f16 value table.
row_q4_K = intrinsic(_row_kquant(0, 1))
row_q5_K = intrinsic(_row_kquant(1, 1))
row_q6_K = intrinsic(_row_kquant(2, 1))
row4_q4_K = intrinsic(_row_kquant(0, 4))
row4_q5_K = intrinsic(_row_kquant(1, 4))
row4_q6_K = intrinsic(_row_kquant(2, 4))
