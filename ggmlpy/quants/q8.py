"""The activation block types Q8_0, Q8_1 and Q8_K: what ggml quantizes ``src1`` of a MUL_MAT to.

ggml's CPU MUL_MAT converts the activations to the weight type's ``vec_dot_type`` (Q8_0 for
Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants) and then runs integer dot products
block by block (ggml-cpu.c ``ggml_compute_forward_mul_mat``). This module writes those blocks
like ggml's reference quantizers ``quantize_row_q8_0_ref``, ``quantize_row_q8_1_ref`` and
``quantize_row_q8_K_ref`` (ggml-quants.c), bit for bit, vectorized over all blocks of all rows.
ggml-cpu's SIMD forms of the Q8_0/Q8_1 quantizers, which its MUL_MAT runs on x86-64 and aarch64,
round differently; they are in :mod:`ggmlpy.quants.q8_arch`.

Byte layouts (little-endian, per block):

=====  ======  =====  ======================================================================
type   elems   bytes  fields
=====  ======  =====  ======================================================================
Q8_0   32      34     ``d`` f16; ``qs[32]`` int8; ``x ~ d * q``
Q8_1   32      36     ``d`` f16; ``s`` f16 ``= d * sum(qs)``; ``qs[32]`` int8
Q8_K   256     292    ``d`` float32; ``qs[256]`` int8; ``bsums[16]`` int16 (sum of each 16 qs)
=====  ======  =====  ======================================================================

Rounding as in ggml: Q8_0/Q8_1 ``d = amax / 127``, ``id = 1 / d`` (0 when ``d`` is 0), ``q =
roundf(x * id)`` (half away from zero), ``d`` stored as f16 (round to nearest even); Q8_K ``iscale
= -127 / max`` where ``max`` is the first element of largest magnitude, ``q = min(127,
nearest_int(iscale * x))`` (half to even), ``d = 1 / iscale`` as float32; a block of zeros gets
``d = 0``, ``qs = 0`` and ``bsums = 0`` (ggml leaves its ``bsums`` unwritten there).

Extreme inputs follow ggml's float32 arithmetic: a block whose ``d`` underflows to 0 quantizes to
zeros; one whose ``1 / d`` (``iscale``) overflows to inf (``amax`` below ~3.7e-37) gives
``x * id = +-inf`` or NaN, which ggml converts to int8 as x86-64's truncating conversion does
(``0x80000000``, low byte 0): those ``qs`` are 0 here too. ``d`` above 65504 is stored as f16
inf. Non-finite input (NaN, +-inf) has no defined result in ggml (its max scans compare with
NaN); here the block's scale is stored as NaN (f16 ``0x7E00``; Q8_K float NaN) and its ``qs`` as
0, so every dot product with it is NaN, as float arithmetic on the values would give.
"""

from __future__ import annotations

import numpy as np

from ggmlpy.quants._common import F32, nearest_int

__all__ = ["QK8_0", "QK8_1", "QK_K", "Q8_0_BYTES", "Q8_1_BYTES", "Q8_K_BYTES",
           "quantize_row_q8_0", "quantize_row_q8_1", "quantize_row_q8_K", "q8_row_bytes"]

QK8_0 = 32
QK8_1 = 32
QK_K = 256
#: bytes per block
Q8_0_BYTES = 34
Q8_1_BYTES = 36
Q8_K_BYTES = 292

_INT_MIN_LOW_BYTE = np.int8(0)  # low byte of x86-64's 0x80000000 "invalid" conversion result


def q8_row_bytes(kind: str, ne0: int) -> int:
    """Bytes of one row of ``ne0`` elements in ``kind`` (``"q8_0"``, ``"q8_1"``, ``"q8_K"``).

    Raises:
        ValueError: unknown kind, or ``ne0`` not a multiple of its block size.
    """
    bs, nbytes = _KINDS.get(kind, (None, None))
    if bs is None:
        raise ValueError(f"q8_row_bytes: kind must be one of {sorted(_KINDS)}, got {kind!r}")
    if ne0 % bs:
        raise ValueError(f"q8_row_bytes: ne0 = {ne0} is not a multiple of {kind}'s block "
                         f"size {bs}")
    return ne0 // bs * nbytes


def _blocks(x: np.ndarray, bs: int, fn: str) -> tuple[np.ndarray, tuple[int, ...]]:
    a = np.asarray(x)
    if a.dtype != np.float32:
        if a.dtype.kind not in "fiu":
            raise TypeError(f"{fn}: x must be a float array, got dtype {a.dtype}")
        a = a.astype(F32)
    if a.ndim == 0:
        raise ValueError(f"{fn}: x must have at least one dimension (ne[0] = last axis)")
    if a.shape[-1] % bs:
        raise ValueError(f"{fn}: ne[0] = {a.shape[-1]} (x's last axis) is not a multiple of "
                         f"the block size {bs}")
    return np.ascontiguousarray(a).reshape(-1, bs), a.shape[:-1]


def _roundf_to_i8(v: np.ndarray) -> np.ndarray:
    """C's ``(int8_t) roundf(v)`` for float32 ``v`` (half away from zero); inf/NaN give 0 as
    x86-64's ``cvttss2si`` (``0x80000000``) truncated to its low byte. ``|v| <= 127.5`` otherwise."""
    with np.errstate(invalid="ignore"):
        t = np.trunc(v)
        frac = np.abs((v - t).astype(F32, copy=False))  # exact for finite v
        r = t + np.where(frac >= F32(0.5), np.sign(v), F32(0)).astype(F32, copy=False)
        ok = np.isfinite(r)
        return np.where(ok, r, F32(0)).astype(np.int8)


