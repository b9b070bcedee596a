"""Split templates: a fresh graph with the structure of one split before skips passes 1-5
(a :class:`TemplateCache` the scheduler holds, and :func:`apply_template`).

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
the object ids its state names can not be reused by other objects while it is kept. On a hit
:func:`apply_template` rebuilds the split's data (a :class:`~ggmlpy.sched.splits.SplitState`:
assignments and causes, split ranges and inputs, copies, graph inputs, substituted sources) for
the new graph's tensors at the same positions, with new copy tensors made exactly as pass 5
makes them; the scheduler graph is then built as after a full split and the allocation follows
as usual (the allocator's plan is checked as usual, or vouched for). The result equals a full
split's (tests/sched/test_sched_template.py compares every field against a scheduler with
templates disabled).
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Any

from ggmlpy.core.tensor import Tensor
from ggmlpy.sched.assign import Assignment
from ggmlpy.sched.splits import Split, SplitState

__all__ = ["SplitTemplate", "TemplateCache", "apply_template", "pins_key", "DEFAULT_TEMPLATES"]

_buffer_of = attrgetter("_buffer")
_view_src_of = attrgetter("view_src")

#: split templates a scheduler keeps (least recently used dropped first)
DEFAULT_TEMPLATES = 8


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
        rec: the reuse cache's record of that split (:class:`~ggmlpy.sched.reuse.SplitRecord`).
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
        st = rec.state
        get = pos.get
        cause = st.assignment.cause
        positions, bvals, cvals = [], [], []
        for t, b in st.assignment.backend_of.items():
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
        for (s, b), cl in st.copies.items():
            p = get(id(s))
            if p is None:
                return None
            copies.append((p, b, cl[slot] is s))
        subst = []
        bo = st.assignment.backend_of
        for nid, srcs in st.src_map.items():
            p = get(nid)
            if p is None:
                return None
            subs = tuple((j, bo[s]) for j, s in enumerate(srcs)
                         if s is not None and cause.get(s) == "5.cpy")
            subst.append((p, subs))
        splits = []
        for sp in st.splits:
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


def apply_template(tmpl: SplitTemplate, order: list[Tensor], cur_copy: int, n_copies: int,
                   names: list[str]) -> SplitState:
    """The split of ``tmpl`` for the graph whose tensors by position are ``order`` (the template
    found by :meth:`TemplateCache.find`, so its key holds and it is usable), in copy slot
    ``cur_copy``: assignments and causes, copies (made as pass 5 makes them, named after the
    backends' ``names``), splits and substituted sources, as a new
    :class:`~ggmlpy.sched.splits.SplitState`."""
    plan = tmpl.plan()
    if plan is None:
        raise ValueError("apply_template: the template has no plan (TemplateCache.find never "
                         "returns such a template)")
    positions = plan.positions
    if len(positions) == 1:
        ts: tuple = (order[positions[0]],)
    else:
        ts = itemgetter(*positions)(order) if positions else ()
    st = SplitState(Assignment(dict(zip(ts, plan.bvals)), dict(zip(ts, plan.cvals))), cur_copy)
    for p, b, is_input in plan.copies:
        if is_input:
            st.input_copies(order[p], b, n_copies, names[b])
        else:
            st.split_copies(order[p], b, n_copies, names[b])
    st.splits = [Split(b, i0, i1, [order[p] for p in ins]) for b, i0, i1, ins in plan.splits]
    copies, src_map = st.copies, st.src_map
    for p, subs in plan.subst:
        node = order[p]
        srcs = list(node.src)
        for j, b in subs:
            srcs[j] = copies[(srcs[j], b)][cur_copy]
        src_map[id(node)] = srcs
    return st
