"""Shape, type, layout and parameter rules of the graph-building ops in ggmlpy.ops.

No backend is involved: every test checks metadata (ne, nb, type, op, op_params, src, views) and
the errors raised for ggml's assert conditions. Layout checks compare against NumPy views built
independently with ``np.lib.stride_tricks.as_strided`` on a byte buffer.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.core.errors import GraphFullError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import GluOp, Op, UnaryOp
from ggmlpy.core.tensor import Context, Flag, Tensor
from ggmlpy.core.types import Type


def f32(x: float) -> float:
    """The float32-rounded value ggml would store in a float op_params slot."""
    return float(np.float32(x))


@pytest.fixture
def ctx() -> Context:
    return Context(no_alloc=True)


def T(ctx: Context, ne, type: Type = Type.F32, name: str = "") -> Tensor:
    t = ctx.new_tensor(type, ne)
    if name:
        t.set_name(name)
    return t


def packed_nb(type: Type, ne) -> tuple[int, int, int, int]:
    ne = tuple(ne) + (1,) * (4 - len(ne))
    nb0 = type.type_size
    nb1 = nb0 * ne[0] // type.blck_size
    return (nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])


def np_view(base: np.ndarray, t: Tensor) -> np.ndarray:
    """The NumPy view of tensor ``t`` over ``base`` (the root's data as a flat array)."""
    itemsize = base.dtype.itemsize
    flat = base.reshape(-1)
    start = t.view_offs // itemsize if t.view_src is not None else 0
    return np.lib.stride_tricks.as_strided(flat[start:], shape=t.ne[::-1], strides=t.nb[::-1])


def check_result(t: Tensor, *, ne, type: Type, op: Op, src, params=None, packed=True) -> None:
    ne = tuple(ne) + (1,) * (4 - len(ne))
    assert t.ne == ne
    assert t.type == type
    assert t.op == op
    assert len(t.src) == len(src) and all(s is e for s, e in zip(t.src, src))
    if params is not None:
        assert t.op_params == params
    if packed:
        assert t.nb == packed_nb(type, ne)
        assert t.view_src is None


def check_inplace(t: Tensor, a: Tensor, op: Op) -> None:
    root = a.view_src if a.view_src is not None else a
    assert t.view_src is root
    assert t.view_offs == a.view_offs
    assert t.ne == a.ne and t.nb == a.nb and t.type == a.type
    assert t.op == op and t.src[0] is a


# ----------------------------------------------------------------------------------------------
# element-wise arithmetic
# ----------------------------------------------------------------------------------------------

BINARY = [(ops.add, ops.add_inplace, Op.ADD), (ops.sub, ops.sub_inplace, Op.SUB),
          (ops.mul, ops.mul_inplace, Op.MUL), (ops.div, ops.div_inplace, Op.DIV)]


@pytest.mark.parametrize("fn,fn_inplace,op", BINARY)
@pytest.mark.parametrize("b_ne", [(8, 3, 2, 5), (8, 1, 1, 1), (4, 3, 1, 5), (1, 1, 2, 1),
                                  (2, 3, 2, 1)])
def test_binary_tiling(ctx, fn, fn_inplace, op, b_ne):
    a = T(ctx, (8, 3, 2, 5), Type.F16, "a")
    b = T(ctx, b_ne, Type.F32, "b")
    r = fn(ctx, a, b)
    check_result(r, ne=a.ne, type=Type.F16, op=op, src=[a, b], params=[])
    ri = fn_inplace(ctx, a, b)
    check_inplace(ri, a, op)
    assert ri.src == [a, b]
    assert ri.name == "a (view)"


@pytest.mark.parametrize("fn,fn_inplace,op", BINARY)
def test_binary_rejects_non_tiling(ctx, fn, fn_inplace, op):
    a = T(ctx, (8, 3, 2), name="acts")
    for bad in [(3, 1, 1), (8, 2, 1), (8, 3, 4), (16, 3, 2)]:
        b = T(ctx, bad, name="bias")
        n = len(ctx)
        with pytest.raises(ValueError, match=r"'acts'.*'bias'"):
            fn(ctx, a, b)
        with pytest.raises(ValueError, match="tile"):
            fn_inplace(ctx, a, b)
        assert len(ctx) == n  # nothing was created


def test_inplace_of_view_points_at_root(ctx):
    a = T(ctx, (8, 4), name="a")
    v = ops.view_2d(ctx, a, 4, 2, a.nb[1], 2 * a.nb[1] + 8)
    r = ops.relu_inplace(ctx, v)
    assert r.view_src is a and r.view_offs == 2 * a.nb[1] + 8
    assert r.ne == v.ne and r.nb == v.nb


def test_dup(ctx):
    a = T(ctx, (4, 3, 2), name="a")
    p = ops.permute(ctx, a, 2, 0, 1, 3)
    check_result(ops.dup(ctx, p), ne=p.ne, type=Type.F32, op=Op.DUP, src=[p], params=[])
    check_inplace(ops.dup_inplace(ctx, a), a, Op.DUP)


def test_add1(ctx):
    a = T(ctx, (5, 4), name="a")
    s = T(ctx, (1,), name="s")
    check_result(ops.add1(ctx, a, s), ne=a.ne, type=Type.F32, op=Op.ADD1, src=[a, s], params=[])
    check_inplace(ops.add1_inplace(ctx, a, s), a, Op.ADD1)
    with pytest.raises(ValueError, match="scalar.*'vec'"):
        ops.add1(ctx, a, T(ctx, (2,), name="vec"))
    with pytest.raises(ValueError, match="padded-1d.*'a \\(transposed\\)'"):
        ops.add1(ctx, ops.transpose(ctx, a), s)


SIMPLE = [(ops.sqr, ops.sqr_inplace, Op.SQR), (ops.sqrt, ops.sqrt_inplace, Op.SQRT),
          (ops.log, ops.log_inplace, Op.LOG), (ops.sin, ops.sin_inplace, Op.SIN),
          (ops.cos, ops.cos_inplace, Op.COS)]


@pytest.mark.parametrize("fn,fn_inplace,op", SIMPLE)
def test_simple_elementwise(ctx, fn, fn_inplace, op):
    a = T(ctx, (7, 1, 5, 3), Type.F16, "a")
    check_result(fn(ctx, a), ne=a.ne, type=Type.F16, op=op, src=[a], params=[])
    check_inplace(fn_inplace(ctx, a), a, op)


def test_scale_and_scale_bias(ctx):
    a = T(ctx, (10, 10, 10, 10), name="a")
    r = ops.scale(ctx, a, 0.1)
    check_result(r, ne=a.ne, type=Type.F32, op=Op.SCALE, src=[a], params=[f32(0.1), 0.0])
    assert all(type(p) is float for p in r.op_params)
    r = ops.scale_bias(ctx, a, 2, 1)
    assert r.op == Op.SCALE and r.op_params == [2.0, 1.0]
    assert all(type(p) is float for p in r.op_params)
    ri = ops.scale_inplace(ctx, a, 3.0)
    check_inplace(ri, a, Op.SCALE)
    assert ri.op_params == [3.0, 0.0]
    rb = ops.scale_bias_inplace(ctx, a, 3.0, -1.5)
    check_inplace(rb, a, Op.SCALE)
    assert rb.op_params == [3.0, -1.5]
    with pytest.raises(ValueError, match="padded-1d.*'a \\(permuted\\)'"):
        ops.scale(ctx, ops.permute(ctx, a, 0, 2, 1, 3), 2.0)
    with pytest.raises(TypeError, match="^scale: s must be a number, got str"):
        ops.scale(ctx, a, "x")


def test_clamp_is_always_a_view(ctx):
    a = T(ctx, (6, 2), Type.F16, "a")
    r = ops.clamp(ctx, a, -1, 0.3)
    check_inplace(r, a, Op.CLAMP)
    assert r.op_params == [-1.0, f32(0.3)]
    assert all(type(p) is float for p in r.op_params)


def test_leaky_relu(ctx):
    a = T(ctx, (6, 2), name="a")
    r = ops.leaky_relu(ctx, a, 0.01)
    check_result(r, ne=a.ne, type=Type.F32, op=Op.LEAKY_RELU, src=[a], params=[f32(0.01)])
    check_inplace(ops.leaky_relu(ctx, a, 0.5, True), a, Op.LEAKY_RELU)


@pytest.mark.parametrize("fn,op,inplace", [(ops.acc, Op.ACC, 0), (ops.acc_inplace, Op.ACC, 1),
                                           (ops.set, Op.SET, 0), (ops.set_inplace, Op.SET, 1)])
def test_set_acc_params(ctx, fn, op, inplace):
    a = T(ctx, (256, 17, 2, 3), name="a")
    b = T(ctx, (64, 5, 2, 1), name="b")
    nb1, nb2, nb3, off = a.nb[1], a.nb[2], a.nb[3], 3 * a.nb[1] + 16
    r = fn(ctx, a, b, nb1, nb2, nb3, off)
    assert r.op == op and r.src == [a, b] and r.ne == a.ne and r.type == a.type
    assert r.op_params == [nb1, nb2, nb3, off, inplace]
    assert all(type(p) is int for p in r.op_params)
    if inplace:
        check_inplace(r, a, op)
    else:
        assert r.view_src is None and r.nb == a.nb


def test_set_acc_errors(ctx):
    a = T(ctx, (8, 4), name="dst")
    b = T(ctx, (4, 2), name="patch")
    # region past the end: rows 3..4 of a 4-row tensor
    with pytest.raises(ValueError, match="past the .*'dst'"):
        ops.set_2d(ctx, a, b, a.nb[1], 3 * a.nb[1])
    with pytest.raises(ValueError, match="nelements"):
        ops.acc(ctx, a, T(ctx, (8, 5), name="big"), a.nb[1], a.nb[2], a.nb[3], 0)
    with pytest.raises(TypeError, match="F32.*'i'"):
        ops.acc(ctx, a, T(ctx, (4, 2), Type.I32, "i"), a.nb[1], a.nb[2], a.nb[3], 0)
    with pytest.raises(TypeError, match="same type"):
        ops.set(ctx, a, T(ctx, (4, 2), Type.F16, "h"), a.nb[1], a.nb[2], a.nb[3], 0)
    with pytest.raises(ValueError, match="contiguous.*'dst \\(transposed\\)'"):
        ops.set_1d(ctx, ops.transpose(ctx, a), b, 0)
    with pytest.raises(ValueError, match="offset"):
        ops.set_1d(ctx, a, b, -4)
    # exactly fitting region is fine: the last 8 elements of a
    flat = T(ctx, (8,), name="flat")
    ops.set_1d(ctx, a, flat, a.nbytes - flat.nbytes)
    with pytest.raises(ValueError, match="past the"):
        ops.set_1d(ctx, a, flat, a.nbytes - flat.nbytes + 4)


def test_set_1d_2d_use_a_strides(ctx):
    a = T(ctx, (8, 4, 3), Type.I32, "a")
    b = T(ctx, (3, 2), Type.I32, "b")
    r = ops.set_1d(ctx, a, b, 12)
    assert r.op_params == [a.nb[1], a.nb[2], a.nb[3], 12, 0]
    r = ops.set_2d_inplace(ctx, a, b, 2 * a.nb[1], 4)
    assert r.op_params == [2 * a.nb[1], a.nb[2], a.nb[3], 4, 1]
    check_inplace(r, a, Op.SET)
    r = ops.set_1d_inplace(ctx, a, b, 0)
    assert r.op_params[-1] == 1 and r.view_src is a
    r = ops.set_2d(ctx, a, b, a.nb[1], 0)
    assert r.op_params == [a.nb[1], a.nb[2], a.nb[3], 0, 0] and r.view_src is None


# ----------------------------------------------------------------------------------------------
# reductions and index ops
# ----------------------------------------------------------------------------------------------

def test_reductions(ctx):
    a = T(ctx, (33, 5, 4, 3), Type.F16, "a")
    check_result(ops.sum(ctx, a), ne=(1,), type=Type.F16, op=Op.SUM, src=[a], params=[])
    check_result(ops.sum_rows(ctx, a), ne=(1, 5, 4, 3), type=Type.F16, op=Op.SUM_ROWS, src=[a],
                 params=[])
    check_result(ops.mean(ctx, a), ne=(1, 5, 4, 3), type=Type.F32, op=Op.MEAN, src=[a], params=[])


def test_argmax(ctx):
    a = T(ctx, (10, 7), name="logits")
    check_result(ops.argmax(ctx, a), ne=(7,), type=Type.I32, op=Op.ARGMAX, src=[a], params=[])
    with pytest.raises(ValueError, match="matrix.*'cube'"):
        ops.argmax(ctx, T(ctx, (10, 7, 2), name="cube"))


def test_argsort(ctx):
    a = T(ctx, (16, 3, 2), name="a")
    r = ops.argsort(ctx, a, ops.SortOrder.DESC)
    check_result(r, ne=a.ne, type=Type.I32, op=Op.ARGSORT, src=[a], params=[1])
    assert type(r.op_params[0]) is int
    assert ops.argsort(ctx, a, 0).op_params == [0]
    with pytest.raises(ValueError, match="order"):
        ops.argsort(ctx, a, 2)


# ----------------------------------------------------------------------------------------------
# layout ops
# ----------------------------------------------------------------------------------------------

def test_repeat(ctx):
    a = T(ctx, (10, 5, 4, 1), Type.I32, "a")
    b = T(ctx, (20, 5, 8, 3), name="target")
    check_result(ops.repeat(ctx, a, b), ne=b.ne, type=Type.I32, op=Op.REPEAT, src=[a], params=[])
    check_result(ops.repeat_4d(ctx, a, 10, 10, 4, 2), ne=(10, 10, 4, 2), type=Type.I32,
                 op=Op.REPEAT, src=[a], params=[])
    with pytest.raises(ValueError, match="'a'.*'bad'"):
        ops.repeat(ctx, a, T(ctx, (15, 5, 4), name="bad"))
    with pytest.raises(ValueError, match=r"\[10, 5, 6, 1\].*'a'"):
        ops.repeat_4d(ctx, a, 10, 5, 6, 1)


@pytest.mark.parametrize("dim", range(4))
def test_concat(ctx, dim):
    ne_a = [4, 3, 2, 2]
    ne_b = list(ne_a)
    ne_b[dim] = 5
    a = T(ctx, ne_a, Type.F16, "a")
    b = T(ctx, ne_b, Type.F16, "b")
    ne_r = list(ne_a)
    ne_r[dim] = ne_a[dim] + 5
    check_result(ops.concat(ctx, a, b, dim), ne=ne_r, type=Type.F16, op=Op.CONCAT, src=[a, b],
                 params=[dim])
    other = (dim + 1) % 4
    ne_c = list(ne_a)
    ne_c[other] += 1
    with pytest.raises(ValueError, match=rf"a.ne{other} == b.ne{other}.*'a'.*'c'"):
        ops.concat(ctx, a, T(ctx, ne_c, Type.F16, "c"), dim)


def test_concat_errors(ctx):
    a = T(ctx, (4, 3), name="a")
    with pytest.raises(ValueError, match="dim"):
        ops.concat(ctx, a, a, 4)
    with pytest.raises(TypeError, match="same type.*'h'"):
        ops.concat(ctx, a, T(ctx, (4, 3), Type.F16, "h"), 0)


def test_cpy_is_view_of_destination(ctx):
    a = T(ctx, (6, 4), name="src")
    b0 = T(ctx, (3, 8, 1), Type.F16, "dst")
    b = ops.view_2d(ctx, b0, 3, 8, b0.nb[1], 0)  # destination may itself be a view
    r = ops.cpy(ctx, a, b)
    assert r.op == Op.CPY and r.src == [a, b] and r.op_params == []
    assert r.view_src is b0 and r.ne == b.ne and r.nb == b.nb and r.type == Type.F16
    assert r.name == "dst (view) (copy of src)"
    unnamed = ctx.new_tensor(Type.F32, (24,))
    assert ops.cpy(ctx, a, unnamed).name == "src (copy)"
    with pytest.raises(ValueError, match="nelements.*'src'.*'short'"):
        ops.cpy(ctx, a, T(ctx, (23,), name="short"))


def test_cast(ctx):
    a = T(ctx, (64, 3), name="a")
    r = ops.cast(ctx, a, Type.Q8_0)
    check_result(r, ne=a.ne, type=Type.Q8_0, op=Op.CPY, src=[a, r], params=[])
    assert r.name == "a (copy)"
    assert ops.cast(ctx, a, 26).type == Type.I32  # ids are accepted
    with pytest.raises(ValueError, match="block size.*'odd'"):
        ops.cast(ctx, T(ctx, (33,), name="odd"), Type.Q4_0)
    with pytest.raises(TypeError, match="not a ggmlpy Type"):
        ops.cast(ctx, a, 99)


def test_cont(ctx):
    a = T(ctx, (4, 3, 2, 5), Type.F16, "a")
    p = ops.permute(ctx, a, 3, 1, 0, 2)
    r = ops.cont(ctx, p)
    check_result(r, ne=p.ne, type=Type.F16, op=Op.CONT, src=[p], params=[])
    assert r.name == "a (permuted) (cont)"
    for fn, ne in [(ops.cont_1d, (120,)), (ops.cont_2d, (12, 10)), (ops.cont_3d, (2, 6, 10)),
                   (ops.cont_4d, (5, 4, 3, 2))]:
        check_result(fn(ctx, p, *ne), ne=ne, type=Type.F16, op=Op.CONT, src=[p], params=[])
    with pytest.raises(ValueError, match="nelements.*'a \\(permuted\\)'"):
        ops.cont_2d(ctx, p, 11, 10)


def test_reshape(ctx):
    a = T(ctx, (4, 3, 2, 5), name="a")
    shape_src = T(ctx, (6, 20), Type.I8, "shape")
    r = ops.reshape(ctx, a, shape_src)
    assert r.op == Op.RESHAPE and r.src == [a] and r.op_params == []
    assert r.type == Type.F32 and r.ne == (6, 20, 1, 1) and r.nb == packed_nb(Type.F32, (6, 20))
    assert r.view_src is a and r.view_offs == 0 and r.name == "a (reshaped)"
    for fn, ne in [(ops.reshape_1d, (120,)), (ops.reshape_2d, (12, 10)),
                   (ops.reshape_3d, (2, 6, 10)), (ops.reshape_4d, (5, 4, 3, 2))]:
        r = fn(ctx, a, *ne)
        assert r.op == Op.RESHAPE and r.view_src is a
        assert r.ne == tuple(ne) + (1,) * (4 - len(ne)) and r.nb == packed_nb(Type.F32, ne)
    # reshape of a reshape still views the root
    assert ops.reshape_1d(ctx, ops.reshape_2d(ctx, a, 12, 10), 120).view_src is a
    with pytest.raises(ValueError, match="contiguous.*'a \\(transposed\\)'"):
        ops.reshape_1d(ctx, ops.transpose(ctx, a), 120)
    with pytest.raises(ValueError, match="nelements.*'a'"):
        ops.reshape_2d(ctx, a, 7, 17)
    with pytest.raises(ValueError, match="nelements.*'a'.*'shape'"):
        ops.reshape(ctx, a, T(ctx, (7,), name="shape"))


def _extent_numpy(t: Tensor) -> int:
    """Byte extent of t computed from all of its element addresses (independent of nbytes_of)."""
    idx = np.indices(t.ne[::-1]).reshape(4, -1)
    addr = sum(idx[3 - i] * t.nb[i] for i in range(4))
    return int(addr.max()) + t.type.type_size


def test_views_strides_offsets_and_nbytes(ctx):
    a = T(ctx, (8, 6, 4, 3), name="a")
    base = np.arange(a.nelements, dtype=np.float32).reshape(a.ne[::-1])
    ts = a.type.type_size

    v1 = ops.view_1d(ctx, a, 10, 5 * ts)
    assert v1.op == Op.VIEW and v1.src == [a] and v1.op_params == [5 * ts]
    assert type(v1.op_params[0]) is int
    assert v1.ne == (10, 1, 1, 1) and v1.nb == packed_nb(Type.F32, (10,))
    assert v1.view_src is a and v1.view_offs == 5 * ts and v1.name == "a (view)"
    np.testing.assert_array_equal(np_view(base, v1).ravel(), base.ravel()[5:15])

    # every other row of the first 2-D slice, starting at row 1, columns 2..5
    v2 = ops.view_2d(ctx, a, 4, 3, 2 * a.nb[1], a.nb[1] + 2 * ts)
    assert v2.ne == (4, 3, 1, 1) and v2.nb == (ts, 2 * a.nb[1], 6 * a.nb[1], 6 * a.nb[1])
    np.testing.assert_array_equal(np_view(base, v2)[0, 0], base[0, 0, 1:6:2, 2:6])
    assert v2.nbytes == _extent_numpy(v2) == (4 - 1) * ts + (3 - 1) * 2 * a.nb[1] + ts

    v3 = ops.view_3d(ctx, a, 8, 3, 2, a.nb[1], 2 * a.nb[2], a.nb[3])
    assert v3.nb == (ts, a.nb[1], 2 * a.nb[2], 2 * a.nb[2] * 2)
    np.testing.assert_array_equal(np_view(base, v3)[0], base[1, 0:4:2, 0:3, :])
    assert v3.nbytes == _extent_numpy(v3)

    v4 = ops.view_4d(ctx, a, 4, 2, 2, 3, 2 * a.nb[1], a.nb[2], a.nb[3], 4 * ts)
    assert v4.nb == (ts, 2 * a.nb[1], a.nb[2], a.nb[3])
    np.testing.assert_array_equal(np_view(base, v4), base[:, 0:2, 0:4:2, 4:8])
    assert v4.nbytes == _extent_numpy(v4)
    assert v4.op_params == [4 * ts]

    # view of a view: offsets add up, view_src is the root
    vv = ops.view_1d(ctx, v2, 3, 2 * ts)
    assert vv.view_src is a and vv.view_offs == a.nb[1] + 4 * ts
    assert vv.op_params == [2 * ts] and vv.src == [v2]


def test_views_out_of_bounds(ctx):
    a = T(ctx, (8, 4), name="small")
    with pytest.raises(ValueError, match="out of bounds.*'small'"):
        ops.view_1d(ctx, a, 33, 0)
    with pytest.raises(ValueError, match="out of bounds"):
        ops.view_1d(ctx, a, 8, a.nbytes - 7 * 4)
    with pytest.raises(ValueError, match="out of bounds"):
        ops.view_2d(ctx, a, 8, 2, a.nb[1], 3 * a.nb[1])
    with pytest.raises(ValueError, match="negative offset"):
        ops.view_1d(ctx, a, 1, -4)
    ops.view_1d(ctx, a, 8, a.nbytes - 8 * 4)  # exactly the last row fits
    q = T(ctx, (64, 2), Type.Q8_0, "q")
    with pytest.raises(ValueError, match="block size.*'q'"):
        ops.view_1d(ctx, q, 16, 0)
    vq = ops.view_2d(ctx, q, 32, 2, q.nb[1], Type.Q8_0.type_size)
    assert vq.nb[0] == 34 and vq.nbytes == 34 + q.nb[1]


def _np_perm(axes):
    # ggml "source dim i moves to position axes[i]" expressed as a NumPy transpose of ne[::-1]
    p = [0] * 4
    for i, ax in enumerate(axes):
        p[3 - ax] = 3 - i
    return p


@pytest.mark.parametrize("axes", list(itertools.permutations(range(4))))
def test_permute_matches_numpy(ctx, axes):
    a = T(ctx, (2, 3, 4, 5), name="a")
    base = np.arange(a.nelements, dtype=np.float32).reshape(a.ne[::-1])
    r = ops.permute(ctx, a, *axes)
    assert r.op == Op.PERMUTE and r.src == [a] and r.op_params == list(axes)
    assert r.view_src is a and r.name == "a (permuted)"
    for i, ax in enumerate(axes):
        assert r.ne[ax] == a.ne[i] and r.nb[ax] == a.nb[i]
    # the data seen through the permuted view equals NumPy's transpose (built without ggmlpy)
    inv = [axes.index(j) for j in range(4)]  # result dim j shows source dim inv[j]
    np_axes = [3 - inv[3 - k] for k in range(4)]
    expected = np.transpose(base, np_axes)
    assert expected.shape == r.ne[::-1]
    np.testing.assert_array_equal(np_view(base, r), expected)


def test_permute_examples_and_errors(ctx):
    a = T(ctx, (2, 3, 4, 5), name="a")
    assert ops.permute(ctx, a, 1, 2, 0, 3).ne == (4, 2, 3, 5)
    assert ops.permute(ctx, a, 1, 0, 2, 3).ne == (3, 2, 4, 5)
    assert ops.permute(ctx, a, 0, 2, 1, 3).ne == (2, 4, 3, 5)
    with pytest.raises(ValueError, match="permutation.*'a'"):
        ops.permute(ctx, a, 0, 1, 1, 3)
    with pytest.raises(ValueError, match="permutation"):
        ops.permute(ctx, a, 0, 1, 2, 4)


def test_transpose(ctx):
    a = T(ctx, (3, 5, 2), Type.F16, "a")
    base = np.arange(a.nelements, dtype=np.float16).reshape(a.ne[::-1])
    r = ops.transpose(ctx, a)
    assert r.op == Op.TRANSPOSE and r.src == [a] and r.op_params == []
    assert r.ne == (5, 3, 2, 1) and r.nb == (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    assert r.is_transposed() and r.view_src is a
    np.testing.assert_array_equal(np_view(base, r), base.swapaxes(-1, -2))


def test_get_rows(ctx):
    a = T(ctx, (64, 10, 3, 2), Type.Q4_0, "table")
    b = T(ctx, (7, 3, 2), Type.I32, "ids")
    check_result(ops.get_rows(ctx, a, b), ne=(64, 7, 3, 2), type=Type.F32, op=Op.GET_ROWS,
                 src=[a, b], params=[])
    ai = T(ctx, (4, 10), Type.I32, "ints")
    bi = T(ctx, (5,), Type.I32, "ids1")
    assert ops.get_rows(ctx, ai, bi).type == Type.I32
    with pytest.raises(ValueError, match="a.ne2 == b.ne1.*'table'.*'bad'"):
        ops.get_rows(ctx, a, T(ctx, (7, 2, 2), Type.I32, "bad"))
    with pytest.raises(ValueError, match="a.ne3 == b.ne2"):
        ops.get_rows(ctx, a, T(ctx, (7, 3, 1), Type.I32, "bad"))
    with pytest.raises(TypeError, match="I32.*'f'"):
        ops.get_rows(ctx, a, T(ctx, (7, 3, 2), Type.F32, "f"))


def test_pad(ctx):
    a = T(ctx, (5, 4, 3, 2), name="a")
    check_result(ops.pad(ctx, a, 1, 2, 0, 3), ne=(6, 6, 3, 5), type=Type.F32, op=Op.PAD, src=[a],
                 params=[0, 1, 0, 2, 0, 0, 0, 3, 0])
    r = ops.pad_ext(ctx, a, 1, 2, 3, 4, 0, 1, 2, 0)
    check_result(r, ne=(8, 11, 4, 4), type=Type.F32, op=Op.PAD, src=[a],
                 params=[1, 2, 3, 4, 0, 1, 2, 0, 0])
    assert r.ne[::-1] == np.pad(np.zeros(a.ne[::-1]), [(2, 0), (0, 1), (3, 4), (1, 2)]).shape
    with pytest.raises(ValueError, match="padding.*'a'"):
        ops.pad(ctx, a, -1, 0, 0, 0)


@pytest.mark.parametrize("start,stop,step", [(0, 10, 1), (0, 10, 3), (-2.5, 3, 0.5), (1, 1.1, 0.03)])
def test_arange(ctx, start, stop, step):
    r = ops.arange(ctx, start, stop, step)
    # float32 count; np.arange's float64 count agrees for these values
    n = int(np.ceil(np.float32((np.float32(stop) - np.float32(start)) / np.float32(step))))
    assert n == len(np.arange(start, stop, step))
    check_result(r, ne=(n,), type=Type.F32, op=Op.ARANGE, src=[],
                 params=[f32(start), f32(stop), f32(step)])
    assert all(type(p) is float for p in r.op_params)


def test_arange_errors(ctx):
    with pytest.raises(ValueError, match="stop > start"):
        ops.arange(ctx, 5, 5, 1)
    with pytest.raises(ValueError, match="step > 0"):
        ops.arange(ctx, 0, 5, -1)


def test_timestep_embedding(ctx):
    t = T(ctx, (3,), name="t")
    r = ops.timestep_embedding(ctx, t, 15, 10000)
    check_result(r, ne=(15, 3), type=Type.F32, op=Op.TIMESTEP_EMBEDDING, src=[t],
                 params=[15, 10000])
    with pytest.raises(TypeError, match="F32.*'ti'"):
        ops.timestep_embedding(ctx, T(ctx, (3,), Type.I32, "ti"), 8, 100)
    with pytest.raises(ValueError, match="vector.*'t2'"):
        ops.timestep_embedding(ctx, T(ctx, (3, 2), name="t2"), 8, 100)


# ----------------------------------------------------------------------------------------------
# normalisation
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn,fn_inplace,op", [(ops.norm, ops.norm_inplace, Op.NORM),
                                              (ops.rms_norm, ops.rms_norm_inplace, Op.RMS_NORM),
                                              (ops.l2_norm, ops.l2_norm_inplace, Op.L2_NORM)])
