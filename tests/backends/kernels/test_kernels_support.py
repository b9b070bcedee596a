"""supports_op of the shared kernels: honest True/False per op and type combination, and the CPU
backend's refusal (UnsupportedOpError) to compute what is not supported."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import alloc_ctx

from ggmlpy import ops
from ggmlpy.backends import kernels
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.core.errors import UnsupportedOpError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _sup(t):
    return kernels.supports_op(t, np)


def test_supported_basics():
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (8, 4))
    h = ctx.new_tensor(Type.F16, (8, 4))
    i = ctx.new_tensor(Type.I32, (4,))
    assert _sup(ops.add(ctx, a, a))
    assert _sup(ops.add(ctx, h, a))                      # f16 + f32 -> f16
    assert _sup(ops.mul_mat(ctx, h, a))                  # f16 weights, f32 activations
    assert _sup(ops.get_rows(ctx, h, i))
    assert _sup(ops.cpy(ctx, a, ctx.new_tensor(Type.I32, (8, 4))))
    assert _sup(ops.transpose(ctx, a))                   # view ops compute nothing
    assert _sup(ops.arange(ctx, 0, 4, 1))


def test_unsupported_type_combinations():
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (32, 4))
    q = ctx.new_tensor(Type.Q8_0, (32, 4))
    q4 = ctx.new_tensor(Type.Q4_0, (32, 4))
    bf = ctx.new_tensor(Type.BF16, (32, 4))
    i = ctx.new_tensor(Type.I32, (32, 4))
    idx = ctx.new_tensor(Type.I32, (2,))
    assert _sup(ops.mul_mat(ctx, q, a))                  # quantized weights (issue 12)
    assert _sup(ops.mul_mat(ctx, q4, a))
    assert not _sup(ops.mul_mat(ctx, a, q))              # ... but never quantized activations
    assert not _sup(ops.mul_mat(ctx, q, ctx.new_tensor(Type.F16, (32, 4))))
    assert _sup(ops.get_rows(ctx, q, idx))
    assert _sup(ops.cpy(ctx, a, ctx.new_tensor(Type.Q8_0, (32, 4))))
    assert not _sup(ops.cpy(ctx, i, ctx.new_tensor(Type.Q8_0, (32, 4))))
    assert not _sup(ops.add(ctx, bf, bf))                # BF16 arithmetic is not implemented
    assert not _sup(ops.add(ctx, q, q))                  # nor on block types
    assert _sup(ops.cpy(ctx, a, ctx.new_tensor(Type.BF16, (32, 4))))
    assert not _sup(ops.add(ctx, i, i))                  # integer arithmetic is not implemented
    assert not _sup(ops.norm(ctx, ctx.new_tensor(Type.F16, (32, 4)), 1e-5))  # CPU: F32 only
    assert not _sup(ops.soft_max(ctx, ctx.new_tensor(Type.F16, (32, 4))))
    assert not _sup(ops.argsort(ctx, i, 0))
    # an op the kernels do not know at all
    t = ctx.new_tensor(Type.F32, (4,))
    t.op, t.src = Op.MUL_MAT, [a]                        # malformed: missing source
    assert not _sup(t)


def test_unsupported_modes_and_sources():
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (16, 4, 3))
    pos = ctx.new_tensor(Type.I32, (3,))
    r = ops.rope(ctx, a, pos, 16, 0)
    assert _sup(r)
    r.op_params[2] = 8                                   # MROPE is not implemented
    assert not _sup(r)
    sm = ops.soft_max_ext(ctx, ctx.new_tensor(Type.F32, (16, 4, 3)), None, 1.0, 0.0)
    assert _sup(sm)
    sm.src.append(ctx.new_tensor(Type.F32, (3,)))        # attention sinks are not implemented
    assert not _sup(sm)


def test_cpu_backend_refuses_unsupported_node():
    ctx = Context()
    q = ctx.new_tensor(Type.Q8_0, (32, 2))
    a = ctx.new_tensor(Type.F32, (32, 3))
    out = ops.mul_mat(ctx, a, q)  # quantized activations: no kernel
    buf = alloc_ctx(ctx)
    try:
        g = Graph()
        g.build_forward_expand(out)
        with pytest.raises(UnsupportedOpError):
            backend_cpu_init().graph_compute(g)
    finally:
        buf.free()
