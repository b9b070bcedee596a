"""UNARY (ggml_unary_op activations) and GLU (gated linear units) kernels.

Each activation maps a float32 array to a new float32 array (never writes its input). F16 tensors
are computed in float32 and rounded once. The generic GELU (and GEGLU) is the exact float32 tanh
formula; ggml's CPU backend reads GELU from an f16 table instead (``GGML_GELU_FP16``, on in
ggml-cpu vec.h), and so do the CPU's variants on NumPy (:func:`gelu_f16_table_into`, stacked in
:mod:`ggmlpy.backends.cpu.variants`; the formula again under ``GGMLPY_PRECISE_KERNELS=1``).

GELU_ERF precision policy. The generic kernel here is the referee: ``0.5*x*erfc(-x/sqrt 2)`` in
float64, rounded once (0.51 ulp; :mod:`ggmlpy.core.special` for NumPy,
``cupyx.scipy.special.erfc`` for CuPy, so the backends agree to the ulp there). It computes F16
tensors, CuPy, non-contiguous layouts and everything under ``GGMLPY_PRECISE_KERNELS=1``. For
C-contiguous F32 on NumPy the CPU's variants take over (:mod:`ggmlpy.backends.cpu.variants`,
stacked in the registry): the Numba kernel (``GGMLPY_JIT``) or the float32 branch-free formula
:func:`ggmlpy.core.special.gelu_erf_f32` (error ``<= GELU_ERF_F32_BOUND * max(1, |x|)``), and
for GELU (tanh form) :func:`gelu_tanh_f32_into` (same formula and rounding as the reference,
fewer passes over memory).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ggmlpy.backends.kernels.common import (
    F32,
    F64,
    FLOATS,
    as_f32,
    c_contig,
    flatten_ew,
    is_numpy,
    src_of,
    sup_same_float,
    ufunc_step,
)
from ggmlpy.backends.kernels.registry import Step, kernel
from ggmlpy.core import special
from ggmlpy.core.opcodes import GluOp, Op, UnaryOp
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

# ---------------------------------------------------------------------------------------------
# erf (exact-erf GELU)


def _erfc_fn(xp: Any) -> Callable[[Any], Any]:
    """The element-wise erfc of ``xp``: :func:`ggmlpy.core.special.erfc` (float64) for NumPy, which has
    none; ``cupyx.scipy.special.erfc`` (a CuPy ufunc: float64 in, float64 out) for CuPy."""
    if is_numpy(xp):
        return special.erfc
    from cupyx.scipy.special import erfc  # noqa: PLC0415 - only with cupy

    return erfc


def _gelu_erf(xp: Any, x: Any) -> Any:
    """0.5*x*(1 + erf(x/sqrt(2))) as float32, from float32 ``x``.

    Both array modules evaluate ``0.5*x*erfc(-x/sqrt(2))`` in float64 and round once, so the
    backends agree to the ulp: in float32, ``1 + erf(x/sqrt(2))`` cancels to 0 for x below about
    -5.5 (CUDA's ``erff`` is also only accurate to 2 ulp)."""
    if is_numpy(xp):
        return special.gelu_erf(x)
    x64 = x.astype(F64)
    r = _erfc_fn(xp)(x64 * -math.sqrt(0.5))
    r *= x64
    r *= 0.5
    return r.astype(F32)


# ---------------------------------------------------------------------------------------------
# activations


def _sigmoid(xp: Any, x: Any) -> Any:
    # 1/(1+exp(-x)) without overflow: e = exp(-|x|) <= 1
    e = xp.exp(-xp.abs(x))
    d = 1.0 + e
    return xp.where(x >= 0, 1.0 / d, e / d).astype(x.dtype, copy=False)


def _act_abs(xp, x): return xp.abs(x)
def _act_sgn(xp, x): return xp.sign(x)
def _act_neg(xp, x): return xp.negative(x)
def _act_step(xp, x): return (x > 0).astype(x.dtype)
def _act_tanh(xp, x): return xp.tanh(x)
def _act_elu(xp, x): return xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0)))
def _act_relu(xp, x): return xp.maximum(x, 0)
def _act_sigmoid(xp, x): return _sigmoid(xp, x)
def _act_silu(xp, x): return x * _sigmoid(xp, x)
def _act_gelu_quick(xp, x): return x * _sigmoid(xp, x * F32(1.702))
def _act_hardsigmoid(xp, x): return xp.minimum(xp.maximum((x + 3) / 6, 0), 1)
def _act_hardswish(xp, x): return x * xp.minimum(xp.maximum((x + 3) / 6, 0), 1)
def _act_exp(xp, x): return xp.exp(x)
def _act_gelu_erf(xp, x): return _gelu_erf(xp, x)


_GELU_C = F32(math.sqrt(2.0 / math.pi))
_GELU_A = F32(0.044715)


