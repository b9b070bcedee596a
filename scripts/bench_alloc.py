"""Benchmark of the graph allocator's compute-buffer sizes; prints JSON.

For each graph (a BERT encoder layer, a 12-layer BERT encoder, a 12-layer pre-norm decoder with
SwiGLU, and random DAGs) it reports:

* ``planned``: ``GraphAllocator.reserve`` -> ``get_buffer_size(0)`` in bytes;
* ``naive``: every intermediate (and graph input) in its own memory, padded to the alignment;
* ``lower_bound``: computed here, independently of the allocator: the largest total of
  simultaneously live non-view tensors the allocator must hold, in execution order, ignoring
  fragmentation. A tensor is live from the node that produces it (graph inputs: from the start)
  to its last read, directly or through a view (outputs: to the end). At node ``i`` the live set
  is every tensor whose lifetime contains ``i``; when node ``i``'s op may run in place
  (``INPLACE_CAPABLE_OPS``) and a source of the same layout dies at ``i``, that source's bytes are
  counted once;
* ``ratio``: planned / lower_bound, and ``plan_ms``: planning time; the ``_compact`` fields are
  the same for ``GraphAllocator(policy="compact")`` (ggml's lifetimes, offline placement).

Graphs are metadata only; weights and compute buffers live in a buffer type that allocates no
memory. Usage: ``python scripts/bench_alloc.py [--tokens N] [--random N]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggmlpy import ops  # noqa: E402
from ggmlpy.alloc.gallocr import POLICIES, GraphAllocator
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft  # noqa: E402
from ggmlpy.backend.interface import Buffer, BufferType  # noqa: E402
from ggmlpy.core.graph import Graph  # noqa: E402
from ggmlpy.core.opcodes import INPLACE_CAPABLE_OPS  # noqa: E402
from ggmlpy.core.tensor import Context, Flag, Tensor  # noqa: E402
from ggmlpy.core.types import Type  # noqa: E402

F32 = Type.F32
ALIGN = 32


class _MetaBuffer(Buffer):
    """A buffer with a size and no memory (sizes only)."""


class MetaBufferType(BufferType):
    """A buffer type that allocates no memory, with the CPU's 32-byte alignment."""

    def _alloc_buffer(self, size: int) -> Buffer:
        return _MetaBuffer(self, size)

    def _get_alignment(self) -> int:
        return ALIGN


META = MetaBufferType("META")


