"""Activation quantizers (Q8_0/Q8_1/Q8_K), the vec_dot referee and the in-place dot kernels.

Expected values come from ggml itself (tests/data/ggml_q8_reference.npz, written by
scripts/make_quant_reference.py through ggml-python 0.0.45) and, for the kernels, from the
referee (:mod:`ggmlpy.quants.vec_dot`, a transcription of ggml's generic C loops) and float64
products of the decoded values.
"""

from __future__ import annotations

import os
import warnings
import zlib

import numpy as np
import pytest
from helpers import dot_abs_terms as _abs_terms
from helpers import dot_terms as _terms
from helpers import lanes_bound as _lanes_bound

from ggmlpy.backends.cpu import qmatmul as dk
from ggmlpy.core import env
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize, q8, quantize, vec_dot

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "ggml_q8_reference.npz")
PAIRS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K", "f16", "bf16"]
EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)
HALF = (Type.F16, Type.BF16)


@pytest.fixture(scope="module")
def ref():
    return dict(np.load(DATA))


def _t(name: str) -> Type:
    return Type[name.upper()]


def _w_arr(t: Type, wb: np.ndarray) -> np.ndarray:
    return wb.view(np.uint16) if t in HALF else wb


@pytest.fixture(params=[True, False], ids=["jit", "numpy"])
def jit(request, monkeypatch):
    if request.param and not dk.jit_available():
        pytest.skip("numba not installed")
    monkeypatch.setenv(env.JIT, "1" if request.param else "0")
    return request.param


# ------------------------------------------------------------------ quantizers vs ggml


@pytest.mark.parametrize("kind", ["q8_0", "q8_1", "q8_K"])
def test_q8_bit_exact_with_ggml_reference(ref, kind):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ours = getattr(q8, "quantize_row_" + kind)(ref["x"])
    np.testing.assert_array_equal(ours, ref["ref_" + kind])


@pytest.mark.parametrize("kind", ["q8_0", "q8_1", "q8_K"])
def test_quantize_act_bit_exact_with_ggml_reference(ref, kind, jit):
    act = dk.quantize_act(kind, ref["x"], n_parts=3, form="ref")
    np.testing.assert_array_equal(dk.act_bytes(act), ref["ref_" + kind])


@pytest.mark.parametrize("kind", ["q8_0", "q8_1", "q8_K"])
def test_quantize_act_x86_bit_exact_with_ggml_cpu(ref, kind, jit):
    """The x86 form gives ggml-cpu's own from_float (AVX2 quantize_row_q8_0/_q8_1; Q8_K's
    reference loop) on this blob's rows, extreme ones included."""
    act = dk.quantize_act(kind, ref["x"], n_parts=3, form="x86")
    np.testing.assert_array_equal(dk.act_bytes(act), ref["cpu_" + kind])


def test_reference_covers_the_extremes(ref):
    """The blob's inputs reach the cases the module docstring names: blocks whose d underflows
    to 0, whose 1/d overflows, f16 overflow of d, exact ties, zero blocks."""
    x = ref["x"].reshape(-1, 32).astype(np.float64)
    amax = np.abs(x).max(axis=1)
    d = (amax / 127).astype(np.float32)
    assert ((amax > 0) & (d == 0)).any()                    # d underflows
    with np.errstate(divide="ignore", over="ignore"):
        assert ((d > 0) & ~np.isfinite(np.float32(1) / d)).any()  # 1/d overflows
    assert (d > 65504).any()                                # f16 d overflows
    assert (amax == 0).any()
    b = ref["ref_q8_0"].reshape(-1, 34)
    assert (b[:, :2].view(np.float16)[:, 0] == np.float16(np.inf)).any()
    # ggml's SIMD quantizer differs from the reference on some of these rows (ties, subnormals)
    assert not np.array_equal(ref["cpu_q8_0"], ref["ref_q8_0"])


def test_non_finite_blocks_get_nan_scales():
    x = np.ones((2, 256), np.float32)
    x[0, 3] = np.nan
    x[1, 40] = np.inf
    for kind in ("q8_0", "q8_1"):
        b = getattr(q8, "quantize_row_" + kind)(x)
        size = b.shape[1] // 8
        d = b.reshape(-1, size)[:, :2].copy().view(np.float16)[:, 0]
        assert np.isnan(d[0]) and np.isnan(d[9]) and not np.isnan(d[1]).any()
    bk = q8.quantize_row_q8_K(x)
    assert np.isnan(bk[:, :4].copy().view(np.float32)).all()


# ------------------------------------------------------------------ referee vs ggml


