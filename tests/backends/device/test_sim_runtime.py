"""SIM-specific behaviour of ggmlpy.backends.sim: latency injection, asynchronous launch,
memory capacity and out-of-memory, environment options, worker threads.

Devices come from ``sim_reg(...)`` directly (no global registry state), so ``pytest -n auto`` works.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.backend.interface import DeviceType, tensor_alloc
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.sim import SimRuntime, sim_reg
from ggmlpy.core.errors import OutOfMemoryError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

MIB = 1 << 20


def _add_graph(buft, n=32):
    ctx = Context()
    a, b = ctx.new_tensor_1d(Type.F32, n), ctx.new_tensor_1d(Type.F32, n)
    c = ops.add(ctx, a, b)
    g = Graph()
    g.build_forward_expand(c)
    buf = buft.alloc_buffer(3 * 128 * (-(-n * 4 // 128)))
    step = 128 * (-(-n * 4 // 128))
    for i, t in enumerate((a, b, c)):
        tensor_alloc(buf, t, i * step)
    return g, a, b, c, buf


def test_graph_compute_async_returns_before_the_work_ends():
    latency_ms = 50.0
    dev = sim_reg(1, latency_us=latency_ms * 1000).devices[0]
    be = dev.init_backend()
    g, a, b, c, buf = _add_graph(dev.get_buffer_type())
    backend_tensor_set(a, np.ones(32, np.float32))
    backend_tensor_set(b, np.ones(32, np.float32))
    try:
        t0 = time.perf_counter()
        be.graph_compute_async(g)
        t_return = time.perf_counter() - t0
        be.synchronize()
        t_sync = time.perf_counter() - t0
        # returns long before the injected 50 ms launch latency has passed; synchronize waits for it
        # (the bound is loose because the suite may share two cores with other workers)
        assert t_return < latency_ms / 2e3, f"graph_compute_async took {t_return * 1e3:.1f} ms"
        assert t_sync >= latency_ms / 1e3
        np.testing.assert_array_equal(backend_tensor_get(c).reshape(32), np.full(32, 2.0))
    finally:
        be.free()
        buf.free()


def test_out_of_memory_carries_sizes_and_leaves_device_usable():
    dev = sim_reg(1, memory_mb=1).devices[0]
    buft = dev.get_buffer_type()
    assert dev.get_memory() == (MIB, MIB)
    keep = buft.alloc_buffer(MIB // 4)
    with pytest.raises(OutOfMemoryError) as info:
        buft.alloc_buffer(MIB)
    err = info.value
    assert err.requested == MIB and err.free == MIB - MIB // 4 and err.where == "SIM0"
    assert "out of memory" in str(err)
    again = buft.alloc_buffer(MIB // 2)  # what fits still allocates
    assert dev.get_memory() == (MIB // 4, MIB)
    again.free()
    keep.free()
    assert dev.get_memory() == (MIB, MIB)
    full = buft.alloc_buffer(MIB)
    full.free()


def test_options_and_environment(monkeypatch):
    monkeypatch.setenv("GGMLPY_SIM_LATENCY_US", "1500")
    monkeypatch.setenv("GGMLPY_SIM_MEMORY_MB", "3")
    dev = sim_reg(2).devices[1]
    rt = dev.runtime
    assert isinstance(rt, SimRuntime)
    assert rt.latency_s == pytest.approx(1.5e-3) and rt.capacity == 3 * MIB
    assert dev.name == "SIM1" and dev.type == DeviceType.ACCEL
    rt2 = sim_reg(1, latency_us=0, memory_mb=5).devices[0].runtime
    assert rt2.latency_s == 0 and rt2.capacity == 5 * MIB  # options override the environment
    monkeypatch.setenv("GGMLPY_SIM_LATENCY_US", "fast")
    with pytest.raises(ValueError, match="GGMLPY_SIM_LATENCY_US"):
        sim_reg(1)
    monkeypatch.delenv("GGMLPY_SIM_LATENCY_US")
    monkeypatch.setenv("GGMLPY_SIM_MEMORY_MB", "-1")
    with pytest.raises(ValueError, match="GGMLPY_SIM_MEMORY_MB"):
        sim_reg(1)
    with pytest.raises(ValueError):
        sim_reg(0, memory_mb=1)


def test_refuse_ops_forces_fallback():
    dev = sim_reg(1, refuse_ops={Op.ADD}).devices[0]
    plain = sim_reg(1).devices[0]
    ctx = Context()
    c = ops.add(ctx, ctx.new_tensor_1d(Type.F32, 4), ctx.new_tensor_1d(Type.F32, 4))
    assert plain.supports_op(c) and not dev.supports_op(c)


def test_worker_thread_ends_when_backend_is_freed_or_collected():
    dev = sim_reg(1).devices[0]
    be = dev.init_backend()
    thread = be.stream._thread
    assert thread.is_alive() and thread.daemon
    be.free()
    assert not thread.is_alive()
    be2 = dev.init_backend()
    thread2 = be2.stream._thread
    del be2
    gc.collect()
    thread2.join(timeout=5)
    assert not thread2.is_alive()
