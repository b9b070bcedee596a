"""Numeric tests of SOFT_MAX (mask tiling over dims 2/3, extra mask rows, F16/F32 masks, scale,
ALiBi) and FLASH_ATTN_EXT (GQA, mask broadcast, ALiBi, softcap, F16 K/V, fully masked rows) on
the CPU backend against float64 NumPy references written with explicit loops.

Tolerances: SOFT_MAX computes exp and the row sum in float32: results are probabilities in
[0, 1] with a few float32 roundings plus NumPy's exp (<= 1 ulp): ``rtol=1e-5, atol=1e-7``.
FLASH_ATTN_EXT adds two float32 GEMMs over D and n_kv terms: ``rtol=1e-4, atol=1e-5``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import run_graph, uniform

from ggmlpy import ops
from ggmlpy.backends.kernels import attention
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _slope(h, n_head, max_bias):
    if max_bias <= 0:
        return 1.0
    n_log2 = 2 ** math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    return m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1)


def _softmax_ref(X, M, scale, max_bias):
    """X (ne3, ne2, ne1, ne0); M (m3, m2, >=ne1, ne0) or None."""
    ne3, ne2, ne1, ne0 = X.shape
    out = np.zeros(X.shape)
    for i3 in range(ne3):
        for i2 in range(ne2):
            slope = _slope(i2, ne2, max_bias)
            for i1 in range(ne1):
                w = scale * X[i3, i2, i1].astype(np.float64)
                if M is not None:
                    w = w + slope * M[i3 % M.shape[0], i2 % M.shape[1], i1].astype(np.float64)
                e = np.exp(w - w.max())
                out[i3, i2, i1] = e / e.sum()
    return out


_SM_CASES = [
    # ne, mask ne (None = no mask), scale, max_bias
    ((16, 16, 1, 1), None, 1.0, 0.0),
    ((15, 7, 3, 2), None, 0.1, 0.0),
    ((16, 5, 4, 3), (16, 8, 1, 1), 1.0, 0.0),    # mask rows > a rows, broadcast over 2/3
    ((16, 5, 4, 3), (16, 5, 2, 3), 0.1, 0.0),    # mask tiled over dim 2 by modulo
    ((15, 5, 6, 4), (15, 5, 3, 2), 1.0, 0.0),    # tiled over dims 2 and 3
    ((16, 5, 8, 1), (16, 5, 1, 1), 1.0, 8.0),    # ALiBi, power-of-two heads
    ((16, 5, 6, 2), (16, 6, 2, 1), 0.5, 8.0),    # ALiBi, 6 heads (m1 branch), tiled mask
]


@pytest.mark.parametrize("ne,mask_ne,scale,max_bias,mask_t", [
    (*case, mt) for case in _SM_CASES for mt in (Type.F32, Type.F16)
    if case[1] is not None or mt == Type.F32])  # without a mask its type does not exist
def test_soft_max_ext(ne, mask_ne, scale, max_bias, mask_t):
    rng = np.random.default_rng(sum(ne) + int(max_bias))
    ctx = Context()
    a = ctx.new_tensor(Type.F32, ne)
    mask = ctx.new_tensor(mask_t, mask_ne) if mask_ne is not None else None
    out = ops.soft_max_ext(ctx, a, mask, scale, max_bias)
    A = uniform(rng, a.ne[::-1], -5, 5)
    inputs = {a: A}
    M = None
    if mask is not None:
        M = uniform(rng, mask.ne[::-1], -2, 2, dtype=mask_t.dtype)
        M[..., 0, 3] = -np.inf                       # masked entries exp to exactly 0
        inputs[mask] = M
    (r,) = run_graph(ctx, [out], inputs)
    ref = _softmax_ref(A, M, float(np.float32(scale)), max_bias)
    np.testing.assert_allclose(r, ref, rtol=1e-5, atol=1e-7)


def test_soft_max_plain_and_inplace():
    rng = np.random.default_rng(2)
    ctx = Context()
    a0 = ctx.new_tensor(Type.F32, (10, 4, 3))
    s1 = ops.soft_max(ctx, a0)
    s2 = ops.soft_max_inplace(ctx, ops.cont(ctx, a0))
    mask = ctx.new_tensor(Type.F32, (10, 4))
    s3 = ops.soft_max_ext_inplace(ctx, ops.cont(ctx, a0), mask, 0.25, 0.0)
    A = uniform(rng, a0.ne[::-1], -5, 5)
    Mk = uniform(rng, mask.ne[::-1])
    r1, r2, r3 = run_graph(ctx, [s1, s2, s3], {a0: A, mask: Mk})
    ref = _softmax_ref(A, None, 1.0, 0.0)
    np.testing.assert_allclose(r1, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(r2, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(r3, _softmax_ref(A, Mk, 0.25, 0.0), rtol=1e-5, atol=1e-7)


def _fa_ref(Q, K, V, M, scale, max_bias, softcap):
    """Q (B, H, NQ, D), K (B, Hkv, NKV, D), V (B, Hkv, NKV, Dv), M (mB, mH, >=NQ, NKV) or None.
    Returns (B, NQ, H, Dv) (ggml's permuted output)."""
    B, H, NQ, _ = Q.shape
    Hkv = K.shape[1]
    g = H // Hkv
    Dv = V.shape[3]
    out = np.zeros((B, NQ, H, Dv))
    for b in range(B):
        for h in range(H):
            slope = _slope(h, H, max_bias)
            k = K[b, h // g].astype(np.float64)
            v = V[b, h // g].astype(np.float64)
            for i in range(NQ):
                s = k @ Q[b, h, i].astype(np.float64) * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                if M is not None:
                    s = s + slope * M[b % M.shape[0], h % M.shape[1], i].astype(np.float64)
                if np.all(np.isneginf(s)):
                    continue                               # fully masked row -> 0
                e = np.exp(s - s.max())
                out[b, i, h] = (e / e.sum()) @ v
    return out


_FA_CASES = [
    # D, Dv, H, Hkv, NQ, NKV, B, mask (mH, mB) or None, max_bias, softcap
    (16, 16, 2, 2, 5, 12, 1, None, 0.0, 0.0),
    (16, 8, 4, 1, 3, 10, 2, (1, 1), 0.0, 0.0),         # GQA 4:1, Dv != Dk
    (8, 8, 6, 2, 4, 9, 2, (3, 2), 0.0, 0.0),           # GQA 3:1, mask tiled over heads/batch
    (8, 8, 4, 2, 4, 9, 1, (1, 1), 8.0, 0.0),           # ALiBi
    (8, 8, 2, 2, 4, 9, 2, (2, 1), 0.0, 30.0),          # softcap
    (8, 8, 6, 3, 3, 7, 1, (1, 1), 8.0, 20.0),          # all together, 6 heads
]


@pytest.mark.parametrize("D,Dv,H,Hkv,NQ,NKV,B,mask,max_bias,softcap", _FA_CASES)
@pytest.mark.parametrize("kv_t", [Type.F32, Type.F16])
def test_flash_attn_ext(D, Dv, H, Hkv, NQ, NKV, B, mask, max_bias, softcap, kv_t):
    rng = np.random.default_rng(D + H * 3 + NQ + int(softcap))
    ctx = Context()
    q = ctx.new_tensor(Type.F32, (D, NQ, H, B))
    k = ctx.new_tensor(kv_t, (D, NKV, Hkv, B))
    v = ctx.new_tensor(kv_t, (Dv, NKV, Hkv, B))
    m = None
    if mask is not None:
        m = ctx.new_tensor(Type.F16, (NKV, NQ + 2, mask[0], mask[1]))   # extra rows ignored
    scale = 1.0 / math.sqrt(D)
    out = ops.flash_attn_ext(ctx, q, k, v, m, scale, max_bias, softcap)
    Q = uniform(rng, q.ne[::-1])
    K = uniform(rng, k.ne[::-1], dtype=kv_t.dtype)
    V = uniform(rng, v.ne[::-1], dtype=kv_t.dtype)
    inputs = {q: Q, k: K, v: V}
    M = None
    if m is not None:
        M = uniform(rng, m.ne[::-1], dtype=np.float16)
        M[..., 1, 2:5] = -np.inf
        M[..., 2, :] = -np.inf                           # a fully masked query row
        inputs[m] = M
    (r,) = run_graph(ctx, [out], inputs)
    assert r.shape == (B, NQ, H, Dv)
    ref = _fa_ref(Q, K, V, M, float(np.float32(scale)), max_bias, float(np.float32(softcap)))
    np.testing.assert_allclose(r, ref, rtol=1e-4, atol=1e-5)
    if M is not None:
        assert np.all(r[:, 2] == 0)


@pytest.mark.parametrize("kv_t", [Type.F32, Type.F16])
def test_flash_attn_ext_chunks_skip_hidden_cells(kv_t, monkeypatch):
    """Query chunks of 2 rows (FA_CHUNK_ELEMS made tiny) over a causal mask whose last cells
    are hidden from every row, one chunk fully masked: the result is the float64 softmax over
    the visible cells; NaN in cells no row sees does not reach the output (ggml skips -inf)."""
    monkeypatch.setattr(attention, "FA_CHUNK_ELEMS", 2 * 2 * 16)
    D, H, NQ, NKV = 8, 2, 9, 16
    rng = np.random.default_rng(7)
    ctx = Context()
    q = ctx.new_tensor(Type.F32, (D, NQ, H, 1))
    k = ctx.new_tensor(kv_t, (D, NKV, 1, 1))
    v = ctx.new_tensor(kv_t, (D, NKV, 1, 1))
    m = ctx.new_tensor(Type.F32, (NKV, NQ, 1, 1))
    out = ops.flash_attn_ext(ctx, q, k, v, m, 0.5, 0.0, 0.0)
    Q = uniform(rng, q.ne[::-1])
    K = uniform(rng, k.ne[::-1], dtype=kv_t.dtype)
    V = uniform(rng, v.ne[::-1], dtype=kv_t.dtype)
    cells = np.arange(NKV)[None, :]
    pos = np.arange(NQ)[:, None] + 2
    M = np.where(cells <= pos, 0.0, -np.inf).astype(np.float32)[None, None]
    M[..., 4:6, :] = -np.inf                         # rows 4, 5: the third chunk, fully masked
    V[..., 12:, :] = np.nan                          # cells 12.. are hidden from every row
    (r,) = run_graph(ctx, [out], {q: Q, k: K, v: V, m: M})
    Vref = V.copy()
    Vref[..., 12:, :] = 0
    ref = _fa_ref(Q, K, Vref, M, 0.5, 0.0, 0.0)
    np.testing.assert_allclose(r, ref, rtol=1e-4, atol=1e-5)
    assert np.all(r[:, 4:6] == 0)


@pytest.mark.parametrize("kv_t", [Type.F32, Type.F16])
@pytest.mark.parametrize("NQ", [1, 5])
def test_flash_attn_ext_reads_only_cells_some_row_sees(kv_t, NQ, monkeypatch):
    """A KV cache's view (cells before and after the used ones hidden from every row, NaN in
    K and V there): only the visible cells are converted and read, and the result is bit for
    bit the same graph over those cells alone; every row hidden: zeros."""
    D, H, NKV, lo, hi = 16, 4, 40, 7, 29
    rng = np.random.default_rng(NQ)

    def fa(Q, K, V, M):
        ctx = Context()
        q = ctx.new_tensor(Type.F32, (D, NQ, H, 1))
        k = ctx.new_tensor(kv_t, (D, K.shape[2], 1, 1))
        v = ctx.new_tensor(kv_t, (D, K.shape[2], 1, 1))
        m = ctx.new_tensor(Type.F32, (K.shape[2], NQ, 1, 1))
        out = ops.flash_attn_ext(ctx, q, k, v, m, 0.25, 0.0, 0.0)
        return run_graph(ctx, [out], {q: Q, k: K, v: V, m: M})[0]

    Q = uniform(rng, (1, H, NQ, D))
    K = uniform(rng, (1, 1, NKV, D), dtype=kv_t.dtype)
    V = uniform(rng, (1, 1, NKV, D), dtype=kv_t.dtype)
    M = np.full((1, 1, NQ, NKV), -np.inf, np.float32)
    M[..., lo:hi] = 0.0
    M[..., 0, hi - 3:hi] = -np.inf                   # (rows see different cells)
    K[..., :lo, :] = np.nan
    V[..., hi:, :] = np.nan
    seen = []
    pick = attention._kv_f32

    def recording(dtype):
        conv = pick(dtype)
        return lambda x: (seen.append(x.shape), conv(x))[1]
    monkeypatch.setattr(attention, "_kv_f32", recording)
    got = fa(Q, K, V, M)
    width = hi - lo - (3 if NQ == 1 else 0)         # the cells some row sees
    assert (1, 1, 1, width, D) in seen and not any(D in sh and NKV in sh for sh in seen)
    want = fa(Q, np.ascontiguousarray(K[..., lo:hi, :]), np.ascontiguousarray(V[..., lo:hi, :]),
              np.ascontiguousarray(M[..., lo:hi]))
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, want)
    assert np.all(fa(Q, K, V, np.full_like(M, -np.inf)) == 0)


# ---------------------------------------------------------------------------------------------
# SOFT_MAX flushes results below float32's smallest normal number on every path (mask type,
# GGMLPY_JIT, ALiBi): the compiled kernel always did, the NumPy paths (an F16 mask, GGMLPY_JIT=0,
# ALiBi) did not, so one op's result depended on the mask's dtype.

_F32_TINY = float(np.finfo(np.float32).tiny)
# logit offsets per row position: 0, -1, -5 and -60 give normal probabilities, -90 .. -100 give
# float32 subnormals before the flush (exp(-90) = 8e-40 < 1.18e-38), none near the threshold
_OFFSETS = np.array([0, -1, -5, -60, -90, -92, -95, -100] * 2, dtype=np.float32)


def _flushed_softmax_ref(A, M, scale, max_bias):
    ref = _softmax_ref(A, M, scale, max_bias)
    ref[ref < _F32_TINY] = 0.0
    return ref


@pytest.mark.parametrize("jit", ["1", "0"], ids=["jit", "nojit"])
@pytest.mark.parametrize("mask_t,scale,max_bias", [
    pytest.param(mt, sc, mb, id=f"{mt.name if mt is not None else 'nomask'}-scale{sc}-bias{mb}")
    for mt in (None, Type.F32, Type.F16) for sc, mb in ((1.0, 0.0), (0.5, 0.0), (1.0, 1.0))
    if mt is not None or mb == 0.0])  # ggml's soft_max_ext requires a mask with ALiBi
def test_soft_max_flushes_subnormal_results_on_every_path(jit, mask_t, scale, max_bias,
                                                           monkeypatch):
    """Table over mask type {none, F32, F16} x GGMLPY_JIT {1, 0} x ALiBi off/on against a
    float64 reference with the flush applied (atol 0: an unflushed subnormal fails). Without
    ALiBi the logits are exact in float32 (integer offsets, masks in steps of 1/8, power-of-two
    scales); ALiBi's float32 slopes move a logit by < 2e-7, so the normal probabilities
    (logits >= -61) keep ``rtol=1e-5`` (the tolerance of the module docstring) and the
    subnormal ones (logits <= -89, ln of float32's smallest normal is -87.3) stay below it."""
    if jit == "1":
        pytest.importorskip("numba")
    monkeypatch.setenv("GGMLPY_JIT", jit)
    rng = np.random.default_rng(7)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (16, 6, 4, 2))
    mask = ctx.new_tensor(mask_t, (16, 8, 2, 1)) if mask_t is not None else None
    out = ops.soft_max_ext(ctx, a, mask, scale, max_bias)
    A = np.broadcast_to(_OFFSETS / np.float32(scale), a.ne[::-1]).astype(np.float32)
    A = A + rng.integers(-8, 9, size=A.shape).astype(np.float32) / 8
    inputs = {a: A}
    M = None
    if mask is not None:
        M = (rng.integers(-8, 9, size=mask.ne[::-1]) / 8).astype(mask_t.dtype)
        inputs[mask] = M
    (r,) = run_graph(ctx, [out], inputs)
    ref = _flushed_softmax_ref(A, M, scale, max_bias)
    assert (ref == 0).sum() >= A.size // 4 and (ref > 0).all(axis=-1).sum() == 0  # flushes
    assert ((ref > 0) & (ref < 1e-20)).any()                  # small normals kept
    np.testing.assert_allclose(r, ref, rtol=1e-5, atol=0)
    assert not ((r > 0) & (r < _F32_TINY)).any()


@pytest.mark.parametrize("jit", ["1", "0"])
def test_soft_max_f16_mask_same_result_as_f32_mask(jit, monkeypatch):
    """An F16 mask holding the same values as an F32 one gives the bit-identical result (the
    same kernel runs: with Numba the F16 mask is converted and the compiled kernel used)."""
    if jit == "1":
        pytest.importorskip("numba")
    monkeypatch.setenv("GGMLPY_JIT", jit)
    rng = np.random.default_rng(11)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (24, 5, 3, 2))
    m16 = ctx.new_tensor(Type.F16, (24, 7, 3, 1))
    m32 = ctx.new_tensor(Type.F32, (24, 7, 3, 1))
    o16 = ops.soft_max_ext(ctx, a, m16, 0.125, 0.0)
    o32 = ops.soft_max_ext(ctx, a, m32, 0.125, 0.0)
    A = uniform(rng, a.ne[::-1], -400, 400)
    M = uniform(rng, m16.ne[::-1], -30, 30, dtype=np.float16)
    M[..., 1, :5] = -np.inf
    r16, r32 = run_graph(ctx, [o16, o32], {a: A, m16: M, m32: M.astype(np.float32)})
    np.testing.assert_array_equal(r16, r32)
    ref = _flushed_softmax_ref(A, M, 0.125, 0.0)
    np.testing.assert_allclose(r16, ref, rtol=1e-5, atol=0)
