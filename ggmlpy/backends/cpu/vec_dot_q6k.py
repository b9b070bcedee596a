"""MUL_MAT with a Q6_K weight as ggml-cpu computes it on x86-64 with AVX2 (the CPU's variant
``cpu.jit.mul_mat_q6k``; a Numba kernel, :mod:`.vec_dot_q6k_kernel`, compiled on first use).

x86 ggml-cpu has neither a repacked nor a llamafile form of Q6_K. A MUL_MAT with it quantizes
``src1`` to Q8_K (``quantize_row_q8_K``, the reference loop) and, for ``ne11 >= 8`` rows, runs
ggml-cpu's tiled K-quant matmul (ggml-cpu.c ``ggml_compute_forward_mul_mat`` first asks
tiled/tiled.cpp ``ggml_compute_forward_mul_mat_tiled``; ``GGML_CPU_TILED_MM`` on by default): its
AVX-512 VNNI microkernel sums each super-block exactly in int32 (``dpbusd``, the ``-32`` offset
as ``32 * bsums``, the 16 scales), then ``acc = acc + (float(S) * d) * d8``, which GCC contracts
to ``fma(float(S) * d, d8, acc)``, super-block after super-block. Below 8 rows it calls
``ggml_vec_dot_q6_K_q8_K`` (arch/x86/quants.c) per output. Its AVX2 loop keeps eight int32 lanes
per super-block: lane ``l`` takes the products of bytes ``4l..4l+3`` of each run of 32 elements
(``_mm256_maddubs_epi16`` then ``_mm256_madd_epi16`` with the 16-element scales), minus ``32 *
(bsum[2l] scale[2l] + bsum[2l+1] scale[2l+1])`` (the ``-32`` offset of the 6-bit values), then
``acc = fma(d8 * d, float(lanes), acc)`` in eight float32 lanes and ``hsum_float_8`` at the end.
The kernel computes both orders exactly (:func:`uses_tiled` picks one, from the node's rows).
From :data:`~ggmlpy.backends.cpu.kquant_igemm.Q6K_MIN_ROWS` rows on (tiled order), when the
active CBLAS is MKL, the super-blocks' integers ``S`` come from integer GEMMs
(:mod:`.kquant_igemm_kernel`: an int16 tile of ``scale * (q6 - 32)``, at most ``128 * 32 = 4096``
in magnitude, against the int16 Q8_K quants, one ``cblas_gemm_s16s16s32`` per super-block and
tile of activation rows; ``|S| <= 256 * 128 * 4096 = 2**27``, exact in int32), then the same
float32 steps, sixteen weight rows per vector: the same bits. The activations are quantized
before the task starts (see :mod:`.repack_q4k`).

Shapes (NumPy, ggml ``ne`` reversed): the weight's rows of bytes, uint8 ``(1, 1, C, nb*210)``
(a 2-D weight, ``ne = [K, C]``), ``b`` float32 ``(B3, B2, N, K)``, ``dst`` float32 ``(B3, B2,
N, C)``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu import kquant_igemm, qmatmul
from ggmlpy.backends.kernels.registry import Step

__all__ = ["Q6K_BYTES", "TILED_MIN_ROWS", "uses_tiled", "decode_q6_k", "mul_mat_q6k_step",
           "warm_up"]

#: bytes per Q6_K super-block (``ql[128]``, ``qh[64]``, ``scales[16]`` int8, ``d`` f16)
Q6K_BYTES = 210
_F32 = np.float32
#: ``src1`` rows from which ggml-cpu runs its tiled K-quant matmul (tiled.cpp
#: ``ggml_tiled_min_batch``)
TILED_MIN_ROWS = 8

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


def decode_q6_k(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K rows of bytes ``(C, nb*210)`` (uint8) to ``(q6, sc, d)``: ``q6`` int8 ``(C,
    nb*256)`` the unsigned 6-bit values (0..63, before ggml's ``-32``) in element order, ``sc``
    int8 ``(C, nb, 16)``, ``d`` float32 ``(C, nb)``. Synchronous.

    Raises:
        ValueError: ``rows`` is not 2-D uint8 with a multiple of 210 bytes per row.
    """
    if rows.ndim != 2 or rows.dtype != np.uint8 or rows.shape[1] % Q6K_BYTES:
        raise ValueError(f"decode_q6_k: rows must be (C, nb*210) uint8, got {rows.shape} "
                         f"{rows.dtype}")
    C, nb = rows.shape[0], rows.shape[1] // Q6K_BYTES
    b = np.ascontiguousarray(rows).reshape(C, nb, Q6K_BYTES)
    ql, qh = b[:, :, 0:128], b[:, :, 128:192]
    q = np.empty((C, nb, 2, 4, 32), np.uint8)
    for j in range(2):
        lo, hi, h = ql[:, :, 64 * j:64 * j + 32], ql[:, :, 64 * j + 32:64 * j + 64], \
            qh[:, :, 32 * j:32 * j + 32]
        q[:, :, j, 0] = (lo & 15) | ((h & 3) << 4)
        q[:, :, j, 1] = (hi & 15) | (((h >> 2) & 3) << 4)
        q[:, :, j, 2] = (lo >> 4) | (((h >> 4) & 3) << 4)
        q[:, :, j, 3] = (hi >> 4) | (((h >> 6) & 3) << 4)
    sc = b[:, :, 192:208].copy().view(np.int8)
    d = b[:, :, 208:210].copy().view(np.float16)[..., 0].astype(_F32)
    return q.view(np.int8).reshape(C, nb * 256), sc, d


