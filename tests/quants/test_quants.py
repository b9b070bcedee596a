"""ggml's types and quantizers: bit-exact against vectors from ggml's C reference, round trips,
randomized (hypothesis) properties and argument errors."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers import BLOCK_TYPES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ggmlpy
from ggmlpy import Type
from ggmlpy.quants import QUANTIZABLE, dequantize, quantize

gguf = pytest.importorskip("gguf")

VECTORS = Path(__file__).resolve().parents[1] / "data" / "ggml_quant_vectors.npz"


@pytest.fixture(scope="module")
def vec():
    return np.load(VECTORS)


# ---------------------------------------------------------------- types


def test_type_table_matches_gguf_constants():
    # an independent source: gguf-py's ids and (block size, type size) table
    for t in Type:
        g = gguf.GGMLQuantizationType(int(t))
        assert g.name == t.name
        assert gguf.GGML_QUANT_SIZES[g] == (t.blck_size, t.type_size), t.name


def test_type_traits_and_names():
    assert Type.BF16.dtype == np.dtype(ml_dtypes.bfloat16)
    assert ggmlpy.type_from_dtype(ml_dtypes.bfloat16) == Type.BF16
    assert [int(t) for t in (Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q4_K, Type.Q5_K, Type.Q6_K)] == \
        [3, 6, 7, 12, 13, 14]
    assert Type.Q4_K.is_quantized and Type.Q4_K.row_size(512) == 288
    assert Type.Q6_K.type_name == "q6_K"
    for t in Type:
        assert ggmlpy.type_from_name(t.type_name.upper()) == t
        if t.is_quantized:  # block types have no per-element dtype
            with pytest.raises(TypeError):
                _ = t.dtype
        else:  # every plain type is found from its storage dtype
            assert ggmlpy.type_from_dtype(t.dtype) == t
    for dt in (np.uint8, np.uint16, np.complex64, np.bool_):
        with pytest.raises(TypeError, match="no ggml type for NumPy dtype"):
            ggmlpy.type_from_dtype(dt)
    with pytest.raises(ValueError, match="unknown ggml type name 'q3_k'"):
        ggmlpy.type_from_name("q3_k")
    with pytest.raises(TypeError, match="block-quantized"):
        _ = Type.Q5_K.dtype


# ---------------------------------------------------------------- bit-exact vs ggml's C code


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.type_name)
def test_quantize_bit_exact_with_ggml(vec, t):
    x = vec["x"]
    want = vec[f"{t.type_name.lower()}_bytes"]
    # as one row and as 16 rows of 256: the result does not depend on the row split
    assert np.array_equal(quantize(x, t).reshape(-1), want)
    assert np.array_equal(quantize(x.reshape(16, 256), t).reshape(-1), want)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.type_name)
def test_dequantize_bit_exact_with_ggml(vec, t):
    b = vec[f"{t.type_name.lower()}_bytes"]
    want = vec[f"{t.type_name.lower()}_deq"]
    got = dequantize(b, t, [256, 16])
    assert got.shape == (16, 256) and got.dtype == np.float32
    assert np.array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))
    assert np.array_equal(dequantize(b.tobytes(), t, [4096]).view(np.uint32), want.view(np.uint32))


def test_f16_bf16_conversion_bit_exact_with_ggml(vec):
    x = vec["conv_x"]
    assert np.array_equal(quantize(x, Type.F16).view(np.uint16), vec["f16_bits"])
    assert np.array_equal(quantize(x, Type.BF16).view(np.uint16), vec["bf16_bits"])
    # decoding: bf16 is the top half of a float32, f16 widens exactly
    bf = dequantize(vec["bf16_bits"], Type.BF16, [x.size])
    assert np.array_equal(bf.view(np.uint32), vec["bf16_bits"].astype(np.uint32) << 16)
    fin = np.isfinite(x) & (np.abs(x) < 60000)
    h = dequantize(vec["f16_bits"], Type.F16, [x.size])
    assert np.array_equal(h[fin], x[fin].astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("shape", [(32, 1), (32, 7), (32, 8), (16, 16), (32, 1000), (16, 4099)])
def test_seqsum_is_sequential(shape):
    # the K-quant quantizers are bit-exact only if sums run in C's loop order
    from ggmlpy.quants._common import seqsum

    rng = np.random.default_rng(shape[1])
    a = (rng.standard_normal(shape) * np.exp(rng.uniform(-12, 12, shape))).astype(np.float32)
    want = a[0].copy()
    for i in range(1, shape[0]):
        want = want + a[i]
    assert np.array_equal(seqsum(a).view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------- round trips


# relative RMS error of a standard-normal row after a round trip: upper bounds with ~30% margin
# over what ggml's own quantizers give on such data (q4_0 ~0.10, q8_0 ~0.004, q6_K ~0.018)
_RMSE_BOUND = {Type.Q4_0: 0.13, Type.Q4_1: 0.11, Type.Q5_0: 0.065, Type.Q5_1: 0.055,
               Type.Q8_0: 0.006, Type.Q4_K: 0.12, Type.Q5_K: 0.06, Type.Q6_K: 0.03,
               Type.F16: 5e-4, Type.BF16: 4e-3, Type.F32: 0.0, Type.F64: 0.0}


@pytest.mark.parametrize("t", sorted(QUANTIZABLE), ids=lambda t: t.type_name)
def test_round_trip_per_type(t):
    rng = np.random.default_rng(int(t))
    x = rng.standard_normal((3, 2, 512)).astype(np.float32)
    b = quantize(x, t)
    assert b.dtype == np.uint8 and b.shape == (3, 2, t.row_size(512))
    y = dequantize(b, t, [512, 2, 3])
    assert y.shape == x.shape and y.dtype == np.float32
    rel = np.sqrt(np.mean((y.astype(np.float64) - x) ** 2) / np.mean(x.astype(np.float64) ** 2))
    assert rel <= _RMSE_BOUND[t], (t.type_name, rel)
    if t in (Type.F32, Type.F64):
        assert np.array_equal(y, x)
    # quantizing the decoded values again reproduces the decoded values for the plain types
    if not t.is_quantized:
        assert np.array_equal(dequantize(quantize(y, t), t, [512, 2, 3]), y)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.type_name)
def test_edge_rows(t):
    n = 512
    zeros = dequantize(quantize(np.zeros(n, np.float32), t), t, [n])
    assert np.array_equal(zeros, np.zeros(n, np.float32))
    # rtol 2e-3: the f16 block scale; 5e-2 at 1e-3 because the K-quants' super-block scale
    # (max sub-scale / 63, ~1.6e-6 here) is an f16 subnormal there, with only ~5 significant bits
    for c, rtol in ((0.5, 2e-3), (-3.0, 2e-3), (2000.0, 2e-3), (1e-3, 5e-2)):
        y = dequantize(quantize(np.full(n, c, np.float32), t), t, [n])
        np.testing.assert_allclose(y, c, rtol=rtol, err_msg=f"{t.type_name} constant {c}")
    # far below f16's range: the block scale underflows to 0 and ggml decodes zeros
    tiny = dequantize(quantize(np.full(n, 1e-30, np.float32), t), t, [n])
    assert np.all(np.isfinite(tiny)) and np.all(np.abs(tiny) <= 1e-30)


# largest |error| per block as a fraction of the block's max |x| (4-bit: one step of ~max/8,
# 5-bit ~max/16, 8-bit ~max/127; K-quants add the 6-bit sub-scale rounding)
_MAX_ERR = {Type.Q4_0: 0.135, Type.Q4_1: 0.135, Type.Q5_0: 0.07, Type.Q5_1: 0.07,
            Type.Q8_0: 0.0085, Type.Q4_K: 0.30, Type.Q5_K: 0.16, Type.Q6_K: 0.08}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), t=st.sampled_from(BLOCK_TYPES))
def test_random_rows_error_bounded(data, t):
    nblk = data.draw(st.integers(1, 3))
    scale = data.draw(st.sampled_from([1e-3, 1.0, 1e3]))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(nblk * t.blck_size) * scale).astype(np.float32)
    # sprinkle exact zeros, repeated values and an outlier
    x[rng.random(x.size) < 0.1] = 0.0
    x[: t.blck_size // 4] = x[0]
    x[rng.integers(x.size)] *= data.draw(st.sampled_from([1.0, 10.0]))
    y = dequantize(quantize(x, t), t, [x.size])
    err = np.abs(y.astype(np.float64) - x).reshape(nblk, -1).max(1)
    amax = np.abs(x.astype(np.float64)).reshape(nblk, -1).max(1)
    assert np.all(err <= _MAX_ERR[t] * amax + 1e-30), (t.type_name, err / amax)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=32, max_size=32))
def test_q8_0_matches_formula(vals):
    # Q8_0 is simple enough to state: d = amax/127 (f16), q = round(x/d) with ggml's rounding
    x = np.array(vals, np.float32)
    b = quantize(x, Type.Q8_0)
    amax = np.abs(x).max()
    d = np.float32(amax) / np.float32(127)
    assert b[:2].view(np.float16)[0] == np.float16(d)
    idn = np.float32(1) / d if d else np.float32(0)
    assert np.array_equal(b[2:].view(np.int8), np.round(x * idn).astype(np.int8))


# ---------------------------------------------------------------- errors


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"ne\[0\] = 100 .* block size 32 of q8_0"):
        quantize(np.zeros((2, 100), np.float32), Type.Q8_0)
    with pytest.raises(ValueError, match=r"ne\[0\] = 32 .* block size 256 of q4_K"):
        dequantize(bytes(18), Type.Q4_K, [32])
    with pytest.raises(ValueError, match="288 bytes given, q4_K of ne = \\[256, 2\\] takes 288"
                       .replace("288 bytes given", "144 bytes given")):
        dequantize(bytes(144), Type.Q4_K, [256, 2])
    with pytest.raises(ValueError, match="i32 is not a float or block-quantized type"):
        quantize(np.zeros(4), Type.I32)
    with pytest.raises(TypeError, match="must be a ggmlpy.Type"):
        quantize(np.zeros(32), "q8_0")
    with pytest.raises(ValueError, match="at least one dimension"):
        quantize(np.float32(1.0), Type.F16)
    with pytest.raises(TypeError, match="ne must be a sequence of ints"):
        dequantize(bytes(34), Type.Q8_0, 32)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.type_name)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_refused_for_block_types(t, bad):
    x = np.ones(t.blck_size * 2, np.float32)
    x[t.blck_size + 3] = bad
    with pytest.raises(ValueError, match=rf"non-finite value .* index \({t.blck_size + 3},\)"):
        quantize(x, t)


def test_f16_bf16_keep_non_finite_as_ggml():
    x = np.array([np.nan, -np.inf, np.inf, 1e6], np.float32)
    h = dequantize(quantize(x, Type.F16), Type.F16, [4])
    assert np.isnan(h[0]) and h[1] == -np.inf and h[2] == np.inf and h[3] == np.inf
    b = dequantize(quantize(x, Type.BF16), Type.BF16, [4])
    assert np.isnan(b[0]) and b[1] == -np.inf and b[2] == np.inf and b[3] == np.float32(999424.0)


def test_quantize_f64_keeps_values_past_float32():
    """F64 is stored from the input itself: values outside float32's range (or finer than its
    precision) are kept, with no overflow warning from a float32 round trip."""
    x = np.array([[1e300, -2.5, 1 + 2**-40, 5e-324]])
    with np.errstate(all="raise"):
        b = quantize(x, Type.F64)
    np.testing.assert_array_equal(np.frombuffer(b.tobytes(), np.float64), x.ravel())
