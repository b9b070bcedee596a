"""The scheduler: one graph across several backends (mirrors ``ggml_backend_sched``).

The scheduler assigns every node of a graph to a backend with the seed's passes, cuts the graph
into per-backend *splits*, copies what each split needs from other backends, allocates everything
through one :class:`~ggmlpy.alloc.gallocr.GraphAllocator` (one buffer per backend) and runs the splits.
With ``parallel=True`` it keeps ``n_copies = 4`` copies of every split input (and of every user
input) so that consecutive evaluations overlap, ordered by per-(backend, copy) events.

Differences from ggml, on purpose:

* The user's tensors are never rewritten. Where ggml sets ``node->src[j]`` to a copy, ggmlpy
  records the substitution in the scheduler graph's ``src_map``; allocators and backends read
  sources through :meth:`Graph.node_srcs`. The same graph object can be split, allocated and
  computed again.
* Tensors the scheduler's allocator placed are un-placed by :meth:`Scheduler.reset`, so the next
  split sees them fresh (ggml leaves dangling pointers).
* An eval callback that returns False stops the whole graph (not only the current split) and
  :meth:`graph_compute_async` returns ``Status.ABORTED``.
* An in-place writer (a non-view node with a ``view_src``, e.g. ``add_inplace``) runs on a
  backend that can access its ``view_src``'s memory (cause ``3.inpl``, after pass 3), its other
  operands copied in; where none can run it, :meth:`split_graph` raises (ggml's open bug: it
  fails at compute time). See :mod:`ggmlpy.sched.assign`.
* A graph whose only nodes are views gets one split over them (as ggml), so they are placed.
* The unchanged-graph fast path: ``reset(); alloc_graph(g)`` of the same, unchanged graph (same
  shapes, op_params, wiring, pins, pre-allocated buffers and compute buffers, by the
  :mod:`ggmlpy.core.snapshot` rule) replays the recorded split and placement instead of splitting
  and planning again (``reuse.hits``/``reuse.misses`` count it). Records are kept for the last
  32 graphs (LRU), so alternating between cached graphs (one per batch shape) replays each.
  When pipelining, replaying another graph than the last one synchronizes the backends first.
  See :mod:`ggmlpy.sched.reuse`.
* Split templates: a *new* graph object with the structure of one split before (equal snapshot
  state, copy slot, pins by position, ``supports_op`` memo tokens, ``offload_op`` answers and
  buffer usages) takes that split by position instead of running passes 1-5 again (the last 8
  structures; ``templates.hits`` counts it, ``templates.enabled = False`` turns it off). See
  :mod:`ggmlpy.sched.template`.
* Upstream fixes over the seed are taken: growable split inputs and splits, copy rotation at
  allocation time (``next_copy``), the alloc-twice guard, events recorded after every split and
  the host wait before an input-less split on another backend.

Ordering spec (what is guaranteed, in words): work of one split is queued on its backend's
stream; a split's inputs are written only after (a) the producing backend's work is done (async
peer copy on the producer's stream, or a host synchronize of the producer before a blocking
copy) and (b) the consuming backend finished the previous use of the same copy slot (an
``event_wait`` on ``events[backend][copy]``, or a host synchronize). User inputs are copied
blocking after a host wait, so the caller may overwrite them as soon as the call returns.
"""

from __future__ import annotations

import gc
import logging
import sys
import weakref
from operator import itemgetter
from typing import Any

from ggmlpy.alloc.gallocr import GraphAllocator
from ggmlpy.backend.interface import (
    Backend,
    BufferType,
    DeviceType,
    EvalCallback,
    Event,
    Status,
    event_new,
    event_record,
    event_synchronize,
    event_wait,
)
from ggmlpy.backend.tensor_data import backend_tensor_copy
from ggmlpy.core import env
from ggmlpy.core.check import checked_args, describe
from ggmlpy.core.graph import Graph, graph_view
from ggmlpy.core.tensor import Flag, Tensor
from ggmlpy.sched.assign import Assigner, Assignment, op_memo_token
from ggmlpy.sched.reuse import ReuseCache, SplitRecord, split_signature
from ggmlpy.sched.splits import SchedGraphBuilder, Split, SplitState, split_and_copy
from ggmlpy.sched.template import SplitTemplate, TemplateCache, apply_template, pins_key

__all__ = ["Scheduler", "MAX_BACKENDS", "MAX_COPIES"]

log = logging.getLogger("ggmlpy.sched.scheduler")

MAX_BACKENDS = 16
MAX_COPIES = 4


