"""The scheduler vouches for its own graph (issue 11 item 3, fresh split+alloc).

A fresh graph object with the same structure as the last one allocated (equal user-graph state
and split signature, :func:`ggmlpy.sched.reuse.split_signature`) builds a scheduler graph with the
state the allocator's plan was validated for, so ``Scheduler._alloc_slow`` tells the allocator
(``GraphAllocator._vouch``) and its state compare is skipped. These tests run with
``gallocr.VERIFY_VOUCH`` on (every vouch is checked by the full compare, a wrong one raises) and
check that every kind of difference withholds the vouch and that results equal float64 NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Graph, Type
from ggmlpy.alloc import gallocr
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage, Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.sched.scheduler import Scheduler


@pytest.fixture(scope="module")
def env(sim_devices):
    reg = sim_devices(1, latency_us=0.0)
    sim, cpu = reg[0].init_backend(), gp.backend_cpu_init()
    rng = np.random.default_rng(7)
    arrs = {k: rng.standard_normal((8, 8)).astype(np.float32) / 3 for k in ("a", "b", "c")}
    w = {}
    for be_name, be in (("sim", sim), ("cpu", cpu)):
        c = Context()
        ts = {k: c.new_tensor_2d(Type.F32, 8, 8).set_name(f"{k}_{be_name}") for k in arrs}
        alloc_ctx_tensors_from_buft(c, be.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
        for k, t in ts.items():
            backend_tensor_set(t, arrs[k])
        w[be_name] = ts
    return sim, cpu, arrs, w


BASE = {"n_tok": 3, "scale": 0.5, "wiring": 0, "b_on": "sim", "mid_output": False,
        "view_col": 0, "pin_mid": False}

# one entry per kind of difference a vouch must see (each changes the scheduler graph's state)
KINDS = {
    "wiring": {"wiring": 1},           # the residual add reads another tensor (same sizes)
    "shape": {"n_tok": 5},             # ne/nb
    "op_params": {"scale": 0.25},      # an op parameter
    "placement": {"b_on": "cpu"},      # a weight on the other backend: other splits and copies
    "flags": {"mid_output": True},     # OUTPUT flag on a middle tensor (no memory reuse)
    "view": {"view_col": 1},           # a view at another offset
    "pin": {"pin_mid": True},          # a user pin (set_tensor_backend: other splits)
}


def _build(env, v):
    """x [8, n_tok] -> h = tanh(A x) (CPU) -> m = scale(B h) (b_on) -> r = m + (h or x) ->
    out = C r + view(x) (CPU). Returns (graph, x, out, mid, reference(X))."""
    sim, cpu, arrs, w = env
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 8, v["n_tok"]).set_name("x").set_input()
    h = gp.tanh(ctx, gp.mul_mat(ctx, w["cpu"]["a"], x))
    m = gp.scale(ctx, gp.mul_mat(ctx, w[v["b_on"]]["b"], h), v["scale"]).set_name("mid")
    if v["mid_output"]:
        m.set_output()
    r = gp.add(ctx, m, h if v["wiring"] == 0 else x)
    xv = gp.view_2d(ctx, x, 4, v["n_tok"], x.nb[1], v["view_col"] * 16)  # (bytes: 4 floats)
    xv2 = gp.concat(ctx, xv, xv, 0)
    out = gp.add(ctx, gp.mul_mat(ctx, w["cpu"]["c"], r), xv2).set_name("out").set_output()
    g = Graph()
    g.build_forward_expand(out)

    def ref(X):
        X = X.astype(np.float64)
        hh = np.tanh(X @ arrs["a"].T.astype(np.float64))
        mm = v["scale"] * (hh @ arrs["b"].T.astype(np.float64))
        rr = mm + (hh if v["wiring"] == 0 else X)
        xvv = X[:, v["view_col"] * 4:v["view_col"] * 4 + 4]
        return rr @ arrs["c"].T.astype(np.float64) + np.concatenate([xvv, xvv], axis=1)

    return g, x, out, m, ref


@pytest.fixture
def verify(monkeypatch):
    monkeypatch.setattr(gallocr, "VERIFY_VOUCH", True)


def _spy(sched):
    calls = []
    real = sched.galloc._vouch

    def spy(graph, other_slot=False):
        calls.append(other_slot)
        real(graph, other_slot)

    sched.galloc._vouch = spy
    return calls


def _run(env, sched, v, rng):
    g, x, out, mid, ref = _build(env, v)
    sched.reset()
    if v["pin_mid"]:
        sched.set_tensor_backend(mid, env[1])  # the CPU (B's product stays on SIM0)
    assert sched.alloc_graph(g)
    X = rng.standard_normal((v["n_tok"], 8)).astype(np.float32)
    backend_tensor_set(x, X)
    assert sched.graph_compute(g) == Status.SUCCESS
    # three float32 GEMMs of K = 8 against float64
    np.testing.assert_allclose(backend_tensor_get(out)[0, 0], ref(X), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("parallel", [False, True])
def test_same_structure_fresh_graphs_are_vouched(env, verify, parallel):
    sched = Scheduler([env[0], env[1]], parallel=parallel)
    calls = _spy(sched)
    rng = np.random.default_rng(1)
    for _ in range(6):
        _run(env, sched, BASE, rng)
    # from the second fresh graph on; when pipelining the copy slot rotates on every allocation,
    # and the vouch is for the same split in another slot (one plan serves every slot; with
    # VERIFY_VOUCH each such vouch is checked by planning the slot's graph aside)
    assert calls == [parallel] * 5
    assert sched.reuse.hits == 0 and sched.reuse.misses == 6  # every graph was fresh
    assert sched.n_plans == 1


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_of_difference_withholds_the_vouch(env, verify, kind):
    sched = Scheduler([env[0], env[1]])
    calls = _spy(sched)
    rng = np.random.default_rng(2)
    _run(env, sched, BASE, rng)
    _run(env, sched, BASE, rng)
    assert len(calls) == 1  # the control: the same structure is vouched for
    _run(env, sched, {**BASE, **KINDS[kind]}, rng)
    assert len(calls) == 1, f"{kind}: a different graph was vouched for"
    # and the variant's own successor is vouched for again (the vouch follows the last graph)
    _run(env, sched, {**BASE, **KINDS[kind]}, rng)
    assert len(calls) == 2
    _run(env, sched, BASE, rng)
    assert len(calls) == 2, f"{kind}: the base after the variant was vouched for"


def test_random_sequences_of_variants_equal_numpy(env, verify):
    rng = np.random.default_rng(3)
    for parallel in (False, True):
        sched = Scheduler([env[0], env[1]], parallel=parallel)
        calls = _spy(sched)
        for _ in range(40):
            v = dict(BASE)
            for kind in rng.choice(sorted(KINDS), size=rng.integers(0, 3), replace=False):
                v.update(KINDS[kind])
            _run(env, sched, v, rng)  # a wrong vouch raises (VERIFY_VOUCH) or gives wrong values
        assert len(calls) > 0 and any(calls) is parallel


def test_verify_catches_a_wrong_vouch(env, verify):
    sched = Scheduler([env[0], env[1]])
    rng = np.random.default_rng(4)
    _run(env, sched, BASE, rng)  # the allocator's plan is checked against BASE's wiring
    sched.reset()
    g2, *_ = _build(env, {**BASE, **KINDS["op_params"]})
    sched.split_graph(g2)
    sched.galloc._vouch(sched.graph)  # forged: another op parameter than the plan was checked for
    with pytest.raises(RuntimeError, match="vouched"):
        sched.galloc.alloc_graph(sched.graph)


def test_verify_catches_a_wrong_vouch_for_another_slot(env, verify):
    # a pipelining scheduler's graph whose user input x has memory of its own: x is the current
    # slot of its copies, so the slot-0 plan gives no address to the duplicate standing in for
    # it in slot 1 (the scheduler does not vouch then); a forged vouch is caught by the check
    # (slot 1's graph planned aside)
    sim, cpu, _arrs, w = env
    xctx = Context()
    x = xctx.new_tensor_2d(Type.F32, 8, 3).set_name("x").set_input()
    xbuf = alloc_ctx_tensors_from_buft(xctx, cpu.get_default_buffer_type())
    ctx = Context()
    out = gp.scale(ctx, gp.mul_mat(ctx, w["sim"]["b"], x), 2.0).set_name("out").set_output()
    g = Graph()
    g.build_forward_expand(out)
    sched = Scheduler([sim, cpu], parallel=True)
    assert sched.reserve(g)
    sched.reset()
    assert sched.alloc_graph(g)  # slot 0, with the reserved plan
    sched.reset()
    sched.cur_copy = 1
    sched.split_graph(g)
    assert not sched._slots_interchangeable()
    sched.galloc._vouch(sched.graph, other_slot=True)  # forged
    with pytest.raises(RuntimeError, match="vouched"):
        sched.galloc.alloc_graph(sched.graph)
    sched.reset()
    xbuf.free()
