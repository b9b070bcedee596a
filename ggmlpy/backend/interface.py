"""The backend interface: buffer types, buffers, backends (streams), devices, registries, events.

This module is the backend contract in one place (mirrors ``ggml-backend.h`` / ``ggml-backend-impl.h``).
Every class has two layers:

* **facade** methods (public names, e.g. ``buft.alloc_buffer(size)``) validate arguments, bounds and
  allocation state, and apply ggml's documented default for every optional hook;
* **hooks** (the ``_``-prefixed methods, e.g. ``_alloc_buffer``) are what a backend implements.
  Required hooks raise ``NotImplementedError("need ...")`` in the base class; optional ones have the
  default ggml gives a NULL slot.

Capabilities (async, host_buffer, events, buffer_from_host_ptr) are data on
:class:`DeviceCaps`, not probed with ``hasattr``. What is not contract lives beside this module:
the tensor set/get/memset/copy functions and their one fallback ladder
(:mod:`ggmlpy.backend.tensor_data`), the zero-size and multi-buffer (:mod:`ggmlpy.backend.buffers`)
and the buffers' write generations (:func:`buffer_written`, ... in :mod:`ggmlpy.backend.write_gen`).
"""

from __future__ import annotations

import functools
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from ggmlpy.backend.write_gen import (
    _DATA_GEN,
    WriteTracked,
    _writes_landed,
    buffer_write_queued,
    buffer_written,
    wait_host_reads,
)
from ggmlpy.core import snapshot as _snapshot
from ggmlpy.core.check import checked_args
from ggmlpy.core.errors import NotAllocatedError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Tensor

__all__ = [
    "Status", "BufferUsage", "DeviceType", "DeviceCaps", "DeviceProps",
    "BufferType", "Buffer", "Backend", "Device", "Reg", "Event",
    "tensor_buffer", "tensor_alloc", "view_init",
    "event_new", "event_record", "event_wait", "event_synchronize", "event_query",
    "buffer_written", "buffer_write_queued",
]


class Status(IntEnum):
    """Result of a compute call (mirrors ``enum ggml_status``)."""

    ALLOC_FAILED = -2
    FAILED = -1
    SUCCESS = 0
    ABORTED = 1


class BufferUsage(IntEnum):
    """What a buffer holds (mirrors ``enum ggml_backend_buffer_usage``); the scheduler reads it."""

    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class DeviceType(IntEnum):
    """Kind of device (mirrors ``enum ggml_backend_dev_type``)."""

    CPU = 0
    GPU = 1
    IGPU = 2
    ACCEL = 3


@dataclass(frozen=True)
class DeviceCaps:
    """Device capabilities (mirrors ``struct ggml_backend_dev_caps``).

    Attributes:
        async_: backends of this device implement async set/get/copy and ``graph_compute``
            returns before the work ends.
        host_buffer: the device has a pinned host buffer type (``get_host_buffer_type``).
        buffer_from_host_ptr: ``buffer_from_host_ptr`` wraps user host memory without a copy.
        events: ``event_new`` returns events for this device.
    """

    async_: bool = False
    host_buffer: bool = False
    buffer_from_host_ptr: bool = False
    events: bool = False


@dataclass
class DeviceProps:
    """Device properties (mirrors ``struct ggml_backend_dev_props``).

    Attributes:
        name, description: as shown by ``python -m ggmlpy devices``.
        memory_free, memory_total: bytes (0/0 when the device has nothing to report).
        type: :class:`DeviceType`.
        device_id: PCI bus id or None.
        caps: :class:`DeviceCaps`.
        extra: backend-specific facts (e.g. ``compute_capability`` for CUDA).
    """

    name: str
    description: str
    memory_free: int
    memory_total: int
    type: DeviceType
    device_id: str | None = None
    caps: DeviceCaps = field(default_factory=DeviceCaps)
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# buffer type


