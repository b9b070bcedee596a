"""Kernels under ggml-alloc's in-place memory reuse: a graph of in-place-capable ops (ADD, MUL,
SCALE, UNARY, RMS_NORM, ROPE, SOFT_MAX, DIAG_MASK_INF, SQR, SQRT, LOG ...) is computed once with
every tensor in its own memory and once placed by the GraphAllocator, which runs eligible nodes
in their first source's memory. Both runs execute the same kernels on the same data in the same
order, so the results must be bit-identical: any kernel that overwrites ``dst`` before it has
read all of an aliased source would differ.
"""

from __future__ import annotations

import numpy as np
from helpers import run_graph, uniform

from ggmlpy import ops
from ggmlpy.alloc.gallocr import GraphAllocator
from ggmlpy.backend.interface import tensor_alloc
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import backend_cpu_init, cpu_buffer_type
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import UnaryOp
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _build(ctx):
    x = ctx.new_tensor(Type.F32, (16, 4, 6)).set_input()       # [d, heads, tokens]
    w = ctx.new_tensor(Type.F32, (16,)).set_input()
    pos = ctx.new_tensor(Type.I32, (6,)).set_input()
    h = ops.rms_norm(ctx, x, 1e-5)
    h = ops.mul(ctx, h, w)
    h = ops.rope(ctx, h, pos, 16, 0)
    h = ops.unary(ctx, h, UnaryOp.SILU)
    h = ops.scale(ctx, h, 0.5)
    h = ops.add(ctx, h, x)
    q = ops.permute(ctx, h, 0, 2, 1, 3)                          # [d, tokens, heads]
    kq = ops.mul_mat(ctx, q, q)                                  # [tokens, tokens, heads]
    kq = ops.diag_mask_inf(ctx, kq, 0)
    kq = ops.soft_max(ctx, kq)
    s = ops.sqr(ctx, kq)
    s = ops.sqrt(ctx, s)
    s = ops.unary(ctx, ops.add(ctx, s, s), UnaryOp.TANH)
    s = ops.log(ctx, ops.scale_bias(ctx, s, 1.0, 1.0))
    v = ops.cont(ctx, ops.permute(ctx, h, 1, 2, 0, 3))           # [tokens, d, heads]
    out = ops.mul_mat(ctx, ops.cont(ctx, ops.transpose(ctx, s)), v)
    out = ops.unary(ctx, out, UnaryOp.GELU_ERF).set_output()
    return x, w, pos, out


def test_results_identical_under_inplace_reuse():
    rng = np.random.default_rng(0)
    X = uniform(rng, (6, 4, 16), -2, 2)
    W = uniform(rng, (16,), 0.5, 1.5)
    P = np.arange(6, dtype=np.int32) * 3

    ctx1 = Context()
    x, w, pos, out = _build(ctx1)
    (ref,) = run_graph(ctx1, [out], {x: X, w: W, pos: P})

    ctx2 = Context()
    x, w, pos, out = _build(ctx2)
    # the inputs get their own buffer (the graph allocator leaves user-allocated tensors alone),
    # so this test exercises the kernels under in-place reuse of the intermediates only
    in_buf = cpu_buffer_type().alloc_buffer(4096)
    off = 0
    for t in (x, w, pos):
        tensor_alloc(in_buf, t, off)
        off += (t.nbytes + 63) // 64 * 64
    g = Graph()
    g.build_forward_expand(out)
    galloc = GraphAllocator(cpu_buffer_type())
    assert galloc.alloc_graph(g)
    in_place = [t for t in g.nodes if t.view_src is None and t.src and t.src[0] is not None
                and t.src[0].buffer is t.buffer and t.src[0].offset == t.offset]
    assert len(in_place) >= 5, "the allocator should run several nodes in place"
    for t, v in ((x, X), (w, W), (pos, P)):
        backend_tensor_set(t, v)
    backend_cpu_init().graph_compute(g)
    got = backend_tensor_get(out)
    galloc.free()
    in_buf.free()
    assert np.isfinite(ref).all()
    np.testing.assert_array_equal(got, ref)
