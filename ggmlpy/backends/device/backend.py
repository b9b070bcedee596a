"""The asynchronous device backend, written once over a :class:`Runtime` (mirrors ggml-cuda's backend glue).

One module holds everything a GPU-like device needs on top of a runtime: its buffer type and
buffers (device memory, ``is_host`` False), a pinned host buffer type (``<RUNTIME>_Host``, host
memory the CPU backend also reads), the backend (one in-order *stream*), the device and events.
Two runtimes implement :class:`Runtime`: ``cupy_runtime`` (real CUDA) and ``sim_runtime`` (a
host-emulated accelerator for machines without a GPU). Only the runtime differs, so the tests that
run on SIM in CI run unchanged on CUDA.

Ordering spec (what is ordered against what; ggml leaves this implicit, so it is written
down here):

* Work queued on one backend (``graph_compute_async``, ``*_async`` copies, ``event_record``,
  ``event_wait``) runs in the order it was queued, on that backend's stream, after the call returns.
  ``Backend.synchronize`` blocks the host until all of it has finished and re-raises (as
  :class:`~ggmlpy.core.errors.ComputeError`) a failure of that work.
* The **blocking** buffer operations (``backend_tensor_set/get/memset``, ``Buffer.clear``,
  blocking ``backend_tensor_copy``) follow CUDA: they finish before they return but are **not
  ordered against any backend stream**. Synchronize the backend before touching, with them, a
  tensor that queued work reads or writes.
* ``graph_compute_async`` resolves the graph into a plan (kernels, array views) on the calling
  thread before it returns; the caller may change or free the :class:`~ggmlpy.core.graph.Graph` object
  and the tensors' metadata at once. The *memory* the plan reads and writes must stay allocated
  until the stream has passed it (freeing a device buffer waits for every stream of the runtime).
* ``backend_tensor_set_async`` copies the caller's bytes into pinned staging at call time: the
  caller may reuse its array at once. The staging is released only after the stream has passed the
  upload. ``backend_tensor_get_async`` writes the caller's array when the stream reaches it; read
  it only after ``synchronize``.
* ``backend_tensor_copy_async(b_src, b_dst, src, dst)`` between device buffers of one runtime:
  the destination stream's current end is recorded and the *source* stream waits for it (so the
  copy cannot overwrite ``dst`` while queued work on ``b_dst`` still reads it; ggml-cuda's
  ``ggml_backend_cuda_cpy_tensor_async`` only makes the destination wait for the copy), the copy
  runs on the source stream, then the destination stream waits
  for the copy. From a host buffer to a device buffer: ``b_src`` is synchronized if it is
  asynchronous, the bytes are snapshotted to pinned staging and uploaded on the destination stream.
  Where the runtime uploads in place (``Runtime.pinned_direct_upload``: CUDA, SIM when asked) a
  ``<RUNTIME>_Host`` source is read by the stream without a snapshot, as in ggml; an event is
  recorded after the copy and registered as a host-read fence on the source buffer
  (:func:`ggmlpy.backend.write_gen.host_read_queued`), so every host-side writer of the package
  (CPU plans, ``backend_tensor_set``/``memset``/``copy``, ``Buffer.clear``/``free``) waits for
  the copy before it overwrites those bytes. Other writes to that memory (a NumPy view) must call
  :func:`ggmlpy.backend.write_gen.wait_host_reads` first.
* Events: ``event_record`` marks the current end of a stream, ``event_wait`` makes another stream
  (of any device of the same runtime) wait for the last record made before the wait call, the
  host never blocks except in ``event_synchronize``.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ggmlpy.backend import interface
from ggmlpy.backend.interface import Backend, Buffer, BufferType, Device, Event, Status, tensor_buffer
from ggmlpy.backend.write_gen import host_read_queued
from ggmlpy.backends import kernels
from ggmlpy.backends.cpu.backend import TENSOR_ALIGNMENT, HostBuffer, cpu_buffer_type, kernel_memo_token
from ggmlpy.backends.plan import Plan, PlanCache, ReplayStats, build_plan, launch_plan
from ggmlpy.core.errors import BackendUnavailableError, ComputeError, OutOfMemoryError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor

__all__ = ["Runtime", "reads_foreign_device_memory", "DeviceMemory", "DeviceInfo", "AsyncBufferType", "AsyncBuffer",
           "AsyncHostBufferType", "AsyncHostBuffer", "AsyncBackend", "AsyncDevice",
           "make_reg", "OFFLOAD_MIN_BATCH"]

#: Default of ``offload_op``'s batch threshold (ggml-cuda's ``GGML_OP_OFFLOAD_MIN_BATCH``).
OFFLOAD_MIN_BATCH = 32


# ---------------------------------------------------------------------------------------------
# the runtime interface


class DeviceMemory:
    """One block of device memory returned by :meth:`Runtime.malloc`.

    Attributes:
        dev: index of the device within its runtime (0-based).
        size: bytes.
    Runtimes subclass it to hold their handle (a pointer, an arena array).
    """

    __slots__ = ("dev", "size", "__weakref__")

    def __init__(self, dev: int, size: int) -> None:
        self.dev = dev
        self.size = int(size)


@dataclass
class DeviceInfo:
    """Static facts of one device reported by :meth:`Runtime.device_info`.

    Attributes:
        description: human-readable, e.g. "NVIDIA H100 80GB HBM3".
        type: :class:`~ggmlpy.backend.interface.DeviceType` (GPU/IGPU for CUDA, ACCEL for SIM).
        device_id: PCI bus id ``"dddd:bb:dd.f"`` or None.
        extra: runtime facts for ``props.extra`` (compute capability, ...).
    """

    description: str
    type: interface.DeviceType
    device_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Runtime:
    """What the async device backend needs from a device runtime.

    A runtime owns ``device_count()`` devices, indexed from 0. All ``offset``/``size`` arguments are
    **bytes**; host data is a 1-D C-contiguous ``uint8`` NumPy array. ``stream`` and ``event``
    objects are opaque handles made by the runtime. Every method not marked *async* completes before
    it returns. The SIM (:class:`ggmlpy.backends.sim.SimRuntime`), CUDA
    (:class:`ggmlpy.backends.cuda.runtime.CupyRuntime`) and RAY
    (:class:`ggmlpy.backends.ray.runtime.RayRuntime`) runtimes subclass it.

    The whole contract (the backend reads nothing else of a runtime):

    * required: ``device_count``, ``device_info``, ``mem_info``; ``malloc``, ``free``, ``array``;
      the blocking copies ``memcpy_htod``, ``memcpy_dtoh``, ``memcpy_dtod``, ``memset``;
      ``alloc_pinned``; ``stream_new``, ``stream_free``, ``stream_synchronize``, ``launch``; the
      async copies ``memcpy_htod_async``, ``memcpy_dtoh_async``, ``memcpy_dtod_async``; the
      events ``event_new``, ``event_record``, ``stream_wait_event``, ``event_synchronize``,
      ``event_query``;
    * ``activate(dev)`` (optional, default: a no-op context manager);
    * ``on_stream(stream)`` (optional, default: a no-op context manager);
    * ``memcpy_dtoh_into(mem, offset, out)`` (optional, default: through ``memcpy_dtoh``);
    * ``staging(stream, size)`` (optional, default: a new ``alloc_pinned`` block);
    * ``launch_count()`` (optional, default None: cannot count);
    * ``supports_graphs`` (optional, default False); ``graph_capture``, ``graph_launch``
      (optional, default: raise NotImplementedError; called only when ``supports_graphs``);
    * ``pinned_direct_upload`` (optional, default False: uploads always go through staging);
    * the attributes ``name``, ``xp``, ``alignment`` and ``guid`` below (defaults: "DEVICE",
      ``numpy``, 128, the zero UUID).

    Attributes:
        name: registration and device-name prefix ("CUDA" -> devices "CUDA0", "CUDA1").
        xp: the array module the kernels run with (``numpy`` or ``cupy``).
        alignment: alignment of tensor offsets in device buffers, bytes (ggml-cuda: 128).
        guid: the backend guid of this runtime's backends.
    """

    name: str = "DEVICE"
    xp: Any = np
    alignment: int = 128
    guid: uuid.UUID = uuid.UUID(int=0)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # implementations inherit the contract's docstrings (units, sync/async, errors)
        super().__init_subclass__(**kwargs)
        for name, fn in vars(cls).items():
            base = getattr(Runtime, name, None)
            if callable(fn) and not getattr(fn, "__doc__", None) and getattr(base, "__doc__", None):
                fn.__doc__ = base.__doc__

    # devices ------------------------------------------------------------------------------------
    def device_count(self) -> int:
        """Number of devices."""
        raise NotImplementedError(f"{type(self).__name__} needs device_count")

    def device_info(self, dev: int) -> DeviceInfo:
        """Static :class:`DeviceInfo` of device ``dev``."""
        raise NotImplementedError(f"{type(self).__name__} needs device_info")

    def mem_info(self, dev: int) -> tuple[int, int]:
        """``(free, total)`` bytes of device ``dev``; ``(0, 0)`` when unknown."""
        raise NotImplementedError(f"{type(self).__name__} needs mem_info")

    def activate(self, dev: int) -> AbstractContextManager[Any]:
        """A context manager making ``dev`` current for allocations and kernel launches
        (``cupy.cuda.Device(dev)``); a no-op by default."""
        return nullcontext()

    def on_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """A context manager making ``stream`` (and its device) current on the calling thread, so
        that work enqueued at once (constants a kernel uploads while a plan is built) is ordered
        before later work on ``stream``; a no-op by default."""
        return nullcontext()

    # device memory ------------------------------------------------------------------------------
    def malloc(self, dev: int, size: int) -> DeviceMemory:
        """Allocate ``size > 0`` bytes on device ``dev`` (not pooled: released by :meth:`free`).

        Raises:
            OutOfMemoryError: not enough memory, carrying ``requested`` and ``free`` bytes; the
                device stays usable.
        """
        raise NotImplementedError(f"{type(self).__name__} needs malloc")

    def free(self, mem: DeviceMemory) -> None:
        """Release ``mem``. The caller guarantees no queued work still uses it."""
        raise NotImplementedError(f"{type(self).__name__} needs free")

    def array(self, mem: DeviceMemory, tensor: Tensor) -> Any:
        """An ``xp`` array viewing ``tensor`` inside ``mem`` at byte ``tensor.offset``, no copy.

        Plain types: dtype ``tensor.type.dtype``, NumPy shape ``ne[::-1]``, strides ``nb[::-1]``.
        Block-quantized types: ``uint8`` rows, shape ``(ne3, ne2, ne1, row_bytes)``.
        """
        raise NotImplementedError(f"{type(self).__name__} needs array")

    # blocking copies (not ordered against any stream, like CUDA's synchronous buffer ops) ------
    def memcpy_htod(self, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        """Copy the host bytes ``src`` to ``mem[offset:offset+src.size]``; blocking."""
        raise NotImplementedError(f"{type(self).__name__} needs memcpy_htod")

    def memcpy_dtoh(self, mem: DeviceMemory, offset: int, size: int) -> np.ndarray:
        """A new host ``uint8`` array of ``size`` bytes read from ``mem[offset:]``; blocking."""
        raise NotImplementedError(f"{type(self).__name__} needs memcpy_dtoh")

    def memcpy_dtod(self, dst: DeviceMemory, dst_offset: int, src: DeviceMemory, src_offset: int,
                    size: int) -> None:
        """Copy ``size`` bytes between device memories (same or different devices); blocking."""
        raise NotImplementedError(f"{type(self).__name__} needs memcpy_dtod")

    def memset(self, mem: DeviceMemory, offset: int, size: int, value: int) -> None:
        """Set ``size`` bytes of ``mem`` from ``offset`` to the byte ``value``; blocking."""
        raise NotImplementedError(f"{type(self).__name__} needs memset")

    # pinned host memory -----------------------------------------------------------------------
    def alloc_pinned(self, size: int) -> np.ndarray:
        """A 1-D ``uint8`` host array of ``size`` bytes in page-locked memory (plain host memory on
        SIM). The array keeps the allocation alive (its ``base``).

        Raises:
            OutOfMemoryError: the allocation failed.
        """
        raise NotImplementedError(f"{type(self).__name__} needs alloc_pinned")

    #: True when :meth:`memcpy_htod_async` may read a pinned host buffer of this runtime in
    #: stream order (no snapshot): uploads from ``<RUNTIME>_Host`` tensors then skip staging.
    pinned_direct_upload: bool = False

    def staging(self, stream: Any, size: int) -> np.ndarray:
        """A 1-D ``uint8`` pinned array of ``size`` bytes for one async upload on ``stream``; pass
        it to :meth:`memcpy_htod_async` on that stream, which owns it from then on. Default: a new
        :meth:`alloc_pinned` block (CUDA reuses blocks from a per-stream ring).

        Raises:
            OutOfMemoryError: pinned memory could not be allocated.
        """
        return self.alloc_pinned(size)

    def launch_count(self) -> int | None:
        """Kernel launches issued so far by this runtime (None when it cannot count)."""
        return None

    # streams ------------------------------------------------------------------------------------
    def stream_new(self, dev: int, name: str) -> Any:
        """A new stream on device ``dev`` that runs queued work in order (``name`` for threads/logs)."""
        raise NotImplementedError(f"{type(self).__name__} needs stream_new")

    def stream_free(self, stream: Any) -> None:
        """Release ``stream`` after the work queued on it has finished. Idempotent."""
        raise NotImplementedError(f"{type(self).__name__} needs stream_free")

    def stream_synchronize(self, stream: Any, check: bool = True) -> None:
        """Block the host until everything queued on ``stream`` has finished.

        Raises:
            ComputeError: with ``check``, when queued work failed since the last check (the cause
                is chained); the failure is then cleared and the stream stays usable. With
                ``check=False`` failures are kept for the next checked synchronize.
        """
        raise NotImplementedError(f"{type(self).__name__} needs stream_synchronize")

    def launch(self, stream: Any, fn: Any) -> None:
        """*Async*: run ``fn()`` in ``stream``'s order (SIM: on the stream's worker thread; CuPy:
        ``fn`` enqueues kernels while ``stream`` is current, so it runs on the host at once)."""
        raise NotImplementedError(f"{type(self).__name__} needs launch")

    #: True when :meth:`graph_capture` and :meth:`graph_launch` work (plans are then replayed)
    supports_graphs: bool = False

    def graph_capture(self, stream: Any, steps: list[Any]) -> Any:
        """Capture ``steps`` (a plan's zero-argument kernel closures, in order) into one graph
        that :meth:`graph_launch` replays on ``stream``, **without running them** (CUDA: stream
        capture into a ``cupy.cuda.Graph``, temporaries from a pool private to the graph; SIM: the
        recorded launch list). The graph reads and writes the same device memory every time.

        Raises:
            Exception: the steps cannot be captured (e.g. they synchronize with the host); the
                stream is left out of capture mode and usable.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot capture graphs")

    def graph_launch(self, stream: Any, graph: Any) -> None:
        """*Async*: run a graph made by :meth:`graph_capture` in ``stream``'s order (one launch);
        the runtime keeps the graph alive until the stream has passed it."""
        raise NotImplementedError(f"{type(self).__name__} cannot launch graphs")

    def memcpy_dtoh_into(self, mem: DeviceMemory, offset: int, out: np.ndarray) -> None:
        """Blocking: read ``out.size`` bytes of ``mem[offset:]`` into ``out`` (1-D C-contiguous
        ``uint8`` host array). Default: through :meth:`memcpy_dtoh` (CUDA copies straight in)."""
        out[:] = self.memcpy_dtoh(mem, offset, out.size)

    def memcpy_htod_async(self, stream: Any, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        """*Async*: upload host ``src`` into ``mem[offset:]`` in stream order. ``src`` is (pinned)
        staging owned by the runtime from now on: it is kept alive until the stream has passed
        the copy, and the caller never touches it again."""
        raise NotImplementedError(f"{type(self).__name__} needs memcpy_htod_async")

    def memcpy_dtoh_async(self, stream: Any, out: np.ndarray, mem: DeviceMemory, offset: int) -> None:
        """*Async*: read ``out.size`` bytes of ``mem[offset:]`` into host ``out`` in stream order.
        ``out`` holds the data once :meth:`stream_synchronize` (or an :meth:`event_synchronize` of
        an event recorded after it) has returned."""
        raise NotImplementedError(f"{type(self).__name__} needs memcpy_dtoh_async")

    def memcpy_dtod_async(self, stream: Any, dst: DeviceMemory, dst_offset: int, src: DeviceMemory,
                          src_offset: int, size: int) -> None:
        """*Async*: copy ``size`` bytes between device memories in ``stream`` order."""
        raise NotImplementedError(f"{type(self).__name__} needs memcpy_dtod_async")

    # events -------------------------------------------------------------------------------------
    def event_new(self, dev: int) -> Any:
        """A new event on device ``dev``, not yet recorded (query True)."""
        raise NotImplementedError(f"{type(self).__name__} needs event_new")

    def event_record(self, event: Any, stream: Any) -> None:
        """*Async*: mark the current end of ``stream``; the event completes when the stream gets there."""
        raise NotImplementedError(f"{type(self).__name__} needs event_record")

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        """*Async*: later work on ``stream`` waits for the last record of ``event`` made before
        this call (no-op if never recorded). The host does not block."""
        raise NotImplementedError(f"{type(self).__name__} needs stream_wait_event")

    def event_synchronize(self, event: Any) -> None:
        """Block the host until ``event``'s last record has completed."""
        raise NotImplementedError(f"{type(self).__name__} needs event_synchronize")

    def event_query(self, event: Any) -> bool:
        """True when ``event``'s last record has completed (or it was never recorded); never blocks."""
        raise NotImplementedError(f"{type(self).__name__} needs event_query")


# ---------------------------------------------------------------------------------------------
# buffers


class AsyncBufferType(BufferType):
    """Device memory of one device (mirrors ggml-cuda's per-device buft ``CUDA<n>``).

    Alignment is the runtime's (128 bytes), ``is_host`` is False (the scheduler must copy host data
    in), allocation is not pooled. One singleton per device, compared by identity.
    """

    device: AsyncDevice

    def _alloc_buffer(self, size: int) -> Buffer:
        dev = self.device
        with dev.runtime.activate(dev.index):
            mem = dev.runtime.malloc(dev.index, size)
        return AsyncBuffer(self, mem)

    def _get_alignment(self) -> int:
        return self.device.runtime.alignment

    def _is_host(self) -> bool:
        return False


class AsyncBuffer(Buffer):
    """A block of device memory (mirrors ggml-cuda's device buffer).

    Every data hook is **blocking and not ordered against any backend stream** (CUDA's synchronous
    buffer ops run on the per-thread default stream): synchronize backends that use the tensors
    first. ``free`` waits for every stream of the runtime before it releases the memory.
    """

    buft: AsyncBufferType

    def __init__(self, buft: AsyncBufferType, mem: DeviceMemory) -> None:
        super().__init__(buft, mem.size)
        self.mem = mem
        #: owners of zero-copy exports (``__cuda_array_interface__``/``__dlpack__``) of this
        #: memory: while one lives, :meth:`free` defers releasing the memory (ggmlpy.backends.interop)
        self._exports: weakref.WeakSet[Any] = weakref.WeakSet()
        # (runtime event, stream) recorded after each queued async read of this memory
        # (``backend_tensor_get_async``, a peer copy out of it): blocking writes wait for them
        self._reads: list[Any] = []
        self._reads_lock = threading.Lock()

    def note_async_read(self, stream: Any) -> None:
        """Record that ``stream`` has a queued read of this buffer's memory: the next blocking
        write (``_set_tensor``, ``_memset_tensor``, ``_clear``, ``_cpy_tensor`` into it) waits
        until the stream has passed that read, so a new evaluation's inputs (written after
        ``reset``/``alloc_graph`` reuse the memory) never overtake it. Call with the runtime
        active on the buffer's device."""
        rt = self.runtime
        ev = rt.event_new(self.buft.device.index)
        rt.event_record(ev, stream)
        with self._reads_lock:
            self._reads = [e for e in self._reads if not rt.event_query(e)]
            self._reads.append(ev)

    def _wait_reads(self) -> None:
        with self._reads_lock:
            reads, self._reads = self._reads, []
        if reads:
            rt = self.runtime
            with rt.activate(self.buft.device.index):
                for ev in reads:
                    rt.event_synchronize(ev)

    @property
    def runtime(self) -> Runtime:
        """The runtime owning the memory."""
        return self.buft.device.runtime

    def _free(self) -> None:
        dev = self.buft.device
        dev._wait_all_streams()
        rt, mem = dev.runtime, self.mem
        live = list(self._exports)
        self._exports = weakref.WeakSet()
        if not live:
            rt.free(mem)
            return
        # exported views may still read this memory: release it when the last export dies, so
        # it is never handed to another allocation while a view can read it
        # one token per export, taken by list.pop (one atomic step under the GIL, no lock: a
        # finalizer can run inside another one's critical section when an allocation there
        # starts the garbage collector, and would wait for its own thread's lock); the export
        # that takes token 0, the last one left, frees the memory, exactly once
        tokens = list(range(len(live)))

        def one_gone() -> None:
            if tokens.pop() == 0:
                rt.free(mem)
        for o in live:
            weakref.finalize(o, one_gone)

    def _set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int) -> None:
        self._wait_reads()
        self.runtime.memcpy_htod(self.mem, tensor.offset + offset, data)

    def _get_tensor(self, tensor: Tensor, offset: int, size: int) -> np.ndarray:
        return self.runtime.memcpy_dtoh(self.mem, tensor.offset + offset, size)

    def _get_tensor_into(self, tensor: Tensor, out: np.ndarray) -> None:
        self.runtime.memcpy_dtoh_into(self.mem, tensor.offset, out)

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._wait_reads()
        self.runtime.memset(self.mem, tensor.offset + offset, size, value)

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        sbuf = tensor_buffer(src)
        if not isinstance(sbuf, AsyncBuffer) or sbuf.runtime is not self.runtime:
            return False
        n = src.nbytes
        if n:
            self._wait_reads()
            self.runtime.memcpy_dtod(self.mem, dst.offset, sbuf.mem, src.offset, n)
        return True

    def _clear(self, value: int) -> None:
        self._wait_reads()
        self.runtime.memset(self.mem, 0, self.size, value)

    def _array(self, tensor: Tensor) -> Any:
        return self.runtime.array(self.mem, tensor)


class AsyncHostBufferType(BufferType):
    """Pinned host memory of a runtime (mirrors ``ggml_backend_cuda_host_buffer_type``, "CUDA_Host").

    Host memory in ggml's layout (``is_host`` True, CPU alignment), so the CPU backend computes on
    it and uploads from it are true DMA on CUDA. Its device is the runtime's device 0, whichever
    device asked for it (as in ggml). If pinned allocation fails it falls back, like ggml, to a
    plain CPU buffer (buffer type "CPU").
    """

    def _alloc_buffer(self, size: int) -> Buffer:
        runtime: Runtime = self.device.runtime  # type: ignore[union-attr]
        try:
            data = runtime.alloc_pinned(size)
        except (OutOfMemoryError, MemoryError):
            return cpu_buffer_type().alloc_buffer(size)
        return AsyncHostBuffer(self, data)

    def _get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def _is_host(self) -> bool:
        return True


class AsyncHostBuffer(HostBuffer):
    """A :class:`~ggmlpy.backends.cpu.backend.HostBuffer` over pinned memory; synchronous hooks. Its memory
    is released (returned to the runtime's pinned pool) when freed."""


# ---------------------------------------------------------------------------------------------
# backend (stream)


class _StreamFence:
    """An event recorded now on ``stream`` (the runtime active on device ``dev``): :meth:`wait`
    blocks until the stream has passed this point, :meth:`done` asks without blocking."""

    __slots__ = ("rt", "dev", "ev")

    def __init__(self, rt: Runtime, dev: int, stream: Any) -> None:
        self.rt, self.dev = rt, dev
        self.ev = rt.event_new(dev)
        rt.event_record(self.ev, stream)

    def wait(self) -> None:
        with self.rt.activate(self.dev):
            self.rt.event_synchronize(self.ev)

    def done(self) -> bool:
        return bool(self.rt.event_query(self.ev))


class AsyncBackend(Backend):
    """One stream of an :class:`AsyncDevice` (mirrors ``ggml_backend_cuda``): asynchronous
    ``graph_compute``, async set/get/copy, events. See the module docstring for the ordering spec.

    Attributes:
        stream: the runtime's stream handle.
        graph_replay: replay unchanged plans as captured graphs where the runtime supports it
            (default True; ggml-cuda's CUDA graphs, see :func:`~ggmlpy.backends.plan.launch_plan`).
        replay_stats: :class:`~ggmlpy.backends.plan.ReplayStats` of this backend's launches.
    """

    device: AsyncDevice
    graph_replay: bool = True

    def __init__(self, device: AsyncDevice) -> None:
        super().__init__(device)
        rt = device.runtime
        self.guid = rt.guid
        self.runtime = rt
        with rt.activate(device.index):
            self.stream = rt.stream_new(device.index, device.name)
            self._copy_event = rt.event_new(device.index)   # the source side of peer copies
            self._ready_event = rt.event_new(device.index)  # "dst stream reached here" for copies
        self._plans = PlanCache(self._build_plan)
        self.replay_stats = ReplayStats()
        # device-side checks of launched plans (Plan.checks), run after the next synchronize
        self._pending_checks: dict[int, Any] = {}
        self._finalizer = weakref.finalize(self, rt.stream_free, self.stream)
        device._backends.add(self)

    # compute ------------------------------------------------------------------------------------
    @property
    def plan_cache(self) -> PlanCache:
        """The backend's compiled plans per graph (read-only attribute): ``len()``, ``builds``
        and ``stats()`` count them; ``get(graph)`` is the plan the next ``graph_compute(graph)``
        launches (built now if the graph changed). Emptied when the backend is freed."""
        return self._plans

    def _can_read(self, t: Tensor) -> bool:
        return tensor_buffer(t).buft is self.device.buft

    def _build_plan(self, graph: Graph) -> Plan:
        with self.runtime.on_stream(self.stream):
            return build_plan(graph, self.runtime.xp, self.name, self._can_read,
                              self.device.can_compute)

    # plan hooks of the backend contract (facades: Backend.graph_plan_*) -------------------------
    def _graph_plan_create(self, graph: Graph) -> Plan:
        # built on the calling thread; raises NotAllocatedError for tensors outside this device's
        # memory and UnsupportedOpError for nodes not supported here
        return self._build_plan(graph)

    def _graph_plan_compute(self, plan: Plan) -> Status:
        # asynchronous: launched on the stream, complete after synchronize()
        return self._launch(plan)

    def _launch(self, plan: Plan) -> Status:
        # launch a live plan on this backend's stream and keep its checks for synchronize()
        self._check_plan_live(plan)
        with self.runtime.activate(self.device.index):
            launch_plan(self.runtime, self.stream, plan, self.replay_stats, self.graph_replay)
        self.device.last_stream = self.stream
        for c in plan.checks:
            self._pending_checks[id(c)] = c
        return Status.SUCCESS

    def _check_plan_live(self, plan: Plan) -> None:
        plan.check_live(self.name)

    def _graph_compute(self, graph: Graph) -> Status:
        """Build (or reuse) the plan on the calling thread, launch it on the stream, return at once."""
        plan = self._plans.get(graph)
        return self._launch(plan)

    def _synchronize(self) -> None:
        self.runtime.stream_synchronize(self.stream)
        if self._pending_checks:
            # device-side checks (e.g. GET_ROWS bounds, kernels/bounds.py): read after the stream
            # finished; the first failure is raised, every flag is re-armed
            checks = list(self._pending_checks.values())
            self._pending_checks.clear()
            first: Exception | None = None
            # on this stream, so a check's re-arming write is ordered before later launches
            with self.runtime.activate(self.device.index), self.runtime.on_stream(self.stream):
                for c in checks:
                    try:
                        c()
                    except ComputeError as e:
                        first = first or e
            if first is not None:
                raise ComputeError(f"{self.name}: {first}") from first

    def free(self) -> None:
        """Synchronize and release the backend (mirrors ``ggml_backend_free``). Idempotent. After a
        sticky runtime failure (BackendUnavailableError) there is nothing left to wait for: the
        backend is released without raising."""
        if not self.freed:
            try:
                self.synchronize()
            except BackendUnavailableError:
                pass
            self._free()
            self.freed = True

    def _free(self) -> None:
        self.device._backends.discard(self)
        self._plans.clear()
        self._finalizer()

    # async data movement ------------------------------------------------------------------------
    def _own_buffer(self, t: Tensor) -> AsyncBuffer | None:
        buf = tensor_buffer(t)
        if isinstance(buf, AsyncBuffer) and buf.buft is self.device.buft:
            return buf
        return None

    def _set_tensor_async(self, tensor: Tensor, data: np.ndarray, offset: int) -> bool:
        buf = self._own_buffer(tensor)
        if buf is None:
            return False
        rt = self.runtime
        staging = rt.staging(self.stream, data.size)
        staging[:] = data  # snapshot now: the caller may reuse its array when we return
        with rt.activate(self.device.index):
            rt.memcpy_htod_async(self.stream, buf.mem, tensor.offset + offset, staging)
        self.device.last_stream = self.stream
        return True

    def _get_tensor_async(self, tensor: Tensor, out: np.ndarray, offset: int) -> bool:
        buf = self._own_buffer(tensor)
        if buf is None:
            return False
        with self.runtime.activate(self.device.index):
            self.runtime.memcpy_dtoh_async(self.stream, out, buf.mem, tensor.offset + offset)
            buf.note_async_read(self.stream)
        return True

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        dbuf = self._own_buffer(dst)
        if dbuf is None:
            return False
        sbuf = tensor_buffer(src)
        rt = self.runtime
        n = src.nbytes
        if isinstance(sbuf, AsyncBuffer):
            if (not isinstance(backend_src, AsyncBackend) or backend_src.runtime is not rt
                    or sbuf.buft is not backend_src.device.buft):
                return False
            if n == 0:
                return True
            if backend_src is self:
                with rt.activate(self.device.index):
                    rt.memcpy_dtod_async(self.stream, dbuf.mem, dst.offset, sbuf.mem, src.offset, n)
                    sbuf.note_async_read(self.stream)
                return True
            # the copy runs on the source stream: first let it wait until this stream has passed
            # the work queued so far (which may still read dst), then make this stream wait for it
            with rt.activate(self.device.index):
                rt.event_record(self._ready_event, self.stream)
            with rt.activate(backend_src.device.index):
                rt.stream_wait_event(backend_src.stream, self._ready_event)
                rt.memcpy_dtod_async(backend_src.stream, dbuf.mem, dst.offset, sbuf.mem,
                                     src.offset, n)
                sbuf.note_async_read(backend_src.stream)
                rt.event_record(backend_src._copy_event, backend_src.stream)
            with rt.activate(self.device.index):
                rt.stream_wait_event(self.stream, backend_src._copy_event)
            return True
        if sbuf.is_host():
            if n == 0:
                return True
            if backend_src is not self and backend_src.device.caps.async_:
                backend_src.synchronize()  # queued work of an async source may still write src
            view = sbuf._host_view(src)
            if (rt.pinned_direct_upload and view is not None and isinstance(sbuf, AsyncHostBuffer)
                    and sbuf.buft.device.runtime is rt):  # type: ignore[union-attr]
                with rt.activate(self.device.index):  # pinned: DMA straight from the tensor
                    rt.memcpy_htod_async(self.stream, dbuf.mem, dst.offset, view)
                    fence = _StreamFence(rt, self.device.index, self.stream)
                # src's bytes are read when the stream gets there: host writers wait till then
                host_read_queued(sbuf, src.offset, n, fence.wait, fence.done)
                return True
            staging = rt.staging(self.stream, n)
            if view is not None:  # one copy, straight from host memory
                staging[:] = view
            else:
                staging[:] = sbuf._get_tensor(src, 0, n)
            with rt.activate(self.device.index):
                rt.memcpy_htod_async(self.stream, dbuf.mem, dst.offset, staging)
            return True
        return False

    # events -------------------------------------------------------------------------------------
    def _event_record(self, event: Event) -> None:
        if self.freed:
            raise BackendUnavailableError(f"event_record: backend {self.name} was freed; the event "
                                          "keeps its previous state")
        with self.runtime.activate(self.device.index):
            self.runtime.event_record(event.handle, self.stream)

    def _event_wait(self, event: Event) -> None:
        edev = event.device
        if not isinstance(edev, AsyncDevice) or edev.runtime is not self.runtime:
            raise ValueError(f"event_wait: backend {self.name} cannot wait for an event of device "
                             f"{edev.name}, which belongs to another runtime")
        with self.runtime.activate(self.device.index):
            self.runtime.stream_wait_event(self.stream, event.handle)

    def __repr__(self) -> str:
        return f"<AsyncBackend {self.name}>"


# ---------------------------------------------------------------------------------------------
# device


def reads_foreign_device_memory(op: Tensor, buft: Any) -> bool:
    """True when a source of ``op`` (or the tensor it views) lives in an :class:`AsyncBuffer`
    of another buffer type than ``buft``: another device's memory, which a device backend
    cannot read directly (its ``supports_op`` then says no and the scheduler copies)."""
    for s in op.src:
        if s is None:
            continue
        b = s.buffer if s.buffer is not None else (s.view_src.buffer if s.view_src is not None
                                                   else None)
        if isinstance(b, AsyncBuffer) and b.buft is not buft:
            return True
    return False


class AsyncDevice(Device):
    """One device of a runtime (mirrors ``ggml_backend_cuda_device``).

    Args:
        runtime: the :class:`Runtime`.
        index: the device's index in the runtime.
        refuse_ops: ops this device reports unsupported even when a kernel exists (to force CPU
            fallback in tests).
        offload_min_batch: ``offload_op`` threshold (ggml-cuda's ``GGML_OP_OFFLOAD_MIN_BATCH``).

    ``supports_op``: the kernels' honest answer for the runtime's array module, unless refused, and
    never for a node with a source in another device's buffer (ggml-cuda's rule, which makes the
    scheduler copy such sources). Compute plans check :meth:`can_compute` on what the node really
    reads (the scheduler's copies through ``graph.src_map``).
    ``supports_buft``: its own device buffer type only (a discrete GPU does not compute on pinned
    host memory; ggml says yes to CUDA_Host only on integrated GPUs, which ggmlpy does not model).
    """

    def __init__(self, runtime: Runtime, index: int, refuse_ops: Iterable[Op] | None = None,
                 offload_min_batch: int = OFFLOAD_MIN_BATCH) -> None:
        super().__init__()
        self.runtime = runtime
        self.index = int(index)
        self._name = f"{runtime.name}{index}"
        self.refuse_ops = frozenset(Op(o) for o in (refuse_ops or ()))
        self.offload_min_batch = int(offload_min_batch)
        self.buft = AsyncBufferType(self._name, self)
        self._info: DeviceInfo | None = None
        self._backends: weakref.WeakSet[AsyncBackend] = weakref.WeakSet()
        self._host_buft: AsyncHostBufferType | None = None
        self._lock = threading.Lock()
        #: the stream of the backend that last queued work on this device (interop exports
        #: name it as the producer stream), or None
        self.last_stream: Any = None

    @property
    def name(self) -> str:
        """Device name, e.g. "CUDA0", "SIM1"."""
        return self._name

    def _get_info(self) -> DeviceInfo:
        if self._info is None:
            self._info = self.runtime.device_info(self.index)
        return self._info

    _CAPS = interface.DeviceCaps(async_=True, host_buffer=True, buffer_from_host_ptr=False, events=True)

    def _get_caps(self) -> interface.DeviceCaps:
        return self._CAPS

    def _get_props(self) -> interface.DeviceProps:
        info = self._get_info()
        free, total = self.runtime.mem_info(self.index)
        return interface.DeviceProps(
            name=self._name, description=info.description, memory_free=free, memory_total=total,
            type=info.type, device_id=info.device_id, caps=self._CAPS, extra=dict(info.extra))

    @property
    def type(self) -> interface.DeviceType:
        """:class:`DeviceType` (without querying memory)."""
        return self._get_info().type

    def _init_backend(self, params: str | None) -> Backend:
        if params:
            raise ValueError(f"init_backend: device {self._name} takes no params, got {params!r}")
        return AsyncBackend(self)

    def _get_buffer_type(self) -> BufferType:
        return self.buft

    def _get_host_buffer_type(self) -> BufferType | None:
        return self.runtime_host_buffer_type()

    def runtime_host_buffer_type(self) -> AsyncHostBufferType:
        """The runtime's pinned host buffer type ``<RUNTIME>_Host`` (one per runtime; its device
        is the runtime's device 0)."""
        dev0 = self.reg.devices[0] if self.reg is not None and self.reg.devices else self
        if dev0 is not self:
            return dev0.runtime_host_buffer_type()  # type: ignore[union-attr]
        with self._lock:
            if self._host_buft is None:
                self._host_buft = AsyncHostBufferType(f"{self.runtime.name}_Host", self)
            return self._host_buft

    def can_compute(self, op: Tensor) -> bool:
        """Whether a kernel exists for ``op``'s op and types here and the op is not refused; unlike
        :meth:`supports_op` it ignores where the sources live (a plan reads the scheduler's copies
        of them, which are checked separately)."""
        return op.op not in self.refuse_ops and kernels.supports_op(op, self.runtime.xp)

    def _supports_op(self, op: Tensor) -> bool:
        if op.op in self.refuse_ops:
            return False
        if reads_foreign_device_memory(op, self.buft):
            return False
        return kernels.supports_op(op, self.runtime.xp)

    def supports_op_memo_token(self) -> tuple | None:
        """See :func:`ggmlpy.backends.cpu.backend.kernel_memo_token` (``refuse_ops`` is fixed per device
        and the source-memory rule above reads the key's memory class and buffer type)."""
        return kernel_memo_token(self, AsyncDevice._supports_op)

    def _supports_buft(self, buft: BufferType) -> bool:
        return buft is self.buft

    def _offload_op(self, op: Tensor) -> bool:
        if op.op == Op.GET_ROWS:
            return False
        if op.op == Op.MUL_MAT:
            batch = op.ne[1]
        elif op.op == Op.ROPE:
            batch = op.ne[2]
        else:
            batch = op.nrows
        return batch >= self.offload_min_batch

    # events -------------------------------------------------------------------------------------
    def _event_new(self) -> Event:
        with self.runtime.activate(self.index):
            return Event(self, self.runtime.event_new(self.index))

    def _event_synchronize(self, event: Event) -> None:
        self.runtime.event_synchronize(event.handle)

    def _event_query(self, event: Event) -> bool:
        return self.runtime.event_query(event.handle)

    # helpers ------------------------------------------------------------------------------------
    def _wait_all_streams(self) -> None:
        """Wait (without raising stored failures) for every live stream of every device of the
        runtime: work on any of them may read or write a buffer about to be freed."""
        devices = self.reg.devices if self.reg is not None else [self]
        for d in devices:
            for b in list(getattr(d, "_backends", ())):
                if not b.freed:
                    self.runtime.stream_synchronize(b.stream, check=False)

    def __repr__(self) -> str:
        return f"<AsyncDevice {self._name}>"


def make_reg(runtime: Runtime, **device_options: Any) -> interface.Reg:
    """A :class:`~ggmlpy.backend.interface.Reg` named ``runtime.name`` with one :class:`AsyncDevice` per device
    of ``runtime`` (``device_options`` go to every :class:`AsyncDevice`)."""
    n = runtime.device_count()
    return interface.Reg(runtime.name, [AsyncDevice(runtime, i, **device_options) for i in range(n)])

