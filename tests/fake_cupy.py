"""A host stand-in for CuPy (test support, not a test module).

It exercises ``cupy_runtime``'s plumbing (pointer arithmetic, views, staging, download finishers,
events, OOM) on machines without a GPU. Every "device" operation completes at once, so it proves
nothing about real stream ordering: the SIM runtime and ``pytest -m gpu`` do that.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ggmlpy.backends import cupy_runtime


class _FakeCudaError(Exception):
    def __init__(self, status: int, msg: str = "fake CUDA error") -> None:
        super().__init__(msg)
        self.status = status


class _FakeRuntime:
    CUDARuntimeError = _FakeCudaError
    memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice = 0, 1, 2, 3

    def __init__(self, n: int, capacity: int) -> None:
        self.n, self.capacity = n, capacity
        self.allocs: dict[int, np.ndarray] = {}
        self.used = [0] * n
        self.cur = 0

    def getDeviceCount(self) -> int:
        return self.n

    def getDeviceProperties(self, dev: int) -> dict:
        return {"name": f"Fake GPU {dev}".encode(), "major": 9, "minor": 0, "totalGlobalMem": self.capacity,
                "multiProcessorCount": 132, "pciBusID": 0x1A + dev, "pciDeviceID": 0, "pciDomainID": 0,
                "integrated": 0}

    def memGetInfo(self) -> tuple[int, int]:
        return self.capacity - self.used[self.cur], self.capacity

    def malloc(self, size: int) -> int:
        if self.used[self.cur] + size > self.capacity:
            raise _FakeCudaError(2, "cudaErrorMemoryAllocation")
        a = np.zeros(size, np.uint8)
        self.allocs[a.ctypes.data] = (a, self.cur)
        self.used[self.cur] += size
        return a.ctypes.data

    def free(self, ptr: int) -> None:
        a, dev = self.allocs.pop(ptr)
        self.used[dev] -= a.size

    def memcpyAsync(self, dst: int, src: int, size: int, kind: int, stream: int) -> None:
        ctypes.memmove(dst, src, size)

    def memcpyPeerAsync(self, dst: int, ddev: int, src: int, sdev: int, size: int, stream: int) -> None:
        ctypes.memmove(dst, src, size)

    def memsetAsync(self, ptr: int, value: int, size: int, stream: int) -> None:
        ctypes.memset(ptr, value, size)


class _FakeCuda:
    def __init__(self, rt: _FakeRuntime) -> None:
        self.runtime = rt
        fake = self

        class Device:
            def __init__(self, dev: int) -> None:
                self.dev = dev

            def __enter__(self):
                self.prev, rt.cur = rt.cur, self.dev
                return self

            def __exit__(self, *exc):
                rt.cur = self.prev

        class Stream:
            ptr = 7

            def __init__(self, non_blocking: bool = False) -> None:
                assert non_blocking  # the runtime must ask for a non-blocking stream

            def synchronize(self) -> None:
                pass

            def wait_event(self, event) -> None:
                assert isinstance(event, fake.Event)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

        class Event:
            def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
                self.recorded = 0

            def record(self, stream) -> None:
                assert isinstance(stream, Stream)
                self.recorded += 1

            def synchronize(self) -> None:
                pass

            @property
            def done(self) -> bool:
                return True

        class UnownedMemory:
            def __init__(self, ptr: int, size: int, owner, device_id: int) -> None:
                self.ptr, self.size = ptr, size

        class MemoryPointer:
            def __init__(self, mem, offset: int) -> None:
                self.mem, self.ptr = mem, mem.ptr + offset

        Stream.ptds = Stream(non_blocking=True)
        self.Device, self.Stream, self.Event = Device, Stream, Event
        self.UnownedMemory, self.MemoryPointer = UnownedMemory, MemoryPointer

    @staticmethod
    def alloc_pinned_memory(size: int) -> bytearray:
        return bytearray(size)


class _FakeNdarray(np.ndarray):
    """``cupy.ndarray(shape, dtype, memptr, strides)`` over host memory at ``memptr.ptr``."""

    def __new__(cls, shape, dtype, memptr, strides):
        span = memptr.mem.size - (memptr.ptr - memptr.mem.ptr)
        raw = (ctypes.c_char * span).from_address(memptr.ptr)
        return np.ndarray.__new__(np.ndarray, shape, dtype, raw, 0, strides)


class FakeCupy:
    """A module-like stand-in for ``cupy``: ``cuda.*`` as above, arrays and math from NumPy."""

    __version__ = "fake"

    def __init__(self, n_devices: int = 2, capacity: int = 64 << 20) -> None:
        self.cuda = _FakeCuda(_FakeRuntime(n_devices, capacity))
        self.ndarray = _FakeNdarray
        self.uint8 = np.uint8
        self._pool = type("Pool", (), {"free_all_blocks": lambda self: None})()

    def get_default_memory_pool(self):
        return self._pool

    def __getattr__(self, name: str):
        return getattr(np, name)


def fake_cuda_reg(n_devices: int = 2, capacity: int = 64 << 20):
    """A CUDA reg whose runtime is :class:`cupy_runtime.CupyRuntime` over :class:`FakeCupy`."""
    from ggmlpy.backends.device import make_reg

    return make_reg(cupy_runtime.CupyRuntime(FakeCupy(n_devices, capacity)))
