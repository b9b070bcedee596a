"""Matrix products: MUL_MAT (``dst = b @ a^T`` with ggml's block-repeat broadcast over dims 2/3)
and OUT_PROD. F16 operands are computed in float32; the result is F32.

On NumPy (CPU, SIM) a float32 product goes to the external CBLAS that ``GGMLPY_BLAS`` selects
(:mod:`ggmlpy.backends.cpu.blas`: MKL when the ``mkl`` extra is installed; one ``cblas_sgemm``,
or one ``cblas_sgemm_batch`` for a batched product, with addresses fixed at plan build) when it
can take the operands as they lie, else to NumPy's ``matmul``; the weight cache's float32 copies
below go to the same library.

MUL_MAT also takes a BF16 or block-quantized ``src0`` (the weight, NumPy shape ``(A3, A2, M, K)``)
with an F32 ``src1``, and an F16 ``src0`` with F32/F16 ``src1``:

* NumPy (CPU, SIM), ``GGMLPY_QUANT_MATMUL=ggml`` (the default), F32 ``src1`` of fewer rows than
  the weight type's crossover (:data:`ggmlpy.backends.cpu.qmatmul.CROSSOVER`): ggml's own
  method (ggml-cpu.c ``ggml_compute_forward_mul_mat``): ``src1`` is quantized to the type's
  ``vec_dot_type`` once per call and every output is one block dot product read from the
  weight's bytes in place (:mod:`ggmlpy.backends.cpu.qmatmul`); no float32 copy of the weight
  exists. Threaded plans cut the weight's rows. The choice depends on the types, the batch and
  the variable only, never on where the weight lies or on the cache below.
* NumPy, larger batches (prompt processing) and ``GGMLPY_QUANT_MATMUL=dequant``: the weight's
  float32 values, then BLAS, in one of the two ways below. The left operand keeps ggml's
  numerics under ``ggml`` (:mod:`ggmlpy.backends.cpu.qgemm`): F32 activations quantized to the
  weight type's ``vec_dot_type`` and multiplied as their block values (F16/BF16: rounded to
  that type), Q4_1/Q5_1 tiles with their block mins in ``K / 32`` extra columns; activations
  that overflow the ``vec_dot_type``, ``dequant`` and F16 activations: the float32 values.
* NumPy, F16/BF16 weight in a buffer of usage WEIGHTS (block-quantized ones only when
  ``GGMLPY_WEIGHT_CACHE_MB`` is set: the cache trades memory for speed): the weight's float32
  copy comes from :mod:`.weight_cache` (converted on first use, reused until any write to the
  weight's buffer; LRU within ``GGMLPY_WEIGHT_CACHE_MB``, default 256 MiB), then the same
  row-block GEMMs as the per-call path below, so cache state and buffer usage never change the
  bits.
* NumPy, other weights (activations, compute buffers, cache off or weight over budget, async
  writes queued): converted per call in row blocks of 2-4 MiB of float32
  (:func:`~.typeconv.block_rows`; each block dequantized into the thread's tile by
  :func:`ggmlpy.backends.cpu.qgemm.dequantize_rows`), each followed by its GEMM ``dst[..., r:r+R] = b @ a_blk^T`` (the active CBLAS when it takes
  the operands, as for F32, else NumPy: one library per shape). Blocks are that large because
  thinner ones make BLAS slow (measurements in :mod:`.typeconv`); a weight under two blocks is
  one block, so no temporary ever exceeds ~4 MiB whatever the weight.
* CuPy, F16 weight: cuBLAS ``GemmEx`` with f16 inputs, f32 compute and f32 output
  (:mod:`ggmlpy.backends.cuda.gemm`); src1 is converted to f16 first, as ggml-cuda does for its
  cuBLAS path with an F16 src0. Only when the product folds to one 2-D GEMM with unit-stride
  rows; otherwise (and for BF16/quantized weights) the weight is converted on the device into a
  float32 temporary (quantized: one RawKernel launch, :mod:`ggmlpy.backends.cuda.quant`) and
  multiplied by cuBLAS (ggml-cuda likewise dequantizes src0 into a pool buffer per call).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backends.cpu import blas as cpu_blas
from ggmlpy.backends.cpu import qgemm, qmatmul
from ggmlpy.backends.cuda.gemm import gemm_f16, gemm_f16_ok
from ggmlpy.backends.kernels.common import F32, FLOATS, as_f32, as_strided, c_contig, is_numpy, src_of
from ggmlpy.backends.kernels.registry import Step, kernel
from ggmlpy.backends.kernels.typeconv import QUANT_TYPES, block_rows, rows_ok, to_f32
from ggmlpy.backends.kernels.weight_cache import CACHE, array_address, configure_from_env
from ggmlpy.core import env
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

# ---------------------------------------------------------------------------------------------
# support


def _sup_mul_mat(node: Tensor, xp: Any) -> bool:
    a, b = src_of(node, 0), src_of(node, 1)
    if a is None or b is None or node.type != Type.F32:
        return False
    if node.op == Op.MUL_MAT and (a.type in QUANT_TYPES or a.type == Type.BF16):
        # ggml: quantized/BF16 weights with F32 activations; weight rows contiguous
        if b.type != Type.F32 or not rows_ok(a) or a.nb[0] != a.type.type_size:
            return False
    elif a.type not in FLOATS or b.type not in FLOATS:
        return False
    if node.op == Op.MUL_MAT:
        shape_ok = (a.ne[0] == b.ne[0] and node.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3]))
    else:
        shape_ok = (a.ne[1] == b.ne[1] and node.ne == (a.ne[0], b.ne[0], b.ne[2], b.ne[3]))
    return shape_ok and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


# ---------------------------------------------------------------------------------------------
# kernels


def _mm_views(xp: Any, a: Any, b: Any, d: Any) -> tuple[Any, Any, Any]:
    """Views for ``d = b @ A^T`` with ggml's block-repeat broadcast of ``a`` over dims 2/3.

    ``a`` (A3, A2, M, K), ``b`` (B3, B2, N, K), ``d`` (B3, B2, N, M) NumPy shapes, with
    ``B2 = r2*A2``, ``B3 = r3*A3``. Batch axes are split into (A, r) blocks (``a`` gets stride 0
    on the r axes); trailing broadcast batch axes whose strides allow it are folded into the row
    axis N so one large GEMM replaces many small ones. Returns (aT, bv, dv) with
    ``matmul(bv, aT, out=dv)`` computing the product.
    """
    A3, A2, M, K = a.shape
    B3, B2, N, _ = b.shape
    if A3 == B3 and A2 == B2:  # no broadcast (linear layers, attention): plain indexing
        # the batch axes of size 1 dropped, as the general path below drops them
        idx = (0 if A3 == 1 else slice(None), 0 if A2 == 1 else slice(None))
        return a[idx].swapaxes(-1, -2), b[idx], d[idx]
    r2, r3 = B2 // A2, B3 // A3
    sa, sb, sd = a.strides, b.strides, d.strides
    # batch axes: (size, a_stride, b_stride, d_stride)
    batch = [(A3, sa[0], sb[0] * r3, sd[0] * r3), (r3, 0, sb[0], sd[0]),
             (A2, sa[1], sb[1] * r2, sd[1] * r2), (r2, 0, sb[1], sd[1])]
    batch = [x for x in batch if x[0] != 1]
    rows, b_row, d_row = N, sb[2], sd[2]
    while batch:
        n, s_a, s_b, s_d = batch[-1]
        if s_a == 0 and s_b == rows * b_row and s_d == rows * d_row:
            rows *= n
            batch.pop()
        else:
            break
    shp = tuple(x[0] for x in batch)
    aT = as_strided(xp, a, shp + (K, M), tuple(x[1] for x in batch) + (sa[3], sa[2]))
    bv = as_strided(xp, b, shp + (rows, K), tuple(x[2] for x in batch) + (b_row, sb[3]))
    dv = as_strided(xp, d, shp + (rows, M), tuple(x[3] for x in batch) + (d_row, sd[3]))
    return aT, bv, dv


#: batched products with at least this many rows of ``b`` per matrix copy a transposed ``a^T``
#: into a contiguous scratch first (see :func:`_nn_pays`)
NN_MIN_ROWS = 32
_tls = threading.local()


def _nn_pays(aT: Any, bv: Any) -> bool:
    """True for a NumPy batched product (``aT.ndim > 2``, e.g. attention's ``K Q^T`` per head)
    whose ``aT`` matrices are transposed views (last axis not unit-stride) and whose ``b``
    matrices have at least :data:`NN_MIN_ROWS` rows. OpenBLAS runs such many small "NT" GEMMs
    far slower than "NN" ones when it uses threads (many times slower for attention's
    per-head products; below :data:`NN_MIN_ROWS` rows the copy does not pay)."""
    return (aT.ndim > 2 and aT.strides[-1] != aT.itemsize and bv.shape[-2] >= NN_MIN_ROWS
            and aT.dtype == F32)


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """A C-contiguous float32 array of ``shape`` over this thread's scratch buffer (grown as
    needed, never shrunk; valid until the next call on the same thread)."""
    n = 1
    for d in shape:
        n *= d
    buf = getattr(_tls, "buf", None)
    if buf is None or buf.size < n:
        buf = _tls.buf = np.empty(max(n, 1), F32)
    return buf[:n].reshape(shape)


#: ``[True]`` while NumPy's BLAS runs one thread: set by
#: :func:`ggmlpy.backends.cpu.threads.blas_single_thread` while a threaded CPU plan holds BLAS,
#: and from the environment at import (``OPENBLAS_NUM_THREADS``, else ``OMP_NUM_THREADS``, = 1)
BLAS_ONE_THREAD = [os.environ.get("OPENBLAS_NUM_THREADS", os.environ.get("OMP_NUM_THREADS")) == "1"]


def _matmul_nn(bv: np.ndarray, aT: np.ndarray, dv: np.ndarray) -> None:
    """``dv = bv @ aT`` with ``aT`` first copied into a contiguous scratch (see :func:`_nn_pays`),
    unless BLAS runs one thread (:data:`BLAS_ONE_THREAD`): then the transposed ("NT") GEMMs are
    as fast as copy + NN or faster (single-threaded OpenBLAS has no slow NT path) and the copy
    is skipped."""
    if BLAS_ONE_THREAD[0]:
        np.matmul(bv, aT, out=dv)
        return
    t = _scratch(aT.shape)
    np.copyto(t, aT)
    np.matmul(bv, t, out=dv)


def _matmul_step(xp: Any, a: Any, b: Any, dst: Any) -> Step:
    """A closure for ``dst = b @ a^T`` (ggml MUL_MAT layout) over F32/F16 inputs.

    CuPy's ``matmul`` makes both operands C-contiguous first (``ascontiguousarray`` in
    ``cupy/_core/_routines_linalg.pyx``), i.e. it would copy the transposed weight ``a^T`` on every
    call. When the product folds into one 2-D GEMM with a C-contiguous output, CuPy gets ``dot``
    instead, which hands transposed (F-contiguous) operands to cuBLAS as they are
    (``_mat_to_cublas_contiguous``) and requires exactly that output layout."""
    matmul = xp.matmul
    if a.dtype == F32 and b.dtype == F32:
        aT, bv, dv = _mm_views(xp, a, b, dst)
        if is_numpy(xp):
            blas = cpu_blas.gemm_step(bv, aT, dv)  # GGMLPY_BLAS: MKL when installed
            if blas is not None:
                return blas
        if (not is_numpy(xp) and aT.ndim == 2 and dv.dtype == F32 and c_contig(dv)
                and (aT.flags.f_contiguous or c_contig(aT))):
            return partial(xp.dot, bv, aT, out=dv)
        if is_numpy(xp) and _nn_pays(aT, bv):
            return partial(_matmul_nn, bv, aT, dv)
        return partial(matmul, bv, aT, out=dv)

    def run() -> None:
        a32 = as_f32(xp, a)
        b32 = as_f32(xp, b)
        aT, bv, dv = _mm_views(xp, a32, b32, dst)
        matmul(bv, aT, out=dv)
    return run


def _converted_step(xp: Any, node: Tensor, ta: Type, a: Any, b: Any, dst: Any, K: int) -> Step:
    """MUL_MAT with a weight ``a`` of type ``ta`` (F16, BF16 or a block type) that is converted to
    float32 before its GEMM: from the weight cache or in row blocks on NumPy, whole on the device
    (see the module doc)."""
    matmul = xp.matmul
    b32 = b.dtype == F32

    if not is_numpy(xp):
        if ta == Type.F16:
            aT, bv, dv = _mm_views(xp, a, b, dst)
            if gemm_f16_ok(aT, bv, dv):
                return partial(gemm_f16, xp, aT, bv, dv)

        def run_dev() -> None:
            a32 = to_f32(xp, ta, a, K)
            aT, bv, dv = _mm_views(xp, a32, b if b32 else as_f32(xp, b), dst)
            if aT.ndim == 2 and c_contig(dv) and (aT.flags.f_contiguous or c_contig(aT)):
                xp.dot(bv, aT, out=dv)
            else:
                matmul(bv, aT, out=dv)
        return run_dev

    if uses_dot_kernel(node):
        return _dot_step(ta, a, b, dst, _RUN_DOT.get())
    lib = cpu_blas.active()  # the GEMM library, fixed at plan build as for an F32 MUL_MAT
    numerics = qgemm.gemm_numerics(ta, node.src[1].type)
    jobs = _row_block_jobs(a, b, dst, K)
    run_blocks = _row_block_step(xp, ta, jobs, b, K, lib, numerics)
    # block-quantized weights are cached only when GGMLPY_WEIGHT_CACHE_MB is set (a trade of
    # memory for speed); F16/BF16 ones within its default budget
    cache_ok = ta in (Type.F16, Type.BF16) or env.weight_cache_mb_set()
    cached = _weight_key(node, a) if cache_ok and configure_from_env() > 0 else None
    if cached is None:
        return run_blocks
    buf, key = cached
    split = numerics == "ggml" and ta in qgemm.SPLIT_MIN_TYPES
    key = key + (split,)  # the tile form is part of what is cached
    C = qgemm.gemm_cols(ta, K, numerics)
    nbytes = int(np.prod(a.shape[:-1], dtype=np.int64)) * C * 4

    def convert() -> np.ndarray:
        if split:
            rows = a.reshape(-1, a.shape[-1])
            w = qgemm.dequantize_rows(ta, rows, split=True).reshape(*a.shape[:-1], C)
        else:
            w = np.ascontiguousarray(to_f32(xp, ta, a, K), dtype=F32)
        w.flags.writeable = False
        return w

    # the cached copy is multiplied in the same row blocks, by the same GEMM calls, with the same
    # left operand as the per-call conversion: only where the float32 tile comes from differs,
    # never the bits. Activations that overflow the vec_dot type run the per-call path (exact
    # tiles) whatever the cache holds.
    # (weak reference to the copy the calls were built over, the calls, the address of the left
    # operand they read): the calls hold addresses only, so an evicted copy is not kept alive
    calls: list[Any] = [None, None, None]

    def run() -> None:
        w = CACHE.get(buf, key, nbytes, convert)
        if w is None:
            run_blocks()
            return
        xa = _left_operand(ta, b, K, numerics)
        if xa is None:
            run_blocks()
            return
        ref = calls[0]
        addr = array_address(xa)
        if ref is None or ref() is not w or calls[2] != addr:
            built = [_block_gemm(lib, w[i3:i3 + 1, i2:i2 + 1, r0:r1], xa[sl], d_blk)
                     for _, sl, d_blk, (i3, i2, r0, r1) in jobs]
            calls[:] = [weakref.ref(w), built, addr]
        for c in calls[1]:
            c()  # ``w`` (alive in this frame) is the memory the calls read
    return run


def _block_gemm(lib: Any, a_blk: np.ndarray, b: np.ndarray, d_blk: np.ndarray) -> Step:
    """One row block's ``d_blk = b @ a_blk^T`` on NumPy, float32 operands: CBLAS ``lib``
    (:func:`ggmlpy.backends.cpu.blas.active`, as an F32 MUL_MAT) when it takes the views, else NumPy's
    ``matmul`` (through a contiguous ``a^T`` where :func:`_nn_pays`). The choice depends on the
    shapes and strides only, which are the same for a cached copy's block and a freshly converted
    one, so both give the same bits."""
    aT, bv, dv = _mm_views(np, a_blk, b, d_blk)
    step = lib.gemm_step(bv, aT, dv) if lib is not None else None
    if step is not None:
        return step
    if _nn_pays(aT, bv):
        return partial(_matmul_nn, bv, aT, dv)
    return partial(np.matmul, bv, aT, out=dv)


def _weight_key(node: Tensor, a: np.ndarray) -> tuple[Any, tuple] | None:
    """``(buffer, cache key)`` when ``a`` (the compiled src0 array) is exactly ``node.src[0]``'s
    memory in a WEIGHTS buffer that :mod:`.weight_cache` may cache (not user memory wrapped as
    ``CPU_Mapped``), else None. The address check matters: a scheduler may feed the node a copy
    of the weight (``src_map``) while ``node.src[0]`` still names the original."""
    w = node.src[0]
    buf = w.buffer if w.buffer is not None else (w.view_src.buffer if w.view_src is not None else None)
    if (buf is None or getattr(buf, "_data_gen", None) is None or buf.freed
            or buf.usage != BufferUsage.WEIGHTS or buf.buft.name == "CPU_Mapped"
            or not isinstance(a, np.ndarray) or w.offset is None):
        return None
    try:
        ref = buf._array(w)
    except Exception:  # noqa: BLE001 - a buffer without host arrays: no cache
        return None
    if (not isinstance(ref, np.ndarray) or array_address(ref) != array_address(a)
            or ref.shape != a.shape or ref.strides != a.strides):
        return None
    return buf, (id(buf), array_address(a), a.shape, a.strides, w.type)


def _row_block_jobs(a: Any, b: Any, dst: Any, K: int) -> list[tuple[Any, tuple, Any, tuple]]:
    """One job per (i3, i2, row block of :func:`~.typeconv.block_rows` rows) of weight ``a``
    (NumPy shape (A3, A2, M, K)): (weight rows, batch slice of b/dst, dst columns,
    (i3, i2, first row, end row))."""
    A3, A2, M = a.shape[0], a.shape[1], a.shape[2]
    r3, r2 = b.shape[0] // A3, b.shape[1] // A2
    R = block_rows(M, K)
    jobs = []
    for i3 in range(A3):
        for i2 in range(A2):
            sl = (slice(i3 * r3, (i3 + 1) * r3), slice(i2 * r2, (i2 + 1) * r2))
            for r in range(0, M, R):
                e = min(M, r + R)
                jobs.append((a[i3:i3 + 1, i2:i2 + 1, r:e], sl, dst[sl][..., r:e], (i3, i2, r, e)))
    return jobs


def _row_block_step(xp: Any, ta: Type, jobs: list[tuple[Any, tuple, Any, tuple]], b: Any, K: int,
                    lib: Any, numerics: str) -> Step:
    """The NumPy per-call conversion: the left operand once per call (:func:`_left_operand`),
    then each row block of the weight converted into this thread's tile (:func:`_fill_tile`) and
    multiplied by its GEMM (:func:`_block_gemm` with CBLAS ``lib`` or NumPy). The GEMM calls are
    built once and reused while the tile and the left operand stay at the same addresses (the
    thread's scratch buffers only grow, so after the first calls they do)."""
    split = numerics == "ggml" and ta in qgemm.SPLIT_MIN_TYPES
    C = qgemm.gemm_cols(ta, K, numerics)
    rows = [a_blk.shape[2] for a_blk, _, _, _ in jobs]
    built: list[Any] = [None, None]  # (addresses and form the calls were built for, the calls)

    def run() -> None:
        xa = _left_operand(ta, b, K, numerics)
        sp = split
        if xa is None:  # activations beyond the vec_dot type: the exact product
            xa, sp = (b if b.dtype == F32 else b.astype(F32)), False
        cols = C if sp else K
        buf = _thread_buf("tile", max(rows) * cols)
        key = (array_address(buf), array_address(xa), xa.shape, cols)
        if built[0] != key:
            tiles = [buf[:r * cols].reshape(1, 1, r, cols) for r in rows]
            built[:] = [key, [(t, _block_gemm(lib, t, xa[sl], d_blk))
                              for t, (_, sl, d_blk, _) in zip(tiles, jobs)]]
        for (a_blk, _, _, _), (tile, gemm) in zip(jobs, built[1]):
            _fill_tile(ta, a_blk, K, tile, sp)
            gemm()
    return run


def _thread_buf(name: str, n: int) -> np.ndarray:
    """This thread's float32 scratch ``name`` of at least ``n`` elements (grown as needed, never
    shrunk; valid until the next call on the same thread)."""
    buf = getattr(_tls, name, None)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, 1), F32)
        setattr(_tls, name, buf)
    return buf


