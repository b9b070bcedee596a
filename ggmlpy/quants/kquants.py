"""K-quants Q4_K, Q5_K and Q6_K: quantizers written here, dequantizers from ``gguf.quants``.

Super-blocks of QK_K = 256 elements. Byte layouts (little-endian, per super-block):

* Q4_K, 144 bytes: ``d`` f16, ``dmin`` f16, ``scales[12]`` (eight 6-bit scales and eight 6-bit
  mins packed), ``qs[128]`` (4-bit quants, two per byte).
* Q5_K, 176 bytes: as Q4_K plus ``qh[32]`` (the fifth bit) between ``scales`` and ``qs``.
* Q6_K, 210 bytes: ``ql[128]`` (low 4 bits), ``qh[64]`` (high 2 bits), ``scales[16]`` int8,
  ``d`` f16.

The quantizers reproduce ggml's ``quantize_row_q{4,5,6}_K_ref`` (ggml-quants.c) bit for bit: the
same float32 operations in the same order, with every block processed at once (vectorized over
blocks; Python loops run only over the 32/16 positions of a sub-block and over the search steps,
never over blocks). ``gguf.quants`` (gguf-py 0.19) has no K-quant quantizer, which is why they are
written here; its K-quant dequantizers are bit-exact with ggml's ``dequantize_row_*`` (checked
against vectors from ggml's C code in tests/data) and are used as they are.
"""

from __future__ import annotations

import numpy as np

from ggmlpy.quants._common import F32, nearest_int, seqsum

QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)

__all__ = ["QK_K", "quantize_q4_k", "quantize_q5_k", "quantize_q6_k"]


