"""The backend interface facade on the CPU backend: tensor data access, bounds and allocation
checks, the copy ladder, buffers, plans and errors."""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Graph, Type
from ggmlpy.backend.buffers import MultiBuffer
from ggmlpy.backend.interface import BufferUsage, tensor_alloc, view_init
from ggmlpy.backend.tensor_data import (
    backend_tensor_copy,
    backend_tensor_get,
    backend_tensor_get_async,
    backend_tensor_memset,
    backend_tensor_set,
    backend_tensor_set_async,
)
from ggmlpy.core.errors import NotAllocatedError, UnsupportedOpError


def _place(buf, tensors, align=32):
    off = 0
    for t in tensors:
        if t.view_src is not None:
            view_init(t)
            continue
        tensor_alloc(buf, t, off)
        off += -(-t.nbytes // align) * align


@pytest.fixture
def cpu():
    return gp.backend_cpu_init()


def test_set_get_roundtrip_and_shape(cpu):
    ctx = Context()
    t = ctx.new_tensor_3d(Type.F32, 4, 3, 2).set_name("t")
    buf = cpu.alloc_buffer(t.nbytes)
    _place(buf, [t])
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    backend_tensor_set(t, x)
    y = backend_tensor_get(t)
    assert y.shape == (1, 2, 3, 4) and y.dtype == np.float32
    np.testing.assert_array_equal(y[0], x)
    # byte-range reads return bytes
    assert backend_tensor_get(t, 4, 8) == x.reshape(-1)[1:3].tobytes()
    # partial write at an offset
    backend_tensor_set(t, np.array([100.0], np.float32), offset=8)
    assert backend_tensor_get(t)[0, 0, 0, 2] == 100.0


def test_lists_scalars_and_bad_arguments(cpu):
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 4).set_name("t")
    buf = cpu.alloc_buffer(64)
    _place(buf, [t])
    backend_tensor_set(t, [1.0, 2.0, 3.0, 4.0])  # values of the tensor's type, not float64 bytes
    np.testing.assert_array_equal(backend_tensor_get(t).ravel(), [1, 2, 3, 4])
    with pytest.raises(ValueError, match="'t'"):
        backend_tensor_set(t, [1.0, 2.0])
    with pytest.raises(ValueError, match="'t'"):
        backend_tensor_set(t, 1.5)
    with pytest.raises(TypeError, match="offset"):
        backend_tensor_set(t, np.zeros(1, np.float32), offset=1.5)
    with pytest.raises(TypeError, match="Tensor"):
        backend_tensor_get(np.zeros(4))
    with pytest.raises(TypeError, match="Tensor"):
        backend_tensor_copy(t, None)


def test_set_errors_name_the_tensor(cpu):
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 4).set_name("inp")
    with pytest.raises(NotAllocatedError, match="inp"):
        backend_tensor_set(t, np.zeros(4, np.float32))
    with pytest.raises(NotAllocatedError, match="inp"):
        backend_tensor_get(t)
    buf = cpu.alloc_buffer(64)
    _place(buf, [t])
    with pytest.raises(TypeError, match="inp"):
        backend_tensor_set(t, np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="inp"):
        backend_tensor_set(t, np.zeros(3, np.float32))  # whole-tensor write of the wrong size
    with pytest.raises(ValueError, match="outside tensor 'inp'"):
        backend_tensor_set(t, np.zeros(3, np.float32), offset=8)
    with pytest.raises(ValueError, match="outside"):
        backend_tensor_get(t, 12, 8)
    with pytest.raises(ValueError, match="outside"):
        backend_tensor_memset(t, 0, 4, 16)
    # a partial write from offset 0 must be explicit
    backend_tensor_set(t, np.ones(2, np.float32), size=8)
    np.testing.assert_array_equal(backend_tensor_get(t).ravel()[:2], [1, 1])


def test_memset_and_neighbours_untouched(cpu):
    ctx = Context()
    a, b = ctx.new_tensor_1d(Type.I8, 32), ctx.new_tensor_1d(Type.I8, 32)
    buf = cpu.alloc_buffer(64)
    _place(buf, [a, b])
    backend_tensor_set(a, np.full(32, 5, np.int8))
    backend_tensor_set(b, np.full(32, 7, np.int8))
    backend_tensor_memset(a, 1, 8, 4)
    ra = backend_tensor_get(a).ravel()
    assert list(ra[8:12]) == [1] * 4 and ra[7] == 5 and ra[12] == 5
    assert np.all(backend_tensor_get(b) == 7)


