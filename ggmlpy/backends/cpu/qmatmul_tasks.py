"""Dot tasks: one compiled MUL_MAT product whose weight-row chunks the CPU backend's threads
claim from a shared control block (:meth:`ggmlpy.backends.cpu.threads.Pool.run_dot`,
:mod:`ggmlpy.backends.cpu.spin`), built on the row kernels of
:mod:`ggmlpy.backends.cpu.qmatmul_kernels` (imported on first use only: importing this module
imports Numba).

Per weight family (legacy blocks, K-quants, F16/BF16): ``*_chunks`` (a worker) computes the
chunks it claims into scratch and copies each out unless the caller took it over;
The calling thread first quantizes the activations ``x`` float32 ``(N, K)`` into
``yq``/``yd``/``yx`` with the scales' f16 rounding (:func:`quant_q8_f16`, ``quant_q8_k``,
:func:`half_quant`; before the task starts, so that the workers woken for it find the chunks
published instead of going back to sleep during a prompt batch's quantization), and skips the
task when an activation scale (or Q8_1 sum, or an F16 activation) overflowed float16. Then
``*_main`` publishes the task, computes the chunks it claims in place, waits for the workers'
chunks and takes over one whose worker does not finish in time (:func:`_rescue`): when it
returns (0), no worker writes into ``out`` any more. Which thread computes a row never changes its
operations. :func:`serve` is a pool worker's poll loop, which runs a task from its descriptor
without Python.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ggmlpy.backends.cpu import igemm_q8_0 as ig
from ggmlpy.backends.cpu.qmatmul_ir import f16_round
from ggmlpy.backends.cpu.qmatmul_kernels import (
    F32,
    half_dot,
    kquant_lanes,
    legacy_offsets_for,
    legacy_rows,
    quant_q8,
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
    state,
    wait_cycles,
    wait_done,
    wait_workers_back,
)

_OPTS = dict(cache=True, nogil=True, error_model="numpy", boundscheck=False)


@njit(**_OPTS)
def quant_q8_f16(x, yq, yd, ys, kind):
    """:func:`quant_q8` (``kind``: its Q8_0/Q8_1 and rounding-form code) and the f16 rounding of
    the scales (Q8_1: and sums); False when one of them overflowed to inf."""
    quant_q8(x, yq, yd, ys, kind)
    ok = True
    N, nb = yd.shape
    for n in range(N):
        for b in range(nb):
            d = f16_round(yd[n, b])
            yd[n, b] = d
            ok = ok and not (abs(d) == F32(np.inf))
            if (kind & 1) == 1:
                s = f16_round(ys[n, b])
                ys[n, b] = s
                ok = ok and not (abs(s) == F32(np.inf))
    return ok


@njit(**_OPTS)
def quant_q8_0_igemm(x, yq, yd, ys, kind, arep, drep):
    """:func:`quant_q8_f16` (Q8_0), then the integer GEMM's interleaved form of the quants and
    scales (:func:`ggmlpy.backends.cpu.igemm_q8_0.interleave`); False as :func:`quant_q8_f16`."""
    if not quant_q8_f16(x, yq, yd, ys, kind):
        return False
    ig.interleave(yq, yd, arep, drep)
    return True


@njit(inline="always", **_OPTS)
def _commit(ctl, c, gen, tmp, out, m0, m1):
    """A worker's chunk ``c`` of task ``gen`` (rows ``m0:m1`` computed into ``tmp``): copied to
    ``out`` unless the caller took the chunk over meanwhile (:func:`_rescue`), which includes a
    task that ended (and a next one that began) while the worker was put aside: the state word
    then holds another generation, and the copy is dropped without touching ``out`` (whose
    memory may hold another tensor by now) or the next task's count."""
    if acas(ctl, STATES + c, state(gen, 0), state(gen, 2)):
        for n in range(out.shape[0]):
            for m in range(m0, m1):
                out[n, m] = tmp[n, m - m0]
        astore(ctl, STATES + c, state(gen, 3))
        aadd(ctl, DONE, 1)


@njit(inline="always", **_OPTS)
def _own(ctl, c, gen):
    """The caller finished chunk ``c`` of task ``gen`` (computed in place)."""
    astore(ctl, STATES + c, state(gen, 3))
    aadd(ctl, DONE, 1)


