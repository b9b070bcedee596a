"""GGUF files: :func:`gguf_load` into one WEIGHTS buffer, :func:`gguf_save` from tensors or arrays.

Loading parses the file with :class:`~ggmlpy.gguf.reader.GGUFReader` (ours: a memory map, every
declared size checked, both byte orders) and places the tensors with the public backend API
(``Context``, ``alloc_ctx_tensors_from_buft``, ``backend_tensor_set``): the data is read once,
straight from the memory map into the backend buffer. Writing goes through the ``gguf`` package's
``GGUFWriter`` (gguf-py, the optional ``[gguf]`` extra). Mirrors llama.cpp's model loading
(``gguf_init_from_file`` with ``no_alloc`` + ``ggml_backend_alloc_ctx_tensors_from_buft`` +
``ggml_backend_tensor_set`` per tensor) and ``gguf_write_to_file``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import Backend, Buffer, BufferType, BufferUsage
from ggmlpy.backend.tensor_data import as_bytes, backend_tensor_get, backend_tensor_set
from ggmlpy.core.check import describe
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type, type_from_dtype
from ggmlpy.gguf.reader import GGUFReader
from ggmlpy.gguf.strings import StringArray
from ggmlpy.gguf.validate import (
    WRITER_KEY,
    WRITER_VALUE,
    check_loaded_part,
    check_saved_tensor,
    validation_on,
)
from ggmlpy.quants import quantize

__all__ = ["GGUFModel", "gguf_load", "gguf_save"]

def _gguf():
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("GGUF files need the gguf package: pip install 'ggmlpy[gguf]'") from e
    return gguf


@dataclass
class GGUFModel:
    """What :func:`gguf_load` returns: the tensors in one WEIGHTS buffer and the metadata.

    Attributes:
        path: the file read.
        ctx: a ``no_alloc`` :class:`~ggmlpy.core.tensor.Context` holding one tensor per GGUF tensor,
            in file order, named as in the file, with the file's type and ``ne``.
        buffer: the WEIGHTS buffer holding every tensor (a MultiBuffer only when the buffer type's
            max size forces a split, as in ggml), or None for a file without tensor data.
        tensors: name -> :class:`~ggmlpy.core.tensor.Tensor` (the same objects as in ``ctx``).
        metadata: key -> value (int, float, bool, str, or a list of them), header fields excluded.
        metadata_types: key -> (GGUF value type id, array element type id or None); pass it to
            :func:`gguf_save` to write the same value types back.
        alignment: the file's data alignment in bytes (``general.alignment``, default 32).
    """

    path: str
    ctx: Context
    buffer: Buffer | None
    tensors: dict[str, Tensor] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    metadata_types: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    alignment: int = 32

    def __getitem__(self, name: str) -> Tensor:
        """The tensor called ``name``; KeyError naming it if the file has none."""
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def free(self) -> None:
        """Free the weights buffer (mirrors ``ggml_backend_buffer_free``); tensors lose memory."""
        if self.buffer is not None:
            self.buffer.free()
            self.buffer = None


# bytes copied from the map per backend_tensor_set call: the mapped pages of one piece at a time
# are resident, not those of a whole (possibly 100s of MB) tensor
_COPY_CHUNK = 1 << 24


def _plain(value: Any) -> Any:
    """A reader value as plain Python: arrays (NumPy, StringArray, nested lists) as lists."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (np.ndarray, StringArray)):
        return value.tolist()
    return value