class BufferType:
    """A kind of memory a backend can allocate (mirrors ``ggml_backend_buffer_type``).

    Buffer types are long-lived singletons compared by identity.

    Hooks (a subclass implements the required ones; the others have ggml's default):

    * ``_alloc_buffer(size) -> Buffer``, ``_get_alignment() -> int``: required;
    * ``_get_max_size() -> int`` (optional, default ``sys.maxsize``: no limit);
    * ``_get_alloc_size(tensor) -> int`` (optional, default ``tensor.nbytes``);
    * ``_is_host() -> bool`` (optional, default False).

    Args:
        name: e.g. "CPU", "CUDA0", "CUDA_Host", "SIM0".
        device: the owning :class:`Device` (None for the CPU buffer type, as in ggml).
    """

    def __init__(self, name: str, device: Device | None = None) -> None:
        self.name = name
        self.device = device

    # facade -----------------------------------------------------------------------------------
    def alloc_buffer(self, size: int) -> Buffer:
        """Allocate a buffer of ``size`` bytes (mirrors ``ggml_backend_buft_alloc_buffer``).

        ``size == 0`` returns a zero-size buffer without calling the backend. Synchronous.

        Raises:
            TypeError: ``size`` is not an int (a bool, float or str is refused, not truncated).
            ValueError: negative size.
            OutOfMemoryError: the backend could not allocate (carries requested/free bytes).
        """
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"{self.name}: alloc_buffer size must be an int (bytes), got "
                            f"{type(size).__name__} {size!r}")
        size = int(size)
        if size < 0:
            raise ValueError(f"{self.name}: alloc_buffer size must be >= 0, got {size}")
        if size == 0:
            return _zero_buffer_class()(self, 0)
        return self._alloc_buffer(size)

    def get_alignment(self) -> int:
        """Alignment in bytes of tensor offsets (a power of two; mirrors ``ggml_backend_buft_get_alignment``)."""
        return self._get_alignment()

    def get_max_size(self) -> int:
        """Largest single buffer in bytes (``sys.maxsize`` when unlimited; mirrors ``ggml_backend_buft_get_max_size``)."""
        return self._get_max_size()

    def get_alloc_size(self, tensor: Tensor) -> int:
        """Bytes ``tensor`` needs in this buffer type, padding included (mirrors ``ggml_backend_buft_get_alloc_size``)."""
        return self._get_alloc_size(tensor)

    def is_host(self) -> bool:
        """True when the memory is host-addressable in ggml's layout (mirrors ``ggml_backend_buft_is_host``)."""
        return self._is_host()

    def get_device(self) -> Device | None:
        """The owning device, or None for the CPU buffer type (mirrors ``ggml_backend_buft_get_device``)."""
        return self.device

    # hooks ------------------------------------------------------------------------------------
    def _alloc_buffer(self, size: int) -> Buffer:
        raise NotImplementedError(f"{type(self).__name__} needs _alloc_buffer")

    def _get_alignment(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} needs _get_alignment")

    def _get_max_size(self) -> int:
        return sys.maxsize

    def _get_alloc_size(self, tensor: Tensor) -> int:
        return tensor.nbytes

    def _is_host(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<BufferType {self.name}>"


@functools.cache
def _zero_buffer_class() -> type[Buffer]:
    from ggmlpy.backend.buffers import _ZeroBuffer  # a subclass of Buffer: imported when first needed

    return _ZeroBuffer


# ---------------------------------------------------------------------------------------------
# buffer


class Buffer(WriteTracked):
    """A block of backend memory holding tensors (mirrors ``ggml_backend_buffer``).

    Tensors point into a buffer with ``(tensor.buffer, tensor.offset)``.

    Hooks:

    * ``_set_tensor``, ``_get_tensor``, ``_memset_tensor``, ``_clear``, ``_array``: required;
    * ``_free()`` (optional, default: nothing to release);
    * ``_init_tensor(tensor) -> Status`` (optional, default ``Status.SUCCESS``);
    * ``_reset()`` (optional, default: nothing);
    * ``_cpy_tensor(src, dst) -> bool`` (optional, default False: the caller copies through the
      host);
    * ``_get_tensor_into(tensor, out)`` (optional, default: through ``_get_tensor``);
    * ``_host_view(tensor) -> np.ndarray | None`` (optional, default None: memory the host cannot
      address).

    Attributes:
        buft: the :class:`BufferType` that made it.
        size: bytes.
        usage: :class:`BufferUsage` (ANY until set).
        freed: True after :meth:`free`; every data access then raises.
        _data_gen: the process-wide write generation of the buffer's bytes (see
            :func:`buffer_written`); ``_async_writes``: writes queued on a stream and not yet
            known to have landed (see :func:`buffer_write_queued`). Read by the weight cache.
    """

    def __init__(self, buft: BufferType, size: int) -> None:
        self.buft = buft
        self.size = int(size)
        self.usage = BufferUsage.ANY
        self.freed = False
        self._data_gen = next(_DATA_GEN)
        self._async_writes = 0

    # facade -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The buffer type's name (mirrors ``ggml_backend_buffer_name``)."""
        return self.buft.name

    @property
    def data_gen(self) -> int:
        """The process-wide write generation of the buffer's bytes (read-only): raised by every
        write (:func:`~ggmlpy.backend.write_gen.buffer_written`), never lowered; caches of
        converted data compare it."""
        return self._data_gen

    @property
    def async_writes(self) -> int:
        """Writes queued on a stream and not yet known to have landed (read-only; counted up by
        :func:`~ggmlpy.backend.write_gen.buffer_write_queued`, back to 0 when the queuing
        backend's ``synchronize()`` returns)."""
        return self._async_writes

    def free(self) -> None:
        """Release the memory (mirrors ``ggml_backend_buffer_free``). Idempotent.

        A device buffer with work in flight waits for that work first (the runtime's ``_free``);
        host memory that queued copies still read waits for them (``wait_host_reads``).
        Tensors still pointing here raise on access afterwards.
        """
        if not self.freed:
            wait_host_reads(self)
            self._free()
            self.freed = True
            buffer_written(self)
            _snapshot.buffer_freed(self)

    def get_size(self) -> int:
        """Size in bytes (mirrors ``ggml_backend_buffer_get_size``)."""
        return self.size

    def clear(self, value: int = 0) -> None:
        """Set every byte to ``value`` (mirrors ``ggml_backend_buffer_clear``). Synchronous.

        Raises:
            ValueError: ``value`` outside 0..255 or the buffer was freed.
        """
        if not 0 <= int(value) <= 255:
            raise ValueError(f"{self.name}: clear value must be a byte (0..255), got {value}")
        self._check_live()
        if self.size:
            wait_host_reads(self)  # (queued copies may still read this host memory)
            self._clear(int(value))
            buffer_written(self)

    def set_usage(self, usage: BufferUsage) -> None:
        """Record what the buffer holds (mirrors ``ggml_backend_buffer_set_usage``)."""
        self.usage = BufferUsage(usage)

    def get_usage(self) -> BufferUsage:
        """The buffer's :class:`BufferUsage` (mirrors ``ggml_backend_buffer_get_usage``)."""
        return self.usage

    def get_type(self) -> BufferType:
        """The buffer type (mirrors ``ggml_backend_buffer_get_type``)."""
        return self.buft

    def is_host(self) -> bool:
        """Forwarded to the buffer type (mirrors ``ggml_backend_buffer_is_host``)."""
        return self.buft.is_host()

    def get_alignment(self) -> int:
        """Forwarded to the buffer type (mirrors ``ggml_backend_buffer_get_alignment``)."""
        return self.buft.get_alignment()

    def get_max_size(self) -> int:
        """Forwarded to the buffer type (mirrors ``ggml_backend_buffer_get_max_size``)."""
        return self.buft.get_max_size()

    def get_alloc_size(self, tensor: Tensor) -> int:
        """Forwarded to the buffer type (mirrors ``ggml_backend_buffer_get_alloc_size``)."""
        return self.buft.get_alloc_size(tensor)

    def reset(self) -> None:
        """Clear per-tensor extras (mirrors ``ggml_backend_buffer_reset``); galloc calls it before placing tensors."""
        self._reset()

    def init_tensor(self, tensor: Tensor) -> Status:
        """Let the backend prepare a newly placed tensor (mirrors ``ggml_backend_buffer_init_tensor``)."""
        return self._init_tensor(tensor)

    def _check_live(self) -> None:
        if self.freed:
            raise NotAllocatedError(f"buffer {self.name} of {self.size} bytes was freed")

    # hooks ------------------------------------------------------------------------------------
    def _free(self) -> None:
        pass

    def _init_tensor(self, tensor: Tensor) -> Status:
        return Status.SUCCESS

    def _reset(self) -> None:
        pass

    def _set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int) -> None:
        """Write ``data`` (1-D uint8) at byte ``offset`` from ``tensor.offset``; blocking."""
        raise NotImplementedError(f"{type(self).__name__} needs _set_tensor")

    def _get_tensor(self, tensor: Tensor, offset: int, size: int) -> np.ndarray:
        """Return a new host uint8 array of ``size`` bytes read at ``offset`` from ``tensor.offset``; blocking."""
        raise NotImplementedError(f"{type(self).__name__} needs _get_tensor")

    def _get_tensor_into(self, tensor: Tensor, out: np.ndarray) -> None:
        """Read the tensor's first ``out.size`` bytes into ``out`` (1-D C-contiguous uint8);
        blocking. Default: through :meth:`_get_tensor` (device buffers copy straight in)."""
        out[:] = self._get_tensor(tensor, 0, out.size)

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} needs _memset_tensor")

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """Copy ``src`` (in any buffer) into ``dst`` (in this buffer) directly; False if not possible."""
        return False

    def _clear(self, value: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} needs _clear")

    def _host_view(self, tensor: Tensor) -> np.ndarray | None:
        """Zero-copy view of ``tensor``'s bytes: a 1-D ``uint8`` NumPy array of ``tensor.nbytes``
        bytes from its offset (writes go to the buffer). Host buffers return it; the default is
        None (memory the host cannot address, e.g. device memory). Copy paths use it instead of
        ``isinstance`` checks."""
        return None

    def _array(self, tensor: Tensor) -> Any:
        """The tensor's memory as an array of the runtime's array module (NumPy shape ``ne[::-1]``,
        strides ``nb[::-1]``), for kernels. Non-quantized types only."""
        raise NotImplementedError(f"{type(self).__name__} needs _array")

    def __repr__(self) -> str:
        return f"<Buffer {self.name} {self.size} bytes usage={self.usage.name}>"


