"""Numeric tests of the copy and layout kernels: DUP, CONT, CPY (type conversions, reshaping and
strided copies), REPEAT, CONCAT, GET_ROWS, SET, ACC, PAD (zero and circular), ARANGE,
TIMESTEP_EMBEDDING and DIAG_MASK_INF/ZERO, on the CPU backend against NumPy references.

Tolerances: copies, gathers and masks move values and must be bit exact (``assert_array_equal``);
conversions to F16 must equal NumPy's round-to-nearest-even cast, f32 -> i32 must truncate
toward zero. ACC adds once (rtol 2e-7: one float32 rounding). TIMESTEP_EMBEDDING evaluates
cos/sin of float32 arguments up to ~1e3 rad: compared with atol 2e-4 (the float32 argument
itself carries up to 6e-5 rad of rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ggml_tile, np_permute, run_graph, uniform

from ggmlpy import ops
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

_TYPES = [Type.F32, Type.F16, Type.I32]


def _values(rng, shape, typ):
    if typ == Type.I32:
        return rng.integers(-1000, 1000, size=shape).astype(np.int32)
    return uniform(rng, shape, -150, 150, dtype=typ.dtype)


def _convert(x: np.ndarray, typ: Type) -> np.ndarray:
    """Independent reference of ggml's element conversion through float32."""
    if x.dtype == typ.dtype:
        return x
    f = x.astype(np.float32)
    if typ == Type.I32:
        return np.trunc(f).astype(np.int32)
    return f.astype(typ.dtype)


@pytest.mark.parametrize("src_t", _TYPES)
@pytest.mark.parametrize("dst_t", _TYPES)
def test_cpy_type_conversions_transposed(src_t, dst_t):
    rng = np.random.default_rng(int(src_t) * 31 + int(dst_t))
    ctx = Context()
    a = ctx.new_tensor(src_t, (6, 5, 3))
    at = ops.transpose(ctx, a)                          # [5, 6, 3], non-contiguous
    b = ctx.new_tensor(dst_t, (5, 6, 3))
    out = ops.cpy(ctx, at, b)
    A = _values(rng, a.ne[::-1], src_t)
    (r,) = run_graph(ctx, [out], {a: A})
    np.testing.assert_array_equal(r, _convert(np_permute(A, (1, 0, 2, 3)), dst_t))


def test_cpy_f32_to_i32_truncates_toward_zero():
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (6,))
    b = ctx.new_tensor(Type.I32, (6,))
    out = ops.cpy(ctx, a, b)
    (r,) = run_graph(ctx, [out], {a: np.array([1.9, -1.9, 0.5, -0.5, 7.0, -2.2], np.float32)})
    np.testing.assert_array_equal(r.reshape(-1), [1, -1, 0, 0, 7, -2])


def test_cpy_reshaping_and_into_strided_view():
    rng = np.random.default_rng(5)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (6, 4, 2))
    ap = ops.permute(ctx, a, 2, 0, 1, 3)               # non-contiguous source
    b = ctx.new_tensor(Type.F32, (8, 6))               # other shape, same count
    out1 = ops.cpy(ctx, ap, b)
    big = ctx.new_tensor(Type.F32, (10, 8))
    dst_view = ops.view_2d(ctx, big, 6, 8, big.nb[1], 4 * 2)   # strided destination rows
    src2 = ctx.new_tensor(Type.F32, (6, 8))
    out2 = ops.cpy(ctx, src2, dst_view)
    A = uniform(rng, a.ne[::-1])
    S2 = uniform(rng, src2.ne[::-1])
    BIG = uniform(rng, big.ne[::-1])
    r1, r2, rbig = run_graph(ctx, [out1, out2, big], {a: A, src2: S2, big: BIG})
    np.testing.assert_array_equal(r1.reshape(-1), np_permute(A, (2, 0, 1, 3)).reshape(-1))
    expect_big = BIG.reshape(8, 10).copy()
    expect_big[:, 2:8] = S2.reshape(8, 6)
    np.testing.assert_array_equal(rbig.reshape(8, 10), expect_big)   # rest of big untouched
    np.testing.assert_array_equal(r2.reshape(8, 6), S2.reshape(8, 6))


@pytest.mark.parametrize("typ", _TYPES)
def test_dup_cont_cont4d_cast(typ):
    rng = np.random.default_rng(6)
    ctx = Context()
    a = ctx.new_tensor(typ, (4, 3, 5, 2))
    p = ops.permute(ctx, a, 3, 1, 0, 2)
    d = ops.dup(ctx, p)
    c = ops.cont(ctx, p)
    c4 = ops.cont_4d(ctx, p, 10, 3, 1, 4)
    cast = ops.cast(ctx, p, Type.F32)
    A = _values(rng, a.ne[::-1], typ)
    rd, rc, rc4, rcast = run_graph(ctx, [d, c, c4, cast], {a: A})
    P = np_permute(A, (3, 1, 0, 2))
    np.testing.assert_array_equal(rd, P)
    np.testing.assert_array_equal(rc, P)
    np.testing.assert_array_equal(rc4, P.reshape(rc4.shape))
    np.testing.assert_array_equal(rcast, P.astype(np.float32))