def _pad(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


# -- graphs ------------------------------------------------------------------------------------


class _Weights:
    def __init__(self) -> None:
        self.ctx = Context()

    def new(self, *ne: int) -> Tensor:
        return self.ctx.new_tensor(F32, ne)

    def alloc(self) -> None:
        alloc_ctx_tensors_from_buft(self.ctx, META)


def _bert_layer(ctx, W, cur, mask, d, n_head, d_ff, T):
    hd = d // n_head
    q = ops.add(ctx, ops.mul_mat(ctx, W.new(d, d), cur), W.new(d))
    k = ops.add(ctx, ops.mul_mat(ctx, W.new(d, d), cur), W.new(d))
    v = ops.add(ctx, ops.mul_mat(ctx, W.new(d, d), cur), W.new(d))
    q = ops.permute(ctx, ops.reshape_3d(ctx, q, hd, n_head, T), 0, 2, 1, 3)   # [hd, T, H]
    k = ops.permute(ctx, ops.reshape_3d(ctx, k, hd, n_head, T), 0, 2, 1, 3)   # [hd, T, H]
    kq = ops.mul_mat(ctx, k, q)                                                # [T, T, H]
    kq = ops.soft_max_ext(ctx, kq, mask, 1.0 / hd ** 0.5, 0.0)
    v = ops.cont(ctx, ops.permute(ctx, ops.reshape_3d(ctx, v, hd, n_head, T), 1, 2, 0, 3))  # [T, hd, H]
    kqv = ops.mul_mat(ctx, v, kq)                                              # [hd, T, H]
    merged = ops.cont_2d(ctx, ops.permute(ctx, kqv, 0, 2, 1, 3), d, T)
    attn = ops.add(ctx, ops.mul_mat(ctx, W.new(d, d), merged), W.new(d))
    cur = ops.add(ctx, attn, cur)
    cur = ops.add(ctx, ops.mul(ctx, ops.norm(ctx, cur, 1e-12), W.new(d)), W.new(d))
    ff = ops.gelu(ctx, ops.add(ctx, ops.mul_mat(ctx, W.new(d, d_ff), cur), W.new(d_ff)))
    ff = ops.add(ctx, ops.mul_mat(ctx, W.new(d_ff, d), ff), W.new(d))
    cur = ops.add(ctx, ff, cur)
    return ops.add(ctx, ops.mul(ctx, ops.norm(ctx, cur, 1e-12), W.new(d)), W.new(d))


def bert(n_layer: int, T: int, d: int = 384, n_head: int = 12, d_ff: int = 1536) -> Graph:
    """A BERT encoder (MiniLM sizes by default) on ``T`` tokens."""
    W = _Weights()
    ctx = Context()
    x = ctx.new_tensor_2d(F32, d, T).set_name("embd").set_input()
    mask = ctx.new_tensor_2d(F32, T, T).set_name("mask").set_input()
    cur = x
    for _ in range(n_layer):
        cur = _bert_layer(ctx, W, cur, mask, d, n_head, d_ff, T)
    cur.set_output()
    W.alloc()
    g = Graph(8192)
    g.build_forward_expand(cur)
    return g


def decoder(n_layer: int, T: int, d: int = 512, n_head: int = 8, d_ff: int = 1408) -> Graph:
    """A pre-norm decoder: rms_norm, causal attention, SwiGLU FFN, residuals."""
    W = _Weights()
    ctx = Context()
    hd = d // n_head
    cur = ctx.new_tensor_2d(F32, d, T).set_name("embd").set_input()
    mask = ctx.new_tensor_2d(F32, T, T).set_name("kq_mask").set_input()
    for _ in range(n_layer):
        h = ops.mul(ctx, ops.rms_norm(ctx, cur, 1e-6), W.new(d))
        q = ops.permute(ctx, ops.reshape_3d(ctx, ops.mul_mat(ctx, W.new(d, d), h), hd, n_head, T),
                        0, 2, 1, 3)
        k = ops.permute(ctx, ops.reshape_3d(ctx, ops.mul_mat(ctx, W.new(d, d), h), hd, n_head, T),
                        0, 2, 1, 3)
        v = ops.reshape_3d(ctx, ops.mul_mat(ctx, W.new(d, d), h), hd, n_head, T)
        kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, k, q), mask, 1.0 / hd ** 0.5, 0.0)
        v = ops.cont(ctx, ops.permute(ctx, v, 1, 2, 0, 3))
        o = ops.cont_2d(ctx, ops.permute(ctx, ops.mul_mat(ctx, v, kq), 0, 2, 1, 3), d, T)
        cur = ops.add(ctx, ops.mul_mat(ctx, W.new(d, d), o), cur)
        h = ops.mul(ctx, ops.rms_norm(ctx, cur, 1e-6), W.new(d))
        gate = ops.mul_mat(ctx, W.new(d, d_ff), h)
        up = ops.mul_mat(ctx, W.new(d, d_ff), h)
        cur = ops.add(ctx, ops.mul_mat(ctx, W.new(d_ff, d), ops.swiglu_split(ctx, gate, up)), cur)
    cur = ops.mul(ctx, ops.rms_norm(ctx, cur, 1e-6), W.new(d))
    logits = ops.mul_mat(ctx, W.new(d, 4096), cur).set_output()
    W.alloc()
    g = Graph(8192)
    g.build_forward_expand(logits)
    return g


