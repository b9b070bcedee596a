"""Float32-exact helpers shared by the quantizers: ggml's ``nearest_int`` and in-order sums.

ggml's reference quantizers are scalar C loops in float32. To reproduce them bit for bit, sums
must be accumulated in the C loop's order (NumPy's ``sum`` is pairwise), and rounding to an
integer must follow ggml's ``nearest_int`` trick (add 1.5 * 2**23, read the mantissa).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
_MAGIC = np.float32(12582912.0)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: round float32 ``v`` half-to-even via the 1.5*2**23 trick.

    Args:
        v: float32 array (any shape). Values outside +-4194303 give what ggml's trick gives
            (ggml asserts they do not occur).

    Returns:
        int32 array, same shape.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        s = (np.asarray(v, dtype=F32) + _MAGIC).astype(F32)
    return (s.view(np.int32) & 0x007FFFFF) - 0x00400000


def seqsum(a: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in index order in float32, as ``s += a[i]`` in a C loop does.

    Args:
        a: float32 array of shape (n, ...).

    Returns:
        float32 array of shape ``a.shape[1:]``.

    NumPy reduces a C-contiguous array over its outer axis 0 as ``out += a[i]`` for i in order
    (pairwise summation is used only along the innermost axis), so ``np.add.reduce`` is exact
    here and ~20x faster than ``np.add.accumulate``; with fewer than 8 columns the iterator may
    make axis 0 the inner loop, so those take the always-sequential ``accumulate``. Held by
    tests/test_quants.py::test_seqsum_is_sequential.
    """
    a = np.ascontiguousarray(a, dtype=F32)
    if a.ndim < 2 or a.size // max(a.shape[0], 1) < 8:
        return np.add.accumulate(a, axis=0, dtype=F32)[-1]
    return np.add.reduce(a, axis=0, dtype=F32)

