"""One split of a user graph as data, and the scheduler graph built from it (ggml's
``ggml_backend_sched_split_graph`` pass 5 and the construction of ``sched->graph``).

:class:`SplitState` is what flows between the scheduler's parts: the :class:`~ggmlpy.sched.assign.
Assignment` passes 1-4 made, the :class:`Split` list, the split-input copies, the pipelined graph
inputs and the substituted sources. It is made by pass 5 (:func:`split_and_copy`) or by a split
template (:func:`ggmlpy.sched.template.apply_template`), turned into the scheduler graph by
:class:`SchedGraphBuilder`, recorded by the reuse cache and read by the compute loop.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat

from ggmlpy.backend.interface import BufferUsage
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS
from ggmlpy.core.tensor import MAX_NAME, Context, Flag, Tensor
from ggmlpy.sched.assign import Assignment

__all__ = ["Split", "SplitState", "SchedGraphBuilder", "split_and_copy", "VIEW_CACHE_GRAPHS"]

_INOUT = Flag.INPUT | Flag.OUTPUT

#: user graphs whose split-graph views the scheduler keeps (least recently split dropped first)
VIEW_CACHE_GRAPHS = 64


@dataclass
class Split:
    """One per-backend piece of the graph (mirrors ``ggml_backend_sched_split``).

    Attributes:
        backend_id: index of the backend that computes it.
        i_start, i_end: node range ``[i_start, i_end)`` of the user's graph.
        inputs: tensors from other backends copied in before the split runs.
        graph: the graph view the backend computes (shares the scheduler's ``src_map``).
    """

    backend_id: int
    i_start: int
    i_end: int = 0
    inputs: list[Tensor] = field(default_factory=list)
    graph: Graph | None = None


def _named(t: Tensor, name: str) -> Tensor:
    """``t`` named ``name`` (truncated as ``Tensor.set_name`` does): the scheduler's own
    tensors, made here with known-valid arguments, need no argument checks."""
    t.name = name[:MAX_NAME - 1]
    return t


def _dep_view(ctx: Context, t: Tensor) -> Tensor:
    """A view of the whole of ``t`` with its own layout (ggml's ``ggml_view_tensor``, always in
    bounds), its source ``t``, named ``"<t> (dep)"``: keeps ``t`` alive in the scheduler graph
    until its copy is made."""
    vs = t.view_src
    dep = ctx._add(Tensor(t.type, t.ne, t.nb, view_src=t if vs is None else vs,
                          view_offs=0 if vs is None else t.view_offs))
    dep.src = [t]
    return _named(dep, f"{t.name} (dep)")


class SplitState:
    """Everything one split of a user graph decided, for one copy slot.

    Attributes:
        assignment: backends and causes (:class:`~ggmlpy.sched.assign.Assignment`; copies get
            cause ``5.cpy``).
        cur_copy: the copy slot the split was made for.
        splits: the :class:`Split` list.
        copies: ``(source, backend index) -> [copy per slot]`` (``n_copies`` long; for a
            pipelined user input the current slot is the user's tensor itself).
        graph_inputs: the user inputs given a copy per slot (pipelining only).
        src_map, extra_flags: per node id its substituted sources, per tensor id the flags the
            scheduler graph adds (the user's graph is never rewritten).
        ctx: the context holding the copies and dependency views (ggml's ``sched->ctx``).
    """

    __slots__ = ("assignment", "cur_copy", "splits", "copies", "graph_inputs", "src_map",
                 "extra_flags", "ctx")

    def __init__(self, assignment: Assignment, cur_copy: int) -> None:
        self.assignment = assignment
        self.cur_copy = cur_copy
        self.splits: list[Split] = []
        self.copies: dict[tuple[Tensor, int], list[Tensor]] = {}
        self.graph_inputs: list[Tensor] = []
        self.src_map: dict[int, list[Tensor | None]] = {}
        self.extra_flags: dict[int, Flag] = {}
        self.ctx = Context()

    def replica(self) -> SplitState:
        """The same split with its own copy of the assignment (which user pins may extend);
        everything else is shared (never changed once built)."""
        st = SplitState.__new__(SplitState)
        for k in SplitState.__slots__:
            object.__setattr__(st, k, getattr(self, k))
        st.assignment = self.assignment.copy()
        return st

    def input_copies(self, s: Tensor, sb: int, n_copies: int, name: str) -> None:
        """Pipelining: ``n_copies`` copies of the user input ``s`` on its backend ``sb`` (named
        after backend ``name``; the current slot is ``s`` itself, flagged INPUT|OUTPUT in
        :attr:`extra_flags`); ``s`` becomes a graph input."""
        copies = []
        cur = self.cur_copy
        bo, cause = self.assignment.backend_of, self.assignment.cause
        for c in range(n_copies):
            if c == cur:
                t = s  # the user's tensor is the current slot; never reuse its memory
                self.extra_flags[id(s)] = _INOUT
            else:
                t = _named(self.ctx._add(Tensor(s.type, s.ne, s.nb)), f"{name}#{s.name}#{c}")
                t.flags |= _INOUT
                bo[t], cause[t] = sb, "5.cpy"
            copies.append(t)
        self.copies[(s, sb)] = copies
        self.graph_inputs.append(s)

    def split_copies(self, s: Tensor, b: int, n_copies: int, name: str) -> None:
        """``n_copies`` copies of the split input ``s`` on backend ``b`` (named after backend
        ``name``; INPUT|OUTPUT when pipelining, so each slot keeps its own memory)."""
        copies = []
        bo, cause = self.assignment.backend_of, self.assignment.cause
        for c in range(n_copies):
            t = _named(self.ctx._add(Tensor(s.type, s.ne, s.nb)), f"{name}#{s.name}#{c}")
            if n_copies > 1:
                t.flags |= _INOUT
            bo[t], cause[t] = b, "5.cpy"
            copies.append(t)
        self.copies[(s, b)] = copies


def split_and_copy(nodes: list[Tensor], st: SplitState, n_copies: int, names: list[str],
                   buffer_supported: Callable[[dict[Tensor, int], Tensor, int], bool]) -> None:
    """Pass 5 of ``ggml_backend_sched_split_graph``: cut ``nodes`` (a user graph's, every one
    assigned in ``st.assignment``) at backend changes (and where a split on the same backend
    needs weights it cannot use) and make the copies of the tensors a split reads from elsewhere:
    per (source, backend) ``n_copies`` copies, user inputs duplicated per slot when pipelining.
    Fills ``st.splits``, ``st.copies``, ``st.graph_inputs``, ``st.src_map`` and
    ``st.extra_flags``. ``names``: the backends' names; ``buffer_supported``: the assigner's
    (:meth:`ggmlpy.sched.assign.Assigner.buffer_supported`)."""
    bo = st.assignment.backend_of
    copies = st.copies
    src_map = st.src_map
    splits = st.splits
    cur_copy = st.cur_copy
    split: Split | None = None
    weights = BufferUsage.WEIGHTS
    view_ops = VIEW_OPS
    split_b = -1  # split.backend_id
    for i, node in enumerate(nodes):
        if node.op in view_ops:
            continue
        b = bo[node]
        if split is None:
            split = Split(b, 0)
            splits.append(split)
            split_b = b
        need_new = False
        if b == split_b and split.inputs:
            for s in node.src:
                if s is None:
                    continue
                sbuf = s._buffer
                if (sbuf is not None and sbuf.usage == weights
                        and bo.get(s, -1) != b and not buffer_supported(bo, s, b)):
                    need_new = True
                    break
        if b != split_b or need_new:
            split.i_end = i
            split = Split(b, i)
            splits.append(split)
            split_b = b
        new_srcs: list[Tensor | None] | None = None
        for j, s in enumerate(node.src):
            if s is None:
                continue
            sb = bo[s]
            if n_copies > 1 and s.flags & Flag.INPUT and (s, sb) not in copies:
                st.input_copies(s, sb, n_copies, names[sb])
            if sb != b and not buffer_supported(bo, s, b):
                key = (s, b)
                if key not in copies:
                    st.split_copies(s, b, n_copies, names[b])
                    split.inputs.append(s)
                # else: the copy made for an earlier split on this backend is reused
                if new_srcs is None:
                    new_srcs = list(node.src)
                new_srcs[j] = copies[key][cur_copy]
        if new_srcs is not None:
            src_map[id(node)] = new_srcs
    if split is None and nodes:
        # a graph of views only (ggml: one split over every node, so the allocator still
        # initialises the views; they compute nothing): on the backend of the first view
        split = Split(bo[nodes[0]], 0)
        splits.append(split)
    if split is not None:
        split.i_end = len(nodes)


class SchedGraphBuilder:
    """Builds the scheduler's graph (ggml's ``sched->graph``) from a :class:`SplitState`, and
    owns the split-graph views: the view objects of the last split of each recently split user
    graph (bounded LRU, graphs held weakly) are reused for the same backend, node range and copy
    slot, so the backends' plan caches (keyed by graph object and placement) hit across
    evaluations and batch shapes.

    Args:
        n_copies: the scheduler's copy count.
        cpu: the index of the CPU backend (where unassigned leafs go).
    """

    def __init__(self, n_copies: int, cpu: int) -> None:
        self.n_copies = n_copies
        self.cpu = cpu
        self.views: dict[tuple[int, int, int, int], Graph] = {}
        self._views_of: weakref.ref[Graph] | None = None
        self._views_by_graph: OrderedDict[int, tuple[weakref.ref[Graph], dict]] = OrderedDict()

    def adopt(self, graph: Graph, views: dict[tuple[int, int, int, int], Graph]) -> None:
        """Make ``views`` (recorded for ``graph``) the current views (the reuse fast path)."""
        self.views = views
        self._views_of = weakref.ref(graph)

    def build(self, graph: Graph, st: SplitState) -> tuple[Graph, list[int], list[int]]:
        """The scheduler graph of ``graph`` split as ``st``: per split its input dependencies and
        copies, then its nodes; the copies' and the user graph's leafs. Sets each split's
        ``graph`` view. Returns ``(scheduler graph, backend id per node, backend id per leaf)``
        (what the allocator plans with)."""
        bo = st.assignment.backend_of
        nodes = graph.nodes
        splits = st.splits
        src_map, extra_flags = st.src_map, st.extra_flags
        sg = Graph(0)
        sg.src_map = src_map
        sg.extra_flags = extra_flags
        node_ids: list[int] = []
        leaf_ids: list[int] = []
        sg_nodes: list[Tensor] = []  # plain lists, assigned once below (one stamp, not one per append)
        sg_leafs: list[Tensor] = []
        if self._views_of is None or self._views_of() is not graph:
            kept = self._views_by_graph.get(id(graph))
            self.views = kept[1] if kept is not None and kept[0]() is graph else {}
            self._views_of = weakref.ref(graph)
        views: dict[tuple[int, int, int, int], Graph] = {}
        old_views = self.views
        cur_copy = st.cur_copy
        for sp in splits:
            key = (sp.backend_id, sp.i_start, sp.i_end, cur_copy)  # a view per copy slot
            view = old_views.get(key)
            part = nodes[sp.i_start:sp.i_end]
            if view is None or view._nodes != part:
                # (a graph rewired since keeps its node count: compare the nodes themselves; a
                # graph no cache has seen needs no generation bump for its fields)
                view = Graph._view_over(part, src_map, extra_flags)
            else:
                view.src_map = src_map  # (stamped: plans cached for the view revalidate)
                view.extra_flags = extra_flags
            views[key] = view
            sp.graph = view
        self.views = views
        self._keep_views(graph, views)
        copies, ctx = st.copies, st.ctx
        for sp in splits:
            for inp in sp.inputs:
                cpy = copies[(inp, sp.backend_id)][cur_copy]
                sg_nodes.append(_dep_view(ctx, inp))
                node_ids.append(bo[inp])
                sg_nodes.append(cpy)
                node_ids.append(sp.backend_id)
            part = nodes[sp.i_start:sp.i_end]
            sg_nodes.extend(part)
            node_ids.extend(map(bo.__getitem__, part))
        if self.n_copies > 1:
            for inp in st.graph_inputs:
                ib = bo[inp]
                for cpy in copies[(inp, ib)]:
                    sg_leafs.append(cpy)
                    leaf_ids.append(ib)
            for sp in splits:
                for inp in sp.inputs:
                    for cpy in copies[(inp, sp.backend_id)]:
                        sg_leafs.append(cpy)
                        leaf_ids.append(sp.backend_id)
        sg_leafs.extend(graph.leafs)
        leaf_ids.extend(map(bo.get, graph.leafs, repeat(self.cpu)))
        sg.nodes = sg_nodes
        sg.leafs = sg_leafs
        sg.size = max(len(sg.nodes), len(sg.leafs))
        visited = set(map(id, sg_nodes))
        visited.update(map(id, sg_leafs))
        sg._visited = visited
        return sg, node_ids, leaf_ids

    def _keep_views(self, graph: Graph, views: dict) -> None:
        gid, cache = id(graph), self._views_by_graph
        kept = cache.get(gid)
        if kept is not None and kept[0]() is graph:
            ref = kept[0]
        else:
            ref = weakref.ref(graph, lambda r: cache.pop(gid) if cache.get(gid, (None,))[0] is r
                              else None)
        cache[gid] = (ref, views)
        cache.move_to_end(gid)
        while len(cache) > VIEW_CACHE_GRAPHS:
            cache.popitem(last=False)
