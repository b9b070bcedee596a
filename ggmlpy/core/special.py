"""Special functions in pure NumPy: ``erf``, ``erfc`` and the exact-erf GELU.

NumPy has no erf; ggml's GELU_ERF needs one accurate to float32. Used by the NumPy kernels
(:mod:`ggmlpy.backends.kernels`) and the plain NumPy MiniLM reference (:mod:`ggmlpy.models.reference`).
CuPy code uses ``cupyx.scipy.special.erf`` instead.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["GELU_ERF_F32_BOUND", "erf", "erfc", "gelu_erf", "gelu_erf_f32"]

# W. J. Cody's rational Chebyshev approximations ("Rational Chebyshev approximations for the error
# function", Math. Comp. 23 (1969) 631-637; the CALERF routine). _A/_B: erf on |x| <= 0.5.
# _C/_D: erfc(y) = exp(-y*y) * C(y)/D(y), fitted on [0.5, 4]; measured against math.erfc it stays
# within 5e-12 absolute on [0, 0.5] and 2e-16 absolute beyond 4 (where exp(-y*y) < 1.2e-7), so
# one rational serves every y >= 0.
_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
      3.20937758913846947e03, 1.85777706184603153e-1)
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
      2.84423683343917062e03)
_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
      2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
      2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
      1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
      3.43936767414372164e03, 1.23033935480374942e03)
_ERFC_CLIP = 27.5  # exp(-27.5**2) underflows to 0: erfc(y) is 0 (and 2 at -y) beyond, exactly
_CHUNK = 1 << 15   # elements per step of the element-wise loops (keeps temporaries in cache)


def _erfc_nonneg(y: np.ndarray) -> np.ndarray:
    """erfc(y) for float64 ``y >= 0`` (a new array; in-place Horner to limit temporaries)."""
    y = np.minimum(y, _ERFC_CLIP)
    num = y * _C[8]
    den = y.copy()
    for i in range(7):
        num += _C[i]
        num *= y
        den += _D[i]
        den *= y
    num += _C[7]
    den += _D[7]
    num /= den
    num *= np.exp(-(y * y))
    return num


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function ``1 - erf(x)``, element-wise, in pure NumPy.

    Float64 evaluation of Cody's rational approximation: absolute error below 5e-12 everywhere
    (below 1e-15 for ``|x| >= 0.5``) and relative error below 5e-12 for ``x < 6``, far inside
    float32 rounding. ``erfc(-x) = 2 - erfc(x)``; ``erfc(+inf) = 0``, ``erfc(-inf) = 2``; NaN
    propagates.

    Args:
        x: array-like of any shape and real dtype.

    Returns:
        float64 ``np.ndarray`` of the same shape.
    """
    x = np.asarray(x, dtype=np.float64)
    r = _erfc_nonneg(np.abs(x))
    return np.where(x < 0, 2.0 - r, r)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, element-wise, in pure NumPy (mirrors C ``erf``).

    Float64 evaluation of Cody's rational approximations: an odd rational for ``|x| <= 0.5``
    (relative error ~1e-16, so tiny arguments keep full precision) and ``1 - erfc(|x|)`` beyond
    (absolute error below 1e-15). ``erf(+-inf) = +-1``; NaN propagates.

    Args:
        x: array-like of any shape and real dtype.

    Returns:
        float64 ``np.ndarray`` of the same shape.
    """
    x = np.asarray(x, dtype=np.float64)
    xs = np.clip(x, -0.5, 0.5)
    q = xs * xs
    num = _A[4] * q
    den = q.copy()
    for i in range(3):
        num = (num + _A[i]) * q
        den = (den + _B[i]) * q
    small = xs * (num + _A[3]) / (den + _B[3])
    large = np.copysign(1.0 - _erfc_nonneg(np.abs(x)), x)
    return np.where(np.abs(x) <= 0.5, small, large)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """Exact GELU ``0.5 * x * (1 + erf(x / sqrt(2)))`` (mirrors ``ggml_gelu_erf``).

    Computed as ``0.5 * x * erfc(-x / sqrt(2))``, which has no cancellation for negative ``x``, in
    float64 chunks of 32768 elements, rounded once to float32: within 0.51 float32 ulp of the
    exact value over [-20, 20] (measured against ``math.erfc``). As in C, ``gelu_erf(-inf)`` is
    NaN (``-inf * 0``).

    Args:
        x: float32 array of any shape.

    Returns:
        float32 array of the same shape (a new array).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    xf, of = x.reshape(-1), out.reshape(-1)
    for s in range(0, xf.size, _CHUNK):
        xc = xf[s:s + _CHUNK].astype(np.float64)
        z = xc * -np.sqrt(0.5)
        r = _erfc_nonneg(np.abs(z))
        phi2 = np.where(z < 0, 2.0 - r, r)  # 1 + erf(x / sqrt(2))
        phi2 *= xc
        phi2 *= 0.5
        of[s:s + _CHUNK] = phi2
    return out


