"""Argument checks shared by the public entry points: one line, the argument named.

Every helper raises at once (``TypeError`` for a wrong type, ``ValueError`` for a value out of
range, an :class:`ArgumentValueError` naming the argument) with a message
``"<where>: <name> must be <condition>, got <value>"``. ``bool`` is never
accepted where an ``int`` or a number is asked for (``True`` is an ``int`` in Python, but passing
it for a count is a mistake). This module imports nothing from ggmlpy, so any layer may use it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

__all__ = ["checked_args", "ArgumentValueError", "OneLineArgumentParser", "check_type", "check_int",
           "check_number", "check_str", "check_bool", "check_optional", "check_str_sequence",
           "describe"]

F = TypeVar("F", bound=Callable[..., Any])


class ArgumentValueError(ValueError):
    """A ``ValueError`` about one named argument: ``"<where>: <arg> <detail>"``.

    A command line that passes its flags on to a function catches it and names its own flag
    instead of the parameter (``-ngl/--n-gpu-layers`` for ``n_gpu_layers``).

    Attributes:
        arg: the parameter's name as the function spells it (``"n_gpu_layers"``).
        detail: the rest of the message (``"must be in 0..6, got 7"``).
        where: the function's name, or ``""``.
    """

    def __init__(self, arg: str, detail: str, where: str = "") -> None:
        self.arg = arg
        self.detail = detail
        self.where = where
        super().__init__(f"{_prefix(where)}{arg} {detail}")


def describe(value: Any) -> str:
    """A short one-line description of ``value`` for an error message: its type and its repr
    (whitespace collapsed, cut at 40 characters)."""
    if value is None:
        return "None"
    r = " ".join(repr(value).split())
    if len(r) > 40:
        r = r[:37] + "..."
    return f"{type(value).__name__} {r}"


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def _type_names(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    names = [("None" if t is type(None) else t.__name__) for t in ts]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_type(name: str, value: Any, types: type | tuple[type, ...], where: str = "") -> Any:
    """Return ``value`` when it is an instance of ``types``, else raise TypeError naming ``name``.

    A ``bool`` is refused where ``int`` (and not ``bool``) is among ``types``.

    Raises:
        TypeError: ``"<where>: <name> must be <types>, got <type> <repr>"``.
    """
    ts = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, ts)
    if ok and isinstance(value, bool) and bool not in ts and int in ts:
        ok = False
    if not ok:
        raise TypeError(f"{_prefix(where)}{name} must be {_type_names(types)}, got {describe(value)}")
    return value


def check_optional(name: str, value: Any, types: type | tuple[type, ...], where: str = "") -> Any:
    """:func:`check_type` that also accepts None (the message then lists None too)."""
    if value is None:
        return None
    ts = types if isinstance(types, tuple) else (types,)
    return check_type(name, value, ts + (type(None),), where)


def check_bool(name: str, value: Any, where: str = "") -> bool:
    """Return ``value`` when it is a ``bool``; TypeError naming ``name`` otherwise."""
    return check_type(name, value, bool, where)


def check_str(name: str, value: Any, where: str = "", nonempty: bool = False) -> str:
    """Return ``value`` when it is a ``str`` (non-blank if ``nonempty``).

    Raises:
        TypeError: not a str. ValueError: ``nonempty`` and the string is blank.
    """
    check_type(name, value, str, where)
    if nonempty and not value.strip():
        raise ArgumentValueError(name, f"must be a non-empty string, got {value!r}", where)
    return value


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None,
              where: str = "") -> int:
    """Return ``value`` (an ``int``, not a ``bool``; NumPy integers are accepted and converted)
    when ``lo <= value <= hi`` (either bound may be None).

    Raises:
        TypeError: not an integer. ValueError: out of range, with the range in the message.
    """
    import numpy as np

    if isinstance(value, np.integer):
        value = int(value)
    check_type(name, value, int, where)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = (f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in {lo}..{hi}")
        raise ArgumentValueError(name, f"must be {rng}, got {value}", where)
    return value


def check_number(name: str, value: Any, lo: float | None = None, hi: float | None = None,
                 where: str = "", lo_open: bool = False) -> float:
    """Return ``float(value)`` for a finite real number (int or float, not bool) in range.

    ``lo_open`` makes the lower bound strict (``value > lo``).

    Raises:
        TypeError: not a real number. ValueError: NaN, infinite, or out of range.
    """
    import numpy as np

    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    check_type(name, value, (int, float), where)
    x = float(value)
    if not math.isfinite(x):
        raise ArgumentValueError(name, f"must be a finite number, got {value!r}", where)
    if lo is not None and (x <= lo if lo_open else x < lo):
        raise ArgumentValueError(name, f"must be {'>' if lo_open else '>='} {lo}, got {value!r}",
                                 where)
    if hi is not None and x > hi:
        raise ArgumentValueError(name, f"must be <= {hi}, got {value!r}", where)
    return x


def check_str_sequence(name: str, value: Any, where: str = "") -> list[str]:
    """Return ``list(value)`` for a list/tuple (any non-str Sequence) of ``str``.

    Raises:
        TypeError: ``value`` is a str, not a sequence, or holds a non-str (the index is named).
    """
    from collections.abc import Sequence

    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{_prefix(where)}{name} must be a sequence of str, got {describe(value)}")
    for i, v in enumerate(value):
        if not isinstance(v, str):
            raise TypeError(f"{_prefix(where)}{name}[{i}] must be a str, got {describe(v)}")
    return list(value)


# -- checks generated from a signature's annotations ------------------------------------------------

def _annotation_check(ann: Any) -> Callable[[str, Any, str], None] | None:
    """A checker ``(name, value, where)`` for a resolved annotation, or None when the annotation
    says nothing checkable (``Any``, a TypeVar, an unresolved string)."""
    import enum
    import types as _types
    import typing

    import numpy as np

    if ann is typing.Any or ann is object:
        return None
    origin = typing.get_origin(ann)
    if origin in (typing.Union, _types.UnionType):
        members = typing.get_args(ann)
        opt = type(None) in members
        rest = [m for m in members if m is not type(None)]
        checks = [_annotation_check(m) for m in rest]
        if any(c is None for c in checks):
            return None

        def check_union(name: str, value: Any, where: str) -> None:
            if value is None and opt:
                return
            errors = []
            for c in checks:
                try:
                    c(name, value, where)
                    return
                except (TypeError, ValueError) as e:
                    errors.append(e)
            names = " or ".join([_ann_name(m) for m in rest] + (["None"] if opt else []))
            raise TypeError(f"{_prefix(where)}{name} must be {names}, got {describe(value)}")
        return check_union
    if origin is not None or ann in (list, tuple):
        return None  # containers (Sequence[int], list[Backend], ...): the function checks them
    if ann is bool:
        def check_b(name: str, value: Any, where: str) -> None:
            if not isinstance(value, (bool, np.bool_)) and not (
                    isinstance(value, (int, np.integer)) and value in (0, 1)):
                raise TypeError(f"{_prefix(where)}{name} must be bool, got {describe(value)}")
        return check_b
    if ann is int or (isinstance(ann, type) and issubclass(ann, enum.Enum)):
        label = "int" if ann is int else f"{ann.__name__} or int"

        ok_types = (int, np.integer) if ann is int else (ann, int, np.integer)

        def check_i(name: str, value: Any, where: str) -> None:
            if isinstance(value, bool) or not isinstance(value, ok_types):
                raise TypeError(f"{_prefix(where)}{name} must be {label}, got {describe(value)}")
        return check_i
    if ann is float:
        def check_f(name: str, value: Any, where: str) -> None:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                                 np.floating)):
                raise TypeError(f"{_prefix(where)}{name} must be a number, got {describe(value)}")
        return check_f
    if ann is str:
        def check_s(name: str, value: Any, where: str) -> None:
            check_type(name, value, str, where)
        return check_s
    if isinstance(ann, type) and ann is not object and origin is None:
        def check_c(name: str, value: Any, where: str) -> None:
            if not isinstance(value, ann):
                raise TypeError(f"{_prefix(where)}{name} must be {_ann_name(ann)}, got "
                                f"{describe(value)}")
        return check_c
    return None


def _none_or(c: Callable[[str, Any, str], None]) -> Callable[[str, Any, str], None]:
    def check(name: str, value: Any, where: str) -> None:
        if value is not None:
            c(name, value, where)
    return check


def _ann_name(ann: Any) -> str:
    import numpy as np

    if ann is np.ndarray:
        return "a NumPy array"
    return getattr(ann, "__name__", None) or str(ann)


def _where(fn: Callable[..., Any]) -> str:
    """The name a message gives: ``name`` for a function, ``Class.name`` for a method, ``Class``
    for ``__init__``."""
    q = fn.__qualname__
    if "<locals>" in q:  # a closure named by a factory keeps only its own name
        q = fn.__name__
    return q.removesuffix(".__init__")


def _arg_checks(fn: Callable[..., Any]) -> list[tuple[str, int, Callable[[str, Any, str], None]]]:
    """``(parameter, position or -1 when keyword-only, check)`` for every checked parameter of
    ``fn``; empty when the annotations cannot be resolved."""
    import inspect
    import typing

    base = getattr(fn, "__wrapped_base__", None)  # generated twins resolve in their base's module
    base = inspect.unwrap(base) if base is not None else None
    try:
        hints = typing.get_type_hints(fn, globalns=getattr(base, "__globals__", None))
        sig = inspect.signature(fn)
    except Exception:  # noqa: BLE001 (unresolvable annotations: nothing is checked)
        return []
    checks = []
    for i, (name, p) in enumerate(sig.parameters.items()):
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        if name not in hints:
            continue
        c = _annotation_check(hints[name])
        if c is not None and p.default is None:
            c = _none_or(c)
        if c is not None:
            checks.append((name, i if p.kind != p.KEYWORD_ONLY else -1, c))
    return checks


def checked_args(fn: F) -> F:
    """Decorator: check every argument of ``fn`` against its annotations at each call, before
    ``fn`` runs; a wrong type raises ``TypeError("<where>: <name> must be <type>, got <value>")``
    where ``<where>`` is the function's name, ``Class.method``, or ``Class`` for ``__init__``.

    Checked annotations: classes (``Tensor``, ``Context``, ...), ``X | None``, unions of those,
    ``int`` and Enums (the enum or an int, not a bool), ``float`` (any real number, not bool; NaN
    and infinities pass: value rules stay with ``fn``), ``bool`` (bool or 0/1), ``str``.
    Containers and anything else are not checked (the function does). A parameter whose default
    is None also accepts None; ``self``/``cls`` (not annotated) are not checked.

    The annotations are resolved at the first call (so they may name classes defined later in
    the module); after that the wrapper costs one ``isinstance`` per checked argument.

    Unchecked path: ``fn.unchecked`` is the undecorated function, for callers whose arguments
    are valid by construction and that call it in a hot loop (the scheduler's split templates
    duplicate tensors with ``Context.dup_tensor_layout.unchecked``). It skips only these type
    checks, not the value checks inside ``fn``.
    """
    import functools

    checks: list[tuple[str, int, Callable[[str, Any, str], None]]] | None = None
    where = ""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal checks, where
        if checks is None:
            checks, where = _arg_checks(fn), _where(fn)
        n = len(args)
        for name, pos, c in checks:
            if 0 <= pos < n:
                c(name, args[pos], where)
            elif name in kwargs:
                c(name, kwargs[name], where)
        return fn(*args, **kwargs)
    wrapper.unchecked = fn  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


class OneLineArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line on stderr,
    ``"<name>: <message> (see --help)"``, and exit status 2, like every other error of the command
    line. ``error_name`` defaults to ``prog`` without ``"python -m "``. Long options must be
    typed in full (``allow_abbrev=False``: ``--sim`` is not taken for ``--similarity``)."""

    def __init__(self, *args: Any, error_name: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.error_name = error_name

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        name = self.error_name or self.prog.replace("python -m ", "")
        print(f"{name}: {' '.join(str(message).split())} (see --help)", file=sys.stderr)
        raise SystemExit(2)
