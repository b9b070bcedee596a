"""The Numba kernels behind :mod:`ggmlpy.backends.cpu.qgemm` (imported by it on first use only;
importing this module imports Numba): block-quantized weight rows to float32 tiles, and float32
activations quantized to Q8_0/Q8_1/Q8_K (Q8_0/Q8_1 in any form of
:mod:`ggmlpy.quants.q8_arch`, Q8_K as :mod:`ggmlpy.quants.q8`, bit for bit) and written as the float32 values their blocks stand for.

Module-level functions so that Numba's on-disk cache (``cache=True``) finds them again in a later
process. Shapes and layouts are checked by the caller, not here. No ``fastmath``: every float32
operation is the one written (no reassociation, no fused multiply-add), so the results are
bit-identical to NumPy evaluating the same expressions.

Dequantizers (``deq_<type>(w, out, f16, split, n16)``): ``w`` uint8 ``(R, row_bytes)`` weight rows as
they lie (whole blocks), ``out`` float32 ``(R, >= K)``; ``f16`` the float32 value of every f16
bit pattern (``(65536,)``, NumPy's conversion: the scales decode exactly as NumPy decodes them,
subnormals, inf and NaN included). Each element is computed with the float32 expression of
gguf-py's NumPy dequantizer for its type (ggml-quants.c ``dequantize_row_*``), which is what
:func:`ggmlpy.quants.dequantize` returns: Q4_0/Q5_0 ``d * (q - off)``, Q8_0 ``q * d``, Q4_1/Q5_1
``d * q + m``, Q4_K/Q5_K ``(d * sc) * q - dmin * mn``, Q6_K ``(d * sc) * (q - 32)``. With ``split``
(Q4_1/Q5_1 only) the min is left out, ``out[r, k] = d * q``, and block ``b``'s ``m`` is written to
``out[r, K + b]`` (the extra columns that :mod:`ggmlpy.backends.cpu.qgemm` pairs with Q8_1's
``s``). ``n16`` is 16, passed at run time: a block loop of a trip count LLVM cannot see is
vectorized, where a constant 16 is unrolled into scalar code (several times slower for Q4_0,
Q4_1 and Q8_0).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)
F32 = np.float32


@njit(inline="always", **_OPTS)
def _h(wr, o, f16):
    return f16[np.int32(wr[o]) | (np.int32(wr[o + 1]) << 8)]


@njit(inline="always", **_OPTS)
def _u32(wr, o):
    return (np.uint32(wr[o]) | (np.uint32(wr[o + 1]) << np.uint32(8))
            | (np.uint32(wr[o + 2]) << np.uint32(16)) | (np.uint32(wr[o + 3]) << np.uint32(24)))


@njit(**_OPTS)
def deq_q4_0(w, out, f16, split, n16):
    R, nb = w.shape[0], w.shape[1] // 18
    for r in range(R):
        wr = w[r]
        o = out[r]
        for b in range(nb):
            p = b * 18
            d = _h(wr, p, f16)
            for j in range(n16):
                v = wr[p + 2 + j]
                o[b * 32 + j] = d * F32(np.int32(v & np.uint8(0xF)) - np.int32(8))
                o[b * 32 + 16 + j] = d * F32(np.int32(v >> np.uint8(4)) - np.int32(8))


@njit(**_OPTS)
def deq_q4_1(w, out, f16, split, n16):
    R, nb = w.shape[0], w.shape[1] // 20
    K = nb * 32
    for r in range(R):
        wr = w[r]
        o = out[r]
        for b in range(nb):
            p = b * 20
            d = _h(wr, p, f16)
            m = _h(wr, p + 2, f16)
            if split:
                for j in range(n16):
                    v = wr[p + 4 + j]
                    o[b * 32 + j] = d * F32(np.int32(v) & 0xF)
                    o[b * 32 + 16 + j] = d * F32(np.int32(v) >> 4)
                o[K + b] = m
            else:
                for j in range(n16):
                    v = wr[p + 4 + j]
                    o[b * 32 + j] = d * F32(np.int32(v & np.uint8(0xF))) + m
                    o[b * 32 + 16 + j] = d * F32(np.int32(v >> np.uint8(4))) + m


@njit(**_OPTS)
def deq_q5_0(w, out, f16, split, n16):
    R, nb = w.shape[0], w.shape[1] // 22
    for r in range(R):
        wr = w[r]
        o = out[r]
        for b in range(nb):
            p = b * 22
            d = _h(wr, p, f16)
            qh = _u32(wr, p + 2)
            for j in range(16):
                v = wr[p + 6 + j]
                lo = np.int32(v & 0xF) | np.int32(((qh >> np.uint32(j)) & np.uint32(1)) << 4)
                hi = np.int32(v >> 4) | np.int32(((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4)
                o[b * 32 + j] = d * F32(lo - 16)
                o[b * 32 + 16 + j] = d * F32(hi - 16)


@njit(**_OPTS)
def deq_q5_1(w, out, f16, split, n16):
    R, nb = w.shape[0], w.shape[1] // 24
    K = nb * 32
    for r in range(R):
        wr = w[r]
        o = out[r]
        for b in range(nb):
            p = b * 24
            d = _h(wr, p, f16)
            m = _h(wr, p + 2, f16)
            qh = _u32(wr, p + 4)
            if split:
                for j in range(16):
                    v = wr[p + 8 + j]
                    lo = np.int32(v & 0xF) | np.int32(((qh >> np.uint32(j)) & np.uint32(1)) << 4)
                    hi = (np.int32(v >> 4)
                          | np.int32(((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4))
                    o[b * 32 + j] = d * F32(lo)
                    o[b * 32 + 16 + j] = d * F32(hi)
                o[K + b] = m
            else:
                for j in range(16):
                    v = wr[p + 8 + j]
                    lo = np.int32(v & 0xF) | np.int32(((qh >> np.uint32(j)) & np.uint32(1)) << 4)
                    hi = (np.int32(v >> 4)
                          | np.int32(((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4))
                    o[b * 32 + j] = d * F32(lo) + m
                    o[b * 32 + 16 + j] = d * F32(hi) + m


@njit(**_OPTS)
def deq_q8_0(w, out, f16, split, n16):
    R, nb = w.shape[0], w.shape[1] // 34
    for r in range(R):
        wr = w[r]
        o = out[r]
        for b in range(nb):
            p = b * 34
            d = _h(wr, p, f16)
            for j in range(2 * n16):
                o[b * 32 + j] = F32(np.int8(wr[p + 2 + j])) * d


@njit(inline="always", **_OPTS)
def _scale_min(wr, p, j):
    """Q4_K/Q5_K's 6-bit scale and min of sub-block ``j`` (``scales`` at ``wr[p:p + 12]``)."""
    if j < 4:
        return np.int32(wr[p + j] & 63), np.int32(wr[p + j + 4] & 63)
    sc = np.int32(wr[p + j + 4] & 0xF) | (np.int32(wr[p + j - 4] >> 6) << 4)
    mn = np.int32(wr[p + j + 4] >> 4) | (np.int32(wr[p + j] >> 6) << 4)
    return sc, mn


