"""A host stand-in for CuPy (test support, not a test module).

It exercises ``cupy_runtime``'s plumbing (pointer arithmetic, views, staging, download finishers,
events, OOM, peer access, error mapping) on machines without a GPU. Every "device" operation
completes at once, so it proves nothing about real stream ordering: the SIM runtime and
``pytest -m gpu`` do that.

Counting: ``FakeCupy.launch_count()`` counts "kernel launches" the way CuPy would issue them: one per
ufunc call (element-wise op, reduction), per kernel-issuing array function (``copyto``, ``sum``,
``where``, ...), per ``astype``/``copy``, and per ``RawKernel``/``RawModule`` function call. ``pinned_allocs`` counts
``alloc_pinned_memory`` calls; ``hold_events(True)`` keeps events "running" (``done`` False). ``RawKernel`` runs a NumPy emulation of each
``ggmlpy.backends.cuda.kernels`` kernel, float32 maths as the CUDA source. ``cuda.cublas.gemmEx``
(column-major, f16/f32 operands, f32 compute) runs with NumPy, counts one launch and is recorded
in :data:`GEMMEX_CALLS` (``ggmlpy.backends.cuda.gemm``); ``cuda.get_current_stream()`` gives
the innermost ``with stream:`` (else a null stream of ptr 0).

Stream capture (CUDA graphs): ``Stream.begin_capture()`` starts recording, ``end_capture()``
returns a ``cuda.Graph`` whose ``launch(stream)`` replays what was recorded (counted as **one**
launch; ``FakeCupy.graph_launches()`` counts them). While capturing, nothing that writes existing memory
runs, as on CUDA: RawKernel calls, async copies/memsets, ufuncs and array functions given
``out=``, ``copyto`` and ``__setitem__`` are only recorded; pure operations (ufuncs and array
functions without ``out``, ``astype``/``copy``, copying ``__getitem__``) run once to get their
result array (stale values, never written anywhere) and are recorded as a rewrite of that same
array (fixed addresses, like a CUDA graph); nothing is counted. Reading a value to the host while capturing (``float()``, ``int()``,
``bool()``, ``item()``, ``tolist()``) raises the fake ``cudaErrorStreamCaptureUnsupported``, as
CuPy's synchronous transfers do. ``cuda.MemoryPool``/``cuda.using_allocator`` exist (the fake's
arrays do not come from them); ``pools_made()`` counts pools.

Error injection: ``fake.fail_next(path, exc)`` makes the next call of e.g. ``"runtime.memcpyAsync"``,
``"Event.record"``, ``"Stream.synchronize"``, ``"alloc_pinned_memory"`` or ``"RawKernel"`` raise
``exc``.
"""

from __future__ import annotations

import ctypes
import itertools
import types
from functools import partial

import fake_cupy_quant
import numpy as np

from ggmlpy.backends.cuda import runtime as cupy_runtime
from ggmlpy.core import special

_LAUNCHES = [0]
_FAILS: dict[str, BaseException] = {}
_HOLD = [False]
#: the launch list being recorded by a capturing stream, or None
_REC: list | None = None
_GRAPH_LAUNCHES = [0]
_POOLS = [0]
#: ``(consumer stream, current stream)`` of every fake ``__dlpack__`` export
DLPACK_CALLS: list = []
#: a callable giving the current fake stream (set by the latest FakeCupy)
_CURRENT: list = [None]
#: every fake ``cublas.gemmEx`` call: a dict of its arguments (ints) plus ``stream`` (the ptr
#: last given to ``setStream`` for its handle)
GEMMEX_CALLS: list = []


def _capturing() -> bool:
    return _REC is not None


def _record(fn) -> None:
    _REC.append(fn)


def _no_sync(what: str) -> None:
    if _REC is not None:
        raise _FakeCudaError(900, f"cudaErrorStreamCaptureUnsupported: {what} while capturing")


def _maybe_fail(path: str) -> None:
    exc = _FAILS.pop(path, None)
    if exc is not None:
        raise exc


class FakeDriverError(Exception):
    """Stands for ``cupy_backends.cuda.api.driver.CUDADriverError``."""


FakeDriverError.__module__ = "cupy_backends.cuda.api.driver"


class FakeCublasError(Exception):
    """Stands for ``cupy_backends.cuda.libs.cublas.CUBLASError``."""


FakeCublasError.__module__ = "cupy_backends.cuda.libs.cublas"


