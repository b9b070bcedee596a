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
vector is wider than 256 bits here; the legacy rows' prompt-batch tiles also exist in 512-bit
registers (:mod:`ggmlpy.backends.cpu.legacy_zmm_ir`, the same bits, ``GGMLPY_CPU_ZMM``). The F16/BF16 helper (:func:`row_h16`) adds its float32 products to
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


#: x86 GFNI (``vgf2p8affineqb``: a byte shift that differs between the two 128-bit halves in
#: one instruction) for :func:`_nibbles`
_GFNI = _host_has("gfni") and _host_has("avx2")
#: AVX512-BW with VL: a 32-bit mask moves straight into a mask register (:func:`_fifth_bits`)
_MASK32 = _host_has("avx512bw") and _host_has("avx512vl")


def _nibbles(builder: ir.IRBuilder, b16: ir.Value) -> ir.Value:
    """16 bytes -> <32 x i8>: the low nibbles (elements 0-15), then the high ones (16-31). With
    GFNI the 16 bytes are broadcast to both halves and shifted by 0 and 4 in one instruction."""
    if _GFNI:
        # affine bit matrices per 64-bit lane (result bit i = parity(byte 7 - i & x)): the low
        # half keeps bits 0-3, the high half moves bits 4-7 down
        t = _vec(I8, 32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, I8]),
                                            "llvm.x86.vgf2p8affineqb.256")
        mat = ir.Constant(_vec(I64, 4), [0x0102040800000000] * 2 + [0x1020408000000000] * 2)
        return builder.call(fn, [_shuf(builder, b16, b16, list(range(16)) * 2),
                                 builder.bitcast(mat, t), ir.Constant(I8, 0)])
    lo = builder.and_(b16, ir.Constant(_vec(I8, 16), [15] * 16))
    hi = builder.lshr(b16, ir.Constant(_vec(I8, 16), [4] * 16))
    return _shuf(builder, lo, hi, list(range(32)))


def _fifth_bits(builder: ir.IRBuilder, qh: ir.Value) -> ir.Value:
    """<32 x i8>: 16 where bit j of the 32-bit ``qh`` (an i32, or its 4 little-endian bytes as
    <4 x i8>) is set, else 0: with AVX512-BW the i32 as a 32-lane mask, else each byte spread
    over 8 lanes and tested against its lane's bit."""
    c16, c0 = ir.Constant(_vec(I8, 32), [16] * 32), ir.Constant(_vec(I8, 32), [0] * 32)
    if _MASK32:
        q32 = builder.bitcast(qh, I32) if isinstance(qh.type, ir.VectorType) else (
            qh if qh.type.width == 32 else builder.trunc(qh, I32))
        return builder.select(builder.bitcast(q32, _vec(ir.IntType(1), 32)), c16, c0)
    b4 = qh if isinstance(qh.type, ir.VectorType) else builder.bitcast(
        qh if qh.type.width == 32 else builder.trunc(qh, I32), _vec(I8, 4))
    spread = _shuf(builder, b4, b4, [j // 8 for j in range(32)])
    hit = builder.and_(spread, ir.Constant(_vec(I8, 32), [1 << (j % 8) for j in range(32)]))
    set_ = builder.icmp_unsigned("!=", hit, ir.Constant(_vec(I8, 32), [0] * 32))
    return builder.select(set_, c16, c0)


def _prefetch(builder: ir.IRBuilder, ptr: ir.Value) -> None:
    """A read prefetch of the cache line at ``ptr`` into all cache levels (``llvm.prefetch``;
    a hint: an address past the data is harmless)."""
    i8p = I8.as_pointer()
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(ir.VoidType(), [i8p, I32, I32, I32]),
                                        "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(I32, 0), ir.Constant(I32, 3),
                      ir.Constant(I32, 1)])


#: F16/BF16 rows: elements per step of :func:`row_h16`
H16_STEP = 64


