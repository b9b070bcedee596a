"""The float32 weight cache of the NumPy MUL_MAT (ggmlpy/backends/kernels/weight_cache.py).

* A weight in a WEIGHTS buffer is converted once and reused (counted hits), and the result is
  bit-identical to an F32 MUL_MAT of the same (f16-rounded / dequantized) values.
* Never stale: one test per write path (tensor set, partial set, memset, copy, buffer clear,
  async set and async copy on SIM, a graph node writing the weight, free and re-allocation),
  each checking the next product against a float64 reference of the new bytes; plus a
  hypothesis test interleaving random writes and products.
* Budget: ``GGMLPY_WEIGHT_CACHE_MB`` 0 keeps nothing, a small budget evicts least recently used
  entries; weights outside WEIGHTS buffers (or wrapped user memory) are never cached.

The cache serves the dequantizing MUL_MAT path, and block-quantized weights only when
``GGMLPY_WEIGHT_CACHE_MB`` is set: the tests run with ``GGMLPY_QUANT_MATMUL=dequant`` and the
variable set to its default (the dot-kernel path never caches: tests/backends/cpu/
test_qmatmul_placement.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_kinds import new_sim_devices
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backend.tensor_data import (
    backend_tensor_copy,
    backend_tensor_copy_async,
    backend_tensor_get,
    backend_tensor_memset,
    backend_tensor_set,
    backend_tensor_set_async,
)
from ggmlpy.backends.cpu.backend import backend_cpu_init, cpu_buffer_from_array
from ggmlpy.backends.kernels.weight_cache import CACHE, WeightCache
from ggmlpy.core.env import DEFAULT_WEIGHT_CACHE_MB, EnvError, weight_cache_mb
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize, quantize

K, M, N = 256, 48, 5


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setenv("GGMLPY_WEIGHT_CACHE_MB", str(DEFAULT_WEIGHT_CACHE_MB))
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "dequant")
    CACHE.clear()
    yield
    CACHE.clear()


def _values(t: Type, raw: np.ndarray, shape=(M, K)) -> np.ndarray:
    """float64 values of a weight's raw bytes (the reference's view of the memory)."""
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if t == Type.F16:
        return raw.view(np.float16).astype(np.float64).reshape(shape)
    return dequantize(raw, t, [shape[1], shape[0]]).astype(np.float64).reshape(shape)


def _weight_bytes(t: Type, rng, shape=(M, K)) -> np.ndarray:
    w = rng.uniform(-1, 1, shape).astype(np.float32)
    return np.ascontiguousarray(quantize(w, t)).reshape(-1).view(np.uint8)


class _Setup:
    """A weight ``w`` (type t, [K, M]) in its own WEIGHTS buffer on ``backend`` and a graph
    ``y = mul_mat(w, x)`` in another buffer."""

    def __init__(self, backend, t: Type, seed: int = 0, usage=BufferUsage.WEIGHTS) -> None:
        self.backend, self.t = backend, t
        self.rng = np.random.default_rng(seed)
        self.wctx = Context(no_alloc=True)
        self.w = self.wctx.new_tensor(t, (K, M)).set_name("w")
        self.w2 = self.wctx.new_tensor(t, (K, M)).set_name("w2")  # a copy source
        self.wbuf = alloc_ctx_tensors(self.wctx, backend)
        self.wbuf.set_usage(usage)
        self.ctx = Context(no_alloc=True)
        self.x = self.ctx.new_tensor(Type.F32, (K, N)).set_name("x")
        self.y = ops.mul_mat(self.ctx, self.w, self.x)
        self.buf = alloc_ctx_tensors(self.ctx, backend)
        self.graph = Graph(8)
        self.graph.build_forward_expand(self.y)
        self.raw = _weight_bytes(t, self.rng)
        backend_tensor_set(self.w, self.raw)
        self.xv = self.rng.uniform(-1, 1, (N, K)).astype(np.float32)
        backend_tensor_set(self.x, self.xv)

    def product(self) -> np.ndarray:
        self.backend.graph_compute(self.graph)
        return np.asarray(backend_tensor_get(self.y)).reshape(-1).view(np.float32).reshape(N, M)

    def check(self) -> None:
        """The next product equals the float64 reference of the weight's current bytes."""
        got = self.product()
        raw = np.asarray(backend_tensor_get(self.w)).reshape(-1).view(np.uint8)
        np.testing.assert_array_equal(raw, self.raw)  # the test's own mirror is right
        want = self.xv.astype(np.float64) @ _values(self.t, self.raw).T
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def free(self) -> None:
        self.buf.free()
        self.wbuf.free()


