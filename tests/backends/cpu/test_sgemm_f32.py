"""The CPU's F32 x F32 MUL_MAT variant (:mod:`ggmlpy.backends.cpu.sgemm_f32`: llamafile tinyBLAS
and ``ggml_vec_dot_f32`` in ggml-cpu's x86 AVX-512 orders) against NumPy transcriptions of those
loops, bit for bit, over random shapes, strides and broadcasts; each transcription against
float64; and the node choice: which products take the variant (a src0 with batch dims,
not a 2-D one as weights; not with ``GGMLPY_PRECISE_KERNELS``; up to ``MAX_MACS`` unless
``GGMLPY_QUANT_MATMUL=dot``) and which order (tinyBLAS only for a contiguous ``src1`` of two
rows or more, ``K % 16 == 0``, ``M % 4 == 0``), on BERT's attention layout (K*Q on permuted views
of one QKV tensor, KQV on ``cont(V^T)``), unthreaded and split over two threads.
llama.cpp's own tensors are checked in test_sgemm_f32_llamacpp.py.

The transcriptions' fused multiply-add is exact: the float32 product is exact in float64, the
float64 sum's own rounding error is recovered (TwoSum) and breaks the one case where rounding
that sum to float32 could go the wrong way (a sum exactly halfway between two float32 values).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import alloc_ctx, run_graph

from ggmlpy import ops
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu import sgemm_f32
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.backends.cpu.threads import Split
from ggmlpy.backends.kernels.registry import REGISTRY
from ggmlpy.core import env
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

F32, F64 = np.float32, np.float64
pytestmark = pytest.mark.skipif(not cpu_jit.available(),
                                reason="the variant needs Numba (the jit extra)")


def fma(a, b, c):
    """float32 ``a * b + c`` with one rounding, element-wise (module docstring)."""
    a, b, c = (np.asarray(v, F32) for v in (a, b, c))
    p = a.astype(F64) * b.astype(F64)
    cc = np.broadcast_to(c.astype(F64), p.shape)
    s = p + cc
    bp = s - cc
    err = (p - bp) + (cc - (s - bp))
    r = s.astype(F32)
    half = np.abs(s - r.astype(F64)) == np.abs(np.spacing(r).astype(F64)) / 2
    nudged = np.nextafter(s, np.where(err > 0, np.inf, -np.inf)).astype(F32)
    return np.where(half & (err != 0), nudged, r)


def reduce512(v):
    """``_mm512_reduce_add_ps`` over the last axis (16 lanes): halves added down to one."""
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = (v[..., h:] + v[..., :h]).astype(F32)
    return v[..., 0]


def vec_dot_f32_ref(x, y):
    """ggml_vec_dot_f32 (AVX-512, vec.cpp as GCC compiles it) over the last axis, broadcast:
    4 x 16 fused lanes over steps of 64, GGML_F32x16_REDUCE, then the k % 64 leftovers in order
    in float32: each product rounded, then added, but the last (k % 64) % 4 fused."""
    x, y = np.broadcast_arrays(np.asarray(x, F32), np.asarray(y, F32))
    n = x.shape[-1]
    k64 = n - n % 64
    sh = x.shape[:-1]
    if k64:
        acc = np.zeros(sh + (4, 16), F32)
        for i in range(0, k64, 64):
            acc = fma(x[..., i:i + 64].reshape(sh + (4, 16)), y[..., i:i + 64].reshape(sh + (4, 16)),
                      acc)
        r = ((acc[..., 0, :] + acc[..., 2, :]).astype(F32)
             + (acc[..., 1, :] + acc[..., 3, :]).astype(F32)).astype(F32)
        s = reduce512(r)
    else:
        s = np.zeros(sh, F32)
    kmul = k64 + (n - k64) // 4 * 4
    for i in range(k64, kmul):
        s = (s + (x[..., i] * y[..., i]).astype(F32)).astype(F32)
    for i in range(kmul, n):
        s = fma(x[..., i], y[..., i], s)
    return s


def tinyblas_f32_ref(x, y):
    """tinyBLAS<16, __m512, float>: lane l fuses the products k = 16 j + l in turn, then the
    reduce; over the last axis, broadcast."""
    x, y = np.broadcast_arrays(np.asarray(x, F32), np.asarray(y, F32))
    acc = np.zeros(x.shape[:-1] + (16,), F32)
    for j in range(0, x.shape[-1], 16):
        acc = fma(x[..., j:j + 16], y[..., j:j + 16], acc)
    return reduce512(acc)


def _want(a, b, tiny):
    """``dst[i3, i2, n, m]`` of ``b @ a^T`` with a's broadcast, in the chosen order."""
    r2, r3 = b.shape[1] // a.shape[1], b.shape[0] // a.shape[0]
    ae = np.repeat(np.repeat(a, r2, axis=1), r3, axis=0)
    return (tinyblas_f32_ref if tiny else vec_dot_f32_ref)(ae[:, :, None], b[:, :, :, None])


