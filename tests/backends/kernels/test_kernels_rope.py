"""Numeric tests of ROPE (NORMAL and NEOX modes, partial rotation n_dims < ne0, freq_base,
freq_scale, freq_factors, YaRN ext_factor/attn_factor/beta_fast/beta_slow including the
n_ctx_orig = 0 case, in-place, F16) on the CPU backend against a float64 loop reference written
from the ggml reference text.

Tolerance: positions up to 512 give angles up to 512 rad; float32 results of rotations of O(1)
values: ``rtol=1e-5, atol=2e-6`` (the kernel builds theta in float64 and rounds cos/sin to
float32; ggml's own float32 theta would drift ~3e-5 rad at p = 512, which is why the reference
is float64 and not a model of ggml's drift). F16: one f16 rounding of the result, ``atol=4e-3``
for |values| <= ~2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import run_graph, uniform

from ggmlpy import ops
from ggmlpy.core import env
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    """ggml_rope_yarn_corr_dims: floor/ceil of the correction dims, clamped with C's MAX/MIN.
    n_ctx_orig = 0 gives log(0) = -inf: low = MAX(0, -inf) = 0, high = MIN(n_dims-1, -inf) = -inf."""
    def corr(beta):
        with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 when beta = n_ctx_orig = 0
            return n_dims * np.log(np.float64(n_ctx_orig) / (beta * 2 * math.pi)) / (2 * math.log(base))
    lo = max(0.0, float(np.floor(corr(beta_fast))))
    hi = min(n_dims - 1.0, float(np.ceil(corr(beta_slow))))
    return lo, hi


def _rope_ref(X, pos, ff, n_dims, mode, n_ctx_orig, base, fscale, ext, attn, bfast, bslow):
    """X (B, n_tok, n_head, head_dim) float64."""
    out = X.astype(np.float64).copy()
    half = n_dims // 2
    lo, hi = _corr_dims(n_dims, n_ctx_orig, base, bfast, bslow)
    # ggml computes theta_scale = powf(freq_base, -2.0f/n_dims) as a float32 value; theta_m is
    # then p * theta_scale^m (ggml multiplies up in float32; here exactly, in float64)
    theta_scale = float(np.float32(np.float32(base) ** np.float32(-2.0 / n_dims)))
    for t in range(X.shape[1]):
        p = float(pos[t])
        for m in range(half):
            theta_extrap = p * theta_scale ** m
            if ff is not None:
                theta_extrap /= float(ff[m])
            theta_interp = fscale * theta_extrap
            mscale = attn
            if ext != 0.0:
                y = (m - lo) / max(0.001, hi - lo)
                ramp = 1.0 - min(1.0, max(0.0, y))
                mix = ramp * ext
                theta = theta_interp * (1 - mix) + theta_extrap * mix
                mscale *= 1.0 + 0.1 * math.log(1.0 / fscale)
            else:
                theta = theta_interp
            c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
            i0, i1 = (m, m + half) if mode == 2 else (2 * m, 2 * m + 1)
            x0 = X[:, t, :, i0].astype(np.float64)
            x1 = X[:, t, :, i1].astype(np.float64)
            out[:, t, :, i0] = x0 * c - x1 * s
            out[:, t, :, i1] = x0 * s + x1 * c
    return out


_F = lambda v: float(np.float32(v))  # noqa: E731 - op_params are float32

_CASES = [
    # ne, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext, attn, beta_fast, beta_slow, ff
    ((32, 4, 6, 1), 32, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False),
    ((32, 4, 6, 2), 32, 2, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False),
    ((64, 3, 5, 1), 24, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False),     # partial rotation
    ((64, 3, 5, 1), 24, 2, 0, 500000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False),    # partial NEOX
    ((32, 2, 4, 1), 32, 0, 0, 10000.0, 1.4245, 0.7465, 1.4245, 1.0, 1.0, False),  # n_ctx_orig 0
    ((32, 2, 4, 1), 32, 2, 0, 10000.0, 1.4245, 0.7465, 1.0, 1.0, 1.0, True),
    ((64, 2, 4, 1), 64, 2, 4096, 10000.0, 0.25, 1.0, 1.0, 32.0, 1.0, False),  # real YaRN ramp
    ((64, 2, 4, 1), 48, 0, 2048, 10000.0, 0.5, 0.5, 1.2, 32.0, 1.0, True),
]


@pytest.mark.parametrize("case", _CASES)
def test_rope(case, monkeypatch):
    # the generic kernel, the referee (the CPU's default for NORMAL/NEOX without YaRN is ggml's
    # float32 theta, cpu.jit.rope: tests/backends/cpu/test_rope_ggml.py)
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    ne, n_dims, mode, nco, base, fs, ef, af, bf, bsl, use_ff = case
    rng = np.random.default_rng(sum(ne) + n_dims + mode + nco)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, ne)
    pos = ctx.new_tensor(Type.I32, (ne[2],))
    ff = ctx.new_tensor(Type.F32, (n_dims // 2,)) if use_ff else None
    out = ops.rope_ext(ctx, a, pos, ff, n_dims, mode, nco, base, fs, ef, af, bf, bsl)
    inp = ops.rope_ext_inplace(ctx, ops.cont(ctx, a), pos, ff, n_dims, mode, nco, base, fs, ef,
                               af, bf, bsl)
    A = uniform(rng, a.ne[::-1])
    P = rng.integers(0, 512, size=ne[2]).astype(np.int32)
    inputs = {a: A, pos: P}
    FF = None
    if ff is not None:
        FF = uniform(rng, ff.ne[::-1], 0.9, 1.1)
        inputs[ff] = FF.reshape(-1)
    r, ri = run_graph(ctx, [out, inp], inputs)
    ref = _rope_ref(A, P, None if FF is None else FF.reshape(-1), n_dims, mode, nco, _F(base),
                    _F(fs), _F(ef), _F(af), _F(bf), _F(bsl))
    np.testing.assert_allclose(r, ref, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(ri, ref, rtol=1e-5, atol=2e-6)
    if n_dims < ne[0]:
        np.testing.assert_array_equal(r[..., n_dims:], A[..., n_dims:])   # copied unchanged


def test_rope_non_contiguous_input_and_f16():
    rng = np.random.default_rng(5)
    ctx = Context()
    base_t = ctx.new_tensor(Type.F32, (16, 6, 4))                      # [d, tok, head] stored
    a = ops.permute(ctx, base_t, 0, 2, 1, 3)                            # [d, head, tok] view
    pos = ctx.new_tensor(Type.I32, (6,))
    out = ops.rope(ctx, a, pos, 16, 0)
    a16 = ctx.new_tensor(Type.F16, (16, 4, 6))
    out16 = ops.rope(ctx, a16, pos, 12, 2)
    B = uniform(rng, base_t.ne[::-1])
    A16 = uniform(rng, a16.ne[::-1], dtype=np.float16)
    P = rng.integers(0, 100, size=6).astype(np.int32)
    r, r16 = run_graph(ctx, [out, out16], {base_t: B, pos: P, a16: A16})
    X = B.transpose(0, 2, 1, 3)                                         # (1, tok, head, d)
    np.testing.assert_allclose(r, _rope_ref(X, P, None, 16, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0, 0),
                               rtol=1e-5, atol=2e-6)
    assert r16.dtype == np.float16
    ref16 = _rope_ref(A16, P, None, 12, 2, 0, 10000.0, 1.0, 0.0, 1.0, 0, 0)
    np.testing.assert_allclose(r16.astype(np.float64), ref16, rtol=0, atol=4e-3)


def test_rope_zero_dims_is_a_copy():
    rng = np.random.default_rng(6)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (8, 2, 3))
    pos = ctx.new_tensor(Type.I32, (3,))
    out = ops.rope(ctx, a, pos, 0, 0)
    A = uniform(rng, a.ne[::-1])
    (r,) = run_graph(ctx, [out], {a: A, pos: np.arange(3, dtype=np.int32)})
    np.testing.assert_array_equal(r, A)
