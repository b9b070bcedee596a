"""What the models share to run on a :class:`~ggmlpy.sched.scheduler.Scheduler`: device lookup
from ``--device`` strings, the ``n_gpu_layers`` rule, the CPU backend plus the offload devices'
backends (llama.cpp's ``llama_model_load``/``llama_init_from_model`` backend list: devices first,
the CPU last), and one :meth:`SchedModel.close` that frees the scheduler, the weight buffers and
the backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ggmlpy.backend.interface import Backend, Buffer, Device, DeviceType
from ggmlpy.core.check import ArgumentValueError
from ggmlpy.core.errors import BackendUnavailableError

__all__ = ["SchedModel", "check_n_gpu_layers", "cpu_backend", "resolve_device", "resolve_devices"]


def resolve_device(device: str | Device) -> Device:
    """The :class:`~ggmlpy.backend.interface.Device` named ``device`` (case-insensitive), or ``device`` itself.

    Raises:
        BackendUnavailableError: no such device; for CUDA names the message says why CUDA is
            unavailable, for SIM names how to create SIM devices.
        TypeError: ``device`` is neither a name nor a Device.
    """
    from ggmlpy.backend import registry

    if isinstance(device, Device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a device name or a Device, got {type(device).__name__}")
    dev = registry.dev_by_name(device)
    if dev is None:
        registry.backend_init_by_name(device)  # raises BackendUnavailableError with the reason
        raise BackendUnavailableError(f"no device named {device!r}")  # pragma: no cover
    return dev


def resolve_devices(device: str | Device | Sequence[str | Device], where: str) -> list[Device]:
    """The offload devices of ``device``: a name, names joined by commas (``"RAY0,RAY1"``), a
    Device, or a list/tuple of names and Devices; each resolved by :func:`resolve_device`.

    Raises:
        ArgumentValueError (a ValueError) naming ``device`` and ``where``: no device, the CPU
            among several, or a device listed twice.
        BackendUnavailableError, TypeError: as :func:`resolve_device`.
    """
    names = device.split(",") if isinstance(device, str) else (
        list(device) if isinstance(device, (list, tuple)) else [device])
    devs = [resolve_device(d.strip() if isinstance(d, str) else d) for d in names]
    listed = ", ".join(d.name for d in devs)
    if not devs:
        raise ArgumentValueError("device", "must name a device, got none", where)
    if len(devs) > 1 and any(d.type == DeviceType.CPU for d in devs):
        raise ArgumentValueError("device", f"must not list the CPU among several offload "
                                 f"devices (the CPU cannot be one of several: {listed})", where)
    if len({d.name for d in devs}) != len(devs):
        raise ArgumentValueError("device", f"must not list a device twice ({listed})", where)
    return devs


def check_n_gpu_layers(n_gpu_layers: int, n_layer: int, where: str) -> int:
    """``n_gpu_layers`` with -1 (all) replaced by ``n_layer`` (llama.cpp's ``-ngl``).

    Raises:
        ArgumentValueError (a ValueError): outside ``0..n_layer`` and not -1.
    """
    if n_gpu_layers == -1:
        n_gpu_layers = n_layer
    if not 0 <= n_gpu_layers <= n_layer:
        raise ArgumentValueError("n_gpu_layers", f"must be in 0..{n_layer} (or -1 for all) "
                                 f"for this {n_layer}-layer model, got {n_gpu_layers}", where)
    return n_gpu_layers


def cpu_backend(n_threads: int | None) -> Backend:
    """A new CPU backend (``ggml_backend_cpu_init``), with ``n_threads`` threads when given."""
    from ggmlpy.backends.cpu.backend import backend_cpu_init

    cpu = backend_cpu_init()
    if n_threads is not None:
        cpu.set_n_threads(n_threads)
    return cpu


class SchedModel:
    """Base of the models that run their graphs on one scheduler over ``_backends`` (the offload
    devices' backends, highest priority first, then the CPU's), with weights in ``_weight_bufs``.

    A subclass sets these attributes in its constructor and frees its own state (graphs, caches)
    in :meth:`_free_model_state`.
    """

    sched: Any
    _closed: bool
    _backends: list[Backend]
    _device_backends: list[Backend]
    _weight_bufs: list[Buffer]

    def _add_device_backends(self, devs: Sequence[Device]) -> None:
        """Create each device's backend and put it before the CPU's (the last of ``_backends``),
        one by one, so that :meth:`close` frees those made before a failure; sets
        ``_device_backends``. Raises what ``Device.init_backend`` raises."""
        for d in devs:
            self._backends.insert(len(self._backends) - 1, d.init_backend())
        self._device_backends = self._backends[:-1]

    @property
    def devices(self) -> list[str]:
        """Names of the scheduler's backends, highest priority first (e.g. ``["SIM0", "CPU"]``)."""
        return [b.name for b in self._backends]

    def _free_model_state(self) -> None:
        """Free what the subclass holds besides the scheduler, weights and backends (called by
        :meth:`close` once the scheduler is freed)."""

    def close(self) -> None:
        """Free the scheduler, the model's own state, the weight buffers and the backends.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.sched is not None:
                self.sched.free()
        finally:
            self.sched = None
            self._free_model_state()
            for b in self._weight_bufs:
                b.free()
            self._weight_bufs = []
            for be in self._backends:
                be.free()
            self._backends = []
            self._device_backends = []

    def __exit__(self, *exc: object) -> None:
        self.close()