def _h16_codegen(lanes: int):
    """:func:`row_h16` (``lanes`` 8: each 16-lane accumulator as two 8-lane vectors) and
    :func:`row_h16z` (16: one 512-bit register each): chain ``c`` of ``64 / lanes`` holds lanes
    ``lanes * (c % parts)`` on of accumulator ``c // parts`` (``parts = 16 / lanes``)."""
    parts = 16 // lanes

    def codegen(context, builder, sig, args):
        aw, ay, an, abf = args
        vf = _vec(F32T, lanes)
        is_bf = abf if abf.type.width == 1 else builder.trunc(abf, ir.IntType(1))
        acc = [cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * lanes))
               for _ in range(64 // lanes)]

        def body(bf16: bool) -> None:
            with cgutils.for_range(builder, an) as loop:
                base = builder.mul(loop.index, ir.Constant(an.type, H16_STEP))
                _prefetch(builder, _elem_ptr(context, builder, sig.args[0], aw,
                                             builder.add(base, ir.Constant(an.type, 1024))))
                for c in range(64 // lanes):
                    k = builder.add(base, ir.Constant(an.type, lanes * c))
                    bits = _load(context, builder, sig.args[0], aw, k, I16, lanes)
                    if bf16:
                        x = builder.bitcast(builder.shl(builder.zext(bits, _vec(I32, lanes)),
                                                        ir.Constant(_vec(I32, lanes),
                                                                    [16] * lanes)), vf)
                    else:
                        x = builder.fpext(builder.bitcast(bits, _vec(ir.HalfType(), lanes)), vf)
                    yv = _load(context, builder, sig.args[1], ay, k, F32T, lanes)
                    builder.store(_fma(builder, x, yv, builder.load(acc[c])), acc[c])

        with builder.if_else(is_bf) as (then, otherwise):
            with then:
                body(True)
            with otherwise:
                body(False)
        a = [builder.load(p) for p in acc]
        for lo, hi in ((0, 2), (1, 3), (0, 1)):  # accumulator 0 += 2, 1 += 3, 0 += 1
            for q in range(parts):
                a[lo * parts + q] = builder.fadd(a[lo * parts + q], a[hi * parts + q])
        v = a[0]
        if parts == 2:  # the tree's first level: lane j + lane j + 8
            v = builder.fadd(a[0], a[1])
        return _tree_sum(builder, v, lanes)
    return codegen


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
    return types.float32(w, y, n64, bf), _h16_codegen(8)


@intrinsic
def row_h16z(typingctx, w, y, n64, bf):
    """:func:`row_h16` with each 16-lane accumulator in one 512-bit register (4 chains of
    16-lane fused multiply-adds): the same lanes, operations and reduction, so the same bits,
    in half the instructions. Only where the CPU has AVX512-F (``legacy_zmm_ir.ZMM``)."""
    return types.float32(w, y, n64, bf), _h16_codegen(16)


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

    def sh16(op, v, k):
        # a byte shift as a 16-bit one (the masks that follow drop the bits crossing bytes):
        # shift-and-mask pairs on every vector port, where LLVM's byte shifts take slower forms
        t = _vec(I16, 16)
        return builder.bitcast(op(builder.bitcast(v, t), ir.Constant(t, [k] * 16)), _vec(I8, 32))

    def lshr(v, k):
        return sh16(builder.lshr, v, k)

    def shl(v, k):
        return sh16(builder.shl, v, k)

    groups = []
    if kind < 2:
        qo = 48 if kind == 1 else 16
        for c in range(4):
            q = _load(context, builder, aty, w, builder.add(o, c64(qo + 32 * c)), I8, 32)
            for nib in range(2):
                v = builder.and_(lshr(q, 4 * nib), const8(15)) if nib else \
                    builder.and_(q, const8(15))
                if kind == 1:
                    h = _load(context, builder, aty, w, builder.add(o, c64(16)), I8, 32)
                    h = builder.and_(lshr(h, 2 * c + nib), const8(1))
                    v = builder.or_(v, shl(h, 4))
                groups.append((v, 64 * c + 32 * nib, 2 * c + nib, 2 * c + nib))
    else:
        for hh in range(2):
            qh = _load(context, builder, aty, w, builder.add(o, c64(128 + 32 * hh)), I8, 32)
            for g in range(4):
                ql = _load(context, builder, aty, w, builder.add(o, c64(64 * hh + 32 * (g & 1))),
                           I8, 32)
                lo = lshr(ql, 4) if g >> 1 else ql
                v = builder.and_(lo, const8(15))
                hb = builder.and_(lshr(qh, 2 * g), const8(3)) if g else \
                    builder.and_(qh, const8(3))
                v = builder.or_(v, shl(hb, 4))
                v = builder.sub(v, const8(32)) if offset6 else v
                groups.append((v, 128 * hh + 32 * g, 8 * hh + 2 * g, 8 * hh + 2 * g + 1))
    return groups


def _f32_vectors(context, builder, aty, x, n, p, count: int) -> list[ir.Value]:
    """``count`` <8 x float> loaded from float32 row ``n`` of ``x`` at element ``p``."""
    base = _at(context, builder, aty, x, n, p)
    return [builder.load(builder.bitcast(builder.gep(base, [ir.Constant(I64, 8 * i)]),
                                         _vec(F32T, 8).as_pointer()), align=4)
            for i in range(count)]


def _fabs8(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_vec(F32T, 8), [_vec(F32T, 8)]), "llvm.fabs.v8f32")
    return builder.call(fn, [v])


@intrinsic
def block_absmax(typingctx, x, n, p):
    """The largest ``|x[n, p + j]|``, ``j < 256`` (float32 ``x`` 2-D C-contiguous), or NaN when
    one of them is inf or NaN: the ``amax`` of ggml-quants.c ``quantize_row_q8_K_ref`` (its
    ``ax > amax`` never takes a NaN) in 8 lanes, for the blocks without a non-finite value."""
    def codegen(context, builder, sig, args):
        ax, an, ap = args
        m = ir.Constant(_vec(F32T, 8), [0.0] * 8)
        bad = ir.Constant(_vec(ir.IntType(1), 8), [0] * 8)
        inf = ir.Constant(_vec(F32T, 8), [float("inf")] * 8)
        for v in _f32_vectors(context, builder, sig.args[0], ax, an, ap, 32):
            av = _fabs8(builder, v)
            m = builder.select(builder.fcmp_ordered(">", av, m), av, m)
            bad = builder.or_(bad, builder.fcmp_unordered(">=", av, inf))
        h = 8
        while h > 1:
            h //= 2
            lo, hi = _shuf(builder, m, m, list(range(h))), _shuf(builder, m, m, list(range(h, 2 * h)))
            m = builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo)
        any_bad = builder.icmp_unsigned("!=", builder.bitcast(bad, ir.IntType(8)),
                                        ir.Constant(ir.IntType(8), 0))
        return builder.select(any_bad, ir.Constant(F32T, float("nan")),
                              builder.extract_element(m, ir.Constant(I32, 0)))
    return types.float32(x, n, p), codegen


