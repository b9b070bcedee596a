"""Graph allocator: ggml-alloc's ``ggml_gallocr`` and the address planner behind it.

:class:`GraphAllocator` (ggml's ``ggml_gallocr``) plans a compute graph's intermediate tensors
with ggml's planner (best-fit over free blocks, tensors freed after their last consumer, in-place
reuse for ggml's in-place ops, several chunks when the buffer type has a max size), allocates one
compute buffer per chunk, and places the graph's tensors at the planned offsets. The planner is
:class:`_DynAllocator` (ggml's ``ggml_dyn_tallocr``).

All sizes and offsets are in **bytes**. All calls are synchronous and only touch tensor metadata
and buffer allocation; no tensor data is read or written. Logging goes to the ``ggmlpy.alloc.tallocr``
logger (the same logger as :mod:`ggmlpy.alloc.tallocr`, which re-exports everything public here).

Ownership in ggmlpy (differs from ggml, where a graph's tensors are fresh each time): the same
:class:`~ggmlpy.core.tensor.Tensor` objects are reused across evaluations. A :class:`GraphAllocator`
therefore remembers every tensor it placed (``tensor_alloc`` or ``view_init``) together with the
``(buffer, offset)`` it gave it. Such a tensor is *owned* while it still has exactly that placement.
Planning treats owned tensors as unallocated; :meth:`GraphAllocator.alloc_graph` first resets
(``buffer = offset = None``) every owned tensor and every view in the graph whose ``view_src`` is
owned, then places the graph afresh. Tensors the allocator did not place (weights, user-allocated
inputs, anything with other memory) are never modified. When the allocator frees a compute buffer
(re-reserve, failure, :meth:`GraphAllocator.free`), the owned tensors placed in it are reset too,
so no tensor is left pointing into freed memory without the allocator knowing.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from ggmlpy.alloc.dyn_alloc import _UNBOUNDED, MAX_CHUNKS, _DynAllocator, _pad
from ggmlpy.backend.buffers import MultiBuffer
from ggmlpy.backend.interface import Buffer, BufferType, BufferUsage
from ggmlpy.core import snapshot as _snapshot
from ggmlpy.core.check import checked_args
from ggmlpy.core.errors import NotAllocatedError, OutOfMemoryError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import INPLACE_CAPABLE_OPS, Op
from ggmlpy.core.snapshot import Snapshot
from ggmlpy.core.tensor import Flag, Tensor

__all__ = ["GraphAllocator", "MAX_CHUNKS", "POLICIES"]

# Same logger name as before the split from ggmlpy.alloc.tallocr, so log filters keep working.
log = logging.getLogger("ggmlpy.alloc.tallocr")

#: Placement policies of :class:`GraphAllocator`: ``"ggml"`` reproduces ggml-alloc's layouts
#: exactly; ``"compact"`` plans the same lifetimes and in-place reuse, then re-places every block
#: offline (largest first, lowest free offset over its lifetime) and keeps that layout when it is
#: smaller (single-chunk plans only).
POLICIES = ("ggml", "compact")
#: when True, a graph the scheduler vouches for (:meth:`GraphAllocator._vouch`) is compared
#: anyway (a vouch for another copy slot: planned afresh aside and the plans compared) and a
#: mismatch raises RuntimeError (tests turn it on)
VERIFY_VOUCH = False

# stamp-free setters of the Tensor slots (ggmlpy.core.snapshot.slot_setter)
_SET_BUFFER, _SET_OFFSET, _SET_VER = (_snapshot.slot_setter(Tensor, k) for k in ("_buffer", "_offset", "_ver"))


def _init_is_noop(buf: Buffer) -> bool:
    """Whether ``buf.init_tensor`` is :class:`~ggmlpy.backend.interface.Buffer`'s own, which does nothing
    (neither the class nor the instance overrides it or its ``_init_tensor`` hook)."""
    cls = type(buf)
    d = getattr(buf, "__dict__", {})
    return (cls.init_tensor is Buffer.init_tensor and cls._init_tensor is Buffer._init_tensor
            and "init_tensor" not in d and "_init_tensor" not in d)


# =================================================================================================
# gallocr
# =================================================================================================


class _HashNode:
    """Per-tensor planning state (mirrors ggml-alloc's ``struct hash_node``)."""

    __slots__ = ("n_children", "n_views", "buffer_id", "chunk", "offset", "allocated", "block")

    def __init__(self) -> None:
        self.n_children = 0
        self.n_views = 0
        self.buffer_id = 0
        self.chunk = 0
        self.offset = 0
        self.allocated = False
        self.block: _Block | None = None


class _Block:
    """One planned allocation's lifetime, for the ``compact`` policy: ``size`` padded bytes live
    from event ``start`` to event ``end`` (None: never freed); ``members`` are the hash nodes
    placed in it (the tensor and its in-place heirs)."""

    __slots__ = ("size", "start", "end", "members", "offset")

    def __init__(self, size: int, start: int, hn: _HashNode) -> None:
        self.size = size
        self.start = start
        self.end: int | None = None
        self.members = [hn]
        self.offset = 0


def _compact_layout(blocks: list[_Block]) -> int:
    """Offline placement of ``blocks``: largest first, each at the lowest offset free of every
    already placed block whose lifetime overlaps; sets ``block.offset``; returns the peak bytes."""
    placed: list[_Block] = []
    peak = 0
    for b in sorted(blocks, key=lambda x: (-x.size, x.start)):
        b_end = _UNBOUNDED if b.end is None else b.end
        busy = sorted((p for p in placed
                       if p.start < b_end and b.start < (_UNBOUNDED if p.end is None else p.end)),
                      key=lambda x: x.offset)
        off = 0
        for p in busy:
            if off + b.size <= p.offset:
                break
            off = max(off, p.offset + p.size)
        b.offset = off
        placed.append(b)
        peak = max(peak, off + b.size)
    return peak


@dataclass(frozen=True, slots=True)
class _Rec:
    """A recorded placement (mirrors ggml-alloc's ``struct tensor_alloc``); ``buffer_id < 0`` = invalid."""

    buffer_id: int
    chunk: int
    offset: int
    size_max: int


_INVALID = _Rec(-1, -1, -1, 0)


class GraphAllocator:
    """Plans and places a compute graph's tensors in compute buffers (mirrors ``ggml_gallocr``).

    ``GraphAllocator(buft)`` mirrors ``ggml_gallocr_new`` (one buffer); ``GraphAllocator.new_n(bufts)``
    mirrors ``ggml_gallocr_new_n`` (buffer ``i`` of type ``bufts[i]``; entries with the same buffer
    type, compared by identity, share one planner and one set of backend buffers).

    Planning (ggml's ``ggml_gallocr_alloc_graph_impl``): leafs first, then graph inputs
    (``Flag.INPUT``) before any intermediate, then nodes in order; each tensor is freed after its
    last consumer (``Flag.OUTPUT`` tensors never are), views are folded into their ``view_src``, and
    nodes of :data:`~ggmlpy.core.opcodes.INPLACE_CAPABLE_OPS` reuse a source's memory under ggml's exact
    conditions. Sources are read with ``graph.node_srcs(node)``. Memory is one backend buffer per
    planned chunk, allocated with ``buft.alloc_buffer`` and marked ``BufferUsage.COMPUTE``.

    Tensors the allocator places are *owned* (see the module docstring): they are reset and placed
    again by every :meth:`alloc_graph`; weights and user-allocated tensors are never touched.

    Args:
        buft / bufts: the compute buffer type(s).
        policy: ``"ggml"`` (default) places tensors exactly as ggml-alloc does (offsets identical
            to upstream's). ``"compact"`` keeps the same lifetimes and in-place decisions but
            re-places the blocks offline, largest first at the lowest offset free over their
            lifetime, and keeps that layout when it needs fewer bytes; it applies to single-chunk
            plans (no ``max_size`` split) and costs O(blocks^2) planning time.

    Raises:
        TypeError: a buffer type is not a :class:`~ggmlpy.backend.interface.BufferType`.
        ValueError: ``new_n`` got no buffer types, an alignment is not a power of two, or an
            unknown ``policy``.
    """

    @checked_args
    def __init__(self, buft: BufferType, policy: str = "ggml") -> None:
        self._init([buft], policy)

    @classmethod
    @checked_args
    def new_n(cls, bufts: Sequence[BufferType], policy: str = "ggml") -> GraphAllocator:
        """A graph allocator with one buffer per entry of ``bufts`` (mirrors ``ggml_gallocr_new_n``)."""
        self = cls.__new__(cls)
        self._init(list(bufts), policy)
        return self

    def _init(self, bufts: list[BufferType], policy: str = "ggml") -> None:
        if policy not in POLICIES:
            raise ValueError(f"GraphAllocator: policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self._event = 0
        self._blocks: list[list[_Block]] = []
        if not bufts:
            raise ValueError("GraphAllocator: at least one buffer type is needed")
        self.bufts: list[BufferType] = []
        self._talloc_of: list[int] = []     # buffer id -> planner index
        self._tallocs: list[_DynAllocator] = []
        for i, buft in enumerate(bufts):
            if not isinstance(buft, BufferType):
                raise TypeError(f"GraphAllocator: buffer type {i} is a {type(buft).__name__}, "
                                "not a BufferType")
            self.bufts.append(buft)
            for j in range(i):
                if bufts[j] is buft:
                    self._talloc_of.append(self._talloc_of[j])
                    break
            else:
                align = buft.get_alignment()
                if align <= 0 or align & (align - 1):
                    raise ValueError(f"GraphAllocator: alignment {align} of {buft.name} is not a "
                                     "power of two")
                self._talloc_of.append(len(self._tallocs))
                self._tallocs.append(_DynAllocator(align, buft.get_max_size()))
        # per planner: the chunk buffers (None = no buffer; [] = a plan with no chunk)
        self._vbuffers: list[list[Buffer] | None] = [None] * len(self._tallocs)
        self._multi: list[MultiBuffer | None] = [None] * len(self._tallocs)
        self._hash: dict[int, _HashNode] = {}
        self._node_recs: list[tuple[_Rec, list[_Rec]]] = []
        self._leaf_recs: list[_Rec] = []
        self._n_nodes = 0
        self._n_leafs = 0
        # what the recorded plan read from its graph (wiring, flags, ne/nb, views, placements of
        # tensors not owned here), taken with the graph's owned tensors reset: None = no plan
        self._snap: Snapshot | None = None
        self._vouched: Graph | None = None  # see _vouch
        self._vouched_slot = False          # ... for another copy slot's graph
        self._ids: tuple[list[int] | None, list[int] | None] = (None, None)  # of the plan
        # (graph, generation) right after the last alloc_graph placed it (the fast path)
        self._last_placed: tuple[weakref.ref, int] | None = None
        # id(tensor) -> (tensor, buffer, offset) of every tensor this allocator placed
        self._placed: dict[int, tuple[Tensor, Buffer, int]] = {}

    @property
    def n_buffers(self) -> int:
        """Number of buffer ids (the length of the list given to ``new_n``)."""
        return len(self.bufts)

    # -- ownership -----------------------------------------------------------------------------
    def _owns(self, t: Tensor) -> bool:
        rec = self._placed.get(id(t))
        return (rec is not None and rec[0] is t and t._buffer is rec[1]
                and t._offset == rec[2])

    def _has_data(self, t: Tensor) -> bool:
        """ggml's ``t->data || t->buffer``, with owned tensors counted as unallocated."""
        return (t._buffer is not None or t._offset is not None) and not self._owns(t)

    def _record_placed(self, t: Tensor) -> None:
        self._placed[id(t)] = (t, t._buffer, t._offset)  # type: ignore[assignment]

    def _reset_owned(self, buffers: set[int] | None = None, tensors: set[int] | None = None) -> None:
        """Reset every owned tensor (or those whose buffer is in ``buffers``, a set of ids, or
        which are in ``tensors``, a set of tensor ids)."""
        keep: dict[int, tuple[Tensor, Buffer, int]] = {}
        for key, (t, buf, off) in self._placed.items():
            if t._buffer is not buf or t._offset != off:
                continue  # someone else re-placed it: not ours any more
            if ((buffers is not None and id(buf) not in buffers)
                    or (tensors is not None and key not in tensors)):
                keep[key] = (t, buf, off)
                continue
            t.buffer = None
            t.offset = None
        self._placed = keep

    def _reset_graph(self, graph: Graph, only_graph: bool = False) -> None:
        """Reset owned tensors, and views in ``graph`` whose memory is not (or will not stay)
        their ``view_src``'s — views of owned tensors (auto-initialised at creation by
        ``Context``) and views whose source was moved or un-placed since (e.g. by
        ``Scheduler.reset``) — before placing ``graph`` afresh. With ``only_graph`` (used when
        planning) owned tensors outside ``graph`` keep their placement."""
        stale: list[Tensor] = []
        self._reset_views(graph, stale)
        seen = None
        if only_graph:
            seen = {id(t) for t in graph.leafs}
            for node in graph.nodes:
                seen.add(id(node))
                seen.update(id(s) for s in graph.node_srcs(node) if s is not None)
        self._reset_owned(tensors=seen)
        for t in stale:
            t.buffer = None
            t.offset = None

    def _reset_views(self, graph: Graph, stale: list[Tensor]) -> None:
        """:meth:`_reset_graph`'s walk (the hot path of every fresh allocation): appends to ``stale`` every placed view of ``graph`` (leaf, node or source)
        that is not owned here and whose memory is not its ``view_src``'s, or whose ``view_src``
        is owned here. Only views are examined (a tensor may be appended twice: harmless)."""
        owns = self._owns

        def check(t: Tensor) -> None:
            vs = t.view_src
            if owns(t):
                return
            if (vs._buffer is not t._buffer or vs._offset is None
                    or t._offset != vs._offset + t.view_offs or owns(vs)):
                stale.append(t)

        for t in graph._leafs:
            if t.view_src is not None and t._buffer is not None:
                check(t)
        smap = graph._src_map
        smap_get = smap.get if smap is not None else None
        for n in graph._nodes:
            if n.view_src is not None and n._buffer is not None:
                check(n)
            for t in (n.src if smap_get is None else smap_get(id(n), n.src)):
                if t is not None and t.view_src is not None and t._buffer is not None:
                    check(t)

    # -- planning ------------------------------------------------------------------------------
    def _hn(self, t: Tensor) -> _HashNode:
        hn = self._hash.get(id(t))
        if hn is None:
            hn = self._hash[id(t)] = _HashNode()
        return hn

    def _alloc_size(self, buffer_id: int, t: Tensor) -> int:
        return self.bufts[buffer_id].get_alloc_size(t)

    def _is_allocated(self, t: Tensor) -> bool:
        hn = self._hash.get(id(t))
        return self._has_data(t) or (hn is not None and hn.allocated)

    def _free_extra_space(self, node: Tensor, parent: Tensor) -> None:
        # mirrors ggml_gallocr_free_extra_space: give back the parent's tail beyond the node's size
        hn, p_hn = self._hn(node), self._hn(parent)
        parent_size = self._alloc_size(p_hn.buffer_id, parent)
        node_size = self._alloc_size(hn.buffer_id, node)
        if parent_size < node_size:
            raise RuntimeError(f"in-place reuse: parent '{parent.name}' ({parent_size} bytes) is "
                               f"smaller than node '{node.name}' ({node_size} bytes)")
        talloc = self._tallocs[self._talloc_of[p_hn.buffer_id]]
        parent_size = _pad(parent_size, talloc.alignment)
        node_size = _pad(node_size, talloc.alignment)
        if parent_size > node_size:
            talloc.free(p_hn.chunk, p_hn.offset + node_size, parent_size - node_size)

    def _allocate_node(self, graph: Graph, node: Tensor, buffer_id: int) -> None:
        # mirrors ggml_gallocr_allocate_node
        if self._is_allocated(node) or node.view_src is not None:
            return
        hn = self._hn(node)
        hn.allocated = True
        if node.op in INPLACE_CAPABLE_OPS:
            for parent in graph.node_srcs(node):
                if parent is None:
                    continue
                p_hn = self._hash.get(id(parent))
                if p_hn is None or not p_hn.allocated or self._has_data(parent):
                    continue  # not owned in this pass (external data, weights, freed, handed on)
                vs = parent.view_src
                flags = graph.tensor_flags
                if flags(parent) & Flag.OUTPUT or (vs is not None and flags(vs) & Flag.OUTPUT):
                    continue
                if not node.are_same_layout(parent):
                    continue
                if p_hn.n_children == 1 and p_hn.n_views == 0:
                    if vs is not None:
                        # ggml's reuse-through-a-view branch; unreachable since views are never owned
                        vs_hn = self._hn(vs)
                        if (vs_hn.n_views == 1 and vs_hn.n_children == 0
                                and parent.view_offs == 0):
                            hn.buffer_id, hn.chunk, hn.offset = p_hn.buffer_id, p_hn.chunk, p_hn.offset
                            p_hn.allocated = False
                            vs_hn.allocated = False
                            self._free_extra_space(node, vs)
                            return
                    else:
                        hn.buffer_id, hn.chunk, hn.offset = p_hn.buffer_id, p_hn.chunk, p_hn.offset
                        p_hn.allocated = False  # the parent is not freed: the node owns it now
                        self._free_extra_space(node, parent)
                        if p_hn.block is not None:
                            hn.block = p_hn.block
                            hn.block.members.append(hn)
                        return
        k = self._talloc_of[buffer_id]
        talloc = self._tallocs[k]
        size = self._alloc_size(buffer_id, node)
        hn.chunk, hn.offset = talloc.alloc(size)
        hn.buffer_id = buffer_id
        if self.policy == "compact":
            hn.block = _Block(_pad(size, talloc.alignment), self._event, hn)
            self._blocks[k].append(hn.block)
            self._event += 1

    def _free_node(self, graph: Graph, node: Tensor) -> None:
        # mirrors ggml_gallocr_free_node: outputs are never freed
        if graph.tensor_flags(node) & Flag.OUTPUT:
            return
        hn = self._hn(node)
        talloc = self._tallocs[self._talloc_of[hn.buffer_id]]
        talloc.free(hn.chunk, hn.offset, self._alloc_size(hn.buffer_id, node))
        hn.allocated = False
        if hn.block is not None:
            hn.block.end = self._event
            self._event += 1

    def _plan(self, graph: Graph, node_ids: Sequence[int] | None,
              leaf_ids: Sequence[int] | None) -> None:
        # mirrors ggml_gallocr_alloc_graph_impl
        self._hash = {}
        node_srcs = graph.node_srcs
        for i, leaf in enumerate(graph.leafs):
            self._allocate_node(graph, leaf, leaf_ids[i] if leaf_ids is not None else 0)

        # count children and views; allocate graph inputs before anything else
        for i, node in enumerate(graph.nodes):
            bid = node_ids[i] if node_ids is not None else 0
            if node.view_src is not None and node.op != Op.NONE:
                self._hn(node.view_src).n_views += 1
            if graph.tensor_flags(node) & Flag.INPUT:
                self._allocate_node(graph, node, bid)
            for src in node_srcs(node):
                if src is None:
                    continue
                self._hn(src).n_children += 1
                if graph.tensor_flags(src) & Flag.INPUT:
                    self._allocate_node(graph, src, bid)

        for i, node in enumerate(graph.nodes):
            bid = node_ids[i] if node_ids is not None else 0
            srcs = node_srcs(node)
            for parent in srcs:
                if parent is not None:
                    self._allocate_node(graph, parent, bid)
            self._allocate_node(graph, node, bid)
            for parent in srcs:
                if parent is None:
                    continue
                p_hn = self._hn(parent)
                p_hn.n_children -= 1
                if p_hn.n_children == 0 and p_hn.n_views == 0:
                    vs = parent.view_src
                    if vs is not None:
                        vs_hn = self._hn(vs)
                        vs_hn.n_views -= 1
                        if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                            self._free_node(graph, vs)
                    elif p_hn.allocated:
                        self._free_node(graph, parent)

    def _compact(self) -> None:
        """The ``compact`` policy: re-place each single-chunk plan offline (largest block first at
        the lowest offset free over its lifetime) and keep it when it is smaller than ggml's."""
        for k, talloc in enumerate(self._tallocs):
            if len(talloc.chunks) != 1 or not self._blocks[k]:
                continue  # several chunks (a max_size): keep ggml's chunked plan
            peak = _compact_layout(self._blocks[k])
            chunk = talloc.chunks[0]
            if peak >= chunk.max_size or peak > talloc.max_chunk_size:
                continue
            for b in self._blocks[k]:
                for hn in b.members:
                    hn.offset = b.offset
            chunk.max_size = peak

    def _rec_of(self, t: Tensor | None) -> _Rec:
        if t is None or t.view_src is not None or self._has_data(t):
            return _INVALID
        hn = self._hn(t)
        return _Rec(hn.buffer_id, hn.chunk, hn.offset, self._alloc_size(hn.buffer_id, t))

    def _check_ids(self, graph: Graph, node_ids: Sequence[int] | None,
                   leaf_ids: Sequence[int] | None) -> tuple[list[int] | None, list[int] | None]:
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphAllocator: expected a Graph, got {type(graph).__name__}")
        out = []
        for what, ids, n in (("node_buffer_ids", node_ids, graph.n_nodes),
                             ("leaf_buffer_ids", leaf_ids, graph.n_leafs)):
            if ids is None:
                out.append(None)
                continue
            ids = [int(x) for x in ids]
            if len(ids) < n:
                raise ValueError(f"GraphAllocator: {what} has {len(ids)} entries for {n} "
                                 f"{what.split('_')[0]}s")
            ids = ids[:n]
            for k, b in enumerate(ids):
                if not 0 <= b < len(self.bufts):
                    raise IndexError(f"GraphAllocator: {what}[{k}] = {b} is not a buffer id "
                                     f"(0..{len(self.bufts) - 1})")
            out.append(ids)
        return out[0], out[1]

    def _reserve_impl(self, graph: Graph, node_ids: Sequence[int] | None,
                      leaf_ids: Sequence[int] | None, no_alloc: bool) -> bool:
        # mirrors ggml_gallocr_reserve_n_impl
        node_ids, leaf_ids = self._check_ids(graph, node_ids, leaf_ids)
        # the graph's owned tensors are planned as unallocated and placed afresh by alloc_graph:
        # un-place them now so the snapshot below records the state alloc_graph will compare
        self._reset_graph(graph, only_graph=True)
        self._snap = None
        self._last_placed = None
        for talloc in self._tallocs:
            talloc.reset()
        self._event = 0
        self._blocks = [[] for _ in self._tallocs]
        self._ids = (node_ids, leaf_ids)
        self._plan(graph, node_ids, leaf_ids)
        if self.policy == "compact":
            self._compact()

        node_srcs = graph.node_srcs
        self._node_recs = [(self._rec_of(node), [self._rec_of(s) for s in node_srcs(node)])
                           for node in graph.nodes]
        self._leaf_recs = [self._rec_of(leaf) for leaf in graph.leafs]
        self._n_nodes, self._n_leafs = graph.n_nodes, graph.n_leafs
        self._hash = {}
        snap_ok = True

        # (re)allocate the buffers that must grow, once per distinct buffer type
        for k, talloc in enumerate(self._tallocs):
            cur = self._vbuffers[k]
            realloc = cur is None
            for c in range(len(talloc.chunks)):
                cur_size = cur[c].size if cur is not None and c < len(cur) else 0
                if talloc.chunk_max_size(c) > cur_size:
                    realloc = True
            if not realloc:
                continue
            buft = self.bufts[self._talloc_of.index(k)]
            cur_total = sum(b.size for b in cur) if cur else 0
            log.debug("GraphAllocator: reallocating %s buffer from %d to %d bytes",
                      buft.name, cur_total, talloc.total_size)
            self._free_vbuffer(k)
            if no_alloc:
                continue
            chunks: list[Buffer] = []
            try:
                for c in talloc.chunks:
                    buf = buft.alloc_buffer(c.max_size)
                    buf.set_usage(BufferUsage.COMPUTE)
                    chunks.append(buf)
            except OutOfMemoryError as e:
                for b in chunks:
                    b.free()
                log.error("GraphAllocator: failed to allocate %s buffer of %d bytes in %d "
                          "chunk(s) %s: %s", buft.name, talloc.total_size, len(talloc.chunks),
                          [c.max_size for c in talloc.chunks], e)
                snap_ok = False
                break
            self._vbuffers[k] = chunks
        # taken last: freeing buffers above may have un-placed owned tensors of the graph
        self._snap = Snapshot.take(graph)
        return snap_ok

    def _free_vbuffer(self, k: int) -> None:
        cur = self._vbuffers[k]
        if cur is None:
            return
        self._reset_owned({id(b) for b in cur})
        for b in cur:
            b.free()
        self._vbuffers[k] = None
        self._multi[k] = None

    # -- public API ----------------------------------------------------------------------------
    @checked_args
    def reserve(self, graph: Graph) -> bool:
        """Plan ``graph`` with every tensor in buffer 0 and grow the buffers to fit
        (mirrors ``ggml_gallocr_reserve``); see :meth:`reserve_n`."""
        return self.reserve_n(graph, None, None)

    @checked_args
    def reserve_n(self, graph: Graph, node_buffer_ids: Sequence[int] | None,
                  leaf_buffer_ids: Sequence[int] | None) -> bool:
        """Plan ``graph`` and (re)allocate every buffer that must grow (mirrors ``ggml_gallocr_reserve_n``).

        The graph's tensors are not placed (that is :meth:`alloc_graph`). A buffer that must grow
        is freed first (owned tensors in it are reset) and allocated again at the new size; a
        buffer is allocated even when its plan is empty. Buffers only grow.

        Args:
            graph: the graph to plan.
            node_buffer_ids: buffer id of each of ``graph.nodes`` (None: all 0).
            leaf_buffer_ids: buffer id of each of ``graph.leafs`` (None: all 0).

        Returns:
            True on success. False when a backend buffer could not be allocated
            (``OutOfMemoryError`` from ``buft.alloc_buffer``; logged on logger ``ggmlpy.alloc.tallocr``);
            that buffer is then left empty and a later, smaller reserve can still succeed.

        Raises:
            TypeError: ``graph`` is not a Graph. ValueError/IndexError: an id list is shorter than
            the graph's nodes/leafs or holds an id outside ``0..n_buffers-1``.
        """
        return self._reserve_impl(graph, node_buffer_ids, leaf_buffer_ids, no_alloc=False)

    @checked_args
    def reserve_n_size(self, graph: Graph, node_buffer_ids: Sequence[int] | None,
                       leaf_buffer_ids: Sequence[int] | None) -> list[int]:
        """Plan only, and return the bytes each buffer would need (mirrors ``ggml_gallocr_reserve_n_size``).

        Allocates nothing. As in ggml, the recorded plan is replaced by this one and every buffer
        that would have to grow is freed (owned tensors in it are reset), so follow with a real
        :meth:`reserve_n` before :meth:`alloc_graph`.

        Returns:
            ``sizes[i]``: the sum of buffer ``i``'s planned chunk sizes in bytes, or 0 when buffer
            ``i`` shares its buffer type with an earlier id (as :meth:`get_buffer_size`; ggml repeats
            the shared total there).

        Raises:
            as :meth:`reserve_n`.
        """
        self._reserve_impl(graph, node_buffer_ids, leaf_buffer_ids, no_alloc=True)
        sizes = []
        for i in range(len(self.bufts)):
            k = self._talloc_of[i]
            shared = k in self._talloc_of[:i]
            sizes.append(0 if shared else self._tallocs[k].total_size)
        return sizes

    def _needs_realloc(self, graph: Graph, vouched: bool = False) -> bool:
        # mirrors ggml_gallocr_needs_realloc, plus: every planned buffer must exist and be big
        # enough, and the graph must still be what the plan read (ggmlpy.core.snapshot: the wiring
        # -- which tensor feeds which node --, flags, ne/nb, views and foreign placements; ggml
        # compares sizes only, so a same-sized graph with other edges reused stale offsets)
        if self._n_nodes != graph.n_nodes or self._n_leafs != graph.n_leafs:
            return True
        for k, talloc in enumerate(self._tallocs):
            cur = self._vbuffers[k]
            if cur is None or len(cur) < len(talloc.chunks):
                return True
            if any(cur[c].size < ch.max_size for c, ch in enumerate(talloc.chunks)):
                return True
        # when the snapshot matches, every tensor has the state the records were made from
        # (type, ne, nb, view_src, which tensors have foreign memory), so ggml's per-tensor
        # checks (ggml_gallocr_node_needs_realloc: sizes within the planned sizes, memory as
        # when planned) cannot fail; they are not repeated (they cost as much as the compare)
        snap = self._snap
        if snap is not None and vouched:
            if VERIFY_VOUCH:
                ok = self._same_plan(graph) if self._vouched_slot else snap.matches(graph)
                if not ok:
                    raise RuntimeError("GraphAllocator: a vouched graph does not match the plan")
            return False
        return snap is None or not snap.matches(graph)

    def _vouch(self, graph: Graph, other_slot: bool = False) -> None:
        """The caller (the scheduler, which built ``graph``) vouches that ``graph`` has the state
        the current plan was validated for (``Scheduler._alloc_slow``: same user-graph state and
        split signature as the last allocation): the next :meth:`alloc_graph` of ``graph`` skips
        the snapshot compare (counts and buffers are still checked). One-shot; with
        :data:`VERIFY_VOUCH` the compare runs anyway and a mismatch raises RuntimeError.

        ``other_slot``: ``graph`` is the scheduler graph of the same split for another copy slot
        (its state differs from the planned one only in which copy of each split input is
        current; every copy is a leaf that lives through the whole graph, so a fresh plan of
        ``graph`` equals the current one, position by position). With :data:`VERIFY_VOUCH` that
        is checked by planning ``graph`` aside (:meth:`_same_plan`)."""
        self._vouched = graph
        self._vouched_slot = other_slot

    def _same_plan(self, graph: Graph) -> bool:
        """Whether placing ``graph`` with the current plan puts every tensor where a fresh plan
        of ``graph`` (made aside with the current plan's buffer ids, allocating nothing) would,
        with the same chunk sizes (the check behind a vouch for another copy slot). Records a
        tensor never uses (it was placed earlier in the walk, e.g. a copy that is both a leaf
        and a node) do not count."""
        aside = GraphAllocator.new_n(self.bufts, policy=self.policy)
        node_ids, leaf_ids = self._ids
        aside._reserve_impl(graph, node_ids, leaf_ids, no_alloc=True)
        return (aside._addresses(graph) == self._addresses(graph)
                and [[c.max_size for c in t.chunks] for t in aside._tallocs]
                == [[c.max_size for c in t.chunks] for t in self._tallocs])

    def _addresses(self, graph: Graph) -> dict[int, tuple[int, int, int]]:
        """``id(tensor) -> (buffer id, chunk, offset)`` that :meth:`_place_all` would give each
        unplaced, non-view tensor of ``graph`` with the current records (first record met in
        its walk wins: later ones are skipped there too)."""
        out: dict[int, tuple[int, int, int]] = {}

        def note(t: Tensor | None, rec: _Rec) -> None:
            if (t is None or t.view_src is not None or t._buffer is not None
                    or id(t) in out or rec.buffer_id < 0):
                return
            out[id(t)] = (rec.buffer_id, rec.chunk, rec.offset)
        for leaf, rec in zip(graph._leafs, self._leaf_recs):
            note(leaf, rec)
        for node, (dst_rec, src_recs) in zip(graph._nodes, self._node_recs):
            for src, rec in zip(graph.node_srcs(node), src_recs):
                note(src, rec)
            note(node, dst_rec)
        return out

    @checked_args
    def alloc_graph(self, graph: Graph) -> bool:
        """Place every tensor of ``graph`` at its planned address (mirrors ``ggml_gallocr_alloc_graph``).

        First resets the tensors this allocator placed before (and views in ``graph`` of them).
        Then, if the graph no longer matches the recorded plan (other node/leaf counts, a tensor
        that grew past its planned size, a tensor that had memory when planned and has none now,
        or a missing buffer): with one buffer id it re-plans by itself (:meth:`reserve`), with
        several it returns False and the caller must call :meth:`reserve_n` with the ids and then
        this again. Then every buffer is ``reset()`` and leafs, then each node's sources and the
        node, are placed with ``tensor_alloc`` (views with ``view_init``). Tensors that already
        have memory (weights, user inputs) are left alone.

        Returns:
            True when the graph is placed; False when a re-plan is needed (several buffers) or the
            automatic re-plan failed to allocate memory.

        Raises:
            TypeError: ``graph`` is not a Graph.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"alloc_graph: expected a Graph, got {type(graph).__name__}")
        # fast path: the same graph as the last placement and no mutation anywhere since (the
        # process-wide generation did not move): the plan is still valid, skip every check
        last = self._last_placed
        unchanged = (last is not None and last[0]() is graph
                     and last[1] == _snapshot.generation())
        vouched = self._vouched is graph
        self._vouched = None
        self._reset_graph(graph)
        if not unchanged and self._needs_realloc(graph, vouched):
            if len(self.bufts) == 1:
                log.debug("GraphAllocator: graph changed, re-planning")
                if not self.reserve(graph):
                    return False
            else:
                log.debug("GraphAllocator: graph changed and there are several buffers; "
                          "the caller must reserve_n again")
                return False
        for cur in self._vbuffers:
            for b in cur or ():
                b.reset()
        self._place_all(graph)
        self._last_placed = (weakref.ref(graph), _snapshot.generation())
        return True

    def _place_all(self, graph: Graph) -> None:
        """Place every leaf, then each node's sources and the node, at their recorded addresses
        (ggml's ``ggml_gallocr_init_tensor`` over the graph, ``tensor_alloc``/``view_init``
        inline: the hot loop of every fresh allocation). The plan was validated by
        :meth:`_needs_realloc` (every planned chunk exists and is large enough, every tensor has
        the state it was planned with), so ``tensor_alloc``'s bounds check cannot fail and is
        skipped. All placements are stamped with one generation (one bump for the whole graph,
        not two per tensor)."""
        gen = _snapshot.bump()
        set_buffer, set_offset, set_ver = _SET_BUFFER, _SET_OFFSET, _SET_VER
        placed = self._placed
        vbufs = [self._vbuffers[k] for k in self._talloc_of]  # per buffer id
        # chunk buffers whose init_tensor is Buffer's (a no-op): not called for their tensors
        noop = {id(b) for cur in vbufs for b in cur or () if _init_is_noop(b)}

        def init(t: Tensor, rec: _Rec) -> None:
            vs = t.view_src
            if vs is not None:
                if t._buffer is not None or vs._buffer is None:
                    return  # placed, or its memory is not managed by a backend buffer (yet)
                if vs._offset is None:
                    raise NotAllocatedError(f"view_init: view '{t.name}' of unallocated "
                                            f"tensor '{vs.name}'")
                buf, off = vs._buffer, vs._offset + t.view_offs
            elif t._buffer is None and t._offset is None:
                if rec.buffer_id < 0:
                    # a leaf that had memory when planned and is consumed by no node (ggml
                    # does not check those either); leave it unallocated
                    log.debug("GraphAllocator: leaf '%s' has no planned address; left "
                              "unallocated", t.name)
                    return
                buf, off = vbufs[rec.buffer_id][rec.chunk], rec.offset  # type: ignore[index]
            else:
                return
            set_buffer(t, buf)
            set_offset(t, off)
            if t._ver >= 0:
                set_ver(t, gen)
            if id(buf) not in noop:
                buf.init_tensor(t)
            placed[id(t)] = (t, buf, off)

        # (a tensor with a buffer is placed: init would return at once, so it is not called)
        for leaf, rec in zip(graph._leafs, self._leaf_recs):
            if leaf._buffer is None:
                init(leaf, rec)
        smap = graph._src_map
        smap_get = smap.get if smap is not None else None
        for node, (dst_rec, src_recs) in zip(graph._nodes, self._node_recs):
            srcs = node.src if smap_get is None else smap_get(id(node), node.src)
            for src, rec in zip(srcs, src_recs):
                if src is not None and src._buffer is None:
                    init(src, rec)
            if node._buffer is None:
                if node.view_src is None and node._offset is None and dst_rec.buffer_id >= 0:
                    # (init written out for the common case: a computed tensor)
                    buf, off = vbufs[dst_rec.buffer_id][dst_rec.chunk], dst_rec.offset
                    set_buffer(node, buf)
                    set_offset(node, off)
                    if node._ver >= 0:
                        set_ver(node, gen)
                    if id(buf) not in noop:
                        buf.init_tensor(node)
                    placed[id(node)] = (node, buf, off)
                else:
                    init(node, dst_rec)

    def placement(self) -> list[tuple[Tensor, Buffer, int]]:
        """``[(tensor, buffer, offset_bytes)]`` of every tensor this allocator placed and still
        owns (after :meth:`alloc_graph`: exactly the tensors it placed, in placement order).
        Tensors another party re-placed or un-placed since are left out."""
        return [r for r in self._placed.values() if r[0]._buffer is r[1] and r[0]._offset == r[2]]

    @checked_args
    def get_buffer_size(self, buffer_id: int) -> int:
        """Bytes of buffer ``buffer_id`` (sum of its chunks; mirrors ``ggml_gallocr_get_buffer_size``).

        0 when it has no memory yet or shares its buffer type with an earlier id (counted there).

        Raises:
            IndexError: ``buffer_id`` outside ``0..n_buffers-1``.
        """
        self._check_id(buffer_id)
        k = self._talloc_of[buffer_id]
        cur = self._vbuffers[k]
        if cur is None or k in self._talloc_of[:buffer_id]:
            return 0
        return sum(b.size for b in cur)

    @checked_args
    def get_buffer(self, buffer_id: int) -> Buffer | None:
        """The memory of buffer ``buffer_id``: its single chunk buffer, a
        :class:`~ggmlpy.backend.buffers.MultiBuffer` over its chunks when there are several (the same
        object until the buffers change), or None when it has no memory. Ids sharing a buffer
        type return the same object. The allocator owns it: do not free it.

        Raises:
            IndexError: ``buffer_id`` outside ``0..n_buffers-1``.
        """
        self._check_id(buffer_id)
        k = self._talloc_of[buffer_id]
        cur = self._vbuffers[k]
        if not cur:
            return None
        if len(cur) == 1:
            return cur[0]
        if self._multi[k] is None:
            self._multi[k] = MultiBuffer(cur)
            self._multi[k].usage = BufferUsage.COMPUTE
        return self._multi[k]

    @checked_args
    def get_chunk_buffers(self, buffer_id: int) -> list[Buffer]:
        """The backend buffers (one per planned chunk) of buffer ``buffer_id``; empty when none.

        Raises:
            IndexError: ``buffer_id`` outside ``0..n_buffers-1``.
        """
        self._check_id(buffer_id)
        return list(self._vbuffers[self._talloc_of[buffer_id]] or ())

    def _check_id(self, buffer_id: int) -> None:
        if not 0 <= buffer_id < len(self.bufts):
            raise IndexError(f"GraphAllocator: buffer id {buffer_id} outside 0..{len(self.bufts) - 1}")

    def free(self) -> None:
        """Free every buffer once, resetting the tensors placed in them (mirrors ``ggml_gallocr_free``).

        Idempotent. The allocator stays usable: a later reserve allocates new buffers.
        """
        for k in range(len(self._tallocs)):
            self._free_vbuffer(k)
        self._reset_owned()
        self._node_recs, self._leaf_recs = [], []
        self._n_nodes = self._n_leafs = 0
        self._snap = None
        self._last_placed = None

    def __repr__(self) -> str:
        sizes = [self.get_buffer_size(i) for i in range(len(self.bufts))]
        names = [b.name for b in self.bufts]
        return f"<GraphAllocator {names} sizes={sizes}>"
