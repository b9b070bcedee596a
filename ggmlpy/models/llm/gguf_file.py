"""Read a decoder GGUF file: metadata and tensor infos, tensor bytes left in the memory map.

:func:`read_decoder_gguf` parses the file with gguf-py's ``GGUFReader`` (the ``[gguf]`` extra)
and returns the scalar metadata plus one :class:`~ggmlpy.models.gguf_bert.TypedWeight` per
tensor (type, ``ne``, and a uint8 view of the memory-mapped file), so that the model can place
each tensor in the buffer type of its layer and upload it once (llama.cpp's
``llama_model_loader``: ``gguf_init_from_file`` with ``no_alloc``, then ``load_all_data``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ggmlpy.core.errors import GGUFError
from ggmlpy.core.types import Type
from ggmlpy.models.gguf_bert import TypedWeight

__all__ = ["TypedWeight", "read_decoder_gguf"]

#: array keys that hold one entry per vocabulary token: not decoded here (the tokenizer reads them)
_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                 "tokenizer.ggml.merges")


def read_decoder_gguf(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, TypedWeight]]:
    """Metadata and tensors of a GGUF file, the tensor bytes as views of its memory map.

    Args:
        path: the ``.gguf`` file.

    Returns:
        ``(metadata, tensors)``: key -> value (int, float, bool, str or a list of them; the
        per-token vocabulary arrays ``tokenizer.ggml.tokens/scores/token_type/merges`` are left
        out) and name -> :class:`TypedWeight` (ggml ``type``, ``ne`` with ``ne[0]`` innermost,
        ``data``: ``row_size(type, ne0) * ne1 * ne2 * ne3`` bytes), in file order.

    Raises:
        FileNotFoundError: no such file.
        GGUFError: not a readable GGUF file, or a tensor of a type ggmlpy does not know.
        ImportError: the ``gguf`` package is missing (``pip install 'ggmlpy[gguf]'``).
    """
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("GGUF models need the gguf package: pip install 'ggmlpy[gguf]'") from e
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF model file {path!r} does not exist")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # noqa: BLE001 - gguf-py raises ValueError/struct.error/...
        raise GGUFError(path, f"not a readable GGUF file: {e}") from None
    meta: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in _VOCAB_ARRAYS:
            continue
        meta[key] = f.contents()
    tensors: dict[str, TypedWeight] = {}
    for t in reader.tensors:
        try:
            ty = Type(int(t.tensor_type))
        except ValueError:
            raise GGUFError(path, f"unknown ggml type id {int(t.tensor_type)}", t.name) from None
        ne = tuple(int(n) for n in t.shape)
        data = np.asarray(t.data).reshape(-1).view(np.uint8)
        tensors[t.name] = TypedWeight(ty, ne, data)
    return meta, tensors
