"""A checked read position in a mapped GGUF file (the reads of gguf.cpp's ``gguf_reader``).

Every read first checks the bytes left and raises :class:`~ggmlpy.core.errors.GGUFError` naming
the file, what was being read and the byte offsets.
"""

from __future__ import annotations

import struct
from typing import Any

from ggmlpy.core.errors import GGUFError

__all__ = ["Cursor"]


class Cursor:
    """Position ``pos`` in the mapped file ``buf`` (``size`` bytes) read in byte order ``order``
    (``"<"`` or ``">"``); every failed read raises a GGUFError naming ``path``."""

    __slots__ = ("path", "buf", "size", "pos", "order", "_u32", "_u64")

    def __init__(self, path: str, buf: Any, size: int, order: str) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0
        self.set_order(order)

    def set_order(self, order: str) -> None:
        """Read the following fields in byte order ``order``."""
        self.order = order
        self._u32 = struct.Struct(order + "I").unpack_from
        self._u64 = struct.Struct(order + "Q").unpack_from

    def error(self, reason: str, tensor: str | None = None) -> GGUFError:
        """A GGUFError naming the file (and ``tensor``) with ``reason``; to raise."""
        return GGUFError(self.path, reason, tensor)

    def left(self) -> int:
        """Bytes left from ``pos`` to the end of the file."""
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        """Raise a GGUFError unless ``n`` bytes are left for reading ``what``."""
        if n > self.size - self.pos:
            raise self.error(f"truncated at byte {self.size} while reading {what}: it needs "
                             f"{n} bytes from byte {self.pos}, the file has "
                             f"{self.size - self.pos} left")

    def u32(self, what: str) -> int:
        """Read the u32 ``what``."""
        self.need(4, what)
        (v,) = self._u32(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        """Read the u64 ``what``."""
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
