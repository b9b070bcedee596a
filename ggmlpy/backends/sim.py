"""A host-emulated accelerator ("SIM") implementing :class:`~ggmlpy.backends.device.backend.Runtime`.

It lets the asynchronous device backend, the scheduler's copies and its event logic run (and fail
visibly) on machines without a GPU:

* **Memory** is private: one NumPy ``uint8`` arena per buffer, reported ``is_host`` False, so the
  scheduler must copy host data in exactly as for a GPU. A device can be given a capacity; an
  allocation beyond it raises :class:`~ggmlpy.core.errors.OutOfMemoryError` (requested and free bytes)
  and leaves the device usable.
* **Streams** are daemon worker threads, each draining a FIFO of launched work in order. A stream's
  thread ends when its backend is freed (or garbage-collected).
* **Events** are markers in that FIFO (a ``threading.Event`` set when the worker reaches it).
* **Pinned uploads** (``pinned_direct_upload``, off by default): an async upload from a tensor in
  the pinned host buffer type ``SIM_Host`` reads that host memory when the stream reaches the
  copy, not at enqueue, exactly as the CUDA runtime's DMA from ``CUDA_Host`` does; so the rule
  that such memory is not written before the copy completed (the device backend's host-read
  fences, :func:`ggmlpy.backend.write_gen.host_read_queued`) runs, and fails visibly, in CI.
  Off, such uploads are snapshotted into staging at enqueue (no hazard at all).
* **Latency** can be injected: every launch and every copy (async ones in the worker, blocking ones
  on the caller) first sleeps ``latency_us`` microseconds, so a missing synchronisation becomes a
  wrong result in tests instead of a lucky race.
* A failure in queued work is stored and re-raised as :class:`~ggmlpy.core.errors.ComputeError` (the
  original exception chained) by the next ``synchronize`` of that stream. Work queued after the
  failure and before that synchronize is **skipped** (kernels and copies do not run, so no caller
  array receives data computed from a failed step); event records and waits still run, so no
  event is left unsignalled and no call hangs. SIM failures are not sticky: after the synchronize
  that reported it the stream runs new work normally. ``event_synchronize`` waits but does not
  report failures (a stream's do), and a backend garbage-collected without a synchronize drops its
  stored failure. Recording an event on a freed backend's stream raises
  :class:`~ggmlpy.core.errors.BackendUnavailableError` and leaves the event as it was.

Kernels are the NumPy ones of :mod:`ggmlpy.backends.kernels`, so SIM results are bit-identical to
the CPU backend's. Devices are ``SIM0..SIM{n-1}``, of type ACCEL (``backend_init_best`` never picks
them). Environment: ``GGMLPY_SIM_LATENCY_US`` (default 0), ``GGMLPY_SIM_MEMORY_MB`` (default:
the host's physical memory) and ``GGMLPY_SIM_PINNED_DIRECT`` (0 or 1, default 0), read by
:func:`sim_reg` when its arguments are None.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ggmlpy.backend.interface import DeviceType, Reg
from ggmlpy.backend.registry import BackendFactory
from ggmlpy.backends.cpu.backend import MEMORY_ALIGNMENT, host_array
from ggmlpy.backends.device.backend import DeviceInfo, DeviceMemory, Runtime, make_reg
from ggmlpy.core import env
from ggmlpy.core.check import check_int, check_number, check_str_sequence, check_type
from ggmlpy.core.errors import BackendUnavailableError, ComputeError, OutOfMemoryError
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor

__all__ = ["SimRuntime", "sim_reg", "ENV_LATENCY", "ENV_MEMORY", "ENV_PINNED_DIRECT"]

ENV_LATENCY = "GGMLPY_SIM_LATENCY_US"
ENV_MEMORY = "GGMLPY_SIM_MEMORY_MB"
ENV_PINNED_DIRECT = "GGMLPY_SIM_PINNED_DIRECT"


def _aligned(size: int) -> np.ndarray:
    raw = np.empty(size + MEMORY_ALIGNMENT, dtype=np.uint8)
    shift = (-raw.ctypes.data) % MEMORY_ALIGNMENT
    return raw[shift:shift + size]


class _SimMemory(DeviceMemory):
    __slots__ = ("data",)

    def __init__(self, dev: int, data: np.ndarray) -> None:
        super().__init__(dev, data.size)
        self.data = data


class _SimStream:
    """A worker thread running submitted callables in order; counts submitted/finished work."""

    def __init__(self, name: str, latency_s: float) -> None:
        self.name = name
        self.latency_s = latency_s
        self._q: queue.SimpleQueue[tuple[Callable[[], Any], float, bool] | None] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._submitted = 0
        self._done = 0
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=f"ggmlpy-{name}-stream", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        q, cv = self._q, self._cv
        while True:
            item = q.get()
            if item is None:
                return
            fn, delay, always = item
            try:
                if self._error is not None and not always:
                    continue  # a failed step poisons the work queued behind it until reported
                if delay:
                    time.sleep(delay)
                fn()
            except BaseException as e:  # noqa: BLE001 - stored, re-raised by synchronize
                with cv:
                    if self._error is None:
                        self._error = e
            finally:
                del fn, item
                with cv:
                    self._done += 1
                    cv.notify_all()

    def submit(self, fn: Callable[[], Any], delay: float, always: bool = False) -> None:
        """Queue ``fn`` (after ``delay`` seconds); ``always``: run it even after a failure
        (event signals and waits).

        Raises:
            BackendUnavailableError: the stream was closed (its backend freed); nothing is queued.
        """
        with self._cv:
            if self._closed:
                raise BackendUnavailableError(f"the stream of {self.name} was freed (its backend "
                                              "was freed); create a new backend")
            self._submitted += 1
        self._q.put((fn, delay, always))

    def synchronize(self, check: bool) -> None:
        with self._cv:
            target = self._submitted
            self._cv.wait_for(lambda: self._done >= target)
            err = self._error
            if check and err is not None:
                self._error = None
        if check and err is not None:
            raise ComputeError(f"{self.name}: queued work failed: {type(err).__name__}: {err}") from err

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
        self._q.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()


class _SimEvent:
    """An event: ``flag`` is the ``threading.Event`` of its last record (None: never recorded)."""

    __slots__ = ("dev", "flag")

    def __init__(self, dev: int) -> None:
        self.dev = dev
        self.flag: threading.Event | None = None


class _SimGraph:
    """A captured plan on SIM: the steps, replayed in order with NumPy's warnings off."""

    __slots__ = ("steps",)

    def __init__(self, steps: tuple[Callable[[], Any], ...]) -> None:
        self.steps = steps

    def run(self) -> None:
        with np.errstate(all="ignore"):
            for step in self.steps:
                step()


