"""The backend registry: which devices exist, in priority order (mirrors ``ggml-backend-reg.cpp``).

Registration order is CUDA devices, then SIM devices, then the CPU, which is always present and
always last (the scheduler's lowest priority). ``GGMLPY_BACKENDS`` (a comma-separated list of
device names, e.g. ``"SIM0,CPU"``) restricts and orders the devices; the CPU device is appended
when the list leaves it out, since the scheduler needs it.

SIM devices (the host-emulated accelerator of ``ggmlpy.backends.sim_runtime``) are registered
only on request: ``GGMLPY_SIM_DEVICES=N`` at first use, or :func:`register_sim_devices`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .backend import Backend, Device, DeviceType, Reg
from .errors import BackendUnavailableError

__all__ = ["unknown_backend_names", "reg_count", "reg_get", "reg_by_name", "dev_count", "dev_get", "dev_by_name",
           "dev_by_type", "devices", "backend_init_by_name", "backend_init_by_type",
           "backend_init_best", "register", "register_sim_devices", "unregister",
           "cuda_unavailable_reason"]

_lock = threading.RLock()
_regs: list[Reg] = []
_initialized = False


def _ensure_init() -> None:
    global _initialized
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        from .backends.cpu import cpu_reg
        from .backends.cupy_runtime import cuda_reg

        _regs.append(cuda_reg())
        n_sim = os.environ.get("GGMLPY_SIM_DEVICES", "").strip()
        if n_sim:
            try:
                n = int(n_sim)
            except ValueError:
                raise ValueError(f"GGMLPY_SIM_DEVICES must be an integer, got {n_sim!r}") from None
            if n > 0:
                from .backends.sim_runtime import sim_reg

                _regs.append(sim_reg(n))
        _regs.append(cpu_reg())
        _initialized = True


def register(reg: Reg) -> None:
    """Register ``reg`` and its devices ahead of the CPU (mirrors ``ggml_backend_register``).

    A reg already registered (same object, or same name) is replaced by the new one.
    """
    _ensure_init()
    with _lock:
        for i, r in enumerate(_regs):
            if r is reg or r.name == reg.name:
                _regs[i] = reg
                return
        _regs.insert(len(_regs) - 1, reg)  # the CPU stays last


def unregister(name: str) -> None:
    """Remove the reg called ``name`` (case-insensitive; the CPU cannot be removed).

    Raises:
        ValueError: ``name`` is "CPU".
    """
    if name.upper() == "CPU":
        raise ValueError("the CPU backend cannot be unregistered")
    _ensure_init()
    with _lock:
        _regs[:] = [r for r in _regs if r.name.upper() != name.upper()]


def register_sim_devices(n: int = 1, **options: Any) -> Reg:
    """Register ``n`` host-emulated SIM devices ``SIM0..SIM{n-1}`` (replacing earlier SIM devices).

    ``options`` go to :func:`ggmlpy.backends.sim_runtime.sim_reg` (e.g. ``latency_us``,
    ``memory_mb``, ``refuse_ops``). Returns the new reg.

    Raises:
        ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"register_sim_devices: n must be >= 1, got {n}")
    from .backends.sim_runtime import sim_reg

    reg = sim_reg(n, **options)
    register(reg)
    return reg


def reg_count() -> int:
    """Number of registrations (mirrors ``ggml_backend_reg_count``)."""
    _ensure_init()
    return len(_regs)


def reg_get(i: int) -> Reg:
    """Registration ``i`` (mirrors ``ggml_backend_reg_get``). Raises IndexError when out of range."""
    _ensure_init()
    if not 0 <= i < len(_regs):
        raise IndexError(f"reg index {i} out of range 0..{len(_regs) - 1}")
    return _regs[i]


def reg_by_name(name: str) -> Reg | None:
    """The registration called ``name`` (case-insensitive) or None (mirrors ``ggml_backend_reg_by_name``)."""
    _ensure_init()
    for r in _regs:
        if r.name.upper() == name.upper():
            return r
    return None