def _amax_d(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Q8_0/Q8_1's ``amax``, ``d = amax / 127``, ``id`` and the non-finite block mask."""
    amax = np.maximum.reduce(np.abs(b), axis=1)            # finite blocks: as MAX() in C
    bad = ~np.isfinite(amax)
    d = (amax / F32(127)).astype(F32, copy=False)
    with np.errstate(divide="ignore", over="ignore"):
        idv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32, copy=False)
    return amax, d, idv, bad


def _q8_quants(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_0/Q8_1's float32 ``d``, int8 quants ``qs = roundf(x * id)`` (shape of ``b``) and the
    non-finite block mask (whose quants are 0), for float32 blocks ``b`` ``(nblocks, 32)``."""
    _, d, idv, bad = _amax_d(b)
    with np.errstate(invalid="ignore", over="ignore"):
        qs = _roundf_to_i8((b * idv[:, None]).astype(F32, copy=False))
    qs[bad] = 0
    return d, qs, bad


def quantize_row_q8_0(x: np.ndarray) -> np.ndarray:
    """Rows of float32 to Q8_0 blocks (mirrors ggml's ``quantize_row_q8_0_ref``).

    Args:
        x: float array, NumPy shape ``(..., ne0)`` (ggml ``ne = [ne0, ...]``), ``ne0`` a multiple
            of 32; converted to float32 first.

    Returns:
        uint8 array of shape ``(..., ne0 // 32 * 34)``: each row's blocks in ggml's layout.
        Synchronous, host memory.

    Raises:
        TypeError: ``x`` is not numeric. ValueError: 0-d, or ``ne0`` not a multiple of 32.
    """
    b, lead = _blocks(x, QK8_0, "quantize_row_q8_0")
    d, qs, bad = _q8_quants(b)
    d16 = d.astype(np.float16)
    d16[bad] = np.float16(np.nan)
    out = np.empty((b.shape[0], Q8_0_BYTES), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = qs.view(np.uint8)
    return out.reshape(*lead, -1)


def quantize_row_q8_1(x: np.ndarray) -> np.ndarray:
    """Rows of float32 to Q8_1 blocks (mirrors ggml's ``quantize_row_q8_1_ref``): as Q8_0 plus
    ``s = f16(float(sum(qs)) * d)`` (the float32 ``d``, before its f16 rounding).

    Args:
        x: float array ``(..., ne0)``, ``ne0`` a multiple of 32.

    Returns:
        uint8 array ``(..., ne0 // 32 * 36)``. Synchronous.

    Raises:
        TypeError: ``x`` is not numeric. ValueError: 0-d, or ``ne0`` not a multiple of 32.
    """
    b, lead = _blocks(x, QK8_1, "quantize_row_q8_1")
    d, qs, bad = _q8_quants(b)
    s = qs.sum(axis=1, dtype=np.int32)
    with np.errstate(over="ignore", invalid="ignore"):
        sd = (s.astype(F32) * d).astype(F32, copy=False)
    d16 = d.astype(np.float16)
    s16 = sd.astype(np.float16)
    d16[bad] = np.float16(np.nan)
    s16[bad] = np.float16(np.nan)
    out = np.empty((b.shape[0], Q8_1_BYTES), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = s16.view(np.uint8).reshape(-1, 2)
    out[:, 4:] = qs.view(np.uint8)
    return out.reshape(*lead, -1)


def quantize_row_q8_K(x: np.ndarray) -> np.ndarray:
    """Rows of float32 to Q8_K super-blocks (mirrors ggml's ``quantize_row_q8_K_ref``).

    Args:
        x: float array ``(..., ne0)``, ``ne0`` a multiple of 256.

    Returns:
        uint8 array ``(..., ne0 // 256 * 292)``: ``d`` float32, ``qs[256]`` int8, ``bsums[16]``
        int16 per super-block. Synchronous.

    Raises:
        TypeError: ``x`` is not numeric. ValueError: 0-d, or ``ne0`` not a multiple of 256.
    """
    b, lead = _blocks(x, QK_K, "quantize_row_q8_K")
    nb = b.shape[0]
    ax = np.abs(b)
    bad = ~np.isfinite(ax).all(axis=1)
    im = np.argmax(ax, axis=1)                   # first index of the largest |x| (strict >)
    mx = b[np.arange(nb), im]
    zero = (ax[np.arange(nb), im] == 0) | bad
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        iscale = (F32(-127) / np.where(zero, F32(1), mx)).astype(F32, copy=False)
        v = nearest_int((iscale[:, None] * b).astype(F32, copy=False))
        qs = np.minimum(v, 127).astype(np.int8)  # C's int -> int8_t: the low byte
        d = (F32(1) / iscale).astype(F32, copy=False)
    qs[zero] = 0
    d = np.where(zero, F32(0), d).astype(F32, copy=False)
    d[bad] = F32(np.nan)
    bsums = qs.reshape(nb, 16, 16).sum(axis=2, dtype=np.int32).astype(np.int16)
    out = np.empty((nb, Q8_K_BYTES), np.uint8)
    out[:, 0:4] = d.view(np.uint8).reshape(-1, 4)
    out[:, 4:260] = qs.view(np.uint8)
    out[:, 260:292] = bsums.view(np.uint8).reshape(-1, 32)
    return out.reshape(*lead, -1)


_KINDS = {"q8_0": (QK8_0, Q8_0_BYTES), "q8_1": (QK8_1, Q8_1_BYTES), "q8_K": (QK_K, Q8_K_BYTES)}
