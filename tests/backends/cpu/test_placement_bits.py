"""One numeric path per (op, types, shape, backend, n_threads): the same graph on the CPU (and
SIM) backend gives the same bits wherever its tensors are placed.

Seeded random graphs (MUL_MAT with F16 / BF16 / Q8_0 / Q4_0 / Q4_1 / Q4_K / F32 weights, then
ADD, MUL, GELU, SILU, SCALE, SOFT_MAX and a second MUL_MAT downstream) are evaluated with new
inputs under every placement a user can reach: one plain buffer for everything; weights in a WEIGHTS buffer and the
rest in a plain one; the graph allocator (policies "ggml" and "compact") over weights in a
WEIGHTS buffer, evaluated twice with new inputs; and with the weight cache off
(``GGMLPY_WEIGHT_CACHE_MB=0``), with MKL and with NumPy's matmul as the GEMM library. Every
output must equal the plain evaluation's bits. (Before, a weight in a WEIGHTS buffer went through
the weight cache to one whole-matrix MKL GEMM while the same weight elsewhere was converted per
call into row blocks multiplied by NumPy: 1-2 ulp apart, and every node downstream with them.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.gallocr import GraphAllocator
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.backends.kernels.weight_cache import CACHE
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.quants import quantize

pytest.importorskip("gguf")

WTYPES = [Type.F16, Type.BF16, Type.Q8_0, Type.Q4_0, Type.F32, Type.Q4_1, Type.Q4_K]


@dataclass
class Spec:
    """A random graph: x (K, N) -> MUL_MAT(w1 (K, M)) -> elementwise chain -> MUL_MAT(w2)."""

    K: int
    M: int
    N: int
    t1: Type
    t2: Type
    chain: list[str]
    seed: int


def _spec(seed: int) -> Spec:
    rng = np.random.default_rng(seed)
    K = int(rng.choice([32, 64, 96, 256]))
    M = int(rng.choice([32, 64, 160, 256]))
    N = int(rng.choice([1, 3, 8, 33]))
    chain = list(rng.choice(["add", "mul", "gelu", "silu", "scale", "soft_max"],
                            int(rng.integers(1, 4))))
    fit1 = [t for t in WTYPES if K % t.blck_size == 0]  # Q4_K: rows of whole 256-blocks
    fit2 = [t for t in WTYPES if M % t.blck_size == 0]
    return Spec(K, M, N, fit1[int(rng.integers(len(fit1)))], fit2[int(rng.integers(len(fit2)))],
                chain, seed)


def _weights(spec: Spec) -> dict[str, tuple[Type, tuple[int, ...], np.ndarray]]:
    rng = np.random.default_rng(spec.seed + 1)
    # scaled by 1/sqrt(K): activations stay O(1) through the chain (MUL squares them), far from
    # the f16 range of the Q8_0/Q8_1 activation scales
    w1 = (rng.standard_normal((spec.M, spec.K)) / np.sqrt(spec.K)).astype(np.float32)
    w2 = (rng.standard_normal((spec.M, spec.M)) / np.sqrt(spec.M)).astype(np.float32)
    bias = rng.standard_normal((spec.M,)).astype(np.float32)
    return {"w1": (spec.t1, (spec.K, spec.M), quantize(w1, spec.t1)),
            "w2": (spec.t2, (spec.M, spec.M), quantize(w2, spec.t2)),
            "bias": (Type.F32, (spec.M,), bias)}


def _inputs(spec: Spec, k: int) -> np.ndarray:
    return np.random.default_rng(spec.seed * 7 + k).standard_normal((spec.N, spec.K)).astype(np.float32)


def _build(spec: Spec, wctx: Context, cctx: Context) -> tuple[Tensor, dict[str, Tensor], Tensor]:
    ws = {name: wctx.new_tensor(t, ne).set_name(name) for name, (t, ne, _) in _weights(spec).items()}
    x = cctx.new_tensor(Type.F32, (spec.K, spec.N)).set_name("x").set_input()
    h = ops.mul_mat(cctx, ws["w1"], x)
    for op in spec.chain:
        if op == "add":
            h = ops.add(cctx, h, ws["bias"])
        elif op == "mul":
            h = ops.mul(cctx, h, h)
        elif op == "gelu":
            h = ops.gelu(cctx, h)
        elif op == "silu":
            h = ops.silu(cctx, h)
        elif op == "scale":
            h = ops.scale(cctx, h, 0.37)
        else:
            h = ops.soft_max(cctx, h)
    y = ops.mul_mat(cctx, ws["w2"], h).set_name("y").set_output()
    return x, ws, y


def _set_weights(spec: Spec, ws: dict[str, Tensor]) -> None:
    for name, (_, _, data) in _weights(spec).items():
        backend_tensor_set(ws[name], np.ascontiguousarray(data).reshape(-1).view(np.uint8))


def _graph(y: Tensor) -> Graph:
    g = Graph()
    g.build_forward_expand(y)
    return g


def _plain(spec: Spec, backend, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Everything in one buffer of the default usage (ANY): no WEIGHTS buffer, no allocator."""
    ctx = Context(no_alloc=True)
    x, ws, y = _build(spec, ctx, ctx)
    buf = alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
    try:
        _set_weights(spec, ws)
        g = _graph(y)
        out = []
        for xin in inputs:
            backend_tensor_set(x, xin)
            backend.graph_compute(g)
            out.append(np.array(backend_tensor_get(y)))
        return out
    finally:
        buf.free()


