"""The CUDA runtime (ggmlpy.backends.cupy_runtime): the no-CuPy and no-driver paths everywhere, and
CUDA-only facts on a GPU machine (``-m gpu``; skipped with a reason otherwise). The generic device
tests in test_device_backend.py / test_device_ops.py also run on CUDA there."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from ggmlpy.backend import DeviceType, backend_tensor_get, backend_tensor_set, tensor_alloc
from ggmlpy.backends import cupy_runtime
from ggmlpy.backends.cpu import HostBuffer
from ggmlpy.errors import BackendUnavailableError, OutOfMemoryError
from ggmlpy.tensor import Context
from ggmlpy.types import Type


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
    from ggmlpy import registry

    if cupy_runtime.cuda_reg().devices:
        pytest.skip("a CUDA device exists here")
    with pytest.raises(BackendUnavailableError) as info:
        registry.backend_init_by_name("CUDA0")
    assert cupy_runtime.cuda_reg().unavailable_reason in str(info.value)
    assert registry.cuda_unavailable_reason() == cupy_runtime.cuda_reg().unavailable_reason


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
