"""The async device backend (ggmlpy.backends.device.backend) on every runtime: SIM with latency on, and CUDA
on a GPU machine (``-m gpu``; skipped with a reason here).

SIM devices come from the ``sim_devices`` fixture (never the global registry or env), so the
tests run under ``pytest -n auto``. Latency (2 ms per launch and per copy) turns a missing
synchronisation into a wrong result rather than a lucky race.
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_cupy import fake_cuda_reg

from ggmlpy import ops
from ggmlpy.backend.interface import (
    Buffer,
    BufferType,
    event_new,
    event_query,
    event_record,
    event_synchronize,
    event_wait,
    tensor_alloc,
    view_init,
)
from ggmlpy.backend.tensor_data import (
    backend_tensor_copy,
    backend_tensor_copy_async,
    backend_tensor_get,
    backend_tensor_get_async,
    backend_tensor_memset,
    backend_tensor_set,
    backend_tensor_set_async,
)
from ggmlpy.backends.cpu.backend import HostBuffer, backend_cpu_init, cpu_buffer_type
from ggmlpy.backends.cuda.runtime import cuda_reg
from ggmlpy.backends.device.backend import AsyncBackend, AsyncDevice
from ggmlpy.backends.plan import Plan
from ggmlpy.core.errors import ComputeError, NotAllocatedError, UnsupportedOpError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type

RUNTIMES = ["sim", "fakecuda", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=RUNTIMES)
def reg(request, sim_devices):
    """A reg with at least two devices where possible: 2 SIM devices (2 ms latency), the CUDA
    runtime over a host stand-in for CuPy (plumbing only: everything completes at once), or the
    real CUDA reg."""
    if request.param == "sim":
        return sim_devices(2, latency_us=2000)[0].reg
    if request.param == "fakecuda":
        return fake_cuda_reg(2)
    r = cuda_reg()
    if not r.devices:
        pytest.skip(f"no CUDA device: {r.unavailable_reason}")
    return r


@pytest.fixture
def backends():
    """``new(device)`` makes a backend freed at teardown."""
    made: list = []

    def new(device):
        b = device.init_backend()
        made.append(b)
        return b

    yield new
    for b in made:
        b.free()


def place(buft: BufferType, *tensors: Tensor) -> Buffer:
    """Allocate one buffer of ``buft`` holding every non-view tensor (aligned), then init the views."""
    align = buft.get_alignment()
    offs, total = [], 0
    for t in tensors:
        if t.view_src is None:
            offs.append(total)
            total += -(-buft.get_alloc_size(t) // align) * align
    buf = buft.alloc_buffer(max(total, align))
    it = iter(offs)
    for t in tensors:
        if t.view_src is None:
            tensor_alloc(buf, t, next(it))
    for t in tensors:
        if t.view_src is not None:
            view_init(t)
    return buf


def get(t: Tensor) -> np.ndarray:
    """The tensor's data with NumPy shape ``ne[:n_dims][::-1]`` (the 4-D result squeezed)."""
    return backend_tensor_get(t).reshape(t.ne[:t.n_dims][::-1])


def f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def add_graph(dev_buft: BufferType, n: int = 64):
    """c = a + b over F32 vectors of ``n`` elements placed in ``dev_buft``."""
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, n).set_name("a")
    b = ctx.new_tensor_1d(Type.F32, n).set_name("b")
    c = ops.add(ctx, a, b).set_name("c")
    g = Graph()
    g.build_forward_expand(c)
    buf = place(dev_buft, a, b, c)
    return g, a, b, c, buf


# ---------------------------------------------------------------------------------------------
# device, buffer type, props


def test_device_props_and_buffer_types(reg):
    dev = reg.devices[0]
    assert isinstance(dev, AsyncDevice)
    assert dev.name == f"{reg.name}0"
    props = dev.get_props()
    assert props.caps.async_ and props.caps.events and props.caps.host_buffer
    assert not props.caps.buffer_from_host_ptr
    assert props.memory_total > 0 and 0 <= props.memory_free <= props.memory_total
    buft = dev.get_buffer_type()
    assert buft is dev.get_buffer_type()  # a singleton, compared by identity
    assert not buft.is_host() and buft.get_alignment() == 128 and buft.get_device() is dev
    host = dev.get_host_buffer_type()
    assert host.is_host() and host.name == f"{reg.name}_Host"
    assert dev.supports_buft(buft) and not dev.supports_buft(host)
    assert not dev.supports_buft(cpu_buffer_type())
    if len(reg.devices) > 1:
        assert not dev.supports_buft(reg.devices[1].get_buffer_type())
    cpu = backend_cpu_init()
    assert cpu.supports_buft(host) and not cpu.supports_buft(buft)