@pytest.mark.parametrize("name", PAIRS)
def test_referee_matches_ggml_vec_dot_within_bound(ref, name):
    """ggml's SIMD vec_dot sums the same terms in another order (float32 lanes, FMAs): the
    difference is bounded by (terms) * eps32 * sum|terms|. Where a block scale is f16 inf
    (activations near 1e20 and above) both results are non-finite, but the kind may differ: the
    SIMD loop multiplies the inf scale by a zero lane sum (NaN) where the scalar loop gets +-inf."""
    t = _t(name)
    w, y, d = ref["w_" + name], ref["y_" + name], ref["dot_" + name]
    with np.errstate(all="ignore"):
        r = vec_dot.vec_dot(t, w, y)
        S = _abs_terms(t, w, y)
    fin = np.isfinite(d) & np.isfinite(S)
    np.testing.assert_array_equal(np.isfinite(r), np.isfinite(d))
    err = np.abs(r[fin].astype(np.float64) - d[fin])
    if t == Type.F16:
        # on AVX512-FP16 CPUs (this reference's) ggml's F16 dot accumulates in f16 lanes
        # (ggml-cpu/simd-mappings.h GGML_F16x32_FMA = _mm512_fmadd_ph): K/32 sums per lane and a
        # 5-level tree, each rounded to f16 (eps 2**-10)
        bound = (512 // 32 + 5) * 2.0 ** -10 * S[fin]
    else:
        bound = _terms(t, 512) * EPS32 * S[fin] + np.finfo(np.float32).tiny
    if t == Type.BF16:
        # AVX512-BF16's dot instruction (vdpbf16ps) flushes subnormal products to zero: each of
        # the K products may lose up to the smallest normal float32
        bound = bound + 512 * np.finfo(np.float32).tiny
    assert (err <= bound).all(), (name, (err / bound).max())
    assert fin.sum() > 0.6 * fin.size


@pytest.mark.parametrize("name", PAIRS)
def test_weight_bytes_match_ggml(ref, name):
    t = _t(name)
    np.testing.assert_array_equal(quantize(ref["wx"], t).reshape(ref["w_" + name].shape),
                                  ref["w_" + name])


@pytest.mark.parametrize("name", PAIRS)
def test_referee_near_float64_product(name):
    """The referee is the dot product of the decoded values (a check of the transcription that
    does not lean on ggml): |r - y_deq . w_deq| <= terms * eps32 * sum|terms| (float64)."""
    t = _t(name)
    rng = np.random.default_rng(3)
    K = 512
    wx = rng.standard_normal((5, K)).astype(np.float32)
    x = rng.standard_normal((4, K)).astype(np.float32)
    wb = quantize(wx, t).reshape(5, -1)
    act = dk.quantize_act(vec_dot.VEC_DOT_TYPE[t], x)
    yb = dk.act_bytes(act)
    r = vec_dot.vec_dot(t, wb, yb).astype(np.float64)
    wd = dequantize(wb, t, (K, 5)).astype(np.float64)
    Y = vec_dot.unpack_act(vec_dot.VEC_DOT_TYPE[t], yb)
    yd = Y["v"] if "v" in Y else (Y["q"] * Y["d"][..., None]).reshape(4, K)
    exact = yd.astype(np.float64) @ wd.T
    if t in (Type.Q4_1, Type.Q5_1):
        # ggml's min term uses the activation block's s = f16(sum(q) * d), not sum(q) * d_f16
        W = vec_dot.unpack_weight(t, wb)
        qsum = Y["q"].sum(axis=2) * Y["d"].astype(np.float64)
        exact += (W["m"].astype(np.float64)[None] * (Y["s"] - qsum)[:, None]).sum(axis=2)
    bound = _terms(t, K) * EPS32 * _abs_terms(t, wb, yb)
    assert (np.abs(r - exact) <= bound).all()


# ------------------------------------------------------------------ kernels vs referee


def _case(t: Type, rng: np.random.Generator, N: int, M: int, K: int, extreme: np.ndarray | None):
    wx = rng.standard_normal((M, K)).astype(np.float32)
    wx[0] *= 1e4
    wx[-1] *= 1e-3
    x = rng.standard_normal((N, K)).astype(np.float32)
    if extreme is not None:
        e = np.tile(extreme, (1, -(-K // extreme.shape[1])))[:N, :K]
        x[: e.shape[0]] = e
    return _w_arr(t, quantize(wx, t).reshape(M, -1)), x


@pytest.mark.parametrize("name", PAIRS)
@pytest.mark.parametrize("shape", [(1, 7, 512), (3, 33, 256), (5, 2, 1024)])
def test_kernel_against_referee(ref, name, shape, jit):
    """The NumPy fallback gives the referee's bits for block types; the compiled kernels (float32
    lanes, fused multiply-adds) are within :func:`_lanes_bound` of it, non-finite exactly where
    it is (an inf scale times a lane with no products gives NaN where the referee has +-inf, as
    ggml's SIMD loops do); F16/BF16 within ulp32 + K * eps64 * sum|x w| without Numba (float64
    sums reordered), within :func:`_lanes_bound` with it (4 x 16 float32 lanes).
    Every split into parts gives the same bits."""
    t = _t(name)
    N, M, K = shape
    rng = np.random.default_rng(zlib.crc32(repr((name, shape)).encode()))
    w, x = _case(t, rng, N, M, K, ref["x"][rng.permutation(ref["x"].shape[0])])
    with np.errstate(all="ignore"):
        act = dk.quantize_act(vec_dot.VEC_DOT_TYPE[t], x)
        want = vec_dot.vec_dot(t, w.view(np.uint8).reshape(M, -1), dk.act_bytes(act))
        S = _abs_terms(t, w.view(np.uint8).reshape(M, -1), dk.act_bytes(act))
    first = None
    for n_parts in (1, 2, 3):
        out = np.full((N, M), np.nan, np.float32)
        with np.errstate(all="ignore"):
            for p in dk.mul_mat_parts(t, w, act, out, n_parts):
                p()
        if first is None:
            first = out
        np.testing.assert_array_equal(out, first)
    out = first
    fin = np.isfinite(want)
    if t in HALF:
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
        err = np.abs(out[fin].astype(np.float64) - want[fin])
        bound = (_lanes_bound(t, K, S[fin]) if jit
                 else np.spacing(np.abs(want[fin])) + K * EPS64 * S[fin])
        assert (err <= bound).all(), (err / bound).max()
    elif not jit:
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_array_equal(np.isfinite(out), fin)
        err = np.abs(out[fin].astype(np.float64) - want[fin])
        assert (err <= _lanes_bound(t, K, S[fin])).all(), (err / _lanes_bound(t, K, S[fin])).max()


@pytest.mark.parametrize("name", PAIRS)
def test_mul_mat_runs_parts_through_run(name):
    t = _t(name)
    rng = np.random.default_rng(5)
    w, x = _case(t, rng, 4, 10, 256, None)
    seen = []

    def run(parts):
        seen.append(len(parts))
        for p in parts:
            p()

    out = dk.mul_mat(t, w, x, n_threads=2, run=run)
    want = dk.mul_mat(t, w, x, n_threads=1)
    np.testing.assert_array_equal(out, want)
    assert seen == [2, 2]


def test_jit_and_numpy_fallback_agree(monkeypatch):
    """mul_mat with and without Numba: the fallback is the referee, the kernels within their
    bound of it."""
    if not dk.jit_available():
        pytest.skip("numba not installed")
    rng = np.random.default_rng(9)
    for t in (Type.Q4_K, Type.Q5_0, Type.Q8_0):
        w, x = _case(t, rng, 3, 20, 512, None)
        a = dk.mul_mat(t, w, x)
        monkeypatch.setenv(env.JIT, "0")
        b = dk.mul_mat(t, w, x)
        monkeypatch.delenv(env.JIT)
        yb = dk.act_bytes(dk.quantize_act(vec_dot.VEC_DOT_TYPE[t], x))
        np.testing.assert_array_equal(b, vec_dot.vec_dot(t, w, yb))
        S = _abs_terms(t, w, yb)
        assert (np.abs(a.astype(np.float64) - b) <= _lanes_bound(t, 512, S)).all()
        assert not np.array_equal(a, b)  # the kernels really sum in another order


def test_misuse_raises():
    w = quantize(np.ones((4, 64), np.float32), Type.Q8_0)
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="no dot kernel"):
        dk.mul_mat(Type.F32, w, x)
    with pytest.raises(ValueError, match="2-D float32"):
        dk.mul_mat(Type.Q8_0, w, x.astype(np.float64))
    with pytest.raises(ValueError, match="multiple of"):
        dk.quantize_act("q8_0", np.ones((2, 48), np.float32))
    with pytest.raises(ValueError, match="rows of 68 bytes"):
        dk.mul_mat(Type.Q8_0, w[:, :40], x)
    with pytest.raises(ValueError, match="out must be"):
        dk.mul_mat(Type.Q8_0, w, x, out=np.empty((2, 3), np.float32))
    act = dk.quantize_act("q8_1", x)
    with pytest.raises(ValueError, match="takes activations in q8_0"):
        dk.mul_mat_parts(Type.Q8_0, w, act, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="kind must be"):
        dk.quantize_act("q4_0", x)
    with pytest.raises(ValueError, match="multiple of the block size 32"):
        q8.quantize_row_q8_0(np.ones(40, np.float32))
    with pytest.raises(TypeError, match="float array"):
        q8.quantize_row_q8_K(np.array(["a"] * 256))
