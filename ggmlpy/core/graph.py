"""Compute graphs: ggml's ``struct ggml_cgraph`` with ``ggml_build_forward_expand``.

A graph holds the tensors reachable from its outputs in execution order: ``nodes`` (tensors
computed by an op, including view ops, and PARAM tensors) and ``leafs`` (op NONE tensors:
weights, inputs, constants).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator

from ggmlpy.core import snapshot as _snapshot
from ggmlpy.core.check import checked_args
from ggmlpy.core.errors import GraphFullError
from ggmlpy.core.opcodes import Op
from ggmlpy.core.snapshot import TrackedList
from ggmlpy.core.tensor import Context, Flag, Tensor

__all__ = ["DEFAULT_GRAPH_SIZE", "Graph", "new_graph", "graph_view"]

DEFAULT_GRAPH_SIZE = 2048


def _tracked_list(attr: str, doc: str) -> property:
    """A ``list[Tensor]`` property of :class:`Graph` stored in ``attr``: reading returns the
    stored :class:`TrackedList`; assigning stores the value as a TrackedList of the graph and
    bumps its snapshot generation (``ggmlpy.core.snapshot.touch``)."""

    def fset(self: Graph, value: list[Tensor]) -> None:
        setattr(self, attr, TrackedList.of(value, self))
        _snapshot.touch(self)

    return property(operator.attrgetter(attr), fset, doc=doc)


class Graph:
    """A compute graph (mirrors ``struct ggml_cgraph`` / ``ggml_new_graph_custom``).

    Args:
        size: the largest number of nodes, and separately of leafs, the graph may hold
            (ggml's ``GGML_DEFAULT_GRAPH_SIZE = 2048``).

    Attributes:
        nodes: tensors computed by ops, in a topological (execution) order.
        leafs: op NONE tensors (constants, weights, inputs) in first-visit order.
        size: the capacity given at construction (0 for graph views).

    Raises:
        ValueError: if ``size`` is negative.
    """

    @checked_args
    def __init__(self, size: int = DEFAULT_GRAPH_SIZE) -> None:
        if size < 0:
            raise ValueError(f"Graph: size must be >= 0, got {size}")
        self.size = int(size)
        self._ver = 0  # generation of the last change (ggmlpy.core.snapshot)
        self._nodes: list[Tensor] = TrackedList.of((), self)
        self._leafs: list[Tensor] = TrackedList.of((), self)
        self._visited: set[int] = set()
        self._src_map: dict[int, list[Tensor | None]] | None = None
        self._extra_flags: dict[int, Flag] | None = None

    @classmethod
    def _view_over(cls, nodes: list[Tensor], src_map: dict[int, list[Tensor | None]] | None,
                   extra_flags: dict[int, Flag] | None) -> Graph:
        """A size-0 graph over ``nodes`` (no leafs) with the given ``src_map``/``extra_flags``,
        built directly (the scheduler's split views: a graph no cache has seen needs no stamp;
        keep in step with ``__init__``)."""
        g = cls.__new__(cls)
        g.size = 0
        g._ver = 0
        g._nodes = TrackedList.of(nodes, g)
        g._leafs = TrackedList.of((), g)
        g._visited = set(map(id, nodes))
        g._src_map = src_map
        g._extra_flags = extra_flags
        return g

    # Every edit of what a cache reads bumps the snapshot generation (ggmlpy.core.snapshot): the node
    # and leaf lists are tracked lists; assigning them, or src_map/extra_flags, bumps too.
    nodes = _tracked_list("_nodes", "Tensors computed by ops, in execution order (``list[Tensor]``, "
                                    "a tracked list: edits invalidate caches).")
    leafs = _tracked_list("_leafs", "Op NONE tensors in first-visit order (``list[Tensor]``, a "
                                    "tracked list: edits invalidate caches).")

    @property
    def src_map(self) -> dict[int, list[Tensor | None]] | None:
        """The scheduler's source substitutions keyed by ``id(node)``, or None. Assigning bumps
        the snapshot generation; after editing the dict in place call ``snapshot.touch(graph)``."""
        return self._src_map

    @src_map.setter
    def src_map(self, value: dict[int, list[Tensor | None]] | None) -> None:
        self._src_map = value
        _snapshot.touch(self)

    @property
    def extra_flags(self) -> dict[int, Flag] | None:
        """Flags the scheduler adds per ``id(tensor)``, or None. Assigning bumps the generation."""
        return self._extra_flags

    @extra_flags.setter
    def extra_flags(self, value: dict[int, Flag] | None) -> None:
        self._extra_flags = value
        _snapshot.touch(self)

    def node_srcs(self, node: Tensor) -> list[Tensor | None]:
        """The sources ``node`` reads in this graph: ``node.src``, unless the graph's owner (the
        scheduler) substituted some of them with copies in ``src_map`` (keyed by ``id(node)``).
        Allocators and backends read sources through this, so user tensors are never rewritten."""
        m = self._src_map
        if m is None:
            return node.src
        return m.get(id(node), node.src)

    def tensor_flags(self, t: Tensor) -> Flag:
        """``t.flags`` plus any flags the graph's owner (the scheduler) added for this graph in
        ``extra_flags`` (keyed by ``id(t)``), e.g. OUTPUT on copy slots that must never be reused.
        Allocators read flags through this, so user tensors are never modified."""
        m = self._extra_flags
        if not m:
            return t.flags
        e = m.get(id(t))
        return t.flags if e is None else t.flags | e

    @property
    def n_nodes(self) -> int:
        """Number of nodes (mirrors ``ggml_graph_n_nodes``)."""
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        """Number of leafs."""
        return len(self.leafs)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.nodes)

    @checked_args
    def node(self, i: int) -> Tensor:
        """Node ``i``; negative ``i`` counts from the end (mirrors ``ggml_graph_node``).

        Raises:
            IndexError: ``i`` out of range.
        """
        n = len(self.nodes)
        if not -n <= i < n:
            raise IndexError(f"graph node index {i} out of range for {n} nodes")
        return self.nodes[i]

    @checked_args
    def get_tensor(self, name: str) -> Tensor | None:
        """The leaf, then node, named ``name`` or None (mirrors ``ggml_graph_get_tensor``)."""
        for t in self.leafs:
            if t.name == name:
                return t
        for t in self.nodes:
            if t.name == name:
                return t
        return None

    @checked_args
    def contains(self, t: Tensor) -> bool:
        """Whether ``t`` was visited by this graph (a node or a leaf)."""
        return id(t) in self._visited

    @checked_args
    def build_forward_expand(self, tensor: Tensor) -> None:
        """Add ``tensor`` and every tensor it depends on (mirrors ``ggml_build_forward_expand``).

        Depth-first post-order from ``tensor``: each unvisited tensor's sources are visited first,
        in ``src`` order, then the tensor is appended to ``leafs`` (op NONE and not PARAM) or
        ``nodes``. Tensors already in the graph are skipped, so repeated expands append only what
        is new. ``view_src`` is not followed (views reach their source through ``src[0]``).
        Unnamed tensors are named ``leaf_%d``/``node_%d``.

        Raises:
            TypeError: ``tensor`` is not a Tensor.
            GraphFullError: the graph would exceed ``size`` nodes or leafs; the graph is left as
                it was before the call.
        """
        if not isinstance(tensor, Tensor):
            raise TypeError(f"build_forward_expand: expected a Tensor, got {type(tensor).__name__}")
        n_nodes0, n_leafs0 = len(self._nodes), len(self._leafs)
        visited = self._visited
        added: list[int] = []
        try:
            if id(tensor) in visited:
                return
            visited.add(id(tensor))
            added.append(id(tensor))
            stack: list[tuple[Tensor, int]] = [(tensor, 0)]
            while stack:
                t, i = stack[-1]
                srcs = t.src
                while i < len(srcs):
                    s = srcs[i]
                    i += 1
                    if s is not None and id(s) not in visited:
                        visited.add(id(s))
                        added.append(id(s))
                        stack[-1] = (t, i)
                        stack.append((s, 0))
                        break
                else:
                    stack.pop()
                    self._append(t)
        except GraphFullError:
            del self.nodes[n_nodes0:]
            del self.leafs[n_leafs0:]
            visited.difference_update(added)
            raise
        finally:
            if len(self._nodes) != n_nodes0 or len(self._leafs) != n_leafs0:
                _snapshot.touch(self)  # one stamp for everything appended

    def _append(self, t: Tensor) -> None:
        if t.op == Op.NONE and not (t.flags & Flag.PARAM):
            lst, what = self._leafs, "leaf"
        else:
            lst, what = self._nodes, "node"
        if len(lst) >= self.size:
            raise GraphFullError(f"graph full: more than {self.size} {what}s when adding "
                                 f"'{t.name}'; create the Graph with a larger size")
        if not t.name:
            t.name = f"{what}_{len(lst)}"
        list.append(lst, t)  # untracked: build_forward_expand stamps once

    @checked_args
    def add_node(self, t: Tensor) -> None:
        """Append ``t`` to ``nodes`` without visiting its sources (mirrors ``ggml_graph_add_node``).

        Raises:
            GraphFullError: the graph already holds ``size`` nodes.
        """
        if len(self.nodes) >= self.size:
            raise GraphFullError(f"graph full: cannot add node '{t.name}' past size {self.size}")
        self._visited.add(id(t))
        self.nodes.append(t)

    @checked_args
    def view(self, i0: int, i1: int) -> Graph:
        """A graph of ``nodes[i0:i1]`` with no leafs (mirrors ``ggml_graph_view``); see :func:`graph_view`."""
        return graph_view(self, i0, i1)

    def __repr__(self) -> str:
        return f"<Graph {len(self.nodes)} nodes, {len(self.leafs)} leafs, size {self.size}>"


@checked_args
def new_graph(ctx: Context | None = None, size: int = DEFAULT_GRAPH_SIZE) -> Graph:
    """A new empty graph of capacity ``size`` (mirrors ``ggml_new_graph``/``ggml_new_graph_custom``).

    ``ctx`` is accepted for ggml parity and not used: graphs are ordinary Python objects.
    """
    return Graph(size)


@checked_args
def graph_view(graph: Graph, i0: int, i1: int) -> Graph:
    """A graph over ``graph.nodes[i0:i1]`` with no leafs and size 0 (mirrors ``ggml_graph_view``).

    Used to compute one node or one split at a time. The view shares nothing mutable with
    ``graph`` except the tensors themselves.

    Raises:
        IndexError: unless ``0 <= i0 <= i1 <= graph.n_nodes``.
    """
    if not 0 <= i0 <= i1 <= len(graph.nodes):
        raise IndexError(f"graph_view: [{i0}, {i1}) is not inside [0, {len(graph.nodes)}]")
    g = Graph(0)
    g.nodes = graph.nodes[i0:i1]
    g.src_map = graph.src_map
    g.extra_flags = graph.extra_flags
    g._visited = {id(t) for t in g.nodes}
    return g
