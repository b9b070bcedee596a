"""The Numba kernel behind :mod:`ggmlpy.backends.cpu.rope_ggml` (imported by it on first use
only; importing this module imports Numba). A module-level function, so that Numba's on-disk
cache finds it again in a later process. No fast-math flags: every float32 operation rounds as
ggml-cpu's does; the formulas and their check against ggml are in :mod:`.rope_ggml`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

F32, F64 = np.float32, np.float64


@njit(cache=True, nogil=True, error_model="numpy")
def rope(x, pos, out, n_dims, neox, ts, freq_scale, mscale, ff, has_ff):  # pragma: no cover - compiled
    """``out = rope(x)``: x, out float32 ``(B, T, H, D)``; pos int32 ``(T,)``; ff float32
    ``(n_dims/2,)`` (read when ``has_ff``); ts, freq_scale, mscale float32 scalars."""
    B, T, H, D = x.shape
    half = n_dims // 2
    cs = np.empty(half, F32)
    sn = np.empty(half, F32)
    for b in range(B):
        for t in range(T):
            theta = F32(pos[t])
            for i in range(half):
                th = theta / ff[i] if has_ff else theta
                th = freq_scale * th
                cs[i] = F32(math.cos(th)) * mscale
                sn[i] = F32(math.sin(th)) * mscale
                theta = theta * ts
            for h in range(H):
                for i in range(half):
                    if neox:
                        i0, i1 = i, i + half
                    else:
                        i0, i1 = 2 * i, 2 * i + 1
                    x0 = x[b, t, h, i0]
                    x1 = x[b, t, h, i1]
                    c, s = cs[i], sn[i]
                    out[b, t, h, i0] = F32(F64(x0) * F64(c) - F64(x1 * s))
                    out[b, t, h, i1] = F32(F64(x0) * F64(s) + F64(x1 * c))
                for j in range(n_dims, D):
                    out[b, t, h, j] = x[b, t, h, j]
