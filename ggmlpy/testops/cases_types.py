"""test-backend-ops cases over ggml's element types: MUL_MAT with an F16, BF16
or block-quantized ``src0`` and F32 ``src1``, GET_ROWS from every type, SET_ROWS into every
type, and CPY/DUP between F32/F16/BF16 and every block type, with ggml's thresholds:

* MUL_MAT: NMSE 5e-4 (ggml's ``max_nmse_err`` for MUL_MAT).
* GET_ROWS: ggml's default 1e-7 (a dequantization is exact, so backends agree bit for bit).
* CPY into Q4_0/Q4_1/Q5_0/Q5_1/Q8_0: ggml's "one quantization step" estimate
  ``(base**2) / (0.25 * 150**2 * nelements)`` with ``base = 150/8`` (Q4), ``/2`` for Q5, ``/8``
  for Q8 (ggml's ``test_cpy::max_nmse_err``); into the same type: 0; into anything else: 1e-6.
  SET_ROWS from F32 takes CPY's threshold for the same destination type.

Inputs of block types hold quantized uniform values (see :func:`~.case.TestCase.initial_data`).
BF16 arithmetic (ADD, MUL, GELU) is listed too, as ggml lists every type; the NumPy kernels do
not compute it, so those cases report "not supported".
"""

from __future__ import annotations

from ggmlpy import ops
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type
from ggmlpy.testops.case import Builder, TestCase, init_ints
from ggmlpy.testops.cases_layout import set_rows_case
from ggmlpy.testops.cases_nn import _mm_case

__all__ = ["type_cases", "BLOCK_TYPES", "cpy_nmse"]

#: every block-quantized type ggmlpy knows, in ggml's id order
BLOCK_TYPES = (Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K,
               Type.Q6_K)
_F32, _F16, _BF16 = Type.F32, Type.F16, Type.BF16


def cpy_nmse(src: Type, dst: Type, nelements: int) -> float:
    """ggml's CPY threshold for copying ``nelements`` values from ``src`` to ``dst`` (values of
    magnitude up to 150, ggml's CPY initialisation)."""
    if src == dst:
        return 0.0
    legacy = {Type.Q4_0: 1.0, Type.Q4_1: 1.0, Type.Q5_0: 0.5, Type.Q5_1: 0.5, Type.Q8_0: 1 / 8}
    if dst in legacy:
        base = 150.0 / 8 * legacy[dst]
        return base * base / (0.25 * 150.0 * 150.0 * nelements)
    return 1e-6


def _get_rows_case(t: Type, n: int, m: int, r: int, be1: int) -> TestCase:
    def build(b: Builder) -> Tensor:
        idx = b.new(Type.I32, [r, be1, 1], init=init_ints(0, m))
        return ops.get_rows(b.ctx, b.new(t, [n, m, be1, 1]), idx)
    return TestCase("GET_ROWS", {"type": t, "n": n, "m": m, "r": r, "be1": be1, "be2": 1, "v": 0},
                    build)


def _cpy_case(src: Type, dst: Type, ne: list[int]) -> TestCase:
    def build(b: Builder) -> Tensor:
        return ops.cpy(b.ctx, b.new(src, ne), b.new(dst, ne))
    n = ne[0] * ne[1] * ne[2] * ne[3]
    return TestCase("CPY", {"type_src": src, "type_dst": dst, "ne": ne,
                            "permute_src": [0, 1, 2, 3]}, build, max_nmse=cpy_nmse(src, dst, n),
                    init_range=(-150.0, 150.0))


def type_cases() -> list[TestCase]:
    """Every type case, in a fixed order (see the module docstring)."""
    cases: list[TestCase] = []
    for t in BLOCK_TYPES + (_BF16,):
        for n in (1, 8):
            cases.append(_mm_case(t, _F32, 16, n, 256))
        cases.append(_mm_case(t, _F32, 16, 3, 256, bs=(2, 3), nr=(2, 1)))
        for be1 in (1, 3):
            cases.append(_get_rows_case(t, 256, 10, 5, be1))
        for src, dst in ((_F32, t), (t, _F32), (_F16, t), (t, _F16)):
            cases.append(_cpy_case(src, dst, [256, 4, 1, 1]))
        cases.append(set_rows_case(t, Type.I64, [256, 5, 1, 3], (1, 1), 2, 0,
                                   cpy_nmse(_F32, t, 256 * 2 * 3)))
    cases.append(_cpy_case(_BF16, Type.Q8_0, [256, 2, 1, 1]))
    cases.append(_cpy_case(Type.Q4_K, Type.Q8_0, [256, 2, 1, 1]))
    for name, fn in (("ADD", ops.add), ("MUL", ops.mul)):
        def build_b(b: Builder, fn=fn) -> Tensor:
            return fn(b.ctx, b.new(_BF16, [10, 5, 4, 3]), b.new(_BF16, [10, 5, 4, 3]))
        cases.append(TestCase(name, {"type": _BF16, "ne": [10, 5, 4, 3], "nr": [1, 1, 1, 1],
                                     "perm1": 0}, build_b))

    def build_u(b: Builder) -> Tensor:
        return ops.gelu(b.ctx, b.new(_BF16, [128, 2, 2, 2]))
    cases.append(TestCase("GELU", {"type": _BF16, "ne_a": [128, 2, 2, 2], "v": 0}, build_u,
                          family="UNARY"))
    return cases
