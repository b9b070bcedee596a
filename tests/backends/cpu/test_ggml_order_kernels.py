"""The CPU variants that reproduce ggml-cpu's x86 float32 orders (F16 MUL_MAT, SOFT_MAX, Q4_K
and Q6_K MUL_MAT: :mod:`ggmlpy.backends.cpu.sgemm_f16`, :mod:`~ggmlpy.backends.cpu.soft_max_ggml`,
:mod:`~ggmlpy.backends.cpu.repack_q4k`, :mod:`~ggmlpy.backends.cpu.vec_dot_q6k`) against NumPy
transcriptions of the ggml loops they follow, bit for bit, over random shapes and data; each
transcription against float64 (the orders are float32 sums of the right products); the node
choice (the variant selected, and which order for which rows). llama.cpp's own outputs are
checked in test_ggml_order_llamacpp.py.

Fused multiply-adds are emulated in the transcriptions as one float64 multiply-add rounded to
float32 (the product of two float32 values is exact in float64; the float64 sum could round
before the float32 rounding only when it falls within 2**-29 of a float32 rounding boundary).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import eval_mul_mat, run_graph

from ggmlpy import ops
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu import q8k_act, qmatmul, repack_q4k, sgemm_f16, soft_max_ggml, vec_dot_q6k
from ggmlpy.backends.kernels.registry import REGISTRY
from ggmlpy.core import env
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.quants.legacy import gguf_dequantize_blocks
from ggmlpy.quants.q8 import quantize_row_q8_K

F32, F64 = np.float32, np.float64
needs_jit = pytest.mark.skipif(not cpu_jit.available(),
                               reason="the variants need Numba (the jit extra)")


def _fma(a, b, c):
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


def _reduce512(v):
    """``_mm512_reduce_add_ps`` over the last axis (16 lanes): halves added down to one."""
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = (v[..., h:] + v[..., :h]).astype(F32)
    return v[..., 0]


# ---------------------------------------------------------------------------------------------
# F16 MUL_MAT


def _tinyblas_ref(a, b):
    """tinyBLAS<16, __m512>: lane l sums products k = 16 j + l in turn; then the reduce."""
    a32, b32 = a.astype(F32), b.astype(F32)
    N, K = b32.shape
    M = a32.shape[0]
    lanes = np.zeros((N, M, 16), F32)
    for j in range(K // 16):
        p = b32[:, None, 16 * j:16 * j + 16] * a32[None, :, 16 * j:16 * j + 16]
        lanes = (lanes + p).astype(F32)
    return _reduce512(lanes)


def _vec_dot_f16_ref(a, b):
    """ggml_vec_dot_f16 (AVX-512): 4 x 16 lanes over steps of 64, registers 0+2, 1+3, 0+1,
    the reduce, then the k % 64 leftovers added in float64."""
    a32, b32 = a.astype(F32), b.astype(F32)
    N, K = b32.shape
    M = a32.shape[0]
    np_ = K - K % 64
    acc = np.zeros((N, M, 64), F32)
    for i in range(0, np_, 64):
        acc = (acc + b32[:, None, i:i + 64] * a32[None, :, i:i + 64]).astype(F32)
    r = ((acc[..., 0:16] + acc[..., 32:48]).astype(F32)
         + (acc[..., 16:32] + acc[..., 48:64]).astype(F32)).astype(F32)
    s = _reduce512(r).astype(F64)
    for k in range(np_, K):
        s = s + (b32[:, None, k] * a32[None, :, k]).astype(F64)
    return s.astype(F32)


@needs_jit
@pytest.mark.parametrize("M,N,K,A2,B2", [(4, 2, 16, 1, 1), (8, 5, 256, 1, 4), (12, 3, 48, 2, 4),
                                         (256, 9, 256, 1, 4), (20, 1, 256, 1, 4),
                                         (6, 1, 80, 1, 1), (5, 3, 32, 1, 2)])
def test_mul_mat_f16_orders_are_ggml_loops(M, N, K, A2, B2):
    rng = np.random.default_rng(M * 1000 + N * 10 + K)
    a = (rng.standard_normal((1, A2, M, K)) * 2).astype(np.float16)
    b = (rng.standard_normal((1, B2, N, K)) * 2).astype(np.float16)
    tiny = sgemm_f16.uses_tinyblas(M, N, K)
    assert tiny == (N >= 2 and K % 16 == 0 and M % 4 == 0)
    d = np.empty((1, B2, N, M), F32)
    sgemm_f16.mul_mat_f16_step(a, b, d, tiny)()
    for i2 in range(B2):
        ai, bi = a[0, i2 // (B2 // A2)], b[0, i2]
        want = _tinyblas_ref(ai, bi) if tiny else _vec_dot_f16_ref(ai, bi)
        np.testing.assert_array_equal(d[0, i2], want)
        exact = bi.astype(F64) @ ai.astype(F64).T
        np.testing.assert_allclose(d[0, i2], exact, rtol=0, atol=1e-5 * K)


@needs_jit
@pytest.mark.parametrize("M,N", [(6, 7), (35, 6), (70, 13), (3, 1)])
def test_tinyblas_tiles_every_remainder(M, N):
    """The tinyBLAS kernel's 4 x 4 register tiles and the 1 x 4, 4 x 1, 1 x 1 tiles of the rows
    left over (in blocks of 32 weight rows) give every output the order of the lane model, for
    row counts that are no multiples of 4 (which ggml's own dispatch never sends there)."""
    rng = np.random.default_rng(M * 100 + N)
    a = (rng.standard_normal((1, 1, M, 64)) * 3).astype(np.float16)
    b = (rng.standard_normal((1, 1, N, 64)) * 3).astype(np.float16)
    d = np.empty((1, 1, N, M), F32)
    sgemm_f16.mul_mat_f16_step(a, b, d, True)()
    np.testing.assert_array_equal(d[0, 0], _tinyblas_ref(a[0, 0], b[0, 0]))


@needs_jit
def test_mul_mat_f16_strided_operands_and_dst():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((1, 1, 64, 256)).astype(np.float16)[:, :, ::2]      # row stride 2
    b = rng.standard_normal((1, 4, 256, 3)).astype(np.float16).transpose(0, 1, 3, 2)
    big = np.zeros((1, 4, 3, 64), F32)
    d = big[..., ::2]
    sgemm_f16.mul_mat_f16_step(a, b, d, False)()
    for i2 in range(4):
        np.testing.assert_array_equal(d[0, i2], _vec_dot_f16_ref(a[0, 0], b[0, i2]))
    with pytest.raises(ValueError, match="K % 16"):
        sgemm_f16.mul_mat_f16_step(a[..., :40], b[..., :40], d, True)
    with pytest.raises(ValueError, match="do not fit"):
        sgemm_f16.mul_mat_f16_step(a, b[..., :128], d, False)


@needs_jit
@pytest.mark.parametrize("T", [1, 5])
def test_mul_mat_f16_node_takes_the_variant(T, monkeypatch):
    rng = np.random.default_rng(T)
    k = rng.standard_normal((1, 2, 32, 256)).astype(np.float16)
    q = rng.standard_normal((1, 4, T, 256)).astype(np.float16)
    ctx = Context()
    tk = ctx.new_tensor(Type.F16, (256, 32, 2))
    tq = ctx.new_tensor(Type.F16, (256, T, 4))
    node = ops.mul_mat(ctx, tk, tq)
    assert REGISTRY.select(node, np).name == "cpu.jit.mul_mat_f16"
    (y,) = run_graph(ctx, [node], {tk: k[0], tq: q[0]})
    y = y.reshape(4, T, 32)
    for h in range(4):
        ref = (_tinyblas_ref if T >= 2 else _vec_dot_f16_ref)(k[0, h // 2], q[0, h])
        np.testing.assert_array_equal(y[h], ref)
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    assert REGISTRY.select(node, np).name != "cpu.jit.mul_mat_f16"


# ---------------------------------------------------------------------------------------------
# SOFT_MAX

_C = {k: F32(float.fromhex(h)) for k, h in (
    ("r", "0x1.8p23"), ("log2e", "0x1.715476p+0"), ("hi", "0x1.62e4p-1"), ("lo", "0x1.7f7d1cp-20"),
    ("c5", "0x1.0e4020p-7"), ("c4", "0x1.573e2ep-5"), ("c3", "0x1.555e66p-3"),
    ("c2", "0x1.fffdb6p-2"), ("c1", "0x1.ffffecp-1"))}


def _v_expf_ref(x):
    """ggml_v_expf (AVX-512), element-wise on a float32 array."""
    c = _C
    with np.errstate(invalid="ignore", over="ignore"):
        z = _fma(x, c["log2e"], c["r"])
        n = (z - c["r"]).astype(F32)
        b = _fma(-n, c["lo"], _fma(-n, c["hi"], x))
        u = (b * b).astype(F32)
        j = _fma(_fma(_fma(c["c5"], b, c["c4"]), u, _fma(c["c3"], b, c["c2"])), u,
                 _fma(c["c1"], b, F32(1)))
        big = np.abs(n) > 192
        res = (j.astype(F64) * np.exp2(np.where(big, 0, n).astype(F64))).astype(F32)
        return np.where(big, np.where(n <= 0, F32(0), F32(np.inf)), res).astype(F32)


def _soft_max_ref(x, mask, scale):
    w = (x * F32(scale)).astype(F32)
    if mask is not None:
        w = (w + mask).astype(F32)
    mx = w.max(axis=-1, keepdims=True)
    X0 = w.shape[-1]
    n16 = X0 - X0 % 16
    e = np.empty_like(w)
    e[..., :n16] = _v_expf_ref((w[..., :n16] - mx).astype(F32))
    e[..., n16:] = np.exp((w[..., n16:] - mx).astype(F32)).astype(F32)
    s = np.zeros(w.shape[:-1], F64)
    for i in range(0, n16, 16):
        s = s + _reduce512(e[..., i:i + 16]).astype(F64)
    for i in range(n16, X0):
        s = s + e[..., i].astype(F64)
    inv = (1.0 / s).astype(F32)
    p = (e * inv[..., None]).astype(F32)
    return np.where(p < np.finfo(F32).tiny, F32(0), p)       # ggmlpy flushes subnormals


@needs_jit
@pytest.mark.parametrize("X0,X1,scale,masked", [(256, 5, 1.0, True), (64, 3, 0.125, False),
                                                (37, 4, 1.0, True), (512, 2, 1.0, True)])
def test_soft_max_is_ggml_loop(X0, X1, scale, masked):
    rng = np.random.default_rng(X0 + X1)
    x = (rng.standard_normal((2, 3, X1, X0)) * 8).astype(F32)
    x[0, 0, 0, :5] = [-100.0, -120.0, 80.0, 0.0, -0.0]       # subnormal and 0 exponentials
    mask = None
    if masked:
        m = np.zeros((1, 1, X1 + 2, X0), F32)
        m[0, 0, :, X0 // 2:] = -np.inf
        m[0, 0, 1, 3] = -np.inf
        mask = m
    d = np.empty_like(x)
    soft_max_ggml.soft_max_step(x, mask, scale, d)()
    want = _soft_max_ref(x, None if mask is None else mask[:, :, :X1], scale)
    np.testing.assert_array_equal(d, want)
    w = x.astype(F64) * scale + (0 if mask is None else mask[:, :, :X1])
    exact = np.exp(w - w.max(-1, keepdims=True))
    exact /= exact.sum(-1, keepdims=True)
    np.testing.assert_allclose(d, exact, rtol=0, atol=3e-7)


def test_v_expf_transcription_is_close_to_exp():
    x = np.linspace(-87, 0, 200001, dtype=F32)
    rel = np.abs(_v_expf_ref(x).astype(F64) / np.exp(x.astype(F64)) - 1)
    assert rel.max() < 4e-7                                   # ggml_v_expf's own accuracy


@needs_jit
def test_soft_max_node_takes_the_variant_and_checks_arguments():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 32)).astype(F32)
    m = np.where(np.arange(32)[None, :] <= np.arange(6)[:, None] + 20, 0, -np.inf).astype(F32)
    ctx = Context()
    tx = ctx.new_tensor(Type.F32, (32, 6, 4))
    tm = ctx.new_tensor(Type.F32, (32, 6))
    node = ops.soft_max_ext(ctx, tx, tm, 0.5, 0.0)
    assert REGISTRY.select(node, np).name == "cpu.jit.soft_max_ggml"
    (y,) = run_graph(ctx, [node], {tx: x, tm: m})
    np.testing.assert_array_equal(y.reshape(x.shape),
                                  _soft_max_ref(x[None], m[None, None], 0.5)[0])
    with pytest.raises(ValueError, match="C-contiguous float32"):
        soft_max_ggml.soft_max_step(x[None].astype(F64), None, 1.0, x[None])
    with pytest.raises(ValueError, match="broadcast"):
        soft_max_ggml.soft_max_step(x[None], np.ascontiguousarray(m[None, None, :, :16]), 1.0,
                                    np.empty_like(x[None]))


# ---------------------------------------------------------------------------------------------
# Q8_K activations


def test_q8k_rows_reference_rule_is_quantize_row_q8_K():
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.01, 30, (6, 1))).astype(F32)
    x[2, :256] = 0
    qs, d, bs = q8k_act.quantize_q8_k_rows(x, False)
    ref = quantize_row_q8_K(x).reshape(6, 2, 292)
    np.testing.assert_array_equal(d, ref[:, :, 0:4].copy().view(F32)[..., 0])
    np.testing.assert_array_equal(qs.reshape(6, 2, 256), ref[:, :, 4:260].view(np.int8))
    np.testing.assert_array_equal(bs, ref[:, :, 260:].copy().view(np.int16))


