"""The generators of ggml's op variants: ``<op>_inplace`` twins and table-built op families.

ggml pairs most constructors ``ggml_<op>(ctx, a, ...)`` with ``ggml_<op>_inplace(ctx, a, ...)``
that takes the same arguments and differs only in the result: a view of ``a`` (``view_src`` is
a's root, same type, ``ne`` and ``nb``) instead of a new packed tensor. In ggmlpy both call one
private implementation ``impl(ctx, ..., inplace, fn)``; :func:`inplace_variant` builds the twin from
the base op so that its signature and documentation cannot drift from the base's.

:func:`named_variant` gives a closure built by a family factory (``add``/``sub``/``mul``/``div``,
the named unary and GLU functions, ...) its public name and docstring.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TypeVar

from ggmlpy.core.check import checked_args
from ggmlpy.core.tensor import Tensor

__all__ = ["inplace_variant", "named_variant"]

F = TypeVar("F", bound=Callable[..., Tensor])


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

    names = tuple(sig.parameters)

    def variant(*args: object, **kwargs: object) -> Tensor:
        if kwargs or len(args) != len(names):  # the general (slower) path: bind by signature
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{name}: {e}") from None
            bound.apply_defaults()
            arguments = bound.arguments
        else:  # every argument positional, none missing: graph building's hot path
            arguments = dict(zip(names, args))
        return impl(**arguments, **fixed, inplace=True, fn=name)

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
    return checked_args(variant)


def named_variant(fn: F, name: str, doc: str) -> F:
    """Give ``fn`` (a closure made by a family factory) its public ``name`` and docstring ``doc``.

    Sets ``__name__``, ``__qualname__`` and ``__doc__``, so that ``help()``, error messages and
    :func:`inplace_variant` see ggml's name (e.g. ``"add"``), and returns ``fn`` with its argument
    types checked (:func:`~ggmlpy.core.check.checked_args`), as every public op.
    Raises ValueError for an empty name.
    """
    if not name:
        raise ValueError("named_variant: name must be a non-empty string")
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return checked_args(fn)


def shared_doc(paragraph: str) -> Callable[[F], F]:
    """Decorator: append the rules ``paragraph`` several ops share to each one's own docstring.

    The op keeps its first lines (what it computes, the ggml function it mirrors) in its source;
    the shared shape/param/error rules are written once, in a module constant. Returns the function
    itself with ``__doc__`` extended; raises ValueError for an empty paragraph.
    """
    text = inspect.cleandoc(paragraph)
    if not text:
        raise ValueError("shared_doc: paragraph must not be empty")

    def extend(fn: F) -> F:
        fn.__doc__ = inspect.cleandoc(fn.__doc__ or "") + "\n\n" + text + "\n"
        return fn

    return extend
