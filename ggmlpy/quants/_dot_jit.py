"""The Numba kernels behind :mod:`ggmlpy.quants.dot_kernels` (imported by it on first use only;
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


@njit(**_OPTS)
def q4_0(w, yq, yd, yx, out, m0, m1, dx):
    N = yq.shape[0]
    nb = yq.shape[1] // 32
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            dx[b] = f16(wr[b * 18], wr[b * 18 + 1])
        for n in range(N):
            yr = yq[n]
            sumf = F32(0)
            for b in range(nb):
                o = b * 18 + 2
                p = b * 32
                s0 = np.int32(0)
                s1 = np.int32(0)
                for j in range(16):
                    q = np.int32(wr[o + j])
                    s0 += ((q & 15) - 8) * np.int32(yr[p + j])
                    s1 += ((q >> 4) - 8) * np.int32(yr[p + 16 + j])
                sumf += (F32(s0 + s1) * dx[b]) * yd[n, b]
            out[n, m] = sumf


@njit(**_OPTS)
def q4_1(w, yq, yd, yx, out, m0, m1, dx):
    N = yq.shape[0]
    nb = yq.shape[1] // 32
    mx = np.empty(nb, np.float32)
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            dx[b] = f16(wr[b * 20], wr[b * 20 + 1])
            mx[b] = f16(wr[b * 20 + 2], wr[b * 20 + 3])
        for n in range(N):
            yr = yq[n]
            sumf = F32(0)
            for b in range(nb):
                o = b * 20 + 4
                p = b * 32
                s0 = np.int32(0)
                s1 = np.int32(0)
                for j in range(16):
                    q = np.int32(wr[o + j])
                    s0 += (q & 15) * np.int32(yr[p + j])
                    s1 += (q >> 4) * np.int32(yr[p + 16 + j])
                sumf += (dx[b] * yd[n, b]) * F32(s0 + s1) + mx[b] * yx[n, b]
            out[n, m] = sumf


@njit(**_OPTS)
def q5_0(w, yq, yd, yx, out, m0, m1, dx):
    N = yq.shape[0]
    nb = yq.shape[1] // 32
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            dx[b] = f16(wr[b * 22], wr[b * 22 + 1])
        for n in range(N):
            yr = yq[n]
            sumf = F32(0)
            for b in range(nb):
                o = b * 22
                qh = (np.uint32(wr[o + 2]) | (np.uint32(wr[o + 3]) << 8)
                      | (np.uint32(wr[o + 4]) << 16) | (np.uint32(wr[o + 5]) << 24))
                p = b * 32
                s0 = np.int32(0)
                s1 = np.int32(0)
                for j in range(16):
                    q = np.int32(wr[o + 6 + j])
                    h0 = np.int32((qh >> np.uint32(j)) & np.uint32(1)) << 4
                    h1 = np.int32((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4
                    s0 += (((q & 15) | h0) - 16) * np.int32(yr[p + j])
                    s1 += (((q >> 4) | h1) - 16) * np.int32(yr[p + 16 + j])
                sumf += (dx[b] * yd[n, b]) * F32(s0 + s1)
            out[n, m] = sumf


@njit(**_OPTS)
def q5_1(w, yq, yd, yx, out, m0, m1, dx):
    N = yq.shape[0]
    nb = yq.shape[1] // 32
    mx = np.empty(nb, np.float32)
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            dx[b] = f16(wr[b * 24], wr[b * 24 + 1])
            mx[b] = f16(wr[b * 24 + 2], wr[b * 24 + 3])
        for n in range(N):
            yr = yq[n]
            sumf = F32(0)
            for b in range(nb):
                o = b * 24
                qh = (np.uint32(wr[o + 4]) | (np.uint32(wr[o + 5]) << 8)
                      | (np.uint32(wr[o + 6]) << 16) | (np.uint32(wr[o + 7]) << 24))
                p = b * 32
                s0 = np.int32(0)
                s1 = np.int32(0)
                for j in range(16):
                    q = np.int32(wr[o + 8 + j])
                    h0 = np.int32((qh >> np.uint32(j)) & np.uint32(1)) << 4
                    h1 = np.int32((qh >> np.uint32(j + 16)) & np.uint32(1)) << 4
                    s0 += ((q & 15) | h0) * np.int32(yr[p + j])
                    s1 += ((q >> 4) | h1) * np.int32(yr[p + 16 + j])
                sumf += (dx[b] * yd[n, b]) * F32(s0 + s1) + mx[b] * yx[n, b]
            out[n, m] = sumf


@njit(**_OPTS)
def q8_0(w, yq, yd, yx, out, m0, m1, dx):
    N = yq.shape[0]
    nb = yq.shape[1] // 32
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            dx[b] = f16(wr[b * 34], wr[b * 34 + 1])
        for n in range(N):
            yr = yq[n]
            sumf = F32(0)
            for b in range(nb):
                o = b * 34 + 2
                p = b * 32
                s = np.int32(0)
                for j in range(32):
                    s += np.int32(np.int8(wr[o + j])) * np.int32(yr[p + j])
                sumf += F32(s) * (dx[b] * yd[n, b])
            out[n, m] = sumf


@njit(inline="always", **_OPTS)
def _k4_scales(wr, o, sc, mn):
    """Q4_K/Q5_K's eight 6-bit scales and mins of the super-block at byte ``o + 4``."""
    for j in range(4):
        sc[j] = np.int32(wr[o + 4 + j]) & 63
        mn[j] = np.int32(wr[o + 8 + j]) & 63
    for j in range(4, 8):
        sc[j] = (np.int32(wr[o + 8 + j]) & 15) | ((np.int32(wr[o + j]) >> 6) << 4)
        mn[j] = (np.int32(wr[o + 8 + j]) >> 4) | ((np.int32(wr[o + 4 + j]) >> 6) << 4)


