"""MUL_MAT with an F16 weight on the CuPy backend: one cuBLAS GemmEx (f16 A and B, f32 C,
CUBLAS_COMPUTE_32F) on the backend's stream, src1 rounded to f16 first as ggml-cuda does
(ggmlpy/backends/cuda/gemm.py).

Runs on the fake CuPy (tests/fake_cupy.py records each gemmEx and computes it with NumPy in
float32), so CI covers the call's arguments, the column-major layout, CUDA-graph capture and
replay, and the fallback for products that do not fold to one 2-D GEMM; ``-m gpu`` runs the
same checks on a real device.
"""

from __future__ import annotations

import fake_cupy
import numpy as np
import pytest
from fake_cupy import fake_cuda_reg

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cuda import gemm as cuda_gemm
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _f16_ref(x: np.ndarray, w16: np.ndarray) -> np.ndarray:
    """float64 product of src1 rounded to f16 (ggml-cuda's conversion) and the f16 weight."""
    return x.astype(np.float16).astype(np.float64) @ w16.astype(np.float64).T


@pytest.mark.backends("FAKECUDA0", "CUDA0")
@pytest.mark.parametrize("K,M,N,x16", [(384, 96, 7, False), (64, 40, 1, False), (128, 32, 9, True)])
def test_f16_weight_is_one_gemmex_with_f32_compute(backend, backend_kind, K, M, N, x16):
    be = backend
    rng = np.random.default_rng(K + N)
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(Type.F16, (K, M))
    x = ctx.new_tensor(Type.F16 if x16 else Type.F32, (K, N))
    y = ops.mul_mat(ctx, w, x)
    buf = alloc_ctx_tensors(ctx, be)
    try:
        w16 = rng.uniform(-1, 1, (M, K)).astype(np.float16)
        backend_tensor_set(w, w16)
        g = Graph(8)
        g.build_forward_expand(y)
        calls0 = len(fake_cupy.GEMMEX_CALLS)
        for _run in range(3):  # eager, then captured, then replayed
            xv = rng.uniform(-1, 1, (N, K)).astype(np.float32)
            backend_tensor_set(x, xv.astype(np.float16) if x16 else xv)
            be.graph_compute(g)
            got = np.asarray(backend_tensor_get(y)).reshape(-1).view(np.float32).reshape(N, M)
            # f32 accumulation of K products of f16 values <= 1: rounding ~K * 2**-24 relative
            np.testing.assert_allclose(got, _f16_ref(xv, w16), rtol=1e-5, atol=1e-5 * np.sqrt(K))
        if backend_kind == "FAKECUDA0":
            calls = fake_cupy.GEMMEX_CALLS[calls0:]
            assert len(calls) == 2  # eager + capture (the replay runs the recorded call)
            c = calls[0]
            assert (c["transa"], c["transb"]) == (cuda_gemm.CUBLAS_OP_T, cuda_gemm.CUBLAS_OP_N)
            assert (c["m"], c["n"], c["k"], c["lda"], c["ldb"], c["ldc"]) == (M, N, K, K, K, M)
            assert (c["Atype"], c["Btype"], c["Ctype"]) == (cuda_gemm.CUDA_R_16F,
                                                            cuda_gemm.CUDA_R_16F, cuda_gemm.CUDA_R_32F)
            assert c["computeType"] == cuda_gemm.CUBLAS_COMPUTE_32F
            assert c["stream"] == be.stream.cs.ptr  # the backend's stream, not the default one
    finally:
        buf.free()


def test_batched_weight_falls_back_to_the_f32_product():
    """Two weight matrices (ne2 = 2) do not fold to one 2-D GEMM: no gemmEx, f32 values."""
    be = fake_cuda_reg(1).devices[0].init_backend()
    rng = np.random.default_rng(5)
    K, M, N = 64, 24, 3
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(Type.F16, (K, M, 2))
    x = ctx.new_tensor(Type.F32, (K, N, 2))
    y = ops.mul_mat(ctx, w, x)
    buf = alloc_ctx_tensors(ctx, be)
    try:
        w16 = rng.uniform(-1, 1, (2, M, K)).astype(np.float16)
        xv = rng.uniform(-1, 1, (2, N, K)).astype(np.float32)
        backend_tensor_set(w, w16)
        backend_tensor_set(x, xv)
        g = Graph(8)
        g.build_forward_expand(y)
        calls0 = len(fake_cupy.GEMMEX_CALLS)
        be.graph_compute(g)
        assert len(fake_cupy.GEMMEX_CALLS) == calls0
        got = np.asarray(backend_tensor_get(y)).reshape(-1).view(np.float32).reshape(2, N, M)
        want = xv.astype(np.float64) @ w16.astype(np.float64).swapaxes(-1, -2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    finally:
        buf.free()
        be.free()


@pytest.mark.parametrize("case", ["3d", "f32_weight", "strided_k", "f16_out", "short_ld"])
def test_gemm_f16_ok_refuses_what_one_gemmex_cannot_do(case):
    K, M, N = 8, 6, 4
    w = np.zeros((M, K), np.float16)
    aT, bv, dv = w.T, np.zeros((N, K), np.float32), np.zeros((N, M), np.float32)
    assert cuda_gemm.gemm_f16_ok(aT, bv, dv)
    if case == "3d":
        aT = np.zeros((2, M, K), np.float16).swapaxes(-1, -2)
    elif case == "f32_weight":
        aT = np.zeros((M, K), np.float32).T
    elif case == "strided_k":
        aT = np.zeros((M, 2 * K), np.float16)[:, ::2].T
    elif case == "f16_out":
        dv = np.zeros((N, M), np.float16)
    elif case == "short_ld":
        dv = np.lib.stride_tricks.as_strided(np.zeros(N * M, np.float32), (N, M), (4 * (M - 1), 4))
    assert not cuda_gemm.gemm_f16_ok(aT, bv, dv)
    with pytest.raises(ValueError, match="gemm_f16: unsupported operands"):
        cuda_gemm.gemm_f16(np, aT, bv, dv)
