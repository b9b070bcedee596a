"""Graph-building op functions: ggml's ``ggml_<op>`` constructors with ggml's shape rules.

Every function takes the :class:`~ggmlpy.tensor.Context` first, then ggml's arguments in ggml's
order, e.g. ``ops.add(ctx, a, b)`` mirrors ``ggml_add(ctx, a, b)``. They only build metadata: the
result tensor (a new packed tensor via ``ctx.new_tensor``/``ctx.dup_tensor``, or a view via
``ctx.new_view``) with ``.op``, ``.op_params`` and ``.src`` set; nothing is computed and no memory
is touched. Backends compute the graph later.

Conventions used by every docstring:

* Shapes are ggml ``ne = [ne0, ne1, ne2, ne3]`` (element counts, ``ne0`` innermost); the NumPy
  shape of the same data is the reverse, ``(ne3, ne2, ne1, ne0)``. Strides ``nb`` are in bytes.
* ``op_params`` is a Python list in ggml's slot order (reference section 2.10). Float slots hold
  Python floats already rounded to float32 (ggml stores them bit-wise as float32), int slots hold
  Python ints. Ops without parameters have ``op_params == []``.
* ``src`` follows ggml's order. Optional sources keep their slot and hold ``None`` when absent
  (``soft_max`` ``[a, mask]``, ``rope`` ``[a, pos, freq_factors]``, ``flash_attn_ext``
  ``[q, k, v, mask]``).
* ``_inplace`` variants return a view of ``a`` (same type, ``ne``, ``nb``; ``view_src`` is a's root)
  with the same op and ``src[0] = a``.
* Names follow ggml where ggml names results: views ``"<a> (view)"``, ``"<a> (reshaped)"``,
  ``"<a> (permuted)"``, ``"<a> (transposed)"``, ``"<a> (cont)"``, ``"<a> (copy)"``,
  ``"<b> (copy of <a>)"``. Other results are unnamed (the graph names them ``node_%d``).
* Errors: a violated ggml assert raises ``ValueError`` (shape/layout/parameter rules) or
  ``TypeError`` (element-type rules), naming the function, the condition and the tensors (by
  ``.name``, type and ``ne``). Non-Tensor arguments raise ``TypeError``. Nothing is added to the
  context when an error is raised before the result is created.

Note that ``sum``, ``abs`` and ``set`` shadow Python builtins inside this module's namespace (they
keep ggml's names); use ``ggmlpy.ops.sum`` qualified.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Sequence
from enum import IntEnum

import numpy as np

from .graph import Graph
from .opcodes import GluOp, Op, UnaryOp
from .tensor import MAX_DIMS, Context, Tensor
from .types import Type

__all__ = [
    # constants and enums
    "Prec", "SortOrder", "ROPE_TYPE_NORMAL", "ROPE_TYPE_NEOX",
    # tensor and graph helpers
    "set_name", "set_input", "set_output", "set_param", "build_forward_expand",
    # element-wise arithmetic
    "dup", "dup_inplace", "add", "add_inplace", "add1", "add1_inplace", "sub", "sub_inplace",
    "mul", "mul_inplace", "div", "div_inplace", "sqr", "sqr_inplace", "sqrt", "sqrt_inplace",
    "log", "log_inplace", "sin", "sin_inplace", "cos", "cos_inplace",
    "scale", "scale_inplace", "scale_bias", "scale_bias_inplace", "clamp", "leaky_relu",
    "acc", "acc_inplace", "set", "set_inplace", "set_1d", "set_1d_inplace", "set_2d",
    "set_2d_inplace",
    # reductions and index ops
    "sum", "sum_rows", "mean", "argmax", "argsort",
    # layout ops
    "repeat", "repeat_4d", "concat", "cpy", "cast", "cont", "cont_1d", "cont_2d", "cont_3d",
    "cont_4d", "reshape", "reshape_1d", "reshape_2d", "reshape_3d", "reshape_4d",
    "view_1d", "view_2d", "view_3d", "view_4d", "permute", "transpose", "get_rows",
    "pad", "pad_ext", "arange", "timestep_embedding",
    # normalisation
    "norm", "norm_inplace", "rms_norm", "rms_norm_inplace", "group_norm", "group_norm_inplace",
    "l2_norm", "l2_norm_inplace",
    # matrix products
    "mul_mat", "mul_mat_set_prec", "out_prod",
    # masking, softmax, attention, rope
    "diag_mask_inf", "diag_mask_inf_inplace", "diag_mask_zero", "diag_mask_zero_inplace",
    "soft_max", "soft_max_inplace", "soft_max_ext", "soft_max_ext_inplace",
    "rope", "rope_inplace", "rope_ext", "rope_ext_inplace",
    "flash_attn_ext", "flash_attn_ext_set_prec",
    # unary
    "unary", "unary_inplace",
    "abs", "abs_inplace", "sgn", "sgn_inplace", "neg", "neg_inplace", "step", "step_inplace",
    "tanh", "tanh_inplace", "elu", "elu_inplace", "relu", "relu_inplace",
    "sigmoid", "sigmoid_inplace", "gelu", "gelu_inplace", "gelu_quick", "gelu_quick_inplace",
    "gelu_erf", "gelu_erf_inplace", "silu", "silu_inplace", "hardswish", "hardsigmoid",
    "exp", "exp_inplace",
    # gated linear units
    "glu", "glu_split",
    "reglu", "reglu_swapped", "reglu_split", "geglu", "geglu_swapped", "geglu_split",
    "swiglu", "swiglu_swapped", "swiglu_split", "geglu_erf", "geglu_erf_swapped",
    "geglu_erf_split", "geglu_quick", "geglu_quick_swapped", "geglu_quick_split",
]


# ------------------------------------------------------------------------------------------------
# constants
# ------------------------------------------------------------------------------------------------

class Prec(IntEnum):
    """Accumulation precision hint of MUL_MAT / FLASH_ATTN_EXT (mirrors ``enum ggml_prec``)."""

    DEFAULT = 0
    F32 = 10


class SortOrder(IntEnum):
    """Order of :func:`argsort` (mirrors ``enum ggml_sort_order``)."""

    ASC = 0
    DESC = 1


#: RoPE mode: rotate adjacent pairs ``(2m, 2m+1)`` (mirrors ``GGML_ROPE_TYPE_NORMAL``).
ROPE_TYPE_NORMAL = 0
#: RoPE mode: rotate pairs ``(m, m + n_dims/2)`` (mirrors ``GGML_ROPE_TYPE_NEOX``).
ROPE_TYPE_NEOX = 2

_INT32_MAX = 2**31 - 1


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

def _desc(t: Tensor) -> str:
    name = f"'{t.name}'" if t.name else "<unnamed>"
    return f"{name} ({t.type.type_name}, ne={list(t.ne)})"


def _check_ctx(ctx: object, fn: str) -> None:
    if not isinstance(ctx, Context):
        raise TypeError(f"{fn}: first argument must be a Context, got {type(ctx).__name__}")


def _check_tensor(x: object, fn: str, arg: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}: argument '{arg}' must be a Tensor, got {type(x).__name__}")
    return x


def _args(ctx: object, fn: str, **tensors: object) -> None:
    _check_ctx(ctx, fn)
    for arg, t in tensors.items():
        if t is not None:
            _check_tensor(t, fn, arg)


def _require(cond: bool, fn: str, what: str, *tensors: Tensor) -> None:
    if not cond:
        got = ", ".join(_desc(t) for t in tensors)
        raise ValueError(f"{fn}: requires {what}" + (f"; got {got}" if got else ""))


def _require_type(cond: bool, fn: str, what: str, *tensors: Tensor) -> None:
    if not cond:
        got = ", ".join(_desc(t) for t in tensors)
        raise TypeError(f"{fn}: requires {what}" + (f"; got {got}" if got else ""))


def _int(x: object, fn: str, arg: str) -> int:
    try:
        return operator.index(x)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{fn}: '{arg}' must be an int, got {x!r}") from None


def _f32(x: object, fn: str, arg: str) -> float:
    """``x`` rounded to float32 and returned as a Python float (ggml's float op_params slots)."""
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: '{arg}' must be a number, got {x!r}") from None
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def _op(t: Tensor, op: Op, params: Sequence[object], src: Sequence[Tensor | None]) -> Tensor:
    t.op = op
    t.op_params = list(params)
    t.src = list(src)
    return t


def _view_tensor(ctx: Context, a: Tensor) -> Tensor:
    """A view of all of ``a`` with a's type, ne and nb, named ``"<a> (view)"``
    (``ggml_view_tensor``)."""
    t = ctx.new_view(a, a.type, a.ne, a.nb, 0)
    t.set_name(f"{a.name} (view)")
    return t


def _dup_or_view(ctx: Context, a: Tensor, inplace: bool) -> Tensor:
    return _view_tensor(ctx, a) if inplace else ctx.dup_tensor(a)


def _is_padded_1d(t: Tensor) -> bool:
    # mirrors ggml's internal ggml_is_padded_1d
    return (t.nb[0] == t.type.type_size and t.nb[2] == t.nb[1] * t.ne[1]
            and t.nb[3] == t.nb[2] * t.ne[2])


def _is_scalar(t: Tensor) -> bool:
    return t.ne == (1, 1, 1, 1)


def _is_vector(t: Tensor) -> bool:
    return t.ne[1] == 1 and t.ne[2] == 1 and t.ne[3] == 1


def _is_matrix(t: Tensor) -> bool:
    return t.ne[2] == 1 and t.ne[3] == 1


def _divides(d: int, n: int) -> bool:
    """``n % d == 0`` with a zero divisor counting as not dividing (empty tensors)."""
    return d > 0 and n % d == 0


def _nelements(ne: Sequence[int]) -> int:
    n = 1
    for v in ne:
        n *= v
    return n


# ------------------------------------------------------------------------------------------------
# tensor flags, names and graph expansion
# ------------------------------------------------------------------------------------------------

def set_name(tensor: Tensor, name: str) -> Tensor:
    """Set ``tensor.name`` (truncated to 63 characters) and return the tensor (mirrors
    ``ggml_set_name``).

    Raises TypeError if ``tensor`` is not a Tensor.
    """
    return _check_tensor(tensor, "set_name", "tensor").set_name(name)


def set_input(tensor: Tensor) -> Tensor:
    """Flag ``tensor`` as a graph input (``Flag.INPUT``) and return it (mirrors ``ggml_set_input``).

    Raises TypeError if ``tensor`` is not a Tensor.
    """
    return _check_tensor(tensor, "set_input", "tensor").set_input()


def set_output(tensor: Tensor) -> Tensor:
    """Flag ``tensor`` (and its ``view_src``) as a graph output and return it (mirrors
    ``ggml_set_output``).

    Raises TypeError if ``tensor`` is not a Tensor.
    """
    return _check_tensor(tensor, "set_output", "tensor").set_output()


def set_param(tensor: Tensor) -> Tensor:
    """Flag ``tensor`` as a trainable parameter and return it (mirrors ``ggml_set_param``).

    Raises ValueError if the tensor has an op (only op NONE tensors can be parameters), TypeError
    if it is not a Tensor.
    """
    return _check_tensor(tensor, "set_param", "tensor").set_param()


def build_forward_expand(graph: Graph, tensor: Tensor) -> None:
    """Add ``tensor`` and everything it depends on to ``graph`` (mirrors
    ``ggml_build_forward_expand``).

    Delegates to :meth:`Graph.build_forward_expand` (depth-first post-order over ``src``; op NONE
    tensors become leafs, the rest nodes). Raises TypeError for a non-Graph/non-Tensor argument and
    :class:`~ggmlpy.errors.GraphFullError` when the graph's size is exceeded.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"build_forward_expand: expected a Graph, got {type(graph).__name__}")
    graph.build_forward_expand(tensor)


# ------------------------------------------------------------------------------------------------
# element-wise arithmetic
# ------------------------------------------------------------------------------------------------

def _dup_impl(ctx: Context, a: Tensor, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    return _op(_dup_or_view(ctx, a, inplace), Op.DUP, [], [a])


def dup(ctx: Context, a: Tensor) -> Tensor:
    """Copy of ``a`` (mirrors ``ggml_dup``).

    a: any type, any layout ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), may be
    permuted. Result: new packed tensor of a's type and ne holding a's values in logical
    (row-major) order; op DUP, src ``[a]``, no params.
    """
    return _dup_impl(ctx, a, False, "dup")


def dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`dup`: a view of ``a`` (same type/ne/nb) with op DUP, src ``[a]`` (mirrors
    ``ggml_dup_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules as :func:`dup`.
    """
    return _dup_impl(ctx, a, True, "dup_inplace")


