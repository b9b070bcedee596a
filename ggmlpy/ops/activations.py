"""Activation ops (test-backend-ops family ``cases_elementwise``: unary and GLU cases): the UNARY op
with its named functions (abs ... exp) and the GLU op with its reglu/geglu/swiglu/... variants.
"""

from __future__ import annotations

from collections.abc import Callable

from ggmlpy.core.check import checked_args
from ggmlpy.core.opcodes import GluOp, Op, UnaryOp
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.ops._base import _args, _desc, _dup_or_view, _int, _op, _require, _require_type
from ggmlpy.ops._variants import inplace_variant, named_variant

__all__ = [
    "unary", "unary_inplace", "abs", "abs_inplace", "sgn", "sgn_inplace", "neg",
    "neg_inplace", "step", "step_inplace", "tanh", "tanh_inplace", "elu", "elu_inplace",
    "relu", "relu_inplace", "sigmoid", "sigmoid_inplace", "gelu", "gelu_inplace",
    "gelu_quick", "gelu_quick_inplace", "gelu_erf", "gelu_erf_inplace", "silu",
    "silu_inplace", "hardswish", "hardsigmoid", "exp", "exp_inplace", "glu",
    "glu_split", "reglu", "reglu_swapped", "reglu_split", "geglu", "geglu_swapped",
    "geglu_split", "swiglu", "swiglu_swapped", "swiglu_split", "geglu_erf",
    "geglu_erf_swapped", "geglu_erf_split", "geglu_quick", "geglu_quick_swapped",
    "geglu_quick_split",
]


