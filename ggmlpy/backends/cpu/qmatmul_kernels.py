"""The Numba kernels behind :mod:`ggmlpy.backends.cpu.qmatmul` (imported by it on first use only;
importing this module imports Numba). Module-level functions so that Numba's on-disk cache
(``cache=True``) finds them again in a later process. Shapes and layouts are checked by the
caller, not here.

The block kernels (:func:`legacy_lanes`, :func:`kquant_lanes`) compute ``out[n, m]`` for the
weight rows ``m0 <= m < m1`` and every activation row ``n``, each row's sum in ggml's SIMD shape
(exact int32 block sums in 8 lanes, float32 lanes with fused multiply-adds, a fixed tree at the
end: :mod:`ggmlpy.backends.cpu.qmatmul_ir`; the bound against the referee is in
:mod:`ggmlpy.backends.cpu.qmatmul`). Every output is computed in one fixed order, so results do
not depend on how the rows are split over threads.

Arguments of the block kernels: ``w`` uint8 ``(M, row_bytes)`` the weight's rows as they lie;
``yq`` int8 ``(N, K)`` the activation quants; ``yd`` float32 ``(N, nb)`` their scales; ``yx``
float32 ``(N, nb)`` Q8_1's ``s`` or int32 ``(N, nb * 16)`` Q8_K's ``bsums`` (unused otherwise);
``out`` float32 ``(N, M)``; ``tbl`` float32 ``(65536,)`` the value of every f16 bit pattern
(ggml's ``ggml_table_f32_f16``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM as _ZMM
from ggmlpy.backends.cpu.legacy_zmm_ir import (
    zrow44_q4_1,
    zrow44_q5_1,
    zrow84_q4_0,
    zrow84_q5_0,
    zrow84_q8_0,
)
from ggmlpy.backends.cpu.qmatmul_ir import (
    H16_STEP,
    Q8_X86_VECTOR,
    VNNI,
    block_absmax,
    block_first_abs,
    legacy_offsets,
    q8_block_x86,
    row2w_q4_0,
    row2w_q4_1,
    row2w_q5_0,
    row2w_q5_1,
    row2w_q8_0,
    row4_q4_0,
    row4_q4_1,
    row4_q4_K,
    row4_q5_0,
    row4_q5_1,
    row4_q5_K,
    row4_q6_K,
    row4_q8_0,
    row44_q4_0,
    row44_q4_1,
    row44_q5_0,
    row44_q5_1,
    row44_q8_0,
    row_h16,
    row_h16z,
    row_q4_0,
    row_q4_1,
    row_q4_K,
    row_q4_K_gemv,
    row_q5_0,
    row_q5_1,
    row_q5_K,
    row_q6_K,
    row_q8_0,
)

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)
F32 = np.float32

#: added to a legacy kind code (0-4) for :func:`legacy_rows` to compute its prompt-batch tiles
#: in 512-bit registers (:mod:`ggmlpy.backends.cpu.legacy_zmm_ir`, the same bits; only where
#: its ``ZMM`` holds)
ZMM_FLAG = 8
#: whether :func:`half_dot` runs its 16-lane accumulators in 512-bit registers (row_h16z, the
#: same bits; where the CPU has AVX512-F, -BW and -VNNI: a constant of the compiled code)
H16_ZMM = _ZMM
#: whether :func:`quant_q8` runs its x86 form in vector code (qmatmul_ir.q8_block_x86)
HAS_AVX = Q8_X86_VECTOR


@njit(**_OPTS)
def legacy_offsets_for(yq, kind):
    """The int32 offset sums ``(N, nb * 8)`` the VNNI rows start from
    (:func:`ggmlpy.backends.cpu.qmatmul_ir.legacy_offsets`) for int8 activations ``yq`` ``(N,
    K)``; a ``(1, 8)`` placeholder without VNNI (``kind``: the legacy kind code, with or without
    :data:`ZMM_FLAG`)."""
    N = yq.shape[0]
    yo = np.empty((N, (yq.shape[1] // 32) * 8) if VNNI else (1, 8), np.int32)
    if VNNI:
        legacy_offsets(yq, yo, kind & 7)
    return yo


@njit(**_OPTS)
def legacy_lanes(w, yq, yd, yx, out, m0, m1, mo, kind, tbl):
    """Q4_0 (kind 0), Q4_1 (1), Q5_0 (2), Q5_1 (3), Q8_0 (4) rows against Q8_0/Q8_1:
    :func:`legacy_rows` with the activations' offset sums made here (:func:`legacy_offsets_for`)
    for the call's rows."""
    legacy_rows(w, yq, yd, yx, legacy_offsets_for(yq, kind), out, m0, m1, mo, kind, tbl)