@intrinsic
def block_first_abs(typingctx, x, n, p, a):
    """The first ``j < 256`` with ``|x[n, p + j]| == a`` (0 if none): where ggml's sequential
    ``ax > amax`` scan last moved, i.e. the element whose signed value gives Q8_K's scale."""
    def codegen(context, builder, sig, args):
        ax, an, ap, aa = args
        av = _splat(builder, aa, 8)
        words = [ir.Constant(I64, 0)] * 4
        for i, v in enumerate(_f32_vectors(context, builder, sig.args[0], ax, an, ap, 32)):
            hit = builder.bitcast(builder.fcmp_ordered("==", _fabs8(builder, v), av),
                                  ir.IntType(8))
            bits = builder.shl(builder.zext(hit, I64), ir.Constant(I64, 8 * (i % 8)))
            words[i // 8] = builder.or_(words[i // 8], bits)
        fn = cgutils.get_or_insert_function(builder.module,
                                            ir.FunctionType(I64, [I64, ir.IntType(1)]),
                                            "llvm.cttz.i64")
        idx = ir.Constant(I64, 0)
        for k in (3, 2, 1, 0):  # the lowest non-zero word wins
            tz = builder.add(builder.call(fn, [words[k], ir.Constant(ir.IntType(1), 0)]),
                             ir.Constant(I64, 64 * k))
            idx = builder.select(builder.icmp_unsigned("!=", words[k], ir.Constant(I64, 0)),
                                 tz, idx)
        return idx
    return types.int64(x, n, p, a), codegen


def _maxps(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """x86 ``maxps(a, b)``: ``a > b ? a : b`` lane-wise (a NaN in either gives ``b``)."""
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)


_CVTPS2DQ = "llvm.x86.avx.cvt.ps2dq.256" if _host_has("avx") else None
#: whether :func:`q8_block_x86` compiles (Numba compiles for this CPU and it has AVX)
Q8_X86_VECTOR = _CVTPS2DQ is not None


@intrinsic
def q8_block_x86(typingctx, x, n, p, yq, yd, ys, b, q81):
    """One block of ggml-cpu's x86 ``quantize_row_q8_0`` / ``_q8_1`` (the AVX2 branch of
    ggml-cpu/arch/x86/quants.c) in its vector shape: ``amax`` of ``|x[n, p:p + 32]|`` as its four
    8-lane ``maxps`` then the ``hsum``-shaped ``maxps`` tree, ``d = amax / 127``, ``id = 127 /
    amax`` (0 when amax is 0), each ``x * id`` rounded to nearest even and converted
    (``cvtps2dq``: 0x80000000 for NaN and out of range) then saturated to int8 (the packs): the
    quants go to ``yq[n, p:p + 32]``, ``d`` to ``yd[n, b]`` and, where ``q81``, ``d * (the int32
    sum of the converted values, wrapping)`` to ``ys[n, b]``. The bits of
    :func:`ggmlpy.backends.cpu.qmatmul_kernels.quant_q8`'s x86 form; float32 ``x`` rows and int8
    ``yq`` rows contiguous (callers check). Only where the CPU has AVX (elsewhere it compiles
    to nothing)."""
    def codegen(context, builder, sig, args):
        if _CVTPS2DQ is None:
            return context.get_dummy_value()
        ax, an, ap, ayq, ayd, ays, ab, aq81 = args
        v8, i8x8 = _vec(F32T, 8), _vec(I32, 8)
        xs = _f32_vectors(context, builder, sig.args[0], ax, an, ap, 4)
        m = _fabs8(builder, xs[0])
        for v in xs[1:]:
            m = _maxps(builder, m, _fabs8(builder, v))
        t = _maxps(builder, _shuf(builder, m, m, [4, 5, 6, 7]), _shuf(builder, m, m, [0, 1, 2, 3]))
        u = _maxps(builder, t, _shuf(builder, t, t, [2, 3, 2, 3]))
        amax = builder.extract_element(
            _maxps(builder, u, _shuf(builder, u, u, [1, 1, 3, 3])), ir.Constant(I32, 0))
        c127 = ir.Constant(F32T, 127.0)
        d = builder.fdiv(amax, c127)
        idv = builder.select(builder.fcmp_unordered("!=", amax, ir.Constant(F32T, 0.0)),
                             builder.fdiv(c127, amax), ir.Constant(F32T, 0.0))
        idv8 = _splat(builder, idv, 8)
        rnd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v8]),
                                             "llvm.roundeven.v8f32")
        cvt = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i8x8, [v8]),
                                             _CVTPS2DQ)
        ivs = [builder.call(cvt, [builder.call(rnd, [builder.fmul(v, idv8)])]) for v in xs]
        lo, hi = ir.Constant(i8x8, [-128] * 8), ir.Constant(i8x8, [127] * 8)
        qs = []
        for iv in ivs:
            c = builder.select(builder.icmp_signed(">", iv, hi), hi, iv)
            c = builder.select(builder.icmp_signed("<", c, lo), lo, c)
            qs.append(builder.trunc(c, _vec(I8, 8)))
        q32 = _shuf(builder, _shuf(builder, qs[0], qs[1], list(range(16))),
                    _shuf(builder, qs[2], qs[3], list(range(16))), list(range(32)))
        qp = _at(context, builder, sig.args[3], ayq, an, ap)
        builder.store(q32, builder.bitcast(qp, _vec(I8, 32).as_pointer()), align=1)
        builder.store(d, _at(context, builder, sig.args[4], ayd, an, ab))
        with builder.if_then(builder.icmp_signed("!=", aq81, ir.Constant(aq81.type, 0))):
            tot = builder.add(builder.add(ivs[0], ivs[1]), builder.add(ivs[2], ivs[3]))
            sm = _reduce_add(builder, tot, 8)
            builder.store(builder.fmul(d, builder.sitofp(sm, F32T)),
                          _at(context, builder, sig.args[5], ays, an, ab))
        return context.get_dummy_value()
    return types.none(x, n, p, yq, yd, ys, b, q81), codegen


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


