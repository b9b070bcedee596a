"""The Q8_0 integer GEMM (:mod:`ggmlpy.backends.cpu.igemm_q8_0_ir`): batches of 16+ activation rows.

* Bits: every output equals ggml's scalar ``ggml_vec_dot_q8_0_q8_0`` as
  :func:`ggmlpy.quants.vec_dot.dot_unpacked` models it (``sumf += float(sumi) * (dx * dy)``
  block by block, no fused multiply-add), bit for bit: on random shapes (rows not a multiple of
  the 4-row tiles or the 16-row lane groups, 1-3 groups per tile, strided outputs), through
  every path a product takes (the per-call parts, a prepared step alone, on pools of 2 and 3
  threads and with a worker started by hand), and on the extreme blocks of ggml's reference blob
  (inf/NaN/subnormal scales, -128 quants), NaN for NaN.
* Against llama.cpp's x86 order (the 8-lane tiles of the default mode): within the float32
  rounding of two summation orders, ``|a - b| <= 2 (nb + 4) 2^-24 sum_b |float(sumi_b) dx dy|``.
* Which products take it (:func:`ggmlpy.backends.cpu.qmatmul.igemm_applies`): Q8_0 batches of
  16+ rows in the ``fast`` mode of ``GGMLPY_QUANT_MATMUL`` (every test here sets it).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ggmlpy.backends.cpu import qmatmul
from ggmlpy.backends.cpu.threads import Pool
from ggmlpy.core.types import Type
from ggmlpy.quants import quantize
from ggmlpy.quants.vec_dot import dot_unpacked, unpack_weight

pytestmark = pytest.mark.skipif(not qmatmul.jit_available(), reason="numba not installed")


@pytest.fixture(autouse=True)
def _fast_mode(monkeypatch):
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "fast")

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "ggml_q8_reference.npz")


def _zmm() -> bool:
    from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM

    return bool(ZMM)


needs_zmm = pytest.mark.skipif(not qmatmul.jit_available() or not _zmm(),
                               reason="the integer GEMM needs AVX512-F/BW/VNNI")


def _scalar(w: np.ndarray, act: qmatmul.ActQ) -> np.ndarray:
    return dot_unpacked(Type.Q8_0, unpack_weight(Type.Q8_0, w), qmatmul._act_dict(act))


def _case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    N = int(rng.integers(16, 120))
    K = 32 * int(rng.integers(1, 50))
    M = int(rng.integers(1, 70))
    w = quantize(rng.standard_normal((M, K)).astype(np.float32), Type.Q8_0).reshape(M, -1)
    x = (rng.standard_normal((N, K)) * rng.uniform(0.01, 30)).astype(np.float32)
    return w, x


def test_selection() -> None:
    ok = qmatmul.jit_available() and _zmm()
    assert qmatmul.igemm_applies(Type.Q8_0, qmatmul.IGEMM_ROWS) == ok
    assert qmatmul.igemm_applies(Type.Q8_0, 512) == ok
    assert not qmatmul.igemm_applies(Type.Q8_0, qmatmul.IGEMM_ROWS - 1)
    for t in (Type.Q4_0, Type.Q5_0, Type.Q4_K, Type.F16):
        assert not qmatmul.igemm_applies(t, 512)


@pytest.mark.parametrize(("var", "value"), [("GGMLPY_CPU_ZMM", "0"),
                                            ("GGMLPY_QUANT_MATMUL", "ggml"),
                                            ("GGMLPY_QUANT_MATMUL", "dot"),
                                            ("GGMLPY_QUANT_MATMUL", "dequant"),
                                            ("GGMLPY_JIT", "0")])
def test_switched_off(monkeypatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    assert not qmatmul.igemm_applies(Type.Q8_0, 512)


def test_malformed_switch_raises(monkeypatch) -> None:
    from ggmlpy.core.env import EnvError

    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "fastest")
    with pytest.raises(EnvError, match="GGMLPY_QUANT_MATMUL"):
        qmatmul.igemm_applies(Type.Q8_0, 512)


@needs_zmm
@pytest.mark.parametrize("seed", range(24))
def test_scalar_vec_dot_bits_on_random_shapes(seed: int) -> None:
    w, x = _case(seed)
    N, M = x.shape[0], w.shape[0]
    act = qmatmul.quantize_act("q8_0", x)
    want = _scalar(w, act)
    for parts in (1, 3):
        got = qmatmul.mul_mat(Type.Q8_0, w, x, n_threads=parts)
        np.testing.assert_array_equal(got, want)
    out = np.full((N, M), np.nan, np.float32)
    qmatmul.prepare(Type.Q8_0, w, x, out)()
    np.testing.assert_array_equal(out, want)
    # a strided destination (the element-by-element stores)
    big = np.full((N, 2 * M), np.nan, np.float32)
    qmatmul.prepare(Type.Q8_0, w, x, big[:, ::2])()
    np.testing.assert_array_equal(big[:, ::2], want)
    assert np.isnan(big[:, 1::2]).all()


@needs_zmm
@pytest.mark.parametrize("runner", ["pool2", "pool3", "hand"])
def test_same_bits_on_threads(runner: str) -> None:
    from test_dot_tasks import _by_hand  # (pytest puts this folder on sys.path)

    w, x = _case(100)
    w = np.concatenate([w] * 20)  # rows for several chunks
    N, M = x.shape[0], w.shape[0]
    want = _scalar(w, qmatmul.quantize_act("q8_0", x))
    pool = Pool(2 if runner == "pool2" else 3)
    try:
        out = np.full((N, M), np.nan, np.float32)
        step = qmatmul.prepare(Type.Q8_0, w, x, out, _by_hand if runner == "hand" else
                               pool.run_dot)
        for _ in range(4):
            out[...] = np.nan
            step()
            np.testing.assert_array_equal(out, want)
    finally:
        pool.close()


@needs_zmm
def test_extreme_blocks_of_ggml_blob() -> None:
    """ggml's reference rows (scales inf/NaN/subnormal, quants -128): NaN where the scalar loop
    gives NaN, its bits elsewhere; and the 8-lane order's results on the finite outputs within
    the stated bound."""
    ref = np.load(DATA)
    w, y, simd = ref["w_q8_0"], ref["y_q8_0"], ref["dot_q8_0"]
    N = y.shape[0]
    assert N >= qmatmul.IGEMM_ROWS
    act = qmatmul._alloc_act("q8_0", N, 512)
    qmatmul._from_bytes(act, y, 0, N)
    out = np.full((N, w.shape[0]), -1.0, np.float32)
    with np.errstate(all="ignore"):
        for part in qmatmul.mul_mat_parts(Type.Q8_0, w, act, out, 1):
            part()
        want = _scalar(w, act)
    np.testing.assert_array_equal(out, want)
    fin = np.isfinite(want) & np.isfinite(simd)
    assert fin.sum() > 0.5 * want.size and not np.isfinite(want).all()
    _assert_order_bound(w, act, out, simd, fin)


def _assert_order_bound(w, act, a, b, mask) -> None:
    W, Y = unpack_weight(Type.Q8_0, w), qmatmul._act_dict(act)
    sumi = np.einsum("mbj,nbj->nmb", W["q"], Y["q"], dtype=np.int64).astype(np.float64)
    with np.errstate(all="ignore"):
        terms = np.abs(sumi * W["d"][None].astype(np.float64) * Y["d"][:, None].astype(np.float64))
        nb = sumi.shape[2]
        bound = 2 * (nb + 4) * 2.0 ** -24 * terms.sum(axis=2)
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    assert (diff[mask] <= bound[mask]).all(), float(np.max((diff - bound)[mask]))


@needs_zmm
@pytest.mark.parametrize("seed", range(6))
def test_within_order_bound_of_x86_tiles(monkeypatch, seed: int) -> None:
    w, x = _case(200 + seed)
    act = qmatmul.quantize_act("q8_0", x)
    got = qmatmul.mul_mat(Type.Q8_0, w, x)
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "ggml")
    x86 = qmatmul.mul_mat(Type.Q8_0, w, x)
    assert not np.array_equal(got, x86)  # two orders: the bound is what is tested
    _assert_order_bound(w, act, got, x86, np.ones(got.shape, bool))
