"""Normalisation kernels: NORM, RMS_NORM, L2_NORM, GROUP_NORM (F32); the result is float32.

Accumulation policy. ggml's CPU accumulates these sums in double. RMS_NORM, L2_NORM and
GROUP_NORM do the same here. NORM (LayerNorm, the hot one in BERT-style encoders) has two forms:

* default (any array module), the ``fast.norm`` variant of :mod:`ggmlpy.backends.cpu.variants`
  (the Numba kernel ``cpu.jit.norm`` on NumPy with ``GGMLPY_JIT``; CUDA's fused kernel first on
  CuPy): :func:`ggmlpy.backends.cpu.fastpath.norm`, float32 throughout: the row mean with
  NumPy's pairwise summation (relative error about ``log2(n) * 6e-8``), the centred values
  written once into the destination, their sum of squares as a float32 dot product per row
  (``einsum``; error at most ``n * 6e-8`` relative, typically ``sqrt(n) * 6e-8``) and one
  in-place scale: four passes, no temporaries of the input's size. For MiniLM's rows of 384 the
  outputs move by about 1e-6 relative against the double sums; test-backend-ops' NMSE
  tolerance (1e-7) and the model's 1e-5 embedding tolerance hold with a wide margin;
* ``GGMLPY_PRECISE_KERNELS=1`` (read when a plan is built): the generic kernel here, the mean
  and the variance summed in float64 as ggml does, the centred values in float32 (the referee).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ggmlpy.backends.kernels.common import F32, F64, alias, sup_f32_same
from ggmlpy.backends.kernels.registry import Step, kernel
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor


@kernel(Op.NORM, supports=sup_f32_same)
def _k_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    eps = float(node.op_params[0])
    a = srcs[0]
    n = a.shape[-1]
    sm, copyto, sqrt = xp.sum, xp.copyto, xp.sqrt

    def run() -> None:
        mean = (sm(a, axis=-1, keepdims=True, dtype=F64) / n).astype(F32)
        d = a - mean                                            # f32, as ggml
        var = sm(d * d, axis=-1, keepdims=True, dtype=F64) / n
        scale = (1.0 / sqrt(var + eps)).astype(F32)
        d *= scale
        copyto(dst, d, casting="unsafe")
    return run


def _sum_sq_scale(xp: Any, a: Any, dst: Any, scale_of: Callable[[Any], Any]) -> Step:
    """The step ``dst = a * scale_of(ss)`` with ``ss`` each row's sum of squares (float64,
    keepdims: NumPy shape ``(..., 1)`` for rows along axis -1) and ``scale_of`` giving the
    float32 row scale (RMS_NORM, L2_NORM). ``a`` may be ``dst`` itself (in place)."""
    sm, mul = xp.sum, xp.multiply
    a = alias(a, dst)  # in-place: CuPy would copy an overlapping input of ``mul`` per call

    def run() -> None:
        x64 = a.astype(F64)
        mul(a, scale_of(sm(x64 * x64, axis=-1, keepdims=True)), out=dst)
    return run


@kernel(Op.RMS_NORM, supports=sup_f32_same)
def _k_rms_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    eps = float(node.op_params[0])
    n = srcs[0].shape[-1]
    sqrt = xp.sqrt
    return _sum_sq_scale(xp, srcs[0], dst, lambda ss: (1.0 / sqrt(ss / n + eps)).astype(F32))


@kernel(Op.L2_NORM, supports=sup_f32_same)
def _k_l2_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    eps = F32(node.op_params[0])
    sqrt, maximum = xp.sqrt, xp.maximum
    # ggml: 1/fmaxf(sqrtf(sum), eps)
    return _sum_sq_scale(xp, srcs[0], dst,
                         lambda ss: (1.0 / maximum(sqrt(ss).astype(F32), eps)).astype(F32))


@kernel(Op.GROUP_NORM, supports=sup_f32_same)
def _k_group_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    n_groups, eps = int(node.op_params[0]), float(node.op_params[1])
    a = srcs[0]                       # (ne3, ne2=channels, ne1, ne0)
    ne2 = a.shape[1]
    cpg = (ne2 + n_groups - 1) // n_groups
    groups = [slice(g, min(g + cpg, ne2)) for g in range(0, ne2, cpg)]
    sm, copyto, sqrt = xp.sum, xp.copyto, xp.sqrt
    axes = (1, 2, 3)

    def run() -> None:
        outs = []
        for s in groups:               # ~32 groups: compute all first (dst may alias a)
            x = a[:, s]
            n = x.shape[1] * x.shape[2] * x.shape[3]
            mean = (sm(x, axis=axes, keepdims=True, dtype=F64) / n).astype(F32)
            d = x - mean
            var = sm(d * d, axis=axes, keepdims=True, dtype=F64) / n
            d *= (1.0 / sqrt(var + eps)).astype(F32)
            outs.append(d)
        for s, d in zip(groups, outs):
            copyto(dst[:, s], d, casting="unsafe")
    return run
