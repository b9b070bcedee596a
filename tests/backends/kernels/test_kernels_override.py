"""KernelRegistry.override: runtime-specific kernels stacked in front of an op's generic kernel
(the fused CUDA kernels for CuPy), first matching predicate wins, misuse raises at once; the real
registry picks the fused kernel for the fake CuPy and the generic one for NumPy, and a graph on
the fake CUDA device then runs NORM/SOFT_MAX/GELU_ERF in one launch each, in float32."""

from __future__ import annotations

import numpy as np
import pytest
from fake_cupy import FakeCupy, fake_cuda_reg

from ggmlpy import ops
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cuda import kernels as ck
from ggmlpy.backends.kernels import REGISTRY, KernelRegistry
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op, UnaryOp
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _reg_with_add():
    reg = KernelRegistry()
    calls = []

    @reg.kernel(Op.ADD, supports=lambda node, xp: True)
    def generic(xp, node, dst, srcs):
        calls.append("generic")
        return None
    return reg, calls


def _add_node(type_=Type.F32):
    ctx = Context()
    a, b = ctx.new_tensor(type_, (32, 2)), ctx.new_tensor(type_, (32, 2))
    return ops.add(ctx, a, b)


def test_first_matching_override_wins_then_the_generic_kernel():
    reg, calls = _reg_with_add()

    def mk(tag):
        def make(xp, node, dst, srcs):
            calls.append(tag)
        return make
    reg.override(Op.ADD, mk("A"), supports=lambda node, xp: xp == "a")
    reg.override(Op.ADD, mk("AB"), supports=lambda node, xp: xp in ("a", "b"))
    n = _add_node()
    for xp, want in (("a", "A"), ("b", "AB"), ("c", "generic")):
        reg.compile_node(xp, n, None, [])
        assert calls[-1] == want
    assert [e.make for e in reg.overrides(Op.ADD)][0].__qualname__.endswith("make")
    assert reg.entry(Op.ADD).make.__name__ == "generic"  # entry(): the generic one, unchanged


def test_a_raising_override_predicate_falls_through():
    reg, calls = _reg_with_add()

    def bad(node, xp):
        raise ValueError("malformed")
    reg.override(Op.ADD, lambda xp, node, dst, srcs: calls.append("o"), supports=bad)
    reg.compile_node(np, _add_node(), None, [])
    assert calls == ["generic"]


def test_an_override_decides_alone_for_quantized_nodes():
    reg, _ = _reg_with_add()
    q = _add_node(Type.Q8_0)
    assert not reg.supports_op(q, np)  # generic entries never see quantized nodes
    reg.override(Op.ADD, lambda xp, node, dst, srcs: None,
                 supports=lambda node, xp: node.type == Type.Q8_0 and xp == "gpu")
    assert reg.supports_op(q, "gpu") and not reg.supports_op(q, np)
    assert reg.supports_op(_add_node(), np)  # the generic predicate still answers for F32


@pytest.mark.parametrize("args, exc, match", [
    (("ADD", lambda *a: None, lambda n, xp: True), TypeError, "Op member"),
    ((Op.SUB, lambda *a: None, lambda n, xp: True), ValueError, "no generic kernel"),
    ((Op.ADD, 3, lambda n, xp: True), TypeError, "callable"),
    ((Op.ADD, lambda *a: None, lambda n: True), TypeError, r"\(node, xp\)"),
])
def test_override_misuse_raises(args, exc, match):
    reg, _ = _reg_with_add()
    with pytest.raises(exc, match=match):
        reg.override(*args)


def test_override_twice_is_refused():
    reg, _ = _reg_with_add()

    def make(xp, node, dst, srcs):
        return None
    reg.override(Op.ADD, make, supports=lambda n, xp: True)
    with pytest.raises(ValueError, match="already overrides ADD"):
        reg.override(Op.ADD, make, supports=lambda n, xp: True)
    with pytest.raises(ValueError, match="already overrides"):
        ck.register(REGISTRY)  # the package registered the fused kernels once, on import


def _graph_nodes():
    ctx = Context()
    x = ctx.new_tensor(Type.F32, (64, 6))
    m = ctx.new_tensor(Type.F32, (64, 6))
    n = ops.norm(ctx, x, 1e-5)
    s = ops.soft_max_ext(ctx, n, m, 0.5, 0.0)
    g = ops.unary(ctx, s, UnaryOp.GELU_ERF)
    return ctx, x, m, [n, s, g]


@pytest.mark.parametrize("i", range(3))
def test_the_registry_picks_fused_for_cupy_and_cpu_variants_for_numpy(i, monkeypatch):
    monkeypatch.delenv("GGMLPY_PRECISE_KERNELS", raising=False)
    node = _graph_nodes()[3][i]
    fake = FakeCupy(1)
    assert REGISTRY.select(node, fake).make is ck.make
    assert REGISTRY.select(node, fake).name == "cuda.fused"
    on_numpy = REGISTRY.select(node, np).name
    assert on_numpy.split(".")[0] in ("cpu", "fast"), on_numpy
    # a node the fused kernels do not take (F16) gets the float32 fast path on CuPy too
    ctx = Context()
    h = ctx.new_tensor(Type.F16, (64, 6))
    assert REGISTRY.select(ops.norm(ctx, h, 1e-5), fake).name == "fast.norm"
    monkeypatch.setenv("GGMLPY_PRECISE_KERNELS", "1")  # the referee: the generic kernel
    assert REGISTRY.select(ops.norm(ctx, h, 1e-5), fake) is REGISTRY.entry(Op.NORM)


def test_fake_cuda_graph_runs_one_launch_per_fused_node_in_float32():
    dev = fake_cuda_reg(1).devices[0]
    be = dev.init_backend()
    ctx, x, m, (n, s, g) = _graph_nodes()
    gr = Graph()
    gr.build_forward_expand(g)
    buf = dev.get_buffer_type().alloc_buffer(1 << 16)
    try:
        off = 0
        from ggmlpy.backend.interface import tensor_alloc  # noqa: PLC0415
        for t in ctx:
            if t.view_src is None:
                tensor_alloc(buf, t, off)
                off += -(-t.nbytes // 256) * 256
        rng = np.random.default_rng(3)
        xv = rng.standard_normal((6, 64)).astype(np.float32)
        mv = np.where(rng.random((6, 64)) < 0.2, -np.inf, 0).astype(np.float32)
        backend_tensor_set(x, xv)
        backend_tensor_set(m, mv)
        n0 = dev.runtime.launch_count()
        be.graph_compute(gr)
        assert dev.runtime.launch_count() - n0 == 3  # one fused launch per node
        got = backend_tensor_get(g).reshape(6, 64).astype(np.float64)
        x64 = xv.astype(np.float64)
        nn = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
        z = nn * 0.5 + mv
        e = np.exp(z - z.max(-1, keepdims=True))
        sm = e / e.sum(-1, keepdims=True)
        from ggmlpy.core.special import erf  # float64 erf (NumPy has none; scipy is no dependency)
        want = 0.5 * sm * (1 + erf(sm / np.sqrt(2)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        buf.free()
        be.free()
