"""Numeric tests of NORM, RMS_NORM, GROUP_NORM and L2_NORM on the CPU backend against float64
NumPy references (plain formulas).

Tolerance: RMS/L2/GROUP_NORM accumulate sums in float64 like ggml's CPU, then apply a float32
scale: the result carries ~3 float32 roundings (centre, scale, product), so ``rtol=1e-6`` with
``atol=1e-6`` for values near 0 (inputs are O(1)-O(10), outputs O(1)). NORM's default float32
sums (rows of 64 here: about 64 * 6e-8 relative at worst, typically 8 * 6e-8) also stay within
it; tests/test_kernels_fastpath_wiring.py checks both NORM paths on longer rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import np_permute, run_graph, uniform

from ggmlpy import ops
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

_TOL = dict(rtol=1e-6, atol=1e-6)


def _norm_ref(x, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def _rms_ref(x, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def _l2_ref(x, eps):
    return x / np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), eps)


@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.1, 10.0])
@pytest.mark.parametrize("layout", ["contiguous", "permuted", "view"])
def test_norm_rms_l2(eps, layout):
    rng = np.random.default_rng(int(eps * 100) + len(layout))
    ctx = Context()
    if layout == "contiguous":
        base = ctx.new_tensor(Type.F32, (64, 5, 4, 3))
        a = base
    elif layout == "permuted":
        base = ctx.new_tensor(Type.F32, (64, 4, 5, 3))
        a = ops.permute(ctx, base, 0, 2, 1, 3)             # rows contiguous, dims 1/2 swapped
    else:
        base = ctx.new_tensor(Type.F32, (70, 5, 4, 3))
        a = ops.view_4d(ctx, base, 64, 5, 4, 3, base.nb[1], base.nb[2], base.nb[3], 12)
    outs = [ops.norm(ctx, a, eps), ops.rms_norm(ctx, a, eps), ops.l2_norm(ctx, a, eps)]
    B = uniform(rng, base.ne[::-1], -10, 10)
    rn, rr, rl = run_graph(ctx, outs, {base: B})
    if layout == "contiguous":
        X = B
    elif layout == "permuted":
        X = np_permute(B, (0, 2, 1, 3))
    else:
        X = B[..., 3:67]
    X = X.astype(np.float64)
    np.testing.assert_allclose(rn, _norm_ref(X, np.float32(eps)), **_TOL)
    np.testing.assert_allclose(rr, _rms_ref(X, np.float32(eps)), **_TOL)
    np.testing.assert_allclose(rl, _l2_ref(X, np.float32(eps)), **_TOL)


def test_norm_inplace_variants():
    rng = np.random.default_rng(3)
    ctx = Context()
    a0 = ctx.new_tensor(Type.F32, (33, 6))
    outs = [ops.norm_inplace(ctx, ops.cont(ctx, a0), 1e-5),
            ops.rms_norm_inplace(ctx, ops.cont(ctx, a0), 1e-5),
            ops.l2_norm_inplace(ctx, ops.cont(ctx, a0), 1e-5)]
    A = uniform(rng, a0.ne[::-1], -3, 3)
    rn, rr, rl = run_graph(ctx, outs, {a0: A})
    X = A.astype(np.float64)
    eps = np.float32(1e-5)
    np.testing.assert_allclose(rn, _norm_ref(X, eps), **_TOL)
    np.testing.assert_allclose(rr, _rms_ref(X, eps), **_TOL)
    np.testing.assert_allclose(rl, _l2_ref(X, eps), **_TOL)


@pytest.mark.parametrize("ne,groups", [((6, 5, 32, 2), 8), ((4, 3, 10, 1), 4), ((5, 5, 7, 2), 3)])
def test_group_norm(ne, groups):
    rng = np.random.default_rng(sum(ne))
    ctx = Context()
    a = ctx.new_tensor(Type.F32, ne)
    out = ops.group_norm(ctx, a, groups, 1e-6)
    A = uniform(rng, a.ne[::-1], -2, 2)
    (r,) = run_graph(ctx, [out], {a: A})
    X = A.astype(np.float64)            # (ne3, ne2 = channels, ne1, ne0)
    ne2 = ne[2]
    cpg = -(-ne2 // groups)             # ceil(ne2 / groups) channels per group, last may be short
    ref = np.empty_like(X)
    for i3 in range(ne[3]):
        for g0 in range(0, ne2, cpg):
            blk = X[i3, g0:g0 + cpg]
            mean = blk.mean()
            var = ((blk - mean) ** 2).mean()
            ref[i3, g0:g0 + cpg] = (blk - mean) / np.sqrt(var + np.float32(1e-6))
    np.testing.assert_allclose(r, ref, **_TOL)
