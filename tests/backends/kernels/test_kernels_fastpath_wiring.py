"""The CPU kernels' float32 fast paths (GELU_ERF, GELU, NORM, SOFT_MAX without ALiBi) and the
``GGMLPY_PRECISE_KERNELS=1`` float64 referee path, each against float64 NumPy references
computed here, through real graphs on the CPU backend (plans are built after the variable is set).

Tolerances (reasons):
* GELU_ERF fast: the documented bound ``GELU_ERF_F32_BOUND * max(1, |x|)`` of
  :func:`ggmlpy.core.special.gelu_erf_f32`; precise: one float32 rounding of the float64 value
  (0.51 ulp), so within 1 ulp.
* GELU (tanh): the fast path performs the reference kernel's float32 operations in the same
  order, so the result is bit-identical to the reference formula evaluated in float32.
* NORM fast: float32 sums (pairwise mean, dot-product variance) give about ``n * 6e-8`` relative
  error in the worst case: ``rtol=atol=4e-6`` for rows of up to 384 O(1)-O(10) values. Precise:
  float64 sums as ggml: ``1e-6``.
* SOFT_MAX: a reciprocal and a multiply instead of a divide: a couple of float32 roundings,
  ``rtol=2e-6, atol=1e-7`` on values in [0, 1].
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import np_permute, run_graph, uniform

from ggmlpy import ops
from ggmlpy.backends.kernels import unary
from ggmlpy.core import env, special
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _gelu_erf64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    erfc = np.vectorize(math.erfc)
    return 0.5 * x * erfc(-x / math.sqrt(2.0))


@pytest.fixture(params=["fast", "precise"])
def precision(request, monkeypatch):
    if request.param == "precise":
        monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    else:
        monkeypatch.delenv(env.PRECISE_KERNELS, raising=False)
    return request.param


# ---------------------------------------------------------------------------------------------
# GELU_ERF / GELU


@pytest.mark.parametrize("shape,layout", [((1536, 40), "contiguous"), ((7, 3, 2), "contiguous"),
                                          ((70_001,), "contiguous"), ((16, 9, 4), "permuted")])
def test_gelu_erf_kernel_error_bound(precision, shape, layout):
    rng = np.random.default_rng(len(shape) * 7 + shape[0])
    ctx = Context()
    base = ctx.new_tensor(Type.F32, shape)
    a = ops.permute(ctx, base, 0, 2, 1, 3) if layout == "permuted" else base
    out = ops.gelu_erf(ctx, a)
    X = uniform(rng, base.ne[::-1], -9, 9)
    X.reshape(-1)[:4] = [0.0, -30.5, 31.0, 1.19]
    (got,) = run_graph(ctx, [out], {base: X})
    src = np_permute(X.reshape(base.ne[::-1]), (0, 2, 1, 3)) \
        if layout == "permuted" else X
    src = src.reshape(got.shape)
    ref = _gelu_erf64(src)
    err = np.abs(got.astype(np.float64) - ref)
    if precision == "fast" and layout == "contiguous":
        assert np.all(err <= special.GELU_ERF_F32_BOUND * np.maximum(1.0, np.abs(src)))
    else:  # float64 formula rounded once (the non-contiguous input takes the referee path)
        ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
        assert np.all(err <= ulp)


def test_gelu_erf_precise_path_is_the_float64_referee(monkeypatch):
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    rng = np.random.default_rng(3)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (300, 11))
    X = uniform(rng, a.ne[::-1], -7, 7)
    (got,) = run_graph(ctx, [ops.gelu_erf(ctx, a)], {a: X})
    got = got.reshape(X.shape)
    np.testing.assert_array_equal(got, special.gelu_erf(X))


def test_gelu_erf_fast_and_precise_differ_only_within_the_bound(monkeypatch):
    # the two paths are really different code (the switch is live) yet agree within the bound
    rng = np.random.default_rng(4)
    X = uniform(rng, (50, 2000), -6, 6)
    res = {}
    for v in ("0", "1"):
        monkeypatch.setenv(env.PRECISE_KERNELS, v)
        ctx = Context()
        a = ctx.new_tensor(Type.F32, (2000, 50))
        (r,) = run_graph(ctx, [ops.gelu_erf(ctx, a)], {a: X})
        res[v] = r.reshape(X.shape)
    d = np.abs(res["0"].astype(np.float64) - res["1"])
    assert d.max() > 0.0
    assert np.all(d <= 2 * special.GELU_ERF_F32_BOUND * np.maximum(1.0, np.abs(X)))


@pytest.mark.parametrize("n", [1, 5, 32_768, 32_769, 100_000])
def test_gelu_tanh_fast_path_bit_identical_to_reference_formula(n, monkeypatch):
    # the f16-table variant (ggml-cpu's GELU, the default) steps aside under PRECISE_KERNELS and
    # the chunked float32 formula computes: that path is the one checked here
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    rng = np.random.default_rng(n)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (n,))
    X = uniform(rng, (n,), -12, 12)
    (got,) = run_graph(ctx, [ops.gelu(ctx, a)], {a: X})
    got = got.reshape(X.shape)
    np.testing.assert_array_equal(got, unary._act_gelu(np, X))
    x = X.astype(np.float64)
    ref = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_gelu_inplace_fast_path(monkeypatch):
    # the float32 formula's variant (under PRECISE_KERNELS; by default the f16 table computes)
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    rng = np.random.default_rng(9)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (40_000,))
    X = uniform(rng, (40_000,), -5, 5)
    (got,) = run_graph(ctx, [ops.gelu_erf(ctx, ops.gelu(ctx, a))], {a: X})
    got = got.reshape(X.shape)
    g = unary._act_gelu(np, X)
    ref = _gelu_erf64(g)
    assert np.all(np.abs(got - ref) <= special.GELU_ERF_F32_BOUND * np.maximum(1.0, np.abs(g)))


# ---------------------------------------------------------------------------------------------
# NORM


def _norm64(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


@pytest.mark.parametrize("n,rows,offset", [(384, 300, 0.0), (384, 7, 50.0), (1, 3, 0.0),
                                           (33, 40, -3.0), (1536, 5, 1.0)])
def test_norm_fast_and_precise_against_float64(precision, n, rows, offset):
    rng = np.random.default_rng(n + rows)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (n, rows))
    eps = 1e-12
    X = (uniform(rng, (rows, n), -10, 10) + np.float32(offset)).astype(np.float32)
    (got,) = run_graph(ctx, [ops.norm(ctx, a, eps)], {a: X})
    tol = 4e-6 if precision == "fast" else 1e-6
    if n == 1:  # x - mean is 0 exactly: 0 * 1/sqrt(eps)
        np.testing.assert_array_equal(got, 0.0)
        return
    np.testing.assert_allclose(got.reshape(X.shape), _norm64(X, eps), rtol=tol, atol=tol)


def test_norm_fast_path_on_strided_rows():
    rng = np.random.default_rng(11)
    ctx = Context()
    base = ctx.new_tensor(Type.F32, (64, 4, 5, 3))
    a = ops.permute(ctx, base, 0, 2, 1, 3)
    B = uniform(rng, base.ne[::-1], -10, 10)
    (got,) = run_graph(ctx, [ops.norm(ctx, a, 1e-5)], {base: B})
    np.testing.assert_allclose(got, _norm64(np_permute(B, (0, 2, 1, 3)), 1e-5),
                               rtol=4e-6, atol=4e-6)


# ---------------------------------------------------------------------------------------------
# SOFT_MAX


def _soft_max64(x, mask, scale, slopes=None):
    w = x.astype(np.float64) * scale
    if mask is not None:
        w = w + (mask if slopes is None else slopes * mask)
    w = w - w.max(axis=-1, keepdims=True)
    e = np.exp(w)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("ne,mne", [((40, 40, 12, 8), (40, 64, 1, 8)),     # BERT: per sequence
                                    ((16, 5, 6, 4), (16, 5, 3, 2)),        # tiles dims 2 and 3
                                    ((16, 5, 6, 4), (16, 8, 6, 1)),        # extra mask rows
                                    ((9, 3, 2, 1), None)])
@pytest.mark.parametrize("mask_type", [Type.F32, Type.F16])
def test_soft_max_fast_path_against_float64(ne, mne, mask_type):
    rng = np.random.default_rng(sum(ne))
    ctx = Context()
    a = ctx.new_tensor(Type.F32, ne)
    m = None if mne is None else ctx.new_tensor(mask_type, mne)
    scale = 0.125
    out = ops.soft_max_ext(ctx, a, m, scale, 0.0)
    X = uniform(rng, ne[::-1], -8, 8)
    inputs = {a: X}
    ref_mask = None
    if m is not None:
        M = uniform(rng, mne[::-1], -2, 2)
        M[..., 1] = -np.inf                       # a masked key in every row
        M = M.astype(mask_type.dtype)
        inputs[m] = M
        rows = M[:, :, :ne[1], :].astype(np.float64)
        ref_mask = np.tile(rows, (ne[3] // mne[3], ne[2] // mne[2], 1, 1))
    (got,) = run_graph(ctx, [out], inputs)
    ref = _soft_max64(X, ref_mask, scale)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-7)
    if m is not None:
        assert np.all(got[..., 1] == 0.0)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=2e-6)


def test_soft_max_alibi_keeps_the_reference_path():
    # max_bias > 0: per-head slopes multiply the mask (not the fast path); checked against float64
    rng = np.random.default_rng(5)
    ne, mne = (8, 4, 4, 1), (8, 4, 1, 1)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, ne)
    m = ctx.new_tensor(Type.F32, mne)
    out = ops.soft_max_ext(ctx, a, m, 0.5, 8.0)
    X, M = uniform(rng, ne[::-1], -3, 3), uniform(rng, mne[::-1], -3, 3)
    (got,) = run_graph(ctx, [out], {a: X, m: M})
    slopes = np.array([2.0 ** (-8.0 / 4 * (h + 1)) for h in range(4)]).reshape(1, 4, 1, 1)
    np.testing.assert_allclose(got, _soft_max64(X, M.astype(np.float64), 0.5, slopes),
                               rtol=2e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# the variable


@pytest.mark.parametrize("value,expected", [("0", False), ("1", True), (" 1 ", True), ("", False)])
def test_precise_kernels_variable_parses(monkeypatch, value, expected):
    monkeypatch.setenv(env.PRECISE_KERNELS, value)
    env.validate()
    assert env.precise_kernels() is expected


@pytest.mark.parametrize("value", ["2", "yes", "true", "-1"])
def test_precise_kernels_variable_rejects(monkeypatch, value):
    monkeypatch.setenv(env.PRECISE_KERNELS, value)
    with pytest.raises(env.EnvError, match="GGMLPY_PRECISE_KERNELS"):
        env.validate()


# ---------------------------------------------------------------------------------------------
# MUL_MAT: batched products with a transposed src0 view (attention) go through copy + NN


@pytest.mark.parametrize("blas", ["numpy", "mkl"])
@pytest.mark.parametrize("blas_one", [False, True])
@pytest.mark.parametrize("L", [8, 31, 32, 48])
@pytest.mark.parametrize("pattern", ["kq", "kqv"])
def test_batched_mul_mat_with_transposed_views(L, pattern, blas_one, blas, monkeypatch):
    """NumPy's matmul: copy + NN when it pays (BLAS multi-threaded); with BLAS at one thread (a
    threaded CPU plan's hold, or the environment) the transposed view goes to BLAS as it is. MKL
    (``GGMLPY_BLAS=mkl``): one ``cblas_sgemm_batch`` over the views as they lie, never a copy.
    Same results every way. On a one-thread backend (a batched plan on more threads always
    holds BLAS at one thread: tests/backends/cpu/test_placement_bits.py)."""
    from ggmlpy.backends.cpu import blas as cpu_blas
    from ggmlpy.backends.kernels import matmul

    monkeypatch.setenv("GGMLPY_BLAS", blas)
    # the generic kernel under test: the CPU's ggml-order F32 variant (a computed src0) steps aside
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    if blas == "mkl":
        _need_mkl(cpu_blas)
    calls = []
    scratch = matmul._scratch  # only the copy + NN path takes a scratch
    monkeypatch.setattr(matmul, "BLAS_ONE_THREAD", [blas_one])
    monkeypatch.setattr(matmul, "_scratch", lambda *a: (calls.append(1), scratch(*a))[1])
    rng = np.random.default_rng(L)
    d, nh, S = 8, 3, 2
    ctx = Context()
    qkv = ctx.new_tensor(Type.F32, (d * nh, L, S))           # [H, L, S] like BERT's Q/K/V
    kq_in = ctx.new_tensor(Type.F32, (L, L, nh, S))
    x = ops.permute(ctx, ops.reshape_4d(ctx, qkv, d, nh, L, S), 0, 2, 1, 3)   # [d, L, nh, S]
    X = uniform(rng, qkv.ne[::-1], -1, 1)
    xn = X.astype(np.float64).reshape(S, L, nh, d).transpose(0, 2, 1, 3)        # (S, nh, L, d)
    if pattern == "kq":
        out = ops.mul_mat(ctx, x, x)                          # src0 viewed transposed per head
        ref = xn @ xn.swapaxes(-1, -2)
        inputs = {qkv: X}
    else:
        vt = ops.cont(ctx, ops.transpose(ctx, x))             # [L, d, nh, S] contiguous
        out = ops.mul_mat(ctx, vt, kq_in)                     # src0^T is an F-order view
        K = uniform(rng, kq_in.ne[::-1], 0, 1)
        ref = K.astype(np.float64) @ xn
        inputs = {qkv: X, kq_in: K}
    from helpers import _backend

    be = _backend()
    n0 = be.n_threads
    be.set_n_threads(1)
    try:
        (got,) = run_graph(ctx, [out], inputs)
    finally:
        be.set_n_threads(n0)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * L)
    assert bool(calls) == (blas == "numpy" and L >= matmul.NN_MIN_ROWS and not blas_one)


def _need_mkl(cpu_blas):
    try:
        cpu_blas.load_mkl()
    except Exception as e:  # noqa: BLE001 - BackendUnavailableError
        pytest.skip(f"MKL not installed (the mkl extra): {e}")