def _binary_impl(ctx: Context, a: Tensor, b: Tensor, op: Op, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a, b=b)
    _require(b.can_repeat_to(a), fn, "b to tile a (every a.ne[i] % b.ne[i] == 0)", a, b)
    return _op(_dup_or_view(ctx, a, inplace), op, [], [a, b])


def add(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a + tile(b)``, op ADD (mirrors ``ggml_add``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with every
    ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not NumPy-broadcast.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``, no params. Types: CPU
    kernels support all-F32, all-F16 and F16 a with F32 b. Raises ValueError if b does not tile
    a.
    """
    return _binary_impl(ctx, a, b, Op.ADD, False, "add")


def add_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """In-place ``a + tile(b)``: a view of a, op ADD (mirrors ``ggml_add_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with every
    ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not NumPy-broadcast.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``, no params. Types: CPU
    kernels support all-F32, all-F16 and F16 a with F32 b. Raises ValueError if b does not tile
    a.
    """
    return _binary_impl(ctx, a, b, Op.ADD, True, "add_inplace")


def sub(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a - tile(b)``, op SUB (mirrors ``ggml_sub``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with every
    ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not NumPy-broadcast.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``, no params. Types: CPU
    kernels support all-F32, all-F16 and F16 a with F32 b. Raises ValueError if b does not tile
    a.
    """
    return _binary_impl(ctx, a, b, Op.SUB, False, "sub")


def sub_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """In-place ``a - tile(b)``: a view of a, op SUB (mirrors ``ggml_sub_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with every
    ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not NumPy-broadcast.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``, no params. Types: CPU
    kernels support all-F32, all-F16 and F16 a with F32 b. Raises ValueError if b does not tile
    a.
    """
    return _binary_impl(ctx, a, b, Op.SUB, True, "sub_inplace")


def mul(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a * tile(b)``, op MUL (mirrors ``ggml_mul``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with every
    ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not NumPy-broadcast.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``, no params. Types: CPU
    kernels support all-F32, all-F16 and F16 a with F32 b. Raises ValueError if b does not tile
    a.
    """
    return _binary_impl(ctx, a, b, Op.MUL, False, "mul")


def mul_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """In-place ``a * tile(b)``: a view of a, op MUL (mirrors ``ggml_mul_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with every
    ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not NumPy-broadcast.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``, no params. Types: CPU
    kernels support all-F32, all-F16 and F16 a with F32 b. Raises ValueError if b does not tile
    a.
    """
    return _binary_impl(ctx, a, b, Op.MUL, True, "mul_inplace")


def div(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a / tile(b)``, op DIV (mirrors ``ggml_div``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with every
    ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not NumPy-broadcast.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``, no params. Types: CPU
    kernels support all-F32, all-F16 and F16 a with F32 b. Raises ValueError if b does not tile
    a.
    """
    return _binary_impl(ctx, a, b, Op.DIV, False, "div")


def div_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """In-place ``a / tile(b)``: a view of a, op DIV (mirrors ``ggml_div_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); b ``[m0, m1, m2, m3]`` with every
    ``m_i`` dividing ``ne_i``: b is **tiled** (index modulo, ``np.tile``), not NumPy-broadcast.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``, no params. Types: CPU
    kernels support all-F32, all-F16 and F16 a with F32 b. Raises ValueError if b does not tile
    a.
    """
    return _binary_impl(ctx, a, b, Op.DIV, True, "div_inplace")


def _add1_impl(ctx: Context, a: Tensor, b: Tensor, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a, b=b)
    _require(_is_scalar(b), fn, "b to be a scalar (ne == [1, 1, 1, 1])", b)
    _require(_is_padded_1d(a), fn, "a to be padded-1d (nb0 == type size, nb2 == nb1*ne1, "
             "nb3 == nb2*ne2)", a)
    return _op(_dup_or_view(ctx, a, inplace), Op.ADD1, [], [a, b])


def add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """``a + b[0]`` with scalar b, op ADD1 (mirrors ``ggml_add1``, deprecated in ggml).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), padded-1d (packed elements,
    dims 2/3 packed above dim 1); b ``[1, 1, 1, 1]``. Result: a's type and ne, src ``[a, b]``,
    no params. Raises ValueError if b is not a scalar or a not padded-1d.
    """
    return _add1_impl(ctx, a, b, False, "add1")


def add1_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """In-place :func:`add1`: a view of a, op ADD1, src ``[a, b]`` (mirrors ``ggml_add1_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules and errors as
    :func:`add1`.
    """
    return _add1_impl(ctx, a, b, True, "add1_inplace")


def _simple_unary(ctx: Context, a: Tensor, op: Op, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    return _op(_dup_or_view(ctx, a, inplace), op, [], [a])


def sqr(ctx: Context, a: Tensor) -> Tensor:
    """``x*x`` element-wise, op SQR (mirrors ``ggml_sqr``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.SQR, False, "sqr")


def sqr_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place ``x*x``, op SQR (mirrors ``ggml_sqr_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.SQR, True, "sqr_inplace")


def sqrt(ctx: Context, a: Tensor) -> Tensor:
    """``sqrt(x)`` element-wise, op SQRT (mirrors ``ggml_sqrt``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.SQRT, False, "sqrt")


def sqrt_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place ``sqrt(x)``, op SQRT (mirrors ``ggml_sqrt_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.SQRT, True, "sqrt_inplace")


def log(ctx: Context, a: Tensor) -> Tensor:
    """Natural ``log(x)`` element-wise, op LOG (mirrors ``ggml_log``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.LOG, False, "log")


def log_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place ``log(x)``, op LOG (mirrors ``ggml_log_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.LOG, True, "log_inplace")


def sin(ctx: Context, a: Tensor) -> Tensor:
    """``sin(x)`` element-wise, op SIN (mirrors ``ggml_sin``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.SIN, False, "sin")


def sin_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place ``sin(x)``, op SIN (mirrors ``ggml_sin_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.SIN, True, "sin_inplace")


def cos(ctx: Context, a: Tensor) -> Tensor:
    """``cos(x)`` element-wise, op COS (mirrors ``ggml_cos``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.COS, False, "cos")


def cos_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place ``cos(x)``, op COS (mirrors ``ggml_cos_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    a's type and ne (a view of a for ``_inplace``), src ``[a]``, no params. No shape rules.
    """
    return _simple_unary(ctx, a, Op.COS, True, "cos_inplace")


def _scale_impl(ctx: Context, a: Tensor, s: float, b: float, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    params = [_f32(s, fn, "s"), _f32(b, fn, "b")]
    _require(_is_padded_1d(a), fn, "a to be padded-1d (nb0 == type size, nb2 == nb1*ne1, "
             "nb3 == nb2*ne2)", a)
    return _op(_dup_or_view(ctx, a, inplace), Op.SCALE, params, [a])


def scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    """``s * x``, op SCALE (mirrors ``ggml_scale``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), padded-1d, F32 on the CPU.
    Result: a's type and ne, src ``[a]``, op_params ``[s, 0.0]`` (floats). Raises ValueError if a
    is not padded-1d (packed elements, dims 2/3 packed above dim 1).
    """
    return _scale_impl(ctx, a, s, 0.0, False, "scale")


def scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    """In-place :func:`scale`: a view of a, op SCALE, params ``[s, 0.0]`` (mirrors
    ``ggml_scale_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules and errors as
    :func:`scale`.
    """
    return _scale_impl(ctx, a, s, 0.0, True, "scale_inplace")


def scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """``s * x + b``, op SCALE (mirrors ``ggml_scale_bias``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), padded-1d, F32 on the CPU.
    Result: a's type and ne, src ``[a]``, op_params ``[s, b]`` (floats). Raises ValueError if a is
    not padded-1d.
    """
    return _scale_impl(ctx, a, s, b, False, "scale_bias")


def scale_bias_inplace(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """In-place :func:`scale_bias`: a view of a, op SCALE, params ``[s, b]`` (mirrors
    ``ggml_scale_bias_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules and errors as
    :func:`scale_bias`.
    """
    return _scale_impl(ctx, a, s, b, True, "scale_bias_inplace")


def clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:
    """Clamp to ``[min, max]``: ``max(min(x, max), min)``, op CLAMP (mirrors ``ggml_clamp``).

    **Always in place**: the result is a view of a (a's type, ne, nb) although the name has no
    ``_inplace``. a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU.
    src ``[a]``, op_params ``[min, max]`` (floats). No shape rules.
    """
    fn = "clamp"
    _args(ctx, fn, a=a)
    params = [_f32(min, fn, "min"), _f32(max, fn, "max")]
    return _op(_view_tensor(ctx, a), Op.CLAMP, params, [a])


def leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    """``max(x, 0) + negative_slope * min(x, 0)``, op LEAKY_RELU (mirrors ``ggml_leaky_relu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result: a's
    type and ne; a view of a when ``inplace``. src ``[a]``, op_params ``[negative_slope]`` (float).
    No shape rules.
    """
    fn = "leaky_relu"
    _args(ctx, fn, a=a)
    params = [_f32(negative_slope, fn, "negative_slope")]
    return _op(_dup_or_view(ctx, a, bool(inplace)), Op.LEAKY_RELU, params, [a])


def _set_acc_impl(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
                  inplace: bool, op: Op, fn: str) -> Tensor:
    _args(ctx, fn, a=a, b=b)
    nbs = [_int(nb1, fn, "nb1"), _int(nb2, fn, "nb2"), _int(nb3, fn, "nb3")]
    offset = _int(offset, fn, "offset")
    if op == Op.ACC:
        _require_type(a.type == Type.F32 and b.type == Type.F32, fn, "a and b of type F32", a, b)
        _require(a.is_contiguous(), fn, "a to be contiguous", a)
    else:
        _require_type(a.type == b.type, fn, "a and b of the same type", a, b)
        _require(a.is_contiguous(), fn, "a to be contiguous (the kernels copy a in one piece)", a)
    _require(b.nelements <= a.nelements, fn, "nelements(b) <= nelements(a)", a, b)
    if min(nbs) < 0 or not 0 <= offset < 2**30:
        raise ValueError(f"{fn}: requires nb1, nb2, nb3 >= 0 and 0 <= offset < 2**30; got "
                         f"nb1={nbs[0]}, nb2={nbs[1]}, nb3={nbs[2]}, offset={offset} for "
                         f"{_desc(a)}, {_desc(b)}")
    if not b.is_empty():
        # extent of the view of a that b is written into (ggml's kernel assert)
        strides = [a.type.type_size, *nbs]
        last = offset + builtins.sum((b.ne[i] - 1) * strides[i] for i in range(MAX_DIMS))
        if last + a.type.type_size > a.nbytes:
            raise ValueError(f"{fn}: the view of a with b's shape {list(b.ne)}, strides "
                             f"{strides} and offset {offset} ends at byte "
                             f"{last + a.type.type_size}, past the {a.nbytes} bytes of "
                             f"{_desc(a)}; b is {_desc(b)}")
    result = _dup_or_view(ctx, a, inplace)
    return _op(result, op, [*nbs, offset, 1 if inplace else 0], [a, b])


def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """Copy of a with b **added** into a strided region, op ACC; a and b F32 (mirrors ``ggml_acc``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
    ``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
    element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
    must lie inside a. Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``,
    op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
    bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
    """
    return _set_acc_impl(ctx, a, b, nb1, nb2, nb3, offset, False, Op.ACC, "acc")


def acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
                offset: int) -> Tensor:
    """In-place :func:`acc` (result is a view of a, params' inplace slot 1) (mirrors
    ``ggml_acc_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
    ``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
    element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
    must lie inside a. Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``,
    op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
    bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
    """
    return _set_acc_impl(ctx, a, b, nb1, nb2, nb3, offset, True, Op.ACC, "acc_inplace")


def set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """Copy of a with b **assigned** into a strided region, op SET; a and b of the same type (F32 or
    I32 on the CPU) (mirrors ``ggml_set``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
    ``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
    element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
    must lie inside a. Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``,
    op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
    bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
    """
    return _set_acc_impl(ctx, a, b, nb1, nb2, nb3, offset, False, Op.SET, "set")


def set_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int,
                offset: int) -> Tensor:
    """In-place :func:`set` (result is a view of a, params' inplace slot 1) (mirrors
    ``ggml_set_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
    ``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
    element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
    must lie inside a. Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``,
    op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
    bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
    """
    return _set_acc_impl(ctx, a, b, nb1, nb2, nb3, offset, True, Op.SET, "set_inplace")


def set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """:func:`set` with a's own strides: ``set(a, b, a.nb1, a.nb2, a.nb3, offset)`` (mirrors
    ``ggml_set_1d``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
    ``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
    element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
    must lie inside a. Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``,
    op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
    bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
    """
    _args(ctx, "set_1d", a=a, b=b)
    return _set_acc_impl(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, False, Op.SET, "set_1d")


def set_1d_inplace(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """In-place :func:`set_1d` (mirrors ``ggml_set_1d_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
    ``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
    element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
    must lie inside a. Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``,
    op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
    bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
    """
    _args(ctx, "set_1d_inplace", a=a, b=b)
    return _set_acc_impl(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, True, Op.SET,
                         "set_1d_inplace")


def set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """:func:`set` with row stride ``nb1`` and a's nb2/nb3: ``set(a, b, nb1, a.nb2, a.nb3, offset)``
    (mirrors ``ggml_set_2d``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
    ``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
    element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
    must lie inside a. Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``,
    op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
    bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
    """
    _args(ctx, "set_2d", a=a, b=b)
    return _set_acc_impl(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, False, Op.SET, "set_2d")


def set_2d_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """In-place :func:`set_2d` (mirrors ``ggml_set_2d_inplace``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
    ``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
    element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
    must lie inside a. Result: a's type and ne (a view of a for ``_inplace``), src ``[a, b]``,
    op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
    bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
    """
    _args(ctx, "set_2d_inplace", a=a, b=b)
    return _set_acc_impl(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, True, Op.SET, "set_2d_inplace")


# ------------------------------------------------------------------------------------------------
# reductions and index ops
# ------------------------------------------------------------------------------------------------

def sum(ctx: Context, a: Tensor) -> Tensor:
    """Sum of all elements, op SUM (mirrors ``ggml_sum``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32/F16 on the CPU. Result:
    ``[1]`` (NumPy ``(1, 1, 1, 1)``) of **a's type**, src ``[a]``, no params. No shape rules.
    """
    _args(ctx, "sum", a=a)
    return _op(ctx.new_tensor(a.type, (1,)), Op.SUM, [], [a])


def sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """Sum of each row (along ne0), op SUM_ROWS (mirrors ``ggml_sum_rows``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``; NumPy ``sum(axis=-1,
    keepdims=True)``). Result: ``[1, ne1, ne2, ne3]`` of a's type, src ``[a]``, no params. No shape
    rules.
    """
    _args(ctx, "sum_rows", a=a)
    return _op(ctx.new_tensor(a.type, (1, *a.ne[1:])), Op.SUM_ROWS, [], [a])


def mean(ctx: Context, a: Tensor) -> Tensor:
    """Mean of each row (along ne0), op MEAN (mirrors ``ggml_mean``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``; NumPy ``mean(axis=-1,
    keepdims=True)``). Result: **F32** ``[1, ne1, ne2, ne3]``, src ``[a]``, no params. No shape
    rules.
    """
    _args(ctx, "mean", a=a)
    return _op(ctx.new_tensor(Type.F32, (1, *a.ne[1:])), Op.MEAN, [], [a])


def argmax(ctx: Context, a: Tensor) -> Tensor:
    """Index of the maximum of each row, op ARGMAX (mirrors ``ggml_argmax``).

    a a matrix ``[ne0, ne1, 1, 1]`` (NumPy ``(1, 1, ne1, ne0)``) with ``ne0 <= INT32_MAX``. Result:
    **I32** ``[ne1]`` (ggml's CPU returns the *last* index among equal maxima), src ``[a]``, no
    params. Raises ValueError if a is not a matrix or its rows are too long.
    """
    fn = "argmax"
    _args(ctx, fn, a=a)
    _require(_is_matrix(a), fn, "a to be a matrix (ne2 == ne3 == 1)", a)
    _require(a.ne[0] <= _INT32_MAX, fn, "a.ne0 <= INT32_MAX", a)
    return _op(ctx.new_tensor(Type.I32, (a.ne[1],)), Op.ARGMAX, [], [a])


def argsort(ctx: Context, a: Tensor, order: SortOrder | int) -> Tensor:
    """Per-row argsort, op ARGSORT (mirrors ``ggml_argsort``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``; NumPy ``argsort(axis=-1)``), F32 on
    the CPU, ``ne0 <= INT32_MAX``. Result: **I32** with a's ne, src ``[a]``, op_params ``[order]``
    (int; :class:`SortOrder` ASC 0, DESC 1; tie order unspecified). Raises ValueError for an unknown
    order or too-long rows.
    """
    fn = "argsort"
    _args(ctx, fn, a=a)
    o = _int(order, fn, "order")
    if o not in (SortOrder.ASC, SortOrder.DESC):
        raise ValueError(f"{fn}: order must be SortOrder.ASC (0) or SortOrder.DESC (1), got {o} "
                         f"for {_desc(a)}")
    _require(a.ne[0] <= _INT32_MAX, fn, "a.ne0 <= INT32_MAX", a)
    return _op(ctx.new_tensor(Type.I32, a.ne), Op.ARGSORT, [int(o)], [a])


# ------------------------------------------------------------------------------------------------
# layout ops
# ------------------------------------------------------------------------------------------------

def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Tile a to b's shape, op REPEAT (mirrors ``ggml_repeat``).

    a ``[m0, m1, m2, m3]``; b ``[ne0, ne1, ne2, ne3]`` (only its shape is used) with every
    ``m_i`` dividing ``ne_i``. Result: **a's type** with b's ne (NumPy ``np.tile(a, reps)`` of shape
    ``(ne3, ne2, ne1, ne0)``), src ``[a]``, no params. Raises ValueError if a does not tile b.
    """
    fn = "repeat"
    _args(ctx, fn, a=a, b=b)
    _require(a.can_repeat_to(b), fn, "a to tile b (every b.ne[i] % a.ne[i] == 0)", a, b)
    return _op(ctx.new_tensor(a.type, b.ne), Op.REPEAT, [], [a])


def repeat_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """Tile a to shape ``[ne0, ne1, ne2, ne3]``, op REPEAT (mirrors ``ggml_repeat_4d``).

    a ``[m0, m1, m2, m3]`` with every ``m_i`` dividing ``ne_i`` (or a empty). Result: a's type,
    ne ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), src ``[a]``, no params. Raises
    ValueError if a does not tile the target shape.
    """
    fn = "repeat_4d"
    _args(ctx, fn, a=a)
    ne = tuple(_int(v, fn, f"ne{i}") for i, v in enumerate((ne0, ne1, ne2, ne3)))
    ok = a.is_empty() or all(n >= 0 and n % m == 0 for n, m in zip(ne, a.ne))
    _require(ok, fn, f"a to tile the target shape {list(ne)}", a)
    return _op(ctx.new_tensor(a.type, ne), Op.REPEAT, [], [a])


def concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """Concatenate a and b along ggml dimension ``dim``, op CONCAT (mirrors ``ggml_concat``).

    a and b of the same type with equal ne except in ``dim`` (0..3; NumPy axis ``3 - dim``).
    Result: a's type, ``ne[dim] = a.ne[dim] + b.ne[dim]``, src ``[a, b]``, op_params ``[dim]``.
    Raises ValueError for a bad dim or mismatched shapes, TypeError for different types.
    """
    fn = "concat"
    _args(ctx, fn, a=a, b=b)
    d = _int(dim, fn, "dim")
    if not 0 <= d < MAX_DIMS:
        raise ValueError(f"{fn}: dim must be in [0, {MAX_DIMS}), got {d} for {_desc(a)}, "
                         f"{_desc(b)}")
    _require_type(a.type == b.type, fn, "a and b of the same type", a, b)
    ne = []
    for i in range(MAX_DIMS):
        if i == d:
            ne.append(a.ne[i] + b.ne[i])
        else:
            _require(a.ne[i] == b.ne[i], fn, f"a.ne{i} == b.ne{i} (all dims but dim {d} equal)",
                     a, b)
            ne.append(a.ne[i])
    return _op(ctx.new_tensor(a.type, ne), Op.CONCAT, [d], [a, b])


def cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Copy a into b, converting types, op CPY (mirrors ``ggml_cpy``).

    a and b any shapes with ``nelements(a) == nelements(b)``; elements are copied in logical
    (row-major, ne0 fastest) order and converted to b's type (F32->I32 truncates; quantized
    destinations quantize per block). Result: **a view of b** (b's type, ne, nb) named
    ``"<b> (copy of <a>)"``, src ``[a, b]``, no params. Raises ValueError if the counts differ.
    """
    fn = "cpy"
    _args(ctx, fn, a=a, b=b)
    _require(a.nelements == b.nelements, fn, "nelements(a) == nelements(b)", a, b)
    result = ctx.new_view(b, b.type, b.ne, b.nb, 0)
    result.set_name(f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)")
    return _op(result, Op.CPY, [], [a, b])


def cast(ctx: Context, a: Tensor, type: Type) -> Tensor:
    """a converted to ``type``, op CPY (mirrors ``ggml_cast``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``). Result: new packed tensor of
    ``type`` with a's ne, named ``"<a> (copy)"``; as in ggml its src is ``[a, result]`` (the result
    is its own destination). No params. Raises TypeError for an unknown type, ValueError if
    ``ne0`` is not a multiple of a quantized type's block size.
    """
    fn = "cast"
    _args(ctx, fn, a=a)
    try:
        t = Type(type)
    except ValueError:
        raise TypeError(f"{fn}: {type!r} is not a ggmlpy Type (casting {_desc(a)})") from None
    if a.ne[0] % t.blck_size:
        raise ValueError(f"{fn}: a.ne0 must be a multiple of {t.type_name}'s block size "
                         f"{t.blck_size}; got {_desc(a)}")
    result = ctx.new_tensor(t, a.ne)
    result.set_name(f"{a.name} (copy)")
    return _op(result, Op.CPY, [], [a, result])


def _cont_impl(ctx: Context, a: Tensor, ne: tuple[int, ...], fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    ne = tuple(_int(v, fn, f"ne{i}") for i, v in enumerate(ne))
    _require(_nelements(ne) == a.nelements and min(ne) >= 0, fn,
             f"the new shape {list(ne)} to have nelements(a) elements", a)
    if ne[0] % a.type.blck_size:
        raise ValueError(f"{fn}: ne0={ne[0]} is not a multiple of {a.type.type_name}'s block size; "
                         f"got {_desc(a)}")
    result = ctx.new_tensor(a.type, ne)
    result.set_name(f"{a.name} (cont)")
    return _op(result, Op.CONT, [], [a])


def cont(ctx: Context, a: Tensor) -> Tensor:
    """Packed copy of a (e.g. of a permuted view), op CONT (mirrors ``ggml_cont``).

    a ``[ne0, ne1, ne2, ne3]`` any layout (NumPy ``np.ascontiguousarray``). Result: new packed
    tensor of a's type and ne named ``"<a> (cont)"``, src ``[a]``, no params.
    """
    fn = "cont"
    _args(ctx, fn, a=a)
    return _cont_impl(ctx, a, a.ne, fn)


def cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """Packed copy of a reshaped to ``[ne0]`` (NumPy ``(ne0,)``), op CONT (mirrors
    ``ggml_cont_1d``).

    Requires ``ne0 == nelements(a)`` (ValueError otherwise). Result a's type, src ``[a]``, no
    params.
    """
    return _cont_impl(ctx, a, (ne0, 1, 1, 1), "cont_1d")


def cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """Packed copy of a reshaped to ``[ne0, ne1]`` (NumPy ``(ne1, ne0)``), op CONT (mirrors
    ``ggml_cont_2d``).

    Requires ``ne0*ne1 == nelements(a)`` (ValueError otherwise). Result a's type, src ``[a]``, no
    params.
    """
    return _cont_impl(ctx, a, (ne0, ne1, 1, 1), "cont_2d")


def cont_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """Packed copy of a reshaped to ``[ne0, ne1, ne2]`` (NumPy ``(ne2, ne1, ne0)``), op CONT
    (mirrors ``ggml_cont_3d``).

    Requires ``ne0*ne1*ne2 == nelements(a)`` (ValueError otherwise). Result a's type, src ``[a]``.
    """
    return _cont_impl(ctx, a, (ne0, ne1, ne2, 1), "cont_3d")


def cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """Packed copy of a reshaped to ``[ne0..ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), op CONT
    (mirrors ``ggml_cont_4d``).

    Requires ``ne0*ne1*ne2*ne3 == nelements(a)`` (ValueError otherwise). Result a's type, src
    ``[a]``.
    """
    return _cont_impl(ctx, a, (ne0, ne1, ne2, ne3), "cont_4d")


def _reshape_impl(ctx: Context, a: Tensor, ne: tuple[int, ...], fn: str) -> Tensor:
    _require(a.is_contiguous(), fn, "a to be contiguous (use cont() first)", a)
    ne = tuple(_int(v, fn, f"ne{i}") for i, v in enumerate(ne))
    _require(_nelements(ne) == a.nelements and min(ne) >= 0, fn,
             f"the new shape {list(ne)} to have nelements(a) elements", a)
    if ne[0] % a.type.blck_size:
        raise ValueError(f"{fn}: ne0={ne[0]} is not a multiple of {a.type.type_name}'s block size; "
                         f"got {_desc(a)}")
    result = ctx.new_view(a, a.type, ne, None, 0)
    result.set_name(f"{a.name} (reshaped)")
    return _op(result, Op.RESHAPE, [], [a])


def reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """View of a with b's shape, op RESHAPE (mirrors ``ggml_reshape``).

    a contiguous; b any tensor with ``nelements(b) == nelements(a)`` (only its ne is used).
    Result: a view of a (a's type, b's ne, packed nb; NumPy ``a.reshape(b.shape)``), src ``[a]``,
    no params. Raises ValueError if a is not contiguous or the counts differ.
    """
    fn = "reshape"
    _args(ctx, fn, a=a, b=b)
    _require(a.nelements == b.nelements, fn, "nelements(a) == nelements(b)", a, b)
    return _reshape_impl(ctx, a, b.ne, fn)


def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """View of contiguous a as ``[ne0]`` (NumPy ``(ne0,)``), op RESHAPE (mirrors
    ``ggml_reshape_1d``).

    Result a's type, packed nb, src ``[a]``, no params. Raises ValueError if a is not contiguous or
    ``ne0 != nelements(a)``.
    """
    _args(ctx, "reshape_1d", a=a)
    return _reshape_impl(ctx, a, (ne0,), "reshape_1d")


def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """View of contiguous a as ``[ne0, ne1]`` (NumPy ``(ne1, ne0)``), op RESHAPE (mirrors
    ``ggml_reshape_2d``).

    Result a's type, packed nb, src ``[a]``, no params. Raises ValueError if a is not contiguous or
    ``ne0*ne1 != nelements(a)``.
    """
    _args(ctx, "reshape_2d", a=a)
    return _reshape_impl(ctx, a, (ne0, ne1), "reshape_2d")


def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """View of contiguous a as ``[ne0, ne1, ne2]`` (NumPy ``(ne2, ne1, ne0)``), op RESHAPE (mirrors
    ``ggml_reshape_3d``).

    Result a's type, packed nb, src ``[a]``, no params. Raises ValueError if a is not contiguous or
    the element count differs.
    """
    _args(ctx, "reshape_3d", a=a)
    return _reshape_impl(ctx, a, (ne0, ne1, ne2), "reshape_3d")


def reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """View of contiguous a as ``[ne0..ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), op RESHAPE (mirrors
    ``ggml_reshape_4d``).

    Result a's type, packed nb, src ``[a]``, no params. Raises ValueError if a is not contiguous or
    the element count differs.
    """
    _args(ctx, "reshape_4d", a=a)
    return _reshape_impl(ctx, a, (ne0, ne1, ne2, ne3), "reshape_4d")


def _view_impl(ctx: Context, a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...] | None,
               offset: int, fn: str) -> Tensor:
    ne = tuple(_int(v, fn, f"ne{i}") for i, v in enumerate(ne))
    offset = _int(offset, fn, "offset")
    if nb is not None:
        nb = tuple(_int(v, fn, f"nb{i}") for i, v in enumerate(nb))
    if ne[0] % a.type.blck_size:
        raise ValueError(f"{fn}: ne0={ne[0]} is not a multiple of {a.type.type_name}'s block size "
                         f"{a.type.blck_size}; viewing {_desc(a)}")
    result = ctx.new_view(a, a.type, ne, nb, offset)  # raises ValueError when out of bounds
    result.set_name(f"{a.name} (view)")
    return _op(result, Op.VIEW, [offset], [a])


def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    """View ``[ne0]`` (NumPy ``(ne0,)``) of a's memory at byte ``offset`` (mirrors
    ``ggml_view_1d``).

    ``offset`` and strides are in **bytes**; ``nb0`` is a's type size; offset is relative to a
    (a view of a view points at the root with the offsets added). Result: a view of a with a's type,
    op VIEW, src ``[a]``, op_params ``[offset]`` (int), named ``"<a> (view)"``. Raises ValueError
    when ne0 is not a multiple of the block size, the offset is negative, or the **packed** size of
    the new shape plus the offset exceeds the root's nbytes (ggml's check; a strided view's real
    extent is not checked).
    """
    _args(ctx, "view_1d", a=a)
    return _view_impl(ctx, a, (ne0,), None, offset, "view_1d")


def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    """View ``[ne0, ne1]`` (NumPy ``(ne1, ne0)``) with row stride ``nb1``; nb2 = nb3 = nb1*ne1
    (mirrors ``ggml_view_2d``).

    ``offset`` and strides are in **bytes**; ``nb0`` is a's type size; offset is relative to a
    (a view of a view points at the root with the offsets added). Result: a view of a with a's type,
    op VIEW, src ``[a]``, op_params ``[offset]`` (int), named ``"<a> (view)"``. Raises ValueError
    when ne0 is not a multiple of the block size, the offset is negative, or the **packed** size of
    the new shape plus the offset exceeds the root's nbytes (ggml's check; a strided view's real
    extent is not checked).
    """
    fn = "view_2d"
    _args(ctx, fn, a=a)
    nb1, ne1 = _int(nb1, fn, "nb1"), _int(ne1, fn, "ne1")
    nb = (a.type.type_size, nb1, nb1 * ne1, nb1 * ne1)
    return _view_impl(ctx, a, (ne0, ne1), nb, offset, fn)


def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
            offset: int) -> Tensor:
    """View ``[ne0, ne1, ne2]`` (NumPy ``(ne2, ne1, ne0)``) with strides nb1, nb2; nb3 = nb2*ne2
    (mirrors ``ggml_view_3d``).

    ``offset`` and strides are in **bytes**; ``nb0`` is a's type size; offset is relative to a
    (a view of a view points at the root with the offsets added). Result: a view of a with a's type,
    op VIEW, src ``[a]``, op_params ``[offset]`` (int), named ``"<a> (view)"``. Raises ValueError
    when ne0 is not a multiple of the block size, the offset is negative, or the **packed** size of
    the new shape plus the offset exceeds the root's nbytes (ggml's check; a strided view's real
    extent is not checked).
    """
    fn = "view_3d"
    _args(ctx, fn, a=a)
    nb1, nb2, ne2 = _int(nb1, fn, "nb1"), _int(nb2, fn, "nb2"), _int(ne2, fn, "ne2")
    nb = (a.type.type_size, nb1, nb2, nb2 * ne2)
    return _view_impl(ctx, a, (ne0, ne1, ne2), nb, offset, fn)


def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int,
            nb3: int, offset: int) -> Tensor:
    """View ``[ne0..ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with strides nb1, nb2, nb3 (mirrors
    ``ggml_view_4d``).

    ``offset`` and strides are in **bytes**; ``nb0`` is a's type size; offset is relative to a
    (a view of a view points at the root with the offsets added). Result: a view of a with a's type,
    op VIEW, src ``[a]``, op_params ``[offset]`` (int), named ``"<a> (view)"``. Raises ValueError
    when ne0 is not a multiple of the block size, the offset is negative, or the **packed** size of
    the new shape plus the offset exceeds the root's nbytes (ggml's check; a strided view's real
    extent is not checked).
    """
    fn = "view_4d"
    _args(ctx, fn, a=a)
    nb = (a.type.type_size, nb1, nb2, nb3)
    return _view_impl(ctx, a, (ne0, ne1, ne2, ne3), nb, offset, fn)


def permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Permuted view of a: **source dim i moves to position axis_i**, op PERMUTE (mirrors
    ``ggml_permute``).

    Result ``ne[axis_i] = a.ne[i]``, ``nb[axis_i] = a.nb[i]`` (a view: a's type, no data moved), src
    ``[a]``, op_params ``[axis0, axis1, axis2, axis3]`` (ints), named ``"<a> (permuted)"``. This is
    the inverse of NumPy's ``transpose(perm)`` convention; on NumPy shapes (ne reversed) the same
    view is ``np.transpose(x, p)`` with ``p[3 - axis_i] = 3 - i``. E.g. ``permute(1, 0, 2, 3)``
    swaps ne0/ne1 and ``permute(1, 2, 0, 3)`` gives ``[a.ne2, a.ne0, a.ne1, a.ne3]``. Raises
    ValueError unless the axes are distinct and in ``0..3``.
    """
    fn = "permute"
    _args(ctx, fn, a=a)
    axes = [_int(x, fn, f"axis{i}") for i, x in enumerate((axis0, axis1, axis2, axis3))]
    if any(not 0 <= x < MAX_DIMS for x in axes) or len(builtins.set(axes)) != MAX_DIMS:
        raise ValueError(f"{fn}: axes must be a permutation of 0..3, got {axes} for {_desc(a)}")
    ne = [0] * MAX_DIMS
    nb = [0] * MAX_DIMS
    for i, ax in enumerate(axes):
        ne[ax] = a.ne[i]
        nb[ax] = a.nb[i]
    result = _view_tensor(ctx, a)
    result.set_name(f"{a.name} (permuted)")
    result.ne = tuple(ne)  # type: ignore[assignment]
    result.nb = tuple(nb)  # type: ignore[assignment]
    return _op(result, Op.PERMUTE, axes, [a])


def transpose(ctx: Context, a: Tensor) -> Tensor:
    """View of a with dims 0 and 1 swapped, op TRANSPOSE (mirrors ``ggml_transpose``).

    a ``[ne0, ne1, ne2, ne3]`` -> ``[ne1, ne0, ne2, ne3]`` with nb0/nb1 swapped (NumPy
    ``x.swapaxes(-1, -2)``); a's type, src ``[a]``, no params, named ``"<a> (transposed)"``.
    """
    fn = "transpose"
    _args(ctx, fn, a=a)
    result = _view_tensor(ctx, a)
    result.set_name(f"{a.name} (transposed)")
    result.ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    result.nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return _op(result, Op.TRANSPOSE, [], [a])


def get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Gather rows of a by I32 indices b, op GET_ROWS (mirrors ``ggml_get_rows``).

    a ``[n, rows, ne2, ne3]`` (NumPy ``(ne3, ne2, rows, n)``; any type incl. quantized); b **I32**
    ``[r, ne2, ne3, 1]`` (``a.ne2 == b.ne1``, ``a.ne3 == b.ne2``, ``b.ne3 == 1``). Result
    ``[n, r, b.ne1, b.ne2]`` of type **F32** (I32 when a is I32): ``out[:, i, j, k] =
    a[:, b[i, j, k], j, k]`` dequantized. src ``[a, b]``, no params. Raises ValueError for the
    shape rules, TypeError if b is not I32.
    """
    fn = "get_rows"
    _args(ctx, fn, a=a, b=b)
    _require(a.ne[2] == b.ne[1], fn, "a.ne2 == b.ne1", a, b)
    _require(a.ne[3] == b.ne[2], fn, "a.ne3 == b.ne2", a, b)
    _require(b.ne[3] == 1, fn, "b.ne3 == 1", b)
    _require_type(b.type == Type.I32, fn, "b of type I32", b)
    t = Type.I32 if a.type == Type.I32 else Type.F32
    return _op(ctx.new_tensor(t, (a.ne[0], b.ne[0], b.ne[1], b.ne[2])), Op.GET_ROWS, [], [a, b])


def pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
            lp3: int, rp3: int) -> Tensor:
    """Zero-pad a on both sides of each dim, op PAD (mirrors ``ggml_pad_ext``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32 on the CPU. Result: a's type,
    ``ne_i + lp_i + rp_i`` (NumPy ``np.pad(x, [(lp3, rp3), (lp2, rp2), (lp1, rp1), (lp0, rp0)])``),
    src ``[a]``, op_params ``[lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, 0]`` (ints; last slot is
    ggml's "circular" flag, always 0 here). Raises ValueError for negative padding.
    """
    fn = "pad_ext"
    _args(ctx, fn, a=a)
    names = ("lp0", "rp0", "lp1", "rp1", "lp2", "rp2", "lp3", "rp3")
    p = [_int(v, fn, n) for v, n in zip((lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3), names)]
    if min(p) < 0:
        raise ValueError(f"{fn}: padding must be >= 0, got {dict(zip(names, p))} for {_desc(a)}")
    ne = [a.ne[i] + p[2 * i] + p[2 * i + 1] for i in range(MAX_DIMS)]
    return _op(ctx.new_tensor(a.type, ne), Op.PAD, [*p, 0], [a])


def pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """Zero-pad a at the end of each dim: ``pad_ext(a, 0, p0, 0, p1, 0, p2, 0, p3)``, op PAD
    (mirrors ``ggml_pad``).

    a ``[ne0..ne3]`` -> ``[ne0+p0, ne1+p1, ne2+p2, ne3+p3]`` (NumPy shape reversed), a's type,
    src ``[a]``, op_params ``[0, p0, 0, p1, 0, p2, 0, p3, 0]``. Raises ValueError for negative p.
    """
    fn = "pad"
    _args(ctx, fn, a=a)
    p = [_int(v, fn, f"p{i}") for i, v in enumerate((p0, p1, p2, p3))]
    if min(p) < 0:
        raise ValueError(f"{fn}: padding must be >= 0, got {p} for {_desc(a)}")
    return pad_ext(ctx, a, 0, p[0], 0, p[1], 0, p[2], 0, p[3])


def arange(ctx: Context, start: float, stop: float, step: float) -> Tensor:
    """``[start, start+step, ...)`` below stop, op ARANGE (mirrors ``ggml_arange``).

    No sources. Result: **F32** ``[n]`` (NumPy ``(n,)``) with ``n = ceil((stop - start) / step)``
    computed in float32; values ``start + step*i``. op_params ``[start, stop, step]`` (floats),
    src ``[]``. Raises ValueError unless ``stop > start`` and ``step > 0``.
    """
    fn = "arange"
    _check_ctx(ctx, fn)
    s0, s1, st = _f32(start, fn, "start"), _f32(stop, fn, "stop"), _f32(step, fn, "step")
    if not s1 > s0 or not st > 0 or not math.isfinite(s1 - s0):
        raise ValueError(f"{fn}: requires finite stop > start and step > 0; got start={s0}, "
                         f"stop={s1}, step={st}")
    n = int(np.ceil(np.float32((np.float32(s1) - np.float32(s0)) / np.float32(st))))
    return _op(ctx.new_tensor(Type.F32, (n,)), Op.ARANGE, [s0, s1, st], [])


def timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    """Sinusoidal timestep embedding, op TIMESTEP_EMBEDDING (mirrors ``ggml_timestep_embedding``).

    timesteps **F32** vector ``[N]`` (NumPy ``(N,)``). Result: **F32** ``[dim, N]`` (NumPy
    ``(N, dim)``): with ``half = dim // 2`` and ``f_j = exp(-ln(max_period) * j / half)``,
    ``out[j] = cos(t*f_j)``, ``out[j+half] = sin(t*f_j)``, last column 0 when dim is odd.
    src ``[timesteps]``, op_params ``[dim, max_period]`` (ints). Raises TypeError if timesteps is
    not F32, ValueError if it is not a vector or ``dim < 1``.
    """
    fn = "timestep_embedding"
    _args(ctx, fn, timesteps=timesteps)
    d, mp = _int(dim, fn, "dim"), _int(max_period, fn, "max_period")
    _require_type(timesteps.type == Type.F32, fn, "timesteps of type F32", timesteps)
    _require(_is_vector(timesteps), fn, "timesteps to be a vector (ne1 == ne2 == ne3 == 1)",
             timesteps)
    if d < 1:
        raise ValueError(f"{fn}: dim must be >= 1, got {d} for {_desc(timesteps)}")
    result = ctx.new_tensor(Type.F32, (d, timesteps.ne[0]))
    return _op(result, Op.TIMESTEP_EMBEDDING, [d, mp], [timesteps])


# ------------------------------------------------------------------------------------------------
# normalisation
# ------------------------------------------------------------------------------------------------

def _norm_impl(ctx: Context, a: Tensor, eps: float, op: Op, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    e = _f32(eps, fn, "eps")
    if not e >= 0.0:
        raise ValueError(f"{fn}: requires eps >= 0, got {e} for {_desc(a)}")
    return _op(_dup_or_view(ctx, a, inplace), op, [e], [a])


def norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """Per-row standardisation ``(x - mean) / sqrt(var + eps)`` (population variance), op NORM
    (mirrors ``ggml_norm``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``, rows along axis -1), F32 on the CPU.
    Result: a's type and ne, src ``[a]``, op_params ``[eps]`` (float). Raises ValueError if
    ``eps < 0``.
    """
    return _norm_impl(ctx, a, eps, Op.NORM, False, "norm")


def norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """In-place :func:`norm`: a view of a, op NORM, params ``[eps]`` (mirrors
    ``ggml_norm_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules and errors as
    :func:`norm`.
    """
    return _norm_impl(ctx, a, eps, Op.NORM, True, "norm_inplace")


def rms_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """Per-row ``x / sqrt(mean(x**2) + eps)``, op RMS_NORM (mirrors ``ggml_rms_norm``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``, rows along axis -1), F32 on the CPU.
    Result: a's type and ne, src ``[a]``, op_params ``[eps]`` (float). Raises ValueError if
    ``eps < 0``.
    """
    return _norm_impl(ctx, a, eps, Op.RMS_NORM, False, "rms_norm")


def rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """In-place :func:`rms_norm`: a view of a, op RMS_NORM, params ``[eps]`` (mirrors
    ``ggml_rms_norm_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules and errors as
    :func:`rms_norm`.
    """
    return _norm_impl(ctx, a, eps, Op.RMS_NORM, True, "rms_norm_inplace")


def l2_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """Per-row ``x / max(||x||_2, eps)``, op L2_NORM (mirrors ``ggml_l2_norm``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``, rows along axis -1), F32 on the CPU.
    Result: a's type and ne, src ``[a]``, op_params ``[eps]`` (float). Raises ValueError if
    ``eps < 0``.
    """
    return _norm_impl(ctx, a, eps, Op.L2_NORM, False, "l2_norm")


def l2_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """In-place :func:`l2_norm`: a view of a, op L2_NORM, params ``[eps]`` (mirrors
    ``ggml_l2_norm_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules and errors as
    :func:`l2_norm`.
    """
    return _norm_impl(ctx, a, eps, Op.L2_NORM, True, "l2_norm_inplace")


def _group_norm_impl(ctx: Context, a: Tensor, n_groups: int, eps: float, inplace: bool,
                     fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    g, e = _int(n_groups, fn, "n_groups"), _f32(eps, fn, "eps")
    if g < 1 or not e >= 0.0:
        raise ValueError(f"{fn}: requires n_groups >= 1 and eps >= 0, got n_groups={g}, eps={e} "
                         f"for {_desc(a)}")
    return _op(_dup_or_view(ctx, a, inplace), Op.GROUP_NORM, [g, e], [a])


def group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """Group normalisation over channels = **dim 2**, op GROUP_NORM (mirrors ``ggml_group_norm``).

    a ``[W, H, C, N]`` (NumPy ``(N, C, H, W)``), F32 on the CPU. With ``cpg = ceil(C / n_groups)``
    each group of channels ``[g*cpg, min((g+1)*cpg, C))`` and each n is normalised over its
    ``W*H*channels`` values (mean, population variance, ``+ eps``). Result: a's type and ne, src
    ``[a]``, op_params ``[n_groups, eps]`` (int, float). Raises ValueError if ``n_groups < 1`` or
    ``eps < 0``.
    """
    return _group_norm_impl(ctx, a, n_groups, eps, False, "group_norm")


def group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """In-place :func:`group_norm`: a view of a, op GROUP_NORM (mirrors
    ``ggml_group_norm_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules, params and errors as
    :func:`group_norm`.
    """
    return _group_norm_impl(ctx, a, n_groups, eps, True, "group_norm_inplace")


# ------------------------------------------------------------------------------------------------
# matrix products
# ------------------------------------------------------------------------------------------------

def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Batched ``b @ a.T`` over rows of K values, op MUL_MAT (mirrors ``ggml_mul_mat``).

    a ``[K, M, A2, A3]`` (NumPy ``(A3, A2, M, K)``; any type incl. quantized; not transposed), b
    ``[K, N, B2, B3]`` (NumPy ``(B3, B2, N, K)``) with ``B2 % A2 == 0`` and ``B3 % A3 == 0``.
    Result: **F32** ``[M, N, B2, B3]`` (NumPy ``(B3, B2, N, M)``): ``out[i, j, k, l] = dot(a[:, i, k
    // (B2/A2), l // (B3/A3)], b[:, j, k, l])`` (block-repeat broadcast of a, not tiling). src ``[a,
    b]``, op_params ``[prec, hint]`` = ``[Prec.DEFAULT, 0]`` (see :func:`mul_mat_set_prec`). Raises
    ValueError if ``a.ne0 != b.ne0``, the batch dims do not divide, or a is transposed (``nb0 >
    nb1``).
    """
    fn = "mul_mat"
    _args(ctx, fn, a=a, b=b)
    _require(a.ne[0] == b.ne[0], fn, "a.ne0 == b.ne0 (shared K)", a, b)
    _require(_divides(a.ne[2], b.ne[2]), fn, "b.ne2 % a.ne2 == 0", a, b)
    _require(_divides(a.ne[3], b.ne[3]), fn, "b.ne3 % a.ne3 == 0", a, b)
    _require(not a.is_transposed(), fn, "a not transposed (a.nb0 <= a.nb1)", a)
    result = ctx.new_tensor(Type.F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]))
    return _op(result, Op.MUL_MAT, [int(Prec.DEFAULT), 0], [a, b])


def mul_mat_set_prec(a: Tensor, prec: Prec | int) -> Tensor:
    """Set a MUL_MAT node's accumulation-precision hint ``op_params[0]`` (mirrors
    ``ggml_mul_mat_set_prec``).

    ``prec`` is :class:`Prec` (DEFAULT 0, F32 10); a backend hint that the NumPy CPU path ignores.
    Returns ``a``. Raises ValueError if a's op is not MUL_MAT or prec is unknown, TypeError if a is
    not a Tensor.
    """
    fn = "mul_mat_set_prec"
    _check_tensor(a, fn, "a")
    p = _int(prec, fn, "prec")
    _require(a.op == Op.MUL_MAT, fn, "a to be a MUL_MAT node", a)
    if p not in (Prec.DEFAULT, Prec.F32):
        raise ValueError(f"{fn}: prec must be Prec.DEFAULT (0) or Prec.F32 (10), got {p}")
    a.op_params[0] = int(p)
    return a


def out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Batched outer-product sum over the shared dim 1, op OUT_PROD (mirrors ``ggml_out_prod``).

    a ``[M, K, A2, A3]`` (NumPy ``(A3, A2, K, M)``; not transposed), b ``[N, K, B2, B3]`` with
    ``B2 % A2 == 0``, ``B3 % A3 == 0``. Result: **F32** ``[M, N, B2, B3]`` (NumPy
    ``(B3, B2, N, M)`` = ``b.swapaxes(-1, -2) @ A`` with a block-repeated), ``out[i0, i1, i2, i3] =
    sum_k a[i0, k, i2 // r2, i3 // r3] * b[i1, k, i2, i3]``. src ``[a, b]``, no params. Raises
    ValueError if ``a.ne1 != b.ne1``, the batch dims do not divide, or a is transposed.
    """
    fn = "out_prod"
    _args(ctx, fn, a=a, b=b)
    _require(a.ne[1] == b.ne[1], fn, "a.ne1 == b.ne1 (shared K)", a, b)
    _require(_divides(a.ne[2], b.ne[2]), fn, "b.ne2 % a.ne2 == 0", a, b)
    _require(_divides(a.ne[3], b.ne[3]), fn, "b.ne3 % a.ne3 == 0", a, b)
    _require(not a.is_transposed(), fn, "a not transposed (a.nb0 <= a.nb1)", a)
    result = ctx.new_tensor(Type.F32, (a.ne[0], b.ne[0], b.ne[2], b.ne[3]))
    return _op(result, Op.OUT_PROD, [], [a, b])


# ------------------------------------------------------------------------------------------------
# masking, softmax, attention, rope
# ------------------------------------------------------------------------------------------------

def _diag_mask_impl(ctx: Context, a: Tensor, n_past: int, op: Op, inplace: bool,
                    fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    n = _int(n_past, fn, "n_past")
    return _op(_dup_or_view(ctx, a, inplace), op, [n], [a])


def diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Causal mask: element (col i0, row i1) of every 2-D slice becomes -inf where ``i0 > n_past +
    i1``, op DIAG_MASK_INF (mirrors ``ggml_diag_mask_inf``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32 on the CPU. Result: a's type
    and ne, src ``[a]``, op_params ``[n_past]`` (int). No shape rules.
    """
    return _diag_mask_impl(ctx, a, n_past, Op.DIAG_MASK_INF, False, "diag_mask_inf")


def diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """In-place :func:`diag_mask_inf`: a view of a, params ``[n_past]`` (mirrors
    ``ggml_diag_mask_inf_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules as
    :func:`diag_mask_inf`.
    """
    return _diag_mask_impl(ctx, a, n_past, Op.DIAG_MASK_INF, True, "diag_mask_inf_inplace")


def diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Like :func:`diag_mask_inf` but sets the masked elements to 0, op DIAG_MASK_ZERO (mirrors
    ``ggml_diag_mask_zero``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32. Result: a's type and ne,
    src ``[a]``, op_params ``[n_past]`` (int). No shape rules.
    """
    return _diag_mask_impl(ctx, a, n_past, Op.DIAG_MASK_ZERO, False, "diag_mask_zero")


def diag_mask_zero_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """In-place :func:`diag_mask_zero`: a view of a, params ``[n_past]`` (mirrors
    ``ggml_diag_mask_zero_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules as
    :func:`diag_mask_zero`.
    """
    return _diag_mask_impl(ctx, a, n_past, Op.DIAG_MASK_ZERO, True, "diag_mask_zero_inplace")


def _soft_max_impl(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float,
                   inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a, mask=mask)
    s, mb = _f32(scale, fn, "scale"), _f32(max_bias, fn, "max_bias")
    _require(a.is_contiguous(), fn, "a to be contiguous", a)
    if mask is not None:
        _require_type(mask.type in (Type.F16, Type.F32), fn, "mask of type F16 or F32", mask)
        _require(mask.is_contiguous(), fn, "mask to be contiguous", mask)
        _require(mask.ne[0] == a.ne[0], fn, "mask.ne0 == a.ne0", a, mask)
        _require(mask.ne[1] >= a.ne[1], fn, "mask.ne1 >= a.ne1", a, mask)
        _require(_divides(mask.ne[2], a.ne[2]), fn, "a.ne2 % mask.ne2 == 0", a, mask)
        _require(_divides(mask.ne[3], a.ne[3]), fn, "a.ne3 % mask.ne3 == 0", a, mask)
    if mb > 0.0:
        _require(mask is not None, fn, "a mask when max_bias > 0 (ALiBi)", a)
    return _op(_dup_or_view(ctx, a, inplace), Op.SOFT_MAX, [s, mb], [a, mask])


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """Row softmax, op SOFT_MAX, params ``[1.0, 0.0]`` (mirrors ``ggml_soft_max``).

    a contiguous ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32 on the CPU; softmax
    runs along rows (NumPy axis -1) of ``scale*x + slope(h)*mask_row``. Optional mask F16/F32,
    contiguous, ``mask.ne0 == a.ne0``, ``mask.ne1 >= a.ne1`` (row i of a uses mask row i), tiled
    over dims 2/3 (``a.ne2 % mask.ne2 == 0``, ``a.ne3 % mask.ne3 == 0``). ``max_bias > 0`` (ALiBi
    slopes per dim-2 head) requires a mask. Result: a's type and ne (a view of a for ``_inplace``),
    src ``[a, mask]`` (mask slot None when absent), op_params ``[scale, max_bias]`` (floats). Raises
    ValueError for the shape/layout rules, TypeError for a mask of another type.
    """
    return _soft_max_impl(ctx, a, None, 1.0, 0.0, False, "soft_max")


def soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place row softmax, op SOFT_MAX, params ``[1.0, 0.0]`` (mirrors ``ggml_soft_max_inplace``).

    a contiguous ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32 on the CPU; softmax
    runs along rows (NumPy axis -1) of ``scale*x + slope(h)*mask_row``. Optional mask F16/F32,
    contiguous, ``mask.ne0 == a.ne0``, ``mask.ne1 >= a.ne1`` (row i of a uses mask row i), tiled
    over dims 2/3 (``a.ne2 % mask.ne2 == 0``, ``a.ne3 % mask.ne3 == 0``). ``max_bias > 0`` (ALiBi
    slopes per dim-2 head) requires a mask. Result: a's type and ne (a view of a for ``_inplace``),
    src ``[a, mask]`` (mask slot None when absent), op_params ``[scale, max_bias]`` (floats). Raises
    ValueError for the shape/layout rules, TypeError for a mask of another type.
    """
    return _soft_max_impl(ctx, a, None, 1.0, 0.0, True, "soft_max_inplace")


def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                 max_bias: float) -> Tensor:
    """Row softmax of ``scale*a + slope*mask``, op SOFT_MAX (mirrors ``ggml_soft_max_ext``).

    a contiguous ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32 on the CPU; softmax
    runs along rows (NumPy axis -1) of ``scale*x + slope(h)*mask_row``. Optional mask F16/F32,
    contiguous, ``mask.ne0 == a.ne0``, ``mask.ne1 >= a.ne1`` (row i of a uses mask row i), tiled
    over dims 2/3 (``a.ne2 % mask.ne2 == 0``, ``a.ne3 % mask.ne3 == 0``). ``max_bias > 0`` (ALiBi
    slopes per dim-2 head) requires a mask. Result: a's type and ne (a view of a for ``_inplace``),
    src ``[a, mask]`` (mask slot None when absent), op_params ``[scale, max_bias]`` (floats). Raises
    ValueError for the shape/layout rules, TypeError for a mask of another type.
    """
    return _soft_max_impl(ctx, a, mask, scale, max_bias, False, "soft_max_ext")


def soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                         max_bias: float) -> Tensor:
    """In-place :func:`soft_max_ext` (mirrors ``ggml_soft_max_ext_inplace``).

    a contiguous ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32 on the CPU; softmax
    runs along rows (NumPy axis -1) of ``scale*x + slope(h)*mask_row``. Optional mask F16/F32,
    contiguous, ``mask.ne0 == a.ne0``, ``mask.ne1 >= a.ne1`` (row i of a uses mask row i), tiled
    over dims 2/3 (``a.ne2 % mask.ne2 == 0``, ``a.ne3 % mask.ne3 == 0``). ``max_bias > 0`` (ALiBi
    slopes per dim-2 head) requires a mask. Result: a's type and ne (a view of a for ``_inplace``),
    src ``[a, mask]`` (mask slot None when absent), op_params ``[scale, max_bias]`` (floats). Raises
    ValueError for the shape/layout rules, TypeError for a mask of another type.
    """
    return _soft_max_impl(ctx, a, mask, scale, max_bias, True, "soft_max_ext_inplace")


def _rope_impl(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int,
               mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float,
               ext_factor: float, attn_factor: float, beta_fast: float, beta_slow: float,
               inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a, pos=pos, freq_factors=freq_factors)
    nd, md = _int(n_dims, fn, "n_dims"), _int(mode, fn, "mode")
    nco = _int(n_ctx_orig, fn, "n_ctx_orig")
    floats = [_f32(v, fn, n) for v, n in ((freq_base, "freq_base"), (freq_scale, "freq_scale"),
                                          (ext_factor, "ext_factor"), (attn_factor, "attn_factor"),
                                          (beta_fast, "beta_fast"), (beta_slow, "beta_slow"))]
    if md & 1:
        raise ValueError(f"{fn}: mode & 1 is no longer supported by ggml (got mode={md}) for "
                         f"{_desc(a)}")
    if md not in (ROPE_TYPE_NORMAL, ROPE_TYPE_NEOX):
        raise ValueError(f"{fn}: ggmlpy supports mode ROPE_TYPE_NORMAL (0) and ROPE_TYPE_NEOX (2) "
                         f"only, got mode={md} for {_desc(a)}")
    if nd < 0 or nd % 2 or nd > a.ne[0]:
        raise ValueError(f"{fn}: requires n_dims even and 0 <= n_dims <= a.ne0, got n_dims={nd} "
                         f"for {_desc(a)}")
    _require_type(pos.type == Type.I32, fn, "pos of type I32", pos)
    _require(_is_vector(pos), fn, "pos to be a vector", pos)
    _require(pos.ne[0] == a.ne[2], fn, "pos.ne0 == a.ne2 (one position per token)", a, pos)
    if freq_factors is not None:
        _require_type(freq_factors.type == Type.F32, fn, "freq_factors of type F32", freq_factors)
        _require(freq_factors.ne[0] >= nd // 2, fn, f"freq_factors.ne0 >= n_dims/2 = {nd // 2}",
                 freq_factors)
    params = [0, nd, md, 0, nco, *floats, 0, 0, 0, 0, 0]
    return _op(_dup_or_view(ctx, a, inplace), Op.ROPE, params, [a, pos, freq_factors])


def rope(ctx: Context, a: Tensor, pos: Tensor, n_dims: int, mode: int) -> Tensor:
    """Rotary position embedding with ggml's default settings, op ROPE (mirrors ``ggml_rope``).

    Defaults: n_ctx_orig 0, freq_base 10000, freq_scale 1, ext_factor 0, attn_factor 1,
    beta_fast 0, beta_slow 0 (no YaRN), no freq_factors.

    a ``[head_dim, n_head, n_tok, B]`` (NumPy ``(B, n_tok, n_head, head_dim)``), F32/F16; pos
    **I32** vector ``[n_tok]`` (``pos.ne0 == a.ne2``); optional freq_factors **F32** with ``ne0 >=
    n_dims/2``. ``n_dims`` (even, ``<= a.ne0``) leading elements of each row rotate: mode
    ``ROPE_TYPE_NORMAL`` (0) pairs ``(2m, 2m+1)``, ``ROPE_TYPE_NEOX`` (2) pairs ``(m, m+n_dims/2)``.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, pos, freq_factors]`` (None
    when absent), op_params (16 slots) ``[0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale,
    ext_factor, attn_factor, beta_fast, beta_slow, 0, 0, 0, 0, 0]`` (slots 5-10 floats, 11-14 M-RoPE
    sections, 15 n_offs). Raises ValueError for ``mode & 1``, modes other than NORMAL/NEOX
    (M-RoPE/vision are not implemented), a bad n_dims or shapes; TypeError for pos not I32 or
    freq_factors not F32.
    """
    return _rope_impl(ctx, a, pos, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0,
                      False, "rope")


def rope_inplace(ctx: Context, a: Tensor, pos: Tensor, n_dims: int, mode: int) -> Tensor:
    """In-place :func:`rope` (mirrors ``ggml_rope_inplace``).

    a ``[head_dim, n_head, n_tok, B]`` (NumPy ``(B, n_tok, n_head, head_dim)``), F32/F16; pos
    **I32** vector ``[n_tok]`` (``pos.ne0 == a.ne2``); optional freq_factors **F32** with ``ne0 >=
    n_dims/2``. ``n_dims`` (even, ``<= a.ne0``) leading elements of each row rotate: mode
    ``ROPE_TYPE_NORMAL`` (0) pairs ``(2m, 2m+1)``, ``ROPE_TYPE_NEOX`` (2) pairs ``(m, m+n_dims/2)``.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, pos, freq_factors]`` (None
    when absent), op_params (16 slots) ``[0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale,
    ext_factor, attn_factor, beta_fast, beta_slow, 0, 0, 0, 0, 0]`` (slots 5-10 floats, 11-14 M-RoPE
    sections, 15 n_offs). Raises ValueError for ``mode & 1``, modes other than NORMAL/NEOX
    (M-RoPE/vision are not implemented), a bad n_dims or shapes; TypeError for pos not I32 or
    freq_factors not F32.
    """
    return _rope_impl(ctx, a, pos, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0,
                      True, "rope_inplace")


def rope_ext(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int,
             mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
             attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """Rotary position embedding with YaRN parameters, op ROPE (mirrors ``ggml_rope_ext``).

    a ``[head_dim, n_head, n_tok, B]`` (NumPy ``(B, n_tok, n_head, head_dim)``), F32/F16; pos
    **I32** vector ``[n_tok]`` (``pos.ne0 == a.ne2``); optional freq_factors **F32** with ``ne0 >=
    n_dims/2``. ``n_dims`` (even, ``<= a.ne0``) leading elements of each row rotate: mode
    ``ROPE_TYPE_NORMAL`` (0) pairs ``(2m, 2m+1)``, ``ROPE_TYPE_NEOX`` (2) pairs ``(m, m+n_dims/2)``.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, pos, freq_factors]`` (None
    when absent), op_params (16 slots) ``[0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale,
    ext_factor, attn_factor, beta_fast, beta_slow, 0, 0, 0, 0, 0]`` (slots 5-10 floats, 11-14 M-RoPE
    sections, 15 n_offs). Raises ValueError for ``mode & 1``, modes other than NORMAL/NEOX
    (M-RoPE/vision are not implemented), a bad n_dims or shapes; TypeError for pos not I32 or
    freq_factors not F32.
    """
    return _rope_impl(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                      ext_factor, attn_factor, beta_fast, beta_slow, False, "rope_ext")


def rope_ext_inplace(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None,
                     n_dims: int, mode: int, n_ctx_orig: int, freq_base: float,
                     freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
                     beta_slow: float) -> Tensor:
    """In-place :func:`rope_ext` (mirrors ``ggml_rope_ext_inplace``).

    a ``[head_dim, n_head, n_tok, B]`` (NumPy ``(B, n_tok, n_head, head_dim)``), F32/F16; pos
    **I32** vector ``[n_tok]`` (``pos.ne0 == a.ne2``); optional freq_factors **F32** with ``ne0 >=
    n_dims/2``. ``n_dims`` (even, ``<= a.ne0``) leading elements of each row rotate: mode
    ``ROPE_TYPE_NORMAL`` (0) pairs ``(2m, 2m+1)``, ``ROPE_TYPE_NEOX`` (2) pairs ``(m, m+n_dims/2)``.
    Result: a's type and ne (a view of a for ``_inplace``), src ``[a, pos, freq_factors]`` (None
    when absent), op_params (16 slots) ``[0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale,
    ext_factor, attn_factor, beta_fast, beta_slow, 0, 0, 0, 0, 0]`` (slots 5-10 floats, 11-14 M-RoPE
    sections, 15 n_offs). Raises ValueError for ``mode & 1``, modes other than NORMAL/NEOX
    (M-RoPE/vision are not implemented), a bad n_dims or shapes; TypeError for pos not I32 or
    freq_factors not F32.
    """
    return _rope_impl(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                      ext_factor, attn_factor, beta_fast, beta_slow, True, "rope_ext_inplace")


def flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                   scale: float, max_bias: float, logit_softcap: float) -> Tensor:
    """Fused attention ``softmax(scale * q k^T [softcap] + slope*mask) v``, op FLASH_ATTN_EXT
    (mirrors ``ggml_flash_attn_ext``).

    q ``[Dk, n_q, H, B]`` (NumPy ``(B, H, n_q, Dk)``, F32), k ``[Dk, n_kv, H_kv, B]``, v ``[Dv,
    n_kv, H_kv, B]`` (not transposed; K/V heads are block-repeated: q head h uses kv head ``h // (H
    / H_kv)``), optional mask F16 (F32 accepted) contiguous ``[n_kv, >= n_q, H_m, B_m]`` tiled over
    heads/batch. Result: **F32, permuted** ``[Dv, H, n_q, B]`` (NumPy ``(B, n_q, H, Dv)``), src
    ``[q, k, v, mask]`` (mask None when absent), op_params ``[scale, max_bias, logit_softcap,
    prec]`` (3 floats, int prec = ``Prec.DEFAULT``; see :func:`flash_attn_ext_set_prec`). Raises
    ValueError unless ``k.ne0 == q.ne0``, ``v.ne1 == k.ne1``, ``q.ne2 % k.ne2 == 0``, ``q.ne2 %
    v.ne2 == 0``, ``q.ne3 == k.ne3 == v.ne3``; for the mask ``mask.ne0 == k.ne1``, ``mask.ne1 >=
    q.ne1``, ``q.ne2 % mask.ne2 == 0``, ``q.ne3 % mask.ne3 == 0``; and a mask when ``max_bias > 0``.
    TypeError for a mask that is not F16/F32.
    """
    fn = "flash_attn_ext"
    _args(ctx, fn, q=q, k=k, v=v, mask=mask)
    params = [_f32(scale, fn, "scale"), _f32(max_bias, fn, "max_bias"),
              _f32(logit_softcap, fn, "logit_softcap"), int(Prec.DEFAULT)]
    _require(k.ne[0] == q.ne[0], fn, "k.ne0 == q.ne0 (head size Dk)", q, k)
    _require(_divides(k.ne[2], q.ne[2]), fn, "q.ne2 % k.ne2 == 0 (GQA heads)", q, k)
    _require(q.ne[3] == k.ne[3], fn, "q.ne3 == k.ne3", q, k)
    _require(q.ne[3] == v.ne[3], fn, "q.ne3 == v.ne3", q, v)
    _require(v.ne[1] == k.ne[1], fn, "v.ne1 == k.ne1 (n_kv)", k, v)
    _require(_divides(v.ne[2], q.ne[2]), fn, "q.ne2 % v.ne2 == 0 (GQA heads)", q, v)
    if mask is not None:
        _require_type(mask.type in (Type.F16, Type.F32), fn, "mask of type F16 or F32", mask)
        _require(mask.is_contiguous(), fn, "mask to be contiguous", mask)
        _require(mask.ne[0] == k.ne[1], fn, "mask.ne0 == k.ne1 (n_kv)", k, mask)
        _require(mask.ne[1] >= q.ne[1], fn, "mask.ne1 >= q.ne1 (n_q)", q, mask)
        _require(_divides(mask.ne[2], q.ne[2]), fn, "q.ne2 % mask.ne2 == 0", q, mask)
        _require(_divides(mask.ne[3], q.ne[3]), fn, "q.ne3 % mask.ne3 == 0", q, mask)
    if params[1] > 0.0:
        _require(mask is not None, fn, "a mask when max_bias > 0 (ALiBi)", q)
    result = ctx.new_tensor(Type.F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]))
    return _op(result, Op.FLASH_ATTN_EXT, params, [q, k, v, mask])


def flash_attn_ext_set_prec(a: Tensor, prec: Prec | int) -> Tensor:
    """Set a FLASH_ATTN_EXT node's precision hint ``op_params[3]`` (mirrors
    ``ggml_flash_attn_ext_set_prec``).

    ``prec`` is :class:`Prec` (DEFAULT 0, F32 10). Returns ``a``. Raises ValueError if a's op is not
    FLASH_ATTN_EXT or prec is unknown, TypeError if a is not a Tensor.
    """
    fn = "flash_attn_ext_set_prec"
    _check_tensor(a, fn, "a")
    p = _int(prec, fn, "prec")
    _require(a.op == Op.FLASH_ATTN_EXT, fn, "a to be a FLASH_ATTN_EXT node", a)
    if p not in (Prec.DEFAULT, Prec.F32):
        raise ValueError(f"{fn}: prec must be Prec.DEFAULT (0) or Prec.F32 (10), got {p}")
    a.op_params[3] = int(p)
    return a


# ------------------------------------------------------------------------------------------------
# unary ops
# ------------------------------------------------------------------------------------------------

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
    themselves may be strided), F32/F16 on the CPU. Result: new packed tensor of a's type and ne,
    src ``[a]``, op_params ``[int(op)]`` (:class:`~ggmlpy.opcodes.UnaryOp`). Raises ValueError if
    a's rows are not contiguous or op is unknown.
    """
    return _unary_impl(ctx, a, op, False, "unary")


def unary_inplace(ctx: Context, a: Tensor, op: UnaryOp) -> Tensor:
    """In-place :func:`unary`: a view of a, op UNARY, params ``[int(op)]`` (mirrors
    ``ggml_unary_inplace``).

    Result a's type, ne and nb (NumPy shape ``(ne3, ne2, ne1, ne0)``); rules and errors as
    :func:`unary`.
    """
    return _unary_impl(ctx, a, op, True, "unary_inplace")


def abs(ctx: Context, a: Tensor) -> Tensor:
    """``|x|`` element-wise: :func:`unary` with ``UnaryOp.ABS`` (mirrors ``ggml_abs``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.ABS]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.ABS, False, "abs")


def abs_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`abs`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.ABS]`` (mirrors ``ggml_abs_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.ABS, True, "abs_inplace")


def sgn(ctx: Context, a: Tensor) -> Tensor:
    """sign: ``1``, ``-1`` or ``0`` element-wise: :func:`unary` with ``UnaryOp.SGN`` (mirrors
    ``ggml_sgn``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.SGN]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.SGN, False, "sgn")


def sgn_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`sgn`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.SGN]`` (mirrors ``ggml_sgn_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.SGN, True, "sgn_inplace")


def neg(ctx: Context, a: Tensor) -> Tensor:
    """``-x`` element-wise: :func:`unary` with ``UnaryOp.NEG`` (mirrors ``ggml_neg``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.NEG]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.NEG, False, "neg")


def neg_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`neg`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.NEG]`` (mirrors ``ggml_neg_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.NEG, True, "neg_inplace")


def step(ctx: Context, a: Tensor) -> Tensor:
    """``1 if x > 0 else 0`` element-wise: :func:`unary` with ``UnaryOp.STEP`` (mirrors
    ``ggml_step``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.STEP]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.STEP, False, "step")


def step_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`step`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.STEP]`` (mirrors ``ggml_step_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.STEP, True, "step_inplace")


