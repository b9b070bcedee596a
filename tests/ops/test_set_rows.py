"""SET_ROWS (``ggml_set_rows``): the constructor's rules, index bounds, and scheduler placement.

The kernels' values on CPU/SIM/fake CUDA are held by ``tests/test_device_ops.py``
(``set_rows_*``) and the test-backend-ops cases (``ggmlpy/testops/cases_layout.py``); here:

* the node is a view of the destination with ggml's source order ``[b, c, a]``, and every
  violated ggml assert raises the named error;
* an index outside the destination's rows is a ComputeError naming the node, nothing written;
* as an in-place writer of its destination's memory (the KV cache's write) the node runs on the
  backend holding that memory, here a SIM device, with its F32 rows computed on the CPU and
  copied in; the rows it does not name keep their values.
"""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Graph, Op, Type, ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.sim import sim_reg
from ggmlpy.core.errors import ComputeError
from ggmlpy.sched.scheduler import Scheduler


def test_set_rows_is_a_view_of_a_with_ggml_source_order():
    ctx = Context()
    a = ctx.new_tensor_2d(Type.F16, 8, 5).set_name("cache")
    b = ctx.new_tensor_2d(Type.F32, 8, 2)
    c = ctx.new_tensor_1d(Type.I64, 2)
    r = ops.set_rows(ctx, a, b, c)
    assert r.op == Op.SET_ROWS and r.src == [b, c, a] and r.view_src is a
    assert r.type == Type.F16 and r.ne == a.ne and r.nb == a.nb and r.name == "cache (view)"


@pytest.mark.parametrize("make, err, what", [
    (lambda c: (c.new_tensor_2d(Type.F32, 8, 5), c.new_tensor_2d(Type.F16, 8, 2),
                c.new_tensor_1d(Type.I64, 2)), TypeError, "b of type F32"),
    (lambda c: (c.new_tensor_2d(Type.F32, 8, 5), c.new_tensor_2d(Type.F32, 8, 2),
                c.new_tensor_1d(Type.F32, 2)), TypeError, "c of type I64 or I32"),
    (lambda c: (c.new_tensor_2d(Type.F32, 8, 5), c.new_tensor_2d(Type.F32, 4, 2),
                c.new_tensor_1d(Type.I64, 2)), ValueError, "a.ne0 == b.ne0"),
    (lambda c: (c.new_tensor_2d(Type.F32, 8, 5), c.new_tensor_2d(Type.F32, 8, 2),
                c.new_tensor_1d(Type.I64, 3)), ValueError, "b.ne1 == c.ne0"),
    (lambda c: (c.new_tensor_3d(Type.F32, 8, 5, 3), c.new_tensor_3d(Type.F32, 8, 2, 3),
                c.new_tensor_2d(Type.I64, 2, 2)), ValueError, "b.ne2 % c.ne1 == 0"),
])
def test_set_rows_rules(make, err, what):
    ctx = Context()
    a, b, c = make(ctx)
    with pytest.raises(err, match=what):
        ops.set_rows(ctx, a, b, c)


def _alloc(ctx: Context, backend) -> None:
    alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())


@pytest.mark.parametrize("n", [2, 1], ids=["rows", "one-row"])  # (one row: its own fast path)
@pytest.mark.parametrize("bad", [5, -1])
def test_set_rows_index_out_of_range_is_a_compute_error(bad, n):
    cpu = gp.backend_cpu_init()
    ctx = Context()
    a = ctx.new_tensor_2d(Type.F32, 4, 5)
    b = ctx.new_tensor_2d(Type.F32, 4, n)
    c = ctx.new_tensor_1d(Type.I32, n)
    r = ops.set_rows(ctx, a, b, c).set_name("w")
    _alloc(ctx, cpu)
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    backend_tensor_set(a, x)
    backend_tensor_set(b, np.ones((n, 4), np.float32))
    backend_tensor_set(c, np.array([1, bad][-n:], np.int32))
    g = Graph()
    g.build_forward_expand(r)
    with pytest.raises(ComputeError, match=f"SET_ROWS node 'w': index {bad}"):
        cpu.graph_compute(g)
    np.testing.assert_array_equal(backend_tensor_get(a).reshape(5, 4), x)  # nothing written


@pytest.mark.parametrize("dt", [Type.F32, Type.F16])
@pytest.mark.parametrize("row", [0, 3, 4])
def test_set_rows_one_row_writes_that_row_only(dt, row):
    """One index (a generated token's K or V): that row written, converted to the
    destination's type, every other row untouched; the index read at each evaluation."""
    cpu = gp.backend_cpu_init()
    ctx = Context()
    a = ctx.new_tensor_2d(dt, 4, 5)
    b = ctx.new_tensor_2d(Type.F32, 4, 1)
    c = ctx.new_tensor_1d(Type.I64, 1)
    r = ops.set_rows(ctx, a, b, c)
    _alloc(ctx, cpu)
    x = np.arange(20, dtype=dt.dtype).reshape(5, 4)
    backend_tensor_set(a, x)
    g = Graph()
    g.build_forward_expand(r)
    want = x.copy()
    for k, rr in enumerate((row, (row + 2) % 5)):
        v = np.full((1, 4), 0.5 + k, np.float32)
        backend_tensor_set(b, v)
        backend_tensor_set(c, np.array([rr], np.int64))
        cpu.graph_compute(g)
        want[rr] = v[0].astype(dt.dtype)
        np.testing.assert_array_equal(backend_tensor_get(a).reshape(5, 4), want)


def test_set_rows_runs_where_its_destination_lives():
    """Destination (a cache) in a SIM buffer, rows computed on the CPU: the writer runs on SIM."""
    sim = sim_reg(1, latency_us=0.0).devices[0].init_backend()
    cpu = gp.backend_cpu_init()
    rng = np.random.default_rng(5)
    cache_ctx = Context()
    cache = cache_ctx.new_tensor_2d(Type.F16, 16, 10).set_name("cache")
    buf = alloc_ctx_tensors_from_buft(cache_ctx, sim.get_default_buffer_type())
    x = rng.standard_normal((10, 16)).astype(np.float16)
    backend_tensor_set(cache, x)

    ctx = Context()
    src = ctx.new_tensor_2d(Type.F32, 16, 3).set_name("src").set_input()
    idx = ctx.new_tensor_1d(Type.I64, 3).set_name("idx").set_input()
    rows = ops.scale(ctx, src, 2.0)                       # computed on the CPU (input there)
    w = ops.set_rows(ctx, cache, rows, idx).set_name("write")
    g = Graph()
    g.build_forward_expand(w)
    sched = Scheduler([sim, cpu], parallel=False)
    try:
        assert sched.alloc_graph(g)
        assert sched.get_tensor_backend(w) is sim
        y = rng.standard_normal((3, 16)).astype(np.float32)
        backend_tensor_set(src, y)
        backend_tensor_set(idx, np.array([7, 0, 4], np.int64))
        assert sched.graph_compute(g) == Status.SUCCESS
        sched.synchronize()
        want = x.copy()
        want[[7, 0, 4]] = (2.0 * y).astype(np.float16)
        np.testing.assert_array_equal(backend_tensor_get(cache).reshape(10, 16), want)
    finally:
        sched.free()
        buf.free()