def gguf_load(path: str | os.PathLike[str], backend_or_buft: Backend | BufferType,
              validate: bool | None = None) -> GGUFModel:
    """Read a GGUF file: tensors into one new WEIGHTS buffer of ``backend_or_buft``, plus metadata.

    The file is parsed by :class:`~ggmlpy.gguf.reader.GGUFReader` (memory-mapped; every count,
    length and offset checked against the file). Each tensor's bytes are copied once from the map
    into the buffer with ``backend_tensor_set`` (synchronous), in pieces of at most 16 MiB, in
    ggml's little-endian layout (a big-endian file's tensors are byte-swapped on the way); each
    copied piece's pages are then dropped from the process (``madvise``), so the process holds
    the buffer, not the buffer plus the mapped file. Tensor ``ne`` and types are the file's (ggml order: ``ne[0]`` innermost;
    the NumPy view of a tensor has shape ``ne[::-1]``; a tensor of 0 dims gets ``ne = [1]``).

    Args:
        path: the .gguf file.
        backend_or_buft: a :class:`~ggmlpy.backend.interface.Backend` (its default buffer type is used) or
            a :class:`~ggmlpy.backend.interface.BufferType`.
        validate: check that every block tensor decodes to finite values (ggml's
            ``ggml_validate_row_data``, :mod:`ggmlpy.gguf.validate`) while copying; None (the
            default) checks files ggmlpy wrote (metadata ``ggmlpy.writer``), True any file,
            False none.

    Returns:
        A :class:`GGUFModel`; its metadata arrays are plain lists (the vocabulary as a list of str).

    Raises:
        TypeError: ``backend_or_buft`` is neither; ``validate`` is not None, True or False.
        FileNotFoundError: no such file.
        GGUFError: the file is not GGUF or anything in it is inconsistent: header, metadata
            (lengths and counts past the end of the file, unknown value types, bad UTF-8,
            duplicate keys, a bad ``general.alignment``), tensor infos (unknown or unsupported
            type, more than 4 dimensions, a shape overflowing int64, ``ne[0]`` not a multiple of
            the block size, a misaligned offset, data past the end of the file or overlapping
            another tensor's, duplicate names). The message names the file and, when one is at
            fault, the key or tensor. With validation on: a block tensor whose block does not
            decode to finite values (the message names the tensor and the first such block).
        OutOfMemoryError: the buffer cannot be allocated.
    """
    validation_on(validate, {})  # a TypeError for anything but None/True/False, before any work
    if isinstance(backend_or_buft, Backend):
        buft = backend_or_buft.get_default_buffer_type()
    elif isinstance(backend_or_buft, BufferType):
        buft = backend_or_buft
    else:
        raise TypeError(f"gguf_load: backend_or_buft must be a Backend or BufferType, got "
                        f"{type(backend_or_buft).__name__}")
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"gguf_load: no such file {path!r}")
    reader = GGUFReader(path)
    metadata = {key: _plain(v) for key, v in reader.fields.items()}
    mtypes = {key: (int(vt), None if sub is None else int(sub))
              for key, (vt, sub) in reader.field_types.items()}

    ctx = Context(no_alloc=True)
    tensors: dict[str, Tensor] = {}
    for name, ti in reader.tensors.items():
        tensors[name] = ctx.new_tensor(ti.type, list(ti.ne) or [1]).set_name(name)
    buffer = alloc_ctx_tensors_from_buft(ctx, buft) if tensors else None
    if buffer is not None:
        buffer.set_usage(BufferUsage.WEIGHTS)
    try:
        for name, ti in reader.tensors.items():
            for off, part in ti.chunks(_COPY_CHUNK):
                check_loaded_part(path, validation_on(validate, metadata), name, ti.type, ti.ne,
                                  off, part)
                backend_tensor_set(tensors[name], part, off, len(part))
                reader.release(ti, off, len(part))
    except BaseException:
        if buffer is not None:  # a failed load keeps no device memory (nobody else can free it)
            buffer.free()
        raise
    return GGUFModel(path, ctx, buffer, tensors, metadata, mtypes, int(reader.alignment))