def tanh(ctx: Context, a: Tensor) -> Tensor:
    """``tanh(x)`` element-wise: :func:`unary` with ``UnaryOp.TANH`` (mirrors ``ggml_tanh``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.TANH]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.TANH, False, "tanh")


def tanh_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`tanh`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.TANH]`` (mirrors ``ggml_tanh_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.TANH, True, "tanh_inplace")


def elu(ctx: Context, a: Tensor) -> Tensor:
    """``x if x > 0 else expm1(x)`` element-wise: :func:`unary` with ``UnaryOp.ELU`` (mirrors
    ``ggml_elu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.ELU]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.ELU, False, "elu")


def elu_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`elu`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.ELU]`` (mirrors ``ggml_elu_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.ELU, True, "elu_inplace")


def relu(ctx: Context, a: Tensor) -> Tensor:
    """``max(x, 0)`` element-wise: :func:`unary` with ``UnaryOp.RELU`` (mirrors ``ggml_relu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.RELU]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.RELU, False, "relu")


def relu_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`relu`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.RELU]`` (mirrors ``ggml_relu_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.RELU, True, "relu_inplace")


def sigmoid(ctx: Context, a: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))`` element-wise: :func:`unary` with ``UnaryOp.SIGMOID`` (mirrors
    ``ggml_sigmoid``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.SIGMOID]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.SIGMOID, False, "sigmoid")


def sigmoid_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`sigmoid`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.SIGMOID]`` (mirrors ``ggml_sigmoid_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.SIGMOID, True, "sigmoid_inplace")


def gelu(ctx: Context, a: Tensor) -> Tensor:
    """Tanh-approximated GELU ``0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))`` element-wise (ggml's
    CPU uses an f16 table): :func:`unary` with ``UnaryOp.GELU`` (mirrors ``ggml_gelu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.GELU]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU, False, "gelu")


