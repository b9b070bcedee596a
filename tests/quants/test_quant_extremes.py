"""Quantizers on extreme inputs (huge, tiny, subnormal, zeros, -0.0, mixed sign, float32 max) and
the range/validity checks: the block kernels are bit-exact with ggml's C reference
(tests/data/ggml_quant_extreme.npz), and ``quantize`` refuses exactly the blocks that would not
decode to what was given (ggml's ``ggml_validate_row_data`` on the output, plus the magnitude
bound)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggmlpy import Type
from ggmlpy.quants import dequantize, kquants, quantize
from ggmlpy.quants.legacy import gguf_dequantize_blocks, gguf_quantize_blocks
from ggmlpy.quants.validate import MAX_DECODABLE, first_invalid_block

pytest.importorskip("gguf")

EXTREME = Path(__file__).resolve().parents[1] / "data" / "ggml_quant_extreme.npz"
BLOCK_TYPES = [Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K,
               Type.Q6_K]
_OWN = {Type.Q4_K: kquants.quantize_q4_k, Type.Q5_K: kquants.quantize_q5_k,
        Type.Q6_K: kquants.quantize_q6_k}
SEG = 256


@pytest.fixture(scope="module")
def ext():
    return np.load(EXTREME)


def _kernel(t: Type, x: np.ndarray) -> np.ndarray:
    """The block kernel alone (no range/validity refusal), as ggml's quantize_row_*_ref."""
    blocks = x.reshape(-1, t.blck_size)
    with np.errstate(all="ignore"):
        q = _OWN[t](blocks) if t in _OWN else gguf_quantize_blocks(blocks, t)
    return np.asarray(q, np.uint8).reshape(-1)


def _segments(ext, t):
    x = ext["x"]
    want = ext[f"{t.type_name.lower()}_bytes"].reshape(-1, t.type_size)
    per = SEG // t.blck_size
    for k, name in enumerate(ext["names"]):
        yield str(name), x[k * SEG:(k + 1) * SEG], want[k * per:(k + 1) * per].reshape(-1)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.type_name)
def test_kernels_bit_exact_with_ggml_on_extremes(ext, t):
    """Every extreme class, every type: the kernels give ggml's bytes (per segment, so a failure
    names the class)."""
    wrong = [name for name, x, want in _segments(ext, t) if not np.array_equal(_kernel(t, x), want)]
    assert wrong == []


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.type_name)
def test_dequantize_matches_ggml_on_extreme_bytes(ext, t):
    b = ext[f"{t.type_name.lower()}_bytes"]
    want = ext[f"{t.type_name.lower()}_deq"]
    with np.errstate(all="ignore"):
        got = gguf_dequantize_blocks(b.reshape(-1, t.type_size), t).reshape(-1)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_q6_k_huge_values_regression():
    """Values of 1e18 overflow Q6_K's group sums so every group's scale is NaN: ggml's scan
    ``abs_scale > max_abs_scale`` skips NaN and writes the all-zero block, where an argmax takes
    NaN as the largest and the block decoded to 256 NaN. The kernel matches ggml; quantize
    refuses, since neither block is the input. (1e15 makes ggml's d overflow to +inf instead.)"""
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32) * np.float32(1e18)
    assert np.array_equal(_kernel(Type.Q6_K, x), np.zeros(210, np.uint8))
    x15 = np.full(256, 1e15, np.float32)
    q = _kernel(Type.Q6_K, x15)
    assert q[208:].view(np.float16)[0] == np.inf  # decodes to inf * 0 = NaN
    for v in (x, x15):
        with pytest.raises(ValueError, match=r"block 0 of row 0 .* q6_K block holds is 2\.68"):
            quantize(v, Type.Q6_K)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.type_name)
def test_quantize_refuses_exactly_what_would_not_decode(ext, t):
    """Table over the extreme classes: quantize gives ggml's bytes where ggml's output passes its
    own validation and every |x| is within MAX_DECODABLE, and raises otherwise."""
    n_ok = n_refused = 0
    for name, x, want in _segments(ext, t):
        blocks = x.reshape(-1, t.blck_size)
        valid = first_invalid_block(t, want) is None
        fits = bool((np.abs(blocks).max(axis=1) <= MAX_DECODABLE[t]).all())
        if valid and fits:
            assert np.array_equal(quantize(x, t).reshape(-1), want), name
            out = dequantize(want, t, [SEG])
            assert np.isfinite(out).all(), name
            n_ok += 1
        else:
            with pytest.raises(ValueError, match=rf"cannot be stored as {t.type_name}"):
                quantize(x, t)
            n_refused += 1
    assert n_ok >= 15 and n_refused >= 10  # the table covers both sides for every type


