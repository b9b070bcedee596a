"""The one generator of ggml's ``<op>_inplace`` twins (``add_inplace``, ``scale_inplace``, ...).

ggml pairs most constructors ``ggml_<op>(ctx, a, ...)`` with ``ggml_<op>_inplace(ctx, a, ...)``
that takes the same arguments and differs only in the result: a view of ``a`` (``view_src`` is
a's root, same type, ``ne`` and ``nb``) instead of a new packed tensor. In ggmlpy both call one
private implementation ``impl(ctx, ..., inplace, fn)``; :func:`inplace_variant` builds the twin from
the base op so that its signature and documentation cannot drift from the base's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..tensor import Tensor

__all__ = ["inplace_variant"]


def inplace_variant(base: Callable[..., Tensor], impl: Callable[..., Tensor], *, note: str = "",
                    **fixed: object) -> Callable[..., Tensor]:
    """Return ``<base>_inplace``: ``base``'s signature, computed by ``impl`` with ``inplace=True``.

    The twin binds its arguments with ``base``'s signature (a wrong call raises TypeError naming
    the twin), then calls ``impl(**arguments, **fixed, inplace=True, fn="<base>_inplace")``: every
    parameter of ``base`` and every key of ``fixed`` must be a parameter name of ``impl`` (``fixed``
    supplies what ``base`` hard-codes, e.g. ``op=Op.ADD`` or soft_max's ``mask=None``). ``note``
    is appended to the generated docstring (e.g. a param slot that differs). The docstring points
    at ``base`` for shapes (ggml ``ne``, NumPy ``ne[::-1]``), types, op_params and errors. Mirrors
    ggml's ``ggml_<op>_inplace`` family. Raises TypeError at definition time if ``base`` or
    ``impl`` is not callable.
    """
    if not callable(base) or not callable(impl):
        raise TypeError(f"inplace_variant: base and impl must be callable, got {base!r}, {impl!r}")
    name = f"{base.__name__}_inplace"
    sig = inspect.signature(base)

    def variant(*args: object, **kwargs: object) -> Tensor:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{name}: {e}") from None
        return impl(**bound.arguments, **fixed, inplace=True, fn=name)

    variant.__name__ = variant.__qualname__ = name
    variant.__module__ = base.__module__
    variant.__signature__ = sig  # type: ignore[attr-defined]
    variant.__annotations__ = dict(base.__annotations__)
    variant.__wrapped_base__ = base  # type: ignore[attr-defined]
    variant.__doc__ = (
        f"In-place :func:`{base.__name__}` (mirrors ``ggml_{name}``).\n\n"
        f"Same arguments, shape rules, op, op_params and errors as :func:`{base.__name__}`; the "
        f"result is a view of ``a`` (a's type, ``ne`` and ``nb``; NumPy shape ``ne[::-1]``) with "
        f"``src[0] = a``, so the op overwrites a's memory when the graph is computed."
        + (f" {note}" if note else "") + "\n")
    return variant
