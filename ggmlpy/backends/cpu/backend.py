"""The NumPy CPU backend (mirrors ``ggml-cpu``'s backend glue and ``ggml_backend_cpu_buffer_type``).

Memory is host NumPy ``uint8`` arrays aligned to 64 bytes; tensors are exposed to kernels as NumPy
views shaped ``ne[::-1]`` with strides ``nb[::-1]`` (no copies). ``graph_compute`` is synchronous:
it resolves the graph once into a :class:`~ggmlpy.backends.plan.Plan` (ggml's ``graph_plan``),
caches it while the graph and its allocation are unchanged, and runs it. Large nodes run on
``n_threads`` threads (ggml's ``n_threads``; :mod:`ggmlpy.backends.cpu.threads`).
"""

from __future__ import annotations

import gc
import mmap
import os
import platform
import uuid
import weakref
from functools import lru_cache
from typing import Any

import numpy as np

from ggmlpy.backend.interface import (
    Backend,
    Buffer,
    BufferType,
    Device,
    DeviceCaps,
    DeviceProps,
    DeviceType,
    Reg,
    Status,
)
from ggmlpy.backend.registry import BackendFactory
from ggmlpy.backend.write_gen import host_reads_pending
from ggmlpy.backends import kernels
from ggmlpy.backends.cpu import blas as cpu_blas
from ggmlpy.backends.cpu import threads as cpu_threads
from ggmlpy.backends.cpu import variants as cpu_variants
from ggmlpy.backends.plan import Plan, PlanCache, build_plan
from ggmlpy.core.errors import OutOfMemoryError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor

__all__ = ["HostBuffer", "ReadOnlyHostBuffer", "CPUBufferType", "CPUBackend", "CPUDevice",
           "cpu_buffer_type", "cpu_buffer_from_array", "cpu_buffer_from_mapped", "backend_cpu_init",
           "cpu_device", "cpu_reg", "host_array", "TENSOR_ALIGNMENT", "MEMORY_ALIGNMENT"]

#: Alignment of tensor offsets in CPU buffers, in bytes (ggml's ``TENSOR_ALIGNMENT``).
TENSOR_ALIGNMENT = 32
#: Alignment of the base address of CPU buffer memory, in bytes.
MEMORY_ALIGNMENT = 64


#: buffers from this many bytes are mapped with their pages populated up front (Linux)
POPULATE_MIN_BYTES = 1 << 20
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", None)


def _free_physical_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not available here: never populate
        return 0


def _aligned_bytes(size: int, align: int = MEMORY_ALIGNMENT) -> np.ndarray:
    """``size`` bytes of host memory, base aligned to ``align`` (<= the page size). From
    :data:`POPULATE_MIN_BYTES` on Linux, an anonymous mapping made with ``MAP_POPULATE``: the
    kernel maps every page at once instead of one fault per 4 KiB page on first write, which
    made the first graph evaluation after a reserve pay for a page fault per page; the
    memory is zeroed and unmapped when the last view of it is gone. Only while ``size`` is at
    most half the free physical memory: populated pages are committed at once, so a request
    beyond it would meet the kernel's OOM killer instead of an error (lazily mapped memory, as
    ``malloc``'s in ggml, is only taken when written). Otherwise, and off Linux: ``np.empty``.

    Raises:
        MemoryError: the memory cannot be had.
    """
    if (_MAP_POPULATE is not None and size >= POPULATE_MIN_BYTES
            and size <= _free_physical_bytes() // 2):
        try:
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_POPULATE)
        except OSError as e:
            raise MemoryError(f"mmap of {size} bytes failed: {e}") from None
        return np.frombuffer(m, np.uint8)  # page-aligned; the array keeps the mapping alive
    raw = np.empty(size + align, dtype=np.uint8)
    shift = (-raw.ctypes.data) % align
    return raw[shift:shift + size]


def host_array(data: np.ndarray, t: Tensor) -> np.ndarray:
    """A NumPy view of tensor ``t`` inside host memory ``data`` (a 1-D uint8 array, the buffer's base).

    Plain types: dtype ``t.type.dtype``, shape ``ne[::-1]``, strides ``nb[::-1]``. Block-quantized
    types: raw ``uint8`` rows, shape ``(ne3, ne2, ne1, row_bytes)``. NumPy checks the view stays
    inside ``data`` (ValueError otherwise).
    """
    if t.type.is_quantized:
        row = t.type.row_size(t.ne[0])
        return np.ndarray((t.ne[3], t.ne[2], t.ne[1], row), np.uint8, data, t.offset,
                          (t.nb[3], t.nb[2], t.nb[1], 1))
    return np.ndarray(t.ne[::-1], t.type.dtype, data, t.offset, t.nb[::-1])


