"""The Numba kernels behind :mod:`ggmlpy.backends.cpu.qmatmul` (imported by it on first use only;
importing this module imports Numba). Module-level functions so that Numba's on-disk cache
(``cache=True``) finds them again in a later process. Shapes and layouts are checked by the
caller, not here.

Every block kernel computes ``out[n, m]`` for the weight rows ``m0 <= m < m1`` and every
activation row ``n`` with exactly the float32 operations of :func:`ggmlpy.quants.vec_dot.vec_dot`
in its order (no ``fastmath``: no reassociation, no fused multiply-add), so its results are
bit-identical to the referee's and do not depend on how the rows are split over threads. The
integer block sums are exact in any order, which is what lets LLVM vectorize them.

Arguments of the block kernels: ``w`` uint8 ``(M, row_bytes)`` the weight's rows as they lie;
``yq`` int8 ``(N, K)`` the activation quants; ``yd`` float32 ``(N, nb)`` their scales; ``yx``
float32 ``(N, nb)`` Q8_1's ``s`` or int32 ``(N, nb * 16)`` Q8_K's ``bsums`` (unused otherwise);
``out`` float32 ``(N, M)``; ``dx`` float32 ``(nb,)`` and ``acc`` scratch owned by the caller.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ggmlpy.backends.cpu.qmatmul_ir import (
    acc_h16,
    dot4_q4,
    dot4_q5,
    dot4_q8,
    dot_q4,
    dot_q5,
    dot_q8,
    kblock_q4,
    kblock_q5,
    kblock_q6,
)

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)
F32 = np.float32
_SUB = F32(5.9604645e-08)  # 2**-24: an f16 subnormal's unit


@njit(inline="always", **_OPTS)
def f16(lo, hi):
    """Little-endian f16 bytes -> float32 (exact, subnormals, inf and NaN included)."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = F32(m) * _SUB
    elif e == 31:
        v = np.int32(0x7F800000 | (m << 13)).view(np.float32)
    else:
        v = np.int32(((e + 112) << 23) | (m << 13)).view(np.float32)
    return -v if h & 0x8000 else v


@njit(inline="always", **_OPTS)
def _u32(wr, o):
    return (np.uint32(wr[o]) | (np.uint32(wr[o + 1]) << np.uint32(8))
            | (np.uint32(wr[o + 2]) << np.uint32(16)) | (np.uint32(wr[o + 3]) << np.uint32(24)))


@njit(inline="always", **_OPTS)
def _isums(wr, yr, nb, bsz, kind, isum):
    """The int32 sums of every block of weight row ``wr`` with activation row ``yr``."""
    nb4 = nb - nb % 4
    if kind == 4:
        for b in range(0, nb4, 4):
            dot4_q8(wr, b * bsz, bsz, yr, b * 32, 2, 0, 0, isum, b)
        for b in range(nb4, nb):
            isum[b] = dot_q8(wr, b * bsz + 2, yr, b * 32)
    elif kind <= 1:
        qo = 2 if kind == 0 else 4
        sub = 8 if kind == 0 else 0
        for b in range(0, nb4, 4):
            dot4_q4(wr, b * bsz, bsz, yr, b * 32, qo, 0, sub, isum, b)
        for b in range(nb4, nb):
            isum[b] = dot_q4(wr, b * bsz + qo, sub, yr, b * 32)
    else:
        qhs = 2 if kind == 2 else 4
        sub = 16 if kind == 2 else 0
        for b in range(0, nb4, 4):
            dot4_q5(wr, b * bsz, bsz, yr, b * 32, qhs + 4, qhs, sub, isum, b)
        for b in range(nb4, nb):
            isum[b] = dot_q5(wr, b * bsz + qhs + 4, _u32(wr, b * bsz + qhs), sub, yr, b * 32)


