"""MUL_MAT with an F16 weight on the CUDA device: one cuBLAS ``GemmEx`` with f16 inputs, f32
compute type and f32 output (no float32 copy of the weight).

What ggml-cuda does and what this module does:

* ggml-cuda's cuBLAS path for an F16 ``src0`` converts ``src1`` (the activations) to f16 in a
  pool buffer and calls ``cublasGemmEx`` with ``CUDA_R_16F`` A and B. With ``GGML_PREC_DEFAULT``
  it computes in ``CUBLAS_COMPUTE_16F`` with an f16 result converted back to f32 on most GPUs,
  and in ``CUBLAS_COMPUTE_32F`` straight into the f32 ``dst`` on Volta/CDNA/RDNA4 (and for
  ``GGML_PREC_F32``).
* Here: ``src1`` is converted to f16 as ggml-cuda does (one element-wise launch into a new
  C-contiguous array on the current stream), then ``GemmEx(A=f16, B=f16, C=f32,
  CUBLAS_COMPUTE_32F)`` writes ``dst`` directly: f32 accumulation everywhere, ggml-cuda's
  high-precision variant (``ggml_cuda_op_mul_mat_cublas`` in ``ggml-cuda.cu``). The only rounding beyond an F32 GEMM
  is that of ``src1`` to f16 (relative 2**-11 per element), as in ggml-cuda.

Layout: ggml ``dst[N, M] = src1[N, K] @ src0[M, K]^T`` in row-major NumPy shapes is, for
column-major cuBLAS, ``C(M x N) = op_T(A (K x M, lda = src0 row stride)) * B (K x N, ldb = K)``
with ``ldc`` = dst's row stride in elements.

Array-module contract: ``xp.cuda.cublas`` provides ``gemmEx`` and ``setStream`` (CuPy's
``cupy_backends.cuda.libs.cublas``; the test stand-in ``tests/fake_cupy.py`` records the call and
computes it with NumPy), ``xp.cuda.Device().cublas_handle`` the current device's handle and
``xp.cuda.get_current_stream().ptr`` the current stream. Scalars ``alpha``/``beta`` are host
float32 (cuBLAS's default host pointer mode) and are read when the call is enqueued, so the call
may be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CUDA_R_16F", "CUDA_R_32F", "CUBLAS_OP_N", "CUBLAS_OP_T", "CUBLAS_COMPUTE_32F",
           "CUBLAS_GEMM_DEFAULT", "gemm_f16_ok", "gemm_f16"]

#: ``cudaDataType`` values (``library_types.h``)
CUDA_R_16F = 2
CUDA_R_32F = 0
#: ``cublasOperation_t``
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
#: ``cublasComputeType_t``
CUBLAS_COMPUTE_32F = 68
#: ``cublasGemmAlgo_t``: cuBLAS's heuristic (tensor cores allowed for f16 inputs)
CUBLAS_GEMM_DEFAULT = -1

_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)


def _ptr(x: Any) -> int:
    """Device address of ``x``'s first element: CuPy's ``x.data.ptr``; a NumPy-backed stand-in
    (whose ``data`` is a memoryview) gives its ``ctypes.data``."""
    d = x.data
    return int(d.ptr) if hasattr(d, "ptr") else int(x.ctypes.data)


def gemm_f16_ok(aT: Any, bv: Any, dv: Any) -> bool:
    """Whether ``dv = bv @ aT`` can be one GemmEx: 2-D operands, ``aT`` an f16 ``(K, M)`` view
    of the weight with unit stride along K (``aT.strides[0] == 2``) and 2-byte-aligned row stride
    >= K, ``dv`` float32 ``(N, M)`` with unit stride along M and row stride >= M, ``bv`` of
    shape ``(N, K)``. All sizes positive and below 2**31."""
    if aT.ndim != 2 or bv.ndim != 2 or dv.ndim != 2:
        return False
    K, M = aT.shape
    N = bv.shape[0]
    if bv.shape[1] != K or dv.shape != (N, M) or min(K, M, N) <= 0 or max(K, M, N) >= 1 << 31:
        return False
    if aT.dtype != np.float16 or dv.dtype != np.float32:
        return False
    sa0, sa1 = aT.strides
    sd0, sd1 = dv.strides
    return (sa0 == 2 and sa1 % 2 == 0 and sa1 // 2 >= K and sd1 == 4 and sd0 % 4 == 0
            and sd0 // 4 >= M)


def gemm_f16(xp: Any, aT: Any, bv: Any, dv: Any) -> None:
    """``dv = bv @ aT`` with f16 ``aT`` (the weight, transposed view ``(K, M)``), ``bv`` (N, K)
    f32 or f16 (converted to a C-contiguous f16 copy, as ggml-cuda does), ``dv`` (N, M) f32:
    one ``cublasGemmEx`` (f16 A/B, f32 C, ``CUBLAS_COMPUTE_32F``) on the current stream
    (asynchronous). Callers check :func:`gemm_f16_ok` first.

    Raises:
        ValueError: the operands fail :func:`gemm_f16_ok`.
    """
    if not gemm_f16_ok(aT, bv, dv):
        raise ValueError(f"gemm_f16: unsupported operands aT {aT.dtype}{aT.shape}{aT.strides}, "
                         f"bv {bv.dtype}{bv.shape}, dv {dv.dtype}{dv.shape}{dv.strides}")
    K, M = aT.shape
    N = bv.shape[0]
    b16 = bv.astype(np.float16, order="C")  # a new contiguous f16 copy (ggml-cuda: src1 -> f16)
    cublas = xp.cuda.cublas
    handle = xp.cuda.Device().cublas_handle
    cublas.setStream(handle, xp.cuda.get_current_stream().ptr)
    cublas.gemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K,
                  _ONE.ctypes.data, _ptr(aT), CUDA_R_16F, aT.strides[1] // 2,
                  _ptr(b16), CUDA_R_16F, K,
                  _ZERO.ctypes.data, _ptr(dv), CUDA_R_32F, dv.strides[0] // 4,
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
