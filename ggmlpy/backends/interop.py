"""Zero-copy interop: tensors as NumPy arrays, CUDA Array Interface v3 and DLPack producers.

What a tensor exposes depends on where its memory is:

* **Host buffer** (CPU, CUDA_Host, user arrays wrapped by ``cpu_buffer_from_array``):
  :func:`numpy_view` (``Tensor.numpy()``) is a NumPy view (shape ``ne[::-1]``, strides
  ``nb[::-1]`` bytes, the tensor's dtype) of the buffer's memory; ``np.asarray(tensor)``
  (``__array__``) gives the same view, and ``__dlpack__`` exports it (device ``kDLCPU``), so
  ``torch.from_dlpack(tensor)`` shares the memory.
* **CUDA device buffer**: ``__cuda_array_interface__`` (v3: ``data`` = device pointer,
  ``strides`` in bytes, ``stream`` = the pointer of the stream of the backend that last queued
  work on the device, so a consumer orders its reads after that work) and ``__dlpack__`` /
  ``__dlpack_device__`` (``kDLCUDA``; the consumer's ``stream`` argument is honoured: CuPy makes
  that stream wait for the producer stream, which is made current for the export).
* SIM device memory and block-quantized tensors export nothing (``TypeError``; the dunders raise
  ``AttributeError`` so ``hasattr`` probes say no): read them with ``backend_tensor_get``.

Lifetimes (as in ggml): a view aliases the tensor's memory *now*. A view of a graph intermediate
is valid until the next evaluation (or allocation) reuses that memory; it then shows whatever is
written there. A view never reads memory handed to someone else: NumPy views keep the host block
alive; device exports register an owner with the buffer, and freeing a device buffer with live
exports defers ``cudaFree`` until the last export is garbage-collected. Exporting a tensor of a
freed or unallocated buffer raises :class:`~ggmlpy.core.errors.NotAllocatedError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.backend.interface import tensor_buffer
from ggmlpy.core.tensor import Tensor

__all__ = ["numpy_view", "to_array", "cuda_array_interface", "dlpack", "dlpack_device",
           "device_export_owner"]

KDL_CPU = 1
KDL_CUDA = 2


def _buffer(t: Tensor, what: str) -> Any:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a Tensor, got {type(t).__name__}")
    return tensor_buffer(t)  # NotAllocatedError: unallocated or freed


def numpy_view(t: Tensor) -> np.ndarray:
    """A NumPy view of ``t``'s memory in a host buffer: shape ``ne[::-1]``, strides ``nb[::-1]``
    (bytes), dtype of ``t.type``; writes go to the tensor. No copy, no synchronization: finish
    queued work that writes ``t`` first. Mirrors reading ``tensor->data`` of a host buffer in ggml.

    Raises:
        NotAllocatedError: ``t`` is unallocated or its buffer was freed.
        TypeError: ``t`` is block-quantized, or in device memory (read it with
            ``backend_tensor_get``, or use ``__cuda_array_interface__``/``__dlpack__`` on CUDA).
    """
    buf = _buffer(t, "Tensor.numpy")
    if t.type.is_quantized:
        raise TypeError(f"Tensor.numpy: '{t.name}' is {t.type.type_name} (block-quantized): no "
                        "element view; read its bytes with backend_tensor_get")
    if not buf.is_host():
        raise TypeError(f"Tensor.numpy: '{t.name}' is in device memory ({buf.name}); use "
                        "backend_tensor_get (a copy) or, on CUDA, __cuda_array_interface__/__dlpack__")
    return buf._array(t)


def to_array(t: Tensor, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    """``np.asarray(tensor)`` (the ``__array__`` protocol, NumPy 2 signature): the host view of
    :func:`numpy_view` (``copy`` None/False) for host tensors, a copy read with
    ``backend_tensor_get`` for device tensors (``copy=False`` then raises ValueError)."""
    buf = _buffer(t, "Tensor.__array__")
    if buf.is_host() and not t.type.is_quantized:
        a = numpy_view(t)
        if copy:
            a = a.copy()
    else:
        if copy is False:
            raise ValueError(f"Tensor.__array__: '{t.name}' is in {buf.name}: a host array needs a copy")
        from ggmlpy.backend.tensor_data import backend_tensor_get  # noqa: PLC0415 - same layer, call time only

        a = backend_tensor_get(t)
    if dtype is not None and np.dtype(dtype) != a.dtype:
        if copy is False:
            raise ValueError(f"Tensor.__array__: dtype {dtype} needs a copy of '{t.name}'")
        a = a.astype(dtype)
    return a


def _cuda(t: Tensor, what: str) -> tuple[Any, Any]:
    """``(buffer, runtime)`` of a tensor in CUDA device memory, else AttributeError."""
    buf = _buffer(t, what)
    from ggmlpy.backends.cuda.runtime import CupyRuntime  # noqa: PLC0415 - leaf import, CuPy not needed
    from ggmlpy.backends.device.backend import AsyncBuffer  # noqa: PLC0415

    if not isinstance(buf, AsyncBuffer) or not isinstance(buf.runtime, CupyRuntime):
        raise AttributeError(f"{what}: '{t.name}' is not in CUDA device memory ({buf.name})")
    if t.type.is_quantized:
        raise AttributeError(f"{what}: '{t.name}' is {t.type.type_name}: no element layout")
    return buf, buf.runtime


def _producer_stream(buf: Any) -> Any:
    """The runtime stream of the backend that last queued work on the buffer's device, or None."""
    s = buf.buft.device.last_stream
    return None if s is None or getattr(s, "closed", False) else s