def test_tensor_copy_requires_same_layout(cpu):
    ctx = Context()
    a = ctx.new_tensor_2d(Type.F32, 4, 2).set_name("a")
    b = ctx.new_tensor_2d(Type.F32, 4, 2).set_name("b")
    c = ctx.new_tensor_2d(Type.F32, 2, 4).set_name("c")
    buf = cpu.alloc_buffer(256)
    _place(buf, [a, b, c])
    backend_tensor_set(a, np.arange(8, dtype=np.float32).reshape(2, 4))
    backend_tensor_copy(a, b)
    np.testing.assert_array_equal(backend_tensor_get(b), backend_tensor_get(a))
    with pytest.raises(ValueError, match="differ in layout"):
        backend_tensor_copy(a, c)


def test_async_forms_fall_back_on_cpu(cpu):
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 8)
    buf = cpu.alloc_buffer(64)
    _place(buf, [t])
    x = np.arange(8, dtype=np.float32)
    backend_tensor_set_async(cpu, t, x)
    out = np.empty(8, np.float32)
    backend_tensor_get_async(cpu, t, out)
    cpu.synchronize()
    np.testing.assert_array_equal(out, x)
    with pytest.raises(ValueError, match="outside"):
        backend_tensor_get_async(cpu, t, np.empty(9, np.float32))


def test_zero_copy_user_memory(cpu):
    raw = np.zeros(64 * 4 + 32, np.uint8)
    shift = (-raw.ctypes.data) % 32
    arr = raw[shift:shift + 256].view(np.float32)  # 32-byte aligned, as ggml requires
    buf = gp.cpu_buffer_from_array(arr)
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 64)
    tensor_alloc(buf, t, 0)
    backend_tensor_set(t, np.full(64, 3.0, np.float32))
    assert np.all(arr == 3.0)  # the user's array is the tensor's memory
    with pytest.raises(ValueError, match="aligned"):
        gp.cpu_buffer_from_array(np.zeros(65, np.uint8)[1:])


def test_zero_size_and_multi_buffer(cpu):
    z = cpu.alloc_buffer(0)
    assert z.size == 0
    z.clear(0)
    b1, b2 = cpu.alloc_buffer(64), cpu.alloc_buffer(32)
    mb = MultiBuffer([b1, b2])
    assert mb.size == 96
    mb.set_usage(BufferUsage.WEIGHTS)
    assert b1.usage == BufferUsage.WEIGHTS and b2.usage == BufferUsage.WEIGHTS
    mb.free()
    assert b1.freed and b2.freed


def test_freed_buffer_access_raises(cpu):
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 4).set_name("gone")
    buf = cpu.alloc_buffer(16)
    _place(buf, [t])
    buf.free()
    with pytest.raises(NotAllocatedError, match="freed"):
        backend_tensor_get(t)
    with pytest.raises(ValueError):
        buf.clear(300)


def test_tensor_alloc_bounds(cpu):
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 16).set_name("big")
    buf = cpu.alloc_buffer(32)
    with pytest.raises(ValueError, match="big"):
        tensor_alloc(buf, t, 0)
    assert not t.is_allocated


def test_compute_unallocated_graph_raises(cpu):
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 4).set_name("a")
    c = gp.neg(ctx, a).set_name("c")
    g = Graph()
    g.build_forward_expand(c)
    with pytest.raises(NotAllocatedError):
        cpu.graph_compute(g)


def test_unsupported_op_raises(cpu):
    ctx = Context()
    a = ctx.new_tensor_2d(Type.Q8_0, 32, 2).set_name("q")
    b = ctx.new_tensor_2d(Type.F32, 32, 2).set_name("x")
    c = gp.add(ctx, b, b)
    d = gp.scale(ctx, c, 2.0)
    # a quantized add is not implemented by the NumPy kernels
    bad = gp.add(ctx, a, a).set_name("qadd")
    assert not cpu.supports_op(bad)
    buf = cpu.alloc_buffer(4096)
    _place(buf, [a, b, c, d, bad])
    g = Graph()
    g.build_forward_expand(bad)
    with pytest.raises(UnsupportedOpError, match="qadd"):
        cpu.graph_compute(g)


