"""Zero-copy interop (issue 14 item 6): host tensors as NumPy views / DLPack (NumPy, torch CPU),
CUDA tensors as __cuda_array_interface__ v3 / DLPack with the producer's stream (fake CuPy),
backend_tensor_get(out=), and the lifetimes: views alias the memory now, a freed buffer's memory
is never handed to anyone while a view can read it, exporting a freed tensor raises."""

from __future__ import annotations

import ctypes
import gc

import fake_cupy
import numpy as np
import pytest
from fake_cupy import fake_cuda_reg

from ggmlpy import ops
from ggmlpy.backend.interface import tensor_alloc, view_init
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import backend_cpu_init, cpu_buffer_type
from ggmlpy.core.errors import NotAllocatedError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _placed(buft, *ne_types, size=1 << 14):
    ctx = Context()
    ts = [ctx.new_tensor(ty, ne) for ty, ne in ne_types]
    buf = buft.alloc_buffer(size)
    off = 0
    for t in ts:
        tensor_alloc(buf, t, off)
        off += -(-t.nbytes // 256) * 256
    return ctx, buf, ts


# ---------------------------------------------------------------------------------------------
# host buffers


def test_numpy_view_aliases_host_memory_with_ggml_strides():
    ctx, buf, (t,) = _placed(cpu_buffer_type(), (Type.F32, (5, 3, 2)))
    x = np.arange(30, dtype=np.float32).reshape(2, 3, 5)
    backend_tensor_set(t, x)
    v = t.numpy()
    assert v.shape == (1, 2, 3, 5) and v.strides == t.nb[::-1] and v.dtype == np.float32
    np.testing.assert_array_equal(v[0], x)
    v[0, 1, 2, 3] = -7  # writes go to the tensor
    assert backend_tensor_get(t)[0, 1, 2, 3] == -7
    # a permuted view tensor: a strided NumPy view, no copy
    p = ops.permute(ctx, t, 1, 0, 2, 3)
    view_init(p)
    pv = p.numpy()
    assert np.shares_memory(pv, v)
    np.testing.assert_array_equal(pv, np.swapaxes(v, -1, -2))
    # np.asarray: the same view; copy=True / another dtype: a copy
    a = np.asarray(t)
    assert np.shares_memory(a, v)
    assert not np.shares_memory(np.array(t, copy=True), v)
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float64), v.astype(np.float64))
    buf.free()


def test_torch_and_numpy_dlpack_share_host_memory():
    torch = pytest.importorskip("torch")
    ctx, buf, (t, h) = _placed(cpu_buffer_type(), (Type.F32, (4, 3)), (Type.F16, (8,)))
    backend_tensor_set(t, np.arange(12, dtype=np.float32).reshape(3, 4))
    backend_tensor_set(h, np.linspace(0, 1, 8, dtype=np.float16))
    assert t.__dlpack_device__() == (1, 0)
    tt = torch.from_dlpack(t)
    assert tt.dtype == torch.float32 and tuple(tt.shape) == (1, 1, 3, 4)
    tt[0, 0, 2, 1] = 99.0  # shared: visible through ggml's read
    assert backend_tensor_get(t)[0, 0, 2, 1] == 99.0
    th = torch.from_dlpack(h)
    assert th.dtype == torch.float16
    np.testing.assert_array_equal(th.numpy().reshape(-1), np.linspace(0, 1, 8, dtype=np.float16))
    n = np.from_dlpack(t)
    assert np.shares_memory(n, t.numpy())
    buf.free()