def _unary_impl(ctx: Context, a: Tensor, op: UnaryOp | int, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    try:
        u = UnaryOp(_int(op, fn, "op"))
    except ValueError:
        raise ValueError(f"{fn}: unknown unary op {op!r} for {_desc(a)}") from None
    _require(a.is_contiguous_rows(), fn, "a to have contiguous rows (nb0 == type size)", a)
    return _op(_dup_or_view(ctx, a, inplace), Op.UNARY, [int(u)], [a])


@checked_args
def unary(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    """Element-wise unary function ``op``, op UNARY (mirrors ``ggml_unary``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows (rows
    themselves may be strided). Result: new packed tensor of a's type and ne,
    src ``[a]``, op_params ``[int(op)]`` (:class:`~ggmlpy.core.opcodes.UnaryOp`). Raises ValueError if
    a's rows are not contiguous or op is unknown.
    """
    return _unary_impl(ctx, a, op, False, "unary")


unary_inplace = inplace_variant(unary, _unary_impl)


def _named_unary(name: str, op: UnaryOp, formula: str) -> Callable[[Context, Tensor], Tensor]:
    """Build ``ggml_<name>(ctx, a)``: :func:`unary` with ``op`` fixed, documented by ``formula``."""

    def named(ctx: Context, a: Tensor) -> Tensor:
        return _unary_impl(ctx, a, op, False, name)

    return named_variant(named, name, (
        f"{formula} element-wise: :func:`unary` with ``UnaryOp.{op.name}`` (mirrors "
        f"``ggml_{name}``).\n\n"
        f"a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows. "
        f"Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.{op.name}]``. "
        f"Raises ValueError if a's rows are not contiguous.\n"))


def _unary_pair(name: str, op: UnaryOp, formula: str) -> tuple[Callable[[Context, Tensor], Tensor],
                                                               Callable[[Context, Tensor], Tensor]]:
    """``ggml_<name>`` and its generated ``ggml_<name>_inplace`` twin."""
    base = _named_unary(name, op, formula)
    return base, inplace_variant(base, _unary_impl, op=op)


# ggml's named unary functions, in enum ggml_unary_op order
abs, abs_inplace = _unary_pair("abs", UnaryOp.ABS, "``|x|``")
sgn, sgn_inplace = _unary_pair("sgn", UnaryOp.SGN, "sign (``1``, ``-1`` or ``0``)")
neg, neg_inplace = _unary_pair("neg", UnaryOp.NEG, "``-x``")
step, step_inplace = _unary_pair("step", UnaryOp.STEP, "``1 if x > 0 else 0``")
tanh, tanh_inplace = _unary_pair("tanh", UnaryOp.TANH, "``tanh(x)``")
elu, elu_inplace = _unary_pair("elu", UnaryOp.ELU, "``x if x > 0 else expm1(x)``")
relu, relu_inplace = _unary_pair("relu", UnaryOp.RELU, "``max(x, 0)``")
sigmoid, sigmoid_inplace = _unary_pair("sigmoid", UnaryOp.SIGMOID, "``1 / (1 + exp(-x))``")
gelu, gelu_inplace = _unary_pair(
    "gelu", UnaryOp.GELU, "Tanh-approximated GELU ``0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))`` "
    "(ggml's CPU uses an f16 table)")
gelu_quick, gelu_quick_inplace = _unary_pair(
    "gelu_quick", UnaryOp.GELU_QUICK, "``x / (1 + exp(-1.702x))`` (ggml's CPU uses an f16 table)")
silu, silu_inplace = _unary_pair("silu", UnaryOp.SILU, "``x / (1 + exp(-x))``")
hardswish = _named_unary("hardswish", UnaryOp.HARDSWISH, "``x * min(1, max(0, (x + 3)/6))``")
hardsigmoid = _named_unary("hardsigmoid", UnaryOp.HARDSIGMOID, "``min(1, max(0, (x + 3)/6))``")
exp, exp_inplace = _unary_pair("exp", UnaryOp.EXP, "``exp(x)``")
gelu_erf, gelu_erf_inplace = _unary_pair("gelu_erf", UnaryOp.GELU_ERF,
                                         "Exact GELU ``0.5x(1 + erf(x/sqrt(2)))``")


def _glu_impl(ctx: Context, a: Tensor, b: Tensor | None, op: GluOp | int, swapped: bool,
              fn: str) -> Tensor:
    _args(ctx, fn, a=a, b=b)
    try:
        g = GluOp(_int(op, fn, "op"))
    except ValueError:
        raise ValueError(f"{fn}: unknown GLU op {op!r} for {_desc(a)}") from None
    _require(a.is_contiguous_1(), fn, "a to be contiguous_1 (packed rows, dims 2/3 packed)", a)
    if b is None:
        ne = (a.ne[0] // 2, *a.ne[1:])
        src = [a]
    else:
        _require(b.is_contiguous_1(), fn, "b to be contiguous_1 (packed rows, dims 2/3 packed)", b)
        _require(a.ne == b.ne, fn, "a and b of the same shape", a, b)
        _require_type(a.type == b.type, fn, "a and b of the same type", a, b)
        ne = a.ne
        src = [a, b]
    return _op(ctx.new_tensor(a.type, ne), Op.GLU, [int(g), 1 if swapped else 0], src)


@checked_args
def glu(ctx: Context, a: Tensor, op: GluOp, swapped: bool = False) -> Tensor:
    """Gated linear unit on the two halves of each row, op GLU (mirrors ``ggml_glu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), contiguous_1. With x the
    first ``ne0 // 2`` elements of a row and g the next ``ne0 // 2`` (swapped: x second half, g
    first), ``out = act(x) * g``. Result: a's type, ``[ne0 // 2, ne1, ne2, ne3]`` (NumPy ``(ne3,
    ne2, ne1, ne0 // 2)``), src ``[a]``, op_params ``[int(op), int(swapped)]``
    (:class:`~ggmlpy.core.opcodes.GluOp`). Raises ValueError if a is not contiguous_1 or op is unknown.
    """
    return _glu_impl(ctx, a, None, op, swapped, "glu")


@checked_args
def glu_split(ctx: Context, a: Tensor, b: Tensor, op: GluOp) -> Tensor:
    """Gated linear unit with separate gate tensor: ``act(a) * b``, op GLU (mirrors
    ``ggml_glu_split``).

    a and b of the same type and shape ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``),
    both contiguous_1. Result: a's type and ne, src ``[a, b]``, op_params
    ``[int(op), 0]``. Raises ValueError for different shapes, non-contiguous_1 inputs or an unknown
    op; TypeError for different types.
    """
    return _glu_impl(ctx, a, b, op, False, "glu_split")


def _glu_family(name: str, op: GluOp, act: str) -> tuple[Callable[..., Tensor], ...]:
    """Build ``ggml_<name>``, ``ggml_<name>_swapped`` and ``ggml_<name>_split`` for GLU ``op``."""

    def fused(ctx: Context, a: Tensor) -> Tensor:
        return _glu_impl(ctx, a, None, op, False, name)

    def swapped(ctx: Context, a: Tensor) -> Tensor:
        return _glu_impl(ctx, a, None, op, True, f"{name}_swapped")

    def split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
        return _glu_impl(ctx, a, b, op, False, f"{name}_split")

    fused_rules = (
        "a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]`` (NumPy "
        "``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.{op}, {sw}]``. "
        "Raises ValueError if a is not contiguous_1.\n")
    docs = {
        fused: f"``{act}(x) * g`` with x, g the first/second half of each row: :func:`glu` with "
               f"``GluOp.{op.name}`` (mirrors ``ggml_{name}``).\n\n"
               + fused_rules.format(op=op.name, sw=0),
        swapped: f"``{act}(x) * g`` with x the **second** and g the first half of each row: "
                 f":func:`glu` with ``GluOp.{op.name}``, swapped (mirrors "
                 f"``ggml_{name}_swapped``).\n\n" + fused_rules.format(op=op.name, sw=1),
        split: f"``{act}(a) * b``: :func:`glu_split` with ``GluOp.{op.name}`` (mirrors "
               f"``ggml_{name}_split``).\n\n"
               f"a, b same type and shape ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, "
               f"ne0)``), contiguous_1; result a's type and ne, op GLU, src ``[a, b]``, op_params "
               f"``[GluOp.{op.name}, 0]``. Raises ValueError for different shapes or "
               f"non-contiguous_1 inputs, TypeError for different types.\n",
    }
    return tuple(named_variant(f, name + suffix, docs[f])
                 for f, suffix in ((fused, ""), (swapped, "_swapped"), (split, "_split")))


# ggml's named GLU variants, in enum ggml_glu_op order
reglu, reglu_swapped, reglu_split = _glu_family("reglu", GluOp.REGLU, "relu")
geglu, geglu_swapped, geglu_split = _glu_family("geglu", GluOp.GEGLU, "gelu")
swiglu, swiglu_swapped, swiglu_split = _glu_family("swiglu", GluOp.SWIGLU, "silu")
geglu_erf, geglu_erf_swapped, geglu_erf_split = _glu_family("geglu_erf", GluOp.GEGLU_ERF,
                                                            "gelu_erf")
geglu_quick, geglu_quick_swapped, geglu_quick_split = _glu_family("geglu_quick",
                                                                  GluOp.GEGLU_QUICK, "gelu_quick")
