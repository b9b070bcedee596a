"""The CPU's GELU / GEGLU through ggml-cpu's f16 table (``cpu.gelu_f16_table``,
``cpu.geglu_f16_table``) against ggml's own outputs (``tests/data/ggml_gelu_f16.npz``, made by
``scripts/make_gelu_reference.py`` with ggml-python's CPU backend), and against the float64 GELU
within the table's rounding bound.

The bound: the input is rounded to f16 (relative error <= 2**-11; f16's subnormal spacing 2**-24
below 2**-14), GELU's slope is below 1.13 in magnitude, and the entry is rounded to f16 again, so
``|table(x) - gelu(x)| <= 2**-11 * (1.13 * |x| + |gelu(x)|) + 2**-24`` (times ``|g|``, plus one
float32 rounding, for GEGLU).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helpers import run_graph, uniform

from ggmlpy import ops
from ggmlpy.core import env
from ggmlpy.core.opcodes import GluOp
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

DATA = Path(__file__).resolve().parents[2] / "data" / "ggml_gelu_f16.npz"


def _all_f16_inputs() -> np.ndarray:
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    x[~np.isfinite(x)] = 0.0
    return x


def _gelu64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))


def _bound(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 2.0**-11 * (1.13 * np.abs(x) + np.abs(_gelu64(x))) + 2.0**-24


@pytest.fixture(scope="module")
def ref():
    return np.load(DATA)


def test_gelu_equals_ggml_cpu_for_every_f16_input(ref):
    x = _all_f16_inputs()
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (x.size,))
    (got,) = run_graph(ctx, [ops.gelu(ctx, a)], {a: x})
    np.testing.assert_array_equal(got.reshape(-1), ref["gelu"].astype(np.float32))


@pytest.mark.parametrize("form", ["split", "halves", "swapped"])
def test_geglu_equals_ggml_cpu(ref, form):
    x = _all_f16_inputs()[::16]
    gate = ref["gate"]
    ctx = Context()
    n = x.size
    if form == "split":
        a, g = ctx.new_tensor(Type.F32, (n,)), ctx.new_tensor(Type.F32, (n,))
        (got,) = run_graph(ctx, [ops.glu_split(ctx, a, g, GluOp.GEGLU)], {a: x, g: gate})
    else:
        a = ctx.new_tensor(Type.F32, (2 * n,))
        both = np.concatenate([gate, x] if form == "swapped" else [x, gate])
        (got,) = run_graph(ctx, [ops.glu(ctx, a, GluOp.GEGLU, swapped=form == "swapped")],
                           {a: both})
    np.testing.assert_array_equal(got.reshape(-1), ref["geglu"])


def test_gelu_table_within_its_bound_of_float64_and_precise_is_the_formula(monkeypatch):
    rng = np.random.default_rng(5)
    x = uniform(rng, (3, 50_000), -12, 12)
    x[0, :4] = [-10.0, 10.0, -9.999, 1e-30]
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (50_000, 3))
    out = ops.gelu(ctx, a)
    (got,) = run_graph(ctx, [out], {a: x})
    got = got.reshape(x.shape)
    err = np.abs(got.astype(np.float64) - _gelu64(x))
    assert np.all(err <= _bound(x))
    assert err.max() > 1e-3                      # the table's f16 steps are visible
    assert got[0, 0] == 0.0 and got[0, 1] == 10.0  # ggml's cut-offs at -10 / 10
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (50_000, 3))
    (exact,) = run_graph(ctx, [ops.gelu(ctx, a)], {a: x})
    np.testing.assert_allclose(exact.reshape(x.shape), _gelu64(x), rtol=1e-5, atol=1e-6)


def test_geglu_table_strided_rows_within_bound():
    # the fused form reads half rows (not contiguous): the same table, times the gate
    rng = np.random.default_rng(6)
    n, rows = 300, 7
    both = uniform(rng, (rows, 2 * n), -6, 6)
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (2 * n, rows))
    (got,) = run_graph(ctx, [ops.glu(ctx, a, GluOp.GEGLU, swapped=False)], {a: both})
    x, g = both[:, :n].astype(np.float64), both[:, n:].astype(np.float64)
    err = np.abs(got.reshape(x.shape) - _gelu64(x) * g)
    assert np.all(err <= _bound(x) * np.abs(g) + 2.0**-23 * np.abs(_gelu64(x) * g) + 1e-30)


def test_compiled_table_pass_is_the_numpy_form_bit_for_bit():
    """``cpu_jit.gelu_table`` (the one-pass kernel plans use with Numba) against the NumPy form
    ``gelu_f16_table_into`` (the fallback): every f16 value, the +-10 limits and their
    neighbours, NaN, +-inf, +-0 and random float32 values, for GELU (also in place) and GEGLU
    (also into the gate's memory)."""
    from ggmlpy.backends.cpu import jit as cpu_jit
    from ggmlpy.backends.kernels.unary import gelu_f16_table, gelu_f16_table_into

    if not cpu_jit.available():
        pytest.skip(f"compiled kernels unavailable: {cpu_jit.reason()}")
    rng = np.random.default_rng(5)
    lim = np.float32(10.0)
    edges = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, lim, -lim, np.nextafter(lim, 0),
                      np.nextafter(-lim, 0), np.nextafter(lim, 20), np.nextafter(-lim, -20),
                      65504.0, 65520.0, -65520.0, 1e-8, -1e-8, 6e-5], np.float32)
    x = np.concatenate([_all_f16_inputs(), edges,
                        (rng.standard_normal(4099) * 6).astype(np.float32)])
    g = rng.standard_normal(x.size).astype(np.float32)
    g[:5] = [np.nan, np.inf, 0.0, -0.0, 1e30]
    table = gelu_f16_table()

    def same(a, b):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))

    want = np.empty_like(x)
    gelu_f16_table_into(x, want)
    same(cpu_jit.gelu_table(x, np.empty_like(x), table), want)
    y = x.copy()
    cpu_jit.gelu_table(y, y, table)
    same(y, want)
    gelu_f16_table_into(x, want, g)
    same(cpu_jit.gelu_table(x, np.empty_like(x), table, g), want)
    gg = g.copy()
    cpu_jit.gelu_table(x, gg, table, gg)
    same(gg, want)
    with pytest.raises(ValueError, match="table shape"):
        cpu_jit.gelu_table(x, y, table[:10])
    with pytest.raises(ValueError, match="g shape"):
        cpu_jit.gelu_table(x, y, table, g[:10])
