"""Reductions: SUM, SUM_ROWS, MEAN (accumulated in float64 like ggml's CPU), ARGMAX (ggml's CPU
loop exactly, NaN included: :func:`argmax_ggml`) and ARGSORT (stable on every array module).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ggmlpy.backends.kernels.common import F64, FLOATS, c_contig, src_of
from ggmlpy.backends.kernels.registry import Step, kernel
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

# ---------------------------------------------------------------------------------------------
# support


def _sup_reduce(node: Tensor, xp: Any) -> bool:
    a = src_of(node, 0)
    if a is None or a.type not in FLOATS:
        return False
    if node.op == Op.MEAN:
        return node.type == Type.F32
    return node.type == a.type


def _sup_argmax(node: Tensor, xp: Any) -> bool:
    a = src_of(node, 0)
    return (a is not None and a.type == Type.F32 and node.type == Type.I32
            and a.ne[2] == a.ne[3] == 1 and node.ne[0] == a.ne[1])


def _sup_argsort(node: Tensor, xp: Any) -> bool:
    a = src_of(node, 0)
    return a is not None and a.type == Type.F32 and node.type == Type.I32 and a.ne == node.ne


# ---------------------------------------------------------------------------------------------
# kernels


@kernel(Op.SUM, supports=_sup_reduce)
def _k_sum(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]
    copyto, sm = xp.copyto, xp.sum
    return lambda: copyto(dst, sm(a, dtype=F64), casting="unsafe")


@kernel(Op.SUM_ROWS, supports=_sup_reduce)
def _k_sum_rows(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]
    copyto, sm = xp.copyto, xp.sum
    return lambda: copyto(dst, sm(a, axis=-1, keepdims=True, dtype=F64), casting="unsafe")


@kernel(Op.MEAN, supports=_sup_reduce)
def _k_mean(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]
    n = a.shape[-1]
    copyto, sm = xp.copyto, xp.sum
    return lambda: copyto(dst, sm(a, axis=-1, keepdims=True, dtype=F64) / n, casting="unsafe")


def argmax_ggml(xp: Any, a: Any) -> Any:
    """ggml's CPU ARGMAX of each row (``ggml_vec_argmax_f32`` in ggml-cpu/vec.h), vectorised.

    ggml's loop keeps ``max = MAX(max, x[i])`` from ``-inf`` (``MAX(a, b) = a > b ? a : b``) and
    takes the last ``i`` with ``x[i] == max``. A NaN makes ``max`` NaN (``max > NaN`` is false)
    and is never taken (``NaN == NaN`` is false); the next non-NaN value then becomes ``max``
    whatever it is. So the answer is the last index of the maximum of the run of values between
    the last NaN before the row's last non-NaN value and that value; ties give the last index;
    an all-NaN row gives 0. Examples: ``[nan, 5, nan, 1]`` -> 3, ``[2, nan, 1]`` -> 2,
    ``[1, 3, 3, nan]`` -> 2, ``[-inf, -inf]`` -> 1.

    Args:
        xp: the array module (NumPy or CuPy); no host synchronisation.
        a: float array, rows on the last axis (``ne0`` elements).

    Returns:
        int64 array of ``a.shape[:-1]``.
    """
    n = a.shape[-1]
    nan = xp.isnan(a)
    idx = xp.arange(n)
    valid = ~nan
    q = (n - 1) - xp.argmax(valid[..., ::-1], axis=-1)[..., None]        # last non-NaN
    p = xp.max(xp.where(nan & (idx < q), idx, -1), axis=-1, keepdims=True)  # last NaN before it
    seg = (idx > p) & (idx <= q)
    m = xp.max(xp.where(seg, a, -xp.inf), axis=-1, keepdims=True)
    hit = seg & (a == m)
    r = (n - 1) - xp.argmax(hit[..., ::-1], axis=-1)
    return xp.where(valid.any(axis=-1), r, 0)


@kernel(Op.ARGMAX, supports=_sup_argmax)
def _k_argmax(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]                       # (1, 1, ne1, ne0) -> dst (1, 1, 1, ne1)
    d = dst.reshape(a.shape[:-1]) if c_contig(dst) else None
    copyto = xp.copyto

    def run() -> None:
        r = argmax_ggml(xp, a)
        if d is not None:
            copyto(d, r, casting="unsafe")
        else:
            copyto(dst, r.reshape(dst.shape), casting="unsafe")
    return run


@kernel(Op.ARGSORT, supports=_sup_argsort)
def _k_argsort(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    desc = bool(node.op_params[0]) if node.op_params else False
    a = srcs[0]
    copyto = xp.copyto
    # stable on both: CuPy's argsort is always stable (thrust; it accepts only kind=None or
    # "stable"), NumPy's default quicksort is not, so ties would order differently per backend
    argsort = partial(xp.argsort, axis=-1, kind="stable")
    if desc:
        return lambda: copyto(dst, argsort(-a), casting="unsafe")
    return lambda: copyto(dst, argsort(a), casting="unsafe")
