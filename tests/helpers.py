"""Test helpers: run a small graph on the CPU backend and read results back.

Used by the kernel tests (tests/test_kernels_*.py). Everything here goes through the public
backend API (``tensor_alloc``, ``view_init``, ``backend_tensor_set/get``, ``graph_compute``), so
the kernels are exercised exactly as a user would reach them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ggmlpy.backend.interface import tensor_alloc, view_init
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import TENSOR_ALIGNMENT, backend_cpu_init
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type

__all__ = ["run_graph", "alloc_ctx", "GARBAGE_BYTE", "np_permute", "ggml_tile", "uniform"]

#: Every byte of a test buffer starts as this value before inputs are written: as float32 it is
#: a NaN (0xFFFFFFFF), as int32 -1, so an element a kernel forgets to write shows up at once.
GARBAGE_BYTE = 0xFF

#: every block-quantized type of the type table (ggmlpy/core/types.py), in id order: a type added
#: there is tested by every test parametrized over this list
BLOCK_TYPES = tuple(t for t in Type if t.is_quantized)
#: every plain (one element per block) type of the type table, in id order
PLAIN_TYPES = tuple(t for t in Type if not t.is_quantized)

_BACKEND = None


def _backend():
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = backend_cpu_init()
    return _BACKEND


def _align(n: int, a: int = TENSOR_ALIGNMENT) -> int:
    return (n + a - 1) // a * a


def alloc_ctx(ctx: Context):
    """Allocate every non-view tensor of ``ctx`` linearly into one new CPU buffer (each offset
    aligned to 32 bytes), then initialise every view; the buffer is filled with
    :data:`GARBAGE_BYTE` first. Returns the buffer."""
    backend = _backend()
    total = 0
    for t in ctx:
        if t.view_src is None:
            total = _align(total) + max(t.nbytes, 1)
    buf = backend.alloc_buffer(max(_align(total), TENSOR_ALIGNMENT))
    buf.clear(GARBAGE_BYTE)
    off = 0
    for t in ctx:
        if t.view_src is None and t.buffer is None:
            off = _align(off)
            tensor_alloc(buf, t, off)
            off += max(t.nbytes, 1)
    for t in ctx:
        if t.view_src is not None and t.buffer is None:
            view_init(t)
    return buf


def run_graph(ctx: Context, out_tensors: Sequence[Tensor],
              inputs: Mapping[Tensor, np.ndarray]) -> list[np.ndarray]:
    """Allocate ``ctx``, write ``inputs`` (arrays of each tensor's dtype, NumPy shape
    ``ne[::-1]``; tensors must be non-views or contiguous views), compute a graph over
    ``out_tensors`` on the CPU backend and return each output read back (NumPy shape
    ``ne[::-1]``, the tensor's dtype)."""
    buf = alloc_ctx(ctx)
    try:
        for t, arr in inputs.items():
            arr = np.ascontiguousarray(arr, dtype=t.type.dtype).reshape(t.ne[::-1])
            backend_tensor_set(t, arr)
        g = Graph(max(2048, 2 * len(ctx)))
        for t in out_tensors:
            g.build_forward_expand(t)
        _backend().graph_compute(g)
        return [backend_tensor_get(t) for t in out_tensors]
    finally:
        buf.free()


def np_permute(x: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """What ``ops.permute(a, *axes)`` shows of data ``x`` (NumPy shape ``a.ne[::-1]``), written
    from ggml's rule ``result.ne[axes[i]] = a.ne[i]``: ggml-order output dim j is input dim i
    with ``axes[i] == j``."""
    g = x.transpose(3, 2, 1, 0)                     # ggml order [i0, i1, i2, i3]
    inv = [0] * 4
    for i, ax in enumerate(axes):
        inv[ax] = i
    return np.transpose(g, inv).transpose(3, 2, 1, 0)


def ggml_tile(b: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """ggml's tiling broadcast of ``b`` to NumPy ``shape`` (every b dim divides the target)."""
    return np.tile(b, [n // m for n, m in zip(shape, b.shape)])


def uniform(rng: np.random.Generator, shape: Sequence[int], lo: float = -1.0, hi: float = 1.0,
            dtype=np.float32) -> np.ndarray:
    """U(lo, hi) samples rounded to ``dtype``."""
    return rng.uniform(lo, hi, size=tuple(shape)).astype(dtype)
