"""Property tests of GraphAllocator over random DAGs (hypothesis).

Each example is a random program of element-wise ops (add/mul/sub, scale, unary, sqr, in-place
``add_inplace``), mul_mat, norm, cont, and the view ops view_2d / transpose / reshape_2d, over F32
inputs (Flag.INPUT, placed by the allocator) and weights (allocated outside it). The program is
built twice: once with every tensor in its own memory (``alloc_ctx_tensors``) and once placed by
:class:`GraphAllocator`. Checked:

* every node and source is placed; views sit at ``view_src.offset + view_offs``;
* no two allocator-placed tensors whose lifetimes overlap share bytes, except a parent and the
  in-place child that takes its memory at the parent's last use (lifetimes are computed here,
  independently of the allocator: produced at the node's index, or -1 for leafs, so inputs are
  live from the start; used wherever it or a view of it is read or written; OUTPUT tensors live
  to the end);
* computing on the CPU backend gives bit-identical outputs to the separate-memory run, also after
  a second ``alloc_graph`` of the same graph (the reset-and-re-place path).

A node the CPU backend does not support is left out of the program, so the DAG ops widen as
kernels are added.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggmlpy import ops
from ggmlpy.alloc.dyn_alloc import _DynAllocator
from ggmlpy.alloc.gallocr import GraphAllocator
from ggmlpy.alloc.tallocr import alloc_ctx_tensors
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import CPUBufferType, backend_cpu_init, cpu_buffer_type, cpu_device
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import INPLACE_CAPABLE_OPS
from ggmlpy.core.tensor import Context, Flag, Tensor
from ggmlpy.core.types import Type

F32 = Type.F32
SHAPES = [(8, 4), (4, 8), (8, 8), (16, 2), (4, 4), (32, 1), (8, 3), (6, 4), (8, 6), (4, 6)]
KINDS = ["add", "mul", "sub", "scale", "relu", "neg", "sqr", "add_inplace", "mul_mat", "norm",
         "cont", "view_rows", "transpose", "reshape"]

step_st = st.tuples(st.sampled_from(KINDS), st.integers(0, 1 << 16), st.integers(0, 1 << 16),
                    st.booleans())
program_st = st.fixed_dictionaries({
    "inputs": st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3),
    "weights": st.lists(st.sampled_from(SHAPES), min_size=0, max_size=3),
    "steps": st.lists(step_st, min_size=4, max_size=30),
    "n_out": st.integers(1, 3),
    "seed": st.integers(0, 1000),
    "max_size": st.sampled_from([0, 256, 512]),
})


class _MaxBuft(CPUBufferType):
    def __init__(self, max_size: int) -> None:
        super().__init__(f"CPU_max{max_size}", None)
        self._max = max_size

    def _get_max_size(self) -> int:
        return self._max


def _apply(ctx: Context, kind: str, a: Tensor, pool: list[Tensor], j: int) -> Tensor | None:
    def partner(pred):
        cands = [t for t in pool if pred(t)]
        return cands[j % len(cands)] if cands else None

    if kind in ("add", "mul", "sub", "add_inplace"):
        b = partner(lambda t: t.ne == a.ne)
        fn = {"add": ops.add, "mul": ops.mul, "sub": ops.sub, "add_inplace": ops.add_inplace}[kind]
        return fn(ctx, a, b)
    if kind == "scale":
        return ops.scale(ctx, a, 0.5 + j % 3)
    if kind == "relu":
        return ops.relu(ctx, a)
    if kind == "neg":
        return ops.neg(ctx, a)
    if kind == "sqr":
        return ops.sqr(ctx, a)
    if kind == "mul_mat":
        b = partner(lambda t: t.ne[0] == a.ne[0] and t.ne[2] == 1 and t.ne[3] == 1)
        return ops.mul_mat(ctx, a, b)
    if kind == "norm":
        return ops.norm(ctx, a, 1e-5)
    if kind == "cont":
        return ops.cont(ctx, a)
    if kind == "transpose":
        return ops.transpose(ctx, a)
    if kind == "view_rows":
        if not a.is_contiguous() or a.ne[1] < 2:
            return None
        rows = a.ne[1] // 2
        return ops.view_2d(ctx, a, a.ne[0], rows, a.nb[1], a.nb[1] * (j % (a.ne[1] - rows + 1)))
    if kind == "reshape":
        if not a.is_contiguous():
            return None
        return ops.reshape_2d(ctx, a, a.ne[1], a.ne[0])
    raise AssertionError(kind)


def _build(prog, weights_external: bool):
    """Build the program; returns (graph, inputs, weights, outputs, all ctxs)."""
    dev = cpu_device()
    ctx = Context()
    wctx = Context() if weights_external else ctx
    inputs = [ctx.new_tensor(F32, s).set_name(f"in{i}").set_input()
              for i, s in enumerate(prog["inputs"])]
    weights = [wctx.new_tensor(F32, s).set_name(f"w{i}") for i, s in enumerate(prog["weights"])]
    pool: list[Tensor] = [*inputs, *weights]
    flagged: list[Tensor] = []
    for kind, i, j, out in prog["steps"]:
        # mostly one of the three newest tensors (deep chains), sometimes any (wide fan-in)
        a = pool[-1 - (i >> 2) % min(3, len(pool))] if i % 4 else pool[(i >> 2) % len(pool)]
        try:
            t = _apply(ctx, kind, a, pool, j)
        except (ValueError, TypeError):
            continue  # ggml's shape/layout rules refuse this combination (e.g. scale of a transpose)
        if t is None or not dev.supports_op(t):
            continue
        pool.append(t)
        if out:
            flagged.append(t)
    computed = pool[len(inputs) + len(weights):]
    outs = (computed[-prog["n_out"]:] if computed else []) + flagged
    outs = list({id(t): t for t in outs}.values())
    g = Graph()
    for t in outs:
        t.set_output()
        g.build_forward_expand(t)
    return g, inputs, weights, outs, (ctx, wctx)


def _fill(inputs, weights, seed):
    rng = np.random.default_rng(seed)
    for t in [*inputs, *weights]:
        v = rng.standard_normal(t.ne[::-1]).astype(np.float32)
        if t.is_allocated:  # an input no output depends on is not in the graph
            backend_tensor_set(t, v)


def _lifetimes(g: Graph) -> dict[int, tuple[int, int]]:
    n = g.n_nodes
    start: dict[int, int] = {}
    end: dict[int, int] = {}

    def root(t: Tensor) -> Tensor:
        return t.view_src if t.view_src is not None else t

    for leaf in g.leafs:
        start[id(leaf)] = -1
    for i, node in enumerate(g.nodes):
        if node.view_src is None:
            start.setdefault(id(node), i)
        for t in [node, *g.node_srcs(node)]:
            if t is not None:
                r = root(t)
                end[id(r)] = max(end.get(id(r), -1), i)
    for t in [*g.leafs, *g.nodes]:
        r = root(t)
        if r.flags & Flag.OUTPUT:
            end[id(r)] = n
    return {k: (start[k], max(end.get(k, start[k]), start[k])) for k in start}


def _check_placement(g: Graph, ga: GraphAllocator) -> None:
    chunks = {id(b) for b in ga.get_chunk_buffers(0)}
    for node in g.nodes:
        for t in [node, *g.node_srcs(node)]:
            if t is None:
                continue
            assert t.is_allocated, t
            if t.view_src is not None:
                assert t.buffer is t.view_src.buffer
                assert t.offset == t.view_src.offset + t.view_offs
    life = _lifetimes(g)
    owned = [t for t in [*g.leafs, *g.nodes]
             if t.view_src is None and id(t.buffer) in chunks]
    producer_srcs = {id(n): [s for s in g.node_srcs(n) if s is not None] for n in g.nodes}
    index = {id(n): i for i, n in enumerate(g.nodes)}
    for ai, a in enumerate(owned):
        sa, ea = life[id(a)]
        for b in owned[ai + 1:]:
            if a.buffer is not b.buffer:
                continue
            if not (a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes):
                continue
            sb, eb = life[id(b)]
            if sa > eb or sb > ea:
                continue  # lifetimes disjoint
            # the only allowed sharing: an in-place child taking its parent's memory at the
            # parent's last use
            for p, c in ((a, b), (b, a)):
                sp, ep = life[id(p)]
                sc, _ = life[id(c)]
                if (id(c) in index and c.op in INPLACE_CAPABLE_OPS and sc == ep
                        and any(s is p for s in producer_srcs[id(c)]) and c.offset == p.offset):
                    break
            else:
                raise AssertionError(f"{a} (life {sa}..{ea}) and {b} (life {sb}..{eb}) overlap")


def _outputs(outs):
    return [backend_tensor_get(t).tobytes() for t in outs]


@pytest.mark.parametrize("policy", ["ggml", "compact"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=program_st)
def test_random_dag_placement_and_results(policy, prog):
    be = backend_cpu_init()
    # reference: every tensor in its own memory
    g0, in0, w0, out0, (ctx0, _) = _build(prog, weights_external=False)
    if g0.n_nodes == 0:
        return
    assert alloc_ctx_tensors(ctx0, be) is not None
    _fill(in0, w0, prog["seed"])
    be.graph_compute(g0)
    want = _outputs(out0)

    g, ins, ws, outs, (_, wctx) = _build(prog, weights_external=True)
    if ws:
        alloc_ctx_tensors(wctx, be)
    buft = _MaxBuft(prog["max_size"]) if prog["max_size"] else cpu_buffer_type()
    ref = GraphAllocator(buft)  # ggml's plan (reserve places no tensor)
    assert ref.reserve(g)
    ggml_size = sum(b.size for b in ref.get_chunk_buffers(0))
    ref.free()
    ga = GraphAllocator(buft, policy=policy)
    for _ in range(2):
        assert ga.alloc_graph(g)
        _check_placement(g, ga)
        for w in ws:
            assert w.buffer not in ga.get_chunk_buffers(0)
        _fill(ins, ws, prog["seed"])
        be.graph_compute(g)
        # bit-identical: same kernels on the same values, only the memory differs
        assert _outputs(outs) == want
    # never more than every owned tensor in its own (32-byte aligned) slot
    naive = sum(-(-t.nbytes // 32) * 32 for t in [*g.leafs, *g.nodes]
                if t.view_src is None and t.buffer in ga.get_chunk_buffers(0))
    assert ga.get_buffer_size(0) <= naive or prog["max_size"]
    if policy == "compact":  # never larger than ggml's own plan of the same graph
        assert sum(b.size for b in ga.get_chunk_buffers(0)) <= ggml_size


@settings(max_examples=25, deadline=None)
@given(prog=program_st)
def test_reserve_n_size_matches_reserve(prog):
    g, _, ws, _, (_, wctx) = _build(prog, weights_external=True)
    if ws:
        alloc_ctx_tensors(wctx, backend_cpu_init())
    ga = GraphAllocator(cpu_buffer_type())
    sizes = ga.reserve_n_size(g, None, None)
    assert ga.get_buffer_size(0) == 0
    assert ga.reserve(g)
    assert ga.get_buffer_size(0) == sizes[0]


@settings(max_examples=60, deadline=None)
@given(max_size=st.sampled_from([1 << 62, 256, 1024]),
       ops_=st.lists(st.tuples(st.booleans(), st.integers(1, 200), st.integers(0, 1 << 16)),
                     min_size=1, max_size=80))
def test_dyn_allocator_never_overlaps_and_coalesces(max_size, ops_):
    # independent bookkeeping of live (chunk, offset, padded size) ranges
    d = _DynAllocator(32, max_size)
    live: list[tuple[int, int, int]] = []
    for is_alloc, size, k in ops_:
        if is_alloc or not live:
            c, off = d.alloc(size)
            padded = -(-size // 32) * 32
            assert off % 32 == 0
            for c2, o2, s2 in live:
                assert c2 != c or off + padded <= o2 or o2 + s2 <= off, "overlap"
            live.append((c, off, padded))
            assert d.chunk_max_size(c) >= off + padded
        else:
            c, off, padded = live.pop(k % len(live))
            d.free(c, off, padded)
    for c, off, padded in live:
        d.free(c, off, padded)
    for ch in d.chunks:  # everything freed: one block per chunk, from offset 0
        assert len(ch.blocks) == 1 and ch.blocks[0][0] == 0