def _placed(spec: Spec, backend, inputs: list[np.ndarray], policy: str | None) -> list[np.ndarray]:
    """Weights in a WEIGHTS buffer; compute tensors in a plain buffer (policy None) or placed by
    the graph allocator (re-allocated before each evaluation, as a scheduler does)."""
    wctx, cctx = Context(no_alloc=True), Context(no_alloc=True)
    x, ws, y = _build(spec, wctx, cctx)
    wbuf = alloc_ctx_tensors_from_buft(wctx, backend.get_default_buffer_type())
    wbuf.set_usage(BufferUsage.WEIGHTS)
    cbuf = None
    ga = None
    try:
        _set_weights(spec, ws)
        g = _graph(y)
        if policy is None:
            cbuf = alloc_ctx_tensors_from_buft(cctx, backend.get_default_buffer_type())
        else:
            ga = GraphAllocator(backend.get_default_buffer_type(), policy=policy)
        out = []
        for xin in inputs:
            if ga is not None:
                assert ga.alloc_graph(g)
            backend_tensor_set(x, xin)
            backend.graph_compute(g)
            out.append(np.array(backend_tensor_get(y)))
        return out
    finally:
        if ga is not None:
            ga.free()
        if cbuf is not None:
            cbuf.free()
        wbuf.free()


@pytest.fixture(scope="module", params=["cpu", "sim"])
def backend(request):
    if request.param == "cpu":
        b = backend_cpu_init()
    else:
        from ggmlpy.backends.sim import sim_reg

        b = sim_reg(1, latency_us=0).devices[0].init_backend()
    yield b
    b.free()


PLACEMENTS = [("weights_buffer", None), ("gallocr_ggml", "ggml"), ("gallocr_compact", "compact")]


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("cache_mb", ["256", "0"])
@pytest.mark.parametrize("blas", ["auto", "numpy"])
def test_placement_does_not_change_the_bits(backend, monkeypatch, seed, cache_mb, blas):
    """auto: MKL where installed (the GEMMs of F32 and converted weights); numpy: NumPy's matmul,
    whose OpenBLAS gives different bits for a split product, so the row blocks must match."""
    spec = _spec(seed)
    monkeypatch.setenv("GGMLPY_WEIGHT_CACHE_MB", cache_mb)
    monkeypatch.setenv("GGMLPY_BLAS", blas)
    CACHE.clear()
    inputs = [_inputs(spec, k) for k in range(2)]
    want = _plain(spec, backend, inputs)
    assert all(np.isfinite(w).all() for w in want)
    for label, policy in PLACEMENTS:
        got = _placed(spec, backend, inputs, policy)
        for k in range(2):
            assert np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32)), (
                f"{label}, evaluation {k}, {spec}: max |diff| = "
                f"{np.max(np.abs(got[k] - want[k]))}")


@pytest.mark.parametrize("seed", range(6))
def test_cache_on_and_off_give_the_same_bits(backend, monkeypatch, seed):
    spec = _spec(100 + seed)
    inputs = [_inputs(spec, k) for k in range(2)]
    res = {}
    for mb in ("256", "0"):
        monkeypatch.setenv("GGMLPY_WEIGHT_CACHE_MB", mb)
        CACHE.clear()
        res[mb] = _placed(spec, backend, inputs, "ggml")
    for k in range(2):
        assert np.array_equal(res["256"][k].view(np.uint32), res["0"][k].view(np.uint32)), spec
