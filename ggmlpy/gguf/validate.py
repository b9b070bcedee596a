"""Tensor data validation for GGUF files, as llama.cpp does it (``ggml_validate_row_data``).

llama-quantize validates every quantized tensor before writing it, and llama.cpp's model loader
validates tensors when asked (``check_tensors``). Here :func:`check_saved_tensor` refuses a block
tensor whose blocks would not decode to finite values before :func:`~ggmlpy.gguf.weights.gguf_save`
writes it, and :func:`check_loaded_part` does the same for each piece
:func:`~ggmlpy.gguf.weights.gguf_load` copies: on by default for files ggmlpy wrote (recognised by
the metadata key :data:`WRITER_KEY`, which gguf_save always writes), on request for foreign files.
The rule per type is :func:`ggmlpy.quants.validate.first_invalid_block`'s, ggml's: block types
need finite f16 scales, float types (F32, F16, BF16, F64) finite elements (so an F32 value too
large for F16 cannot become a stored inf either); integer tensors are not checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.core.errors import GGUFError
from ggmlpy.core.types import Type
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


def check_saved_tensor(name: str, t: Type, ne: list[int], raw: np.ndarray) -> None:
    """Refuse a tensor about to be written whose blocks (elements, for float types) would not
    decode to finite values (llama-quantize's check before writing).

    Args:
        name: the tensor's name (for the message).
        t: its type (integer types are not checked).
        ne: its ggml shape (``ne[0]`` gives the blocks per row for the message).
        raw: its bytes, any shape, uint8.

    Raises:
        ValueError: ``"gguf_save: tensor '<name>': block <b> of row <r> ..."`` for the first
            invalid block (``element <i> of row <r> ...`` for float types).
    """
    bad = first_invalid_block(t, raw)
    if bad is not None:
        raise ValueError(f"gguf_save: tensor '{name}': {_where(t, ne[0], bad)}")


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
    """Validate one piece of a tensor being loaded (whole blocks, ``offset`` bytes into it).

    Args:
        path: the file (for the message).
        validate: whether to check at all (:func:`validation_on`).
        name, t, ne: the tensor's name, type and ggml shape.
        offset: the piece's byte offset within the tensor (a multiple of ``t.type_size``).
        part: the piece's bytes, little-endian layout.

    Raises:
        GGUFError: naming the file, the tensor and its first invalid block (element).
    """
    if not validate:
        return
    bad = first_invalid_block(t, part)
    if bad is not None:
        block = offset // t.type_size + bad
        raise GGUFError(path, _where(t, ne[0] if ne else t.blck_size, block)
                        + "; gguf_load(..., validate=False) loads it anyway", tensor=name)