# ---------------------------------------------------------------------------------------------
# placing tensors


def tensor_buffer(tensor: Tensor) -> Buffer:
    """The buffer holding ``tensor``'s data: its ``view_src``'s for views (ggml's rule).

    Raises:
        NotAllocatedError: the tensor has no memory, or its buffer was freed.
    """
    buf = tensor.buffer
    if buf is None and tensor.view_src is not None:
        buf = tensor.view_src.buffer
    if buf is None or tensor.offset is None:
        raise NotAllocatedError(f"tensor '{tensor.name}' is not allocated (no buffer/offset)")
    if buf.freed:
        raise NotAllocatedError(f"tensor '{tensor.name}' points into a freed buffer {buf.name}")
    return buf


@checked_args
def tensor_alloc(buffer: Buffer, tensor: Tensor, offset: int) -> Status:
    """Place ``tensor`` at byte ``offset`` of ``buffer`` (mirrors ``ggml_backend_tensor_alloc``).

    Raises:
        ValueError: the tensor already has memory or is a view, or
            ``[offset, offset + alloc_size)`` does not lie inside the buffer.
    """
    if tensor.buffer is not None or tensor.offset is not None:
        raise ValueError(f"tensor_alloc: tensor '{tensor.name}' already has memory")
    if tensor.view_src is not None:
        raise ValueError(f"tensor_alloc: tensor '{tensor.name}' is a view; use view_init")
    size = buffer.get_alloc_size(tensor)
    if offset < 0 or offset + size > buffer.size:
        raise ValueError(f"tensor_alloc: '{tensor.name}' needs {size} bytes at offset {offset}, "
                         f"outside buffer {buffer.name} of {buffer.size} bytes")
    tensor.buffer, tensor.offset = buffer, int(offset)
    return buffer.init_tensor(tensor)


