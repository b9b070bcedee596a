"""Activation ops (test-backend-ops family ``cases_elementwise``: unary and GLU cases): the UNARY op
with its named functions (abs ... exp) and the GLU op with its reglu/geglu/swiglu/... variants.
"""

from __future__ import annotations

from ..opcodes import GluOp, Op, UnaryOp
from ..tensor import Context, Tensor
from ._base import _args, _desc, _dup_or_view, _int, _op, _require, _require_type
from ._inplace import inplace_variant

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


def unary(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    """Element-wise unary function ``op``, op UNARY (mirrors ``ggml_unary``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows (rows
    themselves may be strided). Result: new packed tensor of a's type and ne,
    src ``[a]``, op_params ``[int(op)]`` (:class:`~ggmlpy.opcodes.UnaryOp`). Raises ValueError if
    a's rows are not contiguous or op is unknown.
    """
    return _unary_impl(ctx, a, op, False, "unary")
unary_inplace = inplace_variant(unary, _unary_impl)


def abs(ctx: Context, a: Tensor) -> Tensor:
    """``|x|`` element-wise: :func:`unary` with ``UnaryOp.ABS`` (mirrors ``ggml_abs``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.ABS]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.ABS, False, "abs")
abs_inplace = inplace_variant(abs, _unary_impl, op=UnaryOp.ABS)


def sgn(ctx: Context, a: Tensor) -> Tensor:
    """sign: ``1``, ``-1`` or ``0`` element-wise: :func:`unary` with ``UnaryOp.SGN`` (mirrors
    ``ggml_sgn``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.SGN]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.SGN, False, "sgn")
sgn_inplace = inplace_variant(sgn, _unary_impl, op=UnaryOp.SGN)


def neg(ctx: Context, a: Tensor) -> Tensor:
    """``-x`` element-wise: :func:`unary` with ``UnaryOp.NEG`` (mirrors ``ggml_neg``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.NEG]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.NEG, False, "neg")
neg_inplace = inplace_variant(neg, _unary_impl, op=UnaryOp.NEG)


def step(ctx: Context, a: Tensor) -> Tensor:
    """``1 if x > 0 else 0`` element-wise: :func:`unary` with ``UnaryOp.STEP`` (mirrors
    ``ggml_step``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.STEP]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.STEP, False, "step")
step_inplace = inplace_variant(step, _unary_impl, op=UnaryOp.STEP)


def tanh(ctx: Context, a: Tensor) -> Tensor:
    """``tanh(x)`` element-wise: :func:`unary` with ``UnaryOp.TANH`` (mirrors ``ggml_tanh``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.TANH]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.TANH, False, "tanh")
tanh_inplace = inplace_variant(tanh, _unary_impl, op=UnaryOp.TANH)


def elu(ctx: Context, a: Tensor) -> Tensor:
    """``x if x > 0 else expm1(x)`` element-wise: :func:`unary` with ``UnaryOp.ELU`` (mirrors
    ``ggml_elu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.ELU]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.ELU, False, "elu")
elu_inplace = inplace_variant(elu, _unary_impl, op=UnaryOp.ELU)


def relu(ctx: Context, a: Tensor) -> Tensor:
    """``max(x, 0)`` element-wise: :func:`unary` with ``UnaryOp.RELU`` (mirrors ``ggml_relu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.RELU]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.RELU, False, "relu")
relu_inplace = inplace_variant(relu, _unary_impl, op=UnaryOp.RELU)


def sigmoid(ctx: Context, a: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))`` element-wise: :func:`unary` with ``UnaryOp.SIGMOID`` (mirrors
    ``ggml_sigmoid``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.SIGMOID]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.SIGMOID, False, "sigmoid")
sigmoid_inplace = inplace_variant(sigmoid, _unary_impl, op=UnaryOp.SIGMOID)


def gelu(ctx: Context, a: Tensor) -> Tensor:
    """Tanh-approximated GELU ``0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))`` element-wise (ggml's
    CPU uses an f16 table): :func:`unary` with ``UnaryOp.GELU`` (mirrors ``ggml_gelu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.GELU]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU, False, "gelu")
gelu_inplace = inplace_variant(gelu, _unary_impl, op=UnaryOp.GELU)


