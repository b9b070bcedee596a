"""Element types: ggml's ``ggml_type`` with block size, bytes per block and NumPy dtype.

Mirrors ``ggml_type``, ``ggml_blck_size``, ``ggml_type_size``, ``ggml_row_size``,
``ggml_type_name`` and ``ggml_is_quantized``. The numeric ids are ggml's (and GGUF's), so files
and op_params that store a type id read across unchanged.

Types and byte layouts (one block; all little-endian; ``f16`` = IEEE half):

=======  ====  =====  ===========================================================================
type     blck  bytes  layout of one block
=======  ====  =====  ===========================================================================
F32      1     4      float32
F16      1     2      IEEE half (``np.float16``)
BF16     1     2      bfloat16, the top 16 bits of a float32 (``ml_dtypes.bfloat16``, imported
                      the first time a BF16 dtype is asked for: :func:`bf16_dtype`)
Q4_0     32    18     d f16; qs[16]: element i in low nibble of qs[i], i+16 in the high nibble;
                      x = d * (q - 8)
Q4_1     32    20     d f16, m f16; qs[16] as Q4_0; x = d * q + m
Q5_0     32    22     d f16; qh[4] (uint32, bit i = fifth bit of element i); qs[16] as Q4_0;
                      x = d * (q - 16)
Q5_1     32    24     d f16, m f16; qh[4]; qs[16]; x = d * q + m
Q8_0     32    34     d f16; qs[32] int8; x = d * q
Q4_K     256   144    d f16, dmin f16, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128]
Q5_K     256   176    d f16, dmin f16, scales[12], qh[32], qs[128]
Q6_K     256   210    ql[128], qh[64], scales[16] int8, d f16
I8..I64  1     1..8   signed integers; F64 float64
=======  ====  =====  ===========================================================================

Quantizing and dequantizing these layouts lives in :mod:`ggmlpy.quants`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import cache

import numpy as np

from ggmlpy.core.check import checked_args

__all__ = ["Type", "TypeTraits", "row_size", "type_from_dtype", "type_from_name", "bf16_dtype"]


@cache
def bf16_dtype() -> np.dtype:
    """NumPy dtype of a BF16 element (``ml_dtypes.bfloat16``, the dtype JAX uses).

    ``ml_dtypes`` is imported on the first call (it takes longer to import than the rest of
    ggmlpy together), so that ``import ggmlpy`` does not load it.

    Raises:
        ImportError: ``ml_dtypes`` is not installed.
    """
    import ml_dtypes  # noqa: PLC0415 - lazy: see above

    return np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True, slots=True)
class TypeTraits:
    """Static facts of one element type.

    Attributes:
        name: ggml's name ("f32", "q8_0", ...).
        blck_size: elements per block (1 for plain types, 32 for Q4_0..Q8_0, 256 for K-quants).
        type_size: bytes per block (for plain types: bytes per element).
        dtype: NumPy dtype of one element's storage, or None for block-quantized types
            (their memory is exposed as raw ``uint8`` rows). BF16's entry is None too: its
            dtype, ``ml_dtypes.bfloat16``, is resolved on first use (:func:`bf16_dtype`).
        is_float: whether values are floating point (F32, F16, BF16, F64 and quantized types).
    """

    name: str
    blck_size: int
    type_size: int
    dtype: np.dtype | None
    is_float: bool


class Type(IntEnum):
    """A tensor element type with ggml's numeric id (mirrors ``enum ggml_type``).

    Use the properties for the type's traits: ``Type.F16.type_size == 2``,
    ``Type.Q8_0.blck_size == 32``, ``Type.F32.dtype == np.float32``.
    """

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    BF16 = 30

    @property
    def traits(self) -> TypeTraits:
        """The :class:`TypeTraits` of this type."""
        return _TRAITS[self]

    @property
    def blck_size(self) -> int:
        """Elements per block (mirrors ``ggml_blck_size``)."""
        return _TRAITS[self].blck_size

    @property
    def type_size(self) -> int:
        """Bytes per block (mirrors ``ggml_type_size``); bytes per element when ``blck_size == 1``."""
        return _TRAITS[self].type_size

    @property
    def dtype(self) -> np.dtype:
        """NumPy storage dtype of one element.

        Raises:
            TypeError: for block-quantized types, whose elements are not addressable one by one.
        """
        dt = _TRAITS[self].dtype
        if dt is None:
            if self is Type.BF16:
                return bf16_dtype()
            raise TypeError(f"type {self.name} is block-quantized and has no per-element dtype")
        return dt

    @property
    def is_quantized(self) -> bool:
        """True for block-quantized types (mirrors ``ggml_is_quantized``)."""
        return _TRAITS[self].blck_size > 1

    @property
    def type_name(self) -> str:
        """ggml's lower-case name ("f32", "q8_0"; mirrors ``ggml_type_name``)."""
        return _TRAITS[self].name

    def row_size(self, n: int) -> int:
        """Bytes taken by ``n`` elements of this type; see :func:`row_size`."""
        return row_size(self, n)


