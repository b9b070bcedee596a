"""Compiled-plan reuse is valid only for an unchanged graph (issue 10 items 1, 7, 10).

Each backend caches plans per graph (ggmlpy.backends.plan.PlanCache) behind a
ggmlpy.core.snapshot.Snapshot; these tests mutate what a plan reads and check the next compute uses
the new state, on the CPU and on a SIM device with latency on.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from backend_kinds import new_device
from hypothesis import given, settings
from hypothesis import strategies as st

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import view_init
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.core import snapshot
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

#: the kinds the Hypothesis test draws from (it cannot take the function-scoped ``backend``)
KINDS = ["CPU", "SIM0"]


def _backend(kind: str):
    return new_device(kind).init_backend()


def _compute(backend, g: Graph, out) -> np.ndarray:
    backend.graph_compute(g)
    backend.synchronize()
    return backend_tensor_get(out)


def test_op_params_write_rebuilds_plan(backend):
    """Issue example: y = scale(x, 2); y.op_params[0] = 3 then recompute gives 3, not 2."""
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 4)
    y = ops.scale(ctx, x, 2.0)
    g = Graph()
    g.build_forward_expand(y)
    buf = alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
    try:
        backend_tensor_set(x, np.ones(4, np.float32))
        np.testing.assert_array_equal(_compute(backend, g, y), [[[[2, 2, 2, 2]]]])
        y.op_params[0] = 3.0
        np.testing.assert_array_equal(_compute(backend, g, y), [[[[3, 3, 3, 3]]]])
    finally:
        buf.free()


def test_src_rewired_to_view_with_other_ne(backend):
    """Issue example: y = sum(view_1d(base, 4, 0)) = 6; y.src[0] = view_1d(base, 8, 0) -> 28."""
    ctx = Context()
    base = ctx.new_tensor_1d(Type.F32, 16)
    v4 = ops.view_1d(ctx, base, 4, 0)
    v8 = ops.view_1d(ctx, base, 8, 0)
    y = ops.sum(ctx, v4)
    g = Graph()
    g.build_forward_expand(y)
    buf = alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
    try:
        for v in (v4, v8):
            if v.buffer is None:
                view_init(v)
        backend_tensor_set(base, np.arange(16, dtype=np.float32))
        assert _compute(backend, g, y).item() == 6.0
        y.src[0] = v8
        assert _compute(backend, g, y).item() == 28.0
    finally:
        buf.free()


def test_unchanged_graph_reuses_plan():
    be = backend_cpu_init()
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 4)
    y = ops.scale(ctx, x, 2.0)
    g = Graph()
    g.build_forward_expand(y)
    buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
    try:
        be.graph_compute(g)
        be.graph_compute(g)
        y.name = "renamed"  # names are not read by plans
        be.graph_compute(g)
        assert be.plan_cache.builds == 1
        y.op_params[0] = 2.0  # same value: no change
        be.graph_compute(g)
        assert be.plan_cache.builds == 1
        y.op_params[0] = 5.0
        be.graph_compute(g)
        assert be.plan_cache.builds == 2
    finally:
        buf.free()


# -- randomized: mutate a computed graph, the cached result must equal a fresh graph's ----------

_view = st.tuples(st.integers(1, 8), st.integers(1, 4), st.integers(0, 3), st.integers(0, 16))
_mut = st.one_of(
    st.tuples(st.just("params"), st.sampled_from([0.5, 2.0, -1.0, 3.0])),
    st.tuples(st.just("view"), _view),   # rewire to a new same-buffer view: other ne, nb, offset
    st.tuples(st.just("move"), st.booleans()),  # move the view's (buffer, offset) to base/base2
    st.tuples(st.just("op"), st.sampled_from(["scale", "sqr"])),  # res.op rewritten in place
)


def _strided(data: np.ndarray, v) -> np.ndarray:
    ne0, ne1, gap, off = v
    nb1 = ne0 + gap
    d = data[off:]
    return np.lib.stride_tricks.as_strided(d, shape=(ne1, ne0), strides=(nb1 * d.itemsize, d.itemsize))


@settings(max_examples=25, deadline=None)
@given(v0=_view, muts=st.lists(_mut, min_size=1, max_size=5), kind=st.sampled_from(KINDS))
def test_random_mutations_match_fresh_graph(v0, muts, kind):
    """res = scale(sum(view_2d(base, ...)), s) computed once, then a random sequence of
    mutations (op_params writes, src rewired to same-buffer views with other ne/nb/offset,
    (buffer, offset) moves, op changes), each followed by a compute on the same Graph: the result
    must equal the float64 NumPy value and a fresh graph's result on a fresh backend."""
    be = _backend(kind)
    buft = be.get_default_buffer_type()
    rng = np.random.default_rng(0)
    data = {"base": rng.standard_normal(64).astype(np.float32),
            "base2": rng.standard_normal(64).astype(np.float32)}
    ctx = Context()
    base = ctx.new_tensor_1d(Type.F32, 64)
    base2 = ctx.new_tensor_1d(Type.F32, 64)

    def mkview(v):
        ne0, ne1, gap, off = v
        return ops.view_2d(ctx, base, ne0, ne1, (ne0 + gap) * 4, off * 4)

    view = mkview(v0)
    red = ops.sum(ctx, view)
    res = ops.scale(ctx, red, 2.0)
    g = Graph()
    g.build_forward_expand(res)
    buf = alloc_ctx_tensors_from_buft(ctx, buft)
    state = {"v": v0, "where": "base", "s": 2.0, "op": "scale"}
    fresh_be = _backend(kind) if kind == "CPU" else be.device.init_backend()
    try:
        backend_tensor_set(base, data["base"])
        backend_tensor_set(base2, data["base2"])
        for i, mut in enumerate([None, *muts]):
            if mut is not None:
                what, arg = mut
                if what == "params":
                    res.op_params[0] = arg
                    state["s"] = arg
                elif what == "view":
                    nv = mkview(arg)
                    view_init(nv)
                    red.src[0] = nv
                    view = nv
                    state["v"], state["where"] = arg, "base"
                elif what == "move":
                    target = base2 if arg else base
                    view.offset = target.offset + state["v"][3] * 4
                    state["where"] = "base2" if arg else "base"
                else:
                    res.op = {"scale": Op.SCALE, "sqr": Op.SQR}[arg]
                    state["op"] = arg
            x = _strided(data[state["where"]].astype(np.float64), state["v"])
            want = x.sum() * state["s"] if state["op"] == "scale" else x.sum() ** 2
            got = _compute(be, g, res).item()
            fresh = Graph()
            fresh.build_forward_expand(res)
            fresh_got = _compute(fresh_be, fresh, res).item()
            assert got == fresh_got, (i, mut, got, fresh_got)
            assert got == pytest.approx(want, rel=1e-5, abs=1e-5), (i, mut, state)
    finally:
        buf.free()
        fresh_be.free()
        be.free()


