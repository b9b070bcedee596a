"""Scheduler placement rules beyond the seed's passes (issue 10 items 3 and 17).

* An in-place writer (a non-view node with a ``view_src``) writes into its ``view_src``'s memory,
  so it runs on a backend that can access that memory, with its other operands copied in; where
  no such backend runs the op, ``alloc_graph`` (split time) raises, never the compute.
* A graph whose only nodes are views still gets one split, so its views are placed.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Graph, Op, Type
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage, Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.core.errors import UnsupportedOpError
from ggmlpy.sched.scheduler import Scheduler

RNG = np.random.default_rng(77)


@pytest.fixture(scope="module")
def devs(sim_devices):
    """(SIM0, SIM1, CPU) and two SIM devices that refuse the in-place ops' op codes."""
    reg = sim_devices(2, latency_us=0.0)
    bad = sim_devices(2, latency_us=0.0,
                  refuse_ops={Op.ADD, Op.SUB, Op.MUL, Op.SQR, Op.SCALE, Op.SET, Op.ACC})
    return ([d.init_backend() for d in reg], [d.init_backend() for d in bad],
            gp.backend_cpu_init())


def _weight(backend, arr):
    c = Context()
    t = c.new_tensor_2d(Type.F32, arr.shape[1], arr.shape[0])
    alloc_ctx_tensors_from_buft(c, backend.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
    backend_tensor_set(t, arr)
    return t


# op name -> (build r from (ctx, A, B), float64 reference from (A, B) as NumPy (3, 4) arrays)
def _ref_set_1d(a, b):
    out = a.copy().ravel()
    out[4:8] = b.ravel()[:4]
    return out.reshape(a.shape)


def _ref_acc(a, b):
    out = a.copy()
    out[:, 2:4] += b[:, 0:2]
    return out


INPLACE = {
    "add": (lambda ctx, A, B: gp.add_inplace(ctx, A, B), lambda a, b: a + b),
    "sub": (lambda ctx, A, B: gp.sub_inplace(ctx, A, B), lambda a, b: a - b),
    "mul": (lambda ctx, A, B: gp.mul_inplace(ctx, A, B), lambda a, b: a * b),
    "sqr": (lambda ctx, A, B: gp.sqr_inplace(ctx, A), lambda a, b: a * a),
    "scale": (lambda ctx, A, B: gp.scale_inplace(ctx, A, 2.5), lambda a, b: 2.5 * a),
    "set_1d": (lambda ctx, A, B: gp.set_1d_inplace(ctx, A, gp.view_1d(ctx, B, 4, 0), 16), _ref_set_1d),
    "acc": (lambda ctx, A, B: gp.acc_inplace(ctx, A, gp.view_2d(ctx, B, 2, 3, B.nb[1], 0),
                                             A.nb[1], A.nb[2], A.nb[3], 8), _ref_acc),
}


def _case(op, a_backend, b_backend, backends, b_first=True, refusing_owner=False):
    """A = W_a x on ``a_backend``'s weights, B = W_b x on ``b_backend``'s, r = op(A, B) in place,
    out = r + B. With ``b_first`` B comes before r in the graph (so the seed's expansion would
    give r B's backend). Checks r and out against float64, or that ``alloc_graph`` raises when
    ``refusing_owner`` (A's backend refuses the op and no other can access its memory)."""
    Wa = RNG.standard_normal((4, 8)).astype(np.float32)
    Wb = RNG.standard_normal((4, 8)).astype(np.float32)
    X = RNG.standard_normal((3, 8)).astype(np.float32)
    wa, wb = _weight(a_backend, Wa), _weight(b_backend, Wb)
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 8, 3).set_name("x").set_input()
    A = gp.mul_mat(ctx, wa, x).set_name("A")
    B = gp.mul_mat(ctx, wb, x).set_name("B")
    build, ref = INPLACE[op]
    r = build(ctx, A, B).set_name("r")
    assert r.view_src is A  # the writer's result is a view of A
    out = gp.add(ctx, r, B).set_name("out").set_output()
    g = Graph()
    if b_first:
        g.build_forward_expand(B)
    g.build_forward_expand(out)
    sched = Scheduler(backends)
    try:
        if refusing_owner:
            with pytest.raises(UnsupportedOpError, match="'r'.*writes in place into 'A'"):
                sched.alloc_graph(g)
            return
        assert sched.alloc_graph(g)
        backend_tensor_set(x, X)
        assert sched.graph_compute(g) == Status.SUCCESS
        a = X.astype(np.float64) @ Wa.T.astype(np.float64)
        b = X.astype(np.float64) @ Wb.T.astype(np.float64)
        want = ref(a, b)
        # float32 GEMVs of K=8 then one elementwise op, against float64
        np.testing.assert_allclose(backend_tensor_get(out)[0, 0], want + b, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(backend_tensor_get(A)[0, 0], want, rtol=1e-5, atol=1e-5)
        placed = {n["name"]: n["backend"] for n in sched.report()["nodes"]}
        assert placed["r"] == a_backend.name  # where A's memory is
    finally:
        sched.free()


# -- the examples ------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["add", "set_1d", "acc", "sqr"])
def test_inplace_writer_on_sim_memory_runs_on_sim(devs, op):
    (s0, s1), _bad, cpu = devs
    _case(op, s0, cpu, [s0, cpu])


def test_inplace_writer_mirror_cpu_memory_runs_on_cpu(devs):
    (s0, s1), _bad, cpu = devs
    _case("add", cpu, s0, [s0, cpu])


def test_inplace_writer_whose_owner_refuses_the_op_raises_at_split_time(devs):
    _ok, (b0, b1), cpu = devs
    _case("add", b0, cpu, [b0, cpu], refusing_owner=True)


def test_pinned_inplace_writer_that_cannot_reach_its_memory_raises_at_split_time(devs):
    (s0, s1), _bad, cpu = devs
    wa = _weight(s0, np.ones((4, 8), np.float32))
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 8, 3).set_name("x").set_input()
    A = gp.mul_mat(ctx, wa, x).set_name("A")
    r = gp.sqr_inplace(ctx, A).set_name("r").set_output()
    g = Graph()
    g.build_forward_expand(r)
    sched = Scheduler([s0, cpu])
    sched.set_tensor_backend(r, cpu)
    with pytest.raises(UnsupportedOpError, match="pinned to CPU"):
        sched.alloc_graph(g)
    sched.reset()  # usable again; without the pin r follows A
    assert sched.alloc_graph(g)
    backend_tensor_set(x, np.ones((3, 8), np.float32))
    sched.graph_compute(g)
    assert np.all(backend_tensor_get(r) == 64.0)
    sched.free()


