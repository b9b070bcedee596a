"""CUDA through CuPy: a :class:`~ggmlpy.backends.device.backend.Runtime` for real NVIDIA GPUs.

* Device memory comes straight from ``cudaMalloc`` (``cupy.cuda.runtime.malloc``), not from CuPy's
  memory pool, and goes back with ``cudaFree`` when the buffer is freed. Kernels see it through
  ``cupy.ndarray`` views (``cupy.cuda.UnownedMemory``) with the tensor's shape and strides.
* One non-blocking stream per backend (``cupy.cuda.Stream(non_blocking=True)``); kernels are
  enqueued on it by running the plan while it is the current stream.
* Blocking buffer operations run on the per-thread default stream and synchronize it (ggml-cuda's
  rule): they are not ordered against the backends' non-blocking streams.
* Async uploads copy from pinned staging taken from the stream's :class:`PinnedRing` (power-of-two
  size classes, reused once an event recorded after the copy has completed, capped); async
  downloads land in ring staging and are copied to the caller's array when the host observes
  completion (stream or event synchronize, or a query that returns True). Uploads from a pinned
  ``CUDA_Host`` tensor skip staging (``pinned_direct_upload``): the DMA reads the tensor's memory
  when the stream reaches it, so the device backend registers a host-read fence after each such
  copy and the package's host-side writers wait for it (:mod:`ggmlpy.backend.write_gen`).
* Every CUDA failure (launch, copy, memset, event, stream, allocation) becomes
  :class:`~ggmlpy.core.errors.ComputeError` or :class:`~ggmlpy.core.errors.OutOfMemoryError` naming the
  device and the operation, the CuPy exception chained.
* Peer access is enabled once per ordered device pair, before the first peer copy, where
  ``cudaDeviceCanAccessPeer`` allows it.
* :meth:`CupyRuntime.launch_count` counts fused kernel launches (:mod:`.cuda_kernels`); with the
  test suite's fake CuPy it counts every launch.
* CUDA graphs (``supports_graphs``): :meth:`CupyRuntime.graph_capture` captures a plan's steps
  with ``Stream.begin_capture()/end_capture()`` (relaxed mode) while CuPy allocates from a
  ``cupy.cuda.MemoryPool`` private to that graph (temporaries keep their addresses for every
  replay and are never handed to anyone else); :meth:`CupyRuntime.graph_launch` launches the
  ``cupy.cuda.Graph`` and keeps it (and its pool) alive until the stream has passed it.
* ``cupy.cuda.Event`` (timing disabled) for events; ``cudaMemGetInfo`` for memory.
* A failed stream synchronize discards that stream's pending downloads (their staging is never
  copied into the caller's arrays; staging blocks go back to the ring). A sticky error (illegal
  address, launch failure, device assert, ...: the CUDA context is lost) also marks the runtime
  failed: every later launch or checked synchronize raises BackendUnavailableError.
* The pinned host buffer type is "CUDA_Host" (``cupy.cuda.alloc_pinned_memory``), a host buffer the
  CPU backend computes on.

:func:`cuda_reg` never raises and never prints: without CuPy, a driver or a device it returns a
reg with no devices and a one-line ``unavailable_reason``; before registering devices it runs
:func:`probe` (compile and run a 1-element kernel through NVRTC, create a cuBLAS handle), so a CuPy
without its CUDA libraries (no ``[ctk]`` extra) is reported instead of failing at the first graph.
"""

from __future__ import annotations

import sys
import threading
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from functools import lru_cache
from typing import Any

import numpy as np

from ggmlpy.backend.interface import DeviceType, Reg
from ggmlpy.backend.registry import BackendFactory
from ggmlpy.backends.device.backend import DeviceInfo, DeviceMemory, Runtime, make_reg
from ggmlpy.core.errors import BackendUnavailableError, ComputeError, OutOfMemoryError
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

__all__ = ["CupyRuntime", "PinnedRing", "cuda_reg", "import_cupy", "probe"]

_CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation
_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704

_INSTALL_HINT = "install ggmlpy[cuda12] or ggmlpy[cuda13] (CuPy >= 14 with its ctk extra)"

_PROBE_SOURCE = r"""
extern "C" __global__ void ggmlpy_probe(float* a, const float v) {
    if (threadIdx.x == 0 && blockIdx.x == 0) a[0] = v + 1.0f;
}
"""


