"""Exceptions raised by ggmlpy.

Misuse raises at once with a subclass of ``ValueError``/``TypeError``/``IndexError`` naming the
tensor and the violated condition; runtime outcomes (out of memory, a backend failure) use the
dedicated classes below or a :class:`~ggmlpy.backend.interface.Status`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GgmlpyError", "OutOfMemoryError", "NotAllocatedError", "UnsupportedOpError",
           "GraphFullError", "BackendUnavailableError", "ComputeError", "FileFormatError",
           "GGUFError"]


class GgmlpyError(Exception):
    """Base class of every ggmlpy-specific exception."""


class OutOfMemoryError(GgmlpyError, MemoryError):
    """A buffer allocation failed for lack of memory.

    Attributes:
        requested: bytes asked for.
        free: bytes the device reported free at the time (``None`` when unknown).
        where: the buffer type or device name.
    """

    def __init__(self, where: str, requested: int, free: int | None = None, detail: str = "") -> None:
        self.where = where
        self.requested = int(requested)
        self.free = None if free is None else int(free)
        free_s = "unknown" if free is None else f"{self.free} bytes"
        msg = f"{where}: out of memory allocating {self.requested} bytes (free: {free_s})"
        super().__init__(msg + (f"; {detail}" if detail else ""))


class NotAllocatedError(GgmlpyError, ValueError):
    """A tensor that needs memory (to read, write or compute) has none."""


class UnsupportedOpError(GgmlpyError, ValueError):
    """A backend was asked to compute an op/type combination it does not support."""


class GraphFullError(GgmlpyError, ValueError):
    """A graph ran out of node or leaf slots (its ``size``)."""


class BackendUnavailableError(GgmlpyError, RuntimeError):
    """A named backend or device does not exist or cannot be initialised here."""


class ComputeError(GgmlpyError, RuntimeError):
    """A backend failed while computing a graph (carries the failing node when known)."""


class FileFormatError(GgmlpyError, ValueError):
    """A file exists but cannot be used (truncated, not the expected format, inconsistent). The
    message is one line: ``"<path>[: tensor '<name>']: <reason>"``.

    Attributes:
        path: the file.
        tensor: the tensor at fault, or None when the fault is not in one tensor.
        reason: what is wrong, in words (whitespace collapsed to one line).
    """

    def __init__(self, path: Any, reason: str, tensor: str | None = None) -> None:
        self.path = str(path)
        self.tensor = tensor
        self.reason = " ".join(str(reason).split())
        where = f"{self.path}: tensor '{tensor}'" if tensor is not None else self.path
        super().__init__(f"{where}: {self.reason}")


class GGUFError(FileFormatError):
    """A GGUF file cannot be read: bad header or metadata, a tensor of an unknown or unsupported
    type, a misaligned or truncated tensor. The message names the file and, when one is at fault,
    the tensor.

    Attributes:
        path: the file.
        tensor: the tensor's name, or None when the fault is not in one tensor.
        reason: what is wrong, in words.
    """
