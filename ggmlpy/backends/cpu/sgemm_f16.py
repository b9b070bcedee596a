"""MUL_MAT of two F16 operands as ggml-cpu computes it on x86-64 with AVX-512 (the CPU's variant
``cpu.jit.mul_mat_f16``; Numba kernels in :mod:`.sgemm_f16_kernel`, compiled on first use).

llama.cpp's attention without flash attention multiplies the F16 KV cache by F16 activations
(``KQ = mul_mat(K, Q)``, ``KQV = mul_mat(V^T, P)``; ggml-cpu converts an F32 ``src1`` to F16,
the ``vec_dot_type`` of F16, first). ggml-cpu.c ``ggml_compute_forward_mul_mat`` hands the
product to llamafile's ``llamafile_sgemm`` (llamafile/sgemm.cpp), which takes it when ``src1``
has at least two rows (``n >= 2``), ``k % 16 == 0`` and the weight rows ``m % 4 == 0``:
``tinyBLAS<16, __m512, __m512, ggml_fp16_t, ggml_fp16_t, float>``, where each output is 16
float32 lanes, lane ``l`` accumulating the products ``k = 16 j + l`` in turn (``madd``), then
``hsum`` = ``_mm512_reduce_add_ps``. The register tiling (``RM x RN`` blocks, thread chunks)
changes which outputs are computed together, not any output's order. Otherwise (one row, as in
every generated token) ggml's own loop calls ``ggml_vec_dot_f16`` (vec.cpp) per output: four
16-lane registers over steps of 64, reduced by ``GGML_F32x16_REDUCE`` (registers 0+2, 1+3, then
0+1, then ``_mm512_reduce_add_ps``), the leftover ``k % 64`` products added in double.

This module computes both orders exactly (the f16 values widened to float32 make every product
exact, so the fused multiply-adds round as additions). The choice is the node's, not a threaded
slice's: ``n`` is the node's ``ne[1]`` of ``src1`` and ``m`` its ``src0`` rows.

Shapes (NumPy, ggml ``ne`` reversed): ``a`` ``(A3, A2, M, K)`` float16 (the F16 ``src0``, any
strides), ``b`` ``(B3, B2, N, K)`` float16, ``dst`` ``(B3, B2, N, M)`` float32, with ``B2 % A2
== 0`` and ``B3 % A3 == 0`` (ggml's broadcast of ``src0``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.backends.kernels.registry import Step

__all__ = ["uses_tinyblas", "mul_mat_f16_step", "MAX_MACS", "warm_up"]

#: multiply-adds up to which the variant takes a product of any batch (larger ones of batches
#: from ``qmatmul.GGML_ORDER_ROWS`` rows, the attention of long prompt micro-batches, stay on the
#: BLAS GEMM of float32 copies: faster, in another float32 order)
MAX_MACS = 1 << 24

_state: dict[str, Any] = {}
_F32 = np.float32


def _kernels() -> Any:
    k = _state.get("k")
    if k is None:
        from ggmlpy.backends.cpu import sgemm_f16_kernel  # noqa: PLC0415 - imports Numba

        k = _state["k"] = sgemm_f16_kernel
    return k


def uses_tinyblas(m: int, n: int, k: int) -> bool:
    """Whether ggml-cpu (x86-64, AVX-512) computes an F16 x F16 MUL_MAT with ``m`` rows of
    ``src0`` (``ne01``), ``n`` rows of ``src1`` (``ne11``) and ``k`` columns (``ne00``) through
    llamafile's tinyBLAS (``llamafile_sgemm``: ``n >= 2``, ``k % 16 == 0``, ``m % 4 == 0``);
    else ``ggml_vec_dot_f16`` computes each output."""
    return n >= 2 and k % 16 == 0 and m % 4 == 0


def mul_mat_f16_step(a: np.ndarray, b: np.ndarray, dst: np.ndarray, tinyblas: bool) -> Step:
    """The step computing ``dst = b @ a^T`` per matrix (module docstring shapes) in tinyBLAS's
    order (``tinyblas``, which needs ``K % 16 == 0``) or ``ggml_vec_dot_f16``'s. Synchronous
    when run; the float16 operands are widened to float32 copies at each run.

    Raises:
        ValueError: shapes that do not fit, or ``tinyblas`` with ``K % 16 != 0``.
    """
    if a.ndim != 4 or b.ndim != 4 or dst.ndim != 4:
        raise ValueError("sgemm_f16: a, b and dst must be 4-D")
    A3, A2, M, K = a.shape
    B3, B2, N, Kb = b.shape
    if Kb != K or dst.shape != (B3, B2, N, M) or B2 % A2 or B3 % A3:
        raise ValueError(f"sgemm_f16: a {a.shape}, b {b.shape} and dst {dst.shape} do not fit "
                         "dst = b @ a^T with a broadcast over dims 2/3")
    if tinyblas and K % 16:
        raise ValueError(f"sgemm_f16: tinyBLAS order needs K % 16 == 0, got K = {K}")
    ks = _kernels()
    kern = ks.tinyblas if tinyblas else ks.vec_dot
    a32 = np.empty(a.shape, _F32)
    b32 = np.empty(b.shape, _F32)
    direct = dst.flags.c_contiguous
    out = dst.reshape(-1) if direct else np.empty(dst.size, _F32)
    dims = (A2, A3, M, K, B2, B3, N)
    a1, b1 = a32.reshape(-1), b32.reshape(-1)
    copyto = np.copyto

    def run() -> None:
        copyto(a32, a)
        copyto(b32, b)
        kern(a1, b1, out, *dims)
        if not direct:
            copyto(dst, out.reshape(dst.shape))
    return run


def warm_up() -> None:
    """*Sync*: compile (or load from Numba's disk cache) both kernels. Needs Numba."""
    a = np.ones((1, 1, 4, 16), np.float16)
    b = np.ones((1, 1, 2, 16), np.float16)
    d = np.empty((1, 1, 2, 4), np.float32)
    mul_mat_f16_step(a, b, d, True)()
    mul_mat_f16_step(a, b, d, False)()
