"""The scheduler's unchanged-graph fast path (issue 11 item 3, issue 10 items 1-2 scheduler side).

``reset(); alloc_graph(g)`` of the same, unchanged graph replays the recorded split and placement
(``sched.reuse.hits``); every mutation a split or placement depends on makes it split again
(``sched.reuse.misses``) and the result is the fresh graph's result.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Graph, Type
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage, Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.sched.scheduler import Scheduler

RNG = np.random.default_rng(99)


@pytest.fixture(scope="module")
def sim_cpu(sim_devices):
    reg = sim_devices(1, latency_us=0.0)
    return reg[0].init_backend(), gp.backend_cpu_init()


def _weight(backend, arr, name):
    c = Context()
    t = c.new_tensor_2d(Type.F32, arr.shape[1], arr.shape[0]).set_name(name)
    alloc_ctx_tensors_from_buft(c, backend.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
    backend_tensor_set(t, arr)
    return t


class Net:
    """x [8, 3] -> h = W_sim x (SIM0) -> y = scale(h, 2) -> z = W_cpu y (CPU) -> out = z + x[:6]."""

    def __init__(self, sim, cpu):
        self.Ws = RNG.standard_normal((6, 8)).astype(np.float32)
        self.Wc = RNG.standard_normal((6, 6)).astype(np.float32)
        self.ws, self.wc = _weight(sim, self.Ws, "ws"), _weight(cpu, self.Wc, "wc")
        ctx = self.ctx = Context()
        self.x = ctx.new_tensor_2d(Type.F32, 8, 3).set_name("x").set_input()
        self.h = gp.mul_mat(ctx, self.ws, self.x).set_name("h")
        self.y = gp.scale(ctx, self.h, 2.0).set_name("y")
        self.z = gp.mul_mat(ctx, self.wc, self.y).set_name("z")
        self.xv = gp.view_2d(ctx, self.x, 6, 3, self.x.nb[1], 0).set_name("xv")
        self.out = gp.add(ctx, self.z, self.xv).set_name("out").set_output()
        self.g = Graph()
        self.g.build_forward_expand(self.out)

    def ref(self, X, s=2.0, xv=None):
        h = X.astype(np.float64) @ self.Ws.T.astype(np.float64)
        z = (s * h) @ self.Wc.T.astype(np.float64)
        return z + (X[:, :6] if xv is None else xv)


def _run(sched, net, X, graph=None):
    g = net.g if graph is None else graph
    sched.reset()
    assert sched.alloc_graph(g)
    backend_tensor_set(net.x, X)
    assert sched.graph_compute(g) == Status.SUCCESS
    return backend_tensor_get(net.out)[0, 0]


def _check(got, want):
    # two float32 GEMMs of K <= 8 against float64
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("parallel", [False, True])
def test_unchanged_graph_takes_the_fast_path(sim_cpu, parallel):
    sim, cpu = sim_cpu
    net = Net(sim, cpu)
    sched = Scheduler([sim, cpu], parallel=parallel)
    n_slots = sched.get_n_copies()
    for _k in range(3 * n_slots):
        X = RNG.standard_normal((3, 8)).astype(np.float32)
        _check(_run(sched, net, X), net.ref(X))
        assert sched.get_n_splits() == 2
    # one split per copy slot, then only replays
    assert (sched.reuse.misses, sched.reuse.hits) == (n_slots, 2 * n_slots)
    sched.reset()
    assert net.out.buffer is None and net.h.buffer is None  # reset still un-places
    sched.free()


def _mutations(net, sim, cpu):
    """(name, mutate(net, sched) -> new expected-result function) for every kind of change."""

    def op_params(sched):
        net.y.op_params[0] = 3.0
        return lambda X: net.ref(X, s=3.0)

    def rewire(sched):
        # same node count, same sizes: out reads a different (already computed) tensor
        xv2 = gp.view_2d(net.ctx, net.x, 6, 3, net.x.nb[1], 8).set_name("xv2")
        net.out.src[1] = xv2
        net.g.nodes[net.g.nodes.index(net.xv)] = xv2
        return lambda X: net.ref(X, xv=X[:, 2:8])

    def new_view(sched):
        # the shape of fault: same buffer and offset, other ne
        idx = net.g.nodes.index(net.xv)
        v = gp.view_2d(net.ctx, net.x, 6, 3, net.x.nb[1], 0)
        vv = gp.scale(net.ctx, v, -1.0)
        net.g.nodes[idx] = v
        net.g.nodes.insert(idx + 1, vv)
        net.out.src[1] = vv
        return lambda X: net.ref(X, xv=-X[:, :6])

    def pin(sched):
        sched.set_tensor_backend(net.y, cpu)
        return None  # same values, other placement

    def weight_buffer(sched):
        # the CPU weight moves to a new buffer with new values
        Wc2 = RNG.standard_normal((6, 6)).astype(np.float32)
        c = Context()
        w2 = c.new_tensor_2d(Type.F32, 6, 6)
        buf = alloc_ctx_tensors_from_buft(c, cpu.get_default_buffer_type())
        buf.set_usage(BufferUsage.WEIGHTS)
        backend_tensor_set(w2, Wc2)
        net.wc.buffer, net.wc.offset = w2.buffer, w2.offset
        net.Wc = Wc2
        net._keep = (c, w2, buf)
        return lambda X: net.ref(X)

    def compute_buffer_freed(sched):
        # a bigger graph reserved through the same scheduler grows (frees) the compute buffers
        ctx = Context()
        big = ctx.new_tensor_1d(Type.F32, 1 << 16).set_input()
        g2 = Graph()
        g2.build_forward_expand(gp.sum(ctx, gp.scale(ctx, big, 1.0)).set_output())
        assert sched.reserve(g2)
        return lambda X: net.ref(X)

    return [("op_params", op_params), ("rewire", rewire), ("new_view", new_view), ("pin", pin),
            ("weight_buffer", weight_buffer), ("compute_buffer_freed", compute_buffer_freed)]


@pytest.mark.parametrize("kind", ["op_params", "rewire", "new_view", "pin", "weight_buffer",
                                  "compute_buffer_freed"])
def test_every_mutation_kind_invalidates_the_fast_path(sim_cpu, kind):
    sim, cpu = sim_cpu
    net = Net(sim, cpu)
    sched = Scheduler([sim, cpu])
    X = RNG.standard_normal((3, 8)).astype(np.float32)
    _check(_run(sched, net, X), net.ref(X))
    _check(_run(sched, net, X), net.ref(X))
    assert (sched.reuse.misses, sched.reuse.hits) == (1, 1)
    sched.reset()
    mutate = dict(_mutations(net, sim, cpu))[kind]
    want = mutate(sched) or net.ref
    assert sched.alloc_graph(net.g)
    assert (sched.reuse.misses, sched.reuse.hits) == (2, 1)  # split again
    backend_tensor_set(net.x, X)
    assert sched.graph_compute(net.g) == Status.SUCCESS
    _check(backend_tensor_get(net.out)[0, 0], want(X))
    if kind == "pin":
        assert sched.get_tensor_backend(net.y) is cpu
        sched.reset()
        sched.set_tensor_backend(net.y, cpu)  # the same pin again: replayed
        assert sched.alloc_graph(net.g)
        assert (sched.reuse.misses, sched.reuse.hits) == (2, 2)
        assert sched.get_tensor_backend(net.y) is cpu
    else:
        _check(_run(sched, net, X), want(X))  # and the new state is replayed
        assert (sched.reuse.misses, sched.reuse.hits) == (2, 2)
    sched.free()


def test_other_graph_object_is_split_again(sim_cpu):
    sim, cpu = sim_cpu
    net = Net(sim, cpu)
    sched = Scheduler([sim, cpu])
    X = RNG.standard_normal((3, 8)).astype(np.float32)
    _check(_run(sched, net, X), net.ref(X))
    g2 = Graph()
    g2.build_forward_expand(net.out)
    _check(_run(sched, net, X, graph=g2), net.ref(X))
    assert (sched.reuse.misses, sched.reuse.hits) == (2, 0)


def test_other_wiring_same_sizes_is_not_reused():
    # issue 10 item 2 through the scheduler: n2 = n1 + n0 vs n2 = n1 + n1, same node count and
    # per-position sizes; the second must give 8a, not the first graph's 12a
    cpu = gp.backend_cpu_init()
    sched = Scheduler([cpu])
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 16).set_name("a").set_input()
    n0 = gp.scale(ctx, a, 2.0).set_name("n0")
    n1 = gp.scale(ctx, n0, 2.0).set_name("n1")
    n2 = gp.add(ctx, n1, n0).set_name("n2").set_output()
    g = Graph()
    g.build_forward_expand(n2)
    A = np.arange(16, dtype=np.float32)
    for want in (6 * A, 6 * A):
        sched.reset()
        assert sched.alloc_graph(g)
        backend_tensor_set(a, A)
        sched.graph_compute(g)
        np.testing.assert_array_equal(backend_tensor_get(n2).ravel(), want)
    n2.src[1] = n1  # rewired: n2 = n1 + n1 = 8a
    sched.reset()
    assert sched.alloc_graph(g)
    backend_tensor_set(a, A)
    sched.graph_compute(g)
    np.testing.assert_array_equal(backend_tensor_get(n2).ravel(), 8 * A)
    assert (sched.reuse.misses, sched.reuse.hits) == (2, 1)


def test_random_mutations_then_cached_result_equals_fresh(sim_cpu):
    sim, cpu = sim_cpu
    rng = np.random.default_rng(5)
    for _trial in range(12):
        net = Net(sim, cpu)
        sched = Scheduler([sim, cpu])
        X = rng.standard_normal((3, 8)).astype(np.float32)
        _run(sched, net, X)
        sched.reset()
        kinds = _mutations(net, sim, cpu)
        name, mutate = kinds[rng.integers(len(kinds))]
        want = mutate(sched) or net.ref
        got = _run(sched, net, X) if name != "pin" else None
        if got is None:  # the pin must survive into the alloc: no reset in between
            assert sched.alloc_graph(net.g)
            backend_tensor_set(net.x, X)
            sched.graph_compute(net.g)
            got = backend_tensor_get(net.out)[0, 0]
        _check(got, want(X))
        # a fresh scheduler on the mutated graph agrees
        sched.free()
        fresh = Scheduler([sim, cpu])
        _check(_run(fresh, net, X), got)
        fresh.free()


def test_two_schedulers_alternating_on_one_graph(sim_cpu):
    # each scheduler's parked placement comes back only while nobody else placed the graph; the
    # other scheduler's placements in between are seen (state compare), results stay right
    sim, cpu = sim_cpu
    net = Net(sim, cpu)
    s1 = Scheduler([sim, cpu])
    s2 = Scheduler([sim, cpu])  # its own compute buffers: other addresses
    bufs = {s1: set(), s2: set()}
    for _k in range(4):
        for s in (s1, s2):
            X = RNG.standard_normal((3, 8)).astype(np.float32)
            _check(_run(s, net, X), net.ref(X))
            bufs[s].add(id(net.out.buffer))
            s.reset()
            assert net.out.buffer is None
    assert len(bufs[s1]) == len(bufs[s2]) == 1 and bufs[s1] != bufs[s2]
    assert s1.reuse.hits == 3 and s2.reuse.hits == 3
    s1.free()
    s2.free()


# -- several graphs: the records are kept per graph (LRU), so alternating graphs hit ----------


def _round(sched, nets, X):
    for net in nets:
        _check(_run(sched, net, X), net.ref(X))


@pytest.mark.parametrize("parallel", [False, True])
def test_alternating_graphs_take_the_fast_path(sim_cpu, parallel):
    sim, cpu = sim_cpu
    nets = [Net(sim, cpu) for _ in range(3)]
    sched = Scheduler([sim, cpu], parallel=parallel)
    n_slots = sched.get_n_copies()
    X = RNG.standard_normal((3, 8)).astype(np.float32)
    # the copy slot rotates per alloc_graph: 3 graphs over 4 slots meet every (graph, slot) pair
    # once in the first 4 rounds, each a split
    for _ in range(n_slots):
        _round(sched, nets, X)
    assert (sched.reuse.misses, sched.reuse.hits) == (3 * n_slots, 0)
    for k in range(3):
        X = RNG.standard_normal((3, 8)).astype(np.float32)
        _round(sched, nets, X)
        assert (sched.reuse.misses, sched.reuse.hits) == (3 * n_slots, 3 * (k + 1))
    sched.reset()
    for net in nets:  # reset still un-places every graph's tensors
        assert net.out.buffer is None and net.h.buffer is None
    sched.free()


@pytest.mark.parametrize("kind", ["op_params", "rewire", "new_view", "pin", "weight_buffer",
                                  "compute_buffer_freed"])
def test_mutating_one_of_several_graphs_splits_only_that_one(sim_cpu, kind):
    sim, cpu = sim_cpu
    nets = [Net(sim, cpu) for _ in range(3)]
    sched = Scheduler([sim, cpu])
    X = RNG.standard_normal((3, 8)).astype(np.float32)
    _round(sched, nets, X)
    _round(sched, nets, X)
    assert (sched.reuse.misses, sched.reuse.hits) == (3, 3)
    target = nets[1]
    sched.reset()
    want = dict(_mutations(target, sim, cpu))[kind](sched) or target.ref
    assert sched.alloc_graph(target.g)  # (a pin holds for this alloc only)
    backend_tensor_set(target.x, X)
    assert sched.graph_compute(target.g) == Status.SUCCESS
    _check(backend_tensor_get(target.out)[0, 0], want(X))
    assert (sched.reuse.misses, sched.reuse.hits) == (4, 3)
    for net in (nets[0], nets[2]):
        _check(_run(sched, net, X), net.ref(X))
    # the other graphs still replay, except after a freed compute buffer (every record points
    # into the compute buffers, so all are dropped)
    if kind == "compute_buffer_freed":
        assert (sched.reuse.misses, sched.reuse.hits) == (6, 3)
    else:
        assert (sched.reuse.misses, sched.reuse.hits) == (4, 5)
    sched.free()


def _compute_buffers(sched):
    return [id(b) for i in range(sched.get_n_backends()) for b in sched.galloc.get_chunk_buffers(i)]


def test_random_mutations_among_alternating_graphs_equal_fresh(sim_cpu):
    # randomized over mutation kinds, the graph mutated and the order of evaluation: every
    # result equals the reference and a fresh scheduler's result; a graph replays exactly when
    # it was neither mutated nor invalidated since its last split
    sim, cpu = sim_cpu
    rng = np.random.default_rng(11)
    for _trial in range(6):
        nets = [Net(sim, cpu) for _ in range(3)]
        wants = [net.ref for net in nets]
        sched = Scheduler([sim, cpu])
        X = rng.standard_normal((3, 8)).astype(np.float32)
        _round(sched, nets, X)
        valid = {0, 1, 2}
        for _step in range(8):
            i = int(rng.integers(3))
            net = nets[i]
            sched.reset()
            # (each graph is mutated at most once: the expected-result functions do not compose)
            mutated = rng.random() < 0.5 and wants[i] == net.ref
            name = None
            if mutated:
                kinds = [k for k in _mutations(net, sim, cpu) if k[0] != "pin"]
                name, mutate = kinds[rng.integers(len(kinds))]
                before = _compute_buffers(sched)
                wants[i] = mutate(sched) or net.ref
                if _compute_buffers(sched) != before:
                    valid.clear()  # (a reserve only frees buffers when they must grow)
            m0, h0 = sched.reuse.misses, sched.reuse.hits
            assert sched.alloc_graph(net.g)
            # a graph replays exactly when it was neither mutated nor invalidated since its
            # last split (a freed compute buffer invalidates every graph)
            assert sched.reuse.hits == h0 + (i in valid and not mutated), (name, valid)
            valid.add(i)
            backend_tensor_set(net.x, X)
            assert sched.graph_compute(net.g) == Status.SUCCESS
            got = backend_tensor_get(net.out)[0, 0]
            _check(got, wants[i](X))
            fresh = Scheduler([sim, cpu])
            _check(_run(fresh, net, X), got)
            fresh.free()
            assert sched.reuse.misses + sched.reuse.hits == m0 + h0 + 1
        sched.free()


def test_reuse_cache_is_bounded_and_counts_evictions(sim_cpu):
    from ggmlpy.sched.reuse import ReuseCache
    sim, cpu = sim_cpu
    nets = [Net(sim, cpu) for _ in range(4)]
    sched = Scheduler([sim, cpu])
    sched.reuse = ReuseCache(capacity=3)
    X = RNG.standard_normal((3, 8)).astype(np.float32)
    _round(sched, nets, X)  # 4 graphs through 3 places: the first is evicted
    assert len(sched.reuse) == 3 and sched.reuse.evictions == 1
    _round(sched, nets, X)  # LRU order: every graph is evicted before it comes back
    assert (sched.reuse.misses, sched.reuse.hits) == (8, 0)
    for net in (nets[3], nets[2], nets[1]):  # the 3 most recent replay
        _check(_run(sched, net, X), net.ref(X))
    assert (sched.reuse.misses, sched.reuse.hits) == (8, 3)
    sched.reset()
    assert all(net.out.buffer is None for net in nets)
    sched.free()
    with pytest.raises(ValueError, match="capacity"):
        ReuseCache(capacity=0)


def test_dead_graph_drops_its_record(sim_cpu):
    import gc
    sim, cpu = sim_cpu
    nets = [Net(sim, cpu) for _ in range(2)]
    sched = Scheduler([sim, cpu])
    X = RNG.standard_normal((3, 8)).astype(np.float32)
    _round(sched, nets, X)
    assert len(sched.reuse) == 2
    sched.reset()
    nets[0].g = None
    gc.collect()
    assert len(sched.reuse) == 1
    _check(_run(sched, nets[1], X), nets[1].ref(X))
    assert sched.reuse.hits == 1
    sched.free()


@pytest.mark.parametrize("parallel", [False, True])
def test_graph_that_grew_the_buffers_replays_next_time(parallel):
    """A graph whose allocation grows a compute buffer (the old one freed, which drops every
    record) is kept with its new record: its next allocation replays (it used to be split again,
    through a template, and GGMLPY_SCHED_DEBUG printed its table a second time)."""
    sched = Scheduler([gp.backend_cpu_init()], parallel=parallel)
    n_slots = sched.n_copies
    for n in (16, 64, 256):                               # each one grows the buffer
        ctx = Context()
        x = ctx.new_tensor_1d(Type.F32, n).set_name("x").set_input()
        y = gp.scale(ctx, gp.sqr(ctx, x), 3.0).set_name("y").set_output()
        g = Graph()
        g.build_forward_expand(y)
        misses0, hits0 = sched.reuse.misses, sched.reuse.hits
        for _k in range(3 * n_slots):
            X = RNG.standard_normal(n).astype(np.float32)
            sched.reset()
            assert sched.alloc_graph(g)
            backend_tensor_set(x, X)
            assert sched.graph_compute(g) == Status.SUCCESS
            np.testing.assert_allclose(backend_tensor_get(y).ravel(), 3.0 * X.astype(np.float64) ** 2,
                                       rtol=1e-6)
        sched.synchronize()
        # one split per copy slot, replays only after that
        assert sched.reuse.misses - misses0 == n_slots
        assert sched.reuse.hits - hits0 == 2 * n_slots