class FakePoolOutOfMemory(MemoryError):
    """Stands for ``cupy.cuda.memory.OutOfMemoryError`` (CuPy's pool could not allocate)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"Out of memory allocating {size} bytes")
        self._size = size


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
        self.peer_enable_calls = []

    def getDeviceCount(self) -> int:
        return self.n

    def getDeviceProperties(self, dev: int) -> dict:
        return {"name": f"Fake GPU {dev}".encode(), "major": 9, "minor": 0, "totalGlobalMem": self.capacity,
                "multiProcessorCount": 132, "pciBusID": 0x1A + dev, "pciDeviceID": 0, "pciDomainID": 0,
                "integrated": 0}

    def memGetInfo(self) -> tuple[int, int]:
        return self.capacity - self.used[self.cur], self.capacity

    def malloc(self, size: int) -> int:
        _maybe_fail("runtime.malloc")
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
        _maybe_fail("runtime.memcpyAsync")
        if _capturing():
            return _record(lambda: ctypes.memmove(dst, src, size))
        ctypes.memmove(dst, src, size)

    def memcpyPeerAsync(self, dst: int, ddev: int, src: int, sdev: int, size: int, stream: int) -> None:
        _maybe_fail("runtime.memcpyPeerAsync")
        if _capturing():
            return _record(lambda: ctypes.memmove(dst, src, size))
        ctypes.memmove(dst, src, size)

    def memsetAsync(self, ptr: int, value: int, size: int, stream: int) -> None:
        _maybe_fail("runtime.memsetAsync")
        if _capturing():
            return _record(lambda: ctypes.memset(ptr, value, size))
        ctypes.memset(ptr, value, size)

    # peer access: devices with the same parity can reach each other (a made-up topology)
    peer_enable_calls: list[tuple[int, int]]

    def deviceCanAccessPeer(self, dev: int, peer: int) -> int:
        return int(dev != peer and dev % 2 == peer % 2)

    def deviceEnablePeerAccess(self, peer: int) -> None:
        if (self.cur, peer) in self.peer_enable_calls:
            raise _FakeCudaError(704, "cudaErrorPeerAccessAlreadyEnabled")
        self.peer_enable_calls.append((self.cur, peer))


_CUDA_DTYPES = {0: np.float32, 2: np.float16}  # cudaDataType: CUDA_R_32F, CUDA_R_16F


def _colmajor(addr: int, rows: int, cols: int, ld: int, dtype) -> np.ndarray:
    """A column-major ``rows x cols`` matrix with leading dimension ``ld`` (elements) at ``addr``,
    as a NumPy ``(rows, cols)`` view."""
    size = np.dtype(dtype).itemsize
    return _at(addr, (rows, cols), (size, ld * size), dtype).T


class _FakeCublas:
    """``cupy_backends.cuda.libs.cublas``: ``setStream`` and ``gemmEx`` (column-major, host
    pointer mode; f16/f32 operands; computed in float32 with NumPy, i.e. f32 accumulation as
    ``CUBLAS_COMPUTE_32F``). Each gemmEx is recorded in :data:`GEMMEX_CALLS` and counted as one
    launch; while a stream captures it is recorded, not run."""

    CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_COMPUTE_32F = 0, 1, 68

    def __init__(self) -> None:
        self.streams: dict[int, int] = {}

    def setStream(self, handle: int, stream: int) -> None:  # noqa: N802 - CuPy's name
        self.streams[int(handle)] = int(stream)

    def gemmEx(self, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb,  # noqa: N802
               beta, C, Ctype, ldc, computeType, algo) -> None:
        _maybe_fail("cublas.gemmEx")
        args = dict(handle=handle, transa=transa, transb=transb, m=m, n=n, k=k, A=A, Atype=Atype,
                    lda=lda, B=B, Btype=Btype, ldb=ldb, C=C, Ctype=Ctype, ldc=ldc,
                    computeType=computeType, algo=algo, stream=self.streams.get(int(handle)))
        if int(computeType) != self.CUBLAS_COMPUTE_32F or Ctype not in _CUDA_DTYPES:
            raise NotImplementedError(f"fake gemmEx: computeType {computeType}, Ctype {Ctype}")
        al = float(ctypes.c_float.from_address(int(alpha)).value)
        be = float(ctypes.c_float.from_address(int(beta)).value)
        GEMMEX_CALLS.append(args)

        def run() -> None:
            ta, tb = int(transa) == self.CUBLAS_OP_T, int(transb) == self.CUBLAS_OP_T
            a = _colmajor(int(A), *((k, m) if ta else (m, k)), int(lda), _CUDA_DTYPES[int(Atype)])
            b = _colmajor(int(B), *((n, k) if tb else (k, n)), int(ldb), _CUDA_DTYPES[int(Btype)])
            c = _colmajor(int(C), int(m), int(n), int(ldc), _CUDA_DTYPES[int(Ctype)])
            opa = (a.T if ta else a).astype(np.float32)
            opb = (b.T if tb else b).astype(np.float32)
            r = _F(al) * (opa @ opb)
            if be != 0.0:
                r = r + _F(be) * c.astype(np.float32)
            c[...] = r.astype(c.dtype)

        if _capturing():
            return _record(run)
        _LAUNCHES[0] += 1
        run()


class _FakeCuda:
    def __init__(self, rt: _FakeRuntime) -> None:
        self.runtime = rt
        fake = self
        self.current_streams: list = []  # ``with stream:`` nesting (the current stream is last)
        self.cublas = _FakeCublas()

        class Device:
            def __init__(self, dev: int | None = None) -> None:
                self.dev = rt.cur if dev is None else dev  # None: the current device, as CuPy

            @property
            def cublas_handle(self) -> int:
                _maybe_fail("cublas_handle")
                return 1

            def __enter__(self):
                self.prev, rt.cur = rt.cur, self.dev
                return self

            def __exit__(self, *exc):
                rt.cur = self.prev

        ptrs = itertools.count(0x1000)

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                assert non_blocking  # the runtime must ask for a non-blocking stream
                self.ptr = next(ptrs)
                self.device = rt.cur

            def synchronize(self) -> None:
                _maybe_fail("Stream.synchronize")
                _no_sync("Stream.synchronize")

            def wait_event(self, event) -> None:
                assert isinstance(event, fake.Event)

            def begin_capture(self, mode=None) -> None:
                global _REC
                _maybe_fail("Stream.begin_capture")
                if _REC is not None:
                    raise _FakeCudaError(900, "cudaErrorStreamCaptureUnsupported: already capturing")
                _REC = []
                self.capturing = True

            def end_capture(self):
                global _REC
                if not getattr(self, "capturing", False):
                    raise _FakeCudaError(400, "cudaErrorIllegalState: not capturing")
                ops, _REC, self.capturing = _REC, None, False
                _maybe_fail("Stream.end_capture")
                return Graph(ops)

            def is_capturing(self) -> bool:
                return bool(getattr(self, "capturing", False))

            def __enter__(self):
                fake.current_streams.append(self)
                return self

            def __exit__(self, *exc):
                fake.current_streams.pop()

        class Event:
            def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
                self.recorded = 0

            def record(self, stream) -> None:
                assert isinstance(stream, Stream)
                _maybe_fail("Event.record")
                self.recorded += 1

            def synchronize(self) -> None:
                _maybe_fail("Event.synchronize")

            @property
            def done(self) -> bool:
                return not _HOLD[0]  # held: "still running" until a synchronize reaps it

        class Graph:
            """``cupy.cuda.Graph``: replays the recorded launch list; one counted launch."""

            def __init__(self, ops) -> None:
                self.ops = ops

            def launch(self, stream=None) -> None:
                _maybe_fail("Graph.launch")
                _LAUNCHES[0] += 1
                _GRAPH_LAUNCHES[0] += 1
                with np.errstate(all="ignore"):
                    for op in self.ops:
                        op()

        class MemoryPool:
            def __init__(self) -> None:
                _POOLS[0] += 1
                self.freed = False

            def malloc(self, size: int):
                raise NotImplementedError("the fake's arrays do not come from a pool")

            def free_all_blocks(self) -> None:
                self.freed = True

        class UnownedMemory:
            def __init__(self, ptr: int, size: int, owner, device_id: int) -> None:
                self.ptr, self.size, self.owner = ptr, size, owner

        class MemoryPointer:
            def __init__(self, mem, offset: int) -> None:
                self.mem, self.ptr = mem, mem.ptr + offset

        Stream.ptds = Stream(non_blocking=True)
        Stream.null = type("NullStream", (), {"ptr": 0})()
        self.get_current_stream = lambda: (fake.current_streams[-1] if fake.current_streams
                                           else Stream.null)
        self.Device, self.Stream, self.Event = Device, Stream, Event
        self.Graph, self.MemoryPool = Graph, MemoryPool

        from contextlib import nullcontext  # noqa: PLC0415

        self.using_allocator = lambda allocator=None: nullcontext()
        self.UnownedMemory, self.MemoryPointer = UnownedMemory, MemoryPointer

    pinned_allocs = 0

    def alloc_pinned_memory(self, size: int) -> bytearray:
        _maybe_fail("alloc_pinned_memory")
        _FakeCuda.pinned_allocs += 1
        return bytearray(size)


class _FakeNdarray(np.ndarray):
    """``cupy.ndarray(shape, dtype, memptr, strides)`` over host memory at ``memptr.ptr``."""

    def __new__(cls, shape, dtype, memptr, strides):
        span = memptr.mem.size - (memptr.ptr - memptr.mem.ptr)
        raw = (ctypes.c_char * span).from_address(memptr.ptr)
        arr = np.ndarray.__new__(_CountingArray, shape, dtype, raw, 0, strides)
        arr._memptr = memptr  # keeps the memory's owner alive, as CuPy's arrays do
        return arr


def _plain(x):
    if isinstance(x, _CountingArray):
        return x.view(np.ndarray)
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def _wrap(r):
    if type(r) is np.ndarray:
        return r.view(_CountingArray)
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)
    return r


#: array functions that only build views or answer questions: no kernel in CuPy
_NO_LAUNCH = frozenset({
    "reshape", "transpose", "broadcast_to", "expand_dims", "squeeze", "moveaxis", "swapaxes",
    "shape", "ndim", "size", "may_share_memory", "shares_memory", "result_type", "can_cast",
    "as_strided", "broadcast_arrays", "atleast_1d", "atleast_2d", "atleast_3d", "ravel",
    "diagonal", "real", "imag", "iscomplexobj", "isrealobj", "empty_like", "split", "array_split",
})


def _rewrite(r, call):
    """Record ``call()`` re-run into result ``r`` (an array or a tuple of arrays)."""
    if isinstance(r, np.ndarray):
        _record(lambda: np.copyto(r, call()))
    elif isinstance(r, tuple) and all(isinstance(v, np.ndarray) for v in r):
        def again():
            for dst, v in zip(r, call()):
                np.copyto(dst, v)
        _record(again)


def _is_view_of(r, args) -> bool:
    return isinstance(r, np.ndarray) and any(
        isinstance(a, np.ndarray) and np.may_share_memory(r, a) for a in args)


class _CountingArray(np.ndarray):
    """A NumPy array that counts the kernel launches CuPy would issue for it (see the module doc);
    while a fake stream captures, operations are recorded instead of counted."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kw):
        kw = {k: _plain(v) for k, v in kw.items()}
        pin = _plain(inputs)
        if out is not None:
            kw["out"] = _plain(out)
        if not _capturing():
            _LAUNCHES[0] += 1
            r = getattr(ufunc, method)(*pin, **kw)
        elif out is not None or method == "at":  # writes device memory: recorded, not run
            _record(lambda: getattr(ufunc, method)(*pin, **kw))
            r = None
        else:  # a pure computation: run for its result array, recorded as a rewrite of it
            r = getattr(ufunc, method)(*pin, **kw)
            if isinstance(r, np.generic):
                r = np.asarray(r)
            res = r if isinstance(r, tuple) or method != "__call__" else (r,)
            _record(lambda: getattr(ufunc, method)(*pin, **kw, out=res))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(r)

    def __array_function__(self, func, types_, args, kwargs):
        pargs = _plain(args)
        pkw = {k: _plain(v) for k, v in kwargs.items()}
        name = func.__name__
        if name == "take" and "mode" not in pkw:
            pkw["mode"] = "wrap"  # CuPy's take wraps out-of-range indices
        if not _capturing():
            if name not in _NO_LAUNCH:
                _LAUNCHES[0] += 1
            r = func(*pargs, **pkw)
        elif name == "copyto" or pkw.get("out") is not None:  # writes: recorded, not run
            _record(lambda: func(*pargs, **pkw))
            r = pkw.get("out")
        else:
            r = func(*pargs, **pkw)
            if not (name in _NO_LAUNCH and (_is_view_of(r, pargs) or not isinstance(r, np.ndarray))):
                if isinstance(r, np.generic):
                    r = np.asarray(r)
                _rewrite(r, lambda: func(*pargs, **pkw))
        if name == "copyto":
            return None
        return _wrap(r)

    def astype(self, *a, **k):
        me = self.view(np.ndarray)
        if not _capturing():
            _LAUNCHES[0] += 1
            return _wrap(me.astype(*a, **k))
        r = me.astype(*a, **k)
        if r is not me:
            _rewrite(r, lambda: me.astype(*a, **k))
        return _wrap(r)

    def copy(self, *a, **k):
        me = self.view(np.ndarray)
        if not _capturing():
            _LAUNCHES[0] += 1
            return _wrap(me.copy(*a, **k))
        r = me.copy(*a, **k)
        _rewrite(r, lambda: me.copy(*a, **k))
        return _wrap(r)

    def _maybe_copy(self, name, *a, **k):
        """``reshape``/``ravel``/``flatten``: a view when possible, else a copy kernel (counted,
        or recorded while capturing), as in CuPy."""
        me = self.view(np.ndarray)
        r = getattr(me, name)(*a, **k)
        if not np.may_share_memory(r, me):
            if _capturing():
                _rewrite(r, lambda: getattr(me, name)(*a, **k))
            else:
                _LAUNCHES[0] += 1
        return _wrap(r)

    def reshape(self, *a, **k):
        return self._maybe_copy("reshape", *a, **k)

    def ravel(self, *a, **k):
        return self._maybe_copy("ravel", *a, **k)

    def flatten(self, *a, **k):
        return self._maybe_copy("flatten", *a, **k)

    def __setitem__(self, key, value):
        me, v = self.view(np.ndarray), _plain(value)
        if _capturing():
            return _record(lambda: me.__setitem__(key, v))
        me[key] = v

    def __getitem__(self, key):
        if isinstance(key, tuple) and any(isinstance(k, np.ndarray) and k.dtype.kind in "iu"
                                          for k in key):
            # CuPy wraps out-of-range integer-array indices (advanced indexing), never raises
            key = tuple(np.asarray(k) % self.shape[d]
                        if isinstance(k, np.ndarray) and k.dtype.kind in "iu" else k
                        for d, k in enumerate(key))
        r = np.ndarray.__getitem__(self, key)
        if isinstance(r, np.generic):  # CuPy gives a 0-d device array, not a host scalar
            r = np.ndarray.__getitem__(self, (key if isinstance(key, tuple) else (key,)) + (Ellipsis,))
        if _capturing() and isinstance(r, np.ndarray) and not np.may_share_memory(r, self):
            me, rr = self.view(np.ndarray), r.view(np.ndarray)
            _record(lambda: np.copyto(rr, me[key]))
        return r

    def __dlpack__(self, *, stream=None, **kw):
        """Host-emulated export (device kCPU); records ``(consumer stream, current stream)`` in
        ``DLPACK_CALLS`` so tests see which streams an export was ordered with."""
        cur = _CURRENT[0]() if _CURRENT[0] is not None else None
        DLPACK_CALLS.append((stream, cur))
        return np.ndarray.__dlpack__(self.view(np.ndarray), stream=None, **kw)

    # values read back to the host: not allowed while capturing (CuPy: synchronous transfer)
    def __float__(self):
        _no_sync("float()")
        return float(self.view(np.ndarray))

    def __int__(self):
        _no_sync("int()")
        return int(self.view(np.ndarray))

    def __bool__(self):
        _no_sync("bool()")
        return bool(self.view(np.ndarray))

    def item(self, *a):
        _no_sync("item()")
        return self.view(np.ndarray).item(*a)

    def tolist(self):
        _no_sync("tolist()")
        return self.view(np.ndarray).tolist()