def test_a_view_of_an_intermediate_shows_the_next_evaluation():
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (4,))
    out = ops.scale(ctx, a, 2.0)
    g = Graph()
    g.build_forward_expand(out)
    buf = cpu_buffer_type().alloc_buffer(1024)
    tensor_alloc(buf, a, 0)
    tensor_alloc(buf, out, 256)
    be = backend_cpu_init()
    backend_tensor_set(a, np.array([1, 2, 3, 4], np.float32))
    be.graph_compute(g)
    v = out.numpy()
    np.testing.assert_array_equal(v.reshape(-1), [2, 4, 6, 8])
    backend_tensor_set(a, np.array([5, 6, 7, 8], np.float32))
    be.graph_compute(g)  # the memory is reused: the view shows what is there now (as in ggml)
    np.testing.assert_array_equal(v.reshape(-1), [10, 12, 14, 16])
    buf.free()


def test_exports_of_unallocated_freed_or_quantized_tensors_raise():
    ctx = Context()
    loose = ctx.new_tensor(Type.F32, (4,))
    for f in (loose.numpy, lambda: np.asarray(loose), lambda: loose.__dlpack__()):
        with pytest.raises(NotAllocatedError, match="not allocated"):
            f()
    ctx, buf, (t, q) = _placed(cpu_buffer_type(), (Type.F32, (4,)), (Type.Q8_0, (32,)))
    with pytest.raises(TypeError, match="block-quantized"):
        q.numpy()
    backend_tensor_set(t, np.ones(4, np.float32))
    v = t.numpy()
    buf.free()
    with pytest.raises(NotAllocatedError, match="freed"):
        t.numpy()
    with pytest.raises(NotAllocatedError, match="freed"):
        t.__dlpack__()
    # the old view keeps its block alive: a new buffer never gets that memory
    other = cpu_buffer_type().alloc_buffer(buf.size)
    assert not np.shares_memory(v, other.data)
    np.testing.assert_array_equal(v.reshape(-1), 1)
    other.free()


# ---------------------------------------------------------------------------------------------
# device memory


def test_sim_tensors_export_nothing_but_copy_on_asarray(sim_devices):
    dev = sim_devices(1)[0]
    ctx, buf, (t,) = _placed(dev.get_buffer_type(), (Type.F32, (3, 2)))
    backend_tensor_set(t, np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(TypeError, match="device memory"):
        t.numpy()
    assert not hasattr(t, "__cuda_array_interface__")
    with pytest.raises(TypeError, match="not in CUDA device memory"):
        t.__dlpack__()
    np.testing.assert_array_equal(np.asarray(t).reshape(2, 3), np.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match="needs a copy"):
        np.asarray(t, copy=False)
    buf.free()


def _read(ptr: int, n: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * (4 * n)).from_address(ptr), np.float32).copy()


def test_cuda_array_interface_v3_names_the_producer_stream():
    reg = fake_cuda_reg(1)
    dev = reg.devices[0]
    ctx, buf, (a, b) = _placed(dev.get_buffer_type(), (Type.F32, (8, 2)), (Type.F32, (8, 2)))
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    backend_tensor_set(a, x)
    cai = a.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (1, 1, 2, 8) and cai["strides"] == a.nb[::-1]
    assert cai["typestr"] == "<f4" and cai["data"][1] is False
    assert cai["stream"] is None  # nothing queued on any stream yet: no wait needed
    np.testing.assert_array_equal(_read(cai["data"][0], 16), x.reshape(-1))
    be = dev.init_backend()
    g = Graph()
    out = ops.scale(ctx, a, 3.0)
    g.build_forward_expand(out)
    tensor_alloc(buf, out, 4096)
    be.graph_compute_async(g)
    cai = out.__cuda_array_interface__
    assert cai["stream"] == be.stream.cs.ptr  # consumers wait for the backend's stream
    be.synchronize()
    np.testing.assert_array_equal(_read(cai["data"][0], 16), 3 * x.reshape(-1))
    be.free()
    assert out.__cuda_array_interface__["stream"] is None  # a freed stream is not named
    del cai
    buf.free()


