"""The kernel registry (ggmlpy/backends/kernels/registry.py): one entry per op with its support
predicate, predicates that see the array module, a fake array module declaring a gap that
supports_op then reports, and registration misuse raising at once."""

from __future__ import annotations

import inspect
import types

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.backends import kernels
from ggmlpy.backends.kernels import REGISTRY, KernelRegistry, registry
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.testops.families import all_cases

#: the ops that need a kernel: every op of the op table (ggmlpy/core/opcodes.py) but NONE (leaves)
#: and the view ops, which compute nothing; an op added to the table must get a kernel
EXPECTED_OPS = {op.name for op in Op if op is not Op.NONE and op not in VIEW_OPS}


def _case_ops() -> set[str]:
    """The ops of every compute node of every test-backend-ops case."""
    return {t.op.name for case in all_cases() for t in case.build_graph()[0]
            if t.op is not Op.NONE and t.op not in VIEW_OPS}


def test_every_registered_op_has_a_two_argument_predicate():
    regd = kernels.registered_ops()
    assert {op.name for op in regd} == EXPECTED_OPS
    # and every kernel is exercised by a test-backend-ops case (testops/families)
    assert _case_ops() == EXPECTED_OPS
    assert len(regd) == len(set(regd))
    for op in regd:
        e = REGISTRY.entry(op)
        assert e is not None and e.op is op
        assert callable(e.make) and callable(e.supports)
        params = list(inspect.signature(e.supports).parameters)
        assert params[:2] == ["node", "xp"], (op.name, params)
    # ops without a kernel: no entry, and supports_op says no (views compute nothing: yes)
    for op in Op:
        if op not in regd:
            assert REGISTRY.entry(op) is None


def test_every_case_op_is_covered_by_the_registry():
    # each compute node of every test-backend-ops case has a registered kernel, except the
    # quantized/BF16 coverage cases, which supports_op refuses before any predicate
    for case in all_cases():
        ctx = case.build_graph()[0]
        for t in ctx:
            if t.op in (Op.NONE, Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE):
                continue
            assert REGISTRY.entry(t.op) is not None, (case.name, t.op.name)


def test_predicates_see_the_array_module(monkeypatch):
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (8, 4))
    node = ops.add(ctx, a, a)
    seen = []
    orig = REGISTRY.entry(Op.ADD)

    def spy(n, xp):
        seen.append((n, xp))
        return orig.supports(n, xp)

    monkeypatch.setitem(REGISTRY._entries, Op.ADD, registry.KernelEntry(Op.ADD, orig.make, spy))
    fake_xp = types.SimpleNamespace(__name__="fakexp")
    assert kernels.supports_op(node, np) is True
    assert kernels.supports_op(node, fake_xp) is True
    assert seen == [(node, np), (node, fake_xp)]


def _f16_gap_on(gap_xp):
    """A predicate: F32/F16 same-shape nodes, except F16 on ``gap_xp`` (a runtime's own gap)."""
    def supports(node, xp):
        if xp is gap_xp and node.type == Type.F16:
            return False
        return node.type in (Type.F32, Type.F16) and node.src[0].ne == node.ne
    return supports


def test_fake_array_module_declares_a_gap_that_supports_op_reports():
    reg = KernelRegistry()
    fake_xp = types.SimpleNamespace(__name__="fakexp")

    @reg.kernel(Op.SQR, supports=_f16_gap_on(fake_xp))
    def make(xp, node, dst, srcs):
        return lambda: xp.square(srcs[0], out=dst)

    ctx = Context()
    f32 = ops.sqr(ctx, ctx.new_tensor(Type.F32, (5, 3)))
    f16 = ops.sqr(ctx, ctx.new_tensor(Type.F16, (5, 3)))
    assert reg.supports_op(f32, np) and reg.supports_op(f32, fake_xp)
    assert reg.supports_op(f16, np)
    assert not reg.supports_op(f16, fake_xp)                # the gap, only on that module
    assert not reg.supports_op(ops.sqrt(ctx, f32.src[0]), np)  # no kernel registered: no
    assert reg.supports_op(ops.transpose(ctx, f32), fake_xp)   # views compute nothing
    # the registered kernel computes real values
    x = np.arange(15, dtype=np.float32).reshape(1, 1, 3, 5) - 7
    d = np.empty_like(x)
    reg.compile_node(np, f32, d, [x])()
    np.testing.assert_array_equal(d, (x.astype(np.float64) ** 2).astype(np.float32))


def test_generic_type_rule_comes_before_the_predicate():
    # quantized / BF16 tensors are refused without asking the predicate
    reg = KernelRegistry()
    calls = []
    reg.kernel(Op.SQR, supports=lambda n, xp: calls.append(n) or True)(lambda *a: None)
    ctx = Context()
    assert not reg.supports_op(ops.sqr(ctx, ctx.new_tensor(Type.BF16, (4,))), np)
    assert calls == []
    assert reg.supports_op(ops.sqr(ctx, ctx.new_tensor(Type.F32, (4,))), np)
    assert len(calls) == 1


def test_predicate_errors_on_malformed_nodes_mean_unsupported():
    reg = KernelRegistry()

    def boom(node, xp):
        raise IndexError("src[1] missing")
    reg.kernel(Op.SQR, supports=boom)(lambda *a: None)
    ctx = Context()
    assert reg.supports_op(ops.sqr(ctx, ctx.new_tensor(Type.F32, (4,))), np) is False


@pytest.mark.parametrize("args, kwargs, exc, words", [
    ((), {"supports": lambda n, xp: True}, ValueError, "at least one op"),
    (("ADD",), {"supports": lambda n, xp: True}, TypeError, "Op members"),
    ((Op.VIEW,), {"supports": lambda n, xp: True}, ValueError, "computes nothing"),
    ((Op.ADD,), {"supports": lambda n: True}, TypeError, "(node, xp)"),
    ((Op.ADD,), {"supports": 3}, TypeError, "callable"),
])
def test_registration_misuse_raises(args, kwargs, exc, words):
    reg = KernelRegistry()
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
        reg.kernel(*args, **kwargs)


def test_an_op_is_registered_once():
    reg = KernelRegistry()
    reg.kernel(Op.ADD, supports=lambda n, xp: True)(lambda *a: None)
    with pytest.raises(ValueError, match="ADD already has a kernel"):
        reg.kernel(Op.ADD, supports=lambda n, xp: True)
    with pytest.raises(ValueError, match="ADD already has a kernel"):
        REGISTRY.kernel(Op.ADD, Op.SUB, supports=lambda n, xp: True)
    assert REGISTRY.entry(Op.SUB) is not None and reg.entry(Op.SUB) is None


def test_compile_node_without_kernel_names_the_node():
    reg = KernelRegistry()
    ctx = Context()
    t = ops.sqr(ctx, ctx.new_tensor(Type.F32, (4,)))
    t.name = "sq"
    with pytest.raises(ValueError, match="no kernel for op SQR of 'sq'"):
        reg.compile_node(np, t, np.empty(4, np.float32), [np.ones(4, np.float32)])
