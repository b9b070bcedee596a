"""Reading GGUF files: header, metadata and tensor infos parsed from a memory map of the file.

:class:`GGUFReader` mirrors ggml's ``gguf_init_from_file`` with ``no_alloc`` (gguf.cpp): it
parses the header, the key/value metadata and the tensor infos once, and exposes each tensor's
data as a zero-copy view of the mapped file. Nothing the file declares is trusted: every count,
length, dimension, type id and offset is checked against the bytes actually left in the file
before anything is read or allocated, and every problem raises :class:`~ggmlpy.errors.GGUFError`
naming the file and saying what is wrong in the file's terms (which key or tensor, at which byte).

Cost: scalars are parsed with ``struct``; an array of numbers is a read-only NumPy view of the
file (no Python object per element); an array of strings is located by walking its length
prefixes (a vectorised pass when every string is shorter than 256 bytes, a tight loop
otherwise: each prefix's position depends on the previous length), then all its bytes are
gathered and decoded as UTF-8 at once; single strings are decoded on access from the decoded
text (:class:`StringArray`).

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
:meth:`TensorInfo.little_endian`, the bytes in ggml's little-endian layout (the same view for a
little-endian file; a swapped copy for a big-endian one). The big-endian layout of a tensor is
the one a big-endian ggml host writes with its native structs: plain types (F32, F16, BF16, I16,
I32, I64, F64) have each element byte-swapped (I8 has nothing to swap); in a block type's block
every multi-byte field is byte-swapped on its own and byte arrays stay as they are:

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

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, overload

import numpy as np

from ggmlpy.core.errors import GGUFError
from ggmlpy.core.types import Type

__all__ = ["GGUFReader", "TensorInfo", "StringArray", "ValueType", "MAX_NESTING",
           "MAX_TENSOR_NAME", "DEFAULT_ALIGNMENT", "block_swap_fields"]

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


def block_swap_fields(t: Type) -> tuple[tuple[int, int], ...]:
    """The multi-byte fields of one block of ``t`` that byte order changes.

    Returns:
        ``(byte offset in the block, width in bytes)`` pairs; for a plain type one pair
        ``(0, type_size)`` (empty for 1-byte types). See the module docstring for the layouts.
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