def gelu_quick(ctx: Context, a: Tensor) -> Tensor:
    """``x / (1 + exp(-1.702x))`` (ggml's CPU uses an f16 table) element-wise: :func:`unary` with
    ``UnaryOp.GELU_QUICK`` (mirrors ``ggml_gelu_quick``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.GELU_QUICK]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU_QUICK, False, "gelu_quick")
gelu_quick_inplace = inplace_variant(gelu_quick, _unary_impl, op=UnaryOp.GELU_QUICK)


def gelu_erf(ctx: Context, a: Tensor) -> Tensor:
    """Exact GELU ``0.5x(1 + erf(x/sqrt(2)))`` element-wise: :func:`unary` with ``UnaryOp.GELU_ERF``
    (mirrors ``ggml_gelu_erf``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.GELU_ERF]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU_ERF, False, "gelu_erf")
gelu_erf_inplace = inplace_variant(gelu_erf, _unary_impl, op=UnaryOp.GELU_ERF)


def silu(ctx: Context, a: Tensor) -> Tensor:
    """``x / (1 + exp(-x))`` element-wise: :func:`unary` with ``UnaryOp.SILU`` (mirrors
    ``ggml_silu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.SILU]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.SILU, False, "silu")
silu_inplace = inplace_variant(silu, _unary_impl, op=UnaryOp.SILU)


def hardswish(ctx: Context, a: Tensor) -> Tensor:
    """``x * min(1, max(0, (x + 3)/6))`` element-wise: :func:`unary` with ``UnaryOp.HARDSWISH``
    (mirrors ``ggml_hardswish``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.HARDSWISH]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.HARDSWISH, False, "hardswish")


def hardsigmoid(ctx: Context, a: Tensor) -> Tensor:
    """``min(1, max(0, (x + 3)/6))`` element-wise: :func:`unary` with ``UnaryOp.HARDSIGMOID``
    (mirrors ``ggml_hardsigmoid``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.HARDSIGMOID]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.HARDSIGMOID, False, "hardsigmoid")


def exp(ctx: Context, a: Tensor) -> Tensor:
    """``exp(x)`` element-wise: :func:`unary` with ``UnaryOp.EXP`` (mirrors ``ggml_exp``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.EXP]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.EXP, False, "exp")
exp_inplace = inplace_variant(exp, _unary_impl, op=UnaryOp.EXP)


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


def glu(ctx: Context, a: Tensor, op: GluOp, swapped: bool = False) -> Tensor:
    """Gated linear unit on the two halves of each row, op GLU (mirrors ``ggml_glu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), contiguous_1. With x the
    first ``ne0 // 2`` elements of a row and g the next ``ne0 // 2`` (swapped: x second half, g
    first), ``out = act(x) * g``. Result: a's type, ``[ne0 // 2, ne1, ne2, ne3]`` (NumPy ``(ne3,
    ne2, ne1, ne0 // 2)``), src ``[a]``, op_params ``[int(op), int(swapped)]``
    (:class:`~ggmlpy.opcodes.GluOp`). Raises ValueError if a is not contiguous_1 or op is unknown.
    """
    return _glu_impl(ctx, a, None, op, swapped, "glu")


def glu_split(ctx: Context, a: Tensor, b: Tensor, op: GluOp) -> Tensor:
    """Gated linear unit with separate gate tensor: ``act(a) * b``, op GLU (mirrors
    ``ggml_glu_split``).

    a and b of the same type and shape ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``),
    both contiguous_1. Result: a's type and ne, src ``[a, b]``, op_params
    ``[int(op), 0]``. Raises ValueError for different shapes, non-contiguous_1 inputs or an unknown
    op; TypeError for different types.
    """
    return _glu_impl(ctx, a, b, op, False, "glu_split")


def reglu(ctx: Context, a: Tensor) -> Tensor:
    """``relu(x) * g`` with x, g the first/second half of each row: :func:`glu` with ``GluOp.REGLU``
    (mirrors ``ggml_reglu``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.REGLU, 0]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.REGLU, False, "reglu")


def reglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``relu(x) * g`` with x the **second** and g the first half of each row: :func:`glu` with
    ``GluOp.REGLU``, swapped (mirrors ``ggml_reglu_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.REGLU, 1]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.REGLU, True, "reglu_swapped")


def reglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``relu(a) * b``: :func:`glu_split` with ``GluOp.REGLU`` (mirrors ``ggml_reglu_split``).

    a, b same type and shape ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``),
    contiguous_1; result a's type and ne, op GLU, src ``[a, b]``, op_params ``[GluOp.REGLU, 0]``.
    Raises ValueError for different shapes or non-contiguous_1 inputs, TypeError for different
    types.
    """
    return _glu_impl(ctx, a, b, GluOp.REGLU, False, "reglu_split")


