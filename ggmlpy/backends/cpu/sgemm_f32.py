"""MUL_MAT of two F32 activations as ggml-cpu computes it on x86-64 with AVX-512 (the CPU's
variant ``cpu.jit.mul_mat_f32``; Numba kernels in :mod:`.sgemm_f32_kernel`, compiled on first
use).

An encoder without a KV cache (llama.cpp's ``build_attn_mha`` on BERT's F32 ``Q``, ``K``, ``V``)
multiplies float32 activations: ``KQ = mul_mat(K, Q)`` with both operands permuted views,
``KQV = mul_mat(cont(V^T), softmax(KQ))`` and mean pooling ``mul_mat(cont(x^T), inp_mean)``.
ggml-cpu.c ``ggml_compute_forward_mul_mat`` offers the product to llamafile's ``llamafile_sgemm``
(llamafile/sgemm.cpp) only when ``src1`` is contiguous (``ggml_is_contiguous``); it takes it when
``src1`` has at least two rows (``n >= 2``), ``k % 16 == 0`` and ``m % 4 == 0``:
``tinyBLAS<16, __m512, __m512, float, float, float>``, where each output is 16 float32 lanes,
lane ``l`` accumulating ``k = 16 j + l`` with ``_mm512_fmadd_ps`` in turn, then ``hsum`` =
``_mm512_reduce_add_ps`` (the register tiles and thread chunks change which outputs are computed
together, not any output's order). Otherwise (a permuted ``src1`` as K*Q's, one row as the
pooling's, ``k % 16 != 0``) ggml's own loop calls ``ggml_vec_dot_f32`` (vec.cpp) per output:
four 16-lane registers of fused multiply-adds over steps of ``GGML_F32_STEP`` = 64, reduced by
``GGML_F32x16_REDUCE``, then the leftover ``k % 64`` products added in float32 one by one (as
GCC compiles that loop: each product rounded before its addition, except the last ``(k % 64) %
4``, which are fused; :mod:`.sgemm_f32_kernel`). For MiniLM's ``k = 32`` K*Q products that is a
plain float32 sum in order.

The choice is the node's, not a threaded slice's: ``n`` is the node's ``ne[1]`` of ``src1``,
``m`` its ``src0`` rows and the contiguity that of the node's ``src1``.

Shapes (NumPy, ggml ``ne`` reversed): ``a`` ``(A3, A2, M, K)`` float32 (``src0``, any strides),
``b`` ``(B3, B2, N, K)`` float32 (any strides), ``dst`` ``(B3, B2, N, M)`` float32, with ``B2 %
A2 == 0`` and ``B3 % A3 == 0`` (ggml's broadcast of ``src0``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ggmlpy.backends.kernels.registry import Step

__all__ = ["uses_tinyblas", "mul_mat_f32_step", "MAX_MACS", "warm_up"]

#: multiply-adds up to which the variant takes a product (larger ones, the attention of long
#: batches, stay on the BLAS GEMM: faster, in another float32 order). Not every product below
#: ``qmatmul.GGML_ORDER_ROWS`` rows as the F16 variant: an encoder's K*Q has one row per token of
#: a sequence, so that would take every MiniLM batch (32 sentences of 128 tokens: about 2x
#: BLAS's time per product, some 15% of an encode)
MAX_MACS = 1 << 24

_state: dict[str, Any] = {}
_F32 = np.float32


def _kernels() -> Any:
    k = _state.get("k")
    if k is None:
        from ggmlpy.backends.cpu import sgemm_f32_kernel  # noqa: PLC0415 - imports Numba

        k = _state["k"] = sgemm_f32_kernel
    return k


def uses_tinyblas(m: int, n: int, k: int, src1_contiguous: bool) -> bool:
    """Whether ggml-cpu (x86-64, AVX-512) computes an F32 x F32 MUL_MAT with ``m`` rows of
    ``src0`` (``ne01``), ``n`` rows of ``src1`` (``ne11``), ``k`` columns (``ne00``) and a
    ``src1`` that is (``src1_contiguous``, ``ggml_is_contiguous``) or is not contiguous through
    llamafile's tinyBLAS (``llamafile_sgemm``: contiguous ``src1``, ``n >= 2``, ``k % 16 ==
    0``, ``m % 4 == 0``); else ``ggml_vec_dot_f32`` computes each output."""
    return src1_contiguous and n >= 2 and k % 16 == 0 and m % 4 == 0


def mul_mat_f32_step(a: np.ndarray, b: np.ndarray, dst: np.ndarray, tinyblas: bool) -> Step:
    """The step computing ``dst = b @ a^T`` per matrix (module docstring shapes) in tinyBLAS's
    order (``tinyblas``, which needs ``K % 16 == 0``) or ``ggml_vec_dot_f32``'s. Synchronous
    when run; operands that are not C-contiguous are copied at each run (and ``vec_dot``
    transposes ``a`` into a scratch copy at each run).

    Raises:
        ValueError: shapes that do not fit, a dtype other than float32, or ``tinyblas`` with
            ``K % 16 != 0``.
    """
    if a.ndim != 4 or b.ndim != 4 or dst.ndim != 4:
        raise ValueError("sgemm_f32: a, b and dst must be 4-D")
    if a.dtype != _F32 or b.dtype != _F32 or dst.dtype != _F32:
        raise ValueError(f"sgemm_f32: a, b and dst must be float32, got {a.dtype}, {b.dtype}, "
                         f"{dst.dtype}")
    A3, A2, M, K = a.shape
    B3, B2, N, Kb = b.shape
    if Kb != K or dst.shape != (B3, B2, N, M) or B2 % A2 or B3 % A3:
        raise ValueError(f"sgemm_f32: a {a.shape}, b {b.shape} and dst {dst.shape} do not fit "
                         "dst = b @ a^T with a broadcast over dims 2/3")
    if tinyblas and K % 16:
        raise ValueError(f"sgemm_f32: tinyBLAS order needs K % 16 == 0, got K = {K}")
    ks = _kernels()
    copyto = np.copyto
    a_c, b_c = a.flags.c_contiguous, b.flags.c_contiguous
    a32 = a if a_c else np.empty(a.shape, _F32)
    b32 = b if b_c else np.empty(b.shape, _F32)
    direct = dst.flags.c_contiguous
    out = dst.reshape(-1) if direct else np.empty(dst.size, _F32)
    dims = (A2, A3, M, K, B2, B3, N)
    a1, b1 = a32.reshape(-1), b32.reshape(-1)
    need_a = tinyblas or K >= 64

    def fill() -> None:
        if not a_c and need_a:
            copyto(a32, a)
        if not b_c:
            copyto(b32, b)

    def finish() -> None:
        if not direct:
            copyto(dst, out.reshape(dst.shape))

    if tinyblas:
        from ggmlpy.backends.cpu import sgemm_f16_kernel  # noqa: PLC0415 - imports Numba

        kern = sgemm_f16_kernel.tinyblas   # the one tinyBLAS kernel (float32 operands)

        def run() -> None:
            fill()
            kern(a1, b1, out, *dims)
            finish()
        return run

    mp = -(-M // 16) * 16
    at = np.zeros((A3, A2, K, mp), _F32)    # the padding columns stay 0
    at_view = at[..., :M].transpose(0, 1, 3, 2)
    at1 = at.reshape(-1)
    acc = np.zeros(4 * mp, _F32)
    vec_dot = ks.vec_dot

    def run_vec_dot() -> None:
        fill()
        copyto(at_view, a)
        vec_dot(a1, at1, b1, out, acc, *dims)
        finish()
    return run_vec_dot


def warm_up() -> None:
    """*Sync*: compile (or load from Numba's disk cache) both kernels. Needs Numba."""
    a = np.ones((1, 1, 4, 64), _F32)
    b = np.ones((1, 1, 2, 64), _F32)
    d = np.empty((1, 1, 2, 4), _F32)
    mul_mat_f32_step(a, b, d, True)()
    mul_mat_f32_step(a, b, d, False)()
