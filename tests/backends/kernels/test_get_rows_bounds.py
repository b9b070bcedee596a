"""GET_ROWS with out-of-range indices raises on every backend (issue 10, item 6).

Before: index -1 returned the last row on the CPU, index = n_rows raised a bare NumPy IndexError
(CPU) or an anonymous ComputeError (SIM0), and CuPy's ``take`` wraps silently. Now every backend
raises ComputeError naming the op, the node, the index tensor and the bad index
(ggmlpy/backends/kernels/bounds.py): eagerly on host arrays (CPU, SIM), and on CUDA through a
device-side min/max flag read at the next synchronize (checked with tests/fake_cupy.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from backend_kinds import new_device

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.core.errors import ComputeError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

N_ROWS = 5
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

# (index pattern, the bad index the message must name)
BAD = [
    ([0, -1], -1),
    ([-2, 1, 2], -2),
    ([0, N_ROWS], N_ROWS),
    ([N_ROWS + 1, 0], N_ROWS + 1),
    ([3, 10**6], 10**6),
    ([0, I32_MAX], I32_MAX),
    ([I32_MIN, 0], I32_MIN),
    ([I32_MIN, I32_MAX], I32_MIN),  # both bad: the negative one is reported
]
GOOD = [[0], [N_ROWS - 1], [4, 0, 3, 3, 1], list(range(N_ROWS))]


def _graph(backend, n_idx, batched):
    ctx = Context()
    if batched:  # a (4, N_ROWS, 2) weight, indices (n_idx, 2): the batched kernel path
        w = ctx.new_tensor_3d(Type.F32, 4, N_ROWS, 2).set_name("w")
        ids = ctx.new_tensor_2d(Type.I32, n_idx, 2).set_name("ids")
    else:
        w = ctx.new_tensor_2d(Type.F32, 4, N_ROWS).set_name("w")
        ids = ctx.new_tensor_1d(Type.I32, n_idx).set_name("ids")
    y = ops.get_rows(ctx, w, ids).set_name("rows")
    g = Graph()
    g.build_forward_expand(y)
    buf = alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
    shape = (2, N_ROWS, 4) if batched else (N_ROWS, 4)
    wv = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    backend_tensor_set(w, wv)
    return g, w, ids, y, buf, wv


def _set_ids(ids, pattern, batched):
    a = np.array(pattern, np.int64).astype(np.int32)
    backend_tensor_set(ids, np.stack([a, a[::-1]]) if batched else a)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("pattern,bad", BAD)
def test_bad_index_raises_naming_op_node_and_index(backend, pattern, bad, batched):
    g, w, ids, y, buf, wv = _graph(backend, len(pattern), batched)
    try:
        _set_ids(ids, pattern, batched)
        with pytest.raises(ComputeError) as info:
            backend.graph_compute(g)  # CPU raises at once; SIM/CUDA at the synchronize inside
        msg = str(info.value)
        assert (f"GET_ROWS node 'rows': index {bad} in 'ids' is out of range for the {N_ROWS} "
                f"rows of 'w' (valid 0..{N_ROWS - 1})") in msg, msg
        # the backend stays usable and the flag is re-armed: a good index computes right
        _set_ids(ids, [1] * len(pattern), batched)
        backend.graph_compute(g)
        got = backend_tensor_get(y)
        if batched:
            np.testing.assert_array_equal(got, wv[:, [1] * len(pattern)][None])
        else:
            np.testing.assert_array_equal(got.reshape(len(pattern), 4),
                                          wv[[1] * len(pattern)])
    finally:
        buf.free()


@pytest.mark.parametrize("pattern", GOOD)
def test_good_indices_compute_the_rows(backend, pattern):
    g, w, ids, y, buf, wv = _graph(backend, len(pattern), False)
    try:
        _set_ids(ids, pattern, False)
        backend.graph_compute(g)
        np.testing.assert_array_equal(backend_tensor_get(y).reshape(len(pattern), 4), wv[pattern])
    finally:
        buf.free()


def test_fake_cuda_check_runs_at_synchronize_not_at_launch():
    """On CUDA the launch returns at once (no host sync per evaluation); synchronize raises."""
    b = new_device("FAKECUDA0").init_backend()
    g, w, ids, y, buf, wv = _graph(b, 2, False)
    try:
        _set_ids(ids, [0, N_ROWS], False)
        b.graph_compute_async(g)  # no error yet: the flag lives on the device
        with pytest.raises(ComputeError, match=rf"CUDA0: GET_ROWS node 'rows': index {N_ROWS} "):
            b.synchronize()
        b.synchronize()  # reported once, then re-armed
    finally:
        buf.free()
        b.free()
