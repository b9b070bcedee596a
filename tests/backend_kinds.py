"""The one list of backend kinds the tests run on (test support, not a test module).

``tests/conftest.py`` parametrizes its ``backend`` and ``device`` fixtures with
:func:`backend_params`; a test that cannot take a function-scoped fixture (a Hypothesis test
drawing the kind) calls :func:`new_device` with a kind of :data:`BACKEND_KINDS`. SIM devices for
any other use come from :func:`new_sim_devices` (the ``sim_devices`` fixture).
"""

from __future__ import annotations

from typing import Any

import pytest

#: latency of the SIM device a kind makes: every launch and copy is delayed, so a missing
#: synchronisation gives a wrong result instead of a lucky race
SIM_LATENCY_US = 200.0

#: every kind, in id order: the CPU, one SIM device, the CUDA runtime over tests/fake_cupy.py,
#: the real CUDA device (``gpu``), a RAY device (``ray``)
BACKEND_KINDS = ("CPU", "SIM0", "FAKECUDA0", "CUDA0", "RAY0")
#: the kinds a test gets without a ``backends`` marker (RAY0 is added for ``ray`` tests)
DEFAULT_BACKENDS = ("CPU", "SIM0", "FAKECUDA0")
_KIND_MARKS = {"CUDA0": [pytest.mark.gpu], "RAY0": [pytest.mark.ray, pytest.mark.xdist_group("ray")]}


def backend_params(kinds) -> list:
    """``pytest.param`` objects for ``kinds`` (names of :data:`BACKEND_KINDS`), id = the name,
    CUDA0 marked ``gpu`` and RAY0 marked ``ray``. Raises ValueError for an unknown name."""
    bad = [k for k in kinds if k not in BACKEND_KINDS]
    if bad:
        raise ValueError(f"unknown backend kind(s) {bad}; known: {list(BACKEND_KINDS)}")
    return [pytest.param(k, id=k, marks=_KIND_MARKS.get(k, [])) for k in kinds]


def new_sim_devices(n: int = 1, latency_us: float | None = None, memory_mb: float | None = None,
                    refuse_ops: Any = None, **options: Any) -> list:
    """The ``n`` devices of a new SIM registration (:func:`ggmlpy.backends.sim.sim_reg`: one new
    runtime per call, never the global registry, so tests stay independent under ``pytest -n``).
    None options read the environment as ``sim_reg`` does (latency 0, host-sized memory when
    unset); further keyword options (``pinned_direct_upload``) go to ``sim_reg`` as given. The
    ``sim_devices`` fixture is this function; helpers that run at collection time or outside a
    test call it directly."""
    from ggmlpy.backends.sim import sim_reg

    reg = sim_reg(n, latency_us=latency_us, memory_mb=memory_mb, refuse_ops=refuse_ops, **options)
    return list(reg.devices)


def new_device(kind: str, ray_reg: Any = None) -> Any:
    """Device 0 of a fresh registration of ``kind``: the CPU device, a SIM device with
    :data:`SIM_LATENCY_US` (one new runtime), the CUDA runtime over the fake CuPy (a 2-device
    reg), the real CUDA device (skips the test without one) or ``ray_reg.devices[0]`` for RAY0.

    Raises ValueError for an unknown kind or RAY0 without ``ray_reg``."""
    if kind == "CPU":
        from ggmlpy.backends.cpu.backend import cpu_device

        return cpu_device()
    if kind == "SIM0":
        return new_sim_devices(1, latency_us=SIM_LATENCY_US)[0]
    if kind == "FAKECUDA0":
        from fake_cupy import fake_cuda_reg

        return fake_cuda_reg(2).devices[0]
    if kind == "CUDA0":
        from ggmlpy.backends.cuda.runtime import cuda_reg

        reg = cuda_reg()
        if not reg.devices:
            pytest.skip(f"no CUDA device: {reg.unavailable_reason}")
        return reg.devices[0]
    if kind == "RAY0" and ray_reg is not None:
        return ray_reg.devices[0]
    raise ValueError(f"kind {kind!r}: expected one of {list(BACKEND_KINDS)} (RAY0 needs ray_reg)")