def probe(cupy: Any) -> str | None:
    """None when CUDA device 0 can really run work, else a one-line reason: compiles and launches
    a 1-element kernel (NVRTC + driver), reads the result back, creates device 0's cuBLAS
    handle. Never raises."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with cupy.cuda.Device(0):
                a = cupy.zeros(1, dtype=np.float32)
                cupy.RawKernel(_PROBE_SOURCE, "ggmlpy_probe")((1,), (32,), (a, np.float32(41.0)))
                got = float(a[0])
    except Exception as e:  # noqa: BLE001 - NVRTC missing, driver too old, no kernel image...
        return f"cannot compile/run a CUDA kernel ({_one_line(e)}); {_INSTALL_HINT}"
    if got != 42.0:
        return f"a 1-element CUDA kernel returned {got} instead of 42.0"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cupy.cuda.Device(0).cublas_handle  # noqa: B018 - creates the handle
    except Exception as e:  # noqa: BLE001
        return f"cuBLAS is not usable ({_one_line(e)}); {_INSTALL_HINT}"
    return None


def _driver_missing() -> str | None:
    """On Linux, a one-line reason when the CUDA driver library (``libcuda.so.1``) cannot be
    loaded: CuPy cannot reach a device then, and importing it (about a second, most of it
    ``ml_dtypes``) is skipped. None elsewhere or when the library loads."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1 cannot be loaded)"
    return None


def import_cupy() -> tuple[Any, str | None]:
    """``(cupy, None)`` when CuPy imports and sees at least one CUDA device, else ``(None, reason)``
    with a one-line reason. On Linux without the CUDA driver library CuPy is not imported at all
    (:func:`_driver_missing`), unless it already is (``sys.modules``). Warnings CuPy emits while importing are suppressed; never raises."""
    missing = _driver_missing() if "cupy" not in sys.modules else None  # imported: use it
    if missing is not None:
        return None, missing
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import cupy  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken CUDA library install
        return None, f"CuPy is not usable: {_one_line(e)}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return None, f"no usable CUDA driver/device ({_one_line(e)})"
    if n < 1:
        return None, "CuPy found no CUDA device"
    return cupy, None


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


class _CudaMemory(DeviceMemory):
    __slots__ = ("ptr", "unowned")

    def __init__(self, dev: int, size: int, ptr: int, unowned: Any) -> None:
        super().__init__(dev, size)
        self.ptr = ptr
        self.unowned = unowned


class PinnedRing:
    """Reusable pinned staging of one stream: blocks in power-of-two size classes (at least
    ``min_block`` bytes), handed out by :meth:`take`, given back by the runtime with :meth:`put`
    once an event recorded after their copy has completed, then reused for any request of the same
    class. At most ``cap`` bytes stay cached; a block returned beyond the cap is released.
    :meth:`free` releases every cached block (blocks in flight are released when they come back).

    Args:
        alloc: ``alloc(nbytes) -> 1-D uint8 pinned array`` (the runtime's ``alloc_pinned``).
        cap: bytes of idle blocks kept for reuse.
        min_block: the smallest size class in bytes.

    Attributes:
        allocs: pinned allocations made so far (``cudaHostAlloc`` calls).
    """

    def __init__(self, alloc: Callable[[int], np.ndarray], cap: int = 256 << 20,
                 min_block: int = 4096) -> None:
        if cap < 0 or min_block < 1:
            raise ValueError(f"PinnedRing: cap ({cap}) must be >= 0 and min_block ({min_block}) >= 1")
        self._alloc = alloc
        self.cap = cap
        self.min_block = min_block
        self._idle: dict[int, list[np.ndarray]] = {}
        self._out: dict[int, np.ndarray] = {}  # view address -> its block, taken, not yet queued
        self.cached_bytes = 0
        self.allocs = 0
        self._lock = threading.Lock()

    def size_class(self, size: int) -> int:
        """The block size in bytes serving a request of ``size`` bytes."""
        return max(self.min_block, 1 << max(0, int(size) - 1).bit_length())

    def take(self, size: int) -> np.ndarray:
        """A 1-D uint8 view of ``size`` bytes over an idle or new pinned block.

        Raises:
            ValueError: ``size`` is negative.
            OutOfMemoryError: pinned allocation failed.
        """
        if size < 0:
            raise ValueError(f"PinnedRing.take: size must be >= 0, got {size}")
        c = self.size_class(size)
        with self._lock:
            idle = self._idle.get(c)
            block = idle.pop() if idle else None
            if block is not None:
                self.cached_bytes -= c
        if block is None:
            block = self._alloc(c)
            self.allocs += 1
        view = block[:size]
        with self._lock:
            self._out[view.ctypes.data] = block
        return view

    def claim(self, view: np.ndarray) -> np.ndarray | None:
        """The block under ``view`` if it came from :meth:`take` (now in flight), else None."""
        with self._lock:
            return self._out.pop(view.ctypes.data, None)

    def put(self, block: np.ndarray) -> None:
        """Return an in-flight block whose copy has completed (released if over the cap)."""
        with self._lock:
            if self.cached_bytes + block.size <= self.cap:
                self._idle.setdefault(block.size, []).append(block)
                self.cached_bytes += block.size

    def free(self) -> None:
        """Release every idle block (their pinned memory goes back when the arrays die)."""
        with self._lock:
            self._idle.clear()
            self.cached_bytes = 0