def test_q8k_rows_group_rule_takes_the_positive_sign_on_a_tie():
    x = np.zeros((2, 256), F32)
    x[:, 3], x[:, 10], x[:, 20] = -2.0, 2.0, 0.5              # -amax first, then +amax
    q_ref, d_ref, _ = q8k_act.quantize_q8_k_rows(x, False)
    q_grp, d_grp, _ = q8k_act.quantize_q8_k_rows(x, True)
    assert d_ref[0, 0] == F32(2.0 / 127) and d_grp[0, 0] == -F32(2.0 / 127)
    np.testing.assert_array_equal(q_grp, -q_ref)
    x[:, 10] = 1.0                                            # no tie: the same blocks
    np.testing.assert_array_equal(q8k_act.quantize_q8_k_rows(x, True)[0],
                                  q8k_act.quantize_q8_k_rows(x, False)[0])


@needs_jit
def test_compiled_q8k_rows_are_the_numpy_rows():
    # the tasks' quantizer (kquant_order_tasks.quant_q8_k_rows) against q8k_act's NumPy form,
    # both sign rules: ties of +-amax either way round, blocks of zeros, of -0.0, of
    # subnormals, of one repeated value, huge values, a strided input
    from ggmlpy.backends.cpu import kquant_order_tasks as tk  # noqa: PLC0415

    rng = np.random.default_rng(12)
    x = (rng.standard_normal((24, 1024)) * rng.uniform(0.01, 30, (24, 1))).astype(F32)
    x[0, 7], x[0, 9] = -20.0, 20.0
    x[1, 7], x[1, 9] = 20.0, -20.0
    x[2, :256] = 0.0
    x[3, :256] = -0.0
    x[4, :256] = 1e-42
    x[5, 256:512] = 3.0
    x[6, 256:512] = -3.0
    x[7, 512:768] = rng.choice([-1.0, 1.0], 256)
    x[8] *= 1e30
    x[9, :256] = rng.choice([-2.0, -1.0, 0.0, 1.0, 2.0], 256)
    wide = np.zeros((24, 2048), F32)
    wide[:, ::2] = x
    for xs in (x, wide[:, ::2]):
        for ng in (0, 8, 24):
            yq = np.empty((24, 1024), np.int8)
            yd = np.empty((24, 4), F32)
            bs = np.empty((24, 64), np.int16)
            tk.quant_q8_k_rows(xs, yq, yd, bs, ng)
            for rows, grp in ((slice(0, ng), True), (slice(ng, 24), False)):
                q, d, b = q8k_act.quantize_q8_k_rows(x[rows], grp)
                np.testing.assert_array_equal(yq[rows], q)
                np.testing.assert_array_equal(yd[rows].view(np.int32), d.view(np.int32))
                np.testing.assert_array_equal(bs[rows], b.reshape(-1, 64))