class HostBuffer(Buffer):
    """A buffer of host memory held as a 1-D ``uint8`` NumPy array ``data`` (CPU, pinned CUDA_Host,
    or user memory wrapped by :func:`cpu_buffer_from_array`). All hooks are synchronous."""

    def __init__(self, buft: BufferType, data: np.ndarray, owner: Any = None) -> None:
        super().__init__(buft, data.size)
        self.data = data
        self._owner = owner  # keeps wrapped memory (e.g. pinned allocations, user arrays) alive

    def _free(self) -> None:
        self.data = np.empty(0, np.uint8)
        self._owner = None

    def _set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int) -> None:
        start = tensor.offset + offset
        self.data[start:start + data.size] = data

    def _get_tensor(self, tensor: Tensor, offset: int, size: int) -> np.ndarray:
        start = tensor.offset + offset
        return self.data[start:start + size].copy()

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        start = tensor.offset + offset
        self.data[start:start + size] = value

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        sbuf = src.buffer
        view = sbuf._host_view(src) if sbuf is not None else None
        if view is not None:
            self.data[dst.offset:dst.offset + view.size] = view
            return True
        return False

    def _host_view(self, tensor: Tensor) -> np.ndarray:
        return self.data[tensor.offset:tensor.offset + tensor.nbytes]

    def _clear(self, value: int) -> None:
        self.data[:] = value

    def _array(self, tensor: Tensor) -> np.ndarray:
        return host_array(self.data, tensor)


class CPUBufferType(BufferType):
    """The "CPU" buffer type: host memory, 64-byte aligned base, 32-byte tensor alignment, no max size
    (mirrors ``ggml_backend_cpu_buffer_type``)."""

    def _alloc_buffer(self, size: int) -> Buffer:
        try:
            data = _aligned_bytes(size)
        except MemoryError:
            raise OutOfMemoryError(self.name, size, None) from None
        return HostBuffer(self, data)

    def _get_alignment(self) -> int:
        return TENSOR_ALIGNMENT

    def _is_host(self) -> bool:
        return True


@lru_cache(maxsize=1)
def cpu_buffer_type() -> CPUBufferType:
    """The CPU buffer type singleton (mirrors ``ggml_backend_cpu_buffer_type``)."""
    return CPUBufferType("CPU", None)


class _MappedBufferType(CPUBufferType):
    def _alloc_buffer(self, size: int) -> Buffer:
        raise ValueError("CPU_Mapped buffers wrap user memory; use cpu_buffer_from_array")


@lru_cache(maxsize=1)
def _mapped_buffer_type() -> _MappedBufferType:
    return _MappedBufferType("CPU_Mapped", None)