def test_blocking_set_get_memset_clear_copy(reg):
    rng = np.random.default_rng(1)
    ctx = Context()
    a = ctx.new_tensor_2d(Type.F32, 8, 3)
    b = ctx.new_tensor_2d(Type.F32, 8, 3)
    buf = place(reg.devices[0].get_buffer_type(), a, b)
    try:
        x = f32(rng, 3, 8)
        backend_tensor_set(a, x)
        np.testing.assert_array_equal(get(a), x)  # exact: bytes are copied
        backend_tensor_copy(a, b)
        np.testing.assert_array_equal(get(b), x)
        backend_tensor_memset(b, 0, offset=4, size=8)  # zero elements 1 and 2 of row 0
        exp = x.copy()
        exp[0, 1:3] = 0
        np.testing.assert_array_equal(get(b), exp)
        buf.clear(0)
        np.testing.assert_array_equal(get(a), np.zeros((3, 8), np.float32))
    finally:
        buf.free()


# ---------------------------------------------------------------------------------------------
# graph compute and async data movement


def test_graph_compute_matches_reference(reg, backends):
    be = backends(reg.devices[0])
    g, a, b, c, buf = add_graph(reg.devices[0].get_buffer_type())
    rng = np.random.default_rng(2)
    x, y = f32(rng, 64), f32(rng, 64)
    backend_tensor_set(a, x)
    backend_tensor_set(b, y)
    be.graph_compute(g)
    # float32 addition of float32 inputs is exact in float64 then rounded once: tolerance 1 ulp
    np.testing.assert_allclose(get(c), x.astype(np.float64) + y, rtol=2e-7, atol=1e-30)
    buf.free()


def test_set_async_snapshots_caller_data(reg, backends):
    be = backends(reg.devices[0])
    g, a, b, c, buf = add_graph(reg.devices[0].get_buffer_type())
    x = np.arange(64, dtype=np.float32)
    y = np.full(64, 0.5, np.float32)
    backend_tensor_set_async(be, a, x)
    backend_tensor_set_async(be, b, y)
    x[:] = -1000.0  # overwritten right after the call: must not change what the device computes
    y[:] = -1000.0
    be.graph_compute_async(g)
    out = np.empty(64, np.float32)
    backend_tensor_get_async(be, c, out)
    be.synchronize()
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.float64) + 0.5)  # exact in f32
    buf.free()


def test_get_async_valid_after_synchronize(reg, backends):
    be = backends(reg.devices[0])
    ctx = Context()
    a = ctx.new_tensor_2d(Type.F32, 16, 4)
    buf = place(reg.devices[0].get_buffer_type(), a)
    x = f32(np.random.default_rng(3), 4, 16)
    backend_tensor_set(a, x)
    out = np.zeros((4, 16), np.float32)
    backend_tensor_get_async(be, a, out)
    part = np.zeros(8, np.float32)
    backend_tensor_get_async(be, a, part, offset=4 * 16)  # row 1, first half: 8 floats
    be.synchronize()
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(part, x[1, :8])
    buf.free()


def test_async_copies_between_backends_and_from_host(reg, backends):
    devs = reg.devices
    d0, d1 = devs[0], devs[-1]  # the same device when only one exists
    b0, b1 = backends(d0), backends(d1)
    ctx = Context()
    src = ctx.new_tensor_1d(Type.F32, 256)
    mid = ctx.new_tensor_1d(Type.F32, 256)
    dst = ctx.new_tensor_1d(Type.F32, 256)
    host = ctx.new_tensor_1d(Type.F32, 256)
    buf0 = place(d0.get_buffer_type(), src, mid)
    buf1 = place(d1.get_buffer_type(), dst)
    hbuf = place(cpu_buffer_type(), host)
    rng = np.random.default_rng(4)
    x, h = f32(rng, 256), f32(rng, 256)
    backend_tensor_set_async(b0, src, x)
    backend_tensor_copy_async(b0, b0, src, mid)          # same backend: on its stream
    backend_tensor_copy_async(b0, b1, mid, dst)          # other backend: source stream + event
    out = np.empty(256, np.float32)
    backend_tensor_get_async(b1, dst, out)
    b1.synchronize()  # b1 alone: the copy's event must order it after b0's queued work
    np.testing.assert_array_equal(out, x)
    backend_tensor_set(host, h)
    cpu = backend_cpu_init()
    backend_tensor_copy_async(cpu, b1, host, dst)        # host buffer -> device, on b1's stream
    backend_tensor_set(host, np.zeros(256, np.float32))  # the host copy was snapshotted
    backend_tensor_get_async(b1, dst, out)
    b1.synchronize()
    np.testing.assert_array_equal(out, h)
    for b in (buf0, buf1, hbuf):
        b.free()