# ---------------------------------------------------------------------------------------------
# Q4_K (repacked order) and Q6_K


def _rand_blocks(rng, C, nb, nbytes, d_offsets):
    b = rng.integers(0, 256, (C, nb, nbytes), dtype=np.uint8)
    for o in d_offsets:                                       # finite f16 scales
        b[:, :, o:o + 2] = (rng.uniform(1e-4, 2e-2, (C, nb)).astype(np.float16)
                            .view(np.uint8).reshape(C, nb, 2))
    return b.reshape(C, nb * nbytes)


def _q4k_ref(rows, x, n_rows):
    """repack.cpp forward_mul_mat with the x86 gemm (rows in groups of 4, a step per pair of
    sub-blocks) and gemv (the rest, a step per super-block)."""
    ng = n_rows - n_rows % 4
    out = np.empty((n_rows, rows.shape[0]), F32)
    for rows_, grp in ((slice(0, ng), True), (slice(ng, n_rows), False)):
        xr = x[rows_]
        if xr.shape[0] == 0:
            continue
        out[rows_] = _q4k_ref_q(rows, *q8k_act.quantize_q8_k_rows(xr, grp), grp)
    return out


def _q4k_ref_q(rows, qs, xd, bs, grouped):
    """:func:`_q4k_ref` from Q8_K quants ``qs`` int8 ``(Y, K)``, ``xd`` ``(Y, nb)``, ``bs``
    ``(Y, nb, 16)``: the gemm's steps (pairs of sub-blocks) when ``grouped``, else the gemv's."""
    w4, sc, mn, d, dmin = repack_q4k.decode_q4_k(rows)
    C, nb = d.shape
    Y = qs.shape[0]
    step = 2 if grouped else 8
    b32 = bs.astype(np.int64).reshape(Y, nb, 8, 2).sum(-1)
    dots = np.einsum("cbjk,ybjk->ycbj", w4.reshape(C, nb, 8, 32).astype(np.int64),
                     qs.reshape(Y, nb, 8, 32).astype(np.int64))
    acc = np.zeros((Y, C), F32)
    accm = np.zeros((Y, C), F32)
    for b in range(nb):
        ds = (d[None, :, b] * xd[:, b:b + 1]).astype(F32)
        dms = (dmin[None, :, b] * xd[:, b:b + 1]).astype(F32)
        for j0 in range(0, 8, step):
            js = slice(j0, j0 + step)
            iacc = (dots[:, :, b, js] * sc[None, :, b, js]).sum(-1)
            imin = (mn[None, :, b, js] * b32[:, None, b, js]).sum(-1)
            acc = _fma(iacc.astype(F32), ds, acc)
            accm = _fma(imin.astype(F32), dms, accm)
    return (acc - accm).astype(F32)


