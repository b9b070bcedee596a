"""The graph allocator never reuses a plan for a graph with other wiring (issue 10, item 2).

ggml's ``ggml_gallocr_needs_realloc`` compares node counts and tensor sizes only, so two graphs of
the same size whose edges differ (``n2 = add(n1, n0)`` vs ``n2 = add(n1, n1)``) shared one plan:
a tensor still needed was overwritten by an in-place child. ggmlpy's plan validity is a
:class:`ggmlpy.core.snapshot.Snapshot` of the graph (which tensor feeds which node, flags, ne/nb, views,
foreign placements) taken when the plan is made. Checked here: the issue's example (new graph and
in-place rewiring of the same graph), the several-buffer protocol (``alloc_graph`` says False, the
caller reserves again), the scheduler path, and a hypothesis test over random rewirings of
same-size graphs whose results must equal a float64 NumPy reference and a fresh allocator's.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggmlpy import ops
from ggmlpy.alloc.gallocr import GraphAllocator
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import CPUBufferType, backend_cpu_init
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.sched.scheduler import Scheduler

N = 4  # elements per tensor


@pytest.fixture(scope="module")
def cpu():
    b = backend_cpu_init()
    yield b
    b.free()


def _chain(wire_n0: bool):
    """a (input) -> n0 = 2a -> n1 = 2 n0 -> n2 = add(n1, n0 if wire_n0 else n1)."""
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor_1d(Type.F32, N).set_name("a").set_input()
    n0 = ops.scale(ctx, a, 2.0).set_name("n0")
    n1 = ops.scale(ctx, n0, 2.0).set_name("n1")
    n2 = ops.add(ctx, n1, n0 if wire_n0 else n1).set_name("n2").set_output()
    g = Graph()
    g.build_forward_expand(n2)
    return g, a, n0, n1, n2


def _run(backend, galloc, g, a, out, x):
    assert galloc.alloc_graph(g)
    backend_tensor_set(a, x)
    backend.graph_compute(g)
    return backend_tensor_get(out).reshape(-1)


def test_new_graph_with_other_edges_is_replanned(cpu):
    """Issue example: add(n1, n1) = 8a planned first; add(n1, n0) must give 6a, not 8a."""
    galloc = GraphAllocator(cpu.get_default_buffer_type())
    x = np.arange(1, N + 1, dtype=np.float32)
    try:
        for wire, factor in ((False, 8), (True, 6), (False, 8), (True, 6)):
            g, a, _, _, n2 = _chain(wire)
            np.testing.assert_array_equal(_run(cpu, galloc, g, a, n2, x), factor * x)
    finally:
        galloc.free()


def test_same_graph_rewired_in_place_is_replanned(cpu):
    """The same Graph object and tensors, ``n2.src[1]`` switched between n1 and n0."""
    galloc = GraphAllocator(cpu.get_default_buffer_type())
    x = np.arange(1, N + 1, dtype=np.float32)
    g, a, n0, n1, n2 = _chain(False)
    try:
        np.testing.assert_array_equal(_run(cpu, galloc, g, a, n2, x), 8 * x)
        n2.src[1] = n0
        np.testing.assert_array_equal(_run(cpu, galloc, g, a, n2, x), 6 * x)
        n2.src[1] = n1
        np.testing.assert_array_equal(_run(cpu, galloc, g, a, n2, x), 8 * x)
    finally:
        galloc.free()


def test_several_buffers_ask_for_reserve_on_other_wiring(cpu):
    """With several buffer ids the allocator cannot re-plan alone: alloc_graph returns False."""
    bt0, bt1 = cpu.get_default_buffer_type(), CPUBufferType("CPU_b", None)
    galloc = GraphAllocator.new_n([bt0, bt1])
    x = np.arange(1, N + 1, dtype=np.float32)
    try:
        g1, a1, _, _, out1 = _chain(False)
        assert galloc.reserve_n(g1, [0] * g1.n_nodes, [1] * g1.n_leafs)
        np.testing.assert_array_equal(_run(cpu, galloc, g1, a1, out1, x), 8 * x)
        assert galloc.alloc_graph(g1)  # unchanged graph: the plan is reused
        g2, a2, _, _, out2 = _chain(True)
        assert not galloc.alloc_graph(g2)  # same sizes, other edges: a new plan is needed
        assert galloc.reserve_n(g2, [0] * g2.n_nodes, [1] * g2.n_leafs)
        np.testing.assert_array_equal(_run(cpu, galloc, g2, a2, out2, x), 6 * x)
    finally:
        galloc.free()


def test_scheduler_rewired_graphs(cpu):
    """The scheduler's allocation path (reserve_n/alloc_graph through its own galloc)."""
    sched = Scheduler([cpu])
    x = np.arange(1, N + 1, dtype=np.float32)
    for wire, factor in ((False, 8), (True, 6), (False, 8)):
        g, a, _, _, n2 = _chain(wire)
        sched.reset()
        assert sched.alloc_graph(g)
        backend_tensor_set(a, x)
        sched.graph_compute(g)
        np.testing.assert_array_equal(backend_tensor_get(n2).reshape(-1), factor * x)
    sched.galloc.free()


