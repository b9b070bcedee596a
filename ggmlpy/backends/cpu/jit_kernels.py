"""The Numba kernels behind :mod:`ggmlpy.backends.cpu.jit` (imported by it on first use only;
importing this module imports Numba). Module-level functions, so that Numba's on-disk cache
(``cache=True``) finds them again in a later process. See :mod:`ggmlpy.backends.cpu.jit` for the
formulas and their accuracy; shapes and layouts are checked there, not here.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.fma_ir import reduce512, vload, vtype

# no 'nnan'/'ninf': NaN and inf must propagate as in ggml; 'contract' allows FMAs, 'reassoc'
# lets LLVM vectorize the reductions
_FASTMATH = {"contract", "arcp", "nsz", "reassoc"}
_OPTS = dict(fastmath=_FASTMATH, cache=True, nogil=True, error_model="numpy")

F32 = np.float32
F32_TINY = F32(np.finfo(np.float32).tiny)
LN_TINY = F32(-87.33654)                      # ~ln(F32_TINY): below it exp(y) < F32_TINY -> 0
LOG2E = F32(1.4426950408889634)
LN2_HI, LN2_LO = F32(0.693359375), F32(-2.12194440e-4)  # LN2_HI: 9 significant bits
E2, E3, E4, E5, E6, E7 = (F32(1.0 / math.factorial(i)) for i in range(2, 8))
#: the table GELU's bounds (ggml-cpu vec.h ``GELU_COEF``-table loops: ``x <= -10`` -> 0,
#: ``x >= 10`` -> x; ggmlpy.backends.kernels.unary.GELU_TABLE_LIMIT)
GELU_LIMIT = F32(10.0)


@njit(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})
def reduce_ln2(y, k):
    # y - k ln2 in two steps (Cody-Waite): k * LN2_HI is exact for |k| <= 2^15, so the first
    # difference is exact. A separate, not-inlined function without 'reassoc': with it LLVM
    # folds the two steps into y - k * float32(ln2) (error up to 2.4e-7 at y = -87)
    r = y - k * LN2_HI
    return r - k * LN2_LO


@njit(inline="always", **_OPTS)
def expf_nonpos(y):  # exp(y) for float32 y <= 0: < 1 ulp; y < LN_TINY -> 0; NaN stays NaN
    yc = LN_TINY if y < LN_TINY else y
    k = np.floor(yc * LOG2E + F32(0.5))       # float32: int64 here would make the loop f64
    r = reduce_ln2(yc, k)                     # |r| <= ln2 / 2
    p = E7
    p = p * r + E6
    p = p * r + E5
    p = p * r + E4
    p = p * r + E3
    p = p * r + E2
    p = p * r + F32(1.0)
    p = p * r + F32(1.0)
    e = p * np.int32((np.int32(k) + np.int32(127)) << np.int32(23)).view(np.float32)  # * 2**k
    return F32(0.0) if y < LN_TINY else e


P = F32(0.3275911 * math.sqrt(0.5))
A1, A2, A3, A4, A5 = (F32(v) for v in (0.254829592, -0.284496736, 1.421413741, -1.453152027,
                                       1.061405429))
GELU_SQ_MIN = F32(1e-18)  # below it a*a would be a float32 subnormal (slow): use 0 instead


@njit(inline="always", **_OPTS)
def gelu1(v):
    a = abs(v)
    a = F32(30.0) if a > F32(30.0) else a     # NaN passes through
    t = F32(1.0) / (F32(1.0) + P * a)
    q = t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5))))
    aa = a * a if a > GELU_SQ_MIN else F32(0.0)
    c = F32(0.5) * a * q * expf_nonpos(F32(-0.5) * aa)
    r = (F32(0.0) if v < F32(0.0) else v) - c  # NaN passes through
    return F32(0.0) if abs(r) < F32_TINY else r  # no float32 subnormals (they slow BLAS 10x)


@njit(**_OPTS)
def gelu_body(x, out):
    for i in range(x.size):
        out[i] = gelu1(x[i])


@njit(**_OPTS)
def gelu_inplace_body(x):  # one array: LLVM vectorizes without a runtime overlap check
    for i in range(x.size):
        x[i] = gelu1(x[i])


@njit(inline="always", **_OPTS)
def max_key(v):  # float32 bits as an int32 that orders like the float (integer max vectorizes)
    k = np.float32(v).view(np.int32)
    return k ^ ((k >> np.int32(31)) & np.int32(0x7fffffff))


@njit(inline="always", **_OPTS)
def softmax_rows(x, m, has_mask, dims, sc, o):
    # x, o: flat C-order (X3, X2, X1, X0) (o may be x); m: flat (M3, M2, M1, X0)
    X3, X2, X1, X0, M3, M2, M1 = dims
    i1 = i2 = i3 = 0
    for r in range(X3 * X2 * X1):             # counters, no divisions per row
        b = r * X0
        if has_mask:
            mb = (((i3 % M3) * M2 + (i2 % M2)) * M1 + i1) * X0
            for j in range(X0):
                o[b + j] = x[b + j] * sc + m[mb + j]
        else:
            for j in range(X0):
                o[b + j] = x[b + j] * sc
        i1 += 1
        if i1 == X1:
            i1 = 0
            i2 += 1
            if i2 == X2:
                i2 = 0
                i3 += 1
        mk = np.int32(-2147483648)
        for j in range(X0):
            k = max_key(o[b + j])
            mk = k if k > mk else mk
        mx = np.int32(mk ^ ((mk >> np.int32(31)) & np.int32(0x7fffffff))).view(np.float32)
        for j in range(X0):
            o[b + j] = expf_nonpos(o[b + j] - mx)  # a NaN max (NaN in the row) -> NaN row
        s = 0.0
        for j in range(X0):                    # float64 sum, a separate loop (vectorizes)
            s += o[b + j]
        inv = F32(1.0 / s)
        for j in range(X0):
            e = o[b + j] * inv
            o[b + j] = F32(0.0) if e < F32_TINY else e  # no float32 subnormals


@njit(**_OPTS)
def softmax_body(x, m, has_mask, dims, scale, out):
    softmax_rows(x, m, has_mask, dims, scale, out)


@njit(**_OPTS)
def softmax_inplace_body(x, m, has_mask, dims, scale):
    # inlined with one name for both arrays, so LLVM knows they are the same memory
    softmax_rows(x, m, has_mask, dims, scale, x)


@intrinsic
def _centre_sq16(typingctx, x, i, mean, out):
    """``ggml_vec_cvar_f32``'s AVX-512 step: ``v = x[i:i+16] - mean`` stored to
    ``out[i:i+16]``, returns ``_mm512_reduce_add_ps(v * v)`` (float32). ``x``, ``out``: 1-D
    float32 C-contiguous rows; the caller guarantees the bounds."""
    sig = types.float32(x, i, mean, out)

    def codegen(context, builder, signature, args):
        x_, i_, mean_, out_ = args
        vt = vtype(16)
        v = vload(context, builder, signature.args[0], x_, i_, 16)
        undef = ir.Constant(vt, ir.Undefined)
        m = builder.shuffle_vector(builder.insert_element(undef, mean_, ir.Constant(ir.IntType(64), 0)),
                                   undef, ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))
        d = builder.fsub(v, m)
        o = context.make_array(signature.args[3])(context, builder, out_)
        builder.store(d, builder.bitcast(builder.gep(o.data, [i_]), vt.as_pointer()), align=4)
        return reduce512(builder, builder.fmul(d, d))
    return sig, codegen


#: no fast-math flags: ggml's own order of float32 and float64 operations
_EXACT = dict(cache=True, nogil=True, error_model="numpy")


@njit(inline="always", **_EXACT)
def _norm_rows_ggml(x, out, eps):
    # ggml-cpu ops.cpp ggml_compute_forward_norm_f32 with AVX512F+DQ: the row sum in double in
    # order (ggml_vec_sum_f32), rounded to float, mean = sum / ne00 in float; ggml_vec_cvar_f32:
    # y = x - mean, the squares of 16 values reduced as _mm512_reduce_add_ps (halves added) and
    # added in double, then the n % 16 leftover squares one by one; variance = (float)(sum / n);
    # scale = 1.0f / sqrtf(variance + eps); y *= scale. out may be x (each element is read
    # before it is written).
    R, n = x.shape
    n16 = n - n % 16
    e, fn = F32(eps), F32(n)
    means = np.empty(R, F32)
    r = 0
    while r + 4 <= R:  # four rows' sums side by side: four independent float64 chains
        x0, x1, x2, x3 = x[r], x[r + 1], x[r + 2], x[r + 3]
        s0 = s1 = s2 = s3 = 0.0
        for j in range(n):
            s0 += np.float64(x0[j])
            s1 += np.float64(x1[j])
            s2 += np.float64(x2[j])
            s3 += np.float64(x3[j])
        means[r], means[r + 1] = F32(s0) / fn, F32(s1) / fn
        means[r + 2], means[r + 3] = F32(s2) / fn, F32(s3) / fn
        r += 4
    for r1 in range(r, R):
        xr = x[r1]
        s = 0.0
        for j in range(n):
            s += np.float64(xr[j])
        means[r1] = F32(s) / fn
    for r in range(R):
        xr = x[r]
        orow = out[r]
        mean = means[r]
        acc = 0.0
        for i in range(0, n16, 16):
            acc += np.float64(_centre_sq16(xr, i, mean, orow))
        for j in range(n16, n):
            v = xr[j] - mean
            orow[j] = v
            acc += np.float64(v * v)
        var = F32(acc / n)
        scale = F32(1.0) / F32(np.sqrt(var + e))
        for j in range(n):
            orow[j] = orow[j] * scale


@njit(**_EXACT)
def rms_norm_body(x, eps, out):
    # ggml-cpu ggml_compute_forward_rms_norm_f32: sum += (double)(x*x) in element order (no
    # fastmath: no reassociation); mean = (float)(sum/n); scale = 1.0f/sqrtf(mean + eps);
    # y = x*scale in float32. out may be x (each row is read whole before it is written)
    R, n = x.shape
    e = F32(eps)
    for r in range(R):
        xr = x[r]
        s = 0.0
        for j in range(n):
            v = xr[j]
            s += np.float64(v * v)
        scale = F32(1.0) / np.sqrt(F32(s / n) + e)
        orow = out[r]
        for j in range(n):
            orow[j] = xr[j] * scale


@njit(**_EXACT)
def norm_body(x, eps, out):
    _norm_rows_ggml(x, out, eps)


@njit(**_EXACT)
def norm_inplace_body(x, eps):
    _norm_rows_ggml(x, x, eps)


@njit(**_OPTS)
def binary_body(a, b, out, op):
    R, n = a.shape
    bcast = b.shape[0] == 1
    for r in range(R):
        ar = a[r]
        br = b[0] if bcast else b[r]
        orow = out[r]
        if op == 0:
            for j in range(n):
                orow[j] = ar[j] + br[j]
        elif op == 1:
            for j in range(n):
                orow[j] = ar[j] - br[j]
        elif op == 2:
            for j in range(n):
                orow[j] = ar[j] * br[j]
        else:
            for j in range(n):
                orow[j] = ar[j] / br[j]


@njit(**_OPTS)
def binary_inplace_body(a, b, op):  # a (op)= b: two arrays, so LLVM's overlap check passes
    R, n = a.shape
    bcast = b.shape[0] == 1
    for r in range(R):
        ar = a[r]
        br = b[0] if bcast else b[r]
        if op == 0:
            for j in range(n):
                ar[j] += br[j]
        elif op == 1:
            for j in range(n):
                ar[j] -= br[j]
        elif op == 2:
            for j in range(n):
                ar[j] *= br[j]
        else:
            for j in range(n):
                ar[j] /= br[j]


@intrinsic
def _f16_index(typingctx, x):
    """The f16 bit pattern of float32 ``x`` rounded to nearest even (LLVM ``fptrunc`` to half, as
    F16C's ``vcvtps2ph`` and NumPy's ``astype(float16)``), as an int64 table index 0..65535."""
    def codegen(context, builder, sig, args):
        h = builder.fptrunc(args[0], ir.HalfType())
        bits = builder.bitcast(h, ir.IntType(16))
        return builder.zext(bits, ir.IntType(64))
    return types.int64(types.float32), codegen


@njit(inline="always", **_OPTS)
def _gelu_table1(v, table):
    if v >= GELU_LIMIT:
        return v
    if v <= -GELU_LIMIT:
        return F32(0.0)
    return table[_f16_index(v)]


@njit(**_OPTS)
def gelu_table_body(x, table, out):
    for i in range(x.shape[0]):
        out[i] = _gelu_table1(x[i], table)


@njit(**_OPTS)
def gelu_table_inplace_body(x, table):
    for i in range(x.shape[0]):
        x[i] = _gelu_table1(x[i], table)


@njit(**_OPTS)
def geglu_table_body(x, g, table, out):
    for i in range(x.shape[0]):
        v = x[i]
        if v <= -GELU_LIMIT:
            out[i] = F32(0.0)
        else:
            out[i] = _gelu_table1(v, table) * g[i]


@intrinsic
def _half16_to_f32(typingctx, src, dst, i):
    """``dst[i:i+16] = float32(src[i:i+16])`` (uint16 f16 bits ``src``, float32 ``dst``, flat
    C-contiguous; LLVM ``fpext`` of 16 halves: F16C's ``vcvtph2ps``, exact)."""
    def codegen(context, builder, sig, args):
        a_src = context.make_array(sig.args[0])(context, builder, args[0])
        a_dst = context.make_array(sig.args[1])(context, builder, args[1])
        vh = ir.VectorType(ir.IntType(16), 16)
        p = builder.bitcast(builder.gep(a_src.data, [args[2]]), vh.as_pointer())
        h = builder.bitcast(builder.load(p, align=2), ir.VectorType(ir.HalfType(), 16))
        f = builder.fpext(h, ir.VectorType(ir.FloatType(), 16))
        q = builder.bitcast(builder.gep(a_dst.data, [args[2]]), f.type.as_pointer())
        builder.store(f, q, align=4)
        return context.get_dummy_value()
    return types.none(src, dst, i), codegen


@njit(**_EXACT)
def half_to_f32_body(src, dst):
    # 16 at a time in vector code, the tail through a zero-padded block of 16 (the same
    # conversion for every element: signalling NaNs come out quiet, as F16C and ggml give them)
    n = src.shape[0]
    n16 = n - n % 16
    for i in range(0, n16, 16):
        _half16_to_f32(src, dst, i)
    if n16 < n:
        hs = np.zeros(16, np.uint16)
        fs = np.empty(16, np.float32)
        for i in range(n16, n):
            hs[i - n16] = src[i]
        _half16_to_f32(hs, fs, 0)
        for i in range(n16, n):
            dst[i] = fs[i - n16]
