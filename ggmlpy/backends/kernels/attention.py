"""Soft-max and attention kernels: DIAG_MASK_INF/ZERO, SOFT_MAX (mask and ALiBi) and FLASH_ATTN_EXT
(an exact float32 softmax; ggml's CPU accumulates in f16 when V is F16). On NumPy FLASH_ATTN_EXT
runs in chunks of query rows whose scores stay in cache (:data:`FA_CHUNK_ELEMS`), each reading
only the KV cells between the first and the last one its mask leaves visible to some row of the
chunk (the cells outside are ``-inf`` for all of them, so they add exact zeros: ggml's CPU kernel
skips ``-inf`` mask entries too; a causal prompt reads about half the cells).

SOFT_MAX without ALiBi (``max_bias == 0``) runs the variants of :mod:`ggmlpy.backends.cpu.variants`
(``fast.soft_max``: :func:`ggmlpy.backends.cpu.fastpath.soft_max`
straight in the destination (scale, mask, max, exp, one reciprocal per row and a multiply, no
temporaries of the input's size); ggml's tiling broadcast of the mask over dims 2/3 is given to
it as stride-0 views); the generic kernel here computes ALiBi. Rows sum to 1 within float32
rounding as with the divide. With Numba (the ``jit`` extra), C-contiguous float32 operands go to
:func:`ggmlpy.backends.cpu.jit.soft_max` instead (``cpu.jit.soft_max``): one compiled kernel, float64 sums; an F16 mask is converted to a float32 copy of the
rows used first (exact), so it takes the same kernel. Every SOFT_MAX path flushes probabilities
below float32's smallest normal number to zero (as the compiled kernel does), so a result does
not depend on the mask's type, the layout or ``GGMLPY_JIT``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backends.cpu import fastpath
from ggmlpy.backends.kernels.common import (
    F32,
    FLOATS,
    as_f32,
    as_strided,
    copy_into,
    is_numpy,
    src_of,
    sup_f32_same,
)
from ggmlpy.backends.kernels.registry import Kernel, Step, kernel
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

# ---------------------------------------------------------------------------------------------
# support


def _sup_soft_max(node: Tensor, xp: Any) -> bool:
    a, mask = src_of(node, 0), src_of(node, 1)
    if a is None or a.type != Type.F32 or node.type != Type.F32 or a.ne != node.ne:
        return False
    if len(node.src) > 2 and any(s is not None for s in node.src[2:]):
        return False  # sinks not implemented
    max_bias = float(node.op_params[1]) if len(node.op_params) > 1 else 0.0
    if mask is None:
        return max_bias == 0.0
    return (mask.type in FLOATS and mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1]
            and a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0)


def _sup_fa(node: Tensor, xp: Any) -> bool:
    q, k, v = src_of(node, 0), src_of(node, 1), src_of(node, 2)
    mask = src_of(node, 3)
    if q is None or k is None or v is None or node.type != Type.F32 or q.type != Type.F32:
        return False
    if k.type not in FLOATS or v.type not in FLOATS:
        return False
    if len(node.src) > 4 and any(s is not None for s in node.src[4:]):
        return False  # sinks not implemented
    if mask is not None and (mask.type not in FLOATS or mask.ne[0] != k.ne[1]
                             or mask.ne[1] < q.ne[1] or q.ne[2] % mask.ne[2]
                             or q.ne[3] % mask.ne[3]):
        return False
    return (k.ne[0] == q.ne[0] and v.ne[1] == k.ne[1] and k.ne[2] == v.ne[2]
            and q.ne[2] % k.ne[2] == 0 and q.ne[3] == k.ne[3] == v.ne[3]
            and node.ne == (v.ne[0], q.ne[2], q.ne[1], q.ne[3]))


# ---------------------------------------------------------------------------------------------
# kernels


def _k_diag_mask(value: float) -> Kernel:
    def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
        n_past = int(node.op_params[0])
        ne1, ne0 = dst.shape[2], dst.shape[3]
        mask = xp.asarray(np.arange(ne0)[None, :] > n_past + np.arange(ne1)[:, None])
        copy_a = copy_into(xp, dst, srcs[0])
        copyto = xp.copyto
        v = F32(value)

        def run() -> None:
            copy_a()
            copyto(dst, v, where=mask)
        return run
    return make


kernel(Op.DIAG_MASK_INF, supports=sup_f32_same)(_k_diag_mask(-math.inf))
kernel(Op.DIAG_MASK_ZERO, supports=sup_f32_same)(_k_diag_mask(0.0))


def _alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """Per-head ALiBi slopes (float32, ggml's formula); all ones when ``max_bias == 0``."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=F32)
    n_log2 = 2 ** int(math.floor(math.log2(n_head)))
    m0 = F32(2.0) ** F32(-max_bias / n_log2)
    m1 = F32(2.0) ** F32(-(max_bias / 2.0) / n_log2)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1).astype(F32),
                    m1 ** (2 * (h - n_log2) + 1).astype(F32)).astype(F32)


