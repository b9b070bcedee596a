"""Compute plans: a graph resolved once into a list of ready-to-run kernel calls (ggml's ``graph_plan``).

Building a plan resolves, for every node, the kernel, the array views of the destination and
sources over their buffers' memory and the op's parameters. Running it is then a loop of
zero-argument calls. Plans are cached per graph and reused while everything they read is unchanged
(:mod:`ggmlpy.core.snapshot`: O(1) when no mutation happened in the process, else one compare of a
compact per-tensor state).

Graph replay (ggml-cuda's CUDA graphs): :func:`launch_plan` runs a plan eagerly the first time
(a warm-up: kernels compile, libraries create their handles), captures it into one replayable
graph the second time (:meth:`Runtime.graph_capture`: a ``cupy.cuda.Graph`` on CUDA, a recorded
launch list on SIM) and from then on replays the graph with one launch. The captured graph
belongs to the :class:`Plan` object, and a plan is only reused while the plan cache's validity
rule holds, so any change that rule detects (other nodes, other placement, freed buffers, ...)
yields a new plan and therefore a new capture. A plan whose capture fails (its kernels
synchronize with the host, an op CuPy cannot capture) is marked and always runs eagerly.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backend.interface import Buffer, BufferUsage, Device, tensor_buffer
from ggmlpy.backend.write_gen import buffer_written, wait_host_reads_ranges
from ggmlpy.backends import kernels
from ggmlpy.backends.cpu import variants as cpu_variants
from ggmlpy.core import snapshot as _snapshot
from ggmlpy.core.errors import NotAllocatedError, UnsupportedOpError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.snapshot import Snapshot
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type
from ggmlpy.sched.assign import node_key

__all__ = ["Plan", "check_buffers_live", "build_plan", "PlanCache", "ReplayStats", "launch_plan"]

Step = Callable[[], None]


class Plan:
    """A compiled graph: ``steps[i]`` runs one node's kernel; ``nodes[i]`` is that node (a CPU
    step fused from several row-aligned nodes, :func:`ggmlpy.backends.cpu.threads.fuse_chains`,
    runs them all; ``nodes[i]`` is then the last of them).

    Attributes:
        steps: zero-argument callables, in graph order (view and NONE nodes are left out).
        nodes: the node each step computes.
        buffers: the distinct buffers the steps read or write.
        dsts: every node a step writes, in graph order (``nodes`` as built, before a CPU plan
            fuses steps): the destinations :meth:`wait_host_reads` guards.
    """

    __slots__ = ("steps", "nodes", "buffers", "runs", "graph", "capture_failed", "checks",
                 "written", "threaded", "dsts", "_write_ranges", "__weakref__")

    def __init__(self, steps: list[Step], nodes: list[Tensor], buffers: list[Buffer] | None = None) -> None:
        self.steps = steps
        self.nodes = nodes
        self.buffers = buffers or []
        #: launches of this plan so far (eager or replayed)
        self.runs = 0
        #: the runtime's captured graph of :attr:`steps` (None until captured)
        self.graph: Any = None
        #: True once a capture failed: the plan then always runs eagerly
        self.capture_failed = False
        #: device-side checks (a step's ``check`` attribute, kernels/bounds.py): zero-argument
        #: callables a device backend runs after the synchronize that follows a launch; each
        #: raises ComputeError for a fault its step flagged on the device
        self.checks: list[Callable[[], None]] = [c for c in (getattr(s, "check", None)
                                                             for s in steps) if c is not None]
        #: buffers (not of usage COMPUTE) the steps write: :meth:`run` gives each a new write
        #: generation when it returns (:func:`ggmlpy.backend.interface.buffer_written`), which is what
        #: keeps converted weight copies (kernels/weight_cache.py) from going stale
        self.written: list[Buffer] = []
        #: CPU: some steps run on the backend's worker threads (cpu_threads.Split), so BLAS is
        #: held at one thread while the plan runs; set by the backend at build time
        self.threaded = False
        self.dsts: list[Tensor] = nodes
        self._write_ranges: dict[int, tuple[Buffer, list[int], list[int]]] | None = None

    def wait_host_reads(self) -> None:
        """Block until no queued copy still reads host memory this plan's steps are about to
        write (:func:`ggmlpy.backend.write_gen.wait_host_reads_ranges`; the host-read rule of
        :mod:`ggmlpy.backend.write_gen`). Backends that run plans on host memory call it before
        each run when :func:`~ggmlpy.backend.write_gen.host_reads_pending` is True. The written
        byte ranges (per buffer, merged) are worked out on the first such call and kept: a plan
        is only reused while its tensors stay where they were."""
        ranges = self._write_ranges
        if ranges is None:
            ranges = self._write_ranges = _write_ranges(self.dsts)
        wait_host_reads_ranges(ranges)

    def check_live(self, backend_name: str = "") -> None:
        """Raise NotAllocatedError if a buffer the plan uses was freed since it was built."""
        check_buffers_live(self.buffers, backend_name)

    def run(self) -> None:
        """Run every step in order on the calling thread, with NumPy's floating-point warnings
        off (overflow to inf and NaN propagate silently, as in ggml's kernels)."""
        with np.errstate(all="ignore"):
            for step in self.steps:
                step()
        for b in self.written:
            buffer_written(b)


def _write_ranges(nodes: list[Tensor]) -> dict[int, tuple[Buffer, list[int], list[int]]]:
    """Per buffer the sorted, merged byte ranges ``[start, end)`` the ``nodes`` occupy (their
    ``offset`` and ``nbytes``: the span ggml's ``ggml_nbytes`` gives, strided views included)."""
    spans: dict[int, tuple[Buffer, list[tuple[int, int]]]] = {}
    for t in nodes:
        buf = t.buffer if t.buffer is not None else (t.view_src.buffer if t.view_src is not None
                                                     else None)
        if buf is None or t.offset is None:
            continue
        spans.setdefault(id(buf), (buf, []))[1].append((t.offset, t.offset + t.nbytes))
    out: dict[int, tuple[Buffer, list[int], list[int]]] = {}
    for key, (buf, iv) in spans.items():
        iv.sort()
        starts: list[int] = []
        ends: list[int] = []
        for lo, hi in iv:
            if ends and lo <= ends[-1]:
                ends[-1] = max(ends[-1], hi)
            else:
                starts.append(lo)
                ends.append(hi)
        out[key] = (buf, starts, ends)
    return out


def check_buffers_live(buffers: list[Buffer], backend_name: str = "") -> None:
    """Raise NotAllocatedError naming the first of ``buffers`` that was freed (a plan or an
    encoded graph must not run on memory that was handed back)."""
    for b in buffers:
        if b.freed:
            raise NotAllocatedError(f"{backend_name}: the graph uses buffer {b.name} of "
                                    f"{b.size} bytes, which was freed")


class ReplayStats:
    """How a backend's plans were launched (counters, for tests and benchmarks).

    Attributes:
        eager: launches that ran the plan's steps one by one.
        captures: plans captured into a graph.
        replays: launches of a captured graph (the capturing launch included).
        capture_failures: captures that failed (the plan then runs eagerly for good).
    """

    __slots__ = ("eager", "captures", "replays", "capture_failures")

    def __init__(self) -> None:
        self.eager = self.captures = self.replays = self.capture_failures = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a dict."""
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self) -> str:
        return f"ReplayStats({self.as_dict()})"


def launch_plan(runtime: Any, stream: Any, plan: Plan, stats: ReplayStats, replay: bool = True) -> None:
    """*Async*: enqueue ``plan`` on ``stream`` of ``runtime``, replaying its captured graph when
    it has one (see the module docstring): the first launch of a plan runs its steps
    (``runtime.launch(stream, plan.run)``), the second captures them with
    ``runtime.graph_capture(stream, plan.steps)`` and launches the graph
    (``runtime.graph_launch``), later ones launch the graph. ``replay`` False, a runtime with
    ``supports_graphs`` False, or an earlier failed capture: always eager.

    A capture that raises (any exception but :class:`KeyboardInterrupt`) is counted in
    ``stats.capture_failures`` and the plan runs eagerly from then on; failures of the eager
    work or of a graph launch propagate as the runtime reports them.
    """
    if plan.graph is not None and replay:
        runtime.graph_launch(stream, plan.graph)
        plan.runs += 1
        stats.replays += 1
        return
    if (not replay or plan.runs == 0 or plan.capture_failed or not plan.steps
            or not runtime.supports_graphs):
        runtime.launch(stream, plan.run)
        plan.runs += 1
        stats.eager += 1
        return
    try:
        # the write-generation bumps of Plan.run are part of what a replay must do
        graph = runtime.graph_capture(stream, list(plan.steps) + [
            partial(buffer_written, b) for b in plan.written])
    except Exception:  # noqa: BLE001 - any capture failure: eager from now on
        plan.capture_failed = True
        stats.capture_failures += 1
        runtime.launch(stream, plan.run)
        plan.runs += 1
        stats.eager += 1
        return
    plan.graph = graph
    stats.captures += 1
    runtime.graph_launch(stream, graph)
    plan.runs += 1
    stats.replays += 1


def build_plan(graph: Graph, xp: Any, backend_name: str,
               can_read: Callable[[Tensor], bool], supports: Callable[[Tensor], bool],
               compile_node: Callable[[Any, Tensor, Any, list[Any]], Step | None] | None = None,
               ) -> Plan:
    """Resolve ``graph`` into a :class:`Plan` for array module ``xp``.

    Args:
        graph: the graph; every computed node and its sources must be allocated.
        xp: ``numpy`` or ``cupy`` (the module the buffers' ``_array`` views belong to).
        backend_name: used in error messages.
        can_read: whether this backend can access a tensor's buffer directly.
        supports: the backend's ``supports_op``.
        compile_node: ``compile_node(xp, node, dst, srcs) -> Step | None``; by default the
            kernel registry's (:func:`ggmlpy.backends.kernels.compile_node`). The CPU backend
            passes one that splits large nodes over its threads.

    Raises:
        NotAllocatedError: a node or source has no memory, or lives in a buffer this backend
            cannot read.
        UnsupportedOpError: a node's op/type combination is not supported.
    """
    steps: list[Step] = []
    nodes: list[Tensor] = []
    buffers: dict[int, Buffer] = {}
    compile_node = compile_node or kernels.compile_node
    writes: dict[int, tuple[Buffer, list[int]]] = {}  # non-COMPUTE buffers written, by step
    cache_reads: set[int] = set()  # buffers a MUL_MAT may read through the weight cache
    arrays: dict[int, Any] = {}  # id(tensor) -> its array view (tensors outlive the build)
    with cpu_variants.plan_build_scope():
        _compile_nodes(graph, xp, backend_name, can_read, supports, compile_node, steps, nodes,
                       buffers, writes, cache_reads, arrays)
    plan = Plan(steps, nodes, list(buffers.values()))
    if writes:
        _track_writes(plan, writes, cache_reads)
    return plan


def _compile_nodes(graph: Graph, xp: Any, backend_name: str, can_read: Callable[[Tensor], bool],
                   supports: Callable[[Tensor], bool],
                   compile_node: Callable[[Any, Tensor, Any, list[Any]], Step | None],
                   steps: list[Step], nodes: list[Tensor], buffers: dict[int, Buffer],
                   writes: dict[int, tuple[Buffer, list[int]]], cache_reads: set[int],
                   arrays: dict[int, Any]) -> None:
    """The loop of :func:`build_plan`: one step per computed node, appended to ``steps``."""
    memo: dict[tuple, bool] | None = {} if _memoisable(supports) else None
    smap = graph.src_map
    no_compute = _NO_COMPUTE
    for node in graph.nodes:
        if node.op in no_compute or min(node.ne) == 0:  # (ggml_is_empty)
            continue
        if memo is None:
            ok = supports(node)
        else:
            try:
                k = node_key(node)
                ok = memo.get(k)
            except TypeError:  # an unhashable op_params value: ask
                k = None
                ok = None
            if ok is None:
                ok = supports(node)
                if k is not None:
                    memo[k] = ok
        if not ok:
            srcs = ", ".join(f"{s.name}:{s.type.type_name}" for s in node.src
                             if s is not None)
            raise UnsupportedOpError(f"{backend_name}: op {node.op.name} of node '{node.name}' "
                                     f"({node.type.type_name}, sources {srcs}) is not supported")
        node_srcs = node.src if smap is None else smap.get(id(node), node.src)
        # one array view per tensor and build: a node's result is the very array its consumers
        # read (the tensors of a graph do not move while its plan is built)
        dst = arrays.get(id(node))
        if dst is None:
            dst = arrays[id(node)] = _array(node, can_read, backend_name, buffers)
        srcs = []
        for s in node_srcs:
            if s is None:
                srcs.append(None)
                continue
            a = arrays.get(id(s))
            if a is None:
                a = arrays[id(s)] = _array(s, can_read, backend_name, buffers)
            srcs.append(a)
        step = compile_node(xp, node, dst, srcs)
        if step is not None:
            steps.append(step)
            nodes.append(node)
            if xp is np:
                _note_write_and_cache_read(node, len(steps) - 1, writes, cache_reads)


def _note_write_and_cache_read(node: Tensor, i: int, writes: dict[int, tuple[Buffer, list[int]]],
                               cache_reads: set[int]) -> None:
    """Record step ``i`` as a writer of its destination's buffer when that buffer is not COMPUTE,
    and a MUL_MAT whose ``src0`` is not F32 as a possible weight-cache reader of its buffer."""
    buf = tensor_buffer(node)
    if buf is not None and getattr(buf, "usage", BufferUsage.COMPUTE) != BufferUsage.COMPUTE:
        writes.setdefault(id(buf), (buf, []))[1].append(i)
    if node.op == Op.MUL_MAT and node.src[0] is not None and node.src[0].type != Type.F32:
        wb = tensor_buffer(node.src[0])
        if wb is not None:
            cache_reads.add(id(wb))


def _track_writes(plan: Plan, writes: dict[int, tuple[Buffer, list[int]]],
                  cache_reads: set[int]) -> None:
    """Keep the weight cache's write generations right for a NumPy plan.

    A buffer the plan writes gets one new generation when :meth:`Plan.run` returns, after all
    its bytes are in place: one call per buffer and run, not one per node. Where the same plan
    may also *read* that buffer through the cache (a MUL_MAT with a converted ``src0`` in it),
    each writing step bumps right after it runs instead, so a later step never uses a copy made
    before the write."""
    for key, (buf, idx) in writes.items():
        if key in cache_reads:
            for i in idx:
                plan.steps[i] = _bump_after(plan.steps[i], buf)
        else:
            plan.written.append(buf)


def _bump_after(step: Step, buf: Buffer) -> Step:
    def run() -> None:
        step()
        buffer_written(buf)
    run.step = step  # type: ignore[attr-defined]  # the wrapped step (cpu_threads.compile_pending)
    return run


_NO_COMPUTE = frozenset(VIEW_OPS) | {Op.NONE}


def _memoisable(supports: Callable[[Tensor], bool]) -> bool:
    """Whether ``supports`` (a device's ``supports_op`` or ``can_compute``, bound) answers as a
    function of :func:`~ggmlpy.sched.assign.node_key` alone, so one plan build may ask once per
    distinct key: the device offers a memo token (:func:`ggmlpy.backends.cpu.backend.kernel_memo_token`:
    no override of its ``supports_op``/``_supports_op``) and the method is not replaced on the
    instance."""
    dev = getattr(supports, "__self__", None)
    name = getattr(supports, "__name__", "")
    if dev is None or name not in ("supports_op", "can_compute") or name in vars(dev):
        return False
    return isinstance(dev, Device) and dev.supports_op_memo_token() is not None


def _array(t: Tensor, can_read: Callable[[Tensor], bool], backend_name: str,
           buffers: dict[int, Buffer]) -> Any:
    """The array view of ``t`` over its buffer's memory; records the buffer in ``buffers``."""
    vs = t.view_src
    if (t._buffer is None and (vs is None or vs._buffer is None)) or t._offset is None:
        # the graph was never placed, or another graph's alloc_graph un-placed it: never run
        # whatever memory another graph left behind
        raise NotAllocatedError(
            f"{backend_name}: graph_compute: tensor '{t.name}' ({t.op.name}) of this graph is not "
            "allocated; allocate this graph (GraphAllocator.alloc_graph(graph) or "
            "Scheduler.alloc_graph(graph)) before computing it -- an allocator places only the "
            "graph it was last given")
    buf = tensor_buffer(t)
    if not can_read(t):
        raise NotAllocatedError(f"{backend_name}: tensor '{t.name}' is in buffer {buf.name}, "
                                "which this backend cannot access")
    buffers[id(buf)] = buf
    return buf._array(t)


class _Entry:
    __slots__ = ("snapshot", "plan", "buffer_ids")

    def __init__(self, snap: Snapshot, plan: Plan) -> None:
        self.snapshot = snap
        self.plan = plan
        self.buffer_ids = frozenset(id(b) for b in plan.buffers)


class PlanCache:
    """Plans per graph, valid for a :class:`~ggmlpy.core.snapshot.Snapshot` of what they read.

    ``get`` returns a cached plan when the graph still matches the snapshot taken when the plan
    was built (op, type, op_params, ne, nb, sources and their identities, view_src/view_offs,
    flags, buffer and offset of every node, leaf and source): O(1) when nothing in the process
    changed since, else one O(n) compare. Otherwise it builds and caches a new plan. Several
    placements per graph are remembered (up to ``maxsize`` plans in all, least recently used
    dropped first), so a scheduler rotating its ``n_copies`` input slots reuses one plan per slot.

    Nothing here keeps memory alive that its owner released: graphs are held weakly (a dead
    graph's plans are dropped at once) and a freed buffer drops every plan using it
    (:func:`ggmlpy.core.snapshot.on_buffer_free`). Thread-safe for concurrent ``get`` calls.

    Args:
        build: ``build(graph) -> Plan``.
        maxsize: plans remembered.

    Attributes:
        builds: number of plans built (for tests and benchmarks).

    ``len(cache)`` is the number of plans held; :meth:`stats` gives every counter at once.
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

    def stats(self) -> dict[str, int]:
        """The cache's counters (a new dict; reading them changes nothing): ``plans`` held now
        (``len(cache)``), ``graphs`` live graphs with at least one plan, ``builds`` plans built
        since the cache was made (each miss of :meth:`get` builds one; never reset, not even by
        :meth:`clear`), ``maxsize`` the most plans held."""
        with self._lock:
            return {"plans": self._n, "graphs": len(self._graphs), "builds": self.builds,
                    "maxsize": self._maxsize}

    def clear(self) -> None:
        """Forget every plan."""
        with self._lock:
            self._graphs.clear()
            self._n = 0
