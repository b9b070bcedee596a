"""One Numba intrinsic: float32 fused multiply-add (``llvm.fma.f32``, one rounding), what
ggml-cpu's ``_mm*_fmadd_ps`` lanes compute; for the kernels that reproduce ggml's float32 order
(:mod:`.soft_max_ggml_kernel`, :mod:`.repack_q4k_kernel`). Importing this module imports Numba.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["fma32"]

_F = ir.FloatType()


@intrinsic
def fma32(typingctx, a, b, c):
    """``a * b + c`` in float32 with one rounding (``llvm.fma.f32``); float32 arguments."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F, [_F] * 3),
                                            "llvm.fma.f32")
        return builder.call(fn, list(args))
    return sig, codegen
