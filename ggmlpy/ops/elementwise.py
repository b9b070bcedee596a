"""Element-wise arithmetic ops (test-backend-ops family ``cases_elementwise``: binary and simple
ops): dup, add/sub/mul/div (b tiled over a), add1, sqr/sqrt/log/sin/cos, scale, clamp, leaky_relu.
"""

from __future__ import annotations

from collections.abc import Callable

from ggmlpy.core.check import checked_args
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.ops._base import _args, _dup_or_view, _f32, _is_padded_1d, _is_scalar, _op, _require, _view_tensor
from ggmlpy.ops._variants import inplace_variant, named_variant

__all__ = [
    "dup", "dup_inplace", "add", "add_inplace", "add1", "add1_inplace", "sub",
    "sub_inplace", "mul", "mul_inplace", "div", "div_inplace", "sqr", "sqr_inplace",
    "sqrt", "sqrt_inplace", "log", "log_inplace", "sin", "sin_inplace", "cos",
    "cos_inplace", "scale", "scale_inplace", "scale_bias", "scale_bias_inplace",
    "clamp", "leaky_relu",
]


def _dup_impl(ctx: Context, a: Tensor, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    return _op(_dup_or_view(ctx, a, inplace), Op.DUP, [], [a])


@checked_args
def dup(ctx: Context, a: Tensor) -> Tensor:
    """Copy of ``a`` (mirrors ``ggml_dup``).

    a: any type, any layout ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), may be
    permuted. Result: new packed tensor of a's type and ne holding a's values in logical
    (row-major) order; op DUP, src ``[a]``, no params.
    """
    return _dup_impl(ctx, a, False, "dup")


dup_inplace = inplace_variant(dup, _dup_impl)


def _binary_impl(ctx: Context, a: Tensor, b: Tensor, op: Op, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a, b=b)
    _require(b.can_repeat_to(a), fn, "b to tile a (every a.ne[i] % b.ne[i] == 0)", a, b)
    return _op(_dup_or_view(ctx, a, inplace), op, [], [a, b])


def _binary_pair(name: str, op: Op, symbol: str) -> tuple[Callable[..., Tensor],
                                                        Callable[..., Tensor]]:
    """``ggml_<name>(ctx, a, b)`` (``a <symbol> tile(b)``) and its generated in-place twin."""

    def binary(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return _binary_impl(ctx, a, b, op, False, name)

    base = named_variant(binary, name, (
        f"``a {symbol} tile(b)``, op {op.name} (mirrors ``ggml_{name}``).\n\n"
        "a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with "
        "every ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not "
        "NumPy-broadcast. Result: a's type and ne, src ``[a, b]``, no params. Raises ValueError if "
        "b does not tile a.\n"))
    return base, inplace_variant(base, _binary_impl, op=op)


add, add_inplace = _binary_pair("add", Op.ADD, "+")
sub, sub_inplace = _binary_pair("sub", Op.SUB, "-")
mul, mul_inplace = _binary_pair("mul", Op.MUL, "*")
div, div_inplace = _binary_pair("div", Op.DIV, "/")


def _add1_impl(ctx: Context, a: Tensor, b: Tensor, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a, b=b)
    _require(_is_scalar(b), fn, "b to be a scalar (ne == [1, 1, 1, 1])", b)
    _require(_is_padded_1d(a), fn, "a to be padded-1d (nb0 == type size, nb2 == nb1*ne1, "
             "nb3 == nb2*ne2)", a)
    return _op(_dup_or_view(ctx, a, inplace), Op.ADD1, [], [a, b])


@checked_args
def add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a + b[0]`` with scalar b, op ADD1 (mirrors ``ggml_add1``, deprecated in ggml).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), padded-1d (packed elements,
    dims 2/3 packed above dim 1); b ``[1, 1, 1, 1]``. Result: a's type and ne, src ``[a, b]``,
    no params. Raises ValueError if b is not a scalar or a not padded-1d.
    """
    return _add1_impl(ctx, a, b, False, "add1")


add1_inplace = inplace_variant(add1, _add1_impl)


def _simple_unary(ctx: Context, a: Tensor, op: Op, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    return _op(_dup_or_view(ctx, a, inplace), op, [], [a])


def _simple_pair(name: str, op: Op, formula: str) -> tuple[Callable[..., Tensor],
                                                          Callable[..., Tensor]]:
    """``ggml_<name>(ctx, a)`` (element-wise ``formula``, no params) and its in-place twin."""

    def simple(ctx: Context, a: Tensor) -> Tensor:
        return _simple_unary(ctx, a, op, False, name)

    base = named_variant(simple, name, (
        f"{formula} element-wise, op {op.name} (mirrors ``ggml_{name}``).\n\n"
        "a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``). Result: a's type and ne, src "
        "``[a]``, no params. No shape rules.\n"))
    return base, inplace_variant(base, _simple_unary, op=op)


sqr, sqr_inplace = _simple_pair("sqr", Op.SQR, "``x*x``")
sqrt, sqrt_inplace = _simple_pair("sqrt", Op.SQRT, "``sqrt(x)``")
log, log_inplace = _simple_pair("log", Op.LOG, "Natural ``log(x)``")
sin, sin_inplace = _simple_pair("sin", Op.SIN, "``sin(x)``")
cos, cos_inplace = _simple_pair("cos", Op.COS, "``cos(x)``")


def _scale_impl(ctx: Context, a: Tensor, s: float, b: float, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    params = [_f32(s, fn, "s"), _f32(b, fn, "b")]
    _require(_is_padded_1d(a), fn, "a to be padded-1d (nb0 == type size, nb2 == nb1*ne1, "
             "nb3 == nb2*ne2)", a)
    return _op(_dup_or_view(ctx, a, inplace), Op.SCALE, params, [a])


@checked_args
def scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    """``s * x``, op SCALE (mirrors ``ggml_scale``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), padded-1d.
    Result: a's type and ne, src ``[a]``, op_params ``[s, 0.0]`` (floats). Raises ValueError if a
    is not padded-1d (packed elements, dims 2/3 packed above dim 1).
    """
    return _scale_impl(ctx, a, s, 0.0, False, "scale")


scale_inplace = inplace_variant(scale, _scale_impl, b=0.0)


@checked_args
def scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """``s * x + b``, op SCALE (mirrors ``ggml_scale_bias``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), padded-1d.
    Result: a's type and ne, src ``[a]``, op_params ``[s, b]`` (floats). Raises ValueError if a is
    not padded-1d.
    """
    return _scale_impl(ctx, a, s, b, False, "scale_bias")


scale_bias_inplace = inplace_variant(scale_bias, _scale_impl)


@checked_args
def clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:
    """Clamp to ``[min, max]``: ``max(min(x, max), min)``, op CLAMP (mirrors ``ggml_clamp``).

    **Always in place**: the result is a view of a (a's type, ne, nb) although the name has no
    ``_inplace``. a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``).
    src ``[a]``, op_params ``[min, max]`` (floats). No shape rules.
    """
    fn = "clamp"
    _args(ctx, fn, a=a)
    params = [_f32(min, fn, "min"), _f32(max, fn, "max")]
    return _op(_view_tensor(ctx, a), Op.CLAMP, params, [a])


@checked_args
def leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    """``max(x, 0) + negative_slope * min(x, 0)``, op LEAKY_RELU (mirrors ``ggml_leaky_relu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``). Result: a's
    type and ne; a view of a when ``inplace``. src ``[a]``, op_params ``[negative_slope]`` (float).
    No shape rules.
    """
    fn = "leaky_relu"
    _args(ctx, fn, a=a)
    params = [_f32(negative_slope, fn, "negative_slope")]
    return _op(_dup_or_view(ctx, a, bool(inplace)), Op.LEAKY_RELU, params, [a])
