"""Chains of split nodes cut along different axes (``cpu_threads.fuse_chains`` by per-slice byte
ranges): attention's pattern, where a node cut by sequence (a copy of per-head views) runs in
the same step as the GEMM and bias add cut by token rows before it, because slice ``i`` of the
copy reads only bytes that slice ``i`` of the chain wrote.

Every result is compared bit for bit with one thread (no GEMM in the random graphs: every op
here computes each element the same way whatever the slice), on graphs placed by the graph
allocator (which reuses memory between nodes, as in a model). The random graphs mix row-cut and
sequence-cut nodes, reads of earlier results in other layouts (transposed, other heads), and odd
sequence counts whose slice bounds do not line up with the token rows' (joins then must be
refused)."""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.gallocr import GraphAllocator
from ggmlpy.alloc.tallocr import alloc_ctx_tensors
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu import threads as cpu_threads
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.backends.cpu.threads import Split
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

F32 = Type.F32
D, NH = 16, 8          # head size, heads: H = 128, the fused rows 3H = 384


def _heads(ctx, x, first, S, L):
    """Elements ``first..first+H`` of each row of ``x`` ([C, S*L]) as [D, L, NH, S] (BERT's)."""
    row = x.nb[1]
    return ops.view_4d(ctx, x, D, L, NH, S, row, D * x.nb[0], L * row, first * x.nb[0])


def _build(seed: int, S: int, L: int):
    rng = np.random.default_rng(seed)
    H = D * NH
    T = S * L
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor(F32, (3 * H, T)).set_input()
    b3 = ctx.new_tensor(F32, (3 * H,)).set_input()
    bh = ctx.new_tensor(F32, (H,)).set_input()
    y = ops.add(ctx, x, b3)                      # [3H, T], cut on token rows
    flat = [y]                                   # [*, T] results
    heads = []                                   # [D, L, NH, S] results
    for _ in range(8):
        k = int(rng.integers(0, 8))
        src = flat[int(rng.integers(0, len(flat)))]
        if k in (0, 1) and src.ne[0] == 3 * H:   # a third of the fused rows, per head, copied
            part = int(rng.integers(0, 3)) * H
            v = _heads(ctx, src, part, S, L)
            heads.append(ops.cont(ctx, ops.transpose(ctx, v)) if k == 0 else ops.cont(ctx, v))
        elif k == 2 and heads:                   # heads merged back to [H, T]
            h = heads[int(rng.integers(0, len(heads)))]
            if h.ne[0] == D:                     # [D, L, NH, S] -> [D, NH, L, S] -> [H, T]
                flat.append(ops.cont_2d(ctx, ops.permute(ctx, h, 0, 2, 1, 3), H, T))
            else:                                # [L, D, NH, S] (a transposed copy)
                flat.append(ops.cont_2d(ctx, ops.permute(ctx, h, 1, 0, 2, 3), H, T))
        elif k == 3 and heads:
            h = heads[int(rng.integers(0, len(heads)))]
            heads.append(ops.scale(ctx, h, float(rng.uniform(0.5, 2))))
        elif k == 4:
            flat.append(ops.gelu_erf(ctx, src))
        elif k == 5 and src.ne[0] == H:
            flat.append(ops.norm(ctx, ops.add(ctx, src, bh), 1e-5))
        elif k == 6 and len(flat) > 1:           # a residual between two results of one shape
            same = [f for f in flat if f.ne == src.ne]
            flat.append(ops.add(ctx, src, same[int(rng.integers(0, len(same)))]))
        else:
            flat.append(ops.scale_inplace(ctx, src, 0.75) if src is not y else ops.scale(ctx, src, 0.75))
    outs = list(flat[1:] + heads)
    for t in outs:
        t.set_output()
    return ctx, (x, b3, bh), outs


def _run(seed: int, S: int, L: int, n_threads: int):
    ctx, inputs, outs = _build(seed, S, L)
    g = Graph(256)
    for t in outs:
        g.build_forward_expand(t)
    backend = backend_cpu_init()
    backend.set_n_threads(n_threads)
    galloc = GraphAllocator(backend.get_default_buffer_type())
    try:
        assert galloc.alloc_graph(g)
        vals = np.random.default_rng(500 + seed)
        for t in inputs:
            if t.buffer is not None:
                backend_tensor_set(t, vals.uniform(-2, 2, t.ne[::-1]).astype(np.float32))
        backend.graph_compute(g)
        plan = backend.plan_cache.get(g)
        steps = [s.n_nodes if isinstance(s, Split) and s.parts is not None else 0
                 for s in plan.steps]
        return [np.array(backend_tensor_get(t)) for t in outs], steps
    finally:
        galloc.free()
        backend.free()


#: (S, L): 3H x T above the ADD threshold (1M elements), so chains start; S even (the cuts
#: meet at 2 threads), odd, and 2 sequences
SHAPES = [(32, 96), (33, 93), (2, 1500)]
_joined: list[int] = []


@pytest.mark.parametrize("S, L", SHAPES)
@pytest.mark.parametrize("seed", range(6))
def test_mixed_axis_chains_equal_one_thread(seed, S, L, monkeypatch) -> None:
    real = cpu_threads._slices_disjoint
    verdicts = []
    monkeypatch.setattr(cpu_threads, "_slices_disjoint",
                        lambda c, s: (verdicts.append(real(c, s)), verdicts[-1])[1])
    one, _ = _run(seed, S, L, 1)
    for n in (2, 3):
        got, _ = _run(seed, S, L, n)
        for i, (a, b) in enumerate(zip(got, one)):
            np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32),
                                          err_msg=f"seed {seed}, S={S}, {n} threads, output {i}")
    _joined.append(sum(verdicts))