def test_norms(ctx, fn, fn_inplace, op):
    a = T(ctx, (64, 5, 4, 3), name="x")
    r = fn(ctx, a, 1e-6)
    check_result(r, ne=a.ne, type=Type.F32, op=op, src=[a], params=[f32(1e-6)])
    assert type(r.op_params[0]) is float
    ri = fn_inplace(ctx, a, 0)
    check_inplace(ri, a, op)
    assert ri.op_params == [0.0] and type(ri.op_params[0]) is float
    with pytest.raises(ValueError, match="eps >= 0.*'x'"):
        fn(ctx, a, -1e-5)


def test_group_norm(ctx):
    a = T(ctx, (9, 9, 1280), name="x")
    r = ops.group_norm(ctx, a, 32, 1e-6)
    check_result(r, ne=a.ne, type=Type.F32, op=Op.GROUP_NORM, src=[a], params=[32, f32(1e-6)])
    assert type(r.op_params[0]) is int and type(r.op_params[1]) is float
    check_inplace(ops.group_norm_inplace(ctx, a, 32, 1e-6), a, Op.GROUP_NORM)
    with pytest.raises(ValueError, match="n_groups"):
        ops.group_norm(ctx, a, 0, 1e-6)


# ----------------------------------------------------------------------------------------------
# matrix products
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a_type", [Type.F32, Type.F16, Type.Q8_0])
def test_mul_mat_shape(ctx, a_type):
    a = T(ctx, (256, 16, 2, 1), a_type, "w")  # [K, M, A2, A3]
    b = T(ctx, (256, 5, 6, 3), Type.F32, "x")  # [K, N, B2, B3]
    r = ops.mul_mat(ctx, a, b)
    check_result(r, ne=(16, 5, 6, 3), type=Type.F32, op=Op.MUL_MAT, src=[a, b], params=[0, 0])
    # NumPy form of the same shapes: b @ a.T with a block-repeated over the batch dims
    an = np.zeros(a.ne[::-1], np.float32)
    bn = np.zeros(b.ne[::-1], np.float32)
    A = np.repeat(np.repeat(an, 3, axis=1), 3, axis=0)
    assert (bn @ A.swapaxes(-1, -2)).shape == r.ne[::-1]
    assert ops.mul_mat_set_prec(r, ops.Prec.F32) is r
    assert r.op_params == [10, 0]


