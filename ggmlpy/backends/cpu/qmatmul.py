"""MUL_MAT with the weight's blocks read in place: ggml's quantized-activation dot products.

``y = x @ W^T`` for a weight ``W`` (ggml ``src0``, ``ne = [K, M]``) of type F16, BF16 or a block
type, and float32 activations ``x`` (``src1``, ``ne = [K, N]``), computed as ggml's CPU backend
computes it (ggml-cpu.c ``ggml_compute_forward_mul_mat``): ``x`` is converted once to the weight
type's ``vec_dot_type`` (:data:`~ggmlpy.quants.vec_dot.VEC_DOT_TYPE`: Q8_0, Q8_1, Q8_K, F16 or
BF16, see :mod:`ggmlpy.quants.q8`), then every output is one ``vec_dot`` of a weight row with an
activation row, blocks decoded on the fly: no float32 copy of the weight is ever made, so a
matrix-vector product reads each weight byte once.

Two implementations:

* Numba kernels (:mod:`ggmlpy.backends.cpu.qmatmul_kernels`, the ``jit`` extra; ``GGMLPY_JIT=0``
  turns them off), one per weight type, compiled on first use and cached on disk.
* A NumPy fallback: :func:`ggmlpy.quants.vec_dot.dot_unpacked` (the referee itself) over chunks
  of weight rows (F16/BF16: float64 sums of the float32 products).

Numerics, against the referee (:mod:`ggmlpy.quants.vec_dot`, ggml's generic scalar loops). The
fallback computes exactly its float32 operations in its order (bit-identical). The compiled
block kernels sum in ggml's SIMD shape instead (ggml-cpu's AVX2/AVX512 ``vec_dot``): every
block's integer products in exact int32 lanes, converted to float32 and added to 8 float32
lanes with one fused multiply-add by the block's scale ``d_w * d_y`` (K-quants: the sub-block
scales applied in the integers first; Q4_1/Q5_1's ``m_w * s_y`` and the K-quants' min terms in
one more float32 accumulator), the lanes then added as a fixed tree. With ``nb`` blocks and
``A = sum_b |d_w d_y| sum_j |q_w q_y| (+ sum_b |m_w s_y|, + the K-quants' |min| terms)`` the sum
of the terms' magnitudes, ``|y - y_ref| <= (4 nb + 16) * 2**-23 * A`` (tested,
tests/helpers.py ``lanes_bound``): the referee's own rounding error vs the exact sum of its terms
and the kernels' are each below half of that. Where a weight block's scale is inf or NaN (a
block that does not decode) both are non-finite, but the kind may differ (an inf scale times a
lane without products is NaN where the referee has +-inf, as in ggml's SIMD loops). For F16/BF16
the float32 products are summed in float64 in another fixed order (2 x 16 lanes, then the lanes
in order; the fallback: NumPy's pairwise sum) instead of the referee's sequential one:
``|y - y_ref| <= ulp32(y_ref) + K * 2**-53 * sum_k |x_k w_k|``. In every case each output is
computed by one thread in one fixed order, so results do not depend on the thread count or on
how the rows are split.

Against ggml's own SIMD kernels the difference is the lanes' layout and the order of the
roundings: ``|y - y_ggml| <= T * 2**-23 * sum_b |term_b|`` with ``T = 4 * nb`` roundings
(``nb`` blocks; ``+ 16`` for the K-quants' lane sums) and ``term_b`` the per-block float terms;
the activations are quantized as ggml-cpu quantizes them on the host's architecture (AVX2 on
x86-64: ``id = 127 / amax``, ties to even; :mod:`ggmlpy.quants.q8_arch`, ``GGMLPY_Q8_ROUNDING``),
the referee taking those same blocks. Two ggml kernels
are less precise on this kind of CPU: its F16 dot with AVX512-FP16 accumulates in f16 lanes
(ggml-cpu/simd-mappings.h), ``|y - y_ggml| <= (K/32 + 5) * 2**-10 * sum_k |x_k w_k|``, and its BF16
dot with AVX512-BF16 flushes subnormal products to zero (up to ``K * 2**-126`` more).

Which path a MUL_MAT takes (:func:`chooses_dot`, ``GGMLPY_QUANT_MATMUL``): by default (``ggml``)
the block types run these kernels (and the CPU's x86 ggml-order variants) at every batch size,
so that token generation and prompt micro-batches alike follow ggml-cpu's summation orders and a
model's results follow llama.cpp's bit for bit; F16/BF16 weights take the GEMM path from
:data:`CROSSOVER` rows (2 and 4). ``fast`` takes, per shape, whichever is faster: the dot kernels
below :data:`CROSSOVER` ``[type]`` rows, dequantized row blocks of the weight and a BLAS GEMM
from it on (docs/quant_matmul.md has the measured crossovers). The GEMM path keeps ggml's
numerics but for the summation order (:mod:`ggmlpy.backends.cpu.qgemm`: the same activation
quantization, the referee's result within float32 summation-order rounding).

Threads: :func:`mul_mat` splits the weight rows into ``n_threads`` contiguous ranges (ggml splits
``src0``'s rows among its threads the same way when ``src1`` has few rows), each computed by one
part, and the activation quantization by activation rows. A plan's step (:func:`prepare`) is one
compiled task instead: the calling thread quantizes the activations, then every thread of the
CPU backend's pool claims chunks of weight rows from a shared atomic counter until none is left
(ggml's ``ggml_threadpool_chunk_add`` scheme), so a late thread takes a smaller share instead of
holding the others up. Calls are synchronous.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.core import env
from ggmlpy.core.types import Type
from ggmlpy.quants import q8_arch
from ggmlpy.quants.q8 import Q8_0_BYTES, Q8_1_BYTES, Q8_K_BYTES, QK_K
from ggmlpy.quants.vec_dot import VEC_DOT_TYPE, dot_unpacked, unpack_weight

__all__ = ["DOT_TYPES", "GGML_ORDER_ROWS", "CROSSOVER", "IGEMM_ROWS", "igemm_applies", "VEC_DOT_TYPE", "chooses_dot", "ActQ", "jit_available", "run_alone", "run_alone_compiling_worker", "kquant_operands", "shared_scratch", "ScratchLock", "q8k_scratch", "plane_tasks_step",
           "quantize_act", "act_bytes", "mul_mat", "mul_mat_parts", "prepare", "warm_up"]

F32 = np.float32
Step = Callable[[], None]
#: weight types with a dot kernel
DOT_TYPES = frozenset(VEC_DOT_TYPE)
#: weight elements per chunk of the NumPy fallback's int32 temporaries
_NP_CHUNK = 1 << 20

#: activation rows (``src1``'s ``ne[1]``) below which the F16 activation products (the
#: attention's, ``cpu.jit.mul_mat_f16``) run llamafile's tinyBLAS order in the default mode
#: (larger ones, long prompt micro-batches without flash attention, the BLAS GEMM of float32
#: copies: faster, in another order) with ``GGMLPY_QUANT_MATMUL=fast``
GGML_ORDER_ROWS = 256

#: activation rows from which a MUL_MAT with this weight type runs the GEMM path
#: (:mod:`ggmlpy.backends.cpu.qgemm`: dequantized tiles of the weight, the activations in the
#: ``vec_dot_type``, a BLAS GEMM) instead of the dot kernel when ``GGMLPY_QUANT_MATMUL=fast``:
#: about where the GEMM starts to win on a 2-core AVX512 Xeon with the 512-bit legacy tiles
#: (``scripts/bench_qmatmul.py --crossover``, docs/quant_matmul.md). F16/BF16 weights take it
#: from 2 and 4 rows in the default mode too: there the float32 GEMM wins as soon as the batch
#: is more than a matrix-vector product (which reads half the bytes on the dot kernel), and
#: llama.cpp's own F16 order for them is not the dot kernel's either.
CROSSOVER = {Type.Q4_0: 512, Type.Q4_1: 256, Type.Q5_0: 384, Type.Q5_1: 256, Type.Q8_0: 512,
             Type.Q4_K: 512, Type.Q5_K: 128, Type.Q6_K: 1024,  # (Q6_K: none up to 512 rows)
             Type.F16: 2, Type.BF16: 4}
#: weight types whose batches take the GEMM path from :data:`CROSSOVER` rows in the default
#: ``ggml`` mode as well
_GEMM_IN_GGML_MODE = frozenset((Type.F16, Type.BF16))


#: activation rows from which a Q8_0 product runs the integer GEMM in the ``fast`` mode
#: (:mod:`ggmlpy.backends.cpu.igemm_q8_0_ir`, :func:`igemm_applies`); below them its 16-row lane
#: groups would be mostly padding and the 8-lane dot tiles are faster (docs/quant_matmul.md)
IGEMM_ROWS = 16


def igemm_applies(t: Type, n_rows: int) -> bool:
    """Whether a CPU MUL_MAT with a weight of type ``t`` and ``n_rows`` F32 activation rows runs
    the Q8_0 integer GEMM (each output in ggml's scalar ``vec_dot`` order, bit for bit; 1.2-1.7x
    the 8-lane tiles' speed): ``GGMLPY_QUANT_MATMUL=fast``, ``t`` Q8_0, ``n_rows >=
    IGEMM_ROWS``, and Numba compiling for a CPU with AVX512-F, -BW and -VNNI with
    ``GGMLPY_CPU_ZMM`` on (default). Not in the default ``ggml`` mode: its 8-lane tiles give
    llama.cpp's bits on x86, and a model that quantizes each layer's activations again
    amplifies the last-bit differences of another order (all-MiniLM-L6-v2 from a q8_0 GGUF:
    2.1e-3 from llama.cpp's embeddings instead of 2.7e-5).

    Raises:
        EnvError: ``GGMLPY_QUANT_MATMUL`` or ``GGMLPY_CPU_ZMM`` is malformed.
    """
    if t != Type.Q8_0 or n_rows < IGEMM_ROWS or env.quant_matmul() != "fast":
        return False
    if not env.cpu_zmm() or not jit_available():
        return False
    from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM  # noqa: PLC0415 - imports llvmlite

    return bool(ZMM)


def chooses_dot(t: Type, src1_type: Type, n_rows: int) -> bool:
    """Whether a CPU MUL_MAT with a weight of type ``t`` and ``n_rows`` activation rows of type
    ``src1_type`` runs the dot kernels: ``t`` has a kernel, the activations are F32, and
    ``GGMLPY_QUANT_MATMUL`` is ``ggml`` (the default: every batch for the block types, below
    :data:`CROSSOVER` for F16/BF16), ``dot`` (every batch) or ``fast`` with
    ``n_rows < CROSSOVER[t]`` (larger batches: the dequantized GEMM, faster; Q8_0 where
    :func:`igemm_applies`: the integer GEMM at every batch, faster than both). Depends on nothing
    else (not on buffers or caches; on Numba and the CPU only through :func:`igemm_applies`),
    so one graph always takes one numeric path.

    Raises:
        EnvError: ``GGMLPY_QUANT_MATMUL`` is malformed.
    """
    if t not in DOT_TYPES or src1_type != Type.F32:
        return False
    mode = env.quant_matmul()
    if mode == "ggml" and t not in _GEMM_IN_GGML_MODE:
        return True
    if mode == "fast" and igemm_applies(t, n_rows):
        return True  # the integer GEMM outruns the dequantized one at every batch
    return mode == "dot" or (mode in ("ggml", "fast") and n_rows < CROSSOVER[t])


def _jit() -> Any:
    return cpu_jit.kernel_module("qmatmul_kernels")


def jit_available() -> bool:
    """True when the Numba kernels run: Numba imports and ``GGMLPY_JIT`` is not 0.

    Raises:
        EnvError: ``GGMLPY_JIT`` is malformed.
    """
    return env.jit_enabled() and _jit() is not None


@dataclass
class ActQ:
    """Activations in a ``vec_dot_type``, split into arrays (the kernels' form of the blocks).

    Attributes:
        kind: ``"q8_0"``, ``"q8_1"``, ``"q8_K"``, ``"f16"`` or ``"bf16"``.
        q: int8 ``(N, K)`` quants (f16/bf16: float32 ``(N, K)`` of the rounded values).
        d: float32 ``(N, nb)`` block scales (Q8_0/Q8_1: the f16 value as float32).
        x: Q8_1 ``s`` float32 ``(N, nb)``; Q8_K ``bsums`` int32 ``(N, K / 16)``; else a dummy.
    """

    kind: str
    q: np.ndarray
    d: np.ndarray
    x: np.ndarray


_DUMMY = np.zeros((1, 1), F32)


def _f16_value(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v.astype(np.float16).astype(F32)


def _bf16_value(x: np.ndarray) -> np.ndarray:
    from ggmlpy.quants import fp32_to_bf16  # noqa: PLC0415 - the optional gguf extra

    return (fp32_to_bf16(x).view(np.uint16).astype(np.uint32) << 16).view(F32)


def _act_shapes(kind: str, N: int, K: int) -> list[tuple[tuple[int, int], Any]]:
    """``(shape, dtype)`` of an :class:`ActQ`'s ``q``, ``d`` and ``x`` for ``N`` rows of ``K``."""
    if kind in ("f16", "bf16"):
        return [((N, K), F32), ((1, 1), F32), ((1, 1), F32)]
    bs = QK_K if kind == "q8_K" else 32
    x = (((N, K // 16), np.int32) if kind == "q8_K"
         else ((N, K // 32), F32) if kind == "q8_1" else ((1, 1), F32))
    return [((N, K), np.int8), ((N, K // bs), F32), x]


def _alloc_act(kind: str, N: int, K: int) -> ActQ:
    return ActQ(kind, *(np.empty(sh, dt) for sh, dt in _act_shapes(kind, N, K)))


def _quant_rows(act: ActQ, x: np.ndarray, n0: int, n1: int, jit: bool, form: str) -> None:
    """Quantize activation rows ``n0:n1`` of ``x`` into ``act`` (one part of a call; Q8_0/Q8_1
    rounded in ``form``, :mod:`ggmlpy.quants.q8_arch`)."""
    kind = act.kind
    xs = x[n0:n1]
    if kind == "f16":
        act.q[n0:n1] = _f16_value(xs)
        return
    if kind == "bf16":
        act.q[n0:n1] = _bf16_value(xs)
        return
    k = _jit() if jit else None
    if k is not None:
        if kind == "q8_K":
            k.quant_q8_k(xs, act.q[n0:n1], act.d[n0:n1], act.x[n0:n1])
            return
        k.quant_q8(xs, act.q[n0:n1], act.d[n0:n1], act.x[n0:n1] if kind == "q8_1" else _DUMMY,
                   (1 if kind == "q8_1" else 0) + 2 * q8_arch.FORM_CODE[form])
        act.d[n0:n1] = _f16_value(act.d[n0:n1])
        if kind == "q8_1":
            act.x[n0:n1] = _f16_value(act.x[n0:n1])
        return
    _from_bytes(act, q8_arch.quantize_row_q8(kind, xs, form), n0, n1)


def _from_bytes(act: ActQ, b: np.ndarray, n0: int, n1: int) -> None:
    """Rows ``n0:n1`` of ``act`` from their block bytes (``(n1 - n0, row_bytes)`` uint8)."""
    n = n1 - n0
    if act.kind == "q8_K":
        blk = b.reshape(n, -1, Q8_K_BYTES)
        act.d[n0:n1] = np.ascontiguousarray(blk[..., 0:4]).view(F32)[..., 0]
        act.q[n0:n1] = blk[..., 4:260].reshape(n, -1).view(np.int8)
        act.x[n0:n1] = np.ascontiguousarray(blk[..., 260:]).view("<i2").reshape(n, -1)
        return
    size = Q8_1_BYTES if act.kind == "q8_1" else Q8_0_BYTES
    o = size - 32
    blk = b.reshape(n, -1, size)
    act.d[n0:n1] = np.ascontiguousarray(blk[..., 0:2]).view(np.float16)[..., 0]
    if act.kind == "q8_1":
        act.x[n0:n1] = np.ascontiguousarray(blk[..., 2:4]).view(np.float16)[..., 0]
    act.q[n0:n1] = blk[..., o:].reshape(n, -1).view(np.int8)


def _validate_x(x: Any, kind: str, fn: str) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != F32 or x.ndim != 2:
        raise ValueError(f"{fn}: x must be a 2-D float32 ndarray (N, K), got "
                         f"{getattr(x, 'dtype', type(x).__name__)} "
                         f"{getattr(x, 'shape', '')}")
    bs = QK_K if kind == "q8_K" else 32 if kind.startswith("q8") else 1
    if x.shape[1] % bs:
        raise ValueError(f"{fn}: K = {x.shape[1]} is not a multiple of {kind}'s block size {bs}")


def _check_x(x: Any, kind: str, fn: str) -> np.ndarray:
    _validate_x(x, kind, fn)
    return np.ascontiguousarray(x)


def quantize_act(kind: str, x: np.ndarray, n_parts: int = 1,
                 run: Callable[[list[Step]], None] | None = None,
                 form: str | None = None) -> ActQ:
    """Convert activation rows to a ``vec_dot_type`` (ggml: ``from_float`` of ``vec_dot_type``
    applied to every row of ``src1``): Q8_0/Q8_1 with the rounding of ``form``
    (:func:`ggmlpy.quants.q8_arch.quantize_row_q8`, bit for bit), Q8_K with ggml's reference
    quantizer (:mod:`ggmlpy.quants.q8`), F16 round to nearest even, BF16 ``GGML_FP32_TO_BF16``.

    Args:
        kind: ``"q8_0"``, ``"q8_1"``, ``"q8_K"``, ``"f16"`` or ``"bf16"``.
        x: float32 ``(N, K)`` (ggml ``ne = [K, N]``); K a multiple of the block size.
        n_parts: split the rows into this many parts, run by ``run`` (e.g. a CPU backend pool's
            ``run``; None runs them in turn).
        form: one of :data:`ggmlpy.quants.q8_arch.FORMS` (None: ``GGMLPY_Q8_ROUNDING``,
            :func:`ggmlpy.quants.q8_arch.env_form`).

    Returns:
        An :class:`ActQ`. Synchronous.

    Raises:
        ValueError: unknown kind or form, or ``x`` not a 2-D float32 array with whole blocks.
    """
    form = q8_arch.env_form() if form is None else form
    if form not in q8_arch.FORMS:
        raise ValueError(f"quantize_act: form must be one of {q8_arch.FORMS}, got {form!r}")
    if kind not in ("q8_0", "q8_1", "q8_K", "f16", "bf16"):
        raise ValueError(f"quantize_act: kind must be q8_0, q8_1, q8_K, f16 or bf16, got {kind!r}")
    x = _check_x(x, kind, "quantize_act")
    N, K = x.shape
    act = _alloc_act(kind, N, K)
    jit = jit_available()
    parts = [partial(_quant_rows, act, x, lo, hi, jit, form)
             for lo, hi in _bounds(N, n_parts) if hi > lo]
    _run(parts, run)
    return act


def act_bytes(act: ActQ) -> np.ndarray:
    """The activation blocks as ggml lays them out (uint8 ``(N, row_bytes)``; F16/BF16: their
    bits as bytes), for comparison with :mod:`ggmlpy.quants.q8`'s output."""
    N, K = act.q.shape
    if act.kind == "f16":
        return act.q.astype(np.float16).view(np.uint8)
    if act.kind == "bf16":
        return (act.q.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if act.kind == "q8_K":
        nb = K // QK_K
        out = np.empty((N, nb, Q8_K_BYTES), np.uint8)
        out[..., 0:4] = act.d.reshape(N, nb, 1).view(np.uint8)
        out[..., 4:260] = act.q.reshape(N, nb, QK_K).view(np.uint8)
        out[..., 260:] = act.x.astype("<i2").reshape(N, nb, 16).view(np.uint8)
        return out.reshape(N, -1)
    nb = K // 32
    size = Q8_1_BYTES if act.kind == "q8_1" else Q8_0_BYTES
    out = np.empty((N, nb, size), np.uint8)
    out[..., 0:2] = act.d.astype(np.float16).reshape(N, nb, 1).view(np.uint8)
    if act.kind == "q8_1":
        out[..., 2:4] = act.x.astype(np.float16).reshape(N, nb, 1).view(np.uint8)
    out[..., size - 32:] = act.q.reshape(N, nb, 32).view(np.uint8)
    return out.reshape(N, -1)


def _act_dict(act: ActQ) -> dict[str, np.ndarray]:
    """``act`` in :func:`ggmlpy.quants.vec_dot.unpack_act`'s form (for the NumPy fallback)."""
    if act.kind in ("f16", "bf16"):
        return {"v": act.q}
    N, K = act.q.shape
    bs = QK_K if act.kind == "q8_K" else 32
    y = {"q": act.q.astype(np.int32).reshape(N, K // bs, bs), "d": act.d}
    if act.kind == "q8_1":
        y["s"] = act.x
    elif act.kind == "q8_K":
        y["bsums"] = act.x.reshape(N, K // QK_K, 16)
    return y


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    q, r = divmod(n, max(1, parts))
    out, lo = [], 0
    for i in range(max(1, parts)):
        hi = lo + q + (1 if i < r else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _run(parts: list[Step], run: Callable[[list[Step]], None] | None) -> None:
    if run is None or len(parts) < 2:
        for p in parts:
            p()
    else:
        run(parts)


def _w_rows(t: Type, w: Any, K: int) -> np.ndarray:
    """The weight as uint8 rows ``(M, row_bytes)`` (F16/BF16: uint16 ``(M, K)``), no copy."""
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        raise ValueError(f"mul_mat: the weight must be a 2-D ndarray of rows, got "
                         f"{getattr(w, 'shape', type(w).__name__)}")
    if t in (Type.F16, Type.BF16):
        if w.dtype not in (np.float16, np.uint16) and w.dtype.name != "bfloat16" or w.shape[1] != K:
            raise ValueError(f"mul_mat: a {t.type_name} weight must be (M, {K}) of 16-bit "
                             f"values, got {w.dtype} {w.shape}")
        v = w.view(np.uint16)
    else:
        if w.dtype != np.uint8 or w.shape[1] != t.row_size(K):
            raise ValueError(f"mul_mat: a {t.type_name} weight must be uint8 rows of "
                             f"{t.row_size(K)} bytes, got {w.dtype} {w.shape}")
        v = w
    if v.strides[1] != v.itemsize:
        raise ValueError("mul_mat: the weight's rows must be contiguous")
    return v


_LEGACY = {Type.Q4_0: 0, Type.Q4_1: 1, Type.Q5_0: 2, Type.Q5_1: 3, Type.Q8_0: 4}
_KQUANT = {Type.Q4_K: 0, Type.Q5_K: 1, Type.Q6_K: 2}


def _legacy_code(k: Any, t: Type) -> int:
    """The legacy kernels' kind code of ``t`` (``k``: the kernels' module), with its
    ``ZMM_FLAG`` where the CPU runs the 512-bit tiles and ``GGMLPY_CPU_ZMM`` allows them."""
    from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM  # noqa: PLC0415 - imports llvmlite

    return _LEGACY[t] + (k.ZMM_FLAG if ZMM and env.cpu_zmm() else 0)


def _f16_table() -> np.ndarray:
    """float32 value of every f16 bit pattern (256 KiB, made once; ggml's
    ``ggml_table_f32_f16``): the legacy kernels read each block's scale from it."""
    return cpu_jit.f16_table()


def _jit_part(k: Any, t: Type, w: np.ndarray, act: ActQ, out: np.ndarray, m0: int,
              m1: int) -> Step:
    """The compiled kernel call for weight rows ``m0:m1``, its arguments and scratch bound once
    (a step is called per token: per-call Python work is the cost to keep small)."""
    if t in (Type.F16, Type.BF16):
        return partial(k.half_dot, w, act.q, out, m0, m1, 0, t == Type.BF16)
    if t in _KQUANT:
        return partial(k.kquant_lanes, w, act.q, act.d, act.x, out, m0, m1, 0, _KQUANT[t],
                       _f16_table())
    if igemm_applies(t, act.q.shape[0]):
        from ggmlpy.backends.cpu import igemm_q8_0  # noqa: PLC0415 - imports Numba

        return partial(igemm_q8_0.lanes, w, act.q, act.d, out, m0, m1, 0, _f16_table())
    ys = act.x if act.kind == "q8_1" else act.d  # (Q8_0: read by no kernel)
    return partial(k.legacy_lanes, w, act.q, act.d, ys, out, m0, m1, 0, _legacy_code(k, t),
                   _f16_table())


def _rows_numpy(t: Type, w: np.ndarray, act: ActQ, out: np.ndarray, m0: int, m1: int) -> None:
    Y = _act_dict(act)
    N, K = act.q.shape
    if t in (Type.F16, Type.BF16):
        step = max(1, _NP_CHUNK // max(1, N * K))
        for r in range(m0, m1, step):
            blk = w[r:min(r + step, m1)].view(np.uint8)
            Wv = unpack_weight(t, blk)["v"]
            prod = (act.q[:, None, :] * Wv[None, :, :]).astype(F32)
            out[:, r:r + blk.shape[0]] = prod.astype(np.float64).sum(axis=2).astype(F32)
        return
    step = max(1, _NP_CHUNK // max(1, N * K))
    for r in range(m0, m1, step):
        hi = min(r + step, m1)
        out[:, r:hi] = dot_unpacked(t, unpack_weight(t, w[r:hi]), Y)


def mul_mat_parts(t: Type, w: np.ndarray, act: ActQ, out: np.ndarray,
                  n_parts: int = 1) -> list[Step]:
    """The parts of ``out = act @ w^T``: one step per contiguous range of weight rows.

    Args:
        t: the weight type (one of :data:`DOT_TYPES`).
        w: the weight, ``(M, row_bytes)`` uint8 (block types) or ``(M, K)`` of 16-bit values
            (F16/BF16), rows contiguous (ggml ``ne = [K, M]``); read in place.
        act: the activations in ``VEC_DOT_TYPE[t]`` (:func:`quantize_act`), ``N`` rows.
        out: float32 ``(N, M)``, any strides (ggml ``dst``, ``ne = [M, N]``).
        n_parts: how many ranges (at most M).

    Returns:
        Steps that together write every element of ``out`` once; each is synchronous, releases
        the GIL (Numba) and may run on its own thread.

    Raises:
        ValueError: ``t`` has no kernel; the arrays' types or shapes do not match.
    """
    if t not in DOT_TYPES:
        raise ValueError(f"mul_mat: type {t.type_name} has no dot kernel")
    if act.kind != VEC_DOT_TYPE[t]:
        raise ValueError(f"mul_mat: {t.type_name} takes activations in "
                         f"{VEC_DOT_TYPE[t]}, got {act.kind}")
    N, K = act.q.shape
    wv = _w_rows(t, w, K)
    M = wv.shape[0]
    if (not isinstance(out, np.ndarray) or out.dtype != F32 or out.shape != (N, M)
            or not out.flags.writeable):
        raise ValueError(f"mul_mat: out must be a writeable float32 ({N}, {M}) array, got "
                         f"{getattr(out, 'dtype', type(out).__name__)} "
                         f"{getattr(out, 'shape', '')}")
    k = _jit() if jit_available() else None
    parts: list[Step] = []
    for lo, hi in _bounds(M, min(max(1, n_parts), max(1, M))):
        if hi <= lo:
            continue
        if k is not None:
            parts.append(_jit_part(k, t, wv, act, out, lo, hi))
        else:
            parts.append(partial(_rows_numpy, t, wv, act, out, lo, hi))
    return parts


#: a dot task's rows per chunk: about this many chunks per product (at least 8 rows each), so
#: that the threads' shares even out when one of them starts late
_CHUNKS = 64
#: the least weight bytes times activation rows per chunk of a dot task: each chunk costs a claim
#: and a chunk state's cache line moved between the cores, about 0.5 us; matrix-vector products
#: of Gemma 3's layers with weights from memory (2 threads, AMD Zen 5): 640 x 2048 Q5_0 65 ->
#: 45 us, 2048 x 640 Q4_K 54 -> 34 us with 128 KiB chunks instead of 64 chunks of 8-32 rows
CHUNK_WORK = 128 * 1024
#: words of a control block (:mod:`ggmlpy.backends.cpu.spin`) for a task without workers
_CTL_SOLO = 96
#: runs a dot task: ``run_dot(main, worker)`` (:meth:`ggmlpy.backends.cpu.threads.Pool.run_dot`)
RunDot = Callable[[Callable[[np.ndarray, int], int], Callable[[np.ndarray, int], Any]], int]


def run_alone(main: Callable[[np.ndarray, int], int], worker: Any) -> int:
    """*Sync*: a :data:`RunDot` without workers: ``main(ctl, 1)`` on the calling thread with a
    fresh control block of its own (``worker`` is not called), which then computes every chunk.
    Returns ``main``'s result."""
    del worker
    return main(np.zeros(_CTL_SOLO, np.int64), 1)


def run_alone_compiling_worker(main: Callable[[np.ndarray, int], int], worker: Any) -> int:
    """*Sync*: :func:`run_alone`, after compiling (or loading from Numba's disk cache) the task's
    worker part for its arguments (``worker``: a ``functools.partial`` of a Numba dispatcher),
    which a pool's threads would otherwise compile at their first task: for warm-ups."""
    from numba import typeof  # noqa: PLC0415 - only with the compiled kernels

    ctl = np.zeros(_CTL_SOLO, np.int64)
    worker.func.compile(tuple(typeof(a) for a in (*worker.args, ctl, 1)))
    return run_alone(main, worker)


def kquant_operands(where: str, a: np.ndarray, b: np.ndarray, dst: np.ndarray,
                    block_bytes: int) -> tuple[int, int, int, int, int]:
    """Check the operands of a 2-D K-quant weight's MUL_MAT step and return ``(C, nb, B3, B2,
    N)``: ``a`` the weight's rows of bytes, uint8 ``(1, 1, C, nb*block_bytes)`` (ggml ``ne =
    [nb*256, C]``); ``b`` float32 ``(B3, B2, N, nb*256)``; ``dst`` ``(B3, B2, N, C)``.

    Raises:
        ValueError: naming ``where`` and the operand whose shape or dtype does not fit.
    """
    if a.ndim != 4 or a.shape[:2] != (1, 1) or a.dtype != np.uint8 or a.shape[3] % block_bytes:
        raise ValueError(f"{where}: the weight must be (1, 1, C, nb*{block_bytes}) uint8, got "
                         f"{a.shape} {a.dtype}")
    C, nb = a.shape[2], a.shape[3] // block_bytes
    if b.ndim != 4 or b.dtype != F32 or b.shape[3] != nb * 256:
        raise ValueError(f"{where}: src1 must be float32 (B3, B2, N, {nb * 256}), got "
                         f"{b.shape} {b.dtype}")
    B3, B2, N = b.shape[:3]
    if dst.shape != (B3, B2, N, C):
        raise ValueError(f"{where}: dst {dst.shape} must be {(B3, B2, N, C)}")
    return C, nb, B3, B2, N


class ScratchLock:
    """The lock of a set of shared activation buffers (:func:`shared_scratch`), a context
    manager as ``threading.Lock``; it holds the buffers, so that a step keeping it keeps them."""

    __slots__ = ("_lock", "arrays", "__weakref__")

    def __init__(self, arrays: tuple[np.ndarray, ...]) -> None:
        self._lock = threading.Lock()
        self.arrays = arrays

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)


#: the live buffer sets by key, held weakly: a set is freed with the last step (plan) using it
_SCRATCH: weakref.WeakValueDictionary[tuple[Any, ...], ScratchLock] = weakref.WeakValueDictionary()
_SCRATCH_LOCK = threading.Lock()


def shared_scratch(key: tuple[Any, ...],
                   shapes: Sequence[tuple[tuple[int, ...], Any]]) -> tuple[ScratchLock,
                                                                         tuple[np.ndarray, ...]]:
    """Activation buffers shared by every prepared step that asks with the same ``key`` (which
    must determine ``shapes``: ``(shape, dtype)`` per array, elements), and the lock a step
    holds while it uses them: a model's layers, whose steps run one at a time, then keep one
    set of quantized-activation buffers per shape instead of one per layer (memory that stays
    resident once written); two plans running at once on other threads wait for each other
    instead of sharing the data. The set lives as long as a step keeps its lock (the steps of
    :func:`prepare` and the ggml-order variants do): closing a model frees it."""
    with _SCRATCH_LOCK:
        got = _SCRATCH.get(key)
        if got is None:
            got = ScratchLock(tuple(np.empty(sh, dt) for sh, dt in shapes))
            _SCRATCH[key] = got
        return got, got.arrays


def q8k_scratch(plane: int, N: int, K: int, gemm: bool) -> tuple[ScratchLock,
                                                                tuple[np.ndarray, ...]]:
    """The Q8_K activation buffers of the K-quant ggml-order variants (Q4_K's
    ``repack_q4k``, Q6_K's ``vec_dot_q6k``), shared by both (:func:`shared_scratch`; a model's
    Q4_K and Q6_K ``ffn_down`` products of one batch use one set): ``yq`` int8 ``(N, K)``,
    ``yd`` float32 ``(N, K/256)``, ``bsums`` int16 ``(N, K/16)``, the sums of 32 int32 ``(N,
    K/32)`` and the int16 widening for the integer GEMMs ``(N if gemm else 0, K)``."""
    nb = K // QK_K
    return shared_scratch(("q8_K", plane, N, K, bool(gemm)),
                          [((N, K), np.int8), ((N, nb), F32), ((N, nb * 16), np.int16),
                           ((N, nb * 8), np.int32), ((N if gemm else 0, K), np.int16)])


def plane_tasks_step(b: np.ndarray, dst: np.ndarray,
                     make: Callable[[np.ndarray, np.ndarray, int],
                                    tuple[Step, Any, Any, threading.Lock]],
                     run_dot: RunDot | None) -> Step:
    """A step running one dot task per plane ``(i3, i2)`` of ``b`` float32 ``(B3, B2, N, K)``
    into ``dst`` float32 ``(B3, B2, N, C)``. ``make(x, out, i)`` gives, for plane ``i`` (in
    ``(i3, i2)`` order), ``x`` ``(N, K)`` as it lies and ``out`` ``(N, C)`` (the ``dst`` plane itself when it is C-contiguous,
    else a buffer copied out after the task): ``prep`` (quantizes ``x`` into the task's
    activation buffers), the task's ``(main, worker)``, which ``run_dot`` (None:
    :func:`run_alone`) runs, and the lock of those buffers (:func:`shared_scratch`). A run holds
    every plane's lock, quantizes every plane, then runs the tasks: a task's workers, woken when
    it starts, find its chunks published at once. Synchronous when run."""
    go = run_dot or run_alone
    N, C = dst.shape[2], dst.shape[3]
    out = np.empty((N, C), F32)
    jobs = []
    for i3 in range(b.shape[0]):
        for i2 in range(b.shape[1]):
            d = dst[i3, i2]
            o = d if d.flags.c_contiguous else out
            jobs.append((d, o, *make(b[i3, i2], o, len(jobs))))
    locks = list(dict.fromkeys(job[-1] for job in jobs))

    def run() -> None:
        with ExitStack() as held:
            for lk in locks:
                held.enter_context(lk)
            for job in jobs:
                job[2]()
            for d, o, _, main, worker, _ in jobs:
                go(main, worker)
                if o is not d:
                    np.copyto(d, o)
    return run


def _desc(k: Any, family: int, kind: int, w: np.ndarray, act: ActQ, yx: np.ndarray,
          out: np.ndarray, chunk: int) -> np.ndarray:
    """A dot task's descriptor (:func:`ggmlpy.backends.cpu.qmatmul_tasks.serve`: the arrays'
    addresses and shapes, for a worker that runs the task without Python; ``k`` that module);
    family -1 (the worker calls the task's Python callable) unless every array is
    C-contiguous."""
    d = np.full(16, -1, np.int64)
    arrays = (w, act.q, act.d, yx, out, _f16_table())
    if not all(a.flags.c_contiguous for a in arrays):
        return d
    N, K = act.q.shape
    for i, v in ((k.D_FAMILY, family), (k.D_W, w.ctypes.data), (k.D_M, w.shape[0]),
                 (k.D_ROW, w.shape[1]), (k.D_YQ, act.q.ctypes.data), (k.D_N, N), (k.D_K, K),
                 (k.D_YD, act.d.ctypes.data), (k.D_NB, act.d.shape[1]),
                 (k.D_YX, yx.ctypes.data), (k.D_NX, yx.shape[1]), (k.D_OUT, out.ctypes.data),
                 (k.D_TBL, _f16_table().ctypes.data), (k.D_CHUNK, chunk), (k.D_KIND, kind)):
        d[i] = v
    return d


def prepare(t: Type, w: np.ndarray, x: np.ndarray, out: np.ndarray,
            run_dot: RunDot | None = None, repack_order: bool = False) -> Step:
    """A step computing ``out = x @ W^T`` (as :func:`mul_mat`) whose checks, buffers and kernel
    arguments are set up now, for a plan that calls it once per evaluation: each call quantizes
    the current contents of ``x`` into buffers owned by the step, then runs the kernel.

    With the Numba kernels the whole call is one compiled task (quantization with the scales'
    f16 rounding, then the weight rows in chunks, :mod:`ggmlpy.backends.cpu.qmatmul_tasks`)
    that ``run_dot`` shares among threads (a CPU backend's
    :meth:`~ggmlpy.backends.cpu.threads.Pool.run_dot`; None: the calling thread alone). Every
    output is computed by one thread in one fixed order, so the result does not depend on the
    threads.

    Args:
        t: weight type (:data:`DOT_TYPES`). w: the weight rows (see :func:`mul_mat_parts`).
        x: float32 ``(N, K)``, any strides.
        out: float32 ``(N, M)``, any strides.
        run_dot: see above.
        repack_order: Q4_K only, with Numba: every output in llama.cpp's repacked gemv order
            (:func:`ggmlpy.backends.cpu.qmatmul_ir.row_q4_K_gemv`, the bits of
            :mod:`ggmlpy.backends.cpu.repack_q4k` for activation rows outside its groups of
            four) instead of ggml's ``vec_dot`` order.

    Returns:
        A synchronous zero-argument step (not reentrant: one caller at a time).

    Raises:
        ValueError: as :func:`quantize_act` and :func:`mul_mat_parts`.
    """
    if t not in DOT_TYPES:
        raise ValueError(f"mul_mat: type {t.type_name} has no dot kernel")
    kind = VEC_DOT_TYPE[t]
    _validate_x(x, kind, "prepare")
    N, K = x.shape
    # the activation buffers of every step of this kind and shape (one set per shape, not per
    # layer), held while a step runs
    jit = jit_available()
    use_igemm = jit and igemm_applies(t, N)
    shapes, key = _act_shapes(kind, N, K), ("act", kind, N, K)
    if use_igemm:  # + the integer GEMM's interleaved activations (igemm_q8_0)
        G = -(-N // 16)
        shapes, key = shapes + [((G, K * 16), np.uint8), ((G, K // 2), F32)], key + ("igemm",)
    lock, arrs = shared_scratch(key, shapes)
    act = ActQ(kind, *arrs[:3])
    (part,) = mul_mat_parts(t, w, act, out, 1)
    k = _jit() if jit else None
    wv = _w_rows(t, w, K)
    form = q8_arch.env_form()
    if k is not None:
        from ggmlpy.backends.cpu import qmatmul_tasks as tk  # noqa: PLC0415 - imports Numba

        go = run_dot or run_alone
        M = wv.shape[0]
        # whole 8-row tiles per chunk (the legacy kernels' 512-bit tiles; a chunk of 12 rows
        # ran a third of them on the 4-row tiles), about _CHUNKS chunks
        chunk = 8 * max(1, -(-M // (8 * _CHUNKS)))
        # and at least CHUNK_WORK weight bytes times activation rows (whole 8-row tiles)
        rows = -(-CHUNK_WORK // (wv.shape[1] * wv.itemsize * N))
        chunk = max(chunk, 8 * -(-rows // 8))
        if t in (Type.F16, Type.BF16):
            bf = t == Type.BF16
            desc = _desc(tk, 2, int(bf), wv, act, act.q, out, chunk)
            quant = partial(tk.half_quant, x, act.q, bf)
            main = partial(tk.half_main, desc, wv, act.q, out, bf, chunk)
            worker = partial(tk.half_chunks, wv, act.q, out, bf, chunk)
        elif t in _KQUANT:
            kk = 3 if repack_order and t == Type.Q4_K else _KQUANT[t]
            args = (wv, act.q, act.d, act.x, out, kk, _f16_table(), chunk)
            desc = _desc(tk, 1, kk, wv, act, act.x, out, chunk)
            k8 = k.quant_q8_k

            def quant() -> bool:
                k8(x, act.q, act.d, act.x)
                return True
            main = partial(tk.kquant_main, desc, *args)
            worker = partial(tk.kquant_chunks, *args)
        elif use_igemm:
            arep, drep = arrs[3:]
            tbl = _f16_table()
            desc = _desc(tk, 3, 0, wv, act, act.d, out, chunk)
            if desc[tk.D_FAMILY] == 3:
                desc[tk.D_YQ], desc[tk.D_YD] = arep.ctypes.data, drep.ctypes.data
                desc[tk.D_NX] = G
            qkind = 2 * q8_arch.FORM_CODE[form]
            quant = partial(tk.quant_q8_0_igemm, x, act.q, act.d, act.d, qkind, arep, drep)
            main = partial(tk.igemm_main, desc, wv, arep, drep, out, tbl, chunk)
            worker = partial(tk.igemm_chunks, wv, arep, drep, out, tbl, chunk)
        else:
            ys = act.x if kind == "q8_1" else act.d  # (Q8_0: read by no kernel)
            code = _legacy_code(k, t)
            args = (wv, act.q, act.d, ys, out, code, _f16_table(), chunk)
            desc = _desc(tk, 0, code, wv, act, ys, out, chunk)
            qkind = (1 if kind == "q8_1" else 0) + 2 * q8_arch.FORM_CODE[form]
            quant = partial(tk.quant_q8_f16, x, act.q, act.d, ys, qkind)
            main = partial(tk.legacy_main, desc, *args)
            worker = partial(tk.legacy_chunks, *args)

        def run() -> None:
            # the activations first, then the task (module docstring of qmatmul_tasks)
            with lock:
                if quant():
                    go(main, worker)
                    return
            _exact(t, wv, x, out)
        return run

    def run_other() -> None:
        with lock:
            _quant_rows(act, np.ascontiguousarray(x), 0, N, jit, form)
            if not _overflowed(act):
                part()
                return
        _exact(t, wv, x, out)
    return run_other


def _overflowed(act: ActQ) -> bool:
    """Whether the activations did not fit the vec_dot type: a Q8_0/Q8_1 block scale (or Q8_1
    sum) beyond float16's range (finite activations above ~8.3e6), or a finite activation beyond
    float16's range for an F16 weight. ggml-cpu then returns inf/NaN; ggmlpy computes that
    product exactly instead (:func:`_exact`). Q8_K's float32 scale and BF16 cannot overflow
    for finite float32 activations."""
    if act.kind in ("q8_0", "q8_1"):
        return bool(np.isinf(act.d).any() or (act.kind == "q8_1" and np.isinf(act.x).any()))
    if act.kind == "f16":
        return bool(np.isinf(act.q).any())
    return False


def _exact(t: Type, wv: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """``out = x @ dequantize(W)^T`` in float32: the exact product, for activations the vec_dot
    type cannot hold (:func:`_overflowed`). Dequantizes the whole weight (rare: only for such
    activations)."""
    from ggmlpy.quants import dequantize  # noqa: PLC0415

    w = dequantize(np.ascontiguousarray(wv), t, (x.shape[1], wv.shape[0]))
    out[...] = np.asarray(x, dtype=F32) @ w.T


def mul_mat(t: Type, w: np.ndarray, x: np.ndarray, out: np.ndarray | None = None,
            n_threads: int = 1, run: Callable[[list[Step]], None] | None = None) -> np.ndarray:
    """*Sync*: ``out = x @ W^T`` the way ggml's CPU MUL_MAT computes it for a weight of type
    ``t`` (``x`` converted to ``VEC_DOT_TYPE[t]``, then one ``vec_dot`` per output).

    Args:
        t: weight type (:data:`DOT_TYPES`).
        w: weight rows, read in place (see :func:`mul_mat_parts`).
        x: float32 ``(N, K)`` activations (ggml ``src1``, ``ne = [K, N]``).
        out: float32 ``(N, M)`` to write, or None for a new array.
        n_threads: parts to split the work into; ``run(parts)`` runs them (e.g.
            :meth:`ggmlpy.backends.cpu_threads.Pool.run`); None runs them in turn.

    Returns:
        ``out``.

    Raises:
        ValueError: as :func:`quantize_act` and :func:`mul_mat_parts`.
    """
    if t not in DOT_TYPES:
        raise ValueError(f"mul_mat: type {t.type_name} has no dot kernel")
    act = quantize_act(VEC_DOT_TYPE[t], x, n_threads, run)
    if out is None:
        out = np.empty((act.q.shape[0], w.shape[0]), F32)
    if _overflowed(act):
        _exact(t, _w_rows(t, w, x.shape[1]), x, out)
        return out
    _run(mul_mat_parts(t, w, act, out, n_threads), run)
    return out


def warm_up() -> bool:
    """*Sync*: compile (or load from Numba's cache) every kernel and dot task; returns
    :func:`jit_available`."""
    if not jit_available():
        return False
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 256)).astype(F32)
    from ggmlpy.quants import quantize  # noqa: PLC0415

    for t in DOT_TYPES:
        wq = quantize(x, t)
        if t in (Type.F16, Type.BF16):
            wq = wq.view(np.uint16)
        out = mul_mat(t, wq, x)
        prepare(t, wq, x, out)()
    return True
