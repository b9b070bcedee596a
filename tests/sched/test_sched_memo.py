"""The scheduler's ``supports_op`` memo across splits (issue 11 item 3: fresh splits cache
per-node answers) and its validity.

Answers are memoised by node key (op, type, ne, nb, op_params, view-ness, and per source op,
type, ne, nb and memory kind) only for devices that offer a memo token (CPU and the async
devices, unless ``supports_op``/``_supports_op`` is overridden); a registered kernel override
changes the token. Assignments with the memo must equal assignments without it.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
import ggmlpy.sched.assign as assign_mod
from ggmlpy import Context, Graph, Op, Type
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage, Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.kernels import REGISTRY
from ggmlpy.backends.kernels.registry import KernelEntry
from ggmlpy.backends.plan import _memoisable
from ggmlpy.sched.assign import node_key, op_memo_token
from ggmlpy.sched.scheduler import Scheduler


@pytest.fixture(scope="module")
def devs(sim_devices):
    reg = sim_devices(1, latency_us=0.0)
    refusing = sim_devices(1, latency_us=0.0, refuse_ops={Op.ADD, Op.SCALE})
    return reg[0].init_backend(), refusing[0].init_backend(), gp.backend_cpu_init()


def _weight(backend, arr):
    c = Context()
    t = c.new_tensor_2d(Type.F32, arr.shape[1], arr.shape[0])
    alloc_ctx_tensors_from_buft(c, backend.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
    backend_tensor_set(t, arr)
    return t


_UNARY = [gp.tanh, gp.relu, gp.gelu, gp.silu, gp.neg]


def _random_graph(rng, weights, n_blocks):
    """A chain over random blocks: mul_mat with a weight (of a random backend), add, a random
    unary op, scale, sometimes an F16 cast or a sum_rows; returns (graph, x, out)."""
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 8, 3).set_name("x").set_input()
    h = x
    for _ in range(n_blocks):
        w = weights[int(rng.integers(len(weights)))]
        h = gp.mul_mat(ctx, w, h)
        h = gp.add(ctx, h, x)
        h = _UNARY[int(rng.integers(len(_UNARY)))](ctx, h)
        h = gp.scale(ctx, h, float(rng.uniform(0.2, 0.9)))
        if rng.random() < 0.3:
            h = gp.cast(ctx, gp.cast(ctx, h, Type.F16), Type.F32)
    out = h.set_name("out").set_output()
    g = Graph()
    g.build_forward_expand(out)
    return g, x, out


def _assignment(sched, g):
    sched.reset()
    sched.split_graph(g)
    r = sched.report()
    return [(n["backend"], n["cause"]) for n in r["nodes"]], [(s["backend"], s["nodes"])
                                                             for s in r["splits"]]


@pytest.mark.parametrize("which", ["sim", "refusing"])
def test_memoised_assignment_equals_asking_every_time(devs, monkeypatch, which):
    sim, refusing, cpu = devs
    dev = sim if which == "sim" else refusing
    rng = np.random.default_rng(3)
    weights = [_weight(b, rng.standard_normal((8, 8)).astype(np.float32))
               for b in (dev, cpu, dev, cpu)]
    memo = Scheduler([dev, cpu])
    assert None not in [op_memo_token(b) for b in (dev, cpu)]
    plain = Scheduler([dev, cpu])
    graphs = [_random_graph(rng, weights, int(rng.integers(2, 6))) for _ in range(12)]
    got = [_assignment(memo, g) for g, _x, _o in graphs]  # the memo fills over the graphs
    assert len(memo.assigner.op_key_memo_keys) > 0
    with monkeypatch.context() as m:
        m.setattr(assign_mod, "op_memo_token", lambda backend: None)
        want = [_assignment(plain, g) for g, _x, _o in graphs]
    assert len(plain.assigner.op_key_memo_keys) == 0
    assert got == want
    # and the memoised scheduler computes the right values
    g, x, out = graphs[0]
    X = rng.standard_normal((3, 8)).astype(np.float32)
    memo.reset()
    assert memo.alloc_graph(g)
    backend_tensor_set(x, X)
    assert memo.graph_compute(g) == Status.SUCCESS
    got_v = backend_tensor_get(out)[0, 0].copy()
    memo.free()
    plain.reset()
    with monkeypatch.context() as m:
        m.setattr(assign_mod, "op_memo_token", lambda backend: None)
        assert plain.alloc_graph(g)
    backend_tensor_set(x, X)
    assert plain.graph_compute(g) == Status.SUCCESS
    np.testing.assert_array_equal(got_v, backend_tensor_get(out)[0, 0])
    plain.free()


def _counting(monkeypatch):
    calls = []
    orig = REGISTRY.supports_op

    def count(node, xp):
        calls.append(node.op)
        return orig(node, xp)

    monkeypatch.setattr(REGISTRY, "supports_op", count)
    return calls


def test_second_split_of_the_same_structure_asks_nothing(devs, monkeypatch):
    sim, _refusing, cpu = devs
    rng = np.random.default_rng(4)
    weights = [_weight(b, rng.standard_normal((8, 8)).astype(np.float32)) for b in (sim, cpu)]
    sched = Scheduler([sim, cpu])
    calls = _counting(monkeypatch)
    g1 = _random_graph(np.random.default_rng(9), weights, 4)[0]
    g2 = _random_graph(np.random.default_rng(9), weights, 4)[0]  # same structure, new tensors
    a1 = _assignment(sched, g1)
    n1 = len(calls)
    assert n1 > 0
    a2 = _assignment(sched, g2)
    assert len(calls) == n1  # answered from the memo
    assert a1 == a2
    sched.free()


def test_overridden_supports_op_is_asked_every_split(devs):
    sim, _refusing, cpu = devs
    rng = np.random.default_rng(5)
    weights = [_weight(b, rng.standard_normal((8, 8)).astype(np.float32)) for b in (sim, cpu)]
    asked = []
    orig = cpu.device.supports_op

    def refuse_gelu(op):
        asked.append(op)
        return op.op != Op.UNARY and orig(op)

    # an instance override, deleted afterwards (monkeypatch would put the bound method back as an
    # instance attribute: an override still, for the later tests of this module's devices)
    cpu.device.supports_op = refuse_gelu
    try:
        _asked_every_split(sim, cpu, weights, asked)
    finally:
        del cpu.device.supports_op
    assert "supports_op" not in vars(cpu.device)


def _asked_every_split(sim, cpu, weights, asked):
    assert op_memo_token(cpu) is None and not _memoisable(cpu.device.supports_op)
    sched = Scheduler([sim, cpu])
    g = _random_graph(np.random.default_rng(1), weights, 3)[0]
    _assignment(sched, g)
    n1 = len(asked)
    assert n1 > 0
    _assignment(sched, g)
    assert len(asked) == 2 * n1
    assert len(sched.assigner.op_key_memo_keys) > 0  # the SIM device's answers are still memoised
    r = sched.report()
    assert all(n["backend"] == "SIM0" for n in r["nodes"] if n["op"] == "UNARY")
    sched.free()


def test_registering_an_override_changes_the_token(devs, monkeypatch):
    sim, _refusing, cpu = devs
    rng = np.random.default_rng(6)
    weights = [_weight(b, rng.standard_normal((8, 8)).astype(np.float32)) for b in (sim, cpu)]
    g = _random_graph(rng, weights, 2)[0]
    sched = Scheduler([sim, cpu])
    t0 = op_memo_token(cpu)
    _assignment(sched, g)
    assert {k[1] for k in sched.assigner.op_key_memo_keys} == {t0}
    fake = KernelEntry(Op.ADD, lambda xp, node, dst, srcs: None, lambda node, xp: False)
    overrides = {k: list(v) for k, v in REGISTRY._overrides.items()}
    overrides.setdefault(Op.ADD, []).append(fake)
    with monkeypatch.context() as m:
        m.setattr(REGISTRY, "_overrides", overrides)  # as REGISTRY.override(...) would
        t1 = op_memo_token(cpu)
        assert t1 != t0 and op_memo_token(sim) == t1
        calls = _counting(m)
        _assignment(sched, g)  # keys carry the token: asked again, answers kept under t1
        assert calls
        assert {k[1] for k in sched.assigner.op_key_memo_keys} == {t0, t1}
    sched.free()


def test_node_key_reads_what_supports_op_reads():
    ctx = Context()
    a = ctx.new_tensor_2d(Type.F32, 4, 3)
    b = ctx.new_tensor_2d(Type.F32, 4, 3)
    n1 = gp.add(ctx, a, b)
    n2 = gp.add(ctx, a, b)
    assert node_key(n1) == node_key(n2)
    assert node_key(gp.mul(ctx, a, b)) != node_key(n1)                       # op
    c = ctx.new_tensor_2d(Type.F16, 4, 3)
    assert node_key(gp.add(ctx, a, c)) != node_key(n1)                       # a source type
    assert node_key(gp.scale(ctx, a, 2.0)) != node_key(gp.scale(ctx, a, 3.0))  # op_params
    assert node_key(gp.add(ctx, gp.transpose(ctx, a), gp.transpose(ctx, b))) != node_key(n1)
    d = ctx.new_tensor_2d(Type.F32, 8, 3)
    assert node_key(gp.add(ctx, d, d)) != node_key(gp.add(ctx, a, a))      # ne
    cpu = gp.backend_cpu_init()
    c2 = Context()
    w = c2.new_tensor_2d(Type.F32, 4, 3)
    alloc_ctx_tensors_from_buft(c2, cpu.get_default_buffer_type())
    assert node_key(gp.add(ctx, w, b)) != node_key(n1)                       # source memory


def test_build_plan_memo_only_for_plain_device_methods(devs):
    sim, _refusing, cpu = devs
    assert _memoisable(cpu.device.supports_op)
    assert _memoisable(sim.device.can_compute)
    assert not _memoisable(lambda t: True)
    assert not _memoisable(cpu.supports_op)  # a backend method: not a device's