def test_two_backends_ordered_only_by_events(reg, backends):
    dev = reg.devices[0]
    prod, cons = backends(dev), backends(dev)  # two streams of one device
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 128).set_name("a")
    b = ctx.new_tensor_1d(Type.F32, 128).set_name("b")
    c = ops.add(ctx, a, b).set_name("c")
    d = ops.add(ctx, c, b).set_name("d")
    g1, g2 = Graph(), Graph()
    g1.build_forward_expand(c)
    g2.nodes = [d]  # compute only d; c comes from the producer
    buf = place(dev.get_buffer_type(), a, b, c, d)
    buf.clear(0)
    x = np.arange(128, dtype=np.float32)
    y = np.full(128, 3.0, np.float32)
    ev = event_new(dev)
    assert event_query(ev)  # never recorded: complete
    backend_tensor_set_async(prod, a, x)
    backend_tensor_set_async(prod, b, y)
    prod.graph_compute_async(g1)
    event_record(ev, prod)
    event_wait(cons, ev)
    cons.graph_compute_async(g2)
    out = np.empty(128, np.float32)
    backend_tensor_get_async(cons, d, out)
    cons.synchronize()  # only the consumer is synchronized
    np.testing.assert_array_equal(out, x.astype(np.float64) + 6.0)  # small integers: exact
    event_synchronize(ev)
    assert event_query(ev)
    buf.free()


def test_event_rules(reg, backends, sim_devices):
    d0 = reg.devices[0]
    b0 = backends(d0)
    ev = event_new(d0)
    assert ev is not None and ev.device is d0
    if len(reg.devices) > 1:
        b1 = backends(reg.devices[1])
        with pytest.raises(ValueError, match="another device"):
            event_record(ev, b1)
        event_record(ev, b0)
        event_wait(b1, ev)  # waits across devices of one runtime are allowed (as in CUDA)
        b1.synchronize()
        assert event_query(ev)
    other = sim_devices(1)[0]  # another runtime
    ob = backends(other)
    ev_other = event_new(other)
    with pytest.raises(ValueError, match="another runtime"):
        event_wait(b0, ev_other)
    with pytest.raises(ValueError, match="another runtime"):
        event_wait(ob, ev)
    with pytest.raises(ValueError):
        event_wait(backend_cpu_init(), ev)  # the CPU has no events
    assert event_new(backend_cpu_init().device) is None


# ---------------------------------------------------------------------------------------------
# faults and bad input


def test_bad_async_copies_raise_before_anything_is_queued(reg, backends):
    be = backends(reg.devices[0])
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 16).set_name("a")
    b = ctx.new_tensor_1d(Type.F32, 8).set_name("b")
    buf = place(reg.devices[0].get_buffer_type(), a, b)
    x = np.arange(16, dtype=np.float32)
    backend_tensor_set(a, x)
    with pytest.raises(ValueError, match="'a'"):
        backend_tensor_set_async(be, a, np.zeros(17, np.float32))      # wrong size
    with pytest.raises(ValueError, match="outside tensor 'a'"):
        backend_tensor_set_async(be, a, np.zeros(4, np.uint8), offset=62)  # out of bounds
    with pytest.raises(TypeError):
        backend_tensor_set_async(be, a, np.zeros(16, np.float64))      # wrong dtype
    out = np.full(17, 7.0, np.float32)
    with pytest.raises(ValueError, match="outside tensor 'a'"):
        backend_tensor_get_async(be, a, out)                           # too large
    with pytest.raises(ValueError, match="differ in layout"):
        backend_tensor_copy_async(be, be, a, b)
    be.synchronize()
    np.testing.assert_array_equal(get(a), x)  # nothing was written
    np.testing.assert_array_equal(out, np.full(17, 7.0, np.float32))
    buf.free()


