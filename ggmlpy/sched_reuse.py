"""The scheduler's unchanged-graph fast path (issue 11 item 3; llama.cpp's graph reuse).

When the same graph is allocated again with the same shapes, pins and compute buffers, the
scheduler's split and the allocator's placement would come out identical, so
:class:`~ggmlpy.sched.Scheduler` keeps them here and replays them instead of re-splitting and
re-planning. Validity follows the one rule of :mod:`ggmlpy.snapshot` (ARCHITECTURE.md decision 8):

* a :class:`~ggmlpy.snapshot.Snapshot` of the user's graph taken when the split was built (the
  graph as the split read it: the scheduler's own placements undone by ``reset``). It covers
  every node, leaf and outside source: op, type, ``op_params``, ``ne``/``nb``, which tensor
  feeds which slot (so a graph with other wiring never reuses a split), ``view_src``/
  ``view_offs``, flags, and the buffer/offset of pre-allocated tensors (weights, user inputs);
* the graph object itself (held weakly), the user pins made with ``set_tensor_backend`` since
  the last reset, and the copy slot (``cur_copy``; one record per slot when pipelining);
* the compute buffers: the cache is dropped the moment any of them is freed
  (:func:`~ggmlpy.snapshot.on_buffer_free`), e.g. when a larger graph makes the allocator grow.

Placement replay. ``Scheduler.reset`` must un-place the tensors the scheduler placed (so another
allocator or scheduler sees them free). Doing that with ordinary assignments would stamp every
tensor and make the next validity check a full state compare, so when the placement is cached
it is *parked*: each tensor still at the cached address is un-placed without a stamp. The next
fast path puts back exactly the parked values, again without a stamp, so every other cache (the
backends' compiled plans) sees the same addresses it last saw. A slow path, ``free`` or a
dropped cache first stamps every parked tensor still un-placed (:func:`unpark`), so no cache
keeps trusting the parked addresses. Replaying another slot's placement (pipelining) assigns
normally (stamped) and then re-baselines the snapshot, as the only changes since it were the
scheduler's own.

Caveat: between ``reset`` and the next ``alloc_graph`` a parked tensor reads as un-placed but
caches that recorded its old address are not told; computing such a tensor in that window is a
misuse (it has no memory) and is not diagnosed. Not thread-safe (neither is the scheduler).
"""

from __future__ import annotations

import weakref
from typing import Any

from .snapshot import Snapshot, generation, on_buffer_free, touch

__all__ = ["SplitRecord", "ReuseCache"]

_osa = object.__setattr__


class SplitRecord:
    """Everything one split + allocation of a graph produced, for one copy slot.

    Attributes: the scheduler's per-split state (``splits``, ``graph``, ``node_ids``,
    ``leaf_ids``, ``backend_of``, ``cause``, ``copies``, ``graph_inputs``, ``views``, ``ctx``)
    and ``placement``: ``[(tensor, buffer, offset_bytes)]`` of every tensor the allocation placed.
    """

    __slots__ = ("splits", "graph", "node_ids", "leaf_ids", "backend_of", "cause", "copies",
                 "graph_inputs", "views", "ctx", "placement")

    def __init__(self, **kw: Any) -> None:
        for k in self.__slots__:
            _osa(self, k, kw[k])


def park(placement: list[tuple[Any, Any, Any]]) -> None:
    """Un-place every tensor of ``placement`` still at its recorded (buffer, offset), without
    stamping it (see the module docstring)."""
    for t, b, o in placement:
        if t._buffer is b and t._offset == o:
            _osa(t, "_buffer", None)
            _osa(t, "_offset", None)


def unpark(placement: list[tuple[Any, Any, Any]]) -> None:
    """Stamp every tensor of a parked ``placement`` that is still un-placed, so caches that
    recorded its old address revalidate."""
    for t, _b, _o in placement:
        if t._buffer is None and t._offset is None and t._ver >= 0:
            touch(t)


