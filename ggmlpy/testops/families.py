"""The case lists of test-backend-ops: every eval case (test and support modes) and the perf list.

Counts per op family are printed by ``python -m ggmlpy test-backend-ops --list``.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

from ggmlpy import ops
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type
from ggmlpy.testops.case import Builder, TestCase
from ggmlpy.testops.cases_elementwise import elementwise_cases
from ggmlpy.testops.cases_layout import layout_cases
from ggmlpy.testops.cases_nn import _fa_case, _mm_case, nn_cases
from ggmlpy.testops.cases_types import type_cases

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
    """The cases over ggml's element types (:func:`.cases_types.type_cases`)."""
    return type_cases()