def _make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                      nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's ``make_qkx2_quants`` (use_mad=false) over many groups at once.

    Args:
        x, w: float32, shape (n, G): n values (and weights) of each of G groups, in order.

    Returns:
        (L uint8 (n, G), scale float32 (G,), the_min float32 (G,) = -min).
    """
    mn = np.minimum.reduce(x, axis=0)
    mx = np.maximum.reduce(x, axis=0)
    sum_w = seqsum(w)
    sum_x = seqsum(w * x)
    mn = np.where(mn > 0, F32(0), mn).astype(F32, copy=False)
    flat = mx == mn
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rng = (mx - mn).astype(F32, copy=False)
        iscale = (F32(nmax) / rng).astype(F32, copy=False)
        scale = (F32(1) / iscale).astype(F32, copy=False)
        xm = (x - mn).astype(F32, copy=False)
        L = np.clip(nearest_int(iscale * xm), 0, nmax).astype(F32, copy=False)
        diff = (scale * L + mn - x).astype(F32, copy=False)
        best = seqsum(w * (diff * diff))
        for step in range(nstep + 1):
            isc = ((F32(rmin) + F32(rdelta) * F32(step)) + F32(nmax)).astype(F32, copy=False)
            # ggml's loop reads the current (possibly updated) min in both places
            isc = (isc / (mx - mn).astype(F32, copy=False)).astype(F32, copy=False)
            la = np.clip(nearest_int(isc * (x - mn).astype(F32, copy=False)), 0, nmax).astype(F32, copy=False)
            wl = (w * la).astype(F32, copy=False)
            sum_l = seqsum(wl)
            sum_l2 = seqsum(wl * la)
            sum_xl = seqsum(wl * x)
            D = (sum_w * sum_l2 - sum_l * sum_l).astype(F32, copy=False)
            this_scale = ((sum_w * sum_xl - sum_x * sum_l) / D).astype(F32, copy=False)
            this_min = ((sum_l2 * sum_x - sum_l * sum_xl) / D).astype(F32, copy=False)
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min).astype(F32, copy=False)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale).astype(F32, copy=False)
            d2 = (this_scale * la + this_min - x).astype(F32, copy=False)
            cur = seqsum(w * (d2 * d2))
            upd = (D > 0) & (cur < best)
            L = np.where(upd, la, L)
            best = np.where(upd, cur, best)
            scale = np.where(upd, this_scale, scale)
            mn = np.where(upd, this_min, mn)
    L = np.where(flat, F32(0), L)
    scale = np.where(flat, F32(0), scale).astype(F32, copy=False)
    return L.astype(np.uint8), scale, (-mn).astype(F32, copy=False)


def _k_scales_mins(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Shared first half of Q4_K/Q5_K: per-32 scales/mins, their 6-bit codes and the final L.

    Args:
        x: float32, shape (nb, 256).

    Returns:
        (d f16 bits (nb,), dmin f16 bits (nb,), packed scales uint8 (nb, 12), L uint8 (nb, 256)).
    """
    nb = x.shape[0]
    xs = np.ascontiguousarray(x.reshape(nb * 8, 32).T)  # (32, G): one column per 32-element sub-block
    av_x = np.sqrt((seqsum(xs * xs) / F32(32)).astype(F32, copy=False)).astype(F32, copy=False)
    w = (av_x + np.abs(xs)).astype(F32, copy=False)
    L, scales, mins = _make_qkx2_quants(xs, w, nmax, rmin, rdelta, nstep)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)
    L = L.T.reshape(nb, 256)
    # ggml keeps the largest value > 0 starting from +0 (``if (scale > max_scale)``): -0.0,
    # negatives and NaN never win, so the max ignores NaN (fmax) and anything not > 0 gives +0
    max_scale = np.fmax.reduce(scales, axis=1)
    max_scale = np.where(max_scale > 0, max_scale, F32(0)).astype(F32, copy=False)
    max_min = np.fmax.reduce(mins, axis=1)
    max_min = np.where(max_min > 0, max_min, F32(0)).astype(F32, copy=False)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0)).astype(F32, copy=False)
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0)).astype(F32, copy=False)
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    sc = np.zeros((nb, 12), np.uint8)
    sc[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    sc[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    sc[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    d16 = (max_scale / F32(63)).astype(F32, copy=False).astype(np.float16)
    dmin16 = (max_min / F32(63)).astype(F32, copy=False).astype(np.float16)
    d = (d16.astype(F32, copy=False)[:, None] * ls.astype(F32, copy=False)).astype(F32, copy=False)   # (nb, 8)
    dm = (dmin16.astype(F32, copy=False)[:, None] * lm.astype(F32, copy=False)).astype(F32, copy=False)
    xr = x.reshape(nb, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        lq = nearest_int((xr + dm[:, :, None]) / d[:, :, None])
    lq = np.clip(lq, 0, nmax).astype(np.uint8)
    L = np.where((d != 0)[:, :, None], lq, L.reshape(nb, 8, 32)).reshape(nb, 256)
    return d16.view(np.uint16), dmin16.view(np.uint16), sc, L


def _k_head(x: np.ndarray, type_size: int, nmax: int, rmin: float, rdelta: float,
            nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K blocks with their head written: uint8 ``(nb, type_size)`` whose bytes 0:4 hold
    ``d``/``dmin`` (f16) and 4:16 the packed 6-bit scales and mins of :func:`_k_scales_mins` (the
    quants' bytes left to the caller), and the quants L as uint8 ``(nb, 4, 2, 32)`` (64-element
    chunk, 32-element half, position), for float32 ``x`` ``(nb, 256)``."""
    nb = x.shape[0]
    d, dmin, sc, L = _k_scales_mins(x, nmax, rmin, rdelta, nstep)
    out = np.empty((nb, type_size), np.uint8)
    out[:, 0:2] = d[:, None].view(np.uint8)
    out[:, 2:4] = dmin[:, None].view(np.uint8)
    out[:, 4:16] = sc
    return out, L.reshape(nb, 4, 2, 32)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Quantize rows to Q4_K like ggml's ``quantize_row_q4_K_ref``.

    Args:
        x: float32, shape (nb, 256): nb super-blocks.

    Returns:
        uint8, shape (nb, 144).
    """
    nb = x.shape[0]
    out, Lc = _k_head(x, 144, 15, -1.0, 0.1, 20)
    out[:, 16:] = (Lc[:, :, 0] | (Lc[:, :, 1] << 4)).reshape(nb, 128)
    return out


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """Quantize rows to Q5_K like ggml's ``quantize_row_q5_K_ref``.

    Args:
        x: float32, shape (nb, 256).

    Returns:
        uint8, shape (nb, 176).
    """
    nb = x.shape[0]
    out, Lc = _k_head(x, 176, 31, -0.5, 0.1, 15)      # Lc: chunk c, half h, position j
    hi = (Lc >> 4).astype(np.uint8)                   # fifth bit
    shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)  # (4, 2)
    qh = np.bitwise_or.reduce((hi << shifts[None, :, :, None]).reshape(nb, 8, 32), axis=1)
    out[:, 16:48] = qh
    lo = Lc & 0xF
    out[:, 48:] = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(nb, 128)
    return out


def _make_qx_quants_rmse1(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qx_quants(n, nmax, x, L, rmse_type=1, NULL)`` over many groups at once.

    Args:
        x: float32, shape (n, G).

    Returns:
        (L int8 (n, G) in [0, 2*nmax), scale float32 (G,)).
    """
    G = x.shape[1]
    ax = np.abs(x)
    imax = np.argmax(ax, axis=0)          # first index of the largest |x| (C uses strict >)
    amax = ax[imax, np.arange(G)]
    mx = x[imax, np.arange(G)]
    zero = amax < GROUP_MAX_EPS
    w = (x * x).astype(F32, copy=False)
    wx = (w * x).astype(F32, copy=False)

    def trial(iscale):
        lraw = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        lf = lraw.astype(F32, copy=False)
        sumlx = seqsum(wx * lf)
        suml2 = seqsum((w * lf) * lf)
        return lraw, sumlx, suml2

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (F32(-nmax) / mx).astype(F32, copy=False)
        l0, sumlx, suml2 = trial(iscale)
        L = (l0 + nmax).astype(np.int8)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32, copy=False)
        best = (scale * sumlx).astype(F32, copy=False)
        for step in range(-9, 10):
            if step == 0:
                continue
            isc = (-(F32(nmax) + F32(0.1) * F32(step)) / mx).astype(F32, copy=False)
            l1, sumlx, suml2 = trial(isc)
            upd = (suml2 > 0) & ((sumlx * sumlx).astype(F32, copy=False) > (best * suml2).astype(F32, copy=False))
            L = np.where(upd, (l1 + nmax).astype(np.int8), L)
            new_scale = (sumlx / suml2).astype(F32, copy=False)
            scale = np.where(upd, new_scale, scale)
            best = np.where(upd, (new_scale * sumlx).astype(F32, copy=False), best)
    L = np.where(zero, np.int8(0), L)
    scale = np.where(zero, F32(0), scale).astype(F32, copy=False)
    return L, scale


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Quantize rows to Q6_K like ggml's ``quantize_row_q6_K_ref``.

    Args:
        x: float32, shape (nb, 256).

    Returns:
        uint8, shape (nb, 210).
    """
    nb = x.shape[0]
    xs = np.ascontiguousarray(x.reshape(nb * 16, 16).T)
    L, scales = _make_qx_quants_rmse1(xs, 32)
    L = L.T.reshape(nb, 16, 16)
    scales = scales.reshape(nb, 16)
    # ggml scans ``if (abs_scale > max_abs_scale)`` from 0: the first strictly largest |scale|
    # wins and a NaN scale (huge inputs overflow the group's sums) never does; argmax would
    # take NaN as the largest, so NaN counts as 0 here (all-NaN gives the all-zero block)
    asc = np.abs(scales)
    asc = np.where(np.isnan(asc), F32(0), asc)
    im = np.argmax(asc, axis=1)
    max_abs = asc[np.arange(nb), im]
    max_scale = scales[np.arange(nb), im]
    zero = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (F32(-128) / max_scale).astype(F32, copy=False)
        d16 = (F32(1) / iscale).astype(F32, copy=False).astype(np.float16)
        qsc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
        d = (d16.astype(F32, copy=False)[:, None] * qsc.astype(F32, copy=False)).astype(F32, copy=False)
        lq = np.clip(nearest_int(x.reshape(nb, 16, 16) / d[:, :, None]), -32, 31) + 32
    L = np.where((d != 0)[:, :, None], lq.astype(np.int8), L).reshape(nb, 256).astype(np.uint8)
    Lc = L.reshape(nb, 2, 4, 32)                      # half, quarter, position
    lo = Lc & 0xF
    ql = np.empty((nb, 2, 64), np.uint8)
    ql[:, :, 0:32] = lo[:, :, 0] | (lo[:, :, 2] << 4)
    ql[:, :, 32:64] = lo[:, :, 1] | (lo[:, :, 3] << 4)
    hi = Lc >> 4
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    out = np.empty((nb, 210), np.uint8)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = qsc.view(np.uint8)
    out[:, 208:210] = d16.view(np.uint16)[:, None].view(np.uint8)
    out[zero] = 0
    return out
