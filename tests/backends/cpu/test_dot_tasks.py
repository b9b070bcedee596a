"""Dot tasks (:meth:`ggmlpy.backends.cpu.threads.Pool.run_dot`, :mod:`ggmlpy.backends.cpu.spin`):
the row chunks of one compiled product claimed by several threads from an atomic counter.

* :func:`spin.claim` hands every chunk index out exactly once over concurrent claimers, and none
  of a task that another generation replaced.
* A prepared product (:func:`ggmlpy.backends.cpu.qmatmul.prepare`) gives the same bits whatever
  threads take part and whichever chunks they take: solo, through pools of 2 and 3 threads, and
  with a second thread started on the worker side by hand (so that it really claims chunks),
  for every dot type and batches of 1 and 5 rows, with many small chunks and with the default
  chunks (at least ``qmatmul.CHUNK_WORK`` weight bytes times rows each). Expected values: the solo run, itself held
  to the vec_dot referee by tests/quants/test_quant_dot.py.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ggmlpy.backends.cpu import qmatmul
from ggmlpy.backends.cpu.threads import Pool
from ggmlpy.core.types import Type
from ggmlpy.quants import quantize

pytestmark = pytest.mark.skipif(not qmatmul.jit_available(), reason="numba not installed")

TYPES = [Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K, Type.Q6_K,
         Type.F16, Type.BF16]


def _spin():
    from ggmlpy.backends.cpu import spin

    return spin


def test_claim_hands_out_each_chunk_once() -> None:
    from numba import njit

    spin = _spin()
    done = njit(lambda ctl: spin.aadd(ctl, spin.DONE, 1))
    ctl = np.zeros(spin.WORDS, np.int64)
    n = 20000
    spin.publish(ctl, 7, 0)  # (no chunk states: claim and DONE only)
    got: list[list[int]] = [[], [], []]

    def claimer(k: int) -> None:
        while True:
            c = spin.claim(ctl, 7, n)
            if c < 0:
                return
            got[k].append(c)
            done(ctl)

    ts = [threading.Thread(target=claimer, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    every = sorted(got[0] + got[1] + got[2])
    assert every == list(range(n))
    assert ctl[spin.DONE] == n
    assert spin.claim(ctl, 7, n) == -1
    spin.publish(ctl, 8, 0)  # a new generation: the old one's claimers get nothing
    assert spin.claim(ctl, 7, n) == -1
    assert spin.claim(ctl, 8, n) == 0
    assert not spin.wait_value(ctl, spin.DONE, 1, 100)
    assert spin.wait_value(ctl, spin.TASK, 1, 100)


def test_pool_words_follow_the_dot_task_words() -> None:
    from ggmlpy.backends.cpu import threads

    spin = _spin()
    assert threads._PYSEQ >= spin.WORDS and qmatmul._CTL_SOLO >= spin.WORDS
    assert spin.MAX_CHUNKS >= qmatmul._CHUNKS


def _product(t: Type, N: int, M: int = 200, K: int = 512, seed: int = 0):
    rng = np.random.default_rng(seed + int(t))
    w = quantize(rng.standard_normal((M, K)).astype(np.float32), t).reshape(M, -1)
    if t in (Type.F16, Type.BF16):
        w = w.view(np.uint16)
    x = rng.standard_normal((N, K)).astype(np.float32)
    return w, x


def _by_hand(main, worker) -> int:
    """A run_dot whose worker side is a second thread started for this call: it waits for the
    task to be published, then claims chunks like a pool worker."""
    spin = _spin()
    ctl = np.zeros(spin.WORDS, np.int64)
    started = threading.Event()
    claimed = []

    def side() -> None:
        started.set()
        while not spin.wait_value(ctl, spin.TASK, 1 << 32, 10000):  # polls without the GIL
            pass
        claimed.append(worker(ctl, 1))

    th = threading.Thread(target=side)
    th.start()
    started.wait()
    r = main(ctl, 1)
    th.join(timeout=60)
    assert claimed, "the worker side did not run"
    return r


@pytest.mark.parametrize("chunk_work", [1, None], ids=["64-chunks", "default-chunks"])
@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("N", [1, 5])
def test_prepared_product_same_bits_for_any_threads(t: Type, N: int, chunk_work,
                                                     monkeypatch) -> None:
    # chunk_work 1: chunks by count only (about qmatmul._CHUNKS of 8 rows), so that the
    # threads share many; the default: at least qmatmul.CHUNK_WORK bytes x rows per chunk
    if chunk_work is not None:
        monkeypatch.setattr(qmatmul, "CHUNK_WORK", chunk_work)
    w, x = _product(t, N)
    M = w.shape[0]
    solo = np.full((N, M), np.nan, np.float32)
    qmatmul.prepare(t, w, x, solo)()
    assert np.isfinite(solo).all()
    for runner in ("pool2", "pool3", "hand"):
        pool = Pool(2 if runner == "pool2" else 3)
        try:
            run_dot = _by_hand if runner == "hand" else pool.run_dot
            out = np.full((N, M), np.nan, np.float32)
            step = qmatmul.prepare(t, w, x, out, run_dot)
            for _ in range(5):  # later calls find the workers polling
                out[...] = np.nan
                step()
                np.testing.assert_array_equal(out, solo)
        finally:
            pool.close()


def test_overflowing_activations_take_the_exact_product_on_threads() -> None:
    """Activations whose Q8_0 scale overflows f16 are not published as a task: the step computes
    the exact product instead (as the solo step does)."""
    t = Type.Q8_0
    w, x = _product(t, 2)
    x[0, :32] *= 1e7
    M = w.shape[0]
    pool = Pool(2)
    try:
        want = np.empty((2, M), np.float32)
        qmatmul.prepare(t, w, x, want)()
        out = np.empty((2, M), np.float32)
        qmatmul.prepare(t, w, x, out, pool.run_dot)()
        np.testing.assert_array_equal(out, want)
        from ggmlpy.quants import dequantize

        wd = dequantize(w, t, (x.shape[1], M)).astype(np.float64)
        exact = x.astype(np.float64) @ wd.T
        # a float32 GEMM of K terms: gamma_K |x| |w| (any summation order)
        K = x.shape[1]
        bound = K * 2.0 ** -24 / (1 - K * 2.0 ** -24) * (np.abs(x.astype(np.float64)) @ np.abs(wd).T)
        assert (np.abs(out - exact) <= bound).all()
    finally:
        pool.close()


def test_kernels_compiled_for_a_generic_cpu_stay_within_the_bound(tmp_path) -> None:
    """With ``NUMBA_CPU_NAME=generic`` (no AVX2: the K-quant rows' generic-IR pair sums instead
    of ``vpmaddubsw``) the kernels are still within the lanes bound of the referee."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import numpy as np
        from helpers import dot_abs_terms, lanes_bound
        from ggmlpy.backends.cpu import qmatmul, qmatmul_ir
        from ggmlpy.core.types import Type
        from ggmlpy.quants import quantize, vec_dot
        assert qmatmul_ir._MADDUBS is None
        rng = np.random.default_rng(4)
        for t in (Type.Q4_K, Type.Q5_K, Type.Q6_K, Type.Q5_0, Type.Q8_0):
            w = quantize(rng.standard_normal((9, 512)).astype(np.float32), t).reshape(9, -1)
            x = rng.standard_normal((2, 512)).astype(np.float32)
            got = qmatmul.mul_mat(t, w, x)
            yb = qmatmul.act_bytes(qmatmul.quantize_act(vec_dot.VEC_DOT_TYPE[t], x))
            want = vec_dot.vec_dot(t, w, yb)
            err = np.abs(got.astype(np.float64) - want)
            assert (err <= lanes_bound(t, 512, dot_abs_terms(t, w, yb))).all(), t
        print("ok")
    """)
    tests = os.path.join(os.path.dirname(__file__), "..", "..")
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([os.path.abspath(tests),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=600, cwd=os.path.join(tests, ".."))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"


def test_caller_takes_over_the_chunk_of_a_stalled_worker() -> None:
    """A worker that claimed a chunk and then stalls (the operating system put it aside) does
    not hold the caller up: once the caller's own chunks are done, :func:`_rescue` waits its
    bounded time and hands it the stalled chunk (state 4); the worker's late copy is then
    dropped (it writes nothing into ``out``), and the task counts each chunk done once."""
    from numba import njit

    from ggmlpy.backends.cpu import qmatmul_tasks as k

    spin = _spin()
    done = njit(lambda ctl: spin.aadd(ctl, spin.DONE, 1))
    nch, chunk = 5, 4
    ctl = np.zeros(spin.WORDS, np.int64)
    spin.publish(ctl, 3, nch)
    stalled = spin.claim(ctl, 3, nch)  # the worker's claim
    c = spin.claim(ctl, 3, nch)
    while c >= 0:  # the caller's chunks
        k._own(ctl, c, 3)
        c = spin.claim(ctl, 3, nch)
    assert ctl[spin.DONE] == nch - 1
    assert k._rescue(ctl, nch, 3) == stalled
    assert ctl[spin.STATES + stalled] == spin.state(3, 4)
    done(ctl)  # the caller computed it
    assert k._rescue(ctl, nch, 3) == -1
    out = np.zeros((2, nch * chunk), np.float32)
    tmp = np.full((2, chunk), np.nan, np.float32)
    m0 = stalled * chunk
    k._commit(ctl, stalled, 3, tmp, out, m0, m0 + chunk)  # the worker wakes up: dropped
    assert not out.any() and ctl[spin.DONE] == nch
    # a worker that is on time copies its chunk out and counts it
    spin.publish(ctl, 4, 1)
    assert spin.claim(ctl, 4, 1) == 0
    k._commit(ctl, 0, 4, tmp, out, 0, chunk)
    assert np.isnan(out[:, :chunk]).all() and not out[:, chunk:].any()
    assert ctl[spin.STATES] == spin.state(4, 3) and ctl[spin.DONE] == 1
    assert k._rescue(ctl, 1, 4) == -1


@pytest.mark.parametrize("stalled,n_next", [(0, 1), (1, 2), (2, 3), (3, 5)])
def test_a_worker_waking_after_its_task_ended_touches_nothing_of_the_next(stalled: int,
                                                                         n_next: int) -> None:
    """A worker claims a chunk of task 5 and is put aside; the caller takes the chunk over,
    finishes, and the next task (6) is published, which resets the chunk states. When the worker
    wakes up, its copy is dropped: the old ``out`` (memory that may hold another tensor by now)
    is not written, and the next task's chunks and count are untouched, so the next task's
    caller still computes every chunk (before the states carried the generation, the stale copy
    won the reset state, wrote the old ``out`` and counted as a chunk of the next task, which
    was then never computed: zeros in a loaded machine's Gemma logits). Table over the
    stalled chunk and the next task's size."""
    from ggmlpy.backends.cpu import qmatmul_tasks as k

    spin = _spin()
    nch, chunk = 4, 4
    ctl = np.zeros(spin.WORDS, np.int64)
    spin.publish(ctl, 5, nch)
    claims = [spin.claim(ctl, 5, nch) for _ in range(nch)]
    for c in claims:
        if c != stalled:
            k._own(ctl, c, 5)
    assert k._rescue(ctl, nch, 5) == stalled  # the caller takes it over, computes it
    ctl[spin.DONE] += 1
    assert k._rescue(ctl, nch, 5) == -1
    spin.publish(ctl, 6, n_next)  # the next task
    old_out = np.zeros((2, nch * chunk), np.float32)
    tmp = np.full((2, chunk), np.nan, np.float32)
    m0 = stalled * chunk
    k._commit(ctl, stalled, 5, tmp, old_out, m0, m0 + chunk)  # the stale worker wakes up
    assert not old_out.any()
    assert ctl[spin.DONE] == 0
    assert (ctl[spin.STATES:spin.STATES + n_next] == spin.state(6, 0)).all()
    got = [spin.claim(ctl, 6, n_next) for _ in range(n_next + 1)]
    assert got == [*range(n_next), -1]  # every chunk of the next task is still handed out


@pytest.mark.parametrize("t", [Type.Q5_0, Type.Q4_1, Type.Q6_K, Type.BF16])
def test_a_polling_worker_runs_a_published_task_without_python(t: Type) -> None:
    """:func:`serve` (a pool worker's poll loop) picks up a published task, runs every chunk
    from the task's descriptor (its arrays rebuilt from their addresses, no Python), copies them
    out, and returns after its budget: the same bits as the caller alone."""
    from ggmlpy.backends.cpu import qmatmul_tasks as k

    spin = _spin()
    w, x = _product(t, 5)
    M = w.shape[0]
    seen = []

    def capture(main, worker) -> int:
        seen.append(main)
        return main(np.zeros(spin.WORDS, np.int64), 1)

    out = np.full((5, M), np.nan, np.float32)
    qmatmul.prepare(t, w, x, out, capture)()
    want = out.copy()
    assert np.isfinite(want).all()
    main = seen[0]
    desc = next(a for a in main.args if isinstance(a, np.ndarray) and a.dtype == np.int64)
    assert desc[k.D_FAMILY] >= 0  # every array C-contiguous: a native descriptor
    nch = -(-M // int(desc[k.D_CHUNK]))
    out[...] = np.nan
    ctl = np.zeros(spin.WORDS + 8, np.int64)
    k._post(ctl, desc)
    spin.publish(ctl, 9, nch)
    busy = spin.WORDS + 4
    ctl[busy] = 1  # cleared at entry: the worker is back in compiled code
    code, gen = k.serve(ctl, 0, spin.WORDS, 0, 1000, busy)
    assert (code, gen) == (0, 9) and ctl[busy] == 0
    assert ctl[spin.DONE] == nch and (ctl[spin.STATES:spin.STATES + nch] == spin.state(9, 3)).all()
    np.testing.assert_array_equal(out, want)
    # a new slice hand-out ends the poll at once
    ctl[spin.WORDS] = 1
    assert k.serve(ctl, 9, spin.WORDS, 0, 10 ** 9, busy) == (2, 9)
    # a task without a native descriptor: the worker leaves for its Python callable, marked
    # busy before it takes the GIL back
    k._post(ctl, np.full(16, -1, np.int64))
    spin.publish(ctl, 10, nch)
    ctl[spin.WORDS] = 0
    assert k.serve(ctl, 9, spin.WORDS, 0, 10 ** 9, busy) == (1, 10) and ctl[busy] == 1


def test_caller_waits_for_a_worker_back_from_python_before_returning() -> None:
    """spin.wait_workers_back: a task's caller, done with every chunk, spins while a worker of
    the pool is between its Python callable and its poll loop (a worker there holds the GIL, and
    a caller back in Python then would sleep on it): at once without workers or with every
    worker back, bounded for a worker that does not come back."""
    import time

    spin = _spin()

    def took(ctl):
        t = time.perf_counter()
        spin.wait_workers_back(ctl)
        return time.perf_counter() - t

    took(np.zeros(spin.POOL_WORKER0, np.int64))  # compiled; no workers: returns
    ctl = np.zeros(spin.POOL_WORKER0 + 2 * spin.POOL_WORKER_STRIDE, np.int64)
    idle = min(took(ctl) for _ in range(5))
    ctl[spin.POOL_WORKER0 + spin.POOL_WORKER_STRIDE + spin.W_BUSY] = 1  # worker 1 away
    away = took(ctl)
    assert away > 20 * idle and away < 5  # it spun its whole budget, and no longer


def test_warm_up_runs_every_kernel_and_task(monkeypatch) -> None:
    assert qmatmul.warm_up() is True
    monkeypatch.setenv("GGMLPY_JIT", "0")
    assert qmatmul.warm_up() is False


@pytest.mark.parametrize("t", [Type.Q8_0, Type.Q4_K])
def test_steps_of_one_shape_share_buffers_and_stay_correct(t) -> None:
    """Prepared steps of one activation kind and shape share their quantized-activation buffers
    (qmatmul.shared_scratch): steps run one after another in any order, and from two threads at
    once, still give each its own product, bit for bit the one of a step run alone."""
    rng = np.random.default_rng(int(t))
    K, M, N = 512, 40, 9
    ws = [quantize(rng.standard_normal((M, K)).astype(np.float32), t).reshape(M, -1)
          for _ in range(3)]
    xs = [rng.standard_normal((N, K)).astype(np.float32) for _ in range(3)]
    want = []
    for w, x in zip(ws, xs):
        o = np.empty((N, M), np.float32)
        qmatmul.prepare(t, w, x, o)()
        want.append(o.copy())
    outs = [np.empty((N, M), np.float32) for _ in range(3)]
    steps = [qmatmul.prepare(t, w, x, o) for w, x, o in zip(ws, xs, outs)]
    assert (qmatmul.shared_scratch(("act", qmatmul.VEC_DOT_TYPE[t], N, K), [])[1][0]
            .shape == (N, K))
    for i in (2, 0, 1, 0):
        steps[i]()
        np.testing.assert_array_equal(outs[i], want[i])
    errors = []

    def loop(i: int) -> None:
        for _ in range(30):
            steps[i]()
            if not np.array_equal(outs[i], want[i]):
                errors.append(i)

    th = [threading.Thread(target=loop, args=(i,)) for i in range(3)]
    for h in th:
        h.start()
    for h in th:
        h.join()
    assert errors == []


def test_shared_buffers_are_freed_with_the_last_step() -> None:
    """The shared activation buffers live as long as a prepared step that uses them (its lock
    holds them): after the last such step is dropped, e.g. when a model closes, the set is freed
    and a new step of that shape gets fresh buffers, not ones kept for the process's life."""
    import gc
    import weakref

    rng = np.random.default_rng(3)
    K, M, N = 512, 24, 7
    w = quantize(rng.standard_normal((M, K)).astype(np.float32), Type.Q8_0).reshape(M, -1)
    x = rng.standard_normal((N, K)).astype(np.float32)
    out = np.empty((N, M), np.float32)
    key = ("act", "q8_0", N, K)
    steps = [qmatmul.prepare(Type.Q8_0, w, x, out) for _ in range(2)]
    lock, arrays = qmatmul.shared_scratch(key, [])
    alive = weakref.ref(arrays[0].base if arrays[0].base is not None else arrays[0])
    del lock, arrays
    steps[0]()
    del steps[0]
    gc.collect()
    assert key in qmatmul._SCRATCH and alive() is not None   # the other step still holds it
    steps[0]()
    del steps
    gc.collect()
    assert key not in qmatmul._SCRATCH and alive() is None