# ---------------------------------------------------------------------------------------------
# RawKernel emulation (NumPy, float32 maths of ggmlpy.backends.cuda.kernels' sources)


def _at(addr: int, ne, nb, dtype=np.float32) -> np.ndarray:
    """A NumPy view (shape ne[::-1]) of device memory at ``addr`` with byte strides ``nb``."""
    span = sum((n - 1) * s for n, s in zip(ne, nb)) + np.dtype(dtype).itemsize
    raw = (ctypes.c_char * span).from_address(addr)
    return np.ndarray(tuple(ne[::-1]), dtype, raw, 0, tuple(nb[::-1]))


def _addr(a) -> int:
    return int(a.ctypes.data)


_F = np.float32


def _gelu(x):
    return _F(0.5) * x * (_F(1) + np.tanh(_F(0.7978845608028654) * x * (_F(1) + _F(0.044715) * x * x)))


def _gelu_erf(x):
    return (_F(0.5) * x * (_F(1) + special.erf(x * _F(0.7071067811865476)).astype(_F))).astype(_F)


def _silu(x):
    return x / (_F(1) + np.exp(-x))


_EW = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y, "gelu": lambda x, y: _gelu(x), "gelu_erf": lambda x, y: _gelu_erf(x),
    "silu": lambda x, y: _silu(x), "swiglu": lambda x, y: _silu(x) * y,
    "geglu": lambda x, y: _gelu(x) * y, "geglu_erf": lambda x, y: _gelu_erf(x) * y,
    "reglu": lambda x, y: np.maximum(x, _F(0)) * y,
}


