"""Split templates: a fresh graph with the structure of one split before skips passes 1-5
(a mixin of :class:`~ggmlpy.sched.scheduler.Scheduler`).

A model usually builds a new graph object per evaluation, with the same structure as the last
one. The scheduler's fast path (:mod:`ggmlpy.sched.reuse`) only replays for the *same* graph
object; here a split made for one graph is reused, **by position**, for another graph of equal
structure. The key is the :class:`~ggmlpy.core.snapshot.Snapshot` state the scheduler takes anyway for
every split (tensors named by their position in the state's visiting order, so two graphs built
the same way over the same weights and buffers have equal states), and a split's decisions are
a function of what that state covers plus a few things outside it, all part of the key:

* the state (per node, leaf and outside source: op, type, ``ne``/``nb``, ``op_params``, wiring,
  ``view_src``/``view_offs``, flags, buffer identity and offset of pre-allocated tensors);
* the copy slot (``cur_copy``) and, through the scheduler, ``n_copies``, backends and buffer
  types (a template never leaves its scheduler);
* the user pins (``set_tensor_backend``) by position;
* every backend's ``supports_op`` memo token (:func:`~ggmlpy.sched.assign.op_memo_token`): a
  template is made only when every backend's ``supports_op`` is a function of the node key
  (all tokens not None) and used only while the tokens are equal;
* the ``offload_op`` answers pass 1 used (with ``op_offload``): asked again for the new graph's
  nodes at the same positions, the template is used only when every answer is the same;
* the ``usage`` of every buffer the recorded graph's tensors were in (WEIGHTS or not steers
  passes 1 and 5).

The template keeps the recorded graph's tensors (and their view sources and buffers) alive, so
the object ids its state names can not be reused by other objects while it is kept. On a hit the
scheduler's per-split state (assignments and causes, split ranges and inputs, copies, graph
inputs, substituted sources) is rebuilt for the new graph's tensors at the same positions, with
new copy tensors made exactly as pass 5 makes them, and the scheduler graph is built as after a
full split; the allocation follows as usual (the allocator's plan is checked as usual, or vouched
for). The result equals a full split's (tests/test_sched_template.py compares every field against
a scheduler with templates disabled).

:class:`Split` (ggml's ``ggml_backend_sched_split``), the split-input copies and the scheduler
graph's construction (shared by both paths) live here too; :mod:`ggmlpy.sched.scheduler` re-exports
:class:`Split`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context, Flag, Tensor

__all__ = ["Split", "SplitTemplate", "TemplateCache", "TemplateSplits", "pins_key",
           "DEFAULT_TEMPLATES"]

# the scheduler's own copies and dependency views, made with known-valid arguments: without the
# Context/Tensor methods' argument type checks (ggmlpy.core.check.checked_args's unchecked path)
_dup_layout = Context.dup_tensor_layout.unchecked
_set_name = Tensor.set_name.unchecked
_INOUT = Flag.INPUT | Flag.OUTPUT
_buffer_of = attrgetter("_buffer")
_view_src_of = attrgetter("view_src")

#: split templates a scheduler keeps (least recently used dropped first)
DEFAULT_TEMPLATES = 8
#: user graphs whose split-graph views the scheduler keeps (least recently split dropped first)
VIEW_CACHE_GRAPHS = 64


def _dep_view(ctx: Context, t: Tensor) -> Tensor:
    """``ctx.new_view(t, t.type, t.ne, t.nb, 0)`` (a view of the whole of ``t`` with its own
    layout, always in bounds: the checks are skipped), its source ``t``, named ``"<t> (dep)"``."""
    vs = t.view_src
    dep = ctx._add(Tensor(t.type, t.ne, t.nb, view_src=t if vs is None else vs,
                          view_offs=0 if vs is None else t.view_offs))
    dep.src = [t]
    _set_name(dep, f"{t.name} (dep)")
    return dep


def _split_view(nodes: list[Tensor], src_map: dict, extra_flags: dict) -> Graph:
    """A new split graph over ``nodes`` (``graph_view`` of the split's range, built directly:
    a graph no cache has seen needs no generation bump for its fields)."""
    return Graph._view_over(nodes, src_map, extra_flags)


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


def pins_key(pins: dict[Tensor, int], pos: dict[int, int]) -> tuple | None:
    """The user pins ``{tensor: backend index}`` by position in a snapshot's state
    (``pos``: ``id(tensor) -> position``), sorted; None when a pinned tensor has no position."""
    out = []
    for t, b in pins.items():
        p = pos.get(id(t))
        if p is None:
            return None
        out.append((p, b))
    out.sort()
    return tuple(out)


class _Plan:
    """A template's decisions by position (built on first use, see :meth:`SplitTemplate.plan`)."""

    __slots__ = ("positions", "bvals", "cvals", "copies", "subst", "splits", "offload")

    def __init__(self, positions: tuple, bvals: tuple, cvals: tuple, copies: list, subst: list,
                 splits: list, offload: list) -> None:
        self.positions = positions  # positions of the assigned user-graph tensors
        self.bvals = bvals          # ... their backend ids
        self.cvals = cvals          # ... their causes
        self.copies = copies        # [(source position, backend, is_graph_input)], creation order
        self.subst = subst          # [(node position, ((slot j, backend), ...))]
        self.splits = splits        # [(backend, i_start, i_end, input positions)]
        self.offload = offload      # [(node position, backend index, offload_op answer)]