def test_exact_fma_model():
    # the transcriptions' fma against Python's exact rational arithmetic on random triples
    from fractions import Fraction
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(400).astype(F32) for _ in range(3))
    c[::4] = -(a[::4].astype(F64) * b[::4]).astype(F32)       # near-cancellation cases
    got = fma(a, b, c)
    for i in range(a.size):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        lo = F32(float(exact))
        cands = [lo, np.nextafter(lo, F32(np.inf)), np.nextafter(lo, F32(-np.inf))]
        best = min(cands, key=lambda v: (abs(Fraction(float(v)) - exact),
                                         int(np.asarray(v).view(np.int32)) & 1))
        assert got[i] == best


@pytest.mark.parametrize("M,N,K,A2,B2,A3,B3", [
    (7, 3, 1, 1, 1, 1, 1), (5, 4, 3, 1, 2, 1, 1), (16, 2, 9, 2, 4, 1, 1), (52, 52, 32, 4, 4, 1, 1),
    (33, 5, 52, 1, 3, 1, 1), (4, 6, 64, 1, 1, 1, 1), (20, 3, 70, 2, 2, 1, 2), (9, 9, 83, 1, 1, 1, 1),
    (48, 2, 130, 1, 2, 1, 1), (3, 17, 200, 1, 1, 1, 1), (1, 1, 67, 1, 1, 1, 1)])
