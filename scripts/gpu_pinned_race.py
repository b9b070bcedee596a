"""Pinned host sources read by queued uploads, on a real device: prints JSON, exit 1 on a wrong batch.

Usage::

    PYTHONPATH=. python scripts/gpu_pinned_race.py [--device CUDA0|SIM0] [--batches 20]
        [--k 1024] [--m 4096] [--n 512]

The set-up of llama.cpp: ``Scheduler([dev, cpu], bufts=[dev_buft, dev_host_buft])``, so the
CPU's tensors live in pinned host memory (``CUDA_Host``), which the CUDA runtime uploads in place,
in stream order. The graph: ``x`` (input, ``[k, n]``) -> ``h = soft_max(x)`` (pinned to the CPU,
in pinned memory) -> ``y1 = w1 @ h`` (``w1`` ``[k, m]`` on the device) -> ``y = w2 @ y1``
(``w2`` ``[m, m]``); the device's matrix products keep its stream behind the host, so each
upload of ``h`` is still queued when the next evaluation's CPU step writes ``h`` again. The
evaluations are queued back to back (``graph_compute_async``, outputs read with
``backend_tensor_get_async``), with ``parallel`` off and on, each output compared with a NumPy
float64 reference (a batch is wrong when its largest error exceeds 1e-2 of the reference's
largest magnitude: a batch computed from another batch's ``h`` is off by far more).

Reported per mode: ``wrong`` (with the host-read fences of ggmlpy.backend.write_gen; must be 0)
and ``wrong_without_fences`` (a control run with the device backend's fence registration
disabled, showing whether the race happens on this device at all). ``--device SIM0`` runs the
same on a SIM device uploading in place (``pinned_direct_upload``, 500 us latency).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import ggmlpy as gp
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage, Status
from ggmlpy.backend.tensor_data import backend_tensor_get_async, backend_tensor_set
from ggmlpy.backends.device import backend as device_backend
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.sched.scheduler import Scheduler


def _device(name: str):
    if name.startswith("SIM"):
        from ggmlpy.backends.sim import sim_reg  # noqa: PLC0415
        reg = sim_reg(int(name[3:] or 0) + 1, latency_us=500, pinned_direct_upload=True)
    else:
        from ggmlpy.backends.cuda.runtime import cuda_reg  # noqa: PLC0415
        reg = cuda_reg()
    for d in reg.devices:
        if d.name == name:
            return d
    raise SystemExit(f"gpu_pinned_race: no device {name} ({getattr(reg, 'unavailable_reason', '')})")


def _run(dev, parallel: bool, batches: int, k: int, m: int, n: int) -> dict:
    rng = np.random.default_rng(11)
    be, cpu = dev.init_backend(), gp.backend_cpu_init()
    wctx = Context()
    w1 = wctx.new_tensor_2d(Type.F32, k, m).set_name("w1")
    w2 = wctx.new_tensor_2d(Type.F32, m, m).set_name("w2")
    wbuf = alloc_ctx_tensors_from_buft(wctx, be.get_default_buffer_type())
    wbuf.set_usage(BufferUsage.WEIGHTS)
    W1 = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
    W2 = (rng.standard_normal((m, m)) / np.sqrt(m)).astype(np.float32)
    backend_tensor_set(w1, W1)
    backend_tensor_set(w2, W2)
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, k, n).set_name("x").set_input()
    h = gp.soft_max(ctx, x).set_name("h")
    y = gp.mul_mat(ctx, w2, gp.mul_mat(ctx, w1, h)).set_name("y").set_output()
    g = Graph()
    g.build_forward_expand(y)
    sched = Scheduler([be, cpu], bufts=[dev.get_buffer_type(), dev.get_host_buffer_type()],
                      parallel=parallel)
    sched.set_tensor_backend(h, cpu)
    if not sched.reserve(g):
        raise SystemExit("gpu_pinned_race: reserve failed")
    xs = [rng.standard_normal((n, k)).astype(np.float32) * 4 for _ in range(batches)]
    outs = [np.full((n, m), np.nan, np.float32) for _ in range(batches)]
    t0 = time.perf_counter()
    for i in range(batches):
        sched.reset()
        sched.set_tensor_backend(h, cpu)
        if not sched.alloc_graph(g):
            raise SystemExit("gpu_pinned_race: alloc_graph failed")
        backend_tensor_set(x, xs[i])
        if sched.graph_compute_async(g) != Status.SUCCESS:
            raise SystemExit("gpu_pinned_race: graph_compute_async failed")
        backend_tensor_get_async(be, y, outs[i])
    sched.synchronize()
    wall = time.perf_counter() - t0
    splits = [s["backend"] for s in sched.report()["splits"]]
    wrong = 0
    for i in range(batches):
        xx = xs[i].astype(np.float64)
        e = np.exp(xx - xx.max(axis=-1, keepdims=True))
        ref = (e / e.sum(axis=-1, keepdims=True)) @ W1.T.astype(np.float64) @ W2.T.astype(np.float64)
        err = np.abs(outs[i] - ref).max()
        wrong += not (err <= 1e-2 * np.abs(ref).max())
    in_pinned = h.buffer is not None and h.buffer.buft is dev.get_host_buffer_type()
    sched.free()
    wbuf.free()
    be.free()
    return {"wrong": int(wrong), "splits": splits, "h_in_pinned_memory": bool(in_pinned),
            "wall_s": round(wall, 4)}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="CUDA0")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=512)
    a = ap.parse_args()
    dev = _device(a.device)
    out = {"device": dev.name, "description": dev.description, "batches": a.batches,
           "k_m_n": [a.k, a.m, a.n],
           "pinned_direct_upload": bool(dev.runtime.pinned_direct_upload), "modes": {}}
    fenced = device_backend.host_read_queued
    for parallel in (False, True):
        r = _run(dev, parallel, a.batches, a.k, a.m, a.n)
        device_backend.host_read_queued = lambda *args: None  # the control: no fences
        try:
            c = _run(dev, parallel, a.batches, a.k, a.m, a.n)
        finally:
            device_backend.host_read_queued = fenced
        r["wrong_without_fences"] = c["wrong"]
        r["wall_s_without_fences"] = c["wall_s"]
        out["modes"]["parallel" if parallel else "serial"] = r
    ok = all(r["wrong"] == 0 and r["h_in_pinned_memory"] for r in out["modes"].values())
    out["ok"] = ok
    print(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
