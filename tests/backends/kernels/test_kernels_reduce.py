"""Numeric tests of SUM, SUM_ROWS, MEAN, ARGMAX and ARGSORT on the CPU backend against float64
NumPy references.

Tolerances: sums are accumulated in float64 and rounded once to float32 (rtol 2e-7, one
rounding); index results must match exactly (inputs have unique values, so there are no ties
except in the explicit ARGMAX tie test).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import np_permute, run_graph, uniform

from ggmlpy import ops
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.ops import SortOrder


@pytest.mark.parametrize("permuted", [False, True])
def test_sum_sum_rows_mean(permuted):
    rng = np.random.default_rng(1)
    ctx = Context()
    base = ctx.new_tensor(Type.F32, (33, 5, 4, 3))
    a = ops.permute(ctx, base, 1, 0, 3, 2) if permuted else base
    s = ops.sum(ctx, a)
    sr = ops.sum_rows(ctx, a)
    m = ops.mean(ctx, a)
    B = uniform(rng, base.ne[::-1], -0.9, 1.1)
    rs, rsr, rm = run_graph(ctx, [s, sr, m], {base: B})
    A = (np_permute(B, (1, 0, 3, 2)) if permuted else B).astype(np.float64)
    assert rs.shape == (1, 1, 1, 1) and rsr.shape == A.shape[:3] + (1,)
    # float64 accumulation, one rounding to float32
    np.testing.assert_allclose(rs.reshape(()), A.sum(), rtol=2e-7)
    np.testing.assert_allclose(rsr, A.sum(axis=-1, keepdims=True), rtol=2e-7, atol=1e-7)
    np.testing.assert_allclose(rm, A.mean(axis=-1, keepdims=True), rtol=2e-7, atol=1e-7)


def test_sum_f16():
    rng = np.random.default_rng(2)
    ctx = Context()
    a = ctx.new_tensor(Type.F16, (40, 3))
    s = ops.sum(ctx, a)
    sr = ops.sum_rows(ctx, a)
    A = uniform(rng, a.ne[::-1], dtype=np.float16)
    rs, rsr = run_graph(ctx, [s, sr], {a: A})
    assert rs.dtype == np.float16
    # exact sum of f16 values, one rounding to f16 (2^-11 relative) plus a little absolute slack
    np.testing.assert_allclose(rs.astype(np.float64).reshape(()), A.astype(np.float64).sum(),
                               rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(rsr.astype(np.float64), A.astype(np.float64).sum(-1, keepdims=True),
                               rtol=1e-3, atol=1e-3)


def test_argmax_unique_and_last_of_ties():
    rng = np.random.default_rng(3)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (17, 6))
    t = ctx.new_tensor(Type.F32, (5, 3))
    am = ops.argmax(ctx, a)
    at = ops.argmax(ctx, t)
    A = np.stack([rng.permutation(17) for _ in range(6)]).astype(np.float32)
    T = np.array([[1, 3, 3, 0, 2], [5, 5, 5, 5, 5], [0, 1, 2, 3, 4]], np.float32)
    ra, rt = run_graph(ctx, [am, at], {a: A, t: T})
    assert ra.dtype == np.int32
    np.testing.assert_array_equal(ra.reshape(-1), [int(np.where(r == r.max())[0][-1]) for r in A])
    # ggml returns the LAST index among equal maxima
    np.testing.assert_array_equal(rt.reshape(-1), [2, 4, 4])


@pytest.mark.parametrize("order", [SortOrder.ASC, SortOrder.DESC])
def test_argsort(order):
    rng = np.random.default_rng(4)
    ctx = Context()
    base = ctx.new_tensor(Type.F32, (16, 3, 2))
    a = ops.transpose(ctx, ops.cont(ctx, ops.transpose(ctx, base)))  # strided rows
    out = ops.argsort(ctx, a, order)
    B = np.stack([rng.permutation(16) for _ in range(6)]).astype(np.float32).reshape(2, 3, 16)
    B = B / 4 - 2
    (r,) = run_graph(ctx, [out], {base: B})
    assert r.dtype == np.int32
    ref = np.array([sorted(range(16), key=lambda i, row=row: row[i], reverse=bool(order))
                    for row in B.reshape(-1, 16)]).reshape(1, 2, 3, 16)
    np.testing.assert_array_equal(r, ref)