def devices() -> list[Device]:
    """Every device in priority order, after ``GGMLPY_BACKENDS`` filtering (CPU last)."""
    _ensure_init()
    with _lock:
        devs = [d for r in _regs for d in r.devices]
    spec = os.environ.get("GGMLPY_BACKENDS", "").strip()
    if not spec:
        return devs
    by_name = {d.name.upper(): d for d in devs}
    out: list[Device] = []
    for name in (s.strip().upper() for s in spec.split(",") if s.strip()):
        d = by_name.get(name)
        if d is not None and d not in out:
            out.append(d)
    cpu = by_name["CPU"]
    if cpu in out:
        out.remove(cpu)
    out.append(cpu)
    return out


def unknown_backend_names() -> list[str]:
    """Names in ``GGMLPY_BACKENDS`` that match no registered device (they are ignored)."""
    _ensure_init()
    known = {d.name.upper() for r in _regs for d in r.devices}
    spec = os.environ.get("GGMLPY_BACKENDS", "")
    return [s.strip() for s in spec.split(",") if s.strip() and s.strip().upper() not in known]


def dev_count() -> int:
    """Number of devices (mirrors ``ggml_backend_dev_count``)."""
    return len(devices())


def dev_get(i: int) -> Device:
    """Device ``i`` in priority order (mirrors ``ggml_backend_dev_get``). Raises IndexError when out of range."""
    devs = devices()
    if not 0 <= i < len(devs):
        raise IndexError(f"device index {i} out of range 0..{len(devs) - 1}")
    return devs[i]


def dev_by_name(name: str) -> Device | None:
    """The device called ``name`` (case-insensitive) or None (mirrors ``ggml_backend_dev_by_name``)."""
    for d in devices():
        if d.name.upper() == name.upper():
            return d
    return None


def dev_by_type(type: DeviceType) -> Device | None:
    """The first device of ``type`` in priority order, or None (mirrors ``ggml_backend_dev_by_type``).

    SIM devices report type ACCEL, so ``dev_by_type(GPU)`` only finds real GPUs.
    """
    for d in devices():
        if d.type == type:
            return d
    return None


def cuda_unavailable_reason() -> str | None:
    """Why no CUDA device is registered (one line), or None when CUDA devices exist."""
    r = reg_by_name("CUDA")
    if r is None or r.devices:
        return None
    return r.unavailable_reason


def backend_init_by_name(name: str, params: str | None = None) -> Backend:
    """A backend on the device called ``name`` (mirrors ``ggml_backend_init_by_name``).

    Raises:
        BackendUnavailableError: no such device; for CUDA names the message says why CUDA is
            unavailable here.
    """
    if not isinstance(name, str):
        raise TypeError(f"backend_init_by_name: expected a device name, got {type(name).__name__}")
    d = dev_by_name(name)
    if d is None:
        why = ""
        if name.upper().startswith("CUDA"):
            why = f" ({cuda_unavailable_reason() or 'no such CUDA device'})"
        elif name.upper().startswith("SIM"):
            why = " (SIM devices need GGMLPY_SIM_DEVICES=N or register_sim_devices())"
        known = ", ".join(x.name for x in devices())
        raise BackendUnavailableError(f"no device named {name!r}{why}; available: {known}")
    return d.init_backend(params)


def backend_init_by_type(type: DeviceType, params: str | None = None) -> Backend:
    """A backend on the first device of ``type`` (mirrors ``ggml_backend_init_by_type``).

    Raises:
        BackendUnavailableError: no device of that type.
    """
    d = dev_by_type(type)
    if d is None:
        raise BackendUnavailableError(f"no device of type {DeviceType(type).name}")
    return d.init_backend(params)


def backend_init_best() -> Backend:
    """A backend on the best device: a GPU, else an integrated GPU, else the CPU; never SIM
    (mirrors ``ggml_backend_init_best``)."""
    for t in (DeviceType.GPU, DeviceType.IGPU):
        d = dev_by_type(t)
        if d is not None:
            return d.init_backend()
    from .backends.cpu import backend_cpu_init

    return backend_cpu_init()
