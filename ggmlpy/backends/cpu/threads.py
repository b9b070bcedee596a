"""Multithreaded plan steps for the CPU backend (ggml's ``n_threads``: each node split over threads).

ggml's CPU backend runs every node on ``n_threads`` threads, each computing a slice of the rows.
The NumPy backend does the same for the nodes where it pays: at plan build time a large enough
node of a splittable op is compiled once per slice of its destination's outermost non-trivial
axis (NumPy axes 0-2, i.e. ggml dims 3-1; rows are never cut), each slice reading the matching
slices of its sources, and the step runs the slices on a :class:`Pool`: the calling thread
computes the first one while ``n_threads - 1`` worker threads compute the others (NumPy and the
Numba kernels release the GIL, so the slices really run at once).

BLAS threads. While a plan with :class:`Split` steps runs, the BLAS libraries NumPy loaded
(OpenBLAS, MKL, BLIS, found by ``threadpoolctl``) are held at one thread and MUL_MAT is split like
the other ops; so while a plan whose threaded steps are compiled dot tasks (:class:`DotStep`)
runs a batch of several rows (its unsplit steps may call BLAS; a plan of one-row products, token
generation, calls none and leaves it as it is): a
2-thread OpenBLAS leaves its worker spinning after each GEMM, and that spinning thread then
competes with the slices of the next node for the cores (a cheap node right after a threaded
GEMM then runs many times slower). The BLAS setting
is restored when the plan returns. Without ``threadpoolctl`` (the ``jit`` extra) the backend
runs with one thread (plans are then exactly the unthreaded ones).

Splittable ops (:data:`SPLIT_OPS`): element-wise (ADD, SUB, MUL, DIV with a source that is
either sliced alike or broadcast along the split axis; SCALE; UNARY; same-shape CPY/DUP/CONT),
row-wise (NORM, RMS_NORM, L2_NORM, SOFT_MAX without ALiBi, its mask sliced alike or broadcast),
MUL_MAT (split over the batch dims, or over the rows of ``src1`` with ``src0`` shared; on
the dot kernels of :mod:`ggmlpy.backends.cpu.qmatmul`, and on the GEMM path for a quantized
weight of many rows per activation row, over the rows of ``src0``) and
FLASH_ATTN_EXT (over its query rows, K and V shared).
Each slice computes exactly what the whole node computes for those rows, with the same kernel;
BLAS may block a GEMM of fewer rows differently, so MUL_MAT results can differ in the last
float32 bits from an unsplit product (as ggml's own results differ with ``n_threads``).

Thresholds: a node is split when its destination has at least :data:`MIN_ELEMENTS` ``[op]``
elements (memory-bound copies and binary ops need the most, GELU and softmax the fewest;
MUL_MAT: at least :data:`MIN_MACS` multiply-adds), i.e. a few times the round trip of a hand-off
to a worker thread; below that the hand-off costs more than it saves.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ggmlpy.backends.kernels import matmul
from ggmlpy.backends.kernels.attention import fa_query_chunk
from ggmlpy.core import env
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor

__all__ = ["Pool", "Split", "DotStep", "default_n_threads", "split_step", "fuse_chains", "compile_pending",
           "blas_single_thread", "find_blas_libs", "SPLIT_OPS",
           "MIN_ELEMENTS", "MIN_MACS", "MIN_DOT_MACS", "MAX_N_THREADS"]

Step = Callable[[], None]
Compile = Callable[[Any, Tensor, Any, list[Any]], "Step | None"]

#: the most threads a CPU backend may use (ggml's ``GGML_MAX_N_THREADS``)
MAX_N_THREADS = 512

_ELEMENTWISE = (Op.ADD, Op.SUB, Op.MUL, Op.DIV)
_SAME_SHAPE = (Op.SCALE, Op.UNARY, Op.NORM, Op.RMS_NORM, Op.L2_NORM, Op.CPY, Op.DUP, Op.CONT)
#: destination elements from which a node of each op is split (a few hand-off round trips of one
#: thread's work)
MIN_ELEMENTS = {**dict.fromkeys((*_ELEMENTWISE, Op.SCALE, Op.CPY, Op.DUP, Op.CONT), 1 << 20),
                **dict.fromkeys((Op.NORM, Op.RMS_NORM, Op.L2_NORM), 1 << 18),
                Op.UNARY: 1 << 17, Op.SOFT_MAX: 1 << 16}
#: multiply-adds from which a MUL_MAT node is split
MIN_MACS = 1 << 24
#: multiply-adds from which a MUL_MAT on the dot kernels is split over the weight rows (a Gemma
#: 3 270M 640 x 1024 matrix-vector product, ~0.1 ms of one thread, and larger)
MIN_DOT_MACS = 1 << 19
#: ops :func:`split_step` may split
SPLIT_OPS = frozenset((*_ELEMENTWISE, *_SAME_SHAPE, Op.SOFT_MAX, Op.MUL_MAT, Op.FLASH_ATTN_EXT))


def default_n_threads() -> int:
    """Threads a new CPU backend uses: the thread count of the BLAS library NumPy loaded (so
    ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` govern both), capped at ``os.cpu_count()``;
    1 without ``threadpoolctl``."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return 1
    blas = [i.get("num_threads", 1) for i in threadpool_info() if i.get("user_api") == "blas"]
    return max(1, min(max(blas, default=1), os.cpu_count() or 1))


_blas_ctl: list[Any] = []
_blas_lock = threading.Lock()
_blas_depth = [0]
_blas_saved: list[int] = []
_blas_one: list[bool] = [False]  # matmul.BLAS_ONE_THREAD before the hold


def _blas_libs() -> list[Any]:
    if not _blas_ctl:
        try:
            from threadpoolctl import ThreadpoolController
            libs = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
        except Exception:  # noqa: BLE001 - no threadpoolctl, or it cannot inspect this process
            libs = []
        _blas_ctl.append(libs)
    return _blas_ctl[0]


def find_blas_libs() -> int:
    """Look up (once per process) the BLAS libraries :func:`blas_single_thread` holds; returns
    how many were found (0 without ``threadpoolctl``)."""
    return len(_blas_libs())


def _set_blas_threads(c: Any, n: int) -> None:
    """Set one BLAS library's thread count from whichever thread holds the BLAS hold.
    threadpoolctl >= 3.7 lets only the first thread that set an OpenBLAS (pthreads) limit set it
    again, silently ignoring the others; the hold is process-wide and serialized by
    ``_blas_lock``, so it takes control for the call and releases it after."""
    clear = getattr(type(c), "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)
    c.set_num_threads(n)
    if clear is not None:
        clear()


@contextmanager
def blas_single_thread() -> Iterator[None]:
    """Hold every BLAS library NumPy loaded at one thread for the ``with`` body (nested and
    concurrent uses share one hold, from any threads; the last one to leave restores the
    previous counts). A no-op without ``threadpoolctl``."""
    libs = _blas_libs()
    if not libs:
        yield
        return
    with _blas_lock:
        if _blas_depth[0] == 0:
            _blas_saved[:] = [c.num_threads for c in libs]
            for c in libs:
                _set_blas_threads(c, 1)
            _blas_one[:] = [matmul.BLAS_ONE_THREAD[0]]
            matmul.BLAS_ONE_THREAD[0] = True
        _blas_depth[0] += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_depth[0] -= 1
            if _blas_depth[0] == 0:
                for c, n in zip(libs, _blas_saved):
                    _set_blas_threads(c, n)
                matmul.BLAS_ONE_THREAD[0] = _blas_one[0]


class Pool:
    """``n_threads - 1`` daemon worker threads that run slices handed to :meth:`run` and the
    chunks of a compiled dot task handed to :meth:`run_dot`.

    One caller at a time uses the workers; a concurrent caller (another backend's plan on
    another thread) runs its slices itself, one after the other: never a deadlock, never more
    threads than asked for. After ``fork`` a child gets fresh workers on first use.

    Hand-off: slices (Python callables) go through one queue per worker, and the caller blocks
    on their results. With Numba (:mod:`ggmlpy.backends.cpu.spin`) an idle worker first polls a
    shared control block for ``GGMLPY_CPU_SPIN`` spins (:func:`ggmlpy.core.env.cpu_spin`)
    before it blocks on its queue, so that a dot task (:meth:`run_dot`, published from compiled code that holds no GIL) reaches it without an
    operating-system wake-up (ggml's threadpool polls likewise). Slices are not polled for: the
    caller holds the GIL while it hands them out, and a worker that woke up for one would only
    wait for the GIL instead.

    Args:
        n_threads: total threads including the caller's (>= 1).
    """

    def __init__(self, n_threads: int) -> None:
        if (isinstance(n_threads, bool) or not isinstance(n_threads, int)
                or not 1 <= n_threads <= MAX_N_THREADS):
            raise ValueError(f"Pool: n_threads must be an int in 1..{MAX_N_THREADS}, "
                             f"got {n_threads!r}")
        self.n_threads = n_threads
        self._lock = threading.Lock()
        self._pid = -1
        self._inq: list[queue.SimpleQueue] = []
        self._outq: list[queue.SimpleQueue] = []
        self._sh: _Shared | None = None

    def _start(self) -> None:
        self._pid = os.getpid()
        nw = self.n_threads - 1
        self._inq = [queue.SimpleQueue() for _ in range(nw)]
        self._outq = [queue.SimpleQueue() for _ in range(nw)]
        self._sh = sh = _Shared(nw)
        for i in range(nw):
            threading.Thread(target=_worker, args=(i, self._inq[i], self._outq[i], sh),
                             daemon=True, name=f"ggmlpy-cpu-{i + 1}").start()

    def run(self, parts: list[Step]) -> None:
        """*Sync*: run every slice; ``parts[0]`` on the calling thread, the others on the
        workers; returns when all are done. The first exception raised by any slice is
        re-raised here after all slices finished."""
        if len(parts) == 1 or not self._lock.acquire(blocking=False):
            for p in parts:
                p()
            return
        try:
            if self._pid != os.getpid():
                self._start()
            sh = self._sh
            assert sh is not None
            k = min(len(parts) - 1, len(self._inq))
            for i in range(k):
                self._inq[i].put(parts[i + 1])
            sh.ctl[_PYSEQ] += 1  # a worker polling for a dot task looks at its queue
            err: BaseException | None = None
            try:
                parts[0]()
                for p in parts[k + 1:]:
                    p()
            except BaseException as e:  # noqa: BLE001 - re-raised once the workers are done
                err = e
            for i in range(k):
                r = self._outq[i].get()
                if r is not None and err is None:
                    err = r
            if err is not None:
                raise err
        finally:
            self._lock.release()

    def run_dot(self, main: Callable[[np.ndarray, int], int],
                worker: Callable[[np.ndarray, int], Any]) -> int:
        """*Sync*: run a compiled dot task whose chunks the threads claim from a shared counter
        (:func:`ggmlpy.backends.cpu.spin.claim`): ``main(ctl, gen)`` on the calling thread
        prepares the task, publishes generation ``gen`` in ``ctl``
        (:func:`~ggmlpy.backends.cpu.spin.publish`), computes the chunks it claims and waits
        for the others; every worker polling then calls ``worker(ctl, gen)``, which claims and
        computes chunks until none is left. A worker that is not polling takes no part (the
        caller computes every chunk): the result never depends on who computed which chunk. A
        worker blocked on its queue is woken up first (it joins the task if it comes in time).
        Without Numba's spin module, a concurrent caller, or one thread: ``main`` alone with a
        control block of its own. Returns ``main``'s result."""
        if self.n_threads < 2 or not self._lock.acquire(blocking=False):
            return main(np.zeros(_CTL_WORDS, np.int64), 1)
        try:
            if self._pid != os.getpid():
                self._start()
            sh = self._sh
            if sh is None or sh.spin is None:
                return main(np.zeros(_CTL_WORDS, np.int64), 1)
            sh.gen = sh.gen % 0x7FFFFFFE + 1
            sh.dot = (worker, sh.gen)
            ctl = sh.ctl
            for i in range(len(self._inq)):
                if ctl[_worker_word(i, _SLEEP)]:  # it stopped polling: wake it up for this task
                    ctl[_worker_word(i, _SLEEP)] = 0
                    self._inq[i].put(_WAKE)
            return main(ctl, sh.gen)
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the worker threads (a later :meth:`run` starts new ones)."""
        with self._lock:
            if self._pid == os.getpid():
                for q in self._inq:
                    q.put(None)
                if self._sh is not None:
                    self._sh.ctl[_PYSEQ] += 1
            self._pid = -1
            self._inq, self._outq = [], []
            self._sh = None


# control block words (each on its own 64-byte line): the dot tasks' (spin.TASK, spin.DONE,
# the chunk states: spin.WORDS of them), the count of hand-outs of slices, then per worker
# whether it stopped polling
_PYSEQ = 96
_SLEEP = 0
_BUSY = 1  # (spin.W_BUSY)
_CTL_WORDS = 104
_WAKE = object()  # a queue item that only makes a blocked worker poll again
_spin_mod: list[Any] = []


def _spin() -> Any:
    """:mod:`ggmlpy.backends.cpu.spin`, or None without Numba or with ``GGMLPY_JIT=0``."""
    from ggmlpy.backends.cpu import qmatmul

    if not qmatmul.jit_available():
        return None
    if not _spin_mod:
        try:
            from ggmlpy.backends.cpu import spin as mod
        except Exception:  # noqa: BLE001 - ImportError, or a broken Numba install
            mod = None
        _spin_mod.append(mod)
    return _spin_mod[0]


def _worker_word(i: int, w: int) -> int:
    return _CTL_WORDS + 8 * i + w


class _Shared:
    """What a pool shares with its workers: the control block, the current dot task
    ``(worker callable, generation)``, the generation counter, the spins a worker polls
    (``GGMLPY_CPU_SPIN``), and the compiled poll loop
    (:func:`ggmlpy.backends.cpu.qmatmul_tasks.serve`; None without Numba)."""

    def __init__(self, n_workers: int) -> None:
        self.ctl = np.zeros(_CTL_WORDS + 8 * n_workers, np.int64)
        self.dot: tuple[Callable[[np.ndarray, int], Any], int] | None = None
        self.gen = 0
        self.spins = env.cpu_spin()
        self.spin = _spin()
        self.serve = None
        if self.spin is not None:
            from ggmlpy.backends.cpu import qmatmul_tasks

            self.serve = qmatmul_tasks.serve
            # compiled (or loaded from Numba's cache) here, on the starting thread: in a worker it
            # would hold the GIL for it in the middle of the caller's first task
            self.serve(self.ctl, 0, _PYSEQ, 0, 0, _worker_word(0, _BUSY) if n_workers else 0)


def _worker(i: int, inq: queue.SimpleQueue, outq: queue.SimpleQueue, sh: _Shared) -> None:
    ctl, serve = sh.ctl, sh.serve
    gen_seen, py_seen = 0, int(ctl[_PYSEQ])
    w_sleep = _worker_word(i, _SLEEP)
    w_busy = _worker_word(i, _BUSY)
    with np.errstate(all="ignore"):  # as Plan.run: ggml's kernels do not trap overflow
        while True:
            if serve is not None and inq.empty():
                # poll: dot tasks with a native descriptor run inside serve, without the GIL
                r, gen_seen = serve(ctl, gen_seen, _PYSEQ, py_seen, sh.spins, w_busy)
                if r == 1:  # a task without one: its Python callable
                    d = sh.dot
                    if d is not None and d[1] == gen_seen:  # (serve set w_busy: see there)
                        try:
                            d[0](ctl, gen_seen)
                        except BaseException:  # noqa: BLE001, S110 - a compiled task raises
                            pass  # only at its call (before it claims): the caller computes all
                    continue
                if r == 2:
                    py_seen = int(ctl[_PYSEQ])
                    continue
                ctl[w_sleep] = 1
            f = inq.get()
            ctl[w_sleep] = 0
            if f is None:
                return
            if f is _WAKE:
                continue
            try:
                f()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                outq.put(e)
            else:
                outq.put(None)


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    q, r = divmod(n, parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + q + (1 if i < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _plan_axis(dst: Any, n_parts: int) -> int | None:
    """The outermost of NumPy axes 0-2 with at least 2 entries (None if all have 1): slices along
    it are contiguous blocks of a contiguous ``dst``, so each slice gets the kernel the whole node
    gets (the compiled and fast kernels take C-contiguous operands only; a slice of a deeper axis
    under a non-trivial outer one is strided and fell back to another kernel with other
    roundings). Such a node may get fewer than ``n_parts`` slices."""
    del n_parts
    for ax in range(3):
        if dst.shape[ax] >= 2:
            return ax
    return None


class Split:
    """A plan step that runs the slices of one node, or of a fused chain of nodes, on a
    :class:`Pool` (calling it runs ``pool.run(parts)``).

    A node below its op's threshold still gets a ``Split`` (``big`` False) so that it can join a
    chain (:func:`fuse_chains`); its slices are compiled only then, and on its own it runs
    its unsplit step (:meth:`whole_step`). Neither is compiled before it is known to be needed:
    a node whose slices run never compiles its unsplit step, and the other way round.

    Attributes:
        parts: one zero-argument callable per slice (None until compiled).
        ax: the NumPy axis of the destinations that was cut.
        bounds: ``(lo, hi)`` of each slice along ``ax``.
        dst: the (last) node's destination array (whole).
        dsts: the destination arrays of every node in the step.
        reads: ``(array, aligned)`` for every source read from outside the step; ``aligned``
            when the array was cut along ``ax`` exactly like the destination (slice ``i``
            reads rows ``bounds[i]`` only), False when every slice reads all of it (a shared
            GEMM weight, a broadcast bias, a tiled mask).
        n_nodes: nodes computed by the step.
        big: the node reaches its op's threshold on its own.
        whole: the unsplit step of a single node once compiled (None before, and for a node
            with nothing to compute).
    """

    __slots__ = ("pool", "parts", "ax", "bounds", "dst", "dsts", "reads", "n_nodes", "big",
                 "whole", "_compile", "_compile_whole", "_dst_ext", "_read_ext", "_box")

    def __init__(self, pool: Pool, parts: list[Step] | None, ax: int,
                 bounds: list[tuple[int, int]], dst: Any, reads: list[tuple[Any, bool]],
                 big: bool = True, whole: Step | None = None,
                 compile_parts: Callable[[], list[Step] | None] | None = None,
                 compile_whole: Callable[[], Step | None] | None = None) -> None:
        self.pool = pool
        self.parts = parts
        self.ax = ax
        self.bounds = bounds
        self.dst = dst
        self.dsts = [dst]
        self.reads = reads
        self.n_nodes = 1
        self.big = big
        self.whole = whole
        self._compile = compile_parts
        self._compile_whole = None if whole is not None else compile_whole
        self._dst_ext: list[_Extent] | None = None
        self._read_ext: list[tuple[_Extent, bool]] | None = None
        self._box = (1, 0, 1, 0)  # bounds of all dsts, of all reads (empty until extents)

    def compiled(self) -> bool:
        """Compile the slices if that has not happened yet; False if a slice cannot be
        compiled (the node then only runs whole)."""
        if self.parts is None and self._compile is not None:
            self.parts = self._compile()
            self._compile = None
        return self.parts is not None

    def whole_step(self) -> Step | None:
        """The unsplit step of the node, compiled on first use (None: nothing to compute)."""
        if self._compile_whole is not None:
            self.whole = self._compile_whole()
            self._compile_whole = None
        return self.whole

    def extents(self, memo: dict[int, tuple[Any, _Extent]] | None = None,
                ) -> tuple[list[_Extent], list[tuple[_Extent, bool]]]:
        """The memory extents of :attr:`dsts` and :attr:`reads` (computed once, for
        :func:`_can_join`; ``memo`` shares them between the steps of one plan, by array)."""
        if self._dst_ext is None:
            memo = {} if memo is None else memo
            self._dst_ext = [_extent_memo(d, memo) for d in self.dsts]
            self._read_ext = [(_extent_memo(r, memo), aligned) for r, aligned in self.reads]
            self._box = _box(self._dst_ext, (e for e, _ in self._read_ext), (1, 0, 1, 0))
        return self._dst_ext, self._read_ext  # type: ignore[return-value]

    def absorb(self, s: Split, memo: dict[int, tuple[Any, _Extent]] | None = None) -> None:
        """Add the destinations and reads of ``s`` (a step joining this chain) to this one's."""
        d_ext, r_ext = self.extents(memo)
        s_d, s_r = s.extents(memo)
        self.dsts.extend(s.dsts)
        self.reads.extend(s.reads)
        d_ext.extend(s_d)
        r_ext.extend(s_r)
        self._box = _box(s_d, (e for e, _ in s_r), self._box)

    def __call__(self) -> None:
        if self.parts is None:
            step = self.whole_step()
            if step is not None:
                step()
        else:
            self.pool.run(self.parts)

    def __repr__(self) -> str:
        return (f"Split(nodes={self.n_nodes}, parts={None if self.parts is None else len(self.parts)}, "
                f"ax={self.ax}, bounds={self.bounds}, big={self.big})")


#: ``(lo, hi, layout)``: the bytes ``[lo, hi)`` an array may touch (its bounds, as
#: ``np.may_share_memory`` checks them) and ``(address, shape, strides, dtype)``
_Extent = tuple[int, int, tuple]


def _extent(a: Any) -> _Extent:
    """The byte bounds and layout of NumPy array ``a``. An empty array touches no byte (it
    overlaps nothing, as for ``np.may_share_memory``): its bounds are the empty ``(1, 0)``, which
    fail ``x_lo < y_hi and y_lo < x_hi`` against any range of addresses."""
    ptr = a.__array_interface__["data"][0]
    layout = (ptr, a.shape, a.strides, a.dtype)
    if not a.size:
        return 1, 0, layout
    lo = hi = ptr
    for n, st in zip(a.shape, a.strides):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return lo, hi + a.itemsize, layout


def _box(dsts: Any, reads: Any, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """``box`` (lo, hi of destinations; lo, hi of reads) widened by the extents given."""
    dlo, dhi, rlo, rhi = box
    for e in dsts:
        if e[0] < e[1]:
            dlo, dhi = (e[0], e[1]) if dlo > dhi else (min(dlo, e[0]), max(dhi, e[1]))
    for e in reads:
        if e[0] < e[1]:
            rlo, rhi = (e[0], e[1]) if rlo > rhi else (min(rlo, e[0]), max(rhi, e[1]))
    return dlo, dhi, rlo, rhi


def _extent_memo(a: Any, memo: dict[int, tuple[Any, _Extent]]) -> _Extent:
    hit = memo.get(id(a))
    if hit is not None and hit[0] is a:
        return hit[1]
    e = _extent(a)
    memo[id(a)] = (a, e)  # the array is held: its id cannot be reused while memo lives
    return e


def _can_join(chain: Split, s: Split,
              memo: dict[int, tuple[Any, _Extent]] | None = None) -> bool:
    """Whether node step ``s`` may run slice by slice right after the nodes of ``chain``: same
    cut, every source it shares memory with a chain destination is that destination cut alike,
    and its destination overwrites nothing another slice of the chain still reads.

    "Shares memory" is ``np.may_share_memory``'s bounds test and "that destination" is
    :func:`~.kernels.common.same_memory` (address, shape, strides, dtype), both answered from
    extents computed once per step (:meth:`Split.extents`)."""
    if s.ax != chain.ax or s.bounds != chain.bounds:
        return False
    c_dsts, c_reads = chain.extents(memo)
    s_dsts, s_reads = s.extents(memo)
    dlo, dhi, rlo, rhi = chain._box
    (s_dst,) = s_dsts
    lo, hi, lay = s_dst
    for (r_lo, r_hi, r_lay), aligned in s_reads:
        if r_lo < dhi and dlo < r_hi:  # within the bounds of the chain's destinations
            for d_lo, d_hi, d_lay in c_dsts:
                if r_lo < d_hi and d_lo < r_hi and not (aligned and r_lay == d_lay):
                    return False
    if lo < rhi and rlo < hi:
        for (r_lo, r_hi, r_lay), aligned in c_reads:
            if lo < r_hi and r_lo < hi and not (aligned and lay == r_lay):
                return False
    if lo < dhi and dlo < hi:
        for d_lo, d_hi, d_lay in c_dsts:
            if lo < d_hi and d_lo < hi and lay != d_lay:
                return False
    return True


#: per slice of a step: (byte ranges it writes, byte ranges it reads), each ``(lo, hi)``
_SliceExt = list[tuple[list[tuple[int, int]], list[tuple[int, int]]]]


def _slice_extents(s: Split, memo: dict[int, tuple[Any, _Extent]]) -> _SliceExt:
    """The byte ranges each slice of single-node step ``s`` writes (its rows of the
    destination) and reads (its rows of an aligned source, all of any other source): the bounds
    of those views (a superset of the bytes touched), worked out from each array's layout."""
    d_ext, r_ext = s.extents(memo)
    ax = s.ax
    out: _SliceExt = []
    for lo, hi in s.bounds:
        w = [_cut(e, ax, lo, hi) for e in d_ext]
        r = [_cut(e, ax, lo, hi) if aligned else e[:2] for e, aligned in r_ext]
        out.append((w, r))
    return out


def _cut(e: _Extent, ax: int, lo: int, hi: int) -> tuple[int, int]:
    """The byte bounds of ``a[(slice(None),) * ax + (slice(lo, hi),)]`` for the array of extent
    ``e`` (as :func:`_extent` computes them for the view)."""
    ptr, shape, strides, dtype = e[2]
    if ax >= len(shape) or lo >= hi:
        return 1, 0
    first = last = ptr + lo * strides[ax]
    for i, (n, st) in enumerate(zip(shape, strides)):
        if i == ax:
            n = hi - lo
        if n == 0:
            return 1, 0
        if st >= 0:
            last += (n - 1) * st
        else:
            first += (n - 1) * st
    return first, last + dtype.itemsize


def _slices_disjoint(chain: _SliceExt, s: _SliceExt) -> bool:
    """Whether a node with per-slice ranges ``s`` may run slice ``i`` right after slice ``i`` of
    a chain with ranges ``chain`` while other threads run the chain's other slices: for every
    ``i != j`` nothing slice ``i`` reads is written by the chain's slice ``j``, and nothing it
    writes is read or written by the chain's slice ``j``. (Slice ``i`` of the chain ran before
    it on the same thread: any overlap there is ordered.)"""
    if len(chain) != len(s):
        return False

    def meet(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> bool:
        return any(a < d and c < b for a, b in xs if a < b for c, d in ys if c < d)

    for i, (w_i, r_i) in enumerate(s):
        for j, (cw_j, cr_j) in enumerate(chain):
            if i != j and (meet(r_i, cw_j) or meet(w_i, cr_j) or meet(w_i, cw_j)):
                return False
    return True


def _seq(steps: tuple[Step, ...]) -> Step:
    def run() -> None:
        for st in steps:
            st()
    return run


def fuse_chains(steps: list[Step], nodes: list[Tensor]) -> tuple[list[Step], list[Tensor]]:
    """Merge runs of consecutive :class:`Split` steps into one step whose slice ``i`` runs
    slice ``i`` of every node in order: one hand-off to the workers per run instead of per node,
    and each thread keeps its rows in cache from node to node. A node joins a run when

    * it is row-aligned with it (same cut; it reads the run's results only at its own rows,
      :func:`_can_join`: layouts compared, cheap), or else
    * it has as many slices and, by the byte ranges of every slice (:func:`_slice_extents`),
      its slice ``i`` reads nothing the run's slice ``j != i`` writes and writes nothing that
      slice reads or writes (:func:`_slices_disjoint`). This joins nodes cut along another axis
      whose cuts meet the run's: attention's per-head copy of V (cut by sequence) after the
      Q/K/V GEMM and bias add (cut by token rows), the merge of the heads after the products:
      fewer hand-offs between the threads per encode. Once a node joined by ranges, later nodes of the
      run are judged by ranges only (the layouts no longer share one cut).

    A run starts at a node above its threshold; nodes below it join a run but never start one
    (alone they run unsplit). Results are identical to running the nodes one by one.
    ``nodes[i]`` of the result is the last node of step ``i``."""
    out_s: list[Step] = []
    out_n: list[Tensor] = []
    chain: list[tuple[Split, Tensor]] = []
    memo: dict[int, tuple[Any, _Extent]] = {}  # extents by array, for this call

    def flush() -> None:
        if not chain:
            return
        if len(chain) == 1:
            out_s.append(chain[0][0])
        else:
            first = chain[0][0]
            parts = [_seq(tuple(c[0].parts[i] for c in chain)) for i in range(len(first.parts))]
            f = Split(first.pool, parts, first.ax, first.bounds, chain[-1][0].dst, [])
            f.dsts = [d for c in chain for d in c[0].dsts]
            f.reads = [r for c in chain for r in c[0].reads]
            f.n_nodes = sum(c[0].n_nodes for c in chain)
            out_s.append(f)
        out_n.append(chain[-1][1])
        chain.clear()

    acc: Split | None = None
    # per-slice byte ranges of the chain, once a node joined it by them (a node cut along
    # another axis: attention's V copy after the Q/K/V GEMM); from then on only they decide
    ranges: _SliceExt | None = None
    for step, node in zip(steps, nodes):
        if isinstance(step, Split) and acc is not None:
            if ranges is None and _can_join(acc, step, memo) and step.compiled():
                chain.append((step, node))
                acc.absorb(step, memo)
                continue
            if len(step.bounds) == len(acc.bounds) and step.n_nodes == 1:
                if ranges is None:
                    ranges = [([], []) for _ in acc.bounds]
                    for c, _ in chain:
                        _add_ranges(ranges, _slice_extents(c, memo))
                s_ranges = _slice_extents(step, memo)
                if _slices_disjoint(ranges, s_ranges) and step.compiled():
                    chain.append((step, node))
                    _add_ranges(ranges, s_ranges)
                    continue
        flush()
        ranges = None
        if isinstance(step, Split) and step.big:
            chain.append((step, node))
            acc = Split(step.pool, [], step.ax, step.bounds, step.dst, list(step.reads))
            d_ext, r_ext = step.extents(memo)
            acc._dst_ext, acc._read_ext, acc._box = list(d_ext), list(r_ext), step._box
        else:
            acc = None
            if isinstance(step, Split):
                step = step.whole_step()
                if step is None:  # nothing to compute
                    continue
            out_s.append(step)
            out_n.append(node)
    flush()
    return out_s, out_n


def _add_ranges(into: _SliceExt, more: _SliceExt) -> None:
    for (w, r), (mw, mr) in zip(into, more):
        w.extend(mw)
        r.extend(mr)


def compile_pending(steps: list[Step]) -> None:
    """Compile, now (at plan build), the unsplit step of every :class:`Split` in ``steps`` that
    still runs whole and has not compiled it (one :func:`fuse_chains` left inside another step:
    a step wrapped by the plan builder keeps the wrapped one as its ``step`` attribute)."""
    for st in steps:
        inner = getattr(st, "step", st)
        if isinstance(inner, Split) and inner.parts is None:
            inner.whole_step()


class DotStep:
    """A plan step whose product the pool's threads share (:meth:`Pool.run_dot`); calling it
    runs ``inner``. Unlike a plan with :class:`Split` steps, a plan whose only threaded steps are
    dot tasks leaves BLAS's thread count as it is: the task calls no BLAS.
    (Not named ``step``: that attribute marks the plan builder's wrappers.)"""

    __slots__ = ("inner",)

    def __init__(self, inner: Step) -> None:
        self.inner = inner

    def __call__(self) -> None:
        self.inner()


def _dot_split(xp: Any, node: Tensor, dst: Any, srcs: list[Any], pool: Pool,
               compile_node: Compile, whole: Step | None) -> Split | None:
    """A MUL_MAT with a block-quantized weight
    (:func:`~ggmlpy.backends.kernels.matmul.splits_weight_rows`) cut along the weight's rows, as
    ggml splits ``src0``'s rows among its threads: slice ``i`` computes ``dst[..., lo:hi]`` from
    ``src0[..., lo:hi, :]`` and all of ``src1``. On the dot kernels each slice quantizes ``src1``
    itself (a batch below the crossover is small next to the weight) and every output is computed
    by one fixed sequence of operations whatever the cut, so the result does not depend on
    ``n_threads``; on the GEMM path (a weight of many rows per activation row,
    :func:`~ggmlpy.backends.kernels.matmul.splits_weight_rows`) each slice dequantizes only its
    rows of the weight."""
    a, b = srcs[0], srcs[1]
    M = dst.shape[3]
    if M < 2:
        return None
    dot = matmul.uses_dot_kernel(node)
    big = dst.size * b.shape[-1] >= (MIN_DOT_MACS if dot else MIN_MACS)
    if dot and _spin() is not None:
        # one compiled task per product whose row chunks the threads claim (Pool.run_dot)
        with matmul.dot_threads(pool.run_dot if big else None):
            step = compile_node(xp, node, dst, srcs)
        return DotStep(step) if big and step is not None else step
    bounds = _bounds(M, min(M, pool.n_threads))

    def compile_parts() -> list[Step] | None:
        parts = []
        for lo, hi in bounds:
            step = compile_node(xp, node, dst[:, :, :, lo:hi], [a[:, :, lo:hi], *srcs[1:]])
            if step is None:
                return None
            parts.append(step)
        return parts

    reads = [(a, False), (b, False)]
    return _new_split(pool, big, compile_parts, 3, bounds, dst, reads, whole,
                      lambda: compile_node(xp, node, dst, srcs))


def _new_split(pool: Pool, big: bool, compile_parts: Callable[[], list[Step] | None], ax: int,
               bounds: list[tuple[int, int]], dst: Any, reads: list[tuple[Any, bool]],
               whole: Step | None, compile_whole: Callable[[], Step | None]) -> Split | None:
    """The :class:`Split` of a node: its slices compiled now when it is ``big`` (None when one
    does not compile), else compiled on the first run that splits (the whole node otherwise)."""
    if big:
        parts = compile_parts()
        return None if parts is None else Split(pool, parts, ax, bounds, dst, reads)
    return Split(pool, None, ax, bounds, dst, reads, big=False, whole=whole,
                 compile_parts=compile_parts, compile_whole=compile_whole)


def _fa_split(xp: Any, node: Tensor, dst: Any, srcs: list[Any], pool: Pool,
              compile_node: Compile, whole: Step | None) -> Split | None:
    """FLASH_ATTN_EXT cut along its query rows (ggml's CPU kernel splits its rows among the
    threads the same way): slice ``i`` computes ``dst[:, lo:hi]`` (NumPy ``(B, NQ, H, DV)``) from
    ``q[:, :, lo:hi]``, the mask's rows ``lo:hi`` and all of K and V, exactly what the whole node
    computes for those queries (the cuts fall on the kernel's query chunks,
    :func:`~ggmlpy.backends.kernels.attention.fa_query_chunk`, so the bits do not depend on
    ``n_threads``). A node of at least :data:`MIN_MACS` multiply-adds (``NQ * H * DK * NKV`` per
    batch) and two chunks is split."""
    q, k = srcs[0], srcs[1]
    NQ = dst.shape[1]
    if k is None:
        return None
    qc = fa_query_chunk(q.shape[0], q.shape[1], k.shape[2])
    n_chunks = -(-NQ // qc)
    if n_chunks < 2:
        return None
    mask = srcs[3] if len(srcs) > 3 else None
    big = q.size * k.shape[2] >= MIN_MACS
    # cut at the kernel's query chunks: every row is computed as in the whole node
    bounds = [(lo * qc, min(NQ, hi * qc)) for lo, hi in _bounds(n_chunks, min(n_chunks,
                                                                                pool.n_threads))]

    def compile_parts() -> list[Step] | None:
        parts = []
        for lo, hi in bounds:
            part_srcs = list(srcs)
            part_srcs[0] = q[:, :, lo:hi]
            if mask is not None:
                part_srcs[3] = mask[:, :, lo:hi]
            step = compile_node(xp, node, dst[:, lo:hi], part_srcs)
            if step is None:
                return None
            parts.append(step)
        return parts

    reads = [(s, False) for s in srcs if s is not None]
    return _new_split(pool, big, compile_parts, 1, bounds, dst, reads, whole,
                      lambda: compile_node(xp, node, dst, srcs))


def split_step(xp: Any, node: Tensor, dst: Any, srcs: list[Any], pool: Pool,
               compile_node: Compile, whole: Step | None = None) -> Split | None:
    """Compile ``node`` as ``n_parts`` slices over rows of ``dst`` (see the module docstring),
    or None when the op is not splittable, the node is too small or its operands do not slice.

    Args:
        xp: the array module (``numpy``).
        node: the graph node.
        dst: its destination array, NumPy shape ``ne[::-1]``.
        srcs: its sources' arrays (None for absent sources).
        pool: the pool that runs the slices (``pool.n_threads`` slices at most).
        compile_node: ``compile_node(xp, node, dst, srcs) -> Step`` (the kernel registry's).
        whole: the node's unsplit step (run when the node stays alone below its threshold);
            None: compiled with ``compile_node`` only if it is needed (the backend's way:
            most nodes that can be split run as slices, so their unsplit step is never made).

    Returns:
        A :class:`Split` with its slices compiled when the node reaches its op's threshold,
        a lazily compiled one (``big`` False) when it does not, or None.
    """
    op = node.op
    n_parts = pool.n_threads
    whole_dst = dst  # (a copy may see its dst in the source's shape below)
    if op not in SPLIT_OPS or not srcs or srcs[0] is None or dst.ndim != 4 or n_parts < 2:
        return None
    if op == Op.MUL_MAT and matmul.splits_weight_rows(node):
        return _dot_split(xp, node, dst, srcs, pool, compile_node, whole)
    if op == Op.FLASH_ATTN_EXT:
        return _fa_split(xp, node, dst, srcs, pool, compile_node, whole)
    # which operand is cut along ``ax`` (True), or read whole by every slice (False)
    if op == Op.MUL_MAT:
        a, b = srcs[0], srcs[1]
        big = dst.size * b.shape[-1] >= MIN_MACS
        ax = _plan_axis(dst, n_parts)
        if ax is None:
            return None
        n = dst.shape[ax]
        if ax < 2 and a.shape[ax] not in (1, n):
            return None
        a_cut = not (ax == 2 or a.shape[ax] == 1)
        cut = [a_cut, True] + [False] * (len(srcs) - 2)
        reads = [(a, a_cut), (b, True)]
    else:
        big = dst.size >= MIN_ELEMENTS[op]
        if op == Op.SOFT_MAX and len(node.op_params) > 1 and float(node.op_params[1]) != 0.0:
            return None  # ALiBi slopes depend on the head index
        if op in (Op.CPY, Op.DUP, Op.CONT) and srcs[0].shape != dst.shape:
            # a copy into a C-contiguous dst of another shape (attention's merged heads): dst
            # seen in the source's shape is the same row-major order, and then slices alike
            if not (dst.flags.c_contiguous and srcs[0].ndim == 4 and srcs[0].size == dst.size):
                return None
            dst = dst.reshape(srcs[0].shape)
        if op in _SAME_SHAPE and srcs[0].shape != dst.shape:
            return None
        ax = _plan_axis(dst, n_parts)
        if ax is None:
            return None
        n = dst.shape[ax]
        cut = [True]
        reads = [(srcs[0], True)]
        for j in range(1, len(srcs)):
            s = srcs[j]
            if s is None:
                cut.append(False)
                continue
            if op == Op.SOFT_MAX and j == 1 and ax == 2:
                # the mask's rows follow src0's rows, but the mask may have more: cut, not aligned
                cut.append(True)
                reads.append((s, False))
                continue
            m = s.shape[ax]
            if m != n and m != 1:
                return None  # tiles (ggml's modulo broadcast): cannot be cut
            cut.append(m == n)
            reads.append((s, m == n and not (op == Op.SOFT_MAX and ax == 2)))
    bounds = _bounds(n, min(n, n_parts))
    pre = (slice(None),) * ax

    def compile_parts() -> list[Step] | None:
        parts = []
        for lo, hi in bounds:
            key = pre + (slice(lo, hi),)
            step = compile_node(xp, node, dst[key],
                                [s[key] if c else s for s, c in zip(srcs, cut)])
            if step is None:
                return None
            parts.append(step)
        return parts

    return _new_split(pool, big, compile_parts, ax, bounds, dst, reads, whole,
                      lambda: compile_node(xp, node, whole_dst, srcs))
