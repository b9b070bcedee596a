"""Fewest-pass element-wise and row kernels (LayerNorm, masked softmax, bias/residual adds, GELU).

Standalone, array-module generic (``xp`` is ``numpy`` or ``cupy``) functions that write into a
caller-given ``out=`` and allocate at most one row-statistics vector per call, so a compiled
plan can bind them to fixed views once. They are the fast formulations of ggml's ``NORM``,
``SOFT_MAX`` (with mask and scale, no ALiBi), ``ADD`` and ``GELU_ERF`` kernels; the kernel table
(:mod:`ggmlpy.backends.kernels`) decides where they replace the reference kernels.

Shapes are NumPy shapes (ggml ``ne[::-1]``); rows are the last axis (ggml dim 0). All data is
float32; statistics are accumulated in float32 with NumPy's pairwise summation (relative error
about ``log2(n) * 6e-8``; ggml's CPU accumulates NORM in double: for MiniLM's rows of 384 the
difference is below 1e-6 relative, see the tests). Calls are synchronous on NumPy and launch on
the current stream on CuPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["add_bias_residual", "gelu_erf", "norm", "soft_max", "flush_small_to_zero", "F32_TINY"]

_F32 = np.float32
#: float32's smallest normal number (1.18e-38): non-negative results below it are flushed to zero
F32_TINY = np.finfo(np.float32).tiny
_ROW_BLOCK_BYTES = 1 << 18  # rows per block of the blocked two-op passes: 256 KiB (L2-sized)


def _check_out(name: str, x: Any, out: Any) -> None:
    if out.shape != x.shape or out.dtype != _F32:
        raise ValueError(f"{name}: out must be float32 of shape {x.shape}, got "
                         f"{out.dtype} {out.shape}")


def norm(xp: Any, x: Any, eps: float, out: Any) -> Any:
    """LayerNorm without affine (mirrors ``ggml_norm``): ``(x - mean) / sqrt(var + eps)`` per row.

    Three passes over the data (mean, centre into ``out``, sum of squares as a per-row dot
    product through ``einsum``, which NumPy hands to BLAS-like inner loops) and one in-place
    scale, instead of the reference kernel's float64 sums with temporaries.

    Args:
        xp: ``numpy`` or ``cupy``.
        x: float32 array ``[..., n]`` (ggml ``ne = [n, ...]``), any strides.
        eps: added to the variance (ggml's ``eps`` op parameter).
        out: float32 array of ``x``'s shape (may be ``x`` itself).

    Returns:
        ``out``.

    Raises:
        ValueError: ``out`` has another shape or dtype.
    """
    _check_out("norm", x, out)
    n = x.shape[-1]
    mean = x.sum(axis=-1, keepdims=True)
    mean *= _F32(1.0 / n)
    xp.subtract(x, mean, out=out)
    o2 = out.reshape(-1, n) if out.flags.c_contiguous else out
    var = xp.einsum("...i,...i->...", o2, o2)
    var *= _F32(1.0 / n)
    var += _F32(eps)
    xp.sqrt(var, out=var)
    xp.reciprocal(var, out=var)
    if o2 is out:
        out *= var[..., None]
    else:
        o2 *= var[:, None]
    return out


def soft_max(xp: Any, x: Any, mask: Any | None, scale: float, out: Any) -> Any:
    """``softmax(x * scale + mask)`` over rows (mirrors ``ggml_soft_max_ext`` with
    ``max_bias == 0``), computed in ``out``: scale and mask in one pass each, max, ``exp`` in
    place, one reciprocal per row and an in-place multiply (no temporaries of ``x``'s size).

    Args:
        xp: ``numpy`` or ``cupy``.
        x: float32 ``[..., rows, n]``.
        mask: None, or an array broadcastable to ``x`` under NumPy rules (float32 or float16;
            ``-inf`` masks a key). ggml's tiling broadcast over dims 2/3 must be expressed by the
            caller as a broadcastable view (stride 0 axes).
        scale: multiplies ``x`` before the mask is added.
        out: float32 array of ``x``'s shape (may be ``x`` itself).

    Returns:
        ``out``. Rows that are all ``-inf`` give NaN, as in ggml. Probabilities below float32's
        smallest normal number (:data:`F32_TINY`) are flushed to zero, as the compiled kernel
        (:func:`ggmlpy.backends.cpu.jit.soft_max`) does, so the result does not depend on which
        path ran (subnormal operands slow the GEMM that reads them).

    Raises:
        ValueError: ``out`` has another shape or dtype.
    """
    _check_out("soft_max", x, out)
    xp.multiply(x, _F32(scale), out=out)
    if mask is not None:
        xp.add(out, mask, out=out, casting="unsafe")
    m = out.max(axis=-1, keepdims=True)
    xp.subtract(out, m, out=out)
    xp.exp(out, out=out)
    s = out.sum(axis=-1, keepdims=True)
    xp.reciprocal(s, out=s)
    xp.multiply(out, s, out=out)
    return flush_small_to_zero(xp, out)


def flush_small_to_zero(xp: Any, out: Any) -> Any:
    """Set the elements of the non-negative float32 array ``out`` that are below float32's
    smallest normal number (:data:`F32_TINY`, subnormals) to ``+0.0``, in place; NaN stays NaN.

    The NumPy/CuPy formulations of the soft-max kernels call this so that they agree with the
    compiled kernels, which flush (a value moves by less than 1.2e-38). Synchronous on NumPy;
    launched on the current stream on CuPy.

    Args:
        xp: ``numpy`` or ``cupy``.
        out: float32 array of any shape whose elements are >= 0 or NaN (probabilities).

    Returns:
        ``out``.
    """
    xp.copyto(out, _F32(0.0), where=out < F32_TINY)
    return out


def add_bias_residual(xp: Any, x: Any, bias: Any, residual: Any | None, out: Any) -> Any:
    """``out = (x + bias) + residual``: ggml's two ``ADD`` nodes after a dense layer (same
    float32 rounding order), done in row blocks of about 256 KiB through a block-sized
    temporary, so the second add reads the first one's result from cache and ``out`` may alias
    ``x`` or ``residual``.

    Args:
        xp: ``numpy`` or ``cupy``.
        x: float32 ``[rows, n]`` C-contiguous.
        bias: float32 ``[n]`` (broadcast over rows).
        residual: None or float32 ``[rows, n]``.
        out: float32 ``[rows, n]`` C-contiguous (may be ``x`` or ``residual``).

    Returns:
        ``out``.

    Raises:
        ValueError: wrong shapes or dtype of ``out``.
    """
    _check_out("add_bias_residual", x, out)
    if x.ndim != 2 or bias.shape[-1] != x.shape[1] or (residual is not None
                                                        and residual.shape != x.shape):
        raise ValueError(f"add_bias_residual: x must be [rows, n] with bias [n] and residual "
                         f"[rows, n]; got x {x.shape}, bias {bias.shape}, residual "
                         f"{None if residual is None else residual.shape}")
    rows, n = x.shape
    if residual is None:
        xp.add(x, bias, out=out)
        return out
    if xp is not np:
        xp.add(x + bias, residual, out=out)   # one temporary: out may alias x or residual
        return out
    step = max(1, _ROW_BLOCK_BYTES // (4 * n))
    tmp = np.empty((min(step, rows), n), np.float32)  # cache-sized: out may alias x or residual
    add = np.add
    for r in range(0, rows, step):
        t = tmp[:min(step, rows - r)]
        add(x[r:r + step], bias, out=t)
        add(t, residual[r:r + step], out=out[r:r + step])
    return out


def gelu_erf(xp: Any, x: Any, out: Any) -> Any:
    """Float32 exact-erf GELU into ``out`` (mirrors ``ggml_gelu_erf``); NumPy uses
    :func:`ggmlpy.core.special.gelu_erf_f32` (error <= 2e-7 * max(1, |x|), chunked), CuPy the same
    branch-free formula ``max(x, 0) - 0.5|x| erfc(|x|/sqrt 2)`` with ``cupyx``'s float32 erfc.

    Args:
        xp: ``numpy`` or ``cupy``.
        x: float32 array (C-contiguous for the NumPy path; other layouts are copied once).
        out: float32 C-contiguous array of ``x``'s shape (may be ``x``).

    Returns:
        ``out``.

    Raises:
        ValueError: ``out`` has another shape or dtype, or is not C-contiguous (NumPy).
    """
    _check_out("gelu_erf", x, out)
    if xp is np:
        from ggmlpy.core.special import gelu_erf_f32

        return gelu_erf_f32(x, out=out)
    from cupyx.scipy.special import erfc  # noqa: PLC0415 - only with cupy

    a = xp.abs(x)
    c = erfc(a * _F32(0.7071067811865476))
    c *= a
    c *= _F32(0.5)
    xp.maximum(x, _F32(0), out=out)
    out -= c
    return out