def test_plan_is_reused_until_allocation_changes(cpu, monkeypatch):
    from ggmlpy.backends import plan as plan_mod

    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 4)
    b = gp.neg(ctx, a)
    g = Graph()
    g.build_forward_expand(b)
    buf = cpu.alloc_buffer(256)
    _place(buf, [a, b])
    builds = []
    real = plan_mod.build_plan
    monkeypatch.setattr(plan_mod, "build_plan", lambda *a_, **k: builds.append(1) or real(*a_, **k))
    import ggmlpy.backends.cpu.backend as cpu_mod
    monkeypatch.setattr(cpu_mod, "build_plan", plan_mod.build_plan)
    backend_tensor_set(a, np.array([1, 2, 3, 4], np.float32))
    cpu.graph_compute(g)
    cpu.graph_compute(g)
    assert len(builds) == 1
    np.testing.assert_array_equal(backend_tensor_get(b).ravel(), [-1, -2, -3, -4])
    # move b: the plan must be rebuilt and the result land in the new place
    b.buffer = None
    b.offset = None
    tensor_alloc(buf, b, 128)
    cpu.graph_compute(g)
    assert len(builds) == 2
    np.testing.assert_array_equal(backend_tensor_get(b).ravel(), [-1, -2, -3, -4])


def test_context_with_memory():
    ctx = Context(no_alloc=False)
    a = ctx.new_tensor_1d(Type.F32, 3)
    assert a.is_allocated
    backend_tensor_set(a, np.array([1, 2, 3], np.float32))
    v = gp.view_1d(ctx, a, 2, 4)
    np.testing.assert_array_equal(backend_tensor_get(v).ravel(), [2, 3])


@pytest.mark.parametrize("size", [1, 4096, (1 << 20) - 1, 1 << 20, (3 << 20) + 5])
def test_cpu_buffer_memory_small_and_populated(size, monkeypatch):
    """CPU buffers below and from POPULATE_MIN_BYTES (a MAP_POPULATE mapping on Linux, else
    np.empty): 64-byte aligned base, writable, exact size, every byte addressable; a size no
    machine has raises OutOfMemoryError naming the request."""
    from ggmlpy.backends.cpu import backend as cpu_mod
    from ggmlpy.core.errors import OutOfMemoryError

    buf = cpu_mod.cpu_buffer_type().alloc_buffer(size)
    data = buf.data
    assert data.size == size and data.dtype == np.uint8 and data.flags.writeable
    assert data.ctypes.data % cpu_mod.MEMORY_ALIGNMENT == 0
    data[:] = 7
    data[-1] = 9
    assert np.all(data[:-1] == 7) and int(data[-1]) == 9
    buf.free()
    with pytest.raises(OutOfMemoryError, match=str(1 << 55)):
        cpu_mod.cpu_buffer_type().alloc_buffer(1 << 55)


@pytest.mark.parametrize("size", [1.5, "10", True, None, 2.0])
def test_alloc_buffer_size_must_be_an_int(size):
    from ggmlpy.backends.cpu.backend import cpu_buffer_type

    with pytest.raises(TypeError, match="size must be an int"):
        cpu_buffer_type().alloc_buffer(size)
    assert cpu_buffer_type().alloc_buffer(np.int64(16)).size == 16


def test_scheduler_backends_must_be_a_list(cpu):
    from ggmlpy.sched.scheduler import Scheduler

    with pytest.raises(TypeError, match="backends must be a list"):
        Scheduler(cpu)


def test_cpu_buffer_not_populated_beyond_half_the_free_memory(monkeypatch):
    """Populated pages are committed at once: a request above half the free physical memory is
    mapped lazily (np.empty), so it cannot bring the OOM killer at allocation time."""
    from ggmlpy.backends.cpu import backend as cpu_mod

    if cpu_mod._MAP_POPULATE is None:
        pytest.skip("no MAP_POPULATE on this platform: every buffer is np.empty")
    big = cpu_mod.POPULATE_MIN_BYTES * 4
    monkeypatch.setattr(cpu_mod, "_free_physical_bytes", lambda: 4 * big)
    populated = cpu_mod._aligned_bytes(big)
    monkeypatch.setattr(cpu_mod, "_free_physical_bytes", lambda: big)
    lazy = cpu_mod._aligned_bytes(big)
    assert not isinstance(populated.base, np.ndarray)  # a view of the mmap
    assert isinstance(lazy.base, np.ndarray)           # a slice of np.empty's array
    for a in (populated, lazy):
        assert a.size == big and a.ctypes.data % cpu_mod.MEMORY_ALIGNMENT == 0
        a[:] = 3
        assert int(a[::4096].sum()) == 3 * len(range(0, big, 4096))