def _infer_vtype(v: Any, VT: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return VT.BOOL
    if isinstance(v, (int, np.integer)):
        v = int(v)
        if 0 <= v < 2**32:
            return VT.UINT32
        if -2**31 <= v < 0:
            return VT.INT32
        if v < 0:
            return VT.INT64
        return VT.UINT64 if v >= 2**63 else VT.INT64
    if isinstance(v, (float, np.floating)):
        return VT.FLOAT32
    if isinstance(v, str):
        return VT.STRING
    if isinstance(v, (list, tuple, np.ndarray)):
        return VT.ARRAY
    raise TypeError(f"gguf_save: metadata value {v!r} of type {type(v).__name__} has no GGUF type")


def _infer_subtype(values: Any, key: str, VT: Any) -> Any:
    vals = list(values)
    if not vals:
        return VT.INT32
    kinds = {_infer_vtype(x, VT) for x in vals}
    if VT.ARRAY in kinds:
        raise TypeError(f"gguf_save: metadata {key!r}: nested arrays are not supported")
    if kinds <= {VT.UINT32, VT.INT32}:
        return VT.INT32 if all(-2**31 <= int(x) < 2**31 for x in vals) else VT.INT64
    if len(kinds) == 1:
        return kinds.pop()
    raise TypeError(f"gguf_save: metadata {key!r}: array mixes value types {sorted(kinds)}")


def _tensor_bytes(name: str, value: Any) -> tuple[Type, list[int], np.ndarray]:
    """(type, ne, uint8 byte array of NumPy shape ne[::-1] with the last axis in bytes)."""
    if isinstance(value, Tensor):
        if not value.is_contiguous():
            raise ValueError(f"gguf_save: tensor '{name}' is not contiguous")
        raw = as_bytes(backend_tensor_get(value))
        t, ne = value.type, [int(n) for n in value.ne]
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
    elif isinstance(value, tuple) and len(value) == 2:
        arr = np.asarray(value[1])
        try:
            raw = quantize(arr, value[0]).reshape(-1)
        except (TypeError, ValueError) as e:  # quantize's message names the rule, not the tensor
            raise type(e)(f"gguf_save: tensor '{name}': {e}") from None
        t = Type(value[0])
        ne = list(arr.shape[::-1]) or [1]
    elif isinstance(value, np.ndarray):
        try:
            t = type_from_dtype(value.dtype)
        except TypeError as e:
            raise TypeError(f"gguf_save: tensor '{name}': {e}") from None
        raw = as_bytes(value)
        ne = list(value.shape[::-1]) or [1]
    else:
        raise TypeError(f"gguf_save: tensor '{name}' must be a Tensor, a NumPy array or a "
                        f"(Type, float array) pair, got {type(value).__name__}")
    if len(ne) > 4:
        raise ValueError(f"gguf_save: tensor '{name}' has {len(ne)} dimensions (at most 4)")
    byte_shape = tuple(ne[::-1][:-1]) + (t.row_size(ne[0]),)
    return t, ne, raw.reshape(byte_shape)


def gguf_save(path: str | os.PathLike[str], tensors: Context | Iterable[Tensor] | Mapping[str, Any],
              metadata: Mapping[str, Any] | None = None,
              types: Mapping[str, tuple[int, int | None]] | None = None) -> None:
    """Write a GGUF file (version 3, alignment ``metadata['general.alignment']`` or 32).

    Args:
        path: the file to write (replaced if it exists).
        tensors: a :class:`~ggmlpy.core.tensor.Context` or iterable of allocated, named, contiguous
            tensors (their bytes are read with ``backend_tensor_get``, synchronous); or a mapping
            name -> tensor, NumPy array (type from its dtype: float32 -> F32, float16 -> F16,
            ``ml_dtypes.bfloat16`` -> BF16, ints) or ``(Type, float array)`` (converted with
            :func:`~ggmlpy.quants.quantize`; NumPy shape ``ne[::-1]``). Trailing ``ne`` of 1 are
            dropped as ggml's writer does.
        metadata: key -> int, float, bool, str, or list of one of those. Value types are inferred
            (int -> UINT32, or INT32/INT64 when negative or large; float -> FLOAT32; int lists ->
            INT32 arrays) unless ``types`` gives them. ``general.architecture`` defaults to
            "ggmlpy" (gguf-py always writes the key). ``ggmlpy.writer`` = "ggmlpy" is always
            written: it tells :func:`gguf_load` to validate the file's block tensors.
        types: key -> (GGUF value type id, array element type id or None), e.g.
            ``GGUFModel.metadata_types`` for an exact round trip.

    Raises:
        TypeError: a tensor or metadata value of an unsupported kind.
        ValueError: unnamed or duplicate tensors, non-contiguous tensors, more than 4 dims,
            ``ne[0]`` not a multiple of the block size, a bad alignment; a block tensor whose
            block would not decode to finite values (``ggml_validate_row_data``; a ``(Type,
            array)`` pair of a block type is refused by :func:`~ggmlpy.quants.quantize` already),
            or a pair of type F16/BF16 whose finite value overflows (1e9 as F16); the message
            names the tensor and the first such block or element.
        NotAllocatedError: a tensor has no memory.
        ImportError: the ``gguf`` package is missing.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"gguf_save: path must be str or os.PathLike, got {describe(path)}")
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, (Context, Iterable)):
        raise TypeError("gguf_save: tensors must be a Context, an iterable of Tensor or a mapping, "
                        f"got {describe(tensors)}")
    for what, m in (("metadata", metadata), ("types", types)):
        if m is not None and not isinstance(m, Mapping):
            raise TypeError(f"gguf_save: {what} must be a mapping or None, got {describe(m)}")
    gguf = _gguf()
    VT = gguf.GGUFValueType
    metadata = dict(metadata or {})
    types = dict(types or {})
    if isinstance(tensors, Mapping):
        items = list(tensors.items())
    else:
        items = []
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"gguf_save: expected Tensors, got {type(t).__name__}")
            if not t.name:
                raise ValueError("gguf_save: every tensor needs a name (set_name)")
            items.append((t.name, t))
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"gguf_save: duplicate tensor names {dup}")
    arch = metadata.pop("general.architecture", "ggmlpy")
    metadata[WRITER_KEY] = WRITER_VALUE  # this file's block tensors were validated
    types.pop(WRITER_KEY, None)
    types.pop("general.architecture", None)
    w = gguf.GGUFWriter(os.fspath(path), str(arch))
    try:
        align = metadata.pop("general.alignment", None)
        types.pop("general.alignment", None)
        if align is not None:
            align = int(align)
            if align <= 0 or align & (align - 1):
                raise ValueError(f"gguf_save: general.alignment = {align} is not a power of two")
            w.add_custom_alignment(align)
        for key, val in metadata.items():
            if key in types:
                main, sub = types[key]
                vt = VT(main)
                st = VT(sub) if sub is not None and vt == VT.ARRAY else None
            else:
                vt = _infer_vtype(val, VT)
                st = _infer_subtype(val, key, VT) if vt == VT.ARRAY else None
            if vt == VT.ARRAY:
                val = list(val.tolist() if isinstance(val, np.ndarray) else val)
            w.add_key_value(key, val, vt, sub_type=st)
        for name, value in items:
            t, ne, raw = _tensor_bytes(name, value)
            check_saved_tensor(name, t, ne, raw, value)
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(int(t)))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