def test_unsupported_and_unreadable_nodes_raise_on_the_calling_thread(reg, backends, sim_devices):
    dev = reg.devices[0]
    be = backends(dev)
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 8)
    b = ctx.new_tensor_1d(Type.F32, 8)
    c = ops.add(ctx, a, b)
    g = Graph()
    g.build_forward_expand(c)
    dbuf = place(dev.get_buffer_type(), a, c)
    hbuf = place(cpu_buffer_type(), b)  # b in host memory: the device plan cannot read it
    with pytest.raises(NotAllocatedError, match="cannot access"):
        be.graph_compute_async(g)
    dbuf.free()
    hbuf.free()
    if reg.name == "SIM":
        refusing = sim_devices(1, refuse_ops={Op.ADD})[0]
        assert not refusing.supports_op(c)
        rb = backends(refusing)
        ctx2 = Context()
        a2, b2 = ctx2.new_tensor_1d(Type.F32, 8), ctx2.new_tensor_1d(Type.F32, 8)
        c2 = ops.add(ctx2, a2, b2)
        g2 = Graph()
        g2.build_forward_expand(c2)
        rbuf = place(refusing.get_buffer_type(), a2, b2, c2)
        with pytest.raises(UnsupportedOpError, match="ADD"):
            rb.graph_compute_async(g2)
        rbuf.free()


def test_free_waits_for_work_in_flight(reg, backends):
    be = backends(reg.devices[0])
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 1024)
    buf = place(reg.devices[0].get_buffer_type(), a)
    x = f32(np.random.default_rng(5), 1024)
    backend_tensor_set_async(be, a, x)
    out = np.zeros(1024, np.float32)
    backend_tensor_get_async(be, a, out)
    buf.free()  # waits for the queued upload and download first
    np.testing.assert_array_equal(out, x)


def test_cached_plan_refuses_freed_buffer(reg, backends):
    be = backends(reg.devices[0])
    g, a, b, c, buf = add_graph(reg.devices[0].get_buffer_type())
    be.graph_compute(g)
    buf.free()
    with pytest.raises(NotAllocatedError):
        be.graph_compute_async(g)


def test_failure_in_queued_work_reraised_on_synchronize(reg, backends):
    if reg.name != "SIM":
        pytest.skip("a host exception inside queued work is a SIM notion; CUDA raises at launch")
    be = backends(reg.devices[0])
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 4)

    def boom() -> None:
        raise ZeroDivisionError("kernel exploded")

    be.graph_plan_compute(Plan([boom], [t]))
    with pytest.raises(ComputeError, match="kernel exploded") as info:
        be.synchronize()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    be.synchronize()  # the error was reported once; the stream is usable again
    g, a, b, c, buf = add_graph(reg.devices[0].get_buffer_type(), 8)
    backend_tensor_set(a, np.ones(8, np.float32))
    backend_tensor_set(b, np.ones(8, np.float32))
    be.graph_compute(g)
    np.testing.assert_array_equal(get(c), np.full(8, 2.0))
    buf.free()


def test_pinned_host_buffer_works_with_cpu_and_device(reg, backends):
    dev = reg.devices[0]
    be = backends(dev)
    host_buft = dev.get_host_buffer_type()
    ctx = Context()
    ha = ctx.new_tensor_1d(Type.F32, 32)
    hb = ctx.new_tensor_1d(Type.F32, 32)
    hc = ops.add(ctx, ha, hb)
    g = Graph()
    g.build_forward_expand(hc)
    hbuf = place(host_buft, ha, hb, hc)
    assert isinstance(hbuf, HostBuffer) and hbuf.is_host()
    x = np.arange(32, dtype=np.float32)
    backend_tensor_set(ha, x)
    backend_tensor_set(hb, x)
    backend_cpu_init().graph_compute(g)  # the CPU backend computes on pinned memory directly
    dt = Context().new_tensor_1d(Type.F32, 32)
    dbuf = place(dev.get_buffer_type(), dt)
    backend_tensor_copy_async(backend_cpu_init(), be, hc, dt)
    out = np.empty(32, np.float32)
    backend_tensor_get_async(be, dt, out)
    be.synchronize()
    np.testing.assert_array_equal(out, 2 * np.arange(32, dtype=np.float64))  # exact integers
    hbuf.free()
    dbuf.free()


def test_backend_is_async_device_backend(reg, backends):
    be = backends(reg.devices[0])
    assert isinstance(be, AsyncBackend)
    assert be.name == reg.devices[0].name
    assert be.get_default_buffer_type() is reg.devices[0].get_buffer_type()