def test_mul_mat_accepts_permuted_b_and_views(ctx):
    a = T(ctx, (32, 8, 4), name="w")
    b0 = T(ctx, (32, 4, 3), name="x")
    b = ops.permute(ctx, b0, 0, 2, 1, 3)  # [32, 3, 4]
    r = ops.mul_mat(ctx, a, b)
    assert r.ne == (8, 3, 4, 1)


def test_mul_mat_errors(ctx):
    a = T(ctx, (64, 16, 2), name="w")
    with pytest.raises(ValueError, match="a.ne0 == b.ne0.*'w'.*'x'"):
        ops.mul_mat(ctx, a, T(ctx, (32, 4, 2), name="x"))
    with pytest.raises(ValueError, match="b.ne2 % a.ne2.*'w'.*'x3'"):
        ops.mul_mat(ctx, a, T(ctx, (64, 4, 3), name="x3"))
    a4 = T(ctx, (64, 16, 1, 2), name="w4")
    with pytest.raises(ValueError, match="b.ne3 % a.ne3"):
        ops.mul_mat(ctx, a4, T(ctx, (64, 4, 1, 3), name="x"))
    wt = T(ctx, (16, 64), name="wt")
    with pytest.raises(ValueError, match="transposed.*'wt \\(transposed\\)'"):
        ops.mul_mat(ctx, ops.transpose(ctx, wt), T(ctx, (64, 4), name="x"))
    with pytest.raises(ValueError, match="MUL_MAT node.*'w'"):
        ops.mul_mat_set_prec(a, ops.Prec.F32)
    r = ops.mul_mat(ctx, a, T(ctx, (64, 4, 2), name="x"))
    with pytest.raises(ValueError, match="prec"):
        ops.mul_mat_set_prec(r, 3)


