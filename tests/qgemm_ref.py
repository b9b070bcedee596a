"""The expected result of a MUL_MAT on the GEMM path under ggml numerics, and its bound
(importable from any test folder: ``pythonpath = ["tests"]``).

Expected: the vec_dot referee (:func:`ggmlpy.quants.vec_dot.vec_dot`, ggml's generic scalar
loops) of the weight rows with the activations quantized to the ``vec_dot_type``. Bound (the one
stated in :mod:`ggmlpy.backends.cpu.qgemm`): ``(K + 2 nb + 16) * 2**-24 * mag`` with ``mag`` the
float64 sum over the GEMM's columns of ``|activation value| * (|weight part| + |min part|)``,
every piece decoded here from the bytes by the referee's own unpackers (not by the code under
test): Q4_1/Q5_1 weight part ``d q``, min part ``m`` met by Q8_1's ``s`` (one column per block);
Q4_K/Q5_K ``d sc q`` and ``dmin mn``; Q4_0/Q5_0/Q8_0/Q6_K the value and no min; F16/BF16 the
value (``nb = 0``).
"""

from __future__ import annotations

import numpy as np

from ggmlpy.backends.cpu import qmatmul
from ggmlpy.core.types import Type
from ggmlpy.quants import vec_dot

F64 = np.float64


def _weight_parts(t: Type, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|weight part|, |min part|) float64 ``(M, C)``; Q4_1/Q5_1: ``C = K + nb``."""
    U = vec_dot.unpack_weight(t, w)
    if t in (Type.F16, Type.BF16):
        v = np.abs(U["v"].astype(F64))
        return v, np.zeros_like(v)
    M = w.shape[0]
    q = U["q"].astype(F64)
    d = U["d"].astype(F64)[:, :, None]
    if t in (Type.Q4_K, Type.Q5_K):
        sc = np.repeat(U["sc"], 32, axis=2).astype(F64)
        mn = np.repeat(U["mn"], 32, axis=2).astype(F64)
        ws = np.abs(d * sc * q).reshape(M, -1)
        wm = np.abs(U["dmin"].astype(F64)[:, :, None] * mn).reshape(M, -1)
        return ws, wm
    if t == Type.Q6_K:
        sc = np.repeat(U["sc"], 16, axis=2).astype(F64)
        return np.abs(d * sc * q).reshape(M, -1), np.zeros((M, q.shape[1] * 256))
    ws = np.abs(d * q).reshape(M, -1)
    if t in (Type.Q4_1, Type.Q5_1):
        return (np.concatenate([ws, np.zeros((M, q.shape[1]))], axis=1),
                np.concatenate([np.zeros_like(ws), np.abs(U["m"].astype(F64))], axis=1))
    return ws, np.zeros_like(ws)


def _act_values(t: Type, y: np.ndarray) -> np.ndarray:
    """|activation values| float64 ``(N, C)`` from the activation bytes (Q8_1: ``s`` appended)."""
    kind = vec_dot.VEC_DOT_TYPE[t]
    Y = vec_dot.unpack_act(kind, y)
    if kind in ("f16", "bf16"):
        return np.abs(Y["v"].astype(F64))
    N = y.shape[0]
    xa = np.abs(Y["q"].astype(F64) * Y["d"].astype(F64)[:, :, None]).reshape(N, -1)
    if kind == "q8_1":
        xa = np.concatenate([xa, np.abs(Y["s"].astype(F64))], axis=1)
    return xa


def ggml_gemm_expected(t: Type, w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(referee float32 ``(N, M)``, bound float64 ``(N, M)``) for weight rows ``w`` (uint8
    ``(M, row_bytes)``; F16/BF16: their bytes) and float32 activations ``x`` ``(N, K)``."""
    act = qmatmul.quantize_act(vec_dot.VEC_DOT_TYPE[t], np.ascontiguousarray(x))
    y = qmatmul.act_bytes(act)
    w = np.ascontiguousarray(w).view(np.uint8).reshape(w.shape[0], -1)
    want = vec_dot.vec_dot(t, w, y)
    ws, wm = _weight_parts(t, w)
    mag = _act_values(t, y) @ (ws + wm).T
    K = x.shape[1]
    nb = 0 if t in (Type.F16, Type.BF16) else K // t.blck_size
    return want, (K + 2 * nb + 16) * 2.0 ** -24 * mag
