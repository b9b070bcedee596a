"""Tensor metadata, views, contiguity and graph construction (no backend needed)."""

from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Flag, Graph, Type
from ggmlpy.core.errors import GraphFullError


def test_new_tensor_strides_and_sizes():
    ctx = Context()
    t = ctx.new_tensor(Type.F32, (5, 4, 3, 2))
    assert t.ne == (5, 4, 3, 2)
    assert t.nb == (4, 20, 80, 240)
    assert t.nbytes == 5 * 4 * 3 * 2 * 4
    assert t.nelements == 120 and t.nrows == 24 and t.n_dims == 4
    assert t.is_contiguous() and not t.is_transposed() and not t.is_permuted()
    h = ctx.new_tensor_2d(Type.F16, 7, 3)
    assert h.nb == (2, 14, 42, 42) and h.n_dims == 2
    s = ctx.new_tensor_1d(Type.I32, 1)
    assert s.n_dims == 1 and s.ne == (1, 1, 1, 1)


def test_quantized_strides():
    ctx = Context()
    q = ctx.new_tensor_2d(Type.Q8_0, 64, 3)
    assert q.nb[0] == 34 and q.nb[1] == 68 and q.nbytes == 3 * 68
    with pytest.raises(ValueError, match="block size"):
        ctx.new_tensor_2d(Type.Q8_0, 33, 3)


@pytest.mark.parametrize("ne", [(), (1, 2, 3, 4, 5), (-1, 2)])
def test_bad_shapes(ne):
    with pytest.raises(ValueError):
        Context().new_tensor(Type.F32, ne)


def test_non_integer_shape_and_empty_tensor():
    with pytest.raises(TypeError):
        Context().new_tensor(Type.F32, (1.5, 2))
    e = Context().new_tensor(Type.F32, (0, 3))  # ggml allows empty tensors
    assert e.is_empty() and e.nbytes == 0


def test_nbytes_of_strided_view_matches_numpy_extent():
    ctx = Context()
    a = ctx.new_tensor_2d(Type.F32, 10, 6)
    # every second row, 4 elements each, starting at element 2
    v = gp.view_2d(ctx, a, 4, 3, 2 * a.nb[1], 2 * 4)
    assert v.view_src is a and v.view_offs == 8
    base = np.zeros((6, 10), np.float32)
    npv = base[0:6:2, 2:6]  # the same elements as NumPy sees them
    # byte extent: from the first element to one past the last one
    extent = (npv.shape[0] - 1) * npv.strides[0] + (npv.shape[1] - 1) * npv.strides[1] + 4
    assert v.nbytes == extent == 2 * 80 + 3 * 4 + 4
    assert v.nb[1::-1] == npv.strides
    assert not v.is_contiguous() and v.is_contiguous_rows()


def test_views_of_views_flatten_to_root():
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 100)
    v1 = gp.view_1d(ctx, a, 50, 40)
    v2 = gp.view_1d(ctx, v1, 10, 8)
    assert v2.view_src is a and v2.view_offs == 48


def test_view_out_of_bounds_raises_with_name():
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 10).set_name("weights")
    with pytest.raises(ValueError, match="weights"):
        gp.view_1d(ctx, a, 8, 12)


def test_set_output_marks_view_src():
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 10)
    v = gp.view_1d(ctx, a, 5, 0)
    v.set_output()
    assert v.flags & Flag.OUTPUT and a.flags & Flag.OUTPUT


def test_contiguity_predicates_on_permuted():
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (4, 3, 2, 1))
    p = gp.permute(ctx, a, 1, 0, 2, 3)
    assert p.is_transposed() and p.is_permuted() and not p.is_contiguous()
    assert not p.is_contiguous_rows()
    q = gp.permute(ctx, a, 0, 2, 1, 3)
    assert q.is_contiguous_rows() and not q.is_contiguous() and not q.is_contiguous_1()
    assert a.is_contiguously_allocated() and p.is_contiguously_allocated()


def test_graph_order_nodes_and_leafs():
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 4).set_name("a")
    b = ctx.new_tensor_1d(Type.F32, 4).set_name("b")
    c = gp.add(ctx, a, b).set_name("c")
    d = gp.mul(ctx, c, a).set_name("d")
    e = gp.add(ctx, d, c).set_name("e")  # diamond: c used twice, visited once
    g = Graph()
    g.build_forward_expand(e)
    assert [t.name for t in g.nodes] == ["c", "d", "e"]
    assert [t.name for t in g.leafs] == ["a", "b"]
    # a second expand appends only what is new
    f = gp.sqr(ctx, e).set_name("f")
    g.build_forward_expand(f)
    assert [t.name for t in g.nodes] == ["c", "d", "e", "f"]
    assert g.node(-1) is f
    with pytest.raises(IndexError):
        g.node(4)


def test_param_tensor_is_a_node_and_unnamed_get_names():
    ctx = Context()
    w = ctx.new_tensor_1d(Type.F32, 4).set_param()
    x = ctx.new_tensor_1d(Type.F32, 4)
    y = gp.mul(ctx, w, x)
    g = Graph()
    g.build_forward_expand(y)
    assert g.nodes == [w, y] and g.leafs == [x]
    assert x.name == "leaf_0" and y.name == "node_1"
    with pytest.raises(ValueError, match="only op NONE"):
        y.set_param()


def test_graph_full_is_atomic():
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, 4)
    t = x
    for _ in range(5):
        t = gp.sqr(ctx, t)
    g = Graph(size=3)
    with pytest.raises(GraphFullError, match="size"):
        g.build_forward_expand(t)
    assert g.n_nodes == 0 and g.n_leafs == 0
    big = Graph(size=8)
    big.build_forward_expand(t)
    assert big.n_nodes == 5


def test_deep_chain_does_not_recurse():
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 2)
    for _ in range(5000):
        t = gp.neg(ctx, t)
    g = Graph(size=6000)
    g.build_forward_expand(t)
    assert g.n_nodes == 5000


def test_graph_view():
    ctx = Context()
    t = ctx.new_tensor_1d(Type.F32, 2)
    outs = []
    for _ in range(4):
        t = gp.neg(ctx, t)
        outs.append(t)
    g = Graph()
    g.build_forward_expand(t)
    v = gp.graph_view(g, 1, 3)
    assert v.nodes == outs[1:3] and v.n_leafs == 0
    with pytest.raises(IndexError):
        gp.graph_view(g, 2, 9)


def test_types_table():
    assert Type.F32.type_size == 4 and Type.F16.dtype == np.float16
    assert Type.Q4_0.blck_size == 32 and Type.Q4_0.type_size == 18
    assert gp.row_size(Type.Q8_0, 64) == 68
    with pytest.raises(ValueError):
        gp.row_size(Type.Q8_0, 10)
    with pytest.raises(TypeError):
        _ = Type.Q8_0.dtype
    assert gp.type_from_dtype(np.int32) == Type.I32
