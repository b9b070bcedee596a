"""Remote devices on Ray: a :class:`~ggmlpy.backends.device.backend.Runtime` whose devices are Ray actors.

Devices ``RAY0..RAY{n-1}`` are one :class:`~ggmlpy.backends.ray.actor.DeviceActor` each, on any
node of a Ray cluster (or of a local instance). The device backend, the scheduler and the
allocator are unchanged: only this runtime and a backend subclass know that memory is remote.

* **Memory**: a buffer is an arena inside the actor, named by an integer handle; a tensor is
  ``(handle, offset)``. Data crosses as ``uint8`` NumPy arrays through Ray's object store.
* **Stream**: the actor's ordered task queue (every stream of one device shares it, which only
  orders more than required). **Event**: the reference of the last task queued on the device
  when it was recorded; another device waits for it with a no-op task that depends on it.
* **Graph compute** ships a :class:`~ggmlpy.backends.ray.graph_spec.GraphSpec`; the driver caches it
  per graph and allocation (the backend's plan cache) and remembers which hashes each actor has
  compiled, so an unchanged split is one message ``compute(stream, hash)``.
* **Copies** between two RAY devices go actor to actor: the source queues a read whose result
  the destination's write takes as an argument; the bytes never pass through the driver.
* **Faults**: every wait is bounded (``GGMLPY_RAY_TIMEOUT_S``, default 120 s). A dead actor
  (process killed, node lost) raises :class:`~ggmlpy.core.errors.BackendUnavailableError` from the
  first call that waits on it and from every later call at once; its buffers are reported lost
  (:meth:`RayDevice.lost_buffers`), freeing them is a no-op, and a scheduler built without the
  device works. A failure inside queued work is a :class:`~ggmlpy.core.errors.ComputeError` at the
  next synchronize, as on SIM and CUDA.

Ray is started on first use by :func:`ray_reg` (``pip install ggmlpy[ray]``): joining
``GGMLPY_RAY_ADDRESS`` (``auto`` or ``HOST:PORT``) when set, else a local instance that listens
on loopback only, without dashboard, with ``GGMLPY_RAY_DEVICES`` actors.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ggmlpy.backend.interface import Backend, Buffer, DeviceProps, DeviceType, Reg, Status, tensor_buffer
from ggmlpy.backend.registry import BackendFactory
from ggmlpy.backends.device.backend import (
    AsyncBackend,
    AsyncBuffer,
    AsyncBufferType,
    AsyncDevice,
    DeviceInfo,
    DeviceMemory,
    Runtime,
    reads_foreign_device_memory,
)
from ggmlpy.backends.plan import check_buffers_live
from ggmlpy.backends.ray.actor import PLAN_CACHE_SIZE, DeviceActor
from ggmlpy.backends.ray.env import DEFAULT_TIMEOUT_S, RayEnv, ray_env
from ggmlpy.backends.ray.graph_spec import GraphSpec, encode_graph
from ggmlpy.core.check import check_int
from ggmlpy.core.errors import (
    BackendUnavailableError,
    ComputeError,
    NotAllocatedError,
    OutOfMemoryError,
    UnsupportedOpError,
)
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Tensor

__all__ = ["RayRuntime", "RayDevice", "RayBackend", "ray_reg", "start_ray", "DEFAULT_TIMEOUT_S"]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise BackendUnavailableError(f"RAY devices need Ray: pip install 'ggmlpy[ray]' ({e})") from None
    return ray


# ---------------------------------------------------------------------------------------------
# handles


class _RayMemory(DeviceMemory):
    __slots__ = ("handle",)

    def __init__(self, dev: int, size: int, handle: int) -> None:
        super().__init__(dev, size)
        self.handle = handle


class _Stream:
    __slots__ = ("dev", "id", "name", "closed")

    def __init__(self, dev: int, sid: int, name: str) -> None:
        self.dev, self.id, self.name, self.closed = dev, sid, name, False


class _Read:
    """An async read: the ref of the actor's answer and the host array it is copied into."""

    __slots__ = ("ref", "out", "stream", "done")

    def __init__(self, ref: Any, out: np.ndarray, stream: int) -> None:
        self.ref, self.out, self.stream, self.done = ref, out, stream, False


