"""The compiled dot kernels' summation shape, bit for bit.

* Block types: ggml-cpu's own x86 SIMD ``vec_dot`` results (tests/data/ggml_q8_reference.npz,
  written by scripts/make_quant_reference.py through ggml-python 0.0.45 on an AVX512 CPU: the
  ``ggml_vec_dot_*`` loops of ggml-cpu/arch/x86/quants.c) on the blob's weight and activation
  blocks, extreme rows included. The kernels' integer lanes, float32 lanes and final trees are
  those loops', so every output (NaN and inf included) has ggml's bits.
* F16/BF16: a NumPy model of :func:`ggmlpy.backends.cpu.qmatmul_ir.row_h16` and
  ``half_dot`` (4 x 16 float32 lanes over steps of 64 elements, ggml's reduction order, the
  tail in float64). The products of two F16 (or two BF16) values are exact in float32, so each
  fused multiply-add equals a float32 add of the product, which NumPy can do.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ggmlpy.backends.cpu import qmatmul as dk
from ggmlpy.core.types import Type
from ggmlpy.quants import quantize, vec_dot

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "ggml_q8_reference.npz")
BLOCKS = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K"]

pytestmark = pytest.mark.skipif(not dk.jit_available(), reason="numba not installed")


@pytest.mark.parametrize("name", BLOCKS)
def test_block_kernels_have_ggml_simd_bits(name):
    ref = np.load(DATA)
    t = Type[name.upper()]
    w, y, want = ref["w_" + name], ref["y_" + name], ref["dot_" + name]
    N = y.shape[0]
    act = dk._alloc_act(vec_dot.VEC_DOT_TYPE[t], N, 512)
    dk._from_bytes(act, y, 0, N)
    out = np.full((N, w.shape[0]), np.nan, np.float32)
    with np.errstate(all="ignore"):
        for part in dk.mul_mat_parts(t, w, act, out, 1):
            part()
    np.testing.assert_array_equal(out, want)
    assert np.isfinite(want).sum() > 0.6 * want.size and not np.isfinite(want).all()


def _half_model(w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float32 (N, M): ``half_dot``'s sums of the float32 products ``w[m] * y[n]`` (exact)."""
    f32 = np.float32
    M, K = w.shape
    K64 = K - K % 64
    out = np.empty((y.shape[0], M), f32)
    for n in range(y.shape[0]):
        p = (w * y[n]).astype(f32)
        acc = np.zeros((M, 4, 16), f32)
        for s in range(K64 // 64):
            acc = acc + p[:, 64 * s:64 * s + 64].reshape(M, 4, 16)
        a0 = (acc[:, 0] + acc[:, 2]) + (acc[:, 1] + acc[:, 3])
        for h in (8, 4, 2, 1):
            a0 = a0[:, :h] + a0[:, h:2 * h]
        s64 = a0[:, 0].astype(np.float64)
        for k in range(K64, K):
            s64 = s64 + p[:, k].astype(np.float64)
        out[n] = s64.astype(f32)
    return out


@pytest.mark.parametrize("t", [Type.F16, Type.BF16])
@pytest.mark.parametrize("K", [64, 200, 640, 1000])
def test_half_kernel_is_the_lane_model(t, K):
    rng = np.random.default_rng(K + (t == Type.BF16))
    M, N = 9, 3
    wx = rng.standard_normal((M, K)).astype(np.float32)
    wx[0] *= 1e3  # rows of other magnitudes (F16 stays finite)
    wx[1] *= 1e-3
    x = rng.standard_normal((N, K)).astype(np.float32)
    x[1] *= 50.0
    w = quantize(wx, t).reshape(M, -1).view(np.uint16)
    act = dk.quantize_act(vec_dot.VEC_DOT_TYPE[t], x)
    wv = vec_dot.unpack_weight(t, w.view(np.uint8))["v"].astype(np.float32)
    out = np.empty((N, M), np.float32)
    for part in dk.mul_mat_parts(t, w, act, out, 2):
        part()
    want = _half_model(wv, act.q)
    np.testing.assert_array_equal(out, want)
    exact = act.q.astype(np.float64) @ wv.astype(np.float64).T
    assert not np.array_equal(out, exact.astype(np.float32))  # float32 lanes, not float64 sums


def test_q8_k_quantizer_picks_ggml_scale_value():
    """Q8_K's scale is -127 over the signed value where ggml's sequential ``ax > amax`` scan
    stopped: with +-v ties the first one. The compiled quantizer finds amax in 8-lane passes and
    then that value; its bytes equal :func:`ggmlpy.quants.q8.quantize_row_q8_K` on blocks with
    ties of either sign order, all -0.0, a NaN, an inf, and for rows that are not contiguous."""
    from ggmlpy.quants import q8

    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 2048)).astype(np.float32)
    x[0, 700], x[0, 710] = -9.0, 9.0           # tie, negative first
    x[0, 300], x[0, 301] = 8.0, -8.0           # tie, positive first
    x[0, 1024:1280] = -0.0
    x[1, 5] = np.nan
    x[2, 300] = np.inf
    x[2, 1800] = 1e30                          # a block far above the others
    for xs in (x, np.asfortranarray(x)):
        act = dk._alloc_act("q8_K", 3, 2048)
        dk._jit().quant_q8_k(xs, act.q, act.d, act.x)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(dk.act_bytes(act), q8.quantize_row_q8_K(x))
    assert act.d[0, 1] == np.float32(-8 / 127) and act.d[0, 2] == np.float32(9 / 127)  # first signs


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
@pytest.mark.parametrize("N", [1, 3, 4, 5, 8, 11])
@pytest.mark.parametrize("zmm", [False, True])
def test_legacy_tiles_give_every_output_the_one_row_bits(name, N, zmm):
    """The legacy kernel's tiles (with ``zmm``: 8 x 4 or 4 x 4 in 512-bit registers first; then
    4 weight x 4 activation rows, 1 x 4, 2 x 1 and 1 x 1 for the rows left over) compute each
    output with the same operations: the whole product over any weight-row range (remainders of
    0..7 in both directions) equals, bit for bit, the product computed one activation row at a
    time over one weight row at a time (the 1 x 1 row dot that the ggml reference test above
    pins to ggml-cpu's ``vec_dot`` bits)."""
    from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM

    if zmm and not ZMM:
        pytest.skip("this CPU has no AVX512-VNNI (the 512-bit tiles are not compiled)")
    t = Type[name.upper()]
    rng = np.random.default_rng(N)
    K, M = 320, 29
    w = np.frombuffer(quantize(rng.standard_normal((M, K)).astype(np.float32), t),
                      np.uint8).reshape(M, -1)
    x = rng.standard_normal((N, K)).astype(np.float32)
    x[0, :32] *= 1e3                                   # one block far above the others
    kind = vec_dot.VEC_DOT_TYPE[t]
    act = dk.quantize_act(kind, x)
    k = dk._jit()
    tbl = dk._f16_table()
    ys = act.x if kind == "q8_1" else act.d
    code = dk._LEGACY[t]
    for m0, m1 in [(0, M), (1, M), (2, 27), (3, 26), (0, 4), (0, 8), (5, 22), (1, 16)]:
        out = np.full((N, M), np.nan, np.float32)
        k.legacy_lanes(w, act.q, act.d, ys, out, m0, m1, 0, code + (k.ZMM_FLAG if zmm else 0),
                       tbl)
        one = np.full((N, M), np.nan, np.float32)
        for n in range(N):
            for m in range(m0, m1):
                k.legacy_lanes(w, act.q[n:n + 1], act.d[n:n + 1], ys[n:n + 1],
                               one[n:n + 1], m, m + 1, 0, code, tbl)
        np.testing.assert_array_equal(out[:, m0:m1], one[:, m0:m1])
        assert np.isnan(out[:, :m0]).all() and np.isnan(out[:, m1:]).all()
        # an output whose rows are strided (every other column of a wider array): the tiles
        # store element by element there
        wide = np.full((N, 2 * M), np.nan, np.float32)
        k.legacy_lanes(w, act.q, act.d, ys, wide[:, ::2], m0, m1, 0,
                       code + (k.ZMM_FLAG if zmm else 0), tbl)
        np.testing.assert_array_equal(wide[:, ::2][:, m0:m1], one[:, m0:m1])
        assert np.isnan(wide[:, 1::2]).all()


