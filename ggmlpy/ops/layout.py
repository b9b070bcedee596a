"""Layout, copy, indexing and reduction ops (test-backend-ops family ``cases_layout``): acc/set,
sum/sum_rows/mean/argmax/argsort, repeat, concat, cpy/cast/cont, reshape/view/permute/transpose,
get_rows, pad, arange, timestep_embedding.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from ggmlpy.core.check import checked_args
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import MAX_DIMS, Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.ops._base import (
    _INT32_MAX,
    SortOrder,
    _args,
    _check_ctx,
    _desc,
    _divides,
    _dup_or_view,
    _f32,
    _int,
    _is_matrix,
    _is_vector,
    _nelements,
    _op,
    _require,
    _require_type,
    _view_tensor,
)
from ggmlpy.ops._variants import inplace_variant, shared_doc

__all__ = [
    "acc", "acc_inplace", "set", "set_inplace", "set_1d", "set_1d_inplace", "set_2d",
    "set_2d_inplace", "sum", "sum_rows", "mean", "argmax", "argsort", "repeat",
    "repeat_4d", "concat", "cpy", "cast", "cont", "cont_1d", "cont_2d", "cont_3d",
    "cont_4d", "reshape", "reshape_1d", "reshape_2d", "reshape_3d", "reshape_4d",
    "view_1d", "view_2d", "view_3d", "view_4d", "permute", "transpose", "get_rows", "set_rows",
    "pad", "pad_ext", "arange", "timestep_embedding",
]


#: what differs in acc/set's in-place twins besides the view result
_SET_NOTE = "op_params' last slot (``inplace``) is 1."


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


#: shape, param and error rules shared by the docstrings below
_SET_ACC_RULES = """
a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) contiguous; b any shape with
``nelements(b) <= nelements(a)``. The destination region is the view of the result with b's ne,
element stride ``a.type.type_size`` and byte strides ``nb1, nb2, nb3`` at byte ``offset``; it
must lie inside a. Result: a's type and ne, src ``[a, b]``,
op_params ``[nb1, nb2, nb3, offset, inplace]`` (ints; bytes). Raises ValueError for the shape,
bounds and ``0 <= offset < 2**30`` rules, TypeError for the type rule.
"""


@shared_doc(_SET_ACC_RULES)
@checked_args
def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """Copy of a with b **added** into a strided region, op ACC; a and b F32 (mirrors ``ggml_acc``).
    """
    return _set_acc_impl(ctx, a, b, nb1, nb2, nb3, offset, False, Op.ACC, "acc")


acc_inplace = inplace_variant(acc, _set_acc_impl, op=Op.ACC, note=_SET_NOTE)


@shared_doc(_SET_ACC_RULES)
@checked_args
def set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """Copy of a with b **assigned** into a strided region, op SET; a and b of the same type
    (mirrors ``ggml_set``).
    """
    return _set_acc_impl(ctx, a, b, nb1, nb2, nb3, offset, False, Op.SET, "set")


set_inplace = inplace_variant(set, _set_acc_impl, op=Op.SET, note=_SET_NOTE)


def _set_1d_impl(ctx: Context, a: Tensor, b: Tensor, offset: int, inplace: bool,
                 fn: str) -> Tensor:
    _args(ctx, fn, a=a, b=b)
    return _set_acc_impl(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, inplace, Op.SET, fn)


@shared_doc(_SET_ACC_RULES)
@checked_args
def set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """:func:`set` with a's own strides: ``set(a, b, a.nb1, a.nb2, a.nb3, offset)`` (mirrors
    ``ggml_set_1d``).
    """
    return _set_1d_impl(ctx, a, b, offset, False, "set_1d")


set_1d_inplace = inplace_variant(set_1d, _set_1d_impl, note=_SET_NOTE)


def _set_2d_impl(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int, inplace: bool,
                 fn: str) -> Tensor:
    _args(ctx, fn, a=a, b=b)
    return _set_acc_impl(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, inplace, Op.SET, fn)


@shared_doc(_SET_ACC_RULES)
@checked_args
def set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """:func:`set` with row stride ``nb1`` and a's nb2/nb3: ``set(a, b, nb1, a.nb2, a.nb3, offset)``
    (mirrors ``ggml_set_2d``).
    """
    return _set_2d_impl(ctx, a, b, nb1, offset, False, "set_2d")


set_2d_inplace = inplace_variant(set_2d, _set_2d_impl, note=_SET_NOTE)


@checked_args
def sum(ctx: Context, a: Tensor) -> Tensor:
    """Sum of all elements, op SUM (mirrors ``ggml_sum``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``). Result:
    ``[1]`` (NumPy ``(1, 1, 1, 1)``) of **a's type**, src ``[a]``, no params. No shape rules.
    """
    _args(ctx, "sum", a=a)
    return _op(ctx.new_tensor(a.type, (1,)), Op.SUM, [], [a])


@checked_args
def sum_rows(ctx: Context, a: Tensor) -> Tensor:
    """Sum of each row (along ne0), op SUM_ROWS (mirrors ``ggml_sum_rows``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``; NumPy ``sum(axis=-1,
    keepdims=True)``). Result: ``[1, ne1, ne2, ne3]`` of a's type, src ``[a]``, no params. No shape
    rules.
    """
    _args(ctx, "sum_rows", a=a)
    return _op(ctx.new_tensor(a.type, (1, *a.ne[1:])), Op.SUM_ROWS, [], [a])


@checked_args
def mean(ctx: Context, a: Tensor) -> Tensor:
    """Mean of each row (along ne0), op MEAN (mirrors ``ggml_mean``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``; NumPy ``mean(axis=-1,
    keepdims=True)``). Result: **F32** ``[1, ne1, ne2, ne3]``, src ``[a]``, no params. No shape
    rules.
    """
    _args(ctx, "mean", a=a)
    return _op(ctx.new_tensor(Type.F32, (1, *a.ne[1:])), Op.MEAN, [], [a])


@checked_args
def argmax(ctx: Context, a: Tensor) -> Tensor:
    """Index of the maximum of each row, op ARGMAX (mirrors ``ggml_argmax``).

    a a matrix ``[ne0, ne1, 1, 1]`` (NumPy ``(1, 1, ne1, ne0)``) with ``ne0 <= INT32_MAX``. Result:
    **I32** ``[ne1]``, src ``[a]``, no params. Every backend follows ggml's CPU loop
    (``ggml_vec_argmax_f32``): the *last* index among equal maxima; a NaN restarts the search
    (the maximum is taken over the values after the last NaN that precedes the row's last
    non-NaN value), an all-NaN row gives 0: ``[nan, 5, nan, 1]`` -> 3
    (:func:`ggmlpy.backends.kernels.reduce.argmax_ggml`). Raises ValueError if a is not a matrix
    or its rows are too long.
    """
    fn = "argmax"
    _args(ctx, fn, a=a)
    _require(_is_matrix(a), fn, "a to be a matrix (ne2 == ne3 == 1)", a)
    _require(a.ne[0] <= _INT32_MAX, fn, "a.ne0 <= INT32_MAX", a)
    return _op(ctx.new_tensor(Type.I32, (a.ne[1],)), Op.ARGMAX, [], [a])


@checked_args
def argsort(ctx: Context, a: Tensor, order: SortOrder | int) -> Tensor:
    """Per-row argsort, op ARGSORT (mirrors ``ggml_argsort``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``; NumPy ``argsort(axis=-1)``),
    ``ne0 <= INT32_MAX``. Result: **I32** with a's ne, src ``[a]``, op_params ``[order]``
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


