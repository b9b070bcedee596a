"""Float32 copies of F16/BF16/quantized weights, kept between NumPy MUL_MAT calls and invalidated
on every write to the weight's buffer.

ggml's CPU backend multiplies F16/quantized weights in their own type (``vec_dot`` per row
block), so it never holds a float32 copy; NumPy has no such GEMM, and converting a MiniLM matrix
per call made one token 8-17x slower than F32. This cache makes the conversion once per weight
and write instead of once per call.

What is cached: the float32 values (NumPy shape ``ne[::-1]``, C-contiguous) of a MUL_MAT ``src0``
whose memory lies in a buffer of usage :attr:`~ggmlpy.backend.interface.BufferUsage.WEIGHTS` (checked at
plan build and again on every call), NumPy array module only (CPU and SIM backends). The key is
the buffer and the array's address, shape, strides and type; the entry also records the buffer's
write generation read **before** converting.

Never stale: every write to a buffer's bytes gives it a new write generation
(:func:`ggmlpy.backend.interface.buffer_written`: tensor set/memset/copy and their async forms, buffer
clear and free, compiled graph steps writing a non-COMPUTE buffer); an entry is used only while
the generation it recorded is the buffer's current one, and a writer bumps after its bytes are in
place, so a conversion that overlapped a write is never reused. While an async write to the
buffer is queued and its backend not yet synchronized (``buffer._async_writes > 0``) the cache
is neither read nor filled. Freed buffers drop their entries at once
(:func:`ggmlpy.core.snapshot.on_buffer_free`). Not tracked (documented limits): writes through a
NumPy view of the memory (``Tensor.numpy()``, a user array wrapped by ``cpu_buffer_from_array``:
buffers of type ``CPU_Mapped`` are never cached), and graph steps compiled while their
destination buffer was COMPUTE that write it after it is re-marked WEIGHTS; call
``buffer_written(buffer)`` after such writes.

Budget: ``GGMLPY_WEIGHT_CACHE_MB`` (:func:`ggmlpy.core.env.weight_cache_mb`, default 256 MiB, read when
a plan is built); least recently used entries are evicted past it; a weight larger than the whole
budget is not cached (the row-block path of :mod:`.matmul` converts it per call); 0 turns the
cache off. Block-quantized weights are cached only when the variable is set: their small batches
run on the dot kernels (:mod:`ggmlpy.backends.cpu.qmatmul`) straight from the quantized bytes,
so a float32 copy (4 bytes per element against 0.5-1.1) is an explicit trade of memory for the
speed of large batches, not a default. Thread-safe (one lock around the table; conversions run
outside it).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ggmlpy.backend.interface import BufferUsage
from ggmlpy.core import snapshot
from ggmlpy.core.env import weight_cache_mb

__all__ = ["WeightCache", "CACHE", "configure_from_env", "array_address"]


def array_address(x: np.ndarray) -> int:
    """The address of ``x``'s first element (``__array_interface__``'s data pointer)."""
    return int(x.__array_interface__["data"][0])


class _Entry:
    __slots__ = ("gen", "value", "nbytes", "buf_ref")

    def __init__(self, gen: int, value: np.ndarray, buf: Any) -> None:
        self.gen = gen
        self.value = value
        self.nbytes = int(value.nbytes)
        self.buf_ref = weakref.ref(buf)


class WeightCache:
    """An LRU table of float32 weight copies bounded by a byte budget (see the module doc).

    Args:
        budget_bytes: most bytes of float32 copies kept (0: nothing is kept).

    Attributes:
        hits, misses, stores, evictions, invalidations: counters since the last :meth:`clear`
            (``invalidations``: lookups that found an entry of an older write generation).
    """

    def __init__(self, budget_bytes: int = 0) -> None:
        self._lock = threading.Lock()
        self._table: OrderedDict[tuple, _Entry] = OrderedDict()
        self.budget_bytes = max(0, int(budget_bytes))
        self.bytes = 0
        self.hits = self.misses = self.stores = self.evictions = self.invalidations = 0

    # -- configuration -------------------------------------------------------------------------
    def set_budget(self, budget_bytes: int) -> None:
        """Set the budget in bytes (>= 0) and evict down to it at once.

        Raises:
            ValueError: a negative budget.
        """
        if int(budget_bytes) < 0:
            raise ValueError(f"WeightCache.set_budget: budget_bytes must be >= 0, got {budget_bytes}")
        with self._lock:
            self.budget_bytes = int(budget_bytes)
            self._evict(0)

    def clear(self) -> None:
        """Drop every entry and zero the counters."""
        with self._lock:
            self._table.clear()
            self.bytes = 0
            self.hits = self.misses = self.stores = self.evictions = self.invalidations = 0

    def stats(self) -> dict[str, int]:
        """Counters, entry count, bytes held and the budget (bytes), as a dict."""
        with self._lock:
            return {"entries": len(self._table), "bytes": self.bytes, "budget_bytes": self.budget_bytes,
                    "hits": self.hits, "misses": self.misses, "stores": self.stores,
                    "evictions": self.evictions, "invalidations": self.invalidations}

    def __len__(self) -> int:
        return len(self._table)

    # -- use -----------------------------------------------------------------------------------
    def fits(self, nbytes: int) -> bool:
        """Whether a copy of ``nbytes`` bytes may be cached under the current budget."""
        return 0 < nbytes <= self.budget_bytes

    def get(self, buf: Any, key: tuple, nbytes: int, convert: Callable[[], np.ndarray]) -> np.ndarray | None:
        """The float32 copy for ``key`` in buffer ``buf``: the cached one when it is of the
        buffer's current write generation, else ``convert()``'s result (stored when it fits).

        Returns None (the caller converts per call) when the copy cannot be used now: the
        buffer has queued async writes, was freed, is no longer of usage WEIGHTS, or ``nbytes``
        exceeds the budget. Synchronous.
        """
        if (buf.freed or buf._async_writes or buf.usage != BufferUsage.WEIGHTS
                or not self.fits(nbytes)):
            return None
        gen = buf._data_gen  # read before converting: a write overlapping us bumps past it
        with self._lock:
            e = self._table.get(key)
            if e is not None:
                if e.gen == gen and e.buf_ref() is buf:
                    self._table.move_to_end(key)
                    self.hits += 1
                    return e.value
                self.invalidations += 1
                self._drop(key)
            self.misses += 1
        value = convert()
        if buf._async_writes or buf.freed:
            return value  # used for this call only
        with self._lock:
            self._evict(value.nbytes)
            if value.nbytes <= self.budget_bytes:
                old = self._table.pop(key, None)
                if old is not None:
                    self.bytes -= old.nbytes
                self._table[key] = _Entry(gen, value, buf)
                self.bytes += value.nbytes
                self.stores += 1
        snapshot.on_buffer_free(buf, self._buffer_freed)
        return value

    # -- internals (callers hold the lock) -------------------------------------------------------
    def _drop(self, key: tuple) -> None:
        e = self._table.pop(key, None)
        if e is not None:
            self.bytes -= e.nbytes

    def _evict(self, incoming: int) -> None:
        while self._table and self.bytes + incoming > self.budget_bytes:
            _, e = self._table.popitem(last=False)
            self.bytes -= e.nbytes
            self.evictions += 1

    def _buffer_freed(self, buf: Any) -> None:
        bid = id(buf)
        with self._lock:
            for k in [k for k in self._table if k[0] == bid]:
                self._drop(k)


#: the cache every NumPy MUL_MAT uses
CACHE = WeightCache()


def configure_from_env() -> int:
    """Set :data:`CACHE`'s budget from ``GGMLPY_WEIGHT_CACHE_MB`` (called when a MUL_MAT with a
    converted weight is compiled); returns the budget in bytes.

    Raises:
        EnvError: a malformed value.
    """
    budget = int(weight_cache_mb() * (1 << 20))
    if budget != CACHE.budget_bytes:
        CACHE.set_budget(budget)
    return budget
