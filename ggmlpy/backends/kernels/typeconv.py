"""Type conversion inside kernels: rows of F16, BF16 and block-quantized tensors to float32 and
back, over an array module ``xp`` (ggml's ``to_float`` / ``from_float`` type traits).

Array forms (what the runtimes' ``_array`` hooks give the kernels):

* F32 / F16: arrays of ``float32`` / ``float16``, NumPy shape ``ne[::-1]``.
* BF16: ``ml_dtypes.bfloat16`` on NumPy, ``uint16`` on CuPy (CuPy has no bfloat16 dtype); both
  hold the top 16 bits of a float32 and are read through :func:`bf16_bits`.
* Block-quantized types: raw ``uint8`` rows, shape ``(ne3, ne2, ne1, row_bytes)`` with
  ``row_bytes = ne0 / blck_size * type_size``; every row must be contiguous (``nb0`` = one block),
  as ggml requires of quantized operands.

Where the work runs:

* NumPy (CPU and SIM): dequantization by :func:`ggmlpy.backends.cpu.qgemm.dequantize_rows`
  (compiled per block type with the ``jit`` extra, else gguf-py's dequantizers in cache-sized
  chunks; bit-identical to :func:`ggmlpy.quants.dequantize` either way); quantization through
  :mod:`ggmlpy.quants` (gguf-py's quantizers, the own K-quant ones), bit-exact with ggml's
  reference code.
* CuPy: dequantization on the device with the RawKernels of :mod:`ggmlpy.backends.cuda.quant`
  (never through host memory). Quantizing (CPY into a block type) is host-only: the CuPy support
  predicates refuse it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.backends.kernels.common import F32, is_numpy
from ggmlpy.core.types import Type

__all__ = ["FLOAT_TYPES", "QUANT_TYPES", "CONVERTIBLE", "ROW_BLOCK_ELEMS", "MIN_BLOCK_ROWS",
           "block_rows", "bf16_bits",
           "to_f32", "from_f32", "rows_ok", "host_quantizable"]

#: element types with a per-element dtype that the conversion kernels read and write
FLOAT_TYPES = (Type.F32, Type.F16, Type.BF16)
#: block-quantized types with a dequantizer (every one ggmlpy knows)
QUANT_TYPES = (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K,
               Type.Q6_K)
#: every type :func:`to_f32` reads and :func:`from_f32` writes (the latter: quantized on NumPy only)
CONVERTIBLE = FLOAT_TYPES + QUANT_TYPES

#: float32 elements of weight per MUL_MAT block (512K = 2 MiB, one core's L2 here): each block is
#: dequantized into one tile, then multiplied with one GEMM. Blocks are as large as this because a
#: GEMM writing a thin column slice of dst is slow (a few hundred columns cost up to several times
#: one full F32 GEMM; ``scripts/bench_quant.py`` measures it).
ROW_BLOCK_ELEMS = 1 << 19
#: fewest weight rows per MUL_MAT block (see :data:`ROW_BLOCK_ELEMS`)
MIN_BLOCK_ROWS = 256


def block_rows(M: int, K: int) -> int:
    """Rows of an ``M x K`` weight per MUL_MAT block: ``per = max(MIN_BLOCK_ROWS,
    ROW_BLOCK_ELEMS // K)`` rounded so the blocks are balanced and none is thinner than ``per``
    (``floor(M / per)`` blocks of ``ceil(M / n)`` rows; so between ``per`` and ``2 * per`` rows).
    A weight of fewer than ``2 * per`` rows is one block (MiniLM's 384 x 1536 matrices: 2.4 MB of
    float32, still dequantized in cache-sized chunks)."""
    per = max(MIN_BLOCK_ROWS, ROW_BLOCK_ELEMS // max(K, 1))
    n_blocks = max(1, M // per)
    return max(1, -(-M // n_blocks))


def host_quantizable(t: Type, xp: Any) -> bool:
    """Whether :func:`from_f32` can write type ``t`` with array module ``xp`` (block types: NumPy only)."""
    if t in FLOAT_TYPES:
        return True
    return t in QUANT_TYPES and is_numpy(xp)


def rows_ok(t: Any) -> bool:
    """True when a tensor of a block type has contiguous rows of whole blocks (``nb0`` = one block
    and ``ne0`` a multiple of the block size), as the dequantizers need; always True for
    per-element types. ``t`` is a :class:`~ggmlpy.core.tensor.Tensor`."""
    ty = t.type
    if not ty.is_quantized:
        return True
    return t.ne[0] % ty.blck_size == 0 and t.nb[0] == ty.type_size


def bf16_bits(xp: Any, x: Any) -> Any:
    """The uint16 bit patterns of a BF16 array (a view, no copy)."""
    return x.view(np.uint16) if x.dtype != np.uint16 else x


def _bf16_to_f32(xp: Any, x: Any) -> Any:
    u = bf16_bits(xp, x).astype(np.uint32)
    return (u << np.uint32(16)).view(F32)


def _f32_to_bf16_bits(xp: Any, x: Any) -> Any:
    """ggml's ``GGML_FP32_TO_BF16`` on an array: round to nearest even, NaN kept and made quiet."""
    u = xp.ascontiguousarray(x, dtype=F32).view(np.uint32)
    r = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16))
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    q = (u >> np.uint32(16)) | np.uint32(64)
    return xp.where(nan, q, r).astype(np.uint16)


