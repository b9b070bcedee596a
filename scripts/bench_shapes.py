#!/usr/bin/env python3
"""Per-new-shape host costs of all-MiniLM-L6-v2 on the CPU backend; prints one JSON object.

For ``--shapes`` batch shapes ``(--batch-size, L)`` never seen before (``L`` from 16 by 8, offset
per round so every build is fresh) it times, per shape:

- ``graph``: :meth:`BertModel._build_graph` (the ggml graph of the batch);
- ``alloc``: ``Scheduler.reset`` + ``Scheduler.alloc_graph`` (splits and gallocr placement);
- ``plan``: the CPU backend's plan build (kernel compilation, thread splits, chain fusion).

Each is measured in this process's CPU time (``time.process_time``: robust to other processes
on a shared machine, and every part is single-threaded), over ``--rounds`` rounds; the JSON
gives the median and the minimum in milliseconds. ``--threads`` (default 2) is set before NumPy
loads, as in ``scripts/bench_minilm.py``.

Then (unless ``--no-encode``) it encodes the 512-sentence mixed set of ``bench_minilm.py`` twice
with a fresh model and reports both wall times and, for each call, the time spent building
graphs, allocating and building plans (``first_call``/``second_call``), and the number of
graphs built.

Usage: ``python scripts/bench_shapes.py [--shapes 15] [--rounds 3] [--batch-size 32]
[--threads 2] [--no-encode]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# bench_minilm sets OMP/OPENBLAS/MKL_NUM_THREADS from --threads before NumPy loads, and finds
# ggmlpy in the checkout when it is not installed
from bench_minilm import make_mixed_sentences  # noqa: E402

from ggmlpy.models.bert import BertModel  # noqa: E402


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(xs) * 1e3, 3), "min_ms": round(min(xs) * 1e3, 3)}


def per_shape(model: BertModel, n_shapes: int, rounds: int, batch: int) -> dict[str, Any]:
    """CPU time of graph build, scheduler allocation and CPU plan build per fresh shape."""
    cpu = model._backends[-1]
    pt = time.process_time
    out: dict[str, list[float]] = {"graph": [], "alloc": [], "plan": []}
    for r in range(rounds):
        for k in range(n_shapes):
            length = 16 + 8 * k + r          # a shape no earlier round built
            t0 = pt()
            g = model._build_graph(batch, length)
            t1 = pt()
            model.sched.reset()
            if not model.sched.alloc_graph(g.graph):
                raise RuntimeError(f"could not allocate {batch} x {length}")
            t2 = pt()
            cpu._build_plan(g.graph)
            t3 = pt()
            out["graph"].append(t1 - t0)
            out["alloc"].append(t2 - t1)
            out["plan"].append(t3 - t2)
    res: dict[str, Any] = {k: _stats(v) for k, v in out.items()}
    res["graph_nodes"] = len(g.graph.nodes)
    res["total_median_ms"] = round(sum(res[k]["median_ms"] for k in out), 3)
    return res


def encode_calls(batch: int) -> dict[str, Any]:
    """Two encodes of the 512-sentence mixed set with a fresh model: wall time and build time."""
    sentences = make_mixed_sentences(512)
    model = BertModel.load(max_batch=batch)
    cpu = model._backends[-1]
    acc = {"graph": 0.0, "alloc": 0.0, "plan": 0.0}

    def timed(obj: Any, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def run(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                acc[key] += time.perf_counter() - t0
        setattr(obj, name, run)

    timed(model, "_build_graph", "graph")
    timed(model.sched, "alloc_graph", "alloc")
    timed(cpu._plans, "_build", "plan")
    calls = []
    try:
        for _ in range(2):
            for k in acc:
                acc[k] = 0.0
            time.sleep(0.5)
            t0 = time.perf_counter()
            model.encode(sentences, batch_size=batch)
            calls.append({"wall_s": round(time.perf_counter() - t0, 3),
                          **{k + "_s": round(v, 3) for k, v in acc.items()},
                          "graphs_built": model.n_graph_builds,
                          "plans_built": cpu._plans.builds})
    finally:
        model.close()
    return {"first_call": calls[0], "second_call": calls[1]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n", 1)[0])
    p.add_argument("--shapes", type=int, default=15)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-encode", action="store_true")
    a = p.parse_args(argv)
    model = BertModel.load(max_batch=a.batch_size)
    try:
        res: dict[str, Any] = {"benchmark": "MiniLM per-new-shape host costs (CPU)",
                               "threads": a.threads, "batch_size": a.batch_size,
                               "per_shape": per_shape(model, a.shapes, a.rounds, a.batch_size)}
    finally:
        model.close()
    if not a.no_encode:
        res["encode_512"] = encode_calls(a.batch_size)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
