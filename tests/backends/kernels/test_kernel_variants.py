"""One kernel registry for every variant: the CPU's Numba, fast-path and referee variants are
overrides with names and predicates, so which kernel computes a node is one
:meth:`~ggmlpy.backends.kernels.registry.KernelRegistry.select`; the settings and the arrays'
layout pick the variant, support stays the generic entry's answer, and ``test-backend-ops
--kernels`` lists the choice."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.backends.cpu import fastpath
from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.kernels.registry import REGISTRY, KernelRegistry, layout_arrays
from ggmlpy.core import env, special
from ggmlpy.core.opcodes import GluOp, Op
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


@pytest.fixture
def settings(monkeypatch):
    monkeypatch.delenv(env.PRECISE_KERNELS, raising=False)
    monkeypatch.delenv(env.JIT, raising=False)
    return monkeypatch


def _names(op: Op) -> list[str]:
    return [e.name for e in REGISTRY.overrides(op)]


def test_variant_table_in_try_order() -> None:
    assert _names(Op.UNARY) == ["cuda.fused", "cpu.jit.gelu_erf", "fast.gelu_erf_f32",
                                "cpu.gelu_f16_table", "fast.gelu_tanh_f32"]
    assert _names(Op.GLU) == ["cuda.fused", "cpu.geglu_f16_table"]
    assert _names(Op.NORM) == ["cuda.fused", "cpu.jit.norm", "fast.norm"]
    assert _names(Op.SOFT_MAX) == ["cuda.fused", "cpu.jit.soft_max_ggml", "cpu.jit.soft_max",
                                   "cpu.jit.soft_max_f16", "fast.soft_max"]
    for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV):
        assert _names(op) == ["cuda.fused", "cpu.jit.binary"]
    assert REGISTRY.entry(Op.NORM).name == "generic"
    assert all(e.narrows for e in REGISTRY.overrides(Op.NORM)[1:])
    assert not REGISTRY.overrides(Op.NORM)[0].narrows  # the fused CUDA kernel decides alone


def test_settings_pick_the_gelu_erf_variant(settings) -> None:
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (64, 8))
    node = ops.gelu_erf(ctx, a)
    settings.setenv(env.JIT, "0")
    assert REGISTRY.select(node, np).name == "fast.gelu_erf_f32"
    settings.setenv(env.PRECISE_KERNELS, "1")
    assert REGISTRY.select(node, np) is REGISTRY.entry(Op.UNARY)  # the float64 referee
    settings.delenv(env.PRECISE_KERNELS)
    settings.setenv(env.JIT, "1")
    want = "cpu.jit.gelu_erf" if cpu_jit.available() else "fast.gelu_erf_f32"
    assert REGISTRY.select(node, np).name == want
    # a permuted (non-contiguous) source: the variants need C-contiguous arrays
    p = ops.gelu_erf(ctx, ops.permute(ctx, ctx.new_tensor(Type.F32, (4, 5, 6)), 0, 2, 1, 3))
    assert REGISTRY.select(p, np) is REGISTRY.entry(Op.UNARY)
    # F16 and GELU (tanh form)
    assert REGISTRY.select(ops.gelu_erf(ctx, ctx.new_tensor(Type.F16, (8,))), np).name == "generic"
    # GELU (tanh form): ggml-cpu's f16 table by default, the float32 formula when precise
    assert REGISTRY.select(ops.gelu(ctx, a), np).name == "cpu.gelu_f16_table"
    geglu = ops.glu_split(ctx, a, ctx.new_tensor(Type.F32, (64, 8)), GluOp.GEGLU)
    assert REGISTRY.select(geglu, np).name == "cpu.geglu_f16_table"
    settings.setenv(env.PRECISE_KERNELS, "1")
    assert REGISTRY.select(ops.gelu(ctx, a), np).name == "fast.gelu_tanh_f32"
    assert REGISTRY.select(geglu, np) is REGISTRY.entry(Op.GLU)


def test_fits_sees_the_arrays_compiled_not_the_node(settings) -> None:
    # a threaded plan compiles slices: a column slice is not C-contiguous, so the generic
    # kernel computes it while the whole node takes the float32 fast path
    settings.setenv(env.JIT, "0")
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (64, 8))
    node = ops.gelu_erf(ctx, a)
    dst, srcs = layout_arrays(node)
    assert dst.shape == (1, 1, 8, 64) and dst.strides[2:] == (256, 4)
    assert srcs[0].dtype == np.float32
    assert REGISTRY.select(node, np, dst, srcs).name == "fast.gelu_erf_f32"
    assert REGISTRY.select(node, np, dst[..., :32], [srcs[0][..., :32]]).name == "generic"
    x = np.linspace(-6, 6, 512, dtype=np.float32).reshape(1, 1, 8, 64)
    out = np.empty_like(x)
    step = REGISTRY.compile_node(np, node, out, [x])
    assert step.func is special.gelu_erf_f32
    step()
    ref = np.empty_like(x)
    special.gelu_erf_f32(x, ref)
    np.testing.assert_array_equal(out.view(np.int32), ref.view(np.int32))


def test_soft_max_and_norm_variants(settings) -> None:
    settings.setenv(env.JIT, "0")
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (16, 4, 2))
    m = ctx.new_tensor(Type.F16, (16, 4))
    assert REGISTRY.select(ops.soft_max_ext(ctx, a, m, 0.5, 0.0), np).name == "fast.soft_max"
    alibi = ops.soft_max_ext(ctx, a, m, 0.5, 8.0)
    assert REGISTRY.select(alibi, np).name == "generic"  # ALiBi: only the generic kernel
    n = ops.norm(ctx, a, 1e-5)
    assert REGISTRY.select(n, np).name == "fast.norm"
    step = REGISTRY.compile_node(np, n, *layout_arrays(n)[:1], layout_arrays(n)[1])
    assert step.func is fastpath.norm
    settings.setenv(env.PRECISE_KERNELS, "1")
    assert REGISTRY.select(n, np).name == "generic"


def test_bad_jit_setting_is_an_error_not_a_fallback(settings) -> None:
    # the setting is read once a compiled kernel would take the node's arrays (a node this large)
    settings.setenv(env.JIT, "sometimes")
    ctx = Context()
    n = 1 << 16
    node = ops.add(ctx, ctx.new_tensor(Type.F32, (n,)), ctx.new_tensor(Type.F32, (n,)))
    with pytest.raises(env.EnvError, match="GGMLPY_JIT"):
        REGISTRY.select(node, np)


def test_small_nodes_do_not_load_numba() -> None:
    # a graph of nodes too small for the compiled kernels never imports Numba (first-call cost)
    import subprocess
    import sys

    code = ("import sys, numpy as np, ggmlpy as gp\n"
            "be = gp.backend_cpu_init(); ctx = gp.Context()\n"
            "a = ctx.new_tensor_1d(gp.Type.F32, 16).set_input(); x = gp.add(ctx, a, a)\n"
            "g = gp.Graph(); g.build_forward_expand(x)\n"
            "gp.GraphAllocator(be.get_default_buffer_type()).alloc_graph(g)\n"
            "gp.backend_tensor_set(a, np.ones(16, np.float32)); be.graph_compute(g)\n"
            "assert (gp.backend_tensor_get(x) == 2).all()\n"
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_supports_op_does_not_ask_narrowing_variants() -> None:
    reg = KernelRegistry()
    reg.kernel(Op.ADD, supports=lambda node, xp: node.type == Type.F32)(
        lambda xp, node, dst, srcs: None)

    def never_asked(node, xp):
        raise AssertionError("supports_op asked a narrowing variant")

    reg.override(Op.ADD, lambda xp, node, dst, srcs: None, never_asked, name="v", narrows=True)
    ctx = Context()
    f32 = ops.add(ctx, ctx.new_tensor(Type.F32, (4,)), ctx.new_tensor(Type.F32, (4,)))
    f16 = ops.add(ctx, ctx.new_tensor(Type.F16, (4,)), ctx.new_tensor(Type.F16, (4,)))
    assert reg.supports_op(f32, np) and not reg.supports_op(f16, np)
    assert reg.overrides(Op.ADD)[0].name == "v"


def test_cli_lists_the_kernels(settings, capsys) -> None:
    from ggmlpy.testops import main

    settings.setenv(env.JIT, "0")
    assert main(["--kernels", "-o", "NORM", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["array_modules"][0] == "numpy" and doc["cases"]
    by_case = {r["case"]: r["kernels"]["numpy"] for r in doc["cases"]}
    assert all(k.startswith("NORM:") for k in by_case.values())
    f32 = [k for c, k in by_case.items() if "type=f32" in c]
    assert f32 and set(f32) == {"NORM:fast.norm"}
    settings.setenv(env.PRECISE_KERNELS, "1")
    assert main(["--kernels", "-o", "NORM", "--quick"]) == 0
    text = capsys.readouterr().out
    assert "NORM:generic" in text and "fast.norm" not in text and text.rstrip().endswith("cases")
