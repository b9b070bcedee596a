"""Byte order of GGUF tensor data: which bytes of a block a big-endian file stores swapped.

A big-endian GGUF file (:class:`~ggmlpy.gguf.reader.GGUFReader` detects one by its version
field) holds its tensors in the layout a big-endian ggml host writes with its native structs:
plain types (F32, F16, BF16, I16, I32, I64, F64) have each element byte-swapped (I8 has nothing
to swap); in a block type's block every multi-byte field is byte-swapped on its own and byte
arrays stay as they are:

=======  ====  ===================================================================
type     size  fields swapped (byte offset in the block: width)
=======  ====  ===================================================================
Q4_0     18    d f16 (0:2)
Q4_1     20    d f16 (0:2), m f16 (2:2)
Q5_0     22    d f16 (0:2), qh as one u32 (2:4) (ggml copies it to and from a uint32_t)
Q5_1     24    d f16 (0:2), m f16 (2:2), qh as one u32 (4:4)
Q8_0     34    d f16 (0:2)
Q4_K     144   d f16 (0:2), dmin f16 (2:2); scales[12] and qs are bytes
Q5_K     176   d f16 (0:2), dmin f16 (2:2); scales[12], qh[32] and qs are bytes
Q6_K     210   d f16 (208:2); ql, qh and the int8 scales are bytes
=======  ====  ===================================================================

This agrees with gguf-py's ``gguf_convert_endian.py`` for the types it converts (Q4_0, Q8_0,
Q4_K, Q6_K, the plain float types). Note that gguf-py's ``GGUFWriter(endianess=BIG)`` swaps the
elements of the NumPy array it is given, which leaves block data (a ``uint8`` array) in the
little-endian layout: such a file is not a valid big-endian file for block types, and this
reader (like a big-endian ggml host) reads its scales swapped.
"""

from __future__ import annotations

import numpy as np

from ggmlpy.core.types import Type

__all__ = ["block_swap_fields", "to_little_endian"]


def block_swap_fields(t: Type) -> tuple[tuple[int, int], ...]:
    """The multi-byte fields of one block of ``t`` that byte order changes.

    Returns:
        ``(byte offset in the block, width in bytes)`` pairs; for a plain type one pair
        ``(0, type_size)`` (empty for 1-byte types). The layouts are in the module docstring.
    """
    t = Type(t)
    if not t.is_quantized:
        return ((0, t.type_size),) if t.type_size > 1 else ()
    return _BLOCK_FIELDS[t]


_BLOCK_FIELDS: dict[Type, tuple[tuple[int, int], ...]] = {
    Type.Q4_0: ((0, 2),),
    Type.Q4_1: ((0, 2), (2, 2)),
    Type.Q5_0: ((0, 2), (2, 4)),
    Type.Q5_1: ((0, 2), (2, 2), (4, 4)),
    Type.Q8_0: ((0, 2),),
    Type.Q4_K: ((0, 2), (2, 2)),
    Type.Q5_K: ((0, 2), (2, 2)),
    Type.Q6_K: ((208, 2),),
}


def to_little_endian(raw: np.ndarray, t: Type, order: str) -> np.ndarray:
    """1-D uint8 ``raw`` (whole blocks of ``t`` in byte order ``order``, ``"<"`` or ``">"``) in
    ggml's little-endian layout: ``raw`` itself when nothing is to swap, else a swapped copy."""
    fields = block_swap_fields(t)
    if order == "<" or not fields or not len(raw):
        return raw
    blocks = np.array(raw).reshape(-1, t.type_size)
    for start, width in fields:
        f = blocks[:, start:start + width]
        f[...] = f[:, ::-1].copy()
    return blocks.reshape(-1)