def _madd_scales(builder: ir.IRBuilder, p16: ir.Value, sc: ir.Value) -> ir.Value:
    """<8 x i32>: adjacent pair sums of ``p16 * sc`` (<16 x i16> pair sums of a group's 32
    products; ``sc`` <16 x i16> its sub-block scales: lanes 0-7 for elements 0-15, 8-15 for
    16-31): the ``pmaddwd`` shape."""
    p = builder.mul(builder.sext(p16, _vec(I32, 16)), builder.sext(sc, _vec(I32, 16)))
    return builder.add(_shuf(builder, p, p, list(range(0, 16, 2))),
                       _shuf(builder, p, p, list(range(1, 16, 2))))


#: x86 AVX2's ``vpshufb`` for :func:`_scale_vectors`
_PSHUFB = "llvm.x86.avx2.pshuf.b" if _host_has("avx2") else None


def _scale_vectors(builder: ir.IRBuilder, s8v: ir.Value, pairs: list[tuple[int, int]],
                   opaque: ir.Value) -> list[ir.Value]:
    """For each ``(jl, jh)``: <16 x i16> with lanes 0-7 = ``s8v[jl]``, 8-15 = ``s8v[jh]``
    (``s8v`` <8 x i16> scales). With AVX2: one in-lane ``vpshufb`` each from ``s8v`` copied to
    both 128-bit halves (ggml's ``get_scale_shuffle_k4`` scheme), whose masks are offset by
    ``opaque`` (an i8 that is 0 at run time, unknown to LLVM) so that LLVM keeps the
    instruction (two ports) instead of turning the shuffles into lane-crossing permutes (one
    port, plus a register copy each)."""
    dup = _shuf(builder, s8v, s8v, list(range(8)) * 2)
    out = []
    for jl, jh in pairs:
        if _PSHUFB is None:
            out.append(_shuf(builder, dup, dup, [jl] * 8 + [8 + jh] * 8))
            continue
        t = _vec(I8, 32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t]), _PSHUFB)
        mask = builder.add(ir.Constant(t, [2 * jl, 2 * jl + 1] * 8 + [2 * jh, 2 * jh + 1] * 8),
                           _splat(builder, opaque, 32))
        out.append(builder.bitcast(builder.call(fn, [builder.bitcast(dup, t), mask]),
                                   _vec(I16, 16)))
    return out


