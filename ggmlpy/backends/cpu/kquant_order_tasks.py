"""Dot tasks for the Q4_K and Q6_K products in llama.cpp's x86 orders (:mod:`.repack_q4k`,
:mod:`.vec_dot_q6k`): one compiled call quantizes the activation rows to Q8_K (``*_quant``,
before the task starts), then the threads of the CPU backend's pool claim chunks of weight rows
by the protocol of :mod:`ggmlpy.backends.cpu.qmatmul_tasks`
(:func:`~ggmlpy.backends.cpu.spin.publish`, :func:`~ggmlpy.backends.cpu.spin.claim`, a worker's
chunk committed unless the caller took it over); each chunk on the dot kernels or, with
``gemm`` an address (not 0), through the integer GEMMs of :mod:`.kquant_igemm_kernel`. Every output is computed by one thread in one fixed order, so the result does not depend
on the threads. Importing this module imports Numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ggmlpy.backends.cpu.kquant_igemm_kernel import (
    q4k_rows_igemm,
    q4k_scratch,
    q6k_rows_igemm,
    q6k_scratch,
    widen_rows,
)
from ggmlpy.backends.cpu.qmatmul_tasks import _commit, _own, _post, _rescue
from ggmlpy.backends.cpu.repack_q4k_kernel import gemm_q4k
from ggmlpy.backends.cpu.spin import DONE, aadd, claim, publish, wait_workers_back
from ggmlpy.backends.cpu.vec_dot_q6k_kernel import mul_mat_q6k

F32 = np.float32
_OPTS = dict(cache=True, nogil=True, error_model="numpy")


@njit(**_OPTS)
def quant_q8_k_rows(x, yq, yd, bs, n_group4):  # pragma: no cover - compiled
    """Rows of float32 ``x`` ``(N, K)`` to Q8_K: ``yq`` int8 ``(N, K)``, ``yd`` float32 ``(N,
    K/256)``, ``bs`` int16 ``(N, K/16)``; rows below ``n_group4`` with
    ``ggml_quantize_mat_q8_K_4x8``'s sign rule, the rest with ``quantize_row_q8_K_ref``'s
    (:mod:`ggmlpy.backends.cpu.q8k_act`, whose NumPy form this matches). Per block of 256:
    ``amax`` the largest magnitude of the non-NaN values (the integer maximum of their
    magnitudes' bits, which order as the values do), the sign from the first value of that
    magnitude or from whether ``+amax`` occurs, then ``nearest_int(iscale * x)`` (the
    ``12582912`` trick on the float32 product) clamped to 127; loops without branches, which
    LLVM vectorizes."""
    N, K = x.shape
    ab = np.empty(256, np.int32)
    f = np.empty(256, F32)
    fi = f.view(np.int32)
    for n in range(N):
        xi = x[n].view(np.int32) if x.strides[1] == 4 else x[n].copy().view(np.int32)
        for b in range(K // 256):
            p = b * 256
            m = np.int32(0)
            for j in range(256):
                a = xi[p + j] & np.int32(0x7FFFFFFF)
                a = a if a <= np.int32(0x7F800000) else np.int32(0)    # NaN: not a candidate
                ab[j] = a
                m = max(m, a)
            if m == 0:
                for j in range(256):
                    yq[n, p + j] = 0
                for j in range(16):
                    bs[n, b * 16 + j] = 0
                yd[n, b] = F32(0)
                continue
            amax = np.array([m], np.int32).view(F32)[0]
            if n < n_group4:
                c = 0
                for j in range(256):
                    c += xi[p + j] == m                                # an element equal to +amax
                neg = c == 0
            else:
                k = 256
                for j in range(256):
                    k = min(k, j if ab[j] == m else 256)               # the first of magnitude amax
                neg = xi[p + k] < 0
            iscale = (F32(127) if neg else F32(-127)) / amax
            for j in range(256):
                f[j] = iscale * x[n, p + j] + F32(12582912.0)
            for j in range(256):
                i = (fi[j] & 0x007FFFFF) - 0x00400000
                yq[n, p + j] = np.int8(i if i < 127 else 127)
            for j in range(16):
                s = 0
                for e in range(16):
                    s += yq[n, p + 16 * j + e]
                bs[n, b * 16 + j] = np.int16(s)
            yd[n, b] = F32(1) / iscale


@njit(**_OPTS)
def _sums32(bs, b32):  # pragma: no cover - compiled
    N, n16 = bs.shape
    for n in range(N):
        for j in range(n16 // 2):
            b32[n, j] = np.int32(bs[n, 2 * j]) + np.int32(bs[n, 2 * j + 1])


@njit(**_OPTS)
def _q4k_rows(w, yq, yd, b32, out, ng, m0, m1, o0, tbl):  # pragma: no cover - compiled
    # out[:, c - o0] for the weight rows m0 <= c < m1; gemm order for rows < ng, gemv after
    N = yq.shape[0]
    nb = yd.shape[1]
    if ng > 0:
        gemm_q4k(w, yq, yd, b32, out, m0, m1, o0, 0, ng, nb, True, tbl)
    if ng < N:
        gemm_q4k(w, yq, yd, b32, out, m0, m1, o0, ng, N, nb, False, tbl)


@njit(**_OPTS)
def _q4k_chunk(gemm, w, y16, yq, yd, b32, out, ng, m0, m1, o0, tbl, s16,
               s32):  # pragma: no cover - compiled
    # one chunk: through the integer GEMMs at address `gemm`, or (0) the dot kernel alone
    if gemm != 0:
        q4k_rows_igemm(gemm, w, y16, yq, yd, b32, out, ng, m0, m1, o0, tbl, s16, s32)
    else:
        _q4k_rows(w, yq, yd, b32, out, ng, m0, m1, o0, tbl)


@njit(**_OPTS)
def q4k_chunks(gemm, w, y16, yq, yd, b32, out, ng, chunk, tbl, ctl,
               gen):  # pragma: no cover - compiled
    """A worker's part of a Q4_K task: chunks of ``chunk`` weight rows into ``out`` ``(N, M)``
    (through a buffer of its own, committed unless the caller took the chunk over); ``gemm``:
    the address of ``cblas_gemm_s16s16s32`` (:mod:`.kquant_igemm_kernel`), or 0."""
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    tmp = np.empty((out.shape[0], chunk), F32)
    s16, s32 = q4k_scratch(chunk if gemm != 0 else 0, yq.shape[1], ng)
    while True:
        c = claim(ctl, gen, nch)
        if c < 0:
            return
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        _q4k_chunk(gemm, w, y16, yq, yd, b32, tmp, ng, m0, m1, m0, tbl, s16, s32)
        _commit(ctl, c, gen, tmp, out, m0, m1)


@njit(**_OPTS)
def q4k_quant(x, yq, yd, bs, b32, y16, ng):  # pragma: no cover - compiled
    """A Q4_K task's activations: ``x`` float32 ``(N, K)`` (any strides) to Q8_K (``ng`` rows
    grouped by four), ``b32`` the sums of 32 quants, and the grouped rows widened into ``y16``
    int16 when it has rows (the integer GEMMs' operand)."""
    quant_q8_k_rows(x, yq, yd, bs, ng)
    _sums32(bs, b32)
    if y16.shape[0] > 0:
        widen_rows(yq, y16, ng)


@njit(**_OPTS)
def q4k_main(desc, gemm, w, y16, yq, yd, b32, out, ng, chunk, tbl, ctl,
             gen):  # pragma: no cover - compiled
    """The caller's part of a Q4_K task (activations from :func:`q4k_quant`): publish the
    chunks of weight rows, compute those it claims until none is left; returns 0."""
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    s16, s32 = q4k_scratch(chunk if gemm != 0 else 0, yq.shape[1], ng)
    _post(ctl, desc)
    publish(ctl, gen, nch)
    c = claim(ctl, gen, nch)
    while c >= 0:
        _q4k_chunk(gemm, w, y16, yq, yd, b32, out, ng, c * chunk, min(M, c * chunk + chunk), 0,
                   tbl, s16, s32)
        _own(ctl, c, gen)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch, gen)
    while c >= 0:
        _q4k_chunk(gemm, w, y16, yq, yd, b32, out, ng, c * chunk, min(M, c * chunk + chunk), 0,
                   tbl, s16, s32)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch, gen)
    wait_workers_back(ctl)  # a worker ran this task's Python callable: see there
    return 0


