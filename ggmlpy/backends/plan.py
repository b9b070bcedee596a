"""Compute plans: a graph resolved once into a list of ready-to-run kernel calls (ggml's ``graph_plan``).

Building a plan resolves, for every node, the kernel, the array views of the destination and
sources over their buffers' memory and the op's parameters. Running it is then a loop of
zero-argument calls. Plans are cached per graph and reused while everything they read is unchanged
(:mod:`ggmlpy.snapshot`: O(1) when no mutation happened in the process, else one compare of a
compact per-tensor state).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import Buffer, tensor_buffer
from ..errors import NotAllocatedError, UnsupportedOpError
from .. import snapshot as _snapshot
from ..graph import Graph
from ..snapshot import Snapshot
from ..opcodes import VIEW_OPS, Op
from ..tensor import Tensor
from . import kernels

__all__ = ["Plan", "build_plan", "PlanCache"]

Step = Callable[[], None]


class Plan:
    """A compiled graph: ``steps[i]`` runs one node's kernel; ``nodes[i]`` is that node.

    Attributes:
        steps: zero-argument callables, in graph order (view and NONE nodes are left out).
        nodes: the node each step computes.
        buffers: the distinct buffers the steps read or write.
    """

    __slots__ = ("steps", "nodes", "buffers")

    def __init__(self, steps: list[Step], nodes: list[Tensor], buffers: list[Buffer] | None = None) -> None:
        self.steps = steps
        self.nodes = nodes
        self.buffers = buffers or []

    def check_live(self, backend_name: str = "") -> None:
        """Raise NotAllocatedError if a buffer the plan uses was freed since it was built."""
        for b in self.buffers:
            if b.freed:
                raise NotAllocatedError(f"{backend_name}: the graph uses buffer {b.name} of "
                                        f"{b.size} bytes, which was freed")

    def run(self) -> None:
        """Run every step in order on the calling thread, with NumPy's floating-point warnings
        off (overflow to inf and NaN propagate silently, as in ggml's kernels)."""
        with np.errstate(all="ignore"):
            for step in self.steps:
                step()


def build_plan(graph: Graph, xp: Any, backend_name: str,
               can_read: Callable[[Tensor], bool], supports: Callable[[Tensor], bool]) -> Plan:
    """Resolve ``graph`` into a :class:`Plan` for array module ``xp``.

    Args:
        graph: the graph; every computed node and its sources must be allocated.
        xp: ``numpy`` or ``cupy`` (the module the buffers' ``_array`` views belong to).
        backend_name: used in error messages.
        can_read: whether this backend can access a tensor's buffer directly.
        supports: the backend's ``supports_op``.

    Raises:
        NotAllocatedError: a node or source has no memory, or lives in a buffer this backend
            cannot read.
        UnsupportedOpError: a node's op/type combination is not supported.
    """
    steps: list[Step] = []
    nodes: list[Tensor] = []
    buffers: dict[int, Buffer] = {}
    for node in graph.nodes:
        if node.op == Op.NONE or node.op in VIEW_OPS or node.is_empty():
            continue
        if not supports(node):
            srcs = ", ".join(f"{s.name}:{s.type.type_name}" for s in node.src if s is not None)  # noqa
            raise UnsupportedOpError(f"{backend_name}: op {node.op.name} of node '{node.name}' "
                                     f"({node.type.type_name}, sources {srcs}) is not supported")
        dst = _array(node, can_read, backend_name)
        srcs = [None if s is None else _array(s, can_read, backend_name)
                for s in graph.node_srcs(node)]
        for t in (node, *graph.node_srcs(node)):
            if t is not None:
                b = tensor_buffer(t)
                buffers[id(b)] = b
        step = kernels.compile_node(xp, node, dst, srcs)
        if step is not None:
            steps.append(step)
            nodes.append(node)
    return Plan(steps, nodes, list(buffers.values()))


def _array(t: Tensor, can_read: Callable[[Tensor], bool], backend_name: str) -> Any:
    buf = tensor_buffer(t)
    if not can_read(t):
        raise NotAllocatedError(f"{backend_name}: tensor '{t.name}' is in buffer {buf.name}, "
                                "which this backend cannot access")
    return buf._array(t)


class _Entry:
    __slots__ = ("snapshot", "plan", "buffer_ids")

    def __init__(self, snap: Snapshot, plan: Plan) -> None:
        self.snapshot = snap
        self.plan = plan
        self.buffer_ids = frozenset(id(b) for b in plan.buffers)


class PlanCache:
    """Plans per graph, valid for a :class:`~ggmlpy.snapshot.Snapshot` of what they read.

    ``get`` returns a cached plan when the graph still matches the snapshot taken when the plan
    was built (op, type, op_params, ne, nb, sources and their identities, view_src/view_offs,
    flags, buffer and offset of every node, leaf and source): O(1) when nothing in the process
    changed since, else one O(n) compare. Otherwise it builds and caches a new plan. Several
    placements per graph are remembered (up to ``maxsize`` plans in all, least recently used
    dropped first), so a scheduler rotating its ``n_copies`` input slots reuses one plan per slot.

    Nothing here keeps memory alive that its owner released: graphs are held weakly (a dead
    graph's plans are dropped at once) and a freed buffer drops every plan using it
    (:func:`ggmlpy.snapshot.on_buffer_free`). Thread-safe for concurrent ``get`` calls.

    Args:
        build: ``build(graph) -> Plan``.
        maxsize: plans remembered.

    Attributes:
        builds: number of plans built (for tests and benchmarks).
    """

    def __init__(self, build: Callable[[Graph], Plan], maxsize: int = 32) -> None:
        self._build = build
        self._maxsize = maxsize
        # id(graph) -> (weakref to graph, entries most recent last)
        self._graphs: OrderedDict[int, tuple[weakref.ref, list[_Entry]]] = OrderedDict()
        self._n = 0
        self._lock = threading.RLock()
        self.builds = 0

    def __len__(self) -> int:
        return self._n

    def get(self, graph: Graph) -> Plan:
        """The plan for ``graph``, rebuilt only if something it read changed.

        Raises:
            whatever ``build`` raises (NotAllocatedError, UnsupportedOpError); nothing is cached then.
        """
        gid = id(graph)
        with self._lock:
            slot = self._graphs.get(gid)
            if slot is not None and slot[0]() is graph:
                entries = slot[1]
                gen = _snapshot.generation()
                last = entries[-1]
                if last.snapshot.generation == gen or last.snapshot.unchanged_since(graph):
                    last.snapshot.generation = gen
                    return last.plan
                state = _snapshot.graph_state(graph)  # something changed: compare by state
                for k in range(len(entries) - 1, -1, -1):
                    e = entries[k]
                    if e.snapshot.matches(graph, state):
                        if k != len(entries) - 1:
                            entries.append(entries.pop(k))
                        self._graphs.move_to_end(gid)
                        return e.plan
        snap = Snapshot.take(graph)
        plan = self._build(graph)
        entry = _Entry(snap, plan)
        with self._lock:
            self.builds += 1
            slot = self._graphs.get(gid)
            if slot is None or slot[0]() is not graph:
                if slot is not None:
                    self._n -= len(slot[1])
                ref = weakref.ref(graph, self._graph_died_cb(gid))
                slot = (ref, [])
                self._graphs[gid] = slot
            slot[1].append(entry)
            self._graphs.move_to_end(gid)
            self._n += 1
            for b in plan.buffers:
                _snapshot.on_buffer_free(b, self._buffer_freed)
            while self._n > self._maxsize:
                ogid, (oref, oentries) = next(iter(self._graphs.items()))
                oentries.pop(0)
                self._n -= 1
                if not oentries:
                    del self._graphs[ogid]
        return plan

    def _graph_died_cb(self, gid: int) -> Callable[[weakref.ref], None]:
        me = weakref.ref(self)

        def died(ref: weakref.ref) -> None:
            cache = me()
            if cache is None:
                return
            with cache._lock:
                slot = cache._graphs.get(gid)
                if slot is not None and slot[0] is ref:
                    del cache._graphs[gid]
                    cache._n -= len(slot[1])
        return died

    def _buffer_freed(self, buffer: Buffer) -> None:
        bid = id(buffer)
        with self._lock:
            for gid in list(self._graphs):
                ref, entries = self._graphs[gid]
                keep = [e for e in entries if bid not in e.buffer_ids]
                self._n -= len(entries) - len(keep)
                if keep:
                    entries[:] = keep
                else:
                    del self._graphs[gid]

    def clear(self) -> None:
        """Forget every plan."""
        with self._lock:
            self._graphs.clear()
            self._n = 0
