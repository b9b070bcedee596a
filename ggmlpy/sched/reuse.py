"""The scheduler's unchanged-graph fast path (llama.cpp's graph reuse, ``llm_graph_result::can_reuse`` in
``src/llama-graph.cpp``).

When the same graph is allocated again with the same shapes, pins and compute buffers, the
scheduler's split and the allocator's placement would come out identical, so
:class:`~ggmlpy.sched.scheduler.Scheduler` keeps them here and replays them instead of re-splitting and
re-planning. Records are kept for the last :data:`DEFAULT_CAPACITY` graphs (an LRU keyed by graph
object, graphs held weakly), so a model that caches one graph per batch shape and alternates
between them replays each. Validity follows the one rule of :mod:`ggmlpy.core.snapshot`, per graph:

* a :class:`~ggmlpy.core.snapshot.Snapshot` of the user's graph taken when the split was built (the
  graph as the split read it: the scheduler's own placements undone by ``reset``). It covers
  every node, leaf and outside source: op, type, ``op_params``, ``ne``/``nb``, which tensor
  feeds which slot (so a graph with other wiring never reuses a split), ``view_src``/
  ``view_offs``, flags, and the buffer/offset of pre-allocated tensors (weights, user inputs);
* the graph object itself (held weakly; its records go when it dies), the user pins made with
  ``set_tensor_backend`` since the last reset, and the copy slot (``cur_copy``; one record per
  slot when pipelining);
* the compute buffers: every record is dropped the moment any of them is freed
  (:func:`~ggmlpy.core.snapshot.on_buffer_free`), e.g. when a larger graph makes the allocator grow.

Placement replay. ``Scheduler.reset`` must un-place the tensors the scheduler placed (so another
allocator or scheduler sees them free). Doing that with ordinary assignments would stamp every
tensor and make the next validity check a full state compare, so when the placement is cached
it is *parked*: each tensor still at the cached address is un-placed without a stamp. The next
fast path of that record puts back exactly the parked values, again without a stamp, so every
other cache (the backends' compiled plans) sees the same addresses it last saw. Several
placements may be parked at once (one per kept record): a plan is only checked when its graph
is computed, which needs that graph's placement put back first, so a plan never sees another
record's addresses. Re-splitting a graph, dropping or evicting its record, or dropping the
cache first stamps its parked tensors still un-placed (:func:`unpark`), so no cache keeps
trusting addresses nobody will put back. Replaying a record that is not parked assigns
normally (stamped) and then re-baselines the graph's snapshot, as the only changes since it
were the scheduler's own.

A *new* graph object with the structure of one split before is not replayed here (its tensors
are other objects) but takes that split by position from a split template, see
:mod:`ggmlpy.sched.template`; its allocation then runs as usual.

Caveat: between ``reset`` and the next ``alloc_graph`` a parked tensor reads as un-placed but
caches that recorded its old address are not told; computing such a tensor in that window is a
misuse (it has no memory) and is not diagnosed. Not thread-safe (neither is the scheduler).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

from ggmlpy.core.snapshot import Snapshot, bump, generation, on_buffer_free, slot_setter
from ggmlpy.core.tensor import Tensor

__all__ = ["SplitRecord", "ReuseCache", "DEFAULT_CAPACITY", "split_signature"]

# stamp-free setters of the Tensor slots (ggmlpy.core.snapshot.slot_setter)
_SET_BUFFER, _SET_OFFSET, _SET_VER = (slot_setter(Tensor, k) for k in ("_buffer", "_offset", "_ver"))


class SplitRecord:
    """Everything one split + allocation of a graph produced, for one copy slot.

    Attributes:
        state: the split (:class:`~ggmlpy.sched.splits.SplitState`, its assignment a copy
            nobody changes).
        graph: the scheduler graph built from it; ``node_ids``, ``leaf_ids``: the backend id of
            each of its nodes and leafs.
        views: the split-graph views (:attr:`ggmlpy.sched.splits.SchedGraphBuilder.views`).
        placement: ``[(tensor, buffer, offset_bytes)]`` of every tensor the allocation placed.
    """

    __slots__ = ("state", "graph", "node_ids", "leaf_ids", "views", "placement")

    def __init__(self, state: Any, graph: Any, node_ids: list[int], leaf_ids: list[int],
                 views: dict, placement: list[tuple[Any, Any, Any]]) -> None:
        self.state = state
        self.graph = graph
        self.node_ids = node_ids
        self.leaf_ids = leaf_ids
        self.views = views
        self.placement = placement


def park(placement: list[tuple[Any, Any, Any]]) -> None:
    """Un-place every tensor of ``placement`` still at its recorded (buffer, offset), without
    stamping it (see the module docstring)."""
    set_buffer, set_offset = _SET_BUFFER, _SET_OFFSET
    for t, b, o in placement:
        if t._buffer is b and t._offset == o:
            set_buffer(t, None)
            set_offset(t, None)


def unpark(placement: list[tuple[Any, Any, Any]]) -> None:
    """Stamp every tensor of a parked ``placement`` that is still un-placed, so caches that
    recorded its old address revalidate (one new generation for all of them)."""
    gen = None
    set_ver = _SET_VER
    for t, _b, _o in placement:
        if t._buffer is None and t._offset is None and t._ver >= 0:
            if gen is None:
                gen = bump()
            set_ver(t, gen)


def _layout(rec: SplitRecord) -> tuple:
    """The addresses of a record's placement, position by position (buffer identity, offset);
    views are left out (they own no memory: a view of the user's input follows its copy slot)."""
    return tuple((id(b), o) for t, b, o in rec.placement if t.view_src is None)


def split_signature(splits: list[Any], graph_inputs: list[Any], pos: dict[int, int],
                    node_ids: list[int], leaf_ids: list[int], cur_copy: int) -> tuple | None:
    """What the scheduler's graph (``Scheduler.graph``) is built from besides the user graph's
    state, by position: the copy slot, per split its backend, node range ``[i_start, i_end)`` and
    inputs (positions in the user graph's :class:`~ggmlpy.core.snapshot.Snapshot`, ``pos`` as filled
    by :meth:`Snapshot.take`), the pipelined graph inputs, and the backend id of every node and
    leaf of the scheduler's graph. Two splits with equal user-graph states and equal signatures
    build scheduler graphs with equal states (which copy feeds which slot follows from the
    inputs' positions and the backend ids), so the allocator's compare can be skipped (the
    scheduler *vouches*, see ``Scheduler._alloc_slow``). None when an input has no position
    (a source outside the snapshot's walk): no vouch then."""
    get = pos.get
    sig = []
    for sp in splits:
        ins = tuple([get(id(t)) for t in sp.inputs])
        if None in ins:
            return None
        sig.append((sp.backend_id, sp.i_start, sp.i_end, ins))
    gi = tuple([get(id(t)) for t in graph_inputs])
    if None in gi:
        return None
    return (cur_copy, tuple(sig), gi, node_ids, leaf_ids)


class _Entry:
    """The records of one graph: the graph (weakly), the pins and snapshot they are valid for,
    and one record per copy slot."""

    __slots__ = ("graph", "snap", "pins", "slots")

    def __init__(self, graph: weakref.ref[Any], snap: Snapshot, pins: dict[Any, int]) -> None:
        self.graph = graph
        self.snap = snap
        self.pins = pins
        self.slots: dict[int, SplitRecord] = {}


#: graphs whose split records the scheduler keeps (least recently used dropped first)
DEFAULT_CAPACITY = 32


class ReuseCache:
    """The split records of the last ``capacity`` graphs the scheduler allocated (an LRU keyed
    by graph object), and their validity.

    A model that caches one graph per batch shape and alternates between them takes the fast
    path for each. Every record is validated on its own (its graph's snapshot, pins and copy
    slot); a freed compute buffer drops all of them (they all point into the same buffers).

    Counters: ``hits`` (fast paths taken), ``misses`` (splits built by ``alloc_graph``) and
    ``evictions`` (graphs dropped to stay within ``capacity``).

    Raises:
        ValueError: ``capacity`` < 1.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if int(capacity) < 1:
            raise ValueError(f"ReuseCache: capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._buffers: set[int] = set()
        # id(placement) -> placement, for every placement parked by Scheduler.reset
        self._parked: dict[int, list[tuple[Any, Any, Any]]] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        # the entry :meth:`begin` made or refreshed last (kept again by :meth:`store` when a
        # buffer freed during that allocation cleared the cache)
        self._pending: _Entry | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def _unpark_entry(self, e: _Entry) -> None:
        for r in e.slots.values():
            pl = self._parked.pop(id(r.placement), None)
            if pl is not None:
                unpark(pl)

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key, None)
        if e is not None:
            self._unpark_entry(e)

    def clear(self) -> None:
        """Drop every record (stamping parked tensors first, see :func:`unpark`)."""
        for pl in self._parked.values():
            unpark(pl)
        self._parked = {}
        self._entries = OrderedDict()
        self._buffers = set()

    def holds(self, placement: list[tuple[Any, Any, Any]]) -> bool:
        """Whether ``placement`` is the placement of a record kept here."""
        return any(r.placement is placement for e in self._entries.values()
                   for r in e.slots.values())

    def park(self, placement: list[tuple[Any, Any, Any]]) -> None:
        """Un-place ``placement`` (a kept record's) without stamps until it is replayed (see
        :func:`park`)."""
        park(placement)
        self._parked[id(placement)] = placement

    def _buffer_freed(self, buffer: Any) -> None:
        if id(buffer) in self._buffers:
            self.clear()

    def _valid_entry(self, graph: Any, pins: dict[Any, int]) -> _Entry | None:
        """The entry of ``graph`` when its pins and snapshot still hold; an invalid entry of
        ``graph`` is dropped (its parked placements stamped)."""
        key = id(graph)
        e = self._entries.get(key)
        if e is None:
            return None
        if e.graph() is not graph or pins != e.pins or not e.snap.matches(graph):
            self._drop(key)
            return None
        return e

    def lookup(self, graph: Any, slot: int, pins: dict[Any, int]) -> SplitRecord | None:
        """The record for ``graph`` in copy slot ``slot`` when still valid, else None (records
        of other slots are kept only while the graph, pins and snapshot are unchanged; other
        graphs' records are not touched)."""
        e = self._valid_entry(graph, pins)
        if e is None:
            return None
        self._entries.move_to_end(id(graph))
        return e.slots.get(slot)

    def begin(self, graph: Any, pins: dict[Any, int], pos: dict[int, int] | None = None,
              order: list[Any] | None = None) -> Snapshot:
        """Before a split is built for ``graph``: stamp ``graph``'s own parked tensors, keep its
        other slots' records only when it is unchanged, and take the snapshot the new record
        will be valid for. Returns it (pass it to :meth:`store`). Other graphs' records stay.
        ``pos``, ``order``: as :meth:`Snapshot.take`."""
        key = id(graph)
        e = self._valid_entry(graph, pins)
        if e is not None:
            self._unpark_entry(e)  # the split below places its tensors anew (stamped)
        snap = Snapshot.take(graph, pos, order)
        if e is None:
            ref = weakref.ref(graph, self._graph_died(key))
            e = _Entry(ref, snap, dict(pins))
            self._entries[key] = e
            while len(self._entries) > self.capacity:
                k0 = next(iter(self._entries))
                self._drop(k0)
                self.evictions += 1
        else:
            e.snap = snap
            e.pins = dict(pins)
        self._entries.move_to_end(key)
        self._pending = e
        return snap

    def _graph_died(self, key: int) -> Any:
        me = weakref.ref(self)

        def died(ref: weakref.ref) -> None:
            cache = me()
            if cache is not None:
                e = cache._entries.get(key)
                if e is not None and e.graph is ref:
                    cache._drop(key)
        return died

    def store(self, snap: Snapshot, slot: int, rec: SplitRecord, buffers: list[Any],
              replanned: bool) -> None:
        """After a successful allocation: keep ``rec`` for ``slot`` of the graph ``snap`` was
        taken for. ``buffers`` are the compute buffers the placement points into (the cache is
        dropped when one is freed); ``replanned``: the allocator planned anew, so that graph's
        other slots' placements are stale."""
        e = next((x for x in reversed(self._entries.values()) if x.snap is snap), None)
        if e is None:
            # the allocation freed a compute buffer (the allocator grew it), which cleared every
            # record, this graph's too: keep this graph again, with the new record only (it
            # points into the new buffers), so its next allocation replays
            p, self._pending = self._pending, None
            g = p.graph() if p is not None and p.snap is snap else None
            if g is None:
                return
            p.slots = {}
            self._entries[id(g)] = e = p
        if replanned and e.slots:
            # another plan: other slots' records stay only when they place every tensor at the
            # same addresses (then the copy slots of in-flight evaluations are still disjoint)
            layout = _layout(rec)
            e.slots = {k: r for k, r in e.slots.items() if _layout(r) == layout}
        e.slots[slot] = rec
        for b in buffers:
            if id(b) not in self._buffers:
                self._buffers.add(id(b))
                on_buffer_free(b, self._buffer_freed)
        snap.generation = generation()  # only the scheduler's own placements happened since

    def replay(self, graph: Any, rec: SplitRecord) -> None:
        """Put ``rec``'s placement back: silently when it is parked, else with ordinary
        (stamped) assignments followed by a re-baselined snapshot of ``graph``."""
        parked = self._parked.pop(id(rec.placement), None)
        if parked is not None:
            set_buffer, set_offset = _SET_BUFFER, _SET_OFFSET
            for t, b, o in parked:
                set_buffer(t, b)
                set_offset(t, o)
        else:
            for t, b, o in rec.placement:
                t.buffer = b
                t.offset = o
            e = self._entries.get(id(graph))
            if e is not None:
                e.snap.generation = generation()
        self.hits += 1