_TRAITS: dict[Type, TypeTraits] = {
    Type.F32: TypeTraits("f32", 1, 4, np.dtype(np.float32), True),
    Type.F16: TypeTraits("f16", 1, 2, np.dtype(np.float16), True),
    Type.Q4_0: TypeTraits("q4_0", 32, 18, None, True),
    Type.Q4_1: TypeTraits("q4_1", 32, 20, None, True),
    Type.Q5_0: TypeTraits("q5_0", 32, 22, None, True),
    Type.Q5_1: TypeTraits("q5_1", 32, 24, None, True),
    Type.Q8_0: TypeTraits("q8_0", 32, 34, None, True),
    Type.Q4_K: TypeTraits("q4_K", 256, 144, None, True),
    Type.Q5_K: TypeTraits("q5_K", 256, 176, None, True),
    Type.Q6_K: TypeTraits("q6_K", 256, 210, None, True),
    Type.I8: TypeTraits("i8", 1, 1, np.dtype(np.int8), False),
    Type.I16: TypeTraits("i16", 1, 2, np.dtype(np.int16), False),
    Type.I32: TypeTraits("i32", 1, 4, np.dtype(np.int32), False),
    Type.I64: TypeTraits("i64", 1, 8, np.dtype(np.int64), False),
    Type.F64: TypeTraits("f64", 1, 8, np.dtype(np.float64), True),
    Type.BF16: TypeTraits("bf16", 1, 2, None, True),  # dtype: bf16_dtype(), resolved lazily
}

_FROM_NAME = {tr.name.lower(): ty for ty, tr in _TRAITS.items()}

_FROM_DTYPE = {tr.dtype: ty for ty, tr in _TRAITS.items() if tr.dtype is not None}


@checked_args
def row_size(type: Type, n: int) -> int:
    """Bytes taken by a row of ``n`` elements of ``type`` (mirrors ``ggml_row_size``).

    Args:
        type: the element type.
        n: number of elements (not bytes); must be a multiple of ``type.blck_size``.

    Returns:
        ``type.type_size * n // type.blck_size`` bytes.

    Raises:
        ValueError: if ``n`` is negative or not a multiple of the block size.
    """
    t = _TRAITS[Type(type)]
    if n < 0 or n % t.blck_size:
        raise ValueError(f"row_size: {n} elements is not a non-negative multiple of the "
                         f"block size {t.blck_size} of type {t.name}")
    return t.type_size * n // t.blck_size


def type_from_dtype(dtype: np.dtype | type) -> Type:
    """The :class:`Type` whose storage dtype is ``dtype`` (float32 -> F32, int32 -> I32, ...).

    Raises:
        TypeError: ``dtype`` is None or not a dtype, or no ggml type stores that dtype
            (``ml_dtypes.bfloat16`` gives BF16).
    """
    if dtype is None:  # np.dtype(None) would be float64
        raise TypeError("type_from_dtype: dtype must be a NumPy dtype or scalar type, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"type_from_dtype: dtype must be a NumPy dtype or scalar type, got "
                        f"{type(dtype).__name__} {dtype!r}") from None
    try:
        return _FROM_DTYPE[dt]
    except KeyError:
        # a bfloat16 dtype exists only once ml_dtypes was imported (by the caller), so comparing
        # with bf16_dtype() imports nothing new
        if dt.name == "bfloat16" and dt == bf16_dtype():
            return Type.BF16
        raise TypeError(f"no ggml type for NumPy dtype {dt}") from None


def type_from_name(name: str) -> Type:
    """The :class:`Type` called ``name``, case-insensitive ("f16", "Q8_0", "q4_k", "BF16").

    Mirrors looking a name up in ggml's type traits table.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: no such type (the message lists the known names).
    """
    if not isinstance(name, str):
        raise TypeError(f"type name must be a str, got {type(name).__name__}")
    try:
        return _FROM_NAME[name.lower()]
    except KeyError:
        raise ValueError(f"unknown ggml type name {name!r}; known: "
                         f"{', '.join(sorted(_FROM_NAME))}") from None
