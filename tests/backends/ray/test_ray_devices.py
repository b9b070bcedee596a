"""RAY devices (``ggmlpy.backends.ray.runtime``): Ray actors behind the async device backend.

One local Ray instance (2 CPUs, loopback only) and two actors serve the whole session
(``ray_reg2`` in conftest.py); every test here is in the xdist group "ray", so under
``pytest -n auto`` they share one worker and one instance. Tests that kill an actor make their own.

* the async device backend's whole contract suite (tests/test_device_backend.py) rerun on RAY;
* test-backend-ops on RAY0: a deterministic sample of the case table in CI (the full table:
  ``python scripts/bench_ray.py --ops``), same verdicts as the NumPy SIM device;
* an unchanged split costs one message and ships no spec bytes; plans are dropped with buffers;
* a RAY0 -> RAY1 scheduler pipeline equals the CPU bit for bit;
* faults: a killed actor gives BackendUnavailableError within the timeout, its buffers are
  reported lost, and a scheduler without it works.
"""

from __future__ import annotations

import collections
import io
import json
import os
import signal
import time
from contextlib import redirect_stdout

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.backend.tensor_data import (
    backend_tensor_get,
    backend_tensor_get_async,
    backend_tensor_set,
    backend_tensor_set_async,
)
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.core.errors import BackendUnavailableError, ComputeError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.sched.scheduler import Scheduler

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]


