"""Allocators: ggml-alloc's linear allocator and the context allocation helpers.

Two tools here place tensors in backend memory (mirrors ``ggml-alloc.h`` / ``ggml-backend.h``):

* :class:`TensorAllocator` (ggml's ``ggml_tallocr``): a bump allocator inside one existing buffer.
* :func:`alloc_ctx_tensors_from_buft` / :func:`alloc_ctx_tensors` (ggml's
  ``ggml_backend_alloc_ctx_tensors*``): every unallocated tensor of a context in one buffer (or
  several, wrapped in a :class:`~ggmlpy.backend.buffers.MultiBuffer`, when the buffer type has a max size).

The graph allocator (ggml's ``ggml_gallocr``) lives in :mod:`ggmlpy.alloc.gallocr`.

All sizes and offsets are in **bytes**. All calls are synchronous and only touch tensor metadata
and buffer allocation; no tensor data is read or written.
"""

from __future__ import annotations

import logging

from ggmlpy.alloc.dyn_alloc import _pad
from ggmlpy.backend.buffers import MultiBuffer
from ggmlpy.backend.interface import Backend, Buffer, BufferType, Status, tensor_alloc, view_init
from ggmlpy.core.check import checked_args
from ggmlpy.core.errors import OutOfMemoryError
from ggmlpy.core.tensor import Context, Tensor

__all__ = ["TensorAllocator", "alloc_ctx_tensors_from_buft", "alloc_ctx_tensors",
           "alloc_ctx_tensors_size"]

log = logging.getLogger("ggmlpy.alloc.tallocr")

# =================================================================================================
# tallocr
# =================================================================================================


class TensorAllocator:
    """A bump allocator placing tensors one after another in one buffer (mirrors ``ggml_tallocr``).

    ``TensorAllocator(buffer)`` mirrors ``ggml_tallocr_new``: the first tensor goes at offset 0
    (buffer bases are aligned in ggmlpy). Each :meth:`alloc` takes the buffer type's
    ``get_alloc_size(tensor)`` rounded up to its alignment. Nothing is ever freed.

    Args:
        buffer: a live buffer holding memory (not a :class:`~ggmlpy.backend.buffers.MultiBuffer`).

    Attributes:
        buffer: the buffer.
        alignment: the buffer type's alignment in bytes.
        offset: the next free byte offset (always a multiple of ``alignment``).

    Raises:
        TypeError: ``buffer`` is not a Buffer. ValueError: it is a MultiBuffer (it has no memory of
        its own; allocate into its children). NotAllocatedError: it was freed.
    """

    def __init__(self, buffer: Buffer) -> None:
        if not isinstance(buffer, Buffer):
            raise TypeError(f"TensorAllocator: expected a Buffer, got {type(buffer).__name__}")
        if isinstance(buffer, MultiBuffer):
            raise ValueError(f"TensorAllocator: buffer {buffer.name} is a MultiBuffer; "
                             "allocate into one of its buffers")
        buffer._check_live()
        align = buffer.get_alignment()
        if align <= 0 or align & (align - 1):
            raise ValueError(f"TensorAllocator: alignment {align} of {buffer.name} is not a power of two")
        self.buffer = buffer
        self.alignment = align
        self.offset = 0

    @property
    def free_bytes(self) -> int:
        """Bytes left after :attr:`offset`."""
        return self.buffer.size - self.offset

    def alloc(self, tensor: Tensor) -> Status:
        """Place ``tensor`` at the current offset and advance it (mirrors ``ggml_tallocr_alloc``).

        Returns:
            The :class:`~ggmlpy.backend.interface.Status` of the buffer's ``init_tensor``.

        Raises:
            OutOfMemoryError: the padded size does not fit in the bytes left (``requested`` is the
                padded size, ``free`` the bytes left); nothing changes. (ggml aborts here.)
            ValueError: the tensor already has memory or is a view (from ``tensor_alloc``).
        """
        size = _pad(self.buffer.get_alloc_size(tensor), self.alignment)
        if self.offset + size > self.buffer.size:
            log.error("TensorAllocator: not enough space in buffer %s for tensor '%s' "
                      "(needed %d bytes, available %d bytes)", self.buffer.name, tensor.name,
                      size, self.free_bytes)
            raise OutOfMemoryError(self.buffer.name, size, self.free_bytes,
                                   f"tensor '{tensor.name}' does not fit in the buffer")
        status = tensor_alloc(self.buffer, tensor, self.offset)
        self.offset += size
        return status



# =================================================================================================
# context allocation
# =================================================================================================


def _ctx_ranges(ctx: Context, buft: BufferType, fn: str) -> tuple[list[tuple[int, int, int]], int]:
    """Split ``ctx``'s tensors into ``(first, end, bytes)`` index ranges at the max size.

    Raises:
        ValueError: a tensor alone is larger than ``buft``'s max size (named, with the sizes).
    """
    align = buft.get_alignment()
    max_size = buft.get_max_size()
    tensors = ctx.tensors
    ranges: list[tuple[int, int, int]] = []
    first, cur, total = 0, 0, 0
    for i, t in enumerate(tensors):
        this = 0
        if t._offset is None and t._buffer is None and t.view_src is None:
            this = _pad(buft.get_alloc_size(t), align)
            if this > max_size:
                # ggml logs "tensor is too large to fit in a buffer" and returns NULL; never
                # allocate it anyway (a later NumPy/device failure would not name the tensor)
                raise ValueError(f"{fn}: tensor '{t.name}' ({t.type.type_name}, ne={list(t.ne)}) "
                                 f"needs {this} bytes, more than the max size {max_size} bytes "
                                 f"of a {buft.name} buffer")
        if cur > 0 and cur + this > max_size:
            ranges.append((first, i, cur))
            total += cur
            first, cur = i, this
        else:
            cur += this
    if cur > 0:
        ranges.append((first, len(tensors), cur))
        total += cur
    return ranges, total


