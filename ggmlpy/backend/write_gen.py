"""The package's write protocol: data-write generations of buffers (what the weight cache,
``backends/kernels/weight_cache.py``, checks before it reuses a converted copy of a buffer's
tensors) and host-read fences (what a host-side writer waits for before it overwrites host memory
that a queued copy still reads).

Every :class:`ggmlpy.backend.interface.Buffer` carries ``_data_gen`` (the process-wide generation of its
bytes' last change) and ``_async_writes`` (writes queued on a stream and not yet known to have
landed). This module owns that bookkeeping: the generation source, :func:`buffer_written`,
:func:`buffer_write_queued` and the end of queued writes at ``Backend.synchronize``.

Host-read fences. A device runtime may upload from pinned host memory *in stream order*, reading
the bytes only when the stream reaches the copy (CUDA's DMA from a ``CUDA_Host`` tensor; SIM with
``pinned_direct_upload``). The rule, whatever the runtime: a host memory region read by a queued
copy is not written (by a kernel, a ``tensor_set``/``memset``/``copy``, a ``clear``, or a tensor
the allocator placed there since) until that copy has completed. ggml keeps it by ordering such
copies against the producer's next write; here the backend that queues such a copy records a
fence after it (:func:`host_read_queued`, an event on its stream), and every host-side writer of
the package waits for the fences overlapping the bytes it is about to write
(:func:`wait_host_reads`: ``backend_tensor_set``/``memset``/``copy`` and their async fallbacks,
:meth:`Buffer.clear`, :meth:`Buffer.free`, and the CPU backend's plans through
:func:`wait_host_reads_ranges` before they run). Code that writes a buffer's host memory any
other way (a NumPy view from ``Tensor.numpy()``) must call :func:`wait_host_reads` first.

Why a separate module: it is the package's write protocol, not the backend contract, and it
depends on nothing else in the package, so it sits in the lowest layer. ``Buffer`` derives from
:class:`WriteTracked` (defined here) so that :func:`buffer_written` can refuse non-buffers without
importing ``ggmlpy.backend.interface`` (a higher layer). Every name stays importable from
``ggmlpy.backend.interface``.
"""

from __future__ import annotations

import itertools
import threading
from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover  (annotations only: backend is a higher layer)
    from ggmlpy.backend.interface import Backend, Buffer

__all__ = ["WriteTracked", "buffer_written", "buffer_write_queued", "host_read_queued",
           "wait_host_reads", "wait_host_reads_ranges", "host_reads_pending"]

#: process-wide source of write generations; ``next()`` on it is atomic under the GIL, so two
#: writers never publish the same value
_DATA_GEN = itertools.count(1)
_queued_lock = threading.Lock()


class WriteTracked:
    """Base class of :class:`ggmlpy.backend.interface.Buffer`: marks an object whose bytes carry a write
    generation (``_data_gen``, int) and a count of queued writes (``_async_writes``, int), both
    set by ``Buffer.__init__``. No state and no methods of its own."""

    __slots__ = ()


def buffer_written(buffer: Buffer) -> None:
    """Record that bytes of ``buffer`` changed: give it a new, never used write generation
    (``buffer._data_gen``). Call it **after** the bytes are in place. Every write path of the
    package calls it: ``backend_tensor_set``/``memset``/``copy`` (dst), their async forms (at
    enqueue, see :func:`buffer_write_queued`), :meth:`Buffer.clear`, :meth:`Buffer.free` and
    compiled graph steps whose destination lives in a buffer that is not COMPUTE
    (:meth:`ggmlpy.backends.plan.Plan.run`: once per run, or after each writing step when
    the same plan also reads the buffer through the weight cache). Code that writes a buffer's
    memory any other way (a NumPy view from ``Tensor.numpy()``, a wrapped user array) must call
    it too, or converted weight copies may be stale. Synchronous; thread-safe.

    Raises:
        TypeError: ``buffer`` is not a :class:`Buffer`.
    """
    if not isinstance(buffer, WriteTracked):
        raise TypeError(f"buffer_written: buffer must be a Buffer, got {type(buffer).__name__}")
    buffer._data_gen = next(_DATA_GEN)


def buffer_write_queued(backend: Backend, buffer: Buffer) -> None:
    """Record a write to ``buffer`` queued on ``backend``'s stream: bump its write generation now
    and count it in ``buffer._async_writes`` until ``backend.synchronize()`` returns (then the
    generation is bumped again). While the count is non-zero the weight cache neither uses nor
    stores a converted copy of the buffer's tensors. Thread-safe."""
    with _queued_lock:
        buffer._async_writes += 1
        q = backend.__dict__.setdefault("_queued_writes", [])
        q.append(buffer)
    buffer_written(buffer)


