"""Case tables of the element-wise families: UNARY, GLU, ADD/SUB/MUL/DIV/ADD1, SQR/SQRT/LOG/SIN/COS,
SCALE, CLAMP, LEAKY_RELU (ggml's ``make_test_cases_eval`` sweeps, sized for a NumPy backend)."""

from __future__ import annotations

from collections.abc import Sequence

from ggmlpy import ops
from ggmlpy.core.opcodes import GluOp, UnaryOp
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type
from ggmlpy.testops.case import Builder, TestCase

__all__ = ["elementwise_cases", "strided_rows"]

F32, F16 = Type.F32, Type.F16


def strided_rows(b: Builder, type: Type, ne: Sequence[int], factor: int = 3, **kw) -> Tensor:
    """A ``[ne]`` view whose rows are ``factor`` times longer in memory (ggml's ``v=1`` inputs:
    packed elements, strided rows)."""
    ne = list(ne) + [1] * (4 - len(ne))
    base = b.new(type, [ne[0] * factor, *ne[1:]], **kw)
    return ops.view_4d(b.ctx, base, ne[0], ne[1], ne[2], ne[3], base.nb[1], base.nb[2],
                       base.nb[3], 0)


def _unary_cases() -> list[TestCase]:
    cases = []
    for u in UnaryOp:
        for type in (F16, F32):
            for v in (0, 1):
                for ne in ([128, 2, 2, 2], [5, 7, 11, 13]):
                    def build(b: Builder, u=u, type=type, v=v, ne=ne) -> Tensor:
                        a = strided_rows(b, type, ne) if v else b.new(type, ne)
                        return ops.unary(b.ctx, a, u)
                    lo_hi = (-10.0, 10.0) if (u == UnaryOp.EXP and type == F16) else (-150.0, 150.0)
                    cases.append(TestCase(u.name, {"type": type, "ne_a": ne, "v": v}, build,
                                          family="UNARY", init_range=lo_hi))
    return cases


def _glu_cases() -> list[TestCase]:
    cases = []
    for g in GluOp:
        for type in (F16, F32):
            for v in (0, 1):
                for swapped in (0, 1):
                    for ne in ([128, 2, 2, 2], [5, 7, 11, 13]):
                        ne2 = [ne[0] * 2, *ne[1:]]

                        def build(b: Builder, g=g, type=type, v=v, swapped=swapped, ne2=ne2):
                            a = strided_rows(b, type, ne2) if v else b.new(type, ne2)
                            return ops.glu(b.ctx, a, g, bool(swapped))
                        cases.append(TestCase(g.name, {"type": type, "ne_a": ne2, "v": v,
                                                       "swapped": swapped},
                                              build, family="GLU", init_range=(-150.0, 150.0)))
            for ne in ([128, 2, 2, 2], [5, 7, 11, 13]):
                def build(b: Builder, g=g, type=type, ne=ne):
                    return ops.glu_split(b.ctx, b.new(type, ne), b.new(type, ne), g)
                cases.append(TestCase(g.name, {"type": type, "ne_a": ne, "split": 1}, build,
                                      family="GLU", init_range=(-150.0, 150.0)))
    return cases


# ggml's test_bin_bcast patterns: (ne of b, repeat factors nr; a = ne * nr)
_BCAST = [
    ([1, 1, 8, 1], [1, 1, 1, 1]), ([1, 1, 1, 1], [32, 1, 1, 1]), ([1, 1, 320, 320], [1, 1, 1, 1]),
    ([10, 5, 1, 1], [1, 1, 1, 1]), ([10, 5, 4, 1], [1, 1, 1, 1]), ([10, 5, 4, 3], [1, 1, 1, 1]),
    ([10, 5, 4, 3], [2, 1, 1, 1]), ([10, 5, 4, 3], [1, 2, 1, 1]), ([10, 5, 4, 3], [1, 1, 2, 1]),
    ([10, 5, 4, 3], [1, 1, 1, 2]), ([10, 5, 4, 3], [1, 1, 2, 2]), ([10, 5, 4, 3], [1, 2, 2, 2]),
    ([10, 5, 4, 3], [2, 2, 2, 2]),
]
_BCAST_LARGE = [([1280, 1, 1, 1], [1, 16, 16, 1]), ([4096, 1, 1, 1], [1, 64, 1, 1]),
                ([16, 16, 64, 1], [1, 1, 1, 1])]

_BINARY = {"ADD": (ops.add, (-1.0, 1.0)), "SUB": (ops.sub, (-1.0, 1.0)),
           "MUL": (ops.mul, (0.9, 1.1)), "DIV": (ops.div, (0.9, 1.1))}


