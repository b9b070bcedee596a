"""Ops on BF16, F16 and block-quantized tensors (issue 12 item 3) on the CPU and SIM backends:
MUL_MAT with a converted weight, GET_ROWS that dequantizes, CPY/DUP/CONT between every pair.

MUL_MAT takes one of two numeric paths (``GGMLPY_QUANT_MATMUL``): ``ggml`` (the default) runs
ggml's quantized-activation dot products below the type's batch crossover; its reference is the
vec_dot referee (:mod:`ggmlpy.quants.vec_dot`, ggml's generic loops) on the activations quantized
as ggml quantizes them: for block types exact without Numba and within the compiled kernels'
bound ``(4 nb + 16) * 2**-23 * sum|terms|`` with it (helpers.lanes_bound); for F16/BF16 within
``ulp32 + K * eps64 * sum|x w|`` without Numba and ``(K // 64 + 8) * 2**-24 * sum|x w|`` with it. Larger batches (the GEMM path) keep those
numerics: the referee within the float32 summation-order bound of
:mod:`ggmlpy.backends.cpu.qgemm` (``tests/qgemm_ref.py``). ``dequant`` multiplies the exact weight
values in float32:

References: the weight's float values are ``ggmlpy.dequantize`` of its bytes (bit-exact with
ggml's ``dequantize_row_*``, held by test_quants.py against ggml's C vectors); products are then
computed in float64. Tolerance for MUL_MAT: float32 GEMM of K-term sums, ``atol = 2e-6 * sqrt(K)
* max|w|``, ``rtol = 1e-5`` (the same bound as test_kernels_matmul.py, scaled by the weight's
magnitude). Copies into a block type must equal ``ggmlpy.quantize`` byte for byte; copies out of
one must equal ``ggmlpy.dequantize`` exactly (no tolerance).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import BLOCK_TYPES, _backend, alloc_ctx, dot_abs_terms, lanes_bound
from qgemm_ref import ggml_gemm_expected

from ggmlpy import ops
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu import qmatmul
from ggmlpy.backends.kernels import supports_op, typeconv
from ggmlpy.core import env
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize, fp32_to_bf16, quantize, vec_dot

QTYPES = list(BLOCK_TYPES)
WTYPES = QTYPES + [Type.F16, Type.BF16]


def _encode(t: Type, x: np.ndarray) -> np.ndarray:
    """Bytes of float32 ``x`` (NumPy shape ne[::-1]) in type ``t``, as a flat uint8 array."""
    return quantize(x, t).reshape(-1)


def _values(t: Type, raw: np.ndarray, ne) -> np.ndarray:
    return dequantize(raw, t, ne)


def _run(ctx, outs, inputs, backend=None):
    """Allocate ``ctx`` on the CPU, write raw bytes / arrays, compute, read back raw bytes."""
    buf = alloc_ctx(ctx)
    try:
        for t, arr in inputs.items():
            backend_tensor_set(t, np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
        g = Graph(256)
        for t in outs:
            g.build_forward_expand(t)
        (backend or _backend()).graph_compute(g)
        return [np.asarray(backend_tensor_get(t)).reshape(-1).view(np.uint8).copy() for t in outs]
    finally:
        buf.free()


def _f32(raw):
    return raw.view(np.float32)


# ---------------------------------------------------------------------------------------------
# MUL_MAT


def _mm_ref(W, B):
    """W (A3, A2, M, K), B (B3, B2, N, K) -> (B3, B2, N, M) in float64 with ggml's broadcast."""
    A3, A2 = W.shape[:2]
    B3, B2 = B.shape[:2]
    out = np.zeros(B.shape[:3] + (W.shape[2],))
    for l in range(B3):
        for k in range(B2):
            out[l, k] = B[l, k].astype(np.float64) @ W[l // (B3 // A3), k // (B2 // A2)].astype(np.float64).T
    return out


def _dot_ref(t: Type, raw: np.ndarray, ne_a, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ggml path's expected result: per batch matrix, the referee ``vec_dot`` of the weight
    rows with ``B`` quantized to the ``vec_dot_type``; and sum|x w| (float64) for the F16/BF16
    bound, the sum of the vec_dot terms' magnitudes otherwise (float64). ``raw``: the weight's
    bytes, ``ne_a`` its ne; ``B`` (B3, B2, N, K) float32."""
    A3, A2, M = ne_a[3], ne_a[2], ne_a[1]
    rows = raw.reshape(A3, A2, M, -1)
    B3, B2 = B.shape[:2]
    out = np.zeros(B.shape[:3] + (M,), np.float32)
    mag = np.zeros(B.shape[:3] + (M,))
    for l in range(B3):
        for k in range(B2):
            w = rows[l // (B3 // A3), k // (B2 // A2)]
            act = qmatmul.quantize_act(vec_dot.VEC_DOT_TYPE[t], np.ascontiguousarray(B[l, k]))
            out[l, k] = vec_dot.vec_dot(t, w, qmatmul.act_bytes(act))
            mag[l, k] = dot_abs_terms(t, w, qmatmul.act_bytes(act))
    return out, mag


def _check_gemm_ggml(t: Type, got: np.ndarray, raw: np.ndarray, ne_a, B: np.ndarray) -> None:
    """The GEMM path under ggml numerics: the referee within the float32 summation-order bound
    (:func:`qgemm_ref.ggml_gemm_expected`), per batch matrix."""
    A3, A2, M = ne_a[3], ne_a[2], ne_a[1]
    rows = raw.reshape(A3, A2, M, -1)
    B3, B2 = B.shape[:2]
    for l in range(B3):
        for k in range(B2):
            want, bound = ggml_gemm_expected(t, rows[l // (B3 // A3), k // (B2 // A2)], B[l, k])
            assert (np.abs(got[l, k].astype(np.float64) - want) <= bound).all()


def _check_mm(t: Type, got: np.ndarray, raw: np.ndarray, ne_a, B: np.ndarray, dot: bool) -> None:
    if dot:
        want, mag = _dot_ref(t, raw, ne_a, B)
        if t in (Type.F16, Type.BF16) and not qmatmul.jit_available():
            bound = np.spacing(np.abs(want)) + ne_a[0] * np.finfo(np.float64).eps * mag
            assert (np.abs(got.astype(np.float64) - want) <= bound).all()
        elif qmatmul.jit_available():  # float32 lanes: within the kernels' bound of the referee
            assert (np.abs(got.astype(np.float64) - want) <= lanes_bound(t, ne_a[0], mag)).all()
        else:
            np.testing.assert_array_equal(got, want)
        return
    W = _values(t, raw, ne_a)
    np.testing.assert_allclose(got, _mm_ref(W, B), rtol=1e-5,
                               atol=2e-6 * np.sqrt(ne_a[0]) * np.abs(W).max())


@pytest.mark.parametrize("mode", ["ggml", "fast", "dot", "dequant"])
@pytest.mark.parametrize("t", WTYPES)
@pytest.mark.parametrize("m,n,bs,nr", [(7, 1, (1, 1), (1, 1)), (300, 5, (1, 1), (1, 1)),
                                       (5, 3, (2, 3), (2, 1)), (9, 40, (1, 1), (1, 1)),
                                       (9, 70, (1, 1), (1, 1)), (9, 300, (1, 1), (1, 1))])
def test_mul_mat_converted_weight_matches_float64(t, m, n, bs, nr, mode, monkeypatch):
    monkeypatch.setenv(env.QUANT_MATMUL, mode)
    k = 512 if t.blck_size == 256 else 96
    rng = np.random.default_rng(int(t) * 31 + m)
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(t, (k, m, bs[0], bs[1]))
    b = ctx.new_tensor(Type.F32, (k, n, bs[0] * nr[0], bs[1] * nr[1]))
    out = ops.mul_mat(ctx, a, b)
    assert supports_op(out, np)
    w = rng.uniform(-1, 1, a.ne[::-1]).astype(np.float32)
    raw = _encode(t, w)
    B = rng.uniform(-1, 1, b.ne[::-1]).astype(np.float32)
    (r,) = _run(ctx, [out], {a: raw, b: B})
    # dot: the block dot products (ggml: at every batch for the block types; fast: below the
    # type's crossover, n = 300 is past every one)
    dot = qmatmul.chooses_dot(t, Type.F32, n)
    assert dot == (mode == "dot" or (mode == "ggml" and t not in (Type.F16, Type.BF16))
                   or (mode in ("ggml", "fast") and n < qmatmul.CROSSOVER[t]))
    if mode in ("ggml", "fast") and not dot:
        _check_gemm_ggml(t, _f32(r).reshape(out.ne[::-1]), raw, a.ne, B)
        return
    _check_mm(t, _f32(r).reshape(out.ne[::-1]), raw, a.ne, B, dot)


def test_mul_mat_row_blocks_cover_every_row_and_tail(monkeypatch):
    monkeypatch.setenv(env.QUANT_MATMUL, "dequant")
    # M not a multiple of the row block: the last block is short; every column must be written
    k = 4096
    m = typeconv.MIN_BLOCK_ROWS * 3 + 3
    assert typeconv.block_rows(m, k) < m  # several blocks
    rng = np.random.default_rng(5)
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(Type.Q8_0, (k, m))
    b = ctx.new_tensor(Type.F32, (k, 2))
    out = ops.mul_mat(ctx, a, b)
    raw = _encode(Type.Q8_0, rng.uniform(-1, 1, (m, k)).astype(np.float32))
    B = rng.uniform(-1, 1, (2, k)).astype(np.float32)
    (r,) = _run(ctx, [out], {a: raw, b: B})
    ref = B.astype(np.float64) @ _values(Type.Q8_0, raw, a.ne).reshape(m, k).astype(np.float64).T
    np.testing.assert_allclose(_f32(r).reshape(2, m), ref, rtol=1e-5, atol=2e-6 * np.sqrt(k))


def test_mul_mat_f16_weight_with_f16_activations():
    rng = np.random.default_rng(2)
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(Type.F16, (40, 9))
    b = ctx.new_tensor(Type.F16, (40, 4))
    out = ops.mul_mat(ctx, a, b)
    A = rng.uniform(-1, 1, (9, 40)).astype(np.float16)
    B = rng.uniform(-1, 1, (4, 40)).astype(np.float16)
    (r,) = _run(ctx, [out], {a: A, b: B})
    np.testing.assert_allclose(_f32(r).reshape(4, 9), B.astype(np.float64) @ A.astype(np.float64).T,
                               rtol=1e-5, atol=2e-6 * np.sqrt(40))


@pytest.mark.parametrize("mode", ["ggml", "dot", "dequant"])
def test_mul_mat_sees_a_weight_written_between_calls(mode, monkeypatch):
    # no converted copy survives a call: rewriting the weight changes the next result
    monkeypatch.setenv(env.QUANT_MATMUL, mode)
    rng = np.random.default_rng(3)
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(Type.Q8_0, (32, 4))
    b = ctx.new_tensor(Type.F32, (32, 1))
    out = ops.mul_mat(ctx, a, b)
    buf = alloc_ctx(ctx)
    try:
        g = Graph(16)
        g.build_forward_expand(out)
        B = rng.uniform(-1, 1, (1, 32)).astype(np.float32)
        backend_tensor_set(b, B)
        for _ in range(2):
            raw = _encode(Type.Q8_0, rng.uniform(-1, 1, (4, 32)).astype(np.float32))
            backend_tensor_set(a, raw)
            _backend().graph_compute(g)
            got = np.asarray(backend_tensor_get(out)).reshape(1, 1, 1, 4)
            _check_mm(Type.Q8_0, got, raw, a.ne, B.reshape(1, 1, 1, 32), mode != "dequant")
    finally:
        buf.free()


def test_mul_mat_refuses_quantized_weight_with_f16_activations():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(Type.Q8_0, (64, 4))
    assert not supports_op(ops.mul_mat(ctx, a, ctx.new_tensor(Type.F16, (64, 2))), np)
    # OUT_PROD stays float-only
    assert not supports_op(ops.out_prod(ctx, ctx.new_tensor(Type.Q8_0, (32, 4)),
                                        ctx.new_tensor(Type.F32, (32, 4))), np)


# ---------------------------------------------------------------------------------------------
# GET_ROWS


@pytest.mark.parametrize("t", WTYPES)
@pytest.mark.parametrize("batched", [False, True])
def test_get_rows_dequantizes_selected_rows_exactly(t, batched):
    k = 256
    rng = np.random.default_rng(int(t) + 7 * batched)
    ne2 = 3 if batched else 1
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(t, (k, 10, ne2, 1))
    idx = ctx.new_tensor(Type.I32, (6, ne2, 1))
    out = ops.get_rows(ctx, a, idx)
    assert supports_op(out, np)
    raw = _encode(t, rng.uniform(-2, 2, a.ne[::-1]).astype(np.float32))
    I = rng.integers(0, 10, (1, ne2, 6)).astype(np.int32)
    (r,) = _run(ctx, [out], {a: raw, idx: I})
    W = _values(t, raw, a.ne)
    ref = np.stack([W[0, j][I[0, j]] for j in range(ne2)])[None]
    np.testing.assert_array_equal(_f32(r).reshape(out.ne[::-1]), ref)


# ---------------------------------------------------------------------------------------------
# CPY / DUP / CONT


@pytest.mark.parametrize("t", WTYPES)
def test_cpy_f32_to_type_is_bit_exact_with_the_reference_quantizer(t):
    rng = np.random.default_rng(int(t))
    ctx = Context(no_alloc=True)
    src = ctx.new_tensor(Type.F32, (256, 3, 2))
    dst = ctx.new_tensor(t, (256, 3, 2))
    out = ops.cpy(ctx, src, dst)
    assert supports_op(out, np)
    x = rng.uniform(-3, 3, src.ne[::-1]).astype(np.float32)
    (r,) = _run(ctx, [out], {src: x})
    np.testing.assert_array_equal(r, _encode(t, x))


@pytest.mark.parametrize("t", WTYPES)
@pytest.mark.parametrize("to", [Type.F32, Type.F16, Type.BF16])
def test_cpy_type_to_float_dequantizes_exactly(t, to):
    rng = np.random.default_rng(int(t) * 3 + int(to))
    ctx = Context(no_alloc=True)
    src = ctx.new_tensor(t, (512, 2))
    dst = ctx.new_tensor(to, (256, 4))  # other shape, same count: logical row-major order
    out = ops.cpy(ctx, src, dst)
    raw = _encode(t, rng.uniform(-3, 3, (2, 512)).astype(np.float32))
    (r,) = _run(ctx, [out], {src: raw})
    want = _encode(to, _values(t, raw, src.ne).reshape(4, 256))
    np.testing.assert_array_equal(r, want)


@pytest.mark.parametrize("pair", [(Type.Q8_0, Type.Q4_0), (Type.Q4_K, Type.Q8_0),
                                  (Type.BF16, Type.Q6_K), (Type.Q5_1, Type.BF16)])
def test_cpy_between_block_types_goes_through_float32(pair):
    ta, tb = pair
    rng = np.random.default_rng(int(ta) * 100 + int(tb))
    ctx = Context(no_alloc=True)
    src = ctx.new_tensor(ta, (256, 4))
    dst = ctx.new_tensor(tb, (256, 4))
    out = ops.cpy(ctx, src, dst)
    raw = _encode(ta, rng.uniform(-1, 1, (4, 256)).astype(np.float32))
    (r,) = _run(ctx, [out], {src: raw})
    np.testing.assert_array_equal(r, _encode(tb, _values(ta, raw, src.ne)))


def test_cont_of_a_transposed_f32_into_q8_0_and_dup_of_bf16():
    rng = np.random.default_rng(9)
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor(Type.F32, (4, 64))
    dst = ctx.new_tensor(Type.Q8_0, (64, 4))
    out = ops.cpy(ctx, ops.transpose(ctx, x), dst)
    bsrc = ctx.new_tensor(Type.BF16, (32, 2))
    dup = ops.dup(ctx, bsrc)
    X = rng.uniform(-1, 1, (64, 4)).astype(np.float32)
    Bb = fp32_to_bf16(rng.uniform(-1, 1, (2, 32)).astype(np.float32))
    r, rd = _run(ctx, [out, dup], {x: X, bsrc: Bb})
    np.testing.assert_array_equal(r, _encode(Type.Q8_0, np.ascontiguousarray(X.T)))
    np.testing.assert_array_equal(rd, Bb.view(np.uint8).reshape(-1))


def test_bf16_rounding_is_ggmls_nearest_even():
    # values half-way between two bf16 numbers round to the even one; NaN stays a quiet NaN
    ctx = Context(no_alloc=True)
    src = ctx.new_tensor(Type.F32, (4,))
    dst = ctx.new_tensor(Type.BF16, (4,))
    out = ops.cpy(ctx, src, dst)
    u = np.array([0x3F808000, 0x3F818000, 0x7F800001, 0xBF80FFFF], np.uint32)
    (r,) = _run(ctx, [out], {src: u.view(np.float32)})
    np.testing.assert_array_equal(r.view(np.uint16), [0x3F80, 0x3F82, 0x7FC0, 0xBF81])


def test_copy_support_is_refused_where_the_kernel_cannot_run():
    ctx = Context(no_alloc=True)
    # an integer type mixed with a block type
    assert not supports_op(ops.cpy(ctx, ctx.new_tensor(Type.I32, (32, 2)),
                                   ctx.new_tensor(Type.Q8_0, (32, 2))), np)
    # quantizing runs on the host only: a device array module is refused
    fake_xp = object()
    assert not supports_op(ops.cpy(ctx, ctx.new_tensor(Type.F32, (32, 2)),
                                   ctx.new_tensor(Type.Q8_0, (32, 2))), fake_xp)
    assert supports_op(ops.cpy(ctx, ctx.new_tensor(Type.Q8_0, (32, 2)),
                               ctx.new_tensor(Type.F32, (32, 2))), fake_xp)


def test_cpy_between_same_block_type_of_other_shape_copies_the_bytes():
    # a reshaping copy within one block type is ggml's memcpy, not dequantize + quantize
    rng = np.random.default_rng(11)
    ctx = Context(no_alloc=True)
    src = ctx.new_tensor(Type.Q4_K, (512, 2))
    dst = ctx.new_tensor(Type.Q4_K, (256, 4))
    out = ops.cpy(ctx, src, dst)
    raw = rng.integers(0, 256, src.nbytes, dtype=np.uint8)
    raw.reshape(-1, 144)[:, :4] = np.array([0.01, 0.01], np.float16).view(np.uint8)  # finite d, dmin
    (r,) = _run(ctx, [out], {src: raw})
    np.testing.assert_array_equal(r, raw)


@pytest.mark.parametrize("m,k", [(1536, 384), (384, 1536), (1, 32), (5000, 256), (257, 2048)])
def test_block_rows_are_balanced_and_cover_the_weight(m, k):
    r = typeconv.block_rows(m, k)
    n = -(-m // r)
    assert 1 <= r <= m and n * r >= m and (n - 1) * r < m
    per = max(typeconv.MIN_BLOCK_ROWS, typeconv.ROW_BLOCK_ELEMS // k)
    assert r >= min(m, per)                       # never a thin block (slow GEMM)
    assert n == 1 or r < 2 * per                  # several blocks: each near the budget
    assert n * r - m < n                          # balanced: the last block is not a thin tail
