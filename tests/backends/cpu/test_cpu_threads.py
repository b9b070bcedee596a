"""The CPU backend's threads (:mod:`ggmlpy.backends.cpu.threads`, ``CPUBackend.set_n_threads``).

* Every op of ``SPLIT_OPS`` on graphs large enough to be split, along NumPy axes 0, 1 and 2, with
  sources sliced alike, broadcast along the split axis, or tiled (which is not split): results
  with 2 and 3 threads are bit-identical to 1 thread (each slice runs the whole node's kernel on
  its rows); MUL_MAT (BLAS may block a smaller GEMM differently) is checked against a float64
  reference with the rigorous float32 dot-product bound ``gamma_K |a| |b|``,
  ``gamma_K = K u / (1 - K u)``, ``u = 2^-24``, which holds for any summation order.
* That the plan really split: a split node's step (``Plan.steps``) is a ``cpu_threads.Split``
  with its ``parts`` compiled; the tests count those and their ``parts``.
* Fused runs of split nodes (``fuse_chains``): which nodes join (row-aligned reads) and which
  must not (a transposed or one-row read of an earlier result, a computed softmax mask, a
  computed GEMM weight), and seeded random chains placed by the graph allocator (memory reused
  between nodes): bit-identical to one thread.
* :class:`Pool` (errors, concurrency, ``close``, ``fork``), :func:`blas_single_thread` (nested,
  from several threads), ``set_n_threads`` validation and plan cache, MiniLM against the
  sentence-transformers fixture with 1, 2 and 3 threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
import pytest
from helpers import alloc_ctx

from ggmlpy import ops
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu import threads as cpu_threads
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.backends.cpu.threads import MIN_ELEMENTS, MIN_MACS, SPLIT_OPS, Pool, Split
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

F32, F16 = Type.F32, Type.F16
REPO_ROOT = Path(__file__).resolve().parents[3]
U32 = 2.0**-24


def _split_parts(plan) -> list[list]:
    """The slices of every step of ``plan`` that runs on the backend's threads (a
    :class:`~ggmlpy.backends.cpu.threads.Split` with its slices compiled)."""
    return [s.parts for s in plan.steps if isinstance(s, Split) and s.parts is not None]


def _compute(build, n_threads: int, seed: int = 0):
    """Build ``build(ctx) -> (out, {tensor: ggml-shaped values})`` in a new context, compute it
    on a CPU backend with ``n_threads``; returns (result, inputs as written, the plan)."""
    ctx = Context()
    out, ins = build(ctx, np.random.default_rng(seed))
    buf = alloc_ctx(ctx)
    buf.set_usage(BufferUsage.COMPUTE)  # as a graph allocator's: steps are the kernels' own
    backend = backend_cpu_init()
    backend.set_n_threads(n_threads)
    assert backend.n_threads == n_threads
    try:
        arrays = []
        for t, v in ins.items():
            v = np.ascontiguousarray(v, t.type.dtype).reshape(t.ne[::-1])
            backend_tensor_set(t, v)
            arrays.append(v)
        g = Graph(64)
        g.build_forward_expand(out)
        plan = backend.graph_plan_create(g)
        backend.graph_plan_compute(plan)
        return backend_tensor_get(out), arrays, plan
    finally:
        backend.free()
        buf.free()


def _rand(rng, ne, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, tuple(ne)[::-1]).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# the table: (id, op, builder, split expected)

def _bin(fn, ne_a, ne_b, inplace=False):
    def build(ctx, rng):
        a, b = ctx.new_tensor(F32, ne_a), ctx.new_tensor(F32, ne_b)
        f = getattr(ops, fn + ("_inplace" if inplace else ""))
        bv = _rand(rng, ne_b, 0.5, 2.0)
        return f(ctx, a, b), {a: _rand(rng, ne_a), b: bv}
    return build


def _unary(fn, ne, *args):
    def build(ctx, rng):
        a = ctx.new_tensor(F32, ne)
        return getattr(ops, fn)(ctx, a, *args), {a: _rand(rng, ne, -6, 6)}
    return build


def _cpy(ne):
    def build(ctx, rng):
        a, b = ctx.new_tensor(F32, ne), ctx.new_tensor(F16, ne)
        return ops.cpy(ctx, a, b), {a: _rand(rng, ne)}
    return build


def _cont_t(ne):
    def build(ctx, rng):
        a = ctx.new_tensor(F32, ne)
        return ops.cont(ctx, ops.transpose(ctx, a)), {a: _rand(rng, ne)}
    return build


def _cont_merge(ne, f16=False):
    """Attention's merged heads: [d, L, h, B] permuted to [d, h, L, B], copied into a 2-D
    [d*h, L*B] (another shape than its source: split along the source's outer axis)."""
    def build(ctx, rng):
        a = ctx.new_tensor(F32, ne)
        p = ops.permute(ctx, a, 0, 2, 1, 3)
        if f16:
            d = ctx.new_tensor(F16, (ne[0] * ne[2], ne[1] * ne[3]))
            return ops.cpy(ctx, p, d), {a: _rand(rng, ne)}
        return ops.cont_2d(ctx, p, ne[0] * ne[2], ne[1] * ne[3]), {a: _rand(rng, ne)}
    return build


def _soft_max(ne, ne_m, scale=0.5, max_bias=0.0):
    def build(ctx, rng):
        a = ctx.new_tensor(F32, ne)
        m = None if ne_m is None else ctx.new_tensor(F32, ne_m)
        ins = {a: _rand(rng, ne, -8, 8)}
        if m is not None:
            mv = _rand(rng, ne_m, -3, 3)
            mv[..., 1::3] = -np.inf
            ins[m] = mv
        return ops.soft_max_ext(ctx, a, m, scale, max_bias), ins
    return build


def _flash_attn(D, NQ, H, NKV):
    """Attention of NQ queries over NKV cells (one KV head) with a causal mask of -inf."""
    def build(ctx, rng):
        q = ctx.new_tensor(F32, (D, NQ, H, 1))
        k, v = ctx.new_tensor(F32, (D, NKV, 1, 1)), ctx.new_tensor(F32, (D, NKV, 1, 1))
        m = ctx.new_tensor(F32, (NKV, NQ, 1, 1))
        mv = np.where(np.arange(NKV)[None, :] <= np.arange(NQ)[:, None], 0.0, -np.inf)
        ins = {q: _rand(rng, q.ne), k: _rand(rng, k.ne), v: _rand(rng, v.ne),
               m: mv.astype(np.float32)[None, None]}
        return ops.flash_attn_ext(ctx, ops.permute(ctx, q, 0, 2, 1, 3), k, v, m, 0.125, 0.0,
                                  0.0), ins
    return build


def _mul_mat(ne_a, ne_b):
    def build(ctx, rng):
        a, b = ctx.new_tensor(F32, ne_a), ctx.new_tensor(F32, ne_b)
        return ops.mul_mat(ctx, a, b), {a: _rand(rng, ne_a, -1, 1), b: _rand(rng, ne_b, -1, 1)}
    return build


E = 1 << 20  # MIN_ELEMENTS of the memory-bound ops (asserted below)
AX0, AX1, AX2 = (1024, 128, 2, 4), (1024, 256, 4, 1), (1024, 1024, 1, 1)  # ne; 2^20 elements
NRM0, NRM2 = (1024, 32, 2, 4), (512, 512, 1, 1)  # 2^18
SM0, SM1, SM2 = (512, 8, 4, 4), (512, 32, 4, 1), (256, 256, 1, 1)  # 2^16

_CASES = [
    # element-wise, split along NumPy axis 0, 1, 2; b sliced alike / broadcast / tiled
    ("add-ax0-same", Op.ADD, _bin("add", AX0, AX0), True),
    ("add-ax0-bias", Op.ADD, _bin("add", AX0, (1024, 1, 1, 1)), True),
    ("add-ax0-bcast-split-axis", Op.ADD, _bin("add", AX0, (1024, 128, 2, 1)), True),
    ("add-ax0-tiled", Op.ADD, _bin("add", AX0, (1024, 128, 2, 2)), False),
    ("add-ax1-bcast", Op.ADD, _bin("add", AX1, (1024, 256, 1, 1)), True),
    ("add-ax1-tiled", Op.ADD, _bin("add", AX1, (1024, 256, 2, 1)), False),
    ("add-ax2-bias", Op.ADD, _bin("add", AX2, (1024, 1, 1, 1)), True),
    ("add-ax2-inplace", Op.ADD, _bin("add", AX2, AX2, inplace=True), True),
    ("sub-ax1-same", Op.SUB, _bin("sub", AX1, AX1), True),
    ("sub-ax2-bcast-cols", Op.SUB, _bin("sub", AX2, (1, 1024, 1, 1)), True),
    ("mul-ax0-bias", Op.MUL, _bin("mul", AX0, (1024, 1, 2, 1)), True),
    ("mul-ax2-inplace-bias", Op.MUL, _bin("mul", AX2, (1024, 1, 1, 1), inplace=True), True),
    ("div-ax2-same", Op.DIV, _bin("div", AX2, AX2), True),
    ("div-ax1-bias", Op.DIV, _bin("div", AX1, (1024, 1, 1, 1)), True),
    ("scale-ax0", Op.SCALE, _unary("scale", AX0, 0.37), True),
    ("cpy-f16-ax1", Op.CPY, _cpy(AX1), True),
    ("dup-ax2", Op.DUP, _unary("dup", AX2), True),
    ("cont-transposed-ax0", Op.CONT, _cont_t(AX0), True),
    ("cont-transposed-ax2", Op.CONT, _cont_t(AX2), True),
    ("cont-merge-heads-2d", Op.CONT, _cont_merge((64, 128, 16, 8)), True),
    ("cont-merge-heads-one-batch", Op.CONT, _cont_merge((64, 1024, 16, 1)), True),
    ("cpy-merge-heads-f16", Op.CPY, _cont_merge((64, 128, 16, 8), f16=True), True),
    # unary
    ("gelu_erf-ax0", Op.UNARY, _unary("gelu_erf", (512, 64, 2, 2)), True),
    ("gelu_erf-ax2", Op.UNARY, _unary("gelu_erf", (256, 512, 1, 1)), True),
    ("silu-ax1", Op.UNARY, _unary("silu", (512, 64, 4, 1)), True),
    # row-wise
    ("norm-ax0", Op.NORM, _unary("norm", NRM0, 1e-5), True),
    ("norm-ax2", Op.NORM, _unary("norm", NRM2, 1e-12), True),
    # outer dims of 2 and 3 threads: the cut stays on axis 0 (contiguous slices, same kernel)
    ("norm-2x2", Op.NORM, _unary("norm", (1024, 64, 2, 2), 1e-5), True),
    ("rms_norm-ax2", Op.RMS_NORM, _unary("rms_norm", NRM2, 1e-6), True),
    ("l2_norm-ax0", Op.L2_NORM, _unary("l2_norm", NRM0, 1e-12), True),
    ("soft_max-ax0-nomask", Op.SOFT_MAX, _soft_max(SM0, None), True),
    ("soft_max-2x2-mask", Op.SOFT_MAX, _soft_max((512, 32, 2, 2), (512, 32, 1, 1)), True),
    ("soft_max-ax0-mask-bcast", Op.SOFT_MAX, _soft_max(SM0, (512, 8, 1, 1)), True),
    ("soft_max-ax0-mask-equal", Op.SOFT_MAX, _soft_max(SM0, (512, 8, 4, 4)), True),
    ("soft_max-ax0-mask-tiled", Op.SOFT_MAX, _soft_max(SM0, (512, 8, 4, 2)), False),
    ("soft_max-ax1-mask-bcast-rows", Op.SOFT_MAX, _soft_max(SM1, (512, 40, 1, 1)), True),
    ("soft_max-ax2-mask-more-rows", Op.SOFT_MAX, _soft_max(SM2, (256, 300, 1, 1), 1.0), True),
    ("soft_max-ax1-alibi", Op.SOFT_MAX, _soft_max(SM1, (512, 32, 1, 1), 1.0, 8.0), False),
    ("soft_max-ax2-alibi-big", Op.SOFT_MAX, _soft_max((256, 1024, 1, 1), (256, 1024, 1, 1),
                                                      1.0, 8.0), False),
    # attention: cut along the query rows at the kernel's chunks (512 rows: 4 chunks of 128)
    ("flash_attn-queries", Op.FLASH_ATTN_EXT, _flash_attn(64, 512, 4, 512), True),
]

# MUL_MAT: ne_a = [K, M, B2a, B3a], ne_b = [K, N, B2, B3] -> dst [M, N, B2, B3]
_MM_CASES = [
    ("mul_mat-rows", _mul_mat((256, 256, 1, 1), (256, 256, 1, 1)), True),
    ("mul_mat-batch-ax1", _mul_mat((256, 128, 4, 1), (256, 128, 4, 1)), True),
    ("mul_mat-batch-ax1-src0-bcast", _mul_mat((256, 128, 1, 1), (256, 128, 4, 1)), True),
    ("mul_mat-batch-ax0-src0-bcast", _mul_mat((128, 128, 2, 1), (128, 128, 2, 4)), True),
    ("mul_mat-batch-ax1-src0-tiled", _mul_mat((256, 128, 2, 1), (256, 128, 4, 1)), False),
]


def test_table_covers_every_split_op() -> None:
    assert {c[1] for c in _CASES} | {Op.MUL_MAT} == set(SPLIT_OPS)
    assert all(MIN_ELEMENTS[op] <= E for op in SPLIT_OPS if op not in (Op.MUL_MAT, Op.FLASH_ATTN_EXT))


def _kernel_of(step):
    """What identifies a step's kernel: the function of a ``partial``, else the code object."""
    return step.func if isinstance(step, partial) else getattr(step, "__code__", type(step))


def _expected_parts(dst_shape, n):
    """Slices of the outermost of NumPy axes 0-2 with more than one entry (contiguous slices)."""
    return min(n, next(d for d in dst_shape[:3] if d > 1))


@pytest.mark.parametrize("name,op,build,split", _CASES, ids=[c[0] for c in _CASES])
def test_split_is_bit_identical(name, op, build, split) -> None:
    one, _, plan1 = _compute(build, 1)
    assert _split_parts(plan1) == []
    assert plan1.nodes[-1].op == op
    for n in (2, 3):
        got, _, plan = _compute(build, n)
        parts = _split_parts(plan)
        if split:
            assert len(parts) == 1 and len(parts[0]) == _expected_parts(one.shape, n), \
                f"{name}: not split over {n}"
            # every slice runs the whole node's kernel (regression: slices of an inner axis were
            # strided and fell back from the Numba kernel to the NumPy one, which rounds
            # differently); binary ops may switch between NumPy and Numba on a slice: both are
            # IEEE float32 (bit-identical, checked below)
            if op not in (Op.ADD, Op.SUB, Op.MUL, Op.DIV):
                assert {_kernel_of(p) for p in parts[0]} == {_kernel_of(plan1.steps[-1])}
        else:
            assert parts == [], f"{name}: split although it must not be"
        if one.dtype == np.float16:
            one_bits, got_bits = one.view(np.int16), got.view(np.int16)
        else:
            one_bits, got_bits = one.view(np.int32), got.view(np.int32)
        np.testing.assert_array_equal(got_bits, one_bits, err_msg=f"{name}, {n} threads")


def _mm_check(got, a, b):
    """``got`` = ``b @ a^T`` per batch (ggml MUL_MAT; a, b NumPy-shaped, a's batches repeated
    over b's as ggml does: each ``r = B/A`` consecutive ones) within ``gamma_K |a||b|``."""
    K = a.shape[-1]
    B3, B2 = b.shape[0], b.shape[1]
    r3, r2 = B3 // a.shape[0], B2 // a.shape[1]  # ggml: batch i of b uses a's batch i // r
    ai = a[np.arange(B3)[:, None] // r3, np.arange(B2)[None, :] // r2]
    a64, b64 = ai.astype(np.float64), b.astype(np.float64)
    ref = b64 @ np.swapaxes(a64, -1, -2)
    mag = np.abs(b64) @ np.swapaxes(np.abs(a64), -1, -2)
    gamma = K * U32 / (1 - K * U32)
    assert got.shape == ref.shape
    err = np.abs(got - ref)
    assert np.all(err <= gamma * mag), f"max err/bound {np.max(err / (gamma * mag)):.3g}"


@pytest.mark.parametrize("name,build,split", _MM_CASES, ids=[c[0] for c in _MM_CASES])
def test_mul_mat_split_within_gemm_bound(name, build, split) -> None:
    for n in (1, 2, 3):
        got, (a, b), plan = _compute(build, n)
        dst = plan.nodes[-1]
        assert dst.op == Op.MUL_MAT and dst.ne[0] * dst.ne[1] * dst.ne[2] * dst.ne[3] \
            * a.shape[-1] >= MIN_MACS
        parts = _split_parts(plan)
        if split and n > 1:
            assert len(parts) == 1 and len(parts[0]) == _expected_parts(got.shape, n), \
                f"{name}: not split over {n}"
        else:
            assert parts == []
        _mm_check(got, a, b)


@pytest.mark.parametrize("op,build_small", [
    (Op.ADD, _bin("add", (1024, 1023, 1, 1), (1024, 1, 1, 1))),
    (Op.SCALE, _unary("scale", (1023, 1024, 1, 1), 2.0)),
    (Op.UNARY, _unary("gelu_erf", (1023, 128, 1, 1))),
    (Op.NORM, _unary("norm", (1023, 256, 1, 1), 1e-5)),
    (Op.SOFT_MAX, _soft_max((255, 256, 1, 1), (255, 256, 1, 1))),
    (Op.MUL_MAT, _mul_mat((256, 255, 1, 1), (256, 256, 1, 1))),
])
def test_below_threshold_not_split(op, build_small) -> None:
    got, ins, plan = _compute(build_small, 3)
    node = plan.nodes[-1]
    assert node.op == op
    n_el = int(np.prod(node.ne))
    if op == Op.MUL_MAT:
        assert n_el * ins[0].shape[-1] < MIN_MACS
    else:
        assert MIN_ELEMENTS[op] > n_el >= MIN_ELEMENTS[op] * 0.99
    assert _split_parts(plan) == []
    if op == Op.MUL_MAT:
        _mm_check(got, *ins)  # BLAS on 1 vs 2 threads may block differently
    else:
        one, _, _ = _compute(build_small, 1)
        np.testing.assert_array_equal(got.view(np.int32), one.view(np.int32))


def test_split_results_are_right() -> None:
    # the table compares thread counts with each other; anchor two of its cases to NumPy
    got, (a, b), _ = _compute(_bin("add", AX0, (1024, 128, 2, 1)), 3)
    np.testing.assert_array_equal(got, a + b)
    got, (x, m), _ = _compute(_soft_max(SM0, (512, 8, 1, 1)), 3)
    w = x.astype(np.float64) * 0.5 + m
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Pool

def test_pool_runs_every_slice_on_distinct_threads() -> None:
    pool = Pool(3)
    try:
        seen: list[str] = []
        lock = threading.Lock()

        def part(i):
            time.sleep(0.02)
            with lock:
                seen.append((i, threading.current_thread().name))
        pool.run([partial(part, i) for i in range(5)])  # more parts than threads: caller runs extra
        assert sorted(i for i, _ in seen) == list(range(5))
        names = dict(seen)
        assert names[0] == threading.current_thread().name
        assert names[1] != names[2] and {names[1], names[2]} <= {"ggmlpy-cpu-1", "ggmlpy-cpu-2"}
    finally:
        pool.close()


@pytest.mark.parametrize("raiser", [0, 1, 2])
def test_pool_error_reraised_after_all_slices(raiser) -> None:
    pool = Pool(3)
    done: list[int] = []

    def part(i):
        if i == raiser:
            raise KeyError(f"slice {i}")
        time.sleep(0.05)
        done.append(i)
    try:
        with pytest.raises(KeyError, match=f"slice {raiser}"):
            pool.run([partial(part, i) for i in range(3)])
        assert sorted(done) == [i for i in range(3) if i != raiser]  # nobody left running
        pool.run([partial(done.append, 10 + i) for i in range(3)])  # the pool still works
        assert sorted(done)[-3:] == [10, 11, 12]
    finally:
        pool.close()


def test_pool_concurrent_callers_no_deadlock() -> None:
    pool = Pool(2)
    results: dict[int, list[int]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def caller(k):
        try:
            for it in range(200):
                out = [None, None, None]

                def part(i, out=out, it=it):
                    out[i] = k * 100000 + it * 10 + i
                pool.run([partial(part, i) for i in range(3)])
                results[k].append(out == [k * 100000 + it * 10 + i for i in range(3)])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=caller, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    try:
        assert not any(t.is_alive() for t in threads), "deadlock"
        assert errors == []
        assert results[0] == [True] * 200 and results[1] == [True] * 200
    finally:
        pool.close()


def test_pool_close_then_run_and_validation() -> None:
    pool = Pool(2)
    got: list[str] = []
    part = lambda: got.append(threading.current_thread().name)  # noqa: E731
    pool.run([part, part])
    pool.close()
    pool.close()  # idempotent
    pool.run([part, part])
    pool.close()
    assert len(got) == 4 and got.count("ggmlpy-cpu-1") == 2
    for bad in (0, -1, True, 2.0, "2", None):
        with pytest.raises(ValueError, match="n_threads"):
            Pool(bad)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_pool_after_fork_gets_fresh_workers() -> None:
    script = textwrap.dedent("""
        import os, sys, threading
        from ggmlpy.backends.cpu.threads import Pool
        pool = Pool(2)
        names = []
        part = lambda: names.append(threading.current_thread().name)
        pool.run([part, part])
        assert sorted(names) == ["MainThread", "ggmlpy-cpu-1"], names  # (either may be first)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                done = []
                t = threading.Thread(target=lambda: (pool.run([part, part]), done.append(1)))
                t.start(); t.join(10)
                ok = done == [1] and "ggmlpy-cpu-1" in names[2:] and len(names) == 4
                code = 0 if ok else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        pool.run([part, part])
        print(os.waitstatus_to_exitcode(status), len(names))
    """)
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "4"]


# ---------------------------------------------------------------------------------------------
# BLAS threads

@lru_cache(maxsize=1)
def _numpy_blas_paths() -> frozenset[str]:
    """The BLAS libraries ``import numpy`` loads (in a fresh interpreter: this process may have
    loaded others since, e.g. SciPy's OpenBLAS, which NumPy's GEMMs never call)."""
    code = ("import json, numpy; from threadpoolctl import threadpool_info; print(json.dumps("
            "[i['filepath'] for i in threadpool_info() if i['user_api'] == 'blas']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return frozenset(os.path.realpath(p) for p in json.loads(r.stdout))


def _blas_threads() -> list[int]:
    """Thread counts of NumPy's BLAS libraries, in threadpoolctl's order."""
    from threadpoolctl import threadpool_info
    return [i["num_threads"] for i in threadpool_info()
            if i["user_api"] == "blas" and os.path.realpath(i["filepath"]) in _numpy_blas_paths()]


def test_blas_single_thread_nested_restores() -> None:
    from ggmlpy.backends.kernels import matmul

    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not _blas_threads():
        pytest.skip("NumPy's BLAS is not visible to threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        if max(before) < 2:
            pytest.skip("NumPy's BLAS runs one thread here: nothing to restore")
        flag = list(matmul.BLAS_ONE_THREAD)
        with cpu_threads.blas_single_thread():
            assert set(_blas_threads()) == {1}
            assert matmul.BLAS_ONE_THREAD == [True]  # MUL_MAT then skips its copy + NN
            with cpu_threads.blas_single_thread():
                assert set(_blas_threads()) == {1}
            assert set(_blas_threads()) == {1}  # the outer hold is still on
            assert matmul.BLAS_ONE_THREAD == [True]
        assert _blas_threads() == before
        assert matmul.BLAS_ONE_THREAD == flag
        with pytest.raises(RuntimeError, match="inside"):
            with cpu_threads.blas_single_thread():
                raise RuntimeError("inside")
        assert _blas_threads() == before


def test_blas_single_thread_overlapping_threads() -> None:
    # two backends' plans on two threads: the hold ends when the last one leaves, whichever
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        if not before or max(before) < 2:
            pytest.skip("NumPy's BLAS is not visible to threadpoolctl or runs one thread here")
        t1_in, t2_in, t1_out = threading.Event(), threading.Event(), threading.Event()
        seen: dict[str, list[int]] = {}

        def first():
            with cpu_threads.blas_single_thread():
                t1_in.set()
                t2_in.wait(10)
            t1_out.set()

        def second():
            t1_in.wait(10)
            with cpu_threads.blas_single_thread():
                t2_in.set()
                t1_out.wait(10)
                seen["after first left"] = _blas_threads()
        threads = [threading.Thread(target=f) for f in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        assert not any(t.is_alive() for t in threads)
        assert seen["after first left"] == [1] * len(before)
        assert _blas_threads() == before


def test_blas_single_thread_from_any_thread() -> None:
    # regression: threadpoolctl >= 3.7 ignores OpenBLAS limits set from any thread but the first
    # one that set one; a hold on a worker after the main thread held did nothing, and a hold
    # the main thread took but a worker left last was never restored (BLAS stuck at 1 thread)
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        if not before or max(before) < 2:
            pytest.skip("NumPy's BLAS is not visible to threadpoolctl or runs one thread here")
        with cpu_threads.blas_single_thread():  # the main thread holds (and sets) first
            pass
        seen: dict[str, list[int]] = {}

        def hold(key):
            with cpu_threads.blas_single_thread():
                seen[key] = _blas_threads()
        t = threading.Thread(target=hold, args=("worker",))
        t.start()
        t.join(timeout=20)
        assert seen["worker"] == [1] * len(before)
        assert _blas_threads() == before
        # main enters, a worker enters, main leaves, the worker leaves last
        w_in, m_out = threading.Event(), threading.Event()

        def late():
            with cpu_threads.blas_single_thread():
                w_in.set()
                m_out.wait(10)
                seen["late"] = _blas_threads()
        t = threading.Thread(target=late)
        with cpu_threads.blas_single_thread():
            t.start()
            assert w_in.wait(10)
        m_out.set()
        t.join(timeout=20)
        assert seen["late"] == [1] * len(before)
        assert _blas_threads() == before


@pytest.mark.parametrize("n_threads, rows, held", [(1, 64, False), (2, 64, False),
                                                   (1, 4096, False), (2, 4096, True)])
def test_threaded_plan_holds_blas_at_one_thread(n_threads, rows, held) -> None:
    """BLAS is held at one thread exactly while a plan with split steps runs (decided when the
    plan is built); a plan whose nodes all run whole, e.g. too small to split, leaves BLAS's
    own threads alone (no worker of ours competes with them), and the count is restored."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        if not before or max(before) < 2:
            pytest.skip("NumPy's BLAS is not visible to threadpoolctl or runs one thread here")
        seen: list[list[int]] = []
        backend = backend_cpu_init()
        backend.set_n_threads(n_threads)
        ctx = Context()
        a = ctx.new_tensor(F32, (512, rows))
        out = ops.scale(ctx, a, 2.0)
        buf = alloc_ctx(ctx)
        try:
            v = _rand(np.random.default_rng(0), (512, rows))
            backend_tensor_set(a, v)
            g = Graph(8)
            g.build_forward_expand(out)
            plan = backend.graph_plan_create(g)
            assert plan.threaded == held
            plan.steps.append(lambda: seen.append(_blas_threads()))  # observe during the run
            backend.graph_plan_compute(plan)
            assert seen == [[1] * len(before) if held else before]
            assert _blas_threads() == before
            np.testing.assert_array_equal(backend_tensor_get(out).reshape(v.shape), v * np.float32(2.0))
        finally:
            backend.free()
            buf.free()


def test_plan_with_wrapped_split_step_is_threaded() -> None:
    """A split step the plan builder wraps (write tracking: a CPY into a weight that the same
    plan then reads through the weight cache) still makes the plan threaded, so BLAS is held at
    one thread while its slices run; results are right."""
    backend = backend_cpu_init()
    backend.set_n_threads(2)
    ctx = Context()
    K = M = 1024                                   # the CPY has 2^20 elements: it is split
    src = ctx.new_tensor(F32, (K, M))
    w = ctx.new_tensor(F16, (K, M))
    x = ctx.new_tensor(F32, (K, 4))
    y = ops.mul_mat(ctx, ops.cpy(ctx, src, w), x)
    buf = alloc_ctx(ctx)
    buf.set_usage(BufferUsage.WEIGHTS)
    try:
        rng = np.random.default_rng(3)
        sv, xv = _rand(rng, (K, M), -1, 1), _rand(rng, (K, 4), -1, 1)
        backend_tensor_set(src, sv)
        backend_tensor_set(x, xv)
        g = Graph(8)
        g.build_forward_expand(y)
        plan = backend.graph_plan_create(g)
        assert any(isinstance(getattr(st, "step", None), Split) for st in plan.steps)
        assert plan.threaded
        backend.graph_plan_compute(plan)
        # an F16 weight's MUL_MAT rounds the activations to F16 (ggml's vec_dot_type) first
        ref = (xv.astype(np.float16).astype(np.float64)
               @ sv.astype(np.float16).astype(np.float64).T)
        got = backend_tensor_get(y).reshape(ref.shape)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.sqrt(K))
    finally:
        backend.free()
        buf.free()


# ---------------------------------------------------------------------------------------------
# set_n_threads

@pytest.mark.parametrize("bad,err", [(0, ValueError), (-1, ValueError), (True, TypeError),
                                     (False, TypeError), (2.0, TypeError), ("2", TypeError),
                                     (None, TypeError), (cpu_threads.MAX_N_THREADS + 1, ValueError),
                                     (100000, ValueError)])
def test_set_n_threads_validation(bad, err) -> None:
    backend = backend_cpu_init()
    try:
        n = backend.n_threads
        with pytest.raises(err, match="n_threads"):
            backend.set_n_threads(bad)
        assert backend.n_threads == n
    finally:
        backend.free()


def test_set_n_threads_takes_numpy_ints() -> None:
    backend = backend_cpu_init()
    try:
        backend.set_n_threads(np.int64(2))
        assert backend.n_threads == 2 and type(backend.n_threads) is int
    finally:
        backend.free()


def test_default_n_threads_and_set_drops_cached_plans(monkeypatch) -> None:
    backend = backend_cpu_init()
    assert backend.n_threads == cpu_threads.default_n_threads() >= 1
    calls: list[int] = []
    orig = cpu_threads.split_step

    def spy(xp, node, dst, srcs, pool, *rest):
        calls.append(pool.n_threads)
        return orig(xp, node, dst, srcs, pool, *rest)
    monkeypatch.setattr(cpu_threads, "split_step", spy)
    ctx = Context()
    a = ctx.new_tensor(F32, AX2)
    out = ops.scale(ctx, a, 3.0)
    buf = alloc_ctx(ctx)
    try:
        v = _rand(np.random.default_rng(3), AX2)
        backend_tensor_set(a, v)
        g = Graph(8)
        g.build_forward_expand(out)
        backend.set_n_threads(1)
        backend.graph_compute(g)
        assert calls == []                      # one thread: nothing to split
        backend.set_n_threads(2)
        backend.graph_compute(g)                # the plan of 1 thread is not reused
        assert calls == [2]
        backend.graph_compute(g)                # cached
        backend.set_n_threads(2)                # same count: the plan stays
        backend.graph_compute(g)
        assert calls == [2]
        backend.set_n_threads(3)
        backend.graph_compute(g)
        assert calls == [2, 3]
        np.testing.assert_array_equal(backend_tensor_get(out), v * np.float32(3.0))
    finally:
        backend.free()
        buf.free()


# ---------------------------------------------------------------------------------------------
# MiniLM

EMB_MAX_ABS, EMB_MIN_COS = 1e-5, 0.99999  # as tests/test_model_bert.py


@pytest.mark.model
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_minilm_matches_fixture(n_threads, model_dir, fixtures_dir, monkeypatch) -> None:
    import json

    from ggmlpy.models.bert import BertModel

    public = json.loads((fixtures_dir / "minilm_public.json").read_text(encoding="utf-8"))
    monkeypatch.setattr(cpu_threads, "default_n_threads", lambda: n_threads)
    splits: list[int] = []
    orig = cpu_threads.split_step

    def spy(*args):
        split = orig(*args)
        splits.append(0 if split is None or split.parts is None else len(split.parts))
        return split
    monkeypatch.setattr(cpu_threads, "split_step", spy)
    with BertModel.load(model_dir=model_dir, device="CPU", max_batch=8) as m:
        emb = m.encode(public["sentences"], batch_size=4)
    if n_threads == 1:
        assert splits == []
    else:
        assert max(splits) == n_threads, "no node of MiniLM was split"
    ref = np.asarray(public["embeddings"], dtype=np.float64)
    got = emb.astype(np.float64)
    assert emb.dtype == np.float32 and emb.shape == ref.shape
    assert np.abs(got - ref).max() <= EMB_MAX_ABS
    cos = (got * ref).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= EMB_MIN_COS


# ---------------------------------------------------------------------------------------------
# fused runs of split nodes (cpu_threads.fuse_chains)

def _chain_rowwise(ctx, rng):
    # x + bias -> gelu_erf -> * bias -> norm -> scale: every node reads the previous one at its
    # own rows; one fused step expected
    ne = (1024, 256, 2, 2)
    x, b1, b2 = ctx.new_tensor(F32, ne), ctx.new_tensor(F32, (1024,)), ctx.new_tensor(F32, (1024,))
    y = ops.add(ctx, x, b1)
    y = ops.gelu_erf(ctx, y)
    y = ops.mul(ctx, y, b2)
    y = ops.norm(ctx, y, 1e-5)
    y = ops.scale(ctx, y, 0.5)
    return y, {x: _rand(rng, ne), b1: _rand(rng, (1024,)), b2: _rand(rng, (1024,), 0.5, 2)}


def _chain_inplace(ctx, rng):
    ne = (1024, 1024, 1, 1)
    x, b = ctx.new_tensor(F32, ne), ctx.new_tensor(F32, (1024,))
    y = ops.add(ctx, x, b)
    y = ops.gelu_erf_inplace(ctx, y)
    y = ops.scale_inplace(ctx, y, 3.0)
    y = ops.norm_inplace(ctx, y, 1e-6)
    return y, {x: _rand(rng, ne), b: _rand(rng, (1024,))}


def _chain_transposed_read(ctx, rng):
    # the second node reads the first one's result transposed (other rows): no fusion
    ne = (1024, 1024, 1, 1)
    x, b = ctx.new_tensor(F32, ne), ctx.new_tensor(F32, (1024,))
    y = ops.add(ctx, x, b)
    z = ops.cont(ctx, ops.transpose(ctx, y))
    return ops.add(ctx, z, b), {x: _rand(rng, ne), b: _rand(rng, (1024,))}


def _chain_mask_from_node(ctx, rng):
    # a node computes the softmax mask; softmax reads its rows 'not aligned' (mask rows may
    # outnumber x's): the mask node and the softmax are not fused
    ne = (1024, 1024, 1, 1)
    x, m0, m1 = (ctx.new_tensor(F32, ne) for _ in range(3))
    m = ops.add(ctx, m0, m1)
    s = ops.soft_max_ext(ctx, x, m, 0.25, 0.0)
    return ops.scale(ctx, s, 2.0), {x: _rand(rng, ne, -6, 6), m0: _rand(rng, ne),
                                    m1: _rand(rng, ne)}


def _chain_row_broadcast_of_node(ctx, rng):
    # the second node broadcasts ONE row of the first node's result over all rows
    ne = (1024, 1024, 1, 1)
    x, b = ctx.new_tensor(F32, ne), ctx.new_tensor(F32, (1024,))
    y = ops.add(ctx, x, b)
    row = ops.view_1d(ctx, y, 1024, 1000 * y.nb[1])  # row 1000: written by the last slice
    return ops.mul(ctx, y, row), {x: _rand(rng, ne), b: _rand(rng, (1024,))}


def _chain_mul_mat(ctx, rng):
    # gelu -> mul_mat (gelu's result as src1, cut alike; fusable) -> bias add; then a MUL_MAT
    # with that result as the shared weight src0 (read whole by every slice: not fusable)
    K, N = 256, 1024
    x = ctx.new_tensor(F32, (K, N))
    w, b = ctx.new_tensor(F32, (K, 256)), ctx.new_tensor(F32, (256,))
    h = ops.add(ctx, ops.mul_mat(ctx, w, ops.gelu_erf(ctx, x)), b)       # ne [256, N]
    v = ctx.new_tensor(F32, (256, 64))
    return ops.mul_mat(ctx, h, v), {x: _rand(rng, (K, N)), w: _rand(rng, (K, 256), -0.1, 0.1),
                                    b: _rand(rng, (256,)), v: _rand(rng, (256, 64))}


# name, builder, nodes per plan step (0: a step that runs unsplit), bit-exact
_CHAINS = [
    ("rowwise", _chain_rowwise, [5], True),
    ("inplace", _chain_inplace, [4], True),
    ("transposed-read", _chain_transposed_read, [1, 2], True),
    ("mask-from-node", _chain_mask_from_node, [1, 2], True),
    ("row-broadcast-of-node", _chain_row_broadcast_of_node, [1, 1], True),
    ("mul_mat", _chain_mul_mat, [3, 1], False),
]


@pytest.mark.parametrize("name,build,fused,exact", _CHAINS, ids=[c[0] for c in _CHAINS])
def test_fused_chains_equal_one_thread(name, build, fused, exact) -> None:
    one, ins, plan1 = _compute(build, 1)
    for n in (2, 3):
        got, _, plan = _compute(build, n)
        sizes = [s.n_nodes if isinstance(s, Split) and s.parts is not None else 0
                 for s in plan.steps]
        assert sizes == fused, f"{name}, {n} threads: nodes per step {sizes}"
        if exact:
            np.testing.assert_array_equal(got.view(np.int32), one.view(np.int32),
                                          err_msg=f"{name}, {n} threads")
        else:
            # GEMMs of fewer rows may be blocked differently by BLAS (module docstring); the
            # products here are O(1) sums of 256 terms: 1e-5 relative is ~100 float32 ulps
            np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-5)


def _random_graph(seed: int, n_threads: int) -> np.ndarray:
    """A seeded random chain of splittable ops over ``ne = [1024, 1024]`` (residual adds from
    earlier nodes, in-place ops, a transposed copy now and then) placed by the graph allocator,
    which reuses memory between nodes as in a model; returns the output."""
    from ggmlpy.alloc.gallocr import GraphAllocator

    rng = np.random.default_rng(seed)
    ctx = Context(no_alloc=True)
    ne = (1024, 1024)
    x = ctx.new_tensor(F32, ne).set_input()
    bias = ctx.new_tensor(F32, (1024,)).set_input()
    mask = ctx.new_tensor(F32, ne).set_input()
    nodes = [x]
    y = x
    for _ in range(10):
        k = int(rng.integers(0, 9))
        if k == 0:
            y = ops.add(ctx, y, bias)
        elif k == 1:
            y = ops.add(ctx, y, nodes[int(rng.integers(0, len(nodes)))])  # residual
        elif k == 2:
            y = ops.mul_inplace(ctx, y, bias)
        elif k == 3:
            y = ops.gelu_erf(ctx, y)
        elif k == 4:
            y = ops.norm(ctx, y, 1e-5)
        elif k == 5:
            y = ops.soft_max_ext(ctx, y, mask, 0.5, 0.0)
        elif k == 6:
            y = ops.scale_inplace(ctx, y, float(rng.uniform(0.5, 2)))
        elif k == 7:
            y = ops.cont(ctx, ops.transpose(ctx, y))
        else:
            y = ops.sub(ctx, nodes[int(rng.integers(0, len(nodes)))], y)
        nodes.append(y)
    y.set_output()
    g = Graph(64)
    g.build_forward_expand(y)
    backend = backend_cpu_init()
    backend.set_n_threads(n_threads)
    galloc = GraphAllocator(backend.get_default_buffer_type())
    try:
        assert galloc.alloc_graph(g)
        vals = np.random.default_rng(1000 + seed)
        for t, lo, hi in ((x, -2, 2), (bias, 0.5, 1.5), (mask, -1, 1)):
            v = vals.uniform(lo, hi, t.ne[::-1]).astype(np.float32)
            if t.buffer is not None:  # an input the random graph does not use has no memory
                backend_tensor_set(t, v)
        backend.graph_compute(g)
        return backend_tensor_get(y)
    finally:
        galloc.free()
        backend.free()


@pytest.mark.parametrize("seed", range(8))
def test_random_allocated_chains_equal_one_thread(seed) -> None:
    one = _random_graph(seed, 1)
    assert np.isfinite(one).any()
    for n in (2, 3):
        got = _random_graph(seed, n)
        np.testing.assert_array_equal(got.view(np.int32), one.view(np.int32),
                                      err_msg=f"seed {seed}, {n} threads")


def _cpu_workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("ggmlpy-cpu-")}


@pytest.mark.parametrize("how", ["free", "gc", "set_n_threads"])
def test_worker_threads_stop_with_their_backend(how: str) -> None:
    """A backend's worker threads end when it is freed, garbage-collected, or given another
    thread count (the old pool's threads end, the new pool starts its own on first use)."""
    import gc

    before = _cpu_workers()
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, 1024, MIN_ELEMENTS[Op.SCALE] // 1024)
    y = ops.scale(ctx, x, 2.0)
    buf = alloc_ctx(ctx)
    backend = backend_cpu_init()
    backend.set_n_threads(3)
    backend_tensor_set(x, np.ones(x.ne[1::-1], np.float32))
    g = Graph(8)
    g.build_forward_expand(y)
    backend.graph_compute(g)
    np.testing.assert_array_equal(backend_tensor_get(y), 2.0)
    ours = _cpu_workers() - before   # other tests' backends may be collected meanwhile
    assert len(ours) == 2
    if how == "free":
        backend.free()
    elif how == "gc":
        del backend, g
        gc.collect()
    else:
        backend.set_n_threads(1)
    deadline = time.monotonic() + 5.0
    while any(t.is_alive() for t in ours) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in ours)
    buf.free()