@njit(**_OPTS)
def legacy(w, yq, yd, yx, out, m0, m1, dx, mx, kind, tbl):
    """Q4_0 (kind 0), Q4_1 (1), Q5_0 (2), Q5_1 (3), Q8_0 (4) rows against Q8_0/Q8_1: the block
    sums four at a time (:mod:`ggmlpy.backends.cpu.qmatmul_ir`), then the float32 terms in block
    order. ``tbl``: float32 ``(65536,)``, the value of every f16 bit pattern (ggml's
    ``ggml_table_f32_f16``)."""
    N = yq.shape[0]
    nb = yq.shape[1] // 32
    bsz = (18, 20, 22, 24, 34)[kind]
    isum = np.empty(nb + 4, np.int32)
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            o = b * bsz
            dx[b] = tbl[np.int32(wr[o]) | (np.int32(wr[o + 1]) << 8)]
        if kind == 1 or kind == 3:
            for b in range(nb):
                o = b * bsz
                mx[b] = tbl[np.int32(wr[o + 2]) | (np.int32(wr[o + 3]) << 8)]
        for n in range(N):
            _isums(wr, yq[n], nb, bsz, kind, isum)
            sumf = F32(0)
            if kind == 0:
                for b in range(nb):
                    sumf += (F32(isum[b]) * dx[b]) * yd[n, b]
            elif kind == 2:
                for b in range(nb):
                    sumf += (dx[b] * yd[n, b]) * F32(isum[b])
            elif kind == 4:
                for b in range(nb):
                    sumf += F32(isum[b]) * (dx[b] * yd[n, b])
            else:
                for b in range(nb):
                    sumf += (dx[b] * yd[n, b]) * F32(isum[b]) + mx[b] * yx[n, b]
            out[n, m] = sumf


@njit(inline="always", **_OPTS)
def _k4_scales(wr, o, sc, mn):
    """Q4_K/Q5_K's eight 6-bit scales and mins of the super-block at byte ``o`` (``scales`` at
    ``o + 4``; ``get_scale_min_k4`` in ggml-quants.c)."""
    for j in range(4):
        sc[j] = np.int32(wr[o + 4 + j]) & 63
        mn[j] = np.int32(wr[o + 8 + j]) & 63
    for j in range(4, 8):
        sc[j] = (np.int32(wr[o + 8 + j]) & 15) | ((np.int32(wr[o + j]) >> 6) << 4)
        mn[j] = (np.int32(wr[o + 8 + j]) >> 4) | ((np.int32(wr[o + 4 + j]) >> 6) << 4)


@njit(**_OPTS)
def kquant(w, yq, yd, yx, out, m0, m1, dx, kind):
    """Q4_K (kind 0, 144-byte super-blocks), Q5_K (1, 176) and Q6_K (2, 210) against Q8_K."""
    N = yq.shape[0]
    nb = yq.shape[1] // 256
    bsz = (144, 176, 210)[kind]
    dmin = np.empty(nb, np.float32)
    sc = np.empty((nb, 16), np.int32)
    mn = np.empty((nb, 8), np.int32)
    aux = np.empty(8, np.int32)
    sums = np.empty(8, np.float32)
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            o = b * bsz
            if kind == 2:
                dx[b] = f16(wr[o + 208], wr[o + 209])
                for j in range(16):
                    sc[b, j] = np.int32(np.int8(wr[o + 192 + j]))
            else:
                dx[b] = f16(wr[o], wr[o + 1])
                dmin[b] = f16(wr[o + 2], wr[o + 3])
                _k4_scales(wr, o, sc[b], mn[b])
        for n in range(N):
            yr = yq[n]
            sumf = F32(0)
            for l in range(8):
                sums[l] = F32(0)
            for b in range(nb):
                o = b * bsz
                p = b * 256
                if kind == 2:
                    kblock_q6(wr, o, yr, p, sc, b * 16, aux)
                else:
                    if kind == 1:
                        kblock_q5(wr, o, yr, p, sc, b * 16, aux)
                    else:
                        kblock_q4(wr, o, yr, p, sc, b * 16, aux)
                    sumi = np.int32(0)
                    for j in range(16):
                        sumi += yx[n, b * 16 + j] * mn[b, j >> 1]
                d = dx[b] * yd[n, b]
                for l in range(8):
                    sums[l] += d * F32(aux[l])
                if kind != 2:
                    sumf -= (dmin[b] * yd[n, b]) * F32(sumi)
            for l in range(8):
                sumf += sums[l]
            out[n, m] = sumf


@njit(inline="always", **_OPTS)
def _f16v(h):
    """f16 bits (int32 0..65535) -> float32 without branches (vectorizes): exponent rebias,
    inf/NaN widened, subnormals renormalized through one float subtraction (exact)."""
    o = (h & 0x7FFF) << 13
    e = o & 0x0F800000
    o += (127 - 15) << 23
    o = o + ((128 - 16) << 23) if e == 0x0F800000 else o
    sub = np.int32(o + (1 << 23)).view(np.float32) - np.int32(113 << 23).view(np.float32)
    v = sub if e == 0 else np.int32(o).view(np.float32)
    return np.int32(np.float32(v).view(np.int32) | ((h & 0x8000) << 16)).view(np.float32)


