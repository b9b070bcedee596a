"""Dequantization on the CUDA device: one ``cupy.RawKernel`` per block type turns rows of blocks
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) into float32 in device memory, so MUL_MAT and
GET_ROWS on the CuPy backend never move a weight through the host (ggml-cuda's ``dequantize_*``
/ ``convert.cu`` do the same job before cuBLAS).

Maths: each element is computed as ggml's reference ``dequantize_row_*`` computes it, with
explicit round-to-nearest float32 operations (``__fmul_rn``/``__fadd_rn``/``__fsub_rn``) so the
compiler cannot contract ``d*q - m`` into an FMA: the result is bit-identical to
:func:`ggmlpy.dequantize` (gguf-py), which ``tests/fake_cupy_quant.py`` checks through a NumPy
emulation written from these same formulas (the sources themselves are compile-checked with NVRTC
or nvcc without a GPU, ``tests/test_cuda_quant.py``). f16 scales are decoded by hand (exact).

Launch: one thread per output element (grid-stride loop, 256 threads per block); the source is a
4-D view of uint8 rows ``(ne3, ne2, ne1, row_bytes)`` with any row strides; the output is a new
C-contiguous float32 array ``(ne3, ne2, ne1, ne0)`` on the current device, enqueued on the current
stream (asynchronous).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ggmlpy.core.types import Type

__all__ = ["SOURCES", "ALL_SOURCE", "KERNEL_NAMES", "dequantize_rows", "kernel_name"]

_BLOCK = 256
_MAX_GRID = 65535 * 8

_HEADER = r"""
typedef long long i64;
typedef unsigned char u8;
__device__ __forceinline__ unsigned int ld_u16(const u8* p) { return p[0] | (p[1] << 8); }
__device__ __forceinline__ unsigned int ld_u32(const u8* p) {
    return p[0] | (p[1] << 8) | (p[2] << 16) | ((unsigned int)p[3] << 24);
}
__device__ __forceinline__ float ld_f16(const u8* p) {
    const unsigned int h = ld_u16(p);
    const unsigned int s = (h >> 15) & 1u, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float v;
    if (e == 0u) v = ldexpf((float)m, -24);
    else if (e == 31u) v = m ? __int_as_float(0x7fc00000) : __int_as_float(0x7f800000);
    else v = ldexpf((float)(m | 0x400u), (int)e - 25);
    return s ? -v : v;
}
/* ggml's get_scale_min_k4: 6-bit scale and min number j (0..7) of a K-quant block */
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) { *sc = q[j] & 63; *m = q[j + 4] & 63; }
    else { *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}