class _Event:
    __slots__ = ("dev", "ref", "reads")

    def __init__(self, dev: int) -> None:
        self.dev = dev
        self.ref: Any = None
        self.reads: list[_Read] = []


class _Dev:
    """Driver-side state of one actor."""

    def __init__(self, actor: Any, name: str, info: dict[str, Any]) -> None:
        self.actor = actor
        self.name = name
        self.info = info
        self.last: Any = None                 # ref of the last task queued
        self.reads: list[_Read] = []          # async reads not yet copied out
        self.copies: list[tuple[Any, int | None, str]] = []  # (write ref, stream, source) to check
        self.known: OrderedDict[str, frozenset[int]] = OrderedDict()  # compiled plans (mirror)
        self.drop: list[str] = []             # hashes to tell the actor to forget
        self.dead: str | None = None          # why the actor is unusable
        self.mems: weakref.WeakSet[_RayMemory] = weakref.WeakSet()
        self.messages = 0                     # tasks submitted (for tests and benchmarks)
        self.spec_bytes = 0                   # spec bytes shipped


# ---------------------------------------------------------------------------------------------
# runtime


class RayRuntime(Runtime):
    """The runtime behind RAY devices (see the module docstring).

    Args:
        actors: Ray actor handles of :class:`~ggmlpy.backends.ray.actor.DeviceActor`, one per
            device, in device order.
        timeout_s: bound of every wait on an actor, seconds (> 0).

    Raises:
        ValueError: no actors, or ``timeout_s <= 0``.
        BackendUnavailableError: an actor did not answer its first call within ``timeout_s``.
    """

    name = "RAY"
    xp = np
    alignment = 128
    guid = uuid.UUID("5f0b7d3e-91a2-4c6d-b8e4-2a7c9d1e0f35")

    def __init__(self, actors: Sequence[Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not actors:
            raise ValueError("RayRuntime: needs at least one actor")
        if not timeout_s > 0:
            raise ValueError(f"RayRuntime: timeout_s must be > 0, got {timeout_s}")
        self.ray = _import_ray()
        self.timeout_s = float(timeout_s)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._devs: list[_Dev] = []
        names = [f"RAY{i}" for i in range(len(actors))]
        refs = [a.info.remote() for a in actors]
        for i, (a, ref) in enumerate(zip(actors, refs)):
            d = _Dev(a, names[i], {})
            self._devs.append(d)
            d.info = self._get(i, ref, "starting")

    # helpers ------------------------------------------------------------------------------------
    def _dev(self, dev: int) -> _Dev:
        d = self._devs[dev]
        if d.dead is not None:
            raise BackendUnavailableError(f"{d.name} is unavailable: {d.dead}")
        return d

    def _get(self, dev: int, refs: Any, what: str) -> Any:
        """``ray.get(refs)`` bounded by the timeout, with Ray's failures mapped to ggmlpy's."""
        ray, d = self.ray, self._devs[dev]
        exc = ray.exceptions
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except exc.GetTimeoutError:
            raise BackendUnavailableError(f"{d.name}: no answer within {self.timeout_s:g} s while "
                                          f"{what} (GGMLPY_RAY_TIMEOUT_S)") from None
        except (exc.RayActorError, exc.ObjectLostError, exc.OwnerDiedError,
                exc.RaySystemError) as e:
            self.mark_dead(dev, f"{type(e).__name__} while {what}")
            raise BackendUnavailableError(f"{d.name} is unavailable: its actor died "
                                          f"({type(e).__name__} while {what})") from None
        except exc.RayTaskError as e:
            cause = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
            if isinstance(cause, MemoryError):
                raise
            raise ComputeError(f"{d.name}: {what} failed: {type(cause).__name__}: "
                               f"{str(cause).splitlines()[-1] if str(cause) else ''}") from cause

    def _submit(self, dev: int, method: str, *args: Any) -> Any:
        d = self._dev(dev)
        ref = getattr(d.actor, method).remote(*args)
        d.last = ref
        d.messages += 1
        return ref

    def mark_dead(self, dev: int, why: str) -> None:
        """Declare device ``dev`` lost: every later call on it raises BackendUnavailableError."""
        d = self._devs[dev]
        if d.dead is None:
            d.dead = why
            d.known.clear()

    def alive(self, dev: int) -> bool:
        """False once device ``dev`` was found dead (no call is made)."""
        return self._devs[dev].dead is None

    def dead_reason(self, dev: int) -> str | None:
        """Why device ``dev`` is unavailable, or None."""
        return self._devs[dev].dead

    def ping(self, dev: int) -> int:
        """The actor's pid; raises BackendUnavailableError when it is dead or does not answer."""
        return self._get(dev, self._submit(dev, "ping"), "pinging")

    def lost_memory(self, dev: int) -> list[DeviceMemory]:
        """The not-yet-freed memory of device ``dev`` if it is dead, else an empty list."""
        d = self._devs[dev]
        return [] if d.dead is None else list(d.mems)

    def actor(self, dev: int) -> Any:
        """The Ray actor handle of device ``dev`` (for tests and tools)."""
        return self._devs[dev].actor

    def counters(self, dev: int) -> dict[str, int]:
        """Driver-side counters of device ``dev``: ``messages`` submitted and ``spec_bytes`` sent."""
        d = self._devs[dev]
        return {"messages": d.messages, "spec_bytes": d.spec_bytes}

    # devices ------------------------------------------------------------------------------------
    def device_count(self) -> int:
        return len(self._devs)

    def device_info(self, dev: int) -> DeviceInfo:
        info = self._devs[dev].info
        gpu = info.get("array_module") == "cupy"
        extra = {k: info[k] for k in ("node_ip", "node_id", "hostname", "pid", "array_module")
                 if k in info}
        return DeviceInfo(description=info.get("description", "Ray actor"),
                          type=DeviceType.GPU if gpu else DeviceType.ACCEL, device_id=None,
                          extra=extra)

    def mem_info(self, dev: int) -> tuple[int, int]:
        free, total = self._get(dev, self._submit(dev, "mem_info"), "reading memory info")
        return int(free), int(total)

    # memory -------------------------------------------------------------------------------------
    def malloc(self, dev: int, size: int) -> DeviceMemory:
        h = next(self._ids)
        try:
            self._get(dev, self._submit(dev, "malloc", h, int(size)), f"allocating {size} bytes")
        except MemoryError:
            raise OutOfMemoryError(self._devs[dev].name, size, None,
                                   "the actor's allocation failed") from None
        mem = _RayMemory(dev, size, h)
        self._devs[dev].mems.add(mem)
        return mem

    def free(self, mem: DeviceMemory) -> None:
        d = self._devs[mem.dev]
        d.mems.discard(mem)  # type: ignore[arg-type]
        h = mem.handle  # type: ignore[attr-defined]
        for k in [k for k, hs in d.known.items() if h in hs]:
            del d.known[k]  # the actor drops these plans itself
        if d.dead is None:
            try:
                self._get(mem.dev, self._submit(mem.dev, "free", h), "freeing a buffer")
            except BackendUnavailableError:
                pass  # a dead device's memory is gone anyway

    def array(self, mem: DeviceMemory, tensor: Tensor) -> Any:
        raise NotAllocatedError(f"RAY{mem.dev}: tensor '{tensor.name}' is in a remote actor's "
                                "memory, which the driver cannot view; use tensor get/set")

    def memcpy_htod(self, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        self._get(mem.dev, self._submit(mem.dev, "write", None, mem.handle, int(offset), src),  # type: ignore[attr-defined]
                  "writing a tensor")

    def memcpy_dtoh(self, mem: DeviceMemory, offset: int, size: int) -> np.ndarray:
        out = self._get(mem.dev, self._submit(mem.dev, "read", mem.handle, int(offset), int(size)),  # type: ignore[attr-defined]
                        "reading a tensor")
        return out if out.flags.writeable else out.copy()

    def memcpy_dtod(self, dst: DeviceMemory, dst_offset: int, src: DeviceMemory, src_offset: int,
                    size: int) -> None:
        ref = self._dtod(None, None, dst, dst_offset, src, src_offset, size)
        self._get(dst.dev, ref, "copying a tensor")

    def _dtod(self, sid_src: int | None, sid_dst: int | None, dst: DeviceMemory, dst_offset: int,
              src: DeviceMemory, src_offset: int, size: int) -> Any:
        dh, sh = dst.handle, src.handle  # type: ignore[attr-defined]
        if dst.dev == src.dev:
            return self._submit(dst.dev, "copy", sid_dst, dh, int(dst_offset), sh, int(src_offset),
                                int(size))
        d = self._dev(dst.dev)
        data = self._submit(src.dev, "read", sh, int(src_offset), int(size))  # actor to actor
        ref = self._submit(dst.dev, "write", sid_dst, dh, int(dst_offset), data)
        if sid_dst is not None:  # a failed read never runs the write: check it at synchronize
            d.copies.append((ref, sid_dst, self._devs[src.dev].name))
        return ref

    def _check_copies(self, dev: int, stream: int) -> str | None:
        """The first failure of ``stream``'s actor-to-actor copies into device ``dev`` (their
        writes never ran because the source's read failed or its device died), or None."""
        d = self._devs[dev]
        mine = [c for c in d.copies if c[1] == stream]
        if not mine:
            return None
        d.copies = [c for c in d.copies if c[1] != stream]
        err = None
        for ref, _, source in mine:
            try:
                self.ray.get(ref, timeout=self.timeout_s)
            except Exception as e:  # noqa: BLE001 - the source's failure, reported here
                if err is None:
                    err = f"copy from {source} failed: {type(e).__name__}"
        return err

    def memset(self, mem: DeviceMemory, offset: int, size: int, value: int) -> None:
        self._get(mem.dev, self._submit(mem.dev, "memset", None, mem.handle, int(offset),  # type: ignore[attr-defined]
                                        int(size), int(value)), "clearing memory")

    def alloc_pinned(self, size: int) -> np.ndarray:
        try:
            return np.empty(size, np.uint8)
        except MemoryError:
            raise OutOfMemoryError("RAY_Host", size, None) from None

    # streams ------------------------------------------------------------------------------------
    def stream_new(self, dev: int, name: str) -> _Stream:
        return _Stream(dev, next(self._ids), name)

    def stream_free(self, stream: Any) -> None:
        if stream.closed:
            return
        stream.closed = True
        d = self._devs[stream.dev]
        if d.dead is None:
            try:
                if self.ray.is_initialized():
                    d.actor.close_stream.remote(stream.id)
            except Exception:  # noqa: BLE001 - best effort at interpreter exit
                pass

    def _fill(self, dev: int, reads: list[_Read], check: bool, stream: int | None) -> str | None:
        """Copy finished async reads into their host arrays; the first failure of ``stream``'s."""
        todo = [r for r in reads if not r.done]
        err = None
        if not todo:
            return None
        for r in todo:
            try:
                r.out[:] = self._get(dev, r.ref, "reading a tensor")
            except ComputeError as e:
                if err is None and (stream is None or r.stream == stream):
                    err = str(e)
            finally:
                r.done = True
                r.ref = None
        d = self._devs[dev]
        d.reads = [r for r in d.reads if not r.done]
        return err

    def stream_synchronize(self, stream: Any, check: bool = True) -> None:
        d = self._devs[stream.dev]
        if d.dead is not None:
            if check:
                raise BackendUnavailableError(f"{d.name} is unavailable: {d.dead}")
            return
        try:
            err = self._get(stream.dev, self._submit(stream.dev, "sync", stream.id, check),
                            "synchronizing")
            err2 = self._fill(stream.dev, d.reads, check, stream.id)
        except BackendUnavailableError:
            if check:
                raise
            return
        err3 = self._check_copies(stream.dev, stream.id) if check else None
        err = err or err2 or err3
        if check and err:
            raise ComputeError(f"{stream.name}: queued work failed: {err}")

    def launch(self, stream: Any, fn: Any) -> None:
        raise NotImplementedError("RAY streams run graph specs (RayRuntime.compute), not host "
                                  "callables")

    def compute(self, stream: Any, spec: GraphSpec) -> None:
        """*Async*: run ``spec`` on ``stream``: the spec's bytes are sent only if this device has
        not compiled it yet (or dropped it), else one message with its hash."""
        d = self._dev(stream.dev)
        if spec.hash in d.known:
            d.known.move_to_end(spec.hash)
            data = None
        else:
            data = spec.data
            d.known[spec.hash] = spec.handles
            d.spec_bytes += len(data)
            while len(d.known) > PLAN_CACHE_SIZE:
                d.drop.append(d.known.popitem(last=False)[0])
        drop, d.drop = d.drop, []
        self._submit(stream.dev, "compute", stream.id, spec.hash, data, drop)

    def memcpy_htod_async(self, stream: Any, mem: DeviceMemory, offset: int, src: np.ndarray) -> None:
        self._submit(stream.dev, "write", stream.id, mem.handle, int(offset), src)  # type: ignore[attr-defined]

    def memcpy_dtoh_async(self, stream: Any, out: np.ndarray, mem: DeviceMemory, offset: int) -> None:
        ref = self._submit(stream.dev, "read", mem.handle, int(offset), int(out.size))  # type: ignore[attr-defined]
        self._devs[stream.dev].reads.append(_Read(ref, out, stream.id))

    def memcpy_dtod_async(self, stream: Any, dst: DeviceMemory, dst_offset: int, src: DeviceMemory,
                          src_offset: int, size: int) -> None:
        self._dtod(stream.id, stream.id, dst, dst_offset, src, src_offset, size)

    def copy_between(self, src_stream: Any, dst_stream: Any, dst: DeviceMemory, dst_offset: int,
                     src: DeviceMemory, src_offset: int, size: int) -> None:
        """*Async*: copy between two devices, actor to actor: a read queued on the source device
        (after its queued work) feeds a write queued on the destination (after its own)."""
        self._dtod(src_stream.id, dst_stream.id, dst, dst_offset, src, src_offset, size)

    # events -------------------------------------------------------------------------------------
    def event_new(self, dev: int) -> _Event:
        return _Event(dev)

    def event_record(self, event: Any, stream: Any) -> None:
        d = self._dev(stream.dev)
        event.dev = stream.dev
        event.ref = d.last
        event.reads = list(d.reads)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        ref = event.ref
        if ref is None or event.dev == stream.dev:
            return  # one actor queue: already ordered
        ready, _ = self.ray.wait([ref], timeout=0)
        if not ready:
            self._submit(stream.dev, "wait", ref)

    def event_synchronize(self, event: Any) -> None:
        if event.ref is None:
            return
        try:
            self._get(event.dev, event.ref, "waiting for an event")
        except ComputeError:
            pass  # a failed task still marks the point; failures are reported by synchronize
        self._fill(event.dev, event.reads, False, None)
        event.reads = []

    def event_query(self, event: Any) -> bool:
        if event.ref is None:
            return True
        ready, _ = self.ray.wait([event.ref], timeout=0)
        return bool(ready)


# ---------------------------------------------------------------------------------------------
# backend and device


class _RemotePlan:
    """A graph encoded for a RAY device: what :class:`RayBackend`'s plan cache holds."""

    __slots__ = ("spec", "buffers")

    def __init__(self, spec: GraphSpec, buffers: list[Any]) -> None:
        self.spec = spec
        self.buffers = buffers

    def check_live(self, backend_name: str = "") -> None:
        """Raise NotAllocatedError if a buffer the spec uses was freed since it was encoded."""
        check_buffers_live(self.buffers, backend_name)

    def run(self) -> None:
        """Refused: a remote plan runs on its actor."""
        raise NotImplementedError("a RAY plan runs on its actor (graph_plan_compute)")


class RayBackend(AsyncBackend):
    """One stream of a :class:`RayDevice`: :class:`~ggmlpy.backends.device.backend.AsyncBackend` with
    graphs shipped as specs and RAY-to-RAY copies made actor to actor. Same ordering spec."""

    device: RayDevice
    runtime: RayRuntime

    def _build_plan(self, graph: Graph) -> _RemotePlan:  # type: ignore[override]
        dev = self.device
        buffers: dict[int, Any] = {}

        def handle_of(t: Tensor) -> int:
            b = tensor_buffer(t)
            if not isinstance(b, AsyncBuffer) or b.buft is not dev.buft:
                where = b.name if b is not None else "no buffer"
                raise NotAllocatedError(f"{self.name}: tensor '{t.name}' is in buffer {where}, "
                                        "which this backend cannot access")
            buffers[id(b)] = b
            return b.mem.handle  # type: ignore[attr-defined]

        def check(node: Tensor) -> None:
            if not dev.can_compute(node):
                srcs = ", ".join(f"{s.name}:{s.type.type_name}" for s in node.src if s is not None)
                raise UnsupportedOpError(f"{self.name}: op {node.op.name} of node '{node.name}' "
                                         f"({node.type.type_name}, sources {srcs}) is not supported")

        spec = encode_graph(graph, handle_of, check)
        return _RemotePlan(spec, list(buffers.values()))

    def graph_plan_compute(self, plan: Any) -> Status:
        """Queue ``plan`` (from :meth:`graph_plan_create`) on the actor; asynchronous."""
        plan.check_live(self.name)
        self.runtime.compute(self.stream, plan.spec)
        return Status.SUCCESS

    def _graph_compute(self, graph: Graph) -> Status:
        plan = self._plans.get(graph)
        plan.check_live(self.name)
        self.runtime.compute(self.stream, plan.spec)  # type: ignore[attr-defined]
        return Status.SUCCESS

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        dbuf = self._own_buffer(dst)
        sbuf = tensor_buffer(src)
        if (dbuf is not None and isinstance(backend_src, RayBackend) and backend_src is not self
                and backend_src.runtime is self.runtime and isinstance(sbuf, AsyncBuffer)
                and sbuf.buft is backend_src.device.buft):
            n = src.nbytes
            if n:
                self.runtime.copy_between(backend_src.stream, self.stream, dbuf.mem, dst.offset,
                                          sbuf.mem, src.offset, n)
            return True
        return super()._cpy_tensor_async(backend_src, src, dst)

    def __repr__(self) -> str:
        return f"<RayBackend {self.name}>"


class _RayBufferType(AsyncBufferType):
    """A RAY device's memory: :class:`~ggmlpy.backends.device.backend.AsyncBufferType` that remembers its
    live buffers (weakly), so the buffers of a dead device can be reported lost."""

    def __init__(self, name: str, device: RayDevice) -> None:
        super().__init__(name, device)
        self.buffers: weakref.WeakSet[AsyncBuffer] = weakref.WeakSet()

    def _alloc_buffer(self, size: int) -> Buffer:
        buf = super()._alloc_buffer(size)
        self.buffers.add(buf)  # type: ignore[arg-type]
        return buf


class RayDevice(AsyncDevice):
    """One RAY device (an actor). Supports what the kernels support for the actor's array module
    (NumPy, or CuPy on a GPU actor; judged with NumPy when the driver lacks CuPy).

    ``props.extra`` holds ``node_ip``, ``node_id``, ``hostname``, ``pid``, ``array_module``.
    """

    runtime: RayRuntime

    def __init__(self, runtime: RayRuntime, index: int, **options: Any) -> None:
        super().__init__(runtime, index, **options)
        self.buft = _RayBufferType(self.name, self)
        self.xp: Any = np
        if runtime.device_info(index).extra.get("array_module") == "cupy":
            try:
                import cupy

                self.xp = cupy
            except ImportError:
                pass

    def can_compute(self, op: Tensor) -> bool:
        """Whether a kernel exists for ``op`` with the actor's array module and it is not refused."""
        from ggmlpy.backends import kernels

        return op.op not in self.refuse_ops and kernels.supports_op(op, self.xp)

    def _supports_op(self, op: Tensor) -> bool:
        if reads_foreign_device_memory(op, self.buft):
            return False
        return self.can_compute(op)

    def _init_backend(self, params: str | None) -> Backend:
        self.runtime._dev(self.index)  # a dead device gives BackendUnavailableError
        return RayBackend(self)

    def _get_props(self) -> DeviceProps:
        info = self._get_info()
        try:
            free, total = self.runtime.mem_info(self.index)
        except BackendUnavailableError:
            free, total = 0, 0  # a dead device lists with no memory and alive False
        extra = dict(info.extra, alive=self.alive)
        if not self.alive:
            extra["lost"] = self.runtime.dead_reason(self.index)
        return DeviceProps(name=self.name, description=info.description, memory_free=free,
                           memory_total=total, type=info.type, device_id=None, caps=self._CAPS,
                           extra=extra)

    @property
    def alive(self) -> bool:
        """False once the actor was found dead."""
        return self.runtime.alive(self.index)

    def lost_buffers(self) -> list[AsyncBuffer]:
        """Buffers of this device that are lost because its actor died (empty while alive)."""
        if self.alive:
            return []
        return [b for b in list(self.buft.buffers) if not b.freed]

    def __repr__(self) -> str:
        return f"<RayDevice {self.name}>"


# ---------------------------------------------------------------------------------------------
# starting Ray


_start_lock = threading.Lock()


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[3])  # the folder holding the ggmlpy package


def check_address_reachable(address: str, timeout_s: float) -> None:
    """Open (and close) a TCP connection to ``address`` (``"HOST:PORT"``, ``"[v6]:PORT"``)
    within ``timeout_s`` seconds: a Ray head's GCS port accepts one at once, while
    ``ray.init(address=...)`` on a dead one retries for minutes. ``"auto"`` is not checked.

    Raises:
        BackendUnavailableError: the connection was refused, timed out or the host name does not
            resolve (the message names the address, what failed and ``GGMLPY_RAY_ADDRESS``).
    """
    import socket  # noqa: PLC0415

    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        what = (f"no answer within {timeout_s:g} s" if isinstance(e, TimeoutError)
                else (e.strerror or type(e).__name__))
        raise BackendUnavailableError(
            f"RAY: GGMLPY_RAY_ADDRESS {address} is unreachable (TCP connect: {what}; is "
            "`ray start --head` running there?)") from None


def start_ray(env: RayEnv | None = None) -> Any:
    """Initialise Ray in this process if it is not: join ``env.address`` when set, else start a
    local instance that listens on loopback only (Ray's servers bind the node address, which is
    forced to 127.0.0.1), without dashboard, with ``env.num_cpus`` CPUs and ``env.object_store_mb``
    of object store. Returns the ``ray`` module.

    ``ray.init`` has no timeout and retries a dead address for minutes, so a ``HOST:PORT``
    address is first checked with a TCP connect bounded by ``env.timeout_s``
    (``GGMLPY_RAY_TIMEOUT_S``; :func:`check_address_reachable`). ``ray.init`` itself runs on the
    calling thread (Ray's driver set-up does not survive a helper thread), so a port that
    accepts connections but is no Ray head is still waited for by Ray's own timeouts.

    Raises:
        BackendUnavailableError: Ray is not installed, the address is unreachable, or Ray did
            not start / connect in time (the message names the address).
    """
    env = env or ray_env()
    if env.address is not None:
        check_address_reachable(env.address, env.timeout_s)
    with _start_lock:
        if "ray" not in __import__("sys").modules and env.address is None:
            # ray reads this once at import: with it the node's address defaults to loopback
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray = _import_ray()
        if ray.is_initialized():
            return ray
        job = ray.job_config.JobConfig(code_search_path=[_package_root()])
        try:
            if env.address is not None:
                ray.init(address=env.address, job_config=job, log_to_driver=False,
                         logging_level="WARNING")
            else:
                from ray._private import ray_constants

                ray_constants.ENABLE_RAY_CLUSTER = False  # loopback node address (see above)
                # a new instance, even if RAY_ADDRESS is set
                ray.init(address="local", num_cpus=env.num_cpus, num_gpus=0,
                         include_dashboard=False, _node_ip_address="127.0.0.1",
                         job_config=job, log_to_driver=False,
                         object_store_memory=env.object_store_mb << 20, logging_level="WARNING")
        except Exception as e:  # noqa: BLE001 - any start failure means no RAY devices
            where = env.address or "a local instance"
            raise BackendUnavailableError(f"RAY: could not start Ray ({where}): "
                                          f"{type(e).__name__}: {e}") from None
        return ray


def ray_reg(n: int | None = None, address: str | None = None, timeout_s: float | None = None,
            **device_options: Any) -> Reg:
    """A new registration "RAY" with ``n`` devices ``RAY0..RAY{n-1}``, one new actor each.

    Args:
        n: number of devices; None reads ``GGMLPY_RAY_DEVICES`` (default: one per GPU of the
            cluster if it has GPUs, else one per alive node).
        address: Ray address to join (``"auto"`` or ``"HOST:PORT"``); None reads
            ``GGMLPY_RAY_ADDRESS`` (unset: a local loopback instance). Ignored if Ray is
            already initialised in this process.
        timeout_s: bound of every wait on an actor; None reads ``GGMLPY_RAY_TIMEOUT_S``.
        device_options: passed to every :class:`RayDevice` (``refuse_ops``, ...).

    Actors ask for one GPU each when the cluster has GPUs (placed by Ray's scheduler, spread
    over nodes), else for no resources (local instance) or one CPU (cluster, spread).

    Raises:
        ValueError: ``n < 1`` or a malformed environment variable.
        BackendUnavailableError: Ray is missing, or did not start, or an actor did not start.
    """
    env = ray_env(n=n, address=address, timeout_s=timeout_s)
    ray = start_ray(env)
    res = ray.cluster_resources()
    n_gpu = int(res.get("GPU", 0))
    count = env.n
    if count is None:
        count = n_gpu or max(1, len([x for x in ray.nodes() if x.get("Alive")]))
    if count < 1:
        raise ValueError(f"ray_reg: need at least one device, got {count}")
    use_gpu = n_gpu >= 1
    opts: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0}
    if use_gpu:
        opts.update(num_gpus=1, num_cpus=0)
    elif env.address is None:
        opts.update(num_cpus=0)
    else:
        opts.update(num_cpus=1, scheduling_strategy="SPREAD")
    if env.address is not None:
        opts.setdefault("scheduling_strategy", "SPREAD")
    cls = ray.remote(DeviceActor)
    actors = [cls.options(name=None, **opts).remote(use_gpu, f"RAY{i}") for i in range(count)]
    runtime = RayRuntime(actors, timeout_s=env.timeout_s)
    return Reg("RAY", [RayDevice(runtime, i, **device_options) for i in range(count)])


def register_ray_devices(n: int | None = None, **options: Any) -> Reg:
    """Register ``n`` remote devices ``RAY0..RAY{n-1}``, one new Ray actor each (replacing earlier
    RAY devices); Ray starts (or joins ``GGMLPY_RAY_ADDRESS``) if it has not yet.

    ``options`` go to :func:`ray_reg` (``address``, ``timeout_s``, ``refuse_ops``). Returns the
    new reg.

    Raises:
        TypeError: ``n`` is not an int. ValueError: ``n`` outside 1..1024, a malformed option
            or ``GGMLPY_*`` variable. BackendUnavailableError: Ray is not installed or did not
            start.
    """
    from ggmlpy.backend import registry

    if n is not None:
        check_int("n", n, 1, 1024, "register_ray_devices")
    registry.reg_count()  # the registry starts up (and validates the environment) first
    reg = ray_reg(n, **options)
    registry.register(reg)
    return reg


def _env_reg() -> Reg | None:
    # RAY devices from the environment; a Ray that cannot start leaves an empty reg saying why
    from ggmlpy.core import env as core_env

    if not core_env.ray_requested():
        return None
    try:
        return ray_reg()
    except BackendUnavailableError as e:
        return Reg("RAY", [], unavailable_reason=str(e))


def _unavailable(name: str) -> str:
    from ggmlpy.backend.registry import reg_unavailable_reason

    return (reg_unavailable_reason("RAY") or "RAY devices need GGMLPY_RAY_DEVICES=N or "
            "GGMLPY_RAY_ADDRESS, or register_ray_devices()")


#: the registry's entry for RAY (installed by :func:`ggmlpy.backends.install`)
FACTORY = BackendFactory("RAY", 30, _env_reg, unavailable_reason=_unavailable, on_demand=True)
