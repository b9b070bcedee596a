"""Reading GGUF files: header, metadata and tensor infos parsed from a memory map of the file.

:class:`GGUFReader` mirrors ggml's ``gguf_init_from_file`` with ``no_alloc`` (gguf.cpp): it
parses the header, the key/value metadata and the tensor infos once, and exposes each tensor's
data as a zero-copy view of the mapped file. Nothing the file declares is trusted: every count,
length, dimension, type id and offset is checked against the bytes actually left in the file
before anything is read or allocated, and every problem raises :class:`~ggmlpy.core.errors.GGUFError`
naming the file and saying what is wrong in the file's terms (which key or tensor, at which byte).

Cost: scalars are parsed with ``struct``; an array of numbers is a read-only NumPy view of the
file (no Python object per element); an array of strings is located by walking its length
prefixes (vectorised runs of short strings, :mod:`ggmlpy.gguf.strings`), then all its bytes are
gathered and decoded as UTF-8 at once; single strings are sliced out of the decoded text on
access (:class:`~ggmlpy.gguf.strings.StringArray`).

File layout (GGUF v2/v3, ggml's docs/gguf.md): magic ``GGUF``; u32 version; u64 tensor count;
u64 key count; the keys (string key, u32 value type, value); the tensor infos (string name, u32
n_dims, n_dims x i64 ``ne`` in ggml order, u32 ggml type, u64 offset relative to the data
section); zero padding up to the alignment (``general.alignment``, a u32 power of two, default
32); the data section. A string is a u64 byte length and that many UTF-8 bytes; an array is a
u32 element type, a u64 element count and the elements (arrays may nest).

Rules beyond ggml's (ggml itself refuses nested arrays, which this reader supports):

- Tensor data may be placed in any order and with gaps (ggml requires them packed in file
  order), but two tensors' byte ranges may not overlap and none may end past the end of the file.
- Arrays nest at most :data:`MAX_NESTING` deep.
- BOOL values must be 0 or 1 (docs/gguf.md: anything else is invalid).

Byte order. ggml writes GGUF in the host's byte order; the only marker is the version field,
which reads as ``version << 24`` with the wrong order (gguf.cpp checks ``version & 0xFFFF == 0``).
This reader detects a big-endian file that way and reads every header field, metadata value and
tensor info big-endian (numeric arrays are views with a big-endian dtype, so values read right).
Tensor data is exposed two ways: :attr:`TensorInfo.data`, the file's bytes as they are, and
:meth:`TensorInfo.little_endian` / :meth:`TensorInfo.chunks`, the bytes in ggml's little-endian
layout (the same view for a little-endian file; swapped copies for a big-endian one, by the rule
of :mod:`ggmlpy.gguf.byteorder`).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from ggmlpy.core.errors import GGUFError
from ggmlpy.core.types import Type
from ggmlpy.gguf.byteorder import to_little_endian
from ggmlpy.gguf.cursor import Cursor
from ggmlpy.gguf.strings import read_string_array

__all__ = ["GGUFReader", "TensorInfo", "ValueType", "MAX_NESTING", "MAX_TENSOR_NAME",
           "DEFAULT_ALIGNMENT"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
"""Alignment of the data section and of tensor offsets without ``general.alignment``."""
MAX_DIMS = 4
"""ggml's ``GGML_MAX_DIMS``: tensors have at most 4 dimensions."""
MAX_TENSOR_NAME = 63
"""Longest tensor name in bytes (ggml's ``GGML_MAX_NAME`` less the terminating NUL)."""
MAX_NESTING = 32
"""Deepest nesting of arrays of arrays accepted (an array of numbers has depth 1)."""
_INT64_MAX = 2**63 - 1
# smallest encodings: a key/value pair (u64 key length, 1 key byte, u32 type, 1 value byte) and a
# tensor info (u64 name length, u32 n_dims, u32 type, u64 offset)
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8