@pytest.mark.parametrize("ttype,big", [(Type.F16, 1e6), (Type.F16, -70000.0), (Type.F32, 1e39)])
def test_set_list_out_of_range_refused(cpu, ttype, big):
    """A list or scalar is converted to the tensor's element type; a finite value beyond that
    type's range would become inf: refused, naming the tensor. In range, the values land."""
    ctx = Context()
    t = ctx.new_tensor_1d(ttype, 4).set_name("w")
    buf = cpu.alloc_buffer(64)
    gp.tensor_alloc(buf, t, 0)
    with pytest.raises(ValueError, match="outside the range of tensor 'w'"):
        backend_tensor_set(t, [1.0, big, 3.0, 4.0])
    backend_tensor_set(t, [1.0, 2.0, np.inf, -np.inf])  # infinities given are kept as given
    got = backend_tensor_get(t).reshape(-1)
    np.testing.assert_array_equal(got, np.array([1.0, 2.0, np.inf, -np.inf], ttype.dtype))
    top = 65504.0 if ttype == Type.F16 else 3e38               # in range: stored
    backend_tensor_set(t, top, size=t.nbytes // 4)
    assert float(backend_tensor_get(t).reshape(-1)[0]) == float(np.array(top, ttype.dtype))


def _zero_bufts():
    from backend_kinds import new_sim_devices

    dev = new_sim_devices(1)[0]
    return [gp.cpu_buffer_type(), dev.get_buffer_type(), dev.get_host_buffer_type()]


@pytest.mark.parametrize("buft", _zero_bufts(), ids=lambda b: b.name)
def test_alloc_buffer_0_is_the_zero_size_buffer_of_every_buffer_type(buft):
    # ggml returns a zero-size buffer for alloc_buffer(0) without calling the backend; it lives in
    # ggmlpy.backend.buffers (one layer above backend.py) and must stay a working Buffer
    from ggmlpy.backend.buffers import _ZeroBuffer
    from ggmlpy.backend.interface import Buffer
    from ggmlpy.backend.write_gen import buffer_written

    z = buft.alloc_buffer(0)
    assert type(z) is _ZeroBuffer and isinstance(z, Buffer)
    assert z.buft is buft and z.size == 0 and z.get_size() == 0 and z.is_host() == buft.is_host()
    t = Context().new_tensor_2d(Type.F32, 0, 3).set_name("empty")
    assert tensor_alloc(z, t, 0) == gp.Status.SUCCESS
    backend_tensor_set(t, np.zeros((3, 0), np.float32))
    backend_tensor_memset(t, 7, 0, 0)
    assert backend_tensor_get(t).shape == (1, 1, 3, 0)
    assert z._array(t).shape == (1, 1, 3, 0) and z._array(t).dtype == np.float32
    z.clear(5)
    gen = z.data_gen
    buffer_written(z)
    assert z.data_gen > gen
    z.free()
    assert z.freed
    with pytest.raises(NotAllocatedError, match="freed"):
        backend_tensor_get(t)


def test_buffer_written_takes_every_buffer_kind_and_refuses_lookalikes(cpu):
    # the type check lives in ggmlpy.backend.write_gen (below backend.py): Buffer derives from WriteTracked
    from ggmlpy.backend.write_gen import buffer_written

    bufs = [cpu.alloc_buffer(64), cpu.alloc_buffer(0)]
    bufs.append(MultiBuffer([cpu.alloc_buffer(16), cpu.alloc_buffer(16)]))
    gens = []
    for b in bufs:
        buffer_written(b)
        gens.append(b.data_gen)
    assert gens == sorted(set(gens))  # new and strictly increasing, never reused

    class LooksLikeABuffer:
        _data_gen = 0
        _async_writes = 0

    fake = LooksLikeABuffer()
    with pytest.raises(TypeError, match="buffer must be a Buffer, got LooksLikeABuffer"):
        buffer_written(fake)
    assert fake._data_gen == 0
