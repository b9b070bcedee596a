"""Float32 lane building blocks for the kernels that reproduce ggml-cpu's float32 order
(:mod:`.soft_max_ggml_kernel`, :mod:`.repack_q4k_kernel`, :mod:`.sgemm_f16_kernel`,
:mod:`.sgemm_f32_kernel`, :mod:`.jit_kernels`' NORM): the Numba intrinsic :func:`fma32` (float32
fused multiply-add, ``llvm.fma.f32``, one rounding: what ``_mm*_fmadd_ps`` lanes compute) and
LLVM IR helpers for intrinsics that hold ggml's AVX-512 registers as ``<16 x float>`` vectors
(:func:`vtype`, :func:`vload`, :func:`reduce512` = ``_mm512_reduce_add_ps``, :func:`reduce2048`
= ``GGML_F32x16_REDUCE``). Importing this module imports Numba.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["fma32", "vtype", "vload", "reduce512", "reduce2048"]

_F = ir.FloatType()
_I32 = ir.IntType(32)


@intrinsic
def fma32(typingctx, a, b, c):
    """``a * b + c`` in float32 with one rounding (``llvm.fma.f32``); float32 arguments."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F, [_F] * 3),
                                            "llvm.fma.f32")
        return builder.call(fn, list(args))
    return sig, codegen


def vtype(n: int) -> ir.VectorType:
    """The LLVM type ``<n x float>`` (``n`` float32 lanes)."""
    return ir.VectorType(_F, n)


def _half(builder: ir.IRBuilder, v: ir.Value, n: int, hi: bool) -> ir.Value:
    idx = list(range(n // 2, n)) if hi else list(range(n // 2))
    return builder.shuffle_vector(v, ir.Constant(vtype(n), ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, n // 2), idx))


def reduce512(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """``_mm512_reduce_add_ps`` of a ``<16 x float>``: upper half + lower half down to one
    lane; returns the float32 value."""
    n = 16
    while n > 1:
        v = builder.fadd(_half(builder, v, n, True), _half(builder, v, n, False))
        n //= 2
    return builder.extract_element(v, ir.Constant(_I32, 0))


def reduce2048(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """``GGML_F32x16_REDUCE`` of four 16-lane registers held as one ``<64 x float>``: registers
    0+2 and 1+3, then their sum, then :func:`reduce512`."""
    r = [builder.shuffle_vector(v, ir.Constant(vtype(64), ir.Undefined),
                                ir.Constant(ir.VectorType(_I32, 16), list(range(16 * j, 16 * j + 16))))
         for j in range(4)]
    return reduce512(builder, builder.fadd(builder.fadd(r[0], r[2]), builder.fadd(r[1], r[3])))


def vload(context: Any, builder: ir.IRBuilder, aty: Any, arr: ir.Value, off: ir.Value,
          n: int) -> ir.Value:
    """Inside an intrinsic's codegen: the ``<n x float>`` at element ``off`` of the float32
    array ``arr`` (Numba type ``aty``), unaligned; no bounds check."""
    a = context.make_array(aty)(context, builder, arr)
    p = builder.gep(a.data, [off])
    return builder.load(builder.bitcast(p, vtype(n).as_pointer()), align=4)