def test_out_prod(ctx):
    a = T(ctx, (10, 16, 2, 1), name="a")  # [M, K, A2, A3]
    b = T(ctx, (7, 16, 4, 3), Type.F32, "b")  # [N, K, B2, B3]
    r = ops.out_prod(ctx, a, b)
    check_result(r, ne=(10, 7, 4, 3), type=Type.F32, op=Op.OUT_PROD, src=[a, b], params=[])
    an = np.zeros(a.ne[::-1], np.float32)
    A = np.repeat(np.repeat(an, 2, axis=1), 3, axis=0)
    assert (np.zeros(b.ne[::-1]).swapaxes(-1, -2) @ A).shape == r.ne[::-1]
    with pytest.raises(ValueError, match="a.ne1 == b.ne1.*'a'.*'bad'"):
        ops.out_prod(ctx, a, T(ctx, (7, 15, 4, 3), name="bad"))
    with pytest.raises(ValueError, match="b.ne2 % a.ne2"):
        ops.out_prod(ctx, a, T(ctx, (7, 16, 3, 3), name="bad"))


# ----------------------------------------------------------------------------------------------
# masking, softmax, rope, attention
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn,fn_inplace,op", [
    (ops.diag_mask_inf, ops.diag_mask_inf_inplace, Op.DIAG_MASK_INF),
    (ops.diag_mask_zero, ops.diag_mask_zero_inplace, Op.DIAG_MASK_ZERO)])