TYPES = [Type.F16, Type.Q8_0, Type.Q4_K]


def _types(t):
    if t.is_quantized:
        pytest.importorskip("gguf")
    if t.is_quantized and K % t.blck_size:
        pytest.skip("row not a whole number of blocks")


@pytest.mark.parametrize("t", [Type.F16, Type.Q8_0])
def test_converted_once_then_reused_and_equal_to_f32_mul_mat(t):
    _types(t)
    cpu = backend_cpu_init()
    s = _Setup(cpu, t)
    try:
        first = s.product()
        st0 = CACHE.stats()
        assert st0["stores"] == 1 and st0["entries"] == 1 and st0["bytes"] == M * K * 4
        for _ in range(3):
            np.testing.assert_array_equal(s.product(), first)
        assert CACHE.stats()["hits"] == 3 and CACHE.stats()["stores"] == 1
        # bit-identical to an F32 MUL_MAT of the converted values (same GEMM, same shapes)
        ctx = Context(no_alloc=True)
        w32 = ctx.new_tensor(Type.F32, (K, M))
        x = ctx.new_tensor(Type.F32, (K, N))
        y = ops.mul_mat(ctx, w32, x)
        b = alloc_ctx_tensors(ctx, cpu)
        backend_tensor_set(w32, _values(t, s.raw).astype(np.float32))
        backend_tensor_set(x, s.xv)
        g = Graph(8)
        g.build_forward_expand(y)
        cpu.graph_compute(g)
        ref = np.asarray(backend_tensor_get(y)).reshape(-1).view(np.float32).reshape(N, M)
        np.testing.assert_array_equal(first, ref)
        b.free()
        s.check()
    finally:
        s.free()


# -- one test per write path -----------------------------------------------------------------


def _write_set(s):
    s.raw = _weight_bytes(s.t, s.rng)
    backend_tensor_set(s.w, s.raw)


def _write_partial_set(s):
    row = s.t.row_size(K)
    new = _weight_bytes(s.t, s.rng)[: 3 * row]
    backend_tensor_set(s.w, new, offset=7 * row)
    s.raw = s.raw.copy()
    s.raw[7 * row: 10 * row] = new


def _write_memset(s):
    row = s.t.row_size(K)
    backend_tensor_memset(s.w, 0, 2 * row, 5 * row)
    s.raw = s.raw.copy()
    s.raw[2 * row: 7 * row] = 0


def _write_copy(s):
    other = _weight_bytes(s.t, s.rng)
    backend_tensor_set(s.w2, other)
    backend_tensor_copy(s.w2, s.w)
    s.raw = other


def _write_clear(s):
    s.wbuf.clear(0)
    s.raw = np.zeros_like(s.raw)


def _write_graph_node(s):
    """A CPY node of another graph writes new values into the weight (dst in the WEIGHTS buffer)."""
    vals = s.rng.uniform(-1, 1, (M, K)).astype(np.float32)
    ctx = Context(no_alloc=True)
    src = ctx.new_tensor(Type.F32, (K, M))
    cp = ops.cpy(ctx, src, s.w)
    b = alloc_ctx_tensors(ctx, s.backend)
    backend_tensor_set(src, vals)
    g = Graph(8)
    g.build_forward_expand(cp)
    s.backend.graph_compute(g)
    b.free()
    s.raw = np.ascontiguousarray(quantize(vals, s.t)).reshape(-1).view(np.uint8)


WRITES = {"set": _write_set, "partial_set": _write_partial_set, "memset": _write_memset,
          "copy": _write_copy, "clear": _write_clear, "graph_node": _write_graph_node}


@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("write", list(WRITES))
def test_every_write_path_invalidates_the_copy(t, write):
    _types(t)
    if write == "graph_node" and t == Type.Q4_K:
        pytest.importorskip("gguf")
    s = _Setup(backend_cpu_init(), t, seed=hash(write) % 1000)
    try:
        s.check()
        s.check()
        assert CACHE.stats()["hits"] >= 1
        WRITES[write](s)
        s.check()  # never the stale copy
        s.check()  # and the new copy is cached again
        assert CACHE.stats()["stores"] >= 2
    finally:
        s.free()


