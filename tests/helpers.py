"""Test helpers: run a small graph on the CPU backend and read results back.

Used by the kernel tests (tests/test_kernels_*.py). Everything here goes through the public
backend API (``tensor_alloc``, ``view_init``, ``backend_tensor_set/get``, ``graph_compute``), so
the kernels are exercised exactly as a user would reach them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors
from ggmlpy.backend.interface import BufferUsage, tensor_alloc, view_init
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import TENSOR_ALIGNMENT, backend_cpu_init
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.quants import vec_dot

__all__ = ["run_graph", "alloc_ctx", "GARBAGE_BYTE", "np_permute", "ggml_tile", "uniform",
           "dot_abs_terms", "dot_terms", "lanes_bound"]

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


# ------------------------------------------------------------------ vec_dot error bounds

_HALF = (Type.F16, Type.BF16)


def dot_abs_terms(t: Type, wb: np.ndarray, yb: np.ndarray) -> np.ndarray:
    """sum over the float terms of the vec_dot loop of their magnitudes, float64 (N, M)."""
    W = vec_dot.unpack_weight(t, wb)
    Y = vec_dot.unpack_act(vec_dot.VEC_DOT_TYPE[t], yb)
    f = np.float64
    if t in _HALF:
        return np.abs(Y["v"].astype(f)) @ np.abs(W["v"].astype(f)).T
    aw, ay = np.abs(W["q"]).astype(f), np.abs(Y["q"]).astype(f)
    if t in (Type.Q4_K, Type.Q5_K, Type.Q6_K):
        sub = 16 if t == Type.Q6_K else 32
        aw = aw * np.repeat(np.abs(W["sc"]), sub, axis=2)
    isum = np.einsum("mbj,nbj->nmb", aw, ay)                       # sum |q_w q_y| per block
    s = isum * np.abs(W["d"].astype(f))[None] * np.abs(Y["d"].astype(f))[:, None]
    if "m" in W:
        s += np.abs(W["m"].astype(f))[None] * np.abs(Y["s"].astype(f))[:, None]
    if "mn" in W:
        ab = np.abs(Y["bsums"]).astype(f)
        mins = np.einsum("mbj,nbj->nmb", np.repeat(W["mn"], 2, axis=2).astype(f), ab)
        s += mins * np.abs(W["dmin"].astype(f))[None] * np.abs(Y["d"].astype(f))[:, None]
    return s.sum(axis=2)


def dot_terms(t: Type, K: int) -> int:
    """How many float roundings a vec_dot result has at most: the block terms, their products
    and the final lane sums (F16/BF16: the K products and their sums)."""
    if t in _HALF:
        return 2 * K
    nb = K // t.blck_size
    return 4 * nb + (16 if t.blck_size == 256 else 0)


def lanes_bound(t: Type, K: int, S: np.ndarray) -> np.ndarray:
    """The compiled dot kernels' distance to the referee (qmatmul's numerics statement). Block
    types: ``terms * 2**-23 * sum|terms|`` plus one float32 tiny for results near the
    underflow. F16/BF16 (float32 lanes): ``(K // 64 + 8) * 2**-24 * sum|x w| + K * 2**-149``
    (each product passes through at most ``K // 64 - 1`` lane additions and 6 reduction ones,
    plus the final rounding of both sides; the last term for BF16 products and sums that
    underflow float32)."""
    if t in _HALF:
        return (K // 64 + 8) * 2.0 ** -24 * S + K * 2.0 ** -149
    return dot_terms(t, K) * float(np.finfo(np.float32).eps) * S + np.finfo(np.float32).tiny


def eval_mul_mat(t: Type, raw: np.ndarray, x: np.ndarray, K: int, M: int,
                 usage: BufferUsage | None, n_threads: int,
                 times: int = 1) -> tuple[list[np.ndarray], bool]:
    """One MUL_MAT node on a fresh CPU backend of ``n_threads`` threads: the weight ``raw`` (its
    bytes, type ``t``, ggml ``ne = [K, M]``) in its own buffer (given ``usage``, e.g. WEIGHTS),
    the F32 activations ``x`` (NumPy ``(N, K)``); the graph computed ``times`` times. Returns each
    result (float32 ``(N, M)``) and whether the node ran on the dot kernels."""
    cpu = backend_cpu_init()
    cpu.set_n_threads(n_threads)
    wctx, ctx = Context(no_alloc=True), Context(no_alloc=True)
    a = wctx.new_tensor(t, (K, M))
    b = ctx.new_tensor(Type.F32, (K, x.shape[0]))
    out = ops.mul_mat(ctx, a, b)
    wbuf = alloc_ctx_tensors(wctx, cpu)
    if usage is not None:
        wbuf.set_usage(usage)
    buf = alloc_ctx_tensors(ctx, cpu)
    try:
        backend_tensor_set(a, raw.reshape(-1).view(np.uint8))
        backend_tensor_set(b, x)
        g = Graph(8)
        g.build_forward_expand(out)
        res = []
        for _ in range(times):
            cpu.graph_compute(g)
            res.append(np.asarray(backend_tensor_get(out)).reshape(x.shape[0], M).copy())
        from ggmlpy.backends.kernels.matmul import uses_dot_kernel  # noqa: PLC0415

        return res, uses_dot_kernel(out)
    finally:
        wbuf.free()
        buf.free()
        cpu.free()