def test_cuda_dlpack_honours_the_consumer_stream_under_the_producer_stream():
    dev = fake_cuda_reg(1).devices[0]
    ctx, buf, (a,) = _placed(dev.get_buffer_type(), (Type.F32, (6,)))
    be = dev.init_backend()
    fake_cupy.DLPACK_CALLS.clear()
    x = np.arange(6, dtype=np.float32)
    from ggmlpy.backend.tensor_data import backend_tensor_set_async  # noqa: PLC0415

    backend_tensor_set_async(be, a, x)  # queued on be's stream: it becomes the producer stream
    cap = a.__dlpack__(stream=None)
    assert fake_cupy.DLPACK_CALLS[-1] == (None, be.stream.cs)
    a.__dlpack__(stream=7)
    assert fake_cupy.DLPACK_CALLS[-1] == (7, be.stream.cs)  # the consumer's stream goes through
    be.synchronize()
    n = np.from_dlpack(a)  # the fake's memory is host-emulated: kCPU, readable here
    np.testing.assert_array_equal(n.reshape(-1), x)
    backend_tensor_set(a, x * 2)
    np.testing.assert_array_equal(n.reshape(-1), x * 2)  # zero-copy
    del cap, n
    be.free()
    buf.free()


def test_freeing_a_device_buffer_with_live_exports_defers_its_release():
    dev = fake_cuda_reg(1).devices[0]
    rt = dev.runtime.rt
    ctx, buf, (a,) = _placed(dev.get_buffer_type(), (Type.F32, (6,)))
    backend_tensor_set(a, np.arange(6, dtype=np.float32))
    ptr = buf.mem.ptr
    cap = a.__dlpack__()
    buf.free()
    assert ptr in rt.allocs  # a live export: not released, not reusable
    with pytest.raises(NotAllocatedError, match="freed"):
        a.__cuda_array_interface__  # noqa: B018
    with pytest.raises(NotAllocatedError, match="freed"):
        a.__dlpack__()
    del cap
    gc.collect()
    assert ptr not in rt.allocs  # the last export died: released
    # without exports, free releases at once
    ctx, buf, (b,) = _placed(dev.get_buffer_type(), (Type.F32, (6,)))
    p2 = buf.mem.ptr
    buf.free()
    assert p2 not in rt.allocs


# ---------------------------------------------------------------------------------------------
# backend_tensor_get(out=)


def test_backend_tensor_get_into_out(device):
    buft = device.get_buffer_type()
    ctx, buf, (t, q) = _placed(buft, (Type.F32, (4, 3)), (Type.Q8_0, (32,)))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    backend_tensor_set(t, x)
    out = np.empty((3, 4), np.float32)
    assert backend_tensor_get(t, out=out) is out
    np.testing.assert_array_equal(out, x)
    strided = np.empty((3, 8), np.float32)[:, ::2]  # a non-contiguous out
    backend_tensor_get(t, out=strided)
    np.testing.assert_array_equal(strided, x)
    # a transposed view tensor, read in logical order
    tt = ops.transpose(ctx, t)
    view_init(tt)
    o2 = np.empty(12, np.float32)
    backend_tensor_get(tt, out=o2)
    np.testing.assert_array_equal(o2, x.T.reshape(-1))
    raw = np.arange(34, dtype=np.uint8)
    backend_tensor_set(q, raw)
    qo = np.empty(34, np.uint8)
    backend_tensor_get(q, out=qo)
    np.testing.assert_array_equal(qo, raw)
    with pytest.raises(TypeError, match="dtype float64"):
        backend_tensor_get(t, out=np.empty(12))
    with pytest.raises(ValueError, match="11 elements"):
        backend_tensor_get(t, out=np.empty(11, np.float32))
    with pytest.raises(ValueError, match="no offset/size"):
        backend_tensor_get(t, 4, out=out)
    ro = np.empty(12, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        backend_tensor_get(t, out=ro)
    with pytest.raises(TypeError, match="NumPy array"):
        backend_tensor_get(t, out=[0.0] * 12)
    buf.free()