def _fill_tile(ta: Type, a_blk: Any, K: int, tile: np.ndarray, split: bool) -> None:
    """Weight rows ``a_blk`` (NumPy ``(1, 1, R, row)``) as float32 into ``tile`` ``(1, 1, R,
    C)``: block types dequantized (:func:`ggmlpy.backends.cpu.qgemm.dequantize_rows`, ``split``:
    Q4_1/Q5_1 mins in the extra columns), F16/BF16 converted (exact)."""
    if ta in QUANT_TYPES:
        qgemm.dequantize_rows(ta, a_blk[0, 0], tile[0, 0], split=split)
    else:
        np.copyto(tile, to_f32(np, ta, a_blk, K))


def _left_operand(ta: Type, b: np.ndarray, K: int, numerics: str) -> np.ndarray | None:
    """The GEMM's left operand for activations ``b`` (NumPy ``(B3, B2, N, K)``): ``"exact"``
    numerics: ``b`` as float32; ``"ggml"``: ``b`` in the weight type's ``vec_dot_type`` as the
    values its blocks stand for (:func:`ggmlpy.backends.cpu.qgemm.act_operand`, ``(B3, B2, N,
    C)`` in this thread's scratch), or None when ``b`` overflows that type."""
    if numerics != "ggml":
        return b if b.dtype == F32 else b.astype(F32)
    C = qgemm.gemm_cols(ta, K, numerics)
    rows = int(np.prod(b.shape[:-1], dtype=np.int64))
    out = _thread_buf("act", rows * C)[:rows * C].reshape(rows, C)
    if not qgemm.act_operand(ta, b.reshape(rows, K), out):
        return None
    return out.reshape(*b.shape[:-1], C)


