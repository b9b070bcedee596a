"""ROPE (NORMAL and NEOX modes, YaRN ramp, optional frequency factors). ``theta`` is built in
float64 (ggml multiplies in float32, drifting a few ulps); the rotation is float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ggmlpy.backends.kernels.common import F32, F64, FLOATS, as_f32, c_contig, copy_into, noop, src_of
from ggmlpy.backends.kernels.registry import Step, kernel
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

# ---------------------------------------------------------------------------------------------
# support


def _sup_rope(node: Tensor, xp: Any) -> bool:
    a, pos = src_of(node, 0), src_of(node, 1)
    if a is None or pos is None or pos.type != Type.I32 or a.type not in FLOATS:
        return False
    p = list(node.op_params) + [0] * (16 - len(node.op_params))
    n_dims, mode = int(p[1]), int(p[2])
    if mode not in (0, 2) or int(p[15]) != 0:
        return False  # MROPE/VISION/IMROPE and n_offs not implemented
    ff = src_of(node, 2)
    if ff is not None and (ff.type != Type.F32 or ff.ne[0] < n_dims // 2):
        return False
    return (node.type == a.type and node.ne == a.ne and 0 <= n_dims <= a.ne[0] and n_dims % 2 == 0
            and pos.nelements >= a.ne[2])


# ---------------------------------------------------------------------------------------------
# kernels


def _rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                         beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims in float32 with C's MAX/MIN ternaries (NaN/inf cases included)."""
    f = F32
    with np.errstate(all="ignore"):
        def corr(n_rot: float) -> np.float32:
            return f(f(n_dims) * np.log(f(f(n_ctx_orig) / (f(n_rot) * f(2) * f(math.pi))))
                     / (f(2) * np.log(f(freq_base))))
        start = np.floor(corr(beta_fast))
        end = np.ceil(corr(beta_slow))
    lo = f(0) if f(0) > start else start            # MAX(0, start)
    hi = f(n_dims - 1) if f(n_dims - 1) < end else end  # MIN(n_dims - 1, end)
    return float(lo), float(hi)


def _rope_ramp(lo: float, hi: float, m: np.ndarray) -> np.ndarray:
    """1 - MIN(1, MAX(0, (m - lo) / MAX(0.001, hi - lo))) with C ternary semantics, float32."""
    f = F32
    with np.errstate(all="ignore"):
        den = f(hi - lo)
        den = f(0.001) if f(0.001) > den else den
        y = (m.astype(F32) - f(lo)) / den
        y = np.where(f(0) > y, f(0), y)             # MAX(0, y): NaN stays NaN
        y = np.where(f(1) < y, f(1), y)             # MIN(1, y)
    return (f(1) - y).astype(F32)


@kernel(Op.ROPE, supports=_sup_rope)
def _k_rope(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = list(node.op_params) + [0] * (16 - len(node.op_params))
    n_dims, mode, n_ctx_orig = int(p[1]), int(p[2]), int(p[4])
    freq_base, freq_scale, ext_factor = float(p[5]), float(p[6]), float(p[7])
    attn_factor, beta_fast, beta_slow = float(p[8]), float(p[9]), float(p[10])
    a, pos = srcs[0], srcs[1]
    ff = srcs[2] if len(srcs) > 2 else None
    n_tok = a.shape[1]
    half = n_dims // 2
    if half == 0:                                   # nothing rotates: a plain copy
        return copy_into(xp, dst, a)
    m = np.arange(half)
    theta_scale = float(F32(freq_base) ** F32(-2.0 / n_dims))
    powers = theta_scale ** m.astype(F64)          # theta_m = p * theta_scale^m
    mscale = attn_factor
    if ext_factor != 0.0:
        lo, hi = _rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        mix = _rope_ramp(lo, hi, m).astype(F64) * ext_factor
        coef = freq_scale * (1.0 - mix) + mix      # theta = t_interp*(1-mix) + t_extrap*mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    else:
        coef = np.full(half, freq_scale)
    base = xp.asarray(powers * coef)               # (half,) float64
    ms = F64(mscale)
    if mode & 2:  # NEOX: (m, m + n_dims/2)
        x0, x1 = a[..., :half], a[..., half:n_dims]
        d0, d1 = dst[..., :half], dst[..., half:n_dims]
    else:         # NORMAL: (2m, 2m+1)
        x0, x1 = a[..., 0:n_dims:2], a[..., 1:n_dims:2]
        d0, d1 = dst[..., 0:n_dims:2], dst[..., 1:n_dims:2]
    rest = copy_into(xp, dst[..., n_dims:], a[..., n_dims:]) if n_dims < a.shape[-1] else noop
    cos, sin, copyto = xp.cos, xp.sin, xp.copyto
    # a reshape of a non-contiguous view is a copy: take it per call, never a stale one now
    posv = pos.reshape(-1) if c_contig(pos) else None

    def run() -> None:
        pf = (posv if posv is not None else pos.reshape(-1))[:n_tok].astype(F64)
        vec = base if ff is None else base / ff.reshape(-1)[:half].astype(F64)
        theta = pf[:, None] * vec[None, :]         # (n_tok, half)
        c = (cos(theta) * ms).astype(F32)[None, :, None, :]
        s = (sin(theta) * ms).astype(F32)[None, :, None, :]
        y0 = as_f32(xp, x0)
        y1 = as_f32(xp, x1)
        o0 = y0 * c - y1 * s
        o1 = y0 * s + y1 * c
        copyto(d0, o0, casting="unsafe")
        copyto(d1, o1, casting="unsafe")
        rest()
    return run
