"""The process side of a RAY device: one Ray actor owning one device's memory and compiled plans.

:class:`DeviceActor` is a plain class; :mod:`ggmlpy.backends.ray.runtime` turns it into a Ray actor
(``ray.remote(DeviceActor)``), so this module imports neither Ray nor anything of the driver's.
The actor runs one task at a time, in the order the driver submitted them: that queue is the
device's stream (Ray's ordering guarantee for a synchronous, single-threaded actor and one
submitter; the actor is created without task retries, which would break it).

Memory: one ``uint8`` arena per buffer, a NumPy array (64-byte aligned) or, when the actor was
given a GPU and CuPy works there, a CuPy array on that GPU. Buffers are named by integer
*handles* chosen by the driver; a tensor is ``(handle, byte offset)``. Data crosses the process
boundary only as ``uint8`` NumPy arrays (through Ray's object store) and specs as bytes
(:mod:`ggmlpy.backends.ray.graph_spec`): nothing the driver sends is unpickled into ggmlpy objects.

Errors: work queued on a stream (``stream`` is not None) never raises; its first failure is kept
per stream and returned (and cleared) by :meth:`DeviceActor.sync`, like a CUDA stream's sticky
error. Blocking calls (``stream=None``) raise, and the driver maps the exception.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["DeviceActor", "ARENA_ALIGNMENT", "PLAN_CACHE_SIZE"]

#: Alignment of every arena's base address, bytes (the CPU backend's ``MEMORY_ALIGNMENT``).
ARENA_ALIGNMENT = 64
#: Compiled plans an actor keeps; the driver mirrors this bound and names what to drop.
PLAN_CACHE_SIZE = 64


def _aligned(size: int) -> np.ndarray:
    raw = np.empty(size + ARENA_ALIGNMENT, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ARENA_ALIGNMENT
    return raw[shift:shift + size]


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of this node's memory, from /proc/meminfo when readable."""
    try:
        info: dict[str, int] = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                info[k] = int(v.split()[0]) * 1024
        return info.get("MemAvailable", info["MemFree"]), info["MemTotal"]
    except (OSError, KeyError, ValueError):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            return total, total
        except (ValueError, OSError, AttributeError):
            return 0, 0