def _q6k_ref(rows, x, tiled):
    """x86 ggml_vec_dot_q6_K_q8_K (AVX2 lanes) or the tiled kernel (exact block sums)."""
    return _q6k_ref_q(rows, *q8k_act.quantize_q8_k_rows(x, False), tiled)


def _q6k_ref_q(rows, qs, xd, bs, tiled):
    """:func:`_q6k_ref` from Q8_K quants (as :func:`_q4k_ref_q`'s)."""
    q6, sc, d = vec_dot_q6k.decode_q6_k(rows)
    C, nb = d.shape
    Y = qs.shape[0]
    q = q6.reshape(C, nb, 256).astype(np.int64)
    q8 = qs.reshape(Y, nb, 256).astype(np.int64)
    e = np.arange(256)
    lane, sidx = (e % 32) // 4, e // 16
    s16 = sc.astype(np.int64)
    if tiled:
        acc = np.zeros((Y, C), F32)
        for b in range(nb):
            S = np.einsum("ce,ye,ce->yc", q[:, b] - 32, q8[:, b], s16[:, b, sidx])
            acc = _fma((S.astype(F32) * d[None, :, b]).astype(F32), xd[:, b:b + 1], acc)
        return acc
    acc = np.zeros((Y, C, 8), F32)
    for b in range(nb):
        prod = np.einsum("ce,ye,ce->yce", q[:, b], q8[:, b], s16[:, b, sidx])
        S = np.stack([prod[..., lane == l].sum(-1) for l in range(8)], -1)
        corr = (bs[:, b].astype(np.int64)[:, None, :] * s16[None, :, b, :])
        S = S - 32 * (corr[..., 0::2] + corr[..., 1::2])
        dd = (xd[:, b:b + 1] * d[None, :, b]).astype(F32)
        acc = _fma(dd[..., None], S.astype(F32), acc)
    r = (acc[..., 4:8] + acc[..., 0:4]).astype(F32)
    return ((r[..., 0] + r[..., 2]).astype(F32) + (r[..., 1] + r[..., 3]).astype(F32)).astype(F32)


