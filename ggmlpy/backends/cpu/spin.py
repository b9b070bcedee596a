"""Atomics and spin-waits for the CPU backend's worker hand-off, as Numba functions (imported only
when Numba is; :mod:`ggmlpy.backends.cpu.threads` and :mod:`ggmlpy.backends.cpu.qmatmul_tasks`
use them).

A waiting thread reads a shared word in a loop inside a ``nogil`` compiled function instead of
sleeping on a lock, so a hand-off between the threads costs a cache line's transfer instead of a
wake-up by the operating system (ggml's threadpool polls the same way, ggml-cpu.c
``ggml_graph_compute_poll_for_work``). Every wait that can meet an absent peer is bounded
(``budget`` spins, each one load and the CPU's spin-loop hint: ``pause`` on x86, ``yield`` on
ARM), after which the caller falls back to blocking.

The control block ``ctl`` is a 1-D int64 NumPy array; word ``i`` is ``ctl[i]`` (callers keep the
words they share on separate 64-byte lines). Loads are acquire, stores release, the
read-modify-writes sequentially consistent (LLVM's ``load atomic``, ``store atomic``,
``cmpxchg`` and ``atomicrmw``): what a thread wrote before a release store is visible to a thread
whose acquire load sees that store.
"""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["aload", "astore", "acas", "aadd", "relax", "cycles", "as_ptr", "TASK", "DONE",
           "STATES", "state", "MAX_CHUNKS", "DESC", "WORDS", "RESCUE_CYCLES", "claim", "publish", "wait_done", "wait_change",
           "wait_value", "wait_cycles", "wait_workers_back", "POOL_WORKER0", "POOL_WORKER_STRIDE",
           "W_BUSY", "BACK_SPINS"]

I64 = ir.IntType(64)
_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)

#: the dot-task word: ``(generation << 32) | next chunk`` (see :func:`claim`)
TASK = 0
#: chunks of the current dot task finished
DONE = 8
#: ``ctl[STATES + c]``: chunk ``c``'s state word ``(generation << 8) | state`` (:func:`state`;
#: the dot task's generation, so that a worker that wakes up after its task ended cannot touch the
#: chunk of the next task: state 0 claimed or not yet, 2 being copied out by a
#: worker, 3 done, 4 taken over by the caller)
STATES = 16
#: the most chunks a dot task may have
MAX_CHUNKS = 64
#: ``ctl[DESC:DESC + 16]``: the current dot task's descriptor (see qmatmul_tasks.serve)
DESC = STATES + MAX_CHUNKS
#: words of the control block the dot tasks use (a pool's own words follow)
WORDS = DESC + 16
#: a pool's control block (ggmlpy.backends.cpu.threads): its first per-worker word, the words
#: per worker, and the worker's word that is 1 while it runs a task's Python callable (from the
#: call until it is back polling in compiled code, :func:`ggmlpy.backends.cpu.qmatmul_tasks.serve`)
POOL_WORKER0 = 104
POOL_WORKER_STRIDE = 8
W_BUSY = 1
#: spins a task's caller waits at most for such workers (:func:`wait_workers_back`)
BACK_SPINS = 1 << 18
#: time-stamp-counter ticks (of the order of 10 us) the caller of a dot task waits for a
#: worker's chunk before it takes the chunk over
RESCUE_CYCLES = 30000

# the spin-loop hint as an LLVM target intrinsic (inline assembly has no parser in Numba's JIT)
_HINT = {"x86_64": ("llvm.x86.sse2.pause", []), "amd64": ("llvm.x86.sse2.pause", []),
         "aarch64": ("llvm.aarch64.hint", [1]), "arm64": ("llvm.aarch64.hint", [1]),
         }.get(platform.machine().lower())


def _word(context, builder, aty, arr, idx):
    a = context.make_array(aty)(context, builder, arr)
    return builder.gep(a.data, [idx])


@intrinsic
def aload(typingctx, a, i):
    """Acquire load of ``a[i]`` (int64)."""
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_word(context, builder, sig.args[0], *args), "acquire", 8)
    return types.int64(a, i), codegen


@intrinsic
def astore(typingctx, a, i, v):
    """Release store ``a[i] = v`` (int64)."""
    def codegen(context, builder, sig, args):
        p = _word(context, builder, sig.args[0], args[0], args[1])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(v, p, "release", 8)
        return context.get_dummy_value()
    return types.none(a, i, v), codegen


@intrinsic
def acas(typingctx, a, i, old, new):
    """``a[i] = new`` if ``a[i] == old`` (one atomic step); True when it was swapped."""
    def codegen(context, builder, sig, args):
        p = _word(context, builder, sig.args[0], args[0], args[1])
        o = context.cast(builder, args[2], sig.args[2], types.int64)
        n = context.cast(builder, args[3], sig.args[3], types.int64)
        r = builder.cmpxchg(p, o, n, "seq_cst", "seq_cst")
        return builder.extract_value(r, 1)
    return types.boolean(a, i, old, new), codegen