# -- random rewirings ------------------------------------------------------------------------------
# A program is K nodes; node i is (kind, j, k): kind in add/sub/mul/scale/neg/sqr, reading values
# j and k (mod the i + 2 values defined before it: two inputs then nodes 0..i-1). Every node is in
# the graph (each is expanded in order), so all programs of one K have the same node count and
# per-position sizes and differ only in their edges and ops.
KINDS = ("add", "sub", "mul", "scale", "neg", "sqr")
K = 6
step_st = st.tuples(st.sampled_from(KINDS), st.integers(0, 64), st.integers(0, 64))
programs_st = st.lists(st.lists(step_st, min_size=K, max_size=K), min_size=2, max_size=4)


def _build(prog):
    ctx = Context(no_alloc=True)
    ins = [ctx.new_tensor_1d(Type.F32, N).set_name(f"in{i}").set_input() for i in range(2)]
    vals = list(ins)
    g = Graph()
    for i, (kind, j, k) in enumerate(prog):
        x, y = vals[j % len(vals)], vals[k % len(vals)]
        if kind == "add":
            t = ops.add(ctx, x, y)
        elif kind == "sub":
            t = ops.sub(ctx, x, y)
        elif kind == "mul":
            t = ops.mul(ctx, x, y)
        elif kind == "scale":
            t = ops.scale(ctx, x, 0.5)
        elif kind == "neg":
            t = ops.neg(ctx, x)
        else:
            t = ops.sqr(ctx, x)
        t.set_name(f"n{i}")
        g.build_forward_expand(t)
        vals.append(t)
    vals[-1].set_output()
    return g, ins, vals[-1]


def _reference(prog, xs):
    vals = [x.astype(np.float64) for x in xs]
    for kind, j, k in prog:
        x, y = vals[j % len(vals)], vals[k % len(vals)]
        vals.append({"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                     "scale": lambda: 0.5 * x, "neg": lambda: -x, "sqr": lambda: x * x}[kind]())
    return vals[-1]


def _assert_reference(got, ref):
    # F32 against float64: each of the K ops rounds once (relative 6e-8), so 1e-5 is loose
    # enough for K = 6 and far below any wrong-wiring difference; values past F32's range
    # (|v| > 1e30 after mul/sqr chains) are compared only as the non-finite/huge result.
    small = np.abs(ref) < 1e30
    np.testing.assert_allclose(got[small], ref[small], rtol=1e-5, atol=0)
    assert np.all(np.abs(got[~small]) > 1e29), (got, ref)


def _eval(backend, galloc, prog, xs):
    g, ins, out = _build(prog)
    assert galloc.alloc_graph(g)
    for t, x in zip(ins, xs):
        if t.buffer is not None:  # an input no node reads is not in the graph
            backend_tensor_set(t, x)
    backend.graph_compute(g)
    return backend_tensor_get(out).reshape(-1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs=programs_st, seed=st.integers(0, 2**16))
def test_random_rewirings_match_fresh_allocator(cpu, programs, seed):
    """One allocator fed a sequence of same-size graphs with other edges gives, for each, the
    float64 reference and the result of a fresh allocator (never the previous plan's)."""
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-3, 4, N).astype(np.float32) for _ in range(2)]
    buft = cpu.get_default_buffer_type()
    shared = GraphAllocator(buft)
    try:
        for prog in programs:
            got = _eval(cpu, shared, prog, xs)
            fresh = GraphAllocator(buft)
            try:
                want = _eval(cpu, fresh, prog, xs)
            finally:
                fresh.free()
            np.testing.assert_array_equal(got, want)
            _assert_reference(got, _reference(prog, xs))
    finally:
        shared.free()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=st.lists(step_st, min_size=K, max_size=K),
       rewires=st.lists(st.tuples(st.integers(0, K - 1), st.integers(0, 1), st.integers(0, 64)),
                        min_size=1, max_size=4))
def test_random_in_place_rewiring_of_one_graph(cpu, prog, rewires):
    """Rewire sources of an allocated graph in place (``node.src[j] = earlier value``), then
    alloc_graph + compute again: the result equals a fresh allocator's on the same graph."""
    rng = np.random.default_rng(len(rewires))
    xs = [rng.integers(-3, 4, N).astype(np.float32) for _ in range(2)]
    buft = cpu.get_default_buffer_type()
    g, ins, out = _build(prog)
    shared = GraphAllocator(buft)
    try:
        assert shared.alloc_graph(g)
        for t, x in zip(ins, xs):
            if t.buffer is not None:  # an input no node reads is not in the graph
                backend_tensor_set(t, x)
        cpu.graph_compute(g)
        for i, slot, pick in rewires:
            node = g.nodes[i]
            if slot >= len(node.src) or node.src[slot] is None:
                continue
            earlier = ins + g.nodes[:i]
            node.src[slot] = earlier[pick % len(earlier)]
        results = []
        for galloc in (shared, GraphAllocator(buft)):
            assert galloc.alloc_graph(g)
            for t, x in zip(ins, xs):
                if t.buffer is not None:  # an input no node reads is not in the graph
                    backend_tensor_set(t, x)
            cpu.graph_compute(g)
            results.append(backend_tensor_get(out).reshape(-1).copy())
            galloc.free()  # un-places its tensors, so the next allocator plans them afresh
        np.testing.assert_array_equal(results[0], results[1])
        _assert_reference(results[0], _graph_reference(g, ins, xs))
    finally:
        shared.free()


