"""The GEMM path of a quantized MUL_MAT (ggmlpy/backends/cpu/qgemm.py, dequant_kernels.py).

* The compiled dequantizers equal :func:`ggmlpy.quants.dequantize` (gguf-py's NumPy code) bit for
  bit on random bytes, which hold every kind of f16 scale (normal, subnormal, zero, inf, NaN), plus
  blocks whose scales are set to the extremes on purpose; NaN where and only where it is NaN. The
  NumPy fallback too. The split form (Q4_1/Q5_1) equals ``d * q`` and ``m`` decoded by the
  referee's unpacker.
* The activation operand equals the values of the activation blocks (the referee's unpacker) bit
  for bit, Q8_1's ``s`` in the extra columns.
* A MUL_MAT graph for every weight type and batch sizes around its crossover equals the vec_dot
  referee: exactly below the crossover (the dot kernels), within the float32 summation-order bound
  from it on (``tests/qgemm_ref.py``); on 1 and 2 threads; with the weight cache on and off, and
  the same bits either way. ``GGMLPY_QUANT_MATMUL=dequant`` is the float64 product of the exact
  values within float32 GEMM rounding. Activations beyond the Q8_0 scale range take the exact
  product.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from helpers import dot_abs_terms, eval_mul_mat, lanes_bound
from qgemm_ref import ggml_gemm_expected

from ggmlpy import ops
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backends.cpu import qgemm, qmatmul
from ggmlpy.backends.kernels.matmul import splits_weight_rows
from ggmlpy.backends.kernels.weight_cache import CACHE
from ggmlpy.core import env
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize, q8_arch, quantize, vec_dot

pytest.importorskip("gguf")

BLOCK = list(qgemm.BLOCK_TYPES)
# f16 bit patterns of scales: subnormals, +-0, the largest finite, +-inf, quiet and signalling NaN
EXTREME_F16 = [0x0001, 0x03FF, 0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01,
               0x8001, 0x0400, 0x3C00]
# byte offsets of each type's f16 fields (scales and mins) in a block
F16_FIELDS = {Type.Q4_0: (0,), Type.Q4_1: (0, 2), Type.Q5_0: (0,), Type.Q5_1: (0, 2),
              Type.Q8_0: (0,), Type.Q4_K: (0, 2), Type.Q5_K: (0, 2), Type.Q6_K: (208,)}


@pytest.fixture(autouse=True)
def _fast_mode(monkeypatch):
    """The GEMM path of the block types runs from their crossover in the ``fast`` mode (the
    default ``ggml`` keeps them on ggml's orders at every batch); a test may set another."""
    monkeypatch.setenv(env.QUANT_MATMUL, "fast")


def _jit() -> bool:
    return qgemm.kernels_available()


def _random_rows(t: Type, rng: np.random.Generator, R: int, K: int) -> np.ndarray:
    w = rng.integers(0, 256, (R, t.row_size(K)), dtype=np.uint8)
    blk = w.reshape(R, -1, t.type_size)
    n = blk.shape[1]
    for i, bits in enumerate(EXTREME_F16):   # one block per extreme value per field
        for off in F16_FIELDS[t]:
            r, b = divmod(i * len(F16_FIELDS[t]) + F16_FIELDS[t].index(off), n)
            blk[r % R, b, off:off + 2] = np.array([bits], "<u2").view(np.uint8)
    return w


def _same(got: np.ndarray, want: np.ndarray) -> None:
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("t", BLOCK)
def test_dequantize_rows_bit_exact(t, jit):
    if jit and not _jit():
        pytest.skip("numba not importable")
    rng = np.random.default_rng(int(t))
    K, R = 512, 24
    w = _random_rows(t, rng, R, K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # inf * 0 in gguf-py's code
        want = dequantize(w, t, (K, R))
        got = qgemm.dequantize_rows(t, w, jit=jit)
        # into a wider array's rows (a tile with a row stride), from rows with a stride
        wide = np.full((R, K + 7), 7.0, np.float32)
        qgemm.dequantize_rows(t, np.repeat(w, 2, axis=0)[::2], wide[:, :K], jit=jit)
    _same(got, want)
    _same(wide[:, :K], want)
    assert (wide[:, K:] == 7.0).all()
    # quantized real values round-trip too (no NaN anywhere)
    x = rng.standard_normal((R, K)).astype(np.float32)
    wq = quantize(x, t)
    np.testing.assert_array_equal(qgemm.dequantize_rows(t, wq, jit=jit), dequantize(wq, t, (K, R)))


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("t", sorted(qgemm.SPLIT_MIN_TYPES))
def test_dequantize_rows_split_form(t, jit):
    if jit and not _jit():
        pytest.skip("numba not importable")
    rng = np.random.default_rng(3 + int(t))
    K, R = 256, 9
    w = quantize(rng.standard_normal((R, K)).astype(np.float32), t)
    got = qgemm.dequantize_rows(t, w, split=True, jit=jit)
    U = vec_dot.unpack_weight(t, w)
    np.testing.assert_array_equal(got[:, :K], (U["d"][:, :, None] * U["q"].astype(np.float32))
                                  .reshape(R, K))
    np.testing.assert_array_equal(got[:, K:], U["m"])


def test_dequantize_rows_errors():
    w = np.zeros((2, 18), np.uint8)
    with pytest.raises(ValueError, match="not a block type"):
        qgemm.dequantize_rows(Type.F16, w)
    with pytest.raises(ValueError, match="uint8"):
        qgemm.dequantize_rows(Type.Q4_0, w.astype(np.int16))
    with pytest.raises(ValueError, match="whole q4_0 blocks"):
        qgemm.dequantize_rows(Type.Q4_0, np.zeros((2, 19), np.uint8))
    with pytest.raises(ValueError, match=r"\(2, 32\)"):
        qgemm.dequantize_rows(Type.Q4_0, w, out=np.empty((2, 33), np.float32))
    with pytest.raises(ValueError, match="split applies"):
        qgemm.dequantize_rows(Type.Q4_0, w, split=True)


def _hard_rows(rng: np.random.Generator, K: int, big: float = 1e6) -> np.ndarray:
    """Activation rows that probe the quantizers' rounding: normal and wide-range values, exact
    half-way ties, one-signed rows, tiny and subnormal blocks (scale underflow, ``1 / d``
    overflow), large values (``big``: Q8_0 scales near float16's largest), zero and -0 blocks,
    NaN and +-inf."""
    rows = [rng.standard_normal(K), rng.standard_normal(K) * np.logspace(-3, 3, K),
            (rng.integers(-254, 255, K) + 0.5) / 2,  # Q8_0 ties: amax 127 -> d = 1
            np.abs(rng.standard_normal(K)), -np.abs(rng.standard_normal(K)),
            rng.standard_normal(K) * 1e-40, rng.standard_normal(K) * 3e-37,
            rng.standard_normal(K) * 1.2e-38, rng.standard_normal(K) * 1e-44,
            rng.standard_normal(K) * big, np.zeros(K), -np.zeros(K),
            rng.integers(-3, 4, K).astype(np.float64)]
    x = np.array(rows, dtype=np.float32)
    ties = x[2].copy()
    ties[::32] = 127.0  # every 32-block's amax 127 (Q8_0 d = 1 exactly)
    ties[::256] = -127.0  # every Q8_K block's max -127 (iscale = 1)
    x = np.vstack([x, ties])
    x[0, 5], x[1, 300], x[4, 40] = np.nan, np.inf, -np.inf
    x[3, :32] = 0.0
    x[3, 32:64] = rng.standard_normal(32) * 1e-30
    return x


@pytest.mark.parametrize("form", q8_arch.FORMS)
@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("t", BLOCK + [Type.F16, Type.BF16])
def test_act_operand_is_the_block_values(t, jit, form):
    """The operand is what the blocks of ``form``'s quantizer stand for, bit for bit (the sign
    of zero included), except in blocks holding NaN or +-inf, which are NaN in every form."""
    if jit and not _jit():
        pytest.skip("numba not importable")
    rng = np.random.default_rng(11 + int(t))
    K = 512
    kind = vec_dot.VEC_DOT_TYPE[t]
    x = _hard_rows(rng, K, 1e3 if kind in ("q8_1", "f16") else 1e6)  # Q8_1's sum fits f16
    if kind == "f16":
        x[~np.isfinite(x)] = np.nan  # +-inf counts as beyond float16's range (exact product)
    N = x.shape[0]
    C = qgemm.gemm_cols(t, K, "ggml")
    out = np.empty((N, C), np.float32)
    assert qgemm.act_operand(t, x, out, jit=jit, form=form)
    if kind in ("f16", "bf16"):
        Y = vec_dot.unpack_act(kind, qmatmul.act_bytes(qmatmul.quantize_act(kind, x)))
        np.testing.assert_array_equal(out, Y["v"])
        return
    with np.errstate(invalid="ignore", over="ignore"):
        ref = q8_arch.quantize_row_q8(kind, x, form)  # ggml's quantizers of that form
    Y = vec_dot.unpack_act(kind, ref)
    bs = 256 if kind == "q8_K" else 32
    bad = ~np.isfinite(x).reshape(N, K // bs, bs).all(axis=2)
    with np.errstate(invalid="ignore"):
        want = Y["q"].astype(np.float32) * Y["d"][:, :, None]
    want[bad] = np.nan
    _same(out[:, :K], want.reshape(N, K))
    if kind == "q8_1":
        _same(out[:, K:], np.where(bad, np.float32(np.nan), Y["s"]))
    # beyond float16's range the Q8_0/Q8_1 scale overflows: no operand
    if kind != "q8_K":
        assert not qgemm.act_operand(t, np.full((1, K), 1e7, np.float32), out[:1], jit=jit,
                                     form=form)
    with pytest.raises(ValueError, match="block size"):
        qgemm.act_operand(t, x[:, :K - 16], out[:, :K - 16], jit=jit)


def _mul_mat(t: Type, raw: np.ndarray, x: np.ndarray, K: int, M: int, n_threads: int,
             weights: bool, times: int = 1) -> list[np.ndarray]:
    res, dot = eval_mul_mat(t, raw, x, K, M, BufferUsage.WEIGHTS if weights else None,
                            n_threads, times)
    assert dot == (not _gemm_path(t, x.shape[0]))
    return res


def _gemm_path(t: Type, n: int) -> bool:
    """Whether the fast mode takes the GEMM path: from the crossover, but for Q8_0 where its
    integer GEMM runs (a dot-kernel path at every batch, ggml's scalar order)."""
    return n >= qmatmul.CROSSOVER[t] and not qmatmul.igemm_applies(t, n)


def _batches(t: Type) -> list[int]:
    c = qmatmul.CROSSOVER[t]
    return sorted({max(1, c - 1), c, c + 1, 2 * c + 3})


TABLE = [(t, n) for t in BLOCK + [Type.F16, Type.BF16] for n in _batches(t)]


@pytest.mark.parametrize("t,n", TABLE)
def test_mul_mat_tracks_the_vec_dot_referee(t, n, monkeypatch):
    K = 512
    M = 600   # two weight-row parts on 2 threads; Q4_1/Q5_1 tiles of K + K/32 columns
    rng = np.random.default_rng(int(t) * 13 + n)
    raw = quantize((rng.standard_normal((M, K)) / 8).astype(np.float32), t)
    x = rng.standard_normal((n, K)).astype(np.float32)
    want, bound = ggml_gemm_expected(t, raw.reshape(M, -1), x)
    off = _mul_mat(t, raw, x, K, M, 1, False)[0]
    if qmatmul.igemm_applies(t, n) or (n < qmatmul.CROSSOVER[t] and t in BLOCK
                                       and not qmatmul.jit_available()):
        # the NumPy dot path and the Q8_0 integer GEMM: the referee's operations
        np.testing.assert_array_equal(off, want)
    elif n < qmatmul.CROSSOVER[t] and t in BLOCK:  # the compiled dot kernels: their lanes bound
        yb = qmatmul.act_bytes(qmatmul.quantize_act(vec_dot.VEC_DOT_TYPE[t], x))
        lb = lanes_bound(t, K, dot_abs_terms(t, raw.reshape(M, -1), yb))
        assert (np.abs(off.astype(np.float64) - want) <= lb).all()
    else:
        assert (np.abs(off.astype(np.float64) - want) <= bound).all()
    monkeypatch.setenv(env.WEIGHT_CACHE_MB, "64")  # block types are cached only when it is set
    hits = CACHE.stats()["hits"]
    for nt in (1, 2):
        for r in _mul_mat(t, raw, x, K, M, nt, True, times=2):
            np.testing.assert_array_equal(r, off)  # cache on/off, first/second call, threads
    assert (CACHE.stats()["hits"] > hits) == _gemm_path(t, n)  # the copy served


def _cuts_weight_rows(t: Type, K: int, M: int, n: int) -> bool:
    ctx = Context(no_alloc=True)
    node = ops.mul_mat(ctx, ctx.new_tensor(t, (K, M)), ctx.new_tensor(Type.F32, (K, n)))
    return splits_weight_rows(node)


@pytest.mark.parametrize("t", [Type.Q4_1, Type.Q4_K, Type.Q8_0])
def test_activation_row_split_tracks_the_referee(t, monkeypatch):
    """A batch of more than M / 8 rows is cut along the activation rows on 2 threads (each part
    quantizes its rows and dequantizes the whole weight): the referee within the bound, and the
    same bits as one thread."""
    # (Q8_0 takes the GEMM path only where its integer GEMM does not run: 256-bit tiles)
    monkeypatch.setenv(env.CPU_ZMM, "0")
    K, M, n = 512, 600, qmatmul.CROSSOVER[t] + 44   # on the GEMM path
    assert not _cuts_weight_rows(t, K, M, n) and _cuts_weight_rows(t, K, 8 * n, n)
    rng = np.random.default_rng(int(t) + 1)
    raw = quantize((rng.standard_normal((M, K)) / 8).astype(np.float32), t)
    x = rng.standard_normal((n, K)).astype(np.float32)
    want, bound = ggml_gemm_expected(t, raw.reshape(M, -1), x)
    one = _mul_mat(t, raw, x, K, M, 1, False)[0]
    assert (np.abs(one.astype(np.float64) - want) <= bound).all()
    np.testing.assert_array_equal(_mul_mat(t, raw, x, K, M, 2, False)[0], one)


@pytest.mark.parametrize("t", [Type.Q4_1, Type.Q4_K, Type.Q8_0, Type.F16])
def test_dequant_mode_is_the_exact_product(t, monkeypatch):
    monkeypatch.setenv(env.QUANT_MATMUL, "dequant")
    K, M, n = 256, 300, qmatmul.CROSSOVER[t] + 14
    rng = np.random.default_rng(int(t))
    raw = quantize(rng.standard_normal((M, K)).astype(np.float32), t)
    x = rng.standard_normal((n, K)).astype(np.float32)
    W = dequantize(raw.reshape(-1).view(np.uint8), t, (K, M)).astype(np.float64)
    ref = x.astype(np.float64) @ W.T
    got = _mul_mat(t, raw, x, K, M, 1, False)[0] if n >= qmatmul.CROSSOVER[t] else None
    bound = K * 2.0 ** -24 * (np.abs(x).astype(np.float64) @ np.abs(W).T)
    assert got is not None and (np.abs(got - ref) <= bound).all()


@pytest.mark.parametrize("t", [Type.Q8_0, Type.Q4_1])
def test_overflowing_activations_take_the_exact_product(t):
    K, M, n = 256, 64, 80
    rng = np.random.default_rng(5)
    raw = quantize(rng.standard_normal((M, K)).astype(np.float32), t)
    x = rng.standard_normal((n, K)).astype(np.float32)
    x[3, 40] = 3e7   # its Q8_0/Q8_1 block scale beyond float16's range
    W = dequantize(raw.reshape(-1).view(np.uint8), t, (K, M)).astype(np.float64)
    ref = x.astype(np.float64) @ W.T
    got = _mul_mat(t, raw, x, K, M, 1, False)[0]
    assert np.isfinite(got).all()
    bound = K * 2.0 ** -24 * (np.abs(x).astype(np.float64) @ np.abs(W).T)
    assert (np.abs(got - ref) <= bound).all()


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("t", [Type.Q8_0, Type.Q4_1])
def test_mul_mat_gives_ggml_mul_mat_bits_with_x86_rounding(t, n_threads, monkeypatch):
    """One-hot weight rows make every output one activation element's ``d_w d_a q_w q_a`` (no
    summation order involved), so a CPU MUL_MAT with the x86 rounding must give ggml's own
    MUL_MAT on this x86-64 machine bit for bit (tests/data/ggml_q8_x86_reference.npz, edge-case
    rows: ties, 127/amax scales, 1/amax overflow, zero blocks), on the dot path (4 rows) and on
    the GEMM path (all finite rows within f16's range, repeated past the crossover), with the
    compiled quantizers and without."""
    ref = dict(np.load(os.path.join(os.path.dirname(__file__), "..", "..", "data",
                                    "ggml_q8_x86_reference.npz")))
    name = t.type_name
    # rows whose Q8_1 scales and sums fit f16 (an overflowing one sends the whole product to
    # the exact path, as documented in qgemm)
    ds = ref["cpu_q8_1"][ref["mm_rows"]].reshape(len(ref["mm_rows"]), -1, 36)[..., :4]
    fit = np.isfinite(ds.copy().view(np.float16)).all(axis=(1, 2))
    x = ref["x"][ref["mm_rows"]][fit]
    want = ref["mm_" + name][fit]
    reps = -(-qmatmul.CROSSOVER[t] // x.shape[0])  # enough rows for the GEMM path
    x, want = np.tile(x, (reps, 1)), np.tile(want, (reps, 1))
    w = ref["w_" + name]
    K = x.shape[1]
    assert x.shape[0] >= qmatmul.CROSSOVER[t]
    monkeypatch.setenv(env.Q8_ROUNDING, "x86")
    for jit in ("1", "0"):
        monkeypatch.setenv(env.JIT, jit)
        for rows in (slice(0, 4), slice(None)):
            (got,) = _mul_mat(t, w, x[rows], K, K, n_threads, weights=True)
            np.testing.assert_array_equal(got.view(np.uint32), want[rows].view(np.uint32))


@pytest.mark.parametrize("form", q8_arch.FORMS)
def test_q8_0_operand_rounds_scales_to_f16_as_numpy(form):
    """The compiled Q8_0 operand rounds each block scale ``d = amax / 127`` to f16 itself: on
    scales that are exact f16 half-way ties (low 13 float32 mantissa bits 0x1000, odd and even
    neighbours), next to the f16 normal/subnormal edge 2**-14, subnormal ties, and up to the
    largest finite f16 (65504; from 65520 the scale overflows: no operand) it gives the NumPy
    path's bits."""
    if not _jit():
        pytest.skip("numba not importable")
    rng = np.random.default_rng(5)
    ds = []
    for e in (-20, -15, -14, -13, -1, 0, 7, 15):
        for m in (0x000000, 0x001000, 0x003000, 0x7FF000, 0x7FEFFF, 0x001001, 0x000FFF):
            if e == 15 and m >= 0x7FE000:
                continue  # 65520 and its neighbour: the overflow case below
            ds.append(np.array([((e + 127) << 23) | m], np.int32).view(np.float32)[0])
    ds += [np.float32(65504.0), np.float32(65519.0), np.float32(2.0 ** -24 * 1.5),
           np.float32(2.0 ** -24 * 2.5), np.float32(2.0 ** -25)]
    K = 32 * len(ds)
    x = rng.uniform(-1, 1, (3, K)).astype(np.float32)
    for b, d in enumerate(ds):
        amax = np.float32(d) * np.float32(127)
        x[:, b * 32] = amax  # amax / 127 is d or its float32 neighbour: either way a probe
        x[1, b * 32 + 1] = -amax
    got, want = np.empty_like(x), np.empty_like(x)
    assert qgemm.act_operand(Type.Q8_0, x, got, jit=True, form=form)
    assert qgemm.act_operand(Type.Q8_0, x, want, jit=False, form=form)
    _same(got, want)
    over = np.full((1, 64), np.float32(65520.0 * 127), np.float32)
    assert not qgemm.act_operand(Type.Q8_0, over, np.empty_like(over), jit=True, form=form)
    assert not qgemm.act_operand(Type.Q8_0, over, np.empty_like(over), jit=False, form=form)