def _layout(rec: SplitRecord) -> tuple:
    """The addresses of a record's placement, position by position (buffer identity, offset);
    views are left out (they own no memory: a view of the user's input follows its copy slot)."""
    return tuple((id(b), o) for t, b, o in rec.placement if t.view_src is None)


class ReuseCache:
    """The split records of the last graph the scheduler allocated, and their validity.

    Counters: ``hits`` (fast paths taken) and ``misses`` (splits built by ``alloc_graph``).
    """

    def __init__(self) -> None:
        self._graph: weakref.ref[Any] | None = None
        self._snap: Snapshot | None = None
        self._pins: dict[Any, int] = {}
        self._slots: dict[int, SplitRecord] = {}
        self._buffers: set[int] = set()
        self.parked: list[tuple[Any, Any, Any]] | None = None
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        """Drop every record (stamping parked tensors first, see :func:`unpark`)."""
        if self.parked is not None:
            unpark(self.parked)
            self.parked = None
        self._graph = None
        self._snap = None
        self._slots = {}
        self._buffers = set()

    def holds(self, placement: list[tuple[Any, Any, Any]]) -> bool:
        """Whether ``placement`` is the placement of a record kept here."""
        return any(r.placement is placement for r in self._slots.values())

    def _buffer_freed(self, buffer: Any) -> None:
        if id(buffer) in self._buffers:
            self.clear()

    def lookup(self, graph: Any, slot: int, pins: dict[Any, int]) -> SplitRecord | None:
        """The record for ``graph`` in copy slot ``slot`` when still valid, else None (records
        of other slots are kept only while the graph, pins and snapshot are unchanged)."""
        ref = self._graph
        if ref is None or ref() is not graph or pins != self._pins or self._snap is None:
            self.clear()
            return None
        if not self._snap.matches(graph):
            self.clear()
            return None
        return self._slots.get(slot)

    def begin(self, graph: Any, pins: dict[Any, int]) -> Snapshot:
        """Before a split is built for ``graph``: stamp parked tensors, keep other slots' records
        only when this is the same, unchanged graph, and take the snapshot the new record will be
        valid for. Returns it (pass it to :meth:`store`)."""
        if self.parked is not None:
            unpark(self.parked)
            self.parked = None
        ref = self._graph
        same = (ref is not None and ref() is graph and pins == self._pins
                and self._snap is not None and self._snap.matches(graph))
        if not same:
            self._slots = {}
        snap = Snapshot.take(graph)
        self._graph = weakref.ref(graph)
        self._pins = dict(pins)
        self._snap = snap
        return snap

    def store(self, snap: Snapshot, slot: int, rec: SplitRecord, buffers: list[Any],
              replanned: bool) -> None:
        """After a successful allocation: keep ``rec`` for ``slot``. ``buffers`` are the compute
        buffers the placement points into (the cache is dropped when one is freed);
        ``replanned``: the allocator planned anew, so other slots' placements are stale."""
        if snap is not self._snap:
            return
        if replanned and self._slots:
            # another plan: other slots' records stay only when they place every tensor at the
            # same addresses (then the copy slots of in-flight evaluations are still disjoint)
            layout = _layout(rec)
            self._slots = {k: r for k, r in self._slots.items() if _layout(r) == layout}
        self._slots[slot] = rec
        for b in buffers:
            if id(b) not in self._buffers:
                self._buffers.add(id(b))
                on_buffer_free(b, self._buffer_freed)
        snap.generation = generation()  # only the scheduler's own placements happened since

    def replay(self, rec: SplitRecord) -> None:
        """Put ``rec``'s placement back: silently when it is the parked one, else with ordinary
        (stamped) assignments followed by a re-baselined snapshot."""
        parked, self.parked = self.parked, None
        if rec.placement is parked:
            for t, b, o in parked:
                _osa(t, "_buffer", b)
                _osa(t, "_offset", o)
        else:
            if parked is not None:
                unpark(parked)
            for t, b, o in rec.placement:
                t.buffer = b
                t.offset = o
            if self._snap is not None:
                self._snap.generation = generation()
        self.hits += 1
