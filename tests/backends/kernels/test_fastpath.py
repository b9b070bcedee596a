"""Fast float32 kernels: :func:`ggmlpy.core.special.gelu_erf_f32` (documented error bound on a dense
grid) and :mod:`ggmlpy.backends.cpu.fastpath` (NORM, masked SOFT_MAX, bias + residual ADD, GELU_ERF)
against float64 NumPy references computed here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ggmlpy.backends.cpu import fastpath
from ggmlpy.core import special


def _gelu64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * np.array([math.erfc(-v / math.sqrt(2.0)) for v in x.ravel()]).reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# gelu_erf_f32


def test_gelu_erf_f32_bound_dense_grid() -> None:
    # every float32 in [-8, 8] at a 2^-13 step plus a coarser sweep to +-40 (where the erfc term
    # underflows); the referee is the float64 path (0.51 ulp, itself checked against math.erfc)
    x = np.concatenate([np.arange(-8.0, 8.0, 2.0 ** -13), np.linspace(-40.0, 40.0, 200_001),
                        [0.0, -0.0, 1e-38, -1e-38, 1e-6, -1e-6, 3e38, -3e38]]).astype(np.float32)
    ref = 0.5 * x.astype(np.float64) * special.erfc(-x.astype(np.float64) / math.sqrt(2.0))
    got = special.gelu_erf_f32(x).astype(np.float64)
    err = np.abs(got - ref)
    assert np.all(err <= special.GELU_ERF_F32_BOUND * np.maximum(1.0, np.abs(x)))
    # the bound is not loose by orders of magnitude (it documents the real error)
    assert (err / np.maximum(1.0, np.abs(x))).max() > 0.25 * special.GELU_ERF_F32_BOUND


def test_gelu_erf_f32_referee_spot_checks() -> None:
    x = np.array([-6.0, -3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.5, 7.0], dtype=np.float32)
    err = np.abs(special.gelu_erf_f32(x) - _gelu64(x))
    assert np.all(err <= special.GELU_ERF_F32_BOUND * np.maximum(1.0, np.abs(x)))


def test_gelu_erf_f32_special_values() -> None:
    got = special.gelu_erf_f32(np.array([np.inf, -np.inf, np.nan, 31.0, -31.0], np.float32))
    assert got[0] == np.inf and got[1] == 0.0 and np.isnan(got[2])
    assert got[3] == np.float32(31.0) and got[4] == 0.0


@pytest.mark.parametrize("n,chunk", [(1, 7), (6, 7), (7, 7), (50, 7), (1000, 33), (70_000, 1 << 15)])
def test_gelu_erf_f32_chunks_and_in_place(n: int, chunk: int) -> None:
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    want = special.gelu_erf_f32(x.copy(), chunk=1 << 20)
    assert np.array_equal(special.gelu_erf_f32(x, chunk=chunk), want)
    y = x.copy()
    assert special.gelu_erf_f32(y, out=y, chunk=chunk) is y
    assert np.array_equal(y, want)
    err = np.abs(want.astype(np.float64) - _gelu64(x))
    assert np.all(err <= special.GELU_ERF_F32_BOUND * np.maximum(1.0, np.abs(x)))


def test_gelu_erf_f32_shape_and_errors() -> None:
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    assert special.gelu_erf_f32(x).shape == (2, 3, 4)
    with pytest.raises(ValueError, match="out"):
        special.gelu_erf_f32(x, out=np.empty((24,), np.float32))
    with pytest.raises(ValueError, match="out"):
        special.gelu_erf_f32(x, out=np.empty((2, 3, 4), np.float64))
    with pytest.raises(ValueError, match="chunk"):
        special.gelu_erf_f32(x, chunk=0)


# ---------------------------------------------------------------------------------------------
# fastpath


def _norm64(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps)


@pytest.mark.parametrize("shape", [(1, 1), (5, 384), (1152, 384), (3, 4, 7), (2, 1, 3, 1536)])
@pytest.mark.parametrize("eps", [1e-12, 1e-5])
def test_norm_matches_float64(shape: tuple[int, ...], eps: float) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 4 + 2).astype(np.float32)
    out = np.empty_like(x)
    assert fastpath.norm(np, x, eps, out) is out
    ref = _norm64(x, eps)
    # float32 pairwise sums over n <= 1536: a few float32 ulps of the O(1) result
    assert np.max(np.abs(out - ref)) <= 2e-6
    y = x.copy()
    fastpath.norm(np, y, eps, y)                     # in place
    assert np.max(np.abs(y - ref)) <= 2e-6


def test_norm_strided_input_and_errors() -> None:
    rng = np.random.default_rng(1)
    big = rng.standard_normal((6, 20)).astype(np.float32)
    x = big[::2, 3:15]                               # non-contiguous rows
    out = np.empty(x.shape, np.float32)
    fastpath.norm(np, x, 1e-5, out)
    assert np.max(np.abs(out - _norm64(x, 1e-5))) <= 2e-6
    with pytest.raises(ValueError, match="norm: out"):
        fastpath.norm(np, x, 1e-5, np.empty((3, 11), np.float32))


def _softmax64(x: np.ndarray, mask: np.ndarray | None, scale: float) -> np.ndarray:
    w = x.astype(np.float64) * scale
    if mask is not None:
        w = w + mask.astype(np.float64)
    w = w - w.max(axis=-1, keepdims=True)
    e = np.exp(w)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("S,H,L", [(1, 1, 1), (2, 12, 9), (32, 12, 36), (3, 2, 70)])
@pytest.mark.parametrize("mask_dtype", [np.float32, np.float16, None])
def test_soft_max_matches_float64(S: int, H: int, L: int, mask_dtype) -> None:
    rng = np.random.default_rng(S * 100 + L)
    x = (rng.standard_normal((S, H, L, L)) * 5).astype(np.float32)
    mask = None
    if mask_dtype is not None:
        lens = rng.integers(1, L + 1, size=S)
        m = np.where(np.arange(L)[None, :] < lens[:, None], 0.0, -np.inf)
        m = m + np.where(np.isfinite(m), rng.standard_normal((S, L)) * 0.5, 0.0)
        mask = m.astype(mask_dtype)[:, None, None, :]  # broadcast over heads and query rows
    out = np.empty_like(x)
    fastpath.soft_max(np, x, mask, 0.125, out)
    ref = _softmax64(x, mask, 0.125)
    assert np.max(np.abs(out - ref)) <= 5e-7
    if mask is not None:
        assert np.all(out[np.broadcast_to(np.isneginf(mask), out.shape)] == 0.0)
    fastpath.soft_max(np, x, mask, 0.125, x)          # in place
    assert np.array_equal(x, out)


def test_soft_max_fully_masked_row_is_nan_like_ggml() -> None:
    x = np.zeros((1, 1, 1, 4), np.float32)
    mask = np.full((1, 1, 1, 4), -np.inf, np.float32)
    out = np.empty_like(x)
    with np.errstate(invalid="ignore"):
        fastpath.soft_max(np, x, mask, 1.0, out)
    assert np.all(np.isnan(out))


@pytest.mark.parametrize("rows,n", [(1, 1), (7, 384), (1152, 384), (1000, 1536), (3, 100_000)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_bias_residual(rows: int, n: int, with_residual: bool) -> None:
    rng = np.random.default_rng(rows + n)
    x = rng.standard_normal((rows, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    r = rng.standard_normal((rows, n)).astype(np.float32) if with_residual else None
    want = (x + b) + r if with_residual else x + b     # ggml's node order, float32
    out = np.empty_like(x)
    fastpath.add_bias_residual(np, x, b, r, out)
    assert np.array_equal(out, want)
    if r is not None:
        r2 = r.copy()
        fastpath.add_bias_residual(np, x, b, r2, r2)   # into the residual's memory
        assert np.array_equal(r2, want)


def test_add_bias_residual_errors() -> None:
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="bias"):
        fastpath.add_bias_residual(np, x, np.zeros(7, np.float32), None, np.empty_like(x))
    with pytest.raises(ValueError, match="residual"):
        fastpath.add_bias_residual(np, x, np.zeros(8, np.float32), np.zeros((3, 8), np.float32),
                                   np.empty_like(x))


def test_fastpath_gelu_erf_numpy() -> None:
    x = np.linspace(-10, 10, 4001, dtype=np.float32).reshape(1, 4001)
    out = np.empty_like(x)
    assert fastpath.gelu_erf(np, x, out) is out
    err = np.abs(out - _gelu64(x))
    assert np.all(err <= special.GELU_ERF_F32_BOUND * np.maximum(1.0, np.abs(x)))
