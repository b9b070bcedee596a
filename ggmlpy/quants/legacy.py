"""Legacy 32-element block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quant dequantizers.

Both directions come from ``gguf.quants`` (gguf-py 0.19, the optional ``[gguf]`` extra): its
NumPy quantizers for these five types and its dequantizers for all eight block types are bit-exact
with ggml's ``quantize_row_*_ref`` / ``dequantize_row_*`` (held by tests against vectors generated
from ggml's C code, tests/data/ggml_quant_vectors.npz) and vectorized over blocks (``scripts/bench_quant.py`` measures their rate), so they are used as
they are.
Byte layouts are in :mod:`ggmlpy.core.types`.
"""

from __future__ import annotations

import numpy as np

from ggmlpy.core.types import Type

__all__ = ["gguf_quantize_blocks", "gguf_dequantize_blocks", "GGUF_QUANTIZE", "GGUF_DEQUANTIZE"]

#: types whose quantizer is gguf-py's
GGUF_QUANTIZE = frozenset({Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0})
#: types whose dequantizer is gguf-py's
GGUF_DEQUANTIZE = GGUF_QUANTIZE | {Type.Q4_K, Type.Q5_K, Type.Q6_K}


def _gguf_quants():
    try:
        import gguf.quants as gq
        from gguf import GGMLQuantizationType
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("quantizing/dequantizing the legacy and K-quant types needs the gguf "
                          "package: pip install 'ggmlpy[gguf]'") from e
    return gq, GGMLQuantizationType


def gguf_quantize_blocks(x: np.ndarray, type: Type) -> np.ndarray:
    """Quantize float32 blocks with gguf-py.

    Args:
        x: float32, shape (nblocks, blck_size).
        type: one of :data:`GGUF_QUANTIZE`.

    Returns:
        uint8, shape (nblocks, type_size).
    """
    gq, Q = _gguf_quants()
    x = np.ascontiguousarray(x, dtype=np.float32)
    if type in (Type.Q4_0, Type.Q5_0):
        # ggml starts its |x| scan from max = +0.0, so an all-zero block gets d = +0/-8 = -0.0
        # even when its zeros are -0.0; gguf-py takes max from the data (-0.0 -> d = +0.0).
        # Adding +0.0 turns -0.0 into +0.0 and changes nothing else (+-0 quantize alike).
        x = x + np.float32(0)
    # one long row: gguf-py works in groups of 16 rows, so 32-element rows would be slow
    q = gq.quantize(x.reshape(1, -1), Q(int(type)))
    q = np.array(q, dtype=np.uint8).reshape(x.shape[0], type.type_size)
    if type in (Type.Q4_1, Type.Q5_1):
        _min_zero_sign(x, q)
    return q


def _min_zero_sign(x: np.ndarray, q: np.ndarray) -> None:
    """Give the ``m`` field (bytes 2:4, f16) of Q4_1/Q5_1 blocks whose minimum is zero ggml's sign.

    ggml's scan ``if (v < min) min = v`` keeps the first element that reaches the minimum, so a
    zero minimum has the sign of the block's first zero; NumPy's min may return either zero.
    Only ``m``'s sign bit can differ (``x - min`` and the quants are the same for +-0).
    """
    mn = x.min(axis=1)
    rows = np.nonzero(mn == 0)[0]
    if rows.size == 0:
        return
    xr = x[rows]
    first = np.argmax(xr == 0, axis=1)
    neg = np.signbit(xr[np.arange(rows.size), first])
    q[rows, 2] = 0
    q[rows, 3] = np.where(neg, 0x80, 0).astype(np.uint8)


def gguf_dequantize_blocks(b: np.ndarray, type: Type) -> np.ndarray:
    """Dequantize blocks with gguf-py.

    Args:
        b: uint8, shape (nblocks, type_size).
        type: one of :data:`GGUF_DEQUANTIZE`.

    Returns:
        float32, shape (nblocks, blck_size).
    """
    gq, Q = _gguf_quants()
    d = gq.dequantize(np.ascontiguousarray(b).reshape(1, -1), Q(int(type)))
    return np.asarray(d, dtype=np.float32).reshape(b.shape[0], type.blck_size)