@njit(**_OPTS)
def _q6k_chunk(gemm, w, y16, yq, yd, bs, out, tiled, m0, m1, o0, tbl, s16,
               s32):  # pragma: no cover - compiled
    # one chunk: through the integer GEMMs at address `gemm` (tiled order), or the dot kernel
    if gemm != 0:
        q6k_rows_igemm(gemm, w, y16, yd, out, m0, m1, o0, tbl, s16, s32)
    else:
        mul_mat_q6k(w, yq, yd, bs, out, m0, m1, o0, yd.shape[1], tiled, tbl)


@njit(**_OPTS)
def q6k_chunks(gemm, w, y16, yq, yd, bs, out, tiled, chunk, tbl, ctl,
               gen):  # pragma: no cover - compiled
    """A worker's part of a Q6_K task (see :func:`q4k_chunks`; ``gemm`` only with
    ``tiled``)."""
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    tmp = np.empty((out.shape[0], chunk), F32)
    s16, s32 = q6k_scratch(chunk if gemm != 0 else 0, yq.shape[1], yq.shape[0])
    while True:
        c = claim(ctl, gen, nch)
        if c < 0:
            return
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        _q6k_chunk(gemm, w, y16, yq, yd, bs, tmp, tiled, m0, m1, m0, tbl, s16, s32)
        _commit(ctl, c, gen, tmp, out, m0, m1)


@njit(**_OPTS)
def q6k_quant(x, yq, yd, bs, y16):  # pragma: no cover - compiled
    """A Q6_K task's activations: ``x`` float32 ``(N, K)`` (any strides) to Q8_K with
    ``quantize_row_q8_K``'s rule, widened into ``y16`` int16 when it has rows."""
    quant_q8_k_rows(x, yq, yd, bs, 0)
    if y16.shape[0] > 0:
        widen_rows(yq, y16, yq.shape[0])


@njit(**_OPTS)
def q6k_main(desc, gemm, w, y16, yq, yd, bs, out, tiled, chunk, tbl, ctl,
             gen):  # pragma: no cover - compiled
    """The caller's part of a Q6_K task (activations from :func:`q6k_quant`); returns 0."""
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    s16, s32 = q6k_scratch(chunk if gemm != 0 else 0, yq.shape[1], yq.shape[0])
    _post(ctl, desc)
    publish(ctl, gen, nch)
    c = claim(ctl, gen, nch)
    while c >= 0:
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        _q6k_chunk(gemm, w, y16, yq, yd, bs, out, tiled, m0, m1, 0, tbl, s16, s32)
        _own(ctl, c, gen)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch, gen)
    while c >= 0:
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        _q6k_chunk(gemm, w, y16, yq, yd, bs, out, tiled, m0, m1, 0, tbl, s16, s32)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch, gen)
    wait_workers_back(ctl)  # a worker ran this task's Python callable: see there
    return 0
