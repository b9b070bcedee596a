"""The scheduler on CPU + SIM devices: assignment, splits, copies, recompute, pipelining, errors."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from backend_kinds import new_sim_devices

import ggmlpy as gp
from ggmlpy import Context, Graph, Op, Type
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage, Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_get_async, backend_tensor_set
from ggmlpy.core.errors import UnsupportedOpError
from ggmlpy.sched.scheduler import Scheduler

RNG = np.random.default_rng(1234)


def _sim(latency_us=0.0, refuse=(), memory_mb=None, n=1):
    devs = new_sim_devices(n, latency_us=latency_us, memory_mb=memory_mb, refuse_ops=set(refuse))
    return [d.init_backend() for d in devs]


class MLP:
    """x [8, n_tok] -> W1 (SIM weights) -> +b1 -> soft_max -> W2 (SIM weights) -> out [6, n_tok]."""

    def __init__(self, weights_backend, n_tok=5):
        self.wctx = Context()
        self.w1 = self.wctx.new_tensor_2d(Type.F32, 8, 16).set_name("w1")
        self.b1 = self.wctx.new_tensor_1d(Type.F32, 16).set_name("b1")
        self.w2 = self.wctx.new_tensor_2d(Type.F32, 16, 6).set_name("w2")
        self.wbuf = alloc_ctx_tensors_from_buft(self.wctx, weights_backend.get_default_buffer_type())
        self.wbuf.set_usage(BufferUsage.WEIGHTS)
        self.W1 = RNG.standard_normal((16, 8)).astype(np.float32)
        self.B1 = RNG.standard_normal(16).astype(np.float32)
        self.W2 = RNG.standard_normal((6, 16)).astype(np.float32)
        backend_tensor_set(self.w1, self.W1)
        backend_tensor_set(self.b1, self.B1)
        backend_tensor_set(self.w2, self.W2)
        ctx = self.ctx = Context()
        self.x = ctx.new_tensor_2d(Type.F32, 8, n_tok).set_name("x").set_input()
        h = gp.add(ctx, gp.mul_mat(ctx, self.w1, self.x), self.b1).set_name("h")
        s = gp.soft_max(ctx, h).set_name("s")
        self.out = gp.mul_mat(ctx, self.w2, s).set_name("out").set_output()
        self.graph = Graph()
        self.graph.build_forward_expand(self.out)

    def reference(self, x):
        h = x.astype(np.float64) @ self.W1.T.astype(np.float64) + self.B1
        e = np.exp(h - h.max(axis=-1, keepdims=True))
        s = e / e.sum(axis=-1, keepdims=True)
        return s @ self.W2.T.astype(np.float64)


def _sqr_scale_graph():
    """x (input, 64 floats) -> y = 3 * x^2 (output); returns (x, y, graph)."""
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 64).set_name("x").set_input()
    y = gp.scale(ctx, gp.sqr(ctx, x), 3.0).set_name("y").set_output()
    g = Graph()
    g.build_forward_expand(y)
    return x, y, g


def _srcs_snapshot(graph):
    return [(n, list(n.src)) for n in graph.nodes]


def test_last_backend_must_be_cpu():
    sim = _sim()[0]
    with pytest.raises(ValueError, match="CPU"):
        Scheduler([gp.backend_cpu_init(), sim])
    with pytest.raises(ValueError):
        Scheduler([])
    with pytest.raises(ValueError, match="16"):
        Scheduler([gp.backend_cpu_init()] * 17)


def test_cpu_only_matches_reference():
    cpu = gp.backend_cpu_init()
    m = MLP(cpu)
    sched = Scheduler([cpu])
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    assert sched.alloc_graph(m.graph)
    backend_tensor_set(m.x, x)
    assert sched.graph_compute(m.graph) == Status.SUCCESS
    assert sched.get_n_splits() == 1
    # float32 kernels vs float64 reference, K <= 16: 1e-5 relative is ample
    np.testing.assert_allclose(backend_tensor_get(m.out)[0, 0], m.reference(x), rtol=1e-5, atol=1e-6)


def test_split_assignment_and_copies_with_refused_op():
    sim = _sim(refuse={Op.SOFT_MAX})[0]
    cpu = gp.backend_cpu_init()
    m = MLP(sim)
    before = _srcs_snapshot(m.graph)
    sched = Scheduler([sim, cpu])
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    assert sched.alloc_graph(m.graph)
    backend_tensor_set(m.x, x)
    assert sched.graph_compute(m.graph) == Status.SUCCESS
    rep = sched.report()
    by_name = {n["name"]: n for n in rep["nodes"]}
    assert by_name["s"]["backend"] == "CPU"           # SIM refuses SOFT_MAX
    assert by_name["out"]["backend"] == sim.name and by_name["out"]["cause"] == "1.wgt"
    assert by_name["h"]["backend"] == sim.name
    assert [s["backend"] for s in rep["splits"]] == [sim.name, "CPU", sim.name]
    assert [[i["name"] for i in s["inputs"]] for s in rep["splits"]] == [["x"], ["h"], ["s"]]
    assert rep["splits"][0]["inputs"][0]["bytes"] == 8 * 5 * 4
    np.testing.assert_allclose(backend_tensor_get(m.out)[0, 0], m.reference(x), rtol=1e-5, atol=1e-6)
    # the user's tensors were not rewritten
    assert _srcs_snapshot(m.graph) == before


def test_weights_on_sim_results_equal_cpu_only_run():
    sim = _sim(latency_us=300, refuse={Op.SOFT_MAX})[0]
    cpu = gp.backend_cpu_init()
    m_sim, m_cpu = MLP(sim), MLP(cpu)
    # same weights on both
    for t, arr in ((m_cpu.w1, m_sim.W1), (m_cpu.b1, m_sim.B1), (m_cpu.w2, m_sim.W2)):
        backend_tensor_set(t, arr)
    s1, s2 = Scheduler([sim, cpu]), Scheduler([cpu])
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    for sched, m in ((s1, m_sim), (s2, m_cpu)):
        sched.alloc_graph(m.graph)
        backend_tensor_set(m.x, x)
        sched.graph_compute(m.graph)
    # the same NumPy kernels run on both devices: the results are bit-identical
    np.testing.assert_array_equal(backend_tensor_get(m_sim.out), backend_tensor_get(m_cpu.out))


def test_recompute_after_reset_and_resplit_with_new_inputs():
    sim = _sim(latency_us=200, refuse={Op.SOFT_MAX})[0]
    cpu = gp.backend_cpu_init()
    m = MLP(sim)
    sched = Scheduler([sim, cpu])
    assert sched.reserve(m.graph)
    size0 = sched.get_buffer_size(sim)
    assert size0 > 0
    for _k in range(4):
        x = RNG.standard_normal((5, 8)).astype(np.float32)
        sched.reset()
        assert sched.alloc_graph(m.graph)
        backend_tensor_set(m.x, x)
        assert sched.graph_compute(m.graph) == Status.SUCCESS
        np.testing.assert_allclose(backend_tensor_get(m.out)[0, 0], m.reference(x), rtol=1e-5, atol=1e-6)
        # recompute the allocated graph with new input values, no re-split
        x2 = RNG.standard_normal((5, 8)).astype(np.float32)
        backend_tensor_set(m.x, x2)
        sched.graph_compute(m.graph)
        np.testing.assert_allclose(backend_tensor_get(m.out)[0, 0], m.reference(x2), rtol=1e-5, atol=1e-6)
    assert sched.get_buffer_size(sim) == size0  # no re-plan grew anything
    with pytest.raises(ValueError, match="already allocated"):
        sched.alloc_graph(m.graph)


def test_parallel_pipelined_evaluations_with_latency():
    sim = _sim(latency_us=500, refuse={Op.SOFT_MAX})[0]
    cpu = gp.backend_cpu_init()
    m = MLP(sim)
    sched = Scheduler([sim, cpu], parallel=True)
    assert sched.get_n_copies() == 4
    assert sched.reserve(m.graph)
    n_eval = 12
    xs = [RNG.standard_normal((5, 8)).astype(np.float32) for _ in range(n_eval)]
    outs = [np.empty((1, 1, 5, 6), np.float32) for _ in range(n_eval)]
    user = np.empty((5, 8), np.float32)
    for k in range(n_eval):
        sched.reset()
        assert sched.alloc_graph(m.graph)
        user[:] = xs[k]
        backend_tensor_set(m.x, user)
        assert sched.graph_compute_async(m.graph) == Status.SUCCESS
        user[:] = 1e6  # overwriting the caller's data right away must not leak in
        backend_tensor_get_async(sim, m.out, outs[k])
    sched.synchronize()
    for k in range(n_eval):
        np.testing.assert_allclose(outs[k][0, 0], m.reference(xs[k]), rtol=1e-5, atol=1e-6)


def test_parallel_user_input_overwritten_after_compute_async():
    # input feeding the SIM split directly: it must be copied before graph_compute_async returns
    sim = _sim(latency_us=2000)[0]
    cpu = gp.backend_cpu_init()
    x, y, g = _sqr_scale_graph()
    sched = Scheduler([sim, cpu], parallel=True)
    results = []
    for k in range(6):
        sched.reset()
        for n in g.nodes:  # no weights: pin the work to SIM so the input crosses devices
            sched.set_tensor_backend(n, sim)
        sched.alloc_graph(g)
        assert [s["backend"] for s in sched.report()["splits"]] == [sim.name]
        data = np.full(64, float(k), np.float32)
        backend_tensor_set(x, data)
        sched.graph_compute_async(g)
        backend_tensor_set(x, np.full(64, -99.0, np.float32))  # x is host memory (CPU)
        out = np.empty(64, np.float32)
        backend_tensor_get_async(sim, y, out)
        results.append(out)
    sched.synchronize()
    for k, out in enumerate(results):
        assert np.all(out == 3.0 * k * k)


def test_no_backend_supports_node_then_reset_works():
    sim = _sim(refuse={Op.SQR})[0]
    cpu = gp.backend_cpu_init()
    ctx = Context()
    a = ctx.new_tensor_2d(Type.Q8_0, 32, 2).set_name("q").set_input()
    bad = gp.add(ctx, a, a).set_name("qadd")
    g = Graph()
    g.build_forward_expand(bad)
    sched = Scheduler([sim, cpu])
    with pytest.raises(UnsupportedOpError, match="qadd"):
        sched.alloc_graph(g)
    sched.reset()
    m = MLP(sim)
    assert sched.alloc_graph(m.graph)
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    backend_tensor_set(m.x, x)
    sched.graph_compute(m.graph)
    np.testing.assert_allclose(backend_tensor_get(m.out)[0, 0], m.reference(x), rtol=1e-5, atol=1e-6)


def test_preallocated_tensor_in_unusable_buffer_raises():
    sim = _sim(refuse={Op.CPY})[0]
    cpu = gp.backend_cpu_init()
    kctx = Context()
    cache = kctx.new_tensor_1d(Type.F32, 32).set_name("kv_cache")
    alloc_ctx_tensors_from_buft(kctx, sim.get_default_buffer_type())
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 8).set_name("x").set_input()
    dst = gp.view_1d(ctx, cache, 8, 0)
    w = gp.cpy(ctx, x, dst).set_name("store")
    g = Graph()
    g.build_forward_expand(w)
    sched = Scheduler([sim, cpu])
    with pytest.raises(UnsupportedOpError, match="kv_cache|store"):
        sched.alloc_graph(g)


def test_user_pin_and_reserve_keeps_it():
    sim = _sim()[0]
    cpu = gp.backend_cpu_init()
    m = MLP(cpu)
    sched = Scheduler([sim, cpu])
    s_node = m.graph.get_tensor("s")
    sched.set_tensor_backend(s_node, sim)
    assert sched.get_tensor_backend(s_node) is sim
    sched.split_graph(m.graph)
    assert sched.report()["nodes"][[n.name for n in m.graph.nodes].index("s")]["cause"] == "usr"
    sched.reset()
    assert sched.get_tensor_backend(s_node) is None


def test_eval_callback_observes_and_stops():
    cpu = gp.backend_cpu_init()
    m = MLP(cpu)
    sched = Scheduler([cpu])
    seen = []

    def cb(t, ask):
        if ask:
            return t.name in ("h", "s", "out")
        seen.append((t.name, backend_tensor_get(t).copy()))
        return t.name != "s"  # stop after s

    sched.set_eval_callback(cb)
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    sched.alloc_graph(m.graph)
    backend_tensor_set(m.x, x)
    assert sched.graph_compute(m.graph) == Status.ABORTED
    assert [n for n, _ in seen] == ["h", "s"]
    h = x.astype(np.float64) @ m.W1.T + m.B1
    np.testing.assert_allclose(seen[0][1][0, 0], h, rtol=1e-5, atol=1e-5)


def test_reserve_out_of_memory_returns_false_and_logs(caplog):
    sim = _sim(memory_mb=1)[0]
    cpu = gp.backend_cpu_init()
    wctx = Context()
    w = wctx.new_tensor_1d(Type.F32, 1).set_name("w")  # a 4-byte weight on SIM0
    alloc_ctx_tensors_from_buft(wctx, sim.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
    backend_tensor_set(w, np.array([2.0], np.float32))
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 1 << 20).set_name("x").set_input()  # 4 MiB
    y = gp.mul(ctx, x, w).set_name("y")  # next to its weight: on SIM0, which has 1 MiB
    z = gp.sqrt(ctx, y).set_name("z")
    g = Graph()
    g.build_forward_expand(z)
    sched = Scheduler([sim, cpu])
    with caplog.at_level(logging.ERROR, logger="ggmlpy"):
        assert sched.reserve(g) is False
    assert any("bytes" in r.getMessage() for r in caplog.records)
    assert x.buffer is None and list(z.src) == [y] and list(y.src) == [x, w]
    # computing without a successful allocation reports it instead of running
    with caplog.at_level(logging.ERROR, logger="ggmlpy"):
        assert sched.graph_compute(g) == Status.ALLOC_FAILED
    assert x.buffer is None and z.buffer is None
    # the scheduler works again with a graph that fits
    ctx2 = Context()
    a = ctx2.new_tensor_1d(Type.F32, 16).set_name("a").set_input()
    b = gp.sqr(ctx2, a).set_name("b")
    g2 = Graph()
    g2.build_forward_expand(b)
    sched.reset()
    assert sched.alloc_graph(g2)
    backend_tensor_set(a, np.arange(16, dtype=np.float32))
    sched.graph_compute(g2)
    np.testing.assert_array_equal(backend_tensor_get(b).ravel(), np.arange(16, dtype=np.float32) ** 2)


def test_debug_env_prints_report(monkeypatch, capsys):
    monkeypatch.setenv("GGMLPY_SCHED_DEBUG", "2")
    sim = _sim(refuse={Op.SOFT_MAX})[0]
    cpu = gp.backend_cpu_init()
    m = MLP(sim)
    sched = Scheduler([sim, cpu])
    sched.alloc_graph(m.graph)
    err = capsys.readouterr().err
    assert "SPLIT #0" in err and "SPLIT #2" in err and "SOFT_MAX" in err


def test_parallel_input_slots_rotate_and_never_overlap_intermediates():
    cpu = gp.backend_cpu_init()
    x, y, g = _sqr_scale_graph()
    sched = Scheduler([cpu], parallel=True)
    offsets = []
    for k in range(5):
        sched.reset()
        assert sched.alloc_graph(g)
        offsets.append(x.offset)
        spans = [(t.offset, t.offset + t.nbytes) for t in g.nodes]
        assert all(e <= x.offset or s >= x.offset + x.nbytes for s, e in spans)
        backend_tensor_set(x, np.full(64, float(k), np.float32))
        sched.graph_compute(g)
        assert np.all(backend_tensor_get(y) == 3.0 * k * k)
    assert len(set(offsets[:4])) == 4 and offsets[4] == offsets[0]  # 4 slots, rotating
    assert x.flags == gp.Flag.INPUT  # the scheduler's OUTPUT pin lives in its own tables


def test_plans_are_reused_across_resplits(monkeypatch):
    import ggmlpy.backends.cpu.backend as cpu_mod

    builds = []
    real = cpu_mod.build_plan
    monkeypatch.setattr(cpu_mod, "build_plan", lambda *a, **k: builds.append(1) or real(*a, **k))
    cpu = gp.backend_cpu_init()
    m = MLP(cpu)
    sched = Scheduler([cpu])
    for _k in range(4):
        x = RNG.standard_normal((5, 8)).astype(np.float32)
        sched.reset()
        sched.alloc_graph(m.graph)
        backend_tensor_set(m.x, x)
        sched.graph_compute(m.graph)
        np.testing.assert_allclose(backend_tensor_get(m.out)[0, 0], m.reference(x), rtol=1e-5, atol=1e-6)
    assert len(builds) == 1  # same split ranges and addresses: the CPU plan is built once


@pytest.mark.parametrize("parallel", [False, True])
def test_two_devices_chain_with_peer_copies(parallel, sim_devices):
    # SIM0 -> SIM1: the second device reads its copy of the first device's result
    reg = sim_devices(2, latency_us=300)
    s0, s1 = reg[0].init_backend(), reg[1].init_backend()
    cpu = gp.backend_cpu_init()

    def weight(backend, name, arr):
        c = Context()
        t = c.new_tensor_2d(Type.F32, 8, 8).set_name(name)
        alloc_ctx_tensors_from_buft(c, backend.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
        backend_tensor_set(t, arr)
        return t

    W0 = RNG.standard_normal((8, 8)).astype(np.float32)
    W1 = RNG.standard_normal((8, 8)).astype(np.float32)
    w0, w1 = weight(s0, "w0", W0), weight(s1, "w1", W1)
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 8, 3).set_name("x").set_input()
    h = gp.tanh(ctx, gp.mul_mat(ctx, w0, x)).set_name("h")
    y = gp.mul_mat(ctx, w1, h).set_name("y").set_output()
    g = Graph()
    g.build_forward_expand(y)
    sched = Scheduler([s0, s1, cpu], parallel=parallel)
    xs = [RNG.standard_normal((3, 8)).astype(np.float32) for _ in range(6)]
    outs = [np.empty((1, 1, 3, 8), np.float32) for _ in xs]
    for xk, ok in zip(xs, outs):
        sched.reset()
        assert sched.alloc_graph(g)
        backend_tensor_set(x, xk)
        assert sched.graph_compute_async(g) == Status.SUCCESS
        backend_tensor_get_async(s1, y, ok)
    sched.synchronize()
    rep = sched.report()
    assert [s["backend"] for s in rep["splits"]] == [s0.name, s1.name]
    assert [[i["name"] for i in s["inputs"]] for s in rep["splits"]] == [["x"], ["h"]]
    for xk, ok in zip(xs, outs):
        ref = np.tanh(xk.astype(np.float64) @ W0.T) @ W1.T.astype(np.float64)
        # float32 matmuls of K=8 and tanh against float64: 1e-5 relative is ample
        np.testing.assert_allclose(ok[0, 0], ref, rtol=1e-5, atol=1e-5)


def test_view_made_between_evaluations_follows_its_source():
    # a view created while its source is placed (so it gets that address at once) must follow
    # the source when the scheduler re-places it for another graph
    cpu = gp.backend_cpu_init()
    sched = Scheduler([cpu])
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 8).set_name("x").set_input()
    y = ctx.new_tensor_1d(Type.F32, 256).set_name("y").set_input()
    z = ctx.new_tensor_1d(Type.F32, 100000).set_input()
    g0 = Graph()
    g0.build_forward_expand(gp.sum(ctx, gp.scale(ctx, gp.scale(ctx, z, 1.0), 1.0)).set_output())
    assert sched.reserve(g0)  # a compute buffer large enough for both graphs below
    h = gp.scale(ctx, x, 2.0).set_name("h")
    g1 = Graph()
    g1.build_forward_expand(h.set_output())
    sched.alloc_graph(g1)
    backend_tensor_set(x, np.arange(8, dtype=np.float32))
    sched.graph_compute(g1)
    v = gp.view_1d(ctx, h, 8, 0).set_name("v")  # placed at h's current address
    out = gp.add(ctx, gp.sum(ctx, gp.scale(ctx, y, 1.0)), gp.sum(ctx, v)).set_output()
    g2 = Graph()
    g2.build_forward_expand(out)
    sched.reset()
    sched.alloc_graph(g2)
    assert v.buffer is h.buffer and v.offset == h.offset
    backend_tensor_set(x, np.arange(8, dtype=np.float32))
    backend_tensor_set(y, np.ones(256, np.float32))
    sched.graph_compute(g2)
    assert backend_tensor_get(out).ravel()[0] == 256 + 2 * np.arange(8).sum()


def test_compact_alloc_policy_through_the_scheduler():
    sim = _sim(latency_us=100, refuse={Op.SOFT_MAX})[0]
    cpu = gp.backend_cpu_init()
    m = MLP(sim)
    sched = Scheduler([sim, cpu], parallel=True, alloc_policy="compact")
    for _ in range(3):
        x = RNG.standard_normal((5, 8)).astype(np.float32)
        sched.reset()
        assert sched.alloc_graph(m.graph)
        backend_tensor_set(m.x, x)
        sched.graph_compute(m.graph)
        np.testing.assert_allclose(backend_tensor_get(m.out)[0, 0], m.reference(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="policy"):
        Scheduler([cpu], alloc_policy="tightest")