def uses_dot_kernel(node: Tensor) -> bool:
    """Whether a NumPy MUL_MAT ``node`` runs ggml's quantized-activation dot products on its
    weight's bytes (:mod:`ggmlpy.backends.cpu.qmatmul`) rather than dequantized row blocks and a
    GEMM: decided by the types, the batch (``src1``'s rows) and ``GGMLPY_QUANT_MATMUL`` only,
    never by buffer usage or cache state (see :func:`~ggmlpy.backends.cpu.qmatmul.chooses_dot`)."""
    a, b = node.src[0], node.src[1]
    return (node.op == Op.MUL_MAT and a is not None and b is not None
            and qmatmul.chooses_dot(a.type, b.type, b.ne[1]))


#: a GEMM-path MUL_MAT with a block-quantized weight of at least this many rows per activation
#: row is cut along the weight's rows on threads, a smaller one along the activation rows (see
#: :func:`splits_weight_rows`)
WEIGHT_ROWS_PER_ACT_ROW = 8


def splits_weight_rows(node: Tensor) -> bool:
    """Whether a threaded CPU plan cuts MUL_MAT ``node`` along its weight's rows
    (:func:`ggmlpy.backends.cpu.threads.split_step`): on the dot kernels, and on the GEMM path for
    a block-quantized weight of ``M >= WEIGHT_ROWS_PER_ACT_ROW * N`` rows (``N`` activation rows).
    Each part of a weight-row cut dequantizes only its rows but builds the whole activation
    operand; each part of an activation-row cut dequantizes the whole weight and builds the operand
    of its rows only. Quantizing an activation element costs several times dequantizing a weight
    element (:mod:`ggmlpy.backends.cpu.qgemm`), so prompt batches of most shapes cut the
    activation rows, as an F32 MUL_MAT does."""
    a, b = node.src[0], node.src[1]
    if node.op != Op.MUL_MAT or a is None or b is None:
        return False
    if uses_dot_kernel(node):
        return True
    return a.type in QUANT_TYPES and a.ne[1] >= WEIGHT_ROWS_PER_ACT_ROW * b.ne[1]


