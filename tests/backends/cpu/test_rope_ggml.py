"""The CPU's ROPE variant (``cpu.jit.rope``, :mod:`ggmlpy.backends.cpu.rope_ggml`) against ggml's
own ``ggml_rope_ext`` (``tests/data/ggml_rope.npz``, made by ``scripts/make_rope_reference.py``
with ggml-python's CPU backend): bit for bit, positions up to 32767, NEOX and NORMAL modes, a
partial rotation. The generic kernel (theta in float64, under ``GGMLPY_PRECISE_KERNELS=1``) is
the float64 referee: it stays within float32 rounding of the exact rotation, and ggml's float32
theta steps drift away from it at large positions (theta_i = p * theta_scale**i accumulates i
float32 roundings: about 1e-3 of |x| at position 32767).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import run_graph

from ggmlpy import ops
from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.kernels.registry import REGISTRY
from ggmlpy.core import env
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

DATA = Path(__file__).resolve().parents[2] / "data" / "ggml_rope.npz"


@pytest.fixture(scope="module")
def ref():
    r = np.load(DATA)
    return r, json.loads(str(r["meta_json"]))


def _rope(x: np.ndarray, pos: np.ndarray, mode: int, base: float, n_dims: int):
    T, H, d = x.shape
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (d, H, T))
    p = ctx.new_tensor(Type.I32, (T,))
    node = ops.rope_ext(ctx, a, p, None, n_dims, mode, 32768, base, 1.0, 0.0, 1.0, 0.0, 0.0)
    name = REGISTRY.select(node, np).name
    (y,) = run_graph(ctx, [node], {a: x, p: pos})
    return y.reshape(x.shape), name


def _exact(x: np.ndarray, pos: np.ndarray, mode: int, base: float, n_dims: int) -> np.ndarray:
    x = x.astype(np.float64)
    half = n_dims // 2
    # ggml's theta_scale is a float32 (powf); the powers and products are exact here
    ts = float(np.float32(np.float32(base) ** np.float32(-2.0 / n_dims)))
    theta = pos[:, None].astype(np.float64) * ts ** np.arange(half, dtype=np.float64)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if mode & 2:
        x0, x1 = x[..., :half], x[..., half:n_dims]
    else:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
    out = x.copy()
    o0, o1 = x0 * c - x1 * s, x0 * s + x1 * c
    if mode & 2:
        out[..., :half], out[..., half:n_dims] = o0, o1
    else:
        out[..., 0:n_dims:2], out[..., 1:n_dims:2] = o0, o1
    return out


@pytest.mark.skipif(not cpu_jit.available(), reason="the variant needs Numba (the jit extra)")
def test_rope_variant_is_bit_identical_to_ggml(ref):
    r, meta = ref
    pos = r["positions"]
    for k, (name, case) in enumerate(meta["cases"].items()):
        d, n_dims = case["d"], case["n_dims"]
        x = (np.random.default_rng(meta["seed"] + k).standard_normal((len(pos), 1, d)) * 3
             ).astype(np.float32)
        y, kernel = _rope(x, pos, case["mode"], case["freq_base"], n_dims)
        assert kernel == "cpu.jit.rope"
        np.testing.assert_array_equal(y, r[name], err_msg=name)


def test_precise_rope_is_the_float64_referee(ref, monkeypatch):
    monkeypatch.setenv(env.PRECISE_KERNELS, "1")
    r, meta = ref
    pos = r["positions"]
    name, case = "neox_1e4", meta["cases"]["neox_1e4"]
    x = (np.random.default_rng(meta["seed"]).standard_normal((len(pos), 1, case["d"])) * 3
         ).astype(np.float32)
    y, kernel = _rope(x, pos, case["mode"], case["freq_base"], case["n_dims"])
    assert kernel == "generic"
    exact = _exact(x, pos, case["mode"], case["freq_base"], case["n_dims"])
    # theta in float64 (error ~1e-11 at 32767), cos/sin rounded to float32 once, the rotation
    # in float32: a few ulps of |x| (up to ~12)
    np.testing.assert_allclose(y, exact, rtol=0, atol=4e-6 * max(1.0, np.abs(x).max()))
    drift = np.abs(r[name].astype(np.float64) - exact).max()
    # ggml's float32 theta steps, visible at large positions (observed 1.3e-3 * max|x|)
    assert 2e-4 * np.abs(x).max() < drift < 3e-3 * np.abs(x).max()