@checked_args
def view_init(tensor: Tensor) -> Status:
    """Give a view its ``view_src``'s memory (mirrors ``ggml_backend_view_init``).

    Raises:
        ValueError: the tensor is not a view. NotAllocatedError: its ``view_src`` has no memory.
    """
    if tensor.view_src is None:
        raise ValueError(f"view_init: tensor '{tensor.name}' is not a view")
    src = tensor.view_src
    if src.buffer is None or src.offset is None:
        raise NotAllocatedError(f"view_init: view '{tensor.name}' of unallocated "
                                f"tensor '{src.name}'")
    tensor.buffer, tensor.offset = src.buffer, src.offset + tensor.view_offs
    return src.buffer.init_tensor(tensor)


# ---------------------------------------------------------------------------------------------
# backend (stream)


class Backend:
    """One execution stream of a device (mirrors ``ggml_backend``).

    Hooks:

    * ``_graph_compute(graph) -> Status``: required;
    * ``_free()`` (optional, default: nothing); ``_synchronize()`` (optional, default: nothing,
      for a backend whose work is done when its calls return);
    * ``_graph_plan_create(graph)``, ``_graph_plan_compute(plan)`` (optional, default: raise
      NotImplementedError, "no graph plans"); ``_graph_plan_update(plan, graph)`` (optional,
      default: free the plan and create a new one); ``_graph_plan_free(plan)`` (optional,
      default: nothing);
    * ``_set_tensor_async``, ``_get_tensor_async``, ``_cpy_tensor_async`` (optional, default
      False: the facade falls back to blocking copies);
    * ``_event_record(event)``, ``_event_wait(event)`` (optional, default: raise
      NotImplementedError; asked only of devices whose caps say ``events``).

    Attributes:
        device: the :class:`Device`.
        guid: a ``uuid.UUID`` identifying the backend kind (mirrors ``ggml_backend_guid``).
    """

    guid: uuid.UUID = uuid.UUID(int=0)

    def __init__(self, device: Device) -> None:
        self.device = device
        self.freed = False

    @property
    def name(self) -> str:
        """The backend's name, e.g. "CPU", "CUDA0" (mirrors ``ggml_backend_name``)."""
        return self.device.name

    def free(self) -> None:
        """Synchronize and release the backend (mirrors ``ggml_backend_free``). Idempotent."""
        if not self.freed:
            self.synchronize()
            self._free()
            self.freed = True

    def get_device(self) -> Device:
        """The device (mirrors ``ggml_backend_get_device``)."""
        return self.device

    def get_default_buffer_type(self) -> BufferType:
        """The device's preferred buffer type (mirrors ``ggml_backend_get_default_buffer_type``)."""
        return self.device.get_buffer_type()

    def alloc_buffer(self, size: int) -> Buffer:
        """Allocate ``size`` bytes in the default buffer type (mirrors ``ggml_backend_alloc_buffer``)."""
        return self.get_default_buffer_type().alloc_buffer(size)

    def get_alignment(self) -> int:
        """Alignment of the default buffer type in bytes (mirrors ``ggml_backend_get_alignment``)."""
        return self.get_default_buffer_type().get_alignment()

    def get_max_size(self) -> int:
        """Max buffer size of the default buffer type in bytes (mirrors ``ggml_backend_get_max_size``)."""
        return self.get_default_buffer_type().get_max_size()

    def synchronize(self) -> None:
        """Block the host until all work queued on this backend is done (mirrors ``ggml_backend_synchronize``).

        Async writes queued through this backend (:func:`buffer_write_queued`) count as landed
        afterwards, also when the hook raises (a failed stream skipped them: nothing is in flight)."""
        try:
            self._synchronize()
        finally:
            if self.__dict__.get("_queued_writes"):
                _writes_landed(self)

    def graph_compute_async(self, graph: Graph) -> Status:
        """Launch ``graph`` on this backend's stream (mirrors ``ggml_backend_graph_compute_async``).

        May return before the work ends (device backends do); the CPU backend computes before it
        returns. Every node and source must be allocated in memory this backend can read.

        Raises:
            TypeError: ``graph`` is not a Graph. NotAllocatedError: a tensor has no memory.
            UnsupportedOpError: a node's op/type combination is not supported by this backend.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"graph_compute: expected a Graph, got {type(graph).__name__}")
        return self._graph_compute(graph)

    def graph_compute(self, graph: Graph) -> Status:
        """Compute ``graph`` and wait for it (mirrors ``ggml_backend_graph_compute``): ``graph_compute_async``
        followed by ``synchronize``. Returns the :class:`Status` of the launch."""
        status = self.graph_compute_async(graph)
        self.synchronize()
        return status

    def graph_plan_create(self, graph: Graph) -> Any:
        """Resolve ``graph`` once into a reusable plan (mirrors ``ggml_backend_graph_plan_create``).

        Valid while the graph and its tensors' (buffer, offset) are unchanged. Synchronous.
        Optional hook: where ggml asserts on a missing slot, the base hook raises.

        Raises:
            TypeError: ``graph`` is not a Graph. NotImplementedError: the backend has no plans.
            NotAllocatedError, UnsupportedOpError: as :meth:`graph_compute_async`.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"graph_plan_create: expected a Graph, got {type(graph).__name__}")
        return self._graph_plan_create(graph)

    def graph_plan_compute(self, plan: Any) -> Status:
        """Run a plan made by this backend's :meth:`graph_plan_create`
        (mirrors ``ggml_backend_graph_plan_compute``). Synchronous on the CPU; device backends
        launch it on their stream and return at once (complete after :meth:`synchronize`).

        Raises:
            ValueError: ``plan`` is None. NotImplementedError: the backend has no plans.
            NotAllocatedError: a buffer the plan uses was freed.
        """
        if plan is None:
            raise ValueError(f"graph_plan_compute: backend {self.name} got no plan (None)")
        return self._graph_plan_compute(plan)

    def graph_plan_update(self, plan: Any, graph: Graph) -> Any:
        """The plan for ``graph`` that replaces ``plan``, which must not be used afterwards
        (mirrors the ``graph_plan_update`` slot). Default hook: :meth:`graph_plan_free` then
        :meth:`graph_plan_create`. Synchronous.

        Raises:
            TypeError: ``graph`` is not a Graph. ValueError: ``plan`` is None.
            NotImplementedError: the backend has no plans.
        """
        if plan is None:
            raise ValueError(f"graph_plan_update: backend {self.name} got no plan (None)")
        if not isinstance(graph, Graph):
            raise TypeError(f"graph_plan_update: expected a Graph, got {type(graph).__name__}")
        return self._graph_plan_update(plan, graph)

    def graph_plan_free(self, plan: Any) -> None:
        """Release a plan made by :meth:`graph_plan_create` (mirrors ``ggml_backend_graph_plan_free``).
        Default hook: nothing to release (the plan's memory is garbage-collected). Synchronous.

        Raises:
            ValueError: ``plan`` is None.
        """
        if plan is None:
            raise ValueError(f"graph_plan_free: backend {self.name} got no plan (None)")
        self._graph_plan_free(plan)

    def supports_op(self, op: Tensor) -> bool:
        """Whether this backend can compute ``op`` (mirrors ``ggml_backend_supports_op``)."""
        return self.device.supports_op(op)

    def supports_buft(self, buft: BufferType) -> bool:
        """Whether this backend can read/write ``buft`` memory directly (mirrors ``ggml_backend_supports_buft``)."""
        return self.device.supports_buft(buft)

    def offload_op(self, op: Tensor) -> bool:
        """Whether ``op`` should be offloaded here although its weights are in host memory
        (mirrors ``ggml_backend_offload_op``)."""
        return self.device.offload_op(op)

    # hooks ------------------------------------------------------------------------------------
    def _free(self) -> None:
        pass

    def _synchronize(self) -> None:
        pass

    def _graph_compute(self, graph: Graph) -> Status:
        raise NotImplementedError(f"{type(self).__name__} needs _graph_compute")

    def _graph_plan_create(self, graph: Graph) -> Any:
        raise NotImplementedError(f"backend {self.name} ({type(self).__name__}) has no graph plans")

    def _graph_plan_compute(self, plan: Any) -> Status:
        raise NotImplementedError(f"backend {self.name} ({type(self).__name__}) has no graph plans")

    def _graph_plan_update(self, plan: Any, graph: Graph) -> Any:
        self.graph_plan_free(plan)
        return self._graph_plan_create(graph)

    def _graph_plan_free(self, plan: Any) -> None:
        pass

    def _set_tensor_async(self, tensor: Tensor, data: np.ndarray, offset: int) -> bool:
        return False

    def _get_tensor_async(self, tensor: Tensor, out: np.ndarray, offset: int) -> bool:
        return False

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        return False

    def _event_record(self, event: Event) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no events")

    def _event_wait(self, event: Event) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no events")

    def __repr__(self) -> str:
        return f"<Backend {self.name}>"