def _load_contract_suite():
    """The device backend's contract tests (tests/backends/device/test_device_backend.py), loaded
    under a private name so its tests run again here with ``reg`` = the RAY devices."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "device" / "test_device_backend.py"
    spec = importlib.util.spec_from_file_location("_device_contract_suite", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


contract = _load_contract_suite()


@pytest.fixture
def reg(ray_reg2):
    return ray_reg2


backends = contract.backends

# the device backend's contract suite, unchanged, with ``reg`` = the two RAY devices
for _name in dir(contract):
    if _name.startswith("test_"):
        globals()[f"{_name}_on_ray"] = getattr(contract, _name)
del _name


# ---------------------------------------------------------------------------------------------
# test-backend-ops


def test_backend_ops_sample_same_verdicts_as_numpy(ray_reg2, sim_devices) -> None:
    from ggmlpy.testops.families import all_cases
    from ggmlpy.testops.runner import run_tests

    table = all_cases()
    first = {}
    for i, c in enumerate(table):
        first.setdefault(c.family, i)
    # deterministic sample: every 25th case plus the first case of every op family
    cases = [c for i, c in enumerate(table) if i % 25 == 0 or i in set(first.values())]
    assert {c.family for c in cases} == {c.family for c in table}
    ray_rep = run_tests("test", backend=ray_reg2.devices[0], cases=cases)
    sim_rep = run_tests("test", backend=sim_devices(1)[0], cases=cases)
    got = [(r.case, r.status) for r in ray_rep.results]
    want = [(r.case, r.status) for r in sim_rep.results]
    assert got == want
    counts = collections.Counter(s for _, s in got)
    assert counts["FAIL"] == 0 and counts["OK"] >= 0.95 * len(cases), counts


# ---------------------------------------------------------------------------------------------
# graph specs: one message for an unchanged split


def _chain(buft, n: int = 256):
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, n).set_name("a")
    b = ctx.new_tensor_1d(Type.F32, n).set_name("b")
    c = ops.mul(ctx, ops.add(ctx, a, b), a).set_name("c")
    g = Graph()
    g.build_forward_expand(c)
    return g, a, b, c, contract.place(buft, *list(ctx))


def test_unchanged_split_is_one_small_message(ray_reg2) -> None:
    dev = ray_reg2.devices[0]
    rt = dev.runtime
    be = dev.init_backend()
    g, a, b, c, buf = _chain(dev.get_buffer_type())
    rng = np.random.default_rng(3)
    x, y = contract.f32(rng, 256), contract.f32(rng, 256)
    backend_tensor_set(a, x)
    backend_tensor_set(b, y)
    be.graph_compute(g)
    c0 = rt.counters(dev.index)
    for _ in range(5):
        be.graph_compute_async(g)
    c1 = rt.counters(dev.index)
    be.synchronize()
    assert c1["messages"] - c0["messages"] == 5  # one message per evaluation
    assert c1["spec_bytes"] == c0["spec_bytes"]  # no spec re-sent
    np.testing.assert_array_equal(contract.get(c), (x + y) * x)
    stats = rt.ray.get(rt.actor(dev.index).stats.remote())
    plans_before = stats["plans"]
    buf.free()  # the actor forgets plans over a freed buffer
    stats = rt.ray.get(rt.actor(dev.index).stats.remote())
    assert stats["plans"] == plans_before - 1
    be.free()


def test_failure_in_queued_work_reported_once_by_synchronize(ray_reg2) -> None:
    dev = ray_reg2.devices[0]
    be = dev.init_backend()
    g, a, b, c, buf = _chain(dev.get_buffer_type(), 8)
    # a queued write past the end of the buffer fails on the actor, not on the caller
    dev.runtime.memcpy_htod_async(be.stream, buf.mem, buf.size - 4, np.zeros(64, np.uint8))
    with pytest.raises(ComputeError, match="outside buffer"):
        be.synchronize()
    be.synchronize()  # reported once; the stream stays usable
    backend_tensor_set(a, np.ones(8, np.float32))
    backend_tensor_set(b, np.ones(8, np.float32))
    be.graph_compute(g)
    np.testing.assert_array_equal(contract.get(c), np.full(8, 2.0, np.float32))
    buf.free()
    be.free()


# ---------------------------------------------------------------------------------------------
# scheduler: CPU -> RAY0 -> RAY1, pipelined


def _pipeline_graph(devs, rng, hidden=32, n_tok=8):
    from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
    from ggmlpy.backend.interface import BufferUsage

    ws, bufs = [], []
    for be in devs:
        ctx = Context()
        w = ctx.new_tensor_2d(Type.F32, hidden, hidden)
        buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
        buf.set_usage(BufferUsage.WEIGHTS)
        backend_tensor_set(w, (rng.standard_normal((hidden, hidden)) / 6).astype(np.float32))
        ws.append(w)
        bufs.append(buf)
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, hidden, n_tok).set_name("x").set_input()
    h = x
    for w in ws:
        h = ops.tanh(ctx, ops.mul_mat(ctx, w, h))
    out = h.set_name("out").set_output()
    g = Graph()
    g.build_forward_expand(out)
    return g, x, out, ws, bufs


def _reference(ws, xs):
    outs = []
    for xv in xs:
        h = xv
        for w in ws:
            h = np.tanh(h @ backend_tensor_get(w)[0, 0].T)
        outs.append(h)
    return outs


@pytest.mark.parametrize("parallel", [False, True])
def test_cpu_ray0_ray1_pipeline_matches_cpu(ray_reg2, parallel: bool) -> None:
    cpu = backend_cpu_init()
    r0, r1 = (d.init_backend() for d in ray_reg2.devices)
    rng = np.random.default_rng(7)
    g, x, out, ws, bufs = _pipeline_graph([cpu, r0, r1], rng)
    xs = [rng.standard_normal((8, 32)).astype(np.float32) for _ in range(6)]
    sched = Scheduler([r0, r1, cpu], parallel=parallel, op_offload=False)
    assert sched.reserve(g)
    outs = [np.empty((8, 32), np.float32) for _ in xs]
    for k, xv in enumerate(xs):
        sched.reset()
        sched.alloc_graph(g)
        backend_tensor_set(x, xv)
        sched.graph_compute_async(g)
        backend_tensor_get_async(r1, out, outs[k])
    sched.synchronize()
    assert sched.get_n_splits() == 3
    # the same graph on the CPU alone, bit for bit
    cpu_sched = Scheduler([cpu], op_offload=False)
    g2, x2, out2, ws2, bufs2 = _pipeline_graph([cpu, cpu, cpu], np.random.default_rng(7))
    for k, xv in enumerate(xs):
        cpu_sched.reset()
        cpu_sched.alloc_graph(g2)
        backend_tensor_set(x2, xv)
        cpu_sched.graph_compute(g2)
        np.testing.assert_array_equal(outs[k], backend_tensor_get(out2)[0, 0])
        np.testing.assert_allclose(outs[k], _reference(ws, [xv])[0], rtol=1e-5, atol=1e-6)
    sched.free()
    cpu_sched.free()
    for b in bufs + bufs2:
        b.free()
    for b in (r0, r1):
        b.free()


# ---------------------------------------------------------------------------------------------
# devices listing


def test_devices_json_lists_node_and_memory(ray_reg2) -> None:
    from ggmlpy.backend import registry
    from ggmlpy.cli import main

    registry.register(ray_reg2)
    try:
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert main(["devices", "--json"]) == 0
    finally:
        registry.unregister("RAY")
    rows = {r["name"]: r for r in json.loads(buf.getvalue())["devices"]}
    for name in ("RAY0", "RAY1"):
        r = rows[name]
        assert r["extra"]["node_ip"] == "127.0.0.1" and r["extra"]["alive"] is True
        assert r["extra"]["array_module"] == "numpy" and r["extra"]["pid"] > 0
        assert 0 < r["memory_free"] <= r["memory_total"]
        assert r["caps"]["async"] and r["caps"]["events"]
    assert rows["RAY0"]["extra"]["pid"] != rows["RAY1"]["extra"]["pid"]


def test_environment_registers_ray_devices(ray_reg2, monkeypatch, fresh_registry) -> None:
    registry = fresh_registry
    monkeypatch.setenv("GGMLPY_RAY_DEVICES", "2")
    names = [d.name for d in registry.devices()]
    assert names[-3:] == ["RAY0", "RAY1", "CPU"]
    be = registry.backend_init_by_name("ray1")
    g, a, b, c, buf = _chain(be.get_default_buffer_type(), 32)
    backend_tensor_set(a, np.full(32, 2.0, np.float32))
    backend_tensor_set(b, np.full(32, 1.0, np.float32))
    be.graph_compute(g)
    np.testing.assert_array_equal(contract.get(c), np.full(32, 6.0, np.float32))
    buf.free()
    be.free()
    with pytest.raises(BackendUnavailableError, match="no device named 'RAY7'"):
        registry.backend_init_by_name("RAY7")
    registry.reset()
    monkeypatch.setenv("GGMLPY_RAY_DEVICES", "0")
    assert registry.reg_by_name("RAY") is None
    with pytest.raises(BackendUnavailableError, match="RAY devices need GGMLPY_RAY_DEVICES"):
        registry.backend_init_by_name("RAY0")


def _outside_address() -> str | None:
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only picks the outgoing interface
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def test_local_instance_listens_on_loopback_only(ray_reg2) -> None:
    import socket

    import ray

    info = ray._private.worker.global_worker.node.address_info
    assert info["node_ip_address"] == "127.0.0.1"
    host, port = info["gcs_address"].rsplit(":", 1)
    assert host == "127.0.0.1"
    with socket.create_connection(("127.0.0.1", int(port)), timeout=2):
        pass  # reachable on loopback
    ip = _outside_address()
    if ip is not None:  # and not on the machine's other address
        with pytest.raises(OSError):
            socket.create_connection((ip, int(port)), timeout=2).close()
    assert ray_reg2.devices[0].get_props().extra["node_ip"] == "127.0.0.1"


# ---------------------------------------------------------------------------------------------
# faults


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_dead_actor_unavailable_within_timeout(ray_reg2, how: str) -> None:
    import ray

    from ggmlpy.backends.ray.runtime import ray_reg

    reg = ray_reg(1, timeout_s=20.0)  # a device of its own: it is about to die
    dev = reg.devices[0]
    be = dev.init_backend()
    g, a, b, c, buf = _chain(dev.get_buffer_type(), 16)
    backend_tensor_set(a, np.ones(16, np.float32))
    backend_tensor_set(b, np.ones(16, np.float32))
    be.graph_compute(g)
    pid = dev.get_props().extra["pid"]
    if how == "ray.kill":
        ray.kill(dev.runtime.actor(0))  # asynchronous: wait until the process is gone
    else:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while _process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _process_alive(pid)
    t0 = time.perf_counter()
    be.graph_compute_async(g)  # queued before the death is known: reported by the next wait
    with pytest.raises(BackendUnavailableError, match="RAY0 is unavailable"):
        be.synchronize()
    assert time.perf_counter() - t0 < 20.0
    # from now on every call fails at once, without waiting
    t1 = time.perf_counter()
    for call in (lambda: backend_tensor_get(c), be.synchronize, lambda: be.graph_compute_async(g),
                 dev.init_backend):
        with pytest.raises(BackendUnavailableError, match="RAY0 is unavailable"):
            call()
    assert time.perf_counter() - t1 < 1.0
    assert dev.alive is False and dev.lost_buffers() == [buf]
    props = dev.get_props()
    assert props.extra["alive"] is False and "lost" in props.extra and props.memory_total == 0
    buf.free()  # freeing lost memory is a no-op, not an error
    be.free()
    assert dev.lost_buffers() == []
    # the scheduler can be rebuilt without the dead device
    cpu = backend_cpu_init()
    r1 = ray_reg2.devices[1].init_backend()
    rng = np.random.default_rng(11)
    g2, x, out, ws, bufs = _pipeline_graph([cpu, r1], rng)
    sched = Scheduler([r1, cpu], op_offload=False)
    sched.reserve(g2)
    sched.alloc_graph(g2)
    xv = rng.standard_normal((8, 32)).astype(np.float32)
    backend_tensor_set(x, xv)
    sched.graph_compute(g2)
    np.testing.assert_allclose(backend_tensor_get(out)[0, 0], _reference(ws, [xv])[0],
                               rtol=1e-5, atol=1e-6)
    sched.free()
    for bb in bufs:
        bb.free()
    r1.free()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped by its parent) is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_timeout_bounds_a_stuck_actor(ray_reg2) -> None:
    from ggmlpy.backends.ray.runtime import RayRuntime

    rt = RayRuntime([ray_reg2.devices[0].runtime.actor(0)], timeout_s=0.3)
    ref = rt._submit(0, "stall", 1.0)  # the actor's queue is held for 1 s
    t0 = time.perf_counter()
    with pytest.raises(BackendUnavailableError, match="no answer within 0.3 s"):
        rt.ping(0)
    assert time.perf_counter() - t0 < 0.9
    assert rt.alive(0)  # slow is not dead
    rt.ray.get(ref, timeout=10)


def test_failed_source_of_an_actor_to_actor_copy_is_reported(ray_reg2) -> None:
    d0, d1 = ray_reg2.devices
    rt = d0.runtime
    b0, b1 = d0.init_backend(), d1.init_backend()
    m0, m1 = rt.malloc(0, 256), rt.malloc(1, 256)
    rt.memcpy_htod(m1, 0, np.full(256, 7, np.uint8))
    # a read past the end of the source fails on RAY0: the write on RAY1 never runs
    rt.copy_between(b0.stream, b1.stream, m1, 0, m0, 200, 100)
    with pytest.raises(ComputeError, match="copy from RAY0 failed"):
        b1.synchronize()
    b1.synchronize()  # reported once
    np.testing.assert_array_equal(rt.memcpy_dtoh(m1, 0, 256), np.full(256, 7, np.uint8))
    assert rt.alive(0) and rt.alive(1)  # a failed copy kills no device
    rt.free(m0)
    rt.free(m1)
    b0.free()
    b1.free()


def test_async_set_get_roundtrip_between_devices(ray_reg2) -> None:
    from ggmlpy.backend.tensor_data import backend_tensor_copy_async

    d0, d1 = ray_reg2.devices
    b0, b1 = d0.init_backend(), d1.init_backend()
    ctx = Context()
    s = ctx.new_tensor_1d(Type.F32, 300_000).set_name("s")  # > Ray's 100 KiB inline limit
    t = ctx.new_tensor_1d(Type.F32, 300_000).set_name("t")
    bs, bt = contract.place(d0.get_buffer_type(), s), contract.place(d1.get_buffer_type(), t)
    x = contract.f32(np.random.default_rng(5), 300_000)
    backend_tensor_set_async(b0, s, x)
    backend_tensor_copy_async(b0, b1, s, t)  # actor to actor
    out = np.empty_like(x)
    backend_tensor_get_async(b1, t, out)
    b1.synchronize()
    np.testing.assert_array_equal(out, x)
    bs.free()
    bt.free()
    b0.free()
    b1.free()