def cuda_array_interface(t: Tensor) -> dict[str, Any]:
    """``__cuda_array_interface__`` v3 of a tensor in CUDA device memory: ``shape`` ``ne[::-1]``,
    ``strides`` ``nb[::-1]`` (bytes), ``typestr`` of its dtype, ``data`` ``(pointer, False)``,
    ``stream``: the pointer of the stream that last queued work on the device (consumers wait for
    it), or None when no backend has queued anything (blocking copies are already complete). The
    tensor is registered as an export owner of its buffer (see the module docstring).

    Raises:
        AttributeError: not in CUDA memory, or quantized (so ``hasattr`` probes say no).
        NotAllocatedError: unallocated or freed.
    """
    buf, _rt = _cuda(t, "__cuda_array_interface__")
    buf._exports.add(t)
    s = _producer_stream(buf)
    return {"shape": tuple(t.ne[::-1]), "typestr": np.dtype(t.type.dtype).str,
            "data": (int(buf.mem.ptr) + int(t.offset), False), "strides": tuple(t.nb[::-1]),
            "descr": [("", np.dtype(t.type.dtype).str)], "version": 3,
            "stream": None if s is None else int(s.cs.ptr)}


class _ExportOwner:
    """Owner of one device export: while it lives, freeing the buffer defers ``cudaFree``."""

    __slots__ = ("__weakref__",)


def device_export_owner(buf: Any) -> _ExportOwner:
    """A new owner object registered with device buffer ``buf`` (see the module docstring)."""
    o = _ExportOwner()
    buf._exports.add(o)
    return o


def dlpack_device(t: Tensor) -> tuple[int, int]:
    """``__dlpack_device__``: ``(kDLCUDA=2, device)`` for CUDA memory, ``(kDLCPU=1, 0)`` for host
    buffers (the array module's own answer where it differs, e.g. the test suite's fake CuPy)."""
    buf = _buffer(t, "__dlpack_device__")
    if buf.is_host():
        return (KDL_CPU, 0)
    buf, rt = _cuda(t, "__dlpack_device__")
    return tuple(_device_array(t, buf, rt, None).__dlpack_device__())


def _device_array(t: Tensor, buf: Any, rt: Any, owner: Any) -> Any:
    cp = rt.cp
    mem = cp.cuda.UnownedMemory(int(buf.mem.ptr) + int(t.offset), max(t.nbytes, 1), owner,
                                buf.mem.dev)
    return cp.ndarray(tuple(t.ne[::-1]), t.type.dtype, cp.cuda.MemoryPointer(mem, 0),
                      tuple(t.nb[::-1]))


def dlpack(t: Tensor, *, stream: Any = None, **kwargs: Any) -> Any:
    """``__dlpack__``: a DLPack capsule sharing ``t``'s memory. Host buffers: NumPy's export of
    :func:`numpy_view`. CUDA: CuPy's export of a view owned by a new export owner, made with the
    producer stream (the backend's that last queued work) current, so CuPy orders the consumer's
    ``stream`` (an int pointer, 1 legacy, 2 per-thread, None: the consumer synchronizes itself)
    after it. Other keyword arguments (``max_version``, ``dl_device``, ``copy``) go to the array
    module.

    Raises:
        NotAllocatedError, TypeError: as :func:`numpy_view` (SIM memory: TypeError).
    """
    buf = _buffer(t, "__dlpack__")
    if buf.is_host():
        return numpy_view(t).__dlpack__(stream=stream, **kwargs)
    try:
        buf, rt = _cuda(t, "__dlpack__")
    except AttributeError as e:
        raise TypeError(str(e)) from None
    arr = _device_array(t, buf, rt, device_export_owner(buf))
    s = _producer_stream(buf)
    with rt.cp.cuda.Device(buf.mem.dev):
        if s is None:
            return arr.__dlpack__(stream=stream, **kwargs)
        with s.cs:
            return arr.__dlpack__(stream=stream, **kwargs)


class HOOKS:
    """The functions behind ``Tensor.numpy``, ``__array__``, ``__cuda_array_interface__``,
    ``__dlpack__`` and ``__dlpack_device__`` (installed by :func:`ggmlpy.backends.install`)."""

    numpy = staticmethod(numpy_view)
    array = staticmethod(to_array)
    cuda_array_interface = staticmethod(cuda_array_interface)
    dlpack = staticmethod(dlpack)
    dlpack_device = staticmethod(dlpack_device)

