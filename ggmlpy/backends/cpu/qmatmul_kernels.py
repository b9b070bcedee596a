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
from numba import carray, njit

from ggmlpy.backends.cpu.qmatmul_ir import (
    f16_round,
    row4_q4_0,
    row4_q4_1,
    row4_q4_K,
    row4_q5_0,
    row4_q5_1,
    row4_q5_K,
    row4_q6_K,
    row4_q8_0,
    row_h16,
    row_q4_0,
    row_q4_1,
    row_q4_K,
    row_q5_0,
    row_q5_1,
    row_q5_K,
    row_q6_K,
    row_q8_0,
)
from ggmlpy.backends.cpu.spin import (
    DESC,
    DONE,
    RESCUE_CYCLES,
    STATES,
    TASK,
    aadd,
    acas,
    aload,
    as_ptr,
    astore,
    claim,
    publish,
    relax,
    wait_cycles,
    wait_done,
)

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)
F32 = np.float32


@njit(**_OPTS)
def legacy_lanes(w, yq, yd, yx, out, m0, m1, mo, kind, tbl):
    """Q4_0 (kind 0), Q4_1 (1), Q5_0 (2), Q5_1 (3), Q8_0 (4) rows against Q8_0/Q8_1, one
    compiled row dot per weight row and four activation rows at a time
    (:func:`ggmlpy.backends.cpu.qmatmul_ir.row4_q4_0` and the others; ``yx``: Q8_1's sums, or any
    float32 ``(N, nb)`` for Q8_0); row ``m``'s results go to column ``m - mo`` of ``out``."""
    N = yq.shape[0]
    nb = yq.shape[1] // 32
    N4 = N - N % 4
    for m in range(m0, m1):
        wr = w[m]
        for n in range(0, N4, 4):
            if kind == 0:
                row4_q4_0(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 1:
                row4_q4_1(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 2:
                row4_q5_0(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 3:
                row4_q5_1(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            else:
                row4_q8_0(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
        for n in range(N4, N):
            if kind == 0:
                row_q4_0(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 1:
                row_q4_1(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 2:
                row_q5_0(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            elif kind == 3:
                row_q5_1(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)
            else:
                row_q8_0(wr, 0, yq, yd, yx, n, out, m - mo, tbl, nb)


@njit(**_OPTS)
def kquant_lanes(w, yq, yd, yx, out, m0, m1, mo, kind, tbl):
    """Q4_K (kind 0, 144-byte super-blocks), Q5_K (1, 176) and Q6_K (2, 210) rows against Q8_K,
    one compiled row dot per weight row and four activation rows at a time
    (:func:`ggmlpy.backends.cpu.qmatmul_ir.row4_q4_K` and the others); row ``m``'s results go to
    column ``m - mo`` of ``out``."""
    N = yq.shape[0]
    nb = yq.shape[1] // 256
    N4 = N - N % 4
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
            if kind == 0:
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
    rounded to that type, held as float32 ``(N, K)``: float32 products summed in float64 lanes
    (:func:`ggmlpy.backends.cpu.qmatmul_ir.row_h16`, the first ``K - K mod 32`` elements), then
    the tail elements in order; row ``m``'s results go to column ``m - mo`` of ``out``."""
    N, K = y.shape
    K16 = K - K % 32
    for m in range(m0, m1):
        wr = w[m]
        for n in range(N):
            yr = y[n]
            s = row_h16(wr, yr, K16 // 32, bf)
            for k in range(K16, K):
                h = np.int32(wr[k])
                v = np.int32(h << 16).view(np.float32) if bf else _f16v(h)
                s += np.float64(v * yr[k])
            out[n, m - mo] = F32(s)


@njit(**_OPTS)
def quant_q8(x, yq, yd, ys, kind):
    """Activation rows float32 ``(N, K)`` -> Q8_0 (``kind`` 0) / Q8_1 (1) quants ``yq`` int8
    ``(N, K)``, float32 scales ``yd`` ``(N, K/32)`` and (Q8_1) ``ys = sum(q) * d``, as
    :func:`ggmlpy.quants.q8.quantize_row_q8_0`/``_q8_1`` compute them before the scales' f16
    rounding (the caller rounds them; NaN for a block with non-finite input)."""
    N, K = x.shape
    for n in range(N):
        for b in range(K // 32):
            p = b * 32
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
            if kind == 1:
                ys[n, b] = F32(np.nan) if bad else F32(s) * d


@njit(**_OPTS)
def quant_q8_k(x, yq, yd, bs):
    """Activation rows float32 ``(N, K)`` -> Q8_K quants, float32 ``d`` and int32 ``bsums``
    ``(N, K/16)``, as :func:`ggmlpy.quants.q8.quantize_row_q8_K` computes them."""
    N, K = x.shape
    for n in range(N):
        for b in range(K // 256):
            p = b * 256
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


# ----------------------------------------------------------------------------- threaded drivers
# A dot task (ggmlpy.backends.cpu.threads.Pool.run_dot): the weight rows in chunks of ``chunk``
# rows that the threads claim one at a time from the control block ``ctl`` (generation ``gen``,
# ggmlpy.backends.cpu.spin); ``*_chunks`` (a worker) computes claimed chunks into scratch and
# copies each out unless the caller took it over; ``*_main`` (the calling thread) first
# quantizes the activations ``x`` float32 ``(N, K)`` into ``yq``/``yd``/``yx`` with the scales'
# f16 rounding, publishes the task, computes the chunks it claims in place, then waits for the
# workers' chunks and takes over one whose worker does not finish in time (:func:`_rescue`):
# when it returns, no worker writes into ``out`` any more. ``*_main`` returns 1 without
# computing when an activation scale (or Q8_1 sum, or an F16 activation) overflowed float16,
# else 0. Which thread computes a row never changes its operations.


@njit(**_OPTS)
def quant_q8_f16(x, yq, yd, ys, kind):
    """:func:`quant_q8` and the f16 rounding of the scales (Q8_1: and sums); False when one of
    them overflowed to inf."""
    quant_q8(x, yq, yd, ys, kind)
    ok = True
    N, nb = yd.shape
    for n in range(N):
        for b in range(nb):
            d = f16_round(yd[n, b])
            yd[n, b] = d
            ok = ok and not (abs(d) == F32(np.inf))
            if kind == 1:
                s = f16_round(ys[n, b])
                ys[n, b] = s
                ok = ok and not (abs(s) == F32(np.inf))
    return ok


@njit(inline="always", **_OPTS)
def _commit(ctl, c, tmp, out, m0, m1):
    """A worker's chunk ``c`` (rows ``m0:m1`` computed into ``tmp``): copied to ``out`` unless the
    caller took the chunk over meanwhile (:func:`_rescue`)."""
    if acas(ctl, STATES + c, 0, 2):
        for n in range(out.shape[0]):
            for m in range(m0, m1):
                out[n, m] = tmp[n, m - m0]
        astore(ctl, STATES + c, 3)
        aadd(ctl, DONE, 1)


@njit(inline="always", **_OPTS)
def _own(ctl, c):
    """The caller finished chunk ``c`` (computed in place)."""
    astore(ctl, STATES + c, 3)
    aadd(ctl, DONE, 1)


@njit(inline="always", **_OPTS)
def _rescue(ctl, nch):
    """Once every chunk is claimed: wait for the workers' chunks for up to :data:`RESCUE_CYCLES`;
    then a chunk a worker still holds without having started to copy it out (a thread the
    operating system put aside) is taken over: returns its index for the caller to compute
    (the worker's copy is then dropped, :func:`_commit`), or -1 once every chunk is done."""
    if wait_cycles(ctl, DONE, nch, RESCUE_CYCLES):
        return -1
    for c in range(nch):
        if acas(ctl, STATES + c, 0, 4):
            return c
    wait_done(ctl, nch)  # the rest are being copied out
    return -1


@njit(inline="always", **_OPTS)
def _post(ctl, desc):
    """Write the task's descriptor into the control block: first the task word to generation 0
    (a worker reads a descriptor only between two loads of one live generation, :func:`serve`),
    then the words."""
    astore(ctl, TASK, 0)
    for i in range(desc.shape[0]):
        astore(ctl, DESC + i, desc[i])


@njit(**_OPTS)
def legacy_chunks(w, yq, yd, yx, out, kind, tbl, chunk, ctl, gen):
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    tmp = np.empty((out.shape[0], chunk), F32)
    while True:
        c = claim(ctl, gen, nch)
        if c < 0:
            return
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        legacy_lanes(w, yq, yd, yx, tmp, m0, m1, m0, kind, tbl)
        _commit(ctl, c, tmp, out, m0, m1)


@njit(**_OPTS)
def legacy_main(x, qkind, desc, w, yq, yd, yx, out, kind, tbl, chunk, ctl, gen):
    if not quant_q8_f16(x, yq, yd, yx, qkind):
        return 1
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    _post(ctl, desc)
    publish(ctl, gen, nch)
    c = claim(ctl, gen, nch)
    while c >= 0:
        legacy_lanes(w, yq, yd, yx, out, c * chunk, min(M, c * chunk + chunk), 0, kind, tbl)
        _own(ctl, c)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch)
    while c >= 0:
        legacy_lanes(w, yq, yd, yx, out, c * chunk, min(M, c * chunk + chunk), 0, kind, tbl)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch)
    return 0


@njit(**_OPTS)
def kquant_chunks(w, yq, yd, yx, out, kind, tbl, chunk, ctl, gen):
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    tmp = np.empty((out.shape[0], chunk), F32)
    while True:
        c = claim(ctl, gen, nch)
        if c < 0:
            return
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        kquant_lanes(w, yq, yd, yx, tmp, m0, m1, m0, kind, tbl)
        _commit(ctl, c, tmp, out, m0, m1)


@njit(**_OPTS)
def kquant_main(x, desc, w, yq, yd, yx, out, kind, tbl, chunk, ctl, gen):
    quant_q8_k(x, yq, yd, yx)
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    _post(ctl, desc)
    publish(ctl, gen, nch)
    c = claim(ctl, gen, nch)
    while c >= 0:
        kquant_lanes(w, yq, yd, yx, out, c * chunk, min(M, c * chunk + chunk), 0, kind, tbl)
        _own(ctl, c)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch)
    while c >= 0:
        kquant_lanes(w, yq, yd, yx, out, c * chunk, min(M, c * chunk + chunk), 0, kind, tbl)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch)
    return 0


@njit(**_OPTS)
def half_chunks(w, y, out, bf, chunk, ctl, gen):
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    tmp = np.empty((out.shape[0], chunk), F32)
    while True:
        c = claim(ctl, gen, nch)
        if c < 0:
            return
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        half_dot(w, y, tmp, m0, m1, m0, bf)
        _commit(ctl, c, tmp, out, m0, m1)


@njit(**_OPTS)
def half_main(x, desc, w, y, out, bf, chunk, ctl, gen):
    N, K = x.shape
    for n in range(N):
        for k in range(K):
            v = x[n, k]
            if bf:
                u = np.float32(v).view(np.uint32)
                if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                    u = (u >> np.uint32(16)) | np.uint32(64)
                else:
                    u = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) \
                        >> np.uint32(16)
                y[n, k] = np.uint32(u << np.uint32(16)).view(np.float32)
            else:
                r = f16_round(v)
                if abs(r) == F32(np.inf):
                    return 1
                y[n, k] = r
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    _post(ctl, desc)
    publish(ctl, gen, nch)
    c = claim(ctl, gen, nch)
    while c >= 0:
        half_dot(w, y, out, c * chunk, min(M, c * chunk + chunk), 0, bf)
        _own(ctl, c)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch)
    while c >= 0:
        half_dot(w, y, out, c * chunk, min(M, c * chunk + chunk), 0, bf)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch)
    return 0


# descriptor words (int64) of a dot task, ``ctl[DESC + i]``: what a polling worker needs to run
# the task's ``*_chunks`` without Python (:func:`serve`); built once per prepared step
# (ggmlpy.backends.cpu.qmatmul.prepare) from C-contiguous arrays only (family -1 otherwise)
D_FAMILY, D_W, D_M, D_ROW, D_YQ, D_N, D_K, D_YD, D_NB, D_YX, D_NX, D_OUT, D_TBL, D_CHUNK, D_KIND = \
    range(15)


@njit(**_OPTS)
def _run_desc(ctl, gen, d, u8, i8, u16, i32, f32):
    fam = d[D_FAMILY]
    N, M = d[D_N], d[D_M]
    out = carray(as_ptr(d[D_OUT], f32), (N, M))
    if fam == 2:
        w = carray(as_ptr(d[D_W], u16), (M, d[D_ROW]))
        y = carray(as_ptr(d[D_YQ], f32), (N, d[D_K]))
        half_chunks(w, y, out, d[D_KIND] != 0, d[D_CHUNK], ctl, gen)
        return
    w8 = carray(as_ptr(d[D_W], u8), (M, d[D_ROW]))
    yq = carray(as_ptr(d[D_YQ], i8), (N, d[D_K]))
    yd = carray(as_ptr(d[D_YD], f32), (N, d[D_NB]))
    tbl = carray(as_ptr(d[D_TBL], f32), (65536,))
    if fam == 1:
        bs = carray(as_ptr(d[D_YX], i32), (N, d[D_NX]))
        kquant_chunks(w8, yq, yd, bs, out, d[D_KIND], tbl, d[D_CHUNK], ctl, gen)
    else:
        yx = carray(as_ptr(d[D_YX], f32), (N, d[D_NX]))
        legacy_chunks(w8, yq, yd, yx, out, d[D_KIND], tbl, d[D_CHUNK], ctl, gen)


@njit(**_OPTS)
def serve(ctl, gen_seen, i_seq, seq_seen, budget):
    """A pool worker's wait (ggmlpy.backends.cpu.threads): poll the control block; run every
    dot task published meanwhile whose descriptor has a native form (its chunks, here, without
    the GIL); return ``(code, generation last seen)`` with code 1 for a task that needs Python
    (family -1: the caller runs its Python callable), 2 when word ``i_seq`` is not ``seq_seen``
    (slices in the queue), 0 after ``budget`` spins without either."""
    d = np.empty(16, np.int64)
    u8, i8, u16 = np.empty(0, np.uint8), np.empty(0, np.int8), np.empty(0, np.uint16)
    i32, f32 = np.empty(0, np.int32), np.empty(0, np.float32)
    k = 0
    while k < budget:
        v = aload(ctl, TASK)
        g = v >> 32
        if g != gen_seen and g != 0:
            for i in range(16):
                d[i] = aload(ctl, DESC + i)
            if (aload(ctl, TASK) >> 32) == g:  # the descriptor is generation g's
                gen_seen = g
                if d[D_FAMILY] < 0:
                    return 1, g
                _run_desc(ctl, g, d, u8, i8, u16, i32, f32)
                k = 0
                continue
        if aload(ctl, i_seq) != seq_seen:
            return 2, gen_seen
        relax()
        k += 1
    return 0, gen_seen