#: cudaError_t values after which the context is unusable (700 illegal address, 710 device-side
#: assert, 714-719 hardware stack error .. launch failure); CUDA driver errors use the same numbers
_STICKY_STATUS = frozenset((700, 710, 714, 715, 716, 717, 718, 719))


class _CudaStream:
    """A non-blocking CuPy stream plus the host-side work waiting on it: ``pending`` holds
    ``(event, keep_alive, finish)`` in stream order; ``finish`` (if any) runs once the event is
    done. ``ring`` is its pinned staging."""

    def __init__(self, cupy: Any, dev: int, ring: PinnedRing) -> None:
        self.dev = dev
        self.cs = cupy.cuda.Stream(non_blocking=True)
        self.pending: deque[tuple[Any, Any, Callable[[], None] | None]] = deque()
        self.lock = threading.Lock()
        self.closed = False
        self.ring = ring


class _CudaGraph:
    """A captured plan: the ``cupy.cuda.Graph``, the private memory pool its temporaries came
    from, and the number of steps captured."""

    __slots__ = ("graph", "pool", "n_steps")

    def __init__(self, graph: Any, pool: Any, n_steps: int) -> None:
        self.graph, self.pool, self.n_steps = graph, pool, n_steps


class CupyRuntime(Runtime):
    """The CUDA runtime over CuPy (see the module docstring). Construct only when
    :func:`import_cupy` succeeded.

    Args:
        cupy: the imported ``cupy`` module.
        staging_cap: bytes of idle pinned staging each stream keeps for reuse (:class:`PinnedRing`).
    """

    name = "CUDA"
    alignment = 128
    guid = uuid.UUID("3b8f1d2e-6c4a-4e9b-a5d7-0f2e8c1b9a64")
    pinned_direct_upload = True

    def __init__(self, cupy: Any, staging_cap: int = 256 << 20) -> None:
        self.cp = cupy
        self.xp = cupy
        self.rt = cupy.cuda.runtime
        self._n = self.rt.getDeviceCount()
        self._streams: weakref.WeakSet[_CudaStream] = weakref.WeakSet()
        self._sticky: str | None = None  # set once a sticky CUDA error lost the context
        self.staging_cap = staging_cap
        self._peer: dict[tuple[int, int], bool] = {}
        self._peer_lock = threading.Lock()
        self._graph_launches = 0

    # error mapping --------------------------------------------------------------------------------
    def _is_cuda_error(self, e: BaseException) -> bool:
        """A failure CuPy reports from CUDA or a CUDA library: ``CUDARuntimeError``, but also
        ``CUDADriverError`` (kernel launches and module loads go through the driver API, and a
        sticky fault of earlier work surfaces there) and ``CUBLASError``/``CUSOLVERError``/...
        (all defined under ``cupy_backends.cuda``; the libraries are not imported here)."""
        return (isinstance(e, self.rt.CUDARuntimeError)
                or type(e).__module__.startswith("cupy_backends.cuda"))

    @contextmanager
    def _mapped(self, dev: int | None, what: str) -> Iterator[None]:
        """Turn CuPy's CUDA failures inside the block into ggmlpy's: memory exhaustion (CuPy's
        pool ``OutOfMemoryError``, ``cudaErrorMemoryAllocation``) -> :class:`OutOfMemoryError`,
        any other CUDA/library error -> :class:`ComputeError` naming ``CUDA<dev>`` (``CUDA`` when
        the device is unknown, e.g. for events) and ``what``; other exceptions pass through."""
        where = "CUDA" if dev is None else f"CUDA{dev}"
        try:
            yield
        except OutOfMemoryError:
            raise
        except MemoryError as e:
            free = None if dev is None else self.mem_info(dev)[0]
            raise OutOfMemoryError(where, int(getattr(e, "_size", 0) or 0), free,
                                   f"{what}: {_one_line(e)}") from e
        except Exception as e:
            if not self._is_cuda_error(e):
                raise
            if getattr(e, "status", None) == _CUDA_ERROR_MEMORY_ALLOCATION:
                free = None if dev is None else self.mem_info(dev)[0]
                raise OutOfMemoryError(where, 0, free, f"{what}: {_one_line(e)}") from e
            raise ComputeError(f"{where}: {what} failed: {_one_line(e)}") from e

    # devices ------------------------------------------------------------------------------------
    def device_count(self) -> int:
        return self._n

    def device_info(self, dev: int) -> DeviceInfo:
        p = self.rt.getDeviceProperties(dev)
        name = p.get("name", b"CUDA device")
        name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        cc = f"{p.get('major', 0)}.{p.get('minor', 0)}"
        pci = None
        if "pciBusID" in p:
            pci = f"{p.get('pciDomainID', 0):04x}:{p['pciBusID']:02x}:{p.get('pciDeviceID', 0):02x}.0"
        integrated = bool(p.get("integrated", 0))
        return DeviceInfo(
            description=name, type=DeviceType.IGPU if integrated else DeviceType.GPU, device_id=pci,
            extra={"compute_capability": cc, "device_name": name,
                   "total_memory": int(p.get("totalGlobalMem", 0)),
                   "multiprocessors": int(p.get("multiProcessorCount", 0)),
                   "cupy_version": self.cp.__version__})

    def mem_info(self, dev: int) -> tuple[int, int]:
        try:
            with self.cp.cuda.Device(dev):
                free, total = self.rt.memGetInfo()
            return int(free), int(total)
        except Exception:  # noqa: BLE001 - ggml reports 0/0 on error
            return 0, 0

    def activate(self, dev: int) -> AbstractContextManager[Any]:
        return self.cp.cuda.Device(dev)

    def on_stream(self, stream: Any) -> AbstractContextManager[Any]:
        stack = ExitStack()
        stack.enter_context(self.cp.cuda.Device(stream.dev))
        stack.enter_context(stream.cs)
        return stack

    def launch_count(self) -> int:
        """Kernel launches so far: the array module's own count when it keeps one (the test
        suite's fake CuPy counts every launch), else the fused launches of :mod:`.cuda_kernels`
        (real CuPy exposes no launch hook: its generic kernels are not counted)."""
        own = getattr(self.cp, "launch_count", None)
        if callable(own):
            return int(own())
        from ggmlpy.backends.cuda import kernels as cuda_kernels  # noqa: PLC0415 - a leaf module, imported on demand

        return cuda_kernels.launch_count() + self._graph_launches

    # memory -------------------------------------------------------------------------------------
    def malloc(self, dev: int, size: int) -> DeviceMemory:
        cp = self.cp
        with cp.cuda.Device(dev):
            try:
                ptr = self.rt.malloc(size)
            except self.rt.CUDARuntimeError as e:
                if getattr(e, "status", None) != _CUDA_ERROR_MEMORY_ALLOCATION:
                    raise ComputeError(f"CUDA{dev}: cudaMalloc of {size} bytes failed: "
                                       f"{_one_line(e)}") from e
                # CuPy's pool may hold freed kernel temporaries: give them back and retry once
                cp.get_default_memory_pool().free_all_blocks()
                try:
                    ptr = self.rt.malloc(size)
                except self.rt.CUDARuntimeError:
                    free, _ = self.mem_info(dev)
                    raise OutOfMemoryError(f"CUDA{dev}", size, free, "cudaMalloc failed") from None
            unowned = cp.cuda.UnownedMemory(ptr, size, None, dev)
        return _CudaMemory(dev, size, ptr, unowned)

    def free(self, mem: DeviceMemory) -> None:
        with self.cp.cuda.Device(mem.dev), self._mapped(mem.dev, "cudaFree"):
            self.rt.free(mem.ptr)  # type: ignore[attr-defined]
        mem.ptr = 0  # type: ignore[attr-defined]

    def array(self, mem: DeviceMemory, tensor: Tensor) -> Any:
        cp = self.cp
        ptr = cp.cuda.MemoryPointer(mem.unowned, tensor.offset)  # type: ignore[attr-defined]
        t = tensor
        if t.type.is_quantized:
            row = t.type.row_size(t.ne[0])
            return cp.ndarray((t.ne[3], t.ne[2], t.ne[1], row), cp.uint8, ptr,
                              (t.nb[3], t.nb[2], t.nb[1], 1))
        # CuPy has no bfloat16 dtype: BF16 tensors are their uint16 bit patterns (kernels.typeconv)
        dtype = cp.uint16 if t.type == Type.BF16 else t.type.dtype
        return cp.ndarray(t.ne[::-1], dtype, ptr, t.nb[::-1])

    # blocking copies on the per-thread default stream -----------------------------------------
    def _blocking(self, dev: int, what: str, fn: Callable[[int], None]) -> None:
        with self.cp.cuda.Device(dev), self._mapped(dev, what):
            s = self.cp.cuda.Stream.ptds
            fn(s.ptr)
            s.synchronize()

    def memcpy_htod(self, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        rt = self.rt
        self._blocking(mem.dev, "host-to-device copy", lambda s: rt.memcpyAsync(
            mem.ptr + offset, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, s))  # type: ignore[attr-defined]

    def memcpy_dtoh(self, mem: DeviceMemory, offset: int, size: int) -> np.ndarray:
        rt = self.rt
        out = np.empty(size, np.uint8)
        self._blocking(mem.dev, "device-to-host copy", lambda s: rt.memcpyAsync(
            out.ctypes.data, mem.ptr + offset, size, rt.memcpyDeviceToHost, s))  # type: ignore[attr-defined]
        return out

    def memcpy_dtoh_into(self, mem: DeviceMemory, offset: int, out: np.ndarray) -> None:
        rt = self.rt
        self._blocking(mem.dev, "device-to-host copy", lambda s: rt.memcpyAsync(
            out.ctypes.data, mem.ptr + offset, out.nbytes, rt.memcpyDeviceToHost, s))  # type: ignore[attr-defined]

    def memcpy_dtod(self, dst: DeviceMemory, dst_offset: int, src: DeviceMemory, src_offset: int,
                    size: int) -> None:
        self._blocking(src.dev, "device-to-device copy",
                       lambda s: self._dtod(s, dst, dst_offset, src, src_offset, size))

    def _dtod(self, stream_ptr: int, dst: Any, dst_offset: int, src: Any, src_offset: int,
              size: int) -> None:
        rt = self.rt
        if dst.dev == src.dev:
            rt.memcpyAsync(dst.ptr + dst_offset, src.ptr + src_offset, size,
                           rt.memcpyDeviceToDevice, stream_ptr)
        else:
            self.enable_peer_access(src.dev, dst.dev)
            rt.memcpyPeerAsync(dst.ptr + dst_offset, dst.dev, src.ptr + src_offset, src.dev, size,
                               stream_ptr)

    def enable_peer_access(self, a: int, b: int) -> bool:
        """Enable peer access between devices ``a`` and ``b`` (both directions) once, where
        ``cudaDeviceCanAccessPeer`` allows it; later calls return the cached answer. Returns True
        when ``a`` can access ``b`` directly (peer copies then skip host staging). Mirrors the
        peer-access setup of ggml-cuda. Never raises for "already enabled"."""
        if a == b:
            return True
        with self._peer_lock:
            if (a, b) in self._peer:
                return self._peer[(a, b)]
            for x, y in ((a, b), (b, a)):
                ok = bool(self.rt.deviceCanAccessPeer(x, y))
                if ok:
                    with self.cp.cuda.Device(x):
                        try:
                            self.rt.deviceEnablePeerAccess(y)
                        except self.rt.CUDARuntimeError as e:
                            if getattr(e, "status", None) != _CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
                                ok = False
                self._peer[(x, y)] = ok
            return self._peer[(a, b)]

    def memset(self, mem: DeviceMemory, offset: int, size: int, value: int) -> None:
        rt = self.rt
        self._blocking(mem.dev, "memset", lambda s: rt.memsetAsync(mem.ptr + offset, value, size, s))  # type: ignore[attr-defined]

    def alloc_pinned(self, size: int) -> np.ndarray:
        try:
            mem = self.cp.cuda.alloc_pinned_memory(size)
        except Exception as e:  # noqa: BLE001 - CUDARuntimeError / OutOfMemoryError of CuPy
            raise OutOfMemoryError("CUDA_Host", size, None, _one_line(e)) from None
        return np.frombuffer(mem, np.uint8, size)  # the array's base keeps ``mem`` alive

    def staging(self, stream: Any, size: int) -> np.ndarray:
        """Pinned staging from ``stream``'s :class:`PinnedRing` (see :meth:`Runtime.staging`)."""
        self._reap(stream)
        return stream.ring.take(size)

    # streams ------------------------------------------------------------------------------------
    def stream_new(self, dev: int, name: str) -> _CudaStream:
        with self.cp.cuda.Device(dev), self._mapped(dev, "stream creation"):
            s = _CudaStream(self.cp, dev, PinnedRing(self.alloc_pinned, self.staging_cap))
        self._streams.add(s)
        return s

    def stream_free(self, stream: Any) -> None:
        if stream.closed:
            return
        try:
            self.stream_synchronize(stream, check=False)
        finally:
            stream.closed = True
            stream.ring.free()
            self._streams.discard(stream)

    def stream_synchronize(self, stream: Any, check: bool = True) -> None:
        if check:
            self._check_sticky()
        try:
            with self._mapped(stream.dev, "queued work"):
                stream.cs.synchronize()
        except (ComputeError, OutOfMemoryError) as e:
            self._discard_pending(stream)
            if int(getattr(e.__cause__, "status", 0) or 0) in _STICKY_STATUS:
                self._sticky = str(e)
            if check:
                raise
            return
        self._reap(stream, everything=True)

    def _discard_pending(self, stream: Any) -> None:
        """After a failed synchronize: drop every pending finisher; a download's ``on_failure``
        (give the staging back) runs instead of its copy into the caller's array."""
        with stream.lock:
            items = list(stream.pending)
            stream.pending.clear()
        for _ev, _keep, finish in items:
            if finish is not None:
                getattr(finish, "on_failure", finish)()

    def _check_sticky(self) -> None:
        if self._sticky is not None:
            raise BackendUnavailableError(f"CUDA: the device context was lost by an earlier "
                                          f"error ({self._sticky}); restart the process")

    def launch(self, stream: Any, fn: Callable[[], Any]) -> None:
        self._check_sticky()
        self._reap(stream)
        with self.on_stream(stream), self._mapped(stream.dev, "kernel launch"):
            fn()

    supports_graphs = True

    def graph_capture(self, stream: Any, steps: list[Any]) -> _CudaGraph:
        self._check_sticky()
        cp = self.cp
        cs = stream.cs
        pool = cp.cuda.MemoryPool()
        with self.on_stream(stream), cp.cuda.using_allocator(pool.malloc):
            with self._mapped(stream.dev, "begin graph capture"):
                cs.begin_capture()
            try:
                for step in steps:
                    step()
            except BaseException:
                try:
                    cs.end_capture()
                except Exception:  # noqa: BLE001 - the capture is invalid anyway
                    pass
                pool.free_all_blocks()
                raise
            with self._mapped(stream.dev, "end graph capture"):
                graph = cs.end_capture()
        return _CudaGraph(graph, pool, len(steps))

    def graph_launch(self, stream: Any, graph: Any) -> None:
        self._check_sticky()
        self._reap(stream)
        with self.on_stream(stream), self._mapped(stream.dev, "graph launch"):
            graph.graph.launch(stream.cs)
        self._graph_launches += 1
        self._track(stream, graph, None)  # graph and pool live until the stream has passed it

    def _track(self, stream: Any, keep: Any, finish: Callable[[], None] | None) -> None:
        with self._mapped(stream.dev, "event record"):
            ev = self.cp.cuda.Event(block=False, disable_timing=True)
            ev.record(stream.cs)
        with stream.lock:
            stream.pending.append((ev, keep, finish))

    def _reap(self, stream: Any, everything: bool = False) -> None:
        """Release staging and finish downloads whose event has completed (all after a sync)."""
        while True:
            with stream.lock:
                if not stream.pending:
                    return
                ev, _keep, finish = stream.pending[0]
                if not everything and not ev.done:
                    return
                stream.pending.popleft()
            if finish is not None:
                finish()

    def _reap_all(self) -> None:
        for s in list(self._streams):
            self._reap(s)

    def memcpy_htod_async(self, stream: Any, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        self._reap(stream)
        block = stream.ring.claim(src)
        with self._mapped(stream.dev, "async host-to-device copy"):
            self.rt.memcpyAsync(mem.ptr + offset, src.ctypes.data, src.nbytes,  # type: ignore[attr-defined]
                                self.rt.memcpyHostToDevice, stream.cs.ptr)
        ring = stream.ring
        self._track(stream, src, None if block is None else (lambda: ring.put(block)))

    def memcpy_dtoh_async(self, stream: Any, out: np.ndarray, mem: DeviceMemory, offset: int) -> None:
        self._reap(stream)
        ring = stream.ring
        staging = ring.take(out.nbytes)
        block = ring.claim(staging)
        with self._mapped(stream.dev, "async device-to-host copy"):
            self.rt.memcpyAsync(staging.ctypes.data, mem.ptr + offset, out.nbytes,  # type: ignore[attr-defined]
                                self.rt.memcpyDeviceToHost, stream.cs.ptr)

        def finish() -> None:
            out[:] = staging
            ring.put(block)

        finish.on_failure = lambda: ring.put(block)  # type: ignore[attr-defined]
        self._track(stream, staging, finish)

    def memcpy_dtod_async(self, stream: Any, dst: DeviceMemory, dst_offset: int, src: DeviceMemory,
                          src_offset: int, size: int) -> None:
        self._reap(stream)
        with self._mapped(stream.dev, "async device-to-device copy"):
            self._dtod(stream.cs.ptr, dst, dst_offset, src, src_offset, size)

    # events -------------------------------------------------------------------------------------
    def event_new(self, dev: int) -> Any:
        with self.cp.cuda.Device(dev), self._mapped(dev, "event creation"):
            ev = self.cp.cuda.Event(block=False, disable_timing=True)
        return ev

    def event_record(self, event: Any, stream: Any) -> None:
        with self._mapped(stream.dev, "event record"):
            event.record(stream.cs)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        with self._mapped(stream.dev, "stream wait on event"):
            stream.cs.wait_event(event)

    def event_synchronize(self, event: Any) -> None:
        with self._mapped(None, "event synchronize"):
            event.synchronize()
        self._reap_all()

    def event_query(self, event: Any) -> bool:
        with self._mapped(None, "event query"):
            done = bool(event.done)
        if done:
            self._reap_all()
        return done


@lru_cache(maxsize=1)
def cuda_reg() -> Reg:
    """The "CUDA" registration: devices ``CUDA0..`` when CuPy sees CUDA devices, else a reg with
    no devices whose ``unavailable_reason`` says why in one line. Never raises, prints nothing;
    computed once per process."""
    cupy, reason = import_cupy()
    if cupy is None:
        return Reg("CUDA", [], unavailable_reason=reason)
    reason = probe(cupy)
    if reason is not None:
        return Reg("CUDA", [], unavailable_reason=reason)
    try:
        return make_reg(CupyRuntime(cupy))
    except Exception as e:  # noqa: BLE001
        return Reg("CUDA", [], unavailable_reason=f"CUDA initialisation failed ({_one_line(e)})")


def _unavailable(name: str) -> str:
    from ggmlpy.backend.registry import reg_unavailable_reason

    return reg_unavailable_reason("CUDA") or "no such CUDA device"


#: the registry's entry for CUDA (installed by :func:`ggmlpy.backends.install`)
FACTORY = BackendFactory("CUDA", 10, cuda_reg, unavailable_reason=_unavailable)