class DeviceActor:
    """One remote device (see the module docstring).

    Args:
        use_gpu: compute with CuPy on the GPU Ray assigned to this actor (falls back to NumPy,
            saying why in :meth:`info`, when CuPy or a GPU is missing).
        name: the device's name on the driver ("RAY0"), for messages.
    """

    def __init__(self, use_gpu: bool, name: str) -> None:
        self.name = name
        self.xp: Any = np
        self.gpu_reason = "" if use_gpu else "no GPU requested"
        if use_gpu:
            try:
                import cupy

                cupy.cuda.runtime.getDeviceCount()
                self.xp = cupy
            except Exception as e:  # noqa: BLE001 - reported by info()
                self.gpu_reason = f"CuPy unusable: {type(e).__name__}: {e}"
        self.arenas: dict[int, Any] = {}
        self.used = 0
        self.plans: dict[str, tuple[Any, frozenset[int]]] = {}
        self.errors: dict[int, str] = {}

    # facts ----------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """Static facts: node address and id, host name, pid, array module, description, memory."""
        import ray

        ctx = ray.get_runtime_context()
        free, total = self.mem_info()
        d: dict[str, Any] = {"node_ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(),
                             "hostname": socket.gethostname(), "pid": os.getpid(),
                             "array_module": self.xp.__name__, "memory_total": total,
                             "memory_free": free, "gpu_reason": self.gpu_reason}
        if self.xp is np:
            d["description"] = f"Ray actor on {d['hostname']} (NumPy {np.__version__})"
        else:
            props = self.xp.cuda.runtime.getDeviceProperties(self.xp.cuda.Device().id)
            gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            d["description"] = f"Ray actor on {d['hostname']} ({gpu}, CuPy {self.xp.__version__})"
        return d

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device: the GPU's, or the node's available memory."""
        if self.xp is not np:
            free, total = self.xp.cuda.runtime.memGetInfo()
            return int(free), int(total)
        return _host_memory()

    def ping(self) -> int:
        """The actor's pid (a liveness probe)."""
        return os.getpid()

    # memory ---------------------------------------------------------------------------------
    def malloc(self, handle: int, size: int) -> int:
        """Allocate arena ``handle`` of ``size`` bytes; raises MemoryError when it cannot."""
        if handle in self.arenas:
            raise ValueError(f"{self.name}: buffer handle {handle} already in use")
        self.arenas[handle] = _aligned(size) if self.xp is np else self.xp.empty(size, self.xp.uint8)
        self.used += size
        return handle

    def free(self, handle: int) -> None:
        """Release arena ``handle`` and every compiled plan that uses it (idempotent)."""
        arena = self.arenas.pop(handle, None)
        if arena is not None:
            self.used -= arena.size
        for h in [k for k, (_, hs) in self.plans.items() if handle in hs]:
            del self.plans[h]

    def _arena(self, handle: int) -> Any:
        try:
            return self.arenas[handle]
        except KeyError:
            raise ValueError(f"{self.name}: no buffer with handle {handle} (freed?)") from None

    def _run(self, stream: int | None, fn: Any, *args: Any) -> Any:
        if stream is None:
            return fn(*args)
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - kept for sync()
            self.errors.setdefault(stream, f"{type(e).__name__}: {e}")
            return None

    def write(self, stream: int | None, handle: int, offset: int, data: np.ndarray) -> None:
        """Copy host bytes ``data`` (uint8) into arena ``handle`` at byte ``offset``."""
        def do() -> None:
            arena = self._arena(handle)
            n = data.size
            if offset < 0 or offset + n > arena.size:
                raise ValueError(f"{self.name}: write of {n} bytes at {offset} outside buffer "
                                 f"{handle} of {arena.size} bytes")
            arena[offset:offset + n] = data if self.xp is np else self.xp.asarray(data)
        self._run(stream, do)

    def read(self, handle: int, offset: int, size: int) -> np.ndarray:
        """A host ``uint8`` array of ``size`` bytes of arena ``handle`` from ``offset`` (raises)."""
        arena = self._arena(handle)
        if offset < 0 or offset + size > arena.size:
            raise ValueError(f"{self.name}: read of {size} bytes at {offset} outside buffer "
                             f"{handle} of {arena.size} bytes")
        part = arena[offset:offset + size]
        return part.copy() if self.xp is np else self.xp.asnumpy(part)

    def memset(self, stream: int | None, handle: int, offset: int, size: int, value: int) -> None:
        """Set ``size`` bytes of arena ``handle`` from ``offset`` to the byte ``value``."""
        def do() -> None:
            self._arena(handle)[offset:offset + size] = value
        self._run(stream, do)

    def copy(self, stream: int | None, dst: int, dst_offset: int, src: int, src_offset: int,
             size: int) -> None:
        """Copy ``size`` bytes between two arenas of this actor."""
        def do() -> None:
            d, s = self._arena(dst), self._arena(src)
            d[dst_offset:dst_offset + size] = s[src_offset:src_offset + size]
        self._run(stream, do)

    # compute --------------------------------------------------------------------------------
    def compute(self, stream: int, spec_hash: str, data: bytes | None, drop: Iterable[str]) -> None:
        """Run the plan named ``spec_hash``: compiled from ``data`` (a graph spec) the first time,
        from the cache afterwards. ``drop``: hashes the driver evicted from its mirror of the
        cache (forgotten first)."""
        for h in drop:
            self.plans.pop(h, None)

        def do() -> None:
            entry = self.plans.get(spec_hash)
            if entry is None:
                if data is None:
                    raise RuntimeError(f"{self.name}: plan {spec_hash[:12]} is not cached here and "
                                       "the driver sent no spec")
                entry = self._compile(data)
                self.plans[spec_hash] = entry
            entry[0].run()
        self._run(stream, do)

    def _view(self, t: Any, handle: int) -> Any:
        arena = self._arena(handle)
        if self.xp is np:
            from ggmlpy.backends.cpu.backend import host_array

            return host_array(arena, t)
        cp = self.xp
        ptr = arena.data + t.offset
        if t.type.is_quantized:
            row = t.type.row_size(t.ne[0])
            return cp.ndarray((t.ne[3], t.ne[2], t.ne[1], row), cp.uint8, ptr,
                              (t.nb[3], t.nb[2], t.nb[1], 1))
        return cp.ndarray(t.ne[::-1], t.type.dtype, ptr, t.nb[::-1])

    def _compile(self, data: bytes) -> tuple[Any, frozenset[int]]:
        from ggmlpy.backends import kernels
        from ggmlpy.backends.plan import Plan
        from ggmlpy.backends.ray.graph_spec import decode_spec, spec_handles

        tensors, nodes = decode_spec(data)
        handle = {id(t): h for t, h in tensors}
        steps, done = [], []
        for node in nodes:
            dst = self._view(node, handle[id(node)])
            srcs = [None if s is None else self._view(s, handle[id(s)]) for s in node.src]
            step = kernels.compile_node(self.xp, node, dst, srcs)
            if step is not None:
                steps.append(step)
                done.append(node)
        return Plan(steps, done), spec_handles(tensors)

    # ordering -------------------------------------------------------------------------------
    def wait(self, *deps: Any) -> None:
        """Nothing: Ray resolves ``deps`` (refs of other actors' tasks) before running it, so the
        tasks queued after it wait for them."""

    def sync(self, stream: int, clear: bool = True) -> str | None:
        """The first failure of work queued on ``stream`` since the last clearing sync, or None."""
        return self.errors.pop(stream, None) if clear else self.errors.get(stream)

    def close_stream(self, stream: int) -> None:
        """Forget ``stream``'s stored failure."""
        self.errors.pop(stream, None)

    def stall(self, seconds: float) -> None:
        """Hold the queue for ``seconds`` (fault-handling tests: a device that is slow, not dead)."""
        import time

        time.sleep(float(seconds))

    def stats(self) -> dict[str, int]:
        """Counters for tests and benchmarks: arenas, bytes used, cached plans."""
        return {"buffers": len(self.arenas), "used": self.used, "plans": len(self.plans)}