def geglu(ctx: Context, a: Tensor) -> Tensor:
    """``gelu(x) * g`` with x, g the first/second half of each row: :func:`glu` with ``GluOp.GEGLU``
    (mirrors ``ggml_geglu``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU, 0]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU, False, "geglu")


def geglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``gelu(x) * g`` with x the **second** and g the first half of each row: :func:`glu` with
    ``GluOp.GEGLU``, swapped (mirrors ``ggml_geglu_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU, 1]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU, True, "geglu_swapped")


def geglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``gelu(a) * b``: :func:`glu_split` with ``GluOp.GEGLU`` (mirrors ``ggml_geglu_split``).

    a, b same type and shape ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``),
    contiguous_1; result a's type and ne, op GLU, src ``[a, b]``, op_params ``[GluOp.GEGLU, 0]``.
    Raises ValueError for different shapes or non-contiguous_1 inputs, TypeError for different
    types.
    """
    return _glu_impl(ctx, a, b, GluOp.GEGLU, False, "geglu_split")


def swiglu(ctx: Context, a: Tensor) -> Tensor:
    """``silu(x) * g`` with x, g the first/second half of each row: :func:`glu` with
    ``GluOp.SWIGLU`` (mirrors ``ggml_swiglu``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.SWIGLU, 0]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.SWIGLU, False, "swiglu")


def swiglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``silu(x) * g`` with x the **second** and g the first half of each row: :func:`glu` with
    ``GluOp.SWIGLU``, swapped (mirrors ``ggml_swiglu_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.SWIGLU, 1]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.SWIGLU, True, "swiglu_swapped")


def swiglu_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``silu(a) * b``: :func:`glu_split` with ``GluOp.SWIGLU`` (mirrors ``ggml_swiglu_split``).

    a, b same type and shape ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``),
    contiguous_1; result a's type and ne, op GLU, src ``[a, b]``, op_params ``[GluOp.SWIGLU, 0]``.
    Raises ValueError for different shapes or non-contiguous_1 inputs, TypeError for different
    types.
    """
    return _glu_impl(ctx, a, b, GluOp.SWIGLU, False, "swiglu_split")


def geglu_erf(ctx: Context, a: Tensor) -> Tensor:
    """``gelu_erf(x) * g`` with x, g the first/second half of each row: :func:`glu` with
    ``GluOp.GEGLU_ERF`` (mirrors ``ggml_geglu_erf``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU_ERF, 0]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU_ERF, False, "geglu_erf")


def geglu_erf_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``gelu_erf(x) * g`` with x the **second** and g the first half of each row: :func:`glu` with
    ``GluOp.GEGLU_ERF``, swapped (mirrors ``ggml_geglu_erf_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU_ERF, 1]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU_ERF, True, "geglu_erf_swapped")


def geglu_erf_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``gelu_erf(a) * b``: :func:`glu_split` with ``GluOp.GEGLU_ERF`` (mirrors
    ``ggml_geglu_erf_split``).

    a, b same type and shape ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``),
    contiguous_1; result a's type and ne, op GLU, src ``[a, b]``, op_params ``[GluOp.GEGLU_ERF,
    0]``. Raises ValueError for different shapes or non-contiguous_1 inputs, TypeError for different
    types.
    """
    return _glu_impl(ctx, a, b, GluOp.GEGLU_ERF, False, "geglu_erf_split")


def geglu_quick(ctx: Context, a: Tensor) -> Tensor:
    """``gelu_quick(x) * g`` with x, g the first/second half of each row: :func:`glu` with
    ``GluOp.GEGLU_QUICK`` (mirrors ``ggml_geglu_quick``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU_QUICK,
    0]``. Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU_QUICK, False, "geglu_quick")


def geglu_quick_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``gelu_quick(x) * g`` with x the **second** and g the first half of each row: :func:`glu`
    with ``GluOp.GEGLU_QUICK``, swapped (mirrors ``ggml_geglu_quick_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU_QUICK,
    1]``. Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU_QUICK, True, "geglu_quick_swapped")


def geglu_quick_split(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``gelu_quick(a) * b``: :func:`glu_split` with ``GluOp.GEGLU_QUICK`` (mirrors
    ``ggml_geglu_quick_split``).

    a, b same type and shape ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``),
    contiguous_1; result a's type and ne, op GLU, src ``[a, b]``, op_params ``[GluOp.GEGLU_QUICK,
    0]``. Raises ValueError for different shapes or non-contiguous_1 inputs, TypeError for different
    types.
    """
    return _glu_impl(ctx, a, b, GluOp.GEGLU_QUICK, False, "geglu_quick_split")