# ---------------------------------------------------------------------------------------------
# events


class Event:
    """A marker in a backend's stream (mirrors ``ggml_backend_event``).

    Attributes:
        device: the device that created it; it may only be recorded on / waited for by backends
            of that device (waits may come from any async backend, as in CUDA).
        handle: the runtime's event object.
    """

    def __init__(self, device: Device, handle: Any) -> None:
        self.device = device
        self.handle = handle

    def __repr__(self) -> str:
        return f"<Event of {self.device.name}>"


@checked_args
def event_new(device: Device) -> Event | None:
    """A new event for ``device``, or None when the device has no event support
    (mirrors ``ggml_backend_event_new``)."""
    if device is None or not device.caps.events:
        return None
    return device._event_new()


@checked_args
def event_record(event: Event, backend: Backend) -> None:
    """Mark the current end of ``backend``'s stream; asynchronous (mirrors ``ggml_backend_event_record``).

    Raises:
        ValueError: the backend belongs to another device than the event.
    """
    if not isinstance(event, Event) or not isinstance(backend, Backend):
        raise TypeError(f"event_record: expected (Event, Backend), got "
                        f"({type(event).__name__}, {type(backend).__name__})")
    if backend.device is not event.device:
        raise ValueError(f"event_record: event of device {event.device.name} recorded on "
                         f"backend {backend.name} of another device")
    backend._event_record(event)


