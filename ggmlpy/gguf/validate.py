"""Tensor data validation for GGUF files, as llama.cpp does it (``ggml_validate_row_data``).

llama-quantize validates every quantized tensor before writing it, and llama.cpp's model loader
validates tensors when asked (``check_tensors``). Here :func:`check_saved_tensor` refuses a block
tensor whose blocks would not decode to finite values before :func:`~ggmlpy.gguf.weights.gguf_save`
writes it, and :func:`check_loaded_part` does the same for each piece
:func:`~ggmlpy.gguf.weights.gguf_load` copies: on by default for files ggmlpy wrote (recognised by
the metadata key :data:`WRITER_KEY`, which gguf_save always writes), on request for foreign files.
The rule is :func:`ggmlpy.quants.validate.first_invalid_block`'s, ggml's: a block type needs
finite f16 scales. Float tensors are stored as given (a model may hold NaN or -inf on purpose, and
tests build damaged models that way), except that a finite float32 array that gguf_save converts
to F16/BF16 (a ``(Type, array)`` pair) must stay finite: 1e9 must not become a stored inf.
Integer tensors are not checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.core.errors import GGUFError
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize
from ggmlpy.quants.validate import first_invalid_block

__all__ = ["WRITER_KEY", "WRITER_VALUE", "check_saved_tensor", "check_loaded_part",
           "validation_on"]

#: metadata key gguf_save writes into every file; its presence turns load validation on
WRITER_KEY = "ggmlpy.writer"
#: its value
WRITER_VALUE = "ggmlpy"


def _where(t: Type, ne0: int, block: int) -> str:
    per_row = max(1, ne0 // t.blck_size)
    if t.blck_size == 1:
        return (f"element {block % per_row} of row {block // per_row} (flat element {block}) "
                f"of {t.type_name} is inf or NaN (ggml_validate_row_data)")
    return (f"block {block % per_row} of row {block // per_row} (flat block {block}) of "
            f"{t.type_name} does not decode to finite values: its f16 scale is inf or NaN "
            f"(ggml_validate_row_data)")


def check_saved_tensor(name: str, t: Type, ne: list[int], raw: np.ndarray, value: Any = None) -> None:
    """Refuse a tensor about to be written whose blocks would not decode to finite values
    (llama-quantize's check before writing), or whose finite float32 source overflowed in the
    conversion to F16/BF16.

    Args:
        name: the tensor's name (for the message).
        t: its type.
        ne: its ggml shape (``ne[0]`` gives the blocks per row for the message).
        raw: its bytes, any shape, uint8.
        value: what gguf_save was given for it; a ``(Type, array)`` pair of an F16/BF16 type has
            its array compared with the result (a finite value that became inf is refused).

    Raises:
        ValueError: ``"gguf_save: tensor '<name>': block <b> of row <r> ..."`` for the first
            invalid block (``element <i> of row <r> ...`` for an overflowed F16/BF16 element).
    """
    if t in (Type.F16, Type.BF16):
        if isinstance(value, tuple) and len(value) == 2:
            src = np.asarray(value[1], dtype=np.float32).reshape(-1)
            bad = np.isfinite(src) & ~np.isfinite(dequantize(raw, t, [src.size]))
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"gguf_save: tensor '{name}': {_where(t, ne[0], i)} (the finite "
                                 f"value {float(src[i]):g} overflows {t.type_name})")
        return
    if t.blck_size == 1:
        return
    bad_block = first_invalid_block(t, raw)
    if bad_block is not None:
        raise ValueError(f"gguf_save: tensor '{name}': {_where(t, ne[0], bad_block)}")


def validation_on(validate: bool | None, metadata: dict[str, Any]) -> bool:
    """Whether gguf_load validates: ``validate`` when given, else whether ggmlpy wrote the file.

    Raises:
        TypeError: ``validate`` is neither None nor a bool.
    """
    if validate is None:
        return WRITER_KEY in metadata
    if not isinstance(validate, bool):
        raise TypeError(f"gguf_load: validate must be None, True or False, got {validate!r}")
    return validate


def check_loaded_part(path: str, validate: bool, name: str, t: Type, ne: tuple[int, ...],
                      offset: int, part: np.ndarray) -> None:
    """Validate one piece of a block tensor being loaded (whole blocks, ``offset`` bytes into
    it); other types pass (see the module doc).

    Args:
        path: the file (for the message).
        validate: whether to check at all (:func:`validation_on`).
        name, t, ne: the tensor's name, type and ggml shape.
        offset: the piece's byte offset within the tensor (a multiple of ``t.type_size``).
        part: the piece's bytes, little-endian layout.

    Raises:
        GGUFError: naming the file, the tensor and its first invalid block.
    """
    if not validate or t.blck_size == 1:
        return
    bad = first_invalid_block(t, part)
    if bad is not None:
        block = offset // t.type_size + bad
        raise GGUFError(path, _where(t, ne[0] if ne else t.blck_size, block)
                        + "; gguf_load(..., validate=False) loads it anyway", tensor=name)
