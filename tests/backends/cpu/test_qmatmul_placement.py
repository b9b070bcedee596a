"""One numeric path per MUL_MAT: the dot kernels' results do not depend on where the weight lies
(a WEIGHTS buffer or a plain one), on the evaluation (first or later: no cache state), or on the
CPU backend's thread count (each output is computed by one fixed sequence of operations).

Expected values: the first evaluation of the same graph with the weight in a plain buffer on one
thread; and, to hold that run itself, the vec_dot referee (block types: exact without Numba, within
the compiled kernels' bound with it).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import dot_abs_terms as abs_terms
from helpers import eval_mul_mat, lanes_bound

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backends.cpu import qmatmul, threads
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.backends.kernels import matmul
from ggmlpy.backends.kernels.matmul import uses_dot_kernel
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.quants import quantize, vec_dot

BLOCK = [Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K, Type.Q6_K]


def _evaluate(t: Type, raw: np.ndarray, x: np.ndarray, K: int, M: int, usage: BufferUsage | None,
              n_threads: int, times: int = 2) -> list[np.ndarray]:
    return eval_mul_mat(t, raw, x, K, M, usage, n_threads, times)[0]


# block types on both paths (below and above their crossover); F16/BF16 on the dot kernels only
# (above their crossover they take the float32-copy path, whose placement rules live elsewhere)
CASES = ([(t, n) for t in BLOCK for n in (1, 5, 300)]
         + [(t, n) for t in (Type.F16, Type.BF16) for n in (1, 5) if n < qmatmul.CROSSOVER[t]])


@pytest.mark.parametrize("t,n", CASES)
def test_same_bits_from_weights_and_plain_buffers(t, n):
    K = 512
    M = 2 * 384  # a dot-kernel product over 2**19 multiply-adds is split over the weight rows
    rng = np.random.default_rng(int(t) * 7 + n)
    raw = quantize(rng.standard_normal((M, K)).astype(np.float32), t).reshape(-1)
    x = rng.standard_normal((n, K)).astype(np.float32)
    plain1 = _evaluate(t, raw, x, K, M, None, 1)
    for usage in (BufferUsage.WEIGHTS, None):
        for nt in (1, 2):
            for r in _evaluate(t, raw, x, K, M, usage, nt):
                np.testing.assert_array_equal(r, plain1[0])
    np.testing.assert_array_equal(plain1[1], plain1[0])
    if qmatmul.chooses_dot(t, Type.F32, n) and t in BLOCK:
        act = qmatmul.quantize_act(vec_dot.VEC_DOT_TYPE[t], x)
        yb = qmatmul.act_bytes(act)
        want = vec_dot.vec_dot(t, raw.reshape(M, -1), yb)
        if qmatmul.jit_available():  # float32 lanes: within the kernels' bound of the referee
            bound = lanes_bound(t, K, abs_terms(t, raw.reshape(M, -1), yb))
            assert (np.abs(plain1[0].astype(np.float64) - want) <= bound).all()
        else:
            np.testing.assert_array_equal(plain1[0], want)


def test_dot_split_cuts_the_weight_rows(monkeypatch):
    """On 2 threads a large enough dot-kernel MUL_MAT is compiled once, its product shared among
    the threads through the pool's dot tasks (with Numba), or is one Split over dst's last axis
    (the weight rows), two parts (without); a small one stays whole and on one thread."""
    pool = threads.Pool(2)
    try:
        for jit in ((True, False) if qmatmul.jit_available() else (False,)):
            monkeypatch.setenv("GGMLPY_JIT", "1" if jit else "0")
            for M, big in ((2048, True), (8, False)):
                ctx = Context(no_alloc=True)
                a = ctx.new_tensor(Type.Q8_0, (640, M))
                b = ctx.new_tensor(Type.F32, (640, 1))
                node = ops.mul_mat(ctx, a, b)
                assert uses_dot_kernel(node)
                w = np.zeros((1, 1, M, Type.Q8_0.row_size(640)), np.uint8)
                x = np.zeros((1, 1, 1, 640), np.float32)
                d = np.zeros((1, 1, 1, M), np.float32)
                calls = []

                def compile_node(xp, nd, dst, srcs, calls=calls):
                    calls.append((dst.shape, srcs[0].shape, matmul._RUN_DOT.get()))
                    return lambda: None

                s = threads.split_step(np, node, d, [w, x], pool, compile_node)
                if jit:
                    assert not isinstance(s, threads.Split)
                    assert isinstance(s, threads.DotStep) == big
                    run_dot = pool.run_dot if big else None
                    assert calls == [((1, 1, 1, M), w.shape, run_dot)]
                else:
                    assert s is not None and s.ax == 3 and s.big == big
                    if big:
                        assert calls == [((1, 1, 1, M // 2), (1, 1, M // 2, w.shape[3]), None)] * 2
    finally:
        pool.close()


def test_quant_matmul_env_selects_the_path(monkeypatch):
    ctx = Context(no_alloc=True)
    node = ops.mul_mat(ctx, ctx.new_tensor(Type.Q4_K, (256, 4)), ctx.new_tensor(Type.F32, (256, 1)))
    assert uses_dot_kernel(node)
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "dequant")
    assert not uses_dot_kernel(node)
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "fastest")
    with pytest.raises(ValueError, match="GGMLPY_QUANT_MATMUL"):
        uses_dot_kernel(node)
    monkeypatch.delenv("GGMLPY_QUANT_MATMUL")
    big = ops.mul_mat(ctx, ctx.new_tensor(Type.Q4_K, (256, 4)),
                      ctx.new_tensor(Type.F32, (256, qmatmul.CROSSOVER[Type.Q4_K])))
    assert uses_dot_kernel(big)  # the default: ggml's orders at every batch
    f16_big = ops.mul_mat(ctx, ctx.new_tensor(Type.F16, (256, 4)),
                          ctx.new_tensor(Type.F32, (256, qmatmul.CROSSOVER[Type.F16])))
    assert not uses_dot_kernel(f16_big)  # F16/BF16 weights: the GEMM path from their crossover
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "fast")
    assert uses_dot_kernel(node) and not uses_dot_kernel(big) and not uses_dot_kernel(f16_big)
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "dot")
    assert uses_dot_kernel(big) and uses_dot_kernel(f16_big)
    monkeypatch.delenv("GGMLPY_QUANT_MATMUL")
    f16_act = ops.mul_mat(ctx, ctx.new_tensor(Type.F16, (256, 4)), ctx.new_tensor(Type.F16, (256, 1)))
    assert not uses_dot_kernel(f16_act)


@pytest.mark.parametrize("t", [Type.Q4_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q6_K])
def test_graph_without_numba_gives_the_same_bits(t, monkeypatch):
    """GGMLPY_JIT=0 (the NumPy fallback, what a machine without Numba runs) takes the same path
    with the same numerics: the referee's bits."""
    K, M, n = 512, 96, 3
    rng = np.random.default_rng(int(t))
    raw = quantize(rng.standard_normal((M, K)).astype(np.float32), t).reshape(-1)
    x = rng.standard_normal((n, K)).astype(np.float32)
    monkeypatch.setenv("GGMLPY_JIT", "0")
    (got,) = _evaluate(t, raw, x, K, M, BufferUsage.WEIGHTS, 2, times=1)
    act = qmatmul.quantize_act(vec_dot.VEC_DOT_TYPE[t], x)
    np.testing.assert_array_equal(got, vec_dot.vec_dot(t, raw.reshape(M, -1), qmatmul.act_bytes(act)))


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("usage", [BufferUsage.COMPUTE, BufferUsage.ANY])
def test_plan_with_only_dot_tasks_keeps_blas(usage, rows):
    """A 2-thread plan whose only threaded step is a dot product shared through the pool (a
    compiled task that calls no BLAS) of one activation row (token generation) does not hold
    BLAS at one thread (``plan.threaded`` False: no thread-count changes of the BLAS library
    per evaluation); one of several rows (a prompt batch, whose other steps may call NumPy's
    BLAS, e.g. a flash attention's query chunks) does, so that no multithreaded OpenBLAS worker
    spins on the core the dot task's worker needs. The product is shared either way, whether the
    plan builder wraps the step (a destination outside a COMPUTE buffer) or not."""
    if not qmatmul.jit_available():
        pytest.skip("numba not installed")
    cpu = backend_cpu_init()
    cpu.set_n_threads(2)
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(Type.Q8_0, (640, 2048))
    b = ctx.new_tensor(Type.F32, (640, rows))
    out = ops.mul_mat(ctx, a, b)
    buf = alloc_ctx_tensors(ctx, cpu)
    buf.set_usage(usage)
    try:
        g = Graph(8)
        g.build_forward_expand(out)
        plan = cpu.plan_cache.get(g)
        (step,) = plan.steps
        assert isinstance(step, threads.DotStep) == (usage == BufferUsage.COMPUTE)
        assert isinstance(getattr(step, "step", step), threads.DotStep)
        assert plan.threaded == (rows > 1)
    finally:
        buf.free()