def random_graph(seed: int, n_steps: int = 120) -> Graph:
    """A random DAG of element-wise ops, mul_mat, norm, cont and views over a few shapes."""
    rng = random.Random(seed)
    W = _Weights()
    ctx = Context()
    shapes = [(64, 32), (32, 64), (64, 64), (128, 16), (64, 48)]
    pool = [ctx.new_tensor(F32, rng.choice(shapes)).set_input() for _ in range(3)]
    pool += [W.new(*rng.choice(shapes)) for _ in range(3)]
    n0 = len(pool)
    for _ in range(n_steps):
        a = pool[-1 - rng.randrange(min(4, len(pool)))] if rng.random() < 0.8 else rng.choice(pool)
        kind = rng.choice(["add", "mul", "scale", "gelu", "mul_mat", "norm", "cont", "transpose",
                           "view", "add_inplace"])
        try:
            same = [t for t in pool if t.ne == a.ne]
            if kind in ("add", "mul", "add_inplace"):
                fn = {"add": ops.add, "mul": ops.mul, "add_inplace": ops.add_inplace}[kind]
                t = fn(ctx, a, rng.choice(same))
            elif kind == "scale":
                t = ops.scale(ctx, a, 0.5)
            elif kind == "gelu":
                t = ops.gelu(ctx, a)
            elif kind == "mul_mat":
                t = ops.mul_mat(ctx, a, rng.choice([p for p in pool if p.ne[0] == a.ne[0]]))
            elif kind == "norm":
                t = ops.norm(ctx, a, 1e-5)
            elif kind == "cont":
                t = ops.cont(ctx, a)
            elif kind == "transpose":
                t = ops.transpose(ctx, a)
            else:
                t = ops.view_2d(ctx, a, a.ne[0], a.ne[1] // 2, a.nb[1], 0)
        except (ValueError, TypeError):
            continue
        pool.append(t)
        if rng.random() < 0.05:
            t.set_output()
    W.alloc()
    g = Graph(8192)
    for t in pool[n0:][-3:]:
        g.build_forward_expand(t.set_output())
    for t in pool[n0:]:
        if t.flags & Flag.OUTPUT:
            g.build_forward_expand(t)
    return g


# -- measures ----------------------------------------------------------------------------------


def _owned(t: Tensor) -> bool:
    return t.view_src is None and t.buffer is None and t.offset is None


def naive_size(g: Graph) -> int:
    """Every non-view tensor without memory (intermediates, graph inputs) in its own slot."""
    return sum(_pad(t.nbytes) for t in [*g.leafs, *g.nodes] if _owned(t))


def lower_bound(g: Graph) -> int:
    """Peak of simultaneously live owned bytes (see the module docstring)."""
    n = g.n_nodes

    def root(t: Tensor) -> Tensor:
        return t.view_src if t.view_src is not None else t

    start: dict[int, int] = {}
    end: dict[int, int] = {}
    size: dict[int, int] = {}
    for t in g.leafs:
        if _owned(t):
            start[id(t)] = -1
            size[id(t)] = _pad(t.nbytes)
    for i, node in enumerate(g.nodes):
        if _owned(node):
            start.setdefault(id(node), -1 if node.flags & Flag.INPUT else i)
            size[id(node)] = _pad(node.nbytes)
        for t in [node, *g.node_srcs(node)]:
            if t is not None:
                r = root(t)
                end[id(r)] = max(end.get(id(r), -1), i)
    for t in [*g.leafs, *g.nodes]:
        if root(t).flags & Flag.OUTPUT:
            end[id(root(t))] = n
    for k in start:
        end[k] = max(end.get(k, start[k]), start[k])
    # sweep: +size at start, -size after end
    delta = [0] * (n + 3)
    for k, s in start.items():
        delta[s + 1] += size[k]
        delta[end[k] + 2] -= size[k]
    best, cur = 0, 0
    live_at = []
    for i in range(n + 2):
        cur += delta[i]
        live_at.append(cur)
    for i, node in enumerate(g.nodes):
        peak = live_at[i + 1]
        if node.op in INPLACE_CAPABLE_OPS and _owned(node) and not node.flags & Flag.OUTPUT:
            for s in g.node_srcs(node):
                if (s is not None and id(s) in start and end[id(s)] == i
                        and s.are_same_layout(node) and not s.flags & Flag.OUTPUT):
                    peak -= size[id(node)]
                    break
        best = max(best, peak)
    return max(best, live_at[0])


def measure(name: str, g: Graph) -> dict:
    naive = naive_size(g)
    lb = lower_bound(g)
    out = {"graph": name, "n_nodes": g.n_nodes, "n_leafs": g.n_leafs, "naive": naive,
           "lower_bound": lb, "naive_ratio": round(naive / lb, 2) if lb else None}
    for policy in POLICIES:
        ga = GraphAllocator(META, policy=policy)
        t0 = time.perf_counter()
        assert ga.reserve(g)
        ms = (time.perf_counter() - t0) * 1e3
        planned = ga.get_buffer_size(0)
        key = "" if policy == "ggml" else f"_{policy}"
        out.update({f"planned{key}": planned,
                    f"ratio{key}": round(planned / lb, 4) if lb else None,
                    f"plan_ms{key}": round(ms, 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--random", type=int, default=5)
    args = ap.parse_args()
    T = args.tokens
    results = [
        measure(f"bert_layer_T{T}", bert(1, T)),
        measure(f"bert_12_layers_T{T}", bert(12, T)),
        measure(f"decoder_12_layers_T{T}", decoder(12, T)),
    ]
    results += [measure(f"random_{s}", random_graph(s)) for s in range(args.random)]
    print(json.dumps({"alignment": ALIGN, "results": results}, indent=1))


if __name__ == "__main__":
    main()
