"""CPU-side tensors in pinned host memory (llama.cpp's set-up: ``bufts=[device, device_host]``)
read in place by a device's queued upload: the next evaluation's CPU step must not overwrite
them before the upload has read them (the host-read rule of ggmlpy.backend.write_gen).

SIM with ``pinned_direct_upload`` reads ``SIM_Host`` memory when its stream reaches the copy, as
the CUDA runtime's DMA from ``CUDA_Host`` does; the injected latency keeps the uploads queued
while the host runs ahead, so a missing wait shows as wrong batches (19 of 20 without the
fences, 16 of 20 with ``parallel``)."""

from __future__ import annotations

import numpy as np
import pytest
from backend_kinds import new_sim_devices

import ggmlpy as gp
from ggmlpy import Context, Graph, Op, Type
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage, Status
from ggmlpy.backend.tensor_data import backend_tensor_get_async, backend_tensor_set
from ggmlpy.backends.device import backend as device_backend
from ggmlpy.sched.scheduler import Scheduler

N_BATCHES = 20
LATENCY_US = 500


def _softmax_matmul_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ w.T.astype(np.float64)


def _pipelined_batches(direct: bool, parallel: bool) -> int:
    """x (input, CPU) -> h = soft_max(x) (CPU: SIM refuses SOFT_MAX; h in SIM_Host memory) ->
    y = w @ h (SIM, w in SIM weights). 20 evaluations queued back to back, each output read
    asynchronously; returns the number of wrong batches."""
    rng = np.random.default_rng(7)
    dev = new_sim_devices(1, latency_us=LATENCY_US, refuse_ops={Op.SOFT_MAX},
                  pinned_direct_upload=direct)[0]
    sim, cpu = dev.init_backend(), gp.backend_cpu_init()
    wctx = Context()
    w = wctx.new_tensor_2d(Type.F32, 64, 48).set_name("w")
    wbuf = alloc_ctx_tensors_from_buft(wctx, sim.get_default_buffer_type())
    wbuf.set_usage(BufferUsage.WEIGHTS)
    W = rng.standard_normal((48, 64)).astype(np.float32)
    backend_tensor_set(w, W)
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 64, 32).set_name("x").set_input()
    h = gp.soft_max(ctx, x).set_name("h")
    y = gp.mul_mat(ctx, w, h).set_name("y").set_output()
    g = Graph()
    g.build_forward_expand(y)
    sched = Scheduler([sim, cpu], bufts=[dev.get_buffer_type(), dev.get_host_buffer_type()],
                      parallel=parallel)
    assert sched.reserve(g)
    xs = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(N_BATCHES)]
    outs = [np.full((32, 48), np.nan, np.float32) for _ in range(N_BATCHES)]
    for k in range(N_BATCHES):
        sched.reset()
        assert sched.alloc_graph(g)
        backend_tensor_set(x, xs[k])
        assert sched.graph_compute_async(g) == Status.SUCCESS
        backend_tensor_get_async(sim, y, outs[k])
    sched.synchronize()
    # the set-up under test: h is computed on the CPU, in SIM_Host memory, and uploaded to SIM
    rep = sched.report()
    assert [s["backend"] for s in rep["splits"]] == ["CPU", "SIM0"]
    assert [i["name"] for i in rep["splits"][1]["inputs"]] == ["h"]
    assert h.buffer.buft is dev.get_host_buffer_type()
    wrong = sum(not np.allclose(outs[k], _softmax_matmul_reference(xs[k], W), rtol=1e-4, atol=1e-5)
                for k in range(N_BATCHES))
    sched.free()
    return wrong


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel"])
@pytest.mark.parametrize("direct", [True, False], ids=["direct_upload", "staged_upload"])
def test_pinned_source_not_overwritten_before_queued_upload_read_it(direct, parallel, monkeypatch):
    fences = []
    queued = device_backend.host_read_queued

    def spy(buffer, offset, size, wait, done):
        fences.append((buffer.name, size))
        queued(buffer, offset, size, wait, done)
    monkeypatch.setattr(device_backend, "host_read_queued", spy)
    assert _pipelined_batches(direct, parallel) == 0
    # direct: every upload of h (32 x 64 floats) was queued in place, behind a fence; staged:
    # snapshots, no fence
    assert fences == ([("SIM_Host", 32 * 64 * 4)] * N_BATCHES if direct else [])


def test_sim_pinned_direct_upload_from_environment(monkeypatch, sim_devices):
    monkeypatch.setenv("GGMLPY_SIM_PINNED_DIRECT", "1")
    assert sim_devices(1)[0].runtime.pinned_direct_upload is True
    assert sim_devices(1, pinned_direct_upload=False)[0].runtime.pinned_direct_upload is False
    monkeypatch.setenv("GGMLPY_SIM_PINNED_DIRECT", "0")
    assert sim_devices(1)[0].runtime.pinned_direct_upload is False
    monkeypatch.setenv("GGMLPY_SIM_PINNED_DIRECT", "yes")
    with pytest.raises(ValueError, match="GGMLPY_SIM_PINNED_DIRECT"):
        sim_devices(1)
    monkeypatch.delenv("GGMLPY_SIM_PINNED_DIRECT")
    assert sim_devices(1)[0].runtime.pinned_direct_upload is False