class SimRuntime(Runtime):
    """The host-emulated runtime behind SIM devices (see the module docstring).

    Args:
        n_devices: number of devices.
        latency_us: sleep before each launch and each copy, microseconds (>= 0).
        memory_bytes: capacity of each device in bytes, or None for the host's physical memory.
        pinned_direct_upload: upload from ``SIM_Host`` tensors straight from their memory in
            stream order, as the CUDA runtime does (:attr:`Runtime.pinned_direct_upload`).

    Raises:
        ValueError: negative ``latency_us``, ``n_devices < 1`` or ``memory_bytes < 0``.
    """

    name = "SIM"
    xp = np
    alignment = 128
    guid = uuid.UUID("7a1c0e52-3d4b-4f7e-8c21-5b9d0a6e4f13")

    def __init__(self, n_devices: int, latency_us: float = 0.0, memory_bytes: int | None = None,
                 pinned_direct_upload: bool = False) -> None:
        if n_devices < 1:
            raise ValueError(f"SimRuntime: n_devices must be >= 1, got {n_devices}")
        if latency_us < 0:
            raise ValueError(f"SimRuntime: latency_us must be >= 0, got {latency_us}")
        if memory_bytes is None:
            memory_bytes = _host_memory_bytes()
        if memory_bytes < 0:
            raise ValueError(f"SimRuntime: memory must be >= 0 bytes, got {memory_bytes}")
        self.n_devices = int(n_devices)
        self.latency_s = float(latency_us) * 1e-6
        self.capacity = int(memory_bytes)
        self.pinned_direct_upload = bool(pinned_direct_upload)
        self._used = [0] * self.n_devices
        self._lock = threading.Lock()

    # devices ------------------------------------------------------------------------------------
    def device_count(self) -> int:
        return self.n_devices

    def device_info(self, dev: int) -> DeviceInfo:
        lat = f", {self.latency_s * 1e6:g} us latency" if self.latency_s else ""
        return DeviceInfo(description=f"host-emulated accelerator (NumPy {np.__version__}{lat})",
                          type=DeviceType.ACCEL, device_id=None,
                          extra={"latency_us": self.latency_s * 1e6, "emulated": True})

    def mem_info(self, dev: int) -> tuple[int, int]:
        with self._lock:
            return self.capacity - self._used[dev], self.capacity

    # memory -------------------------------------------------------------------------------------
    def malloc(self, dev: int, size: int) -> DeviceMemory:
        with self._lock:
            free = self.capacity - self._used[dev]
            if size > free:
                raise OutOfMemoryError(f"SIM{dev}", size, free,
                                       f"capacity {self.capacity} bytes ({ENV_MEMORY})")
            self._used[dev] += size
        try:
            data = _aligned(size)
        except MemoryError:
            with self._lock:
                self._used[dev] -= size
                free = self.capacity - self._used[dev]
            raise OutOfMemoryError(f"SIM{dev}", size, free, "host allocation failed") from None
        return _SimMemory(dev, data)

    def free(self, mem: DeviceMemory) -> None:
        with self._lock:
            self._used[mem.dev] -= mem.size
        mem.data = np.empty(0, np.uint8)

    def array(self, mem: DeviceMemory, tensor: Tensor) -> np.ndarray:
        return host_array(mem.data, tensor)  # type: ignore[attr-defined]

    def _delay(self) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)

    def memcpy_htod(self, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        self._delay()
        mem.data[offset:offset + src.size] = src  # type: ignore[attr-defined]

    def memcpy_dtoh(self, mem: DeviceMemory, offset: int, size: int) -> np.ndarray:
        self._delay()
        return mem.data[offset:offset + size].copy()  # type: ignore[attr-defined]

    def memcpy_dtod(self, dst: DeviceMemory, dst_offset: int, src: DeviceMemory, src_offset: int,
                    size: int) -> None:
        self._delay()
        dst.data[dst_offset:dst_offset + size] = src.data[src_offset:src_offset + size]  # type: ignore[attr-defined]

    def memset(self, mem: DeviceMemory, offset: int, size: int, value: int) -> None:
        self._delay()
        mem.data[offset:offset + size] = value  # type: ignore[attr-defined]

    def alloc_pinned(self, size: int) -> np.ndarray:
        try:
            return _aligned(size)
        except MemoryError:
            raise OutOfMemoryError("SIM_Host", size, None) from None

    # streams ------------------------------------------------------------------------------------
    def stream_new(self, dev: int, name: str) -> _SimStream:
        return _SimStream(name, self.latency_s)

    def stream_free(self, stream: Any) -> None:
        stream.close()

    def stream_synchronize(self, stream: Any, check: bool = True) -> None:
        stream.synchronize(check)

    def launch(self, stream: Any, fn: Callable[[], Any]) -> None:
        stream.submit(fn, self.latency_s)

    # graphs: a recorded launch list (the logic of CUDA graph replay, testable without a GPU)
    supports_graphs = True

    def graph_capture(self, stream: Any, steps: list[Any]) -> Any:
        """The launch list ``tuple(steps)``, run by :meth:`graph_launch` as one unit of stream
        work; nothing runs here (as in CUDA stream capture)."""
        return _SimGraph(tuple(steps))

    def graph_launch(self, stream: Any, graph: Any) -> None:
        stream.submit(graph.run, self.latency_s)

    def memcpy_htod_async(self, stream: Any, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        data = mem.data  # type: ignore[attr-defined]
        n = src.size

        def copy() -> None:  # holds ``src`` (the staging) until the worker has run it
            data[offset:offset + n] = src

        stream.submit(copy, self.latency_s)

    def memcpy_dtoh_async(self, stream: Any, out: np.ndarray, mem: DeviceMemory, offset: int) -> None:
        data = mem.data  # type: ignore[attr-defined]
        n = out.size

        def copy() -> None:
            out[:] = data[offset:offset + n]

        stream.submit(copy, self.latency_s)

    def memcpy_dtod_async(self, stream: Any, dst: DeviceMemory, dst_offset: int, src: DeviceMemory,
                          src_offset: int, size: int) -> None:
        d, s = dst.data, src.data  # type: ignore[attr-defined]

        def copy() -> None:
            d[dst_offset:dst_offset + size] = s[src_offset:src_offset + size]

        stream.submit(copy, self.latency_s)

    # events -------------------------------------------------------------------------------------
    def event_new(self, dev: int) -> _SimEvent:
        return _SimEvent(dev)

    def event_record(self, event: Any, stream: Any) -> None:
        flag = threading.Event()
        stream.submit(flag.set, 0.0, always=True)  # raises on a closed stream: event unchanged
        event.flag = flag

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        flag = event.flag
        if flag is not None and not flag.is_set():
            stream.submit(flag.wait, 0.0, always=True)

    def event_synchronize(self, event: Any) -> None:
        flag = event.flag
        if flag is not None:
            flag.wait()

    def event_query(self, event: Any) -> bool:
        flag = event.flag
        return flag is None or flag.is_set()


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30



def sim_reg(n: int, latency_us: float | None = None, memory_mb: float | None = None,
            refuse_ops: Iterable[Op] | None = None, pinned_direct_upload: bool | None = None) -> Reg:
    """A new registration "SIM" with ``n`` host-emulated devices ``SIM0..SIM{n-1}`` (one new
    :class:`SimRuntime`; devices of different calls never share memory, streams or events).

    Args:
        n: number of devices (>= 1).
        latency_us: delay per launch and per copy in microseconds; None reads
            ``GGMLPY_SIM_LATENCY_US`` (default 0).
        memory_mb: capacity of each device in MiB; None reads ``GGMLPY_SIM_MEMORY_MB`` (default:
            the host's physical memory).
        refuse_ops: ops the devices report unsupported (forces CPU fallback in tests).
        pinned_direct_upload: async uploads from ``SIM_Host`` tensors read that memory when the
            stream reaches them, as on CUDA (see :class:`SimRuntime`); None reads
            ``GGMLPY_SIM_PINNED_DIRECT`` (default off).

    Raises:
        ValueError: ``n < 1``, negative options, or a malformed environment variable.
    """
    if latency_us is None:
        latency_us = env.sim_latency_us() or 0.0
    if memory_mb is None:
        memory_mb = env.sim_memory_mb()
    if pinned_direct_upload is None:
        pinned_direct_upload = env.sim_pinned_direct()
    mem_bytes = None if memory_mb is None else int(float(memory_mb) * (1 << 20))
    runtime = SimRuntime(n, latency_us=latency_us, memory_bytes=mem_bytes,
                         pinned_direct_upload=pinned_direct_upload)
    return make_reg(runtime, refuse_ops=refuse_ops)


def register_sim_devices(n: int = 1, **options: Any) -> Reg:
    """Register ``n`` host-emulated SIM devices ``SIM0..SIM{n-1}`` (replacing earlier SIM devices).

    ``options`` go to :func:`sim_reg` (``latency_us``, ``memory_mb``, ``refuse_ops``). Returns
    the new reg.

    Raises:
        TypeError: ``n`` is not an int, an option has the wrong type, or an unknown option is
            given. ValueError: ``n`` outside 1..64, ``latency_us`` not finite or < 0,
            ``memory_mb`` not finite or <= 0, or a malformed ``GGMLPY_*`` variable.
    """
    from ggmlpy.backend import registry

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
        ops = options["refuse_ops"]
        if isinstance(ops, (str, bytes)) or not hasattr(ops, "__iter__"):
            raise TypeError(f"{where}: refuse_ops must be an iterable of Op, got {type(ops).__name__}")
        ops = list(ops)
        for i, op in enumerate(ops):
            check_type(f"refuse_ops[{i}]", op, Op, where)
        options["refuse_ops"] = ops
    registry.reg_count()  # the registry starts up (and validates the environment) first
    reg = sim_reg(n, **options)
    registry.register(reg)
    return reg


_SIM_NAME_RE = re.compile(r"^SIM(\d+)$", re.IGNORECASE)


def register_named_sim_devices(names: Sequence[str]) -> int:
    """Register the SIM devices a command line names, once: when ``GGMLPY_SIM_DEVICES`` is unset
    (or 0) and some ``SIMk`` among ``names`` (case-insensitive, blanks stripped) is not a device
    yet, register ``SIM0..SIMk`` for the highest such ``k`` in one
    :func:`register_sim_devices` call. Names that ``GGMLPY_BACKENDS`` leaves out, and indices
    >= 64, are not registered
    (:func:`~ggmlpy.backend.registry.device_unavailable_reason` then says why).

    Used by ``embed --device``, ``test-backend-ops -b`` and the benchmark scripts, so each
    registers (and reports it) at most once per call, whatever the number of SIM names.

    Returns:
        The number of SIM devices registered by this call; 0 when none was.

    Raises:
        TypeError: ``names`` is not a sequence of str. EnvError: a malformed ``GGMLPY_*``
            variable.
    """
    from ggmlpy.backend import registry

    names = check_str_sequence("names", names, "register_named_sim_devices")
    if env.sim_devices() != 0:
        return 0
    top = -1
    for name in names:
        m = _SIM_NAME_RE.match(name.strip())
        if (m is None or int(m.group(1)) >= env.MAX_SIM_DEVICES
                or registry.backends_env_leaves_out(name)
                or registry.dev_by_name(name.strip()) is not None):
            continue
        top = max(top, int(m.group(1)))
    if top < 0:
        return 0
    register_sim_devices(top + 1)
    return top + 1


def sim_range(n: int) -> str:
    """``"SIM0"`` for one device, else ``"SIM0..SIM{n-1}"``."""
    return "SIM0" if n == 1 else f"SIM0..SIM{n - 1}"


def _env_reg() -> Reg | None:
    n = env.sim_devices()
    return sim_reg(n) if n > 0 else None


def _unavailable(name: str) -> str:
    m = _SIM_NAME_RE.match(name)
    n = env.sim_devices()
    if m and int(m.group(1)) >= env.MAX_SIM_DEVICES:
        return f"SIM devices are numbered SIM0..SIM{env.MAX_SIM_DEVICES - 1}"
    if n > 0:
        return f"GGMLPY_SIM_DEVICES={n} registers {sim_range(n)} only"
    return "SIM devices need GGMLPY_SIM_DEVICES=N or register_sim_devices()"


#: the registry's entry for SIM (installed by :func:`ggmlpy.backends.install`)
FACTORY = BackendFactory("SIM", 20, _env_reg, unavailable_reason=_unavailable, on_demand=True)