@njit(**_OPTS)
def qk_45(w, yq, yd, yx, out, m0, m1, dx, five):
    """Q4_K (``five`` False, 144-byte blocks) and Q5_K (True, 176) against Q8_K."""
    N = yq.shape[0]
    nb = yq.shape[1] // 256
    bsz = 176 if five else 144
    qo = 48 if five else 16
    dmin = np.empty(nb, np.float32)
    sc = np.empty((nb, 8), np.int32)
    mn = np.empty((nb, 8), np.int32)
    a = np.empty((nb, 256), np.int32)
    aux = np.empty(8, np.int32)
    sums = np.empty(8, np.float32)
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            o = b * bsz
            dx[b] = f16(wr[o], wr[o + 1])
            dmin[b] = f16(wr[o + 2], wr[o + 3])
            _k4_scales(wr, o, sc[b], mn[b])
            for c in range(4):
                for l in range(32):
                    q = np.int32(wr[o + qo + 32 * c + l])
                    a[b, 64 * c + l] = q & 15
                    a[b, 64 * c + 32 + l] = q >> 4
            if five:
                for c in range(4):
                    for l in range(32):
                        h = np.int32(wr[o + 16 + l])
                        a[b, 64 * c + l] |= ((h >> (2 * c)) & 1) << 4
                        a[b, 64 * c + 32 + l] |= ((h >> (2 * c + 1)) & 1) << 4
        for n in range(N):
            yr = yq[n]
            sumf = F32(0)
            for l in range(8):
                sums[l] = F32(0)
            for b in range(nb):
                p = b * 256
                for l in range(8):
                    aux[l] = 0
                for j in range(8):
                    s = sc[b, j]
                    for g in range(4):
                        e = 32 * j + 8 * g
                        for l in range(8):
                            aux[l] += s * (np.int32(yr[p + e + l]) * a[b, e + l])
                sumi = np.int32(0)
                for j in range(16):
                    sumi += yx[n, b * 16 + j] * mn[b, j >> 1]
                d = dx[b] * yd[n, b]
                for l in range(8):
                    sums[l] += d * F32(aux[l])
                sumf -= (dmin[b] * yd[n, b]) * F32(sumi)
            for l in range(8):
                sumf += sums[l]
            out[n, m] = sumf


@njit(**_OPTS)
def q6_k(w, yq, yd, yx, out, m0, m1, dx):
    N = yq.shape[0]
    nb = yq.shape[1] // 256
    sc = np.empty((nb, 16), np.int32)
    a = np.empty((nb, 256), np.int32)
    aux = np.empty(8, np.int32)
    sums = np.empty(8, np.float32)
    for m in range(m0, m1):
        wr = w[m]
        for b in range(nb):
            o = b * 210
            dx[b] = f16(wr[o + 208], wr[o + 209])
            for j in range(16):
                sc[b, j] = np.int32(np.int8(wr[o + 192 + j]))
            for h in range(2):
                ql = o + 64 * h
                qh = o + 128 + 32 * h
                e = 128 * h
                for l in range(32):
                    lo = np.int32(wr[ql + l])
                    lo2 = np.int32(wr[ql + 32 + l])
                    hh = np.int32(wr[qh + l])
                    a[b, e + l] = ((lo & 15) | ((hh & 3) << 4)) - 32
                    a[b, e + 32 + l] = ((lo2 & 15) | (((hh >> 2) & 3) << 4)) - 32
                    a[b, e + 64 + l] = ((lo >> 4) | (((hh >> 4) & 3) << 4)) - 32
                    a[b, e + 96 + l] = ((lo2 >> 4) | (((hh >> 6) & 3) << 4)) - 32
        for n in range(N):
            yr = yq[n]
            sumf = F32(0)
            for l in range(8):
                sums[l] = F32(0)
            for b in range(nb):
                p = b * 256
                for l in range(8):
                    aux[l] = 0
                for j in range(16):
                    s = sc[b, j]
                    for g in range(2):
                        e = 16 * j + 8 * g
                        for l in range(8):
                            aux[l] += s * (np.int32(yr[p + e + l]) * a[b, e + l])
                d = dx[b] * yd[n, b]
                for l in range(8):
                    sums[l] += d * F32(aux[l])
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


@njit(fastmath={"reassoc"}, **_OPTS)
def f16_dot(w, y, out, m0, m1):
    """F16 weight rows (uint16 bits ``(M, K)``) against f16-rounded activations held as float32
    ``(N, K)``: float32 products summed in float64 (reassociated: lanes)."""
    N, K = y.shape
    for m in range(m0, m1):
        wr = w[m]
        for n in range(N):
            yr = y[n]
            s = 0.0
            for k in range(K):
                s += np.float64(_f16v(np.int32(wr[k])) * yr[k])
            out[n, m] = F32(s)


@njit(fastmath={"reassoc"}, **_OPTS)
def bf16_dot(w, y, out, m0, m1):
    """BF16 weight rows (uint16 bits ``(M, K)``) against bf16-rounded activations as float32."""
    N, K = y.shape
    for m in range(m0, m1):
        wr = w[m]
        for n in range(N):
            yr = y[n]
            s = 0.0
            for k in range(K):
                s += np.float64(np.int32(np.int32(wr[k]) << 16).view(np.float32) * yr[k])
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