# -- resources: a freed buffer or a dead graph drops its plans (item 7) ---------------------------

@pytest.mark.backends("CPU", "SIM0")  # 64 MiB buffers: more than the fake CuPy's capacity
def test_freed_buffers_are_not_kept_alive_by_plans(backend):
    """Four cycles of (new graph, 64 MiB buffer, compute, free) must not accumulate memory."""
    import tracemalloc

    be = backend
    n = 16 * 1024 * 1024  # 64 MiB of F32
    tracemalloc.start()
    try:
        live = []
        for _cycle in range(4):
            ctx = Context()
            x = ctx.new_tensor_1d(Type.F32, n)
            y = ops.scale_inplace(ctx, x, 2.0)
            g = Graph()
            g.build_forward_expand(y)
            buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
            be.graph_compute(g)
            be.synchronize()
            buf.free()
            del ctx, x, y, buf
            gc.collect()
            live.append(tracemalloc.get_traced_memory()[0])
        assert len(be.plan_cache) == 0
        assert max(live) < 8 * 1024 * 1024, [f"{v / 2**20:.1f} MiB" for v in live]
        # a graph that dies drops its plans even while its buffer lives
        ctx = Context()
        x = ctx.new_tensor_1d(Type.F32, 4)
        y = ops.scale(ctx, x, 2.0)
        g = Graph()
        g.build_forward_expand(y)
        buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
        be.graph_compute(g)
        be.synchronize()
        assert len(be.plan_cache) == 1
        del g
        gc.collect()
        assert len(be.plan_cache) == 0
        buf.free()
    finally:
        tracemalloc.stop()


# -- thread safety of the generation (item 10) ----------------------------------------------------