def test_q4k_and_q6k_decoders_match_the_dequantizer():
    rng = np.random.default_rng(5)
    r4 = _rand_blocks(rng, 8, 2, 144, (0, 2))
    w4, sc, mn, d, dmin = repack_q4k.decode_q4_k(r4)
    deq = (d[..., None, None] * sc[..., None] * w4.reshape(8, 2, 8, 32)
           - dmin[..., None, None] * mn[..., None]).reshape(8, 512)
    np.testing.assert_allclose(deq, gguf_dequantize_blocks(r4.reshape(-1, 144), Type.Q4_K).reshape(8, 512),
                               rtol=1e-6, atol=1e-7)
    r6 = _rand_blocks(rng, 8, 2, 210, (208,))
    q6, sc6, d6 = vec_dot_q6k.decode_q6_k(r6)
    deq6 = (d6[..., None] * np.repeat(sc6.astype(F32), 16, -1)
            * (q6.reshape(8, 2, 256).astype(F32) - 32)).reshape(8, 512)
    np.testing.assert_allclose(deq6, gguf_dequantize_blocks(r6.reshape(-1, 210), Type.Q6_K).reshape(8, 512),
                               rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="144"):
        repack_q4k.decode_q4_k(r4[:, :100])
    with pytest.raises(ValueError, match="210"):
        vec_dot_q6k.decode_q6_k(r6[:, :100])


@needs_jit
@pytest.mark.parametrize("N", [1, 3, 4, 5, 8, 9])
def test_q4k_repack_order_is_ggml_loop(N):
    rng = np.random.default_rng(100 + N)
    C, nb = 24, 2
    rows = _rand_blocks(rng, C, nb, 144, (0, 2))
    x = (rng.standard_normal((N, nb * 256)) * 3).astype(F32)
    x[0, 7], x[0, 9] = -20.0, 20.0                            # a sign tie in a grouped row
    d = np.empty((1, 1, N, C), F32)
    repack_q4k.mul_mat_q4k_step(rows.reshape(1, 1, C, -1), x.reshape(1, 1, N, -1), d, N)()
    want = _q4k_ref(rows, x, N)
    np.testing.assert_array_equal(d[0, 0], want)
    exact = x.astype(F64) @ gguf_dequantize_blocks(rows.reshape(-1, 144), Type.Q4_K).reshape(C, -1).T.astype(F64)
    np.testing.assert_allclose(d[0, 0], exact, rtol=0.05, atol=0.05 * np.abs(exact).max())
    with pytest.raises(ValueError, match="n_rows"):
        repack_q4k.mul_mat_q4k_step(rows.reshape(1, 1, C, -1), x.reshape(1, 1, N, -1), d, N + 1)


