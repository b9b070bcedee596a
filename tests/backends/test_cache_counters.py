"""The public read-only counters of the caches tests inspect: a backend's ``plan_cache``
(``PlanCache.stats()``), ``Buffer.data_gen``/``async_writes``, ``snapshot.free_hook_count()`` and
``Assigner.op_key_memo_keys`` (``Scheduler.assigner``): what each counts, when it changes, and
that it cannot be set."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import tensor_alloc
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set, backend_tensor_set_async
from ggmlpy.backend.write_gen import buffer_written
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.core import snapshot
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.sched.assign import node_key, op_memo_token
from ggmlpy.sched.scheduler import Scheduler


def _scale_graph(backend, factor: float = 2.0):
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 4)
    y = ops.scale(ctx, x, factor)
    g = Graph()
    g.build_forward_expand(y)
    buf = alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
    backend_tensor_set(x, np.arange(4, dtype=np.float32))
    return g, y, buf


@pytest.mark.backends("CPU", "SIM0", "FAKECUDA0")
def test_plan_cache_counts_plans_graphs_and_builds(backend):
    cache = backend.plan_cache
    assert cache.stats()["plans"] == 0 and cache.stats()["builds"] == 0
    g, y, buf = _scale_graph(backend)
    try:
        for _ in range(3):
            backend.graph_compute(g)
        backend.synchronize()
        np.testing.assert_array_equal(backend_tensor_get(y).reshape(-1), [0, 2, 4, 6])
        st = cache.stats()
        assert (st["plans"], st["graphs"], st["builds"]) == (1, 1, 1) and len(cache) == 1
        assert st["builds"] == cache.builds and st["maxsize"] >= 1
        y.op_params[0] = 3.0  # another op parameter: a second plan for the same graph
        backend.graph_compute(g)
        backend.synchronize()
        np.testing.assert_array_equal(backend_tensor_get(y).reshape(-1), [0, 3, 6, 9])
        assert (cache.stats()["plans"], cache.stats()["graphs"], cache.builds) == (2, 1, 2)
        assert cache.get(g) is cache.get(g)  # the plan the next compute runs, not a new build
        assert cache.builds == 2
    finally:
        buf.free()
    # a freed buffer drops its plans; builds is never reset
    assert (cache.stats()["plans"], cache.stats()["graphs"], cache.builds) == (0, 0, 2)
    with pytest.raises(AttributeError):
        backend.plan_cache = None


def test_plan_cache_clear_keeps_builds():
    be = backend_cpu_init()
    g, _y, buf = _scale_graph(be)
    try:
        be.graph_compute(g)
        be.plan_cache.clear()
        assert be.plan_cache.stats()["plans"] == 0 and be.plan_cache.builds == 1
        be.graph_compute(g)
        assert be.plan_cache.builds == 2
    finally:
        buf.free()
        be.free()


@pytest.mark.backends("CPU", "SIM0")
def test_buffer_data_gen_and_async_writes(backend):
    buf = backend.get_default_buffer_type().alloc_buffer(64)
    try:
        gen = buf.data_gen
        buffer_written(buf)
        assert buf.data_gen > gen
        with pytest.raises(AttributeError):
            buf.data_gen = 0
        with pytest.raises(AttributeError):
            buf.async_writes = 0
        assert buf.async_writes == 0
        t = Context(no_alloc=True).new_tensor_1d(Type.F32, 4)
        tensor_alloc(buf, t, 0)
        before = buf.data_gen
        backend_tensor_set_async(backend, t, np.ones(4, np.float32))
        backend.synchronize()
        assert buf.async_writes == 0 and buf.data_gen > before
        np.testing.assert_array_equal(backend_tensor_get(t).reshape(-1), np.ones(4))
    finally:
        buf.free()


def test_free_hook_count_follows_live_buffers():
    be = backend_cpu_init()
    gc.collect()
    base = snapshot.free_hook_count()
    g, _y, buf = _scale_graph(be)
    be.graph_compute(g)  # the plan registers on its buffer
    assert snapshot.free_hook_count() == base + 1
    buf.free()
    assert snapshot.free_hook_count() == base
    be.free()


def test_op_key_memo_keys_name_backend_token_and_node(sim_devices):
    sim = sim_devices(1, latency_us=0.0)[0].init_backend()
    cpu = backend_cpu_init()
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_1d(Type.F32, 8).set_input()
    y = ops.add(ctx, ops.scale(ctx, x, 2.0), x)
    g = Graph()
    g.build_forward_expand(y)
    sched = Scheduler([sim, cpu])
    try:
        assert sched.assigner.op_key_memo_keys == frozenset()
        sched.split_graph(g)
        keys = sched.assigner.op_key_memo_keys
        assert isinstance(keys, frozenset) and keys
        tokens = [op_memo_token(b) for b in (sim, cpu)]
        for b, tok, _key in keys:
            assert tokens[b] == tok
        assert (0, tokens[0], node_key(y)) in keys
        sched.reset()  # kept across resets
        assert sched.assigner.op_key_memo_keys == keys
        with pytest.raises(AttributeError):
            sched.assigner.op_key_memo_keys = frozenset()
    finally:
        sched.free()
        sim.free()
        cpu.free()