@checked_args
def event_wait(backend: Backend, event: Event) -> None:
    """Make ``backend``'s stream wait for ``event``; the host does not block
    (mirrors ``ggml_backend_event_wait``).

    Raises:
        ValueError: the backend cannot wait for events (no events capability), or the event's
            device and the backend's device are of different runtimes.
    """
    if not isinstance(event, Event) or not isinstance(backend, Backend):
        raise TypeError(f"event_wait: expected (Backend, Event), got "
                        f"({type(backend).__name__}, {type(event).__name__})")
    if not backend.device.caps.events:
        raise ValueError(f"event_wait: backend {backend.name} has no event support")
    backend._event_wait(event)


@checked_args
def event_synchronize(event: Event) -> None:
    """Block the host until ``event`` has completed (mirrors ``ggml_backend_event_synchronize``)."""
    event.device._event_synchronize(event)


@checked_args
def event_query(event: Event) -> bool:
    """True when ``event`` has completed (or was never recorded); never blocks."""
    return event.device._event_query(event)


# ---------------------------------------------------------------------------------------------
# device and reg


class Device:
    """A device: memory, a default buffer type, the ops it supports (mirrors ``ggml_backend_dev``).

    Hooks:

    * ``_get_props``, ``_init_backend``, ``_get_buffer_type``, ``_supports_op``,
      ``_supports_buft``: required;
    * ``_get_caps() -> DeviceCaps`` (optional, default ``_get_props().caps``);
    * ``_get_host_buffer_type() -> BufferType | None`` (optional, default None: no pinned host
      buffer);
    * ``_buffer_from_host_ptr(array, max_tensor_size)`` (optional, default: raise
      NotImplementedError; asked only when caps say ``buffer_from_host_ptr``);
    * ``_offload_op(op) -> bool`` (optional, default False);
    * ``_event_new``, ``_event_synchronize``, ``_event_query`` (optional, default: raise
      NotImplementedError; asked only when caps say ``events``).

    Members callers may read on any device:

    * :meth:`supports_op_memo_token` (optional, default None: ``supports_op`` answers are not
      memoised);
    * :attr:`last_stream` (optional, default None: no stream to name as an export's producer).

    Attributes:
        reg: the :class:`Reg` that lists it (set on registration).
        last_stream: the stream of the backend that last queued work on this device (an
            asynchronous device sets it; zero-copy exports name it as the producer stream), or
            None.
    """

    last_stream: Any = None

    def __init__(self) -> None:
        self.reg: Reg | None = None

    @property
    def name(self) -> str:
        """Device name, e.g. "CPU", "CUDA0", "SIM1" (mirrors ``ggml_backend_dev_name``)."""
        return self._get_props().name

    @property
    def description(self) -> str:
        """Human description (mirrors ``ggml_backend_dev_description``)."""
        return self._get_props().description

    @property
    def type(self) -> DeviceType:
        """:class:`DeviceType` (mirrors ``ggml_backend_dev_type``)."""
        return self._get_props().type

    def get_props(self) -> DeviceProps:
        """Current :class:`DeviceProps`, memory figures fresh (mirrors ``ggml_backend_dev_get_props``)."""
        return self._get_props()

    @property
    def caps(self) -> DeviceCaps:
        """The device's :class:`DeviceCaps` without querying memory (hot paths use this)."""
        return self._get_caps()

    def get_memory(self) -> tuple[int, int]:
        """``(free, total)`` bytes; ``(0, 0)`` when unknown (mirrors ``ggml_backend_dev_memory``)."""
        p = self._get_props()
        return p.memory_free, p.memory_total

    def init_backend(self, params: str | None = None) -> Backend:
        """A new backend (stream) on this device (mirrors ``ggml_backend_dev_init``).

        Args:
            params: ggml's backend init string; ggmlpy's devices (CPU, SIM, CUDA) take none.

        Raises:
            TypeError: ``params`` is not a str or None. ValueError: the device takes no params
            and some were given (never silently ignored).
            BackendUnavailableError: the device cannot create a backend.
        """
        if params is not None and not isinstance(params, str):
            raise TypeError(f"init_backend: params for device {self.name} must be a str or None, "
                            f"got {type(params).__name__}")
        return self._init_backend(params)

    def get_buffer_type(self) -> BufferType:
        """The preferred buffer type (mirrors ``ggml_backend_dev_buffer_type``)."""
        return self._get_buffer_type()

    def get_host_buffer_type(self) -> BufferType | None:
        """The pinned host buffer type, or None (mirrors ``ggml_backend_dev_host_buffer_type``)."""
        return self._get_host_buffer_type()

    def buffer_from_host_ptr(self, array: np.ndarray, max_tensor_size: int = 0) -> Buffer:
        """Wrap user host memory as a buffer without copying (mirrors ``ggml_backend_dev_buffer_from_host_ptr``).

        Args:
            array: the host memory (the device's hook states its requirements).
            max_tensor_size: bytes of the largest tensor to be placed (ggml's hint; 0 = not
                given); must be in ``[0, array.nbytes]``, and all such tensors fit (one region).

        Raises:
            ValueError: the device lacks the ``buffer_from_host_ptr`` capability, or
            ``max_tensor_size`` is negative or larger than ``array.nbytes``.
            TypeError: ``max_tensor_size`` is not an int.
        """
        if not self.caps.buffer_from_host_ptr:
            raise ValueError(f"device {self.name} cannot wrap host memory")
        if isinstance(max_tensor_size, bool) or not isinstance(max_tensor_size, (int, np.integer)):
            raise TypeError(f"buffer_from_host_ptr: max_tensor_size must be an int (bytes), "
                            f"got {max_tensor_size!r}")
        nbytes = getattr(array, "nbytes", None)
        if max_tensor_size < 0 or (nbytes is not None and max_tensor_size > nbytes):
            raise ValueError(f"buffer_from_host_ptr: max_tensor_size {max_tensor_size} is outside "
                             f"[0, {nbytes}] (the wrapped array's bytes) on device {self.name}")
        return self._buffer_from_host_ptr(array, int(max_tensor_size))

    def supports_op(self, op: Tensor) -> bool:
        """Whether the device can compute node ``op`` with its source types (mirrors ``ggml_backend_dev_supports_op``).

        Op NONE and the view ops (RESHAPE, VIEW, PERMUTE, TRANSPOSE) compute nothing and are
        supported by every device, as in ggml's backends.
        """
        if op.op == Op.NONE or op.op in VIEW_OPS:
            return True
        return self._supports_op(op)

    def supports_buft(self, buft: BufferType) -> bool:
        """Whether compute on this device can read/write ``buft`` directly (mirrors ``ggml_backend_dev_supports_buft``)."""
        return self._supports_buft(buft)

    def offload_op(self, op: Tensor) -> bool:
        """Whether ``op`` should run here even with host weights (mirrors ``ggml_backend_dev_offload_op``; default False)."""
        return self._offload_op(op)

    # hooks ------------------------------------------------------------------------------------
    def supports_op_memo_token(self) -> tuple | None:
        """A hashable token under which this device's :meth:`supports_op` answers may be memoised
        per node key (the graph's plan build and the scheduler ask once per distinct key), or
        None when every node must be asked (optional, default None). A device returns a token
        only when its answer depends on nothing but the key and fixed per-device settings."""
        return None

    def _get_props(self) -> DeviceProps:
        raise NotImplementedError(f"{type(self).__name__} needs _get_props")

    def _get_caps(self) -> DeviceCaps:
        return self._get_props().caps

    def _init_backend(self, params: str | None) -> Backend:
        raise NotImplementedError(f"{type(self).__name__} needs _init_backend")

    def _get_buffer_type(self) -> BufferType:
        raise NotImplementedError(f"{type(self).__name__} needs _get_buffer_type")

    def _get_host_buffer_type(self) -> BufferType | None:
        return None

    def _buffer_from_host_ptr(self, array: np.ndarray, max_tensor_size: int) -> Buffer:
        raise NotImplementedError(f"{type(self).__name__} needs _buffer_from_host_ptr")

    def _supports_op(self, op: Tensor) -> bool:
        raise NotImplementedError(f"{type(self).__name__} needs _supports_op")

    def _supports_buft(self, buft: BufferType) -> bool:
        raise NotImplementedError(f"{type(self).__name__} needs _supports_buft")

    def _offload_op(self, op: Tensor) -> bool:
        return False

    def _event_new(self) -> Event:
        raise NotImplementedError(f"{type(self).__name__} has no events")

    def _event_synchronize(self, event: Event) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no events")

    def _event_query(self, event: Event) -> bool:
        raise NotImplementedError(f"{type(self).__name__} has no events")

    def __repr__(self) -> str:
        return f"<Device {self.name}>"


class Reg:
    """A backend registration: a named group of devices (mirrors ``ggml_backend_reg``).

    Args:
        name: e.g. "CPU", "CUDA", "SIM".
        devices: the devices it provides.
        unavailable_reason: for a reg with no devices, one line saying why (shown by the CLI).
    """

    def __init__(self, name: str, devices: list[Device], unavailable_reason: str | None = None) -> None:
        self.name = name
        self.devices = list(devices)
        self.unavailable_reason = unavailable_reason
        for d in self.devices:
            d.reg = self

    def dev_count(self) -> int:
        """Number of devices (mirrors ``ggml_backend_reg_dev_count``)."""
        return len(self.devices)

    def dev_get(self, i: int) -> Device:
        """Device ``i`` (mirrors ``ggml_backend_reg_dev_get``).

        Raises:
            IndexError: out of range.
        """
        if not 0 <= i < len(self.devices):
            raise IndexError(f"reg {self.name}: device index {i} out of range 0..{len(self.devices) - 1}")
        return self.devices[i]

    def __repr__(self) -> str:
        return f"<Reg {self.name} {len(self.devices)} devices>"


#: Signature of a scheduler eval callback: ``cb(tensor, ask) -> bool``.
EvalCallback = Callable[[Tensor, bool], bool]
