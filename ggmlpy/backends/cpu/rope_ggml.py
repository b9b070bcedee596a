"""ROPE as ggml-cpu computes it (ops.cpp ``ggml_compute_forward_rope_flt``), the CPU's variant
``cpu.jit.rope`` (a Numba kernel, :mod:`.rope_ggml_kernel`, compiled on first use).

Per position ``p`` ggml fills a cache of ``cos``/``sin`` (``ggml_rope_cache_init``): ``theta``
starts at ``float(p)`` and is multiplied by ``theta_scale = powf(freq_base, -2/n_dims)`` in
float32 after each pair, so it drifts by a few float32 roundings from ``p * theta_scale**i``;
``rope_yarn`` takes ``freq_scale * theta / freq_factor`` and ``cosf``/``sinf`` of it (times
``attn_factor``); then each pair rotates as ``x0*cos - x1*sin``, ``x0*sin + x1*cos``, which the
native x86-64 build contracts to ``fmaf(x0, cos, -(x1*sin))`` and ``fmaf(x0, sin, x1*cos)``.
This kernel does the same: float32 ``theta`` steps, ``math.cos``/``math.sin`` of a float32
(compiled to the C library's ``cosf``/``sinf``, as ggml calls them), and each fused
multiply-add as one float64 operation rounded once to float32 (the product of two float32 values
is exact in float64). Checked bit for bit against ggml's ``ggml_rope_ext`` (NEOX, positions
0..1023, 256 dimensions, bases 1e4 and 1e6) in tests/backends/cpu/test_rope_ggml.py.

Applies to NORMAL and NEOX modes without YaRN (``ext_factor == 0``), F32 tensors, an I32
position per row of dim 2, optional F32 frequency factors, C-contiguous source and destination,
NumPy, Numba available, not ``GGMLPY_PRECISE_KERNELS`` (the generic kernel, theta in float64, is
the tests' referee).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ggmlpy.backends.kernels.registry import Step

__all__ = ["rope_step", "theta_scale", "warm_up"]

_state: dict[str, Any] = {}


def theta_scale(freq_base: float, n_dims: int) -> np.float32:
    """``powf(freq_base, -2.0f/n_dims)`` (float32; the power in float64, rounded once, as a
    correctly rounded ``powf`` gives it)."""
    e = np.float32(np.float32(-2.0) / np.float32(n_dims))
    return np.float32(math.pow(float(np.float32(freq_base)), float(e)))


def _kernel() -> Any:
    k = _state.get("k")
    if k is None:
        from ggmlpy.backends.cpu import rope_ggml_kernel  # noqa: PLC0415 - imports Numba

        k = _state["k"] = rope_ggml_kernel.rope
    return k


def warm_up() -> None:
    """*Sync*: compile (or load from Numba's disk cache) the kernel for float32 arrays, so the
    first graph evaluation does not pay for it. Needs Numba (ImportError without it)."""
    x = np.ones((1, 1, 1, 4), np.float32)
    rope_step(x, np.zeros(1, np.int32), x.copy(), None, 4, 2, 10000.0, 1.0, 1.0)()


def rope_step(a: np.ndarray, pos: np.ndarray, dst: np.ndarray, ff: np.ndarray | None,
              n_dims: int, mode: int, freq_base: float, freq_scale: float,
              attn_factor: float) -> Step:
    """The step computing ``dst = rope(a)`` (float32 C-contiguous NumPy ``(B, T, H, D)`` arrays,
    ggml ``ne = [D, H, T, B]``; ``pos`` int32 with at least ``T`` entries, read at run time;
    ``ff`` float32 frequency factors of at least ``n_dims/2`` or None). Synchronous when run."""
    k = _kernel()
    ts = theta_scale(freq_base, n_dims)
    fs, ms = np.float32(freq_scale), np.float32(attn_factor)
    neox = bool(mode & 2)
    T = a.shape[1]
    ffv = np.ones(1, np.float32) if ff is None else None
    has_ff = ff is not None

    def run() -> None:
        f = ffv if ffv is not None else np.ascontiguousarray(ff.reshape(-1)[:n_dims // 2])
        k(a, np.ascontiguousarray(pos.reshape(-1)[:T]), dst, n_dims, neox, ts, fs, ms, f, has_ff)
    return run
