"""Read a decoder GGUF file: metadata and tensor infos, tensor bytes left in the memory map.

:func:`read_decoder_gguf` parses the file with :class:`ggmlpy.gguf.reader.GGUFReader` and
returns its metadata plus one :class:`~ggmlpy.models.gguf_bert.TypedWeight` per tensor (type,
``ne``, and a uint8 view of the memory-mapped file), so that the model can place each tensor in
the buffer type of its layer and upload it once (llama.cpp's ``llama_model_loader``:
``gguf_init_from_file`` with ``no_alloc``, then ``load_all_data``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ggmlpy.gguf.reader import GGUFReader
from ggmlpy.models.gguf_bert import TypedWeight

__all__ = ["TypedWeight", "read_decoder_gguf"]


def read_decoder_gguf(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, TypedWeight]]:
    """Metadata and tensors of a GGUF file, the tensor bytes as views of its memory map.

    Args:
        path: the ``.gguf`` file.

    Returns:
        ``(metadata, tensors)``: key -> value as :attr:`GGUFReader.fields` gives them (numbers,
        bools, str; arrays of numbers as read-only NumPy views, arrays of strings as
        :class:`~ggmlpy.gguf.strings.StringArray`, so the 262144-token vocabulary costs no
        Python object per entry) and name -> :class:`TypedWeight` (ggml ``type``, ``ne`` with
        ``ne[0]`` innermost, ``data``: ``row_size(type, ne0) * ne1 * ne2 * ne3`` bytes in ggml's
        little-endian layout), in file order.

    Raises:
        FileNotFoundError: no such file.
        GGUFError: anything wrong with the file (named by the reader).
    """
    reader = GGUFReader(path)
    # the metadata own their arrays: a view would keep the whole mapping (and every page of it
    # the weight upload touched) alive and resident for as long as the model keeps its metadata
    meta = {k: _owned(v) for k, v in reader.fields.items()}
    tensors = {name: TypedWeight(t.type, tuple(t.ne) or (1,), t.little_endian().reshape(-1))
               for name, t in reader.tensors.items()}
    return meta, tensors


def _owned(value: Any) -> Any:
    """``value`` with every NumPy array in it (nested lists included) copied out of the map."""
    if isinstance(value, np.ndarray):
        return np.array(value)
    if isinstance(value, list):
        return [_owned(v) for v in value]
    return value