def to_f32(xp: Any, t: Type, x: Any, ne0: int) -> Any:
    """Values of ``x`` (a tensor's array of type ``t``, form as in the module docstring) as float32.

    Args:
        xp: ``numpy`` or ``cupy``.
        t: the tensor's type (one of :data:`CONVERTIBLE`).
        x: the array; block types: uint8 rows ``(..., row_bytes)``.
        ne0: elements per row (used for block types).

    Returns:
        float32 array of shape ``x.shape`` (per-element types; ``x`` itself when already float32)
        or ``x.shape[:-1] + (ne0,)`` (block types). Synchronous on NumPy; on CuPy enqueued on the
        current stream.

    Raises:
        ValueError: ``t`` is not convertible.
    """
    if t == Type.F32:
        return x
    if t == Type.F16:
        return x.astype(F32)
    if t == Type.BF16:
        return _bf16_to_f32(xp, x)
    if t not in QUANT_TYPES:
        raise ValueError(f"to_f32: type {t.type_name} has no float conversion")
    if not is_numpy(xp):
        from ggmlpy.backends.cuda import quant as cuda_quant  # noqa: PLC0415 - device path only
        return cuda_quant.dequantize_rows(xp, t, x, ne0)
    return _host_dequantize(t, x, ne0)


def _host_dequantize(t: Type, x: np.ndarray, ne0: int) -> np.ndarray:
    from ggmlpy.backends.cpu.qgemm import dequantize_rows  # noqa: PLC0415 - host path only

    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
    out = dequantize_rows(t, rows)
    return out.reshape(*lead, ne0)


def from_f32(xp: Any, t: Type, x: Any) -> Any:
    """float32 values ``x`` (NumPy shape ``ne[::-1]``) in type ``t``'s array form, rounded as ggml
    rounds: F16 round-to-nearest-even, BF16 ``GGML_FP32_TO_BF16``, block types with ggml's
    reference quantizers (``quantize_row_*_ref``, bit-exact; NumPy only).

    Returns:
        F32: ``x``; F16: float16 array; BF16: uint16 bit patterns (view them as the destination's
        dtype); block types: uint8 rows ``x.shape[:-1] + (row_bytes,)``.

    Raises:
        ValueError: a block type on CuPy, or NaN/inf given to a block type (ggml writes
            unspecified bytes there; ggmlpy refuses).
    """
    if t == Type.F32:
        return x
    if t == Type.F16:
        return x.astype(np.float16)
    if t == Type.BF16:
        return _f32_to_bf16_bits(xp, x)
    if not is_numpy(xp):
        raise ValueError(f"from_f32: quantizing to {t.type_name} runs on the host only")
    from ggmlpy.quants import quantize  # noqa: PLC0415

    return quantize(x, t)
