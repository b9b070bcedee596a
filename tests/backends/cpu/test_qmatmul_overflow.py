"""Activations the vec_dot type cannot hold: ggml-cpu rounds src1 to Q8_0/Q8_1 blocks with f16
scales (or to f16 for an F16 weight), so finite activations above ~8.3e6 (65504 for F16) give
inf/NaN products there. ggmlpy computes such a product exactly instead: every type with a dot
kernel, through a CPU graph and through the kernel module, against a float64 product."""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy.backends.cpu import qmatmul
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize, quantize

TYPES = [Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K, Type.Q6_K,
         Type.F16, Type.BF16]


def _weight(t: Type, M: int, K: int, rng) -> tuple[np.ndarray, np.ndarray]:
    w = rng.standard_normal((M, K)).astype(np.float32)
    if t == Type.F16:
        raw = w.astype(np.float16)
    else:
        raw = np.frombuffer(quantize(w, t), np.uint8).reshape(M, -1)
    if t == Type.BF16:
        raw = raw.view(np.uint16)
    return raw, dequantize(np.ascontiguousarray(raw), t, (K, M)).astype(np.float64)


@pytest.mark.parametrize("scale", [1.0, 1e5, 1e7, 1e12])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_large_activations_give_the_exact_product(t, scale):
    rng = np.random.default_rng(7)
    K, M, N = 256, 6, 3
    raw, wd = _weight(t, M, K, rng)
    x = (rng.standard_normal((N, K)) * scale).astype(np.float32)
    ref = x.astype(np.float64) @ wd.T
    out = np.empty((N, M), np.float32)
    qmatmul.prepare(t, raw, x, out)()
    assert np.isfinite(out).all()
    # activations src1's type cannot hold: the exact float32 product; otherwise ggml's rounding of
    # src1 (8-bit blocks: ~1/127 of each block's maximum; f16: 11-bit, bf16: 8-bit mantissas)
    overflows = (t in (Type.F16,) and scale >= 1e5) or \
        (qmatmul.VEC_DOT_TYPE[t] in ("q8_0", "q8_1") and scale >= 1e7)
    tol = 1e-5 if overflows else {"f16": 1e-2, "bf16": 5e-2}.get(qmatmul.VEC_DOT_TYPE[t], 5e-2)
    assert np.abs(out - ref).max() <= tol * np.abs(ref).max()
    np.testing.assert_array_equal(qmatmul.mul_mat(t, raw, x), out)


def test_graph_mul_mat_with_huge_activations_is_finite():
    # the example: a Q8_0 weight (one token, below the batch crossover) and activations of 1e8
    rng = np.random.default_rng(3)
    K, M = 64, 4
    be = gp.backend_cpu_init()
    wctx = gp.Context()
    w = wctx.new_tensor_2d(Type.Q8_0, K, M)
    x = wctx.new_tensor_2d(Type.F32, K, 1)
    buf = gp.backend_alloc_ctx_tensors(wctx, be)
    buf.set_usage(gp.BufferUsage.WEIGHTS)
    wf = rng.standard_normal((M, K)).astype(np.float32)
    gp.backend_tensor_set(w, np.frombuffer(quantize(wf, Type.Q8_0), np.uint8))
    xv = (rng.standard_normal((1, K)) * 1e8).astype(np.float32)
    gp.backend_tensor_set(x, xv)
    ctx = gp.Context()
    y = gp.mul_mat(ctx, w, x)
    g = gp.Graph()
    g.build_forward_expand(y)
    gp.GraphAllocator(be.get_default_buffer_type()).alloc_graph(g)
    be.graph_compute(g)
    got = gp.backend_tensor_get(y).reshape(1, M)
    wd = dequantize(quantize(wf, Type.Q8_0), Type.Q8_0, (K, M)).astype(np.float64)
    ref = xv.astype(np.float64) @ wd.T
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