def _published(*tensors):
    """Put the tensors in a snapshot (changes of tensors no snapshot recorded are not stamped)."""
    g = Graph()
    for t in tensors:
        g.build_forward_expand(t)
    snapshot.Snapshot.take(g)
    return tensors[0] if len(tensors) == 1 else tensors


def test_unpublished_tensor_changes_are_free_and_published_ones_stamped():
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 4)
    g0 = snapshot.generation()
    t.offset = 8
    t.op_params = [1.0]
    t.op_params[0] = 2.0
    assert snapshot.generation() == g0 and t._ver == -1
    _published(t)
    g1 = snapshot.generation()
    t.op_params[0] = 3.0
    assert snapshot.generation() == g1 + 1 and t._ver == g1 + 1


def test_generation_bumps_are_not_lost_across_threads():
    """Concurrent tensor moves from several threads: every one of them is counted."""
    ctx = Context()
    ts = _published(*[ctx.new_tensor_1d(Type.F32, 4) for _ in range(4)])
    per_thread = 20000
    start = threading.Barrier(len(ts))

    def work(t):
        start.wait()
        for i in range(per_thread):
            t.offset = i + 1  # a real change every time

    g0 = snapshot.generation()
    threads = [threading.Thread(target=work, args=(t,)) for t in ts]
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # force frequent thread switches inside the increments
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert snapshot.generation() - g0 == len(ts) * per_thread


def test_snapshot_taken_before_concurrent_change_is_invalid():
    """A snapshot records the generation read before its state: a change made after that read
    (even while the state is being taken) makes ``matches`` fall back to comparing state."""
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 4)
    y = ops.scale(ctx, x, 2.0)
    g = Graph()
    g.build_forward_expand(y)
    snap = snapshot.Snapshot.take(g)
    assert snap.matches(g)
    y.op_params[0] = 4.0
    assert not snap.matches(g)
    y.op_params[0] = 2.0
    assert snap.matches(g)  # back to the recorded state: valid again
    x.ne = (2, 1, 1, 1)
    assert not snap.matches(g)


def test_generation_increment_is_serialized_by_the_lock():
    """The stress test above cannot expose a lost update on a GIL build (CPython 3.11 does not
    switch threads inside ``x += 1``); this one checks the mechanism: while the generation lock
    is held, a bump from another thread waits, so read-modify-writes never interleave."""
    ctx = Context()
    t = _published(ctx.new_tensor_1d(Type.F32, 4))
    done = threading.Event()

    def mover():
        t.offset = 123
        done.set()

    with snapshot._lock:
        g0 = snapshot.generation()
        th = threading.Thread(target=mover)
        th.start()
        assert not done.wait(0.2)
        assert snapshot.generation() == g0
    th.join(5)
    assert done.is_set() and snapshot.generation() == g0 + 1


def test_version_check_sees_every_mutation_kind():
    """Snapshot.unchanged_since (the fast check) is False after each kind of mutation of the
    graph and True after a mutation of an unrelated tensor."""
    def fresh():
        ctx = Context()
        x = ctx.new_tensor_1d(Type.F32, 8)
        v = ops.view_1d(ctx, x, 4, 0)
        y = ops.scale(ctx, v, 2.0)
        g = Graph()
        g.build_forward_expand(y)
        return ctx, x, v, y, g

    other = _published(Context().new_tensor_1d(Type.F32, 4))
    mutations = {
        "op_params item": lambda ctx, x, v, y, g: y.op_params.__setitem__(0, 3.0),
        "op_params list": lambda ctx, x, v, y, g: setattr(y, "op_params", [5.0]),
        "src item": lambda ctx, x, v, y, g: y.src.__setitem__(0, x),
        "src append": lambda ctx, x, v, y, g: y.src.append(None),
        "op": lambda ctx, x, v, y, g: setattr(y, "op", Op.SQR),
        "type": lambda ctx, x, v, y, g: setattr(y, "type", Type.F16),
        "ne": lambda ctx, x, v, y, g: setattr(v, "ne", (2, 1, 1, 1)),
        "nb": lambda ctx, x, v, y, g: setattr(v, "nb", (8, 32, 32, 32)),
        "view_offs": lambda ctx, x, v, y, g: setattr(v, "view_offs", 4),
        "flags": lambda ctx, x, v, y, g: y.set_output(),
        "buffer": lambda ctx, x, v, y, g: setattr(x, "buffer", object()),
        "offset": lambda ctx, x, v, y, g: setattr(x, "offset", 64),
        "nodes append": lambda ctx, x, v, y, g: g.nodes.append(ops.sqr(ctx, y)),
        "leafs edit": lambda ctx, x, v, y, g: g.leafs.clear(),
        "src_map": lambda ctx, x, v, y, g: setattr(g, "src_map", {}),
        "extra_flags": lambda ctx, x, v, y, g: setattr(g, "extra_flags", {}),
        "touch": lambda ctx, x, v, y, g: snapshot.touch(g),
    }
    for name, mutate in mutations.items():
        ctx, x, v, y, g = fresh()
        snap = snapshot.Snapshot.take(g)
        g1 = snapshot.generation()
        other.offset = (other.offset or 0) + 1
        assert snapshot.generation() == g1 + 1  # the generation moved: the version check runs
        assert snap.unchanged_since(g), name
        assert snap.matches(g), name
        mutate(ctx, x, v, y, g)
        assert not snap.unchanged_since(g), name
        if name not in ("touch", "extra_flags", "src_map"):  # these leave the state equal
            assert not snap.matches(g), name


