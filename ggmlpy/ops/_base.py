"""Shared pieces of the op constructors: ggml's op constants, the argument checks and result
builders every family uses, and the tensor flag / graph helpers (``set_name``, ``set_input``,
``set_output``, ``set_param``, ``build_forward_expand``).

The private helpers raise the errors every op docstring promises: ``TypeError`` for a non-Context /
non-Tensor argument or a wrong element type, ``ValueError`` for a violated shape/layout/parameter
rule, naming the function, the condition and the tensors (by ``.name``, type and ``ne``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from enum import IntEnum

import numpy as np

from ggmlpy.core.check import checked_args
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context, Tensor

__all__ = ["Prec", "SortOrder", "ROPE_TYPE_NORMAL", "ROPE_TYPE_NEOX",
           "set_name", "set_input", "set_output", "set_param", "build_forward_expand"]


class Prec(IntEnum):
    """Accumulation precision hint of MUL_MAT / FLASH_ATTN_EXT (mirrors ``enum ggml_prec``)."""

    DEFAULT = 0
    F32 = 10


class SortOrder(IntEnum):
    """Order of :func:`argsort` (mirrors ``enum ggml_sort_order``)."""

    ASC = 0
    DESC = 1


ROPE_TYPE_NORMAL = 0


ROPE_TYPE_NEOX = 2


_INT32_MAX = 2**31 - 1


def _desc(t: Tensor) -> str:
    name = f"'{t.name}'" if t.name else "<unnamed>"
    return f"{name} ({t.type.type_name}, ne={list(t.ne)})"


def _check_ctx(ctx: object, fn: str) -> None:
    if not isinstance(ctx, Context):
        raise TypeError(f"{fn}: ctx (the first argument) must be a Context, got {type(ctx).__name__}")


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


@checked_args
def set_name(tensor: Tensor, name: str) -> Tensor:
    """Set ``tensor.name`` (truncated to 63 characters) and return the tensor (mirrors
    ``ggml_set_name``).

    Raises TypeError if ``tensor`` is not a Tensor.
    """
    return _check_tensor(tensor, "set_name", "tensor").set_name(name)


@checked_args
def set_input(tensor: Tensor) -> Tensor:
    """Flag ``tensor`` as a graph input (``Flag.INPUT``) and return it (mirrors ``ggml_set_input``).

    Raises TypeError if ``tensor`` is not a Tensor.
    """
    return _check_tensor(tensor, "set_input", "tensor").set_input()


@checked_args
def set_output(tensor: Tensor) -> Tensor:
    """Flag ``tensor`` (and its ``view_src``) as a graph output and return it (mirrors
    ``ggml_set_output``).

    Raises TypeError if ``tensor`` is not a Tensor.
    """
    return _check_tensor(tensor, "set_output", "tensor").set_output()


@checked_args
def set_param(tensor: Tensor) -> Tensor:
    """Flag ``tensor`` as a trainable parameter and return it (mirrors ``ggml_set_param``).

    Raises ValueError if the tensor has an op (only op NONE tensors can be parameters), TypeError
    if it is not a Tensor.
    """
    return _check_tensor(tensor, "set_param", "tensor").set_param()


@checked_args
def build_forward_expand(graph: Graph, tensor: Tensor) -> None:
    """Add ``tensor`` and everything it depends on to ``graph`` (mirrors
    ``ggml_build_forward_expand``).

    Delegates to :meth:`Graph.build_forward_expand` (depth-first post-order over ``src``; op NONE
    tensors become leafs, the rest nodes). Raises TypeError for a non-Graph/non-Tensor argument and
    :class:`~ggmlpy.core.errors.GraphFullError` when the graph's size is exceeded.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"build_forward_expand: expected a Graph, got {type(graph).__name__}")
    graph.build_forward_expand(tensor)