@njit(**_OPTS)
def legacy_rows(w, yq, yd, yx, yo, out, m0, m1, mo, kind, tbl):
    """Q4_0 (kind 0), Q4_1 (1), Q5_0 (2), Q5_1 (3), Q8_0 (4) rows ``m0 <= m < m1`` against
    Q8_0/Q8_1 activations (``yx``: Q8_1's sums, or any float32 ``(N, nb)`` for Q8_0; ``yo``:
    :func:`legacy_offsets_for` of ``yq`` and ``kind``), compiled row dots
    (:mod:`ggmlpy.backends.cpu.qmatmul_ir`): with :data:`ZMM_FLAG` added to ``kind``, tiles of
    eight (Q4_1/Q5_1: four) weight rows by four activation rows in 512-bit registers
    (:mod:`ggmlpy.backends.cpu.legacy_zmm_ir`), then tiles of four weight rows by four
    activation rows (``row44_q4_0`` and the others), the weight rows left over four activation
    rows at a time (``row4_*``), the activation rows left over two weight rows at a time
    (``row2w_*``, then ``row_*``); row ``m``'s results go to column ``m - mo`` of ``out``.
    Every output's operations are the same in each of these."""
    N = yq.shape[0]
    nb = yq.shape[1] // 32
    N4 = N - N % 4
    mt = m0
    if kind >= ZMM_FLAG:
        kind = kind & 7
        P = 4 if kind == 1 or kind == 3 else 8
        mt = m1 - (m1 - m0) % P
        for m in range(m0, mt, P):
            for n in range(0, N4, 4):
                if kind == 0:
                    zrow84_q4_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
                elif kind == 1:
                    zrow44_q4_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
                elif kind == 2:
                    zrow84_q5_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
                elif kind == 3:
                    zrow44_q5_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
                else:
                    zrow84_q8_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
    m4 = m1 - (m1 - mt) % 4
    for m in range(mt, m4, 4):
        for n in range(0, N4, 4):
            if kind == 0:
                row44_q4_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 1:
                row44_q4_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 2:
                row44_q5_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 3:
                row44_q5_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            else:
                row44_q8_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
    for m in range(m4, m1):
        for n in range(0, N4, 4):
            if kind == 0:
                row4_q4_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 1:
                row4_q4_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 2:
                row4_q5_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 3:
                row4_q5_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            else:
                row4_q8_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
    if N4 == N:
        return
    m2 = m1 - (m1 - m0) % 2
    for m in range(m0, m2, 2):  # the other activation rows: two weight rows at a time
        for n in range(N4, N):
            if kind == 0:
                row2w_q4_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 1:
                row2w_q4_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 2:
                row2w_q5_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 3:
                row2w_q5_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            else:
                row2w_q8_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
    for m in range(m2, m1):
        for n in range(N4, N):
            if kind == 0:
                row_q4_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 1:
                row_q4_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 2:
                row_q5_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            elif kind == 3:
                row_q5_1(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)
            else:
                row_q8_0(w, m, yq, yd, yx, yo, n, out, m - mo, tbl, nb)