@checked_args
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


@checked_args
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


@checked_args
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


@checked_args
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


@checked_args
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


def _new_shape(a: Tensor, ne: tuple[object, ...], fn: str) -> tuple[int, ...]:
    """``ne`` as ints, checked to hold nelements(a) elements with ne0 a multiple of a's block."""
    shape = tuple(_int(v, fn, f"ne{i}") for i, v in enumerate(ne))
    _require(_nelements(shape) == a.nelements and min(shape) >= 0, fn,
             f"the new shape {list(shape)} to have nelements(a) elements", a)
    if shape[0] % a.type.blck_size:
        raise ValueError(f"{fn}: ne0={shape[0]} is not a multiple of {a.type.type_name}'s block "
                         f"size; got {_desc(a)}")
    return shape


def _cont_impl(ctx: Context, a: Tensor, ne: tuple[int, ...], fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    ne = _new_shape(a, ne, fn)
    result = ctx.new_tensor(a.type, ne)
    result.set_name(f"{a.name} (cont)")
    return _op(result, Op.CONT, [], [a])


@checked_args
def cont(ctx: Context, a: Tensor) -> Tensor:
    """Packed copy of a (e.g. of a permuted view), op CONT (mirrors ``ggml_cont``).

    a ``[ne0, ne1, ne2, ne3]`` any layout (NumPy ``np.ascontiguousarray``). Result: new packed
    tensor of a's type and ne named ``"<a> (cont)"``, src ``[a]``, no params.
    """
    _args(ctx, "cont", a=a)  # before reading a.ne
    return _cont_impl(ctx, a, a.ne, "cont")


@checked_args
def cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """Packed copy of a reshaped to ``[ne0]`` (NumPy ``(ne0,)``), op CONT (mirrors
    ``ggml_cont_1d``).

    Requires ``ne0 == nelements(a)`` (ValueError otherwise). Result a's type, src ``[a]``, no
    params.
    """
    return _cont_impl(ctx, a, (ne0, 1, 1, 1), "cont_1d")


@checked_args
def cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """Packed copy of a reshaped to ``[ne0, ne1]`` (NumPy ``(ne1, ne0)``), op CONT (mirrors
    ``ggml_cont_2d``).

    Requires ``ne0*ne1 == nelements(a)`` (ValueError otherwise). Result a's type, src ``[a]``, no
    params.
    """
    return _cont_impl(ctx, a, (ne0, ne1, 1, 1), "cont_2d")


@checked_args
def cont_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """Packed copy of a reshaped to ``[ne0, ne1, ne2]`` (NumPy ``(ne2, ne1, ne0)``), op CONT
    (mirrors ``ggml_cont_3d``).

    Requires ``ne0*ne1*ne2 == nelements(a)`` (ValueError otherwise). Result a's type, src ``[a]``.
    """
    return _cont_impl(ctx, a, (ne0, ne1, ne2, 1), "cont_3d")


@checked_args
def cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """Packed copy of a reshaped to ``[ne0..ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), op CONT
    (mirrors ``ggml_cont_4d``).

    Requires ``ne0*ne1*ne2*ne3 == nelements(a)`` (ValueError otherwise). Result a's type, src
    ``[a]``.
    """
    return _cont_impl(ctx, a, (ne0, ne1, ne2, ne3), "cont_4d")


def _reshape_impl(ctx: Context, a: Tensor, ne: tuple[int, ...], fn: str) -> Tensor:
    _require(a.is_contiguous(), fn, "a to be contiguous (use cont() first)", a)
    ne = _new_shape(a, ne, fn)
    result = ctx.new_view(a, a.type, ne, None, 0)
    result.set_name(f"{a.name} (reshaped)")
    return _op(result, Op.RESHAPE, [], [a])


@checked_args
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


@checked_args
def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    """View of contiguous a as ``[ne0]`` (NumPy ``(ne0,)``), op RESHAPE (mirrors
    ``ggml_reshape_1d``).

    Result a's type, packed nb, src ``[a]``, no params. Raises ValueError if a is not contiguous or
    ``ne0 != nelements(a)``.
    """
    _args(ctx, "reshape_1d", a=a)
    return _reshape_impl(ctx, a, (ne0,), "reshape_1d")


@checked_args
def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    """View of contiguous a as ``[ne0, ne1]`` (NumPy ``(ne1, ne0)``), op RESHAPE (mirrors
    ``ggml_reshape_2d``).

    Result a's type, packed nb, src ``[a]``, no params. Raises ValueError if a is not contiguous or
    ``ne0*ne1 != nelements(a)``.
    """
    _args(ctx, "reshape_2d", a=a)
    return _reshape_impl(ctx, a, (ne0, ne1), "reshape_2d")


@checked_args
def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    """View of contiguous a as ``[ne0, ne1, ne2]`` (NumPy ``(ne2, ne1, ne0)``), op RESHAPE (mirrors
    ``ggml_reshape_3d``).

    Result a's type, packed nb, src ``[a]``, no params. Raises ValueError if a is not contiguous or
    the element count differs.
    """
    _args(ctx, "reshape_3d", a=a)
    return _reshape_impl(ctx, a, (ne0, ne1, ne2), "reshape_3d")


@checked_args
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


#: shape, param and error rules shared by the docstrings below
_VIEW_RULES = """
``offset`` and strides are in **bytes**; ``nb0`` is a's type size; offset is relative to a
(a view of a view points at the root with the offsets added). Result: a view of a with a's type,
op VIEW, src ``[a]``, op_params ``[offset]`` (int), named ``"<a> (view)"``. Raises ValueError
when ne0 is not a multiple of the block size, the offset is negative, or the **packed** size of
the new shape plus the offset exceeds the root's nbytes (ggml's check; a strided view's real
extent is not checked).
"""


@shared_doc(_VIEW_RULES)
@checked_args
def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    """View ``[ne0]`` (NumPy ``(ne0,)``) of a's memory at byte ``offset`` (mirrors
    ``ggml_view_1d``).
    """
    _args(ctx, "view_1d", a=a)
    return _view_impl(ctx, a, (ne0,), None, offset, "view_1d")


@shared_doc(_VIEW_RULES)
@checked_args
def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    """View ``[ne0, ne1]`` (NumPy ``(ne1, ne0)``) with row stride ``nb1``; nb2 = nb3 = nb1*ne1
    (mirrors ``ggml_view_2d``).
    """
    fn = "view_2d"
    _args(ctx, fn, a=a)
    nb1, ne1 = _int(nb1, fn, "nb1"), _int(ne1, fn, "ne1")
    nb = (a.type.type_size, nb1, nb1 * ne1, nb1 * ne1)
    return _view_impl(ctx, a, (ne0, ne1), nb, offset, fn)


@shared_doc(_VIEW_RULES)
@checked_args
def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
            offset: int) -> Tensor:
    """View ``[ne0, ne1, ne2]`` (NumPy ``(ne2, ne1, ne0)``) with strides nb1, nb2; nb3 = nb2*ne2
    (mirrors ``ggml_view_3d``).
    """
    fn = "view_3d"
    _args(ctx, fn, a=a)
    nb1, nb2, ne2 = _int(nb1, fn, "nb1"), _int(nb2, fn, "nb2"), _int(ne2, fn, "ne2")
    nb = (a.type.type_size, nb1, nb2, nb2 * ne2)
    return _view_impl(ctx, a, (ne0, ne1, ne2), nb, offset, fn)