def _act_gelu(xp, x):
    # tanh approximation, exact float32 formula (ggml's CPU uses an f16 lookup table: module doc)
    return 0.5 * x * (1.0 + xp.tanh(_GELU_C * x * (1.0 + _GELU_A * x * x)))


_UNARY: dict[UnaryOp, Callable[[Any, Any], Any]] = {
    UnaryOp.ABS: _act_abs, UnaryOp.SGN: _act_sgn, UnaryOp.NEG: _act_neg, UnaryOp.STEP: _act_step,
    UnaryOp.TANH: _act_tanh, UnaryOp.ELU: _act_elu, UnaryOp.RELU: _act_relu,
    UnaryOp.SIGMOID: _act_sigmoid, UnaryOp.GELU: _act_gelu, UnaryOp.GELU_QUICK: _act_gelu_quick,
    UnaryOp.SILU: _act_silu, UnaryOp.HARDSWISH: _act_hardswish,
    UnaryOp.HARDSIGMOID: _act_hardsigmoid, UnaryOp.EXP: _act_exp, UnaryOp.GELU_ERF: _act_gelu_erf,
}


#: unary ops that are a single ufunc: computed straight into dst with ``out=`` for F32
_UNARY_UFUNC = {UnaryOp.ABS: "abs", UnaryOp.SGN: "sign", UnaryOp.NEG: "negative",
                UnaryOp.TANH: "tanh", UnaryOp.EXP: "exp"}


_GLU: dict[GluOp, Callable[[Any, Any], Any]] = {
    GluOp.REGLU: _act_relu, GluOp.GEGLU: _act_gelu, GluOp.SWIGLU: _act_silu,
    GluOp.GEGLU_ERF: _act_gelu_erf, GluOp.GEGLU_QUICK: _act_gelu_quick,
}


# ---------------------------------------------------------------------------------------------
# support


def _sup_unary(node: Tensor, xp: Any) -> bool:
    if not node.op_params:
        return False
    try:
        UnaryOp(int(node.op_params[0]))
    except ValueError:
        return False
    return sup_same_float(node, xp)


def _sup_glu(node: Tensor, xp: Any) -> bool:
    a, b = src_of(node, 0), src_of(node, 1)
    if not node.op_params or a is None:
        return False
    try:
        GluOp(int(node.op_params[0]))
    except ValueError:
        return False
    if a.type not in FLOATS or node.type not in FLOATS:
        return False
    if b is None:
        return a.ne[0] == 2 * node.ne[0] and a.ne[1:] == node.ne[1:]
    return b.type in FLOATS and a.ne == b.ne == node.ne


# ---------------------------------------------------------------------------------------------
# kernels


_CHUNK = 1 << 15  # elements per step of the chunked float32 activations (128 KiB temporaries)


def gelu_tanh_f32_into(x: Any, out: Any) -> None:
    """``0.5*x*(1 + tanh(sqrt(2/pi)*x*(1 + 0.044715*x*x)))`` (float32, the same operation order
    as :func:`_act_gelu`) from a C-contiguous float32 ``x`` into a C-contiguous ``out`` of the
    same shape (may be ``x``), in chunks of :data:`_CHUNK` elements through two cache-sized
    temporaries: one read of ``x`` and one write of ``out`` from memory per element."""
    xf, of = x.reshape(-1), out.reshape(-1)
    n = xf.size
    m = min(_CHUNK, n)
    t_buf, u_buf = np.empty(m, F32), np.empty(m, F32)
    mul, add, tanh = np.multiply, np.add, np.tanh
    for s in range(0, n, m):
        xc, oc = xf[s:s + m], of[s:s + m]
        k = xc.size
        t, u = t_buf[:k], u_buf[:k]
        mul(xc, _GELU_C, out=t)          # c*x
        mul(_GELU_A, xc, out=u)          # a*x*x + 1
        mul(u, xc, out=u)
        add(u, F32(1.0), out=u)
        mul(t, u, out=t)
        tanh(t, out=t)
        add(t, F32(1.0), out=t)          # 1 + tanh(...)
        mul(xc, F32(0.5), out=u)         # 0.5*x (last read of xc: out may alias x)
        mul(u, t, out=oc)


_GELU_TABLE: list[np.ndarray] = []
_GELU_TABLE_LOCK = threading.Lock()