class StringArray(Sequence[str]):
    """A GGUF array of strings, decoded once (all UTF-8 checked at open), sliced on access.

    ``len(a)`` is the element count; ``a[i]`` the i-th string (negative indices count from the
    end; a slice gives a list); :meth:`tolist` all of them; :meth:`raw` one element's bytes.
    Equality with a list/tuple of str compares the strings.
    """

    __slots__ = ("_text", "_chars", "_bytes", "_blob")

    def __init__(self, text: str, char_bounds: np.ndarray, byte_bounds: np.ndarray,
                 blob: bytes) -> None:
        self._text = text
        self._chars = char_bounds  # n + 1 boundaries into text
        self._bytes = byte_bounds  # n + 1 boundaries into blob
        self._blob = blob

    def __len__(self) -> int:
        return len(self._chars) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        n = len(self)
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(n))]
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"StringArray index {i} out of range for {n} strings")
        i %= n
        return self._text[int(self._chars[i]):int(self._chars[i + 1])]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        """Every string, in order (one slice of the decoded text each)."""
        t, c = self._text, self._chars.tolist()
        return [t[a:b] for a, b in zip(c[:-1], c[1:])]

    def raw(self, i: int) -> bytes:
        """The UTF-8 bytes of element ``i``."""
        i = int(i) % len(self) if len(self) else int(i)
        return self._blob[int(self._bytes[i]):int(self._bytes[i + 1])]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self.tolist() == other.tolist()
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:4])
        return f"StringArray({len(self)} strings: [{head}{', ...' if len(self) > 4 else ''}])"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file (mirrors ggml's ``gguf_tensor_info``).

    Attributes:
        name: the tensor's name.
        type: its element :class:`~ggmlpy.types.Type`.
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
        :func:`block_swap_fields`) byte-swapped.
        """
        if self.byte_order == "<" or self.nbytes == 0:
            return self.data
        return _to_little(self.data.reshape(-1), self.type, self.byte_order).reshape(
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
            yield off, _to_little(flat[off:off + step], self.type, self.byte_order)


def _to_little(raw: np.ndarray, t: Type, order: str) -> np.ndarray:
    """1-D uint8 ``raw`` (whole blocks of ``t`` in byte order ``order``) in little-endian layout."""
    fields = block_swap_fields(t)
    if order == "<" or not fields or not len(raw):
        return raw
    blocks = np.array(raw).reshape(-1, t.type_size)
    for start, width in fields:
        f = blocks[:, start:start + width]
        f[...] = f[:, ::-1].copy()
    return blocks.reshape(-1)


class _Cursor:
    """Position in the mapped file with checked reads; every failure is a GGUFError."""

    __slots__ = ("path", "buf", "size", "pos", "order", "_u32", "_u64")

    def __init__(self, path: str, buf: Any, size: int, order: str) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0
        self.set_order(order)

    def set_order(self, order: str) -> None:
        self.order = order
        self._u32 = struct.Struct(order + "I").unpack_from
        self._u64 = struct.Struct(order + "Q").unpack_from

    def error(self, reason: str, tensor: str | None = None) -> GGUFError:
        return GGUFError(self.path, reason, tensor)

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.error(f"truncated at byte {self.size} while reading {what}: it needs "
                             f"{n} bytes from byte {self.pos}, the file has "
                             f"{self.size - self.pos} left")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = self._u32(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = self._u64(self.buf, self.pos)
        self.pos += 8
        return v

    def raw_string(self, what: str) -> tuple[int, bytes]:
        """(file offset of the bytes, bytes) of a length-prefixed string."""
        n = self.u64(f"the length of {what}")
        if n > self.size - self.pos:
            raise self.error(f"{what} declares {n} bytes at byte {self.pos}, but the file has "
                             f"{self.size - self.pos} left")
        at = self.pos
        self.pos += n
        return at, bytes(self.buf[at:at + n])


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
            strings a :class:`StringArray`; an array of arrays a ``list`` of such arrays (never
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
        c = _Cursor(self.path, self._mmap, self.file_size, "<")
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

    def _read_kv(self, c: _Cursor, i: int) -> None:
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
            value = self._read_scalar(c, vt, f"the value of key {key!r}", key)
        self.fields[key] = value
        self.field_types[key] = (vt, sub)

    def _value_type(self, c: _Cursor, what: str) -> ValueType:
        at = c.pos
        raw = c.u32(what)
        try:
            return ValueType(raw)
        except ValueError:
            raise c.error(f"{what} at byte {at} is {raw}, not a GGUF value type (0..12)") from None

    def _read_scalar(self, c: _Cursor, vt: ValueType, what: str, key: str) -> Any:
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

    def _read_array(self, c: _Cursor, key: str, depth: int) -> tuple[Any, ValueType]:
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
            return self._read_string_array(c, key, name, n), et
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

    def _read_string_array(self, c: _Cursor, key: str, name: str, n: int) -> StringArray:
        starts, lens = _string_offsets(self._u8, c, name, n)
        total = int(lens.sum()) if n else 0
        if n:
            # gather the string bytes (everything from the first length prefix to the end of the
            # last string, less the n 8-byte prefixes)
            first = int(starts[0]) - 8
            end = int(starts[-1] + lens[-1])
            keep = np.ones(end - first, bool)
            pref = starts - (8 + first)
            for k in range(8):
                keep[pref + k] = False
            blob_u8 = self._u8[first:end][keep]
            c.pos = end
        else:
            blob_u8 = np.zeros(0, np.uint8)
        blob = blob_u8.tobytes()
        bounds = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=bounds[1:])
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError as e:
            j = int(np.searchsorted(bounds, e.start, side="right")) - 1
            raise c.error(f"element {j} of {name} (at byte {int(starts[j])}) is not valid UTF-8 "
                          f"(byte {int(starts[j]) + e.start - int(bounds[j])})") from None
        if len(text) == total:  # ASCII: characters and bytes line up
            chars = bounds
        else:
            # a string starting with a continuation byte would decode as part of its neighbour
            head = blob_u8[bounds[:-1][lens > 0]]
            bad = np.flatnonzero((head & 0xC0) == 0x80)
            if len(bad):
                j = int(np.flatnonzero(lens > 0)[bad[0]])
                raise c.error(f"element {j} of {name} (at byte {int(starts[j])}) is not valid "
                              "UTF-8 (starts with a continuation byte)")
            lead = np.zeros(total + 1, np.int64)
            np.cumsum((blob_u8 & 0xC0) != 0x80, out=lead[1:])
            chars = lead[bounds]
        return StringArray(text, chars, bounds, blob)

    def _set_alignment(self, c: _Cursor) -> None:
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

    def _read_tensor_info(self, c: _Cursor, i: int, seen: set[str]
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
        n_el = 1
        for v in ne:
            n_el *= v
        if n_el > _INT64_MAX:
            raise c.error(f"ne = {ne} has {n_el} elements, more than int64 can count", name)
        ne0 = ne[0] if ne else 1  # missing dimensions are 1, as in ggml
        if ne0 % t.blck_size:
            raise c.error(f"ne[0] = {ne0} is not a multiple of the block size {t.blck_size} "
                          f"of {t.type_name}", name)
        nbytes = n_el // t.blck_size * t.type_size
        if nbytes > _INT64_MAX:
            raise c.error(f"ne = {ne} of {t.type_name} takes {nbytes} bytes, more than int64 "
                          "can count", name)
        offset = c.u64(f"the data offset of tensor {name!r}")
        if offset % self.alignment:
            raise c.error(f"data offset {offset} is not a multiple of the alignment "
                          f"{self.alignment}", name)
        return name, t, tuple(ne), offset, nbytes

    def _place_tensors(self, c: _Cursor, infos: list) -> None:
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


def _string_offsets(u8: np.ndarray, c: _Cursor, name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(content start, length) of each of the ``n`` strings of an array at ``c.pos``, int64.

    Every length is checked against the bytes left. Each prefix's position depends on the
    previous length, so the prefixes are walked in runs: :func:`_short_run` takes a run of
    strings shorter than 256 bytes at once (vectorised), and a string it cannot take (a longer
    or an empty one, or one whose bytes look like a short prefix) is read the exact way, after
    which runs are tried again. Leaves ``c.pos`` at the end of the last string.
    """
    starts = np.empty(n, np.int64)
    lens = np.empty(n, np.int64)
    unpack = struct.Struct(c.order + "Q").unpack_from
    buf, size = c.buf, c.size
    j, p = 0, c.pos
    window = 1 << 12
    exact_until = 0  # after a short run, read this many strings the exact way before retrying
    while j < n:
        if n - j >= 64 and j >= exact_until:
            k, filled = _short_run(u8, c.order, p, n - j, size, window, starts[j:], lens[j:])
            if k:
                used = int(starts[j + k - 1] + lens[j + k - 1]) - p
                j += k
                p += used
                if k < 16:
                    exact_until = j + 64
                # a run that filled its window asks for a bigger one, a broken run for one about
                # its size; never much more than the rest needs at the mean length so far
                window = window * 4 if filled else max(1 << 12, 2 * used)
                window = min(window, (p - c.pos) * (n - j) // j * 5 // 4 + (1 << 12))
                continue
            exact_until = j + 64
        if p + 8 > size:
            raise c.error(f"truncated at byte {size} while reading the length of element {j} of "
                          f"{name} (at byte {p})")
        (ln,) = unpack(buf, p)
        p += 8
        if ln > size - p:
            raise c.error(f"element {j} of {name} declares {ln} bytes at byte {p}, but the file "
                          f"has {size - p} left")
        starts[j] = p
        lens[j] = ln
        p += ln
        j += 1
    c.pos = p
    return starts, lens


def _short_run(u8: np.ndarray, order: str, p: int, m: int, size: int, window: int,
               starts: np.ndarray, lens: np.ndarray) -> tuple[int, bool]:
    """Strings shorter than 256 bytes from byte ``p`` on, at most ``m`` of them, at once.

    The candidates are the positions in ``[p, p + window)`` whose 8-byte word (in the file's
    order) is below 256, found with one comparison per word for each of the 8 alignments. From
    ``p`` on, as long as each candidate's length leads exactly to the next candidate, that chain
    is the one the length prefixes define (it starts at a true prefix and each step follows the
    prefix), so its strings are taken; the run stops where the chain breaks.

    Returns:
        ``(strings taken, whether the run went on to the end of the window)``; writes their content starts and lengths into
        ``starts[:k]`` and ``lens[:k]``. ``k`` is 0 when ``p`` does not hold a length below 256.
    """
    end = min(size, p + min(window, 264 * m + 8))
    region = u8[p:end]
    nw = len(region)
    dt = np.dtype(order + "u8")
    parts = [np.flatnonzero(np.frombuffer(region, dt, count=(nw - a) // 8, offset=a) < 256) * 8 + a
             for a in range(min(8, nw - 7)) if nw - a >= 8]
    if not parts:
        return 0, False
    pos = np.sort(np.concatenate(parts))
    if not len(pos) or pos[0] != 0:
        return 0, False
    ln = region[pos + (0 if order == "<" else 7)].astype(np.int64)
    nxt = pos + 8 + ln
    brk = np.flatnonzero(nxt[:-1] != pos[1:])
    k = int(brk[0]) + 1 if len(brk) else len(pos)
    k = min(k, m)
    if int(nxt[k - 1]) > nw:  # the last string runs past the window (or the file)
        k -= 1
    if k <= 0:
        return 0, False
    starts[:k] = pos[:k] + 8 + p
    lens[:k] = ln[:k]
    return k, int(nxt[k - 1]) + 264 >= nw
