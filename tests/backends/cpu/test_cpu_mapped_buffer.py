"""Read-only CPU_Mapped buffers (``cpu_buffer_from_mapped``): tensors in a file mapped read-only
(as llama.cpp's ``use_mmap``) are read in place by the kernels, and every write is refused.

The weights sit in a file behind a 96-byte header, mapped with ``np.memmap(mode="r")``; the
float32 product must be exactly NumPy's (IEEE float32 multiply, the Numba kernel's second operand
a read-only array), the Q8_0 product within the Q8_0 x Q8_0 dot bound of the exact float64
product of the dequantized weight, and identical to the same bytes in an ordinary buffer.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import alloc_ctx, run_graph, uniform

from ggmlpy import ops
from ggmlpy.backend.interface import tensor_alloc
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_memset, backend_tensor_set
from ggmlpy.backends.cpu.backend import ReadOnlyHostBuffer, backend_cpu_init, cpu_buffer_from_mapped
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize, quantize

HEADER = 96  # bytes before the weights in the file (a multiple of 32)
K, M, N = 64, 6, 3


def _weights(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    w_row = uniform(rng, (K,), -2.0, 2.0)
    wq = quantize(uniform(rng, (M, K)), Type.Q8_0).reshape(-1)
    return w_row, wq


def _mapped(tmp_path, w_row: np.ndarray, wq: np.ndarray) -> np.ndarray:
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(HEADER) + w_row.tobytes() + wq.tobytes())
    return np.memmap(path, np.uint8, mode="r")


def _graph(ctx: Context, w, wq, x):
    return ops.mul(ctx, x, w), ops.mul_mat(ctx, wq, x)


def test_kernels_read_mapped_weights_in_place(tmp_path):
    rng = np.random.default_rng(5)
    w_row, wq = _weights(rng)
    x = uniform(rng, (N, K))
    mapped = _mapped(tmp_path, w_row, wq)
    assert not mapped.flags.writeable
    buf = cpu_buffer_from_mapped(mapped)
    assert isinstance(buf, ReadOnlyHostBuffer) and buf.name == "CPU_Mapped" and buf.is_host()
    assert buf.size == mapped.size
    ctx = Context()
    w = ctx.new_tensor_1d(Type.F32, K).set_name("w")
    wt = ctx.new_tensor_2d(Type.Q8_0, K, M).set_name("wq")
    tensor_alloc(buf, w, HEADER)
    tensor_alloc(buf, wt, HEADER + w_row.nbytes)
    np.testing.assert_array_equal(backend_tensor_get(w).reshape(-1), w_row)
    xt = ctx.new_tensor_2d(Type.F32, K, N).set_name("x")
    prod, mm = _graph(ctx, w, wt, xt)
    got_prod, got_mm = (a.reshape(N, -1) for a in run_graph(ctx, [prod, mm], {xt: x}))
    np.testing.assert_array_equal(got_prod, x * w_row)  # float32 products, exactly
    want = x.astype(np.float64) @ dequantize(wq, Type.Q8_0, (K, M)).astype(np.float64).T
    # Q8_0 x Q8_0: x rounded to 8-bit blocks of 32, a step of max|x|/127 per block
    bound = 2 * K * (np.abs(x).max() / 127) * np.abs(dequantize(wq, Type.Q8_0, (K, M))).max()
    assert np.abs(got_mm - want).max() <= bound
    # the same bytes in an ordinary (writable) buffer give the same bits
    ctx2 = Context()
    w2 = ctx2.new_tensor_1d(Type.F32, K)
    wt2 = ctx2.new_tensor_2d(Type.Q8_0, K, M)
    x2 = ctx2.new_tensor_2d(Type.F32, K, N)
    prod2, mm2 = _graph(ctx2, w2, wt2, x2)
    own = alloc_ctx(ctx2)
    for t, data in ((w2, w_row), (wt2, wq), (x2, x)):
        backend_tensor_set(t, data)
    g = Graph(64)
    g.build_forward_expand(prod2)
    g.build_forward_expand(mm2)
    backend_cpu_init().graph_compute(g)
    np.testing.assert_array_equal(got_prod, backend_tensor_get(prod2).reshape(N, K))
    np.testing.assert_array_equal(got_mm, backend_tensor_get(mm2).reshape(N, M))
    own.free()


def test_writes_into_a_mapped_buffer_raise(tmp_path):
    rng = np.random.default_rng(6)
    w_row, wq = _weights(rng)
    buf = cpu_buffer_from_mapped(_mapped(tmp_path, w_row, wq))
    ctx = Context()
    w = ctx.new_tensor_1d(Type.F32, K).set_name("w")
    tensor_alloc(buf, w, HEADER)
    with pytest.raises(ValueError, match="'w'.*CPU_Mapped is read-only"):
        backend_tensor_set(w, np.zeros(K, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        backend_tensor_memset(w, 0)
    with pytest.raises(ValueError, match="read-only"):
        buf.clear(0)
    np.testing.assert_array_equal(backend_tensor_get(w).reshape(-1), w_row)  # nothing written
    buf.free()
    assert buf.freed


def test_cpu_buffer_from_mapped_checks_its_array():
    with pytest.raises(TypeError, match="NumPy array"):
        cpu_buffer_from_mapped(b"\0" * 64)
    with pytest.raises(ValueError, match="1-D C-contiguous uint8"):
        cpu_buffer_from_mapped(np.zeros(16, np.float32))
    raw = np.zeros(128, np.uint8)
    shift = (-raw.ctypes.data) % 32
    with pytest.raises(ValueError, match="aligned"):
        cpu_buffer_from_mapped(raw[shift + 1:shift + 65])
    assert cpu_buffer_from_mapped(raw[shift:shift + 64]).size == 64