def gelu_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`gelu`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.GELU]`` (mirrors ``ggml_gelu_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU, True, "gelu_inplace")


def gelu_quick(ctx: Context, a: Tensor) -> Tensor:
    """``x / (1 + exp(-1.702x))`` (ggml's CPU uses an f16 table) element-wise: :func:`unary` with
    ``UnaryOp.GELU_QUICK`` (mirrors ``ggml_gelu_quick``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.GELU_QUICK]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU_QUICK, False, "gelu_quick")


def gelu_quick_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`gelu_quick`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.GELU_QUICK]`` (mirrors ``ggml_gelu_quick_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU_QUICK, True, "gelu_quick_inplace")


def gelu_erf(ctx: Context, a: Tensor) -> Tensor:
    """Exact GELU ``0.5x(1 + erf(x/sqrt(2)))`` element-wise: :func:`unary` with ``UnaryOp.GELU_ERF``
    (mirrors ``ggml_gelu_erf``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.GELU_ERF]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU_ERF, False, "gelu_erf")


def gelu_erf_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`gelu_erf`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.GELU_ERF]`` (mirrors ``ggml_gelu_erf_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.GELU_ERF, True, "gelu_erf_inplace")


def silu(ctx: Context, a: Tensor) -> Tensor:
    """``x / (1 + exp(-x))`` element-wise: :func:`unary` with ``UnaryOp.SILU`` (mirrors
    ``ggml_silu``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.SILU]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.SILU, False, "silu")


def silu_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`silu`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.SILU]`` (mirrors ``ggml_silu_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.SILU, True, "silu_inplace")


def hardswish(ctx: Context, a: Tensor) -> Tensor:
    """``x * min(1, max(0, (x + 3)/6))`` element-wise: :func:`unary` with ``UnaryOp.HARDSWISH``
    (mirrors ``ggml_hardswish``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.HARDSWISH]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.HARDSWISH, False, "hardswish")


