"""The Numba kernel behind :mod:`ggmlpy.backends.cpu.soft_max_ggml` (imported by it on first
use only; importing this module imports Numba). A module-level function, so that Numba's on-disk
cache finds it again in a later process. No fast-math flags; each fused multiply-add of ggml's
``ggml_v_expf`` is one :func:`~ggmlpy.backends.cpu.fma_ir.fma32` (one rounding).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ggmlpy.backends.cpu.fma_ir import fma32

F32, F64 = np.float32, np.float64

# ggml_v_expf's constants, as its source writes them (hexadecimal float literals)
_R = F32(float.fromhex("0x1.8p23"))
_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
_C5 = F32(float.fromhex("0x1.0e4020p-7"))
_C4 = F32(float.fromhex("0x1.573e2ep-5"))
_C3 = F32(float.fromhex("0x1.555e66p-3"))
_C2 = F32(float.fromhex("0x1.fffdb6p-2"))
_C1 = F32(float.fromhex("0x1.ffffecp-1"))
#: float32's smallest normal number: probabilities below it are flushed to zero
_TINY = F32(np.finfo(np.float32).tiny)


@njit(cache=True, nogil=True, inline="always")
def v_expf(x):  # pragma: no cover - compiled
    """One lane of ggml's AVX-512 ``ggml_v_expf`` (vec.h): ``n = round(x/ln 2)`` by the
    ``1.5*2^23`` trick, ``b = x - n ln 2`` in two FMA steps, a degree-5 polynomial in ``b``
    (Estrin with ``u = b*b``), ``_mm512_scalef_ps(j, n)`` = ``j * 2^n`` rounded once (here:
    ``j * 2^n`` exact in float64, ``2^n`` built from its bits, then rounded to float32); ``|n|
    > 192``: 0 for ``n <= 0``, else inf. Branch-free, so that the loops over it vectorize."""
    z = fma32(x, _LOG2E, _R)
    n = z - _R
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(_C5, b, _C4), u, fma32(_C3, b, _C2)), u, fma32(_C1, b, F32(1.0)))
    big = abs(n) > F32(192.0)
    ni = np.int64(np.float32(0.0) if big else n)
    res = F32(F64(j) * _pow2(ni))
    alt = F32(0.0) if n <= F32(0.0) else F32(np.inf)
    return alt if big else res


@njit(cache=True, nogil=True, inline="always")
def _pow2(ni):  # pragma: no cover - compiled
    # 2.0**ni for -1022 <= ni <= 1023, from the float64 bits
    return np.int64((ni + 1023) << 52).view(np.float64)


@njit(cache=True, nogil=True, inline="always")
def _reduce16(v, o):  # pragma: no cover - compiled
    # _mm512_reduce_add_ps of v[o:o+16]: lanes (i, i+8), then (i, i+4), (i, i+2), (0, 1)
    t0 = (v[o + 0] + v[o + 8]) + (v[o + 4] + v[o + 12])
    t1 = (v[o + 1] + v[o + 9]) + (v[o + 5] + v[o + 13])
    t2 = (v[o + 2] + v[o + 10]) + (v[o + 6] + v[o + 14])
    t3 = (v[o + 3] + v[o + 11]) + (v[o + 7] + v[o + 15])
    return (t0 + t2) + (t1 + t3)


@njit(cache=True, nogil=True, error_model="numpy")
def soft_max(x, mask, has_mask, scale, out):  # pragma: no cover - compiled
    """ggml-cpu ``ggml_compute_forward_soft_max_f32`` without ALiBi and sinks, per row: ``w =
    x*scale (+ mask)`` in float32, ``max``, ``ggml_vec_soft_max_f32`` (AVX-512: 16 values at a
    time through :func:`v_expf`, each group's :func:`_reduce16` added to a float64 sum; the
    last ``n % 16`` through ``expf``, added one by one), then each value times
    ``(float)(1.0/sum)``, a result below float32's smallest normal flushed to zero (ggmlpy's
    softmax convention; ggml keeps it). ``x``, ``out`` float32 ``(X3, X2, X1, X0)``; ``mask`` float32 ``(M3,
    M2, M1, X0)`` (row ``mask[i3 % M3, i2 % M2, i1]``) when ``has_mask``."""
    X3, X2, X1, X0 = x.shape
    M3, M2 = mask.shape[0], mask.shape[1]
    w = np.empty(X0, F32)
    wi = w.view(np.int32)
    kb = np.empty(1, np.int32)
    kf = kb.view(F32)
    for i3 in range(X3):
        for i2 in range(X2):
            for i1 in range(X1):
                xr = x[i3, i2, i1]
                for i in range(X0):
                    w[i] = xr[i] * scale
                if has_mask:
                    mr = mask[i3 % M3, i2 % M2, i1]
                    for i in range(X0):
                        w[i] = w[i] + mr[i]
                # the maximum over order-preserving int32 keys of the float32 bits (an integer
                # max vectorizes; a float compare loop does not): the same value as ggml's
                kmax = np.int32(-2147483648)
                for i in range(X0):
                    bits = wi[i]
                    kmax = max(kmax, bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF)))
                kb[0] = kmax ^ ((kmax >> 31) & np.int32(0x7FFFFFFF))
                mx = kf[0]
                orow = out[i3, i2, i1]
                for i in range(X0):
                    orow[i] = v_expf(w[i] - mx)
                s = F64(0.0)
                i = 0
                while i + 15 < X0:
                    s += F64(_reduce16(orow, i))
                    i += 16
                while i < X0:
                    e = F32(np.exp(w[i] - mx))
                    orow[i] = e
                    s += F64(e)
                    i += 1
                inv = F32(1.0 / s)
                for i in range(X0):
                    v = orow[i] * inv
                    orow[i] = v if v >= _TINY else F32(0.0)
