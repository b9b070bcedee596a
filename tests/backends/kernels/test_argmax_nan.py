"""ARGMAX follows ggml's CPU loop (``ggml_vec_argmax_f32``) exactly on every backend: ties give the
last index, infinities compare as values, and NaN behaves as in ggml's ``max = MAX(max, x[i]);
if (max == x[i]) idx = i`` (it resets the running max and is never chosen). The referee is a
scalar transcription of that loop; the table covers ties, infinities, NaN positions and
all-NaN rows, then seeded random rows mix them. CPU, SIM0, the CUDA path over tests/fake_cupy.py
(FAKECUDA0) and a Ray device (RAY0, when Ray is installed) run the same shared kernel (the
conftest ``backend`` fixture); the float64 referee of test-backend-ops
(ggmlpy/testops/reference.py) is checked against the loop too."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.kernels.reduce import argmax_ggml
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.testops.reference import evaluate

NAN, INF = math.nan, math.inf


def ggml_argmax_loop(row) -> int:
    """ggml's ggml_vec_argmax_f32, line by line (MAX(a, b) is ``a > b ? a : b``)."""
    mx = -INF
    idx = 0
    for i, x in enumerate(row):
        x = float(np.float32(x))
        mx = mx if mx > x else x
        if mx == x:
            idx = i
    return idx


TABLE = [
    ([NAN, 5, NAN, 1], 3),          # the brief's example: a NaN resets the running max
    ([NAN, NAN, NAN, NAN], 0),      # all NaN
    ([1, 3, 3, 2], 2),              # ties: the last
    ([3, 3, 3, 3], 3),
    ([-INF, -INF, -INF], 2),
    ([-INF, 1, -INF], 1),
    ([INF, 1, INF, 2], 2),
    ([1, INF, NAN], 1),             # trailing NaN: the answer before it
    ([2, NAN, 1], 2),               # NaN then a smaller value: that value wins
    ([NAN, -INF], 1),
    ([-INF, NAN], 0),
    ([5, NAN, 1, 7, NAN, 3, 3, NAN], 6),
    ([0.0, -0.0, 0.0, -0.0], 3),    # +-0 compare equal
    ([1], 0),
    ([NAN], 0),
    ([-1e38, -3.4e38, -1e38], 2),
]


def test_table_matches_the_scalar_loop():
    for row, want in TABLE:
        assert ggml_argmax_loop(row) == want, row


def _rows(seed: int, n_rows: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, (n_rows, n)).astype(np.float32)  # small ints: many ties
    specials = np.array([NAN, INF, -INF], np.float32)
    mask = rng.random((n_rows, n)) < rng.uniform(0, 0.6, (n_rows, 1))
    a[mask] = rng.choice(specials, mask.sum())
    a[0] = NAN
    a[1, -1] = NAN
    return a


def _table_array() -> np.ndarray:
    """The table as one matrix, rows padded with trailing NaN (which never changes the loop's
    answer: a NaN is never taken and nothing follows it)."""
    width = max(len(r) for r, _ in TABLE)
    return np.array([r + [NAN] * (width - len(r)) for r, _ in TABLE], np.float32)


def _run(backend, a: np.ndarray) -> np.ndarray:
    ctx = Context()
    x = ctx.new_tensor_2d(Type.F32, a.shape[1], a.shape[0]).set_name("x")
    y = ops.argmax(ctx, x).set_name("am")
    g = Graph()
    g.build_forward_expand(y)
    buf = alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
    try:
        backend_tensor_set(x, np.ascontiguousarray(a))
        backend.graph_compute(g)
        backend.synchronize()
        return np.asarray(backend_tensor_get(y)).reshape(-1)
    finally:
        buf.free()


@pytest.mark.ray
def test_backends_follow_the_loop_on_the_table(backend):
    for row, want in TABLE:
        assert _run(backend, np.array([row], np.float32)).tolist() == [want], row
    # padded with trailing NaN (never changes the answer): all rows in one graph
    got = _run(backend, _table_array())
    assert got.tolist() == [w for _, w in TABLE]


@pytest.mark.ray
@pytest.mark.parametrize(("n_rows", "n"), [(64, 7), (9, 300), (3, 1)])
def test_backends_follow_the_loop_on_random_rows(backend, n_rows, n):
    a = _rows(n_rows * 1000 + n, n_rows, n)
    want = [ggml_argmax_loop(r) for r in a]
    assert _run(backend, a).tolist() == want


def test_shared_kernel_and_reference_agree_with_the_loop():
    a = _rows(5, 200, 33)
    want = np.array([ggml_argmax_loop(r) for r in a])
    assert np.array_equal(argmax_ggml(np, a), want)
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_2d(Type.F32, 33, 200)
    node = ops.argmax(ctx, x)
    g = Graph()
    g.build_forward_expand(node)
    ref = evaluate(ctx, g, {id(x): a})[id(node)]
    assert np.array_equal(ref.reshape(-1), want)