# per legacy kind (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): block bytes, quants offset, qh offset (5-bit),
# value offset subtracted, whether the block has a min (Q4_1/Q5_1)
_LEGACY_LAYOUT = {0: (18, 2, 0, 8, False), 1: (20, 4, 0, 0, True), 2: (22, 6, 2, 16, False),
                  3: (24, 8, 4, 0, True), 4: (34, 2, 0, 0, False)}


def _at(context, builder, aty, arr, *idx) -> ir.Value:
    """Pointer to ``arr[idx]`` (any layout, no bounds check)."""
    a = context.make_array(aty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, aty, a, list(idx))


def _host_vnni() -> bool:
    """Whether Numba compiles for this CPU and it has 256-bit ``vpdpbusd`` (AVX512-VNNI with
    AVX512-VL, or AVX-VNNI)."""
    return (_host_has("avx512vnni") and _host_has("avx512vl")) or _host_has("avxvnni")


#: whether the legacy rows use ``vpdpbusd`` (u8 x s8 products, groups of 4 summed into i32)
#: with the activations' offset sums made once per call (:func:`legacy_offsets`); else
#: ``vpmaddubsw`` pairs and ``pmaddwd`` with ones. The integer lanes are the same either way.
VNNI = _host_vnni()
_DPBUSD = "llvm.x86.avx512.vpdpbusd.256"


def _dpbusd(builder: ir.IRBuilder, acc: ir.Value, u: ir.Value, s8: ir.Value) -> ir.Value:
    """<8 x i32>: ``acc[i] + sum_{j<4} u[4i+j] * s8[4i+j]`` (``u`` <32 x i8> read as unsigned,
    ``s8`` as signed; exact: no intermediate saturation)."""
    v = _vec(I32, 8)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v, [v, v, v]), _DPBUSD)
    return builder.call(fn, [acc, builder.bitcast(u, v), builder.bitcast(s8, v)])


#: the value offset of each legacy kind's unsigned quants in the VNNI rows (Q8_0: its signed
#: values plus 128)
_VNNI_SUB = {0: 8, 1: 0, 2: 16, 3: 0, 4: 128}


@intrinsic
def legacy_offsets(typingctx, yq, off, kind):
    """``off[n, 8 b + i] = -sub * sum_{j<4} yq[n, 32 b + 4 i + j]`` for every activation row
    ``n`` and block ``b`` (int8 ``yq`` ``(N, K)``, int32 ``off`` ``(N, K / 4)``), ``sub`` the
    value offset of legacy kind ``kind`` (:data:`_VNNI_SUB`; 0 for Q4_1/Q5_1: zeros): the
    correction the VNNI rows start each block's lanes from. Only where :data:`VNNI`."""
    def codegen(context, builder, sig, args):
        ayq, aoff, akind = args
        tyq, toff = sig.args[0], sig.args[1]
        a = context.make_array(tyq)(context, builder, ayq)
        N, K = cgutils.unpack_tuple(builder, a.shape, 2)
        nb = builder.udiv(K, ir.Constant(K.type, 32))
        zero = ir.Constant(_vec(I32, 8), [0] * 8)
        subs = ir.Constant(_vec(I8, 32), [0] * 32)
        for k, v in _VNNI_SUB.items():
            c = builder.icmp_signed("==", akind, ir.Constant(akind.type, k))
            subs = builder.select(c, ir.Constant(_vec(I8, 32), [v & 255] * 32), subs)
        with cgutils.for_range(builder, N) as ln:
            with cgutils.for_range(builder, nb) as lb:
                yp = _at(context, builder, tyq, ayq, ln.index,
                         builder.mul(lb.index, ir.Constant(K.type, 32)))
                yv = builder.load(builder.bitcast(yp, _vec(I8, 32).as_pointer()), align=1)
                o = builder.sub(zero, _dpbusd(builder, zero, subs, yv))
                op = _at(context, builder, toff, aoff, ln.index,
                         builder.mul(lb.index, ir.Constant(K.type, 8)))
                builder.store(o, builder.bitcast(op, _vec(I32, 8).as_pointer()), align=4)
        return context.get_dummy_value()
    return types.none(yq, off, kind), codegen


#: legacy rows: how many weight rows ahead a block is prefetched (:func:`_row_legacy_codegen`)
LEGACY_PREFETCH_ROWS = 4


def legacy_value_kind(kind: int) -> int:
    """How a legacy kind's quants decode: 0 Q8_0's signed bytes, 1 nibbles (Q4_0/Q4_1),
    2 nibbles plus fifth bits (Q5_0/Q5_1)."""
    return 0 if kind == 4 else 2 if kind in (2, 3) else 1