@pytest.mark.parametrize(("t", "value"), [(Type.Q4_0, 1e6), (Type.Q5_0, 2e6), (Type.Q8_0, 1e7),
                                          (Type.Q4_1, 2e6), (Type.Q5_1, 4e6), (Type.Q4_K, 1e9),
                                          (Type.Q5_K, 1e9), (Type.Q6_K, 1e9)])
def test_scale_overflow_refused_naming_the_block(t, value):
    """A finite value that overflows a block's f16 scale: ggml stores d = inf silently."""
    x = np.ones((3, 2 * t.blck_size), np.float32)
    x[2, t.blck_size + 1] = value
    q = _kernel(t, x)
    assert not np.isfinite(dequantize(q, t, [2 * t.blck_size, 3])).all()  # what ggml would store
    with pytest.raises(ValueError, match=r"block 1 of row 2 \(flat block 5, largest \|x\| = "):
        quantize(x, t)


@pytest.mark.parametrize("t", BLOCK_TYPES, ids=lambda t: t.type_name)
def test_largest_holdable_values_pass(t):
    """Just inside the bound set by the f16 scale: stored, decoded finite and close."""
    lim = {Type.Q4_0: 5.2e5, Type.Q5_0: 1.04e6, Type.Q8_0: 8.3e6, Type.Q4_1: 9.8e5,
           Type.Q5_1: 2.0e6, Type.Q4_K: 6.1e7, Type.Q5_K: 1.2e8, Type.Q6_K: 2.6e8}[t]
    x = np.linspace(-1, 1, 2 * t.blck_size, dtype=np.float32) * np.float32(lim)
    if t in (Type.Q4_1, Type.Q5_1, Type.Q4_K, Type.Q5_K):
        x = np.abs(x)  # min/dmin are f16 too: keep the offset 0
    d = dequantize(quantize(x, t), t, [x.size])
    assert np.isfinite(d).all()
    assert np.max(np.abs(d - x)) <= 0.1 * lim


def _validate_scalar(t: Type, raw: np.ndarray) -> int | None:
    """Scalar transcription of ggml_validate_row_data's block loop (VALIDATE_ROW_DATA_D_F16_IMPL /
    _DM_F16_IMPL: every listed f16 field must be neither inf nor NaN)."""
    offs = {Type.Q6_K: (208,), Type.Q4_1: (0, 2), Type.Q5_1: (0, 2), Type.Q4_K: (0, 2),
            Type.Q5_K: (0, 2)}.get(t, (0,))
    for i in range(raw.size // t.type_size):
        for off in offs:
            v = raw[i * t.type_size + off:i * t.type_size + off + 2].view(np.float16)[0]
            if not np.isfinite(v):
                return i
    return None


@pytest.mark.parametrize("t", BLOCK_TYPES + [Type.F32, Type.F16, Type.BF16, Type.F64],
                         ids=lambda t: t.type_name)
def test_validator_matches_ggml_rule(t):
    rng = np.random.default_rng(int(t))
    for trial in range(40):
        nb = int(rng.integers(1, 50))
        raw = rng.integers(0, 256, nb * t.type_size, dtype=np.uint8)
        if trial % 3 == 0 and t.blck_size > 1:  # mostly valid: clear the exponent's top bit
            blocks = raw.reshape(nb, t.type_size)
            offs = (208,) if t == Type.Q6_K else (0, 2)
            for off in offs:
                blocks[:, off + 1] &= 0x3F
        if t.blck_size > 1:
            want = _validate_scalar(t, raw)
        else:
            if t == Type.BF16:
                vals = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                vals = raw.view(t.dtype)
            bad = np.nonzero(~np.isfinite(vals))[0]
            want = int(bad[0]) if bad.size else None
        assert first_invalid_block(t, raw) == want
        assert first_invalid_block(t, raw.tobytes()) == want


def test_validator_errors():
    with pytest.raises(ValueError, match="not a whole number of q8_0 blocks"):
        first_invalid_block(Type.Q8_0, bytes(35))
    with pytest.raises(TypeError, match="bytes-like or a NumPy array"):
        first_invalid_block(Type.Q8_0, [0] * 34)
    assert first_invalid_block(Type.I32, bytes(8)) is None
