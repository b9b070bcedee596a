"""Contiguity predicates match ggml's ``ggml_is_contiguous_n`` exactly (issue 10 item 18)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import run_graph

from ggmlpy import ops
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type


def _rule(type: Type, ne, nb, n: int) -> bool:
    """ggml's rule restated in closed form: dim 0 packed (unless ne0 is one block); the free dims
    1..n end at extent ``ne[n]*nb[n]`` (for n == 0: the packed row ``ne0/blck*type_size``); every
    dim i > n with ne[i] != 1 must have stride extent * prod(ne[n+1..i-1])."""
    ts, bs = type.type_size, type.blck_size
    if ne[0] != bs and nb[0] != ts:
        return False
    extent = ne[n] * nb[n] if n >= 1 else ts * (ne[0] // bs)
    for i in range(n + 1, 4):
        if ne[i] != 1 and nb[i] != extent * math.prod(ne[n + 1:i]):
            return False
    return True


def _cases():
    out = []
    for ne in itertools.product([1, 2, 3], [1, 2], [1, 3], [1, 2]):
        ne = (ne[0] * 2, ne[1], ne[2], ne[3])
        packed = [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]]
        for d1, d2, d3 in itertools.product([0, 4, 8], [0, 4, -4 * ne[0] * ne[1] + 4 * ne[0]], [0, 12]):
            nb = (4, packed[1] + d1, max(4, packed[2] + d2), packed[3] + d3)
            out.append((ne, nb))
        out.append((ne, (8, packed[1] * 2, packed[2] * 2, packed[3] * 2)))  # dim 0 strided
        out.append((ne, (4, 4 * ne[0] + 4, 4 * ne[0] + 4, 999)))  # size-1 strides reused
    return out


CASES = _cases()


@pytest.mark.parametrize("n", [0, 1, 2])
def test_predicates_match_ggml_rule_over_stride_table(n):
    mismatches = []
    n_true = 0
    for ne, nb in CASES:
        t = Tensor(Type.F32, ne, nb)
        got = {0: t.is_contiguous, 1: t.is_contiguous_1, 2: t.is_contiguous_2}[n]()
        want = _rule(Type.F32, ne, nb, n)
        n_true += want
        if got != want:
            mismatches.append((ne, nb, got, want))
    assert not mismatches, mismatches[:5]
    assert 0 < n_true < len(CASES)  # the table exercises both outcomes


def test_quantized_rows_use_block_size():
    # Q8_0: 32-element blocks of 34 bytes
    t = Tensor(Type.Q8_0, (64, 2, 1, 1), (34, 68, 136, 136))
    assert t.is_contiguous() and t.is_contiguous_1()
    t = Tensor(Type.Q8_0, (64, 2, 1, 1), (34, 80, 160, 160))
    assert not t.is_contiguous() and t.is_contiguous_1()


def test_size1_dim_stride_is_next_expected_stride():
    """Issue example: view_3d(t0, 6, 1, 3, nb1=28, nb2=28, offset=28) of F32 ne=[7,1,4,1]."""
    t = Tensor(Type.F32, (6, 1, 3, 1), (4, 28, 28, 84))
    assert t.is_contiguous_1() and t.is_contiguous_2() and not t.is_contiguous()


def test_swiglu_on_size1_strided_view_computes():
    ctx = Context()
    t0 = ctx.new_tensor(Type.F32, (7, 1, 4, 1))
    t1 = ops.view_3d(ctx, t0, 6, 1, 3, 28, 28, 28)
    y = ops.swiglu(ctx, t1)
    data = np.linspace(-3, 3, 28, dtype=np.float32).reshape(1, 4, 1, 7)
    (got,) = run_graph(ctx, [y], {t0: data})
    x = data.reshape(-1)[7:].astype(np.float64).reshape(3, 7)[:, :6]  # rows at offset 28, stride 28
    a, b = x[:, :3], x[:, 3:]
    want = a / (1 + np.exp(-a)) * b
    np.testing.assert_allclose(got.reshape(3, 3), want, rtol=1e-6, atol=1e-6)