def tile_23(xp: Any, x: Any, m: Any) -> tuple[Any, Any]:
    """Split dims 2/3 (NumPy axes 0/1) of ``x`` so that ``m`` (same ne0/ne1, ne2/ne3 dividing
    x's) tiles over them by modulo. Returns (x6, m6) with x6 (r3, m3, r2, m2, ...) and m6
    (1, m3, 1, m2, ...)."""
    X3, X2 = x.shape[0], x.shape[1]
    M3, M2 = m.shape[0], m.shape[1]
    r3, r2 = X3 // M3, X2 // M2
    sx, smk = x.strides, m.strides
    x6 = as_strided(xp, x, (r3, M3, r2, M2) + x.shape[2:],
                     (sx[0] * M3, sx[0], sx[1] * M2, sx[1]) + sx[2:])
    m6 = as_strided(xp, m, (1, M3, 1, M2) + m.shape[2:], (0, smk[0], 0, smk[1]) + smk[2:])
    return x6, m6


@kernel(Op.SOFT_MAX, supports=_sup_soft_max)
def _k_soft_max(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = node.op_params
    scale = float(p[0]) if len(p) > 0 else 1.0
    max_bias = float(p[1]) if len(p) > 1 else 0.0
    a = srcs[0]
    mask = srcs[1] if len(srcs) > 1 else None
    X3, X2, X1, X0 = a.shape
    s32 = F32(scale)
    exp, divide = xp.exp, xp.divide
    flush = fastpath.flush_small_to_zero
    if mask is None:
        def run_plain() -> None:
            w = a * s32
            w -= w.max(axis=-1, keepdims=True)
            exp(w, out=w)
            divide(w, w.sum(axis=-1, keepdims=True), out=dst)
            flush(xp, dst)
        return run_plain
    mrows = mask[:, :, :X1, :]
    a6, m6 = tile_23(xp, a, mrows)
    d6, _ = tile_23(xp, dst, mrows)
    M2 = mrows.shape[1]
    r2 = X2 // M2
    slope = xp.asarray(_alibi_slopes(X2, max_bias).reshape(1, 1, r2, M2, 1, 1))
    use_slope = max_bias > 0.0

    def run() -> None:
        w = a6 * s32
        mk = as_f32(xp, m6)
        if use_slope:
            w += slope * mk
        else:
            w += mk
        w -= w.max(axis=-1, keepdims=True)
        exp(w, out=w)
        divide(w, w.sum(axis=-1, keepdims=True), out=d6)
        flush(xp, d6)
    return run


#: float32 scores per query chunk of FLASH_ATTN_EXT on NumPy (256K = 1 MiB, inside L2): the
#: chunk's scores are scaled, masked, exponentiated and summed while they stay in cache
FA_CHUNK_ELEMS = 1 << 18


def fa_query_chunk(B: int, H: int, NKV: int) -> int:
    """Query rows per chunk of a NumPy FLASH_ATTN_EXT with ``B`` batches, ``H`` heads and ``NKV``
    KV cells (``B * H * NKV`` scores per query row, :data:`FA_CHUNK_ELEMS` per chunk). Chunks
    start at multiples of it, so a split of the query rows at such multiples
    (:mod:`ggmlpy.backends.cpu.threads`) computes every row exactly as the whole node does."""
    return max(1, FA_CHUNK_ELEMS // max(1, B * H * NKV))


def _kv_f32(dtype: Any) -> Callable[[np.ndarray], np.ndarray]:
    """How a NumPy FLASH_ATTN_EXT's K or V of ``dtype`` becomes float32, chosen when the step is
    built: an F16 cache through the CPU's vector conversion when the compiled kernels are used
    (:func:`ggmlpy.backends.cpu.jit.f16_converter`: the same values, 10-20x NumPy's
    ``astype``), else ``astype`` (no copy for float32)."""
    if dtype == np.float16:
        from ggmlpy.backends.cpu import jit as cpu_jit  # noqa: PLC0415 - the CPU's kernels

        if cpu_jit.available():
            return cpu_jit.f16_converter()
    return partial(as_f32, np)


@kernel(Op.FLASH_ATTN_EXT, supports=_sup_fa)
def _k_flash_attn_ext(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = node.op_params
    scale = float(p[0]) if len(p) > 0 else 1.0
    max_bias = float(p[1]) if len(p) > 1 else 0.0
    softcap = float(p[2]) if len(p) > 2 else 0.0
    q, k, v = srcs[0], srcs[1], srcs[2]
    mask = srcs[3] if len(srcs) > 3 else None
    B, H, NQ, DK = q.shape
    Hkv, NKV = k.shape[1], k.shape[2]
    DV = v.shape[3]
    g = H // Hkv
    qs = as_strided(xp, q, (B, Hkv, g, NQ, DK),
                     (q.strides[0], q.strides[1] * g, q.strides[1], q.strides[2], q.strides[3]))
    k5 = k[:, :, None]                             # (B, Hkv, 1, NKV, DK)
    v5 = v[:, :, None]                             # (B, Hkv, 1, NKV, DV)
    d_perm = dst.transpose(0, 2, 1, 3)             # dst (B, NQ, H, DV) -> (B, H, NQ, DV)
    d5 = as_strided(xp, d_perm, (B, Hkv, g, NQ, DV),
                     (d_perm.strides[0], d_perm.strides[1] * g, d_perm.strides[1],
                      d_perm.strides[2], d_perm.strides[3]))
    s_scale = F32(scale / softcap) if softcap != 0.0 else F32(scale)
    cap = F32(softcap)
    slopes = xp.asarray(_alibi_slopes(H, max_bias).reshape(1, Hkv, g, 1, 1))
    use_slope = max_bias > 0.0
    mask_fn = None
    if mask is not None:
        mB, mH = mask.shape[0], mask.shape[1]
        mq = mask[:, :, :NQ, :]                    # (mB, mH, NQ, NKV)
        if mH == 1:
            m_b = as_strided(xp, mq, (mB, 1, 1, NQ, NKV),
                              (mq.strides[0], 0, 0, mq.strides[2], mq.strides[3]))
            if mB in (1, B):
                mask_fn = lambda: m_b  # noqa: E731
            else:
                bi = xp.asarray(np.arange(B) % mB)
                mask_fn = lambda: m_b[bi]  # noqa: E731
        else:
            bi = xp.asarray((np.arange(B) % mB).reshape(B, 1))
            hi = xp.asarray((np.arange(H) % mH).reshape(1, H))
            mask_fn = lambda: mq[bi, hi].reshape(B, Hkv, g, NQ, NKV)  # noqa: E731
    matmul, tanh, exp, copyto, where = xp.matmul, xp.tanh, xp.exp, xp.copyto, xp.where
    # query rows per chunk: the chunk's scores (Hkv * g rows of NKV per query) stay in cache
    qc = fa_query_chunk(B, H, NKV)
    numpy = is_numpy(xp)
    if numpy:
        k_conv, v_conv = _kv_f32(k.dtype), _kv_f32(v.dtype)

    def chunk(kk: Any, vv: Any, mk_all: Any, q0: int, q1: int) -> None:
        nkv = kk.shape[-2]
        lo, hi = 0, nkv
        mk = None
        if mk_all is not None:
            mk = mk_all[..., q0:q1, :]
            if numpy:  # cells no query row of the chunk sees (-inf everywhere) are skipped
                live = np.flatnonzero((mk != -np.inf).reshape(-1, nkv).any(axis=0))
                if live.size == 0:
                    d5[..., q0:q1, :] = 0  # fully masked rows: exp(-inf) = 0 -> output 0
                    return
                lo, hi = int(live[0]), int(live[-1]) + 1
                mk = mk[..., lo:hi]
        s = matmul(qs[..., q0:q1, :], kk[..., lo:hi, :].swapaxes(-1, -2))  # (B, Hkv, g, n, w)
        s *= s_scale
        if softcap != 0.0:
            tanh(s, out=s)
            s *= cap
        if mk is not None:
            s += slopes * mk if use_slope else mk
        m = s.max(axis=-1, keepdims=True)
        m = where(m == -np.inf, F32(0), m)        # fully masked rows: exp(-inf) = 0 -> output 0
        s -= m
        exp(s, out=s)
        den = s.sum(axis=-1, keepdims=True)
        o = matmul(s, vv[..., lo:hi, :])
        o /= where(den == 0, F32(1), den)
        copyto(d5[..., q0:q1, :], o, casting="unsafe")

    def run() -> None:
        mk_all = as_f32(xp, mask_fn()) if mask_fn is not None else None
        if not numpy:
            chunk(as_f32(xp, k5), as_f32(xp, v5), mk_all, 0, NQ)
            return
        k_, v_ = k5, v5
        if mk_all is not None:
            # only the cells some query row sees are converted to float32 (a KV cache's view
            # during generation: its used cells, not all of them; each chunk then skips the
            # cells its rows do not see, as before: the same cells, the same bits)
            live = np.flatnonzero((mk_all != -np.inf).reshape(-1, NKV).any(axis=0))
            if live.size == 0:
                d5[...] = 0  # every row fully masked: exp(-inf) = 0 -> output 0
                return
            lo, hi = int(live[0]), int(live[-1]) + 1
            if hi - lo < NKV:
                k_, v_, mk_all = k5[..., lo:hi, :], v5[..., lo:hi, :], mk_all[..., lo:hi]
        kk = k_conv(k_)
        vv = v_conv(v_)
        for q0 in range(0, NQ, qc):
            chunk(kk, vv, mk_all, q0, min(NQ, q0 + qc))
    return run
