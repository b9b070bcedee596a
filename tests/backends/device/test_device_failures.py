"""Async reads vs the next evaluation, events on freed backends, stream failures (issue 10
items 5, 8, 9), on SIM devices with latency on so a missing order shows up as a wrong value."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import event_new, event_query, event_record, event_synchronize
from ggmlpy.backend.tensor_data import (
    backend_tensor_get,
    backend_tensor_get_async,
    backend_tensor_memset,
    backend_tensor_set,
)
from ggmlpy.core.errors import BackendUnavailableError, ComputeError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

LAT_US = 3000


def _run_bounded(fn, timeout=10.0):
    """Run ``fn`` on a thread; fail (instead of hanging the suite) if it does not return."""
    box: dict = {}

    def body():
        try:
            box["r"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["e"] = e

    th = threading.Thread(target=body, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), f"{fn} did not return within {timeout} s"
    if "e" in box:
        raise box["e"]
    return box.get("r")


def _scale_setup(be, n=256):
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, n)
    y = ops.scale(ctx, x, 2.0)
    g = Graph()
    g.build_forward_expand(y)
    buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
    return g, x, y, buf


@pytest.mark.parametrize("write", ["set", "memset", "clear"])
def test_blocking_write_waits_for_queued_async_read(write, sim_devices):
    """Evaluation 1's output read with get_async, then evaluation 2's blocking input write into
    the same memory (as after reset/alloc_graph reuse): the read must see evaluation 1's data."""
    be = sim_devices(1, latency_us=LAT_US)[0].init_backend()
    g, x, y, buf = _scale_setup(be)
    try:
        backend_tensor_set(x, np.full(256, 1.0, np.float32))
        be.graph_compute_async(g)  # queued: y = 2
        out = np.empty(256, np.float32)
        backend_tensor_get_async(be, y, out)  # queued behind the compute
        # the next evaluation writes the same memory with a blocking op
        if write == "set":
            backend_tensor_set(y, np.full(256, 7.0, np.float32))
        elif write == "memset":
            backend_tensor_memset(y, 0)
        else:
            buf.clear(0)
        be.synchronize()
        np.testing.assert_array_equal(out, np.full(256, 2.0, np.float32))
    finally:
        buf.free()
        be.free()


def test_scheduler_next_evaluation_does_not_overtake_async_read(sim_devices):
    """The issue's example through the scheduler: input pinned to SIM0, output read with
    get_async after evaluation 1, evaluation 2 sets new inputs: the host array keeps eval 1's."""
    from ggmlpy.backends.cpu.backend import backend_cpu_init
    from ggmlpy.sched.scheduler import Scheduler

    dev = sim_devices(1, latency_us=LAT_US)[0]
    sim, cpu = dev.init_backend(), backend_cpu_init()
    sched = Scheduler([sim, cpu])
    try:
        ctx = Context()
        x = ctx.new_tensor_1d(Type.F32, 256).set_input()
        y = ops.scale_inplace(ctx, x, 2.0).set_output()  # y shares x's memory
        g = Graph()
        g.build_forward_expand(y)
        sched.set_tensor_backend(x, sim)
        outs = []
        for k in (1.0, 5.0):
            sched.reset()
            assert sched.alloc_graph(g)
            backend_tensor_set(x, np.full(256, k, np.float32))
            sched.graph_compute_async(g)
            out = np.empty(256, np.float32)
            backend_tensor_get_async(sched.get_tensor_backend(y), y, out)
            outs.append(out)
        sched.synchronize()
        np.testing.assert_array_equal(outs[0], np.full(256, 2.0, np.float32))
        np.testing.assert_array_equal(outs[1], np.full(256, 10.0, np.float32))
    finally:
        if hasattr(sched, "free"):
            sched.free()
        sim.free()
        cpu.free()


