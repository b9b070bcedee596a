"""The flat graph state (``ggmlpy.core.snapshot.graph_state``, one tuple with counts and markers).

Two graphs built from the same program have equal states; a program that differs in one step
(op, wiring, parameter, flag, view offset, shape) gives a different state. Seeded random
programs over the class, plus the layout's edge cases (a view source outside the graph, a
source first reached through a node's sources, a None source slot).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Graph, Type
from ggmlpy.core.snapshot import Snapshot, graph_state

OPS = ("add", "mul", "scale", "tanh", "view", "out")


def _random_program(rng, n_steps):
    prog = []
    for k in range(n_steps):
        op = OPS[rng.integers(len(OPS))]
        n_avail = 2 + k
        prog.append((op, int(rng.integers(n_avail)), int(rng.integers(n_avail)),
                     float(rng.choice([0.5, 2.0, 3.0])), int(rng.integers(2))))
    return prog


def _build(prog, n=8, input_flag=(True, False)):
    ctx = Context()
    ts = [ctx.new_tensor_1d(Type.F32, n), ctx.new_tensor_1d(Type.F32, n)]
    for t, f in zip(ts, input_flag):
        if f:
            t.set_input()
    for op, i, j, p, o in prog:
        a, b = ts[i], ts[j]
        if op == "add":
            t = gp.add(ctx, a, b)
        elif op == "mul":
            t = gp.mul(ctx, a, b)
        elif op == "scale":
            t = gp.scale(ctx, a, p)
        elif op == "tanh":
            t = gp.tanh(ctx, a)
        elif op == "view":  # a view of the same size at another offset is still the same size
            t = gp.view_1d(ctx, a, a.ne[0] // 2, o * 4)
            t = gp.concat(ctx, t, t, 0)
        else:
            t = gp.tanh(ctx, a).set_output() if o else gp.tanh(ctx, a)
        ts.append(t)
    g = Graph()
    for t in ts[2:]:
        g.build_forward_expand(t)
    return g


def _mutate(rng, prog):
    prog = list(prog)
    k = int(rng.integers(len(prog)))
    op, i, j, p, o = prog[k]
    field = int(rng.integers(4))
    if field == 0:
        op = OPS[(OPS.index(op) + 1 + int(rng.integers(len(OPS) - 1))) % len(OPS)]
    elif field == 1:
        i = (i + 1) % (2 + k)
    elif field == 2:
        p = {0.5: 2.0, 2.0: 3.0, 3.0: 0.5}[p]
    else:
        o = 1 - o
    new = (op, i, j, p, o)
    return prog, k, new


def _observable(step):
    """The part of a step the graph actually reads (j only for binary ops, p only for scale,
    o only for view/out)."""
    op, i, j, p, o = step
    if op == "out" and not o:
        op = "tanh"  # the same graph: a tanh without the OUTPUT flag
    return (op, i, j if op in ("add", "mul") else None, p if op == "scale" else None,
            o if op == "view" else None)


@pytest.mark.parametrize("seed", range(12))
def test_equal_programs_equal_states_and_one_step_changed_differs(seed):
    rng = np.random.default_rng(seed)
    prog = _random_program(rng, int(rng.integers(3, 12)))
    s1 = graph_state(_build(prog))
    assert s1 == graph_state(_build(prog))
    for _ in range(6):
        base, k, new = _mutate(rng, prog)
        if _observable(new) == _observable(base[k]):
            continue  # the change touched a field this op does not read
        base[k] = new
        assert graph_state(_build(base)) != s1, (prog, k, new)


def test_shape_flag_and_input_changes_differ():
    prog = [("add", 0, 1, 1.0, 0), ("scale", 2, 0, 2.0, 0)]
    s = graph_state(_build(prog))
    assert graph_state(_build(prog, n=6)) != s
    assert graph_state(_build(prog, input_flag=(False, False))) != s
    assert graph_state(_build(prog, input_flag=(False, True))) != s


def test_layout_edge_cases_outside_view_src_late_source_and_none_slot():
    ctx = Context()
    base = ctx.new_tensor_1d(Type.F32, 8)
    v = gp.view_1d(ctx, base, 4, 0)
    x = ctx.new_tensor_1d(Type.F32, 4)
    y = gp.add(ctx, v, x)
    g = Graph()
    g.build_forward_expand(y)
    g2 = Graph()
    g2.build_forward_expand(y)
    assert graph_state(g) == graph_state(g2)
    # a graph whose node list omits the view: the view is reached through y's sources (a late
    # source, recorded after the marker -2) and its view_src is named by identity
    g3 = Graph(0)
    g3.nodes = [y]
    g3.leafs = [x]
    st3 = graph_state(g3)
    assert -2 in st3[st3.index(1):]  # (after the first node's marker)
    assert ("id", id(base)) in st3
    assert st3 != graph_state(g)
    snap = Snapshot.take(g3)
    assert snap._outside and snap._outside[0]() is v
    assert snap.matches(g3)
    # a None source slot is recorded as -1 and differs from a wired one
    y.src.append(None)
    assert graph_state(g3) != st3