def gelu_f16_table() -> np.ndarray:
    """ggml-cpu's GELU table (ggml-cpu.c ``ggml_cpu_init``: ``ggml_table_gelu_f16[i]`` =
    ``fp16(ggml_gelu_f32(fp32(f16 bits i)))``) as float32 ``(65536,)`` indexed by the f16 bit
    pattern: ``0.5*x*(1 + tanh(sqrt(2/pi)*x*(1 + 0.044715*x*x)))`` in float32 with the inner
    ``1 + (0.044715*x)*x`` as one fused multiply-add (as the compiler contracts it in ggml-cpu's
    native x86 build) and ``tanh`` in float64 rounded to float32, then rounded to f16 and widened
    back. This reproduces every entry of ggml-cpu's table on x86-64 (checked against ggml's
    ``ggml_gelu`` over all 65536 f16 inputs). Built once, read-only."""
    if not _GELU_TABLE:
        with _GELU_TABLE_LOCK:
            if not _GELU_TABLE:
                x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
                x = x.astype(F32)
                with np.errstate(all="ignore"):
                    ax = (_GELU_A * x).astype(F64)
                    fma = (ax * x.astype(F64) + 1.0).astype(F32)   # fmaf(a*x, x, 1)
                    inner = (_GELU_C * x) * fma
                    th = np.tanh(inner.astype(F64)).astype(F32)
                    y = (F32(0.5) * x) * (F32(1.0) + th)
                t = y.astype(np.float16).astype(F32)
                t.flags.writeable = False
                _GELU_TABLE.append(t)
    return _GELU_TABLE[0]


#: ggml-cpu's GELU bounds: ``x <= -10`` gives 0, ``x >= 10`` gives x, the table in between
GELU_TABLE_LIMIT = F32(10.0)


def gelu_f16_table_into(x: Any, out: Any, g: Any = None) -> None:
    """ggml-cpu's float32 GELU / GEGLU with ``GGML_GELU_FP16`` (vec.h ``ggml_vec_gelu_f32``,
    ``ggml_vec_geglu_f32``): ``x`` rounded to f16 and looked up in :func:`gelu_f16_table`
    (``x <= -10``: 0, ``x >= 10``: ``x``), times ``g`` (float32) for GEGLU.

    ``x``, ``out`` (and ``g``) float32 NumPy arrays of one shape, ``out`` C-contiguous (may be
    ``x``); processed in chunks of :data:`_CHUNK` elements. The error against the exact GELU is
    up to about 2**-11 relative (the f16 roundings of the input and of the table entry)."""
    table = gelu_f16_table()
    xf = x.reshape(-1) if c_contig(x) else np.ascontiguousarray(x).reshape(-1)
    gf = None
    if g is not None:
        gf = g.reshape(-1) if c_contig(g) else np.ascontiguousarray(g).reshape(-1)
    of = out.reshape(-1)
    n = xf.size
    m = min(_CHUNK, n)
    if m == 0:
        return
    h_buf = np.empty(m, np.float16)
    y_buf = np.empty(m, F32)
    lim = GELU_TABLE_LIMIT
    for s in range(0, n, m):
        xc = xf[s:s + m]
        k = xc.size
        h, y = h_buf[:k], y_buf[:k]
        np.copyto(h, xc, casting="unsafe")                      # RNE, as F16C's vcvtps2ph
        np.take(table, h.view(np.uint16), out=y)
        np.copyto(y, xc, where=xc >= lim)
        if gf is not None:
            np.multiply(y, gf[s:s + m], out=y)
        y[xc <= -lim] = 0.0
        of[s:s + m] = y


@kernel(Op.UNARY, supports=_sup_unary)
def _k_unary(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    op = UnaryOp(node.op_params[0])
    a = srcs[0]
    if node.type == Type.F32 and a.dtype == F32 and op in _UNARY_UFUNC:
        a1, _, d1 = flatten_ew(a, None, dst)
        step = ufunc_step(xp, getattr(xp, _UNARY_UFUNC[op]), a1, out=d1)
        return step
    if op == UnaryOp.RELU and node.type == Type.F32 and a.dtype == F32:
        a1, _, d1 = flatten_ew(a, None, dst)
        return ufunc_step(xp, xp.maximum, a1, F32(0), out=d1)
    act = _UNARY[op]
    copyto = xp.copyto

    def run() -> None:
        copyto(dst, act(xp, as_f32(xp, a)), casting="unsafe")
    return run


@kernel(Op.GLU, supports=_sup_glu)
def _k_glu(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    op = GluOp(node.op_params[0])
    swapped = bool(node.op_params[1]) if len(node.op_params) > 1 else False
    act = _GLU[op]
    a = srcs[0]
    b = srcs[1] if len(srcs) > 1 else None
    if b is None:
        n = dst.shape[-1]
        x, g = (a[..., n:2 * n], a[..., :n]) if swapped else (a[..., :n], a[..., n:2 * n])
    else:
        x, g = a, b  # split form: ggml ignores `swapped`
    copyto = xp.copyto

    def run() -> None:
        gg = as_f32(xp, g)
        copyto(dst, act(xp, as_f32(xp, x)) * gg, casting="unsafe")
    return run
