"""Passes 1-3 of the split against a plain reference (issue 11 item 3: the fast split keeps
ggml's assignment rules).

The scheduler's passes are written for speed (leafs placed by buffer type inline, the weights
rule inline, pass 2 stopping once every node has a backend, pass 3 looking only at backends with
a higher-priority twin buffer type). The reference below states the rules of
``ggml_backend_sched_split_graph`` passes 1-3 directly (one helper call per rule, every sweep,
every backend); on seeded random graphs (weights on CPU/SIM0/SIM1, ops a device refuses, user
inputs, views, pins, op offload on/off, two and three backends, two CPU backends sharing a
buffer type) every
node's and leaf's backend and cause must be equal after the whole split.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Graph, Type
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Flag
from ggmlpy.sched.scheduler import Scheduler


def _ref_id_from_cur(sc, a, t):
    for x, c in ((t, "1.dst"), (t.view_src, "1.vsrc")):
        if x is not None and x.buffer is not None:
            for i in range(len(sc.backends)):
                if sc._buft_ok(i, x.buffer.buft) and sc._op_ok(i, t):
                    return i, c
    if t.flags & Flag.INPUT:
        return len(sc.backends) - 1, "1.inp"
    if t.op not in (Op.ROPE, Op.FLASH_ATTN_EXT):
        for s in t.src:
            if s is None or s.buffer is None or s.buffer.usage != BufferUsage.WEIGHTS:
                continue
            sb = next((i for i in range(len(sc.backends))
                       if sc._buft_ok(i, s.buffer.buft) and sc._op_ok(i, t)), -1)
            if sc.op_offload and sb == len(sc.backends) - 1 and s.buffer.is_host():
                for i, b in enumerate(sc.backends[:-1]):
                    if sc._op_ok(i, t) and b.offload_op(t):
                        return i, "1.off"
            return sb, "1.wgt"
    return -1, ""


def _bid(bo, t):
    return -1 if t is None else bo.get(t, -1)


def _ref_passes(sc, a, graph):
    """``sc``: the reference scheduler's assigner (its memos, backends, buffer types); ``a``:
    the assignment the passes complete."""
    bo, cause = a.backend_of, a.cause
    for t in list(graph.leafs) + list(graph.nodes):
        if bo.get(t, -1) < 0:
            b, c = _ref_id_from_cur(sc, a, t)
            if b >= 0:
                bo[t], cause[t] = b, c
    compute = [n for n in graph.nodes if n.op not in VIEW_OPS]
    cpu = len(sc.backends) - 1
    for order, skip_cpu, tag in ((compute, True, "2.gpu_down"), (compute[::-1], True, "2.gpu_up"),
                                 (compute, False, "2.down"), (compute[::-1], False, "2.up")):
        cur = -1
        for n in order:
            b = bo.get(n, -1)
            if b >= 0:
                cur = -1 if (skip_cpu and b == cpu) else b
            elif cur >= 0 and sc._op_ok(cur, n):
                bo[n], cause[n] = cur, tag
    for n in compute:
        b = bo.get(n, -1)
        srcs = [s for s in n.src if s is not None]
        if b < 0:
            best = -1
            for i in range(len(sc.backends)):
                if sc._op_ok(i, n):
                    k = sum(1 for s in srcs if (_bid(bo, s) >= 0 or _bid(bo, s.view_src) >= 0)
                            and sc.buffer_supported(bo, s, i))
                    if k > best:
                        best = k
                        bo[n], cause[n] = i, "3.best"
        else:
            for i in range(b):
                if (sc.bufts[i] is sc.bufts[b] and sc._op_ok(i, n)
                        and all(sc.buffer_supported(bo, s, i) for s in srcs)):
                    bo[n], cause[n] = i, "3.upg"
                    break


def _weights(backend, n, rng):
    c = Context()
    ts = [c.new_tensor_2d(Type.F32, 8, 8) for _ in range(n)]
    alloc_ctx_tensors_from_buft(c, backend.get_default_buffer_type()).set_usage(BufferUsage.WEIGHTS)
    return ts


def _random_graph(rng, weights):
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 8, 3).set_name("x")
    if rng.integers(2):
        x.set_input()
    ts = [x]
    for k in range(int(rng.integers(6, 30))):
        a = ts[int(rng.integers(len(ts)))]
        r = int(rng.integers(6))
        if r == 0:
            pool = weights[int(rng.integers(len(weights)))]
            t = gp.mul_mat(ctx, pool[int(rng.integers(len(pool)))], a)
        elif r == 1:
            t = gp.add(ctx, a, ts[int(rng.integers(len(ts)))])
        elif r == 2:
            t = gp.scale(ctx, a, 0.5)
        elif r == 3:
            t = gp.tanh(ctx, a)
        elif r == 4:
            t = gp.concat(ctx, gp.view_2d(ctx, a, 4, 3, a.nb[1], 0), gp.view_2d(ctx, a, 4, 3, a.nb[1], 16), 0)
        else:
            t = gp.mul(ctx, a, a)
        ts.append(t.set_name(f"t{k}"))
    g = Graph()
    g.build_forward_expand(ts[-1].set_output())
    return g, ts


@pytest.fixture(scope="module")
def devices(sim_devices):
    reg = sim_devices(2, latency_us=0.0, refuse_ops=[Op.SCALE])  # SIM refuses SCALE: 2.x/3.best paths
    sims = [d.init_backend() for d in reg]
    cpu, cpu2 = gp.backend_cpu_init(), gp.backend_cpu_init()
    rng = np.random.default_rng(0)
    w = {id(b): _weights(b, 4, rng) for b in (*sims, cpu)}
    w[id(cpu2)] = w[id(cpu)]
    return sims, cpu, cpu2, w


@pytest.mark.parametrize("seed", range(16))
def test_split_assignments_equal_the_reference(devices, seed):
    sims, cpu, cpu2, w = devices
    rng = np.random.default_rng(100 + seed)
    three = bool(seed % 2)
    backends = [sims[0], sims[1], cpu] if three else [sims[0], cpu]
    if seed % 4 == 2:
        # a second CPU backend first: both compute in the same buffer type, so nodes the weights
        # rule gives the last one are upgraded to the first (pass 3, "3.upg")
        backends = [cpu2, sims[0], cpu]
    bufts = None
    offload = bool(rng.integers(2))
    g, ts = _random_graph(rng, [w[id(b)] for b in backends])
    pins = [(ts[int(i)], backends[int(rng.integers(len(backends)))])
            for i in rng.choice(len(ts), size=int(rng.integers(0, 3)), replace=False)]

    got = Scheduler(backends, bufts=bufts, op_offload=offload)
    ref = Scheduler(backends, bufts=bufts, op_offload=offload)
    for sc in (got, ref):
        for t, b in pins:
            sc.set_tensor_backend(t, b)
    got.split_graph(g)
    # the reference: the scheduler's own per-split state, then passes 1-3 as stated above, then
    # the same later passes
    asg, a = ref.assigner, ref._state.assignment  # (the pins made above)
    asg.begin()
    _ref_passes(asg, a, g)
    compute = [n for n in g.nodes if n.op not in VIEW_OPS]
    asg._pass3b_inplace_writers_follow_memory(a, compute)
    asg._pass4_assign_remaining_srcs(a, g.nodes)
    names = {id(t): t.name for t in [*g.leafs, *g.nodes]}
    got_a = got._state.assignment
    for t in [*g.leafs, *g.nodes]:
        assert got_a.backend_of.get(t, -1) == a.backend_of.get(t, -1), (seed, names[id(t)])
        assert got_a.cause.get(t) == a.cause.get(t), (seed, names[id(t)])
    assert len(got_a.backend_of) >= len(g.nodes)