def legacy_array_types(sig) -> tuple:
    """The Numba array types of a legacy row intrinsic's arrays ``(w, yq, yd, yx, yo, out,
    tbl)``, from its signature ``(w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb)``."""
    return tuple(sig.args[i] for i in (0, 2, 3, 4, 5, 7, 9))


def _row_legacy_codegen(kind: int, R: int, P: int):
    bsz, qo, qhs, sub, has_min = _LEGACY_LAYOUT[kind]
    vkind = legacy_value_kind(kind)

    def codegen(context, builder, sig, args):
        w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb = args
        aw, ayq, ayd, ayx, ayo, aout, atbl = legacy_array_types(sig)
        i64 = nb.type
        v8 = _vec(F32T, 8)

        def c64(v):
            return ir.Constant(i64, v)

        wrows = [builder.add(m, ir.Constant(m.type, p)) for p in range(P)]
        rows = [builder.add(n0, ir.Constant(n0.type, r)) for r in range(R)]
        acc = {(p, r): cgutils.alloca_once_value(builder, ir.Constant(v8, [0.0] * 8))
               for p in range(P) for r in range(R)}
        accm = {(p, r): cgutils.alloca_once_value(builder, ir.Constant(F32T, 0.0))
                for p in range(P) for r in range(R)}
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            o = builder.mul(b, c64(bsz))
            blocks = []
            for wm in wrows:  # each weight row's block, decoded once for the R activation rows
                def wptr(off, wm=wm):
                    return _at(context, builder, aw, w, wm, builder.add(o, c64(off)))

                # the same block LEGACY_PREFETCH_ROWS rows ahead (weights streamed from memory:
                # the output projection's 178 MB; a hint, harmless past the last row)
                _prefetch(builder, _at(context, builder, aw, w,
                                       builder.add(wm, ir.Constant(wm.type, LEGACY_PREFETCH_ROWS)),
                                       o))

                def half_at(off, wptr=wptr):
                    bits = builder.load(builder.bitcast(wptr(off), I16.as_pointer()), align=1)
                    return builder.load(_elem_ptr(context, builder, atbl, tbl,
                                                  builder.zext(bits, i64)))

                def load(off, n, wptr=wptr):
                    return builder.load(builder.bitcast(wptr(off), _vec(I8, n).as_pointer()),
                                        align=1)
                dw = half_at(0)
                # unsigned values (4-bit: 0..15, 5-bit: 0..31), the offset taken off after the
                # products; Q8_0's signed values: VNNI as x + 128 (the offset 128), else as |x|
                # with x's sign moved onto the activations
                if vkind == 0:
                    vals = load(qo, 32)
                else:
                    vals = _nibbles(builder, load(qo, 16))
                    if vkind == 2:
                        vals = builder.or_(vals, _fifth_bits(builder, load(qhs, 4)))
                neg = None
                if vkind == 0 and VNNI:
                    vals = builder.xor(vals, ir.Constant(_vec(I8, 32), [-128] * 32))
                elif vkind == 0:
                    neg = builder.icmp_signed("<", vals, ir.Constant(_vec(I8, 32), [0] * 32))
                    vals = builder.select(neg, builder.sub(ir.Constant(_vec(I8, 32), [0] * 32),
                                                           vals), vals)
                blocks.append((dw, vals, neg, half_at(2) if has_min else None))
            dwv = None
            if P > 1:  # the P weight scales as one vector: d_w * d_y for all P in one multiply
                dwv = ir.Constant(_vec(F32T, P), ir.Undefined)
                for p, blk in enumerate(blocks):
                    dwv = builder.insert_element(dwv, blk[0], ir.Constant(I32, p))
            for r, n in enumerate(rows):
                dy = builder.load(_at(context, builder, ayd, yd, n, b))
                dv = builder.fmul(dwv, _splat(builder, dy, P)) if dwv is not None else None
                yp = _at(context, builder, ayq, yq, n, builder.mul(b, c64(32)))
                y0 = builder.load(builder.bitcast(yp, _vec(I8, 32).as_pointer()), align=1)
                a0 = ir.Constant(_vec(I32, 8), [0] * 8)
                if VNNI and _VNNI_SUB[kind]:
                    # the lanes start from -offset * the activations' sums of 4
                    op = _at(context, builder, ayo, yo, n, builder.mul(b, c64(8)))
                    a0 = builder.load(builder.bitcast(op, _vec(I32, 8).as_pointer()), align=4)
                sy = builder.load(_at(context, builder, ayx, yx, n, b)) if has_min else None
                for p, (dw, vals, neg, mw) in enumerate(blocks):
                    yv = y0
                    if VNNI:
                        s32 = _dpbusd(builder, a0, vals, yv)
                    else:
                        if neg is not None:
                            yv = builder.select(neg, builder.sub(
                                ir.Constant(_vec(I8, 32), [0] * 32), yv), yv)
                        # |pair| <= 2 * 128 * 127 < 2**15 (activations are within +-127)
                        p16 = _maddubs(builder, vals, yv)
                        if sub:
                            p16 = builder.sub(p16, _maddubs(
                                builder, ir.Constant(_vec(I8, 32), [sub] * 32), yv))
                        s32 = _madd_ones(builder, p16)
                    if dv is None:
                        d8 = _splat(builder, builder.fmul(dw, dy), 8)
                    else:  # lane p of the products (the same rounding as one multiply)
                        d8 = _shuf(builder, dv, dv, [p] * 8)
                    builder.store(_fma(builder, builder.sitofp(s32, v8), d8,
                                       builder.load(acc[p, r])), acc[p, r])
                    if has_min:
                        builder.store(_fma(builder, mw, sy, builder.load(accm[p, r])),
                                      accm[p, r])
        for p in range(P):
            col = builder.add(mc, ir.Constant(mc.type, p))
            for r, n in enumerate(rows):
                v = _tree_sum(builder, builder.load(acc[p, r]), 8)
                if has_min:
                    v = builder.fadd(v, builder.load(accm[p, r]))
                builder.store(v, _at(context, builder, aout, out, n, col))
        return context.get_dummy_value()
    return codegen


