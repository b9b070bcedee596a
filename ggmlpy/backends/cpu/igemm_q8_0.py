"""The Numba loops of the Q8_0 integer GEMM (:mod:`ggmlpy.backends.cpu.igemm_q8_0_ir`): the
activations' interleaved form and the weight rows' block sums, and the tiles over a range of
weight rows. Imported on first use only (imports Numba); ``cache=True`` module-level functions.

Shapes: ``yq`` int8 ``(N, K)`` and ``yd`` float32 ``(N, nb)`` (``nb = K / 32``) the activations
as ``quantize_row_q8_0`` makes them (scales f16 values); ``arep`` uint8 ``(G, nb * 512)`` and
``drep`` float32 ``(G, nb * 16)`` with ``G = ceil(N / 16)`` (:func:`act_groups`); ``w`` uint8
``(M, nb * 34)`` the weight's Q8_0 rows; ``out`` float32 ``(N, M_out)``, row ``m`` written to
column ``m - mo``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ggmlpy.backends.cpu.igemm_q8_0_ir import (
    GROUP,
    RW,
    itile1_q8_0_1,
    itile1_q8_0_2,
    itile1_q8_0_3,
    itile_q8_0_1,
    itile_q8_0_2,
    itile_q8_0_3,
)

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)


def act_groups(n: int) -> int:
    """Groups of :data:`GROUP` activation rows that hold ``n`` rows."""
    return -(-n // GROUP)


@njit(**_OPTS)
def interleave(yq, yd, arep, drep):
    """``arep``/``drep`` from ``yq``/``yd`` (module docstring): row ``16 g + l``'s quant
    ``32 b + 4 q + j`` plus 128 at ``arep[g, 512 b + 64 q + 4 l + j]``, its scale at
    ``drep[g, 16 b + l]``; the rows past ``N`` zero (128 and 0.0)."""
    N, K = yq.shape
    G = arep.shape[0]
    nb = K // 32
    for g in range(G):
        for lane in range(16):
            n = 16 * g + lane
            if n < N:
                for b in range(nb):
                    drep[g, 16 * b + lane] = yd[n, b]
                    for q in range(8):
                        for j in range(4):
                            arep[g, 512 * b + 64 * q + 4 * lane + j] = \
                                np.uint8((np.int32(yq[n, 32 * b + 4 * q + j]) + 128) & 255)
            else:
                for b in range(nb):
                    drep[g, 16 * b + lane] = np.float32(0.0)
                    for q in range(8):
                        for j in range(4):
                            arep[g, 512 * b + 64 * q + 4 * lane + j] = np.uint8(128)


@njit(**_OPTS)
def _block_sums(w, m0, rw, csum):
    """``csum[i, b] = -128 * sum_j int8(w[m0 + i, 34 b + 2 + j])`` for ``i < rw``."""
    nb = csum.shape[1]
    for i in range(rw):
        for b in range(nb):
            s = 0
            for j in range(32):
                s += (np.int32(w[m0 + i, 34 * b + 2 + j]) ^ 128) - 128
            csum[i, b] = -128 * s


@njit(inline="always", **_OPTS)
def _groups_per_tile(left):  # pragma: no cover - compiled
    """Lane groups for the next tile with ``left`` groups to go: 3, but 2 + 2 for 4 (no tile
    of one group after a 3), 2, then 1."""
    if left >= 3 and left != 4:
        return 3
    return 2 if left >= 2 else 1


@njit(**_OPTS)
def rows(w, arep, drep, out, m0, m1, mo, nrow, tbl):
    """Weight rows ``m0 <= m < m1`` against every activation row (``nrow`` of them) into
    ``out[:, m - mo]``: tiles of :data:`RW` weight rows by up to 3 groups of 16 activation
    rows, the weight rows left over one at a time."""
    G = arep.shape[0]
    nb = drep.shape[1] // 16
    csum = np.empty((RW, nb), np.int32)
    m = m0
    while m < m1:
        full = m + RW <= m1
        rw = RW if full else 1
        _block_sums(w, m, rw, csum)
        g = 0
        while g < G:
            t = _groups_per_tile(G - g)
            if full and t == 3:
                itile_q8_0_3(w, m, arep, drep, csum, g, out, m - mo, nrow, tbl, nb)
            elif full and t == 2:
                itile_q8_0_2(w, m, arep, drep, csum, g, out, m - mo, nrow, tbl, nb)
            elif full:
                itile_q8_0_1(w, m, arep, drep, csum, g, out, m - mo, nrow, tbl, nb)
            elif t == 3:
                itile1_q8_0_3(w, m, arep, drep, csum, g, out, m - mo, nrow, tbl, nb)
            elif t == 2:
                itile1_q8_0_2(w, m, arep, drep, csum, g, out, m - mo, nrow, tbl, nb)
            else:
                itile1_q8_0_1(w, m, arep, drep, csum, g, out, m - mo, nrow, tbl, nb)
            g += t
        m += rw


@njit(**_OPTS)
def lanes(w, yq, yd, out, m0, m1, mo, tbl):
    """:func:`rows` for quantized activations ``yq``/``yd`` as they are: their interleaved form
    made here (a per-call product; the plans' steps make it once, with the quantization)."""
    N = yq.shape[0]
    G = (N + GROUP - 1) // GROUP
    arep = np.empty((G, yq.shape[1] * 16), np.uint8)
    drep = np.empty((G, yd.shape[1] * 16), np.float32)
    interleave(yq, yd, arep, drep)
    rows(w, arep, drep, out, m0, m1, mo, N, tbl)