@needs_jit
@pytest.mark.parametrize("N", [1, 5, 8, 11])
def test_q6k_orders_are_ggml_loops(N):
    rng = np.random.default_rng(200 + N)
    C, nb = 16, 2
    rows = _rand_blocks(rng, C, nb, 210, (208,))
    x = (rng.standard_normal((N, nb * 256)) * 3).astype(F32)
    tiled = vec_dot_q6k.uses_tiled(N)
    assert tiled == (N >= 8)
    d = np.empty((1, 1, N, C), F32)
    vec_dot_q6k.mul_mat_q6k_step(rows.reshape(1, 1, C, -1), x.reshape(1, 1, N, -1), d, tiled)()
    np.testing.assert_array_equal(d[0, 0], _q6k_ref(rows, x, tiled))
    d2 = np.empty_like(d)                                     # the other order differs
    vec_dot_q6k.mul_mat_q6k_step(rows.reshape(1, 1, C, -1), x.reshape(1, 1, N, -1), d2,
                                 not tiled)()
    np.testing.assert_array_equal(d2[0, 0], _q6k_ref(rows, x, not tiled))
    exact = x.astype(F64) @ gguf_dequantize_blocks(rows.reshape(-1, 210), Type.Q6_K).reshape(C, -1).T.astype(F64)
    np.testing.assert_allclose(d[0, 0], exact, rtol=0.05, atol=0.05 * np.abs(exact).max())


@needs_jit
@pytest.mark.parametrize("t,N,n_threads", [(Type.Q4_K, 5, 1), (Type.Q4_K, 9, 2),
                                           (Type.Q4_K, 1, 2), (Type.Q4_K, 2, 1),
                                           (Type.Q4_K, 3, 2),
                                           (Type.Q6_K, 9, 2), (Type.Q6_K, 1, 2),
                                           (Type.Q6_K, 3, 1), (Type.Q6_K, 7, 2)])
