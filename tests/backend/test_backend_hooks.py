"""Optional hooks of the backend contract (issue 15): graph plans, the host-view hook, and
parameters that used to be ignored."""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.backend.interface import Backend, Buffer, BufferType, tensor_alloc
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import backend_cpu_init, cpu_buffer_from_array, cpu_buffer_type
from ggmlpy.backends.plan import Plan
from ggmlpy.core.errors import NotAllocatedError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type

N = 24


def _place(buft: BufferType, *tensors: Tensor) -> Buffer:
    align = buft.get_alignment()
    size = sum(-(-buft.get_alloc_size(t) // align) * align for t in tensors)
    buf = buft.alloc_buffer(size)
    off = 0
    for t in tensors:
        tensor_alloc(buf, t, off)
        off += -(-buft.get_alloc_size(t) // align) * align
    return buf


def _mul_add_graph(buft: BufferType):
    """y = (a * b) + a over N floats; two nodes."""
    ctx = Context()
    a = ctx.new_tensor(Type.F32, [N])
    b = ctx.new_tensor(Type.F32, [N])
    y = ops.add(ctx, ops.mul(ctx, a, b), a)
    g = Graph()
    g.build_forward_expand(y)
    buf = _place(buft, a, b, *g.nodes)
    return a, b, y, g, buf


def test_plan_create_compute_update_free_through_the_contract(backend):
    rng = np.random.default_rng(15)
    a, b, y, g, buf = _mul_add_graph(backend.get_default_buffer_type())
    av, bv = rng.standard_normal((2, N)).astype(np.float32)
    backend_tensor_set(a, av)
    backend_tensor_set(b, bv)
    plan = backend.graph_plan_create(g)
    assert isinstance(plan, Plan) and len(plan.steps) == 2
    backend.graph_plan_compute(plan)
    backend.synchronize()
    ref = av.astype(np.float64) * bv + av
    np.testing.assert_allclose(backend_tensor_get(y).reshape(-1), ref, rtol=1e-6, atol=1e-6)
    # the plan holds views of the memory: new inputs, same plan, new result
    backend_tensor_set(a, -av)
    backend.graph_plan_compute(plan)
    backend.synchronize()
    np.testing.assert_allclose(backend_tensor_get(y).reshape(-1), -av.astype(np.float64) * bv - av,
                               rtol=1e-6, atol=1e-6)
    # update to another graph (default hook: free + create) computes the new graph
    ctx = Context()
    y2 = ops.scale(ctx, y, 3.0)
    g2 = Graph()
    g2.build_forward_expand(y2)
    buf2 = _place(backend.get_default_buffer_type(), y2)
    plan2 = backend.graph_plan_update(plan, g2)
    assert isinstance(plan2, Plan) and [n.op for n in plan2.nodes] == [n.op for n in g2.nodes]
    backend.graph_plan_compute(plan2)
    backend.synchronize()
    np.testing.assert_allclose(backend_tensor_get(y2).reshape(-1), 3.0 * (-av.astype(np.float64) * bv - av),
                               rtol=1e-6, atol=1e-6)
    backend.graph_plan_free(plan2)
    # a plan over a freed buffer is refused, not run over released memory
    plan3 = backend.graph_plan_create(g)
    buf.free()
    with pytest.raises(NotAllocatedError, match="freed"):
        backend.graph_plan_compute(plan3)
    buf2.free()


def test_plan_facades_reject_misuse(backend):
    with pytest.raises(TypeError, match="expected a Graph"):
        backend.graph_plan_create([])
    with pytest.raises(ValueError, match="no plan"):
        backend.graph_plan_compute(None)
    with pytest.raises(ValueError, match="no plan"):
        backend.graph_plan_free(None)
    with pytest.raises(TypeError, match="expected a Graph"):
        backend.graph_plan_update(Plan([], []), "graph")


class _NoPlanBackend(Backend):
    """A backend implementing only the required hook (ggml: no graph_plan_* slots)."""

    def _graph_compute(self, graph):  # pragma: no cover - never called here
        raise AssertionError


def test_backend_without_plan_hooks_says_so():
    be = _NoPlanBackend(backend_cpu_init().device)
    with pytest.raises(NotImplementedError, match="has no graph plans"):
        be.graph_plan_create(Graph())
    with pytest.raises(NotImplementedError, match="has no graph plans"):
        be.graph_plan_compute(object())
    with pytest.raises(NotImplementedError, match="has no graph plans"):
        be.graph_plan_update(object(), Graph())
    be.graph_plan_free(object())  # default: nothing to release


def test_host_view_hook(sim_devices):
    rng = np.random.default_rng(1)
    ctx = Context()
    t = ctx.new_tensor(Type.F32, [8])
    buf = _place(cpu_buffer_type(), ctx.new_tensor(Type.F32, [3]), t)
    vals = rng.standard_normal(8).astype(np.float32)
    backend_tensor_set(t, vals)
    view = buf._host_view(t)
    assert view.dtype == np.uint8 and view.size == t.nbytes
    np.testing.assert_array_equal(view.view(np.float32), vals)
    view.view(np.float32)[:] = 2 * vals  # zero copy: writes land in the tensor
    np.testing.assert_array_equal(backend_tensor_get(t).reshape(-1), 2 * vals)
    # user memory wrapped without copy exposes the user's array
    raw = np.zeros(64 + 32, np.uint8)  # a 32-byte-aligned 64-byte window of it
    arr = raw[(-raw.ctypes.data) % 32:][:64]
    assert arr.ctypes.data % 32 == 0 and arr.size == 64
    wrapped = cpu_buffer_from_array(arr)
    u = Context().new_tensor(Type.I8, [16])
    tensor_alloc(wrapped, u, 32)
    assert np.shares_memory(wrapped._host_view(u), arr)
    # device memory has no host view: the SIM buffer and the base class say None
    dev = sim_devices(1)[0]
    s = Context().new_tensor(Type.F32, [8])
    sbuf = _place(dev.get_buffer_type(), s)
    assert sbuf._host_view(s) is None
    assert Buffer._host_view(sbuf, s) is None
    sbuf.free()


def test_init_backend_rejects_params_it_cannot_use(sim_devices):
    cpu_dev = backend_cpu_init().device
    with pytest.raises(ValueError, match="takes no params"):
        cpu_dev.init_backend("n_threads=4")
    with pytest.raises(TypeError, match="params"):
        cpu_dev.init_backend(4)
    sim_dev = sim_devices(1)[0]
    with pytest.raises(ValueError, match="SIM0 takes no params"):
        sim_dev.init_backend("x")
    for ok in (None, ""):
        cpu_dev.init_backend(ok).free()
        sim_dev.init_backend(ok).free()


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (65, ValueError), (1.5, TypeError),
                                      (True, TypeError)])
def test_buffer_from_host_ptr_checks_max_tensor_size(bad, exc):
    dev = backend_cpu_init().device
    arr = np.zeros(64 + 32, np.uint8)
    arr = arr[(-arr.ctypes.data) % 32:][:64]
    with pytest.raises(exc, match="max_tensor_size"):
        dev.buffer_from_host_ptr(arr, bad)
    for ok in (0, 1, 64):
        assert dev.buffer_from_host_ptr(arr, ok).size == 64


def test_tensor_has_no_extra_slot():
    t = Context().new_tensor(Type.F32, [2])
    assert not hasattr(t, "extra")
    with pytest.raises(AttributeError):
        t.extra = 1
