"""The ``GGMLPY_*`` environment variables: each one parsed and validated in one place.

=========================  ===============================================================
variable                   accepted value
=========================  ===============================================================
``GGMLPY_BACKENDS``        comma-separated device names (``SIM0,CPU``): letters then digits
``GGMLPY_SIM_DEVICES``     integer 0..64: SIM devices registered at first use
``GGMLPY_SIM_LATENCY_US``  finite number >= 0: microseconds per SIM launch and copy
``GGMLPY_SIM_MEMORY_MB``   finite number > 0: MiB of memory per SIM device
``GGMLPY_SCHED_DEBUG``     0, 1 or 2: scheduler debug printing
``GGMLPY_FIXTURES``        a folder (read by the test suite only)
=========================  ===============================================================

An empty or all-blank value means "unset". A malformed value raises :class:`EnvError` (a
``ValueError``) whose one-line message names the variable, the value and what is accepted.
:func:`validate` checks every variable at once; the registry calls it before it registers
anything, so a bad variable leaves no half-initialised state. This module imports only
:mod:`ggmlpy.errors`, so every layer may use it.
"""

from __future__ import annotations

import math
import os
import re

from .errors import GgmlpyError

__all__ = ["EnvError", "KNOWN", "BACKENDS", "SIM_DEVICES", "SIM_LATENCY_US", "SIM_MEMORY_MB",
           "SCHED_DEBUG", "FIXTURES", "backends", "sim_devices", "sim_latency_us",
           "sim_memory_mb", "sched_debug", "validate", "unknown_variables", "MAX_SIM_DEVICES"]

BACKENDS = "GGMLPY_BACKENDS"
SIM_DEVICES = "GGMLPY_SIM_DEVICES"
SIM_LATENCY_US = "GGMLPY_SIM_LATENCY_US"
SIM_MEMORY_MB = "GGMLPY_SIM_MEMORY_MB"
SCHED_DEBUG = "GGMLPY_SCHED_DEBUG"
FIXTURES = "GGMLPY_FIXTURES"

#: Every variable ggmlpy reads.
KNOWN = (BACKENDS, SIM_DEVICES, SIM_LATENCY_US, SIM_MEMORY_MB, SCHED_DEBUG, FIXTURES)

#: Upper bound of ``GGMLPY_SIM_DEVICES``.
MAX_SIM_DEVICES = 64

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z_]*\d*$")


class EnvError(GgmlpyError, ValueError):
    """A ``GGMLPY_*`` variable holds a value ggmlpy cannot use.

    Attributes:
        name: the variable's name. value: its (raw) value.
    """

    def __init__(self, name: str, value: str, expected: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name}={value!r} is invalid: expected {expected}")


def _raw(name: str) -> str | None:
    v = os.environ.get(name)
    if v is None or not v.strip():
        return None
    return v.strip()


def backends() -> list[str] | None:
    """``GGMLPY_BACKENDS`` as a list of upper-case device names (order kept, duplicates
    dropped), or None when unset.

    Raises:
        EnvError: an entry is empty or is not a device name (letters, then optional digits).
    """
    v = _raw(BACKENDS)
    if v is None:
        return None
    out: list[str] = []
    for part in v.split(","):
        p = part.strip()
        if not p or not _NAME_RE.match(p):
            raise EnvError(BACKENDS, v, "a comma-separated list of device names such as "
                                        "'SIM0,CPU' (bad entry " + repr(p) + ")")
        if p.upper() not in out:
            out.append(p.upper())
    return out


def sim_devices() -> int:
    """``GGMLPY_SIM_DEVICES`` as an int in 0..64 (0 when unset).

    Raises:
        EnvError: not an integer, or out of range.
    """
    v = _raw(SIM_DEVICES)
    if v is None:
        return 0
    expected = f"an integer in 0..{MAX_SIM_DEVICES}"
    try:
        n = int(v)
    except ValueError:
        raise EnvError(SIM_DEVICES, v, expected) from None
    if not 0 <= n <= MAX_SIM_DEVICES:
        raise EnvError(SIM_DEVICES, v, expected)
    return n


def _number(name: str, positive: bool) -> float | None:
    v = _raw(name)
    if v is None:
        return None
    expected = "a finite number " + ("> 0" if positive else ">= 0")
    try:
        x = float(v)
    except ValueError:
        raise EnvError(name, v, expected) from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise EnvError(name, v, expected)
    return x


def sim_latency_us() -> float | None:
    """``GGMLPY_SIM_LATENCY_US`` in microseconds (finite, >= 0), or None when unset.

    Raises:
        EnvError: not a finite number >= 0 (``nan``, ``inf``, ``-1``, ``abc`` are refused).
    """
    return _number(SIM_LATENCY_US, positive=False)


def sim_memory_mb() -> float | None:
    """``GGMLPY_SIM_MEMORY_MB`` in MiB (finite, > 0), or None when unset.

    Raises:
        EnvError: not a finite number > 0.
    """
    return _number(SIM_MEMORY_MB, positive=True)


def sched_debug() -> int:
    """``GGMLPY_SCHED_DEBUG`` as 0, 1 or 2 (0 when unset).

    Raises:
        EnvError: any other value.
    """
    v = _raw(SCHED_DEBUG)
    if v is None:
        return 0
    if v not in ("0", "1", "2"):
        raise EnvError(SCHED_DEBUG, v, "0, 1 or 2")
    return int(v)


def validate() -> None:
    """Check every variable ggmlpy reads; raise the first :class:`EnvError` (in :data:`KNOWN`
    order). ``GGMLPY_FIXTURES`` is not checked here (only the tests read it)."""
    backends()
    sim_devices()
    sim_latency_us()
    sim_memory_mb()
    sched_debug()


def unknown_variables() -> list[str]:
    """Names of set ``GGMLPY_*`` variables that ggmlpy does not read (likely typos), sorted."""
    return sorted(k for k in os.environ if k.startswith("GGMLPY_") and k not in KNOWN)
