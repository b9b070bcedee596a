"""Tensor data access: set/get/memset/copy and their async forms (``ggml_backend_tensor_*``).

These are the public functions that move bytes in and out of tensors in backend memory; they
validate arguments against the tensor (byte ranges, dtypes, layouts) and then call the buffer's
and backend's hooks defined by the contract in :mod:`ggmlpy.backend.interface`. Copies follow one fallback
ladder, written once here: async peer copy, else host set/get, else staged through the host.

All offsets and sizes are in **bytes**. The blocking forms return when the bytes are in place; the
``*_async`` forms are ordered on the given backend's stream and complete by its ``synchronize()``.
The names are also importable from :mod:`ggmlpy.backend.interface` and :mod:`ggmlpy` (where they lived
before).

Every function that writes bytes records it on the destination buffer after the write
(:func:`ggmlpy.backend.interface.buffer_written`; the async forms with
:func:`ggmlpy.backend.interface.buffer_write_queued`, pending until the backend's ``synchronize``), which is
what invalidates the float32 weight copies of ``backends/kernels/weight_cache.py``, and first
waits until no queued copy still reads the bytes it overwrites
(:func:`ggmlpy.backend.write_gen.wait_host_reads`: a device's in-place upload from pinned host
memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.backend.interface import Backend, tensor_buffer
from ggmlpy.backend.write_gen import buffer_write_queued, buffer_written, wait_host_reads
from ggmlpy.core.check import checked_args
from ggmlpy.core.tensor import Tensor

__all__ = [
    "backend_tensor_set", "backend_tensor_get", "backend_tensor_memset", "backend_tensor_copy",
    "backend_tensor_set_async", "backend_tensor_get_async", "backend_tensor_copy_async",
    "as_bytes", "check_array_shape",
]


def as_bytes(data: Any) -> np.ndarray:
    """A 1-D contiguous ``uint8`` view (or copy, if not contiguous) of ``data``'s bytes.

    Accepts NumPy arrays, ``bytes``/``bytearray``/``memoryview`` and anything ``np.asarray``
    takes. Raises TypeError for object arrays.
    """
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise TypeError("cannot take the bytes of an object array")
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    return as_bytes(np.asarray(data))


def _check_range(tensor: Tensor, offset: int, size: int, what: str) -> None:
    if offset < 0 or size < 0 or offset + size > tensor.nbytes:
        raise ValueError(f"{what}: byte range [{offset}, {offset + size}) is outside tensor "
                         f"'{tensor.name}' of {tensor.nbytes} bytes")


def _start(t: Tensor) -> int:
    """Byte offset of ``t``'s data from the start of its buffer (0 when not known)."""
    return t.offset or 0


def _check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a Tensor, got {type(t).__name__}")


def _check_backend(b: Any, what: str, name: str = "backend") -> None:
    if not isinstance(b, Backend):
        raise TypeError(f"{what}: {name} must be a Backend, got {type(b).__name__}")