@njit(**_OPTS)
def deq_q4_k(w, out, f16, split, n16):
    R, nb = w.shape[0], w.shape[1] // 144
    for r in range(R):
        wr = w[r]
        o = out[r]
        for b in range(nb):
            p = b * 144
            d = _h(wr, p, f16)
            dmin = _h(wr, p + 2, f16)
            for c in range(4):
                sc0, mn0 = _scale_min(wr, p + 4, 2 * c)
                sc1, mn1 = _scale_min(wr, p + 4, 2 * c + 1)
                d0, m0 = d * F32(sc0), dmin * F32(mn0)
                d1, m1 = d * F32(sc1), dmin * F32(mn1)
                q = p + 16 + c * 32
                e = b * 256 + c * 64
                for j in range(32):
                    v = wr[q + j]
                    o[e + j] = d0 * F32(v & 0xF) - m0
                    o[e + 32 + j] = d1 * F32(v >> 4) - m1


@njit(**_OPTS)
def deq_q5_k(w, out, f16, split, n16):
    R, nb = w.shape[0], w.shape[1] // 176
    for r in range(R):
        wr = w[r]
        o = out[r]
        for b in range(nb):
            p = b * 176
            d = _h(wr, p, f16)
            dmin = _h(wr, p + 2, f16)
            for c in range(4):
                sc0, mn0 = _scale_min(wr, p + 4, 2 * c)
                sc1, mn1 = _scale_min(wr, p + 4, 2 * c + 1)
                d0, m0 = d * F32(sc0), dmin * F32(mn0)
                d1, m1 = d * F32(sc1), dmin * F32(mn1)
                q = p + 48 + c * 32
                e = b * 256 + c * 64
                for j in range(32):
                    v = wr[q + j]
                    h = wr[p + 16 + j]
                    lo = np.int32(v & 0xF) | (np.int32((h >> (2 * c)) & 1) << 4)
                    hi = np.int32(v >> 4) | (np.int32((h >> (2 * c + 1)) & 1) << 4)
                    o[e + j] = d0 * F32(lo) - m0
                    o[e + 32 + j] = d1 * F32(hi) - m1