@njit(inline="always", **_OPTS)
def _rescue(ctl, nch, gen):
    """Once every chunk is claimed: wait for the workers' chunks for up to :data:`RESCUE_CYCLES`;
    then a chunk a worker still holds without having started to copy it out (a thread the
    operating system put aside) is taken over: returns its index for the caller to compute
    (the worker's copy is then dropped, :func:`_commit`), or -1 once every chunk is done."""
    if wait_cycles(ctl, DONE, nch, RESCUE_CYCLES):
        return -1
    for c in range(nch):
        if acas(ctl, STATES + c, state(gen, 0), state(gen, 4)):
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
    yo = legacy_offsets_for(yq, kind)
    while True:
        c = claim(ctl, gen, nch)
        if c < 0:
            return
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        legacy_rows(w, yq, yd, yx, yo, tmp, m0, m1, m0, kind, tbl)
        _commit(ctl, c, gen, tmp, out, m0, m1)


@njit(**_OPTS)
def legacy_main(desc, w, yq, yd, yx, out, kind, tbl, chunk, ctl, gen):
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    _post(ctl, desc)
    publish(ctl, gen, nch)
    yo = legacy_offsets_for(yq, kind)
    c = claim(ctl, gen, nch)
    while c >= 0:
        legacy_rows(w, yq, yd, yx, yo, out, c * chunk, min(M, c * chunk + chunk), 0, kind, tbl)
        _own(ctl, c, gen)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch, gen)
    while c >= 0:
        legacy_rows(w, yq, yd, yx, yo, out, c * chunk, min(M, c * chunk + chunk), 0, kind, tbl)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch, gen)
    wait_workers_back(ctl)  # (a task without a native descriptor ran Python on the workers)
    return 0


@njit(**_OPTS)
def igemm_chunks(w, arep, drep, out, tbl, chunk, ctl, gen):
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    tmp = np.empty((out.shape[0], chunk), F32)
    while True:
        c = claim(ctl, gen, nch)
        if c < 0:
            return
        m0, m1 = c * chunk, min(M, c * chunk + chunk)
        ig.rows(w, arep, drep, tmp, m0, m1, m0, out.shape[0], tbl)
        _commit(ctl, c, gen, tmp, out, m0, m1)


@njit(**_OPTS)
def igemm_main(desc, w, arep, drep, out, tbl, chunk, ctl, gen):
    M, N = w.shape[0], out.shape[0]
    nch = (M + chunk - 1) // chunk
    _post(ctl, desc)
    publish(ctl, gen, nch)
    c = claim(ctl, gen, nch)
    while c >= 0:
        ig.rows(w, arep, drep, out, c * chunk, min(M, c * chunk + chunk), 0, N, tbl)
        _own(ctl, c, gen)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch, gen)
    while c >= 0:
        ig.rows(w, arep, drep, out, c * chunk, min(M, c * chunk + chunk), 0, N, tbl)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch, gen)
    wait_workers_back(ctl)  # (a task without a native descriptor ran Python on the workers)
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
        _commit(ctl, c, gen, tmp, out, m0, m1)


@njit(**_OPTS)
def kquant_main(desc, w, yq, yd, yx, out, kind, tbl, chunk, ctl, gen):
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    _post(ctl, desc)
    publish(ctl, gen, nch)
    c = claim(ctl, gen, nch)
    while c >= 0:
        kquant_lanes(w, yq, yd, yx, out, c * chunk, min(M, c * chunk + chunk), 0, kind, tbl)
        _own(ctl, c, gen)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch, gen)
    while c >= 0:
        kquant_lanes(w, yq, yd, yx, out, c * chunk, min(M, c * chunk + chunk), 0, kind, tbl)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch, gen)
    wait_workers_back(ctl)  # (a task without a native descriptor ran Python on the workers)
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
        _commit(ctl, c, gen, tmp, out, m0, m1)


@njit(**_OPTS)
def half_quant(x, y, bf):
    """F32 activations ``x`` ``(N, K)`` rounded to F16 (``bf``: BF16) values in float32 ``y``;
    False when one overflowed float16 (nothing is computed then)."""
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
                    return False
                y[n, k] = r
    return True


