"""The Numba kernels behind :mod:`ggmlpy.backends.cpu_jit` (imported by it on first use only;
importing this module imports Numba). Module-level functions, so that Numba's on-disk cache
(``cache=True``) finds them again in a later process. See :mod:`ggmlpy.backends.cpu_jit` for the
formulas and their accuracy; shapes and layouts are checked there, not here.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# no 'nnan'/'ninf': NaN and inf must propagate as in ggml; 'contract' allows FMAs, 'reassoc'
# lets LLVM vectorize the reductions
_FASTMATH = {"contract", "arcp", "nsz", "reassoc"}
_OPTS = dict(fastmath=_FASTMATH, cache=True, nogil=True, error_model="numpy")

LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453
c2, c3, c4, c5, c6, c7, c8, c9 = (1.0 / math.factorial(i) for i in range(2, 10))


@njit(inline="always", **_OPTS)
def exp_nonpos(y):  # exp(y) for y <= 0 (float64); NaN stays NaN, y < -104 -> ~1e-45
    y = -104.0 if y < -104.0 else y
    k = math.floor(y * LOG2E + 0.5)
    r = y - k * LN2                  # |r| <= ln2 / 2
    p = c9
    p = p * r + c8
    p = p * r + c7
    p = p * r + c6
    p = p * r + c5
    p = p * r + c4
    p = p * r + c3
    p = p * r + c2
    p = p * r + 1.0
    p = p * r + 1.0
    return p * np.int64((np.int64(k) + 1023) << 52).view(np.float64)  # * 2**k

P = 0.3275911 * math.sqrt(0.5)
F32_TINY = float(np.finfo(np.float32).tiny)


@njit(inline="always", **_OPTS)
def gelu1(v):
    a = abs(v)
    a = 30.0 if a > 30.0 else a              # NaN passes through
    t = 1.0 / (1.0 + P * a)
    q = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (
        -1.453152027 + t * 1.061405429))))
    c = 0.5 * a * q * exp_nonpos(-0.5 * a * a)
    r = (0.0 if v < 0.0 else v) - c          # NaN passes through
    return 0.0 if abs(r) < F32_TINY else r   # no float32 subnormals (they slow BLAS 10x)


@njit(**_OPTS)
def gelu_body(x, out):
    for i in range(x.size):
        out[i] = np.float32(gelu1(np.float64(x[i])))


@njit(**_OPTS)
def gelu_inplace_body(x):  # one array: LLVM vectorizes without a runtime overlap check
    for i in range(x.size):
        x[i] = np.float32(gelu1(np.float64(x[i])))


@njit(inline="always", **{**_OPTS, "fastmath": _FASTMATH | {"nnan"}})
def row_max(v, n):  # vectorized max; a NaN in the row reaches the output through the sum
    mx = -np.inf
    for j in range(n):
        mx = max(mx, v[j])
    return mx


@njit(inline="always", **_OPTS)
def softmax_row(orow, X0, tmp):  # orow holds x*scale+mask; softmax in place (tmp: X0 float64)
    mxd = np.float64(row_max(orow, X0))
    s = 0.0
    for j in range(X0):
        e = exp_nonpos(np.float64(orow[j]) - mxd)
        tmp[j] = e
        s += e
    inv = 1.0 / s
    for j in range(X0):
        e = tmp[j] * inv
        orow[j] = np.float32(0.0 if e < F32_TINY else e)  # no float32 subnormals


@njit(inline="always", **_OPTS)
def softmax_rows(x, m, has_mask, scale, out):
    X3, X2, X1, X0 = x.shape
    M3, M2 = m.shape[0], m.shape[1]
    tmp = np.empty(X0, np.float64)
    for r in range(X3 * X2 * X1):
        i3 = r // (X2 * X1)
        i2 = (r // X1) % X2
        i1 = r % X1
        xr = x[i3, i2, i1]
        orow = out[i3, i2, i1]
        if has_mask:
            mr = m[i3 % M3, i2 % M2, i1]
            for j in range(X0):
                orow[j] = xr[j] * scale + mr[j]
        else:
            for j in range(X0):
                orow[j] = xr[j] * scale
        softmax_row(orow, X0, tmp)


@njit(**_OPTS)
def softmax_body(x, m, has_mask, scale, out):
    softmax_rows(x, m, has_mask, scale, out)


@njit(**_OPTS)
def softmax_inplace_body(x, m, has_mask, scale):
    # inlined with one name for both arrays, so LLVM knows they are the same memory
    softmax_rows(x, m, has_mask, scale, x)


@njit(inline="always", **_OPTS)
def mean_rstd(xr, n, eps):
    s = 0.0
    for j in range(n):
        s += xr[j]
    mean = s / n
    s2 = 0.0
    for j in range(n):
        d = xr[j] - mean
        s2 += d * d
    return mean, 1.0 / math.sqrt(s2 / n + eps)


@njit(**_OPTS)
def norm_body(x, eps, out):
    R, n = x.shape
    for r in range(R):
        xr = x[r]
        orow = out[r]
        mean, rstd = mean_rstd(xr, n, eps)
        for j in range(n):
            orow[j] = np.float32((xr[j] - mean) * rstd)


@njit(**_OPTS)
def norm_inplace_body(x, eps):
    R, n = x.shape
    for r in range(R):
        xr = x[r]
        mean, rstd = mean_rstd(xr, n, eps)
        for j in range(n):
            xr[j] = np.float32((xr[j] - mean) * rstd)


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
