"""RAY device benchmarks (JSON on stdout). Starts a local Ray instance (loopback, 2 CPUs) with
two actors RAY0 and RAY1.

1. ``pipeline_ray0_ray1``: a stream of micro-batches through a two-stage graph (first half of the
   layers' weights on RAY0, second half on RAY1, as with two GPUs on two hosts), with the same
   three modes as ``bench_sched.py``: unpipelined (synchronous compute per batch), async with one
   input copy, and pipelined (``parallel=True``); ratio of batches/s vs unpipelined and whether
   the results are identical.
2. ``overhead``: cost of one evaluation of an unchanged split on RAY0 (a one-node graph, so the
   kernel is negligible): ``submit_us`` (driver time of ``graph_compute_async``: one message),
   ``async_us`` (N async evaluations then one synchronize, per evaluation), ``roundtrip_us``
   (``graph_compute``: submit + wait), ``first_us`` (first evaluation: encode, ship and compile the
   spec), ``spec_bytes``; the same on SIM0 for scale.
3. ``--ops``: the full test-backend-ops table on RAY0 next to SIM0 (counts per verdict, seconds).

Usage: ``python scripts/bench_ray.py [--quick] [--ops]``
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from bench_sched import bench_pipeline  # noqa: E402

import ggmlpy as gp  # noqa: E402
from ggmlpy import Context, Graph, Type  # noqa: E402
from ggmlpy.backend.interface import tensor_alloc  # noqa: E402
from ggmlpy.backend.tensor_data import backend_tensor_set
from ggmlpy.backends.ray.runtime import ray_reg  # noqa: E402
from ggmlpy.backends.sim import sim_reg  # noqa: E402


def bench_overhead(backend, n_evals: int) -> dict:
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 16)
    b = gp.add(ctx, a, a)
    g = Graph()
    g.build_forward_expand(b)
    buf = backend.get_default_buffer_type().alloc_buffer(1024)
    tensor_alloc(buf, a, 0)
    tensor_alloc(buf, b, 512)
    backend_tensor_set(a, np.arange(16, dtype=np.float32))
    rt = getattr(backend, "runtime", None)
    counters = getattr(rt, "counters", None)
    spec0 = counters(backend.device.index)["spec_bytes"] if counters else 0
    t0 = time.perf_counter()
    backend.graph_compute(g)
    first = time.perf_counter() - t0
    for _ in range(20):
        backend.graph_compute(g)
    t0 = time.perf_counter()
    for _ in range(n_evals):
        backend.graph_compute(g)
    roundtrip = (time.perf_counter() - t0) / n_evals
    t0 = time.perf_counter()
    for _ in range(n_evals):
        backend.graph_compute_async(g)
    submitted = time.perf_counter()
    backend.synchronize()
    done = time.perf_counter()
    out = {"first_us": first * 1e6, "roundtrip_us": roundtrip * 1e6,
           "submit_us": (submitted - t0) / n_evals * 1e6, "async_us": (done - t0) / n_evals * 1e6,
           "n_evals": n_evals}
    if counters:
        c = counters(backend.device.index)
        out["spec_bytes_sent"] = c["spec_bytes"] - spec0  # once, on the first evaluation
    buf.free()
    return out


def bench_ops(ray_dev, sim_dev) -> dict:
    from ggmlpy.testops.families import all_cases
    from ggmlpy.testops.runner import run_tests

    cases = all_cases()
    res: dict = {"cases": len(cases)}
    statuses = {}
    for name, dev in (("SIM0", sim_dev), ("RAY0", ray_dev)):
        t0 = time.perf_counter()
        rep = run_tests("test", backend=dev, cases=cases)
        res[name] = {"seconds": time.perf_counter() - t0,
                     "counts": dict(collections.Counter(r.status for r in rep.results))}
        statuses[name] = [r.status for r in rep.results]
    res["same_verdicts"] = statuses["SIM0"] == statuses["RAY0"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    ap.add_argument("--ops", action="store_true", help="also run the full test-backend-ops table")
    args = ap.parse_args()
    t0 = time.perf_counter()
    reg = ray_reg(2)
    start_s = time.perf_counter() - t0
    r0, r1 = (d.init_backend() for d in reg.devices)
    sim = sim_reg(1).devices[0].init_backend()
    cpu = gp.backend_cpu_init()
    size = {"n_layers": 8, "hidden": 256 if args.quick else 512,
            "n_tok": 128 if args.quick else 256, "n_batches": 8 if args.quick else 16}
    n_evals = 200 if args.quick else 1000
    out = {
        "ray_start_s": start_s,
        "blas_threads": "OMP/OPENBLAS/MKL_NUM_THREADS=1",
        "pipeline_ray0_ray1": {**size, **bench_pipeline(r0, r1, [r0, r1, cpu], **size)},
        "overhead": {"RAY0": bench_overhead(r0, n_evals), "SIM0": bench_overhead(sim, n_evals)},
    }
    if args.ops:
        out["test_backend_ops"] = bench_ops(reg.devices[0], sim.device)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
