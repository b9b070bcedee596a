"""The device backend passes the same op cases as the CPU backend.

Each case builds one small graph twice (same seed): once in CPU memory computed by the CPU backend,
once in device memory computed by an async device backend. Both results are checked against an
independent float64 NumPy reference (tolerance per case, reason stated), and:

* on SIM the device result must be **bit-identical** to the CPU's: SIM runs the very same NumPy
  kernels (ggmlpy.backends.kernels with xp = numpy) on the same bytes, only on another thread, so
  any difference is a bug in the device layer (wrong views, ordering, copies), never rounding;
* the fake CuPy runs the same NumPy kernels, except where a fused CUDA kernel overrides the
  generic one (``cuda_kernels``: float32 accumulation, as ggml-cuda): there the case tolerance
  applies, and elsewhere bit-identity does;
* on CUDA (``-m gpu``) CuPy's kernels may round differently, so the case tolerance applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import np_permute

from ggmlpy import ops
from ggmlpy.backend.interface import BufferType, tensor_alloc, view_init
from ggmlpy.backend.tensor_data import (
    backend_tensor_get,
    backend_tensor_get_async,
    backend_tensor_set,
    backend_tensor_set_async,
)
from ggmlpy.backends.cpu import blas as cpu_blas
from ggmlpy.backends.cpu.backend import backend_cpu_init, cpu_buffer_type
from ggmlpy.backends.kernels import REGISTRY
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type


@dataclass
class Case:
    """``build(ctx, rng) -> (inputs {tensor: array of NumPy shape ne[::-1]}, output, expected float64)``."""

    build: Callable[[Context, np.random.Generator], tuple[dict[Tensor, np.ndarray], Tensor, np.ndarray]]
    rtol: float
    atol: float
    why: str  # the reason for the tolerance


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _t(ctx, type_, *ne):
    return ctx.new_tensor(type_, ne)


def _add_bcast(ctx, rng):
    a, b = _t(ctx, Type.F32, 16, 4, 3), _t(ctx, Type.F32, 16, 1, 3)
    x, y = _f32(rng, 3, 4, 16), _f32(rng, 3, 1, 16)
    return {a: x, b: y}, ops.add(ctx, a, b), x.astype(np.float64) + y


def _mul(ctx, rng):
    a, b = _t(ctx, Type.F32, 16, 4), _t(ctx, Type.F32, 16, 4)
    x, y = _f32(rng, 4, 16), _f32(rng, 4, 16)
    return {a: x, b: y}, ops.mul(ctx, a, b), x.astype(np.float64) * y


def _scale(ctx, rng):
    a = _t(ctx, Type.F32, 32, 3)
    x = _f32(rng, 3, 32)
    return {a: x}, ops.scale(ctx, a, 0.37), x * np.float64(np.float32(0.37))


def _silu(ctx, rng):
    a = _t(ctx, Type.F32, 32, 3)
    x = _f32(rng, 3, 32)
    xd = x.astype(np.float64)
    return {a: x}, ops.silu(ctx, a), xd / (1.0 + np.exp(-xd))


def _mul_mat(ctx, rng):
    w, v = _t(ctx, Type.F32, 32, 12), _t(ctx, Type.F32, 32, 5)  # [K, M] x [K, N] -> [M, N]
    x, y = _f32(rng, 12, 32), _f32(rng, 5, 32)
    return {w: x, v: y}, ops.mul_mat(ctx, w, v), y.astype(np.float64) @ x.astype(np.float64).T


def _mul_mat_bcast(ctx, rng):
    w, v = _t(ctx, Type.F32, 16, 6, 2), _t(ctx, Type.F32, 16, 3, 4)  # w broadcast over dim 2
    x, y = _f32(rng, 2, 6, 16), _f32(rng, 4, 3, 16)
    exp = np.stack([y[i].astype(np.float64) @ x[i // 2].astype(np.float64).T for i in range(4)])
    return {w: x, v: y}, ops.mul_mat(ctx, w, v), exp


def _mul_mat_f16(ctx, rng):
    w, v = _t(ctx, Type.F16, 32, 8), _t(ctx, Type.F32, 32, 4)
    x, y = _f32(rng, 8, 32).astype(np.float16), _f32(rng, 4, 32)
    return {w: x, v: y}, ops.mul_mat(ctx, w, v), y.astype(np.float64) @ x.astype(np.float64).T


def _soft_max_ext(ctx, rng):
    a, m = _t(ctx, Type.F32, 16, 6, 2), _t(ctx, Type.F32, 16, 6)
    x = _f32(rng, 2, 6, 16)
    mask = np.where(np.arange(16)[None, :] > np.arange(6)[:, None] + 9, -np.inf, 0.0).astype(np.float32)
    z = 0.5 * x.astype(np.float64) + mask
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return {a: x, m: mask}, ops.soft_max_ext(ctx, a, m, 0.5, 0.0), e / e.sum(axis=-1, keepdims=True)


def _rope_ref(x, pos, n_dims, neox, base=10000.0):
    """Plain RoPE with ggml defaults (freq_scale 1, ext_factor 0, attn_factor 1): NumPy x
    (n_tok, n_head, head_dim); pair i rotates by angle pos * base**(-2i/n_dims)."""
    out = x.astype(np.float64).copy()
    half = n_dims // 2
    for t in range(x.shape[0]):
        for i in range(half):
            th = pos[t] * base ** (-2.0 * i / n_dims)
            c, s = np.cos(th), np.sin(th)
            i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[t, :, i0].astype(np.float64), x[t, :, i1].astype(np.float64)
            out[t, :, i0] = x0 * c - x1 * s
            out[t, :, i1] = x0 * s + x1 * c
    return out


def _rope(mode):
    def build(ctx, rng):
        a, p = _t(ctx, Type.F32, 8, 3, 5), _t(ctx, Type.I32, 5)
        x, pos = _f32(rng, 5, 3, 8), np.array([0, 3, 6, 9, 12], np.int32)
        r = ops.rope_ext(ctx, a, p, None, 8, mode, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        return {a: x, p: pos}, r, _rope_ref(x, pos, 8, neox=mode == ops.ROPE_TYPE_NEOX)
    return build


def _norm(ctx, rng):
    a = _t(ctx, Type.F32, 32, 4)
    x = _f32(rng, 4, 32)
    xd = x.astype(np.float64)
    mu, var = xd.mean(-1, keepdims=True), xd.var(-1, keepdims=True)
    return {a: x}, ops.norm(ctx, a, 1e-5), (xd - mu) / np.sqrt(var + 1e-5)


def _rms_norm(ctx, rng):
    a = _t(ctx, Type.F32, 32, 4)
    x = _f32(rng, 4, 32)
    xd = x.astype(np.float64)
    return {a: x}, ops.rms_norm(ctx, a, 1e-6), xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6)


def _get_rows(type_):
    def build(ctx, rng):
        a, i = _t(ctx, type_, 8, 10), _t(ctx, Type.I32, 4)
        x = _f32(rng, 10, 8).astype(type_.dtype)
        idx = np.array([3, 0, 9, 3], np.int32)
        return {a: x, i: idx}, ops.get_rows(ctx, a, i), x[idx].astype(np.float64)
    return build


def _set_rows(type_, type_idx):
    """Rows 5, 0 and 3 of an [8, 7, 2] destination written from an F32 [8, 3, 2] source whose
    index rows broadcast over dim 2 (c is [3, 1]); the other rows keep their values."""
    def build(ctx, rng):
        a, b = _t(ctx, type_, 8, 7, 2), _t(ctx, Type.F32, 8, 3, 2)
        c = _t(ctx, type_idx, 3, 1)
        x = _f32(rng, 2, 7, 8).astype(type_.dtype)
        y = _f32(rng, 2, 3, 8)
        idx = np.array([[5, 0, 3]], type_idx.dtype)
        want = x.astype(np.float64)
        want[:, idx[0]] = y.astype(type_.dtype).astype(np.float64)
        return {a: x, b: y, c: idx}, ops.set_rows(ctx, a, b, c), want
    return build


def _cont_permuted(ctx, rng):
    a = _t(ctx, Type.F32, 4, 3, 2, 5)
    x = _f32(rng, 5, 2, 3, 4)
    return {a: x}, ops.cont(ctx, ops.permute(ctx, a, 2, 0, 1, 3)), np_permute(x, (2, 0, 1, 3)).astype(np.float64)


def _cpy_transposed_f16(ctx, rng):
    a, b = _t(ctx, Type.F32, 6, 4), _t(ctx, Type.F16, 4, 6)
    x = _f32(rng, 4, 6)
    return {a: x}, ops.cpy(ctx, ops.transpose(ctx, a), b), x.T.astype(np.float16).astype(np.float64)


F32_ROUND = "float32 kernels vs a float64 reference: a few float32 ulps (eps 1.2e-7)"
CASES = {
    "add_broadcast": Case(_add_bcast, 1e-7, 0, "one float32 rounding"),
    "mul": Case(_mul, 1e-7, 0, "one float32 rounding"),
    "scale": Case(_scale, 1e-7, 0, "one float32 rounding (the scale is float32 0.37)"),
    "silu": Case(_silu, 1e-6, 1e-7, F32_ROUND),
    "mul_mat": Case(_mul_mat, 1e-5, 1e-5, "float32 sums of 32 products"),
    "mul_mat_broadcast": Case(_mul_mat_bcast, 1e-5, 1e-5, "float32 sums of 16 products"),
    "mul_mat_f16_weight": Case(_mul_mat_f16, 0, 3e-2,
                               "ggml may round src1 to f16 (rel 5e-4 each) over 32 products of N(0,1)"),
    "soft_max_ext_mask": Case(_soft_max_ext, 1e-5, 1e-7, F32_ROUND + " through exp and a sum"),
    "rope_normal": Case(_rope(ops.ROPE_TYPE_NORMAL), 0, 1e-5,
                        "float32 angles up to 12 rad: cos/sin error ~ 12 * 1.2e-7 per term"),
    "rope_neox": Case(_rope(ops.ROPE_TYPE_NEOX), 0, 1e-5,
                      "float32 angles up to 12 rad: cos/sin error ~ 12 * 1.2e-7 per term"),
    "norm": Case(_norm, 1e-5, 1e-6, F32_ROUND + " through mean/variance of 32 values"),
    "rms_norm": Case(_rms_norm, 1e-5, 1e-6, F32_ROUND + " through a mean of 32 squares"),
    "get_rows_f32": Case(_get_rows(Type.F32), 0, 0, "rows are copied"),
    "get_rows_f16": Case(_get_rows(Type.F16), 0, 0, "f16 -> f32 widening is exact"),
    "set_rows_f32_i64": Case(_set_rows(Type.F32, Type.I64), 0, 0, "rows are copied"),
    "set_rows_f16_i32": Case(_set_rows(Type.F16, Type.I32), 0, 0,
                             "f32 -> f16 rounding to nearest even, as NumPy's astype"),
    "cont_permuted": Case(_cont_permuted, 0, 0, "values are copied"),
    "cpy_transposed_to_f16": Case(_cpy_transposed_f16, 0, 0,
                                  "f32 -> f16 rounding to nearest even, as NumPy's astype"),
}

def _uses_override(g: Graph, backend) -> bool:
    """Whether a node of ``g`` is computed by an override kernel (a fused CUDA kernel) on ``backend``."""
    xp = getattr(getattr(backend, "runtime", None), "xp", np)
    return any(REGISTRY.select(n, xp) is not REGISTRY.entry(n.op) for n in g.nodes
               if REGISTRY.entry(n.op) is not None)


def _run(case: Case, buft: BufferType, backend, seed: int) -> tuple[np.ndarray, np.ndarray]:
    ctx = Context()
    inputs, out, expected = case.build(ctx, np.random.default_rng(seed))
    g = Graph()
    g.build_forward_expand(out)
    _run.fused = _uses_override(g, backend)
    if not backend.supports_op(out):
        pytest.skip(f"{backend.name} does not support {out.op.name} here (kernel not available)")
    align = buft.get_alignment()
    total, offs = 0, {}
    for t in ctx:
        if t.view_src is None:
            offs[id(t)] = total
            total += -(-max(buft.get_alloc_size(t), 1) // align) * align
    buf = buft.alloc_buffer(total)
    try:
        buf.clear(0xFF)  # NaN garbage: an element the kernel forgets shows up
        for t in ctx:
            if t.view_src is None:
                tensor_alloc(buf, t, offs[id(t)])
        for t in ctx:
            if t.view_src is not None:
                view_init(t)
        async_ = not buft.is_host()
        for t, x in inputs.items():
            if async_:
                backend_tensor_set_async(backend, t, np.ascontiguousarray(x))
            else:
                backend_tensor_set(t, np.ascontiguousarray(x))
        backend.graph_compute_async(g)
        if async_:
            res = np.empty(out.ne[::-1], out.type.dtype)
            backend_tensor_get_async(backend, out, res)
            backend.synchronize()
        else:
            backend.synchronize()
            res = backend_tensor_get(out)
        return res, expected
    finally:
        buf.free()


@pytest.mark.backends("SIM0", "FAKECUDA0", "CUDA0")
@pytest.mark.parametrize("name", list(CASES))
def test_device_matches_cpu(name, backend, backend_kind):
    device_backend = backend
    case = CASES[name]
    cpu_res, expected = _run(case, cpu_buffer_type(), backend_cpu_init(), seed=11)
    dev_res, _ = _run(case, device_backend.get_default_buffer_type(), device_backend, seed=11)
    expected = expected.reshape(cpu_res.shape)
    # both against the independent reference (tolerance: see the case's ``why``)
    np.testing.assert_allclose(cpu_res.astype(np.float64), expected, rtol=case.rtol, atol=case.atol,
                               err_msg=f"CPU vs reference ({case.why})")
    np.testing.assert_allclose(dev_res.astype(np.float64), expected, rtol=case.rtol, atol=case.atol,
                               err_msg=f"{device_backend.name} vs reference ({case.why})")
    if backend_kind == "CUDA0" or _run.fused:
        return  # real CuPy / fused kernels may round differently: the tolerance above is the check
    if backend_kind == "FAKECUDA0" and name == "mul_mat_f16_weight":
        return  # cuBLAS GemmEx rounds src1 to f16 as ggml-cuda does (backends/cuda_gemm.py)
    if backend_kind == "FAKECUDA0" and name.startswith("rope"):
        return  # the CPU's ROPE steps theta in float32 as ggml-cpu (cpu.jit.rope); the CUDA path
        #         takes the generic kernel's float64 angles (ggml-cuda also computes each angle
        #         directly, with powf, instead of ggml-cpu's running product)
    if (backend_kind == "FAKECUDA0" and name.startswith("mul_mat")
            and cpu_blas.active() is not None):
        return  # the CPU's GEMMs run in MKL (GGMLPY_BLAS), the stand-in's in NumPy's OpenBLAS
    # SIM (and the NumPy stand-in for CuPy) run the same NumPy kernels on the same bytes:
    # bit-identical, not merely close
    assert dev_res.dtype == cpu_res.dtype and dev_res.shape == cpu_res.shape
    assert dev_res.tobytes() == cpu_res.tobytes()
