"""Data-write generations of buffers: what the weight cache (``backends/kernels/weight_cache.py``)
checks before it reuses a converted copy of a buffer's tensors.

Every :class:`ggmlpy.backend.interface.Buffer` carries ``_data_gen`` (the process-wide generation of its
bytes' last change) and ``_async_writes`` (writes queued on a stream and not yet known to have
landed). This module owns that bookkeeping: the generation source, :func:`buffer_written`,
:func:`buffer_write_queued` and the end of queued writes at ``Backend.synchronize``.

Why a separate module: it is the package's write protocol, not the backend contract, and it
depends on nothing else in the package, so it sits in the lowest layer. ``Buffer`` derives from
:class:`WriteTracked` (defined here) so that :func:`buffer_written` can refuse non-buffers without
importing ``ggmlpy.backend.interface`` (a higher layer). Every name stays importable from
``ggmlpy.backend.interface``.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover  (annotations only: backend is a higher layer)
    from ggmlpy.backend.interface import Backend, Buffer

__all__ = ["WriteTracked", "buffer_written", "buffer_write_queued"]

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
