"""One validity rule for every cache that depends on a graph.

Compiled plans, the graph allocator's plan, the scheduler's splits and any device-side graph
replay all read the same things from a graph: per node its op, type, ``op_params``, ``ne``,
``nb`` (bytes), sources (which tensor feeds which slot, after the scheduler's ``src_map``),
``view_src``/``view_offs``, flags (with the graph's ``extra_flags``), and where its memory is
(``buffer``, ``offset`` in bytes); the same for every leaf and every source outside the node
list. This module answers "is that still what I read?" for all of them.

Mechanism
---------
* A process-wide **generation** counter. Every mutation of a field above (of a published
  tensor, see below) bumps it:
  ``Tensor.__setattr__`` (only when the value really changes), in-place writes to
  ``t.op_params``/``t.src`` (they are :class:`TrackedList` objects), ``Graph.nodes``/``leafs``
  edits (also tracked lists), assignment of ``Graph.src_map``/``extra_flags`` and
  :func:`buffer_freed`. The counter is guarded by a lock, so concurrent bumps are never lost
  (this replaces the old ``Tensor.alloc_epoch``, a racy read-modify-write).
* Every Tensor and Graph carries ``_ver``, the generation of its last change. Tensors start
  *unpublished* (``_ver == -1``, plain ``op_params``/``src`` lists, no stamping: graph building
  stays cheap); :meth:`Snapshot.take` publishes every tensor it records.
* A :class:`Snapshot` stores the generation read **before** it was taken plus a compact tuple of
  the state above. :meth:`Snapshot.matches` is O(1) when the generation has not moved; otherwise
  one C-speed ``max`` over the ``_ver`` of the graph's nodes and leafs (and weakly held outside
  sources) shows whether anything of this graph changed; only then is the state tuple rebuilt
  and compared (a change back to the recorded values stays valid). On success it adopts the
  current generation so the next check is O(1) again.

Rules for cache owners (allocator, scheduler split cache, replay)
-----------------------------------------------------------------
1. ``snap = Snapshot.take(graph)`` when building; keep ``snap`` next to the cached result.
2. ``if snap.matches(graph): reuse`` else rebuild and take a new snapshot.
3. Never keep a strong reference to the graph or to buffers only for validation: a snapshot holds
   ids, scalars and weak references only. If the cached result holds buffer memory (array views), register with
   :func:`on_buffer_free` so the result is dropped the moment the buffer is freed.
4. Code that edits a ``src_map``/``extra_flags`` dict in place after assigning it to a graph
   must call :func:`touch` on the graph (assignment stamps by itself).

Costs (``scripts/bench_snapshot.py`` measures them): the unchanged check with an unmoved
generation is O(1); after an unrelated mutation elsewhere it walks the generations (cheap per
node); the state compare fallback and taking a snapshot cost a few attribute reads per node.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

__all__ = ["generation", "bump", "touch", "TrackedList", "Snapshot", "graph_state", "on_buffer_free",
           "buffer_freed", "slot_setter", "free_hook_count"]

_lock = threading.Lock()
_generation = 0


def generation() -> int:
    """The current process-wide mutation generation (an int that only grows). Thread-safe."""
    return _generation


def bump() -> int:
    """Record that something a cache may have read changed; returns the new generation.
    Thread-safe (lock-guarded increment)."""
    global _generation
    with _lock:
        _generation += 1
        return _generation


def touch(obj: Any) -> None:
    """Bump the generation and stamp ``obj`` (a Tensor or Graph) as changed now. Call it after
    editing in place something not tracked automatically (a graph's ``src_map`` dict)."""
    object.__setattr__(obj, "_ver", bump())


class TrackedList(list):
    """A ``list`` whose every mutation stamps its owner (a Tensor's ``op_params``/``src``, a
    Graph's ``nodes``/``leafs``) through :func:`touch`. Reads are plain list reads.

    Build with :meth:`of` (``TrackedList(items)`` has no owner: only the generation moves).
    """

    __slots__ = ("_owner",)

    @classmethod
    def of(cls, items: Iterable[Any], owner: Any) -> TrackedList:
        """A tracked copy of ``items`` stamping ``owner`` (held weakly) on mutation."""
        tl = cls(items)
        tl._owner = weakref.ref(owner)
        return tl

    def _changed(self) -> None:
        ref = getattr(self, "_owner", None)
        o = ref() if ref is not None else None
        if o is None:
            bump()
        elif o._ver >= 0:  # an owner in no snapshot yet (_ver -1) needs no stamp
            touch(o)

    def __setitem__(self, i: Any, v: Any) -> None:
        super().__setitem__(i, v)
        self._changed()

    def __delitem__(self, i: Any) -> None:
        super().__delitem__(i)
        self._changed()

    def __iadd__(self, other: Iterable[Any]) -> TrackedList:
        super().__iadd__(other)
        self._changed()
        return self

    def __imul__(self, n: Any) -> TrackedList:
        super().__imul__(n)
        self._changed()
        return self


def _tracked_mutator(name: str) -> Callable[..., Any]:
    base = getattr(list, name)

    def method(self: TrackedList, *args: Any, **kwargs: Any) -> Any:
        r = base(self, *args, **kwargs)
        self._changed()
        return r

    method.__name__ = name
    method.__doc__ = base.__doc__
    return method


for _name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"):
    setattr(TrackedList, _name, _tracked_mutator(_name))
del _name


def _tensor_state(t: Any, ref: Callable[[Any], Any]) -> tuple:
    vs = t.view_src
    return (t.op, t.type, t.ne, t.nb, tuple(t.op_params), ref(vs) if vs is not None else None,
            t.view_offs, id(t._buffer) if t._buffer is not None else 0, t._offset)


_int_or = int.__or__  # C-level flag union: plain ints, no IntFlag objects in the state


def graph_state(graph: Any) -> tuple:
    """The compact state of ``graph`` a cache depends on: for every node, leaf and source (each
    tensor once, in visiting order) what :func:`_tensor_state` reads and its flags as a plain
    int (with the graph's ``extra_flags``), and per node its sources as the graph resolves them
    (``graph.node_srcs``); one flat tuple (layout: :func:`_state`).

    Tensors are named by their position in that visiting order, not by identity, so the state
    says which position feeds which node (the wiring) and two graph objects built the same way
    over the same weights and buffers have equal states: a plan made for one is valid for the
    other (every cache keys on positions: the allocator's records, the plans' steps). A view
    source outside the graph is named by its identity. Only positions, ids and scalars are
    stored: no tensor, graph or buffer is kept alive.

    (Hot path of every fresh split and allocation: written out inline.)
    """
    return _state(graph, None)


def _state(graph: Any, late: list[Any] | None, pos: dict[int, int] | None = None,
           order: list[Any] | None = None) -> tuple:
    """:func:`graph_state`; appends to ``late`` (when given) every source first reached through
    a node's sources rather than as a node or leaf (a superset of the outside sources), fills
    ``pos`` (when given, empty) with ``id(tensor) -> position`` in the state and ``order`` (when
    given, empty) with the tensors by position (``order[pos[id(t)]] is t``).

    Layout (one flat tuple: a few objects for the cyclic GC to scan instead of several per
    tensor; every variable part is preceded by a count or a marker, so equal tuples mean equal
    states): ``n_leafs, n_nodes``, a record per leaf, then per node ``1`` and its record (or
    ``0`` when already recorded), its source count and per source its position, ``-1`` for
    None, or ``-2`` followed by the source's record (a source not recorded yet: its position
    is the next). A record is ``op, type, ne, nb, len(op_params), *op_params, view_src (its
    position, or ("id", id) outside the state), view_offs, id(buffer) or 0, offset, flags``.
    """
    leafs, nodes = graph._leafs, graph._nodes
    out: list[Any] = [len(leafs), len(nodes)]
    if pos is None:
        pos = {}
    add = out.append
    ext = out.extend
    getpos = pos.get
    smap = graph._src_map
    smap_get = smap.get if smap is not None else None
    xf = graph._extra_flags
    xf_get = xf.get if xf else None
    i_or = _int_or

    order_add = order.append if order is not None else None

    def visit(t: Any) -> None:
        pos[id(t)] = len(pos)
        if order_add is not None:
            order_add(t)
        vs = t.view_src
        if vs is not None:
            p = getpos(id(vs))
            vs = p if p is not None else ("id", id(vs))
        b = t._buffer
        f = t.flags
        if xf_get is not None:
            e = xf_get(id(t))
            if e is not None:
                f = i_or(f, e)
        opp = t.op_params
        ext((t.op, t.type, t.ne, t.nb, len(opp), *opp, vs, t.view_offs,
             id(b) if b is not None else 0, t._offset, f))

    for n in leafs:
        visit(n)
    for n in nodes:
        if id(n) not in pos:  # (visit written out: most nodes are first reached here)
            pos[id(n)] = len(pos)
            if order_add is not None:
                order_add(n)
            vs = n.view_src
            if vs is not None:
                p = getpos(id(vs))
                vs = p if p is not None else ("id", id(vs))
            b = n._buffer
            f = n.flags
            if xf_get is not None:
                e = xf_get(id(n))
                if e is not None:
                    f = i_or(f, e)
            opp = n.op_params
            ext((1, n.op, n.type, n.ne, n.nb, len(opp), *opp, vs, n.view_offs,
                 id(b) if b is not None else 0, n._offset, f))
        else:
            add(0)
        srcs = n.src if smap_get is None else smap_get(id(n), n.src)
        add(len(srcs))
        for s in srcs:
            if s is None:
                add(-1)
                continue
            p = getpos(id(s))
            if p is None:
                add(-2)
                visit(s)
                if late is not None:
                    late.append(s)
            else:
                add(p)
    return tuple(out)


_ver_of = attrgetter("_ver")


def _outside_sources(graph: Any) -> tuple:
    """Sources (as the graph resolves them) that are neither nodes nor leafs of ``graph``."""
    inside = {id(t) for t in graph.nodes}
    inside.update(id(t) for t in graph.leafs)
    out: dict[int, Any] = {}
    node_srcs = graph.node_srcs
    for n in graph.nodes:
        for s in node_srcs(n):
            if s is not None and id(s) not in inside:
                out[id(s)] = s
    return tuple(out.values())


_setters: dict[tuple[type, str], Callable[[Any, Any], None]] = {}


def slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """``f(obj, value)`` setting attribute ``name`` of instances of ``cls`` without
    ``cls.__setattr__`` (no stamp): the slot's own descriptor when ``name`` is a ``__slots__``
    member (about half the cost of ``object.__setattr__``), else ``object.__setattr__``.
    Cached per (class, name)."""
    key = (cls, name)
    f = _setters.get(key)
    if f is None:
        d = next((k.__dict__[name] for k in cls.__mro__ if name in k.__dict__), None)
        if type(d).__name__ == "member_descriptor":
            f = d.__set__
        else:
            def f(obj: Any, value: Any, _n: str = name) -> None:
                object.__setattr__(obj, _n, value)
        _setters[key] = f
    return f


def _publish(graph: Any, outside: tuple) -> None:
    """Mark every tensor a snapshot records as published (``_ver`` -1 -> 0, ``op_params`` and
    ``src`` replaced by tracked copies): from now on its changes are stamped. Tensors never
    published skip stamping, which keeps graph building cheap. (A plain list obtained from
    ``t.op_params``/``t.src`` *before* publication and edited afterwards is not seen: re-read
    the attribute.)"""
    osa = object.__setattr__
    new = TrackedList
    wref = weakref.ref
    cls = None
    for seq in (graph._nodes, graph._leafs, outside):
        for t in seq:
            if t._ver < 0:
                if type(t) is not cls:
                    cls = type(t)
                    set_op, set_src, set_ver = (slot_setter(cls, k) for k in ("op_params", "src", "_ver"))
                r = wref(t)  # (TrackedList.of written out: one weak reference for both lists)
                op = new(t.op_params)
                op._owner = r
                src = new(t.src)
                src._owner = r
                set_op(t, op)
                set_src(t, src)
                set_ver(t, 0)
    if graph._ver < 0:
        osa(graph, "_ver", 0)


class Snapshot:
    """What a cache read from a graph, and the generation it was read at.

    Every Tensor and Graph carries ``_ver``, the generation of its last change (stamped by
    ``Tensor.__setattr__``, tracked-list edits, Graph setters and :func:`touch`); -1 for a
    tensor no snapshot has recorded yet, whose changes need no stamp (:meth:`take` publishes
    every tensor it records). A snapshot is
    valid while no tensor of the graph (nodes, leafs, outside sources) nor the graph itself was
    stamped after it: that check is one C-speed ``max`` over the node and leaf lists. Only when
    it fails is the recorded state compared (a change back to the recorded values stays valid).

    The version checks vouch only for the graph object the snapshot was taken of (held weakly):
    for any other graph (a rebuilt one over the same tensors, say) :meth:`matches` compares the
    state, never the generation.

    Attributes:
        generation: the generation read before the state was taken (or last confirmed).
        state: :func:`graph_state` at that time.
    """

    __slots__ = ("generation", "state", "_outside", "_graph")

    def __init__(self, gen: int, state: tuple, outside: tuple = (), graph: Any = None) -> None:
        self.generation = gen
        self.state = state
        self._outside = tuple(weakref.ref(t) for t in outside)
        self._graph = weakref.ref(graph) if graph is not None else None

    @classmethod
    def take(cls, graph: Any, pos: dict[int, int] | None = None,
             order: list[Any] | None = None) -> Snapshot:
        """Snapshot ``graph`` now (reads the generation first, so a concurrent change is seen).
        ``pos`` (optional, an empty dict) receives ``id(tensor) -> position`` of every tensor
        the state names by position (valid while those tensors live); ``order`` (optional, an
        empty list) those tensors by position."""
        gen = _generation
        late: list[Any] = []
        state = _state(graph, late, pos, order)
        if late:  # (usually none: sources are nodes or leafs)
            inside = {id(t) for t in graph._nodes}
            outside = tuple({id(t): t for t in late if id(t) not in inside}.values())
        else:
            outside = ()
        _publish(graph, outside)
        return cls(gen, state, outside, graph)

    def _of(self, graph: Any) -> bool:
        g = self._graph
        return g is not None and g() is graph

    def unchanged_since(self, graph: Any) -> bool:
        """True when nothing of ``graph`` was stamped after this snapshot's generation (O(n) at
        C speed, no allocation). False does not mean changed: see :meth:`matches`. Always False
        for a graph other than the one snapshotted (its stamps say nothing about this state)."""
        if not self._of(graph):
            return False
        gen = self.generation
        if graph._ver > gen:
            return False
        nodes, leafs = graph._nodes, graph._leafs
        if nodes and max(map(_ver_of, nodes)) > gen:
            return False
        if leafs and max(map(_ver_of, leafs)) > gen:
            return False
        for r in self._outside:
            t = r()
            if t is None or t._ver > gen:
                return False
        return True

    def matches(self, graph: Any, state: tuple | None = None) -> bool:
        """True when ``graph`` still has the state this snapshot recorded.

        For the snapshotted graph: O(1) if no mutation happened in the process since (same
        generation); else the version check of :meth:`unchanged_since`. Otherwise (and for any
        other graph) compares a fresh :func:`graph_state` (pass ``state`` to reuse one already
        computed). On success adopts the current generation.
        """
        gen = _generation
        same = self._of(graph)
        if same and gen == self.generation:
            return True
        if same and self.unchanged_since(graph):
            self.generation = gen
            return True
        if state is None:
            state = graph_state(graph)
        if state == self.state:
            if same:
                # the state matched by position: tensors that took the place of recorded ones
                # (rewired sources, new views) must stamp their changes from now on too
                outside = _outside_sources(graph)
                _publish(graph, outside)
                self._outside = tuple(weakref.ref(t) for t in outside)
            self.generation = gen
            return True
        return False


# -- buffer-free notifications -------------------------------------------------------------------
# id(buffer) -> (weak reference to the buffer, {id(cache): weak bound method})
_free_hooks: dict[int, tuple[weakref.ref, dict[int, weakref.WeakMethod]]] = {}
# reentrant: a buffer's weak-reference callback (:func:`_buffer_died`) can run on a thread that
# holds the lock already, when an allocation inside a locked section starts the garbage collector
# and it frees a dead buffer; with a plain lock that thread would wait for itself forever
_hooks_lock = threading.RLock()


def _buffer_died(key: int) -> Callable[[weakref.ref], None]:
    def died(ref: weakref.ref) -> None:
        with _hooks_lock:
            entry = _free_hooks.get(key)
            if entry is not None and entry[0] is ref:
                del _free_hooks[key]
    return died


def free_hook_count() -> int:
    """Buffers with at least one :func:`on_buffer_free` registration alive now (process-wide).

    A buffer's registrations go when it is freed (:func:`buffer_freed`) or garbage-collected,
    so this stays bounded by the live buffers that caches used."""
    with _hooks_lock:
        return len(_free_hooks)


def on_buffer_free(buffer: Any, method: Callable[[Any], None]) -> None:
    """Call the bound ``method(buffer)`` when ``buffer`` is freed (see :func:`buffer_freed`).

    Only weak references are kept (to ``method``'s object and to ``buffer``), so a dead cache is
    never called or kept alive, and the registration of a buffer garbage-collected without
    ``free()`` is dropped with it (its id may be reused). Registering the same bound method twice
    for one buffer is a no-op.
    """
    wm = weakref.WeakMethod(method)  # type: ignore[arg-type]
    key = id(buffer)
    with _hooks_lock:
        entry = _free_hooks.get(key)
        if entry is None or entry[0]() is not buffer:
            entry = (weakref.ref(buffer, _buffer_died(key)), {})
            _free_hooks[key] = entry
        entry[1][id(method.__self__)] = wm  # type: ignore[attr-defined]


def buffer_freed(buffer: Any) -> None:
    """Called by ``Buffer.free``: bump the generation and call (then forget) every hook
    registered for ``buffer``."""
    bump()
    key = id(buffer)
    with _hooks_lock:
        entry = _free_hooks.get(key)
        hooks = None
        if entry is not None and entry[0]() is buffer:
            hooks = _free_hooks.pop(key)[1]
    if hooks:
        for wm in hooks.values():
            m = wm()
            if m is not None:
                m(buffer)