class SplitTemplate:
    """One full split of a graph, reusable by position for another graph with an equal key
    (see the module docstring).

    Args:
        state: the snapshot state of the graph as the split read it (the key's main part).
        slot: the copy slot (``cur_copy``) it was made for.
        pins: :func:`pins_key` of the user pins.
        tokens: every backend's ``supports_op`` memo token (none None).
        sig: the split signature (:func:`ggmlpy.sched.reuse.split_signature`), or None.
        rec: the scheduler's record of that split (:class:`~ggmlpy.sched.reuse.SplitRecord`).
        pos, order: ``id(tensor) -> position`` and the tensors by position of that state.
        offload_asked: ``[(tensor, backend index, answer)]`` of pass 1's ``offload_op`` calls.
    """

    __slots__ = ("state", "slot", "pins", "tokens", "sig", "usages", "_keep", "_rec", "_pos",
                 "_order", "_offload", "_plan", "_refused")

    def __init__(self, state: tuple, slot: int, pins: tuple, tokens: tuple, sig: tuple | None,
                 rec: Any, pos: dict[int, int], order: list[Tensor],
                 offload_asked: list[tuple[Tensor, int, bool]]) -> None:
        self.state = state
        self.slot = slot
        self.pins = pins
        self.tokens = tokens
        self.sig = sig
        bufs = set(map(_buffer_of, order))
        bufs.discard(None)
        self.usages = tuple((b, b.usage) for b in bufs)
        # (strong references: the ids the state names stay those objects' while kept)
        self._keep = list(map(_view_src_of, order))
        self._rec = rec
        self._pos = pos
        self._order = order
        self._offload = offload_asked
        self._plan: _Plan | None = None
        self._refused = False

    def plan(self) -> _Plan | None:
        """The decisions by position (converted from the record once); None when the record
        assigned or copied a tensor that has no position (a view source outside the graph
        placed by pass 4, say): such a template is never used."""
        if self._plan is None and not self._refused:
            self._plan = self._convert()
            self._refused = self._plan is None
            if self._plan is not None:
                self._rec = self._pos = self._offload = None  # (the order list stays: ids)
        return self._plan

    def usable(self, order: list[Tensor], backends: list[Any]) -> bool:
        """Whether the template applies to the graph whose tensors by position are ``order``
        (its state already found equal): it has a plan, every buffer's usage is as recorded
        and every recorded ``offload_op`` answer is the same for the node at that position."""
        plan = self.plan()
        if plan is None:
            return False
        for b, u in self.usages:
            if b.usage != u:
                return False
        for p, i, a in plan.offload:
            if bool(backends[i].offload_op(order[p])) != a:
                return False
        return True

    def _convert(self) -> _Plan | None:
        rec, pos, slot = self._rec, self._pos, self.slot
        get = pos.get
        cause = rec.cause
        positions, bvals, cvals = [], [], []
        for t, b in rec.backend_of.items():
            p = get(id(t))
            c = cause.get(t, "")
            if p is None:
                if c == "5.cpy":
                    continue
                return None
            positions.append(p)
            bvals.append(b)
            cvals.append(c)
        copies = []
        for (s, b), cl in rec.copies.items():
            p = get(id(s))
            if p is None:
                return None
            copies.append((p, b, cl[slot] is s))
        subst = []
        bo = rec.backend_of
        for nid, srcs in rec.graph._src_map.items():
            p = get(nid)
            if p is None:
                return None
            subs = tuple((j, bo[s]) for j, s in enumerate(srcs)
                         if s is not None and cause.get(s) == "5.cpy")
            subst.append((p, subs))
        splits = []
        for sp in rec.splits:
            ins = tuple(get(id(t)) for t in sp.inputs)
            if None in ins:
                return None
            splits.append((sp.backend_id, sp.i_start, sp.i_end, ins))
        offload = []
        for t, i, a in self._offload:
            p = get(id(t))
            if p is None:
                return None
            offload.append((p, i, a))
        return _Plan(tuple(positions), tuple(bvals), tuple(cvals), copies, subst, splits, offload)


