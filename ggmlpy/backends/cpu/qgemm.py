"""The GEMM path of a MUL_MAT with a quantized weight: float32 tiles of weight rows, and
activations with ggml's numerics.

From the crossover batch on (:data:`ggmlpy.backends.cpu.qmatmul.CROSSOVER`: prompt processing,
sentence batches) a CPU MUL_MAT ``y = x @ W^T`` (weight ``W``, ggml ``src0``, ``ne = [K, M]``;
activations ``x``, ``src1``, ``ne = [K, N]``, NumPy ``(N, K)``) dequantizes row blocks of the
weight into float32 tiles and multiplies each with one BLAS GEMM
(:mod:`ggmlpy.backends.kernels.matmul`). This module makes both GEMM operands.

Weight tiles (:func:`dequantize_rows`): compiled dequantizers per block type
(:mod:`ggmlpy.backends.cpu.dequant_kernels`, the ``jit`` extra; ``GGMLPY_JIT=0`` turns them
off) that write the float32 rows straight from the weight's bytes, bit-identical to
:func:`ggmlpy.quants.dequantize`; the NumPy fallback runs gguf-py's dequantizers over chunks of
:data:`DEQUANT_CHUNK_ELEMS` elements.

Numerics (:func:`gemm_numerics`). ``"ggml"`` (``GGMLPY_QUANT_MATMUL=ggml``, the default): ``x`` is
quantized to the weight type's ``vec_dot_type`` exactly as the dot path quantizes it
(:func:`ggmlpy.backends.cpu.qmatmul.quantize_act`, bit-exact with ggml-cpu's quantizer of the
host's architecture, or another form of :mod:`ggmlpy.quants.q8_arch` by ``GGMLPY_Q8_ROUNDING``)
and the GEMM's left operand is what those blocks stand for, ``xa = d_a * q_a``
(:func:`act_operand`). ggml's ``vec_dot`` computes ``sum_b d_w d_a isum_b`` (plus the min
terms) from integer block sums; the GEMM computes the same sum of the products
``xa_k * w_k`` in another order, so against the referee :func:`ggmlpy.quants.vec_dot.vec_dot`::

    |y - y_ref| <= (K + 2 * nb + 16) * 2**-24 * sum_k |xa_k| * (|w_k| + |m_k|)

``nb`` blocks per row, ``w_k`` the weight element without its min and ``m_k`` its min (Q4_1/Q5_1
``m``, Q4_K/Q5_K ``dmin * min``; 0 elsewhere): the referee rounds each block term and its
running sum (at most ``2 * nb + 16`` float32 roundings of terms bounded by that sum), the GEMM
rounds at most ``K`` times in its summation (any order, fused or not), Q8_K's float32 scale
rounds ``xa`` once (``2**-24`` relative; Q8_0/Q8_1 and F16/BF16 values are exact), and Q4_K/Q5_K
tiles round ``(d * sc) * q - dmin * min`` once. Q4_1/Q5_1: ggml adds ``m_w * s_a`` per block with
Q8_1's f16 ``s = d_a * sum(q_a)``; the tile keeps ``d * q`` and carries the block mins in ``nb``
extra columns that meet ``s`` in ``nb`` extra columns of the left operand (``K + nb`` columns in
all), so the f16 rounding of ``s`` is ggml's. F16/BF16 weights: ``x`` rounded to F16/BF16 (ggml's
``vec_dot_type``), its products with the weight exact in float32, same bound with ``nb = 0``.

Activations the ``vec_dot_type`` cannot hold (:func:`ggmlpy.backends.cpu.qmatmul` ``_overflowed``:
a Q8_0/Q8_1 scale or an F16 value beyond float16's range) make :func:`act_operand` return False;
the caller then multiplies the float32 ``x`` with exactly dequantized tiles, as the dot path does.
A Q8_0/Q8_1 block holding NaN or +-inf stands for NaN values (and ``s``) in every rounding form
(ggml's x86 quantizer would keep finite quants beside a NaN its ``maxps`` order drops).
``"exact"`` (``GGMLPY_QUANT_MATMUL=dequant``, and F16 activations): the float32 ``x`` times
:func:`ggmlpy.quants.dequantize`'s values, the GEMM's own rounding only.

Threads: callers split the weight rows (each part dequantizes its own rows; the activation
operand is made per part); every function here is synchronous on the calling thread and the
compiled kernels release the GIL.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu import qmatmul
from ggmlpy.core import env
from ggmlpy.core.types import Type
from ggmlpy.quants import q8_arch
from ggmlpy.quants.vec_dot import VEC_DOT_TYPE

__all__ = ["BLOCK_TYPES", "SPLIT_MIN_TYPES", "DEQUANT_CHUNK_ELEMS", "dequantize_rows", "warm_up",
           "gemm_numerics", "gemm_cols", "act_operand", "kernels_available"]

F32 = np.float32
#: block types with a compiled dequantizer (every block type ggmlpy multiplies)
BLOCK_TYPES = (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K,
               Type.Q6_K)
#: weight types whose ``"ggml"`` tiles keep the block mins in extra columns (paired with Q8_1's s)
SPLIT_MIN_TYPES = frozenset((Type.Q4_1, Type.Q5_1))
#: float32 elements per chunk of the NumPy fallback (32K = 128 KiB, inside L2): gguf-py's
#: dequantizers reach their best rate from a few ten thousand elements on, and slow down several
#: times when a call covers a whole weight (their temporaries leave the cache)
DEQUANT_CHUNK_ELEMS = 1 << 15



def _kernels() -> Any:
    return cpu_jit.kernel_module("dequant_kernels")


def kernels_available() -> bool:
    """True when the compiled dequantizers run: Numba imports and ``GGMLPY_JIT`` is not 0.

    Raises:
        EnvError: ``GGMLPY_JIT`` is malformed.
    """
    return env.jit_enabled() and _kernels() is not None




def gemm_numerics(t: Type, src1_type: Type) -> str:
    """The numerics of a GEMM-path MUL_MAT with a weight of type ``t`` and activations of type
    ``src1_type``: ``"ggml"`` (activations rounded to ``VEC_DOT_TYPE[t]``, see the module doc)
    when ``GGMLPY_QUANT_MATMUL`` is ``ggml`` (or ``dot``, for a type without a dot kernel), ``t``
    has a ``vec_dot_type`` and the activations are F32; else ``"exact"``. Depends on nothing else (not on buffers, caches or Numba).

    Raises:
        EnvError: ``GGMLPY_QUANT_MATMUL`` is malformed.
    """
    if t in VEC_DOT_TYPE and src1_type == Type.F32 and env.quant_matmul() != "dequant":
        return "ggml"
    return "exact"


def gemm_cols(t: Type, K: int, numerics: str) -> int:
    """Columns of both GEMM operands for rows of ``K`` elements: ``K + K / 32`` for a Q4_1/Q5_1
    weight under ``"ggml"`` numerics (the block mins' columns), else ``K``."""
    return K + K // 32 if numerics == "ggml" and t in SPLIT_MIN_TYPES else K


def _check_rows(t: Type, w: Any, fn: str) -> int:
    if t not in BLOCK_TYPES:
        raise ValueError(f"{fn}: type {t.type_name} is not a block type with a dequantizer")
    if not isinstance(w, np.ndarray) or w.dtype != np.uint8 or w.ndim != 2:
        raise ValueError(f"{fn}: w must be a 2-D uint8 array of weight rows, got "
                         f"{getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    if w.shape[1] % t.type_size:
        raise ValueError(f"{fn}: rows of {w.shape[1]} bytes are not whole {t.type_name} blocks "
                         f"of {t.type_size} bytes")
    return w.shape[1] // t.type_size * t.blck_size


def dequantize_rows(t: Type, w: np.ndarray, out: np.ndarray | None = None, split: bool = False,
                    jit: bool | None = None) -> np.ndarray:
    """*Sync*: weight rows of block type ``t`` as float32 (ggml's ``to_float``,
    ggml-quants.c ``dequantize_row_*``), bit-identical to :func:`ggmlpy.quants.dequantize`.

    Args:
        t: one of :data:`BLOCK_TYPES`.
        w: uint8 ``(R, row_bytes)``, whole blocks, any row stride (read in place when its rows
            are contiguous); ``K = row_bytes / type_size * blck_size`` elements per row.
        out: float32 ``(R, C)`` to write (``C = K``, or ``K + K / 32`` with ``split``; any row
            stride, unit element stride), or None for a new array.
        split: Q4_1/Q5_1 only: ``out[:, :K] = d * q`` without the min, block ``b``'s min in
            ``out[:, K + b]`` (the ``"ggml"`` tile, see the module doc).
        jit: use the compiled kernels (None: when :func:`kernels_available`).

    Returns:
        ``out``.

    Raises:
        ValueError: ``t`` is not a block type; ``w`` is not uint8 rows of whole blocks; ``out``
            has the wrong dtype or shape; ``split`` for a type without mins.
    """
    K = _check_rows(t, w, "dequantize_rows")
    if split and t not in SPLIT_MIN_TYPES:
        raise ValueError(f"dequantize_rows: split applies to Q4_1/Q5_1, not {t.type_name}")
    R = w.shape[0]
    C = K + K // 32 if split else K
    if out is None:
        out = np.empty((R, C), F32)
    elif (not isinstance(out, np.ndarray) or out.dtype != F32 or out.shape != (R, C)
          or out.strides[1] != 4 or not out.flags.writeable):
        raise ValueError(f"dequantize_rows: out must be a writeable float32 ({R}, {C}) array "
                         f"with unit element stride, got {getattr(out, 'dtype', type(out))} "
                         f"{getattr(out, 'shape', '')}")
    if R == 0:
        return out
    if w.strides[1] != 1:
        w = np.ascontiguousarray(w)
    if jit is None:
        jit = kernels_available()
    k = _kernels() if jit else None
    if k is not None:
        k.DEQUANT[t.type_name](w, out, cpu_jit.f16_table(), split, 16)
        return out
    _numpy_rows(t, w, out, K, split)
    return out


def _numpy_rows(t: Type, w: np.ndarray, out: np.ndarray, K: int, split: bool) -> None:
    """The NumPy fallback: gguf-py's dequantizers (:func:`ggmlpy.quants.legacy.
    gguf_dequantize_blocks`) in cache-sized chunks of rows; ``split``: ``d * q`` and the mins from
    :func:`ggmlpy.quants.vec_dot.unpack_weight`."""
    from ggmlpy.quants.legacy import gguf_dequantize_blocks  # noqa: PLC0415 - the gguf extra
    from ggmlpy.quants.vec_dot import unpack_weight  # noqa: PLC0415

    R = w.shape[0]
    step = max(1, DEQUANT_CHUNK_ELEMS // max(K, 1))
    for r in range(0, R, step):
        e = min(R, r + step)
        if split:
            u = unpack_weight(t, w[r:e])
            out[r:e, :K] = (u["d"][:, :, None] * u["q"].astype(F32)).reshape(e - r, K)
            out[r:e, K:] = u["m"]
        else:
            blk = np.ascontiguousarray(w[r:e]).reshape(-1, t.type_size)
            out[r:e] = gguf_dequantize_blocks(blk, t).reshape(e - r, K)


def act_operand(t: Type, x: np.ndarray, out: np.ndarray, jit: bool | None = None,
                form: str | None = None) -> bool:
    """*Sync*: the GEMM's left operand under ``"ggml"`` numerics: ``x`` quantized to
    ``VEC_DOT_TYPE[t]`` with the rounding of ``form`` (the compiled quantizers of
    :mod:`.dequant_kernels`, else :func:`ggmlpy.backends.cpu.qmatmul.quantize_act`: both give
    the blocks of :func:`ggmlpy.quants.q8_arch.quantize_row_q8` bit for bit, as the dot path
    does) and written as the values its blocks stand for, ``out[n, k] = d_a * q_a``
    (F16/BF16: ``x`` rounded to that type); for Q4_1/Q5_1 weights also Q8_1's ``s`` of block
    ``b`` in ``out[n, K + b]``.

    Args:
        t: the weight type (a key of :data:`~ggmlpy.quants.vec_dot.VEC_DOT_TYPE`).
        x: float32 ``(N, K)`` (ggml ``src1``, ``ne = [K, N]``), any strides.
        out: float32 ``(N, gemm_cols(t, K, "ggml"))``, unit element stride.
        jit: use the compiled kernels (None: when available).
        form: Q8_0/Q8_1 rounding, one of :data:`ggmlpy.quants.q8_arch.FORMS` (None:
            ``GGMLPY_Q8_ROUNDING``, :func:`ggmlpy.quants.q8_arch.env_form`).

    Returns:
        True when ``out`` was written; False when the activations overflow the ``vec_dot_type``
        (``out`` then holds nothing useful: multiply the float32 ``x`` with exact tiles).

    Raises:
        ValueError: ``t`` has no ``vec_dot_type``; the arrays' types or shapes do not match;
            ``K`` is not whole blocks; unknown ``form``.
    """
    form = q8_arch.env_form() if form is None else form
    if form not in q8_arch.FORMS:
        raise ValueError(f"act_operand: form must be one of {q8_arch.FORMS}, got {form!r}")
    if t not in VEC_DOT_TYPE:
        raise ValueError(f"act_operand: type {t.type_name} has no vec_dot_type")
    if not isinstance(x, np.ndarray) or x.dtype != F32 or x.ndim != 2:
        raise ValueError(f"act_operand: x must be a 2-D float32 array (N, K), got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    N, K = x.shape
    kind = VEC_DOT_TYPE[t]
    bs = 256 if kind == "q8_K" else 32 if kind.startswith("q8") else 1
    if K % bs:
        raise ValueError(f"act_operand: K = {K} is not a multiple of {kind}'s block size {bs}")
    C = gemm_cols(t, K, "ggml")
    if (not isinstance(out, np.ndarray) or out.dtype != F32 or out.shape != (N, C)
            or out.strides[1] != 4 or not out.flags.writeable):
        raise ValueError(f"act_operand: out must be a writeable float32 ({N}, {C}) array with "
                         f"unit element stride, got {getattr(out, 'dtype', type(out))} "
                         f"{getattr(out, 'shape', '')}")
    if jit is None:
        jit = kernels_available()
    k = _kernels() if jit else None
    if k is not None and kind != "f16" and kind != "bf16":
        return _act_jit(k, kind, np.ascontiguousarray(x), out, form)
    act = qmatmul.quantize_act(kind, x, form=form)
    if kind in ("q8_0", "q8_1") and form != "ref":
        # blocks holding NaN or +-inf stand for NaN, as in the compiled quantizers
        bad = ~np.isfinite(x).reshape(N, K // 32, 32).all(axis=2)
        act.d[bad] = np.nan
        if kind == "q8_1":
            act.x[bad] = np.nan
    if qmatmul._overflowed(act):
        return False
    if act.kind in ("f16", "bf16"):
        out[...] = act.q
        return True
    nb = K // bs
    out[:, :K] = (act.q.reshape(N, nb, bs).astype(F32) * act.d[:, :, None]).reshape(N, K)
    if C > K:
        out[:, K:] = act.x
    return True


def _f16_round(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v.astype(np.float16).astype(F32)


def _act_jit(k: Any, kind: str, x: np.ndarray, out: np.ndarray, form: str) -> bool:
    """:func:`act_operand` with the compiled quantizers of :mod:`.dequant_kernels` (the same
    rounding as :func:`ggmlpy.quants.q8_arch.quantize_row_q8` in ``form``): Q8_0 in two kernel
    calls (``q8_0_scales`` with the f16 rounding, ``q8_0_values_<form>``), Q8_1 in two passes (the block maxima, the scales and their f16
    rounding here, then the quants written as values and their sums)."""
    N, K = x.shape
    xi = x.view(np.int32)
    if kind == "q8_K":
        k.q8k_values(x, xi, out, 32)
        return True
    if kind == "q8_0":  # two calls: inverse and f16 scales per block, then the values
        code = q8_arch.FORM_CODE[form]
        iv = np.empty((N, K // 32), F32)
        h = np.empty((N, K // 32), F32)
        if not k.q8_0_scales(xi, iv, h, code, 32):
            return False
        (k.q8_0_values_ref, k.q8_0_values_x86, k.q8_0_values_arm)[code](x, iv, h, out, 32)
        return True
    nb = K // 32
    a = np.empty((N, nb), F32)
    k.q8_amax(xi, a, 32)
    d = (a / F32(127)).astype(F32, copy=False)
    d16 = _f16_round(d)
    if np.isinf(d16).any():
        return False
    s = np.empty((N, nb), F32)
    k.q8_values(x, a, d, d16, out, s, kind == "q8_1", q8_arch.FORM_CODE[form], 32)
    if kind == "q8_1":
        s16 = _f16_round(s)
        if np.isinf(s16).any():
            return False
        out[:, K:] = s16
    return True


def warm_up(types: Iterable[Type] = BLOCK_TYPES) -> bool:
    """*Sync*: compile (or load from Numba's disk cache) the GEMM path's kernels for weights of
    ``types`` (others are ignored) with the array types plans pass (the dequantizers on weights
    read in place from a read-only file map, the activation operands), so that a first prompt
    batch past the crossover does not pay for it; returns :func:`kernels_available`."""
    if not kernels_available():
        return False
    from ggmlpy.quants import quantize  # noqa: PLC0415

    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    for t in sorted(set(types) & set(BLOCK_TYPES)):
        w = quantize(x, t).reshape(2, -1).view(np.uint8)
        w.flags.writeable = False
        dequantize_rows(t, w, split=t in SPLIT_MIN_TYPES)
        out = np.empty((2, gemm_cols(t, 256, "ggml")), np.float32)
        act_operand(t, x, out)
    return True