def test_zmm_flag_follows_the_host_and_the_variable(monkeypatch):
    """``GGMLPY_CPU_ZMM`` (default 1) turns the 512-bit tiles on where the CPU has them and off
    everywhere when 0; a malformed value raises at once."""
    from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM
    from ggmlpy.core.env import EnvError

    k = dk._jit()
    monkeypatch.delenv("GGMLPY_CPU_ZMM", raising=False)
    assert dk._legacy_code(k, Type.Q5_0) == 2 + (k.ZMM_FLAG if ZMM else 0)
    monkeypatch.setenv("GGMLPY_CPU_ZMM", "0")
    assert dk._legacy_code(k, Type.Q8_0) == 4
    monkeypatch.setenv("GGMLPY_CPU_ZMM", "yes")
    with pytest.raises(EnvError, match="GGMLPY_CPU_ZMM"):
        dk._legacy_code(k, Type.Q4_0)


@pytest.mark.parametrize("form", ["x86", "ref", "arm"])
@pytest.mark.parametrize("kind", ["q8_0", "q8_1"])
def test_compiled_activation_quantizer_has_each_forms_bits(form, kind):
    """The compiled Q8_0/Q8_1 quantizer (the x86 form in vector code where the rows are
    contiguous, the scalar loop otherwise) gives :func:`ggmlpy.quants.q8_arch.quantize_row_q8`'s
    bytes (ggml-cpu's own for x86, tests/quants/test_q8_arch.py) on the x86 edge-case blob
    (ties, 127/amax scales, 1/amax overflow, zero blocks) and on random rows with NaN, inf,
    huge, tiny and all-zero blocks, for C-contiguous and strided activations."""
    from ggmlpy.quants import q8_arch

    blob = np.load(os.path.join(os.path.dirname(__file__), "..", "..", "data",
                                "ggml_q8_x86_reference.npz"))["x"].astype(np.float32)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((12, 256)).astype(np.float32)
    x[0, 3], x[1, 40], x[2, 70] = np.nan, np.inf, -np.inf
    x[3, :32] = 0.0
    x[4, 32:64] *= 1e-40                    # subnormal block
    x[5, 64:96] *= 3e38 / np.abs(x[5, 64:96]).max()
    x[6, 100] = 1e30
    x[7, :] = np.round(x[7, :] * 4) / 4     # many exact ties after scaling
    for rows in (blob, x):
        with np.errstate(all="ignore"):  # (the f16 casts of the huge blocks' scales overflow)
            want = q8_arch.quantize_row_q8(kind, rows, form)
        for xs in (rows, np.repeat(rows, 2, axis=1)[:, ::2]):   # contiguous, strided
            assert xs.strides[1] == (4 if xs is rows else 8)
            act = dk._alloc_act(kind, rows.shape[0], rows.shape[1])
            with np.errstate(all="ignore"):
                dk._quant_rows(act, xs, 0, rows.shape[0], True, form)
                np.testing.assert_array_equal(dk.act_bytes(act), want)


