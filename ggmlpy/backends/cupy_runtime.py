"""CUDA through CuPy: a :class:`~ggmlpy.backends.device.Runtime` for real NVIDIA GPUs.

* Device memory comes straight from ``cudaMalloc`` (``cupy.cuda.runtime.malloc``), not from CuPy's
  memory pool, and goes back with ``cudaFree`` when the buffer is freed. Kernels see it through
  ``cupy.ndarray`` views (``cupy.cuda.UnownedMemory``) with the tensor's shape and strides.
* One non-blocking stream per backend (``cupy.cuda.Stream(non_blocking=True)``); kernels are
  enqueued on it by running the plan while it is the current stream.
* Blocking buffer operations run on the per-thread default stream and synchronize it (ggml-cuda's
  rule): they are not ordered against the backends' non-blocking streams.
* Async uploads copy from pinned staging; the staging is kept until an event recorded after the
  copy has completed. Async downloads land in pinned staging and are copied to the caller's array
  when the host observes completion (stream or event synchronize, or a query that returns True).
* ``cupy.cuda.Event`` (timing disabled) for events; ``cudaMemGetInfo`` for memory.
* The pinned host buffer type is "CUDA_Host" (``cupy.cuda.alloc_pinned_memory``), a host buffer the
  CPU backend computes on.

:func:`cuda_reg` never raises and never prints: without CuPy, a driver or a device it returns a
reg with no devices and a one-line ``unavailable_reason``.
"""

from __future__ import annotations

import threading
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from functools import lru_cache
from typing import Any

import numpy as np

from ..backend import DeviceType, Reg
from ..errors import ComputeError, OutOfMemoryError
from ..tensor import Tensor
from .device import DeviceInfo, DeviceMemory, Runtime, make_reg

__all__ = ["CupyRuntime", "cuda_reg", "import_cupy"]

_CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation


def import_cupy() -> tuple[Any, str | None]:
    """``(cupy, None)`` when CuPy imports and sees at least one CUDA device, else ``(None, reason)``
    with a one-line reason. Warnings CuPy emits while importing are suppressed; never raises."""
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


class _CudaStream:
    """A non-blocking CuPy stream plus the host-side work waiting on it: ``pending`` holds
    ``(event, keep_alive, finish)`` in stream order; ``finish`` (if any) runs once the event is done."""

    def __init__(self, cupy: Any, dev: int) -> None:
        self.dev = dev
        self.cs = cupy.cuda.Stream(non_blocking=True)
        self.pending: deque[tuple[Any, Any, Callable[[], None] | None]] = deque()
        self.lock = threading.Lock()
        self.closed = False