def hardsigmoid(ctx: Context, a: Tensor) -> Tensor:
    """``min(1, max(0, (x + 3)/6))`` element-wise: :func:`unary` with ``UnaryOp.HARDSIGMOID``
    (mirrors ``ggml_hardsigmoid``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.HARDSIGMOID]``. Raises
    ValueError if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.HARDSIGMOID, False, "hardsigmoid")


def exp(ctx: Context, a: Tensor) -> Tensor:
    """``exp(x)`` element-wise: :func:`unary` with ``UnaryOp.EXP`` (mirrors ``ggml_exp``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with contiguous rows, F32/F16.
    Result: a's type and ne, op UNARY, src ``[a]``, op_params ``[UnaryOp.EXP]``. Raises ValueError
    if a's rows are not contiguous.
    """
    return _unary_impl(ctx, a, UnaryOp.EXP, False, "exp")


def exp_inplace(ctx: Context, a: Tensor) -> Tensor:
    """In-place :func:`exp`: a view of a (same type/ne/nb), op UNARY, src ``[a]``, params
    ``[UnaryOp.EXP]`` (mirrors ``ggml_exp_inplace``).

    a needs contiguous rows (ValueError otherwise); NumPy shape ``(ne3, ne2, ne1, ne0)`` unchanged.
    """
    return _unary_impl(ctx, a, UnaryOp.EXP, True, "exp_inplace")


# ------------------------------------------------------------------------------------------------
# gated linear units
# ------------------------------------------------------------------------------------------------

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

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), contiguous_1, F32/F16. With x the
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
    both contiguous_1, F32/F16. Result: a's type and ne, src ``[a, b]``, op_params
    ``[int(op), 0]``. Raises ValueError for different shapes, non-contiguous_1 inputs or an unknown
    op; TypeError for different types.
    """
    return _glu_impl(ctx, a, b, op, False, "glu_split")


def reglu(ctx: Context, a: Tensor) -> Tensor:
    """``relu(x) * g`` with x, g the first/second half of each row: :func:`glu` with ``GluOp.REGLU``
    (mirrors ``ggml_reglu``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.REGLU, 0]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.REGLU, False, "reglu")


def reglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``relu(x) * g`` with x the **second** and g the first half of each row: :func:`glu` with
    ``GluOp.REGLU``, swapped (mirrors ``ggml_reglu_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
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

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU, 0]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU, False, "geglu")


def geglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``gelu(x) * g`` with x the **second** and g the first half of each row: :func:`glu` with
    ``GluOp.GEGLU``, swapped (mirrors ``ggml_geglu_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
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

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.SWIGLU, 0]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.SWIGLU, False, "swiglu")


def swiglu_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``silu(x) * g`` with x the **second** and g the first half of each row: :func:`glu` with
    ``GluOp.SWIGLU``, swapped (mirrors ``ggml_swiglu_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
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

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU_ERF, 0]``.
    Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU_ERF, False, "geglu_erf")


def geglu_erf_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``gelu_erf(x) * g`` with x the **second** and g the first half of each row: :func:`glu` with
    ``GluOp.GEGLU_ERF``, swapped (mirrors ``ggml_geglu_erf_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
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

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
    (NumPy ``(ne3, ne2, ne1, ne0 // 2)``); op GLU, src ``[a]``, op_params ``[GluOp.GEGLU_QUICK,
    0]``. Raises ValueError if a is not contiguous_1.
    """
    return _glu_impl(ctx, a, None, GluOp.GEGLU_QUICK, False, "geglu_quick")


def geglu_quick_swapped(ctx: Context, a: Tensor) -> Tensor:
    """``gelu_quick(x) * g`` with x the **second** and g the first half of each row: :func:`glu`
    with ``GluOp.GEGLU_QUICK``, swapped (mirrors ``ggml_geglu_quick_swapped``).

    a ``[ne0, ne1, ne2, ne3]`` contiguous_1, F32/F16 -> a's type ``[ne0 // 2, ne1, ne2, ne3]``
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