def _check_ctx(ctx: Context, buft: BufferType, fn: str) -> None:
    if not isinstance(ctx, Context):
        raise TypeError(f"{fn}: expected a Context, got {type(ctx).__name__}")
    if not isinstance(buft, BufferType):
        raise TypeError(f"{fn}: expected a BufferType, got {type(buft).__name__}")
    if not ctx.no_alloc:
        raise ValueError(f"{fn}: the context was created with no_alloc=False; its tensors "
                         "already have memory")


@checked_args
def alloc_ctx_tensors_size(ctx: Context, buft: BufferType) -> int:
    """Bytes :func:`alloc_ctx_tensors_from_buft` would allocate for ``ctx`` in ``buft``
    (mirrors ``ggml_backend_alloc_ctx_tensors_from_buft_size``): the padded alloc sizes of every
    tensor that has no memory and is not a view.

    Raises:
        TypeError: wrong argument types. ValueError: ``ctx`` is not ``no_alloc``, or a tensor
            is larger than ``buft``'s max size.
    """
    _check_ctx(ctx, buft, "alloc_ctx_tensors_size")
    return _ctx_ranges(ctx, buft, "alloc_ctx_tensors_size")[1]


@checked_args
def alloc_ctx_tensors_from_buft(ctx: Context, buft: BufferType) -> Buffer | None:
    """Allocate every unallocated tensor of ``ctx`` in new ``buft`` memory
    (mirrors ``ggml_backend_alloc_ctx_tensors_from_buft``).

    Tensors are visited in creation order and placed with a :class:`TensorAllocator`; a new
    buffer starts whenever the current one would pass ``buft.get_max_size()``, and several buffers
    come back wrapped in one :class:`~ggmlpy.backend.buffers.MultiBuffer`. Views without memory are
    initialised from their ``view_src`` (``view_init``); views whose ``view_src`` has no backend
    memory are left alone. Tensors that already have memory are not touched.

    Returns:
        The buffer (or MultiBuffer), or None when there was nothing to allocate (ggml returns
        NULL then too).

    Raises:
        TypeError: wrong argument types. ValueError: ``ctx`` is not ``no_alloc``, or a tensor
            alone needs more than ``buft.get_max_size()`` bytes (the tensor, its size and the max
            size are named; nothing is allocated; ggml logs and returns NULL).
        OutOfMemoryError: a buffer could not be allocated (ggml returns NULL). Every buffer this
            call allocated is freed and every tensor it placed is reset to unallocated first.
    """
    _check_ctx(ctx, buft, "alloc_ctx_tensors_from_buft")
    ranges, _ = _ctx_ranges(ctx, buft, "alloc_ctx_tensors_from_buft")
    tensors = ctx.tensors
    buffers: list[Buffer] = []
    placed: list[Tensor] = []
    rng = (0, 0, 0)
    try:
        for rng in ranges:
            first, end, size = rng
            buf = buft.alloc_buffer(size)
            buffers.append(buf)
            talloc = TensorAllocator(buf)
            for t in tensors[first:end]:
                if t._offset is not None or t._buffer is not None:
                    continue  # already has memory
                if t.view_src is None:
                    talloc.alloc(t)
                    placed.append(t)
                elif t.view_src.is_allocated:
                    view_init(t)
                    placed.append(t)
        # views split off into a trailing range with no bytes of its own (ggml skips them)
        if buffers:
            for t in tensors:
                if t.view_src is not None and t._buffer is None and t.view_src.is_allocated:
                    view_init(t)
                    placed.append(t)
    except Exception as e:
        log.error("alloc_ctx_tensors_from_buft: failed to allocate %s buffers of %s bytes: %s",
                  buft.name, [r[2] for r in ranges], e)
        for t in placed:
            t.buffer = None
            t.offset = None
        for b in buffers:
            b.free()
        if isinstance(e, OutOfMemoryError):
            # name the tensors: the buffer type's error knows only the byte count
            own = [t for t in tensors[rng[0]:rng[1]] if t.view_src is None]
            if own:
                big = max(own, key=lambda t: t.nbytes)
                raise OutOfMemoryError(
                    e.where, e.requested, e.free,
                    f"alloc_ctx_tensors_from_buft: buffer for {len(own)} tensor(s) of the "
                    f"context, the largest '{big.name}' ({big.type.type_name}, ne={list(big.ne)}, "
                    f"{big.nbytes} bytes)") from e
        raise
    if not buffers:
        return None
    if len(buffers) == 1:
        return buffers[0]
    return MultiBuffer(buffers)


@checked_args
def alloc_ctx_tensors(ctx: Context, backend: Backend) -> Buffer | None:
    """:func:`alloc_ctx_tensors_from_buft` with ``backend``'s default buffer type
    (mirrors ``ggml_backend_alloc_ctx_tensors``)."""
    if not isinstance(backend, Backend):
        raise TypeError(f"alloc_ctx_tensors: expected a Backend, got {type(backend).__name__}")
    return alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
