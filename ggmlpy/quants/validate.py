"""Do a tensor's bytes decode to finite values? ggml's ``ggml_validate_row_data`` (ggml-quants.c).

ggml validates a block type by its f16 scale fields: a block decodes to finite values exactly
when its ``d`` (and ``m``/``dmin``) are finite, because the quants are bounded integers and the
largest finite scale times the largest quant stays far inside float32. Float types are validated
per element. One vectorised function per family:

=======================================  =========================================
types                                    what must be finite (f16 at byte offset)
=======================================  =========================================
Q4_0, Q5_0, Q8_0                         ``d`` at 0
Q6_K                                     ``d`` at 208 (after ``ql``, ``qh``, ``scales``)
Q4_1, Q5_1, Q4_K, Q5_K                   ``d`` at 0 and ``m``/``dmin`` at 2
F32, F16, BF16, F64                      every element
=======================================  =========================================

:data:`MAX_DECODABLE` is the other half of "no silent wrong results" on the quantize side: the
largest magnitude any finite block of a type decodes to. An input beyond it cannot be held by the
type at all, even where ggml's search degenerates to a finite block (Q6_K of values from about
1e15 on gives the all-zero block; ggml writes it without a word).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.core.types import Type

__all__ = ["first_invalid_block", "MAX_DECODABLE", "first_unrepresentable_block"]

_F16_MAX = 65504.0
#: f16 scale fields per block type: (byte offsets of each f16 field within the block)
_SCALE_FIELDS: dict[Type, tuple[int, ...]] = {
    Type.Q4_0: (0,), Type.Q5_0: (0,), Type.Q8_0: (0,), Type.Q6_K: (208,),
    Type.Q4_1: (0, 2), Type.Q5_1: (0, 2), Type.Q4_K: (0, 2), Type.Q5_K: (0, 2),
}
#: the largest |value| a block with finite scales decodes to (``dequantize_row_*`` with every
#: scale at the f16 maximum 65504 and the extreme quant): Q4_0 d*(-8), Q5_0 d*(-16), Q8_0
#: d*(-128), Q4_1 m + 15 d, Q5_1 m + 31 d, Q4_K d*63*15 + dmin*63, Q5_K d*63*31 + dmin*63,
#: Q6_K d*(-128)*(-32)
MAX_DECODABLE: dict[Type, float] = {
    Type.Q4_0: 8 * _F16_MAX, Type.Q5_0: 16 * _F16_MAX, Type.Q8_0: 128 * _F16_MAX,
    Type.Q4_1: 16 * _F16_MAX, Type.Q5_1: 32 * _F16_MAX,
    Type.Q4_K: 63 * 16 * _F16_MAX, Type.Q5_K: 63 * 32 * _F16_MAX, Type.Q6_K: 128 * 32 * _F16_MAX,
}
_CHUNK_BYTES = 1 << 24


def _raw(data: Any) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    raise TypeError(f"validate: data must be bytes-like or a NumPy array, got {type(data).__name__}")


def _first_bad_scale(raw: np.ndarray, type_size: int, offsets: tuple[int, ...]) -> int | None:
    """Block family with f16 scales: first block whose scale field has exponent bits all ones."""
    blocks = raw.reshape(-1, type_size)
    step = max(1, _CHUNK_BYTES // type_size)
    for i in range(0, blocks.shape[0], step):
        chunk = blocks[i:i + step]
        bad = np.zeros(chunk.shape[0], bool)
        for off in offsets:
            bits = chunk[:, off].astype(np.uint16) | (chunk[:, off + 1].astype(np.uint16) << 8)
            bad |= (bits & 0x7C00) == 0x7C00
        if bad.any():
            return i + int(np.argmax(bad))
    return None


def _first_bad_float(raw: np.ndarray, type: Type) -> int | None:
    """Float family: first element that is inf or NaN (BF16 read as its upper float32 half)."""
    if type == Type.BF16:
        vals: np.ndarray = raw.view(np.uint16)
    else:
        vals = raw.view(type.dtype)
    step = max(1, _CHUNK_BYTES // type.type_size)
    for i in range(0, vals.size, step):
        chunk = vals[i:i + step]
        if type == Type.BF16:
            bad = (chunk & 0x7F80) == 0x7F80
        else:
            bad = ~np.isfinite(chunk)
        if bad.any():
            return i + int(np.argmax(bad))
    return None


def first_invalid_block(type: Type, data: Any) -> int | None:
    """The index of the first block (element, for float types) that does not decode to finite
    values, or None when all do (mirrors ``ggml_validate_row_data``, which prints the same block
    index and returns false).

    Args:
        type: a float type (F32, F16, BF16, F64) or one of the block types of :data:`MAX_DECODABLE`.
            Integer types have nothing to validate (None).
        data: the tensor's bytes (bytes-like or a NumPy array read as its raw bytes); a whole
            number of blocks. Read in chunks of 16 MiB, so a memmap is not read in one piece.

    Returns:
        A block index (blocks of ``type.blck_size`` elements, ``type.type_size`` bytes) counted
        from the start of ``data``, or None. Synchronous, host memory.

    Raises:
        TypeError: ``data`` is not bytes-like or an array.
        ValueError: ``data`` is not a whole number of blocks; ``type`` is a block type without a
            validator here.
    """
    t = Type(type)
    raw = _raw(data)
    if raw.size % t.type_size:
        raise ValueError(f"validate: {raw.size} bytes are not a whole number of {t.type_name} "
                         f"blocks ({t.type_size} bytes each)")
    if t in _SCALE_FIELDS:
        return _first_bad_scale(raw, t.type_size, _SCALE_FIELDS[t])
    if t in (Type.F32, Type.F16, Type.BF16, Type.F64):
        return _first_bad_float(raw, t)
    if t.blck_size == 1:
        return None
    raise ValueError(f"validate: no validator for block type {t.type_name}")


def first_unrepresentable_block(type: Type, x: np.ndarray) -> int | None:
    """The first block of float input ``x`` holding a value larger in magnitude than any finite
    block of ``type`` decodes to (:data:`MAX_DECODABLE`), or None.

    Args:
        type: a block type of :data:`MAX_DECODABLE`.
        x: finite float32, shape (nblocks, blck_size).

    Returns:
        A block index, or None. Synchronous.
    """
    amax = np.max(np.abs(x), axis=1) if x.size else np.zeros(0, np.float32)
    bad = amax > np.float32(MAX_DECODABLE[Type(type)])
    return int(np.argmax(bad)) if bad.any() else None