def _debug_level() -> int:
    """``GGMLPY_SCHED_DEBUG`` (0, 1 or 2), parsed by :func:`ggmlpy.core.env.sched_debug` (EnvError,
    a ValueError naming the variable, for any other value)."""
    return env.sched_debug()


_first = itemgetter(0)
class Scheduler:
    """Split a graph across backends and run it (mirrors ``ggml_backend_sched_new``).

    The scheduler holds its parts as objects, each owning its state: the :class:`~ggmlpy.sched.
    assign.Assigner` (passes 1-4 and their answer memos), the :class:`~ggmlpy.sched.splits.
    SchedGraphBuilder` (the scheduler graph and the split-graph views), the split templates
    (:class:`~ggmlpy.sched.template.TemplateCache`), the unchanged-graph records
    (:class:`~ggmlpy.sched.reuse.ReuseCache`) and the allocator. What flows between them is data:
    an :class:`~ggmlpy.sched.assign.Assignment` and a :class:`~ggmlpy.sched.splits.SplitState`
    (the current split: ``Scheduler.splits`` is its split list).

    Args:
        backends: 1 to 16 backends in priority order (index 0 highest); the last must be a CPU
            device.
        bufts: the compute buffer type per backend (default: each backend's default buffer type);
            each must be supported by its backend.
        graph_size: the largest graph (nodes) the scheduler expects; the internal graph grows as
            needed.
        parallel: keep ``n_copies = 4`` copies of split inputs for pipelined evaluations.
        op_offload: let a higher-priority backend take ops whose weights are in host memory when
            its ``offload_op`` says so.
        alloc_policy: the compute-buffer planner's placement policy, ``"ggml"`` (ggml's exact
            layouts) or ``"compact"`` (same lifetimes, tighter offline placement); see
            :class:`~ggmlpy.alloc.gallocr.GraphAllocator`.

    Raises:
        ValueError: no backends, more than 16, the last is not a CPU device, a buffer type not
            supported by its backend, ``bufts`` of the wrong length, or an unknown ``alloc_policy``.

    Counters (read-only for users): ``n_plans``, the compute-buffer plans made so far (each
    ``GraphAllocator`` planning pass: one per :meth:`reserve` and :meth:`reserve_size`, and one
    whenever :meth:`alloc_graph` finds the current plan unusable and plans again). A reserved
    graph is planned once: later evaluations of it, in every copy slot when pipelining, reuse
    that plan. ``reuse.hits``/``reuse.misses`` and ``templates.hits``: see below.

    Environment: ``GGMLPY_SCHED_DEBUG=1`` prints the splits (to stderr) once per split actually
    made, as ggml prints once per ``ggml_backend_sched_split_graph`` call: by :meth:`reserve`,
    :meth:`reserve_size`, :meth:`split_graph`, and :meth:`alloc_graph` when it splits (or applies
    a split template); the header line names which (``sched: reserve: ...``), so a reservation
    followed by the first evaluation shows two labelled tables. An unchanged graph that replays
    its recorded splits prints nothing. ``=2`` prints every node too.
    """

    @checked_args
    def __init__(self, backends: list[Backend], bufts: list[BufferType] | None = None,
                 graph_size: int = 2048, parallel: bool = False, op_offload: bool = True,
                 alloc_policy: str = "ggml") -> None:
        if isinstance(backends, Backend) or not hasattr(backends, "__iter__"):
            raise TypeError(f"Scheduler: backends must be a list of Backend objects, got "
                            f"{type(backends).__name__}")
        backends = list(backends)
        n = len(backends)
        for b in backends:
            if not isinstance(b, Backend):
                raise TypeError(f"Scheduler: expected Backend objects, got {type(b).__name__}")
        if not 0 < n <= MAX_BACKENDS:
            raise ValueError(f"Scheduler: need 1 to {MAX_BACKENDS} backends, got {n}")
        if backends[-1].device.type != DeviceType.CPU:
            raise ValueError(f"Scheduler: the last backend must be a CPU device, got "
                             f"{backends[-1].name} ({backends[-1].device.type.name})")
        if bufts is not None and len(bufts) != n:
            raise ValueError(f"Scheduler: {len(bufts)} buffer types for {n} backends")
        self.backends = backends
        self.bufts = [b.get_default_buffer_type() for b in backends] if bufts is None else list(bufts)
        for b, buft in zip(self.backends, self.bufts):
            if not b.supports_buft(buft):
                raise ValueError(f"Scheduler: backend {b.name} does not support buffer type {buft.name}")
        self.graph_size = int(graph_size)
        self.n_copies = MAX_COPIES if parallel else 1
        self.op_offload = bool(op_offload)
        self.cur_copy = 0
        self.next_copy = 0
        self.events: list[list[Event | None]] = [
            [event_new(b.device) if self.n_copies > 1 else None for _ in range(self.n_copies)]
            for b in self.backends]
        from ggmlpy.alloc.gallocr import POLICIES  # noqa: PLC0415

        if alloc_policy not in POLICIES:
            raise ValueError(f"Scheduler: alloc_policy must be one of {POLICIES}, "
                             f"got {alloc_policy!r}")
        self.galloc = GraphAllocator.new_n(self.bufts, policy=alloc_policy)
        self.n_plans = 0
        self.debug = _debug_level()
        self.callback_eval: EvalCallback | None = None
        self._names = [b.name for b in self.backends]
        self.assigner = Assigner(self.backends, self.bufts, self.op_offload)
        self._builder = SchedGraphBuilder(self.n_copies, n - 1)
        self.reuse = ReuseCache()            # the unchanged-graph fast path (sched/reuse.py)
        self.templates = TemplateCache()     # fresh graphs of a known structure (sched/template.py)
        # the current split (assignments since the last reset, pins included)
        self._state = SplitState(Assignment(), 0)
        self.splits: list[Split] = []  # the last split's list (kept by reset, as in ggml)
        self.graph = Graph(0)          # the scheduler's graph: split inputs, copies, nodes
        self._user_graph: Graph | None = None
        self._chunk_views: dict[tuple[int, int, int], tuple[weakref.ref[Graph], Graph]] = {}
        self._node_ids: list[int] = []
        self._leaf_ids: list[int] = []
        self._prev_node_ids: list[int] = []
        self._prev_leaf_ids: list[int] = []
        self._placed: list[Tensor] = []
        self._placement: list[tuple[Tensor, Any, Any]] | None = None  # what the last alloc placed
        self._pins: dict[Tensor, int] = {}   # set_tensor_backend since the last reset
        # (user-graph state, split signature, allocator snapshot) of the last fresh allocation
        self._vouch: tuple[tuple, tuple, Any] | None = None
        self.is_reset = True
        self.is_alloc = False

    # ------------------------------------------------------------------------------------------
    # small queries

    def get_n_backends(self) -> int:
        """Number of backends (mirrors ``ggml_backend_sched_get_n_backends``)."""
        return len(self.backends)

    @checked_args
    def get_backend(self, i: int) -> Backend:
        """Backend ``i`` (mirrors ``ggml_backend_sched_get_backend``). Raises IndexError when out of range."""
        if not 0 <= i < len(self.backends):
            raise IndexError(f"Scheduler: backend index {i} out of range 0..{len(self.backends) - 1}")
        return self.backends[i]

    def get_n_splits(self) -> int:
        """Number of splits of the last split graph (mirrors ``ggml_backend_sched_get_n_splits``)."""
        return len(self.splits)

    def get_n_copies(self) -> int:
        """Copies kept of each split input: 4 with ``parallel``, else 1 (mirrors ``ggml_backend_sched_get_n_copies``)."""
        return self.n_copies

    def _backend_index(self, backend: Backend) -> int:
        for i, b in enumerate(self.backends):
            if b is backend:
                return i
        what = backend.name if isinstance(backend, Backend) else repr(backend)
        raise ValueError(f"Scheduler: {what} is not one of this scheduler's backends")

    @checked_args
    def get_buffer_type(self, backend: Backend) -> BufferType:
        """The compute buffer type of ``backend`` (mirrors ``ggml_backend_sched_get_buffer_type``)."""
        return self.bufts[self._backend_index(backend)]

    @checked_args
    def get_buffer_size(self, backend: Backend) -> int:
        """Bytes of ``backend``'s compute buffer; 0 when it shares an earlier backend's buffer
        (mirrors ``ggml_backend_sched_get_buffer_size``).

        Raises:
            ValueError: ``backend`` is not one of the scheduler's backends.
        """
        return self.galloc.get_buffer_size(self._backend_index(backend))

    @checked_args
    def set_tensor_backend(self, node: Tensor, backend: Backend) -> None:
        """Pin ``node`` to ``backend`` until the next :meth:`reset` (mirrors ``ggml_backend_sched_set_tensor_backend``).

        Raises:
            TypeError: ``node`` is not a Tensor.
            ValueError: ``backend`` is not one of the scheduler's backends.
        """
        if not isinstance(node, Tensor):
            raise TypeError(f"set_tensor_backend: expected a Tensor, got {type(node).__name__}")
        a = self._state.assignment
        a.backend_of[node] = self._pins[node] = self._backend_index(backend)
        a.cause[node] = "usr"
        self.is_reset = False

    @checked_args
    def get_tensor_backend(self, node: Tensor) -> Backend | None:
        """The backend ``node`` is assigned to, or None (mirrors ``ggml_backend_sched_get_tensor_backend``)."""
        b = self._state.assignment.backend_of.get(node, -1)
        return None if b < 0 else self.backends[b]

    def set_eval_callback(self, callback: EvalCallback | None) -> None:
        """Observe nodes while computing (mirrors ``ggml_backend_sched_set_eval_callback``).

        ``callback(t, True)`` asks whether the user wants node ``t``; for those, after the nodes up
        to ``t`` are computed and the backend synchronized, ``callback(t, False)`` delivers it and
        returning False stops the whole graph (the compute returns ``Status.ABORTED``).
        """
        self.callback_eval = callback

    # ------------------------------------------------------------------------------------------
    # assignment

    def split_graph(self, graph: Graph) -> None:
        """Assign backends and build splits without allocating (mirrors ``ggml_backend_sched_split_graph``).

        Assignments already present (user pins, or a previous split without :meth:`reset`) are
        kept. Raises UnsupportedOpError when a node no backend supports, or a pre-allocated
        tensor no capable backend can use, is found; the scheduler is usable after :meth:`reset`.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"split_graph: expected a Graph, got {type(graph).__name__}")
        self._split(graph, "split_graph")

    def _split(self, graph: Graph, caller: str) -> None:
        """:meth:`split_graph`'s work; ``caller`` labels the debug print (the public entry
        point that split)."""
        self.is_reset = False
        self._user_graph = graph
        # (assignments already made, the user's pins, are kept and completed)
        st = SplitState(self._state.assignment, self.cur_copy)
        st.assignment.offload_asked = []
        self.assigner.begin()
        self.assigner.assign(graph, st.assignment)
        split_and_copy(graph.nodes, st, self.n_copies, self._names, self.assigner.buffer_supported)
        self._install(graph, st)
        if self.debug:
            self.print_report(verbose=self.debug > 1, caller=caller)

    def _install(self, graph: Graph, st: SplitState) -> None:
        """Make ``st`` (a split of ``graph``) the current split and build its scheduler graph."""
        self._state = st
        self.splits = st.splits
        self._prev_node_ids, self._prev_leaf_ids = self._node_ids, self._leaf_ids
        self.graph, self._node_ids, self._leaf_ids = self._builder.build(graph, st)

    # ------------------------------------------------------------------------------------------
    # allocation

    def _alloc_splits(self) -> bool:
        sg = self.graph
        bufts = self.bufts
        changed = (len(self._node_ids) != len(self._prev_node_ids)
                   or len(self._leaf_ids) != len(self._prev_leaf_ids))
        if not changed and self._node_ids != self._prev_node_ids:  # (equal lists: C-speed)
            for a, b in zip(self._node_ids, self._prev_node_ids):
                if a != b and bufts[a] is not bufts[b]:
                    changed = True
                    break
        if not changed and self._leaf_ids != self._prev_leaf_ids:
            for a, b in zip(self._leaf_ids, self._prev_leaf_ids):
                if a != b and bufts[a] is not bufts[b]:
                    changed = True
                    break
        self._placed = []
        self._placement = None
        recs = self.galloc._node_recs  # (replaced by every planning pass)
        ok = self._alloc_planned(sg, changed)
        if self.galloc._node_recs is not recs:
            self.n_plans += 1
        return ok

    def _alloc_planned(self, sg: Graph, changed: bool) -> bool:
        """Place the scheduler graph ``sg`` with the allocator's plan, planning anew first when
        the backend ids changed (``changed``) or the allocator finds its plan unusable."""
        if changed or not self.galloc.alloc_graph(sg):
            for b in self.backends:
                b.synchronize()
            self.galloc.reserve_n(sg, self._node_ids, self._leaf_ids)
            if not self.galloc.alloc_graph(sg):
                log.error("Scheduler: failed to allocate the graph (buffer sizes: %s)",
                          [self.galloc.get_buffer_size(i) for i in range(len(self.backends))])
                return False
        # remember what this allocation placed, so reset() can un-place it (the placement's
        # entries are (t, t._buffer, t._offset): it filters out tensors placed elsewhere since)
        self._placement = self.galloc.placement()
        self._placed = list(map(_first, self._placement))
        return True

    @checked_args
    def reserve(self, graph: Graph) -> bool:
        """Plan and allocate compute buffers for the worst-case ``graph`` (mirrors ``ggml_backend_sched_reserve``).

        Synchronizes, splits (keeping user pins made with :meth:`set_tensor_backend`), reserves
        one buffer per backend, then resets. Returns False when a buffer could not be allocated
        (the sizes are logged); the scheduler stays usable.
        """
        self.synchronize()
        try:
            self._split(graph, "reserve")
            self.n_plans += 1
            ok = self.galloc.reserve_n(self.graph, self._node_ids, self._leaf_ids)
        finally:
            self.reset()
        if not ok:
            log.error("Scheduler: reserve failed (buffer sizes: %s)",
                      [self.galloc.get_buffer_size(i) for i in range(len(self.backends))])
        return ok

    @checked_args
    def reserve_size(self, graph: Graph) -> list[int]:
        """Bytes each backend's compute buffer would need for ``graph``, allocating nothing
        (mirrors ``ggml_backend_sched_reserve_size``). Resets first, dropping user pins."""
        self.reset()
        self.synchronize()
        try:
            self._split(graph, "reserve_size")
            self.n_plans += 1
            return self.galloc.reserve_n_size(self.graph, self._node_ids, self._leaf_ids)
        finally:
            self.reset()

    @checked_args
    def alloc_graph(self, graph: Graph) -> bool:
        """Split ``graph`` and place all its tensors (mirrors ``ggml_backend_sched_alloc_graph``).

        Rotates the copy slot (``cur_copy``) first. Returns False when allocation failed. An
        unchanged graph (one of the last 32 allocated, see :mod:`ggmlpy.sched.reuse`) replays its
        recorded split and placement; otherwise the split (taken from a split template when a
        graph of the same structure was split before, see :mod:`ggmlpy.sched.template`) and
        allocation run with Python's cyclic garbage collector paused (process-wide, re-enabled
        before returning when it was on).

        Raises:
            ValueError: the scheduler already holds an allocated graph (call :meth:`reset` first).
            UnsupportedOpError: as :meth:`split_graph`.
        """
        if self.is_alloc:
            raise ValueError("Scheduler.alloc_graph: a graph is already allocated; call reset() first")
        if not isinstance(graph, Graph):
            raise TypeError(f"alloc_graph: expected a Graph, got {type(graph).__name__}")
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        reuse = self.reuse
        # the fast path needs a clean state: nothing assigned but the user's pins
        eligible = len(self._state.assignment.backend_of) == len(self._pins)
        if eligible:
            rec = reuse.lookup(graph, self.cur_copy, self._pins)
            if rec is not None:
                if self.n_copies > 1 and graph is not self._user_graph:
                    # another graph's placement: evaluations of the last graph still in flight
                    # in other copy slots may use memory this one reuses
                    for b in self.backends:
                        b.synchronize()
                self._restore(graph, rec)
                self.is_alloc = True
                return True
        # the slow path allocates many small, acyclic objects (states, records, dicts): the
        # cyclic collector is paused meanwhile so it does not scan the whole heap again and
        # again mid-split (it collects once, on the first allocation after it is re-enabled)
        gc_on = gc.isenabled()
        if gc_on:
            gc.disable()
        try:
            return self._alloc_slow(graph, eligible)
        finally:
            if gc_on:
                gc.enable()

    def _alloc_slow(self, graph: Graph, eligible: bool) -> bool:
        reuse = self.reuse
        snap = None
        pos: dict[int, int] = {}
        order: list[Tensor] = []
        templates = self.templates
        tmpl = tokens = pkey = None
        if eligible:
            snap = reuse.begin(graph, self._pins, pos, order)
            # (the passes read node.src and t.flags; a graph that maps sources or adds flags
            # has a state that does not show those: no template then)
            if templates.enabled and not graph._src_map and not graph._extra_flags:
                tokens = tuple(op_memo_token(b) for b in self.backends)
                pkey = pins_key(self._pins, pos)
                if None in tokens:
                    tokens = None
                elif templates:
                    tmpl = templates.find(snap.state, self.cur_copy, pkey, tokens, order,
                                          self.backends)
        else:
            reuse.clear()
            templates.clear()
        if tmpl is not None:
            self.is_reset = False
            self._user_graph = graph
            self.assigner.begin()  # (this split's supports_op answers: none asked)
            self._install(graph, apply_template(tmpl, order, self.cur_copy, self.n_copies,
                                                self._names))
            templates.hits += 1
            snap.state = tmpl.state  # (equal: one tuple kept, compared by identity below)
            if self.debug:
                self.print_report(verbose=self.debug > 1, caller="alloc_graph (split template)")
        else:
            self._split(graph, "alloc_graph")
        recs_before = self.galloc._node_recs  # replaced whenever the allocator plans anew
        # vouch for the scheduler's graph (skip the allocator's state compare): the user graph's
        # state and the split signature equal those of the last allocation, so the scheduler's
        # graph has the state the allocator's current plan was validated for
        vouch = sig = None
        if snap is not None and not snap._outside:
            if tmpl is not None:
                sig = tmpl.sig  # (the same positions: the same signature)
            else:
                sig = split_signature(self._state.splits, self._state.graph_inputs, pos,
                                      self._node_ids, self._leaf_ids, self.cur_copy)
            if sig is not None:
                last = self._vouch
                st = snap.state
                if (last is not None and last[2] is self.galloc._snap
                        and (last[0] is st or last[0] == st)):
                    if last[1] is sig or last[1] == sig:
                        self.galloc._vouch(self.graph)
                    elif last[1][1:] == sig[1:] and self._slots_interchangeable():
                        # the same split for another copy slot: one plan serves every slot
                        self.galloc._vouch(self.graph, other_slot=True)
                vouch = (st, sig)
        self._vouch = None
        if not self._alloc_splits():
            reuse.clear()
            templates.clear()
            return False
        if vouch is not None:
            self._vouch = (vouch[0], vouch[1], self.galloc._snap)
        if snap is not None:
            reuse.misses += 1
            rec = SplitRecord(self._state.replica(), self.graph, self._node_ids, self._leaf_ids,
                              self._builder.views, self._placement)
            buffers = [b for i in range(len(self.backends)) for b in self.galloc.get_chunk_buffers(i)]
            reuse.store(snap, self.cur_copy, rec, buffers, self.galloc._node_recs is not recs_before)
            if tmpl is None and tokens is not None and pkey is not None:
                templates.add(SplitTemplate(snap.state, self.cur_copy, pkey, tokens, sig, rec,
                                            pos, order, self._state.assignment.offload_asked))
        self.is_alloc = True
        return True

    def _slots_interchangeable(self) -> bool:
        """Whether the scheduler graphs of the current split for different copy slots get the
        same allocator plan, position by position (so a plan made for one slot serves them
        all, as in ggml, where ``ggml_gallocr_needs_realloc`` compares sizes only): pipelining
        (every copy of a split or graph input is an INPUT|OUTPUT leaf, placed first and never
        freed, so which one is current changes no lifetime) and no graph input has memory of
        its own or is a view (the user's tensor is the current slot of its copies: it must be
        placed like the duplicates it stands in for)."""
        if self.n_copies < 2:
            return False
        for t in self._state.graph_inputs:
            if t._buffer is not None or t._offset is not None or t.view_src is not None:
                return False
        return True

    def _restore(self, graph: Graph, rec: SplitRecord) -> None:
        """The fast path: make ``rec`` (a split + allocation of ``graph`` still valid for this
        copy slot) the current state, putting its placement back (see :mod:`ggmlpy.sched.reuse`)."""
        self.reuse.replay(graph, rec)
        sm, ef = rec.graph._src_map, rec.graph._extra_flags
        for sp in rec.state.splits:
            v = sp.graph
            if v._src_map is not sm:  # (a view shared with a later split of another slot)
                v.src_map, v.extra_flags = sm, ef
        self.is_reset = False
        self._user_graph = graph
        self._state = rec.state.replica()
        self.splits = rec.state.splits
        self.graph = rec.graph
        self._node_ids = self._prev_node_ids = rec.node_ids
        self._leaf_ids = self._prev_leaf_ids = rec.leaf_ids
        self._builder.adopt(graph, rec.views)
        self._placement = rec.placement
        self._placed = [t for t, _b, _o in rec.placement]

    # ------------------------------------------------------------------------------------------
    # compute

    @checked_args
    def graph_compute_async(self, graph: Graph) -> Status:
        """Run ``graph``'s splits without waiting for the last one (mirrors ``ggml_backend_sched_graph_compute_async``).

        If nothing is allocated the scheduler resets (when needed) and allocates ``graph`` first,
        returning ``Status.ALLOC_FAILED`` if that fails. If a graph is already allocated,
        ``graph`` must be that graph (ggml silently runs the allocated one instead).

        Raises:
            TypeError: ``graph`` is not a Graph.
            ValueError: another graph is allocated (call :meth:`reset` first, or compute the
                allocated graph); nothing is run.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"Scheduler.graph_compute: graph must be a Graph, got {describe(graph)}")
        if self.is_alloc and graph is not self._user_graph:
            ug = self._user_graph
            raise ValueError(
                f"Scheduler.graph_compute: graph ({graph.n_nodes} nodes) is not the graph "
                f"allocated by alloc_graph ({ug.n_nodes if ug is not None else 0} nodes); call "
                "reset() and then alloc_graph(graph) (or graph_compute(graph)) to run it")
        if not self.is_reset and not self.is_alloc:
            self.reset()
        if not self.is_alloc:
            if not self.alloc_graph(graph):
                return Status.ALLOC_FAILED
        return self._compute_splits()

    @checked_args
    def graph_compute(self, graph: Graph) -> Status:
        """:meth:`graph_compute_async` then :meth:`synchronize` (mirrors ``ggml_backend_sched_graph_compute``)."""
        status = self.graph_compute_async(graph)
        self.synchronize()
        return status

    def _compute_splits(self) -> Status:
        cur = self.cur_copy
        events = self.events
        bo, copies = self._state.assignment.backend_of, self._state.copies
        prev_b = -1
        for sp in self.splits:
            b = sp.backend_id
            backend = self.backends[b]
            ev = events[b][cur]
            if not sp.inputs and prev_b >= 0 and prev_b != b:
                pev = events[prev_b][cur]
                if pev is not None:
                    event_synchronize(pev)
                else:
                    self.backends[prev_b].synchronize()
            for inp in sp.inputs:
                in_backend = self.backends[bo[inp]]
                cpy = copies[(inp, b)][cur]
                if inp.flags & Flag.INPUT:
                    # user data: copy now, so the caller may overwrite it when we return
                    if ev is not None:
                        event_synchronize(ev)
                    else:
                        backend.synchronize()
                    backend_tensor_copy(inp, cpy)
                else:
                    if ev is not None:
                        event_wait(backend, ev)
                    else:
                        backend.synchronize()
                    if not backend._cpy_tensor_async(in_backend, inp, cpy):
                        in_backend.synchronize()
                        if ev is not None:
                            event_synchronize(ev)
                        else:
                            backend.synchronize()
                        backend_tensor_copy(inp, cpy)
            assert sp.graph is not None
            if self.callback_eval is None:
                status = backend.graph_compute_async(sp.graph)
                if status != Status.SUCCESS:
                    return status
            else:
                status = self._compute_with_callback(backend, sp.graph)
                if status != Status.SUCCESS:
                    return status
            if ev is not None:
                event_record(ev, backend)
            prev_b = b
        return Status.SUCCESS

    def _compute_with_callback(self, backend: Backend, g: Graph) -> Status:
        cb = self.callback_eval
        assert cb is not None
        n = len(g.nodes)
        j0 = 0
        while j0 < n:
            j1 = j0
            need = cb(g.nodes[j1], True)
            while not need and j1 < n - 1:
                j1 += 1
                need = cb(g.nodes[j1], True)
            status = backend.graph_compute_async(self._chunk_view(g, j0, j1 + 1))
            if status != Status.SUCCESS:
                return status
            backend.synchronize()
            if need and not cb(g.nodes[j1], False):
                return Status.ABORTED
            j0 = j1 + 1
        return Status.SUCCESS

    def _chunk_view(self, g: Graph, i0: int, i1: int) -> Graph:
        # the same node range of the same split graph reuses one view, so plans stay cached
        key = (id(g), i0, i1)
        hit = self._chunk_views.get(key)
        if hit is not None and hit[0]() is g:
            hit[1].src_map, hit[1].extra_flags = g.src_map, g.extra_flags
            return hit[1]
        if len(self._chunk_views) > 4096:
            self._chunk_views.clear()
        v = graph_view(g, i0, i1)
        self._chunk_views[key] = (weakref.ref(g), v)
        return v

    def synchronize(self) -> None:
        """Wait for every backend (mirrors ``ggml_backend_sched_synchronize``); with nothing allocated
        the copy rotation restarts at 0."""
        for b in self.backends:
            b.synchronize()
        if not self.is_alloc:
            self.next_copy = 0

    def reset(self) -> None:
        """Forget assignments, pins, copies and the allocation (mirrors ``ggml_backend_sched_reset``).

        Tensors placed by the scheduler's allocator are un-placed (``buffer``/``offset`` None), so
        the graph can be split and allocated again; weights and user-allocated tensors are kept.
        When the allocation is recorded for the unchanged-graph fast path the un-placing is
        *parked* (not stamped) so the next ``alloc_graph`` of the same graph can put the same
        addresses back without invalidating the backends' plans (see :mod:`ggmlpy.sched.reuse`).
        """
        if not self.is_reset:
            self._state = SplitState(Assignment(), self.cur_copy)
            self._pins = {}
        placement = self._placement
        if placement is not None and self.reuse.holds(placement):
            self.reuse.park(placement)  # un-placed without stamps, for the fast path (sched/reuse.py)
        else:
            for t in self._placed:
                t.buffer = None
                t.offset = None
        self._placed = []
        self._placement = None
        self.is_reset = True
        self.is_alloc = False

    def free(self) -> None:
        """Synchronize, reset and release the compute buffers (mirrors ``ggml_backend_sched_free``)."""
        self.synchronize()
        self.reset()
        self.reuse.clear()
        self.templates.clear()
        self.galloc.free()

    # ------------------------------------------------------------------------------------------
    # explainability

    def report(self) -> dict[str, Any]:
        """A structured description of the last split.

        Returns:
            ``{"n_splits", "n_copies", "splits": [{"id", "backend", "nodes": [i_start, i_end],
            "inputs": [{"name", "from", "bytes"}], "bytes_copied"}], "nodes": [{"index", "name",
            "op", "backend", "cause", "split"}]}`` where ``cause`` is the rule that placed the
            node: ``usr`` (pinned), ``1.dst``/``1.vsrc`` (its buffer), ``1.inp`` (graph input),
            ``1.wgt``/``1.off`` (next to its weights / offloaded), ``2.gpu_down``, ``2.gpu_up``,
            ``2.down``, ``2.up`` (expansion sweeps), ``3.best``/``3.upg``, ``3.inpl`` (an in-place
            writer moved to where its ``view_src``'s memory is), ``4.vsrc``/``4.cur``/
            ``4.fallback``.
        """
        g = self._user_graph
        bo, cause = self._state.assignment.backend_of, self._state.assignment.cause
        split_of: dict[int, int] = {}
        splits = []
        for k, sp in enumerate(self.splits):
            for i in range(sp.i_start, sp.i_end):
                split_of[i] = k
            inputs = [{"name": t.name, "from": self.backends[bo.get(t, -1)].name
                       if bo.get(t, -1) >= 0 else None, "bytes": t.nbytes}
                      for t in sp.inputs]
            splits.append({"id": k, "backend": self.backends[sp.backend_id].name,
                           "nodes": [sp.i_start, sp.i_end], "inputs": inputs,
                           "bytes_copied": sum(x["bytes"] for x in inputs)})
        nodes = []
        if g is not None:
            for i, n in enumerate(g.nodes):
                b = bo.get(n, -1)
                nodes.append({"index": i, "name": n.name, "op": n.op.name,
                              "backend": self.backends[b].name if b >= 0 else None,
                              "cause": cause.get(n, ""), "split": split_of.get(i)})
        return {"n_splits": len(self.splits), "n_copies": self.n_copies, "splits": splits,
                "nodes": nodes}

    def print_report(self, verbose: bool = False, file: Any = None, caller: str | None = None) -> None:
        """Print :meth:`report` as text to ``file`` (default stderr), synchronously
        (``GGMLPY_SCHED_DEBUG=1``; ``verbose`` adds every node, level 2; mirrors
        ``ggml_backend_sched_print_assignments``). ``caller`` (the entry point that split, e.g.
        ``"reserve"``) is named in the header line: ``sched: reserve: 2 splits, ...``."""
        out = file or sys.stderr
        r = self.report()
        label = f"{caller}: " if caller else ""
        n_nodes = self._user_graph.n_nodes if self._user_graph is not None else 0
        print(f"sched: {label}{r['n_splits']} splits, n_copies={r['n_copies']}, graph of "
              f"{n_nodes} nodes", file=out)
        for sp in r["splits"]:
            ins = ", ".join(f"{x['name']} ({x['bytes']} B from {x['from']})" for x in sp["inputs"])
            print(f"## SPLIT #{sp['id']}: {sp['backend']} nodes [{sp['nodes'][0]}, {sp['nodes'][1]}) "
                  f"{len(sp['inputs'])} inputs{': ' + ins if ins else ''}", file=out)
            if verbose:
                for n in r["nodes"][sp["nodes"][0]:sp["nodes"][1]]:
                    print(f"  node #{n['index']:4d} {n['op']:>16} {n['name']:<32} "
                          f"[{n['backend']} {n['cause']}]", file=out)