@pytest.mark.parametrize("bf", [False, True])
def test_512_bit_half_rows_have_the_256_bit_bits(bf):
    """row_h16z (one 512-bit register per 16-lane accumulator) against row_h16 (pairs of 8-lane
    vectors): the same lanes and operations, the same bits, on rows of 1..39 steps with values
    of every magnitude."""
    from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM

    if not ZMM:
        pytest.skip("row_h16z needs AVX512-F/BW/VNNI")
    from numba import njit

    from ggmlpy.backends.cpu.qmatmul_ir import row_h16, row_h16z

    both = njit(lambda w, y, f: (row_h16(w, y, w.shape[0] // 64, f),
                                 row_h16z(w, y, w.shape[0] // 64, f)))
    rng = np.random.default_rng(int(bf))
    for _ in range(300):
        K = 64 * int(rng.integers(1, 40))
        wf = (rng.standard_normal(K) * np.exp(rng.uniform(-8, 8, K))).astype(np.float32)
        yf = rng.standard_normal(K).astype(np.float32)
        if bf:
            w = (wf.view(np.uint32) >> 16).astype(np.uint16)
            y = ((yf.view(np.uint32) >> 16) << 16).view(np.float32)
        else:
            w = wf.astype(np.float16).view(np.uint16)
            y = yf.astype(np.float16).astype(np.float32)
        a, b = both(w, y, bf)
        assert np.float32(a).view(np.uint32) == np.float32(b).view(np.uint32)