def test_event_record_on_freed_backend_raises_and_never_hangs(sim_devices):
    dev = sim_devices(1, latency_us=LAT_US)[0]
    be = dev.init_backend()
    ev = event_new(dev)
    be.free()
    with pytest.raises(BackendUnavailableError, match="freed"):
        event_record(ev, be)
    _run_bounded(lambda: event_synchronize(ev))  # never recorded: returns at once
    assert event_query(ev)
    # a recorded event stays valid after a failed re-record
    be2 = dev.init_backend()
    event_record(ev, be2)
    be2.free()
    with pytest.raises(BackendUnavailableError):
        event_record(ev, be2)
    _run_bounded(lambda: event_synchronize(ev))
    assert event_query(ev)


def test_runtime_record_on_closed_stream_leaves_event_unchanged(sim_devices):
    dev = sim_devices(1)[0]
    be = dev.init_backend()
    rt, stream = be.runtime, be.stream
    ev = rt.event_new(0)
    be.free()
    with pytest.raises(BackendUnavailableError):
        rt.event_record(ev, stream)
    _run_bounded(lambda: rt.event_synchronize(ev))


def test_failed_step_does_not_write_caller_arrays_and_stream_recovers(sim_devices):
    """A failing step: the async read queued after it must not fill the caller's array with data
    of a failed evaluation; events queued after it are still signalled; synchronize raises
    ComputeError once; afterwards the stream runs new work normally (SIM failures not sticky)."""
    dev = sim_devices(1, latency_us=LAT_US)[0]
    be = dev.init_backend()
    g, x, y, buf = _scale_setup(be)
    try:
        backend_tensor_set(x, np.full(256, 1.0, np.float32))
        backend_tensor_set(y, np.full(256, -1.0, np.float32))

        def boom():
            raise RuntimeError("injected kernel fault")

        be.runtime.launch(be.stream, boom)
        be.graph_compute_async(g)  # skipped: follows the failure
        out = np.full(256, 42.0, np.float32)
        backend_tensor_get_async(be, y, out)
        ev = event_new(dev)
        event_record(ev, be)
        _run_bounded(lambda: event_synchronize(ev))
        with pytest.raises(ComputeError, match="injected kernel fault"):
            _run_bounded(be.synchronize)
        np.testing.assert_array_equal(out, np.full(256, 42.0, np.float32))  # untouched
        np.testing.assert_array_equal(backend_tensor_get(y).reshape(-1), np.full(256, -1.0, np.float32))
        # recovered: the same graph computes and reads back
        be.graph_compute_async(g)
        backend_tensor_get_async(be, y, out)
        _run_bounded(be.synchronize)
        np.testing.assert_array_equal(out, np.full(256, 2.0, np.float32))
    finally:
        buf.free()
        be.free()


# -- CUDA runtime plumbing over the host stand-in for CuPy (failures injected) --------------------

@pytest.mark.parametrize("status,sticky", [(700, True), (1, False)])
def test_cuda_failed_synchronize_discards_downloads_and_sticky_errors_stay(status, sticky):
    from fake_cupy import _FakeCudaError, fake_cuda_reg

    be = fake_cuda_reg(1).devices[0].init_backend()
    g, x, y, buf = _scale_setup(be)
    try:
        backend_tensor_set(x, np.full(256, 1.0, np.float32))
        be.graph_compute_async(g)
        out = np.full(256, 42.0, np.float32)
        backend_tensor_get_async(be, y, out)  # lands in staging; copied to out on a good sync
        cs = be.stream.cs
        cs.synchronize = lambda: (_ for _ in ()).throw(_FakeCudaError(status, "injected fault"))
        with pytest.raises(ComputeError, match="injected fault"):
            be.synchronize()
        np.testing.assert_array_equal(out, np.full(256, 42.0, np.float32))  # staging not copied
        del cs.synchronize  # the device itself would now answer normally
        if sticky:
            with pytest.raises(BackendUnavailableError, match="context was lost"):
                be.graph_compute_async(g)
            with pytest.raises(BackendUnavailableError):
                be.synchronize()
        else:
            be.graph_compute_async(g)
            backend_tensor_get_async(be, y, out)
            be.synchronize()
            np.testing.assert_array_equal(out, np.full(256, 2.0, np.float32))
    finally:
        buf.free()
        be.free()  # never raises for a lost context
