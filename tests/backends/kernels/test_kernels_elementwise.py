"""Numeric tests of the element-wise kernels (binary ops with ggml's tiling broadcast, ADD1, SCALE,
CLAMP, LEAKY_RELU, SQR..COS, UNARY, GLU) on the CPU backend against float64 NumPy references.

Tolerances (float32 results): an op that is one float32 rounding of an exact value is compared
with ``rtol=2e-7`` (the rounding is at most 2^-24 ~ 6e-8 relative); composite formulas (several
float32 steps, libm tanh/exp) use ``rtol=1e-5`` plus a small ``atol`` for cancellation near 0;
F16 results (one rounding to float16 after float32 compute) use ``rtol=2e-3`` (2^-11 ~ 4.9e-4
relative per rounding, f16 inputs carry the same).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import ggml_tile, np_permute, run_graph, uniform

from ggmlpy import ops
from ggmlpy.core import env
from ggmlpy.core.opcodes import GluOp, UnaryOp
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

# ---------------------------------------------------------------------------------------------
# binary ops

_BIN = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}

# (a.ne, b.ne): every tiling pattern ggml allows -- equal shapes, NumPy-style singleton
# broadcast, true tiling (1 < b.ne[i] < a.ne[i]) in each dim and several at once, scalar b.
_PATTERNS = [
    ((10, 5, 4, 3), (10, 5, 4, 3)),
    ((10, 5, 4, 3), (10, 1, 1, 1)),
    ((10, 5, 4, 3), (1, 5, 4, 3)),
    ((10, 5, 4, 3), (1, 1, 1, 1)),
    ((10, 5, 4, 3), (5, 5, 4, 3)),
    ((10, 6, 4, 3), (10, 3, 4, 3)),
    ((10, 5, 4, 3), (10, 5, 2, 3)),
    ((10, 5, 4, 6), (10, 5, 4, 3)),
    ((12, 6, 4, 6), (4, 3, 2, 3)),
    ((12, 6, 4, 2), (6, 1, 2, 1)),
    ((16, 1, 1, 1), (16, 1, 1, 1)),
    ((1, 1, 8, 1), (1, 1, 8, 1)),
]


def _binary_case(name, ne_a, ne_b, ta=Type.F32, tb=Type.F32, seed=0, perm_b=False,
                 perm_a=False, inplace=False):
    rng = np.random.default_rng(seed)
    ctx = Context()
    a = ctx.new_tensor(ta, ne_a)
    if perm_b:
        # b stored with dims 0/1 swapped, viewed back through a permute (non-contiguous b)
        b_base = ctx.new_tensor(tb, (ne_b[1], ne_b[0], ne_b[2], ne_b[3]))
        b = ops.permute(ctx, b_base, 1, 0, 2, 3)
    else:
        b_base = b = ctx.new_tensor(tb, ne_b)
    a_in = a
    if perm_a:
        a_base = ctx.new_tensor(ta, (ne_a[0], ne_a[2], ne_a[1], ne_a[3]))
        a_in = ops.permute(ctx, a_base, 0, 2, 1, 3)
    fn = getattr(ops, name + ("_inplace" if inplace else ""))
    out = fn(ctx, a_in, b)
    lo = 0.9 if name == "div" else -1.0
    A = uniform(rng, a.ne[::-1], dtype=ta.dtype)
    Bb = uniform(rng, b_base.ne[::-1], lo, 1.1 if name == "div" else 1.0, dtype=tb.dtype)
    inputs = {b_base: Bb}
    if perm_a:
        Ab = uniform(rng, a_base.ne[::-1], dtype=ta.dtype)
        inputs[a_base] = Ab
        A_log = np_permute(Ab, (0, 2, 1, 3))
    else:
        inputs[a] = A
        A_log = A
    B_log = np_permute(Bb, (1, 0, 2, 3)) if perm_b else Bb
    (r,) = run_graph(ctx, [out], inputs)
    ref = _BIN[name](A_log.astype(np.float64), ggml_tile(B_log.astype(np.float64), A_log.shape))
    return r, ref


@pytest.mark.parametrize("name", list(_BIN))
@pytest.mark.parametrize("ne_a,ne_b", _PATTERNS)
def test_binary_tiling_f32(name, ne_a, ne_b):
    r, ref = _binary_case(name, ne_a, ne_b, seed=hash((name, ne_a, ne_b)) % 1000)
    assert r.dtype == np.float32
    # one float32 rounding of the exact result
    np.testing.assert_allclose(r, ref, rtol=2e-7, atol=0)


@pytest.mark.parametrize("name", list(_BIN))
@pytest.mark.parametrize("ne_a,ne_b", [((10, 6, 4, 3), (5, 3, 4, 1)), ((8, 8, 2, 2), (8, 8, 1, 1))])
def test_binary_noncontiguous_operands(name, ne_a, ne_b):
    # a permuted (dims 1/2 swapped) and b transposed: strided reads, tiling still by index
    r, ref = _binary_case(name, ne_a, ne_b, perm_a=True, perm_b=True, seed=7)
    np.testing.assert_allclose(r, ref, rtol=2e-7, atol=0)  # one f32 rounding


@pytest.mark.parametrize("name", list(_BIN))
@pytest.mark.parametrize("ne_a,ne_b", [((10, 5, 4, 3), (10, 5, 4, 3)), ((12, 6, 4, 2), (4, 3, 2, 1))])
def test_binary_inplace(name, ne_a, ne_b):
    # dst memory == a memory: the kernel must still read every a element before overwriting it
    r, ref = _binary_case(name, ne_a, ne_b, inplace=True, seed=3)
    np.testing.assert_allclose(r, ref, rtol=2e-7, atol=0)  # one f32 rounding


@pytest.mark.parametrize("name", list(_BIN))
@pytest.mark.parametrize("tb", [Type.F16, Type.F32])
def test_binary_f16(name, tb):
    r, ref = _binary_case(name, (10, 6, 4, 3), (5, 3, 4, 1), ta=Type.F16, tb=tb, seed=11)
    assert r.dtype == np.float16
    # inputs are exact f16/f32 values; the result is one f16 rounding of the f32 value
    np.testing.assert_allclose(r.astype(np.float64), ref, rtol=2e-3, atol=1e-4)


def test_add1_and_scale():
    rng = np.random.default_rng(5)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (7, 3, 2))
    s = ctx.new_tensor(Type.F32, (1,))
    o1 = ops.add1(ctx, a, s)
    o2 = ops.scale(ctx, a, 0.37)
    o3 = ops.scale_bias(ctx, a, -1.5, 0.25)
    o4 = ops.scale_inplace(ctx, ops.add(ctx, a, a), 2.0)
    A = uniform(rng, a.ne[::-1])
    S = np.array([0.625], np.float32)
    r1, r2, r3, r4 = run_graph(ctx, [o1, o2, o3, o4], {a: A, s: S})
    A64 = A.astype(np.float64)
    np.testing.assert_allclose(r1, A64 + 0.625, rtol=2e-7, atol=1e-7)  # one rounding (+ tiny |x|)
    # scale factors are stored as float32 (ggml's op_params): use the rounded values
    np.testing.assert_allclose(r2, A64 * np.float32(0.37), rtol=2e-7)
    # s*x + b: two float32 roundings
    np.testing.assert_allclose(r3, A64 * -1.5 + 0.25, rtol=5e-7, atol=1e-7)
    np.testing.assert_allclose(r4, 4 * A64, rtol=2e-7)  # exact doubling of one rounding


def test_clamp_and_leaky_relu():
    rng = np.random.default_rng(6)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (9, 4, 3))
    t = ctx.new_tensor(Type.F32, (9, 4, 3))
    x = ops.add(ctx, a, t)       # a computed tensor, so CLAMP (always in place) does not clobber a
    c = ops.clamp(ctx, x, -0.5, 0.25)
    lr = ops.leaky_relu(ctx, a, 0.1)
    lr_inp = ops.leaky_relu(ctx, ops.add(ctx, a, t), 3.0, inplace=True)
    A = uniform(rng, a.ne[::-1])
    T = uniform(rng, t.ne[::-1])
    rc, rl, rli = run_graph(ctx, [c, lr, lr_inp], {a: A, t: T})
    X = A.astype(np.float32) + T
    # clamp selects input values: exact
    np.testing.assert_array_equal(rc, np.maximum(np.minimum(X, np.float32(0.25)), np.float32(-0.5)))
    A64 = A.astype(np.float64)
    np.testing.assert_allclose(rl, np.maximum(A64, 0) + np.float32(0.1) * np.minimum(A64, 0),
                               rtol=2e-7)  # one rounding
    X64 = X.astype(np.float64)
    np.testing.assert_allclose(rli, np.maximum(X64, 0) + 3.0 * np.minimum(X64, 0), rtol=2e-7)


_SIMPLE = {
    "sqr": (lambda x: x * x, (-2, 2)),
    "sqrt": (np.sqrt, (50, 100)),
    "log": (np.log, (0.9, 1.1)),
    "sin": (np.sin, (-6.5, 6.5)),
    "cos": (np.cos, (-6.5, 6.5)),
}


@pytest.mark.parametrize("name", list(_SIMPLE))
@pytest.mark.parametrize("typ", [Type.F32, Type.F16])
def test_sqr_sqrt_log_sin_cos(name, typ):
    rng = np.random.default_rng(8)
    f, (lo, hi) = _SIMPLE[name]
    ctx = Context()
    base = ctx.new_tensor(typ, (6, 7, 5, 2))
    a = ops.transpose(ctx, base)          # non-contiguous input
    out = getattr(ops, name)(ctx, a)
    inp = getattr(ops, name + "_inplace")(ctx, ops.cont(ctx, a))
    B = uniform(rng, base.ne[::-1], lo, hi, dtype=typ.dtype)
    r, ri = run_graph(ctx, [out, inp], {base: B})
    ref = f(np_permute(B, (1, 0, 2, 3)).astype(np.float64))
    if typ == Type.F32:
        # libm sinf/cosf/logf/sqrtf are correctly rounded or within ~1 ulp: 3e-7 relative,
        # plus 1e-7 absolute for log near 1 where the result approaches 0
        tol = dict(rtol=3e-7, atol=1e-7)
    else:
        tol = dict(rtol=2e-3, atol=1e-3)  # one f16 rounding of the result
    np.testing.assert_allclose(r.astype(np.float64), ref, **tol)
    np.testing.assert_allclose(ri.astype(np.float64), ref, **tol)


# ---------------------------------------------------------------------------------------------
# unary

def _erf64(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


_UNARY_REF = {
    UnaryOp.ABS: np.abs,
    UnaryOp.SGN: np.sign,
    UnaryOp.NEG: np.negative,
    UnaryOp.STEP: lambda x: (x > 0).astype(np.float64),
    UnaryOp.TANH: np.tanh,
    UnaryOp.ELU: lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    UnaryOp.RELU: lambda x: np.maximum(x, 0),
    UnaryOp.SIGMOID: _sigmoid64,
    UnaryOp.GELU: lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    UnaryOp.GELU_QUICK: lambda x: x * _sigmoid64(1.702 * x),
    UnaryOp.SILU: lambda x: x * _sigmoid64(x),
    UnaryOp.HARDSWISH: lambda x: x * np.minimum(1, np.maximum(0, (x + 3) / 6)),
    UnaryOp.HARDSIGMOID: lambda x: np.minimum(1, np.maximum(0, (x + 3) / 6)),
    UnaryOp.EXP: np.exp,
    UnaryOp.GELU_ERF: lambda x: 0.5 * x * (1 + _erf64(x / math.sqrt(2))),
}


@pytest.mark.parametrize("op", list(UnaryOp))
@pytest.mark.parametrize("rng_range", [(-10.0, 10.0), (-150.0, 150.0)])
def test_unary_f32(op, rng_range, monkeypatch):
    # GELU: the float32 formula (the referee); the CPU's default f16 table has its own test
    # (tests/backends/cpu/test_gelu_f16_table.py)
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    rng = np.random.default_rng(int(op) + 100)
    ctx = Context()
    base = ctx.new_tensor(Type.F32, (33, 7, 3, 2))
    view = ops.view_4d(ctx, base, 16, 7, 3, 2, base.nb[1], base.nb[2], base.nb[3], 4 * 5)
    out = ops.unary(ctx, view, op)                                   # strided rows
    inp = ops.unary_inplace(ctx, ops.cont(ctx, view), op)            # dst aliases its source
    B = uniform(rng, base.ne[::-1], *rng_range)
    with np.errstate(over="ignore"):
        r, ri = run_graph(ctx, [out, inp], {base: B})
        # the exact value rounded to float32 (so EXP(150) is inf on both sides)
        ref = _UNARY_REF[op](B[..., 5:21].astype(np.float64)).astype(np.float32)
    # float32 formulas with a few roundings (tanh/exp/expm1 ~1 ulp each): 1e-5 relative; the
    # absolute term covers cancellation where a result crosses 0 and float32 subnormals
    for got in (r, ri):
        with np.errstate(over="ignore", invalid="ignore"):
            np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("op", [UnaryOp.GELU, UnaryOp.SILU, UnaryOp.GELU_ERF, UnaryOp.ABS,
                                UnaryOp.SIGMOID])
def test_unary_f16(op):
    rng = np.random.default_rng(3)
    ctx = Context()
    a = ctx.new_tensor(Type.F16, (64, 3))
    out = ops.unary(ctx, a, op)
    A = uniform(rng, a.ne[::-1], -8, 8, dtype=np.float16)
    (r,) = run_graph(ctx, [out], {a: A})
    assert r.dtype == np.float16
    ref = _UNARY_REF[op](A.astype(np.float64))
    np.testing.assert_allclose(r.astype(np.float64), ref, rtol=2e-3, atol=1e-3)  # one f16 rounding


def test_erf_helper_accuracy():
    # the pure-NumPy erf behind GELU_ERF (ggmlpy.core.special, Cody's rational approximations):
    # float64-accurate against math.erf; 1e-15 absolute is Cody's bound for |x| >= 0.5
    from ggmlpy.core import special

    x = np.concatenate([np.linspace(-7, 7, 20001), np.geomspace(1e-8, 1, 200)])
    np.testing.assert_allclose(special.erf(x), _erf64(x), rtol=1e-14, atol=1e-15)
    # erfc keeps relative accuracy in the tail (what GELU_ERF of large negative inputs needs);
    # 5e-12 relative is the documented bound, 4 orders below float32's 6e-8
    y = np.linspace(-3, 6, 2001)
    erfc_ref = np.vectorize(math.erfc, otypes=[np.float64])(y)
    np.testing.assert_allclose(special.erfc(y), erfc_ref, rtol=5e-12, atol=0)


# ---------------------------------------------------------------------------------------------
# GLU

_ACT = {
    GluOp.REGLU: _UNARY_REF[UnaryOp.RELU],
    GluOp.GEGLU: _UNARY_REF[UnaryOp.GELU],
    GluOp.SWIGLU: _UNARY_REF[UnaryOp.SILU],
    GluOp.GEGLU_ERF: _UNARY_REF[UnaryOp.GELU_ERF],
    GluOp.GEGLU_QUICK: _UNARY_REF[UnaryOp.GELU_QUICK],
}


@pytest.mark.parametrize("op", list(GluOp))
@pytest.mark.parametrize("form", ["halves", "swapped", "split"])
@pytest.mark.parametrize("typ", [Type.F32, Type.F16])
def test_glu(op, form, typ, monkeypatch):
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")  # GEGLU: the formula, as in test_unary_f32
    rng = np.random.default_rng(int(op) * 7 + len(form))
    ctx = Context()
    n = 12
    if form == "split":
        a = ctx.new_tensor(typ, (n, 5, 2, 2))
        g = ctx.new_tensor(typ, (n, 5, 2, 2))
        out = ops.glu_split(ctx, a, g, op)
        A = uniform(rng, a.ne[::-1], -4, 4, dtype=typ.dtype)
        G = uniform(rng, g.ne[::-1], -4, 4, dtype=typ.dtype)
        (r,) = run_graph(ctx, [out], {a: A, g: G})
        x, gate = A.astype(np.float64), G.astype(np.float64)
    else:
        a = ctx.new_tensor(typ, (2 * n, 5, 2, 2))
        out = ops.glu(ctx, a, op, swapped=(form == "swapped"))
        A = uniform(rng, a.ne[::-1], -4, 4, dtype=typ.dtype)
        (r,) = run_graph(ctx, [out], {a: A})
        lo, hi = A[..., :n].astype(np.float64), A[..., n:].astype(np.float64)
        x, gate = (hi, lo) if form == "swapped" else (lo, hi)
    ref = _ACT[op](x) * gate
    assert r.shape == ref.shape
    if typ == Type.F32:
        np.testing.assert_allclose(r, ref, rtol=1e-5, atol=1e-6)  # a few f32 roundings
    else:
        np.testing.assert_allclose(r.astype(np.float64), ref, rtol=3e-3, atol=3e-3)  # f16 out
