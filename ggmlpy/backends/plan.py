"""Compute plans: a graph resolved once into a list of ready-to-run kernel calls (ggml's ``graph_plan``).

Building a plan resolves, for every node, the kernel, the array views of the destination and
sources over their buffers' memory and the op's parameters. Running it is then a loop of
zero-argument calls. Plans are cached per graph and reused while the graph and the placement of
its tensors are unchanged (checked through :attr:`Tensor.alloc_epoch` and, when that moved, a
signature of every node's and source's ``(buffer, offset)``).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import Buffer, tensor_buffer
from ..errors import NotAllocatedError, UnsupportedOpError
from ..graph import Graph
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


def _signature(graph: Graph) -> tuple:
    sig: list[Any] = []
    node_srcs = graph.node_srcs
    for n in graph.nodes:
        sig.append(id(n))
        sig.append(n._buffer)
        sig.append(n._offset)
        for s in node_srcs(n):
            if s is not None:
                sig.append(s._buffer)
                sig.append(s._offset)
    return tuple(sig)


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


class PlanCache:
    """A small LRU cache of plans keyed by graph identity and allocation signature.

    ``get`` returns a cached plan when the graph has the same nodes and every node and source
    has the same ``(buffer, offset)`` as when the plan was built; otherwise it builds (and caches)
    a new one. Several placements per graph are remembered, so a scheduler rotating its
    ``n_copies`` input slots reuses one plan per slot.

    Args:
        build: ``build(graph) -> Plan``.
        maxsize: plans remembered.
    """

    def __init__(self, build: Callable[[Graph], Plan], maxsize: int = 32) -> None:
        self._build = build
        self._maxsize = maxsize
        self._entries: OrderedDict[tuple, tuple[Any, Plan]] = OrderedDict()
        self._last: dict[int, tuple[Any, int, int, Plan]] = {}

    def get(self, graph: Graph) -> Plan:
        """The plan for ``graph``, rebuilt only if the graph or its allocation changed."""
        gid = id(graph)
        epoch = Tensor.alloc_epoch
        last = self._last.get(gid)
        if (last is not None and last[0]() is graph and last[1] == epoch
                and last[2] == len(graph.nodes)):
            return last[3]
        key = (gid, _signature(graph))
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is graph:
            self._entries.move_to_end(key)
            plan = entry[1]
        else:
            plan = self._build(graph)
            self._entries[key] = (weakref.ref(graph), plan)
            while len(self._entries) > self._maxsize:
                self._entries.popitem(last=False)
        if len(self._last) > self._maxsize:
            self._last.clear()
        self._last[gid] = (weakref.ref(graph), Tensor.alloc_epoch, len(graph.nodes), plan)
        return plan

    def clear(self) -> None:
        """Forget every plan (e.g. when buffers are freed)."""
        self._entries.clear()
        self._last.clear()