"""

# per type: (block size, bytes per block, body computing float y from block pointer b, element j)
_BODIES: dict[Type, str] = {
    Type.Q4_0: r"""
    const float d = ld_f16(b);
    const int q = (j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4)) - 8;
    y = __fmul_rn((float)q, d);""",
    Type.Q4_1: r"""
    const float d = ld_f16(b), m = ld_f16(b + 2);
    const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
    y = __fadd_rn(__fmul_rn((float)q, d), m);""",
    Type.Q5_0: r"""
    const float d = ld_f16(b);
    const unsigned int qh = ld_u32(b + 2);
    const int lo = j < 16 ? (b[6 + j] & 0xF) : (b[6 + j - 16] >> 4);
    const int q = (lo | (((qh >> j) & 1u) << 4)) - 16;
    y = __fmul_rn((float)q, d);""",
    Type.Q5_1: r"""
    const float d = ld_f16(b), m = ld_f16(b + 2);
    const unsigned int qh = ld_u32(b + 4);
    const int lo = j < 16 ? (b[8 + j] & 0xF) : (b[8 + j - 16] >> 4);
    const int q = lo | (((qh >> j) & 1u) << 4);
    y = __fadd_rn(__fmul_rn((float)q, d), m);""",
    Type.Q8_0: r"""
    const float d = ld_f16(b);
    y = __fmul_rn((float)(signed char)b[2 + j], d);""",
    Type.Q4_K: r"""
    const float d = ld_f16(b), dmin = ld_f16(b + 2);
    const int g = j / 64, half = (j % 64) / 32, l = j % 32;
    int sc, m; scale_min_k4(2 * g + half, b + 4, &sc, &m);
    const u8 byte = b[16 + 32 * g + l];
    const int q = half ? (byte >> 4) : (byte & 0xF);
    y = __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)q), __fmul_rn(dmin, (float)m));""",
    Type.Q5_K: r"""
    const float d = ld_f16(b), dmin = ld_f16(b + 2);
    const int g = j / 64, half = (j % 64) / 32, l = j % 32;
    int sc, m; scale_min_k4(2 * g + half, b + 4, &sc, &m);
    const u8 byte = b[48 + 32 * g + l];
    const int q = (half ? (byte >> 4) : (byte & 0xF)) + (((b[16 + l] >> (2 * g + half)) & 1) << 4);
    y = __fsub_rn(__fmul_rn(__fmul_rn(d, (float)sc), (float)q), __fmul_rn(dmin, (float)m));""",
    Type.Q6_K: r"""
    const float d = ld_f16(b + 208);
    const int n = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
    const u8 lb = b[64 * n + l + (quarter & 1) * 32];
    const int lo = quarter >= 2 ? (lb >> 4) : (lb & 0xF);
    const int hi = (b[128 + 32 * n + l] >> (2 * quarter)) & 3;
    const int q = (lo | (hi << 4)) - 32;
    const float sc = (float)(signed char)b[192 + 8 * n + l / 16 + 2 * quarter];
    y = __fmul_rn(__fmul_rn(d, sc), (float)q);""",
}

_TEMPLATE = r"""
extern "C" __global__ void NAME(
        const u8* src, float* dst, const i64 n, const i64 ne0, const i64 ne1, const i64 ne2,
        const i64 nb1, const i64 nb2, const i64 nb3) {
    for (i64 i = (i64)blockIdx.x*blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x*blockDim.x) {
        const i64 e = i % ne0; i64 row = i / ne0;
        const i64 i1 = row % ne1; row /= ne1;
        const i64 i2 = row % ne2; const i64 i3 = row / ne2;
        const u8* b = src + i1*nb1 + i2*nb2 + i3*nb3 + (e / BS) * TS;
        const int j = (int)(e % BS);
        float y;BODY
        dst[i] = y;
    }
}
"""


def kernel_name(t: Type) -> str:
    """The CUDA kernel name dequantizing type ``t`` (``ggmlpy_dequant_q4_0``, ...)."""
    return f"ggmlpy_dequant_{t.type_name}"


def _source(t: Type) -> str:
    body = _BODIES[t]
    return _HEADER + (_TEMPLATE.replace("NAME", kernel_name(t)).replace("BS", str(t.blck_size))
                      .replace("TS", str(t.type_size)).replace("BODY", body))


#: CUDA C source of each kernel (each one a complete translation unit), by kernel name
SOURCES: dict[str, str] = {kernel_name(t): _source(t) for t in _BODIES}
#: kernel names by type
KERNEL_NAMES: dict[Type, str] = {t: kernel_name(t) for t in _BODIES}
#: every kernel in one translation unit (what CI compiles in one compiler run)
ALL_SOURCE: str = _HEADER + "".join(
    _TEMPLATE.replace("NAME", kernel_name(t)).replace("BS", str(t.blck_size))
    .replace("TS", str(t.type_size)).replace("BODY", _BODIES[t]) for t in _BODIES)

_cache: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()


def _kernel(xp: Any, name: str) -> Any:
    key = (id(xp), name)
    k = _cache.get(key)
    if k is None:
        with _lock:
            k = _cache.get(key)
            if k is None:
                k = xp.RawKernel(SOURCES[name], name)
                _cache[key] = k
    return k


def dequantize_rows(xp: Any, t: Type, x: Any, ne0: int) -> Any:
    """Dequantize rows of type ``t`` on the device.

    Args:
        xp: ``cupy`` (or a stand-in with ``RawKernel``, ``empty``).
        t: a block type with a kernel (:data:`KERNEL_NAMES`).
        x: uint8 device array of 1 to 4 dims, the last one a row's bytes
            (``row_size(t, ne0)``, contiguous); the others any strides.
        ne0: elements per row.

    Returns:
        A new C-contiguous float32 device array of shape ``x.shape[:-1] + (ne0,)``; the kernel is
        enqueued on the current stream.

    Raises:
        ValueError: ``t`` has no kernel, ``x`` is not uint8 rows of ``t``, or rows are not
            contiguous.
    """
    name = KERNEL_NAMES.get(t)
    if name is None:
        raise ValueError(f"dequantize_rows: no device dequantizer for {t.type_name}")
    if x.dtype != np.uint8 or x.shape[-1] != t.row_size(ne0) or (x.shape[-1] > 1 and x.strides[-1] != 1):
        raise ValueError(f"dequantize_rows: expected uint8 rows of {t.row_size(ne0)} contiguous "
                         f"bytes for {t.type_name}, got shape {x.shape} strides {x.strides}")
    if x.ndim > 4:
        raise ValueError(f"dequantize_rows: at most 4 dims, got {x.ndim}")
    lead = x.shape[:-1]
    shape4 = (1,) * (4 - x.ndim) + tuple(lead)
    strides4 = (0,) * (4 - x.ndim) + tuple(x.strides[:-1])
    out = xp.empty(tuple(lead) + (ne0,), dtype=np.float32)
    n = int(np.prod(shape4, dtype=np.int64)) * ne0
    if n == 0:
        return out
    grid = min((n + _BLOCK - 1) // _BLOCK, _MAX_GRID)
    i64 = np.int64
    _kernel(xp, name)((grid,), (_BLOCK,), (x, out, i64(n), i64(ne0), i64(shape4[2]),
                                          i64(shape4[1]), i64(strides4[2]), i64(strides4[1]),
                                          i64(strides4[0])))
    return out