def test_mixed_axis_graphs_did_join_by_ranges() -> None:
    """The random graphs above exercise the rule: some nodes joined by per-slice ranges (on
    xdist the runs above may sit in another process: then this one runs a few itself)."""
    if not _joined:
        for seed in range(3):
            test_mixed_axis_chains_equal_one_thread(seed, 32, 96, pytest.MonkeyPatch())
    assert sum(_joined) > 0


def _attention_prefix(S: int, L: int, n_threads: int):
    """BERT's Q/K/V pattern: a fused [3H, T] bias add, then V's per-head transposed copy. The
    inputs live in their own buffer, as a model's activations and weights do (in the compute
    buffer the allocator could give the bias's memory to the copy, which other slices still
    read: the rule then rightly refuses the join)."""
    H = D * NH
    wctx, ctx = Context(no_alloc=True), Context(no_alloc=True)
    x = wctx.new_tensor(F32, (3 * H, S * L))
    b = wctx.new_tensor(F32, (3 * H,))
    y = ops.add(ctx, x, b)
    vt = ops.cont(ctx, ops.transpose(ctx, _heads(ctx, y, 2 * H, S, L)))
    z = ops.scale(ctx, vt, 2.0)
    z.set_output()
    g = Graph(16)
    g.build_forward_expand(z)
    backend = backend_cpu_init()
    backend.set_n_threads(n_threads)
    galloc = GraphAllocator(backend.get_default_buffer_type())
    wbuf = alloc_ctx_tensors(wctx, backend)
    try:
        assert galloc.alloc_graph(g)
        rng = np.random.default_rng(1)
        X = rng.uniform(-1, 1, x.ne[::-1]).astype(np.float32)
        B = rng.uniform(-1, 1, b.ne[::-1]).astype(np.float32)
        backend_tensor_set(x, X)
        backend_tensor_set(b, B)
        backend.graph_compute(g)
        plan = backend.plan_cache.get(g)
        sizes = [s.n_nodes if isinstance(s, Split) and s.parts is not None else 0
                 for s in plan.steps]
        # reference: y = X + B, V = y[:, 2H:3H] per head, transposed per (seq, head), times 2
        yv = (X + B).reshape(S * L, 3 * H)[:, 2 * H:].reshape(S, L, NH, D)  # (S, L, NH, D)
        want = 2 * yv.transpose(0, 2, 3, 1)                      # (S, NH, D, L)
        return np.array(backend_tensor_get(z)), want, sizes
    finally:
        galloc.free()
        wbuf.free()
        backend.free()


@pytest.mark.parametrize("S, L, joined", [(64, 48, True), (128, 24, True), (65, 48, False)])
def test_attention_v_copy_joins_the_qkv_chain(S, L, joined) -> None:
    """With 2 threads the token rows split at T/2 and the sequences at S/2: when S is even the
    two cuts meet (slice i of the copy reads only rows slice i of the add wrote) and the three
    nodes run as one step; when S is odd they do not and the copy must run apart."""
    got, want, sizes = _attention_prefix(S, L, 2)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    if joined:
        assert sizes == [3]
    else:
        assert sizes != [3] and sum(sizes) < 3 + 1


def test_disjointness_rule_table() -> None:
    """``_slices_disjoint`` on hand-made ranges: slice i may touch what chain slice i touched,
    never what another chain slice writes (read or write) or reads (write)."""
    chain = [([(0, 100)], [(1000, 1100)]), ([(100, 200)], [(1100, 1200)])]
    ok = [([(0, 50)], [(0, 100)]), ([(150, 200)], [(100, 200)])]        # own rows only
    assert cpu_threads._slices_disjoint(chain, ok)
    reads_other = [([(300, 310)], [(0, 150)]), ([(310, 320)], [])]    # reads slice 1's rows
    assert not cpu_threads._slices_disjoint(chain, reads_other)
    writes_read = [([(1150, 1160)], []), ([(320, 330)], [])]          # overwrites slice 1's input
    assert not cpu_threads._slices_disjoint(chain, writes_read)
    writes_written = [([(150, 160)], []), ([(500, 510)], [])]         # writes slice 1's output
    assert not cpu_threads._slices_disjoint(chain, writes_written)
    assert not cpu_threads._slices_disjoint(chain, ok[:1])            # other slice count
    empty = [([(5, 5)], [(7, 3)]), ([], [])]                          # empty ranges touch nothing
    assert cpu_threads._slices_disjoint(chain, empty)


def test_cut_bounds_equal_the_views_bounds() -> None:
    """``_cut`` (arithmetic on the layout) gives the bounds ``_extent`` gives for the view
    itself, over random shapes, strides (transposed, broadcast, negative) and cuts."""
    rng = np.random.default_rng(3)
    base = np.zeros(4096, np.float32)
    for _ in range(2000):
        nd = int(rng.integers(1, 5))
        shape = tuple(int(n) for n in rng.integers(1, 6, nd))
        strides = tuple(int(st) * 4 for st in rng.integers(-3, 4, nd))
        off = 2048
        a = np.lib.stride_tricks.as_strided(base[off:], shape, strides)
        ax = int(rng.integers(0, nd))
        lo = int(rng.integers(0, shape[ax]))
        hi = int(rng.integers(lo, shape[ax] + 1))
        view = a[(slice(None),) * ax + (slice(lo, hi),)]
        want = cpu_threads._extent(view)[:2]
        got = cpu_threads._cut(cpu_threads._extent(a), ax, lo, hi)
        if view.size == 0:
            assert not got[0] < got[1]
        else:
            assert got == want, (shape, strides, ax, lo, hi)