def test_diag_mask(ctx, fn, fn_inplace, op):
    a = T(ctx, (10, 10, 3), name="kq")
    check_result(fn(ctx, a, 5), ne=a.ne, type=Type.F32, op=op, src=[a], params=[5])
    ri = fn_inplace(ctx, a, 0)
    check_inplace(ri, a, op)
    assert ri.op_params == [0]


def test_soft_max(ctx):
    a = T(ctx, (16, 16, 4, 2), name="kq")
    r = ops.soft_max(ctx, a)
    check_result(r, ne=a.ne, type=Type.F32, op=Op.SOFT_MAX, src=[a, None], params=[1.0, 0.0])
    check_inplace(ops.soft_max_inplace(ctx, a), a, Op.SOFT_MAX)
    m = T(ctx, (16, 32, 2, 1), Type.F16, "mask")
    r = ops.soft_max_ext(ctx, a, m, 0.125, 8.0)
    check_result(r, ne=a.ne, type=Type.F32, op=Op.SOFT_MAX, src=[a, m], params=[0.125, 8.0])
    ri = ops.soft_max_ext_inplace(ctx, a, None, 0.1, 0.0)
    check_inplace(ri, a, Op.SOFT_MAX)
    assert ri.src == [a, None] and ri.op_params == [f32(0.1), 0.0]


