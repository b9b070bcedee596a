"""ggml-cpu's per-architecture activation quantizers (:mod:`ggmlpy.quants.q8_arch`).

x86: bit for bit against ggml-cpu's own ``from_float`` of Q8_0/Q8_1/Q8_K on this x86-64 machine
(tests/data/ggml_q8_x86_reference.npz, written by scripts/make_q8_arch_reference.py through
ggml-python 0.0.45: ties, 127/amax vs 1/d scales, subnormals, 1/amax overflow, zero and -0 blocks,
+-inf and NaN in every 8-lane vector). aarch64 (no such machine here): against ggml's reference
quantizer's bytes (tests/data/ggml_q8_reference.npz, ggml's ``quantize_row_q8_0_ref``) on every
block without an exact tie or an overflowing ``1 / d``, where NEON's rounding cannot differ, and
against hand-derived bytes on ties, overflow and non-finite blocks (worked out from
ggml-cpu/arch/arm/quants.c: ``vcvtnq_s32_f32`` rounds to even and saturates, the int32 is stored
as its low byte, ``vmaxq_f32`` propagates NaN).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from ggmlpy.core import env
from ggmlpy.core.types import Type
from ggmlpy.quants import q8, q8_arch, vec_dot

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
X86 = os.path.join(DATA, "ggml_q8_x86_reference.npz")
REF = os.path.join(DATA, "ggml_q8_reference.npz")


@pytest.fixture(scope="module")
def x86():
    return dict(np.load(X86))


def _quiet(fn, *a):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*a)


@pytest.mark.parametrize("kind", ["q8_0", "q8_1"])
def test_x86_bit_exact_with_ggml_cpu(x86, kind):
    got = q8_arch.quantize_row_q8(kind, x86["x"], "x86")
    np.testing.assert_array_equal(got, x86["cpu_" + kind])


def test_q8_K_is_the_reference_loop_on_x86(x86):
    """ggml-cpu's x86 quantize_row_q8_K is quantize_row_q8_K_ref: equal on every finite row (the
    reference module gives non-finite blocks its own NaN convention, see ggmlpy.quants.q8)."""
    fin = np.isfinite(x86["x"]).all(axis=1)
    for form in q8_arch.FORMS:
        got = q8_arch.quantize_row_q8("q8_K", x86["x"][fin], form)
        np.testing.assert_array_equal(got, x86["cpu_q8_K"][fin])


def test_x86_blob_reaches_the_cases_where_forms_differ(x86):
    """The blob holds blocks where the reference differs from ggml-cpu (ties, 127/amax, overflow),
    a NaN that maxps drops (finite scale, quant -128) and one it keeps (NaN scale)."""
    x = x86["x"]
    cpu = x86["cpu_q8_0"].reshape(-1, 34)
    ref = _quiet(q8.quantize_row_q8_0, x).reshape(-1, 34)
    blocks = x.reshape(-1, 32)
    fin = np.isfinite(blocks).all(axis=1)
    assert (cpu[fin] != ref[fin]).any(axis=1).sum() >= 20
    d = cpu[:, :2].copy().view(np.float16)[:, 0]
    q = cpu[:, 2:].view(np.int8)
    has_nan = np.isnan(blocks).any(axis=1)
    assert (has_nan & np.isfinite(d)).any() and (has_nan & np.isnan(d)).any()
    assert (q[np.isnan(blocks)] == -128).all()
    amax = np.abs(blocks.astype(np.float64)).max(axis=1)
    with np.errstate(divide="ignore", over="ignore"):
        ovf = fin & (amax > 0) & ~np.isfinite(np.float32(127) / amax.astype(np.float32))
    assert ovf.any() and (q[ovf] == -128).all()   # 0 * inf and +-inf convert to 0x80000000


def test_x86_ties_go_to_even():
    x = np.zeros((1, 32), np.float32)
    x[0, :6] = [127.0, 0.5, 1.5, 2.5, -0.5, -2.5]   # amax 127: id = 1, x / d = x
    for fn in (q8_arch.quantize_row_q8_0_x86, q8_arch.quantize_row_q8_0_arm):
        q = fn(x)[0, 2:8].view(np.int8)
        np.testing.assert_array_equal(q, [127, 0, 2, 2, 0, -2])
    q = q8.quantize_row_q8_0(x)[0, 2:8].view(np.int8)
    np.testing.assert_array_equal(q, [127, 1, 2, 3, -1, -3])   # reference: away from zero


def test_q8_1_sum_is_of_the_converted_values():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 2.5, -0.5, 3.0]
    d = np.float32(1.0)
    for fn in (q8_arch.quantize_row_q8_1_x86, q8_arch.quantize_row_q8_1_arm):
        b = fn(x)[0]
        assert b[0:2].view(np.float16)[0] == d
        assert b[2:4].view(np.float16)[0] == np.float16(127 + 2 + 0 + 3)
        np.testing.assert_array_equal(b[4:8].view(np.int8), [127, 2, 0, 3])


def test_x86_uses_127_over_amax():
    """An amax where ``127 / amax`` and ``1 / (amax / 127)`` are different floats, and a value
    whose scaled form falls on different sides of a half-way point under the two."""
    f = np.float32
    for amax in np.linspace(0.5, 2.0, 20001, dtype=np.float32):
        a, b = f(127) / amax, f(1) / (amax / f(127))
        if a != b:
            break
    else:
        pytest.fail("no amax with differing inverse scales")
    # a value v with v * a and v * b on either side of k + 0.5 (found by search, then checked)
    k = np.arange(-126, 126)
    v = ((k + f(0.5)) * (amax / f(127))).astype(np.float32)
    lo, hi = (v * min(a, b)).astype(f), (v * max(a, b)).astype(f)
    pick = np.where(np.rint(lo) != np.rint(hi))[0]
    assert len(pick), "no half-way split at this amax"
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1] = amax, v[pick[0]]
    got = q8_arch.quantize_row_q8_0_x86(x)[0, 3].view(np.int8)
    assert got == np.int8(np.rint(np.float32(x[0, 1] * a)))
    assert got != q8_arch.quantize_row_q8_0_arm(x)[0, 3].view(np.int8)   # arm: 1 / d


def test_arm_matches_ggml_reference_away_from_ties():
    """NEON differs from the reference loop only on exact ties and overflowing ``1 / d``."""
    r = dict(np.load(REF))
    x = r["x"]
    blocks = x.reshape(-1, 32).astype(np.float32)
    with np.errstate(all="ignore"):
        amax = np.abs(blocks).max(axis=1)
        d = (amax / np.float32(127)).astype(np.float32)
        idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
        v = (blocks * idv[:, None]).astype(np.float32)
        tie = (np.abs(v - np.trunc(v)) == 0.5).any(axis=1)
        ok = np.isfinite(blocks).all(axis=1) & np.isfinite(idv) & ~tie
    got = q8_arch.quantize_row_q8_0_arm(x).reshape(-1, 34)
    want = r["ref_q8_0"].reshape(-1, 34)
    assert ok.sum() > 0.7 * len(ok) and (~ok).any()   # the blob: mostly ordinary blocks
    np.testing.assert_array_equal(got[ok], want[ok])
    got1 = q8_arch.quantize_row_q8_1_arm(x).reshape(-1, 36)
    np.testing.assert_array_equal(got1[ok], r["ref_q8_1"].reshape(-1, 36)[ok])


def test_arm_extremes():
    x = np.zeros((4, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 1e-37, -1e-37, 5e-38   # d subnormal, 1 / d = inf
    x[1, 3] = np.nan
    x[1, 4] = 2.0
    x[2, 7] = np.inf
    x[2, 8] = 1.0
    x[3, 9] = -0.0
    b = _quiet(q8_arch.quantize_row_q8_1_arm, x)
    d = b[:, 0:2].copy().view(np.float16)[:, 0]
    s = b[:, 2:4].copy().view(np.float16)[:, 0]
    q = b[:, 4:].view(np.int8)
    # +inf -> INT32_MAX (low byte -1), -inf -> INT32_MIN (0), 0 * inf = NaN -> 0
    np.testing.assert_array_equal(q[0, :4], [-1, 0, -1, 0])
    assert d[0] == 0 and s[0] == 0
    assert np.isnan(d[1]) and np.isnan(s[1]) and not q[1].any()   # NaN propagates to amax
    assert d[2] == np.inf and not q[2].any()                       # id = 1 / inf = 0; inf*0 = NaN
    assert np.isnan(s[2])                                          # inf * 0
    assert d[3] == 0 and not q[3].any()


def test_x86_extremes():
    x = np.zeros((3, 32), np.float32)
    x[0, 0], x[0, 1] = 1e-37, -1e-37
    x[1, 0] = np.nan                  # lane 0 of the first vector: maxps drops it
    x[1, 9] = 2.0
    x[2, 8] = np.nan                  # dropped by the next maxps of its lane chain
    x[2, 27] = np.nan                 # lane 3 of the last vector: the one maxps order keeps
    b = _quiet(q8_arch.quantize_row_q8_1_x86, x)
    d = b[:, 0:2].copy().view(np.float16)[:, 0]
    q = b[:, 4:].view(np.int8)
    assert d[0] == 0 and (q[0] == -128).all()           # 0 * inf = NaN and +-inf -> -128
    assert d[1] == np.float16(np.float32(2) / np.float32(127))
    assert q[1, 0] == -128 and q[1, 9] == 127 and not q[1, 1:9].any()
    assert np.isnan(d[2]) and (q[2] == -128).all()
    # 32 converted values of 0x80000000 wrap to 0 in the int32 sum; d * 0 = 0
    assert b[0, 2:4].view(np.float16)[0] == 0


def test_host_form_and_env(monkeypatch):
    assert q8_arch.host_form("x86_64") == "x86" and q8_arch.host_form("AMD64") == "x86"
    assert q8_arch.host_form("aarch64") == "arm" and q8_arch.host_form("arm64") == "arm"
    assert q8_arch.host_form("riscv64") == "ref" and q8_arch.host_form("ppc64le") == "ref"
    monkeypatch.delenv(env.Q8_ROUNDING, raising=False)
    assert env.q8_rounding() == "native" and q8_arch.env_form() == q8_arch.host_form()
    for v in ("ref", "X86", "arm"):
        monkeypatch.setenv(env.Q8_ROUNDING, v)
        assert q8_arch.env_form() == v.lower()
    monkeypatch.setenv(env.Q8_ROUNDING, "avx2")
    with pytest.raises(env.EnvError, match="GGMLPY_Q8_ROUNDING"):
        q8_arch.env_form()


def test_errors():
    with pytest.raises(ValueError, match="form"):
        q8_arch.quantize_row_q8("q8_0", np.ones(32, np.float32), "avx")
    with pytest.raises(ValueError, match="kind"):
        q8_arch.quantize_row_q8("q4_0", np.ones(32, np.float32), "x86")
    with pytest.raises(ValueError, match="multiple of"):
        q8_arch.quantize_row_q8_0_x86(np.ones(40, np.float32))
    with pytest.raises(TypeError, match="float"):
        q8_arch.quantize_row_q8_1_arm(np.array(["a"] * 32))


@pytest.mark.parametrize("name,t,kind", [("q8_0", "Q8_0", "q8_0"), ("q4_1", "Q4_1", "q8_1")])
def test_ggml_mul_mat_uses_the_x86_form(x86, name, t, kind):
    """ggml's CPU MUL_MAT of one-hot weight rows with the blob's finite rows equals, bit for bit,
    the vec_dot referee on the x86 form's activation blocks, and not on the reference's."""
    x = x86["x"][x86["mm_rows"]]
    mm = x86["mm_" + name]
    w = x86["w_" + name]
    y = vec_dot.vec_dot(Type[t], w, q8_arch.quantize_row_q8(kind, x, "x86"))
    np.testing.assert_array_equal(y.view(np.uint32), mm.view(np.uint32))
    yr = vec_dot.vec_dot(Type[t], w, _quiet(q8_arch.quantize_row_q8, kind, x, "ref"))
    assert (yr != mm).sum() > 100