#: the dot-task runner the MUL_MAT kernels compiled now hand their dot-kernel products to
#: (:func:`dot_threads`); None: the compiling thread computes them alone
_RUN_DOT: ContextVar[qmatmul.RunDot | None] = ContextVar("ggmlpy_run_dot", default=None)


def dot_runner() -> qmatmul.RunDot | None:
    """The dot-task runner of the plan being built (set by :func:`dot_threads`; None outside
    it): for kernel variants that share a product among the pool's threads the same way."""
    return _RUN_DOT.get()


@contextmanager
def dot_threads(run_dot: qmatmul.RunDot | None) -> Iterator[None]:
    """Within the ``with`` body, MUL_MAT steps compiled on the dot kernels (:func:`uses_dot_kernel`)
    share each product among threads through ``run_dot`` (a CPU backend pool's
    :meth:`~ggmlpy.backends.cpu.threads.Pool.run_dot`; see
    :func:`ggmlpy.backends.cpu.qmatmul.prepare`). Plan-build time only; nothing else changes."""
    tok = _RUN_DOT.set(run_dot)
    try:
        yield
    finally:
        _RUN_DOT.reset(tok)


def _dot_step(ta: Type, a: np.ndarray, b: np.ndarray, dst: np.ndarray,
              run_dot: qmatmul.RunDot | None = None) -> Step:
    """``dst = b @ a^T`` per batch matrix with the weight read in place: ``b`` (B3, B2, N, K)
    float32 quantized to ``ta``'s ``vec_dot_type`` on every call, then one dot kernel call per
    (i3, i2) over all of ``a``'s rows ``(M, row_bytes)`` (ggml's broadcast: ``a[i3 // r3,
    i2 // r2]``), each prepared once (:func:`ggmlpy.backends.cpu.qmatmul.prepare`, threads
    through ``run_dot``)."""
    A3, A2 = a.shape[0], a.shape[1]
    B3, B2 = b.shape[0], b.shape[1]
    r3, r2 = B3 // A3, B2 // A2
    steps = [qmatmul.prepare(ta, a[i3 // r3, i2 // r2], b[i3, i2], dst[i3, i2], run_dot)
             for i3 in range(B3) for i2 in range(B2)]
    if len(steps) == 1:
        return steps[0]

    def run() -> None:
        for s in steps:
            s()
    return run


@kernel(Op.MUL_MAT, supports=_sup_mul_mat, any_type=True)
def _k_mul_mat(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    ta = node.src[0].type
    a, b = srcs[0], srcs[1]
    if ta == Type.F32:
        return _matmul_step(xp, a, b, dst)
    return _converted_step(xp, node, ta, a, b, dst, node.src[0].ne[0])


@kernel(Op.OUT_PROD, supports=_sup_mul_mat)
def _k_out_prod(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # out_np = b^T @ A  ==  MUL_MAT(a^T, b^T) in NumPy layout
    a, b = srcs[0], srcs[1]
    return _matmul_step(xp, a.swapaxes(-1, -2), b.swapaxes(-1, -2), dst)