@njit(**_OPTS)
def deq_q6_k(w, out, f16, split, n16):
    R, nb = w.shape[0], w.shape[1] // 210
    for r in range(R):
        wr = w[r]
        o = out[r]
        for b in range(nb):
            p = b * 210
            d = _h(wr, p + 208, f16)
            for h in range(2):
                ql = p + h * 64
                qh = p + 128 + h * 32
                sc = p + 192 + h * 8
                e = b * 256 + h * 128
                for g in range(2):  # elements 16g .. 16g + 15 of each 32: scale sc + 2t + g
                    d0 = d * F32(np.int8(wr[sc + g]))
                    d1 = d * F32(np.int8(wr[sc + 2 + g]))
                    d2 = d * F32(np.int8(wr[sc + 4 + g]))
                    d3 = d * F32(np.int8(wr[sc + 6 + g]))
                    for j in range(16 * g, 16 * g + 16):
                        a = np.int32(wr[ql + j])
                        c = np.int32(wr[ql + 32 + j])
                        hb = np.int32(wr[qh + j])
                        o[e + j] = d0 * F32(((a & 0xF) | ((hb & 3) << 4)) - 32)
                        o[e + 32 + j] = d1 * F32(((c & 0xF) | (((hb >> 2) & 3) << 4)) - 32)
                        o[e + 64 + j] = d2 * F32(((a >> 4) | (((hb >> 4) & 3) << 4)) - 32)
                        o[e + 96 + j] = d3 * F32(((c >> 4) | (((hb >> 6) & 3) << 4)) - 32)


@njit(**_OPTS)
def act_values(q, d, bs, out):
    """``out[n, k] = float32(q[n, k]) * d[n, k // bs]`` for int8 quants ``q`` ``(N, K)`` and
    float32 block scales ``d`` ``(N, K // bs)``: the values an activation row's blocks stand for
    (exact for f16 scales; one float32 rounding for Q8_K's float32 scale). ``out`` ``(N, >= K)``."""
    N, K = q.shape
    nb = K // bs
    for n in range(N):
        qr = q[n]
        o = out[n]
        for b in range(nb):
            s = d[n, b]
            for j in range(b * bs, b * bs + bs):
                o[j] = F32(qr[j]) * s


