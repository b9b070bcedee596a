"""Quantize and dequantize ggml's types: ``quantize(array, type)`` and ``dequantize(data, type, ne)``.

Bit-exact with ggml's reference code (``quantize_row_*_ref`` and ``dequantize_row_*`` in
ggml-quants.c, ``GGML_FP32_TO_BF16``/``GGML_FP32_TO_FP16`` in ggml-impl.h), held by tests against
vectors generated from ggml's C code (tests/data/README.md). Where each direction comes from:

==============================  ===================================  ==========================
type                            quantize                              dequantize
==============================  ===================================  ==========================
F32, F64                        NumPy cast                           NumPy cast
F16                             :func:`fp32_to_fp16` (ggml's rule)   NumPy cast
BF16                            :func:`fp32_to_bf16` (ggml's rule)   shift into a float32
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0    ``gguf.quants`` (gguf-py)            ``gguf.quants``
Q4_K, Q5_K, Q6_K                :mod:`.kquants` (written here)       ``gguf.quants``
==============================  ===================================  ==========================

All paths are vectorized over blocks (no Python loop per block). ``gguf`` is the optional
``[gguf]`` extra; the block types raise ImportError naming it when it is missing.

NaN policy: ggml's block quantizers give unspecified bytes for non-finite input (their max/min
scans compare with NaN), so :func:`quantize` refuses NaN and +-inf for the block types with a
ValueError instead of writing silently wrong blocks. F16/BF16 conversion keeps NaN and inf as
ggml does (F16: every NaN becomes +-0x7E00; BF16: NaN made quiet by setting bit 6).

Range policy: ggml's quantizers write blocks that do not decode to the input without a word: a
block whose f16 scale overflows (about 5e5 for Q4_0, 8e6 for Q8_0, 4e7-3e8 for the K-quants)
decodes to inf/NaN, and from about 1e15 on Q6_K's search sums overflow and it writes the all-zero
block. :func:`quantize` refuses both with a ValueError naming the first such block: every output
block must pass ggml's ``ggml_validate_row_data`` (:mod:`.validate`), and no input may exceed the
largest magnitude the type decodes to (:data:`~ggmlpy.quants.validate.MAX_DECODABLE`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ggmlpy.core.types import Type, bf16_dtype
from ggmlpy.quants import kquants
from ggmlpy.quants.legacy import GGUF_QUANTIZE, gguf_dequantize_blocks, gguf_quantize_blocks
from ggmlpy.quants.validate import MAX_DECODABLE, first_invalid_block, first_unrepresentable_block

__all__ = ["quantize", "dequantize", "fp32_to_fp16", "fp32_to_bf16", "QUANTIZABLE"]

_OWN_QUANTIZE = {Type.Q4_K: kquants.quantize_q4_k, Type.Q5_K: kquants.quantize_q5_k,
                 Type.Q6_K: kquants.quantize_q6_k}
_PLAIN = (Type.F32, Type.F16, Type.BF16, Type.F64)
#: every type :func:`quantize` and :func:`dequantize` accept
QUANTIZABLE = frozenset(_PLAIN) | GGUF_QUANTIZE | frozenset(_OWN_QUANTIZE)
# elements per chunk: keeps every temporary in cache (measured best of 4K..256K on 1024x1024:
# 16K gives 2-3x the throughput of 256K for both gguf-py's code and the K-quant quantizers)
_CHUNK_ELEMS = 1 << 14


def _check_type(type: Any, what: str) -> Type:
    try:
        t = Type(type)
    except (ValueError, TypeError):
        raise TypeError(f"{what}: type must be a ggmlpy.Type, got {type!r}") from None
    if t not in QUANTIZABLE:
        raise ValueError(f"{what}: type {t.type_name} is not a float or block-quantized type "
                         f"(supported: {', '.join(sorted(x.type_name for x in QUANTIZABLE))})")
    return t


def fp32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 with ggml's rule (``GGML_FP32_TO_BF16``): round to nearest even,
    NaN kept and made quiet (bit 6 set). Same shape; dtype ``ml_dtypes.bfloat16``."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    r = np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)
    return r.view(bf16_dtype())


def fp32_to_fp16(x: np.ndarray) -> np.ndarray:
    """float32 -> IEEE half with ggml's rule (``GGML_FP32_TO_FP16``): round to nearest even,
    overflow to inf, every NaN becomes the canonical quiet NaN 0x7E00 with the input's sign.
    Same shape; dtype float16."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        sign = (x.view(np.uint32) >> 16).astype(np.uint16) & np.uint16(0x8000)
        h = np.where(nan, sign | np.uint16(0x7E00), h).astype(np.uint16)
    return h.view(np.float16)


