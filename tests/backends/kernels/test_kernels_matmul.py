"""Numeric tests of MUL_MAT and OUT_PROD on the CPU backend against float64 NumPy references
(explicit loops over the batch dims with ggml's block-repeat broadcast ``k // r``).

Tolerance: float32 GEMM (BLAS) of K-term dot products with U(-1, 1) inputs: the error is about
``sqrt(K) * 2^-24 * |a||b|``; we use ``atol = 2e-6 * sqrt(K)`` and ``rtol = 1e-5`` (for K <= 300
that is <= 3.5e-5 absolute on results of size ~sqrt(K/9)). F16 inputs are exact in float32, so
the same tolerance applies after converting the inputs in the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import np_permute, run_graph, uniform

from ggmlpy import ops
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _tol(k):
    return dict(rtol=1e-5, atol=2e-6 * np.sqrt(k))


def _mul_mat_ref(A, B):
    """A (A3, A2, M, K), B (B3, B2, N, K) -> (B3, B2, N, M) with a[k // r2, l // r3]."""
    A3, A2, M, K = A.shape
    B3, B2, N, _ = B.shape
    r2, r3 = B2 // A2, B3 // A3
    out = np.zeros((B3, B2, N, M))
    for l in range(B3):
        for k in range(B2):
            a = A[l // r3, k // r2].astype(np.float64)
            b = B[l, k].astype(np.float64)
            for j in range(N):
                for i in range(M):
                    out[l, k, j, i] = np.dot(a[i], b[j])
    return out


# (m, n, k, bs (a dims 2/3), nr (repeat factors: b = bs * nr))
_CASES = [
    (16, 1, 256, (1, 1), (1, 1)),
    (7, 9, 65, (1, 1), (1, 1)),
    (5, 4, 32, (3, 2), (1, 1)),
    (5, 4, 32, (1, 1), (4, 3)),
    (6, 3, 16, (2, 1), (2, 1)),
    (6, 3, 16, (2, 3), (2, 2)),
    (1, 8, 40, (1, 2), (3, 1)),
]


@pytest.mark.parametrize("m,n,k,bs,nr", _CASES)
@pytest.mark.parametrize("type_a", [Type.F32, Type.F16])
def test_mul_mat_broadcast(m, n, k, bs, nr, type_a):
    rng = np.random.default_rng(m * 100 + n + k)
    ctx = Context()
    a = ctx.new_tensor(type_a, (k, m, bs[0], bs[1]))
    b = ctx.new_tensor(Type.F32, (k, n, bs[0] * nr[0], bs[1] * nr[1]))
    out = ops.mul_mat(ctx, a, b)
    A = uniform(rng, a.ne[::-1], dtype=type_a.dtype)
    B = uniform(rng, b.ne[::-1])
    (r,) = run_graph(ctx, [out], {a: A, b: B})
    assert r.dtype == np.float32 and r.shape == (b.ne[3], b.ne[2], n, m)
    # an F16 weight rounds src1 to f16 first (ggml's vec_dot_type), on the dot kernels
    # (ggmlpy/backends/cpu/qmatmul.py) and on the GEMM path (ggmlpy/backends/cpu/qgemm.py)
    Bref = B.astype(np.float16).astype(np.float32) if type_a == Type.F16 else B
    np.testing.assert_allclose(r, _mul_mat_ref(A, Bref), **_tol(k))


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)])
def test_mul_mat_permuted_operands(perm):
    # both operands permuted in dims 1..3 (rows stay contiguous), as test-backend-ops' `per`
    rng = np.random.default_rng(sum(perm))
    ctx = Context()
    ne_a, ne_b = (24, 5, 2, 3), (24, 4, 4, 3)
    inv = [0] * 4
    for i, p in enumerate(perm):
        inv[p] = i

    def stored(ne):
        return tuple(ne[perm[i]] for i in range(4))

    a_base = ctx.new_tensor(Type.F32, stored(ne_a))
    b_base = ctx.new_tensor(Type.F32, stored(ne_b))
    a = ops.permute(ctx, a_base, *inv)
    b = ops.permute(ctx, b_base, *inv)
    assert a.ne == ne_a and b.ne == ne_b
    out = ops.mul_mat(ctx, a, b)
    Ab = uniform(rng, a_base.ne[::-1])
    Bb = uniform(rng, b_base.ne[::-1])
    (r,) = run_graph(ctx, [out], {a_base: Ab, b_base: Bb})
    ref = _mul_mat_ref(np_permute(Ab, inv), np_permute(Bb, inv))
    np.testing.assert_allclose(r, ref, **_tol(24))


def test_mul_mat_strided_rows_and_f16_b():
    rng = np.random.default_rng(21)
    ctx = Context()
    a_full = ctx.new_tensor(Type.F32, (40, 6, 2))
    a = ops.view_3d(ctx, a_full, 32, 6, 2, a_full.nb[1], a_full.nb[2], 8 * 4)  # k_v > k rows
    b = ctx.new_tensor(Type.F16, (32, 5, 4))
    out = ops.mul_mat(ctx, a, b)
    AF = uniform(rng, a_full.ne[::-1])
    B = uniform(rng, b.ne[::-1], dtype=np.float16)
    (r,) = run_graph(ctx, [out], {a_full: AF, b: B})
    np.testing.assert_allclose(r, _mul_mat_ref(AF[..., 8:40], B), **_tol(32))


def _out_prod_ref(A, B):
    """A (A3, A2, K, Ma), B (B3, B2, K, Nb) -> (B3, B2, Nb, Ma): out[.., i1, i0] = sum_k a[k, i0] b[k, i1]."""
    A3, A2, K, Ma = A.shape
    B3, B2, _, Nb = B.shape
    r2, r3 = B2 // A2, B3 // A3
    out = np.zeros((B3, B2, Nb, Ma))
    for l in range(B3):
        for k in range(B2):
            a = A[l // r3, k // r2].astype(np.float64)
            b = B[l, k].astype(np.float64)
            for i1 in range(Nb):
                for i0 in range(Ma):
                    out[l, k, i1, i0] = sum(a[kk, i0] * b[kk, i1] for kk in range(K))
    return out


@pytest.mark.parametrize("bs,nr", [((1, 1), (1, 1)), ((2, 1), (2, 3)), ((1, 2), (3, 1))])
def test_out_prod(bs, nr):
    rng = np.random.default_rng(7 + sum(bs) + sum(nr))
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (6, 16, bs[0], bs[1]))
    b = ctx.new_tensor(Type.F32, (5, 16, bs[0] * nr[0], bs[1] * nr[1]))
    out = ops.out_prod(ctx, a, b)
    A = uniform(rng, a.ne[::-1])
    B = uniform(rng, b.ne[::-1])
    (r,) = run_graph(ctx, [out], {a: A, b: B})
    assert r.shape == (b.ne[3], b.ne[2], 5, 6)
    np.testing.assert_allclose(r, _out_prod_ref(A, B), **_tol(16))


def test_out_prod_f16_a():
    rng = np.random.default_rng(31)
    ctx = Context()
    a = ctx.new_tensor(Type.F16, (6, 16, 2))
    b = ctx.new_tensor(Type.F32, (5, 16, 2))
    out = ops.out_prod(ctx, a, b)
    A = uniform(rng, a.ne[::-1], dtype=np.float16)
    B = uniform(rng, b.ne[::-1])
    (r,) = run_graph(ctx, [out], {a: A, b: B})
    np.testing.assert_allclose(r, _out_prod_ref(A, B), **_tol(16))  # f16 values exact in f32