@intrinsic
def aadd(typingctx, a, i, v):
    """Atomic ``a[i] += v``; returns the old value."""
    def codegen(context, builder, sig, args):
        p = _word(context, builder, sig.args[0], args[0], args[1])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", p, v, "seq_cst")
    return types.int64(a, i, v), codegen


@intrinsic
def relax(typingctx):
    """The CPU's spin-loop hint (nothing on CPUs without one)."""
    def codegen(context, builder, sig, args):
        if _HINT is not None:
            name, imm = _HINT
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(32)] * len(imm)), name)
            builder.call(fn, [ir.Constant(ir.IntType(32), v) for v in imm])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def as_ptr(typingctx, addr, like):
    """The int64 address ``addr`` as a pointer to the dtype of array ``like`` (for
    ``numba.carray``)."""
    dt = like.dtype

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(dt)))
    return types.CPointer(dt)(addr, like), codegen


@intrinsic
def cycles(typingctx):
    """The CPU's time-stamp counter (``llvm.readcyclecounter``: x86 ``rdtsc``; 0 where there is
    none)."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I64, []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(inline="always", **_OPTS)
def state(gen, s):
    """The state word of a chunk of dot task ``gen`` in state ``s`` (see :data:`STATES`)."""
    return (gen << 8) | s


@njit(**_OPTS)
def publish(ctl, gen, n_chunks):
    """Start dot task ``gen`` (0 < gen < 2**31) of ``n_chunks <= MAX_CHUNKS`` chunks: none done,
    every state 0 of generation ``gen``, chunk 0 next."""
    for c in range(n_chunks):
        astore(ctl, STATES + c, state(gen, 0))
    astore(ctl, DONE, 0)
    astore(ctl, TASK, gen << 32)


@njit(**_OPTS)
def claim(ctl, gen, n_chunks):
    """The next unclaimed chunk of dot task ``gen`` (each index handed out once over all
    threads), or -1 when all ``n_chunks`` are claimed or another task replaced ``gen``."""
    while True:
        v = aload(ctl, TASK)
        if (v >> 32) != gen:
            return -1
        c = v & 0xFFFFFFFF
        if c >= n_chunks:
            return -1
        if acas(ctl, TASK, v, v + 1):
            return c


@njit(**_OPTS)
def wait_done(ctl, n_chunks):
    """Spin until ``n_chunks`` chunks are finished (called once every chunk is claimed: the
    threads that claimed the rest are computing them)."""
    while aload(ctl, DONE) < n_chunks:
        relax()


@njit(**_OPTS)
def wait_change(ctl, gen_seen, i_seq, seq_seen, budget):
    """A worker's wait: spin until the dot task's generation is not ``gen_seen`` (returns 1),
    word ``i_seq`` is not ``seq_seen`` (2), or ``budget`` spins passed (0)."""
    for _ in range(budget):
        if (aload(ctl, TASK) >> 32) != gen_seen:
            return 1
        if aload(ctl, i_seq) != seq_seen:
            return 2
        relax()
    return 0


@njit(**_OPTS)
def wait_cycles(ctl, i, value, ticks):
    """Spin until ``ctl[i] >= value`` (True) or about ``ticks`` counter ticks passed (False;
    without a counter: after ``ticks`` spins)."""
    t0 = cycles()
    for k in range(ticks):
        if aload(ctl, i) >= value:
            return True
        relax()
        if k % 16 == 15:
            t = cycles()
            if t != 0 and t - t0 > ticks:
                break
    return aload(ctl, i) >= value


@njit(**_OPTS)
def wait_workers_back(ctl):
    """Called by a task's caller once every chunk is done, before it returns to Python: spin
    (at most :data:`BACK_SPINS`) until no worker of the pool owning ``ctl`` is still between a
    Python callable's return and its poll loop. Such a worker holds the GIL there; a caller that
    came back to Python meanwhile would sleep on the GIL and wait for the operating system to
    wake it (tens of microseconds), where the worker gives the GIL up within a microsecond.
    A control block without workers (shorter than the pool's) passes at once."""
    n = (ctl.shape[0] - POOL_WORKER0) // POOL_WORKER_STRIDE
    for i in range(n):
        k = POOL_WORKER0 + POOL_WORKER_STRIDE * i + W_BUSY
        for _ in range(BACK_SPINS):
            if aload(ctl, k) == 0:
                break
            relax()


@njit(**_OPTS)
def wait_value(ctl, i, value, budget):
    """Spin until ``ctl[i] >= value`` (True) or ``budget`` spins passed (False)."""
    for _ in range(budget):
        if aload(ctl, i) >= value:
            return True
        relax()
    return aload(ctl, i) >= value
