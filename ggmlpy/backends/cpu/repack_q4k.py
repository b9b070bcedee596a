"""MUL_MAT with a Q4_K weight as llama.cpp's CPU backend computes it on x86-64 (the CPU's
variant ``cpu.jit.mul_mat_q4k_repack``; a Numba kernel, :mod:`.repack_q4k_kernel`, compiled on
first use).

llama.cpp loads a Q4_K weight whose rows are a multiple of 8 into the ``CPU_REPACK`` buffer on an
AVX2 CPU (repack.cpp ``ggml_repack_get_optimal_repack_type``: ``block_q4_Kx8``, 8 rows
interleaved), and every MUL_MAT with it then runs ``forward_mul_mat`` there: the activations
quantized to Q8_K per plane, rows in groups of four by ``ggml_quantize_mat_q8_K_4x8`` and the
``ne11 % 4`` last rows by ``quantize_row_q8_K``; ``ggml_gemm_q4_K_8x8_q8_K`` for the groups and
``ggml_gemv_q4_K_8x8_q8_K`` for the rest (arch/x86/repack.cpp). Both compute an output as: per
step the exact integer sums ``iacc = sum_j scale_j * (q4 . q8)_j`` and ``imin = sum_j min_j *
bsum_j`` over its sub-blocks of 32, then ``acc = fma(float(iacc), d*d8, acc)`` and ``accm =
fma(float(imin), dmin*d8, accm)``, the result ``acc - accm``; a step is one super-block of 256 in
the gemv and one pair of sub-blocks (64) in the AVX-512 gemm. Another float32 order than ggml's
``ggml_vec_dot_q4_K_q8_K`` (8 lanes, a horizontal sum at the end), which is what llama.cpp runs for
Q4_K only without the repack buffer.

The two quantizers give the same values but for the sign of the scale when ``+amax`` and
``-amax`` both occur (:mod:`ggmlpy.backends.cpu.q8k_act`).

The grouping of rows by four is the node's (``src1``'s ``ne[1]`` per plane): a threaded plan
must not cut the activation rows (the variant applies where the CPU plan cuts the weight rows).

Two forms, the same bits. The dot kernel (:mod:`.repack_q4k_kernel`) computes each output's
integers and float32 steps in turn. From :data:`~ggmlpy.backends.cpu.kquant_igemm.Q4K_MIN_ROWS`
grouped rows on, when the active CBLAS is MKL, the gemm's step integers ``iacc`` come from
integer GEMMs instead (:mod:`.kquant_igemm_kernel`: per chunk of weight rows an int16 tile of
``sc_j * q4`` (at most ``63 * 15``) against the int16 Q8_K quants, one
``cblas_gemm_s16s16s32`` per 64-element step and tile of activation rows; ``|iacc| <= 64 * 128 *
945 < 2**23``, exact in int32 whatever the GEMM's summation order), and a compiled pass applies
the float32 steps above in ggml's order, sixteen weight rows per vector. The gemv rows stay on
the dot kernel. Each plane's activations are quantized before its task starts, so that the
pool's workers, woken when it starts, find the chunks published.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu import kquant_igemm, qmatmul
from ggmlpy.backends.kernels.registry import Step
from ggmlpy.core.types import Type

__all__ = ["Q4K_BYTES", "decode_q4_k", "mul_mat_q4k_step", "warm_up"]

#: bytes per Q4_K super-block (``d``, ``dmin`` f16, ``scales[12]``, ``qs[128]``)
Q4K_BYTES = 144
_F32 = np.float32

#: weight-row chunks per task (at least 8 rows each), as the dot tasks of
#: :mod:`ggmlpy.backends.cpu.qmatmul`
_CHUNKS = 32

_state: dict[str, Any] = {}


def _tasks() -> Any:
    k = _state.get("k")
    if k is None:
        from ggmlpy.backends.cpu import kquant_order_tasks  # noqa: PLC0415 - imports Numba

        k = _state["k"] = kquant_order_tasks
    return k


def decode_q4_k(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                           np.ndarray]:
    """Q4_K rows of bytes ``(C, nb*144)`` (uint8) to ``(w4, sc, mn, d, dmin)``: ``w4`` int8 ``(C,
    nb*256)`` the 4-bit values in element order, ``sc``/``mn`` int32 ``(C, nb, 8)`` the 6-bit
    sub-block scales and mins (ggml ``get_scale_min_k4``), ``d``/``dmin`` float32 ``(C, nb)``
    (the f16 fields widened). Synchronous.

    Raises:
        ValueError: ``rows`` is not 2-D uint8 with a multiple of 144 bytes per row.
    """
    if rows.ndim != 2 or rows.dtype != np.uint8 or rows.shape[1] % Q4K_BYTES:
        raise ValueError(f"decode_q4_k: rows must be (C, nb*144) uint8, got {rows.shape} "
                         f"{rows.dtype}")
    C, nb = rows.shape[0], rows.shape[1] // Q4K_BYTES
    b = np.ascontiguousarray(rows).reshape(C, nb, Q4K_BYTES)
    d = b[:, :, 0:2].copy().view(np.float16)[..., 0].astype(_F32)
    dmin = b[:, :, 2:4].copy().view(np.float16)[..., 0].astype(_F32)
    q = b[:, :, 4:16].astype(np.int32)
    sc = np.empty((C, nb, 8), np.int32)
    mn = np.empty((C, nb, 8), np.int32)
    sc[..., :4] = q[..., 0:4] & 63
    mn[..., :4] = q[..., 4:8] & 63
    sc[..., 4:] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    qs = b[:, :, 16:].reshape(C, nb, 4, 32)
    w4 = np.empty((C, nb, 4, 2, 32), np.int8)
    w4[:, :, :, 0] = qs & 0xF           # sub-block 2*j2: the low nibbles of 32 bytes
    w4[:, :, :, 1] = qs >> 4            # sub-block 2*j2 + 1: their high nibbles
    return w4.reshape(C, nb * 256), sc, mn, d, dmin


def mul_mat_q4k_step(a: np.ndarray, b: np.ndarray, dst: np.ndarray, n_rows: int,
                     run_dot: Any = None) -> Step:
    """The step computing ``dst = b @ W^T`` in the repacked order (module docstring): ``a`` the
    Q4_K weight's rows of bytes, uint8 ``(1, 1, C, nb*144)`` (ggml ``ne = [K, C]``, a 2-D
    weight); ``b`` float32 ``(B3, B2, N, K)``; ``dst`` float32 ``(B3, B2, N, C)``. ``n_rows``:
    the node's ``src1`` rows per plane (the grouping by four). Each plane is one compiled dot
    task (:mod:`.kquant_order_tasks`) that ``run_dot`` shares among threads (a CPU backend
    pool's ``run_dot``; None: the calling thread alone). The weight's blocks are read in place
    at each run (as ggml's kernels read them), the activations quantized. Synchronous when
    run.

    Raises:
        ValueError: shapes that do not fit, or ``b`` not float32.
    """
    C, nb, B3, B2, N = qmatmul.kquant_operands("repack_q4k", a, b, dst, Q4K_BYTES)
    if N != n_rows:
        raise ValueError(f"repack_q4k: src1 has {N} rows per plane, n_rows is {n_rows}")
    tk = _tasks()
    w = a[0, 0]
    tbl = cpu_jit.f16_table()
    ng = N - N % 4
    if ng == 0:
        # fewer than four rows: all in the gemv order, which the dot kernels compute too
        # (qmatmul_ir.row_q4_K_gemv: the same bits, a task with a native descriptor)
        steps = [qmatmul.prepare(Type.Q4_K, w, b[i3, i2], dst[i3, i2], run_dot,
                                 repack_order=True)
                 for i3 in range(B3) for i2 in range(B2)]

        def run_gemv() -> None:
            for st in steps:
                st()
        return run_gemv
    K = nb * 256
    gemm = kquant_igemm.gemm_address(ng, kquant_igemm.Q4K_MIN_ROWS)
    chunk = kquant_igemm.chunk_rows(C) if gemm else max(8, -(-C // _CHUNKS))
    desc = np.full(16, -1, np.int64)      # no native descriptor: a worker calls `worker`

    def make(x: np.ndarray, o: np.ndarray, plane: int) -> tuple[Any, Any, Any, Any]:
        # the activations' Q8_K arrays, shared with every K-quant step of this shape
        lock, (yq, yd, bs, b32, y16) = qmatmul.q8k_scratch(plane, N, K, bool(gemm))
        y16 = y16[:ng]  # (the rows grouped by four)
        return (partial(tk.q4k_quant, x, yq, yd, bs, b32, y16, ng),
                partial(tk.q4k_main, desc, gemm, w, y16, yq, yd, b32, o, ng, chunk, tbl),
                partial(tk.q4k_chunks, gemm, w, y16, yq, yd, b32, o, ng, chunk, tbl), lock)
    return qmatmul.plane_tasks_step(b, dst, make, run_dot)


def warm_up() -> None:
    """*Sync*: compile (or load from Numba's disk cache) the kernels, the workers' part of the
    tasks included, for the types a model's plans pass (a weight read in place from a read-only
    file map), so that a first prompt batch does not pay for it. Needs Numba."""
    a = np.zeros((1, 1, 8, Q4K_BYTES), np.uint8)
    a.flags.writeable = False
    b = np.zeros((1, 1, 1, 256), _F32)
    go = qmatmul.run_alone_compiling_worker
    mul_mat_q4k_step(a, b, np.empty((1, 1, 1, 8), _F32), 1, go)()
    for n in (5, kquant_igemm.Q4K_MIN_ROWS + 1):   # dot kernels, integer GEMMs
        mul_mat_q4k_step(a, np.zeros((1, 1, n, 256), _F32), np.empty((1, 1, n, 8), _F32), n,
                         go)()