@njit(**_OPTS)
def q8_amax(xi, a, n32):
    """Q8_0/Q8_1, first pass: ``a[n, b] = amax`` (float32) of every 32-element block of the rows
    whose float32 bits are ``xi`` (int32 ``(N, K)``); NaN for a block holding NaN or +-inf. The
    max is taken on the bits of ``|x|`` (their integer order is the values' order, so it is the
    maximum of every form's max tree on finite blocks), which vectorizes. ``n32`` is 32 (see the
    module doc)."""
    N, K = xi.shape
    for n in range(N):
        xr = xi[n]
        for b in range(K // 32):
            m = np.int32(0)
            for jj in range(n32):
                j = b * 32 + jj
                m = max(m, np.int32(xr[j] & np.int32(0x7FFFFFFF)))
            if m >= np.int32(0x7F800000):
                a[n, b] = F32(np.nan)
            else:
                a[n, b] = np.int32(m).view(np.float32)


@njit(**_OPTS)
def q8_values(x, a, d, d16, out, s, want_s, form, n32):
    """Q8_0/Q8_1, second pass: the quants of every block with ``amax`` ``a`` (:func:`q8_amax`)
    and scale ``d = a / 127``, written as their values ``out[n, k] = q * d16`` (``d16`` the
    f16-rounded scale as float32); with ``want_s`` also ``s[n, b] = float(sum(q)) * d`` (Q8_1's
    sum, before its f16 rounding). ``form`` (:mod:`ggmlpy.quants.q8_arch`): 0 ``"ref"``, ggml-quants.c
    ``quantize_row_q8_0_ref``: ``q = roundf(x * (1 / d))``, half away from zero; 1 ``"x86"``,
    ggml-cpu/arch/x86/quants.c ``quantize_row_q8_0``: ``q = rint(x * (127 / amax))``, half to even;
    2 ``"arm"``, ggml-cpu/arch/arm/quants.c: ``q = rint(x * (1 / d))``. A quant that is not finite
    or beyond int8 (a block whose inverse scale overflows, ``amax`` below ~3.7e-37, whose ``d16``
    is 0) is what that form stores (0; -128; -1 or 0) and Q8_1's sum adds the form's int32
    conversion of it, wrapping, so even the signs of those zero values and sums are ggml's. A
    block holding NaN or +-inf (``a`` NaN) gives NaN values in every form. The quants stay integral
    float32 values (``+ 0`` turns a -0 into the +0 an integer quant gives), which keeps the loops
    vectorized."""
    N, K = x.shape
    for n in range(N):
        xr = x[n]
        o = out[n]
        for b in range(K // 32):
            dd = d[n, b]
            if form == 1:
                am = a[n, b]
                idv = F32(127) / am if am != F32(0) else F32(0)
            else:
                idv = F32(1) / dd if dd != F32(0) else F32(0)
            h = d16[n, b]
            if form == 0:
                for jj in range(n32):
                    j = b * 32 + jj
                    v = xr[j] * idv
                    t = np.trunc(v)
                    r = t + (np.copysign(F32(1), v) if abs(v - t) >= F32(0.5) else F32(0))
                    o[j] = ((r if abs(r) < F32(256) else F32(0)) + F32(0)) * h
            elif form == 1:
                for jj in range(n32):
                    j = b * 32 + jj
                    r = np.rint(xr[j] * idv)
                    o[j] = ((r if abs(r) < F32(256) else F32(-128)) + F32(0)) * h
            else:
                for jj in range(n32):
                    j = b * 32 + jj
                    r = np.rint(xr[j] * idv)
                    q = r if abs(r) < F32(256) else (F32(-1) if r > F32(0) else F32(0))
                    o[j] = (q + F32(0)) * h
            if want_s:
                if form == 0:
                    acc = np.int32(0)
                    for jj in range(n32):
                        j = b * 32 + jj
                        v = xr[j] * idv
                        t = np.trunc(v)
                        r = t + (np.copysign(F32(1), v) if abs(v - t) >= F32(0.5) else F32(0))
                        acc += np.int32(r) if abs(r) < F32(256) else np.int32(0)
                    s[n, b] = F32(acc) * dd
                    continue
                acc64 = np.int64(0)
                for jj in range(n32):
                    j = b * 32 + jj
                    r = np.rint(xr[j] * idv)
                    if abs(r) < F32(2147483648.0):
                        acc64 += np.int64(r)
                    elif form == 2 and r > F32(0):
                        acc64 += np.int64(2147483647)
                    elif form == 1 or r < F32(0):
                        acc64 -= np.int64(2147483648)
                acc = np.int32(((acc64 + 2147483648) & 0xFFFFFFFF) - 2147483648)
                s[n, b] = F32(acc) * dd


@njit(**_OPTS)
def q8_0_scales(xi, iv, h, form, n32):
    """Q8_0, first of two calls: per block of the rows whose float32 bits are ``xi`` (int32
    ``(N, K)``) the inverse scale of ``form`` into ``iv`` and the f16-rounded scale into ``h``
    (float32 ``(N, K // 32)`` each). ``amax`` as :func:`q8_amax` (on the bits of ``|x|``; NaN for
    a block holding NaN or +-inf, which then gets NaN in both), ``d = amax / 127`` rounded to f16
    on its float32 bits (round to nearest even: ``+ 0xFFF + lsb`` and the low 13 bits cleared for
    f16 normals, ``rint(d * 2**24) * 2**-24`` below 2**-14: the values of NumPy's
    ``astype(float16)``), ``iv`` = ``127 / amax`` (``form`` 1, ``"x86"``) or ``1 / d`` (0 and 2),
    0 where that divisor is 0. The scale loops are branch-free (selects) and vectorize. Returns
    False when a block's ``d`` is beyond f16 (``d >= 65520``: the caller then takes the exact
    product), else True. ``n32`` is 32 (see the module doc)."""
    N, K = xi.shape
    nb = K // 32
    ai = np.empty(nb, np.int32)
    af = ai.view(np.float32)
    di = np.empty(nb, np.int32)
    df = di.view(np.float32)
    big = np.int32(0x7F800000)
    for n in range(N):
        xir = xi[n]
        hr = h[n]
        hi = hr.view(np.int32)
        ivr = iv[n]
        for b in range(nb):
            m = np.int32(0)
            for jj in range(n32):
                j = b * 32 + jj
                m = max(m, np.int32(xir[j] & np.int32(0x7FFFFFFF)))
            ai[b] = m if m < big else np.int32(0x7FC00000)  # NaN or +-inf in the block: NaN
        over = False
        for b in range(nb):
            df[b] = af[b] / F32(127)
        for b in range(nb):
            u = di[b]
            over |= (u >= np.int32(0x477FF000)) & (u < big)  # rounds to f16 inf
            hi[b] = (u + np.int32(0xFFF) + ((u >> 13) & np.int32(1))) & np.int32(-8192)
        if over:
            return False
        for b in range(nb):
            dd = df[b]
            sub = F32(np.rint(dd * F32(16777216.0))) * F32(5.9604644775390625e-08)
            hr[b] = sub if di[b] < np.int32(0x38800000) else hr[b]  # an f16 subnormal (or 0)
            if form == 1:
                am = af[b]
                ivr[b] = F32(127) / am if am != F32(0) else F32(0)
            else:
                ivr[b] = F32(1) / dd if dd != F32(0) else F32(0)
    return True


@njit(**_OPTS)
def q8_0_values_ref(x, iv, h, out, n32):
    """Q8_0, second call, ``"ref"`` rounding (:func:`q8_values` form 0): the quants of every
    block (inverse scale ``iv``, f16 scale ``h`` from :func:`q8_0_scales`), ``roundf`` (half away
    from zero), written as their values ``out[n, k] = q * h`` (NaN scales give NaN values).
    ``x`` float32 ``(N, K)``, ``out`` float32 ``(N, >= K)``. One kernel per form: with the three
    forms' loops in one function LLVM leaves them scalar (about 3x slower)."""
    N, K = x.shape
    for n in range(N):
        xr = x[n]
        o = out[n]
        ivr = iv[n]
        hr = h[n]
        for b in range(K // 32):
            idv = ivr[b]
            hh = hr[b]
            for jj in range(n32):
                j = b * 32 + jj
                v = xr[j] * idv
                t = np.trunc(v)
                r = t + (np.copysign(F32(1), v) if abs(v - t) >= F32(0.5) else F32(0))
                o[j] = ((r if abs(r) < F32(256) else F32(0)) + F32(0)) * hh


@njit(**_OPTS)
def q8_0_values_x86(x, iv, h, out, n32):
    """:func:`q8_0_values_ref` with ggml-cpu's x86 rounding (:func:`q8_values` form 1):
    ``rint`` (half to even), a quant beyond int8 stored as -128."""
    N, K = x.shape
    for n in range(N):
        xr = x[n]
        o = out[n]
        ivr = iv[n]
        hr = h[n]
        for b in range(K // 32):
            idv = ivr[b]
            hh = hr[b]
            base = b * 32
            for j in range(n32):
                r = np.rint(xr[base + j] * idv)
                o[base + j] = ((r if abs(r) < F32(256) else F32(-128)) + F32(0)) * hh


@njit(**_OPTS)
def q8_0_values_arm(x, iv, h, out, n32):
    """:func:`q8_0_values_ref` with ggml-cpu's aarch64 rounding (:func:`q8_values` form 2):
    ``rint`` (half to even), a quant beyond int8 stored as its int32 conversion's low byte."""
    N, K = x.shape
    for n in range(N):
        xr = x[n]
        o = out[n]
        ivr = iv[n]
        hr = h[n]
        for b in range(K // 32):
            idv = ivr[b]
            hh = hr[b]
            for jj in range(n32):
                j = b * 32 + jj
                r = np.rint(xr[j] * idv)
                q = r if abs(r) < F32(256) else (F32(-1) if r > F32(0) else F32(0))
                o[j] = (q + F32(0)) * hh


@njit(**_OPTS)
def q8k_values(x, xi, out, n32):
    """Q8_K in one pass per 256-element block: ``max`` the first element of largest magnitude,
    ``iscale = -127 / max``, ``q = min(127, nearest_int(iscale * x))`` (the 1.5 * 2**23 trick),
    ``d = 1 / iscale`` (ggml-quants.c ``quantize_row_q8_K_ref``), written as ``out = q * d``;
    a block of zeros gives zeros, one holding NaN or +-inf gives NaN. ``xi``: ``x``'s bits as
    int32; ``n32`` is 32 (see the module doc)."""
    N, K = x.shape
    for n in range(N):
        xr = x[n]
        ur = xi[n]
        o = out[n]
        for b in range(K // 256):
            p = b * 256
            m = np.int32(0)
            for c in range(8):
                for j in range(p + 32 * c, p + 32 * c + n32):
                    m = max(m, np.int32(ur[j] & np.int32(0x7FFFFFFF)))
            if m >= np.int32(0x7F800000) or m == np.int32(0):
                fill = F32(np.nan) if m != np.int32(0) else F32(0)
                for j in range(p, p + 256):
                    o[j] = fill
                continue
            i = p
            while np.int32(ur[i] & np.int32(0x7FFFFFFF)) != m:
                i += 1
            iscale = F32(-127) / xr[i]
            dd = F32(1) / iscale
            if abs(iscale) < F32(np.inf):
                # |iscale * x| <= 127: (v + 1.5 * 2**23) - 1.5 * 2**23 is the trick's integer
                for c in range(8):
                    for j in range(p + 32 * c, p + 32 * c + n32):
                        f = (iscale * xr[j] + F32(12582912.0)) - F32(12582912.0)
                        o[j] = (f if f < F32(127) else F32(127)) * dd
                continue
            for c in range(8):
                for j in range(p + 32 * c, p + 32 * c + n32):
                    f = iscale * xr[j] + F32(12582912.0)
                    q = (np.float32(f).view(np.int32) & 0x007FFFFF) - 0x00400000
                    # C's int -> int8_t keeps the low byte (a 1 / iscale overflow gives -2**22)
                    o[j] = F32(np.int8(q if q < 127 else 127)) * dd


#: the dequantizer of each block type, by ggml type name
DEQUANT = {"q4_0": deq_q4_0, "q4_1": deq_q4_1, "q5_0": deq_q5_0, "q5_1": deq_q5_1,
           "q8_0": deq_q8_0, "q4_K": deq_q4_k, "q5_K": deq_q5_k, "q6_K": deq_q6_k}
