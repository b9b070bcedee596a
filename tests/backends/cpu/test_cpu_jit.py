"""The Numba kernels of :mod:`ggmlpy.backends.cpu.jit` against float64 NumPy references, their
argument checks, ``GGMLPY_JIT``, and the CPU graphs that reach them (ops via :mod:`ggmlpy.ops`).

Tolerances (all from the module docstring of ``cpu_jit``, which computes in float64 and rounds
once or twice to float32):

* GELU_ERF: ``special.GELU_ERF_F32_BOUND * max(1, |x|)`` against ``0.5 x erfc(-x / sqrt 2)``
  from :func:`math.erfc` (independent of the project's own erfc).
* SOFT_MAX: the kernel forms ``x * scale + mask`` in float32, with one rounding or two (LLVM may
  contract it into an FMA, as a C compiler may in ggml), so the reference forms the logits
  exactly in float64 and allows each logit ``w`` an error of ``2^-24 (|x scale| + |w|)``: a
  row's probabilities then carry a relative error up to twice the row's largest such error.
  After that the kernel rounds ``exp`` to float32 and then the product with ``1 / sum``: two
  float32 roundings, ``3e-7`` (2.5 ulp) more; ``atol = F32_TINY`` for the flush of results
  below float32's smallest normal number.
* NORM: float64 statistics, one rounding: ``rtol = 1.2e-7`` (2 half-ulps), ``atol = 1e-12`` for
  results that are zero up to float64 noise.
* ADD/SUB/MUL/DIV: IEEE float32, bit-identical to NumPy.
* JIT on vs off (graph level): GELU both within the bound, so ``2 * bound``; SOFT_MAX the NumPy
  path's documented ``rtol=1e-5, atol=1e-7`` (tests/test_kernels_attention.py); NORM 1e-6 (the
  NumPy fast path sums in float32); binary ops bit-identical.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("numba")

from helpers import alloc_ctx  # noqa: E402

from ggmlpy import ops
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set  # noqa: E402
from ggmlpy.backends.cpu import (
    fastpath,  # noqa: E402
    soft_max_ggml,
)
from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu.backend import backend_cpu_init  # noqa: E402
from ggmlpy.backends.cpu.variants import JIT_MIN_ELEMENTS  # noqa: E402
from ggmlpy.core import (
    env,
    special,  # noqa: E402
)
from ggmlpy.core.env import EnvError  # noqa: E402
from ggmlpy.core.graph import Graph  # noqa: E402
from ggmlpy.core.tensor import Context  # noqa: E402
from ggmlpy.core.types import Type  # noqa: E402

F32_TINY = float(np.finfo(np.float32).tiny)
BOUND = special.GELU_ERF_F32_BOUND
SM_ATOL = F32_TINY
NORM_RTOL = 1.2e-7


@pytest.fixture(autouse=True)
def _jit_on(monkeypatch):
    monkeypatch.delenv(env.JIT, raising=False)
    monkeypatch.delenv(env.PRECISE_KERNELS, raising=False)


def _no_subnormals(y: np.ndarray) -> None:
    a = np.abs(y[np.isfinite(y)])
    sub = (a > 0) & (a < F32_TINY)
    assert not sub.any(), f"{int(sub.sum())} float32 subnormal outputs, e.g. {a[sub][:3]}"


# ---------------------------------------------------------------------------------------------
# GELU_ERF

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _gelu_ref(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return 0.5 * x64 * _erfc(-x64 / math.sqrt(2.0)).astype(np.float64)


def test_gelu_erf_dense_grid_within_bound_and_no_subnormals() -> None:
    x = np.linspace(-40.0, 40.0, 1_000_001, dtype=np.float64).astype(np.float32)
    # plus the region where gelu(x) crosses float32's normal range, and tiny/subnormal inputs
    x = np.concatenate([x, np.linspace(-14.5, -12.5, 100_001).astype(np.float32),
                        np.float32([1e-38, -1e-38, 1e-45, -1e-45, 3e-39, 1.2e-38])])
    out = np.full_like(x, np.nan)
    assert cpu_jit.gelu_erf(x, out) is out
    err = np.abs(out.astype(np.float64) - _gelu_ref(x))
    tol = BOUND * np.maximum(1.0, np.abs(x.astype(np.float64)))
    worst = int(np.argmax(err / tol))
    assert np.all(err <= tol), f"x={x[worst]!r}: err {err[worst]:.3g} > {tol[worst]:.3g}"
    _no_subnormals(out)


def test_gelu_erf_in_place_equals_out_of_place() -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 5, 7, 129)) * 6).astype(np.float32)
    out = np.empty_like(x)
    cpu_jit.gelu_erf(x, out)
    y = x.copy()
    assert cpu_jit.gelu_erf(y, y) is y
    np.testing.assert_array_equal(y, out)
    np.testing.assert_array_equal(x.shape, out.shape)


def test_gelu_erf_special_values() -> None:
    big = np.finfo(np.float32).max
    x = np.float32([np.nan, np.inf, -np.inf, -0.0, 0.0, big, -big, 40.0, -40.0])
    out = np.empty_like(x)
    cpu_jit.gelu_erf(x, out)
    assert np.isnan(out[0])
    assert out[1] == np.inf
    assert out[2] == 0.0                       # x * Phi(x) -> 0 as x -> -inf
    # -0.0 -> a zero (fastmath 'nsz' leaves its sign unspecified; ggml gives -0.0)
    assert out[3] == 0.0 and out[4] == 0.0
    assert out[5] == big and out[6] == 0.0
    assert out[7] == 40.0 and out[8] == 0.0


# ---------------------------------------------------------------------------------------------
# SOFT_MAX

def _softmax_ref(x: np.ndarray, mask: np.ndarray | None, scale: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """float64 softmax of the rows ``x * float32(scale) + mask`` (mask row
    ``mask[i3 % M3, i2 % M2, i1]``, ggml's broadcast) and the relative tolerance of each row
    (module docstring: float32 logits, then 2.5 ulp)."""
    X3, X2, X1, X0 = x.shape
    out = np.empty(x.shape, np.float64)
    rtol = np.empty((X3, X2, X1, 1), np.float64)
    s = float(np.float32(scale))
    for i3 in range(X3):
        for i2 in range(X2):
            for i1 in range(X1):
                xs = x[i3, i2, i1].astype(np.float64) * s
                w = xs.copy()
                if mask is not None:
                    w += mask[i3 % mask.shape[0], i2 % mask.shape[1], i1]
                mx = w.max()
                fin = np.isfinite(w)
                dw = 2.0**-24 * np.max(np.abs(xs[fin]) + np.abs(w[fin]), initial=0.0)
                rtol[i3, i2, i1] = 3e-7 + 2 * dw
                if mx == -np.inf:
                    out[i3, i2, i1] = np.nan  # ggml: an all -inf row gives NaN
                    continue
                e = np.exp(w - mx)
                out[i3, i2, i1] = e / e.sum()
    return out, rtol


def _assert_sm_close(got: np.ndarray, ref: tuple[np.ndarray, np.ndarray]) -> None:
    p, rtol = ref
    assert got.shape == p.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(p))
    ok = np.isnan(p) | (np.abs(got - p) <= rtol * np.abs(p) + SM_ATOL)
    bad = np.argwhere(~ok)
    assert ok.all(), (f"{len(bad)} elements off, first at {tuple(bad[0])}: {got[tuple(bad[0])]!r}"
                      f" vs {p[tuple(bad[0])]!r} (rtol {rtol[tuple(bad[0][:3])][0]:.3g})")


def _check_sm(x, mask, scale, inplace):
    ref = _softmax_ref(x, mask, scale)
    if inplace:
        out = x.copy()
        assert cpu_jit.soft_max(out, mask, scale, out) is out
    else:
        out = np.full_like(x, np.nan)
        x0 = x.copy()
        assert cpu_jit.soft_max(x, mask, scale, out) is out
        np.testing.assert_array_equal(x, x0)  # the input is not touched
    _assert_sm_close(out, ref)
    _no_subnormals(out)
    return out


# (X3, X2, X1, X0) of x, (M3, M2, M1) of the mask (None: no mask), scale
_SM_CASES = [
    ((1, 1, 1, 1), None, 1.0),
    ((1, 1, 4, 33), None, 0.125),
    ((2, 3, 5, 64), None, 1.0),
    ((2, 3, 5, 64), (1, 1, 5), 0.5),     # M3 = M2 = 1: one mask for every head and batch
    ((2, 3, 5, 64), (2, 3, 5), 1.0),     # M3 = X3, M2 = X2
    ((2, 6, 5, 17), (1, 3, 5), 1.0),     # tiled over dim 2 by modulo
    ((4, 3, 5, 17), (2, 1, 5), 2.0),     # tiled over dim 3 by modulo
    ((1, 2, 3, 40), (1, 1, 8), 0.3),     # more mask rows than x rows (ggml pads the mask)
    ((2, 2, 7, 129), (2, 1, 9), 1.0),
]


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("shape,mshape,scale", _SM_CASES)
def test_soft_max_matches_reference(shape, mshape, scale, inplace) -> None:
    rng = np.random.default_rng(sum(shape) + (0 if mshape is None else 7 * sum(mshape)))
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    mask = None
    if mshape is not None:
        mask = rng.uniform(-3, 3, (*mshape, shape[3])).astype(np.float32)
    _check_sm(x, mask, scale, inplace)


@pytest.mark.parametrize("inplace", [False, True])
def test_soft_max_random_shapes(inplace) -> None:
    rng = np.random.default_rng(7)
    for _ in range(25):
        X3, X2, X1, X0 = (int(rng.integers(1, 4)), int(rng.integers(1, 5)),
                          int(rng.integers(1, 9)), int(rng.integers(1, 300)))
        x = (rng.standard_normal((X3, X2, X1, X0)) * rng.uniform(0.1, 30)).astype(np.float32)
        mask = None
        if rng.random() < 0.7:
            M3 = int(rng.choice([d for d in range(1, X3 + 1) if X3 % d == 0]))
            M2 = int(rng.choice([d for d in range(1, X2 + 1) if X2 % d == 0]))
            mask = rng.uniform(-5, 5, (M3, M2, X1 + int(rng.integers(0, 3)), X0))
            mask[rng.random(mask.shape) < 0.2] = -np.inf
            mask[..., 0] = 0.0  # keep every row finite somewhere
            mask = mask.astype(np.float32)
        _check_sm(x, mask, float(rng.uniform(0.05, 2.0)), inplace)


@pytest.mark.parametrize("inplace", [False, True])
def test_soft_max_inf_masks_and_all_inf_row(inplace) -> None:
    x = np.arange(2 * 3 * 16, dtype=np.float32).reshape(1, 2, 3, 16) / 7
    mask = np.zeros((1, 1, 3, 16), np.float32)
    mask[0, 0, 0, ::2] = -np.inf         # half the row masked
    mask[0, 0, 1, :] = -np.inf           # the whole row masked -> NaN
    mask[0, 0, 2, 5] = -np.inf
    out = _check_sm(x, mask, 1.0, inplace)
    assert np.all(out[0, :, 0, ::2] == 0.0)
    assert np.all(np.isnan(out[0, :, 1]))
    np.testing.assert_allclose(out[0, :, [0, 2]].sum(axis=-1), 1.0, rtol=2e-6)


def test_soft_max_nan_and_underflow() -> None:
    x = np.zeros((1, 1, 3, 8), np.float32)
    x[0, 0, 0, 3] = np.nan                       # a NaN poisons its row (as in ggml)
    x[0, 0, 0, 5] = -np.float32(np.nan)          # (a negative NaN too: it orders lowest)
    x[0, 0, 1, 6:] = (-87.0, -87.3)              # exp >= tiny, but p = exp / 6.x < tiny
    x[0, 0, 2, :] = np.float32([0, -200, -1e30, -np.inf, 1, 2, 3, -50])
    out = np.empty_like(x)
    cpu_jit.soft_max(x, None, 1.0, out)
    assert np.all(np.isnan(out[0, 0, 0]))
    _no_subnormals(out)  # regression: results in (0, tiny) were left subnormal
    _assert_sm_close(out[:, :, 1:], _softmax_ref(x[:, :, 1:], None, 1.0))


def test_expf_dense_grid_below_one_ulp() -> None:
    """The float32 ``exp`` both kernels use (module docstring: < 1 ulp on ``[ln(tiny), 0]``,
    0 below, NaN kept), on a dense grid, against float64 ``np.exp``."""
    from numba import njit

    from ggmlpy.backends.cpu import jit_kernels as kj

    @njit(**{**kj._OPTS, "cache": False})  # the kernels' flags (inline="always" takes the caller's)
    def apply(y, out):
        for i in range(y.size):
            out[i] = kj.expf_nonpos(y[i])

    y = np.concatenate([-np.linspace(0.0, 90.0, 2_000_001).astype(np.float32),
                        np.float32([-np.inf, np.nan, -0.0, -1e-30, -87.33654, -87.3366])])
    out = np.empty_like(y)
    apply(y, out)
    ref = np.exp(y.astype(np.float64))
    normal = ref >= F32_TINY
    ulp = np.spacing(ref[normal].astype(np.float32)).astype(np.float64)
    err_ulp = np.abs(out[normal] - ref[normal]) / ulp
    assert err_ulp.max() < 1.0, f"{err_ulp.max():.3f} ulp at y={y[normal][np.argmax(err_ulp)]!r}"
    assert np.all(out[~normal & ~np.isnan(y)] == 0.0)  # below ln(tiny): flushed (no subnormals)
    assert np.isnan(out[np.isnan(y)]).all()


# ---------------------------------------------------------------------------------------------
# NORM

def _norm_ref(x: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis=-1, keepdims=True)
    return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)


def _norm_ggml_ref(x: np.ndarray, eps: float) -> np.ndarray:
    """ggml-cpu's ggml_compute_forward_norm_f32 (x86 AVX512F+DQ) in NumPy, step by step: the
    row sum in float64 in order, rounded to float32; mean = sum / n in float32; y = x - mean;
    the squares of each 16 values reduced as _mm512_reduce_add_ps (halves added) in float32 and
    added in float64, then the n % 16 leftover squares; variance = float32(sum / n); scale =
    1 / sqrtf(variance + eps) in float32; y * scale."""
    f32, f64 = np.float32, np.float64
    R, n = x.shape
    s = np.zeros(R, f64)
    for j in range(n):
        s = s + x[:, j].astype(f64)
    mean = (s.astype(f32) / f32(n)).astype(f32)
    y = (x - mean[:, None]).astype(f32)
    acc = np.zeros(R, f64)
    n16 = n - n % 16
    for i in range(0, n16, 16):
        v = (y[:, i:i + 16] * y[:, i:i + 16]).astype(f32)
        while v.shape[1] > 1:
            h = v.shape[1] // 2
            v = (v[:, h:] + v[:, :h]).astype(f32)
        acc = acc + v[:, 0].astype(f64)
    for j in range(n16, n):
        acc = acc + (y[:, j] * y[:, j]).astype(f32).astype(f64)
    var = (acc / n).astype(f32)
    scale = (f32(1) / np.sqrt((var + f32(eps)).astype(f32))).astype(f32)
    return (y * scale[:, None]).astype(f32)


def _assert_norm_close(got: np.ndarray, x: np.ndarray, eps: float) -> None:
    """Within ggml's float32 roundings of the float64 LayerNorm: the mean rounded to float32
    (two roundings, each <= 2^-24 |mean|) moves every output by up to that over the row's
    standard deviation; the subtraction, variance, scale and product add a few float32
    roundings relative to the output."""
    ref = _norm_ref(x, eps)
    x64 = x.astype(np.float64)
    std = np.sqrt(x64.var(axis=-1, keepdims=True) + eps)
    atol = 3 * 2.0 ** -24 * np.abs(x64.mean(axis=-1, keepdims=True)) / std + 1e-12
    assert np.all(np.abs(got - ref) <= atol + 8 * 2.0 ** -24 * np.abs(ref))


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("shape,eps", [((1, 1), 1e-5), ((3, 384), 1e-12), ((17, 1000), 1e-5),
                                       ((5, 7), 1.0), ((64, 33), 0.0), ((9, 16), 1e-5),
                                       ((6, 47), 1e-5)])
def test_norm_matches_reference(shape, eps, inplace) -> None:
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    x = (rng.standard_normal(shape) * 3 + 10).astype(np.float32)
    if inplace:
        out = x.copy()
        assert cpu_jit.norm(out, eps, out) is out
    else:
        out = np.full_like(x, np.nan)
        assert cpu_jit.norm(x, eps, out) is out
    np.testing.assert_array_equal(out.view(np.int32), _norm_ggml_ref(x, eps).view(np.int32))
    _assert_norm_close(out, x, eps)


def test_norm_constant_rows_and_eps() -> None:
    x = np.full((2, 64), 3.25, np.float32)
    x[1] = -1e6
    out = np.empty_like(x)
    cpu_jit.norm(x, 1e-5, out)
    np.testing.assert_array_equal(out, 0.0)      # zero variance: (x - mean) = 0 exactly
    y = np.float32([[1, -1, 1, -1]])             # var 1: eps = 3 halves the result
    cpu_jit.norm(y, 3.0, y)
    np.testing.assert_allclose(y, [[0.5, -0.5, 0.5, -0.5]], rtol=NORM_RTOL)


# ---------------------------------------------------------------------------------------------
# binary ops

# out is b only where b has a's shape (a one-row b cannot hold a's rows)
_BIN_CASES = [(layout, alias, shape) for layout in ("bias", "same") for alias in ("new", "a", "b")
              for shape in ((1, 1), (1, 40), (3, 17), (64, 1000), (2, 4099))
              if not (alias == "b" and layout == "bias" and shape[0] != 1)]


@pytest.mark.parametrize("op", sorted(cpu_jit.BINARY_OPS))
@pytest.mark.parametrize("layout,alias,shape", _BIN_CASES)
def test_binary_bit_exact(op, layout, alias, shape) -> None:
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal((1 if layout == "bias" else shape[0], shape[1])).astype(np.float32)
    b[np.abs(b) < 1e-3] = 0.5
    a.flat[0] = np.inf                 # inf and NaN propagate as in NumPy
    if b.size > 1:
        b.flat[-1] = np.nan
    ref = getattr(np, op)(a, b)
    a0, b0 = a.copy(), b.copy()
    out = {"new": np.full_like(a, np.nan), "a": a, "b": b}[alias]
    assert cpu_jit.binary(op, a, b, out) is out
    np.testing.assert_array_equal(out.view(np.int32), ref.view(np.int32))
    if alias != "a":
        np.testing.assert_array_equal(a, a0)
    if alias != "b":
        np.testing.assert_array_equal(b, b0)


# ---------------------------------------------------------------------------------------------
# argument checks

_F = np.zeros((2, 4), np.float32)
_X4 = np.zeros((1, 1, 2, 4), np.float32)


@pytest.mark.parametrize("call,match", [
    (lambda: cpu_jit.gelu_erf(_F.astype(np.float64), _F), "gelu_erf: x must be .*float64"),
    (lambda: cpu_jit.gelu_erf(_F, _F.T), "gelu_erf: out must be .*strided"),
    (lambda: cpu_jit.gelu_erf(_F, [0.0]), "gelu_erf: out must be .*got list"),
    (lambda: cpu_jit.gelu_erf(_F, np.zeros((4, 2), np.float32)), "out shape"),
    (lambda: cpu_jit.soft_max(_F, None, 1.0, _F), "soft_max: x must be 4-D"),
    (lambda: cpu_jit.soft_max(_X4, None, 1.0, np.zeros((1, 1, 2, 5), np.float32)),
     "soft_max: x must be 4-D and out of its shape"),
    (lambda: cpu_jit.soft_max(_X4, _F, 1.0, _X4.copy()), "mask .* does not broadcast"),
    (lambda: cpu_jit.soft_max(_X4, np.zeros((1, 1, 1, 4), np.float32), 1.0, _X4.copy()),
     "mask .* does not broadcast"),                             # fewer mask rows than x rows
    (lambda: cpu_jit.soft_max(np.zeros((1, 3, 2, 4), np.float32),
                              np.zeros((1, 2, 2, 4), np.float32), 1.0,
                              np.zeros((1, 3, 2, 4), np.float32)), "mask .* does not broadcast"),
    (lambda: cpu_jit.soft_max(_X4, np.zeros((1, 0, 2, 4), np.float32), 1.0, _X4.copy()),
     "mask .* does not broadcast"),                             # was a ZeroDivisionError
    (lambda: cpu_jit.soft_max(_X4, np.zeros((1, 1, 2, 4), np.float32)[..., ::2], 1.0,
                              _X4.copy()), "soft_max: mask must be .*strided"),
    (lambda: cpu_jit.soft_max(_X4, np.zeros((1, 1, 2, 4), np.float16), 1.0, _X4.copy()),
     "soft_max: mask must be .*float16"),
    (lambda: cpu_jit.norm(_X4, 1e-5, _X4.copy()), "norm: x must be 2-D"),
    (lambda: cpu_jit.norm(_F, 1e-5, _F[:, :2]), "norm: out must be .*strided"),
    (lambda: cpu_jit.binary("pow", _F, _F, _F.copy()), "op must be one of"),
    (lambda: cpu_jit.binary("add", _F, _F[:, :1].copy(), _F.copy()), r"shapes a \(2, 4\), b \(2, 1\)"),
    (lambda: cpu_jit.binary("add", _F, np.zeros((3, 4), np.float32), _F.copy()), "shapes"),
    (lambda: cpu_jit.binary("add", _F, _F, np.zeros((2, 4), np.int32)), "binary: out must be"),
    (lambda: cpu_jit.binary("add", _X4, _X4, _X4.copy()), "shapes"),
])
def test_argument_errors_name_the_argument(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------------------------
# GGMLPY_JIT and graphs

def test_env_switch(monkeypatch) -> None:
    assert cpu_jit.available() and cpu_jit.reason() is None
    monkeypatch.setenv(env.JIT, "0")
    assert not cpu_jit.available()
    assert cpu_jit.reason() == "GGMLPY_JIT=0"
    monkeypatch.setenv(env.JIT, "1")
    assert cpu_jit.available()
    for bad in ("2", "yes", "true", "-1"):
        monkeypatch.setenv(env.JIT, bad)
        with pytest.raises(EnvError, match="GGMLPY_JIT"):
            cpu_jit.available()
        with pytest.raises(EnvError, match="GGMLPY_JIT"):
            env.validate()


def _graph(kind: str, rng: np.random.Generator):
    """A small graph that reaches one jit path: (ctx, out, {tensor: input}, reference fn name)."""
    ctx = Context()
    f32 = Type.F32
    if kind == "gelu":
        a = ctx.new_tensor(f32, (257, 33))
        return ctx, ops.gelu_erf(ctx, a), {a: rng.standard_normal((33, 257)) * 5}
    if kind == "soft_max":
        a = ctx.new_tensor(f32, (40, 7, 6, 2))
        m = ctx.new_tensor(f32, (40, 9, 1, 1))
        out = ops.soft_max_ext(ctx, a, m, 0.125, 0.0)
        mv = rng.uniform(-4, 4, (1, 1, 9, 40))
        mv[..., 3:9, 30:] = -np.inf
        return ctx, out, {a: rng.standard_normal((2, 6, 7, 40)) * 8, m: mv}
    if kind == "norm":
        a = ctx.new_tensor(f32, (384, 19))
        return ctx, ops.norm(ctx, a, 1e-12), {a: rng.standard_normal((19, 384)) * 2 + 1}
    op, layout = kind.split("-")
    a = ctx.new_tensor(f32, (512, 9))           # 4608 >= JIT_MIN_ELEMENTS elements
    b = ctx.new_tensor(f32, (512, 1 if layout == "bias" else 9))
    bv = rng.standard_normal((b.ne[1], 512))
    bv[np.abs(bv) < 1e-2] = 1.0
    out = getattr(ops, op)(ctx, a, b)
    return ctx, out, {a: rng.standard_normal((9, 512)), b: bv}


def _reference(kind: str, ins: list[np.ndarray]) -> np.ndarray:
    if kind == "gelu":
        return _gelu_ref(ins[0])
    if kind == "soft_max":
        return _softmax_ref(ins[0], ins[1], 0.125)
    if kind == "norm":
        return _norm_ref(ins[0], 1e-12)
    op = kind.split("-")[0]
    return getattr(np, {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide"}[op])(
        ins[0], ins[1])


_KINDS = ["gelu", "soft_max", "norm"] + [f"{op}-{lay}" for op in ("add", "sub", "mul", "div")
                                          for lay in ("bias", "same")]
# (a masked F32 softmax takes the CPU's ggml-order variant first, also compiled)
_JIT_FUNCS = {"gelu": cpu_jit.gelu_erf, "soft_max": soft_max_ggml.soft_max, "norm": cpu_jit.norm}
_NUMPY_FUNCS = {"gelu": special.gelu_erf_f32, "soft_max": fastpath.soft_max,
                "norm": fastpath.norm}


def _run(kind: str, jit: str, monkeypatch):
    """Build and compute ``kind``'s graph with ``GGMLPY_JIT=jit`` on a one-thread CPU backend;
    returns (result, inputs, the step's function)."""
    monkeypatch.setenv(env.JIT, jit)
    rng = np.random.default_rng(len(kind))
    ctx, out, ins = _graph(kind, rng)
    buf = alloc_ctx(ctx)
    buf.set_usage(BufferUsage.COMPUTE)  # as a graph allocator's: steps are the kernels' own
    backend = backend_cpu_init()
    backend.set_n_threads(1)
    try:
        arrays = []
        for t, v in ins.items():
            v = np.ascontiguousarray(v, np.float32).reshape(t.ne[::-1])
            backend_tensor_set(t, v)
            arrays.append(v)
        g = Graph(64)
        g.build_forward_expand(out)
        plan = backend.graph_plan_create(g)
        assert len(plan.steps) == 1
        backend.graph_plan_compute(plan)
        return backend_tensor_get(out), arrays, plan.steps[0].func
    finally:
        backend.free()
        buf.free()


@pytest.mark.parametrize("kind", _KINDS)
def test_graph_paths_jit_vs_numpy(kind, monkeypatch) -> None:
    got, ins, fn = _run(kind, "1", monkeypatch)
    got0, _, fn0 = _run(kind, "0", monkeypatch)
    if kind in _JIT_FUNCS:
        assert fn is _JIT_FUNCS[kind] and fn0 is _NUMPY_FUNCS[kind]
    else:
        assert ins[0].size >= JIT_MIN_ELEMENTS
        assert fn is cpu_jit.binary and fn0 is not cpu_jit.binary
    ref = _reference(kind, ins)
    if kind == "gelu":
        tol = BOUND * np.maximum(1.0, np.abs(ins[0].astype(np.float64)))
        assert np.all(np.abs(got - ref) <= tol)
        assert np.all(np.abs(got.astype(np.float64) - got0) <= 2 * tol)
    elif kind == "soft_max":
        _assert_sm_close(got, ref)
        np.testing.assert_allclose(got0, got, rtol=1e-5, atol=1e-7)
    elif kind == "norm":
        _assert_norm_close(got, ins[0], 1e-12)
        np.testing.assert_allclose(got0, got, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got.view(np.int32), ref.astype(np.float32).view(np.int32))
        np.testing.assert_array_equal(got0.view(np.int32), got.view(np.int32))


def test_graph_bad_env_value_raises_at_plan_build(monkeypatch) -> None:
    monkeypatch.setenv(env.JIT, "on")
    with pytest.raises(EnvError, match="GGMLPY_JIT"):
        _run("gelu", "on", monkeypatch)