def test_free_drops_entries_and_a_new_buffer_at_the_same_place_is_not_confused():
    cpu = backend_cpu_init()
    for seed in range(3):  # same sizes each time: the allocator may hand out the same memory
        s = _Setup(cpu, Type.F16, seed=seed)
        s.check()
        s.check()
        s.free()
        assert CACHE.stats()["entries"] == 0  # dropped with the buffer
    assert CACHE.stats()["stores"] == 3 and CACHE.stats()["hits"] == 3


def _sim_setup(t, latency_us: float = 0.0):
    dev = new_sim_devices(1, latency_us=latency_us)[0]
    be = dev.init_backend()
    return be, _Setup(be, t)


def test_async_set_on_sim_is_never_served_stale():
    be, s = _sim_setup(Type.F16)
    try:
        s.check()
        s.check()
        s.raw = _weight_bytes(s.t, s.rng)
        backend_tensor_set_async(be, s.w, s.raw)
        assert s.wbuf.async_writes == 1
        be.graph_compute_async(s.graph)  # ordered after the write on the stream: no cache use
        be.synchronize()
        assert s.wbuf.async_writes == 0
        got = np.asarray(backend_tensor_get(s.y)).reshape(-1).view(np.float32).reshape(N, M)
        want = s.xv.astype(np.float64) @ _values(s.t, s.raw).T
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        s.check()
        s.check()
    finally:
        s.free()
        be.free()


def test_product_queued_before_an_async_write_does_not_cache_the_old_bytes():
    """A product enqueued before an async write runs (20 ms launch latency) after the write was
    enqueued (generation already bumped) but before it lands: it reads the old bytes, which
    must not be cached under the new generation."""
    be, s = _sim_setup(Type.F16, latency_us=20_000)
    try:
        s.check()
        old = s.raw
        s.raw = _weight_bytes(s.t, s.rng)
        be.graph_compute_async(s.graph)  # reads the old weight
        backend_tensor_set_async(be, s.w, s.raw)
        be.synchronize()
        got = np.asarray(backend_tensor_get(s.y)).reshape(-1).view(np.float32).reshape(N, M)
        want = s.xv.astype(np.float64) @ _values(s.t, old).T
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        s.check()  # the new bytes, not a copy of the old ones
        s.check()
    finally:
        s.free()
        be.free()


def test_async_copy_on_sim_is_never_served_stale():
    be, s = _sim_setup(Type.F16)
    try:
        s.check()
        other = _weight_bytes(s.t, s.rng)
        backend_tensor_set(s.w2, other)
        backend_tensor_copy_async(be, be, s.w2, s.w)
        be.synchronize()
        s.raw = other
        s.check()
        s.check()
    finally:
        s.free()
        be.free()


# -- randomized: writes and products interleaved ----------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=st.sampled_from([Type.F16, Type.Q8_0]), seed=st.integers(0, 2**16),
       ops_=st.lists(st.sampled_from(["product", "product", "set", "partial_set", "memset",
                                      "copy", "clear", "graph_node"]), min_size=1, max_size=10))
def test_random_writes_and_products_match_float64(t, seed, ops_):
    s = _Setup(backend_cpu_init(), t, seed=seed)
    try:
        for op in ops_ + ["product"]:
            if op == "product":
                s.check()
            else:
                WRITES[op](s)
    finally:
        s.free()


# -- what is not cached, budget ---------------------------------------------------------------


def test_weights_outside_weights_buffers_are_not_cached():
    s = _Setup(backend_cpu_init(), Type.F16, usage=BufferUsage.ANY)
    try:
        s.check()
        s.check()
        assert CACHE.stats()["entries"] == 0 and CACHE.stats()["misses"] == 0
    finally:
        s.free()