def test_snapshot_vouches_only_for_its_own_graph():
    """The generation fast path of a snapshot holds for the graph it was taken of only: another
    graph (other tensors, same op, shape and positions) with no mutation in between must be
    compared by state and refused; a second Graph over the very same tensors matches by state."""
    def build(ctx, k):
        x = ctx.new_tensor_1d(Type.F32, 8)
        y = ops.scale(ctx, x, k)
        g = Graph()
        g.build_forward_expand(y)
        return g

    ctx = Context()
    g1, g2 = build(ctx, 2.0), build(ctx, 3.0)
    snap = snapshot.Snapshot.take(g1)
    assert snapshot.generation() == snap.generation  # nothing moved: only identity can tell
    assert snap.matches(g1) and snap.unchanged_since(g1)
    assert not snap.unchanged_since(g2)
    assert not snap.matches(g2)  # before: True (same generation), a plan for g1 reused for g2
    g1b = Graph()
    g1b.build_forward_expand(g1.nodes[-1])
    assert snap.matches(g1b)  # same tensors, same state: valid by comparison


def test_buffer_free_hooks_die_with_unfreed_buffers():
    """A buffer garbage-collected without free() takes its free-hook registration with it (before,
    the registry of hooks kept one entry per such buffer id for the life of the process); a
    registration still fires when its buffer is freed."""
    class Cache:
        def __init__(self):
            self.seen = []

        def freed(self, buf):
            self.seen.append(buf)

    class Buf:  # anything weak-referenceable stands for a Buffer here
        pass

    cache = Cache()
    gc.collect()  # (unreachable buffers of earlier tests in this process must not die in between)
    before = snapshot.free_hook_count()
    for _ in range(100):
        snapshot.on_buffer_free(Buf(), cache.freed)
    gc.collect()
    assert snapshot.free_hook_count() == before
    kept = Buf()
    snapshot.on_buffer_free(kept, cache.freed)
    snapshot.on_buffer_free(kept, cache.freed)  # same bound method twice: one call
    snapshot.buffer_freed(kept)
    assert cache.seen == [kept]
    assert snapshot.free_hook_count() == before


def test_buffer_dying_inside_a_locked_free_hook_section_does_not_deadlock():
    """A dead buffer's weak-reference callback can run on a thread inside one of the free-hook
    registry's locked sections (an allocation there starts the garbage collector, which frees a
    buffer caught in a reference cycle): the callback takes the same lock, so a plain lock hung
    that thread (seen as a suite hang in test_sched_placement). Here the callback is made to run
    inside the section: a buffer in a cycle dies at a ``gc.collect()`` called while the lock is
    held."""
    import threading

    class Cache:
        def freed(self, buf):
            pass

    class Buf:
        pass

    cache = Cache()
    done = threading.Event()

    def body():
        b = Buf()
        b.cycle = b  # only the cyclic collector frees it
        snapshot.on_buffer_free(b, cache.freed)
        del b
        with snapshot._hooks_lock:
            gc.collect()  # b's callback runs here, on this thread, and takes the lock again
        done.set()

    gc.collect()
    before = snapshot.free_hook_count()
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "the free-hook callback waited for its own thread's lock"
    assert snapshot.free_hook_count() == before