class TemplateCache:
    """The last ``capacity`` split templates of one scheduler (an LRU list; a lookup compares
    the key's small parts first and the state last, at C speed).

    Counters: ``hits`` (splits taken from a template). ``enabled`` False turns templates off
    (every fresh graph is split in full; tests compare the two).

    Raises:
        ValueError: ``capacity`` < 1.
    """

    def __init__(self, capacity: int = DEFAULT_TEMPLATES) -> None:
        if int(capacity) < 1:
            raise ValueError(f"TemplateCache: capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.enabled = True
        self._items: list[SplitTemplate] = []
        self.hits = 0

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Drop every template."""
        self._items = []

    def find(self, state: tuple, slot: int, pins: tuple | None, tokens: tuple,
             order: list[Tensor], backends: list[Any]) -> SplitTemplate | None:
        """The usable template with this key for the graph whose tensors by position are
        ``order`` (:meth:`SplitTemplate.usable`), or None; moved to the most recently used end."""
        if pins is None:
            return None
        items = self._items
        for k in range(len(items) - 1, -1, -1):
            t = items[k]
            if (t.slot == slot and t.pins == pins and t.tokens == tokens
                    and (t.state is state or t.state == state) and t.usable(order, backends)):
                if k != len(items) - 1:
                    items.append(items.pop(k))
                return t
        return None

    def add(self, tmpl: SplitTemplate) -> None:
        """Keep ``tmpl`` (dropping the least recently used beyond ``capacity``)."""
        self._items.append(tmpl)
        if len(self._items) > self.capacity:
            del self._items[0]


class TemplateSplits:
    """What a full split (pass 5) and the template path share, and the template path itself (a
    mixin of the scheduler, whose per-split state it reads and sets): making the split-input
    copies, building the scheduler graph and its per-split views (kept per user graph, so the
    backends' plan caches hit), and applying a template."""

    backends: list[Any]
    n_copies: int
    cur_copy: int
    _ctx: Context
    _backend_of: dict[Tensor, int]
    _cause: dict[Tensor, str]
    _copies: dict[tuple[Tensor, int], list[Tensor]]
    _graph_inputs: list[Tensor]

    def _input_copies(self, s: Tensor, sb: int, extra_flags: dict[int, Flag]) -> None:
        """Pipelining: ``n_copies`` copies of the user input ``s`` on its backend ``sb`` (the
        current slot is ``s`` itself, flagged INPUT|OUTPUT in ``extra_flags``); ``s`` becomes a
        graph input."""
        copies = []
        cur = self.cur_copy
        name = self.backends[sb].name
        bo, cause = self._backend_of, self._cause
        for c in range(self.n_copies):
            if c == cur:
                t = s  # the user's tensor is the current slot; never reuse its memory
                extra_flags[id(s)] = _INOUT
            else:
                t = _dup_layout(self._ctx, s)
                _set_name(t, f"{name}#{s.name}#{c}")
                t.flags |= _INOUT
                bo[t], cause[t] = sb, "5.cpy"
            copies.append(t)
        self._copies[(s, sb)] = copies
        self._graph_inputs.append(s)

    def _split_copies(self, s: Tensor, b: int) -> None:
        """``n_copies`` copies of the split input ``s`` on backend ``b``."""
        copies = []
        n_copies = self.n_copies
        name = self.backends[b].name
        bo, cause = self._backend_of, self._cause
        for c in range(n_copies):
            t = _dup_layout(self._ctx, s)
            _set_name(t, f"{name}#{s.name}#{c}")
            if n_copies > 1:
                t.flags |= _INOUT
            bo[t], cause[t] = b, "5.cpy"
            copies.append(t)
        self._copies[(s, b)] = copies

    def _apply_template(self, graph: Graph, tmpl: SplitTemplate, order: list[Tensor]) -> None:
        """Make the split of ``tmpl`` the current split of ``graph`` (whose tensors by position
        are ``order``; found by :meth:`TemplateCache.find`, so its key holds and it is usable)."""
        plan = tmpl.plan()
        assert plan is not None  # (usable)
        self.is_reset = False
        self._ctx = Context()
        self._op_memo = {}
        self._copies = {}
        self._graph_inputs = []
        self._user_graph = graph
        positions = plan.positions
        if len(positions) == 1:
            ts: tuple = (order[positions[0]],)
        else:
            ts = itemgetter(*positions)(order) if positions else ()
        self._backend_of = dict(zip(ts, plan.bvals))
        self._cause = dict(zip(ts, plan.cvals))
        extra_flags: dict[int, Flag] = {}
        for p, b, is_input in plan.copies:
            if is_input:
                self._input_copies(order[p], b, extra_flags)
            else:
                self._split_copies(order[p], b)
        self.splits = [Split(b, i0, i1, [order[p] for p in ins])
                       for b, i0, i1, ins in plan.splits]
        copies, cur = self._copies, self.cur_copy
        src_map: dict[int, list[Tensor | None]] = {}
        for p, subs in plan.subst:
            node = order[p]
            srcs = list(node.src)
            for j, b in subs:
                srcs[j] = copies[(srcs[j], b)][cur]
            src_map[id(node)] = srcs
        self._build_sched_graph(graph, src_map, extra_flags)

    def _build_sched_graph(self, graph: Graph, src_map: dict[int, list[Tensor | None]],
                           extra_flags: dict[int, Flag]) -> None:
        """Build the scheduler's graph (ggml's ``sched->graph``): per split its input dependencies
        and copies, then its nodes; the copies' and the user graph's leafs. Sets :attr:`graph` and
        the per-node/leaf backend ids the allocator reserves with."""
        bo = self._backend_of
        nodes = graph.nodes
        splits = self.splits
        n_copies = self.n_copies
        # the scheduler's graph: per split its input dependencies and copies, then its nodes
        self._prev_node_ids, self._prev_leaf_ids = self._node_ids, self._leaf_ids
        sg = Graph(0)
        sg.src_map = src_map
        sg.extra_flags = extra_flags
        node_ids: list[int] = []
        leaf_ids: list[int] = []
        sg_nodes: list[Tensor] = []  # plain lists, assigned once below (one stamp, not one per append)
        sg_leafs: list[Tensor] = []
        # reuse the split graph objects of the previous split of the same graph and ranges, so
        # backends' plan caches (keyed by graph object and placement) hit across evaluations
        if self._views_of is None or self._views_of() is not graph:
            kept = self._views_by_graph.get(id(graph))
            self._views = kept[1] if kept is not None and kept[0]() is graph else {}
            self._views_of = weakref.ref(graph)
        views: dict[tuple[int, int, int, int], Graph] = {}
        old_views = self._views
        cur_copy = self.cur_copy
        for sp in splits:
            key = (sp.backend_id, sp.i_start, sp.i_end, cur_copy)  # a view per copy slot
            view = old_views.get(key)
            part = nodes[sp.i_start:sp.i_end]
            if view is None or view._nodes != part:
                # (a graph rewired since keeps its node count: compare the nodes themselves)
                view = _split_view(part, src_map, extra_flags)
            else:
                view.src_map = src_map  # (stamped: plans cached for the view revalidate)
                view.extra_flags = extra_flags
            views[key] = view
            sp.graph = view
        self._views = views
        self._keep_views(graph, views)
        for sp in splits:
            for inp in sp.inputs:
                cpy = self._copies[(inp, sp.backend_id)][self.cur_copy]
                sg_nodes.append(_dep_view(self._ctx, inp))
                node_ids.append(bo[inp])
                sg_nodes.append(cpy)
                node_ids.append(sp.backend_id)
            part = nodes[sp.i_start:sp.i_end]
            sg_nodes.extend(part)
            node_ids.extend(map(bo.__getitem__, part))
        if n_copies > 1:
            for inp in self._graph_inputs:
                ib = bo[inp]
                for cpy in self._copies[(inp, ib)]:
                    sg_leafs.append(cpy)
                    leaf_ids.append(ib)
            for sp in splits:
                for inp in sp.inputs:
                    for cpy in self._copies[(inp, sp.backend_id)]:
                        sg_leafs.append(cpy)
                        leaf_ids.append(sp.backend_id)
        cpu = len(self.backends) - 1
        sg_leafs.extend(graph.leafs)
        leaf_ids.extend(map(bo.get, graph.leafs, repeat(cpu)))
        sg.nodes = sg_nodes
        sg.leafs = sg_leafs
        sg.size = max(len(sg.nodes), len(sg.leafs))
        visited = set(map(id, sg_nodes))
        visited.update(map(id, sg_leafs))
        sg._visited = visited
        self.graph = sg
        self._node_ids, self._leaf_ids = node_ids, leaf_ids

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