@pytest.mark.parametrize("typ", _TYPES)
def test_repeat(typ):
    rng = np.random.default_rng(7)
    ctx = Context()
    a = ctx.new_tensor(typ, (3, 2, 2, 1))
    r1 = ops.repeat_4d(ctx, a, 6, 4, 2, 3)
    r2 = ops.repeat_4d(ctx, ops.transpose(ctx, a), 4, 6, 4, 2)  # from a strided source
    A = _values(rng, a.ne[::-1], typ)
    o1, o2 = run_graph(ctx, [r1, r2], {a: A})
    np.testing.assert_array_equal(o1, np.tile(A, (3, 1, 2, 2)))
    np.testing.assert_array_equal(o2, np.tile(np_permute(A, (1, 0, 2, 3)), (2, 2, 2, 2)))


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
@pytest.mark.parametrize("typ", [Type.F32, Type.I32])
def test_concat(dim, typ):
    rng = np.random.default_rng(8 + dim)
    ctx = Context()
    ne_a = [4, 3, 2, 2]
    ne_b = list(ne_a)
    ne_b[dim] = 5
    a = ctx.new_tensor(typ, ne_a)
    bb = ctx.new_tensor(typ, (ne_b[1], ne_b[0], ne_b[2], ne_b[3]))
    b = ops.transpose(ctx, bb)                              # non-contiguous second source
    out = ops.concat(ctx, a, b, dim)
    A = _values(rng, a.ne[::-1], typ)
    BB = _values(rng, bb.ne[::-1], typ)
    (r,) = run_graph(ctx, [out], {a: A, bb: BB})
    np.testing.assert_array_equal(r, np.concatenate([A, np_permute(BB, (1, 0, 2, 3))], axis=3 - dim))


@pytest.mark.parametrize("src_t", _TYPES)
def test_get_rows(src_t):
    rng = np.random.default_rng(9)
    ctx = Context()
    a = ctx.new_tensor(src_t, (7, 10))
    idx = ctx.new_tensor(Type.I32, (5,))
    out = ops.get_rows(ctx, a, idx)
    a3 = ctx.new_tensor(src_t, (4, 6, 3, 2))                # batched: per (i2, i3) row tables
    idx3 = ctx.new_tensor(Type.I32, (5, 3, 2))
    out3 = ops.get_rows(ctx, a3, idx3)
    A = _values(rng, a.ne[::-1], src_t)
    I = rng.integers(0, 10, size=5).astype(np.int32)
    A3 = _values(rng, a3.ne[::-1], src_t)
    I3 = rng.integers(0, 6, size=(2, 3, 5)).astype(np.int32)
    r, r3 = run_graph(ctx, [out, out3], {a: A, idx: I, a3: A3, idx3: I3})
    want_t = np.int32 if src_t == Type.I32 else np.float32
    assert r.dtype == want_t
    np.testing.assert_array_equal(r.reshape(5, 7), A.reshape(10, 7)[I].astype(want_t))
    ref3 = np.empty((2, 3, 5, 4), want_t)
    for i3 in range(2):
        for i2 in range(3):
            for i in range(5):
                ref3[i3, i2, i] = A3[i3, i2, I3[i3, i2, i]]
    np.testing.assert_array_equal(r3, ref3)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("typ", [Type.F32, Type.I32])
def test_set(inplace, typ):
    rng = np.random.default_rng(10)
    ctx = Context()
    a0 = ctx.new_tensor(typ, (8, 6, 3))
    a = ops.cont(ctx, a0)              # computed, so an in-place SET leaves the input alone
    b = ctx.new_tensor(typ, (3, 2, 2))
    nb1, nb2, off = a.nb[1], a.nb[2], 2 * a.nb[0] + 1 * a.nb[1]
    fn = ops.set_inplace if inplace else ops.set
    out = fn(ctx, a, b, nb1, nb2, a.nb[3], off)
    A = _values(rng, a0.ne[::-1], typ)
    B = _values(rng, b.ne[::-1], typ)
    (r,) = run_graph(ctx, [out], {a0: A, b: B})
    ref = A.copy()
    ref[0, 0:2, 1:3, 2:5] = B[0]
    np.testing.assert_array_equal(r, ref)