def _emu_ew(op, args):
    a, b, d, n, ne0, ne1, ne2 = args[:7]
    a_nb, b_ne, b_nb, d_nb = args[7:11], args[11:15], args[15:19], args[19:23]
    ne = (int(ne0), int(ne1), int(ne2), int(n) // (int(ne0) * int(ne1) * int(ne2)))
    x = _at(_addr(a), ne, [int(v) for v in a_nb])
    bne = [int(v) for v in b_ne]
    y = _at(_addr(b), bne, [int(v) for v in b_nb])
    y = np.tile(y, tuple(ne[::-1][i] // bne[::-1][i] for i in range(4)))
    out = _at(_addr(d), ne, [int(v) for v in d_nb])
    with np.errstate(all="ignore"):
        out[...] = _EW[op](x.copy(), y.copy()).astype(_F)


def _run_row_norm(grid, args):
    a, d, ne0, ne1, ne2, a1, a2, a3, d1, d2, d3, eps, mode = args
    ne0, ne1, ne2, eps, mode = int(ne0), int(ne1), int(ne2), _F(eps), int(mode)
    anb, dnb = (a1, a2, a3), (d1, d2, d3)
    ne = (ne0, ne1, ne2, grid // (ne1 * ne2))  # one block per row: ne3 from the grid
    x = _at(_addr(a), ne, [4] + [int(v) for v in anb]).copy()
    out = _at(_addr(d), ne, [4] + [int(v) for v in dnb])
    with np.errstate(all="ignore"):
        q = (x * x).sum(axis=-1, keepdims=True, dtype=_F)
        shift = _F(0)
        if mode == 0:
            s = x.sum(axis=-1, keepdims=True, dtype=_F)
            shift = s / _F(ne0)
            inv = _F(1) / np.sqrt(q / _F(ne0) - shift * shift + eps)
        elif mode == 1:
            inv = _F(1) / np.sqrt(q / _F(ne0) + eps)
        else:
            inv = _F(1) / np.sqrt(np.maximum(q, eps * eps))
        out[...] = ((x - shift) * inv).astype(_F)


def _run_soft_max(grid, args):
    (a, m, d, ne0, ne1, ne2, a1, a2, a3, d1, d2, d3, mn2, mn3, mb0, mb1, mb2, mb3,
     mtype, scale, max_bias, m0, m1, n_log2) = args
    ne0, ne1, ne2 = int(ne0), int(ne1), int(ne2)
    ne = (ne0, ne1, ne2, grid // (ne1 * ne2))
    x = _at(_addr(a), ne, [4, int(a1), int(a2), int(a3)]).copy() * _F(scale)
    out = _at(_addr(d), ne, [4, int(d1), int(d2), int(d3)])
    with np.errstate(all="ignore"):
        if int(mtype):
            mt = _F if int(mtype) == 1 else np.float16
            mne = (ne0, ne1, int(mn2), int(mn3))
            mk = _at(_addr(m), mne, [int(mb0), int(mb1), int(mb2), int(mb3)], mt).astype(_F)
            mk = mk[np.arange(ne[3]) % int(mn3)][:, np.arange(ne2) % int(mn2)]
            h = np.arange(ne2)
            if float(max_bias) > 0:
                slope = np.where(h < int(n_log2), np.power(_F(m0), (h + 1).astype(_F)),
                                 np.power(_F(m1), (2 * (h - int(n_log2)) + 1).astype(_F))).astype(_F)
            else:
                slope = np.ones(ne2, _F)
            x = x + slope.reshape(1, ne2, 1, 1) * mk
        x = x - x.max(axis=-1, keepdims=True)
        e = np.exp(x).astype(_F)
        out[...] = e * (_F(1) / e.sum(axis=-1, keepdims=True, dtype=_F))


class _FakeRawModule:
    """``cupy.RawModule(code=...)``: ``get_function(name)`` gives a :class:`_FakeRawKernel`."""

    def __init__(self, code: str, **kw) -> None:
        self.code = code

    def get_function(self, name: str) -> _FakeRawKernel:
        return _FakeRawKernel(self.code, name)


class _FakeRawKernel:
    """``cupy.RawKernel(code, name)``: checks the name is defined in ``code``; calling it runs the
    NumPy emulation and counts one launch."""

    def __init__(self, code: str, name: str, options=(), **kw) -> None:
        if f"void {name}(" not in code:
            raise ValueError(f"kernel {name} not in its source")
        self.name = name

    def __call__(self, grid, block, args) -> None:
        _maybe_fail("RawKernel")
        assert len(grid) == 1 and len(block) == 1 and block[0] % 32 == 0 and block[0] <= 1024
        args = tuple(_plain(a) for a in args)
        if _capturing():  # recorded, not run (a CUDA graph node)
            return _record(lambda: self._run(grid, args))
        _LAUNCHES[0] += 1
        self._run(grid, args)

    def _run(self, grid, args) -> None:
        if self.name == "ggmlpy_probe":
            a, v = args
            _at(_addr(a), (1, 1, 1, 1), (4, 4, 4, 4))[...] = _F(v) + _F(1)
        elif self.name.startswith("ggmlpy_ew_"):
            _emu_ew(self.name[len("ggmlpy_ew_"):], args)
        elif self.name == "ggmlpy_row_norm":
            _run_row_norm(int(grid[0]), args)
        elif self.name == "ggmlpy_soft_max":
            _run_soft_max(int(grid[0]), args)
        elif self.name.startswith("ggmlpy_dequant_"):  # backends/cuda_quant.py
            fake_cupy_quant.run_dequant(self.name, args)
        else:
            raise NotImplementedError(self.name)


class FakeCupy:
    """A module-like stand-in for ``cupy``: ``cuda.*`` as above, arrays and math from NumPy."""

    __version__ = "fake"

    def __init__(self, n_devices: int = 2, capacity: int = 64 << 20) -> None:
        self.cuda = _FakeCuda(_FakeRuntime(n_devices, capacity))
        cs = self.cuda.current_streams
        _CURRENT[0] = lambda: cs[-1] if cs else None
        self.ndarray = _FakeNdarray
        self.uint8 = np.uint8
        self.RawKernel = _FakeRawKernel
        self.RawModule = _FakeRawModule
        self._pool = type("Pool", (), {"free_all_blocks": lambda self: None})()
        self.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(
            as_strided=partial(np.lib.stride_tricks.as_strided, subok=True)))

    @staticmethod
    def launch_count() -> int:
        """Kernel launches issued through fake arrays and RawKernels so far (all fakes)."""
        return _LAUNCHES[0]

    @staticmethod
    def fail_next(path: str, exc: BaseException) -> None:
        """Make the next call of ``path`` (see the module doc) raise ``exc``."""
        _FAILS[path] = exc

    @staticmethod
    def hold_events(on: bool) -> None:
        """While on, ``Event.done`` is False: queued copies look in flight until a synchronize."""
        _HOLD[0] = bool(on)

    @staticmethod
    def graph_launches() -> int:
        """``cuda.Graph.launch`` calls so far (all fakes)."""
        return _GRAPH_LAUNCHES[0]

    @staticmethod
    def pools_made() -> int:
        """``cuda.MemoryPool`` objects made so far (all fakes)."""
        return _POOLS[0]

    @staticmethod
    def pinned_allocs() -> int:
        return _FakeCuda.pinned_allocs

    def get_default_memory_pool(self):
        return self._pool

    def __getattr__(self, name: str):
        return getattr(np, name)


def fake_cuda_reg(n_devices: int = 2, capacity: int = 64 << 20):
    """A CUDA reg whose runtime is :class:`cupy_runtime.CupyRuntime` over :class:`FakeCupy`."""
    from ggmlpy.backends.device.backend import make_reg

    return make_reg(cupy_runtime.CupyRuntime(FakeCupy(n_devices, capacity)))
