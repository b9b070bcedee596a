"""Per-node overhead of the CPU backend on tiny element-wise nodes, against plain NumPy calls.

Builds a chain of N nodes ``x_{i+1} = x_i (+|*|-) c`` over ``[n]`` F32 tensors (c a constant
tensor of the same shape), computes it with the CPU backend repeatedly (the compiled plan is
reused after the first run) and times the same ufuncs called directly on preallocated NumPy
arrays (``np.add(x_i, c, out=x_{i+1})``). Prints one JSON object:

    {"nodes": N, "n": n, "repeats": R,
     "backend_us_per_node": best-of-R graph_compute time / N,
     "plan_run_us_per_node": best-of-R Plan.run() time / N (no graph_compute facade),
     "numpy_us_per_node": best-of-R direct-NumPy loop time / N,
     "numpy_positional_out_us_per_node": the same with the output passed positionally,
     "ratio": backend_us_per_node / numpy_us_per_node, "target_ratio": 2.0,
     "ratio_vs_positional_out": backend_us_per_node / numpy_positional_out_us_per_node,
     "first_compute_ms": time of the first graph_compute (plan build included),
     "max_abs_err": |backend result - NumPy result| of the last node}

Usage: python scripts/bench_overhead.py [--nodes 10000] [--n 16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ggmlpy import ops
from ggmlpy.backend.interface import tensor_alloc
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import TENSOR_ALIGNMENT, backend_cpu_init
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

_OPS = (ops.add, ops.mul, ops.sub)
_NP = (np.add, np.multiply, np.subtract)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--n", type=int, default=16, help="elements per tensor")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    N, n = args.nodes, args.n

    ctx = Context()
    x0 = ctx.new_tensor(Type.F32, (n,))
    c = ctx.new_tensor(Type.F32, (n,))
    x = x0
    for i in range(N):
        x = _OPS[i % 3](ctx, x, c)
    out = x

    backend = backend_cpu_init()
    align = TENSOR_ALIGNMENT
    per = (x0.nbytes + align - 1) // align * align
    buf = backend.alloc_buffer(per * len(ctx))
    for k, t in enumerate(ctx):
        tensor_alloc(buf, t, k * per)
    rng = np.random.default_rng(0)
    X0 = rng.uniform(0.5, 1.5, n).astype(np.float32)
    C = rng.uniform(0.999, 1.001, n).astype(np.float32)   # keeps the chain bounded
    backend_tensor_set(x0, X0)
    backend_tensor_set(c, C)
    g = Graph(N + 16)
    g.build_forward_expand(out)

    t0 = time.perf_counter()
    backend.graph_compute(g)
    first_ms = (time.perf_counter() - t0) * 1e3
    plan = backend.graph_plan_create(g)

    def best(fn) -> float:
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    t_backend = best(lambda: backend.graph_compute(g))
    t_plan = best(plan.run)

    # direct NumPy: the same chain of ufuncs on preallocated arrays
    xs = [np.empty(n, np.float32) for _ in range(N + 1)]
    xs[0][:] = X0
    steps = [(_NP[i % 3], xs[i], xs[i + 1]) for i in range(N)]

    def numpy_loop() -> None:
        for f, a, o in steps:
            f(a, C, out=o)

    t_numpy = best(numpy_loop)

    def numpy_loop_positional() -> None:  # np.add(a, c, o): the cheapest way to call a ufunc
        for f, a, o in steps:
            f(a, C, o)

    t_numpy_pos = best(numpy_loop_positional)
    got = backend_tensor_get(out)
    err = float(np.max(np.abs(got.reshape(-1) - xs[N])))
    res = {
        "nodes": N, "n": n, "repeats": args.repeats,
        "backend_us_per_node": t_backend / N * 1e6,
        "plan_run_us_per_node": t_plan / N * 1e6,
        "numpy_us_per_node": t_numpy / N * 1e6,
        "numpy_positional_out_us_per_node": t_numpy_pos / N * 1e6,
        "ratio": t_backend / t_numpy,
        "ratio_vs_positional_out": t_backend / t_numpy_pos,
        "target_ratio": 2.0,
        "first_compute_ms": first_ms,
        "max_abs_err": err,
    }
    print(json.dumps(res, indent=2))
    buf.free()


if __name__ == "__main__":
    main()