# ---------------------------------------------------------------------------------------------
# float32 GELU (fast path)

# Abramowitz & Stegun 7.1.26 (Hastings): erfc(z) ~= t*(a1 + t*(a2 + t*(a3 + t*(a4 + t*a5))))
# * exp(-z*z), t = 1/(1 + p*z), z >= 0, absolute error <= 1.5e-7. Here z = |x|/sqrt(2), so the
# constants below fold the 1/sqrt(2) into p and the exponent.
_AS_P = np.float32(0.3275911 * math.sqrt(0.5))
_AS_A = tuple(np.float32(c) for c in (0.254829592, -0.284496736, 1.421413741,
                                      -1.453152027, 1.061405429))
_GELU32_CLIP = np.float32(30.0)  # erfc(30/sqrt 2) = 0 in float32: the correction term vanishes
#: Error bound of :func:`gelu_erf_f32`: ``|gelu_erf_f32(x) - gelu(x)| <= B * max(1, |x|)``.
GELU_ERF_F32_BOUND = 2.0e-7


def gelu_erf_f32(x: np.ndarray, out: np.ndarray | None = None,
                 chunk: int = _CHUNK) -> np.ndarray:
    """Float32 exact-erf GELU ``x * Phi(x)`` (fast path of ``ggml_gelu_erf``), branch free.

    Evaluates ``max(x, 0) - 0.5 * |x| * erfc(|x| / sqrt(2))`` entirely in float32 with the
    polynomial erfc of Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7 on erfc), in chunks
    of ``chunk`` elements so that the temporaries stay in cache (one read of ``x`` and one write
    of ``out`` per element from main memory). No cancellation for negative ``x``: the erfc term
    is computed directly, never as ``1 + erf``.

    Error bound (checked on a dense grid by the tests, against the float64 :func:`gelu_erf`):
    ``|gelu_erf_f32(x) - gelu(x)| <= GELU_ERF_F32_BOUND * max(1, |x|)`` with the bound 2e-7,
    for every finite float32 ``x``: ``0.5*|x|*1.5e-7`` from the erfc approximation plus the
    float32 rounding of the last steps (half an ulp of the result and a few ulps of the small
    correction term); measured maximum 1.56e-7 * max(1, |x|) (at x = 1.19). The float64
    :func:`gelu_erf` (0.51 ulp) stays the referee and the exact option.

    Special values: NaN propagates, ``+inf -> +inf``; ``-inf -> 0`` (the limit; ggml's C and the
    float64 path give NaN there). ``|x| > 30`` returns ``max(x, 0)`` exactly.

    Args:
        x: float32 array of any shape (other real dtypes are converted first).
        out: float32 C-contiguous array of ``x``'s shape to write into (may be ``x`` itself);
            None allocates one.
        chunk: elements per step (>= 1; 32768 by default = 128 KiB per float32 temporary).

    Returns:
        ``out`` (float32, shape of ``x``).

    Raises:
        ValueError: ``out`` has another shape, is not float32 or not C-contiguous; ``chunk < 1``.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"gelu_erf_f32: out must be a C-contiguous float32 array of shape "
                         f"{x.shape}, got {out.dtype} {out.shape}")
    if chunk < 1:
        raise ValueError(f"gelu_erf_f32: chunk must be >= 1, got {chunk}")
    xf, of = x.reshape(-1), out.reshape(-1)
    n = xf.size
    m = min(chunk, n)
    a_buf = np.empty(m, np.float32)
    t_buf = np.empty(m, np.float32)
    p_buf = np.empty(m, np.float32)
    a1, a2, a3, a4, a5 = _AS_A
    absolute, minimum, multiply, add = np.abs, np.minimum, np.multiply, np.add
    for s in range(0, n, m):
        xc, oc = xf[s:s + m], of[s:s + m]
        k = xc.size
        a, t, p = a_buf[:k], t_buf[:k], p_buf[:k]
        absolute(xc, out=a)
        minimum(a, _GELU32_CLIP, out=a)
        multiply(a, _AS_P, out=t)           # t = 1 / (1 + p z)
        add(t, 1.0, out=t)
        np.reciprocal(t, out=t)
        multiply(t, a5, out=p)              # Horner
        add(p, a4, out=p)
        multiply(p, t, out=p)
        add(p, a3, out=p)
        multiply(p, t, out=p)
        add(p, a2, out=p)
        multiply(p, t, out=p)
        add(p, a1, out=p)
        multiply(p, t, out=p)
        multiply(a, a, out=t)               # exp(-x^2 / 2)
        multiply(t, -0.5, out=t)
        np.exp(t, out=t)
        multiply(p, t, out=p)               # erfc(|x| / sqrt 2)
        multiply(p, a, out=p)
        multiply(p, 0.5, out=p)             # 0.5 |x| erfc
        np.maximum(xc, 0.0, out=oc)         # last read of xc: out may alias x
        np.subtract(oc, p, out=oc)
    return out
