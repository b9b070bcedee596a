"""Device names given on a command line (``embed --device``, ``test-backend-ops -b``, the
benchmark scripts): SIM devices registered on demand, and the one line that says so."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ggmlpy.backends.sim import register_named_sim_devices, sim_range

__all__ = ["register_named_devices", "sim_registered_note"]


def sim_registered_note(n: int) -> str:
    """The line printed after SIM devices were registered for a command line: ``"registered 2
    host-emulated SIM devices SIM0..SIM1 (set GGMLPY_SIM_DEVICES=N to do this yourself)"``.

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"sim_registered_note: n must be >= 1, got {n}")
    return (f"registered {n} host-emulated SIM device{'s' if n > 1 else ''} {sim_range(n)} "
            "(set GGMLPY_SIM_DEVICES=N to do this yourself)")


def register_named_devices(names: Sequence[str], prog: str) -> int:
    """Register the SIM devices ``names`` asks for
    (:func:`ggmlpy.backends.sim.register_named_sim_devices`) and, when some were, print
    ``"{prog}: registered ..."`` on stderr. Returns the number registered (0: none).

    Raises:
        TypeError: ``names`` is not a sequence of str. EnvError: a malformed ``GGMLPY_*``
            variable.
    """
    n = register_named_sim_devices(names)
    if n:
        print(f"{prog}: {sim_registered_note(n)}", file=sys.stderr)
    return n
