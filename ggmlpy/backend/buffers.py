"""Buffer implementations that belong to no backend: the zero-size buffer and ggml's multi-buffer.

:mod:`ggmlpy.backend.interface` is the backend contract (what a buffer *is*); the two classes here are
implementations of that contract shared by every backend, so they live beside it:

* :class:`_ZeroBuffer`: what ``BufferType.alloc_buffer(0)`` returns for any buffer type;
* :class:`MultiBuffer`: several buffers of one buffer type acting as one (the allocators return
  it when a buffer type's max size forces several chunks).

``BufferType.alloc_buffer(0)`` imports this module late (it subclasses the contract's ``Buffer``).
"""

from __future__ import annotations

import numpy as np

from ggmlpy.backend.interface import Buffer, BufferUsage

__all__ = ["MultiBuffer"]


class _ZeroBuffer(Buffer):
    """The zero-size buffer ggml returns for ``alloc_buffer(0)``: no memory, every hook a no-op."""

    def _set_tensor(self, tensor, data, offset):  # noqa: D401
        pass

    def _get_tensor(self, tensor, offset, size):
        return np.empty(0, np.uint8)

    def _memset_tensor(self, tensor, value, offset, size):
        pass

    def _clear(self, value):
        pass

    def _array(self, tensor):
        return np.empty(tensor.ne[::-1], tensor.type.dtype)


class MultiBuffer(Buffer):
    """Several buffers of one buffer type acting as one (mirrors ggml's multi-buffer).

    Tensors keep pointing at the child buffers; the multi-buffer only frees, clears and sets the
    usage of all of them. ``size`` is the sum of the children's sizes.

    Raises:
        ValueError: no children, or children of different buffer types.
    """

    def __init__(self, buffers: list[Buffer]) -> None:
        if not buffers:
            raise ValueError("MultiBuffer needs at least one buffer")
        buft = buffers[0].buft
        if any(b.buft is not buft for b in buffers):
            raise ValueError("MultiBuffer: all buffers must share one buffer type")
        super().__init__(buft, sum(b.size for b in buffers))
        self.buffers = list(buffers)

    def _free(self) -> None:
        for b in self.buffers:
            b.free()

    def _clear(self, value: int) -> None:
        for b in self.buffers:
            b.clear(value)

    def set_usage(self, usage: BufferUsage) -> None:
        """Set the usage of the multi-buffer and of every child (mirrors ``ggml_backend_multi_buffer_set_usage``)."""
        super().set_usage(usage)
        for b in self.buffers:
            b.set_usage(usage)
