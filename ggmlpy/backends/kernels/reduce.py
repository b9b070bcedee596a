"""Reductions: SUM, SUM_ROWS, MEAN (accumulated in float64 like ggml's CPU), ARGMAX (ggml's last
maximal index) and ARGSORT (stable on every array module).
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


@kernel(Op.ARGMAX, supports=_sup_argmax)
def _k_argmax(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]                       # (1, 1, ne1, ne0) -> dst (1, 1, 1, ne1)
    n = a.shape[-1]
    rev = a[..., ::-1]                # ggml returns the LAST maximal index; argmax the first
    d = dst.reshape(a.shape[:-1]) if c_contig(dst) else None
    copyto, argmax = xp.copyto, xp.argmax

    def run() -> None:
        r = (n - 1) - argmax(rev, axis=-1)
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
