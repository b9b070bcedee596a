"""Graph replay (issue 14 item 4): an unchanged plan runs eagerly once, is captured the second
time and replayed from then on, on SIM (a recorded launch list) and on the fake CuPy (stream
capture into a ``cuda.Graph``); results equal the float64 reference every time; every change the
plan-reuse rule detects (new placement, other nodes, an op parameter, a freed buffer) gives a
new capture; a plan
that cannot be captured runs eagerly."""

from __future__ import annotations

import numpy as np
import pytest
from fake_cupy import FakeCupy, FakeDriverError, fake_cuda_reg

from ggmlpy import ops
from ggmlpy.backend.interface import tensor_alloc
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.plan import Plan, ReplayStats, launch_plan
from ggmlpy.core.errors import NotAllocatedError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

# on SIM (with latency: a missing wait shows up) and the fake CuPy; the CPU does not replay
pytestmark = pytest.mark.backends("SIM0", "FAKECUDA0")


def _model(ctx, n=16, m=6):
    """out = soft_max(norm(x) @ w^T * 0.5 + b): MUL_MAT, NORM, SCALE, ADD, SOFT_MAX."""
    x = ctx.new_tensor(Type.F32, (n, m))
    w = ctx.new_tensor(Type.F32, (n, n))
    b = ctx.new_tensor(Type.F32, (n, 1))
    h = ops.mul_mat(ctx, w, ops.norm(ctx, x, 1e-5))
    out = ops.soft_max(ctx, ops.add(ctx, ops.scale(ctx, h, 0.5), b))
    return x, w, b, out