@shared_doc(_VIEW_RULES)
@checked_args
def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int,
            nb3: int, offset: int) -> Tensor:
    """View ``[ne0..ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``) with strides nb1, nb2, nb3 (mirrors
    ``ggml_view_4d``).
    """
    fn = "view_4d"
    _args(ctx, fn, a=a)
    nb = (a.type.type_size, nb1, nb2, nb3)
    return _view_impl(ctx, a, (ne0, ne1, ne2, ne3), nb, offset, fn)


@checked_args
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


@checked_args
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


@checked_args
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


@checked_args
def set_rows(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write the rows of b into a at the row indices c, op SET_ROWS (mirrors ``ggml_set_rows``).

    a ``[n, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, n)``; any type with whole blocks per row),
    b **F32** ``[n, r, ne2, ne3]``, c **I64 or I32** ``[r, ne11, ne12, 1]`` with ``ne2 % ne11 ==
    0`` and ``ne3 % ne12 == 0``; a and b need contiguous rows (``nb0`` = element size). Semantics:
    ``a[:, c[i, i2 % ne11, i3 % ne12], i2, i3] = convert(b[:, i, i2, i3])`` (whole rows converted
    or quantized to a's type); rows c names twice are undefined, an index outside ``0..ne1-1``
    is a compute error. Result: **a view of a** (a's type, ne, nb; it writes a's memory, so the
    scheduler runs it where a's memory is), src ``[b, c, a]`` in ggml's order, no params. Raises
    ValueError for the shape/layout rules, TypeError if b is not F32 or c not I64/I32.
    """
    fn = "set_rows"
    _args(ctx, fn, a=a, b=b, c=c)
    _require(a.ne[0] == b.ne[0], fn, "a.ne0 == b.ne0", a, b)
    _require(a.ne[2] == b.ne[2], fn, "a.ne2 == b.ne2", a, b)
    _require(a.ne[3] == b.ne[3], fn, "a.ne3 == b.ne3", a, b)
    _require(b.ne[1] == c.ne[0], fn, "b.ne1 == c.ne0 (one index per row of b)", b, c)
    _require(_divides(c.ne[1], b.ne[2]), fn, "b.ne2 % c.ne1 == 0", b, c)
    _require(_divides(c.ne[2], b.ne[3]), fn, "b.ne3 % c.ne2 == 0", b, c)
    _require(c.ne[3] == 1, fn, "c.ne3 == 1", c)
    _require_type(b.type == Type.F32, fn, "b of type F32", b)
    _require_type(c.type in (Type.I64, Type.I32), fn, "c of type I64 or I32", c)
    _require(a.nb[0] == a.type.type_size, fn, "a to have contiguous rows", a)
    _require(b.nb[0] == b.type.type_size, fn, "b to have contiguous rows", b)
    result = ctx.new_view(a, a.type, a.ne, a.nb, 0)
    result.set_name(f"{a.name} (view)" if a.name else "")
    return _op(result, Op.SET_ROWS, [], [b, c, a])


@checked_args
def pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
            lp3: int, rp3: int) -> Tensor:
    """Zero-pad a on both sides of each dim, op PAD (mirrors ``ggml_pad_ext``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``). Result: a's type,
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


@checked_args
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


@checked_args
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


@checked_args
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