def test_kquant_node_takes_the_variant(t, N, n_threads):
    # a CPU backend of n_threads: with two, the product is a dot task whose weight-row chunks
    # both threads claim; every output stays the ggml loop's, whoever computes it. A Q6_K
    # product of fewer than 8 rows runs on the dot kernels instead, with the AVX2 vec_dot's bits
    rng = np.random.default_rng(N)
    C, K = 512, 512
    nbytes, offs = (144, (0, 2)) if t == Type.Q4_K else (210, (208,))
    rows = _rand_blocks(rng, C, K // 256, nbytes, offs)
    x = rng.standard_normal((N, K)).astype(F32)
    ctx = Context()
    node = ops.mul_mat(ctx, ctx.new_tensor(t, (K, C)), ctx.new_tensor(Type.F32, (K, N)))
    name = REGISTRY.select(node, np).name
    if t == Type.Q4_K:
        assert name == "cpu.jit.mul_mat_q4k"
    else:
        assert (name == "cpu.jit.mul_mat_q6k") == (N >= 8)
    res, _ = eval_mul_mat(t, rows, x, K, C, BufferUsage.WEIGHTS, n_threads, times=3)
    want = _q4k_ref(rows, x, N) if t == Type.Q4_K else _q6k_ref(rows, x, N >= 8)
    for y in res:
        np.testing.assert_array_equal(y, want)


@needs_jit
def test_kquant_variant_leaves_activation_row_cuts_to_the_gemm_path(monkeypatch):
    # a batch on the GEMM path (GGMLPY_QUANT_MATMUL=fast, from the crossover) with 8 * N > M: a
    # threaded plan would cut the activation rows (Q4_K's groups of four); by default and with
    # GGMLPY_QUANT_MATMUL=dot every batch runs on the dot kernels, cut along weight rows
    monkeypatch.setenv(env.QUANT_MATMUL, "fast")
    ctx = Context()
    node = ops.mul_mat(ctx, ctx.new_tensor(Type.Q4_K, (256, 64)),
                       ctx.new_tensor(Type.F32, (256, qmatmul.CROSSOVER[Type.Q4_K])))
    f16 = ops.mul_mat(ctx, ctx.new_tensor(Type.F16, (256, 512, 1)),
                      ctx.new_tensor(Type.F16, (256, 512, 4)))
    assert REGISTRY.select(node, np).name != "cpu.jit.mul_mat_q4k"
    assert REGISTRY.select(f16, np).name != "cpu.jit.mul_mat_f16"      # past MAX_MACS
    monkeypatch.delenv(env.QUANT_MATMUL)  # the default: ggml's orders at every size
    assert REGISTRY.select(node, np).name == "cpu.jit.mul_mat_q4k"
    assert REGISTRY.select(f16, np).name == "cpu.jit.mul_mat_f16"
    monkeypatch.setenv(env.QUANT_MATMUL, "dot")
    assert REGISTRY.select(node, np).name == "cpu.jit.mul_mat_q4k"
    assert REGISTRY.select(f16, np).name == "cpu.jit.mul_mat_f16"


# ---------------------------------------------------------------------------------------------
# the integer-GEMM form of both orders (ggmlpy.backends.cpu.kquant_igemm): MKL's int16 GEMM for
# the exact step sums, the float32 steps after them


def _igemm_address():
    from ggmlpy.backends.cpu import kquant_igemm  # noqa: PLC0415

    return kquant_igemm.gemm_address(1 << 30, 0)


needs_igemm = pytest.mark.skipif(not cpu_jit.available() or not _igemm_address(),
                                 reason="the integer GEMMs need Numba and AVX512-VNNI or MKL "
                                        "(the mkl extra)")


@pytest.fixture(params=["vnni", "mkl"])
def gemm_source(request, monkeypatch):
    """Both sources of the exact step sums: the compiled AVX512-VNNI int16 GEMM and MKL's
    ``cblas_gemm_s16s16s32`` (each where this machine has it)."""
    from ggmlpy.backends.cpu import kquant_igemm  # noqa: PLC0415

    if request.param == "vnni":
        if not kquant_igemm.vnni_gemm():
            pytest.skip("no AVX512-VNNI int16 GEMM on this CPU (or GGMLPY_CPU_ZMM=0)")
    else:
        monkeypatch.setattr(kquant_igemm, "vnni_gemm", lambda: False)
        if not kquant_igemm.gemm_address(1 << 30, 0):
            pytest.skip("MKL (the mkl extra) is not installed")
    return request.param


def _kquant_step(t, rows, x, gemm):
    """The variant's step on ``rows`` (C weight rows of bytes) and ``x`` (N, K), with the
    integer GEMMs (``gemm`` True, from 1 row on) or without them (the dot kernels alone)."""
    from ggmlpy.backends.cpu import kquant_igemm  # noqa: PLC0415

    C, N = rows.shape[0], x.shape[0]
    d = np.full((1, 1, N, C), np.nan, F32)
    saved = kquant_igemm.gemm_address
    kquant_igemm.gemm_address = ((lambda n, m: saved(n, 0)) if gemm else (lambda n, m: 0))
    try:
        if t == Type.Q4_K:
            st = repack_q4k.mul_mat_q4k_step(rows.reshape(1, 1, C, -1), x.reshape(1, 1, N, -1),
                                             d, N)
        else:
            st = vec_dot_q6k.mul_mat_q6k_step(rows.reshape(1, 1, C, -1), x.reshape(1, 1, N, -1),
                                              d, vec_dot_q6k.uses_tiled(N))
    finally:
        kquant_igemm.gemm_address = saved
    st()
    return d[0, 0]


@needs_igemm
@pytest.mark.parametrize("t", [Type.Q4_K, Type.Q6_K])
def test_kquant_igemm_is_ggml_loop_over_random_shapes(t, gemm_source):
    # row counts 1..600 (n % 4 of every kind, the gemv rows after the groups), K of 1..8
    # super-blocks, M multiples of 8 (chunk tails of 8 beside the 16-lane groups)
    rng = np.random.default_rng(7 if t == Type.Q4_K else 8)
    nbytes, offs = (144, (0, 2)) if t == Type.Q4_K else (210, (208,))
    shapes = [(1, 256, 8), (4, 256, 16), (5, 1024, 24), (13, 2048, 40), (31, 256, 72),
              (64, 1024, 136), (97, 2048, 8), (130, 256, 200), (258, 1024, 48),
              (403, 256, 24), (600, 2048, 16)]
    shapes += [(int(rng.integers(1, 601)), int(rng.choice([256, 1024, 2048])),
                8 * int(rng.integers(1, 20))) for _ in range(4)]
    for N, K, C in shapes:
        rows = _rand_blocks(rng, C, K // 256, nbytes, offs)
        x = (rng.standard_normal((N, K)) * rng.uniform(0.1, 10)).astype(F32)
        x[rng.random((N, K)) < 0.01] = 0.0
        if N > 4:
            x[3, :256] = 0.0                                  # a block of zeros: d = 0
        got = _kquant_step(t, rows, x, True)
        want = _q4k_ref(rows, x, N) if t == Type.Q4_K else _q6k_ref(rows, x, N >= 8)
        np.testing.assert_array_equal(got, want, err_msg=f"N={N} K={K} C={C}")


def _extreme_rows(t, C, nb, rng):
    """Weight rows whose step sums reach the bounds of the integer GEMMs: Q4_K every 4-bit value
    15 and every 6-bit scale and min 63; Q6_K every 6-bit value 0 (``-32``) and every scale
    -128; a few rows random."""
    nbytes, offs = (144, (0, 2)) if t == Type.Q4_K else (210, (208,))
    b = _rand_blocks(rng, C, nb, nbytes, offs).reshape(C, nb, nbytes)
    if t == Type.Q4_K:
        b[:C // 2, :, 4:144] = 0xFF
    else:
        b[:C // 2, :, 0:192] = 0
        b[:C // 2, :, 192:208] = 0x80
    return b.reshape(C, nb * nbytes)


@needs_igemm
@pytest.mark.parametrize("t", [Type.Q4_K, Type.Q6_K])
@pytest.mark.parametrize("N", [12, 33])
def test_kquant_igemm_exact_at_the_bounds(t, N, gemm_source):
    # all -128 (and all +127) activation quants against the largest weight values: Q4_K |iacc|
    # up to 64 * 128 * 945, Q6_K |S| = 256 * 128 * 4096 = 2**27, exact in the GEMM's int32
    from ggmlpy.backends.cpu import kquant_igemm_kernel as kk  # noqa: PLC0415

    rng = np.random.default_rng(N)
    C, nb = 40, 4
    K = nb * 256
    rows = _extreme_rows(t, C, nb, rng)
    qs = rng.integers(-128, 128, (N, K)).astype(np.int8)
    qs[: N // 2] = -128
    qs[N // 2: N // 2 + 2] = 127
    xd = rng.uniform(1e-3, 1e-1, (N, nb)).astype(F32)
    bs = qs.astype(np.int32).reshape(N, nb, 16, 16).sum(-1).astype(np.int16)
    b32 = bs.astype(np.int32).reshape(N, nb * 8, 2).sum(-1).astype(np.int32)
    y16 = qs.astype(np.int16)
    out = np.full((N, C), np.nan, F32)
    tbl = cpu_jit.f16_table()
    gemm = _igemm_address()
    if t == Type.Q4_K:
        ng = N - N % 4
        kk.q4k_rows_igemm(gemm, rows, y16, qs, xd, b32, out, ng, 0, C, 0, tbl,
                          *kk.q4k_scratch(C, K, ng))
        want = np.concatenate([_q4k_ref_q(rows, qs[:ng], xd[:ng], bs[:ng], True),
                               _q4k_ref_q(rows, qs[ng:], xd[ng:], bs[ng:], False)])
        w4, sc, _, _, _ = repack_q4k.decode_q4_k(rows)
        big = np.abs(np.einsum("ce,ye->yc", (w4.reshape(C, nb * 8, 32)
                                             * sc.reshape(C, nb * 8, 1)).reshape(C, K)[:, :64]
                               .astype(np.int64), qs[:, :64].astype(np.int64))).max()
        assert big == 64 * 128 * 945
    else:
        kk.q6k_rows_igemm(gemm, rows, y16, xd, out, 0, C, 0, tbl, *kk.q6k_scratch(C, K, N))
        want = _q6k_ref_q(rows, qs, xd, bs, True)
        q6, sc6, _ = vec_dot_q6k.decode_q6_k(rows)
        v = (q6.reshape(C, nb, 16, 16).astype(np.int64) - 32) * sc6[..., None]
        big = np.abs(np.einsum("ce,ye->yc", v.reshape(C, K)[:, :256],
                               qs[:, :256].astype(np.int64))).max()
        assert big == 2**27
    np.testing.assert_array_equal(out, want)


@needs_igemm
@pytest.mark.parametrize("t,N", [(Type.Q4_K, 37), (Type.Q4_K, 70), (Type.Q6_K, 41)])
def test_kquant_igemm_threads_cut_weight_rows(t, N, monkeypatch, gemm_source):
    # a CPU backend of two threads, the variant at a prompt batch (GGMLPY_QUANT_MATMUL=dot):
    # the chunks of 144 weight rows go to both threads; same bits as the dot kernels and as
    # the loops, every run
    monkeypatch.setenv(env.QUANT_MATMUL, "dot")
    rng = np.random.default_rng(N)
    C, K = 520, 512
    nbytes, offs = (144, (0, 2)) if t == Type.Q4_K else (210, (208,))
    rows = _rand_blocks(rng, C, K // 256, nbytes, offs)
    x = rng.standard_normal((N, K)).astype(F32)
    res, dot = eval_mul_mat(t, rows, x, K, C, BufferUsage.WEIGHTS, 2, times=3)
    assert dot
    want = _q4k_ref(rows, x, N) if t == Type.Q4_K else _q6k_ref(rows, x, True)
    np.testing.assert_array_equal(_kquant_step(t, rows, x, False), want)
    for y in res:
        np.testing.assert_array_equal(y, want)
