"""Computing a graph other than the allocated one never runs the allocated one (issue 10, item 4).

ggml's scheduler silently runs the graph given to ``alloc_graph`` when ``graph_compute`` gets
another one, and returns SUCCESS. ggmlpy raises instead, on every path: a GraphAllocator plus
``Backend.graph_compute``/``graph_compute_async`` (the other graph's tensors are not placed: the
error names the tensor and says to allocate the graph), and ``Scheduler.graph_compute``/
``graph_compute_async`` (ValueError naming the mismatch). Nothing runs, the allocated graph still
computes its own result afterwards, and after ``reset()`` the other graph computes correctly.
"""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.gallocr import GraphAllocator
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.core.errors import NotAllocatedError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.sched.scheduler import Scheduler

X = np.arange(1, 5, dtype=np.float32)


@pytest.fixture
def backends(backend, backend_kind):
    """``(backend, scheduler backends)``: the conftest backend alone on the CPU, else followed
    by a CPU backend (the scheduler's last backend must be the CPU)."""
    if backend_kind == "CPU":
        yield backend, [backend]
        return
    cpu = backend_cpu_init()
    yield backend, [backend, cpu]
    cpu.free()


def _two_graphs():
    """One input ``a`` shared by g1 (y1 = 2a) and g2 (y2 = 3a)."""
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor_1d(Type.F32, 4).set_name("a").set_input()
    y1 = ops.scale(ctx, a, 2.0).set_name("y1").set_output()
    y2 = ops.scale(ctx, a, 3.0).set_name("y2").set_output()
    g1, g2 = Graph(), Graph()
    g1.build_forward_expand(y1)
    g2.build_forward_expand(y2)
    return a, g1, y1, g2, y2


@pytest.mark.parametrize("method", ["graph_compute", "graph_compute_async"])
def test_backend_compute_of_unallocated_graph_raises(backends, method):
    backend, _ = backends
    a, g1, y1, g2, y2 = _two_graphs()
    galloc = GraphAllocator(backend.get_default_buffer_type())
    try:
        assert galloc.alloc_graph(g1)
        backend_tensor_set(a, X)
        with pytest.raises(NotAllocatedError, match=r"tensor 'y2' \(SCALE\) of this graph is not "
                                                    r"allocated; allocate this graph"):
            getattr(backend, method)(g2)
        backend.synchronize()
        backend.graph_compute(g1)  # the allocated graph is intact
        np.testing.assert_array_equal(backend_tensor_get(y1).reshape(-1), 2 * X)
        # allocating g2 un-places g1's tensors: computing g1 now raises, never runs stale memory
        assert galloc.alloc_graph(g2)
        backend_tensor_set(a, X)
        backend.graph_compute(g2)
        np.testing.assert_array_equal(backend_tensor_get(y2).reshape(-1), 3 * X)
        with pytest.raises(NotAllocatedError, match="'y1'"):
            getattr(backend, method)(g1)
        backend.synchronize()
    finally:
        galloc.free()


@pytest.mark.parametrize("method", ["graph_compute", "graph_compute_async"])
def test_scheduler_compute_of_other_graph_raises(backends, method):
    _, bks = backends
    a, g1, y1, g2, y2 = _two_graphs()
    sched = Scheduler(bks)
    try:
        assert sched.alloc_graph(g1)
        backend_tensor_set(a, X)
        with pytest.raises(ValueError, match=r"graph \(1 nodes\) is not the graph allocated by "
                                             r"alloc_graph \(1 nodes\); call reset\(\)"):
            getattr(sched, method)(g2)
        assert y2.buffer is None  # nothing was placed or run for g2
        sched.graph_compute(g1)  # the allocated graph still runs, with its inputs
        np.testing.assert_array_equal(backend_tensor_get(y1).reshape(-1), 2 * X)
        sched.reset()
        assert sched.alloc_graph(g2)
        backend_tensor_set(a, X)
        getattr(sched, method)(g2)
        sched.synchronize()
        np.testing.assert_array_equal(backend_tensor_get(y2).reshape(-1), 3 * X)
    finally:
        sched.free()


def test_scheduler_compute_without_alloc_allocates_the_given_graph(backends):
    """Not allocated: graph_compute allocates and runs the given graph (ggml's rule, kept)."""
    _, bks = backends
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 4).set_name("a")
    buf_backend = bks[-1]
    from ggmlpy.alloc.tallocr import alloc_ctx_tensors

    buf = alloc_ctx_tensors(ctx, buf_backend)
    backend_tensor_set(a, X)
    ctx2 = Context(no_alloc=True)
    y1 = ops.scale(ctx2, a, 2.0).set_name("y1").set_output()
    y2 = ops.scale(ctx2, a, 3.0).set_name("y2").set_output()
    g1, g2 = Graph(), Graph()
    g1.build_forward_expand(y1)
    g2.build_forward_expand(y2)
    sched = Scheduler(bks)
    try:
        sched.graph_compute(g1)
        np.testing.assert_array_equal(backend_tensor_get(y1).reshape(-1), 2 * X)
        sched.reset()
        sched.graph_compute(g2)
        np.testing.assert_array_equal(backend_tensor_get(y2).reshape(-1), 3 * X)
    finally:
        sched.free()
        buf.free()