@njit(**_OPTS)
def half_dot(w, y, out, m0, m1, bf):
    """F16 (``bf`` False) or BF16 (True) weight rows (uint16 bits ``(M, K)``) against activations
    rounded to that type, held as float32 ``(N, K)``: float32 products summed in 16 float64
    lanes (:func:`ggmlpy.backends.cpu.qmatmul_ir.acc_h16`, element ``k`` in lane ``k mod 16``
    for ``k < K - K mod 16``), the lanes then added in order, then the tail elements."""
    N, K = y.shape
    K16 = K - K % 16
    acc = np.empty(16, np.float64)
    for m in range(m0, m1):
        wr = w[m]
        for n in range(N):
            yr = y[n]
            for j in range(16):
                acc[j] = 0.0
            for k in range(0, K16, 16):
                acc_h16(wr, k, yr, k, bf, acc)
            s = 0.0
            for j in range(16):
                s += acc[j]
            for k in range(K16, K):
                h = np.int32(wr[k])
                v = np.int32(h << 16).view(np.float32) if bf else _f16v(h)
                s += np.float64(v * yr[k])
            out[n, m] = F32(s)


@njit(**_OPTS)
def quant_q8(x, yq, yd, ys, kind):
    """Activation rows float32 ``(N, K)`` -> Q8_0 (``kind`` 0) / Q8_1 (1) quants ``yq`` int8
    ``(N, K)``, float32 scales ``yd`` ``(N, K/32)`` and (Q8_1) ``ys = sum(q) * d``, as
    :func:`ggmlpy.quants.q8.quantize_row_q8_0`/``_q8_1`` compute them before the scales' f16
    rounding (the caller rounds them; NaN for a block with non-finite input)."""
    N, K = x.shape
    for n in range(N):
        for b in range(K // 32):
            p = b * 32
            amax = F32(0)
            bad = False
            for j in range(32):
                v = abs(x[n, p + j])
                amax = v if v > amax else amax
                bad = bad or not (v < F32(np.inf))
            d = amax / F32(127)
            idv = F32(1) / d if d != F32(0) else F32(0)
            s = np.int32(0)
            for j in range(32):
                v = x[n, p + j] * idv
                t = np.trunc(v)
                r = t
                if abs(v - t) >= F32(0.5):
                    r = t + (F32(1) if v > F32(0) else F32(-1))
                q = np.int8(np.int32(r)) if abs(r) < F32(256) else np.int8(0)
                q = np.int8(0) if bad else q
                yq[n, p + j] = q
                s += np.int32(q)
            yd[n, b] = F32(np.nan) if bad else d
            if kind == 1:
                ys[n, b] = F32(np.nan) if bad else F32(s) * d


@njit(**_OPTS)
def quant_q8_k(x, yq, yd, bs):
    """Activation rows float32 ``(N, K)`` -> Q8_K quants, float32 ``d`` and int32 ``bsums``
    ``(N, K/16)``, as :func:`ggmlpy.quants.q8.quantize_row_q8_K` computes them."""
    N, K = x.shape
    for n in range(N):
        for b in range(K // 256):
            p = b * 256
            amax = F32(0)
            mx = F32(0)
            bad = False
            for j in range(256):
                v = x[n, p + j]
                av = abs(v)
                if av > amax:
                    amax = av
                    mx = v
                bad = bad or not (av < F32(np.inf))
            if amax == F32(0) or bad:
                for j in range(256):
                    yq[n, p + j] = 0
                for j in range(16):
                    bs[n, b * 16 + j] = 0
                yd[n, b] = F32(np.nan) if bad else F32(0)
                continue
            iscale = F32(-127) / mx
            for j in range(256):
                f = iscale * x[n, p + j] + F32(12582912.0)
                i = (np.float32(f).view(np.int32) & 0x007FFFFF) - 0x00400000
                yq[n, p + j] = np.int8(i if i < 127 else 127)
            for j in range(16):
                s = np.int32(0)
                for l in range(16):
                    s += np.int32(yq[n, p + 16 * j + l])
                bs[n, b * 16 + j] = s
            yd[n, b] = F32(1) / iscale