def _ref(xv, wv, bv, scale=0.5):
    x = xv.astype(np.float64)
    nx = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    z = nx @ wv.astype(np.float64).T * scale + bv
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _alloc(dev, ctx, pad=0):
    """One buffer holding every tensor of ctx, the first ``pad`` bytes left free."""
    buft = dev.get_buffer_type()
    offs, total = {}, pad
    for t in ctx:
        if t.view_src is None:
            offs[id(t)] = total
            total += -(-max(buft.get_alloc_size(t), 1) // 256) * 256
    buf = buft.alloc_buffer(total)
    for t in ctx:
        if t.view_src is None:
            tensor_alloc(buf, t, offs[id(t)])
    return buf


def _set_inputs(rng, x, w, b):
    vals = [rng.standard_normal(t.ne[:2][::-1]).astype(np.float32) for t in (x, w, b)]
    for t, v in zip((x, w, b), vals):
        backend_tensor_set(t, v)
    return vals


def _compute(be, g, out, rng, x, w, b):
    xv, wv, bv = _set_inputs(rng, x, w, b)
    be.graph_compute(g)
    got = backend_tensor_get(out).view(np.float32).reshape(out.ne[:2][::-1]).astype(np.float64)
    np.testing.assert_allclose(got, _ref(xv, wv, bv), rtol=2e-5, atol=1e-6)


def test_an_unchanged_graph_is_captured_once_then_replayed(device):
    dev = device
    be = dev.init_backend()
    ctx = Context()
    x, w, b, out = _model(ctx)
    g = Graph()
    g.build_forward_expand(out)
    buf = _alloc(dev, ctx)
    rng = np.random.default_rng(0)
    try:
        launches0 = dev.runtime.launch_count()
        for _ in range(5):  # new input values every time: the replay reads them
            _compute(be, g, out, rng, x, w, b)
        assert be.replay_stats.as_dict() == {"eager": 1, "captures": 1, "replays": 4,
                                             "capture_failures": 0}
        if launches0 is not None:  # fake CuPy: a replay is one launch
            n0 = dev.runtime.launch_count()
            g0 = FakeCupy.graph_launches()
            _compute(be, g, out, rng, x, w, b)
            assert dev.runtime.launch_count() - n0 == 1
            assert FakeCupy.graph_launches() - g0 == 1
    finally:
        buf.free()
        be.free()


def test_each_detected_change_forces_a_new_capture(device):
    dev = device
    be = dev.init_backend()
    ctx = Context()
    x, w, b, out = _model(ctx)
    g = Graph()
    g.build_forward_expand(out)
    rng = np.random.default_rng(1)
    buf = _alloc(dev, ctx)
    try:
        for _ in range(3):
            _compute(be, g, out, rng, x, w, b)
        assert (be.replay_stats.captures, be.replay_stats.replays) == (1, 2)
        # 1. placement: the same tensors in a new buffer at other offsets
        buf.free()
        for t in ctx:  # the allocator's job: forget the old placement
            t.buffer, t.offset = None, None
        buf = _alloc(dev, ctx, pad=4096)
        for _ in range(3):
            _compute(be, g, out, rng, x, w, b)
        assert (be.replay_stats.captures, be.replay_stats.replays) == (2, 4)
        # 2. other nodes: the graph grows by one node
        out2 = ops.scale(ctx, out, 2.0)
        g.build_forward_expand(out2)
        tensor_alloc(buf, out2, 0)  # the free pad at the buffer's start
        for _ in range(3):
            xv, wv, bv = _set_inputs(rng, x, w, b)
            be.graph_compute(g)
            got = backend_tensor_get(out2).view(np.float32).reshape(out2.ne[:2][::-1]).astype(np.float64)
            np.testing.assert_allclose(got, 2 * _ref(xv, wv, bv), rtol=2e-5, atol=1e-6)
        assert (be.replay_stats.captures, be.replay_stats.replays) == (3, 6)
        # 3. an op parameter changed in place (the SCALE node's factor)
        sc = out.src[0].src[0]
        assert sc.op.name == "SCALE"
        sc.op_params[0] = 0.25
        for _ in range(3):
            xv, wv, bv = _set_inputs(rng, x, w, b)
            be.graph_compute(g)
            got = backend_tensor_get(out2).view(np.float32).reshape(out2.ne[:2][::-1]).astype(np.float64)
            np.testing.assert_allclose(got, 2 * _ref(xv, wv, bv, 0.25), rtol=2e-5, atol=1e-6)
        assert (be.replay_stats.captures, be.replay_stats.replays) == (4, 8)
        # 4. a freed buffer: refused before any launch, nothing replayed
        buf.free()
        n = be.replay_stats.replays
        with pytest.raises(NotAllocatedError):
            be.graph_compute(g)
        assert be.replay_stats.replays == n
    finally:
        if not buf.freed:
            buf.free()
        be.free()


def test_replay_off_runs_every_launch_eagerly(device):
    dev = device
    be = dev.init_backend()
    be.graph_replay = False
    ctx = Context()
    x, w, b, out = _model(ctx)
    g = Graph()
    g.build_forward_expand(out)
    buf = _alloc(dev, ctx)
    try:
        for _ in range(3):
            _compute(be, g, out, np.random.default_rng(2), x, w, b)
        assert be.replay_stats.as_dict() == {"eager": 3, "captures": 0, "replays": 0,
                                             "capture_failures": 0}
    finally:
        buf.free()
        be.free()


@pytest.mark.parametrize("fail", ["Stream.begin_capture", "Stream.end_capture"])
def test_a_failed_capture_falls_back_to_eager_for_good(fail):
    dev = fake_cuda_reg(1).devices[0]
    be = dev.init_backend()
    ctx = Context()
    x, w, b, out = _model(ctx)
    g = Graph()
    g.build_forward_expand(out)
    buf = _alloc(dev, ctx)
    rng = np.random.default_rng(3)
    try:
        _compute(be, g, out, rng, x, w, b)
        FakeCupy.fail_next(fail, FakeDriverError("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"))
        for _ in range(3):
            _compute(be, g, out, rng, x, w, b)
        assert be.replay_stats.as_dict() == {"eager": 4, "captures": 0, "replays": 0,
                                             "capture_failures": 1}
        assert not dev.runtime.cp.cuda.Stream(non_blocking=True).is_capturing()
    finally:
        buf.free()
        be.free()


def test_a_plan_reading_values_to_the_host_is_not_captured():
    # a step that synchronizes (float() of a device value): CuPy refuses it while capturing; the
    # capture fails cleanly, the stream leaves capture mode and the step runs eagerly
    dev = fake_cuda_reg(1).devices[0]
    rt = dev.runtime
    be = dev.init_backend()
    ctx = Context()
    t = ctx.new_tensor(Type.F32, (4,))
    buf = _alloc(dev, ctx)
    try:
        backend_tensor_set(t, np.arange(4, dtype=np.float32))
        arr = buf._array(t)
        seen = []
        plan = Plan([lambda: seen.append(float(arr[0, 0, 0, 3]))], [t])
        stats = ReplayStats()
        for _ in range(3):
            launch_plan(rt, be.stream, plan, stats)
        assert seen == [3.0, 3.0, 3.0]
        assert stats.as_dict() == {"eager": 3, "captures": 0, "replays": 0, "capture_failures": 1}
        assert plan.capture_failed and plan.graph is None
    finally:
        buf.free()
        be.free()


def test_fake_capture_records_without_running_and_keeps_the_graph_until_the_stream_passes():
    dev = fake_cuda_reg(1).devices[0]
    rt = dev.runtime
    be = dev.init_backend()
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (64,))
    out = ops.add(ctx, a, a)  # fused: a RawKernel launch
    g = Graph()
    g.build_forward_expand(out)
    buf = _alloc(dev, ctx)
    try:
        backend_tensor_set(a, np.ones(64, np.float32))
        be.graph_compute(g)  # eager
        plan = be.plan_cache.get(g)
        pools = FakeCupy.pools_made()
        backend_tensor_set(out, np.zeros(64, np.float32))
        graph = rt.graph_capture(be.stream, list(plan.steps))
        assert FakeCupy.pools_made() == pools + 1  # a memory pool private to the graph
        np.testing.assert_array_equal(backend_tensor_get(out).view(np.float32), 0)  # not run
        FakeCupy.hold_events(True)
        try:
            rt.graph_launch(be.stream, graph)
            assert any(keep is graph for _ev, keep, _f in be.stream.pending)  # alive in flight
        finally:
            FakeCupy.hold_events(False)
        be.synchronize()
        assert not any(keep is graph for _ev, keep, _f in be.stream.pending)
        np.testing.assert_array_equal(backend_tensor_get(out).view(np.float32), 2)
    finally:
        buf.free()
        be.free()


@pytest.mark.model
def test_minilm_on_the_fake_gpu_replays_in_one_launch_with_equal_results(model_dir, monkeypatch):
    import importlib.util  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from ggmlpy.backends.kernels import unary  # noqa: PLC0415

    monkeypatch.setattr(unary, "_erfc_fn", unary._erfc_fn)  # the bench swaps it for the fake
    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_device.py"
    spec = importlib.util.spec_from_file_location("bench_device", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rep = bench.minilm_replay(bench._fake_cuda_device(), str(model_dir), evals=4)
    assert rep["launches_last_evaluation"] == 1
    assert rep["replay_stats"] == {"eager": 1, "captures": 1, "replays": 3, "capture_failures": 0}
    assert rep["replayed_vs_eager_max_abs_diff"] == 0.0
