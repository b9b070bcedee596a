"""Cost of the snapshot validity check (ggmlpy.core.snapshot) per graph node; prints JSON.

For chain graphs of 1k and 10k nodes (x -> scale -> add -> scale ...): the O(1) check when no
mutation happened since the snapshot, the version check after an unrelated mutation elsewhere in
the process (generation moved, nothing of the graph stamped), the full state compare (the
fallback when something was stamped), and the CPU backend's PlanCache.get on an unchanged
graph. Run: ``python -m scripts.bench_snapshot`` or ``python scripts/bench_snapshot.py``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft  # noqa: E402
from ggmlpy.backends.cpu.backend import backend_cpu_init  # noqa: E402
from ggmlpy.core import snapshot  # noqa: E402
from ggmlpy.core.graph import Graph  # noqa: E402
from ggmlpy.core.tensor import Context  # noqa: E402
from ggmlpy.core.types import Type  # noqa: E402


def chain(n: int):
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 8)
    t = x
    for i in range(n):
        t = ops.scale(ctx, t, 1.0) if i % 2 else ops.add(ctx, t, x)
    g = Graph(max(2048, n + 16))
    g.build_forward_expand(t)
    return ctx, g


def per_node_us(fn, n_nodes: int, reps: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best / n_nodes * 1e6


def main() -> None:
    import argparse

    argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0]).parse_args()  # --help; no options
    out = {}
    other = Context().new_tensor_1d(Type.F32, 4)
    og = Graph()
    og.build_forward_expand(other)
    snapshot.Snapshot.take(og)  # publish it: its changes now move the generation
    be = backend_cpu_init()
    for n in (1000, 10000):
        ctx, g = chain(n)
        snap = snapshot.Snapshot.take(g)
        same_gen = per_node_us(lambda: snap.matches(g), n, 1000)

        def moved():
            other.offset = (other.offset or 0) + 1  # unrelated mutation: generation moves
            assert snap.matches(g)

        full = per_node_us(moved, n, 5)
        state_cmp = per_node_us(lambda: snapshot.graph_state(g) == snap.state, n, 5)
        take = per_node_us(lambda: snapshot.Snapshot.take(g), n, 5)
        buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
        be._plans.get(g)
        plan_hit = per_node_us(lambda: be._plans.get(g), n, 1000)

        def plan_moved():
            other.offset = (other.offset or 0) + 1
            be._plans.get(g)

        plan_full = per_node_us(plan_moved, n, 5)
        builds = be._plans.builds
        buf.free()
        out[f"{n}_nodes"] = {
            "unchanged_same_generation_us_per_node": round(same_gen, 5),
            "unchanged_after_unrelated_mutation_us_per_node": round(full, 3),
            "state_compare_us_per_node": round(state_cmp, 3),
            "take_us_per_node": round(take, 3),
            "plancache_get_unchanged_us_per_node": round(plan_hit, 5),
            "plancache_get_after_unrelated_mutation_us_per_node": round(plan_full, 3),
            "plan_builds": builds,
        }
        be._plans.clear()
        be._plans.builds = 0
    be.free()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