def _row_legacy(kind: int, R: int, P: int = 1):
    def typer(typingctx, w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb):
        return (types.none(w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb),
                _row_legacy_codegen(kind, R, P))
    return typer


# row_q*/row4_q*/row2w_q*(w, m, yq, yd, yx, yo, n0, out, mc, tbl, nb): out[n0 + r, mc + p]
# for r < R, p < P, the dot products of weight rows m + p (uint8 w (M, row_bytes), nb blocks
# each) with activation rows n0 + r (int8 quants yq (N, K), float32 scales yd (N, nb), Q8_1
# sums yx (N, nb); with VNNI the int32 offset sums yo (N, K / 4) of legacy_offsets, else
# unused), each block decoded once for the R rows. ggml's SIMD shape: every block's 32 integer
# products in 8 exact int32 lane sums (lane i: elements 4i..4i+3; VNNI: vpdpbusd of the
# unsigned quants with the activations, started from -offset * their sums of 4; else the
# unsigned quants times the activations by _maddubs, the offset taken off as offset * the
# activations' pair sums, Q8_0 by the sign trick, then pmaddwd with ones), converted to float
# and added to 8 float32 lanes with one fused multiply-add by the block's scale d_w * d_y (d_w
# read from the f16 table tbl); the lanes then summed as a fixed tree; Q4_1/Q5_1 add their
# m_w * s_y terms in one more float32 accumulator (fused multiply-adds in block order) after the
# tree. row_*: R = P = 1; row4_*: R = 4 activation rows; row2w_*: P = 2 weight rows, whose
# accumulations are independent chains of fused multiply-adds (one chain is bound by their
# latency); row44_*: a tile of P = 4 weight rows by R = 4 activation rows (16 accumulators in
# registers: each weight block is decoded once for 4 activation rows and each activation block
# read once for 4 weight rows, a quarter of the cache traffic of row4_* on prompt batches).
# Each output's operations are the same in every variant.
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
row2w_q4_0 = intrinsic(_row_legacy(0, 1, 2))
row2w_q4_1 = intrinsic(_row_legacy(1, 1, 2))
row2w_q5_0 = intrinsic(_row_legacy(2, 1, 2))
row2w_q5_1 = intrinsic(_row_legacy(3, 1, 2))
row2w_q8_0 = intrinsic(_row_legacy(4, 1, 2))
row44_q4_0 = intrinsic(_row_legacy(0, 4, 4))
row44_q4_1 = intrinsic(_row_legacy(1, 4, 4))
row44_q5_0 = intrinsic(_row_legacy(2, 4, 4))
row44_q5_1 = intrinsic(_row_legacy(3, 4, 4))
row44_q8_0 = intrinsic(_row_legacy(4, 4, 4))


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
    # kind 3: Q4_K (kind 0's decoding) with llama.cpp's repacked gemv order: per super-block the
    # exact integer sums (all lanes added) in one float32 FMA each, scales and mins apart
    gemv = kind == 3
    if gemv:
        kind = 0
    bsz = _KQ_BYTES[kind]

    def codegen(context, builder, sig, args):
        w, wo, yq, yd, bs, n0, out, m, tbl, nb = args
        aw, ayq, ayd, abs_, aout, atbl = (sig.args[0], sig.args[2], sig.args[3], sig.args[4],
                                          sig.args[6], sig.args[8])
        i64 = wo.type
        v8 = _vec(F32T, 8)
        v4 = _vec(F32T, 4)
        rows = [builder.add(n0, ir.Constant(n0.type, r)) for r in range(R)]
        acc = [cgutils.alloca_once_value(builder, ir.Constant(F32T, 0.0) if gemv
                                         else ir.Constant(v8, [0.0] * 8)) for _ in rows]
        # Q4_K: 4 float32 lanes for the min terms; Q5_K (and the gemv order): one float32
        # accumulator
        accm = [cgutils.alloca_once_value(builder, ir.Constant(v4, [0.0] * 4)
                                          if kind == 0 and not gemv
                                          else ir.Constant(F32T, 0.0)) for _ in rows]

        def c64(v):
            return ir.Constant(i64, v)

        # 0 at run time (the bits of tbl[0], the f16 value 0.0), unknown to LLVM
        opaque = builder.trunc(builder.bitcast(builder.load(
            _elem_ptr(context, builder, atbl, tbl, c64(0))), I32), I8)
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

            groups = _kgroups(context, builder, aw, w, o, kind, offset6=False)
            if kind == 2:
                scv = []
                for h in range(2):
                    half = _shuf(builder, sc, sc, list(range(8 * h, 8 * h + 8)))
                    scv += _scale_vectors(builder, half, [(j0 - 8 * h, j1 - 8 * h) for
                                                          _, _, j0, j1 in groups[4 * h:4 * h + 4]],
                                          opaque)
            else:
                scv = _scale_vectors(builder, sc, [(j0, j1) for _, _, j0, j1 in groups], opaque)
            dw = half_at(208 if kind == 2 else 0)
            dmw = half_at(2) if kind < 2 else None
            for r, n in enumerate(rows):  # the decoded super-block serves every activation row
                dy = builder.load(_at(context, builder, ayd, yd, n, b))
                parts = []
                for (v, e, _, _), sv in zip(groups, scv):
                    yp = _at(context, builder, ayq, yq, n,
                             builder.add(builder.mul(b, c64(256)), c64(e)))
                    yv = builder.load(builder.bitcast(yp, _vec(I8, 32).as_pointer()), align=1)
                    # unsigned values (0..15, 0..31, Q6_K 0..63): |pair| <= 2 * 63 * 128 < 2**15
                    parts.append(_madd_scales(builder, _maddubs(builder, v, yv), sv))
                while len(parts) > 1:  # a balanced tree: no long chain of dependent adds
                    parts = [builder.add(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
                sumi = parts[0]
                if kind == 2:
                    # Q6_K's -32: lane i less 32 * (sc[2i] bsum[2i] + sc[2i+1] bsum[2i+1])
                    lo, hi = _bsums(context, builder, abs_, bs, n, b)
                    off = _pairs(builder, _mul_small(builder, lo, sc32[0]),
                                 _mul_small(builder, hi, sc32[1]))
                    sumi = builder.sub(sumi, builder.shl(off, ir.Constant(_vec(I32, 8), [5] * 8)))
                d = builder.fmul(dw, dy)
                if gemv:
                    builder.store(_fma(builder, builder.sitofp(_reduce_add(builder, sumi, 8),
                                                               F32T), d, builder.load(acc[r])),
                                  acc[r])
                else:
                    builder.store(_fma(builder, builder.sitofp(sumi, v8),
                                       _splat(builder, d, 8), builder.load(acc[r])), acc[r])
                if kind < 2:
                    # the mins: lane i = min[2i] (bsum[4i] + bsum[4i+1])
                    #                    + min[2i+1] (bsum[4i+2] + bsum[4i+3])
                    bp = _pairs(builder, *_bsums(context, builder, abs_, bs, n, b))
                    pm = _mul_small(builder, bp, mn)
                    prod = builder.add(_shuf(builder, pm, pm, [0, 2, 4, 6]),
                                       _shuf(builder, pm, pm, [1, 3, 5, 7]))
                    if gemv:  # accm = fma(float(imin), dmin * d_y, accm), subtracted at the end
                        summ = _reduce_add(builder, prod, 4)
                        builder.store(_fma(builder, builder.sitofp(summ, F32T),
                                           builder.fmul(dmw, dy), builder.load(accm[r])),
                                      accm[r])
                        continue
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
            if gemv:
                builder.store(builder.fsub(builder.load(acc[r]), builder.load(accm[r])),
                              _at(context, builder, aout, out, n, m))
                continue
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
#: Q4_K in llama.cpp's repacked gemv order (``ggml_gemv_q4_K_8x8_q8_K``, x86): per super-block
#: ``acc = fma(float(sum_j sc_j (q4 . q8)_j), d_w * d_y, acc)`` and ``accm = fma(float(sum_j
#: mn_j bsum_j), dmin_w * d_y, accm)``, the result ``acc - accm``
#: (:mod:`ggmlpy.backends.cpu.repack_q4k`: the same bits)
row_q4_K_gemv = intrinsic(_row_kquant(3, 1))
