"""Reserve leaves nothing to plan: a reserved graph is planned once, and with ``parallel``
(n_copies = 4) that one plan serves every copy slot (the split inputs of different copies have
the same sizes and wiring), as in ggml. Counted with ``Scheduler.n_plans``; the allocator's
vouch for another slot is verified (``gallocr.VERIFY_VOUCH``: the slot's graph is planned aside
and the plans compared) and every result is compared with float64 NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from backend_kinds import new_sim_devices

import ggmlpy as gp
from ggmlpy import Context, Graph, Op, Type
from ggmlpy.alloc import gallocr
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage, Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_get_async, backend_tensor_set
from ggmlpy.sched.scheduler import Scheduler


@pytest.fixture(autouse=True)
def verify_vouch(monkeypatch):
    monkeypatch.setattr(gallocr, "VERIFY_VOUCH", True)


def _model(latency_us: float = 0.0):
    """x [16, 4] (input) -> a = W x (SIM) -> s = soft_max(a) (CPU: SIM refuses it) -> y = W s
    (SIM): two split inputs crossing devices (a down, s up) plus the user input."""
    rng = np.random.default_rng(3)
    sim = new_sim_devices(1, latency_us=latency_us, refuse_ops={Op.SOFT_MAX})[0].init_backend()
    cpu = gp.backend_cpu_init()
    wctx = Context()
    w = wctx.new_tensor_2d(Type.F32, 16, 16).set_name("w")
    alloc_ctx_tensors_from_buft(wctx, sim.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
    W = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
    backend_tensor_set(w, W)
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 16, 4).set_name("x").set_input()
    s = gp.soft_max(ctx, gp.mul_mat(ctx, w, x).set_name("a")).set_name("s")
    y = gp.mul_mat(ctx, w, s).set_name("y").set_output()
    g = Graph()
    g.build_forward_expand(y)

    def reference(xv: np.ndarray) -> np.ndarray:
        a = xv.astype(np.float64) @ W.T.astype(np.float64)
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)) @ W.T.astype(np.float64)
    return sim, cpu, ctx, x, y, g, reference, rng


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
def test_reserved_graph_is_planned_once_in_every_copy_slot(parallel):
    sim, cpu, _ctx, x, y, g, reference, rng = _model(latency_us=200)
    sched = Scheduler([sim, cpu], parallel=parallel)
    assert sched.reserve(g)
    assert sched.n_plans == 1
    sizes = [sched.get_buffer_size(b) for b in (sim, cpu)]
    n_eval = 3 * sched.get_n_copies()
    xs = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(n_eval)]
    outs = [np.full((4, 16), np.nan, np.float32) for _ in range(n_eval)]
    slots = []
    for k in range(n_eval):
        sched.reset()
        assert sched.alloc_graph(g)
        slots.append(sched.cur_copy)
        backend_tensor_set(x, xs[k])
        assert sched.graph_compute_async(g) == Status.SUCCESS
        backend_tensor_get_async(sim, y, outs[k])
    sched.synchronize()
    assert sorted(set(slots)) == list(range(sched.get_n_copies()))
    assert sched.n_plans == 1  # was 1 + 3 with parallel: one plan per slot's first use
    assert [sched.get_buffer_size(b) for b in (sim, cpu)] == sizes
    for k in range(n_eval):
        np.testing.assert_allclose(outs[k], reference(xs[k]), rtol=1e-5, atol=1e-6)


def test_copy_slots_keep_disjoint_memory_under_one_plan():
    # the four slots' copies of each split input (and of the user input x, whose current slot
    # is x itself) live at four different addresses
    sim, cpu, _ctx, x, y, g, reference, rng = _model()
    sched = Scheduler([sim, cpu], parallel=True)
    assert sched.reserve(g)
    addrs: dict[str, set] = {}
    for _ in range(4):
        sched.reset()
        assert sched.alloc_graph(g)
        for (src, b), copies in sched._state.copies.items():
            cur = copies[sched.cur_copy]
            addrs.setdefault(f"{src.name}@{b}", set()).add((id(cur.buffer), cur.offset))
        xv = rng.standard_normal((4, 16)).astype(np.float32)
        backend_tensor_set(x, xv)
        assert sched.graph_compute(g) == Status.SUCCESS
        np.testing.assert_allclose(backend_tensor_get(y)[0, 0], reference(xv), rtol=1e-5,
                                   atol=1e-6)
    assert sched.n_plans == 1
    assert sorted(addrs) == ["a@1", "s@0", "x@0", "x@1"]
    assert all(len(v) == 4 for v in addrs.values())


def test_preallocated_graph_input_is_planned_per_slot_and_stays_right():
    # the user's own x (pre-allocated) is the current slot of its copies: its slot-0 plan does
    # not place the duplicates standing in for it in other slots, so each slot plans
    sim, cpu, ctx, x, y, g, reference, rng = _model()
    xctx = Context()
    x2 = xctx.new_tensor_2d(Type.F32, 16, 4).set_name("x2").set_input()
    alloc_ctx_tensors_from_buft(xctx, cpu.get_default_buffer_type())
    y2 = gp.mul_mat(ctx, y.src[0], gp.soft_max(ctx, gp.mul_mat(ctx, y.src[0], x2)))
    g2 = Graph()
    g2.build_forward_expand(y2.set_output())
    sched = Scheduler([sim, cpu], parallel=True)
    assert sched.reserve(g2)
    for _ in range(8):
        sched.reset()
        assert sched.alloc_graph(g2)
        xv = rng.standard_normal((4, 16)).astype(np.float32)
        backend_tensor_set(x2, xv)
        assert sched.graph_compute(g2) == Status.SUCCESS
        np.testing.assert_allclose(backend_tensor_get(y2)[0, 0], reference(xv), rtol=1e-5,
                                   atol=1e-6)
    assert sched.n_plans == 4  # reserve (slot 0) + slots 1..3: no vouch across slots here