def _binary_cases() -> list[TestCase]:
    cases = []
    for name, (fn, rng) in _BINARY.items():
        for type in (F16, F32):
            for idx, (ne, nr) in enumerate(_BCAST + _BCAST_LARGE):
                for perm1 in ((0, 1) if idx < len(_BCAST) else (0,)):
                    def build(b: Builder, fn=fn, type=type, ne=ne, nr=nr, perm1=perm1) -> Tensor:
                        a = b.new(type, [n * r for n, r in zip(ne, nr)])
                        if perm1:
                            # b stored with dims 1 and 2 swapped, permuted back: same ne, not contiguous
                            bb = b.new(type, [ne[0], ne[2], ne[1], ne[3]])
                            bb = ops.permute(b.ctx, bb, 0, 2, 1, 3)
                        else:
                            bb = b.new(type, ne)
                        return fn(b.ctx, a, bb)
                    tags = frozenset() if idx < len(_BCAST) else frozenset({"large"})
                    cases.append(TestCase(name, {"type": type, "ne": ne, "nr": nr, "perm1": perm1},
                                          build, init_range=rng, tags=tags))
        # F16 a with F32 b (ggml's mixed CPU path)
        for ne, nr in _BCAST[5:8]:
            def build(b: Builder, fn=fn, ne=ne, nr=nr) -> Tensor:
                return fn(b.ctx, b.new(F16, [n * r for n, r in zip(ne, nr)]), b.new(F32, ne))
            cases.append(TestCase(name, {"type_a": F16, "type_b": F32, "ne": ne, "nr": nr},
                                  build, init_range=rng))
    for type in (F16, F32):
        for ne in ([10, 5, 4, 3], [1024, 4, 1, 1]):
            def build(b: Builder, type=type, ne=ne) -> Tensor:
                return ops.add1(b.ctx, b.new(type, ne), b.new(type, [1]))
            cases.append(TestCase("ADD1", {"type": type, "ne": ne}, build))
    return cases


_SIMPLE = {"SQR": (ops.sqr, (-1.0, 1.0)), "SQRT": (ops.sqrt, (50.0, 100.0)),
           "LOG": (ops.log, (0.9, 1.1)), "SIN": (ops.sin, (-6.5, 6.5)),
           "COS": (ops.cos, (-6.5, 6.5))}
_SIMPLE_SHAPES = ([10, 5, 4, 3], [7, 1, 5, 3], [1024, 64, 1, 1])


def _simple_cases() -> list[TestCase]:
    cases = []
    for name, (fn, rng) in _SIMPLE.items():
        for type in (F16, F32):
            for ne in _SIMPLE_SHAPES:
                def build(b: Builder, fn=fn, type=type, ne=ne) -> Tensor:
                    return fn(b.ctx, b.new(type, ne))
                cases.append(TestCase(name, {"type": type, "ne": ne}, build, init_range=rng))
            # a transposed (non-contiguous) input
            def build_t(b: Builder, fn=fn, type=type) -> Tensor:
                return fn(b.ctx, ops.transpose(b.ctx, b.new(type, [5, 10, 4, 3])))
            cases.append(TestCase(name, {"type": type, "ne": [10, 5, 4, 3], "transposed": 1},
                                  build_t, init_range=rng))
    for type in (F16, F32):
        for ne in _SIMPLE_SHAPES:
            def build(b: Builder, type=type, ne=ne) -> Tensor:
                return ops.clamp(b.ctx, b.new(type, ne), -0.5, 0.5)
            cases.append(TestCase("CLAMP", {"type": type, "ne": ne, "min": -0.5, "max": 0.5},
                                  build))
            for slope in (0.1,):
                def build_l(b: Builder, type=type, ne=ne, slope=slope) -> Tensor:
                    return ops.leaky_relu(b.ctx, b.new(type, ne), slope, False)
                cases.append(TestCase("LEAKY_RELU", {"type": type, "ne_a": ne,
                                                     "negative_slope": slope}, build_l))
    def build_li(b: Builder) -> Tensor:
        return ops.leaky_relu(b.ctx, b.new(F32, [10, 5, 4, 3]), 0.01, True)
    cases.append(TestCase("LEAKY_RELU", {"type": F32, "ne_a": [10, 5, 4, 3],
                                         "negative_slope": 0.01, "inplace": 1}, build_li))
    for ne, s, bias, inplace in (([10, 10, 10, 10], 2.0, 0.0, 0), ([10, 10, 10, 10], 2.0, 1.0, 0),
                                 ([10, 10, 10, 10], 2.0, 0.0, 1), ([100, 10, 10, 10], 0.5, 0.25, 0),
                                 ([10, 10, 10, 10], 2.0, 1.0, 1)):
        def build_s(b: Builder, ne=ne, s=s, bias=bias, inplace=inplace) -> Tensor:
            a = b.new(F32, ne)
            f = ops.scale_bias_inplace if inplace else ops.scale_bias
            return f(b.ctx, a, s, bias)
        cases.append(TestCase("SCALE", {"type": F32, "ne": ne, "scale": s, "bias": bias,
                                        "inplace": inplace}, build_s))
    return cases


def elementwise_cases() -> list[TestCase]:
    """Every element-wise case (UNARY, GLU, binary, simple math, CLAMP, LEAKY_RELU, SCALE)."""
    return _unary_cases() + _glu_cases() + _binary_cases() + _simple_cases()

