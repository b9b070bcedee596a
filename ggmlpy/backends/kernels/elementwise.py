"""Element-wise kernels: ADD/SUB/MUL/DIV with ggml's tiling broadcast, ADD1, the one-ufunc maths
ops (SQR, SQRT, LOG, SIN, COS), SCALE, CLAMP and LEAKY_RELU.
"""

from __future__ import annotations

from typing import Any

from ggmlpy.backends.kernels.common import (
    F32,
    FLOATS,
    alias,
    as_f32,
    flatten_ew,
    src_of,
    sup_f32_same,
    sup_same_float,
    tile_views,
    tiles,
    ufunc_step,
)
from ggmlpy.backends.kernels.registry import Kernel, Step, kernel
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor

# ---------------------------------------------------------------------------------------------
# support


def _sup_binary(node: Tensor, xp: Any) -> bool:
    a, b = src_of(node, 0), src_of(node, 1)
    return (a is not None and b is not None and node.type in FLOATS and a.type in FLOATS
            and b.type in FLOATS and a.ne == node.ne and tiles(b, a))


def _sup_add1(node: Tensor, xp: Any) -> bool:
    a, b = src_of(node, 0), src_of(node, 1)
    return (a is not None and b is not None and a.type in FLOATS and b.type in FLOATS
            and node.type in FLOATS and b.nelements == 1 and a.ne == node.ne)


def _sup_leaky_clamp(node: Tensor, xp: Any) -> bool:
    return sup_same_float(node, xp) and node.type == src_of(node, 0).type


# ---------------------------------------------------------------------------------------------
# kernels


def _k_binary(ufunc_name: str) -> Kernel:
    def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
        fn = getattr(xp, ufunc_name)
        a, b, d = tile_views(xp, srcs[0], srcs[1], dst)
        if b.size == 1 and b.ndim != 1:
            b = b.reshape(1)
        a, b, d = flatten_ew(a, b, d)
        step = ufunc_step(xp, fn, a, b, out=d)
        return step
    return make


#: binary ops and the ``xp`` ufunc computing each (src1 tiles src0, ggml's repeat broadcast)
_BINARY_UFUNCS = {Op.ADD: "add", Op.SUB: "subtract", Op.MUL: "multiply", Op.DIV: "divide"}
for _op, _name in _BINARY_UFUNCS.items():
    kernel(_op, supports=_sup_binary)(_k_binary(_name))


@kernel(Op.ADD1, supports=_sup_add1)
def _k_add1(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a, b, d = flatten_ew(srcs[0], srcs[1].reshape(1), dst)
    return ufunc_step(xp, xp.add, a, b, out=d)


def _k_ufunc1(ufunc_name: str) -> Kernel:
    def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
        a, _, d = flatten_ew(srcs[0], None, dst)
        return ufunc_step(xp, getattr(xp, ufunc_name), a, out=d)
    return make


#: one-source maths ops and the ``xp`` ufunc computing each (F32/F16, same shape)
_UNARY_UFUNCS = {Op.SQR: "square", Op.SQRT: "sqrt", Op.LOG: "log", Op.SIN: "sin", Op.COS: "cos"}
for _op, _name in _UNARY_UFUNCS.items():
    kernel(_op, supports=sup_same_float)(_k_ufunc1(_name))


@kernel(Op.SCALE, supports=sup_f32_same)
def _k_scale(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = node.op_params
    s = float(p[0]) if len(p) > 0 else 1.0
    bias = float(p[1]) if len(p) > 1 else 0.0
    a, _, d = flatten_ew(srcs[0], None, dst)
    s32 = F32(s)
    if bias == 0.0:
        return ufunc_step(xp, xp.multiply, a, s32, out=d)
    b32 = F32(bias)
    mul, add = xp.multiply, xp.add
    a = alias(a, d)

    def run() -> None:
        mul(a, s32, out=d)
        add(d, b32, out=d)
    return run


@kernel(Op.CLAMP, supports=_sup_leaky_clamp)
def _k_clamp(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    lo, hi = F32(node.op_params[0]), F32(node.op_params[1])
    a, _, d = flatten_ew(srcs[0], None, dst)
    a = alias(a, d)
    mn, mx = xp.minimum, xp.maximum

    def run() -> None:  # ggml: MAX(MIN(x, max), min)
        mn(a, hi, out=d)
        mx(d, lo, out=d)
    return run


@kernel(Op.LEAKY_RELU, supports=_sup_leaky_clamp)
def _k_leaky_relu(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    slope = F32(node.op_params[0])
    a = srcs[0]
    where, copyto = xp.where, xp.copyto

    def run() -> None:
        x = as_f32(xp, a)
        copyto(dst, where(x > 0, x, x * slope), casting="unsafe")
    return run
