"""Q8_K activation rows as ggml-cpu's two x86 quantizers write them, as arrays (not block bytes):
for the kernels that reproduce llama.cpp's K-quant products (:mod:`.repack_q4k`,
:mod:`.vec_dot_q6k`).

``quantize_row_q8_K`` (x86 ggml-cpu calls ggml-quants.c ``quantize_row_q8_K_ref``) takes ``max``,
the first element of largest magnitude, and ``iscale = -127/max``; the repack path's
``ggml_quantize_mat_q8_K_4x8`` (arch/x86/repack.cpp, four rows at a time) takes ``iscale =
-127/amax`` when some element equals ``+amax`` and ``127/amax`` otherwise. They differ only when
``+amax`` and ``-amax`` both occur and ``-amax`` comes first. Both round ``iscale * x`` (float32)
half to even, keep ``min(127, q)``, store ``d = 1/iscale`` (float32) and the sums of each 16
quants; a block of zeros gives ``d = 0`` and zero quants.
"""

from __future__ import annotations

import numpy as np

from ggmlpy.quants._common import nearest_int

__all__ = ["quantize_q8_k_rows"]

_F32 = np.float32


def quantize_q8_k_rows(x: np.ndarray, group4: bool) -> tuple[np.ndarray, np.ndarray,
                                                             np.ndarray]:
    """Float32 rows ``(Y, nb*256)`` to Q8_K as ``(qs, d, bsums)``: int8 ``(Y, nb*256)``, float32
    ``(Y, nb)``, int16 ``(Y, nb, 16)`` (the quant sum of each 16 elements). ``group4``: the
    sign rule of ``ggml_quantize_mat_q8_K_4x8``, else ``quantize_row_q8_K_ref``'s (module
    docstring). Synchronous.

    Raises:
        ValueError: ``x`` is not 2-D with rows a multiple of 256 long.
    """
    if x.ndim != 2 or x.shape[1] % 256:
        raise ValueError(f"quantize_q8_k_rows: x must be (Y, nb*256), got {x.shape}")
    Y, nb = x.shape[0], x.shape[1] // 256
    b = np.asarray(x, _F32).reshape(Y * nb, 256)
    ax = np.abs(b)
    amax = ax.max(axis=1)
    if group4:
        neg = ~(b == amax[:, None]).any(axis=1)      # no element equals +amax
    else:
        neg = b[np.arange(b.shape[0]), np.argmax(ax, axis=1)] < 0
    zero = amax == 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.where(neg, _F32(127), _F32(-127)) / np.where(zero, _F32(1), amax)
        iscale = iscale.astype(_F32)
        v = nearest_int((iscale[:, None] * b).astype(_F32))
        d = (_F32(1) / iscale).astype(_F32)
    qs = np.minimum(v, 127).astype(np.int8)
    qs[zero] = 0
    d[zero] = 0
    bsum = qs.reshape(Y * nb, 16, 16).sum(axis=2, dtype=np.int32).astype(np.int16)
    return qs.reshape(Y, nb * 256), d.reshape(Y, nb), bsum.reshape(Y, nb, 16)