class ValueType(IntEnum):
    """A GGUF metadata value type (mirrors ``enum gguf_type``; ids as in the file)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# NumPy dtype character code of each fixed-size value type (byte order added per file)
_NUMERIC = {ValueType.UINT8: "u1", ValueType.INT8: "i1", ValueType.UINT16: "u2",
            ValueType.INT16: "i2", ValueType.UINT32: "u4", ValueType.INT32: "i4",
            ValueType.FLOAT32: "f4", ValueType.BOOL: "u1", ValueType.UINT64: "u8",
            ValueType.INT64: "i8", ValueType.FLOAT64: "f8"}
_STRUCT = {"u1": "B", "i1": "b", "u2": "H", "i2": "h", "u4": "I", "i4": "i", "f4": "f",
           "u8": "Q", "i8": "q", "f8": "d"}

# names of ggml types this project does not implement, for the error message (gguf.cpp's list)
_GGML_ONLY_TYPES = {9: "q8_1", 10: "q2_K", 11: "q3_K", 15: "q8_K", 16: "iq2_xxs", 17: "iq2_xs",
                    18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s", 22: "iq2_s",
                    23: "iq4_xs", 29: "iq1_m", 34: "tq1_0", 35: "tq2_0", 39: "mxfp4"}


@dataclass(frozen=True, eq=False)
class TensorInfo:
    """One tensor of a GGUF file (mirrors ggml's ``gguf_tensor_info``).

    Attributes:
        name: the tensor's name.
        type: its element :class:`~ggmlpy.core.types.Type`.
        ne: elements per dimension in ggml order (``ne[0]`` innermost), as many as the file
            declares (0 to 4); the NumPy shape is ``ne[::-1]``.
        offset: byte offset of the data relative to the data section (``GGUFReader.data_offset``).
        file_offset: byte offset of the data from the start of the file.
        nbytes: bytes of data (``type.row_size(ne[0]) * ne[1] * ...``).
        data: read-only ``uint8`` view of the mapped file holding the data as stored (the file's
            byte order), NumPy shape ``ne[::-1][:-1] + (row bytes,)`` (``(nbytes,)`` for 0 or 1
            dims).
        byte_order: ``"<"`` or ``">"``, the file's.
    """

    name: str
    type: Type
    ne: tuple[int, ...]
    offset: int
    file_offset: int
    nbytes: int
    data: np.ndarray
    byte_order: str

    @property
    def n_elements(self) -> int:
        """Element count (product of ``ne``; 1 for 0 dims)."""
        n = 1
        for x in self.ne:
            n *= x
        return n

    def little_endian(self) -> np.ndarray:
        """The data in ggml's little-endian layout, ``uint8``, shape as :attr:`data`.

        The view :attr:`data` itself for a little-endian file (zero copy); for a big-endian file
        a new array with each element (plain types) or each multi-byte block field (block types,
        :func:`~ggmlpy.gguf.byteorder.block_swap_fields`) byte-swapped.
        """
        if self.byte_order == "<" or self.nbytes == 0:
            return self.data
        return to_little_endian(self.data.reshape(-1), self.type, self.byte_order).reshape(
            self.data.shape)

    def chunks(self, max_bytes: int = 1 << 24) -> Iterator[tuple[int, np.ndarray]]:
        """The data in ggml's little-endian layout, in pieces of whole blocks.

        Yields:
            ``(byte offset in the tensor, 1-D uint8 array)`` in order, each piece at most
            ``max_bytes`` long (rounded down to whole blocks; at least one block): views of the
            map for a little-endian file, swapped copies for a big-endian one.
        """
        ts = self.type.type_size
        step = max(ts, max_bytes // ts * ts)
        flat = self.data.reshape(-1)
        for off in range(0, self.nbytes, step):
            yield off, to_little_endian(flat[off:off + step], self.type, self.byte_order)


class GGUFReader:
    """A parsed GGUF file (mirrors ``gguf_init_from_file`` with ``no_alloc = true``).

    Opening maps the file read-only (``mmap``) and parses everything but the tensor data; the
    data stays in the map and is read when a view is used.

    Args:
        path: the .gguf file.

    Attributes:
        path: the file, as given (str).
        file_size: its size in bytes.
        version: the GGUF version (2 or 3).
        byte_order: ``"<"`` (little-endian) or ``">"`` (big-endian), from the version field.
        fields: key -> value, in file order. Numbers are ``int``/``float``, BOOL is ``bool``,
            STRING ``str``; an array of numbers is a read-only NumPy view of the file (dtype of
            the element type, in the file's byte order; BOOL arrays ``np.bool_``); an array of
            strings a :class:`~ggmlpy.gguf.strings.StringArray`; an array of arrays a ``list`` of such arrays (never
            flattened).
        field_types: key -> ``(ValueType, element ValueType or None)``; the element type only for
            arrays (ARRAY for an array of arrays; the inner arrays' types are their values').
        alignment: the data alignment in bytes (``general.alignment`` or 32).
        data_offset: byte offset of the data section (end of the tensor infos, aligned).
        tensors: name -> :class:`TensorInfo`, in file order.

    Raises:
        FileNotFoundError: no such file.
        GGUFError: anything wrong with the file (the message names the file, the key or tensor
            at fault and the byte offsets involved).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            self.file_size = os.fstat(f.fileno()).st_size
            if self.file_size == 0:
                raise GGUFError(self.path, "the file is empty (0 bytes), not a GGUF file")
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._u8 = np.frombuffer(self._mmap, np.uint8)
        self.fields: dict[str, Any] = {}
        self.field_types: dict[str, tuple[ValueType, ValueType | None]] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.alignment = DEFAULT_ALIGNMENT
        self._parse()

    # ------------------------------------------------------------------ header and metadata

    def _parse(self) -> None:
        c = Cursor(self.path, self._mmap, self.file_size, "<")
        c.need(4, "the magic")
        magic = bytes(self._mmap[0:4])
        if magic != GGUF_MAGIC:
            raise c.error(f"not a GGUF file: magic {magic!r} at byte 0, expected {GGUF_MAGIC!r}")
        c.pos = 4
        version = c.u32("the version")
        if version not in SUPPORTED_VERSIONS:
            swapped = struct.unpack("<I", struct.pack(">I", version))[0]
            if swapped in SUPPORTED_VERSIONS:
                c.set_order(">")
                version = swapped
            elif version == 1:
                raise c.error("GGUF version 1 is not supported (32-bit lengths); re-convert the "
                              "file")
            else:
                raise c.error(f"unsupported GGUF version {version} (read little-endian; "
                              f"{swapped} big-endian); supported: 2, 3")
        self.version, self.byte_order = version, c.order
        n_tensors = c.u64("the tensor count")
        n_kv = c.u64("the key count")
        least = n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
        if least > c.left():
            raise c.error(f"the header declares {n_tensors} tensors and {n_kv} keys, which need "
                          f"at least {least} bytes after byte {c.pos}; the file has {c.left()}")
        for i in range(n_kv):
            self._read_kv(c, i)
        self._set_alignment(c)
        infos: list[tuple[str, Type, tuple[int, ...], int, int]] = []
        seen: set[str] = set()
        for i in range(n_tensors):
            infos.append(self._read_tensor_info(c, i, seen))
            seen.add(infos[-1][0])
        data_offset = _pad(c.pos, self.alignment)
        if n_tensors and data_offset > self.file_size:
            raise c.error(f"truncated at byte {self.file_size}: the data section starts at byte "
                          f"{data_offset} (tensor infos end at byte {c.pos}, aligned to "
                          f"{self.alignment})")
        self.data_offset = data_offset
        self._place_tensors(c, infos)

    def _read_kv(self, c: Cursor, i: int) -> None:
        at, kb = c.raw_string(f"key #{i}")
        if not kb:
            raise c.error(f"key #{i} at byte {at - 8} is empty")
        try:
            key = kb.decode("utf-8")
        except UnicodeDecodeError as e:
            raise c.error(f"key #{i} at byte {at} is not valid UTF-8 (byte {at + e.start}: "
                          f"{kb[e.start:e.start + 1]!r})") from None
        if key in self.fields:
            raise c.error(f"duplicate key {key!r} (key #{i} at byte {at - 8})")
        vt = self._value_type(c, f"the value type of key {key!r}")
        sub = None
        if vt == ValueType.ARRAY:
            value, sub = self._read_array(c, key, 1)
        else:
            value = self._read_scalar(c, vt, f"the value of key {key!r}")
        self.fields[key] = value
        self.field_types[key] = (vt, sub)

    def _value_type(self, c: Cursor, what: str) -> ValueType:
        at = c.pos
        raw = c.u32(what)
        try:
            return ValueType(raw)
        except ValueError:
            raise c.error(f"{what} at byte {at} is {raw}, not a GGUF value type (0..12)") from None

    def _read_scalar(self, c: Cursor, vt: ValueType, what: str) -> Any:
        if vt == ValueType.STRING:
            at, b = c.raw_string(what)
            try:
                return b.decode("utf-8")
            except UnicodeDecodeError as e:
                raise c.error(f"{what} is not valid UTF-8 (byte {at + e.start})") from None
        code = _NUMERIC[vt]
        size = int(code[1])
        c.need(size, what)
        (v,) = struct.unpack_from(c.order + _STRUCT[code], self._mmap, c.pos)
        if vt == ValueType.BOOL:
            if v > 1:
                raise c.error(f"{what} at byte {c.pos} is a BOOL of {v}; GGUF BOOLs are 0 or 1")
            v = bool(v)
        c.pos += size
        return v

    def _read_array(self, c: Cursor, key: str, depth: int) -> tuple[Any, ValueType]:
        """(value, element type) of the array at the cursor (its type and count come first)."""
        name = f"array {key!r}" if depth == 1 else f"a nested array (depth {depth}) of {key!r}"
        if depth > MAX_NESTING:
            raise c.error(f"{name} at byte {c.pos}: arrays nest more than {MAX_NESTING} deep")
        et = self._value_type(c, f"the element type of {name}")
        at = c.pos
        n = c.u64(f"the length of {name}")
        left = c.left()
        if et == ValueType.STRING:
            least, unit = 8 * n, "string lengths of 8 bytes each"
        elif et == ValueType.ARRAY:
            least, unit = 12 * n, "array headers of 12 bytes each"
        else:
            least, unit = int(_NUMERIC[et][1]) * n, f"{et.name} elements"
        if least > left:
            raise c.error(f"{name} at byte {at} declares {n} elements of type {et.name}, which "
                          f"need at least {least} bytes ({unit}); the file has {left} left")
        if et == ValueType.STRING:
            return read_string_array(self._u8, c, name, n), et
        if et == ValueType.ARRAY:
            items = []
            for _ in range(n):
                items.append(self._read_array(c, key, depth + 1)[0])
            return items, et
        code = _NUMERIC[et]
        arr = np.frombuffer(self._mmap, np.dtype(c.order + code) if code[1] != "1"
                            else np.dtype(code), count=n, offset=c.pos)
        if et == ValueType.BOOL:
            if n and int(arr.max()) > 1:
                j = int(np.flatnonzero(arr > 1)[0])
                raise c.error(f"element {j} of {name} at byte {c.pos + j} is a BOOL of "
                              f"{int(arr[j])}; GGUF BOOLs are 0 or 1")
            arr = arr.view(np.bool_)
        c.pos += least
        return arr, et

    def _set_alignment(self, c: Cursor) -> None:
        key = "general.alignment"
        if key not in self.fields:
            return
        vt, _ = self.field_types[key]
        if vt != ValueType.UINT32:
            raise c.error(f"key {key!r} must be of type UINT32, but is {vt.name}")
        a = self.fields[key]
        if a == 0 or a & (a - 1):
            raise c.error(f"{key} = {a} is not a power of two")
        self.alignment = a

    # ------------------------------------------------------------------ tensor infos

    def _read_tensor_info(self, c: Cursor, i: int, seen: set[str]
                          ) -> tuple[str, Type, tuple[int, ...], int, int]:
        at, nb = c.raw_string(f"the name of tensor #{i}")
        try:
            name = nb.decode("utf-8")
        except UnicodeDecodeError as e:
            raise c.error(f"the name of tensor #{i} at byte {at} is not valid UTF-8 (byte "
                          f"{at + e.start})") from None
        if len(nb) > MAX_TENSOR_NAME:
            raise c.error(f"name of {len(nb)} bytes at byte {at}; ggml allows at most "
                          f"{MAX_TENSOR_NAME}", name)
        if name in seen:
            raise c.error(f"duplicate tensor name (tensor #{i} at byte {at - 8})", name)
        n_dims = c.u32(f"n_dims of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise c.error(f"{n_dims} dimensions (at byte {c.pos - 4}); ggml tensors have at most "
                          f"{MAX_DIMS}", name)
        ne = []
        for d in range(n_dims):
            v = c.u64(f"ne[{d}] of tensor {name!r}")
            if v > _INT64_MAX:
                raise c.error(f"ne[{d}] = {v - 2**64} (at byte {c.pos - 8}) is negative", name)
            ne.append(v)
        tat = c.pos
        raw_type = c.u32(f"the type of tensor {name!r}")
        try:
            t = Type(raw_type)
        except ValueError:
            known = _GGML_ONLY_TYPES.get(raw_type)
            what = f"ggml's {known}, which ggmlpy does not implement" if known else \
                "not a ggml type"
            raise c.error(f"unknown or unsupported ggml type id {raw_type} at byte {tat} "
                          f"({what}; ggmlpy knows {', '.join(x.type_name for x in Type)})",
                          name) from None
        # Python ints: nothing wraps. The products skip zeros, so that a tensor with no elements
        # cannot hide other dimensions whose product (and so its NumPy shape) overflows int64
        n_el = n_nz = 1
        for v in ne:
            n_el *= v
            n_nz *= max(v, 1)
        if n_nz > _INT64_MAX:
            raise c.error(f"ne = {ne} has {n_nz} elements, more than int64 can count", name)
        ne0 = ne[0] if ne else 1  # missing dimensions are 1, as in ggml
        if ne0 % t.blck_size:
            raise c.error(f"ne[0] = {ne0} is not a multiple of the block size {t.blck_size} "
                          f"of {t.type_name}", name)
        if -(-n_nz // t.blck_size) * t.type_size > _INT64_MAX:
            raise c.error(f"ne = {ne} of {t.type_name} takes {n_nz // t.blck_size * t.type_size} "
                          "bytes, more than int64 can count", name)
        nbytes = n_el // t.blck_size * t.type_size
        offset = c.u64(f"the data offset of tensor {name!r}")
        if offset % self.alignment:
            raise c.error(f"data offset {offset} is not a multiple of the alignment "
                          f"{self.alignment}", name)
        return name, t, tuple(ne), offset, nbytes

    def _place_tensors(self, c: Cursor, infos: list) -> None:
        self.tensors = {}
        spans = []
        for name, t, ne, offset, nbytes in infos:
            start = self.data_offset + offset
            end = start + nbytes
            if end > self.file_size:
                raise c.error(f"data [{start}, {end}) (data offset {offset} + {nbytes} bytes) "
                              f"runs past the end of the file, which has {self.file_size} "
                              "bytes: file truncated", name)
            shape = tuple(reversed(ne[1:])) + (t.row_size(ne[0]),) if len(ne) >= 2 else (nbytes,)
            view = self._u8[start:end].reshape(shape) if nbytes else np.zeros(shape, np.uint8)
            self.tensors[name] = TensorInfo(name, t, ne, offset, start, nbytes, view,
                                            self.byte_order)
            if nbytes:
                spans.append((start, len(spans), end, name))
        spans.sort()
        for a, b in zip(spans, spans[1:]):
            if b[0] < a[2]:
                (s0, _, e0, n0), (s1, _, e1, n1) = sorted((a, b), key=lambda x: x[1])
                raise c.error(f"tensors {n0!r} (data [{s0}, {e0})) and {n1!r} (data [{s1}, "
                              f"{e1})) overlap", n1)

    # ------------------------------------------------------------------ access

    def __getitem__(self, name: str) -> TensorInfo:
        """The tensor called ``name``; KeyError naming it and the file if there is none."""
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def release(self, tensor: TensorInfo, offset: int = 0, nbytes: int | None = None) -> None:
        """Drop the mapped pages of ``tensor``'s data (``nbytes`` bytes from byte ``offset`` of
        it, default all) from this process once they were copied.

        ``madvise(MADV_DONTNEED)`` on the pages the range touches (a read-only file mapping: the
        pages leave this process's resident set; reading a view again faults them back in from
        the file). A no-op where the platform has no ``madvise``.
        """
        nbytes = tensor.nbytes - offset if nbytes is None else nbytes
        if nbytes <= 0 or not hasattr(self._mmap, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        first = tensor.file_offset + offset
        start = first // page * page
        end = min(self.file_size, -(-(first + nbytes) // page) * page)
        self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of metadata ``key``, or ``default``."""
        return self.fields.get(key, default)

    def __repr__(self) -> str:
        order = "little" if self.byte_order == "<" else "big"
        return (f"GGUFReader({self.path!r}: v{self.version}, {order}-endian, "
                f"{len(self.fields)} keys, {len(self.tensors)} tensors)")


def _pad(x: int, a: int) -> int:
    return (x + a - 1) // a * a


