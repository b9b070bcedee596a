"""The Numba kernels behind :mod:`ggmlpy.backends.cpu.sgemm_f32` (imported by it on first use
only; importing this module imports Numba). Module-level functions, so that Numba's on-disk
cache finds them again in a later process.

The float32 products are not exact, so ggml-cpu's fused multiply-adds are kept fused: the lane
intrinsic :func:`ggmlpy.backends.cpu.fma_ir.fma_lanes_dot` is ``width`` float32 lanes of
``llvm.fma`` (``_mm512_fmadd_ps``), lane ``l`` adding the products ``k = width*j + l`` in turn;
its 64 lanes (``ggml_vec_dot_f32``'s four registers) are reduced as ``GGML_F32x16_REDUCE``.
llamafile's tinyBLAS order is :func:`ggmlpy.backends.cpu.sgemm_f16_kernel.tinyblas` (fused
16-lane tiles on float32 operands, which the F16 variant widens to first). ``ggml_vec_dot_f32``'s scalar tail
(the products past the last full step of 64) is added one product at a time, each rounded before
the addition, except the last ``(K - K64) % 4``, which are fused (:func:`fma32`): that is how
GCC compiles the tail loop of vec.cpp with FMA enabled (groups of 8 and 4 multiplied as vectors,
then added in order; the last 0-3 with ``vfmadd231ss``). The tail runs across 16 weight rows at
a time on the transposed weight, so that LLVM vectorizes it without reordering any addition (no
fast-math flags).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from ggmlpy.backends.cpu.fma_ir import fma_lanes_dot, vload, vtype

F32 = np.float32
_I64 = ir.IntType(64)


_fma64 = fma_lanes_dot(64)


def _tail_tile(rn: int, rm: int):
    """An intrinsic ``tail(at, ao, mp, b, bo, kb, k0, k1, k2, acc)``: ``ggml_vec_dot_f32``'s
    tail for ``rn`` rows of ``b`` times ``16 rm`` weight rows at once, one float32 lane per
    output: lane ``l`` of block ``j`` for row ``q`` is ``acc[q*mp + 16 j + l]`` and adds
    ``at[ao + k*mp + 16 j + l] * b[bo + q*kb + k]`` for ``k0 <= k < k1`` in turn (the product
    rounded first), then fused (``llvm.fma``) for ``k1 <= k < k2``; the lanes are stored back.
    The ``rn * rm`` lanes vectors are independent chains (what hides the addition latency).
    ``at``, ``b``, ``acc``: 1-D float32 C-contiguous arrays; ``k0 <= k1 <= k2``; the caller
    guarantees the bounds. Returns 0."""

    @intrinsic
    def tail(typingctx, at, ao, mp, b, bo, kb, k0, k1, k2, acc):
        sig = types.int64(at, ao, mp, b, bo, kb, k0, k1, k2, acc)

        def codegen(context, builder, signature, args):
            at_, ao_, mp_, b_, bo_, kb_, k0_, k1_, k2_, acc_ = args
            aty, bty, cty = signature.args[0], signature.args[3], signature.args[9]
            vt = vtype(16)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vt, [vt] * 3), "llvm.fma.v16f32")
            c = context.make_array(cty)(context, builder, acc_)
            barr = context.make_array(bty)(context, builder, b_)
            undef = ir.Constant(vt, ir.Undefined)
            zeros = ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16)
            ptrs, regs = [], []
            for q in range(rn):
                for j in range(rm):
                    off = builder.add(builder.mul(ir.Constant(_I64, q), mp_), ir.Constant(_I64, 16 * j))
                    p = builder.bitcast(builder.gep(c.data, [off]), vt.as_pointer())
                    ptrs.append(p)
                    regs.append(cgutils.alloca_once_value(builder, builder.load(p, align=4)))

            def step(k, fused):
                base = builder.add(ao_, builder.mul(k, mp_))
                va = [vload(context, builder, aty, at_, builder.add(base, ir.Constant(_I64, 16 * j)), 16)
                      for j in range(rm)]
                for q in range(rn):
                    bi = builder.add(builder.add(bo_, builder.mul(ir.Constant(_I64, q), kb_)), k)
                    bk = builder.load(builder.gep(barr.data, [bi]))
                    vb = builder.shuffle_vector(
                        builder.insert_element(undef, bk, ir.Constant(_I64, 0)), undef, zeros)
                    for j in range(rm):
                        r = regs[q * rm + j]
                        cur = builder.load(r)
                        nxt = (builder.call(fma, [va[j], vb, cur]) if fused
                               else builder.fadd(cur, builder.fmul(va[j], vb)))
                        builder.store(nxt, r)

            with cgutils.for_range(builder, builder.sub(k1_, k0_)) as loop:
                step(builder.add(k0_, loop.index), False)
            with cgutils.for_range(builder, builder.sub(k2_, k1_)) as loop:
                step(builder.add(k1_, loop.index), True)
            for p, r in zip(ptrs, regs):
                builder.store(builder.load(r), p, align=4)
            return ir.Constant(_I64, 0)
        return sig, codegen
    return tail


_tail_4x2 = _tail_tile(4, 2)
_tail_4x1 = _tail_tile(4, 1)
_tail_1x4 = _tail_tile(1, 4)
_tail_1x1 = _tail_tile(1, 1)


@njit(cache=True, nogil=True, error_model="numpy")
def vec_dot(a, at, b, out, acc, A2, A3, M, K, B2, B3, N):  # pragma: no cover - compiled
    """The same product in ``ggml_vec_dot_f32``'s order (module docstring): :func:`_fma64` over
    the first ``K - K % 64`` products of each output, then the tail in order by the
    :func:`_tail_tile` intrinsics on ``at``, the weight transposed with its rows padded to
    ``Mp`` (a multiple of 16) values: the 1-D C-contiguous data of ``(A3, A2, K, Mp)``;
    ``acc``: float32 scratch of ``4 * Mp`` elements. ``a`` is read only when ``K >= 64``."""
    r2, r3 = B2 // A2, B3 // A3
    Mp = acc.shape[0] // 4
    nv = K // 64
    k64 = nv * 64
    kmul = k64 + ((K - k64) // 4) * 4   # products rounded before their addition up to here
    zero = F32(0.0)
    for i3 in range(B3):
        for i2 in range(B2):
            ia = (i3 // r3) * A2 + i2 // r2
            a0 = ia * M * K
            t0 = ia * K * Mp
            b0 = (i3 * B2 + i2) * N * K
            o0 = (i3 * B2 + i2) * N * M
            for n0 in range(0, N, 4):
                rn = min(4, N - n0)
                for q in range(rn):
                    c0 = q * Mp
                    if nv:
                        for m in range(M):
                            acc[c0 + m] = _fma64(a, a0 + m * K, b, b0 + (n0 + q) * K, nv)
                    else:
                        for m in range(Mp):
                            acc[c0 + m] = zero
                if rn == 4:
                    m0 = 0
                    while m0 + 32 <= Mp:
                        _tail_4x2(at, t0 + m0, Mp, b, b0 + n0 * K, K, k64, kmul, K, acc[m0:])
                        m0 += 32
                    if m0 < Mp:
                        _tail_4x1(at, t0 + m0, Mp, b, b0 + n0 * K, K, k64, kmul, K, acc[m0:])
                else:
                    for q in range(rn):
                        bq = b0 + (n0 + q) * K
                        cq = acc[q * Mp:]
                        m0 = 0
                        while m0 + 64 <= Mp:
                            _tail_1x4(at, t0 + m0, Mp, b, bq, K, k64, kmul, K, cq[m0:])
                            m0 += 64
                        while m0 < Mp:
                            _tail_1x1(at, t0 + m0, Mp, b, bq, K, k64, kmul, K, cq[m0:])
                            m0 += 16
                for q in range(rn):
                    orow = out[o0 + (n0 + q) * M:o0 + (n0 + q) * M + M]
                    c0 = q * Mp
                    for m in range(M):
                        orow[m] = acc[c0 + m]
