"""NumPy emulation of the dequantization RawKernels of ``ggmlpy.backends.cuda.quant`` (test
support, not a test module): the per-element formulas of the CUDA sources, written again over
index arrays (element ``e`` of a row -> block ``e // BS``, position ``j = e % BS``) in float32
with the same operation order, so the fake CuPy (tests/fake_cupy.py, whose ``RawKernel`` dispatches ``ggmlpy_dequant_*`` names
here) runs what the device would compute.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ggmlpy.backends.cuda import quant as cuda_quant
from ggmlpy.core.types import Type

_F = np.float32
_BY_NAME = {name: t for t, name in cuda_quant.KERNEL_NAMES.items()}


def _f16(b: np.ndarray, off: int) -> np.ndarray:
    return b[:, off:off + 2].copy().view(np.float16).astype(_F)[:, 0]


def _scale_min(jj: np.ndarray, sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for index array ``jj`` over per-element scale bytes ``sc`` (n, 12)."""
    rows = np.arange(sc.shape[0])
    s = sc.astype(np.int32)
    lo = jj < 4
    jl = np.where(lo, jj, 0)
    jh = np.where(lo, 4, jj)
    d_lo = s[rows, jl] & 63
    m_lo = s[rows, jl + 4] & 63
    d_hi = (s[rows, jh + 4] & 0xF) | ((s[rows, jh - 4] >> 6) << 4)
    m_hi = (s[rows, jh + 4] >> 4) | ((s[rows, jh] >> 6) << 4)
    return np.where(lo, d_lo, d_hi), np.where(lo, m_lo, m_hi)


def emulate_elements(t: Type, blocks: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Element ``j[i]`` of block ``blocks[i]`` (uint8 (n, type_size)) as the kernel computes it."""
    b = blocks.astype(np.int32)
    rows = np.arange(b.shape[0])
    if t in (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1):
        qs0 = {Type.Q4_0: 2, Type.Q4_1: 4, Type.Q5_0: 6, Type.Q5_1: 8}[t]
        lo = np.where(j < 16, b[rows, qs0 + j % 16] & 0xF, b[rows, qs0 + j % 16] >> 4)
        d = _f16(blocks, 0)
        if t in (Type.Q5_0, Type.Q5_1):
            h0 = 2 if t == Type.Q5_0 else 4
            qh = (b[:, h0] | (b[:, h0 + 1] << 8) | (b[:, h0 + 2] << 16) | (b[:, h0 + 3] << 24))
            lo = lo | (((qh.astype(np.uint32) >> j.astype(np.uint32)) & 1).astype(np.int32) << 4)
        if t in (Type.Q4_0, Type.Q5_0):
            q = lo - (8 if t == Type.Q4_0 else 16)
            return q.astype(_F) * d
        return q_plus_m(lo, d, _f16(blocks, 2))
    if t == Type.Q8_0:
        return blocks[rows, 2 + j].view(np.int8).astype(_F) * _f16(blocks, 0)
    if t in (Type.Q4_K, Type.Q5_K):
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        g, half, l = j // 64, (j % 64) // 32, j % 32
        sc, m = _scale_min(2 * g + half, blocks[:, 4:16])
        qs0 = 16 if t == Type.Q4_K else 48
        byte = b[rows, qs0 + 32 * g + l]
        q = np.where(half == 1, byte >> 4, byte & 0xF)
        if t == Type.Q5_K:
            q = q + (((b[rows, 16 + l] >> (2 * g + half)) & 1) << 4)
        return (d * sc.astype(_F)) * q.astype(_F) - dmin * m.astype(_F)
    if t == Type.Q6_K:
        d = _f16(blocks, 208)
        n, r = j // 128, j % 128
        quarter, l = r // 32, r % 32
        lb = b[rows, 64 * n + l + (quarter & 1) * 32]
        lo = np.where(quarter >= 2, lb >> 4, lb & 0xF)
        hi = (b[rows, 128 + 32 * n + l] >> (2 * quarter)) & 3
        q = (lo | (hi << 4)) - 32
        sc = blocks[rows, 192 + 8 * n + l // 16 + 2 * quarter].view(np.int8).astype(_F)
        return (d * sc) * q.astype(_F)
    raise NotImplementedError(t)


def q_plus_m(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``q*d + m`` in float32, two roundings (the kernels' ``__fadd_rn(__fmul_rn(q, d), m)``)."""
    return q.astype(_F) * d + m


def _at(addr: int, shape, strides, dtype) -> np.ndarray:
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + np.dtype(dtype).itemsize
    raw = (ctypes.c_char * max(span, 1)).from_address(addr)
    return np.ndarray(tuple(shape), dtype, raw, 0, tuple(strides))


def run_dequant(name: str, args: tuple) -> None:
    """Run kernel ``name`` with its launch arguments (arrays as NumPy arrays, ints as np.int64)."""
    t = _BY_NAME[name]
    LAUNCHES[0] += 1
    src, dst, n, ne0, ne1, ne2, nb1, nb2, nb3 = args
    n, ne0, ne1, ne2 = int(n), int(ne0), int(ne1), int(ne2)
    ne3 = n // (ne0 * ne1 * ne2)
    row = t.row_size(ne0)
    x = _at(int(src.ctypes.data), (ne3, ne2, ne1, row), (int(nb3), int(nb2), int(nb1), 1), np.uint8)
    out = _at(int(dst.ctypes.data), (n,), (4,), np.float32)
    blocks = np.ascontiguousarray(x).reshape(-1, t.type_size)
    e = np.arange(n) % ne0
    blk_idx = np.arange(n) // ne0 * (ne0 // t.blck_size) + e // t.blck_size
    with np.errstate(all="ignore"):
        out[:] = emulate_elements(t, blocks[blk_idx], (e % t.blck_size).astype(np.int64))


#: launches of emulated dequantization kernels in this process
LAUNCHES = [0]
