"""Argument checks shared by the public entry points: one line, the argument named.

Every helper raises at once (``TypeError`` for a wrong type, ``ValueError`` for a value out of
range) with a message ``"<where>: <name> must be <condition>, got <value>"``. ``bool`` is never
accepted where an ``int`` or a number is asked for (``True`` is an ``int`` in Python, but passing
it for a count is a mistake). This module imports nothing from ggmlpy, so any layer may use it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_type", "check_int", "check_number", "check_str", "check_bool",
           "check_optional", "check_str_sequence", "describe"]


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
        raise ValueError(f"{_prefix(where)}{name} must be a non-empty string, got {value!r}")
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
        raise ValueError(f"{_prefix(where)}{name} must be {rng}, got {value}")
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
        raise ValueError(f"{_prefix(where)}{name} must be a finite number, got {value!r}")
    if lo is not None and (x <= lo if lo_open else x < lo):
        raise ValueError(f"{_prefix(where)}{name} must be {'>' if lo_open else '>='} {lo}, got {value!r}")
    if hi is not None and x > hi:
        raise ValueError(f"{_prefix(where)}{name} must be <= {hi}, got {value!r}")
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