def uses_tiled(n_rows: int) -> bool:
    """Whether ggml-cpu computes a Q6_K MUL_MAT whose ``src1`` has ``n_rows`` rows (``ne11``)
    with its tiled kernel (else ``ggml_vec_dot_q6_K_q8_K``)."""
    return n_rows >= TILED_MIN_ROWS


def mul_mat_q6k_step(a: np.ndarray, b: np.ndarray, dst: np.ndarray, tiled: bool,
                     run_dot: Any = None) -> Step:
    """The step computing ``dst = b @ W^T`` in the tiled kernel's order (``tiled``) or
    ``ggml_vec_dot_q6_K_q8_K``'s AVX2 one (module docstring shapes). Each plane is one compiled
    dot task (:mod:`.kquant_order_tasks`) that ``run_dot`` shares among threads (a CPU
    backend pool's ``run_dot``; None: the calling thread alone). The weight's blocks are read
    in place at each run (as ggml's kernels read them), the activations quantized.
    Synchronous when run.

    Raises:
        ValueError: shapes that do not fit, or ``b`` not float32.
    """
    C, nb, B3, B2, N = qmatmul.kquant_operands("vec_dot_q6k", a, b, dst, Q6K_BYTES)
    tk = _tasks()
    w = a[0, 0]
    tbl = cpu_jit.f16_table()
    K = nb * 256
    gemm = kquant_igemm.gemm_address(N, kquant_igemm.Q6K_MIN_ROWS) if tiled else 0
    chunk = kquant_igemm.chunk_rows(C) if gemm else max(8, -(-C // _CHUNKS))
    desc = np.full(16, -1, np.int64)      # no native descriptor: a worker calls `worker`

    def make(x: np.ndarray, o: np.ndarray, plane: int) -> tuple[Any, Any, Any, Any]:
        # the activations' Q8_K arrays, shared with every K-quant step of this shape
        lock, (yq, yd, bs, _, y16) = qmatmul.q8k_scratch(plane, N, K, bool(gemm))
        return (partial(tk.q6k_quant, x, yq, yd, bs, y16),
                partial(tk.q6k_main, desc, gemm, w, y16, yq, yd, bs, o, tiled, chunk, tbl),
                partial(tk.q6k_chunks, gemm, w, y16, yq, yd, bs, o, tiled, chunk, tbl), lock)
    return qmatmul.plane_tasks_step(b, dst, make, run_dot)


def warm_up() -> None:
    """*Sync*: compile (or load from Numba's disk cache) the kernels, the workers' part of the
    tasks included, for the types a model's plans pass (see :func:`.repack_q4k.warm_up`). Needs
    Numba."""
    a = np.zeros((1, 1, 8, Q6K_BYTES), np.uint8)
    a.flags.writeable = False
    go = qmatmul.run_alone_compiling_worker
    for n, tiled in ((1, False), (1, True), (kquant_igemm.Q6K_MIN_ROWS, True)):
        mul_mat_q6k_step(a, np.zeros((1, 1, n, 256), _F32), np.empty((1, 1, n, 8), _F32),
                         tiled, go)()