# -- randomized over in-place ops x placements x graph orders x refusing owners ------------------
ALL_CASES = list(itertools.product(sorted(INPLACE), range(3), range(3), (True, False), (False, True)))


@pytest.mark.parametrize("case", random.Random(10).sample(ALL_CASES, 40))
def test_inplace_writers_random_placements(devs, case):
    op, ia, ib, b_first, refusing = case
    ok, bad, cpu = devs
    sims = bad if refusing else ok
    placements = [sims[0], sims[1], cpu]
    _case(op, placements[ia], placements[ib], [sims[0], sims[1], cpu], b_first=b_first,
          refusing_owner=refusing and ia < 2)


# -- graphs of views only (issue 10 item 17) -----------------------------------------------------
def test_view_only_graph_of_a_weight_is_placed(devs):
    (s0, s1), _bad, cpu = devs
    ctx = Context()
    t0 = ctx.new_tensor_4d(Type.F32, 1, 1, 4, 3).set_name("t0")
    t1 = gp.view_3d(ctx, t0, 1, 1, 4, 4, 4, 32).set_name("t1").set_output()
    alloc_ctx_tensors_from_buft(ctx, cpu.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
    data = np.arange(12, dtype=np.float32).reshape(3, 4, 1, 1) * 1.5
    backend_tensor_set(t0, data)
    g = Graph()
    g.build_forward_expand(t1)
    assert g.n_nodes == 1 and g.nodes[0].op == Op.VIEW
    sched = Scheduler([s0, s1, cpu])
    assert sched.alloc_graph(g)
    assert sched.get_n_splits() == 1
    assert t1.buffer is t0.buffer and t1.offset == t0.offset + 32
    assert sched.graph_compute(g) == Status.SUCCESS
    np.testing.assert_array_equal(backend_tensor_get(t1).ravel(), data.ravel()[8:12])
    sched.free()


@pytest.mark.parametrize("which", ["cpu", "sims"])
def test_view_only_graph_of_an_input_is_placed(devs, which):
    (s0, s1), _bad, cpu = devs
    ctx = Context()
    t0 = ctx.new_tensor_4d(Type.F32, 1, 1, 4, 3).set_name("t0").set_input()
    t1 = gp.view_3d(ctx, t0, 1, 1, 4, 4, 4, 32).set_name("t1").set_output()
    g = Graph()
    g.build_forward_expand(t1)
    sched = Scheduler([cpu] if which == "cpu" else [s0, s1, cpu])
    assert sched.alloc_graph(g)
    assert t0.buffer is not None and t1.buffer is t0.buffer and t1.offset == t0.offset + 32
    data = RNG.standard_normal((3, 4, 1, 1)).astype(np.float32)
    backend_tensor_set(t0, data)
    assert sched.graph_compute(g) == Status.SUCCESS
    np.testing.assert_array_equal(backend_tensor_get(t1).ravel(), data.ravel()[8:12])
    sched.reset()
    assert t1.buffer is None and t0.buffer is None  # the scheduler un-places what it placed
    sched.free()
