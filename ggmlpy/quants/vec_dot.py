"""The referee: NumPy transcriptions of ggml's scalar ``vec_dot`` for each weight/activation pair.

ggml's CPU MUL_MAT computes ``dst[n, m] = vec_dot(row m of src0, row n of src1 in vec_dot_type)``
(ggml-cpu.c ``ggml_compute_forward_mul_mat``). The functions here follow the generic C loops of
ggml-cpu/quants.c (``ggml_vec_dot_<w>_<a>_generic``) and vec.cpp (``ggml_vec_dot_f16``,
``ggml_vec_dot_bf16`` without SIMD) operation by operation: integer sums per block in int32, the
float32 scale products grouped as the C expression groups them (no fused multiply-add), and the
float32 (F16/BF16: float64) accumulation in block order. They are vectorized over all (n, m)
pairs; the only Python loop runs over the blocks of a row. They are the tests' referee and the
definition the compiled kernels (:mod:`ggmlpy.backends.cpu.qmatmul`) are held to.

==========  =========  ===================================================================
weight      vec_dot    per block ``b`` (``sumf`` float32 starts at 0)
==========  =========  ===================================================================
Q4_0        Q8_0       ``sumf += (float(sumi) * dx) * dy``
Q4_1        Q8_1       ``sumf += (dx * dy) * float(sumi) + mx * sy``
Q5_0        Q8_0       ``sumf += (dx * dy) * float(sumi)``
Q5_1        Q8_1       ``sumf += (dx * dy) * float(sumi) + mx * sy``
Q8_0        Q8_0       ``sumf += float(sumi) * (dx * dy)``
Q4_K/Q5_K   Q8_K       ``sums[l] += (dx * dy) * float(aux32[l])`` for the 8 lanes ``l`` (index
                       mod 8 within the super-block, integer sums of ``scale * q8 * q``);
                       ``sumf -= (dminx * dy) * float(sum(bsums[j] * min[j // 2]))``;
                       at the end ``sumf += sums[0] + ... + sums[7]`` (in that order)
Q6_K        Q8_K       as Q4_K without the min term (16 int8 scales of 16 elements)
F16, BF16   F16, BF16  ``sumf`` float64 ``+= float64(float32(x) * float32(y))``; result float32
==========  =========  ===================================================================

(``dx``, ``mx``, ``dy``, ``sy``: the f16 scales/mins of the weight and activation blocks as
float32; Q8_K's ``dy`` is float32.)
"""

from __future__ import annotations

import numpy as np

from ggmlpy.core.types import Type
from ggmlpy.quants.q8 import Q8_0_BYTES, Q8_1_BYTES, Q8_K_BYTES

__all__ = ["VEC_DOT_TYPE", "vec_dot", "dot_unpacked", "unpack_weight", "unpack_act"]

F32 = np.float32

#: ggml's ``vec_dot_type`` of each weight type with a dot kernel (ggml-cpu.c ``type_traits_cpu``)
VEC_DOT_TYPE = {Type.Q4_0: "q8_0", Type.Q5_0: "q8_0", Type.Q8_0: "q8_0",
                Type.Q4_1: "q8_1", Type.Q5_1: "q8_1",
                Type.Q4_K: "q8_K", Type.Q5_K: "q8_K", Type.Q6_K: "q8_K",
                Type.F16: "f16", Type.BF16: "bf16"}


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per entry on the last axis (little-endian f16) -> float32."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(F32)