def cpu_buffer_from_array(array: np.ndarray) -> HostBuffer:
    """Wrap user memory as a CPU buffer without copying (mirrors ``ggml_backend_cpu_buffer_from_ptr``).

    Tensors placed in the buffer read and write ``array``'s memory directly; the buffer keeps a
    reference to ``array``. The buffer type is "CPU_Mapped" (host).

    Args:
        array: a writable C-contiguous NumPy array whose data address is 32-byte aligned.

    Raises:
        TypeError: not a NumPy array. ValueError: not C-contiguous, not writable, or misaligned.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"cpu_buffer_from_array: expected a NumPy array, got {type(array).__name__}")
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("cpu_buffer_from_array: the array must be C-contiguous and writable")
    if array.ctypes.data % TENSOR_ALIGNMENT:
        raise ValueError(f"cpu_buffer_from_array: the array's address is not "
                         f"{TENSOR_ALIGNMENT}-byte aligned")
    return HostBuffer(_mapped_buffer_type(), array.reshape(-1).view(np.uint8), owner=array)


class ReadOnlyHostBuffer(HostBuffer):
    """A :class:`HostBuffer` over read-only memory (a file mapped read-only, as llama.cpp maps a
    model file): kernels read its tensors in place; every write raises."""

    def _refuse(self, what: str) -> None:
        raise ValueError(f"{what}: buffer {self.name} is read-only memory (a mapped file)")

    def _set_tensor(self, tensor: Tensor, data: np.ndarray, offset: int) -> None:
        self._refuse(f"set_tensor of '{tensor.name}'")

    def _memset_tensor(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._refuse(f"memset_tensor of '{tensor.name}'")

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        self._refuse(f"copy into '{dst.name}'")
        return False

    def _clear(self, value: int) -> None:
        self._refuse("clear")


def cpu_buffer_from_mapped(array: np.ndarray) -> HostBuffer:
    """Wrap read-only host memory, e.g. a memory-mapped model file, as a "CPU_Mapped" buffer
    without copying (llama.cpp's ``llama_model_loader`` with ``use_mmap``: the mapping wrapped by
    ``ggml_backend_cpu_buffer_from_ptr``). Tensors placed in it (``tensor_alloc`` at their byte
    offset in ``array``) are read in place by the kernels; ``set_tensor``, ``memset_tensor``,
    copies into it and ``clear`` raise ValueError. The buffer keeps a reference to ``array``.

    Args:
        array: a 1-D C-contiguous uint8 NumPy array (read-only or not) whose data address is
            32-byte aligned; its size is the buffer's size in bytes.

    Raises:
        TypeError: not a NumPy array. ValueError: not 1-D C-contiguous uint8, or misaligned.
    """
    if not isinstance(array, np.ndarray):
        raise TypeError(f"cpu_buffer_from_mapped: expected a NumPy array, got "
                        f"{type(array).__name__}")
    if array.ndim != 1 or array.dtype != np.uint8 or not array.flags.c_contiguous:
        raise ValueError(f"cpu_buffer_from_mapped: the array must be 1-D C-contiguous uint8, got "
                         f"{array.dtype} {array.shape}")
    if array.ctypes.data % TENSOR_ALIGNMENT:
        raise ValueError(f"cpu_buffer_from_mapped: the array's address is not "
                         f"{TENSOR_ALIGNMENT}-byte aligned")
    return ReadOnlyHostBuffer(_mapped_buffer_type(), array, owner=array)


def _batched(graph: Graph) -> bool:
    """Whether a MUL_MAT or FLASH_ATTN_EXT of ``graph`` has more than one activation (query)
    row: a prompt batch rather than one generated token."""
    return any(n.op in (Op.MUL_MAT, Op.FLASH_ATTN_EXT) and len(n.src) > 1
               and n.src[1 if n.op == Op.MUL_MAT else 0].ne[1] > 1 for n in graph.nodes)


class CPUBackend(Backend):
    """The NumPy CPU backend: synchronous ``graph_compute`` over cached plans (mirrors ``ggml_backend_cpu``).

    It reads and writes any host buffer (CPU, CPU_Mapped, pinned CUDA_Host).
    """

    guid = uuid.UUID("5e2c3f1a-8b7d-4c6e-9a0f-1c2d3e4f5a6b")

    def __init__(self, device: CPUDevice) -> None:
        super().__init__(device)
        # as many plans as BertModel keeps batch graphs (models.bert.GRAPH_CACHE_SIZE): a
        # stream of batch shapes does not evict the plans of graphs still cached
        self._plans = PlanCache(self._build_plan, maxsize=64)
        self._n_threads = cpu_threads.default_n_threads()
        self._new_pool()

    @property
    def plan_cache(self) -> PlanCache:
        """The backend's compiled plans per graph (read-only attribute): ``len()``, ``builds``
        and ``stats()`` count them; ``get(graph)`` is the plan the next ``graph_compute(graph)``
        runs (built now if the graph changed). Emptied when the thread count changes."""
        return self._plans

    def _new_pool(self) -> None:
        # the GEMM library (GGMLPY_BLAS) is loaded now, not in the first graph evaluation, and
        # before threadpoolctl looks for the BLAS libraries to hold
        cpu_blas.warm_up()
        # the worker threads stop when the backend is freed or garbage-collected
        self._pool = cpu_threads.Pool(self._n_threads)
        if self._n_threads > 1:
            # find the BLAS libraries now (threadpoolctl inspects every loaded library: ~15 ms
            # in a process with torch), not in the first threaded graph evaluation
            cpu_threads.find_blas_libs()
        self._pool_finalizer = weakref.finalize(self, cpu_threads.Pool.close, self._pool)

    @property
    def n_threads(self) -> int:
        """Threads a node of a computed graph may run on (>= 1); see :meth:`set_n_threads`."""
        return self._n_threads

    def set_n_threads(self, n_threads: int) -> None:
        """Run large nodes on ``n_threads`` threads (mirrors ``ggml_backend_cpu_set_n_threads``).

        The default is the thread count of NumPy's BLAS (``OPENBLAS_NUM_THREADS`` /
        ``OMP_NUM_THREADS``), capped at the core count (1 without ``threadpoolctl``). With more
        than one thread, BLAS is held at one thread while a plan runs and GEMMs are split like
        the other ops (:mod:`ggmlpy.backends.cpu.threads`). Plans built before are dropped.

        Raises:
            TypeError: ``n_threads`` is not an int (a bool or float is refused).
            ValueError: ``n_threads`` is not in 1..:data:`~ggmlpy.backends.cpu.threads.MAX_N_THREADS`
                (512, ggml's ``GGML_MAX_N_THREADS``).
        """
        top = cpu_threads.MAX_N_THREADS
        if isinstance(n_threads, bool) or not isinstance(n_threads, (int, np.integer)):
            raise TypeError(f"set_n_threads: n_threads must be an int in 1..{top}, "
                            f"got {type(n_threads).__name__} {n_threads!r}")
        n_threads = int(n_threads)
        if not 1 <= n_threads <= top:
            raise ValueError(f"set_n_threads: n_threads must be an int in 1..{top}, "
                             f"got {n_threads!r}")
        if n_threads != self._n_threads:
            self._pool_finalizer()
            self._n_threads = n_threads
            self._new_pool()
            self._plans.clear()

    def _compile_node(self, xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Any:
        # one thread: the unsplit step. Several: the node's slices when it is split (its
        # unsplit step is then compiled only if it ends up running alone, cpu_threads.Split),
        # else the unsplit step
        if self._n_threads >= 2:
            split = cpu_threads.split_step(xp, node, dst, srcs, self._pool, kernels.compile_node)
            if split is not None:
                return split
        return kernels.compile_node(xp, node, dst, srcs)

    def _build_plan(self, graph: Graph) -> Plan:
        # building allocates many small, mostly long-lived objects (steps, closures, views):
        # the cyclic collector is paused meanwhile, as in the scheduler's split (each of the
        # dozens of young-generation passes it would make also counts towards the next
        # full-heap pass)
        gc_on = gc.isenabled()
        if gc_on:
            gc.disable()
        try:
            return self._build_plan_paused(graph)
        finally:
            if gc_on:
                gc.enable()

    def _build_plan_paused(self, graph: Graph) -> Plan:
        with cpu_variants.plan_build_scope():
            plan = build_plan(graph, np, self.name, _is_host_tensor, self.device.supports_op,
                              self._compile_node)
            if self._n_threads > 1:
                plan.steps, plan.nodes = cpu_threads.fuse_chains(plan.steps, plan.nodes)
                cpu_threads.compile_pending(plan.steps)
                # BLAS is held at one thread while a plan with split steps runs (their slices
                # call BLAS from several threads at once), and while one with dot tasks runs a
                # batch of several rows: its unsplit steps (a flash attention's products of
                # query chunks) may call NumPy's BLAS with operands large enough for a
                # multithreaded OpenBLAS, whose worker then spins for a while after each call,
                # on the core the dot tasks' worker needs (a 128-token prompt ran slower on two
                # threads than on one). Dot tasks call no BLAS: a plan of one-row products
                # (token generation) keeps BLAS as it is, which spares every evaluation two
                # thread-count changes of the BLAS library (on OpenBLAS each one costs more than
                # a small matrix-vector product). (A step the plan builder wrapped keeps the
                # wrapped one as ``step``.)
                kinds = {type(getattr(s, "step", s)) for s in plan.steps}
                # Any batched plan holds it, whatever its step kinds: OpenBLAS's bits depend on
                # its thread count, so a hold that came and went with the kinds (which differ
                # with where the tensors lie) changed the products' bits with the placement.
                plan.threaded = cpu_threads.Split in kinds or _batched(graph)
        return plan

    def _run(self, plan: Plan) -> None:
        if host_reads_pending():
            # queued copies (a device's upload from pinned memory) may still read bytes this
            # plan writes: wait for those (the host-read rule, ggmlpy.backend.write_gen)
            plan.wait_host_reads()
        if plan.threaded:  # decided at build: a plan without Split steps keeps BLAS as it is
            with cpu_threads.blas_single_thread():
                plan.run()
        else:
            plan.run()

    # plan hooks of the backend contract (facades: Backend.graph_plan_*) -------------------------
    def _graph_plan_create(self, graph: Graph) -> Plan:
        # a fresh plan, not the cached one: the caller owns it
        return self._build_plan(graph)

    def _graph_plan_compute(self, plan: Plan) -> Status:
        # synchronous: runs on the calling thread (and the backend's worker threads)
        plan.check_live(self.name)
        self._run(plan)
        return Status.SUCCESS

    def _graph_compute(self, graph: Graph) -> Status:
        plan = self._plans.get(graph)
        plan.check_live(self.name)
        self._run(plan)
        return Status.SUCCESS

    def _free(self) -> None:
        self._pool_finalizer()


def _is_host_tensor(t: Tensor) -> bool:
    buf = t.buffer
    return buf is not None and buf.buft.is_host()


class CPUDevice(Device):
    """The CPU device (mirrors ``ggml_backend_cpu_device``); always registered, always last."""

    _CAPS = DeviceCaps(async_=False, host_buffer=False, buffer_from_host_ptr=True, events=False)

    @property
    def name(self) -> str:
        """"CPU" (without reading the memory figures)."""
        return "CPU"

    @property
    def type(self) -> DeviceType:
        """``DeviceType.CPU``."""
        return DeviceType.CPU

    def _get_caps(self) -> DeviceCaps:
        return self._CAPS

    def _get_props(self) -> DeviceProps:
        total, free = _host_memory()
        return DeviceProps(
            name="CPU",
            description=(f"{platform.processor() or platform.machine()} (NumPy {np.__version__}, "
                         f"GEMM: {cpu_blas.describe()})"),
            memory_free=free, memory_total=total, type=DeviceType.CPU,
            caps=self._CAPS,
            extra={"threads": cpu_threads.default_n_threads(), "cores": os.cpu_count() or 1,
                   "gemm": cpu_blas.describe()})

    def _init_backend(self, params: str | None) -> Backend:
        if params:
            raise ValueError(f"init_backend: device CPU takes no params, got {params!r}")
        return CPUBackend(self)

    def _get_buffer_type(self) -> BufferType:
        return cpu_buffer_type()

    def _buffer_from_host_ptr(self, array: np.ndarray, max_tensor_size: int) -> Buffer:
        return cpu_buffer_from_array(array)

    def _supports_op(self, op: Tensor) -> bool:
        return kernels.supports_op(op, np)

    def supports_op_memo_token(self) -> tuple | None:
        """See :func:`kernel_memo_token`: the scheduler may cache this device's ``supports_op``
        answers by node key under the returned token; None when it must ask every time."""
        return kernel_memo_token(self, CPUDevice._supports_op)

    def _supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host()


def kernel_memo_token(device: Device, impl: Any) -> tuple | None:
    """A token under which a scheduler may cache ``device.supports_op(node)`` by the node's key
    (op, type, ne, nb, op_params, whether it is a view, and per source: op, type, ne, nb and the
    class and buffer type of its memory), or None when it may not.

    Valid for a device whose ``_supports_op`` is ``impl`` (a kernel-registry lookup that reads only
    those fields) with no subclass or instance override of ``supports_op``/``_supports_op``. The
    token changes when a kernel override is registered (overrides are only ever added), so the
    cached answers are not reused across that change. Cheap (once per split and backend)."""
    cls = type(device)
    if (cls._supports_op is not impl or cls.supports_op is not Device.supports_op
            or "_supports_op" in vars(device) or "supports_op" in vars(device)):
        return None
    reg = kernels.REGISTRY
    return ("kernels", sum(len(reg.overrides(o)) for o in reg.ops()))


def _host_memory() -> tuple[int, int]:
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info.get("MemTotal", 0), info.get("MemAvailable", info.get("MemFree", 0))
    except (OSError, ValueError, IndexError):
        return 0, 0


@lru_cache(maxsize=1)
def cpu_device() -> CPUDevice:
    """The CPU device singleton."""
    return CPUDevice()


@lru_cache(maxsize=1)
def cpu_reg() -> Reg:
    """The CPU backend registration (mirrors ``ggml_backend_cpu_reg``)."""
    return Reg("CPU", [cpu_device()])


def backend_cpu_init() -> CPUBackend:
    """A new CPU backend (mirrors ``ggml_backend_cpu_init``)."""
    return CPUBackend(cpu_device())


def alloc_host_zeroed(n: int) -> Buffer:
    """A zero-filled CPU buffer of ``n`` bytes (the host memory of ``Context(no_alloc=False)``)."""
    buf = cpu_buffer_type().alloc_buffer(n)
    buf.clear(0)
    return buf


#: the registry's entry for the CPU (installed by :func:`ggmlpy.backends.install`)
FACTORY = BackendFactory("CPU", 100, cpu_reg)