def test_soft_max_errors(ctx):
    a = T(ctx, (16, 16, 4, 2), name="kq")
    cases = [((15, 16), Type.F32, ValueError, "mask.ne0 == a.ne0"),
             ((16, 8), Type.F32, ValueError, "mask.ne1 >= a.ne1"),
             ((16, 16, 3), Type.F16, ValueError, "a.ne2 % mask.ne2"),
             ((16, 16, 1, 3), Type.F16, ValueError, "a.ne3 % mask.ne3"),
             ((16, 16), Type.I32, TypeError, "F16 or F32")]
    for ne, ty, exc, msg in cases:
        m = T(ctx, ne, ty, "badmask")
        with pytest.raises(exc, match=f"{msg}.*'badmask'"):
            ops.soft_max_ext(ctx, a, m, 1.0, 0.0)
    with pytest.raises(ValueError, match="max_bias.*'kq'"):
        ops.soft_max_ext(ctx, a, None, 1.0, 8.0)
    with pytest.raises(ValueError, match="contiguous.*'kq \\(permuted\\)'"):
        ops.soft_max(ctx, ops.permute(ctx, a, 0, 2, 1, 3))


def test_rope(ctx):
    a = T(ctx, (128, 32, 6, 1), Type.F16, "q")
    pos = T(ctx, (6,), Type.I32, "pos")
    r = ops.rope(ctx, a, pos, 128, ops.ROPE_TYPE_NORMAL)
    check_result(r, ne=a.ne, type=Type.F16, op=Op.ROPE, src=[a, pos, None],
                 params=[0, 128, 0, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0, 0, 0, 0, 0])
    ri = ops.rope_inplace(ctx, a, pos, 64, ops.ROPE_TYPE_NEOX)
    check_inplace(ri, a, Op.ROPE)
    assert ri.op_params[1:3] == [64, 2]
    ff = T(ctx, (32,), name="ff")
    r = ops.rope_ext(ctx, a, pos, ff, 64, ops.ROPE_TYPE_NEOX, 4096, 500000.0, 0.25, 0.7465,
                     1.4245, 32.0, 1.0)
    check_result(r, ne=a.ne, type=Type.F16, op=Op.ROPE, src=[a, pos, ff],
                 params=[0, 64, 2, 0, 4096, 500000.0, 0.25, f32(0.7465), f32(1.4245), 32.0, 1.0,
                         0, 0, 0, 0, 0])
    assert len(r.op_params) == 16
    assert [type(p) for p in r.op_params] == [int] * 5 + [float] * 6 + [int] * 5
    ri = ops.rope_ext_inplace(ctx, a, pos, None, 128, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    check_inplace(ri, a, Op.ROPE)
    assert ri.src == [a, pos, None]


def test_rope_errors(ctx):
    a = T(ctx, (64, 4, 6), name="q")
    pos = T(ctx, (6,), Type.I32, "pos")
    with pytest.raises(ValueError, match="mode & 1"):
        ops.rope(ctx, a, pos, 64, 1)
    with pytest.raises(ValueError, match="mode"):
        ops.rope(ctx, a, pos, 64, 8)  # M-RoPE is not implemented
    with pytest.raises(ValueError, match="pos.ne0 == a.ne2.*'q'.*'pos5'"):
        ops.rope(ctx, a, T(ctx, (5,), Type.I32, "pos5"), 64, 0)
    with pytest.raises(TypeError, match="I32.*'posf'"):
        ops.rope(ctx, a, T(ctx, (6,), Type.F32, "posf"), 64, 0)
    with pytest.raises(ValueError, match="n_dims"):
        ops.rope(ctx, a, pos, 65, 0)
    with pytest.raises(ValueError, match="n_dims"):
        ops.rope(ctx, a, pos, 128, 0)
    with pytest.raises(ValueError, match="freq_factors.ne0.*'ff'"):
        ops.rope_ext(ctx, a, pos, T(ctx, (16,), name="ff"), 64, 0, 0, 1e4, 1, 0, 1, 0, 0)
    with pytest.raises(TypeError, match="F32.*'ffh'"):
        ops.rope_ext(ctx, a, pos, T(ctx, (32,), Type.F16, "ffh"), 64, 0, 0, 1e4, 1, 0, 1, 0, 0)


def test_flash_attn_ext(ctx):
    Dk, Dv, n_q, H, H_kv, B, n_kv = 64, 32, 5, 8, 2, 3, 40
    q = T(ctx, (Dk, n_q, H, B), name="q")
    k = T(ctx, (Dk, n_kv, H_kv, B), Type.F16, "k")
    v = T(ctx, (Dv, n_kv, H_kv, B), Type.F16, "v")
    m = T(ctx, (n_kv, 8, 1, 1), Type.F16, "mask")
    r = ops.flash_attn_ext(ctx, q, k, v, m, 0.125, 0.0, 50.0)
    check_result(r, ne=(Dv, H, n_q, B), type=Type.F32, op=Op.FLASH_ATTN_EXT, src=[q, k, v, m],
                 params=[0.125, 0.0, 50.0, 0])
    assert [type(p) for p in r.op_params] == [float, float, float, int]
    # NumPy: softmax(q k^T) v has shape (B, H, n_q, Dv); the result is that permuted to (B, n_q, H, Dv)
    assert np.zeros((B, H, n_q, Dv)).transpose(0, 2, 1, 3).shape == r.ne[::-1]
    assert ops.flash_attn_ext_set_prec(r, ops.Prec.F32) is r and r.op_params[3] == 10
    r2 = ops.flash_attn_ext(ctx, q, k, v, None, 1.0, 0.0, 0.0)
    assert r2.src == [q, k, v, None]


def test_flash_attn_ext_errors(ctx):
    q = T(ctx, (64, 5, 8, 2), name="q")
    k = T(ctx, (64, 40, 2, 2), Type.F16, "k")
    v = T(ctx, (32, 40, 2, 2), Type.F16, "v")
    bad = [
        (dict(k=T(ctx, (32, 40, 2, 2), Type.F16, "kx")), "k.ne0 == q.ne0.*'kx'"),
        (dict(k=T(ctx, (64, 40, 3, 2), Type.F16, "kx")), "q.ne2 % k.ne2.*'kx'"),
        (dict(k=T(ctx, (64, 40, 2, 1), Type.F16, "kx")), "q.ne3 == k.ne3.*'kx'"),
        (dict(v=T(ctx, (32, 41, 2, 2), Type.F16, "vx")), "v.ne1 == k.ne1.*'vx'"),
        (dict(v=T(ctx, (32, 40, 2, 1), Type.F16, "vx")), "q.ne3 == v.ne3.*'vx'"),
        (dict(mask=T(ctx, (39, 5), Type.F16, "mx")), "mask.ne0 == k.ne1.*'mx'"),
        (dict(mask=T(ctx, (40, 4), Type.F16, "mx")), "mask.ne1 >= q.ne1.*'mx'"),
        (dict(mask=T(ctx, (40, 5, 3), Type.F16, "mx")), "q.ne2 % mask.ne2.*'mx'"),
        (dict(mask=T(ctx, (40, 5, 1, 3), Type.F16, "mx")), "q.ne3 % mask.ne3.*'mx'"),
    ]
    for kw, msg in bad:
        args = dict(q=q, k=k, v=v, mask=None) | kw
        with pytest.raises(ValueError, match=msg):
            ops.flash_attn_ext(ctx, args["q"], args["k"], args["v"], args["mask"], 1.0, 0.0, 0.0)
    with pytest.raises(TypeError, match="F16 or F32.*'mi'"):
        ops.flash_attn_ext(ctx, q, k, v, T(ctx, (40, 5), Type.I32, "mi"), 1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="max_bias.*'q'"):
        ops.flash_attn_ext(ctx, q, k, v, None, 1.0, 8.0, 0.0)
    with pytest.raises(ValueError, match="FLASH_ATTN_EXT node"):
        ops.flash_attn_ext_set_prec(q, ops.Prec.F32)


# ----------------------------------------------------------------------------------------------
# unary and GLU
# ----------------------------------------------------------------------------------------------

UNARY_NAMES = ["abs", "sgn", "neg", "step", "tanh", "elu", "relu", "sigmoid", "gelu", "gelu_quick",
               "gelu_erf", "silu", "hardswish", "hardsigmoid", "exp"]


@pytest.mark.parametrize("name", UNARY_NAMES)
def test_unary_wrappers(ctx, name):
    uop = UnaryOp[name.upper()]
    a = T(ctx, (5, 7, 11, 13), Type.F16, "a")
    r = getattr(ops, name)(ctx, a)
    check_result(r, ne=a.ne, type=Type.F16, op=Op.UNARY, src=[a], params=[int(uop)])
    assert type(r.op_params[0]) is int
    has_inplace = name not in ("hardswish", "hardsigmoid")
    assert hasattr(ops, name + "_inplace") == has_inplace
    if has_inplace:
        ri = getattr(ops, name + "_inplace")(ctx, a)
        check_inplace(ri, a, Op.UNARY)
        assert ri.op_params == [int(uop)]
    # rows of a transposed view are not contiguous
    with pytest.raises(ValueError, match="contiguous rows.*'a \\(transposed\\)'"):
        getattr(ops, name)(ctx, ops.transpose(ctx, a))


def test_unary_generic(ctx):
    a = T(ctx, (8, 4), name="a")
    # a view with strided rows but packed elements is accepted; the result is packed
    v = ops.view_2d(ctx, a, 4, 4, a.nb[1], 0)
    r = ops.unary(ctx, v, UnaryOp.SILU)
    check_result(r, ne=(4, 4), type=Type.F32, op=Op.UNARY, src=[v], params=[int(UnaryOp.SILU)])
    check_inplace(ops.unary_inplace(ctx, v, UnaryOp.EXP), v, Op.UNARY)
    with pytest.raises(ValueError, match="unknown unary op"):
        ops.unary(ctx, a, 99)


GLU_NAMES = ["reglu", "geglu", "swiglu", "geglu_erf", "geglu_quick"]


@pytest.mark.parametrize("name", GLU_NAMES)
def test_glu_wrappers(ctx, name):
    gop = GluOp[name.upper()]
    a = T(ctx, (128, 2, 2, 2), Type.F16, "a")
    b = T(ctx, (128, 2, 2, 2), Type.F16, "b")
    r = getattr(ops, name)(ctx, a)
    check_result(r, ne=(64, 2, 2, 2), type=Type.F16, op=Op.GLU, src=[a], params=[int(gop), 0])
    r = getattr(ops, name + "_swapped")(ctx, a)
    check_result(r, ne=(64, 2, 2, 2), type=Type.F16, op=Op.GLU, src=[a], params=[int(gop), 1])
    r = getattr(ops, name + "_split")(ctx, a, b)
    check_result(r, ne=a.ne, type=Type.F16, op=Op.GLU, src=[a, b], params=[int(gop), 0])
    assert all(type(p) is int for p in r.op_params)


def test_glu_generic_and_errors(ctx):
    a = T(ctx, (10, 3), name="a")
    check_result(ops.glu(ctx, a, GluOp.SWIGLU, True), ne=(5, 3), type=Type.F32, op=Op.GLU,
                 src=[a], params=[int(GluOp.SWIGLU), 1])
    g = T(ctx, (10, 3), name="g")
    check_result(ops.glu_split(ctx, a, g, GluOp.REGLU), ne=(10, 3), type=Type.F32, op=Op.GLU,
                 src=[a, g], params=[int(GluOp.REGLU), 0])
    with pytest.raises(ValueError, match="same shape.*'a'.*'g2'"):
        ops.swiglu_split(ctx, a, T(ctx, (10, 4), name="g2"))
    with pytest.raises(TypeError, match="same type.*'gh'"):
        ops.swiglu_split(ctx, a, T(ctx, (10, 3), Type.F16, "gh"))
    with pytest.raises(ValueError, match="contiguous_1.*'a \\(transposed\\)'"):
        ops.swiglu(ctx, ops.transpose(ctx, a))
    with pytest.raises(ValueError, match="unknown GLU op"):
        ops.glu(ctx, a, 42)


# ----------------------------------------------------------------------------------------------
# argument checking, helpers, graphs
# ----------------------------------------------------------------------------------------------

def test_argument_types(ctx):
    a = T(ctx, (4,), name="a")
    with pytest.raises(TypeError, match="Context"):
        ops.add(None, a, a)
    with pytest.raises(TypeError, match="^add: b must be Tensor, got ndarray"):
        ops.add(ctx, a, np.zeros(4))
    with pytest.raises(TypeError, match="^soft_max_ext: mask must be Tensor or None, got str"):
        ops.soft_max_ext(ctx, a, "mask", 1.0, 0.0)
    with pytest.raises(TypeError, match="^view_1d: ne0 must be int, got float 1.5"):
        ops.view_1d(ctx, a, 1.5, 0)
    assert ops.view_1d(ctx, a, np.int64(2), np.int32(4)).op_params == [4]


def test_flag_and_name_helpers(ctx):
    a = T(ctx, (4,))
    assert ops.set_name(a, "x" * 80) is a and a.name == "x" * 63
    assert ops.set_input(a) is a and a.flags & Flag.INPUT
    v = ops.view_1d(ctx, a, 2, 0)
    assert ops.set_output(v) is v and v.flags & Flag.OUTPUT and a.flags & Flag.OUTPUT
    assert ops.set_param(a) is a and a.flags & Flag.PARAM
    with pytest.raises(ValueError, match="only op NONE"):
        ops.set_param(ops.relu(ctx, a))
    with pytest.raises(TypeError):
        ops.set_name("a", "b")


def test_all_exports_exist():
    for name in ops.__all__:
        assert hasattr(ops, name), name
    assert len(set(ops.__all__)) == len(ops.__all__)


def test_graph_order_and_leafs(ctx):
    w = T(ctx, (16, 8), Type.F16, "w")
    x = T(ctx, (16, 4), name="x")
    bias = T(ctx, (8,), name="bias")
    h = ops.mul_mat(ctx, w, x)
    h.set_name("h")
    hb = ops.add(ctx, h, bias)
    hb.set_name("hb")
    y = ops.soft_max(ctx, ops.relu(ctx, hb))
    y.set_name("y")
    g = Graph()
    ops.build_forward_expand(g, y)
    assert g.leafs == [w, x, bias]
    assert [n.name for n in g.nodes] == ["h", "hb", "node_2", "y"]
    assert g.nodes[2].op == Op.UNARY
    # a second expand only appends the new part; shared inputs are not repeated
    t = ops.transpose(ctx, x)
    c = ops.cont(ctx, t)
    z = ops.mul_mat(ctx, ops.reshape_2d(ctx, c, 16, 4), ops.cast(ctx, x, Type.F16))
    ops.build_forward_expand(g, z)
    assert g.leafs == [w, x, bias]
    assert g.nodes[4:] == [t, c, z.src[0], z.src[1], z]
    assert g.nodes[-1] is z
    # a node whose src[1] is itself (cast) appears once
    assert sum(n is z.src[1] for n in g.nodes) == 1


def test_graph_full(ctx):
    x = T(ctx, (4,), name="x")
    y = ops.sqr(ctx, ops.sqr(ctx, x))
    g = Graph(size=1)
    with pytest.raises(GraphFullError):
        ops.build_forward_expand(g, y)
    with pytest.raises(TypeError, match="Graph"):
        ops.build_forward_expand(None, y)


def test_empty_batch_dims_raise_value_error_not_zero_division(ctx):
    a = T(ctx, (64, 16, 0), name="w0")
    with pytest.raises(ValueError, match="b.ne2 % a.ne2.*'w0'"):
        ops.mul_mat(ctx, a, T(ctx, (64, 4, 3), name="x"))
    kq = T(ctx, (16, 16, 4), name="kq")
    with pytest.raises(ValueError, match="a.ne2 % mask.ne2"):
        ops.soft_max_ext(ctx, kq, T(ctx, (16, 16, 0), name="m0"), 1.0, 0.0)


def test_every_function_documents_its_ggml_counterpart():
    import inspect

    for name in ops.__all__:
        obj = getattr(ops, name)
        if inspect.isfunction(obj):
            doc = " ".join((obj.__doc__ or "").split())
            assert "mirrors ``ggml_" in doc, name