def _check_int(v: Any, name: str, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what}: {name} must be an int (bytes), got {v!r}")
    return int(v)


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` without its 1s: two shapes with equal squeezes order the same data alike."""
    return tuple(d for d in shape if d != 1)


def check_array_shape(tensor: Tensor, shape: tuple[int, ...], what: str) -> None:
    """Refuse a multi-dimensional host array of NumPy ``shape`` as the whole data of ``tensor``
    unless ``shape`` is ``tensor.ne[::-1]`` up to dims of size 1 (which do not change the order
    of the data); a 1-D array is always taken as the flat data. Only the shape is compared (the
    caller checks the element/byte count). Without it, a ``(ne0, ne1)`` array for ``ne = [ne0,
    ne1]`` (NumPy ``(ne1, ne0)``) of the same size would be written transposed, silently.

    Raises:
        ValueError: ``"<what>: array of shape ... for tensor '<name>' of NumPy shape ..."``.
    """
    if len(shape) > 1 and _squeeze(tuple(shape)) != _squeeze(tensor.ne[::-1]):
        raise ValueError(f"{what}: array of shape {tuple(shape)} for tensor '{tensor.name}' of "
                         f"NumPy shape {tuple(tensor.ne[::-1])} (ne reversed); reshape it, or "
                         "pass a 1-D array or raw bytes")


def _prepare_set(tensor: Tensor, data: Any, offset: int, size: int | None, what: str) -> np.ndarray:
    _check_tensor(tensor, what)
    offset = _check_int(offset, "offset", what)
    if size is not None:
        size = _check_int(size, "size", what)
    tensor_buffer(tensor)
    if not isinstance(data, (np.ndarray, bytes, bytearray, memoryview)):
        # lists and scalars: values of the tensor's element type, never raw float64 bytes
        if tensor.type.is_quantized:
            raise TypeError(f"{what}: tensor '{tensor.name}' is {tensor.type.type_name}: pass its "
                            "raw bytes (bytes or a uint8 array)")
        dt = np.dtype(tensor.type.dtype)
        if dt.kind == "f":
            # a value beyond the type's range would become inf: refuse it (never silently)
            src = np.asarray(data, dtype=np.float64)
            with np.errstate(over="ignore", invalid="ignore"):  # checked right below
                data = src.astype(dt)
            bad = np.isfinite(src) & ~np.isfinite(data)
            if bad.any():
                raise ValueError(f"{what}: value {src[bad].flat[0]!r} is outside the range of "
                                 f"tensor '{tensor.name}' ({tensor.type.type_name}, max "
                                 f"{float(np.finfo(dt).max)!r})")
        else:
            data = np.asarray(data, dtype=dt)
    if isinstance(data, np.ndarray) and data.dtype != np.uint8 and not tensor.type.is_quantized:
        if data.dtype != tensor.type.dtype:
            raise TypeError(f"{what}: array of dtype {data.dtype} for tensor '{tensor.name}' of "
                            f"type {tensor.type.type_name} (dtype {tensor.type.dtype}); convert first")
        if offset == 0 and size is None:
            if data.nbytes != tensor.nbytes:
                raise ValueError(f"{what}: {data.nbytes} bytes for tensor '{tensor.name}' of "
                                 f"{tensor.nbytes} bytes; pass size= for a partial write")
            if data.ndim > 1 and not tensor.is_contiguous():
                raise ValueError(f"{what}: tensor '{tensor.name}' is not contiguous; write "
                                 "its view_src or pass raw bytes")
            check_array_shape(tensor, data.shape, what)
    raw = as_bytes(data)
    n = raw.size if size is None else int(size)
    if n > raw.size:
        raise ValueError(f"{what}: size {n} is larger than the {raw.size} bytes given")
    _check_range(tensor, offset, n, what)
    return raw[:n]


@checked_args
def backend_tensor_set(tensor: Tensor, data: Any, offset: int = 0, size: int | None = None) -> None:
    """Write host data into a tensor's memory, blocking (mirrors ``ggml_backend_tensor_set``).

    Args:
        tensor: an allocated tensor.
        data: a NumPy array of the tensor's dtype, or raw bytes / a uint8 array. Bytes are
            copied as they lie in memory (ggml's raw semantics). A multi-dimensional typed array
            written whole must have NumPy shape ``ne[::-1]`` (up to dims of size 1); a 1-D
            one is taken as the flat data.
        offset: byte offset from the tensor's start.
        size: bytes to write (default: all of ``data``). A typed array written at offset 0 must
            cover the whole tensor unless ``size`` is given.

    Raises:
        NotAllocatedError: the tensor has no memory. TypeError: the array's dtype is not the
        tensor's. ValueError: the byte range is outside the tensor, or a whole-tensor write has
        the wrong byte size or (multi-dimensional) another shape than ``ne[::-1]``.
    """
    raw = _prepare_set(tensor, data, offset, size, "backend_tensor_set")
    if raw.size:
        buf = tensor_buffer(tensor)
        wait_host_reads(buf, _start(tensor) + int(offset), raw.size)
        buf._set_tensor(tensor, raw, int(offset))
        buffer_written(buf)


@checked_args
def backend_tensor_get(tensor: Tensor, offset: int = 0, size: int | None = None, *,
                       out: np.ndarray | None = None) -> np.ndarray | bytes:
    """Read a tensor back to the host, blocking (mirrors ``ggml_backend_tensor_get``).

    With ``offset == 0`` and ``size is None`` it returns a new NumPy array of the tensor's dtype
    with shape ``ne[::-1]`` (strided views are read through their strides); for block-quantized
    types the ``nbytes`` raw bytes as uint8. With a byte range it returns ``bytes``.

    ``out``: a writable host array to read the whole tensor into instead (no new array): the
    tensor's dtype (uint8 for quantized types) and ``tensor.nelements`` elements (any shape; a
    non-contiguous ``out`` is written through its strides in logical order); returned. Not with
    a byte range. Contiguous tensors in device memory are copied straight into a C-contiguous
    ``out``.

    Raises:
        TypeError: ``tensor`` is not a Tensor; ``offset``/``size`` not ints; ``out`` not a
        NumPy array or of another dtype.
        NotAllocatedError: the tensor has no memory. ValueError: range outside the tensor, ``out``
        with a byte range, or an ``out`` of the wrong size or not writable.
    """
    _check_tensor(tensor, "backend_tensor_get")
    offset = _check_int(offset, "offset", "backend_tensor_get")
    buf = tensor_buffer(tensor)
    if out is not None:
        _check_out(tensor, out, offset, size)
        if tensor.nbytes == 0:
            return out
        if tensor.type.is_quantized or tensor.is_contiguous():
            if out.flags.c_contiguous and not buf.is_host():
                buf._get_tensor_into(tensor, out.reshape(-1).view(np.uint8))
                return out
            raw = buf._get_tensor(tensor, 0, tensor.nbytes)
            np.copyto(out, raw.view(out.dtype).reshape(out.shape))
            return out
        raw = buf._get_tensor(tensor, 0, tensor.nbytes)
        src = np.lib.stride_tricks.as_strided(raw.view(tensor.type.dtype), shape=tensor.ne[::-1],
                                              strides=tensor.nb[::-1])
        np.copyto(out, src.reshape(out.shape))
        return out
    if offset == 0 and size is None:
        raw = buf._get_tensor(tensor, 0, tensor.nbytes)
        if tensor.type.is_quantized:
            return raw
        return np.lib.stride_tricks.as_strided(
            raw.view(tensor.type.dtype), shape=tensor.ne[::-1], strides=tensor.nb[::-1]).copy()
    size = tensor.nbytes - offset if size is None else _check_int(size, "size", "backend_tensor_get")
    _check_range(tensor, offset, size, "backend_tensor_get")
    return buf._get_tensor(tensor, int(offset), size).tobytes()


def _check_out(tensor: Tensor, out: Any, offset: int, size: int | None) -> None:
    what = "backend_tensor_get"
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what}: out must be a NumPy array, got {type(out).__name__}")
    if offset != 0 or size is not None:
        raise ValueError(f"{what}: out= reads the whole tensor '{tensor.name}'; no offset/size")
    want = np.dtype(np.uint8) if tensor.type.is_quantized else np.dtype(tensor.type.dtype)
    if out.dtype != want:
        raise TypeError(f"{what}: out has dtype {out.dtype}, tensor '{tensor.name}' needs {want}")
    n = tensor.nbytes if tensor.type.is_quantized else tensor.nelements
    if out.size != n:
        raise ValueError(f"{what}: out has {out.size} elements, tensor '{tensor.name}' has {n}")
    if not out.flags.writeable:
        raise ValueError(f"{what}: out for tensor '{tensor.name}' is read-only")


@checked_args
def backend_tensor_memset(tensor: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
    """Set ``size`` bytes (default: to the end) of a tensor to ``value``, blocking
    (mirrors ``ggml_backend_tensor_memset``).

    Raises:
        TypeError: ``tensor`` is not a Tensor; ``value``/``offset``/``size`` not ints.
        NotAllocatedError, ValueError: as :func:`backend_tensor_set`; ``value`` must be 0..255.
    """
    what = "backend_tensor_memset"
    _check_tensor(tensor, what)
    value = _check_int(value, "value", what)
    offset = _check_int(offset, "offset", what)
    buf = tensor_buffer(tensor)
    size = tensor.nbytes - offset if size is None else _check_int(size, "size", what)
    if not 0 <= value <= 255:
        raise ValueError(f"{what}: value {value} is not a byte")
    _check_range(tensor, offset, size, what)
    if size:
        wait_host_reads(buf, _start(tensor) + offset, size)
        buf._memset_tensor(tensor, value, offset, size)
        buffer_written(buf)


def _check_same_layout(src: Tensor, dst: Tensor, what: str) -> None:
    if not src.are_same_layout(dst):
        raise ValueError(f"{what}: '{src.name}' ({src.type.type_name} ne={list(src.ne)} "
                         f"nb={list(src.nb)}) and '{dst.name}' ({dst.type.type_name} "
                         f"ne={list(dst.ne)} nb={list(dst.nb)}) differ in layout")


@checked_args
def backend_tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copy ``src``'s bytes into ``dst``, blocking (mirrors ``ggml_backend_tensor_copy``).

    Ladder: src in host memory -> set into dst; dst in host memory -> get from src; dst buffer's
    direct copy; else staged through a host copy.

    Raises:
        ValueError: different type/ne/nb. NotAllocatedError: either is unallocated.
    """
    _check_tensor(src, "backend_tensor_copy")
    _check_tensor(dst, "backend_tensor_copy")
    _check_same_layout(src, dst, "backend_tensor_copy")
    if src is dst:
        return
    sbuf, dbuf = tensor_buffer(src), tensor_buffer(dst)
    n = src.nbytes
    if n == 0:
        return
    wait_host_reads(dbuf, _start(dst), n)
    if sbuf.is_host():
        dbuf._set_tensor(dst, sbuf._get_tensor(src, 0, n), 0)
    elif dbuf.is_host() or not dbuf._cpy_tensor(src, dst):
        dbuf._set_tensor(dst, sbuf._get_tensor(src, 0, n), 0)
    buffer_written(dbuf)


@checked_args
def backend_tensor_set_async(backend: Backend, tensor: Tensor, data: Any, offset: int = 0,
                             size: int | None = None) -> None:
    """Queue a host-to-tensor write on ``backend``'s stream (mirrors ``ggml_backend_tensor_set_async``).

    Same arguments and checks as :func:`backend_tensor_set`; all checks happen before anything is
    queued. Device backends snapshot ``data`` into pinned staging at call time, so the caller may
    reuse its array at once. Backends without async support synchronize and then copy blocking.
    """
    _check_backend(backend, "backend_tensor_set_async")
    raw = _prepare_set(tensor, data, offset, size, "backend_tensor_set_async")
    if not raw.size:
        return
    buf = tensor_buffer(tensor)
    wait_host_reads(buf, _start(tensor) + int(offset), raw.size)
    if backend._set_tensor_async(tensor, raw, int(offset)):
        buffer_write_queued(backend, buf)  # lands by backend.synchronize()
    else:
        backend.synchronize()
        buf._set_tensor(tensor, raw, int(offset))
        buffer_written(buf)


@checked_args
def backend_tensor_get_async(backend: Backend, tensor: Tensor, out: np.ndarray, offset: int = 0) -> None:
    """Queue a tensor-to-host read into ``out`` on ``backend``'s stream (mirrors
    ``ggml_backend_tensor_get_async``). ``out`` holds the data only after ``backend.synchronize()``.

    Args:
        out: a writable C-contiguous host array; its ``nbytes`` is the byte count read.
        offset: byte offset from the tensor's start.

    Raises:
        TypeError: ``backend``/``tensor`` of the wrong class, ``offset`` not an int.
        NotAllocatedError, ValueError (range, or ``out`` not writable/contiguous).
    """
    what = "backend_tensor_get_async"
    _check_backend(backend, what)
    _check_tensor(tensor, what)
    offset = _check_int(offset, "offset", what)
    tensor_buffer(tensor)
    if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"backend_tensor_get_async: out for '{tensor.name}' must be a writable "
                         "C-contiguous NumPy array")
    _check_range(tensor, offset, out.nbytes, "backend_tensor_get_async")
    if not out.nbytes:
        return
    raw = out.reshape(-1).view(np.uint8)
    if not backend._get_tensor_async(tensor, raw, int(offset)):
        backend.synchronize()
        raw[:] = tensor_buffer(tensor)._get_tensor(tensor, int(offset), out.nbytes)


@checked_args
def backend_tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    """Copy ``src`` into ``dst`` ordered after the work queued on ``backend_src`` and before later
    work on ``backend_dst`` (mirrors ``ggml_backend_tensor_copy_async``).

    Tries ``backend_dst``'s async peer copy; if it cannot, synchronizes both backends and copies
    blocking with :func:`backend_tensor_copy`.

    Raises:
        TypeError: an argument of the wrong class (named). ValueError: different layout.
        NotAllocatedError: either tensor unallocated.
    """
    what = "backend_tensor_copy_async"
    _check_backend(backend_src, what, "backend_src")
    _check_backend(backend_dst, what, "backend_dst")
    _check_tensor(src, what)
    _check_tensor(dst, what)
    _check_same_layout(src, dst, what)
    if src is dst:
        return
    tensor_buffer(src)
    dbuf = tensor_buffer(dst)
    if backend_dst._cpy_tensor_async(backend_src, src, dst):
        buffer_write_queued(backend_dst, dbuf)  # lands by backend_dst.synchronize()
        return
    backend_src.synchronize()
    backend_dst.synchronize()
    backend_tensor_copy(src, dst)
