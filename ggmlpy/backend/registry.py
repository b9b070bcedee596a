"""The backend registry: which devices exist, in priority order (mirrors ``ggml-backend-reg.cpp``).

The registry is a table of backend factories (:class:`BackendFactory`) and imports no backend.
At first use it validates every ``GGMLPY_*`` variable and calls each factory's ``make_reg`` in
priority order (lowest first); a factory returns its :class:`~ggmlpy.backend.interface.Reg`, or
None when the environment does not ask for it (SIM without ``GGMLPY_SIM_DEVICES``). The CPU reg
is always present and always last (the scheduler's lowest priority).

The built-in table is installed in one place, :func:`ggmlpy.backends.install` (run by ``import
ggmlpy``): CUDA (priority 10), SIM (20), RAY (30), CPU (100). Adding a backend is one package
under ``ggmlpy/backends/`` that defines its ``Reg`` and a :class:`BackendFactory`, plus one entry
in that table (``register_factory``); nothing here changes.

``GGMLPY_BACKENDS`` (a comma-separated list of device names, e.g. ``"SIM0,CPU"``) restricts and
orders the devices; the CPU device is appended when the list leaves it out, since the scheduler
needs it. :func:`reset` forgets the registered regs so that the next call starts over from the
table (tests use it through the ``fresh_registry`` fixture).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ggmlpy.backend.interface import Backend, Device, DeviceType, Reg
from ggmlpy.core import env
from ggmlpy.core.check import check_int, check_optional, check_str, check_type
from ggmlpy.core.errors import BackendUnavailableError

__all__ = ["BackendFactory", "register_factory", "unregister_factory", "factories", "reset", "initialized", "unknown_backend_names",
           "reg_count", "reg_get", "reg_by_name", "dev_count", "dev_get", "dev_by_name",
           "dev_by_type", "devices", "backend_init_by_name", "backend_init_by_type",
           "backend_init_best", "register", "unregister", "reg_unavailable_reason",
           "registered_devices", "excluded_by_backends_env", "backends_env_leaves_out",
           "device_unavailable_reason", "CPU"]

#: the name of the reg that is always present and always last
CPU = "CPU"


def _no_reason(name: str) -> str | None:
    return None


@dataclass(frozen=True)
class BackendFactory:
    """One backend in the registry's table (JAX's backend-factory pattern).

    Attributes:
        name: the reg's name, also the prefix of its device names (``"CUDA"`` -> ``CUDA0``).
        priority: registration order, lowest first (CPU: 100, always last).
        make_reg: ``() -> Reg | None``, called once at the registry's first use (and again after
            :func:`reset`); None when the environment does not ask for this backend. It may
            return a reg with no devices whose ``unavailable_reason`` says why.
        unavailable_reason: ``(name) -> str | None``: why no device called ``name`` (upper-case,
            of this factory's prefix) exists, as one clause; None when there is nothing to add.
        on_demand: devices are registered on request (SIM, RAY), so a name like ``SIM3`` may
            become a device later; ``GGMLPY_BACKENDS`` leaving it out is then worth saying.
    """

    name: str
    priority: int
    make_reg: Callable[[], Reg | None]
    unavailable_reason: Callable[[str], str | None] = _no_reason
    on_demand: bool = False


_lock = threading.RLock()
_factories: dict[str, BackendFactory] = {}
_regs: list[Reg] = []
_initialized = False


def register_factory(factory: BackendFactory) -> None:
    """Add ``factory`` to the table (replacing one of the same name); takes effect at the next
    start-up (the first use, or after :func:`reset`).

    Raises:
        TypeError: ``factory`` is not a :class:`BackendFactory`.
    """
    check_type("factory", factory, BackendFactory, "register_factory")
    with _lock:
        _factories[factory.name.upper()] = factory


def unregister_factory(name: str) -> None:
    """Remove the factory called ``name`` (case-insensitive) from the table, if there; takes
    effect at the next start-up. The CPU's cannot be removed.

    Raises:
        TypeError: ``name`` is not a str. ValueError: ``name`` is "CPU".
    """
    check_str("name", name, "unregister_factory")
    if name.upper() == CPU:
        raise ValueError("the CPU backend's factory cannot be removed")
    with _lock:
        _factories.pop(name.upper(), None)


def factories() -> list[BackendFactory]:
    """The table, in priority order."""
    with _lock:
        return sorted(_factories.values(), key=lambda f: f.priority)


def reset(regs: Sequence[Reg] | None = None) -> None:
    """Start the registry over. Without ``regs``: forget every registered reg (the table stays),
    so the next call validates the environment and builds the regs again from the factories;
    regs added with :func:`register` are dropped. With ``regs`` (a list saved from
    :func:`reg_get`, CPU last): the registry holds exactly those, already started. Devices and
    backends already handed out stay usable either way.

    Raises:
        TypeError: ``regs`` is not a sequence of :class:`~ggmlpy.backend.interface.Reg`.
        ValueError: ``regs`` does not end with the CPU reg.
    """
    global _initialized
    if regs is not None:
        regs = list(regs)
        for i, r in enumerate(regs):
            check_type(f"regs[{i}]", r, Reg, "reset")
        if not regs or regs[-1].name.upper() != CPU:
            raise ValueError("reset: regs must end with the CPU reg")
    with _lock:
        _regs[:] = regs or []
        _initialized = regs is not None


def initialized() -> bool:
    """Whether the registry has started up (its first use succeeded, no :func:`reset` since)."""
    return _initialized


def _ensure_init() -> None:
    """Build the regs from the table, once.

    Every ``GGMLPY_*`` variable is validated first and the regs are built into a local list that
    replaces ``_regs`` only when all succeeded, so a failure (a bad variable, a runtime that
    cannot start) leaves the registry uninitialised and the next call starts over cleanly.
    """
    global _initialized
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        env.validate()  # raises EnvError naming the variable; nothing registered yet
        regs = [r for r in (f.make_reg() for f in factories()) if r is not None]
        if not regs or regs[-1].name.upper() != CPU:
            raise RuntimeError("the backend table has no CPU factory of the highest priority "
                               "(ggmlpy.backends.install registers it)")
        _regs[:] = regs
        _initialized = True


def _device_type(value: object, where: str) -> DeviceType:
    """``value`` as a DeviceType (a DeviceType or its int id); TypeError/ValueError naming ``type``."""
    if isinstance(value, DeviceType):
        return value
    check_type("type", value, (DeviceType, int), where)
    try:
        return DeviceType(value)
    except ValueError:
        raise ValueError(f"{where}: type must be a DeviceType "
                         f"({', '.join(t.name for t in DeviceType)}), got {value!r}") from None


def register(reg: Reg) -> None:
    """Register ``reg`` and its devices ahead of the CPU (mirrors ``ggml_backend_register``).

    A reg already registered (same object, or same name) is replaced by the new one.

    Raises:
        TypeError: ``reg`` is not a :class:`~ggmlpy.backend.interface.Reg`.
    """
    check_type("reg", reg, Reg, "register")
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
        TypeError: ``name`` is not a str. ValueError: ``name`` is "CPU".
    """
    check_str("name", name, "unregister")
    if name.upper() == CPU:
        raise ValueError("the CPU backend cannot be unregistered")
    _ensure_init()
    with _lock:
        _regs[:] = [r for r in _regs if r.name.upper() != name.upper()]


def reg_count() -> int:
    """Number of registrations (mirrors ``ggml_backend_reg_count``)."""
    _ensure_init()
    return len(_regs)


_Named = TypeVar("_Named", Reg, Device)


def _at_index(items: list[_Named], i: int, what: str) -> _Named:
    """``items[i]`` for ``0 <= i < len(items)``; IndexError naming ``what`` otherwise."""
    if not 0 <= i < len(items):
        raise IndexError(f"{what} index {i} out of range 0..{len(items) - 1}")
    return items[i]


def _by_name(items: list[_Named], name: str) -> _Named | None:
    """The first of ``items`` whose ``name`` equals ``name`` ignoring case, or None."""
    for x in items:
        if x.name.upper() == name.upper():
            return x
    return None


def reg_get(i: int) -> Reg:
    """Registration ``i`` (mirrors ``ggml_backend_reg_get``).

    Raises:
        TypeError: ``i`` is not an int (NumPy integers are accepted). IndexError: out of range.
    """
    i = check_int("i", i, where="reg_get")
    _ensure_init()
    return _at_index(_regs, i, "reg")


def reg_by_name(name: str) -> Reg | None:
    """The registration called ``name`` (case-insensitive) or None (mirrors ``ggml_backend_reg_by_name``).

    Raises:
        TypeError: ``name`` is not a str.
    """
    check_str("name", name, "reg_by_name")
    _ensure_init()
    return _by_name(_regs, name)


def registered_devices() -> list[Device]:
    """Every registered device in registration order, ignoring ``GGMLPY_BACKENDS``."""
    _ensure_init()
    with _lock:
        return [d for r in _regs for d in r.devices]


def devices() -> list[Device]:
    """Every device in priority order, after ``GGMLPY_BACKENDS`` filtering (CPU last).

    Raises:
        EnvError: a malformed ``GGMLPY_*`` variable (a ``ValueError`` naming it).
    """
    devs = registered_devices()
    spec = env.backends()
    if spec is None:
        return devs
    by_name = {d.name.upper(): d for d in devs}
    out: list[Device] = []
    for name in spec:
        d = by_name.get(name)
        if d is not None and d not in out:
            out.append(d)
    cpu = by_name[CPU]
    if cpu in out:
        out.remove(cpu)
    out.append(cpu)
    return out


def excluded_by_backends_env(name: str) -> bool:
    """True when a device called ``name`` is registered but ``GGMLPY_BACKENDS`` leaves it out."""
    check_str("name", name, "excluded_by_backends_env")
    known = any(d.name.upper() == name.upper() for d in registered_devices())
    return known and all(d.name.upper() != name.upper() for d in devices())


_NUMBERED_RE = re.compile(r"^([A-Z_]+?)(\d+)$")


def _factory_of(name: str) -> BackendFactory | None:
    """The factory whose device names look like ``name`` (``"SIM3"`` -> SIM's), or None."""
    m = _NUMBERED_RE.match(name.strip().upper())
    if m is None:
        return None
    with _lock:
        return _factories.get(m.group(1))


def backends_env_leaves_out(name: str) -> str | None:
    """Why ``GGMLPY_BACKENDS`` refuses the device called ``name``, as one clause
    (``"GGMLPY_BACKENDS=CPU leaves it out; add it to GGMLPY_BACKENDS or unset the variable"``),
    or None when the variable is unset, lists ``name``, or ``name`` is the CPU (always kept).

    Only names that are or could be devices count: registered ones, and the numbered names of
    backends registered on demand (``BackendFactory.on_demand``: ``SIMn``, ``RAYn``; left out,
    they would not be usable once registered). Any other name is simply not a device (see
    :func:`device_unavailable_reason`).

    Raises:
        TypeError: ``name`` is not a str. EnvError: a malformed ``GGMLPY_*`` variable.
    """
    check_str("name", name, "backends_env_leaves_out")
    allowed = env.backends()
    up = name.strip().upper()
    if allowed is None or up == CPU or up in allowed:
        return None
    f = _factory_of(up)
    if (f is None or not f.on_demand) and all(d.name.upper() != up for d in registered_devices()):
        return None
    return (f"GGMLPY_BACKENDS={','.join(allowed)} leaves it out; add it to GGMLPY_BACKENDS or "
            "unset the variable")


def device_unavailable_reason(name: str) -> str | None:
    """None when a device called ``name`` (case-insensitive) is usable here, else one line
    saying why not and what is available: ``"no device named 'SIM0' (GGMLPY_BACKENDS=CPU leaves
    it out; ...); available: CPU"``. The reason names ``GGMLPY_BACKENDS`` when it leaves the
    device out, else it is the clause of the backend's factory
    (:attr:`BackendFactory.unavailable_reason`: why CUDA is unavailable for ``CUDAn``, how SIM
    and RAY devices are made). The message :func:`backend_init_by_name` raises; the command
    lines print it after their flag.

    Raises:
        TypeError: ``name`` is not a str. EnvError: a malformed ``GGMLPY_*`` variable.
    """
    check_str("name", name, "device_unavailable_reason")
    if name.strip() and dev_by_name(name.strip()) is not None:
        return None
    up = name.strip().upper()
    clause = backends_env_leaves_out(name) if up else None
    if clause is None and up:
        f = _factory_of(up)
        clause = f.unavailable_reason(up) if f is not None else None
    why = f" ({clause})" if clause else ""
    known = ", ".join(x.name for x in devices())
    return f"no device named {name!r}{why}; available: {known}"


def unknown_backend_names() -> list[str]:
    """Names in ``GGMLPY_BACKENDS`` that match no registered device (they are ignored)."""
    known = {d.name.upper() for d in registered_devices()}
    return [n for n in (env.backends() or []) if n not in known]


def dev_count() -> int:
    """Number of devices (mirrors ``ggml_backend_dev_count``)."""
    return len(devices())


def dev_get(i: int) -> Device:
    """Device ``i`` in priority order (mirrors ``ggml_backend_dev_get``).

    Raises:
        TypeError: ``i`` is not an int (NumPy integers are accepted). IndexError: out of range.
    """
    i = check_int("i", i, where="dev_get")
    return _at_index(devices(), i, "device")


def dev_by_name(name: str) -> Device | None:
    """The device called ``name`` (case-insensitive) or None (mirrors ``ggml_backend_dev_by_name``).

    Raises:
        TypeError: ``name`` is not a str.
    """
    check_str("name", name, "dev_by_name")
    return _by_name(devices(), name)


def dev_by_type(type: DeviceType) -> Device | None:
    """The first device of ``type`` in priority order, or None (mirrors ``ggml_backend_dev_by_type``).

    SIM devices report type ACCEL, so ``dev_by_type(GPU)`` only finds real GPUs.

    Raises:
        TypeError: ``type`` is not a :class:`~ggmlpy.backend.interface.DeviceType`.
    """
    type = _device_type(type, "dev_by_type")
    for d in devices():
        if d.type == type:
            return d
    return None


def reg_unavailable_reason(name: str) -> str | None:
    """Why the reg called ``name`` (case-insensitive) has no devices (one line), or None when
    it has devices or is not registered (``registry.reg_unavailable_reason("CUDA")``).

    Raises:
        TypeError: ``name`` is not a str.
    """
    r = reg_by_name(name)
    if r is None or r.devices:
        return None
    return r.unavailable_reason


def backend_init_by_name(name: str, params: str | None = None) -> Backend:
    """A backend on the device called ``name`` (mirrors ``ggml_backend_init_by_name``).

    Raises:
        BackendUnavailableError: no such device, with :func:`device_unavailable_reason`'s
            message (a device left out by ``GGMLPY_BACKENDS`` names the variable; a CUDA name
            says why CUDA is unavailable here).
        TypeError: ``name`` is not a str, ``params`` neither None nor a str.
    """
    where = "backend_init_by_name"
    check_str("name", name, where)
    check_optional("params", params, str, where)
    d = dev_by_name(name)
    if d is None:
        raise BackendUnavailableError(device_unavailable_reason(name) or f"no device named {name!r}")
    return d.init_backend(params)


def backend_init_by_type(type: DeviceType, params: str | None = None) -> Backend:
    """A backend on the first device of ``type`` (mirrors ``ggml_backend_init_by_type``).

    Raises:
        BackendUnavailableError: no device of that type.
        TypeError: ``type`` is not a DeviceType, ``params`` neither None nor a str.
    """
    type = _device_type(type, "backend_init_by_type")
    check_optional("params", params, str, "backend_init_by_type")
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
    return devices()[-1].init_backend()  # the CPU, always last
