"""Float32 lane building blocks for the kernels that reproduce ggml-cpu's float32 order
(:mod:`.soft_max_ggml_kernel`, :mod:`.repack_q4k_kernel`, :mod:`.sgemm_f16_kernel`,
:mod:`.sgemm_f32_kernel`, :mod:`.jit_kernels`' NORM): the Numba intrinsic :func:`fma32` (float32
fused multiply-add, ``llvm.fma.f32``, one rounding: what ``_mm*_fmadd_ps`` lanes compute) and
LLVM IR helpers for intrinsics that hold ggml's AVX-512 registers as ``<16 x float>`` vectors
(:func:`vtype`, :func:`vload`, :func:`reduce512` = ``_mm512_reduce_add_ps``, :func:`reduce2048`
= ``GGML_F32x16_REDUCE``), and :func:`fma_lanes_dot`, one dot product in such lanes. Importing
this module imports Numba.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["fma32", "vtype", "vload", "reduce512", "reduce2048", "fma_lanes_dot"]

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


def fma_lanes_dot(width: int) -> Any:
    """An intrinsic ``dot(a, ao, b, bo, nv)``: ``width`` float32 lanes, lane ``l`` computing
    ``acc = fma(a[ao + width*j + l], b[bo + width*j + l], acc)`` for ``j < nv`` in turn from 0;
    returns the lanes reduced to one float32 (16 lanes: :func:`reduce512`, 64 lanes:
    :func:`reduce2048`). ``a``, ``b``: 1-D float32 C-contiguous arrays; the caller guarantees
    the bounds. (For f16 values widened to float32 the products are exact, so the fused and the
    separate multiply-add round alike.)"""

    @intrinsic
    def dot(typingctx, a, ao, b, bo, nv):
        sig = types.float32(a, ao, b, bo, nv)

        def codegen(context, builder, signature, args):
            aarr, ao_, barr, bo_, nv_ = args
            aty, bty = signature.args[0], signature.args[2]
            vt = vtype(width)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vt, [vt] * 3), f"llvm.fma.v{width}f32")
            acc = cgutils.alloca_once_value(builder, ir.Constant(vt, [0.0] * width))
            w = ir.Constant(ir.IntType(64), width)
            with cgutils.for_range(builder, nv_) as loop:
                off = builder.mul(loop.index, w)
                va = vload(context, builder, aty, aarr, builder.add(ao_, off), width)
                vb = vload(context, builder, bty, barr, builder.add(bo_, off), width)
                builder.store(builder.call(fma, [va, vb, builder.load(acc)]), acc)
            v = builder.load(acc)
            return reduce2048(builder, v) if width == 64 else reduce512(builder, v)
        return sig, codegen
    return dot