def _k_scales_mins(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins of Q4_K/Q5_K (``get_scale_min_k4`` in ggml-quants.c)
    from ``scales[12]`` (``(..., 12)`` uint8) -> two int32 arrays ``(..., 8)``."""
    q = sc.astype(np.int32)
    s = np.empty(sc.shape[:-1] + (8,), np.int32)
    m = np.empty_like(s)
    s[..., :4] = q[..., 0:4] & 63
    m[..., :4] = q[..., 4:8] & 63
    s[..., 4:] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    m[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return s, m


def unpack_weight(t: Type, w: np.ndarray) -> dict[str, np.ndarray]:
    """Decode weight rows of type ``t`` into integer quants and float32 scales.

    Args:
        t: a weight type of :data:`VEC_DOT_TYPE`.
        w: uint8 ``(M, row_bytes)``: M rows of whole blocks (F16/BF16: ``row_bytes = 2 * K``).

    Returns:
        ``q`` int32 ``(M, nb, bs)`` (the integer each element is stored as, offsets applied:
        Q4_0 ``-8..7``, Q5_0 ``-16..15``, Q4_1 ``0..15``, Q5_1 ``0..31``, Q8_0 int8, Q4_K ``0..15``,
        Q5_K ``0..31``, Q6_K ``-32..31``); ``d`` float32 ``(M, nb)``; ``m`` float32 ``(M, nb)``
        (Q4_1/Q5_1 mins) or ``dmin`` float32 ``(M, nb)`` (Q4_K/Q5_K); ``sc``/``mn`` int32
        ``(M, nb, 8)`` (Q4_K/Q5_K) or ``sc`` int32 ``(M, nb, 16)`` (Q6_K); F16/BF16: ``v``
        float32 ``(M, K)``.

    Raises:
        ValueError: ``t`` has no dot kernel, or ``w`` is not whole blocks.
    """
    if t not in VEC_DOT_TYPE:
        raise ValueError(f"unpack_weight: type {t.type_name} has no vec_dot pair here")
    w = np.ascontiguousarray(w, dtype=np.uint8)
    M = w.shape[0]
    if t == Type.F16:
        return {"v": w.view(np.float16).astype(F32).reshape(M, -1)}
    if t == Type.BF16:
        return {"v": (w.view(np.uint16).astype(np.uint32) << 16).view(F32).reshape(M, -1)}
    if w.shape[1] % t.type_size:
        raise ValueError(f"unpack_weight: row of {w.shape[1]} bytes is not whole {t.type_name} "
                         f"blocks of {t.type_size} bytes")
    b = w.reshape(M, -1, t.type_size)
    out: dict[str, np.ndarray] = {}
    if t in (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1):
        has_m = t in (Type.Q4_1, Type.Q5_1)
        out["d"] = _f16(b[..., 0:2])
        o = 2
        if has_m:
            out["m"] = _f16(b[..., 2:4])
            o = 4
        five = t in (Type.Q5_0, Type.Q5_1)
        if five:
            qh = np.ascontiguousarray(b[..., o:o + 4]).view("<u4")[..., 0].astype(np.int64)
            o += 4
        qs = b[..., o:o + 16].astype(np.int32)
        q = np.concatenate([qs & 0xF, qs >> 4], axis=-1)
        if five:
            bits = ((qh[..., None] >> np.arange(32)) & 1).astype(np.int32)
            q = q | (bits << 4)
        if t == Type.Q4_0:
            q = q - 8
        elif t == Type.Q5_0:
            q = q - 16
        out["q"] = q
    elif t == Type.Q8_0:
        out["d"] = _f16(b[..., 0:2])
        out["q"] = b[..., 2:34].view(np.int8).astype(np.int32)
    elif t in (Type.Q4_K, Type.Q5_K):
        out["d"] = _f16(b[..., 0:2])
        out["dmin"] = _f16(b[..., 2:4])
        out["sc"], out["mn"] = _k_scales_mins(b[..., 4:16])
        qs = b[..., -128:].astype(np.int32).reshape(M, -1, 4, 32)  # chunk c of 64 elements
        q = np.stack([qs & 0xF, qs >> 4], axis=3)                  # (M, nb, 4, 2, 32)
        if t == Type.Q5_K:
            qh = b[..., 16:48].astype(np.int32)                    # (M, nb, 32)
            sh = np.arange(8).reshape(4, 2)
            q = q | (((qh[:, :, None, None, :] >> sh[None, None, :, :, None]) & 1) << 4)
        out["q"] = q.reshape(M, -1, 256)
    elif t == Type.Q6_K:
        ql = b[..., 0:128].astype(np.int32).reshape(M, -1, 2, 64)
        qh = b[..., 128:192].astype(np.int32).reshape(M, -1, 2, 32)
        q = np.empty(ql.shape[:3] + (4, 32), np.int32)
        q[..., 0, :] = (ql[..., 0:32] & 0xF) | (((qh >> 0) & 3) << 4)
        q[..., 1, :] = (ql[..., 32:64] & 0xF) | (((qh >> 2) & 3) << 4)
        q[..., 2, :] = (ql[..., 0:32] >> 4) | (((qh >> 4) & 3) << 4)
        q[..., 3, :] = (ql[..., 32:64] >> 4) | (((qh >> 6) & 3) << 4)
        out["q"] = q.reshape(M, -1, 256) - 32
        out["sc"] = b[..., 192:208].view(np.int8).astype(np.int32)
        out["d"] = _f16(b[..., 208:210])
    return out


def unpack_act(kind: str, y: np.ndarray) -> dict[str, np.ndarray]:
    """Decode activation rows in ``kind`` (``"q8_0"``, ``"q8_1"``, ``"q8_K"``, ``"f16"``, ``"bf16"``).

    Args:
        y: uint8 ``(N, row_bytes)`` (from :mod:`ggmlpy.quants.q8`, or F16/BF16 bits as bytes).

    Returns:
        ``q`` int32 ``(N, nb, bs)``, ``d`` float32 ``(N, nb)``; Q8_1 also ``s`` float32
        ``(N, nb)``; Q8_K also ``bsums`` int32 ``(N, nb, 16)``; F16/BF16: ``v`` float32 ``(N, K)``.

    Raises:
        ValueError: unknown kind, or ``y`` not whole blocks.
    """
    y = np.ascontiguousarray(y, dtype=np.uint8)
    N = y.shape[0]
    if kind == "f16":
        return {"v": y.view(np.float16).astype(F32).reshape(N, -1)}
    if kind == "bf16":
        return {"v": (y.view(np.uint16).astype(np.uint32) << 16).view(F32).reshape(N, -1)}
    size = {"q8_0": Q8_0_BYTES, "q8_1": Q8_1_BYTES, "q8_K": Q8_K_BYTES}.get(kind)
    if size is None:
        raise ValueError(f"unpack_act: kind must be q8_0, q8_1, q8_K, f16 or bf16, got {kind!r}")
    if y.shape[1] % size:
        raise ValueError(f"unpack_act: row of {y.shape[1]} bytes is not whole {kind} blocks")
    b = y.reshape(N, -1, size)
    if kind == "q8_0":
        return {"d": _f16(b[..., 0:2]), "q": b[..., 2:].view(np.int8).astype(np.int32)}
    if kind == "q8_1":
        return {"d": _f16(b[..., 0:2]), "s": _f16(b[..., 2:4]),
                "q": b[..., 4:].view(np.int8).astype(np.int32)}
    return {"d": np.ascontiguousarray(b[..., 0:4]).view(F32)[..., 0],
            "q": b[..., 4:260].view(np.int8).astype(np.int32),
            "bsums": np.ascontiguousarray(b[..., 260:292]).view("<i2").astype(np.int32)}


def vec_dot(t: Type, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``out[n, m] = vec_dot(w[m], y[n])`` as ggml's generic scalar loops compute it.

    Args:
        t: the weight type (a key of :data:`VEC_DOT_TYPE`).
        w: uint8 ``(M, row_bytes)``: weight rows (ggml ``src0``, ``ne = [K, M]``).
        y: uint8 ``(N, row_bytes_y)``: activation rows already in ``VEC_DOT_TYPE[t]``
            (:mod:`ggmlpy.quants.q8`; F16/BF16: their bits viewed as bytes), same ``K``.

    Returns:
        float32 ``(N, M)`` (ggml ``dst`` ``ne = [M, N]``). Synchronous; memory of order
        ``N * M * K`` int32 (a test-sized referee).

    Raises:
        ValueError: ``t`` has no pair; rows of different lengths.
    """
    if t not in VEC_DOT_TYPE:
        raise ValueError(f"vec_dot: type {t.type_name} has no vec_dot pair here")
    return dot_unpacked(t, unpack_weight(t, w), unpack_act(VEC_DOT_TYPE[t], y))


def dot_unpacked(t: Type, W: dict[str, np.ndarray], Y: dict[str, np.ndarray]) -> np.ndarray:
    """:func:`vec_dot` on rows already decoded by :func:`unpack_weight` and :func:`unpack_act`.

    Returns:
        float32 ``(N, M)``.

    Raises:
        ValueError: rows of different lengths.
    """
    N, M = Y[next(iter(Y))].shape[0], W[next(iter(W))].shape[0]
    if t in (Type.F16, Type.BF16):
        if W["v"].shape[1] != Y["v"].shape[1]:
            raise ValueError(f"vec_dot: weight rows of {W['v'].shape[1]} elements, activation "
                             f"rows of {Y['v'].shape[1]}")
        prod = (Y["v"][:, None, :] * W["v"][None, :, :]).astype(F32)       # (N, M, K)
        acc = np.zeros((N, M), np.float64)
        for i in range(prod.shape[2]):
            acc += prod[:, :, i].astype(np.float64)
        return acc.astype(F32)
    if W["q"].shape[1] * W["q"].shape[2] != Y["q"].shape[1] * Y["q"].shape[2]:
        raise ValueError("vec_dot: weight and activation rows have different lengths")
    if t in (Type.Q4_K, Type.Q5_K, Type.Q6_K):
        return _dot_k(t, W, Y)
    # (N, M, nb) integer block sums
    sumi = np.einsum("mbj,nbj->nmb", W["q"], Y["q"], dtype=np.int64).astype(np.int32)
    fs = sumi.astype(F32)
    dx, dy = W["d"][None, :, :], Y["d"][:, None, :]
    if t == Type.Q4_0:
        term = ((fs * dx).astype(F32) * dy).astype(F32)
    elif t == Type.Q8_0:
        term = (fs * (dx * dy).astype(F32)).astype(F32)
    elif t == Type.Q5_0:
        term = ((dx * dy).astype(F32) * fs).astype(F32)
    else:  # Q4_1, Q5_1
        term = (((dx * dy).astype(F32) * fs).astype(F32)
                + (W["m"][None, :, :] * Y["s"][:, None, :]).astype(F32)).astype(F32)
    sumf = np.zeros((N, M), F32)
    for b in range(term.shape[2]):
        sumf += term[:, :, b]
    return sumf


def _dot_k(t: Type, W: dict[str, np.ndarray], Y: dict[str, np.ndarray]) -> np.ndarray:
    qw, qy = W["q"], Y["q"]                       # (M, nb, 256), (N, nb, 256)
    M, nb = qw.shape[:2]
    N = qy.shape[0]
    sub = 16 if t == Type.Q6_K else 32
    scale = np.repeat(W["sc"], sub, axis=2)      # (M, nb, 256): each element's sub-block scale
    prod = qy[:, None] * (qw * scale)[None]      # (N, M, nb, 256) int32
    aux32 = prod.reshape(N, M, nb, 32, 8).sum(axis=3, dtype=np.int64).astype(np.int32)
    d = (W["d"][None, :, :] * Y["d"][:, None, :]).astype(F32)      # (N, M, nb)
    sums = np.zeros((N, M, 8), F32)
    sumf = np.zeros((N, M), F32)
    if t != Type.Q6_K:
        mins16 = np.repeat(W["mn"], 2, axis=2)   # (M, nb, 16): min of each 16-element group
        sumi = np.einsum("mbj,nbj->nmb", mins16, Y["bsums"], dtype=np.int64).astype(np.int32)
        dmin = (W["dmin"][None, :, :] * Y["d"][:, None, :]).astype(F32)
    for b in range(nb):
        sums += (d[:, :, b, None] * aux32[:, :, b].astype(F32)).astype(F32)
        if t != Type.Q6_K:
            sumf -= (dmin[:, :, b] * sumi[:, :, b].astype(F32)).astype(F32)
    for lane in range(8):
        sumf += sums[:, :, lane]
    return sumf