class CupyRuntime(Runtime):
    """The CUDA runtime over CuPy (see the module docstring). Construct only when
    :func:`import_cupy` succeeded.

    Args:
        cupy: the imported ``cupy`` module.
    """

    name = "CUDA"
    alignment = 128
    guid = uuid.UUID("3b8f1d2e-6c4a-4e9b-a5d7-0f2e8c1b9a64")

    def __init__(self, cupy: Any) -> None:
        self.cp = cupy
        self.xp = cupy
        self.rt = cupy.cuda.runtime
        self._n = self.rt.getDeviceCount()
        self._streams: weakref.WeakSet[_CudaStream] = weakref.WeakSet()

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

    # memory -------------------------------------------------------------------------------------
    def malloc(self, dev: int, size: int) -> DeviceMemory:
        cp = self.cp
        with cp.cuda.Device(dev):
            try:
                ptr = self.rt.malloc(size)
            except self.rt.CUDARuntimeError as e:
                if getattr(e, "status", None) != _CUDA_ERROR_MEMORY_ALLOCATION:
                    raise
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
        with self.cp.cuda.Device(mem.dev):
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
        return cp.ndarray(t.ne[::-1], t.type.dtype, ptr, t.nb[::-1])

    # blocking copies on the per-thread default stream -----------------------------------------
    def _blocking(self, dev: int, fn: Callable[[int], None]) -> None:
        with self.cp.cuda.Device(dev):
            s = self.cp.cuda.Stream.ptds
            fn(s.ptr)
            s.synchronize()

    def memcpy_htod(self, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        rt = self.rt
        self._blocking(mem.dev, lambda s: rt.memcpyAsync(
            mem.ptr + offset, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice, s))  # type: ignore[attr-defined]

    def memcpy_dtoh(self, mem: DeviceMemory, offset: int, size: int) -> np.ndarray:
        rt = self.rt
        out = np.empty(size, np.uint8)
        self._blocking(mem.dev, lambda s: rt.memcpyAsync(
            out.ctypes.data, mem.ptr + offset, size, rt.memcpyDeviceToHost, s))  # type: ignore[attr-defined]
        return out

    def memcpy_dtod(self, dst: DeviceMemory, dst_offset: int, src: DeviceMemory, src_offset: int,
                    size: int) -> None:
        self._blocking(src.dev, lambda s: self._dtod(s, dst, dst_offset, src, src_offset, size))

    def _dtod(self, stream_ptr: int, dst: Any, dst_offset: int, src: Any, src_offset: int,
              size: int) -> None:
        rt = self.rt
        if dst.dev == src.dev:
            rt.memcpyAsync(dst.ptr + dst_offset, src.ptr + src_offset, size,
                           rt.memcpyDeviceToDevice, stream_ptr)
        else:
            rt.memcpyPeerAsync(dst.ptr + dst_offset, dst.dev, src.ptr + src_offset, src.dev, size,
                               stream_ptr)

    def memset(self, mem: DeviceMemory, offset: int, size: int, value: int) -> None:
        rt = self.rt
        self._blocking(mem.dev, lambda s: rt.memsetAsync(mem.ptr + offset, value, size, s))  # type: ignore[attr-defined]

    def alloc_pinned(self, size: int) -> np.ndarray:
        try:
            mem = self.cp.cuda.alloc_pinned_memory(size)
        except Exception as e:  # noqa: BLE001 - CUDARuntimeError / OutOfMemoryError of CuPy
            raise OutOfMemoryError("CUDA_Host", size, None, _one_line(e)) from None
        return np.frombuffer(mem, np.uint8, size)  # the array's base keeps ``mem`` alive

    # streams ------------------------------------------------------------------------------------
    def stream_new(self, dev: int, name: str) -> _CudaStream:
        with self.cp.cuda.Device(dev):
            s = _CudaStream(self.cp, dev)
        self._streams.add(s)
        return s

    def stream_free(self, stream: Any) -> None:
        if stream.closed:
            return
        try:
            self.stream_synchronize(stream, check=False)
        finally:
            stream.closed = True
            self._streams.discard(stream)

    def stream_synchronize(self, stream: Any, check: bool = True) -> None:
        try:
            stream.cs.synchronize()
        except Exception as e:
            if not self._is_cuda_error(e):
                raise
            if check:
                raise ComputeError(f"CUDA{stream.dev}: queued work failed: {_one_line(e)}") from e
        self._reap(stream, everything=True)

    def _is_cuda_error(self, e: BaseException) -> bool:
        """A failure CuPy reports from CUDA or a CUDA library: ``CUDARuntimeError``, but also
        ``CUDADriverError`` (kernel launches and module loads go through the driver API, and a
        sticky fault of earlier work surfaces there) and ``CUBLASError``/``CUSOLVERError``/...
        (all defined under ``cupy_backends.cuda``; the libraries are not imported here)."""
        return (isinstance(e, self.rt.CUDARuntimeError)
                or type(e).__module__.startswith("cupy_backends.cuda"))

    def launch(self, stream: Any, fn: Callable[[], Any]) -> None:
        self._reap(stream)
        try:
            with self.on_stream(stream):
                fn()
        except MemoryError as e:
            if isinstance(e, OutOfMemoryError):
                raise
            # cupy.cuda.memory.OutOfMemoryError: the pool could not allocate a kernel temporary
            # (it has already freed its cached blocks and retried)
            free, _ = self.mem_info(stream.dev)
            raise OutOfMemoryError(f"CUDA{stream.dev}", int(getattr(e, "_size", 0) or 0), free,
                                   f"kernel temporaries: {_one_line(e)}") from e
        except Exception as e:
            if self._is_cuda_error(e):
                raise ComputeError(f"CUDA{stream.dev}: kernel launch failed: {_one_line(e)}") from e
            raise

    def _track(self, stream: Any, keep: Any, finish: Callable[[], None] | None) -> None:
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
        self.rt.memcpyAsync(mem.ptr + offset, src.ctypes.data, src.nbytes,  # type: ignore[attr-defined]
                            self.rt.memcpyHostToDevice, stream.cs.ptr)
        self._track(stream, src, None)

    def memcpy_dtoh_async(self, stream: Any, out: np.ndarray, mem: DeviceMemory, offset: int) -> None:
        self._reap(stream)
        staging = self.alloc_pinned(out.nbytes)
        self.rt.memcpyAsync(staging.ctypes.data, mem.ptr + offset, out.nbytes,  # type: ignore[attr-defined]
                            self.rt.memcpyDeviceToHost, stream.cs.ptr)

        def finish() -> None:
            out[:] = staging

        self._track(stream, staging, finish)

    def memcpy_dtod_async(self, stream: Any, dst: DeviceMemory, dst_offset: int, src: DeviceMemory,
                          src_offset: int, size: int) -> None:
        self._reap(stream)
        self._dtod(stream.cs.ptr, dst, dst_offset, src, src_offset, size)

    # events -------------------------------------------------------------------------------------
    def event_new(self, dev: int) -> Any:
        with self.cp.cuda.Device(dev):
            return self.cp.cuda.Event(block=False, disable_timing=True)

    def event_record(self, event: Any, stream: Any) -> None:
        event.record(stream.cs)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        stream.cs.wait_event(event)

    def event_synchronize(self, event: Any) -> None:
        event.synchronize()
        self._reap_all()

    def event_query(self, event: Any) -> bool:
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
    try:
        return make_reg(CupyRuntime(cupy))
    except Exception as e:  # noqa: BLE001
        return Reg("CUDA", [], unavailable_reason=f"CUDA initialisation failed ({_one_line(e)})")
