"""SOFT_MAX as ggml-cpu computes it on x86-64 with AVX-512 (ops.cpp
``ggml_compute_forward_soft_max_f32``, vec.cpp ``ggml_vec_soft_max_f32``, vec.h
``ggml_v_expf``): the CPU's variant ``cpu.jit.soft_max_ggml`` (a Numba kernel,
:mod:`.soft_max_ggml_kernel`, compiled on first use).

Per row ggml takes ``w = x*scale`` then ``w += slope*mask`` (``slope`` 1 without ALiBi) in
float32, the maximum, then 16 values at a time ``ggml_v_expf(w - max)`` (a range reduction by
``n = round(x/ln 2)`` in two FMA steps, a degree-5 polynomial, ``_mm512_scalef_ps``), each group's
``_mm512_reduce_add_ps`` added to a double sum (the last ``n % 16`` values through libm's
``expf``, one by one), then every value times ``(float)(1.0/sum)``. The kernel does the same,
each FMA one ``llvm.fma.f32``; ``ggml_v_expf`` is within 2 ulp of ``exp`` (its polynomial),
not correctly rounded, so this is the order of that build, not a more accurate softmax. One
difference, ggmlpy's softmax convention: a probability below float32's smallest normal is
flushed to zero (ggml keeps the subnormal; it adds nothing to the double sum, and llama.cpp's
``-fa off`` attention rounds it to f16 zero before KQV anyway).

Applies to F32 rows without ALiBi or sinks, an F32 or F16 mask (an F16 one converted to a
float32 copy at each run, as ggml widens it) or none, C-contiguous NumPy arrays, Numba
available, not ``GGMLPY_PRECISE_KERNELS``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backends.kernels.registry import Step

__all__ = ["soft_max", "soft_max_step", "warm_up"]

_state: dict[str, Any] = {}
_NO_MASK = np.zeros((1, 1, 1, 1), np.float32)


def _kernel() -> Any:
    k = _state.get("k")
    if k is None:
        from ggmlpy.backends.cpu import soft_max_ggml_kernel  # noqa: PLC0415 - imports Numba

        k = _state["k"] = soft_max_ggml_kernel.soft_max
    return k


def _check(x: np.ndarray, mask: np.ndarray | None, out: np.ndarray) -> None:
    for name, a in (("x", x), ("out", out)) + ((("mask", mask),) if mask is not None else ()):
        if a.dtype != np.float32 or not a.flags.c_contiguous or a.ndim != 4:
            raise ValueError(f"soft_max_ggml: {name} must be a 4-D C-contiguous float32 array")
    if out.shape != x.shape:
        raise ValueError(f"soft_max_ggml: out {out.shape} must have x's shape {x.shape}")
    X3, X2, X1, X0 = x.shape
    if mask is not None and (mask.shape[3] != X0 or mask.shape[2] < X1 or X2 % mask.shape[1]
                             or X3 % mask.shape[0]):
        raise ValueError(f"soft_max_ggml: mask {mask.shape} does not broadcast to x {x.shape}")


def soft_max(x: np.ndarray, mask: np.ndarray | None, scale: float, out: np.ndarray) -> np.ndarray:
    """*Sync*: ``out = softmax(x*scale + mask)`` over the last axis in ggml-cpu's AVX-512 order
    (module docstring). ``x``, ``out``: float32 C-contiguous ``(X3, X2, X1, X0)`` (ggml ``ne``
    reversed; ``out`` may be ``x``); ``mask``: None or float32 C-contiguous ``(M3, M2, M1,
    X0)``, ``M1 >= X1``, ``M2``/``M3`` dividing ``X2``/``X3`` (row ``mask[i3 % M3, i2 % M2,
    i1]``, ggml's broadcast). Returns ``out``.

    Raises:
        ValueError: shapes or dtypes as above violated.
    """
    _check(x, mask, out)
    _kernel()(x, _NO_MASK if mask is None else mask, mask is not None, np.float32(scale), out)
    return out


def soft_max_step(x: np.ndarray, mask: np.ndarray | None, scale: float, dst: np.ndarray) -> Step:
    """The step computing :func:`soft_max` of these arrays (checked now and at each run).

    Raises:
        ValueError: as :func:`soft_max`.
    """
    _check(x, mask, dst)
    return partial(soft_max, x, mask, scale, dst)


def warm_up() -> None:
    """*Sync*: compile (or load from Numba's disk cache) the kernel. Needs Numba."""
    x = np.zeros((1, 1, 1, 17), np.float32)
    soft_max_step(x, None, 1.0, x.copy())()
