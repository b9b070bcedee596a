"""Scheduler benchmarks (JSON on stdout).

1. split+alloc time per node (``sched.reset(); sched.alloc_graph(g)``) for 1k- and 10k-node graphs
   on CPU + SIM0 (weights of every other block on SIM0, so the graph really splits), in four
   forms: ``unchanged`` (the same graph again: the scheduler's fast path, counted in
   ``reuse_hits``), ``fresh`` (a new graph of the same structure each time, built before the
   clock starts: snapshot + split + allocation, the split taken from the template the first
   split of that structure left, see ``ggmlpy.sched.template``; counted in ``template_hits``),
   ``fresh_no_template`` (the same with templates disabled: what a never-seen structure costs)
   and ``fresh_split_only`` (``split_graph`` of a new graph, always in full, no allocation).
   Printed next to ``numpy_ufunc_call_us``, one ``np.add(a, b, out=c)`` on the same small arrays
   timed in the same run, as the machine's yardstick (targets, issue 11: fresh <= 5 us/node,
   unchanged <= 0.5 us/node).
2. Throughput of a stream of micro-batches through a balanced two-backend graph (first half of the
   layers' weights on the CPU and second half on SIM0, as with partial offload; and SIM0 then
   SIM1, as with two GPUs): unpipelined (``parallel=False``, synchronous compute per batch),
   ``parallel=False`` with async compute and read-back, and pipelined (``parallel=True``).

BLAS threads are pinned to 1 (OMP/OPENBLAS/MKL_NUM_THREADS=1, set before NumPy loads) so the CPU
split and the SIM stream each use one core of a two-core machine: the overlap is real.

Usage: ``python scripts/bench_sched.py [--quick]``
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import ggmlpy as gp  # noqa: E402
from ggmlpy import Context, Graph, Type  # noqa: E402
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft  # noqa: E402
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_get_async, backend_tensor_set
from ggmlpy.backends.sim import sim_reg  # noqa: E402
from ggmlpy.sched.scheduler import Scheduler  # noqa: E402


def _weights(backend, shapes, rng):
    ctx = Context()
    ts = [ctx.new_tensor_2d(Type.F32, *s) for s in shapes]
    buf = alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
    buf.set_usage(BufferUsage.WEIGHTS)
    for t in ts:
        backend_tensor_set(t, (rng.standard_normal(t.ne[1::-1]) / np.sqrt(t.ne[0])).astype(np.float32))
    return ts


def _chain_graph(n_nodes: int, w_sim, w_cpu) -> Graph:
    """Chain of small blocks (mul_mat with a weight + add + unary + scale); weights alternate
    CPU/SIM every 8 blocks."""
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 16, 4).set_input()
    h = x
    for i in range(n_nodes // 4):
        w = (w_sim if (i // 8) % 2 else w_cpu)[i // 2]
        h = gp.mul_mat(ctx, w, h)
        h = gp.add(ctx, h, x)
        h = gp.tanh(ctx, h)
        h = gp.scale(ctx, h, 0.5)
    h.set_output()
    g = Graph(size=n_nodes + 16)
    g.build_forward_expand(h)
    return g


def _ufunc_call_us(n_calls: int, reps: int = 5) -> float:
    """Best per-call time of a plain loop of ``np.add(a, b, out=c)`` over 16x4 float32 arrays."""
    a, b, c = (np.ones((4, 16), np.float32) for _ in range(3))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n_calls):
            np.add(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return best / n_calls * 1e6


def bench_split_alloc(n_nodes: int, sim, cpu, reps: int) -> dict:
    """``unchanged``, ``fresh`` and ``fresh_split_only`` split(+alloc) times (see the module doc)."""
    rng = np.random.default_rng(0)
    n_blocks = n_nodes // 4
    w_sim = _weights(sim, [(16, 16)] * (n_blocks // 2 + 1), rng)
    w_cpu = _weights(cpu, [(16, 16)] * (n_blocks // 2 + 1), rng)
    g = _chain_graph(n_nodes, w_sim, w_cpu)
    n = g.n_nodes
    sched = Scheduler([sim, cpu], graph_size=n, op_offload=False)
    sched.reserve(g)

    def best_of(graphs: list[Graph], alloc: bool) -> float:
        times = []
        for gg in graphs:
            t0 = time.perf_counter()
            sched.reset()
            if alloc:
                sched.alloc_graph(gg)
            else:
                sched.split_graph(gg)
            times.append(time.perf_counter() - t0)
        return min(times)

    unchanged = best_of([g] * (reps + 1), alloc=True)  # the first is a miss
    fresh = best_of([_chain_graph(n_nodes, w_sim, w_cpu) for _ in range(reps)], alloc=True)
    templates = getattr(sched, "templates", None)  # (None before split templates existed)
    t_hits = templates.hits if templates is not None else None
    if templates is not None:  # every graph split in full (no template): the first-seen cost
        templates.enabled = False
        no_tmpl = best_of([_chain_graph(n_nodes, w_sim, w_cpu) for _ in range(reps)], alloc=True)
        templates.enabled = True
    else:
        no_tmpl = fresh
    split_only = best_of([_chain_graph(n_nodes, w_sim, w_cpu) for _ in range(reps)], alloc=False)
    ufunc = _ufunc_call_us(n)
    out = {"n_nodes": n, "n_splits": sched.get_n_splits(),
           "unchanged_us_per_node": unchanged / n * 1e6,
           "fresh_us_per_node": fresh / n * 1e6,
           "fresh_split_only_us_per_node": split_only / n * 1e6,
           "fresh_no_template_us_per_node": no_tmpl / n * 1e6,
           "numpy_ufunc_call_us": ufunc,
           "unchanged_in_ufunc_calls": unchanged / n * 1e6 / ufunc,
           "fresh_in_ufunc_calls": fresh / n * 1e6 / ufunc,
           # (None with a scheduler that predates the fast path, to compare before/after)
           "reuse_hits": getattr(getattr(sched, "reuse", None), "hits", None),
           "reuse_misses": getattr(getattr(sched, "reuse", None), "misses", None),
           "template_hits": t_hits}
    sched.free()
    return out


def bench_pipeline(first, second, backends, n_layers: int, hidden: int, n_tok: int,
                   n_batches: int) -> dict:
    """First half of the layers' weights on ``first``, second half on ``second`` (the output's
    device); ``backends`` is the scheduler's list (CPU last)."""
    rng = np.random.default_rng(1)
    half = n_layers // 2
    w_cpu = _weights(first, [(hidden, hidden)] * half, rng)
    w_sim = _weights(second, [(hidden, hidden)] * (n_layers - half), rng)
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, hidden, n_tok).set_name("x").set_input()
    h = x
    for w in w_cpu + w_sim:
        h = gp.tanh(ctx, gp.mul_mat(ctx, w, h))
    out = h.set_name("out").set_output()
    g = Graph()
    g.build_forward_expand(out)
    inputs = [rng.standard_normal((n_tok, hidden)).astype(np.float32) for _ in range(n_batches)]
    res: dict = {}
    results: dict[str, list[np.ndarray]] = {}
    # "unpipelined": parallel=False and a synchronous graph_compute per micro-batch;
    # "async_1copy": parallel=False, graph_compute_async + async read-back (ggml's scheduler then
    #   already overlaps the CPU half of batch k+1 with the device half of batch k: its only wait
    #   is a device synchronize before overwriting the single input copy);
    # "pipelined": parallel=True (n_copies=4, per-slot events), async as above.
    for mode, parallel, sync_each in (("unpipelined", False, True), ("async_1copy", False, False),
                                      ("pipelined", True, False)):
        sched = Scheduler(backends, parallel=parallel, op_offload=False)
        sched.reserve(g)
        outs = [np.empty((n_tok, hidden), np.float32) for _ in range(n_batches)]

        def run() -> None:
            for k in range(n_batches):
                sched.reset()
                sched.alloc_graph(g)
                backend_tensor_set(x, inputs[k])
                if sync_each:
                    sched.graph_compute(g)
                    outs[k][:] = backend_tensor_get(out)[0, 0]
                else:
                    sched.graph_compute_async(g)
                    backend_tensor_get_async(second, out, outs[k])
            sched.synchronize()

        run()  # warm-up: plans built and cached
        best = min(_timed(run) for _ in range(3))
        res[mode] = {"seconds": best, "batches_per_s": n_batches / best,
                     "n_splits": sched.get_n_splits(), "n_copies": sched.get_n_copies()}
        results[mode] = outs
        sched.free()  # un-places the graph's tensors for the next scheduler
    base = res["unpipelined"]["batches_per_s"]
    res["speedup_pipelined_vs_unpipelined"] = res["pipelined"]["batches_per_s"] / base
    res["speedup_async_1copy_vs_unpipelined"] = res["async_1copy"]["batches_per_s"] / base
    res["same_results"] = all(
        all(np.array_equal(a, b) for a, b in zip(results["unpipelined"], results[m]))
        for m in ("async_1copy", "pipelined"))
    return res


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    args = ap.parse_args()
    reg = sim_reg(2, latency_us=0.0)
    sim, sim1 = (d.init_backend() for d in reg.devices)
    size = {"n_layers": 8, "hidden": 256 if args.quick else 512, "n_tok": 128 if args.quick else 256,
            "n_batches": 8 if args.quick else 16}
    cpu = gp.backend_cpu_init()
    sizes = (1000,) if args.quick else (1000, 10000)
    out = {
        "blas_threads": "OMP/OPENBLAS/MKL_NUM_THREADS=1",
        "split_alloc": [bench_split_alloc(n, sim, cpu, reps=3 if n > 2000 else 5) for n in sizes],
        "split_alloc_targets_us_per_node": {"fresh": 5.0, "unchanged": 0.5},
        "pipeline_cpu_sim0": bench_pipeline(cpu, sim, [sim, cpu], **size),
        "pipeline_sim0_sim1": bench_pipeline(sim, sim1, [sim, sim1, cpu], **size),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