@pytest.mark.parametrize("inplace", [False, True])
def test_acc(inplace):
    rng = np.random.default_rng(11)
    ctx = Context()
    a0 = ctx.new_tensor(Type.F32, (16, 5, 2, 3))
    a = ops.cont(ctx, a0)
    b = ctx.new_tensor(Type.F32, (4, 3, 2, 2))
    # strides of a, b placed at element (1, 2, 0, 1); rows of b skip every other row of a
    nb1, nb2, nb3 = 2 * a.nb[1] // 2, a.nb[2], a.nb[3]
    off = 1 * a.nb[0] + 2 * a.nb[1] + 1 * a.nb[3]
    fn = ops.acc_inplace if inplace else ops.acc
    out = fn(ctx, a, b, nb1, nb2, nb3, off)
    A = uniform(rng, a0.ne[::-1])
    B = uniform(rng, b.ne[::-1])
    (r,) = run_graph(ctx, [out], {a0: A, b: B})
    ref = A.astype(np.float64)
    ref[1:3, 0:2, 2:5, 1:5] += B.reshape(2, 2, 3, 4)[:, :, :, :].astype(np.float64)[:2]
    np.testing.assert_allclose(r, ref, rtol=2e-7, atol=1e-7)  # one float32 rounding per sum


def test_pad_zero_and_circular():
    rng = np.random.default_rng(12)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (5, 4, 3, 2))
    p = ops.pad_ext(ctx, ops.transpose(ctx, a), 1, 2, 0, 3, 2, 0, 1, 1)
    p2 = ops.pad(ctx, a, 3, 0, 1, 0)
    # circular padding: ggml's pad_ext_circular (op_params slot 8 = 1); ggmlpy.ops builds only the
    # zero form, so this node is the zero-pad node with the flag set
    pc = ops.pad_ext(ctx, a, 2, 1, 1, 2, 0, 1, 0, 0)
    pc.op_params[8] = 1
    A = uniform(rng, a.ne[::-1])
    rp, rp2, rpc = run_graph(ctx, [p, p2, pc], {a: A})
    At = np_permute(A, (1, 0, 2, 3))
    np.testing.assert_array_equal(rp, np.pad(At, [(1, 1), (2, 0), (0, 3), (1, 2)]))
    np.testing.assert_array_equal(rp2, np.pad(A, [(0, 0), (0, 1), (0, 0), (0, 3)]))
    ref_c = np.empty(rpc.shape, np.float32)
    for i3 in range(rpc.shape[0]):
        for i2 in range(rpc.shape[1]):
            for i1 in range(rpc.shape[2]):
                for i0 in range(rpc.shape[3]):
                    ref_c[i3, i2, i1, i0] = A[i3 % 2, (i2 - 0) % 3, (i1 - 1) % 4, (i0 - 2) % 5]
    np.testing.assert_array_equal(rpc, ref_c)


def test_arange_and_timestep_embedding():
    rng = np.random.default_rng(13)
    ctx = Context()
    ar = ops.arange(ctx, -1.5, 7.25, 0.5)
    t = ctx.new_tensor(Type.F32, (6,))
    te_even = ops.timestep_embedding(ctx, t, 16, 10000)
    te_odd = ops.timestep_embedding(ctx, t, 9, 100)
    T = rng.uniform(0, 1000, size=6).astype(np.float32)
    rar, re, ro = run_graph(ctx, [ar, te_even, te_odd], {t: T})
    n = int(np.ceil((7.25 + 1.5) / 0.5))
    # start + step*i in float32: exact for these dyadic values
    np.testing.assert_array_equal(rar.reshape(-1), -1.5 + 0.5 * np.arange(n))
    for r, dim, mp in ((re, 16, 10000), (ro, 9, 100)):
        half = dim // 2
        f = np.exp(-np.log(mp) * np.arange(half) / half)
        arg = T.astype(np.float64)[:, None] * f[None, :]
        ref = np.zeros((6, dim))
        ref[:, :half] = np.cos(arg)
        ref[:, half:2 * half] = np.sin(arg)
        np.testing.assert_allclose(r.reshape(6, dim), ref, rtol=0, atol=2e-4)


@pytest.mark.parametrize("op", [Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO])
@pytest.mark.parametrize("inplace", [False, True])
def test_diag_mask(op, inplace):
    rng = np.random.default_rng(14)
    ctx = Context()
    a0 = ctx.new_tensor(Type.F32, (7, 5, 3))
    a = ops.cont(ctx, a0)
    name = "diag_mask_inf" if op == Op.DIAG_MASK_INF else "diag_mask_zero"
    out = getattr(ops, name + ("_inplace" if inplace else ""))(ctx, a, 2)
    A = uniform(rng, a0.ne[::-1])
    (r,) = run_graph(ctx, [out], {a0: A})
    ref = A.copy()
    fill = -np.inf if op == Op.DIAG_MASK_INF else 0.0
    for i1 in range(5):
        for i0 in range(7):
            if i0 > 2 + i1:
                ref[..., i1, i0] = fill
    np.testing.assert_array_equal(r.reshape(ref.shape), ref)


def test_tile_reference_sanity():
    # the tiling reference used by the binary tests is np.tile (index modulo)
    b = np.arange(6).reshape(1, 1, 2, 3)
    t = ggml_tile(b, (1, 1, 4, 6))
    assert t[0, 0, 3, 4] == b[0, 0, 3 % 2, 4 % 3]
