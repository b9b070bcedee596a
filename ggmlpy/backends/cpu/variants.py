"""The CPU's kernel variants, stacked in front of the generic kernels of
:data:`ggmlpy.backends.kernels.registry.REGISTRY` (:func:`register`, run by
:func:`ggmlpy.backends.install`), so that the kernel registry alone decides what computes a node.

Each variant narrows its op's generic entry (``narrows=True``: support stays the generic
entry's answer) with a predicate on the node and the settings, and, where the arrays matter, a
``fits(dst, srcs)`` on the arrays being compiled (a threaded CPU plan compiles row slices). They
are tried in this order, the first that applies wins, else the generic kernel runs:

==========================  ==========  ===================================================
name                        op          applies when
==========================  ==========  ===================================================
``cpu.jit.gelu_erf``        UNARY       GELU_ERF, F32, NumPy, Numba (``GGMLPY_JIT`` not 0),
                                        not ``GGMLPY_PRECISE_KERNELS``, C-contiguous arrays
``fast.gelu_erf_f32``       UNARY       the same without Numba: the float32 formula
``cpu.gelu_f16_table``      UNARY       GELU, F32, NumPy, not ``GGMLPY_PRECISE_KERNELS``, a
                                        C-contiguous destination: ggml-cpu's f16 table (one
                                        compiled pass with Numba and C-contiguous arrays)
``cpu.geglu_f16_table``     GLU         GEGLU, F32 sources and destination, NumPy, not precise,
                                        a C-contiguous destination: the same table, times the gate
``fast.gelu_tanh_f32``      UNARY       GELU, F32, NumPy, C-contiguous arrays
``fast.rms_norm``           RMS_NORM    F32, NumPy, not precise: ggml-cpu's roundings (float32
                                        squares summed in float64, ``mean`` float32, ``scale =
                                        1.0f/sqrtf(mean + eps)``, ``x*scale`` float32)
``cpu.jit.rope``            ROPE        NORMAL/NEOX without YaRN, F32, NumPy, Numba, not precise,
                                        C-contiguous arrays: ggml-cpu's float32 theta steps,
                                        ``cosf``/``sinf`` and contracted rotation
                                        (:mod:`ggmlpy.backends.cpu.rope_ggml`)
``cpu.jit.binary``          ADD..DIV    NumPy, Numba, C-contiguous float32 arrays of at least
                                        :data:`JIT_MIN_ELEMENTS`, ``b`` the same shape or one
                                        row
``cpu.jit.norm``            NORM        NumPy, Numba, not precise, C-contiguous float32
``fast.norm``               NORM        not precise (any array module): float32 sums
``cpu.jit.mul_mat_f16``     MUL_MAT     F16 ``src0`` (not in a WEIGHTS buffer) and ``src1``,
                                        F32 result, NumPy, Numba, not precise; with
                                        ``GGMLPY_QUANT_MATMUL=fast`` only a ``src1`` of
                                        fewer rows than :data:`qmatmul.GGML_ORDER_ROWS
                                        <ggmlpy.backends.cpu.qmatmul.GGML_ORDER_ROWS>` or at
                                        most :data:`sgemm_f16.MAX_MACS
                                        <ggmlpy.backends.cpu.sgemm_f16.MAX_MACS>`
                                        multiply-adds: ggml-cpu's x86 AVX-512 orders (llamafile
                                        tinyBLAS for two rows or more, else ``ggml_vec_dot_f16``;
                                        :mod:`ggmlpy.backends.cpu.sgemm_f16`)
``cpu.jit.mul_mat_f32``     MUL_MAT     F32 ``src0`` with batch dims (``ne[2] * ne[3] > 1``:
                                        the attention's per-head products, a pooling of
                                        several sequences; 2-D ones, as weights, stay on
                                        BLAS) and F32 ``src1``, F32 result, NumPy, Numba, not precise, at
                                        most :data:`sgemm_f32.MAX_MACS
                                        <ggmlpy.backends.cpu.sgemm_f32.MAX_MACS>` multiply-adds
                                        (any with ``GGMLPY_QUANT_MATMUL=dot``): ggml-cpu's x86
                                        AVX-512 orders (llamafile tinyBLAS for a contiguous
                                        ``src1`` of two rows or more, else
                                        ``ggml_vec_dot_f32``; :mod:`ggmlpy.backends.cpu.sgemm_f32`)
``cpu.jit.mul_mat_q4k``     MUL_MAT     a 2-D Q4_K weight of ``8k`` rows, F32 ``src1``, NumPy,
                                        Numba, not precise, ``GGMLPY_QUANT_MATMUL`` not
                                        ``dequant``, on the dot kernels' batches (every
                                        batch but with ``fast``, below the crossover there):
                                        llama.cpp's repacked Q4_K order
                                        (:mod:`ggmlpy.backends.cpu.repack_q4k`)
``cpu.jit.mul_mat_q6k``     MUL_MAT     a 2-D Q6_K weight, F32 ``src1`` of 8 rows or more, the
                                        rest as above: ggml-cpu's tiled kernel
                                        (:mod:`ggmlpy.backends.cpu.vec_dot_q6k`; fewer rows take
                                        the dot kernels, which give the AVX2
                                        ``ggml_vec_dot_q6_K_q8_K`` bits)
``cpu.jit.soft_max_ggml``   SOFT_MAX    no ALiBi or sinks, F32 (mask F32, F16 or none), NumPy, Numba,
                                        not precise, C-contiguous arrays: ggml-cpu's AVX-512
                                        ``ggml_v_expf`` and sums
                                        (:mod:`ggmlpy.backends.cpu.soft_max_ggml`)
``cpu.jit.soft_max``        SOFT_MAX    no ALiBi, NumPy, Numba, C-contiguous float32 arrays
``cpu.jit.soft_max_f16``    SOFT_MAX    the same with an F16 mask (converted to float32)
``fast.soft_max``           SOFT_MAX    no ALiBi (any array module)
==========================  ==========  ===================================================

With ``GGMLPY_PRECISE_KERNELS=1`` the GELU table, GELU_ERF, ROPE, RMS_NORM, NORM, F16, F32 and Q4_K
MUL_MAT and ggml-order SOFT_MAX variants
step aside and the generic kernels (float64 sums, the test referee) run. The fused CUDA kernels are stacked before these
and apply to CuPy only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backends.cpu import (
    fastpath,
    qmatmul,
    repack_q4k,
    rope_ggml,
    sgemm_f16,
    sgemm_f32,
    soft_max_ggml,
    vec_dot_q6k,
)
from ggmlpy.backends.cpu import jit as cpu_jit  # imports Numba only when a kernel first needs it
from ggmlpy.backends.kernels import matmul
from ggmlpy.backends.kernels.attention import tile_23
from ggmlpy.backends.kernels.common import F32, c_contig
from ggmlpy.backends.kernels.registry import KernelRegistry, Step
from ggmlpy.backends.kernels.unary import gelu_f16_table, gelu_f16_table_into, gelu_tanh_f32_into
from ggmlpy.core import env, special
from ggmlpy.core.opcodes import GluOp, Op, UnaryOp
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

__all__ = ["register", "jit_ready", "jit_arrays", "plan_build_scope", "JIT_MIN_ELEMENTS"]

_F32_DTYPE = np.dtype(np.float32)
#: smallest tensor (elements) worth a compiled kernel for ops NumPy does in one ufunc call
JIT_MIN_ELEMENTS = 4096

_build_tls = threading.local()


@contextmanager
def plan_build_scope() -> Iterator[None]:
    """For the ``with`` body on this thread (one plan build): :func:`jit_ready` reads
    :func:`ggmlpy.backends.cpu.jit.available` (an environment read) once instead of per kernel,
    so every kernel of one plan makes the same choice. Nested scopes share the outer answer."""
    if getattr(_build_tls, "jit", None) is not None:
        yield
        return
    _build_tls.jit = []
    try:
        yield
    finally:
        _build_tls.jit = None


def jit_ready() -> bool:
    """Whether the compiled kernels are used (:func:`ggmlpy.backends.cpu.jit.available`), read
    once per plan build inside :func:`plan_build_scope`.

    Raises:
        EnvError: ``GGMLPY_JIT`` is malformed.
    """
    memo = getattr(_build_tls, "jit", None)
    if memo is None:
        return cpu_jit.available()
    if not memo:
        memo.append(cpu_jit.available())
    return memo[0]


def jit_arrays(*arrays: Any, min_elements: int = 0) -> bool:
    """True when every array is a C-contiguous float32 NumPy ndarray and the first holds at
    least ``min_elements`` elements: what the compiled kernels take."""
    if not arrays or arrays[0].size < min_elements:
        return False
    for a in arrays:
        if type(a) is not np.ndarray or a.dtype != _F32_DTYPE or not a.flags.c_contiguous:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# predicates (node and settings) and fits (arrays); the compiled variants ask jit_ready() last,
# in their fits, so Numba is imported only once an array a compiled kernel takes is compiled


def _unary_f32(node: Tensor, xp: Any, op: UnaryOp) -> bool:
    a = node.src[0]
    return (xp is np and node.op_params[0] == op and node.type == Type.F32
            and a is not None and a.type == Type.F32)


def _sup_gelu_erf_jit(node: Tensor, xp: Any) -> bool:
    return _unary_f32(node, xp, UnaryOp.GELU_ERF) and not env.precise_kernels()


def _sup_gelu_erf_f32(node: Tensor, xp: Any) -> bool:
    return _unary_f32(node, xp, UnaryOp.GELU_ERF) and not env.precise_kernels()


def _sup_gelu_table(node: Tensor, xp: Any) -> bool:
    return _unary_f32(node, xp, UnaryOp.GELU) and not env.precise_kernels()


def _sup_geglu_table(node: Tensor, xp: Any) -> bool:
    a, b = node.src[0], node.src[1] if len(node.src) > 1 else None
    return (xp is np and node.op_params[0] == GluOp.GEGLU and node.type == Type.F32
            and a is not None and a.type == Type.F32 and (b is None or b.type == Type.F32)
            and not env.precise_kernels())


def _fits_dst_contig(dst: Any, srcs: list[Any]) -> bool:
    return c_contig(dst)


def _sup_rms_norm(node: Tensor, xp: Any) -> bool:
    a = node.src[0]
    return (xp is np and node.type == Type.F32 and a is not None and a.type == Type.F32
            and not env.precise_kernels())


def _sup_rope_ggml(node: Tensor, xp: Any) -> bool:
    a, pos = node.src[0], node.src[1] if len(node.src) > 1 else None
    ff = node.src[2] if len(node.src) > 2 else None
    p = list(node.op_params) + [0] * (16 - len(node.op_params))
    return (xp is np and node.type == Type.F32 and a is not None and a.type == Type.F32
            and pos is not None and int(p[1]) > 0 and int(p[2]) in (0, 2)
            and float(p[7]) == 0.0
            and int(p[15]) == 0 and (ff is None or ff.type == Type.F32)
            and not env.precise_kernels())


def _fits_jit_rope(dst: Any, srcs: list[Any]) -> bool:
    return c_contig(srcs[0]) and c_contig(dst) and jit_arrays(srcs[0], dst) and jit_ready()


def _sup_gelu_tanh_f32(node: Tensor, xp: Any) -> bool:
    return _unary_f32(node, xp, UnaryOp.GELU)


def _fits_contig(dst: Any, srcs: list[Any]) -> bool:
    return c_contig(srcs[0]) and c_contig(dst)


def _fits_jit_unary(dst: Any, srcs: list[Any]) -> bool:
    return c_contig(srcs[0]) and c_contig(dst) and jit_arrays(srcs[0], dst) and jit_ready()


def _sup_jit(node: Tensor, xp: Any) -> bool:
    return xp is np


def _sup_jit_not_precise(node: Tensor, xp: Any) -> bool:
    return xp is np and not env.precise_kernels()


def _sup_not_precise(node: Tensor, xp: Any) -> bool:
    return not env.precise_kernels()


def _jit_rows(a: Any, b: Any, dst: Any) -> tuple[Any, Any, Any] | None:
    """``(a, b, dst)`` as ``(R, n)``, ``(1 or R, n)``, ``(R, n)`` arrays for
    :func:`ggmlpy.backends.cpu.jit.binary` (C-contiguous float32, ``b`` the same shape or one
    row broadcast over all rows, at least :data:`JIT_MIN_ELEMENTS`), or None."""
    if not jit_arrays(a, b, dst, min_elements=JIT_MIN_ELEMENTS) or a.shape != dst.shape:
        return None
    n = a.shape[-1]
    if b.shape == a.shape:
        return a.reshape(-1, n), b.reshape(-1, n), dst.reshape(-1, n)
    if b.shape[-1] == n and b.size == n:
        return a.reshape(-1, n), b.reshape(1, n), dst.reshape(-1, n)
    return None


def _fits_jit_binary(dst: Any, srcs: list[Any]) -> bool:
    return _jit_rows(srcs[0], srcs[1], dst) is not None and jit_ready()


def _fits_jit_norm(dst: Any, srcs: list[Any]) -> bool:
    return jit_arrays(srcs[0], dst) and jit_ready()


def _no_alibi(node: Tensor) -> bool:
    p = node.op_params
    return (float(p[1]) if len(p) > 1 else 0.0) == 0.0


def _sup_soft_max_jit(node: Tensor, xp: Any) -> bool:
    return xp is np and _no_alibi(node)


def _sup_soft_max_fast(node: Tensor, xp: Any) -> bool:
    return _no_alibi(node)


def _sup_mul_mat_f16(node: Tensor, xp: Any) -> bool:
    a, b = node.src[0], node.src[1] if len(node.src) > 1 else None
    if (xp is not np or node.type != Type.F32 or a is None or b is None
            or a.type != Type.F16 or b.type != Type.F16 or env.precise_kernels()):
        return False
    base = a.view_src if a.view_src is not None else a
    if base.buffer is not None and base.buffer.usage == BufferUsage.WEIGHTS:
        return False      # a weight: the weight cache's float32 copy and BLAS (faster)
    # ggml's order at every size as the quantized weights' products (GGMLPY_QUANT_MATMUL=ggml,
    # the default, and dot); with fast below the rows of qmatmul.GGML_ORDER_ROWS (and small
    # products) only
    return (a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0
            and (b.ne[1] < qmatmul.GGML_ORDER_ROWS
                 or node.ne[0] * node.ne[1] * node.ne[2] * node.ne[3] * a.ne[0]
                 <= sgemm_f16.MAX_MACS or env.quant_matmul() != "fast"))


def _sup_mul_mat_f32(node: Tensor, xp: Any) -> bool:
    a, b = node.src[0], node.src[1] if len(node.src) > 1 else None
    if (xp is not np or node.type != Type.F32 or a is None or b is None
            or a.type != Type.F32 or b.type != Type.F32 or env.precise_kernels()):
        return False
    if a.ne[2] * a.ne[3] == 1:
        # a 2-D src0, as every weight: BLAS (faster). A rule of the shapes alone, so that
        # neither a tensor's placement nor a remote device's view of the graph changes it
        return False
    return (a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0
            and a.nb[0] == 4 and b.nb[0] == 4
            and (node.ne[0] * node.ne[1] * node.ne[2] * node.ne[3] * a.ne[0]
                 <= sgemm_f32.MAX_MACS or env.quant_matmul() == "dot"))


def _fits_mul_mat_4d(dst: Any, srcs: list[Any]) -> bool:
    return (type(dst) is np.ndarray and dst.dtype == _F32_DTYPE and dst.ndim == 4
            and all(type(s) is np.ndarray and s.ndim == 4 for s in srcs[:2]) and jit_ready())


def _sup_kquant_2d(node: Tensor, xp: Any, t: Type) -> bool:
    # a 2-D weight of type t with contiguous rows, F32 activations, on the dot kernels' batches
    # (below the crossover, every batch with GGMLPY_QUANT_MATMUL=dot), which a threaded plan
    # cuts along the weight rows: the activation rows stay whole (Q4_K's grouping by four)
    a, b = node.src[0], node.src[1] if len(node.src) > 1 else None
    if (xp is not np or node.type != Type.F32 or a is None or b is None
            or a.type != t or b.type != Type.F32 or env.precise_kernels()
            or env.quant_matmul() == "dequant"):
        return False
    return (a.ne[2] == 1 and a.ne[3] == 1 and a.ne[0] == b.ne[0] and b.ne[0] % 256 == 0
            and b.ne[3] == 1 and a.nb[0] == a.type.type_size
            and matmul.uses_dot_kernel(node))


def _sup_mul_mat_q4k(node: Tensor, xp: Any) -> bool:
    return _sup_kquant_2d(node, xp, Type.Q4_K) and node.src[0].ne[1] % 8 == 0


def _sup_mul_mat_q6k(node: Tensor, xp: Any) -> bool:
    # below the tiled kernel's rows ggml-cpu runs the AVX2 vec_dot, whose bits the dot kernels
    # (ggmlpy.backends.cpu.qmatmul_kernels) give already, faster: the variant steps aside there
    return (_sup_kquant_2d(node, xp, Type.Q6_K)
            and vec_dot_q6k.uses_tiled(node.src[1].ne[1]))


def _fits_mul_mat_q4k(dst: Any, srcs: list[Any]) -> bool:
    a, b = srcs[0], srcs[1]
    return (type(a) is np.ndarray and a.dtype == np.uint8 and a.ndim == 4
            and a.shape[:2] == (1, 1) and a[0, 0].flags.c_contiguous
            and type(b) is np.ndarray and b.dtype == _F32_DTYPE and type(dst) is np.ndarray
            and jit_ready())


def _sup_soft_max_ggml(node: Tensor, xp: Any) -> bool:
    a = node.src[0]
    m = node.src[1] if len(node.src) > 1 else None
    sinks = node.src[2] if len(node.src) > 2 else None
    return (xp is np and _no_alibi(node) and sinks is None and node.type == Type.F32
            and a is not None and a.type == Type.F32
            and (m is None or m.type in (Type.F32, Type.F16)) and not env.precise_kernels())


def _fits_soft_max_ggml(dst: Any, srcs: list[Any]) -> bool:
    mask = _mask(srcs)
    return (jit_arrays(srcs[0], dst) and (mask is None or (type(mask) is np.ndarray
                                                           and mask.flags.c_contiguous))
            and jit_ready())


def _mask(srcs: list[Any]) -> Any:
    return srcs[1] if len(srcs) > 1 else None


def _fits_jit_soft_max(dst: Any, srcs: list[Any]) -> bool:
    mask = _mask(srcs)
    return jit_arrays(srcs[0], dst, *(() if mask is None else (mask,))) and jit_ready()


def _fits_jit_soft_max_f16(dst: Any, srcs: list[Any]) -> bool:
    mask = _mask(srcs)
    return mask is not None and mask.dtype != F32 and jit_arrays(srcs[0], dst) and jit_ready()


# ---------------------------------------------------------------------------------------------
# factories


def _scale(node: Tensor) -> float:
    p = node.op_params
    return float(p[0]) if len(p) > 0 else 1.0


def _k_gelu_erf_jit(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    return partial(cpu_jit.gelu_erf, srcs[0], dst)


def _k_gelu_erf_f32(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    return partial(special.gelu_erf_f32, srcs[0], dst)


def _table_step(x: Any, dst: Any, g: Any = None) -> Step:
    """The table GELU/GEGLU step: one compiled pass when Numba is used and the arrays are
    C-contiguous float32 (:func:`ggmlpy.backends.cpu.jit.gelu_table`), else the NumPy form
    (same bits)."""
    if jit_ready() and jit_arrays(x, dst, *(() if g is None else (g,))):
        return partial(cpu_jit.gelu_table, x, dst, gelu_f16_table(), g)
    return partial(gelu_f16_table_into, x, dst, g)


def _k_gelu_table(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    return _table_step(srcs[0], dst)


def _k_geglu_table(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]
    if len(srcs) > 1 and srcs[1] is not None:
        x, g = a, srcs[1]                          # split form: ggml ignores `swapped`
    else:
        n = dst.shape[-1]
        swapped = bool(node.op_params[1]) if len(node.op_params) > 1 else False
        x, g = (a[..., n:2 * n], a[..., :n]) if swapped else (a[..., :n], a[..., n:2 * n])
    return _table_step(x, dst, g)


def _k_rms_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # ggml-cpu ops.cpp ggml_compute_forward_rms_norm_f32: sum += (double)(x*x); mean = (float)
    # (sum/n); scale = 1.0f/sqrtf(mean + eps); y = x*scale (all float32 but the sum)
    a = srcs[0]
    eps = F32(node.op_params[0])
    n = a.shape[-1]
    if jit_ready() and jit_arrays(a, dst) and a.shape == dst.shape:
        # one compiled pass, the sum in ggml's element order (NumPy's below sums pairwise:
        # the same float64 sum but for the last bits, which the float32 mean rounds away)
        return cpu_jit.rms_norm_step(a.reshape(-1, n), float(eps), dst.reshape(-1, n))
    multiply, sqrt = np.multiply, np.sqrt
    f64 = np.float64

    def run() -> None:
        ss = multiply(a, a).sum(axis=-1, keepdims=True, dtype=f64)
        mean = (ss / n).astype(F32)
        scale = F32(1.0) / sqrt(mean + eps)
        multiply(a, scale, out=dst)
    return run


def _k_rope_ggml(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = list(node.op_params) + [0] * (16 - len(node.op_params))
    ff = srcs[2] if len(srcs) > 2 else None
    return rope_ggml.rope_step(srcs[0], srcs[1], dst, ff, int(p[1]), int(p[2]), float(p[5]),
                               float(p[6]), float(p[8]))


def _k_gelu_tanh_f32(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    return partial(gelu_tanh_f32_into, srcs[0], dst)


def _k_binary_jit(ufunc_name: str) -> Any:
    def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
        return partial(cpu_jit.binary, ufunc_name, *_jit_rows(srcs[0], srcs[1], dst))
    return make


def _k_norm_jit(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]
    n = a.shape[-1]
    return partial(cpu_jit.norm, a.reshape(-1, n), float(node.op_params[0]), dst.reshape(-1, n))


def _k_norm_fast(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    return partial(fastpath.norm, xp, srcs[0], float(node.op_params[0]), dst)


def _k_mul_mat_f16(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # the node's shape decides the kernel (a threaded slice may hold one row of src1)
    a, b = node.src[0], node.src[1]
    tiny = sgemm_f16.uses_tinyblas(a.ne[1], b.ne[1], a.ne[0])
    return sgemm_f16.mul_mat_f16_step(srcs[0], srcs[1], dst, tiny)


def _k_mul_mat_f32(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # the node's shape and src1's contiguity decide the kernel, as in _k_mul_mat_f16
    a, b = node.src[0], node.src[1]
    tiny = sgemm_f32.uses_tinyblas(a.ne[1], b.ne[1], a.ne[0], b.is_contiguous())
    return sgemm_f32.mul_mat_f32_step(srcs[0], srcs[1], dst, tiny)


def _k_mul_mat_q4k(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # the node's rows of src1 decide the grouping by four (the plan cuts only weight rows)
    return repack_q4k.mul_mat_q4k_step(srcs[0], srcs[1], dst, node.src[1].ne[1],
                                       matmul.dot_runner())


def _k_mul_mat_q6k(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # the node's rows decide the order (a threaded plan cuts only the weight rows)
    return vec_dot_q6k.mul_mat_q6k_step(srcs[0], srcs[1], dst,
                                        vec_dot_q6k.uses_tiled(node.src[1].ne[1]),
                                        matmul.dot_runner())


def _k_soft_max_ggml(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a, mask, scale = srcs[0], _mask(srcs), _scale(node)
    if mask is None or mask.dtype == F32:
        return soft_max_ggml.soft_max_step(a, mask, scale, dst)
    # an F16 mask: its rows widened (exactly) into a float32 copy at each run, as ggml reads it
    m16 = mask[:, :, :a.shape[2], :]
    m32 = np.empty(m16.shape, F32)
    step = soft_max_ggml.soft_max_step(a, m32, scale, dst)
    copyto = np.copyto

    def run_widened() -> None:
        copyto(m32, m16)
        step()
    return run_widened


def _k_soft_max_jit(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    return partial(cpu_jit.soft_max, srcs[0], _mask(srcs), _scale(node), dst)


def _k_soft_max_jit_f16(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # an F16 mask: converted (exactly) into a float32 copy of the rows used, then the compiled
    # kernel, so the result is the F32 mask's one (same rounding, same flush)
    a, mask, scale = srcs[0], _mask(srcs), _scale(node)
    x1 = a.shape[2]
    mrows16 = mask[:, :, :x1, :]
    m32 = np.empty(mrows16.shape, F32)
    copyto, jit_soft_max = np.copyto, cpu_jit.soft_max

    def run_converted() -> None:
        copyto(m32, mrows16)
        jit_soft_max(a, m32, scale, dst)
    return run_converted


def _k_soft_max_fast(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a, mask, scale = srcs[0], _mask(srcs), _scale(node)
    if mask is None:
        return partial(fastpath.soft_max, xp, a, None, scale, dst)
    mrows = mask[:, :, :a.shape[2], :]
    a6, m6 = tile_23(xp, a, mrows)
    d6, _ = tile_23(xp, dst, mrows)
    return partial(fastpath.soft_max, xp, a6, m6, scale, d6)


_BINARY_UFUNCS = {Op.ADD: "add", Op.SUB: "subtract", Op.MUL: "multiply", Op.DIV: "divide"}


def register(registry: KernelRegistry) -> None:
    """Stack the CPU's variants (the table of the module docstring) in ``registry``, in that
    order. Raises ValueError when they are already registered there."""
    o = registry.override
    o(Op.UNARY, _k_gelu_erf_jit, _sup_gelu_erf_jit, name="cpu.jit.gelu_erf",
      fits=_fits_jit_unary, narrows=True)
    o(Op.UNARY, _k_gelu_erf_f32, _sup_gelu_erf_f32, name="fast.gelu_erf_f32",
      fits=_fits_contig, narrows=True)
    o(Op.UNARY, _k_gelu_table, _sup_gelu_table, name="cpu.gelu_f16_table",
      fits=_fits_dst_contig, narrows=True)
    o(Op.GLU, _k_geglu_table, _sup_geglu_table, name="cpu.geglu_f16_table",
      fits=_fits_dst_contig, narrows=True)
    o(Op.UNARY, _k_gelu_tanh_f32, _sup_gelu_tanh_f32, name="fast.gelu_tanh_f32",
      fits=_fits_contig, narrows=True)
    o(Op.RMS_NORM, _k_rms_norm, _sup_rms_norm, name="fast.rms_norm", narrows=True)
    o(Op.ROPE, _k_rope_ggml, _sup_rope_ggml, name="cpu.jit.rope", fits=_fits_jit_rope,
      narrows=True)
    for op, ufunc_name in _BINARY_UFUNCS.items():
        o(op, _k_binary_jit(ufunc_name), _sup_jit, name="cpu.jit.binary",
          fits=_fits_jit_binary, narrows=True)
    o(Op.NORM, _k_norm_jit, _sup_jit_not_precise, name="cpu.jit.norm", fits=_fits_jit_norm,
      narrows=True)
    o(Op.NORM, _k_norm_fast, _sup_not_precise, name="fast.norm", narrows=True)
    o(Op.MUL_MAT, _k_mul_mat_f16, _sup_mul_mat_f16, name="cpu.jit.mul_mat_f16",
      fits=_fits_mul_mat_4d, narrows=True)
    o(Op.MUL_MAT, _k_mul_mat_f32, _sup_mul_mat_f32, name="cpu.jit.mul_mat_f32",
      fits=_fits_mul_mat_4d, narrows=True)
    o(Op.MUL_MAT, _k_mul_mat_q4k, _sup_mul_mat_q4k, name="cpu.jit.mul_mat_q4k",
      fits=_fits_mul_mat_q4k, narrows=True)
    o(Op.MUL_MAT, _k_mul_mat_q6k, _sup_mul_mat_q6k, name="cpu.jit.mul_mat_q6k",
      fits=_fits_mul_mat_q4k, narrows=True)
    o(Op.SOFT_MAX, _k_soft_max_ggml, _sup_soft_max_ggml, name="cpu.jit.soft_max_ggml",
      fits=_fits_soft_max_ggml, narrows=True)
    o(Op.SOFT_MAX, _k_soft_max_jit, _sup_soft_max_jit, name="cpu.jit.soft_max",
      fits=_fits_jit_soft_max, narrows=True)
    o(Op.SOFT_MAX, _k_soft_max_jit_f16, _sup_soft_max_jit, name="cpu.jit.soft_max_f16",
      fits=_fits_jit_soft_max_f16, narrows=True)
    o(Op.SOFT_MAX, _k_soft_max_fast, _sup_soft_max_fast, name="fast.soft_max", narrows=True)