def quantize(array: Any, type: Type) -> np.ndarray:
    """Convert float values to ``type``'s bytes (mirrors ``ggml_quantize_chunk`` without imatrix,
    i.e. the ``quantize_row_*_ref`` quantizers, and ggml's F16/BF16 conversions).

    Args:
        array: float values (anything ``np.asarray`` takes; converted to float32 first, except for
            F64, which stores them as given), NumPy
            shape ``ne[::-1]`` with at least one dimension: the last axis is the row, ``ne[0]``
            elements long, and must be a multiple of ``type.blck_size`` (32 for Q4_0..Q8_0, 256
            for Q4_K/Q5_K/Q6_K).
        type: F32, F16, BF16, F64 or a block type (:data:`QUANTIZABLE`).

    Returns:
        A C-contiguous ``uint8`` array of shape ``array.shape[:-1] + (row_size(type, ne[0]),)``:
        each row's bytes in ggml's layout (``.tobytes()`` gives a tensor's data). Synchronous,
        host memory.

    Raises:
        TypeError: ``type`` is not a :class:`~ggmlpy.Type`; ``array`` is not numeric.
        ValueError: ``type`` is an integer type; a 0-d array; ``ne[0]`` not a multiple of the
            block size; NaN or inf given to a block type (see the module's NaN policy); a block
            the type cannot hold (see the module's range policy; the message names the row and
            the block).
        ImportError: a block type without the ``gguf`` package.
    """
    t = _check_type(type, "quantize")
    a = np.asarray(array)
    if a.dtype.kind not in "fiub" and a.dtype.name != "bfloat16":
        raise TypeError(f"quantize: array of dtype {a.dtype} is not numeric")
    if a.ndim == 0:
        raise ValueError("quantize: array must have at least one dimension (ne[0] = last axis)")
    ne0 = a.shape[-1]
    rows_shape = a.shape[:-1]
    if t == Type.F64:  # straight from the input: no float32 round trip (values past float32 stay)
        return np.ascontiguousarray(a, dtype=np.float64).view(np.uint8).reshape(*rows_shape, ne0 * 8)
    x = np.ascontiguousarray(a, dtype=np.float32)
    if t == Type.F32:
        return x.view(np.uint8).reshape(*rows_shape, ne0 * 4)
    if t == Type.F16:
        return fp32_to_fp16(x).view(np.uint8).reshape(*rows_shape, ne0 * 2)
    if t == Type.BF16:
        return fp32_to_bf16(x).view(np.uint8).reshape(*rows_shape, ne0 * 2)
    bs = t.blck_size
    if ne0 % bs:
        raise ValueError(f"quantize: ne[0] = {ne0} (the array's last axis) is not a multiple of "
                         f"the block size {bs} of {t.type_name}")
    if not np.isfinite(x).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
        raise ValueError(f"quantize: non-finite value {x[bad]} at index {bad} "
                         f"cannot be quantized to {t.type_name}")
    blocks = x.reshape(-1, bs)
    out = np.empty((blocks.shape[0], t.type_size), np.uint8)
    step = max(1, _CHUNK_ELEMS // bs)
    fn = _OWN_QUANTIZE.get(t)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # refused just below
        for i in range(0, blocks.shape[0], step):
            chunk = blocks[i:i + step]
            out[i:i + step] = fn(chunk) if fn is not None else gguf_quantize_blocks(chunk, t)
    _check_blocks(t, blocks, out, ne0)
    return out.reshape(*rows_shape, ne0 // bs * t.type_size)


def _check_blocks(t: Type, blocks: np.ndarray, out: np.ndarray, ne0: int) -> None:
    """Refuse blocks that would not decode to what was given: a value past
    :data:`~ggmlpy.quants.validate.MAX_DECODABLE` (no finite block holds it) or a block whose f16
    scale overflowed (``ggml_validate_row_data`` would reject it; it decodes to inf/NaN)."""
    big = first_unrepresentable_block(t, blocks)
    bad = first_invalid_block(t, out)
    if big is None and bad is None:
        return
    i = min(b for b in (big, bad) if b is not None)
    per_row = ne0 // t.blck_size
    amax = float(np.max(np.abs(blocks[i])))
    if i == big:
        why = f"the largest magnitude a {t.type_name} block holds is {MAX_DECODABLE[t]:g}"
    else:
        why = "its f16 scale overflows to inf, so the block would decode to inf/NaN"
    raise ValueError(f"quantize: block {i % per_row} of row {i // per_row} (flat block {i}, "
                     f"largest |x| = {amax:g}) cannot be stored as {t.type_name}: {why}")


def _as_bytes(data: Any) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    raise TypeError(f"dequantize: data must be bytes, bytearray, memoryview or a NumPy array, "
                    f"got {data.__class__.__name__}")


def dequantize(data: Any, type: Type, ne: Sequence[int]) -> np.ndarray:
    """Decode ``type``'s bytes to float32 (mirrors ggml's ``to_float`` type traits:
    ``dequantize_row_*``, ``ggml_fp16_to_fp32_row``, ``ggml_bf16_to_fp32_row``).

    Args:
        data: the tensor's bytes, contiguous rows (bytes-like or a NumPy array of any dtype, read
            as its raw bytes; a memmap is read without a copy of the whole input).
        type: F32, F16, BF16, F64 or a block type (:data:`QUANTIZABLE`).
        ne: ggml shape, ``ne[0]`` innermost (elements, not bytes), 1 to 4 non-negative ints;
            ``ne[0]`` must be a multiple of ``type.blck_size``.

    Returns:
        A new float32 array of NumPy shape ``ne[::-1]``. Synchronous, host memory.

    Raises:
        TypeError: wrong argument types.
        ValueError: bad ``ne``; ``ne[0]`` not a multiple of the block size; ``data`` is not exactly
            ``row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]`` bytes.
        ImportError: a block type without the ``gguf`` package.
    """
    t = _check_type(type, "dequantize")
    if isinstance(ne, (int, np.integer)) or not all(isinstance(n, (int, np.integer)) for n in ne):
        raise TypeError(f"dequantize: ne must be a sequence of ints, got {ne!r}")
    ne = [int(n) for n in ne]
    if not 1 <= len(ne) <= 4 or min(ne) < 0:
        raise ValueError(f"dequantize: ne = {ne} must be 1 to 4 non-negative ints")
    bs = t.blck_size
    if ne[0] % bs:
        raise ValueError(f"dequantize: ne[0] = {ne[0]} is not a multiple of the block size {bs} "
                         f"of {t.type_name}")
    raw = _as_bytes(data)
    nrows = int(np.prod(ne[1:], dtype=np.int64))
    want = t.row_size(ne[0]) * nrows
    if raw.size != want:
        raise ValueError(f"dequantize: {raw.size} bytes given, {t.type_name} of ne = {ne} takes "
                         f"{want} bytes")
    shape = tuple(ne[::-1])
    if t == Type.F32:
        return raw.view(np.float32).reshape(shape).copy()
    if t in (Type.F16, Type.F64):
        return raw.view(t.dtype).astype(np.float32).reshape(shape)
    if t == Type.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    blocks = raw.reshape(-1, t.type_size)
    out = np.empty((blocks.shape[0], bs), np.float32)
    step = max(1, _CHUNK_ELEMS // bs)
    for i in range(0, blocks.shape[0], step):
        out[i:i + step] = gguf_dequantize_blocks(blocks[i:i + step], t)
    return out.reshape(shape)
