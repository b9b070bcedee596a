"""The CUDA runtime (ggmlpy.backends.cuda.runtime): the no-CuPy and no-driver paths everywhere, and
CUDA-only facts on a GPU machine (``-m gpu``; skipped with a reason otherwise). The generic device
tests in test_device_backend.py / test_device_ops.py also run on CUDA there."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from ggmlpy.backend.interface import DeviceType, tensor_alloc
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import HostBuffer
from ggmlpy.backends.cuda import runtime as cupy_runtime
from ggmlpy.core.errors import BackendUnavailableError, OutOfMemoryError
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _fresh_reg():
    return cupy_runtime.cuda_reg.__wrapped__()  # bypass the per-process cache


def test_cuda_reg_without_cupy_is_empty_with_a_reason(monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes ``import cupy`` raise ImportError
    reg = _fresh_reg()
    assert reg.name == "CUDA" and reg.devices == []
    assert reg.unavailable_reason.startswith("CuPy is not usable")
    assert "\n" not in reg.unavailable_reason
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_cuda_reg_here_is_quiet_and_explains_itself(capfd):
    reg = _fresh_reg()
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # no CuPy warnings on stderr, no exception
    if reg.devices:
        assert reg.unavailable_reason is None
        assert [d.name for d in reg.devices] == [f"CUDA{i}" for i in range(len(reg.devices))]
    else:
        assert reg.unavailable_reason and "\n" not in reg.unavailable_reason


def test_init_by_name_cuda0_raises_when_unavailable():
    from ggmlpy.backend import registry

    if cupy_runtime.cuda_reg().devices:
        pytest.skip("a CUDA device exists here")
    with pytest.raises(BackendUnavailableError) as info:
        registry.backend_init_by_name("CUDA0")
    assert cupy_runtime.cuda_reg().unavailable_reason in str(info.value)
    assert registry.reg_unavailable_reason("CUDA") == cupy_runtime.cuda_reg().unavailable_reason


# ---------------------------------------------------------------------------------------------
# GPU machine only


@pytest.fixture
def cuda_dev():
    reg = cupy_runtime.cuda_reg()
    if not reg.devices:
        pytest.skip(f"no CUDA device: {reg.unavailable_reason}")
    return reg.devices[0]


@pytest.mark.gpu
def test_cuda_props(cuda_dev):
    import cupy

    props = cuda_dev.get_props()
    assert props.type in (DeviceType.GPU, DeviceType.IGPU)
    major, minor = cupy.cuda.Device(0).compute_capability[:-1], cupy.cuda.Device(0).compute_capability[-1]
    assert props.extra["compute_capability"] == f"{int(major)}.{int(minor)}"
    free, total = cupy.cuda.runtime.memGetInfo()
    assert props.memory_total == total
    assert props.description and props.extra["device_name"] == props.description


@pytest.mark.gpu
def test_cuda_buffers_bypass_the_cupy_pool_and_oom_is_clean(cuda_dev):
    import cupy

    pool = cupy.get_default_memory_pool()
    used0 = pool.used_bytes()
    buft = cuda_dev.get_buffer_type()
    buf = buft.alloc_buffer(64 << 20)
    assert pool.used_bytes() == used0  # cudaMalloc directly, not the pool
    free_before_free = cuda_dev.get_memory()[0]
    buf.free()
    assert cuda_dev.get_memory()[0] >= free_before_free + (32 << 20)  # released at free
    total = cuda_dev.get_memory()[1]
    with pytest.raises(OutOfMemoryError) as info:
        buft.alloc_buffer(total + (1 << 30))
    assert info.value.requested == total + (1 << 30) and info.value.free is not None
    small = buft.alloc_buffer(1 << 20)  # the device stays usable
    small.free()


@pytest.mark.gpu
def test_cuda_host_buffer_is_pinned_host_memory(cuda_dev):
    buft = cuda_dev.get_host_buffer_type()
    assert buft.name == "CUDA_Host" and buft.is_host()
    buf = buft.alloc_buffer(4096)
    assert isinstance(buf, HostBuffer) and buf.buft is buft
    t = Context().new_tensor_1d(Type.F32, 16)
    tensor_alloc(buf, t, 0)
    x = np.arange(16, dtype=np.float32)
    backend_tensor_set(t, x)
    np.testing.assert_array_equal(backend_tensor_get(t).reshape(16), x)
    buf.free()


from fake_cupy import fake_cuda_reg  # noqa: E402


def test_fake_cuda_props_and_oom():
    reg = fake_cuda_reg(2, capacity=8 << 20)
    d0, d1 = reg.devices
    assert (d0.name, d1.name) == ("CUDA0", "CUDA1")
    p = d1.get_props()
    assert p.type == DeviceType.GPU and p.extra["compute_capability"] == "9.0"
    assert p.device_id == "0000:1b:00.0" and p.description == "Fake GPU 1"
    assert d0.get_memory() == (8 << 20, 8 << 20)
    keep = d0.get_buffer_type().alloc_buffer(6 << 20)
    with pytest.raises(OutOfMemoryError) as info:
        d0.get_buffer_type().alloc_buffer(4 << 20)
    assert info.value.requested == 4 << 20 and info.value.free == 2 << 20
    assert d1.get_memory()[0] == 8 << 20  # per device
    keep.free()
    assert d0.get_memory() == (8 << 20, 8 << 20)  # released at free
    assert d0.get_host_buffer_type().name == "CUDA_Host"
    assert d1.get_host_buffer_type() is d0.get_host_buffer_type()  # device 0's, as in ggml


# ---------------------------------------------------------------------------------------------
# probe, error mapping, pinned staging ring, peer access, two backends on one GPU (fake CuPy)

import fake_cupy  # noqa: E402
from fake_cupy import FakeCublasError, FakeCupy, FakeDriverError, FakePoolOutOfMemory  # noqa: E402

from ggmlpy.backend.tensor_data import (
    backend_tensor_copy_async,
    backend_tensor_get_async,
    backend_tensor_set_async,
)
from ggmlpy.backends.cpu.backend import backend_cpu_init  # noqa: E402
from ggmlpy.core.errors import ComputeError  # noqa: E402


@pytest.fixture(autouse=False)
def no_pending_fail():
    yield
    fake_cupy._FAILS.clear()


def test_probe_passes_on_a_working_fake_and_names_what_is_missing(monkeypatch, no_pending_fail):
    fake = FakeCupy(1)
    assert cupy_runtime.probe(fake) is None
    fake.fail_next("RawKernel", FakeDriverError("CUDA_ERROR_NO_BINARY_FOR_GPU"))
    r = cupy_runtime.probe(fake)
    assert r.startswith("cannot compile/run a CUDA kernel") and "NO_BINARY_FOR_GPU" in r
    assert "ctk" in r and "\n" not in r
    fake.fail_next("cublas_handle", FakeCublasError("CUBLAS_STATUS_NOT_INITIALIZED"))
    r = cupy_runtime.probe(fake)
    assert r.startswith("cuBLAS is not usable") and "NOT_INITIALIZED" in r
    # the reg reports the probe's reason and registers no device
    monkeypatch.setattr(cupy_runtime, "import_cupy", lambda: (fake, None))
    fake.fail_next("RawKernel", OSError("libnvrtc.so.12: cannot open shared object file"))
    reg = _fresh_reg()
    assert reg.devices == [] and "libnvrtc" in reg.unavailable_reason
    reg = _fresh_reg()
    assert [d.name for d in reg.devices] == ["CUDA0"] and reg.unavailable_reason is None


def _rt_env():
    rt = cupy_runtime.CupyRuntime(FakeCupy(2))
    s = rt.stream_new(0, "t")
    m0, m1 = rt.malloc(0, 256), rt.malloc(1, 256)
    return rt, s, m0, m1


_H = np.zeros(64, np.uint8)
_FakeCudaError = fake_cupy._FakeCudaError

#: (operation, where the fake fails, the CuPy-side exception, ggmlpy's exception, message part)
_ERROR_TABLE = [
    ("launch", "RawKernel", FakeDriverError("CUDA_ERROR_ILLEGAL_ADDRESS"), ComputeError, "kernel launch"),
    ("launch", "RawKernel", FakeCublasError("CUBLAS_STATUS_EXECUTION_FAILED"), ComputeError, "kernel launch"),
    ("launch", "RawKernel", FakePoolOutOfMemory(1024), OutOfMemoryError, "kernel launch"),
    ("launch", "RawKernel", KeyError("not CUDA"), KeyError, "not CUDA"),
    ("htod", "runtime.memcpyAsync", _FakeCudaError(700, "cudaErrorIllegalAddress"), ComputeError, "host-to-device"),
    ("dtoh", "runtime.memcpyAsync", _FakeCudaError(700, "cudaErrorIllegalAddress"), ComputeError, "device-to-host"),
    ("dtod", "runtime.memcpyAsync", _FakeCudaError(700, "x"), ComputeError, "device-to-device"),
    ("peer", "runtime.memcpyPeerAsync", _FakeCudaError(700, "x"), ComputeError, "device-to-device"),
    ("memset", "runtime.memsetAsync", _FakeCudaError(1, "cudaErrorInvalidValue"), ComputeError, "memset"),
    ("htod_async", "runtime.memcpyAsync", _FakeCudaError(2, "cudaErrorMemoryAllocation"), OutOfMemoryError, "async host-to-device"),
    ("dtoh_async", "runtime.memcpyAsync", _FakeCudaError(700, "x"), ComputeError, "async device-to-host"),
    ("dtod_async", "runtime.memcpyAsync", _FakeCudaError(700, "x"), ComputeError, "async device-to-device"),
    ("event_record", "Event.record", FakeDriverError("CUDA_ERROR_LAUNCH_FAILED"), ComputeError, "event record"),
    ("event_sync", "Event.synchronize", FakeDriverError("CUDA_ERROR_LAUNCH_FAILED"), ComputeError, "event synchronize"),
    ("stream_sync", "Stream.synchronize", FakeDriverError("CUDA_ERROR_LAUNCH_FAILED"), ComputeError, "queued work"),
    ("malloc", "runtime.malloc", _FakeCudaError(101, "cudaErrorInvalidDevice"), ComputeError, "cudaMalloc"),
    ("pinned", "alloc_pinned_memory", _FakeCudaError(2, "cudaErrorMemoryAllocation"), OutOfMemoryError, "CUDA_Host"),
]


def _do(op, rt, s, m0, m1):
    fake = rt.cp
    if op == "launch":
        k = fake.RawKernel(cupy_runtime._PROBE_SOURCE, "ggmlpy_probe")
        a = np.zeros(1, np.float32)
        rt.launch(s, lambda: k((1,), (32,), (a, np.float32(1))))
    elif op == "htod":
        rt.memcpy_htod(m0, 0, _H)
    elif op == "dtoh":
        rt.memcpy_dtoh(m0, 0, 64)
    elif op == "dtod":
        rt.memcpy_dtod(m0, 0, m0, 64, 64)
    elif op == "peer":
        rt.memcpy_dtod(m1, 0, m0, 0, 64)
    elif op == "memset":
        rt.memset(m0, 0, 64, 1)
    elif op == "htod_async":
        rt.memcpy_htod_async(s, m0, 0, rt.staging(s, 64))
    elif op == "dtoh_async":
        rt.memcpy_dtoh_async(s, np.zeros(64, np.uint8), m0, 0)
    elif op == "dtod_async":
        rt.memcpy_dtod_async(s, m0, 0, m0, 64, 64)
    elif op == "event_record":
        rt.event_record(rt.event_new(0), s)
    elif op == "event_sync":
        ev = rt.event_new(0)
        rt.event_record(ev, s)
        rt.event_synchronize(ev)
    elif op == "stream_sync":
        rt.stream_synchronize(s)
    elif op == "malloc":
        rt.malloc(0, 64)
    elif op == "pinned":
        rt.alloc_pinned(64)


@pytest.mark.parametrize("op, path, exc, want, part", _ERROR_TABLE,
                         ids=[f"{r[0]}-{type(r[2]).__name__}" for r in _ERROR_TABLE])
def test_cuda_errors_map_to_ggmlpy_exceptions(op, path, exc, want, part, no_pending_fail):
    rt, s, m0, m1 = _rt_env()
    _do(op, rt, s, m0, m1)  # works without the fault
    FakeCupy.fail_next(path, exc)
    with pytest.raises(want, match=part) as info:
        _do(op, rt, s, m0, m1)
    assert path not in fake_cupy._FAILS  # the fault was hit, not skipped
    if want is not KeyError:
        assert info.value.__cause__ is exc or want is OutOfMemoryError and op == "pinned"
    _do(op, rt, s, m0, m1)  # and the runtime stays usable
    rt.stream_free(s)


def test_stream_synchronize_unchecked_keeps_quiet(no_pending_fail):
    rt, s, _m0, _m1 = _rt_env()
    FakeCupy.fail_next("Stream.synchronize", FakeDriverError("CUDA_ERROR_LAUNCH_FAILED"))
    rt.stream_synchronize(s, check=False)
    assert "Stream.synchronize" not in fake_cupy._FAILS


def test_pinned_ring_size_classes_cap_and_free():
    allocs = []
    ring = cupy_runtime.PinnedRing(lambda n: allocs.append(n) or np.zeros(n, np.uint8),
                                   cap=3 * 4096, min_block=4096)
    assert [ring.size_class(n) for n in (0, 1, 4096, 4097, 8192, 8193, 1 << 20)] == \
        [4096, 4096, 4096, 8192, 8192, 16384, 1 << 20]
    v = ring.take(100)
    assert v.size == 100 and v.dtype == np.uint8
    block = ring.claim(v)
    assert block.size == 4096 and ring.claim(v) is None
    ring.put(block)
    w = ring.take(4000)  # same class: the block is reused
    assert ring.claim(w) is block and ring.allocs == 1
    ring.put(block)
    big = ring.claim(ring.take(5 << 12))  # 32 KiB class: over the cap once back
    ring.put(big)
    assert ring.cached_bytes == 4096 and allocs == [4096, 32768]
    ring.free()
    assert ring.cached_bytes == 0
    ring.take(10)
    assert ring.allocs == 3
    with pytest.raises(ValueError, match="size"):
        ring.take(-1)
    with pytest.raises(ValueError, match="cap"):
        cupy_runtime.PinnedRing(lambda n: None, cap=-1)


def _fake_backend_and_tensors(n_devices=1):
    reg = fake_cuda_reg(n_devices)
    dev = reg.devices[0]
    be = dev.init_backend()
    ctx = Context()
    ts = [ctx.new_tensor_1d(Type.F32, 1 << 16) for _ in range(2)]
    buf = dev.get_buffer_type().alloc_buffer(2 * (1 << 18) + 4096)
    tensor_alloc(buf, ts[0], 0)
    tensor_alloc(buf, ts[1], (1 << 18))
    return reg, dev, be, ts, buf


def test_async_uploads_and_downloads_reuse_pinned_staging_across_shapes():
    _reg, _dev, be, (t, _), buf = _fake_backend_and_tensors()
    rng = np.random.default_rng(0)
    sizes = [7, 1000, 1024, 3000, 65536, 5, 999, 40000]  # float32 elements
    n0 = FakeCupy.pinned_allocs()
    for _rep in range(4):
        for n in sizes:
            x = rng.standard_normal(n).astype(np.float32)
            backend_tensor_set_async(be, t, x, 0, x.nbytes)
            out = np.empty(n, np.float32)
            backend_tensor_get_async(be, t, out)
            be.synchronize()
            np.testing.assert_array_equal(out, x)
    classes = {max(4096, 1 << (4 * n - 1).bit_length()) for n in sizes}
    # the fake's events complete at once, so the upload's block is back before the download
    # takes one: one block per size class, for 32 transfers of 8 shapes
    assert FakeCupy.pinned_allocs() - n0 == len(classes)
    ring = be.stream.ring
    assert ring.allocs == len(classes) and ring.cached_bytes == sum(classes)
    be.free()
    assert ring.cached_bytes == 0  # freeing the backend frees its staging
    buf.free()


def test_upload_from_a_cuda_host_tensor_is_direct():
    _reg, dev, be, (t, _), buf = _fake_backend_and_tensors()
    hbuf = dev.get_host_buffer_type().alloc_buffer(1 << 18)
    h = Context().new_tensor_1d(Type.F32, 1 << 16)
    tensor_alloc(hbuf, h, 0)
    x = np.arange(1 << 16, dtype=np.float32)
    backend_tensor_set(h, x)
    cpu = backend_cpu_init()
    n0 = FakeCupy.pinned_allocs()
    backend_tensor_copy_async(cpu, be, h, t)
    be.synchronize()
    assert FakeCupy.pinned_allocs() == n0 and be.stream.ring.allocs == 0  # no staging
    np.testing.assert_array_equal(backend_tensor_get(t).reshape(-1), x)
    # a plain CPU tensor still goes through (ring) staging
    c = Context().new_tensor_1d(Type.F32, 1 << 16)
    cbuf = cpu.get_default_buffer_type().alloc_buffer(1 << 18)
    tensor_alloc(cbuf, c, 0)
    backend_tensor_set(c, x[::-1].copy())
    backend_tensor_copy_async(cpu, be, c, t)
    be.synchronize()
    assert be.stream.ring.allocs == 1
    np.testing.assert_array_equal(backend_tensor_get(t).reshape(-1), x[::-1])
    for b in (hbuf, cbuf, buf):
        b.free()
    be.free()


def test_peer_access_is_enabled_once_per_pair_where_allowed():
    rt = cupy_runtime.CupyRuntime(FakeCupy(4))  # the fake: same-parity devices are peers
    mems = [rt.malloc(d, 64) for d in range(4)]
    rt.memcpy_htod(mems[0], 0, np.arange(64, dtype=np.uint8))
    for _ in range(3):
        rt.memcpy_dtod(mems[2], 0, mems[0], 0, 64)
        rt.memcpy_dtod(mems[1], 0, mems[0], 0, 64)
        rt.memcpy_dtod(mems[0], 0, mems[2], 0, 64)
    assert rt.rt.peer_enable_calls == [(0, 2), (2, 0)]
    assert rt.enable_peer_access(0, 2) and rt.enable_peer_access(2, 0)
    assert not rt.enable_peer_access(0, 1) and not rt.enable_peer_access(1, 0)
    np.testing.assert_array_equal(rt.memcpy_dtoh(mems[1], 0, 64), np.arange(64))
    np.testing.assert_array_equal(rt.memcpy_dtoh(mems[2], 0, 64), np.arange(64))
    # "already enabled" by someone else is not an error
    rt2 = cupy_runtime.CupyRuntime(rt.cp)
    assert rt2.enable_peer_access(2, 0) and rt.rt.peer_enable_calls == [(0, 2), (2, 0)]


def test_two_backends_on_one_gpu_have_separate_streams_and_order_by_events():
    _reg, dev, b1, (t1, t2), buf = _fake_backend_and_tensors()
    b2 = dev.init_backend()
    assert b1.stream is not b2.stream and b1.stream.cs.ptr != b2.stream.cs.ptr
    x = np.linspace(-1, 1, 1 << 16, dtype=np.float32)
    backend_tensor_set_async(b1, t1, x)
    r0, c0 = b2._ready_event.recorded, b1._copy_event.recorded
    backend_tensor_copy_async(b1, b2, t1, t2)  # runs on b1's stream after b2's ready event
    assert b2._ready_event.recorded == r0 + 1 and b1._copy_event.recorded == c0 + 1
    b2.synchronize()
    np.testing.assert_array_equal(backend_tensor_get(t2).reshape(-1), x)
    b1.free()
    b2.free()
    buf.free()


def test_staging_in_flight_is_not_reused_until_its_event_passes():
    _reg, _dev, be, (t, _), buf = _fake_backend_and_tensors()
    x = np.arange(1000, dtype=np.float32)
    FakeCupy.hold_events(True)
    try:
        for _ in range(3):  # three uploads in flight: three blocks of one class
            backend_tensor_set_async(be, t, x, 0, x.nbytes)
        ring = be.stream.ring
        assert ring.allocs == 3 and ring.cached_bytes == 0
        be.synchronize()  # all passed: all back in the ring
        assert ring.cached_bytes == 3 * 4096
        for _ in range(3):
            backend_tensor_set_async(be, t, x, 0, x.nbytes)
        assert ring.allocs == 3  # reused, nothing new
        be.synchronize()
    finally:
        FakeCupy.hold_events(False)
    np.testing.assert_array_equal(backend_tensor_get(t).reshape(-1)[:1000], x)
    be.free()
    buf.free()