def test_vec_dot_order_is_ggml_loop(M, N, K, A2, B2, A3, B3):
    rng = np.random.default_rng(M * 1000 + N * 10 + K)
    a = (rng.standard_normal((A3, A2, M, K)) * 2).astype(F32)
    b = (rng.standard_normal((B3, B2, N, K)) * 2).astype(F32)
    d = np.empty((B3, B2, N, M), F32)
    sgemm_f32.mul_mat_f32_step(a, b, d, False)()
    want = _want(a, b, False)
    np.testing.assert_array_equal(d.view(np.int32), want.view(np.int32))
    ae = np.repeat(np.repeat(a, B2 // A2, axis=1), B3 // A3, axis=0).astype(F64)
    exact = b.astype(F64) @ ae.transpose(0, 1, 3, 2)
    np.testing.assert_allclose(d, exact, rtol=0, atol=4e-7 * K * 4)


@pytest.mark.parametrize("M,N,K,A2,B2", [(4, 2, 16, 1, 1), (32, 52, 48, 2, 4), (8, 7, 256, 1, 1),
                                         (12, 3, 32, 3, 3), (64, 2, 128, 1, 2)])
def test_tinyblas_order_is_ggml_loop(M, N, K, A2, B2):
    rng = np.random.default_rng(M * 1000 + N * 10 + K + 1)
    a = (rng.standard_normal((1, A2, M, K)) * 2).astype(F32)
    b = (rng.standard_normal((1, B2, N, K)) * 2).astype(F32)
    d = np.empty((1, B2, N, M), F32)
    sgemm_f32.mul_mat_f32_step(a, b, d, True)()
    np.testing.assert_array_equal(d.view(np.int32), _want(a, b, True).view(np.int32))
    assert not np.array_equal(d, _want(a, b, False)) or K < 32   # the orders do differ


def test_strided_operands_and_dst():
    rng = np.random.default_rng(11)
    qkv = rng.standard_normal((2, 20, 3 * 4 * 32)).astype(F32)       # (S, L, 3 H): one QKV GEMM
    heads = [qkv[:, :, j * 128:(j + 1) * 128].reshape(2, 20, 4, 32).transpose(0, 2, 1, 3)
             for j in range(3)]
    q, k = heads[0], heads[1]                                          # (S, nh, L, d) views
    big = np.zeros((2, 4, 20, 40), F32)
    d = big[..., ::2]                                                  # strided destination
    sgemm_f32.mul_mat_f32_step(k, q, d, False)()
    np.testing.assert_array_equal(d, _want(np.ascontiguousarray(k), np.ascontiguousarray(q),
                                           False))
    a = rng.standard_normal((1, 1, 64, 96)).astype(F32)[:, :, ::2]     # row stride 2, K = 96
    b = rng.standard_normal((1, 2, 96, 5)).astype(F32).transpose(0, 1, 3, 2)
    for tiny in (False, True):
        d = np.empty((1, 2, 5, 32), F32)
        sgemm_f32.mul_mat_f32_step(a, b, d, tiny)()
        np.testing.assert_array_equal(d, _want(np.ascontiguousarray(a),
                                               np.ascontiguousarray(b), tiny))


def test_step_refuses_what_does_not_fit():
    a = np.zeros((1, 1, 4, 40), F32)
    b = np.zeros((1, 2, 3, 40), F32)
    d = np.zeros((1, 2, 3, 4), F32)
    with pytest.raises(ValueError, match="K % 16"):
        sgemm_f32.mul_mat_f32_step(a, b, d, True)
    with pytest.raises(ValueError, match="do not fit"):
        sgemm_f32.mul_mat_f32_step(a, b[..., :32], d, False)
    with pytest.raises(ValueError, match="do not fit"):
        sgemm_f32.mul_mat_f32_step(np.zeros((1, 2, 4, 40), F32), np.zeros((1, 3, 3, 40), F32),
                                   np.zeros((1, 3, 3, 4), F32), False)      # 3 % 2: no broadcast
    with pytest.raises(ValueError, match="float32"):
        sgemm_f32.mul_mat_f32_step(a.astype(F64), b, d, False)
    with pytest.raises(ValueError, match="4-D"):
        sgemm_f32.mul_mat_f32_step(a[0], b, d, False)


def test_uses_tinyblas_is_llamafile_sgemm_rule():
    assert sgemm_f32.uses_tinyblas(32, 2, 16, True)
    assert not sgemm_f32.uses_tinyblas(32, 2, 16, False)      # permuted src1: ggml's own loop
    assert not sgemm_f32.uses_tinyblas(32, 1, 16, True)       # one row
    assert not sgemm_f32.uses_tinyblas(32, 2, 24, True)       # k % 16
    assert not sgemm_f32.uses_tinyblas(30, 2, 16, True)       # m % 4


def _attention(ctx, S, L, nh, d):
    """BERT's attention products as bert.py builds them: one QKV tensor ``[3 H, L*S]``, K and Q
    per-head views ``[d, L, nh, S]``, KQ, then KQV = mul_mat(cont(V^T), P) with P an input of
    KQ's shape (standing for the softmax); returns the QKV input (a leaf, scaled by 1 into the
    computed tensor the views read), P, KQ and KQV."""
    H = nh * d
    raw = ctx.new_tensor(Type.F32, (3 * H, L * S))
    qkv = ops.scale(ctx, raw, 1.0)          # computed in the graph, as the QKV GEMM's sum

    def heads(first):
        row = qkv.nb[1]
        return ops.view_4d(ctx, qkv, d, L, nh, S, row, d * qkv.nb[0], L * row, first * qkv.nb[0])

    q, k, v = heads(0), heads(H), heads(2 * H)
    kq = ops.mul_mat(ctx, k, q)
    p = ctx.new_tensor(Type.F32, (L, L, nh, S))
    vt = ops.cont(ctx, ops.transpose(ctx, v))
    kqv = ops.mul_mat(ctx, vt, p)
    return raw, p, kq, kqv


def _attention_want(x, pv, S, L, nh, d):
    H = nh * d
    per = x.reshape(S, L, 3, nh, d).transpose(2, 0, 3, 1, 4)              # (3, S, nh, L, d)
    q, k, v = per[0], per[1], per[2]
    kq = vec_dot_f32_ref(k[:, :, None], q[:, :, :, None])                # (S, nh, Lq, Lk)
    vt = np.ascontiguousarray(v.transpose(0, 1, 3, 2))                   # (S, nh, d, L)
    tiny = sgemm_f32.uses_tinyblas(d, L, L, True)
    kqv = (tinyblas_f32_ref if tiny else vec_dot_f32_ref)(vt[:, :, None], pv[:, :, :, None])
    assert H == nh * d
    return kq, kqv


@pytest.mark.parametrize("S,L", [(2, 13), (1, 32), (3, 70)])
def test_attention_nodes_take_the_variant(S, L, monkeypatch):
    nh, d = 4, 32
    rng = np.random.default_rng(S * 100 + L)
    x = rng.standard_normal((L * S, 3 * nh * d)).astype(F32)
    pv = rng.random((S, nh, L, L)).astype(F32)
    ctx = Context()
    qkv, p, kq, kqv = _attention(ctx, S, L, nh, d)
    assert REGISTRY.select(kq, np).name == "cpu.jit.mul_mat_f32"
    assert REGISTRY.select(kqv, np).name == "cpu.jit.mul_mat_f32"
    got_kq, got_kqv = run_graph(ctx, [kq, kqv], {qkv: x, p: pv})
    want_kq, want_kqv = _attention_want(x, pv, S, L, nh, d)
    np.testing.assert_array_equal(got_kq, want_kq)
    np.testing.assert_array_equal(got_kqv, want_kqv)
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    assert REGISTRY.select(kq, np).name != "cpu.jit.mul_mat_f32"


def test_split_over_two_threads_keeps_the_bits(monkeypatch):
    # past MAX_MACS only with GGMLPY_QUANT_MATMUL=dot; such a node is split over the threads
    monkeypatch.setenv(env.QUANT_MATMUL, "dot")
    S, L, nh, d = 9, 128, 4, 32
    rng = np.random.default_rng(5)
    x = rng.standard_normal((L * S, 3 * nh * d)).astype(F32)
    pv = rng.random((S, nh, L, L)).astype(F32)
    ctx = Context()
    qkv, p, kq, kqv = _attention(ctx, S, L, nh, d)
    assert S * nh * L * L * d > sgemm_f32.MAX_MACS
    assert REGISTRY.select(kq, np).name == "cpu.jit.mul_mat_f32"
    want_kq, want_kqv = _attention_want(x, pv, S, L, nh, d)
    buf = alloc_ctx(ctx)
    try:
        backend_tensor_set(qkv, x)
        backend_tensor_set(p, pv)
        g = Graph(64)
        g.build_forward_expand(kq)
        g.build_forward_expand(kqv)
        for n_threads in (1, 2):
            cpu = backend_cpu_init()
            cpu.set_n_threads(n_threads)
            plan = cpu.graph_plan_create(g)
            split = [s for s in plan.steps if isinstance(s, Split) and s.parts is not None]
            assert bool(split) == (n_threads == 2)         # the products cut over the threads
            cpu.graph_plan_compute(plan)
            np.testing.assert_array_equal(backend_tensor_get(kq), want_kq)
            np.testing.assert_array_equal(backend_tensor_get(kqv), want_kqv)
            cpu.free()
    finally:
        buf.free()
    monkeypatch.setenv(env.QUANT_MATMUL, "ggml")
    assert REGISTRY.select(kq, np).name != "cpu.jit.mul_mat_f32"        # past MAX_MACS


def test_two_dim_src0_and_other_types_stay_on_blas():
    # a 2-D src0 (every weight) keeps BLAS wherever it is placed; one with batch dims takes the
    # variant, whatever its origin
    ctx = Context()
    w = ctx.new_tensor(Type.F32, (64, 16))
    x = ctx.new_tensor(Type.F32, (64, 4))
    two_d = ops.mul_mat(ctx, w, x)
    batched = ops.mul_mat(ctx, ctx.new_tensor(Type.F32, (64, 16, 2)),
                          ctx.new_tensor(Type.F32, (64, 4, 2)))
    broadcast = ops.mul_mat(ctx, w, ctx.new_tensor(Type.F32, (64, 4, 3)))
    buf = alloc_ctx(ctx)
    try:
        for usage in (BufferUsage.ANY, BufferUsage.WEIGHTS):
            buf.set_usage(usage)
            assert REGISTRY.select(two_d, np).name != "cpu.jit.mul_mat_f32"
            assert REGISTRY.select(broadcast, np).name != "cpu.jit.mul_mat_f32"
            assert REGISTRY.select(batched, np).name == "cpu.jit.mul_mat_f32"
    finally:
        buf.free()
    h = ops.mul_mat(ctx, ctx.new_tensor(Type.F16, (64, 16, 2)), ctx.new_tensor(Type.F32, (64, 4, 2)))
    assert REGISTRY.select(h, np).name != "cpu.jit.mul_mat_f32"
