"""The backend registry: which devices exist, in priority order (mirrors ``ggml-backend-reg.cpp``).

Registration order is CUDA devices, then SIM devices, then the CPU, which is always present and
always last (the scheduler's lowest priority). ``GGMLPY_BACKENDS`` (a comma-separated list of
device names, e.g. ``"SIM0,CPU"``) restricts and orders the devices; the CPU device is appended
when the list leaves it out, since the scheduler needs it.

SIM devices (the host-emulated accelerator of ``ggmlpy.backends.sim``) are registered
only on request: ``GGMLPY_SIM_DEVICES=N`` at first use, or :func:`register_sim_devices`. So are
RAY devices (remote Ray actors, ``ggmlpy.backends.ray.runtime``): ``GGMLPY_RAY_DEVICES=N`` and/or
``GGMLPY_RAY_ADDRESS`` at first use (Ray starts then), or :func:`register_ray_devices`; they come
after SIM and before the CPU.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from ggmlpy.backend.interface import Backend, Device, DeviceType, Reg
from ggmlpy.core import env
from ggmlpy.core.check import check_int, check_number, check_optional, check_str, check_type
from ggmlpy.core.errors import BackendUnavailableError

__all__ = ["unknown_backend_names", "reg_count", "reg_get", "reg_by_name", "dev_count", "dev_get", "dev_by_name",
           "dev_by_type", "devices", "backend_init_by_name", "backend_init_by_type",
           "backend_init_best", "register", "register_sim_devices", "register_ray_devices", "unregister",
           "cuda_unavailable_reason", "registered_devices", "excluded_by_backends_env",
           "backends_env_leaves_out", "device_unavailable_reason", "register_named_sim_devices",
           "sim_registered_note"]

_lock = threading.RLock()
_regs: list[Reg] = []
_initialized = False


def _ensure_init() -> None:
    """Register CUDA, ``GGMLPY_SIM_DEVICES`` SIM devices and the CPU, once.

    Every ``GGMLPY_*`` variable is validated first and the regs are built into a local list that
    replaces ``_regs`` only when all succeeded, so a failure (a bad variable, a SIM runtime that
    cannot start) leaves the registry uninitialised and the next call starts over cleanly.
    """
    global _initialized
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        env.validate()  # raises EnvError naming the variable; nothing registered yet
        from ggmlpy.backends.cpu.backend import cpu_reg
        from ggmlpy.backends.cuda.runtime import cuda_reg

        regs = [cuda_reg()]
        n = env.sim_devices()
        if n > 0:
            from ggmlpy.backends.sim import sim_reg

            regs.append(sim_reg(n))
        if env.ray_requested():
            regs.append(_env_ray_reg())
        regs.append(cpu_reg())
        _regs[:] = regs
        _initialized = True


def _env_ray_reg() -> Reg:
    # RAY devices from the environment; a Ray that cannot start leaves an empty reg saying why
    from ggmlpy.backends.ray.runtime import ray_reg

    try:
        return ray_reg()
    except BackendUnavailableError as e:
        return Reg("RAY", [], unavailable_reason=str(e))


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
    if name.upper() == "CPU":
        raise ValueError("the CPU backend cannot be unregistered")
    _ensure_init()
    with _lock:
        _regs[:] = [r for r in _regs if r.name.upper() != name.upper()]


def register_sim_devices(n: int = 1, **options: Any) -> Reg:
    """Register ``n`` host-emulated SIM devices ``SIM0..SIM{n-1}`` (replacing earlier SIM devices).

    ``options`` go to :func:`ggmlpy.backends.sim.sim_reg` (e.g. ``latency_us``,
    ``memory_mb``, ``refuse_ops``). Returns the new reg.

    Raises:
        TypeError: ``n`` is not an int, an option has the wrong type, or an unknown option is
            given. ValueError: ``n`` outside 1..64, ``latency_us`` not finite or < 0,
            ``memory_mb`` not finite or <= 0, or a malformed ``GGMLPY_*`` variable.
    """
    where = "register_sim_devices"
    check_int("n", n, 1, env.MAX_SIM_DEVICES, where)
    unknown = sorted(set(options) - {"latency_us", "memory_mb", "refuse_ops"})
    if unknown:
        raise TypeError(f"{where}: unknown option(s) {', '.join(unknown)}; "
                        "accepted: latency_us, memory_mb, refuse_ops")
    if options.get("latency_us") is not None:
        check_number("latency_us", options["latency_us"], 0.0, where=where)
    if options.get("memory_mb") is not None:
        check_number("memory_mb", options["memory_mb"], 0.0, where=where, lo_open=True)
    if options.get("refuse_ops") is not None:
        from ggmlpy.core.opcodes import Op

        ops = options["refuse_ops"]
        if isinstance(ops, (str, bytes)) or not hasattr(ops, "__iter__"):
            raise TypeError(f"{where}: refuse_ops must be an iterable of Op, got {type(ops).__name__}")
        ops = list(ops)
        for i, op in enumerate(ops):
            check_type(f"refuse_ops[{i}]", op, Op, where)
        options["refuse_ops"] = ops
    _ensure_init()
    from ggmlpy.backends.sim import sim_reg

    reg = sim_reg(n, **options)
    register(reg)
    return reg


def register_ray_devices(n: int | None = None, **options: Any) -> Reg:
    """Register ``n`` remote devices ``RAY0..RAY{n-1}``, one new Ray actor each (replacing earlier
    RAY devices); Ray starts (or joins ``GGMLPY_RAY_ADDRESS``) if it has not yet.

    ``options`` go to :func:`ggmlpy.backends.ray.runtime.ray_reg` (``address``, ``timeout_s``,
    ``refuse_ops``). Returns the new reg.

    Raises:
        TypeError: ``n`` is not an int. ValueError: ``n`` outside 1..1024, a malformed option
            or ``GGMLPY_*`` variable. BackendUnavailableError: Ray is not installed or did not
            start.
    """
    if n is not None:
        check_int("n", n, 1, 1024, "register_ray_devices")
    _ensure_init()
    from ggmlpy.backends.ray.runtime import ray_reg

    reg = ray_reg(n, **options)
    register(reg)
    return reg


def reg_count() -> int:
    """Number of registrations (mirrors ``ggml_backend_reg_count``)."""
    _ensure_init()
    return len(_regs)


def reg_get(i: int) -> Reg:
    """Registration ``i`` (mirrors ``ggml_backend_reg_get``).

    Raises:
        TypeError: ``i`` is not an int (NumPy integers are accepted). IndexError: out of range.
    """
    i = check_int("i", i, where="reg_get")
    _ensure_init()
    if not 0 <= i < len(_regs):
        raise IndexError(f"reg index {i} out of range 0..{len(_regs) - 1}")
    return _regs[i]


def reg_by_name(name: str) -> Reg | None:
    """The registration called ``name`` (case-insensitive) or None (mirrors ``ggml_backend_reg_by_name``).

    Raises:
        TypeError: ``name`` is not a str.
    """
    check_str("name", name, "reg_by_name")
    _ensure_init()
    for r in _regs:
        if r.name.upper() == name.upper():
            return r
    return None


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
    cpu = by_name["CPU"]
    if cpu in out:
        out.remove(cpu)
    out.append(cpu)
    return out


def excluded_by_backends_env(name: str) -> bool:
    """True when a device called ``name`` is registered but ``GGMLPY_BACKENDS`` leaves it out."""
    check_str("name", name, "excluded_by_backends_env")
    known = any(d.name.upper() == name.upper() for d in registered_devices())
    return known and all(d.name.upper() != name.upper() for d in devices())


_ON_DEMAND_RE = re.compile(r"^(SIM|RAY)(\d+)$", re.IGNORECASE)


def backends_env_leaves_out(name: str) -> str | None:
    """Why ``GGMLPY_BACKENDS`` refuses the device called ``name``, as one clause
    (``"GGMLPY_BACKENDS=CPU leaves it out; add it to GGMLPY_BACKENDS or unset the variable"``),
    or None when the variable is unset, lists ``name``, or ``name`` is the CPU (always kept).

    Only names that are or could be devices count: registered ones, and ``SIMn``/``RAYn`` (the
    kinds registered on demand; left out, they would not be usable once registered). Any other
    name is simply not a device (see :func:`device_unavailable_reason`).

    Raises:
        TypeError: ``name`` is not a str. EnvError: a malformed ``GGMLPY_*`` variable.
    """
    check_str("name", name, "backends_env_leaves_out")
    allowed = env.backends()
    up = name.strip().upper()
    if allowed is None or up == "CPU" or up in allowed:
        return None
    if _ON_DEMAND_RE.match(up) is None and all(d.name.upper() != up for d in registered_devices()):
        return None
    return (f"GGMLPY_BACKENDS={','.join(allowed)} leaves it out; add it to GGMLPY_BACKENDS or "
            "unset the variable")


def device_unavailable_reason(name: str) -> str | None:
    """None when a device called ``name`` (case-insensitive) is usable here, else one line
    saying why not and what is available: ``"no device named 'SIM0' (GGMLPY_BACKENDS=CPU leaves
    it out; ...); available: CPU"``. The reason names ``GGMLPY_BACKENDS`` when it leaves the
    device out, why CUDA is unavailable for ``CUDAn``, how SIM/RAY devices are made for those
    names. The message :func:`backend_init_by_name` raises; the command lines print it after
    their flag.

    Raises:
        TypeError: ``name`` is not a str. EnvError: a malformed ``GGMLPY_*`` variable.
    """
    check_str("name", name, "device_unavailable_reason")
    if name.strip() and dev_by_name(name.strip()) is not None:
        return None
    up = name.strip().upper()
    why = ""
    left_out = backends_env_leaves_out(name) if up else None
    m = _ON_DEMAND_RE.match(up)
    if left_out:
        why = f" ({left_out})"
    elif up.startswith("CUDA"):
        why = f" ({cuda_unavailable_reason() or 'no such CUDA device'})"
    elif m and m.group(1) == "SIM":
        n = env.sim_devices()
        why = (f" (SIM devices are numbered SIM0..SIM{env.MAX_SIM_DEVICES - 1})"
               if int(m.group(2)) >= env.MAX_SIM_DEVICES else
               f" (GGMLPY_SIM_DEVICES={n} registers {_sim_range(n)} only)" if n > 0 else
               " (SIM devices need GGMLPY_SIM_DEVICES=N or register_sim_devices())")
    elif m:
        r = reg_by_name("RAY")
        why = (f" ({r.unavailable_reason})" if r is not None and r.unavailable_reason else
               " (RAY devices need GGMLPY_RAY_DEVICES=N or GGMLPY_RAY_ADDRESS, or "
               "register_ray_devices())")
    known = ", ".join(x.name for x in devices())
    return f"no device named {name!r}{why}; available: {known}"


def register_named_sim_devices(names: Sequence[str]) -> int:
    """Register the SIM devices a command line names, once: when ``GGMLPY_SIM_DEVICES`` is unset
    (or 0) and some ``SIMk`` among ``names`` (case-insensitive, blanks stripped) is not a device
    yet, register ``SIM0..SIMk`` for the highest such ``k`` in one
    :func:`register_sim_devices` call. Names that ``GGMLPY_BACKENDS`` leaves out, and indices
    >= 64, are not registered (:func:`device_unavailable_reason` then says why).

    Used by ``embed --device``, ``test-backend-ops -b`` and the benchmark scripts, so each
    registers (and reports it) at most once per call, whatever the number of SIM names.

    Returns:
        The number of SIM devices registered by this call; 0 when none was.

    Raises:
        TypeError: ``names`` is not a sequence of str. EnvError: a malformed ``GGMLPY_*``
            variable.
    """
    from ggmlpy.core.check import check_str_sequence

    names = check_str_sequence("names", names, "register_named_sim_devices")
    if env.sim_devices() != 0:
        return 0
    top = -1
    for name in names:
        m = _ON_DEMAND_RE.match(name.strip())
        if (m is None or m.group(1).upper() != "SIM" or int(m.group(2)) >= env.MAX_SIM_DEVICES
                or backends_env_leaves_out(name) or dev_by_name(name.strip()) is not None):
            continue
        top = max(top, int(m.group(2)))
    if top < 0:
        return 0
    register_sim_devices(top + 1)
    return top + 1


def _sim_range(n: int) -> str:
    return "SIM0" if n == 1 else f"SIM0..SIM{n - 1}"


def sim_registered_note(n: int) -> str:
    """The one line a command line prints after :func:`register_named_sim_devices` registered
    ``n`` (>= 1) devices: ``"registered 2 host-emulated SIM devices SIM0..SIM1 (set
    GGMLPY_SIM_DEVICES=N to do this yourself)"``.

    Raises:
        TypeError: ``n`` is not an int. ValueError: ``n`` < 1.
    """
    check_int("n", n, 1, None, "sim_registered_note")
    return (f"registered {n} host-emulated SIM device{'s' if n > 1 else ''} {_sim_range(n)} "
            "(set GGMLPY_SIM_DEVICES=N to do this yourself)")


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
    devs = devices()
    if not 0 <= i < len(devs):
        raise IndexError(f"device index {i} out of range 0..{len(devs) - 1}")
    return devs[i]


def dev_by_name(name: str) -> Device | None:
    """The device called ``name`` (case-insensitive) or None (mirrors ``ggml_backend_dev_by_name``).

    Raises:
        TypeError: ``name`` is not a str.
    """
    check_str("name", name, "dev_by_name")
    for d in devices():
        if d.name.upper() == name.upper():
            return d
    return None


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


def cuda_unavailable_reason() -> str | None:
    """Why no CUDA device is registered (one line), or None when CUDA devices exist."""
    r = reg_by_name("CUDA")
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
    from ggmlpy.backends.cpu.backend import backend_cpu_init

    return backend_cpu_init()