def test_wrapped_user_memory_is_not_cached():
    cpu = backend_cpu_init()
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(Type.F16, (K, M))
    raw = np.zeros(w.nbytes + 64, np.uint8)
    shift = (-raw.ctypes.data) % 64
    mem = raw[shift:shift + w.nbytes]
    buf = cpu_buffer_from_array(mem)
    buf.set_usage(BufferUsage.WEIGHTS)
    from ggmlpy.backend.interface import tensor_alloc  # noqa: PLC0415

    tensor_alloc(buf, w, 0)
    rng = np.random.default_rng(3)
    xctx = Context(no_alloc=True)
    x = xctx.new_tensor(Type.F32, (K, N))
    y = ops.mul_mat(xctx, w, x)
    xb = alloc_ctx_tensors(xctx, cpu)
    wv = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    xv = rng.uniform(-1, 1, (N, K)).astype(np.float32)
    backend_tensor_set(x, xv)
    g = Graph(8)
    g.build_forward_expand(y)
    for _ in range(2):
        mem[:w.nbytes] = wv.reshape(-1).view(np.uint8)  # the user writes the memory directly
        cpu.graph_compute(g)
        got = np.asarray(backend_tensor_get(y)).reshape(-1).view(np.float32).reshape(N, M)
        np.testing.assert_allclose(got, xv.astype(np.float64) @ wv.astype(np.float64).T,
                                   rtol=1e-5, atol=1e-5)
        wv = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    assert CACHE.stats()["entries"] == 0
    xb.free()


def test_budget_zero_turns_the_cache_off(monkeypatch):
    monkeypatch.setenv("GGMLPY_WEIGHT_CACHE_MB", "0")
    s = _Setup(backend_cpu_init(), Type.F16)
    try:
        s.check()
        _write_set(s)
        s.check()
        assert CACHE.stats()["entries"] == 0 and CACHE.stats()["misses"] == 0
    finally:
        s.free()


def test_small_budget_evicts_least_recently_used(monkeypatch):
    one = M * K * 4
    monkeypatch.setenv("GGMLPY_WEIGHT_CACHE_MB", str(1.5 * one / (1 << 20)))  # room for one copy
    cpu = backend_cpu_init()
    a, b = _Setup(cpu, Type.F16, seed=1), _Setup(cpu, Type.F16, seed=2)
    try:
        for _ in range(2):
            a.check()
            b.check()
        st_ = CACHE.stats()
        assert st_["entries"] == 1 and st_["bytes"] == one and st_["evictions"] == 3
        b.check()
        assert CACHE.stats()["hits"] == 1  # b stayed: it was used last
        _write_set(a)
        a.check()
        b.check()
    finally:
        a.free()
        b.free()


def test_weight_larger_than_the_budget_takes_the_row_block_path(monkeypatch):
    monkeypatch.setenv("GGMLPY_WEIGHT_CACHE_MB", str(0.5 * M * K * 4 / (1 << 20)))
    s = _Setup(backend_cpu_init(), Type.Q8_0)
    pytest.importorskip("gguf")
    try:
        s.check()
        s.check()
        assert CACHE.stats()["entries"] == 0
    finally:
        s.free()


def test_weight_cache_class_budget_and_errors():
    c = WeightCache(100)
    assert c.fits(100) and not c.fits(101) and not c.fits(0)
    with pytest.raises(ValueError, match="budget_bytes must be >= 0"):
        c.set_budget(-1)


@pytest.mark.parametrize("value,want", [(None, DEFAULT_WEIGHT_CACHE_MB), ("0", 0.0), ("12.5", 12.5),
                                        (" 64 ", 64.0)])
