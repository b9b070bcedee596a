"""The case lists of test-backend-ops: every eval case (test and support modes) and the perf list.

Counts per op family are printed by ``python -m ggmlpy test-backend-ops --list``.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

from .. import ops
from ..tensor import Tensor
from ..types import Type
from .case import Builder, TestCase
from .cases_elementwise import elementwise_cases
from .cases_layout import layout_cases
from .cases_nn import _fa_case, _mm_case, nn_cases

__all__ = ["all_cases", "perf_cases", "family_counts", "type_coverage_cases"]


@lru_cache(maxsize=1)
def _all() -> tuple[TestCase, ...]:
    cases = elementwise_cases() + layout_cases() + nn_cases() + type_coverage_cases()
    dup = [n for n, k in Counter(c.name for c in cases).items() if k > 1]
    if dup:
        raise RuntimeError(f"duplicate test case names: {sorted(dup)[:5]}")
    return tuple(cases)


def all_cases() -> list[TestCase]:
    """Every eval case, in a fixed order (a new list each call; the cases are shared)."""
    return list(_all())


def family_counts(cases: list[TestCase] | None = None) -> dict[str, int]:
    """Number of cases per op family (``UNARY``, ``ADD``, ``MUL_MAT``, ...)."""
    out: dict[str, int] = {}
    for c in (all_cases() if cases is None else cases):
        out[c.family] = out.get(c.family, 0) + 1
    return out


def perf_cases() -> list[TestCase]:
    """Model-sized cases for perf mode (ggml's ``make_test_cases_perf``, scaled for NumPy)."""
    F32, F16 = Type.F32, Type.F16
    cases: list[TestCase] = []
    for ne, nr in (([4096, 1, 1, 1], [1, 512, 1, 1]), ([384, 128, 1, 1], [1, 1, 1, 1])):
        for name, fn in (("ADD", ops.add), ("MUL", ops.mul)):
            def build(b: Builder, fn=fn, ne=ne, nr=nr) -> Tensor:
                return fn(b.ctx, b.new(F32, [n * r for n, r in zip(ne, nr)]), b.new(F32, ne))
            cases.append(TestCase(name, {"type": F32, "ne": ne, "nr": nr, "perf": 1}, build))
    for ne in ([4096, 512, 1, 1], [384, 128, 12, 1]):
        def build_sm(b: Builder, ne=ne) -> Tensor:
            return ops.soft_max(b.ctx, b.new(F32, ne))
        cases.append(TestCase("SOFT_MAX", {"type": F32, "ne": ne, "perf": 1}, build_sm))
        def build_rn(b: Builder, ne=ne) -> Tensor:
            return ops.rms_norm(b.ctx, b.new(F32, ne), 1e-6)
        cases.append(TestCase("RMS_NORM", {"type": F32, "ne": ne, "perf": 1}, build_rn))
        def build_g(b: Builder, ne=ne) -> Tensor:
            return ops.gelu(b.ctx, b.new(F32, ne))
        cases.append(TestCase("GELU", {"type": F32, "ne_a": ne, "perf": 1}, build_g,
                              family="UNARY"))
        def build_c(b: Builder, ne=ne) -> Tensor:
            return ops.cont(b.ctx, ops.transpose(b.ctx, b.new(F32, ne)))
        cases.append(TestCase("CONT", {"type": F32, "ne": ne, "kind": "transpose", "perf": 1},
                              build_c))
    for ta in (F32, F16):
        for m, n, k in ((4096, 1, 4096), (4096, 32, 4096), (384, 128, 384), (1536, 128, 384),
                        (4096, 512, 4096)):
            cases.append(_mm_case(ta, F32, m, n, k))
    for type_kv in (F32, F16):
        for hs, nh, kv, nb in ((64, 12, 128, 128), (128, 32, 1024, 1), (128, 32, 1024, 32)):
            cases.append(_fa_case(hs, hs, nh, 1, 1, kv, nb, 1, 0.0, 0.0, type_kv))
    return cases


def type_coverage_cases() -> list[TestCase]:
    """Cases in types the NumPy kernels do not compute (BF16, Q8_0, Q4_0), as ggml lists every
    type: they show up as "not supported" in test mode and fill the support table. A backend that
    supports them is compared like any other case (no float64 reference for these types)."""
    BF16, Q8, Q4, F32 = Type.BF16, Type.Q8_0, Type.Q4_0, Type.F32
    cases: list[TestCase] = []
    for t in (BF16, Q8, Q4):
        for n in (1, 8):
            cases.append(_mm_case(t, F32, 16, n, 256))
        def build_g(b: Builder, t=t) -> Tensor:
            from .case import init_ints
            idx = b.new(Type.I32, [5, 1, 1], init=init_ints(0, 10))
            return ops.get_rows(b.ctx, b.new(t, [64, 10, 1, 1]), idx)
        cases.append(TestCase("GET_ROWS", {"type": t, "n": 64, "m": 10, "r": 5, "be1": 1,
                                           "be2": 1, "v": 0}, build_g, max_nmse=0.0))
        for src, dst in ((F32, t), (t, F32)):
            def build_c(b: Builder, src=src, dst=dst) -> Tensor:
                return ops.cpy(b.ctx, b.new(src, [256, 4, 1, 1]), b.new(dst, [256, 4, 1, 1]))
            # one quantisation step of error on values in [-1, 1] (ggml's estimate, rounded up)
            thr = 1e-6 if dst == F32 else 1e-3
            cases.append(TestCase("CPY", {"type_src": src, "type_dst": dst, "ne": [256, 4, 1, 1],
                                          "permute_src": [0, 1, 2, 3]}, build_c, max_nmse=thr))
    for name, fn in (("ADD", ops.add), ("MUL", ops.mul)):
        def build_b(b: Builder, fn=fn) -> Tensor:
            return fn(b.ctx, b.new(BF16, [10, 5, 4, 3]), b.new(BF16, [10, 5, 4, 3]))
        cases.append(TestCase(name, {"type": BF16, "ne": [10, 5, 4, 3], "nr": [1, 1, 1, 1],
                                     "perm1": 0}, build_b))
    def build_u(b: Builder) -> Tensor:
        return ops.gelu(b.ctx, b.new(BF16, [128, 2, 2, 2]))
    cases.append(TestCase("GELU", {"type": BF16, "ne_a": [128, 2, 2, 2], "v": 0}, build_u,
                          family="UNARY"))
    return cases