@njit(**_OPTS)
def kquant_lanes(w, yq, yd, yx, out, m0, m1, mo, kind, tbl):
    """Q4_K (kind 0, 144-byte super-blocks), Q5_K (1, 176) and Q6_K (2, 210) rows against Q8_K,
    one compiled row dot per weight row and four activation rows at a time
    (:func:`ggmlpy.backends.cpu.qmatmul_ir.row4_q4_K` and the others); kind 3: Q4_K in
    llama.cpp's repacked gemv order, one activation row at a time
    (:func:`~ggmlpy.backends.cpu.qmatmul_ir.row_q4_K_gemv`); row ``m``'s results go to column
    ``m - mo`` of ``out``."""
    N = yq.shape[0]
    nb = yq.shape[1] // 256
    N4 = 0 if kind == 3 else N - N % 4
    for m in range(m0, m1):
        wr = w[m]
        for n in range(0, N4, 4):
            if kind == 0:
                row4_q4_K(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 1:
                row4_q5_K(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            else:
                row4_q6_K(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
        for n in range(N4, N):
            if kind == 3:
                row_q4_K_gemv(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 0:
                row_q4_K(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 1:
                row_q5_K(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            else:
                row_q6_K(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)


@njit(inline="always", **_OPTS)
def _f16v(h):
    """f16 bits (int32 0..65535) -> float32 without branches (vectorizes): exponent rebias,
    inf/NaN widened, subnormals renormalized through one float subtraction (exact)."""
    o = (h & 0x7FFF) << 13
    e = o & 0x0F800000
    o += (127 - 15) << 23
    o = o + ((128 - 16) << 23) if e == 0x0F800000 else o
    sub = np.int32(o + (1 << 23)).view(np.float32) - np.int32(113 << 23).view(np.float32)
    v = sub if e == 0 else np.int32(o).view(np.float32)
    return np.int32(np.float32(v).view(np.int32) | ((h & 0x8000) << 16)).view(np.float32)


@njit(**_OPTS)
def half_dot(w, y, out, m0, m1, mo, bf):
    """F16 (``bf`` False) or BF16 (True) weight rows (uint16 bits ``(M, K)``) against activations
    rounded to that type, held as float32 ``(N, K)``, as ggml's AVX512 ``ggml_vec_dot_f16``
    sums them: the first ``K - K mod 64`` products in 4 x 16 float32 lanes with fused
    multiply-adds (:func:`ggmlpy.backends.cpu.qmatmul_ir.row_h16`), that sum widened to float64
    and the tail products added to it in order in float64, then rounded to float32; row ``m``'s
    results go to column ``m - mo`` of ``out``."""
    N, K = y.shape
    K64 = K - K % H16_STEP
    for m in range(m0, m1):
        wr = w[m]
        for n in range(N):
            yr = y[n]
            if H16_ZMM:  # (a compile-time constant: the other branch is not compiled)
                s = np.float64(row_h16z(wr, yr, K64 // H16_STEP, bf))
            else:
                s = np.float64(row_h16(wr, yr, K64 // H16_STEP, bf))
            for k in range(K64, K):
                h = np.int32(wr[k])
                v = np.int32(h << 16).view(np.float32) if bf else _f16v(h)
                s += np.float64(v * yr[k])
            out[n, m - mo] = F32(s)


@njit(inline="always", **_OPTS)
def _maxps(a, b):
    """x86 ``maxps``: ``a > b ? a : b`` (a NaN in either operand gives ``b``)."""
    return a if a > b else b


@njit(inline="always", **_OPTS)
def _amax_x86(x, n, p, m):
    """``amax`` of the block ``x[n, p:p + 32]`` in ggml-cpu/arch/x86/quants.c's ``maxps`` order
    (four 8-lane vectors, then the horizontal tree), ``m`` an 8-float scratch."""
    for ln in range(8):
        m[ln] = abs(x[n, p + ln])
    for c in range(8, 32, 8):
        for ln in range(8):
            m[ln] = _maxps(m[ln], abs(x[n, p + c + ln]))
    a0 = _maxps(_maxps(m[4], m[0]), _maxps(m[6], m[2]))
    a1 = _maxps(_maxps(m[5], m[1]), _maxps(m[7], m[3]))
    return _maxps(a0, a1)


@njit(inline="always", **_OPTS)
def _wrap32(s):
    """An integer sum taken modulo 2**32 as a signed int32 (C's wrapping int32 adds)."""
    return np.int32(((np.int64(s) + 2147483648) & 0xFFFFFFFF) - 2147483648)


@njit(**_OPTS)
def quant_q8(x, yq, yd, ys, kind):
    """Activation rows float32 ``(N, K)`` -> Q8_0 / Q8_1 quants ``yq`` int8 ``(N, K)``, float32
    scales ``yd`` ``(N, K/32)`` and (Q8_1) ``ys = sum(q) * d``, before the scales' f16 rounding
    (the caller rounds them). ``kind = t + 2 * form``: ``t`` 0 Q8_0, 1 Q8_1; ``form`` the rounding
    of :mod:`ggmlpy.quants.q8_arch`: 0 ``"ref"`` as :func:`ggmlpy.quants.q8.quantize_row_q8_0`
    (NaN scales and 0 quants for a block with non-finite input), 1 ``"x86"`` as
    :func:`~ggmlpy.quants.q8_arch.quantize_row_q8_0_x86`, 2 ``"arm"`` as
    :func:`~ggmlpy.quants.q8_arch.quantize_row_q8_0_arm` (``_q8_1`` for Q8_1), bit for bit."""
    N, K = x.shape
    q81 = kind & 1
    form = kind >> 1
    m = np.empty(8, np.float32)
    # the x86 form in vector code where the rows are contiguous (the same bits)
    vec = form == 1 and HAS_AVX and x.strides[1] == 4 and yq.strides[1] == 1
    for n in range(N):
        for b in range(K // 32):
            p = b * 32
            if vec:
                q8_block_x86(x, n, p, yq, yd, ys, b, q81)
                continue
            if form != 0:
                if form == 1:
                    amax = _amax_x86(x, n, p, m)
                    d = amax / F32(127)
                    idv = F32(127) / amax if amax != F32(0) else F32(0)
                else:
                    amax = F32(0)
                    for j in range(32):
                        v = abs(x[n, p + j])
                        amax = v if (v > amax or v != v) else amax
                    d = amax / F32(127)
                    idv = F32(1) / d if d != F32(0) else F32(0)
                s = np.int64(0)
                for j in range(32):
                    r = np.rint(x[n, p + j] * idv)
                    if form == 1:
                        # cvtps2dq (0x80000000 for NaN / out of range), then saturating packs
                        iv = np.int64(r) if abs(r) < F32(2147483648.0) else np.int64(-2147483648)
                        q = min(max(iv, -128), 127)
                    else:
                        # vcvtnq_s32_f32 (saturating, NaN to 0), stored as its low byte
                        iv = (np.int64(0) if r != r else np.int64(2147483647)
                              if r >= F32(2147483648.0) else np.int64(-2147483648)
                              if r < F32(-2147483648.0) else np.int64(r))
                        q = ((iv + 128) & 255) - 128
                    yq[n, p + j] = np.int8(q)
                    s += iv
                yd[n, b] = d
                if q81 == 1:
                    ys[n, b] = d * F32(_wrap32(s))
                continue
            amax = F32(0)
            bad = False
            for j in range(32):
                v = abs(x[n, p + j])
                amax = v if v > amax else amax
                bad = bad or not (v < F32(np.inf))
            d = amax / F32(127)
            idv = F32(1) / d if d != F32(0) else F32(0)
            s = np.int32(0)
            for j in range(32):
                v = x[n, p + j] * idv
                t = np.trunc(v)
                r = t
                if abs(v - t) >= F32(0.5):
                    r = t + (F32(1) if v > F32(0) else F32(-1))
                q = np.int8(np.int32(r)) if abs(r) < F32(256) else np.int8(0)
                q = np.int8(0) if bad else q
                yq[n, p + j] = q
                s += np.int32(q)
            yd[n, b] = F32(np.nan) if bad else d
            if q81 == 1:
                ys[n, b] = F32(np.nan) if bad else F32(s) * d


@njit(inline="always", **_OPTS)
def _absmax_scan(x, n, p):
    """ggml-quants.c ``quantize_row_q8_K_ref``'s scan of ``x[n, p:p + 256]``: ``amax``, the
    value where it was found, and whether a value is inf or NaN."""
    amax = F32(0)
    mx = F32(0)
    bad = False
    for j in range(256):
        v = x[n, p + j]
        av = abs(v)
        if av > amax:
            amax = av
            mx = v
        bad = bad or not (av < F32(np.inf))
    return amax, mx, bad


@njit(**_OPTS)
def quant_q8_k(x, yq, yd, bs):
    """Activation rows float32 ``(N, K)`` -> Q8_K quants, float32 ``d`` and int32 ``bsums``
    ``(N, K/16)``, as :func:`ggmlpy.quants.q8.quantize_row_q8_K` computes them (each block's
    ``amax`` in 8-lane passes where the rows are contiguous, else by ggml's scan)."""
    N, K = x.shape
    for n in range(N):
        for b in range(K // 256):
            p = b * 256
            if x.strides[1] == 4:
                # amax and the value where ggml's sequential scan found it, in 8-lane passes
                amax = block_absmax(x, n, p)
                bad = amax != amax
                mx = x[n, p + block_first_abs(x, n, p, amax)] if amax > F32(0) else F32(0)
            else:
                amax, mx, bad = _absmax_scan(x, n, p)
            if amax == F32(0) or bad:
                for j in range(256):
                    yq[n, p + j] = 0
                for j in range(16):
                    bs[n, b * 16 + j] = 0
                yd[n, b] = F32(np.nan) if bad else F32(0)
                continue
            iscale = F32(-127) / mx
            for j in range(256):
                f = iscale * x[n, p + j] + F32(12582912.0)
                i = (np.float32(f).view(np.int32) & 0x007FFFFF) - 0x00400000
                yq[n, p + j] = np.int8(i if i < 127 else 127)
            for j in range(16):
                s = np.int32(0)
                for l in range(16):
                    s += np.int32(yq[n, p + 16 * j + l])
                bs[n, b * 16 + j] = s
            yd[n, b] = F32(1) / iscale