@njit(**_OPTS)
def half_main(desc, w, y, out, bf, chunk, ctl, gen):
    M = w.shape[0]
    nch = (M + chunk - 1) // chunk
    _post(ctl, desc)
    publish(ctl, gen, nch)
    c = claim(ctl, gen, nch)
    while c >= 0:
        half_dot(w, y, out, c * chunk, min(M, c * chunk + chunk), 0, bf)
        _own(ctl, c, gen)
        c = claim(ctl, gen, nch)
    c = _rescue(ctl, nch, gen)
    while c >= 0:
        half_dot(w, y, out, c * chunk, min(M, c * chunk + chunk), 0, bf)
        aadd(ctl, DONE, 1)
        c = _rescue(ctl, nch, gen)
    wait_workers_back(ctl)  # (a task without a native descriptor ran Python on the workers)
    return 0


# descriptor words (int64) of a dot task, ``ctl[DESC + i]``: what a polling worker needs to run
# the task's ``*_chunks`` without Python (:func:`serve`); built once per prepared step
# (ggmlpy.backends.cpu.qmatmul.prepare) from C-contiguous arrays only (family -1 otherwise).
# Family 0 legacy blocks, 1 K-quants, 2 F16/BF16, 3 the Q8_0 integer GEMM (whose interleaved
# activations ``arep`` uint8 (D_NX, D_K * 16) and ``drep`` float32 (D_NX, D_NB * 16) are in the
# D_YQ and D_YD words)
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
    tbl = carray(as_ptr(d[D_TBL], f32), (65536,))
    if fam == 3:
        G = d[D_NX]
        arep = carray(as_ptr(d[D_YQ], u8), (G, d[D_K] * 16))
        drep = carray(as_ptr(d[D_YD], f32), (G, d[D_NB] * 16))
        igemm_chunks(w8, arep, drep, out, tbl, d[D_CHUNK], ctl, gen)
        return
    yq = carray(as_ptr(d[D_YQ], i8), (N, d[D_K]))
    yd = carray(as_ptr(d[D_YD], f32), (N, d[D_NB]))
    if fam == 1:
        bs = carray(as_ptr(d[D_YX], i32), (N, d[D_NX]))
        kquant_chunks(w8, yq, yd, bs, out, d[D_KIND], tbl, d[D_CHUNK], ctl, gen)
    else:
        yx = carray(as_ptr(d[D_YX], f32), (N, d[D_NX]))
        legacy_chunks(w8, yq, yd, yx, out, d[D_KIND], tbl, d[D_CHUNK], ctl, gen)


@njit(**_OPTS)
def serve(ctl, gen_seen, i_seq, seq_seen, budget, i_busy):
    """A pool worker's wait (ggmlpy.backends.cpu.threads): first clear word ``i_busy`` (the
    worker is back in compiled code, without the GIL), set again before returning for a task's
    Python callable (:func:`~ggmlpy.backends.cpu.spin.wait_workers_back`); poll the control
    block; run every
    dot task published meanwhile whose descriptor has a native form (its chunks, here, without
    the GIL); return ``(code, generation last seen)`` with code 1 for a task that needs Python
    (family -1: the caller runs its Python callable), 2 when word ``i_seq`` is not ``seq_seen``
    (slices in the queue), 0 after ``budget`` spins without either."""
    d = np.empty(16, np.int64)
    u8, i8, u16 = np.empty(0, np.uint8), np.empty(0, np.int8), np.empty(0, np.uint16)
    i32, f32 = np.empty(0, np.int32), np.empty(0, np.float32)
    astore(ctl, i_busy, 0)
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
                    # marked busy before the GIL is taken back; cleared when the worker is in
                    # here again (the task's caller waits for that: spin.wait_workers_back)
                    astore(ctl, i_busy, 1)
                    return 1, g
                _run_desc(ctl, g, d, u8, i8, u16, i32, f32)
                k = 0
                continue
        if aload(ctl, i_seq) != seq_seen:
            return 2, gen_seen
        relax()
        k += 1
    return 0, gen_seen