def _graph_reference(g, ins, xs):
    """Evaluate ``g`` in float64 following each node's current ``src`` (after rewiring)."""
    from ggmlpy.core.opcodes import Op, UnaryOp

    val = {id(t): x.astype(np.float64) for t, x in zip(ins, xs)}
    for n in g.nodes:
        a = val[id(n.src[0])]
        b = val[id(n.src[1])] if len(n.src) > 1 and n.src[1] is not None else None
        if n.op == Op.ADD:
            v = a + b
        elif n.op == Op.SUB:
            v = a - b
        elif n.op == Op.MUL:
            v = a * b
        elif n.op == Op.SCALE:
            v = 0.5 * a
        elif n.op == Op.SQR:
            v = a * a
        else:
            assert n.op == Op.UNARY and n.op_params[0] == UnaryOp.NEG, n.op
            v = -a
        val[id(n)] = v
    return val[id(g.nodes[-1])]


def test_graphs_built_before_any_allocation_are_not_confused(cpu):
    """Both wirings built first, then allocated in turn: the second graph must not inherit the
    first graph's plan because nothing changed in between (the snapshot vouches only for the
    graph it was taken of)."""
    x = np.arange(1, N + 1, dtype=np.float32)
    for first, second in ((False, True), (True, False)):
        g1, a1, _, _, o1 = _chain(first)
        g2, a2, _, _, o2 = _chain(second)
        galloc = GraphAllocator(cpu.get_default_buffer_type())
        try:
            np.testing.assert_array_equal(_run(cpu, galloc, g1, a1, o1, x), (6 if first else 8) * x)
            np.testing.assert_array_equal(_run(cpu, galloc, g2, a2, o2, x), (6 if second else 8) * x)
        finally:
            galloc.free()


def test_a_graph_built_the_same_way_reuses_the_plan_other_wiring_does_not(cpu, monkeypatch):
    """The snapshot names tensors by position: a new graph object built the same way over the
    same inputs keeps the recorded plan (ggml's reuse, without a re-plan), a same-size graph
    with other edges is re-planned; both compute the right values."""
    galloc = GraphAllocator(cpu.get_default_buffer_type())
    plans = []
    orig = galloc._plan
    monkeypatch.setattr(galloc, "_plan", lambda *a: (plans.append(1), orig(*a))[1])
    x = np.arange(1, N + 1, dtype=np.float32)
    try:
        for k, (wire, factor, n_plans) in enumerate(((False, 8, 1), (False, 8, 1), (True, 6, 2),
                                                     (True, 6, 2), (False, 8, 3))):
            g, a, _, _, n2 = _chain(wire)
            np.testing.assert_array_equal(_run(cpu, galloc, g, a, n2, x), factor * x)
            assert len(plans) == n_plans, k
    finally:
        galloc.free()


def test_snapshot_outside_sources_equal_the_direct_walk():
    # Snapshot.take finds the outside sources (neither nodes nor leafs, in first-use order)
    # while building the state; the result equals the direct walk, over random graph views
    # (whose sources from earlier nodes are outside) and rewired views
    import random

    from ggmlpy.core.graph import graph_view
    from ggmlpy.core.snapshot import Snapshot, _outside_sources
    rnd = random.Random(8)
    for _trial in range(30):
        ctx = Context()
        a = ctx.new_tensor_1d(Type.F32, 8).set_input()
        ts = [a]
        for _ in range(rnd.randint(2, 12)):
            x, y = rnd.choice(ts), rnd.choice(ts)
            ts.append(rnd.choice([ops.add, ops.mul, ops.sub])(ctx, x, y))
        g = Graph()
        g.build_forward_expand(ts[-1])
        i0 = rnd.randint(0, g.n_nodes - 1)
        v = graph_view(g, i0, rnd.randint(i0, g.n_nodes))
        if v.nodes and rnd.random() < 0.5:  # a substituted source from outside every list
            n = v.nodes[-1]
            v.src_map = {id(n): [ctx.new_tensor_1d(Type.F32, 8), n.src[1]]}
        want = [id(t) for t in _outside_sources(v)]
        snap = Snapshot.take(v)
        assert [id(r()) for r in snap._outside] == want
        assert snap.matches(v)