def test_env_weight_cache_mb(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("GGMLPY_WEIGHT_CACHE_MB", raising=False)
    else:
        monkeypatch.setenv("GGMLPY_WEIGHT_CACHE_MB", value)
    assert weight_cache_mb() == want


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc"])
def test_env_weight_cache_mb_rejects(monkeypatch, value):
    monkeypatch.setenv("GGMLPY_WEIGHT_CACHE_MB", value)
    with pytest.raises(EnvError, match="GGMLPY_WEIGHT_CACHE_MB"):
        weight_cache_mb()


@pytest.mark.parametrize("x_type", [Type.F32, Type.F16])
def test_batched_broadcast_weight_from_the_cache(x_type):
    """A weight [K, M, 2] broadcast over src1 [K, N, 4] (ggml's block repeat) and F16 src1:
    the cached path gives the float64 reference on every call."""
    cpu = backend_cpu_init()
    rng = np.random.default_rng(9)
    wctx, ctx = Context(no_alloc=True), Context(no_alloc=True)
    w = wctx.new_tensor(Type.F16, (K, M, 2))
    x = ctx.new_tensor(x_type, (K, N, 4))
    y = ops.mul_mat(ctx, w, x)
    wbuf = alloc_ctx_tensors(wctx, cpu)
    wbuf.set_usage(BufferUsage.WEIGHTS)
    xbuf = alloc_ctx_tensors(ctx, cpu)
    try:
        g = Graph(8)
        g.build_forward_expand(y)
        for _ in range(2):
            wv = rng.uniform(-1, 1, (2, M, K)).astype(np.float16)
            backend_tensor_set(w, wv)
            for _ in range(2):
                xv = rng.uniform(-1, 1, (4, N, K)).astype(np.float32)
                if x_type == Type.F16:
                    xv = xv.astype(np.float16)
                backend_tensor_set(x, xv)
                cpu.graph_compute(g)
                got = np.asarray(backend_tensor_get(y)).reshape(-1).view(np.float32).reshape(4, N, M)
                wrep = np.repeat(wv.astype(np.float64), 2, axis=0)  # block repeat: i2 -> i2 // 2
                want = xv.astype(np.float64) @ wrep.swapaxes(-1, -2)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert CACHE.stats()["hits"] == 2 and CACHE.stats()["stores"] == 2
    finally:
        wbuf.free()
        xbuf.free()


def test_a_failing_synchronize_still_ends_the_pending_async_writes(monkeypatch):
    """After ``synchronize`` nothing is in flight, even when it reports a failure: the pending
    count returns to 0 and the generation moves past every copy made meanwhile."""
    be, s = _sim_setup(Type.F16)
    try:
        s.check()
        s.raw = _weight_bytes(s.t, s.rng)
        backend_tensor_set_async(be, s.w, s.raw)
        gen = s.wbuf.data_gen
        real = be._synchronize

        def failing() -> None:
            real()
            raise RuntimeError("queued work failed")
        monkeypatch.setattr(be, "_synchronize", failing)
        with pytest.raises(RuntimeError, match="queued work failed"):
            be.synchronize()
        monkeypatch.setattr(be, "_synchronize", real)
        assert s.wbuf.async_writes == 0 and s.wbuf.data_gen > gen
        s.check()
        s.check()
        assert CACHE.stats()["hits"] >= 1
    finally:
        s.free()
        be.free()


@pytest.mark.parametrize("bad", [None, 3, "buf", np.zeros(4)])
def test_buffer_written_refuses_non_buffers(bad) -> None:
    from ggmlpy.backend.write_gen import buffer_written

    with pytest.raises(TypeError, match="buffer_written: buffer must be a Buffer"):
        buffer_written(bad)


@pytest.mark.backends("CPU", "SIM0")
@pytest.mark.parametrize("t", [Type.F16, Type.Q8_0])
def test_one_graph_reads_writes_and_reads_again(backend, t):
    """One graph: ``y1 = w x``, then a CPY writes new values into ``w``, then ``y2 = w x``
    (through the CPY's result, so after it). The plan bumps the weight's write generation right
    after the CPY step (it also reads ``w`` through the cache), so ``y2`` uses the new values;
    repeated runs (SIM: a replayed launch list) stay right, and a plan that only writes a
    weights buffer bumps once when it returns."""
    _types(t)
    s = _Setup(backend, t, seed=7)
    try:
        ctx = Context(no_alloc=True)
        src = ctx.new_tensor(Type.F32, (K, M)).set_name("new_w")
        y1 = ops.mul_mat(ctx, s.w, s.x)
        cp = ops.cpy(ctx, src, s.w)
        y2 = ops.mul_mat(ctx, cp, s.x)
        buf = alloc_ctx_tensors(ctx, s.backend)
        g = Graph(16)
        g.build_forward_expand(y1)
        g.build_forward_expand(y2)
        x64 = s.xv.astype(np.float64)
        for run in range(3):
            vals = s.rng.uniform(-1, 1, (M, K)).astype(np.float32)
            backend_tensor_set(src, vals)
            old = _values(t, s.raw)
            s.backend.graph_compute(g)
            s.backend.synchronize()
            s.raw = np.ascontiguousarray(quantize(vals, t)).reshape(-1).view(np.uint8)
            got1 = np.asarray(backend_tensor_get(y1)).reshape(N, M)
            got2 = np.asarray(backend_tensor_get(y2)).reshape(N, M)
            np.testing.assert_allclose(got1, x64 @ old.T, rtol=1e-5, atol=1e-5,
                                       err_msg=f"run {run}: y1 must see the old weight")
            np.testing.assert_allclose(got2, x64 @ _values(t, s.raw).T, rtol=1e-5, atol=1e-5,
                                       err_msg=f"run {run}: y2 must see the new weight")
        s.check()  # the plain product afterwards sees the last write too
        buf.free()
    finally:
        s.free()