def _writes_landed(backend: Backend) -> None:
    with _queued_lock:
        q = backend.__dict__.get("_queued_writes") or []
        backend._queued_writes = []
        for b in q:
            b._async_writes -= 1
    for b in q:
        buffer_written(b)


# ---------------------------------------------------------------------------------------------
# host-read fences

_reads_lock = threading.Lock()
#: id(buffer) -> buffer, for every buffer holding fences not yet seen complete
_reading: dict[int, Buffer] = {}


def host_read_queued(buffer: Buffer, offset: int, size: int, wait: Callable[[], None],
                     done: Callable[[], bool]) -> None:
    """Record that a copy queued on a stream reads bytes ``[offset, offset + size)`` of
    ``buffer``'s host memory in place (no snapshot). ``wait()`` blocks the host until that copy
    has completed; ``done()`` says, without blocking, whether it has (an event recorded right
    after the copy: ``event_synchronize``/``event_query``). Until then every writer that follows
    the protocol (module docstring) waits before it writes those bytes. Offsets and sizes are
    bytes from the start of the buffer. Thread-safe; the caller queued the copy first.

    Raises:
        TypeError: ``buffer`` is not a :class:`Buffer`.
    """
    if not isinstance(buffer, WriteTracked):
        raise TypeError(f"host_read_queued: buffer must be a Buffer, got {type(buffer).__name__}")
    with _reads_lock:
        reads = buffer.__dict__.setdefault("_host_reads", [])
        reads.append((int(offset), int(offset) + int(size), wait, done))
        _reading[id(buffer)] = buffer


def host_reads_pending() -> bool:
    """Whether any buffer holds a fence not yet seen complete (one dict check: the CPU backend
    asks it before every plan run and does nothing more when it is False)."""
    return bool(_reading)


def _overlapping(buffer: Buffer, hit: Callable[[int, int], bool]) -> list:
    """The fences of ``buffer`` whose range ``hit(lo, hi)`` selects; completed ones that are not
    selected are dropped on the way."""
    with _reads_lock:
        reads = buffer.__dict__.get("_host_reads")
        if not reads:
            return []
        out, keep = [], []
        for r in reads:
            if hit(r[0], r[1]):
                out.append(r)
            elif not r[3]():
                keep.append(r)
        buffer._host_reads = keep + out
        if not buffer._host_reads:
            _reading.pop(id(buffer), None)
        return out


def _waited(buffer: Buffer, fences: list) -> None:
    for r in fences:
        r[2]()
    with _reads_lock:
        gone = set(map(id, fences))
        reads = [r for r in buffer.__dict__.get("_host_reads", ()) if id(r) not in gone]
        buffer._host_reads = reads
        if not reads:
            _reading.pop(id(buffer), None)


def wait_host_reads(buffer: Buffer, offset: int = 0, size: int | None = None) -> None:
    """Block until every queued copy reading bytes of ``buffer`` that overlap ``[offset,
    offset + size)`` (bytes; ``size`` None: to the end of the buffer) has completed (see
    :func:`host_read_queued`). Call it before writing those bytes. Returns at once for a
    buffer without fences. Thread-safe."""
    if not buffer.__dict__.get("_host_reads"):
        return
    hi = None if size is None else offset + size
    fences = _overlapping(buffer, lambda lo, h: h > offset and (hi is None or lo < hi))
    if fences:
        _waited(buffer, fences)


def wait_host_reads_ranges(ranges: dict[int, tuple[Buffer, list[int], list[int]]]) -> None:
    """:func:`wait_host_reads` for many byte ranges at once: ``ranges`` maps ``id(buffer)`` to
    ``(buffer, starts, ends)``, sorted, disjoint ``[starts[i], ends[i])`` (what a compiled plan
    writes, :meth:`ggmlpy.backends.plan.Plan.wait_host_reads`). Each fence is tested with one
    bisection; completed fences of other buffers are dropped on the way (so a buffer nobody
    writes does not keep :func:`host_reads_pending` True). Thread-safe."""
    for key in list(_reading):
        buf = _reading.get(key)
        if buf is None:
            continue
        hit = ranges.get(key)
        if hit is None:
            _overlapping(buf, _never)
            continue
        _, starts, ends = hit

        def overlaps(lo: int, hi: int, starts: list[int] = starts, ends: list[int] = ends) -> bool:
            i = bisect_right(starts, lo) - 1
            return (i >= 0 and ends[i] > lo) or (i + 1 < len(starts) and starts[i + 1] < hi)
        fences = _overlapping(buf, overlaps)
        if fences:
            _waited(buf, fences)


def _never(lo: int, hi: int) -> bool:
    return False
