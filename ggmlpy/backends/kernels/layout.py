"""Copy and layout kernels: DUP/CPY/CONT (with type conversion), REPEAT, CONCAT, SET, ACC,
GET_ROWS, SET_ROWS, PAD, and the generators ARANGE and TIMESTEP_EMBEDDING.

DUP/CPY/CONT convert between F32, F16, BF16 and every block-quantized type (through float32;
into a block type with ggml's reference quantizers, bit-exact, host only); GET_ROWS gathers rows
of an F32/F16/BF16/quantized tensor and dequantizes only those rows (:mod:`.typeconv`);
SET_ROWS scatters F32 rows into an F32/F16/BF16 destination (any array module) or a block type
(quantized per row with ggml's reference quantizers, host only).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ggmlpy.backends.kernels.common import (
    F32,
    FLOATS,
    PLAIN,
    as_strided,
    c_contig,
    copy_into,
    src_of,
    sup_f32,
    tile_views,
    tiles,
)
from ggmlpy.backends.kernels.registry import Kernel, Step, kernel
from ggmlpy.backends.kernels.typeconv import (
    CONVERTIBLE,
    bf16_bits,
    from_f32,
    host_quantizable,
    rows_ok,
    to_f32,
)
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

# ---------------------------------------------------------------------------------------------
# support


def _converting(t: Type) -> bool:
    return t == Type.BF16 or t.is_quantized


def _sup_copy(node: Tensor, xp: Any) -> bool:
    a = src_of(node, 0)
    ok = (Type.F32, Type.F16, Type.I32)
    if a is None or a.nelements != node.nelements:
        return False
    if _converting(a.type) or _converting(node.type):
        # through float32: F32/F16/BF16 <-> every block type; block rows must be whole blocks
        if a.type not in CONVERTIBLE or node.type not in CONVERTIBLE:
            return False
        if not (rows_ok(a) and rows_ok(node)) or not host_quantizable(node.type, xp):
            return False
        return not node.type.is_quantized or node.is_contiguous()
    if a.type == node.type:
        return a.type in PLAIN
    return a.type in ok and node.type in ok


def _sup_repeat(node: Tensor, xp: Any) -> bool:
    a = src_of(node, 0)
    return a is not None and a.type == node.type and a.type in PLAIN and tiles(a, node)


def _sup_concat(node: Tensor, xp: Any) -> bool:
    a, b = src_of(node, 0), src_of(node, 1)
    return (a is not None and b is not None and a.type == b.type == node.type
            and a.type in PLAIN and bool(node.op_params) and 0 <= int(node.op_params[0]) < 4)


def _sup_set_acc(node: Tensor, xp: Any) -> bool:
    a, b = src_of(node, 0), src_of(node, 1)
    if a is None or b is None or len(node.op_params) < 4:
        return False
    types = (Type.F32, Type.I32) if node.op == Op.SET else (Type.F32,)
    return (a.type == b.type == node.type and a.type in types and a.ne == node.ne
            and a.is_contiguous() and b.nelements <= a.nelements)


def _sup_get_rows(node: Tensor, xp: Any) -> bool:
    a, b = src_of(node, 0), src_of(node, 1)
    if a is None or b is None or b.type != Type.I32:
        return False
    if a.type in CONVERTIBLE:
        ok_t = node.type in FLOATS and rows_ok(a)
    elif a.type == Type.I32:
        ok_t = node.type == Type.I32
    else:
        return False
    return ok_t and a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1


def _sup_set_rows(node: Tensor, xp: Any) -> bool:
    b, c = src_of(node, 0), src_of(node, 1)
    t = node.type
    if b is None or c is None or b.type != Type.F32 or c.type not in (Type.I64, Type.I32):
        return False
    if t not in CONVERTIBLE or not host_quantizable(t, xp) or not rows_ok(node):
        return False
    return (node.ne[0] == b.ne[0] and node.ne[2] == b.ne[2] and node.ne[3] == b.ne[3]
            and b.ne[1] == c.ne[0] and b.ne[2] % c.ne[1] == 0 and b.ne[3] % c.ne[2] == 0
            and c.ne[3] == 1 and node.nb[0] == t.type_size and b.nb[0] == 4)


def _sup_arange(node: Tensor, xp: Any) -> bool:
    return node.type == Type.F32


# ---------------------------------------------------------------------------------------------
# kernels


def _k_convert(xp: Any, node: Tensor, dst: Any, a: Any) -> Step:
    """A copy where either side is BF16 or block-quantized: src0 -> float32 in logical order,
    reshaped to dst's ``ne``, -> dst's type (ggml's ``to_float`` then ``from_float``)."""
    ta, td = node.src[0].type, node.type
    ne0_a = node.src[0].ne[0]
    shape = node.ne[::-1]
    copyto = xp.copyto
    d_bits = bf16_bits(xp, dst) if td == Type.BF16 else dst

    def run() -> None:
        x = to_f32(xp, ta, a, ne0_a)
        if x.shape != shape:
            x = x.reshape(shape)  # logical row-major order (copies a non-contiguous view)
        copyto(d_bits, from_f32(xp, td, x), casting="unsafe")
    return run


@kernel(Op.DUP, Op.CPY, Op.CONT, supports=_sup_copy, any_type=True)
def _k_copy(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    """DUP / CONT / CPY: copy src0 into dst in logical row-major order, converting the type
    (through float32 when neither side is float32; f32 -> i32 truncates toward zero; BF16 and
    block types through :func:`_k_convert`)."""
    a = srcs[0]
    if _converting(node.src[0].type) or _converting(node.type):
        if node.src[0].type == node.type and node.type.is_quantized:
            # same block type: the bytes as they are (ggml's memcpy), never a re-quantization
            if a.shape == dst.shape:
                return copy_into(xp, dst, a)
            if c_contig(a) and c_contig(dst):
                return partial(xp.copyto, dst.reshape(-1), a.reshape(-1))
        return _k_convert(xp, node, dst, a)
    need_f32 = (a.dtype != dst.dtype and a.dtype != F32 and dst.dtype != F32
                and (a.dtype.kind == "f" or dst.dtype.kind == "f"))
    copyto = xp.copyto
    if a.shape == dst.shape:
        if need_f32:
            return lambda: copyto(dst, a.astype(F32), casting="unsafe")
        return copy_into(xp, dst, a)
    shape = dst.shape
    if c_contig(a):
        a_r = a.reshape(shape)  # a view: nothing to do per call but the copy
        if need_f32:
            return lambda: copyto(dst, a_r.astype(F32), casting="unsafe")
        return partial(copyto, dst, a_r, casting="unsafe")
    if c_contig(dst):
        # dst seen in a's shape: the same logical row-major order, one pass and no temporary
        # (reshaping a non-contiguous a would copy it first, e.g. attention's merged heads)
        d_r = dst.reshape(a.shape)
        if need_f32:
            return lambda: copyto(d_r, a.astype(F32), casting="unsafe")
        return partial(copyto, d_r, a, casting="unsafe")

    def run() -> None:
        src = a.reshape(shape)
        copyto(dst, src.astype(F32) if need_f32 else src, casting="unsafe")
    return run


@kernel(Op.REPEAT, supports=_sup_repeat)
def _k_repeat(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    d, a, _ = tile_views(xp, dst, srcs[0], dst)
    return partial(xp.copyto, d, a, casting="unsafe")


@kernel(Op.CONCAT, supports=_sup_concat)
def _k_concat(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    dim = int(node.op_params[0])
    ax = 3 - dim
    a, b = srcs[0], srcs[1]
    n = a.shape[ax]
    sl_a = [slice(None)] * 4
    sl_b = [slice(None)] * 4
    sl_a[ax] = slice(0, n)
    sl_b[ax] = slice(n, None)
    da, db = dst[tuple(sl_a)], dst[tuple(sl_b)]
    copyto = xp.copyto

    def run() -> None:
        copyto(da, a, casting="unsafe")
        copyto(db, b, casting="unsafe")
    return run


def _region(xp: Any, node: Tensor, dst: Any, b: Any) -> Any:
    """The view of ``dst`` that SET/ACC write ``b`` into: shape ``b.ne``, byte strides
    ``(nb1, nb2, nb3)`` from op_params, element stride = dst's element size, at byte ``offset``."""
    nb1, nb2, nb3, offset = (int(v) for v in node.op_params[:4])
    item = dst.dtype.itemsize
    ne = b.shape[::-1]
    strides = (item, nb1, nb2, nb3)
    extent = item + sum((n - 1) * s for n, s in zip(ne, strides))
    total = dst.size * item
    if not c_contig(dst):
        raise ValueError(f"{node.op.name} '{node.name}': destination must be contiguous")
    if offset < 0 or offset % item or offset + extent > total:
        raise ValueError(f"{node.op.name} '{node.name}': view of {list(ne)} with strides "
                         f"{[nb1, nb2, nb3]} at byte offset {offset} does not fit the "
                         f"{total} bytes of the destination")
    flat = dst.reshape(-1)[offset // item:]
    return as_strided(xp, flat, b.shape, strides[::-1])


def _k_region(accumulate: bool) -> Kernel:
    """SET (``accumulate=False``: copy b into the region) or ACC (add b to it): dst = a, then the
    region of dst described by op_params (:func:`_region`) is written from b."""
    def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
        a, b = srcs[0], srcs[1]
        region = _region(xp, node, dst, b)
        copy_a = copy_into(xp, dst, a)
        if accumulate:
            write = partial(xp.add, region, b, out=region)
        else:
            write = partial(xp.copyto, region, b, casting="unsafe")

        def run() -> None:
            copy_a()
            write()
        return run
    return make


kernel(Op.SET, supports=_sup_set_acc)(_k_region(False))
kernel(Op.ACC, supports=_sup_set_acc)(_k_region(True))


@kernel(Op.GET_ROWS, supports=_sup_get_rows, any_type=True)
def _k_get_rows(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a, idx = srcs[0], srcs[1]          # a (A3, A2, R, n); idx (1, A3, A2, r) int32
    A3, A2 = a.shape[0], a.shape[1]
    copyto = xp.copyto
    ta = node.src[0].type
    if _converting(ta):
        # gather the selected rows (raw bytes / bf16 bits), then convert only those rows
        ne0 = node.src[0].ne[0]
        if A3 == 1 and A2 == 1:
            a2, i1 = a[0, 0], idx[0, 0, 0]
            take = xp.take
            return lambda: copyto(dst[0, 0], to_f32(xp, ta, take(a2, i1, axis=0), ne0),
                                  casting="unsafe")
        j3 = xp.arange(A3).reshape(A3, 1, 1)
        j2 = xp.arange(A2).reshape(1, A2, 1)
        ii_q = idx[0]
        return lambda: copyto(dst, to_f32(xp, ta, a[j3, j2, ii_q], ne0), casting="unsafe")
    if A3 == 1 and A2 == 1:
        a2, i1, d2 = a[0, 0], idx[0, 0, 0], dst[0, 0]
        if a.dtype == dst.dtype and c_contig(d2):
            return partial(xp.take, a2, i1, axis=0, out=d2)
        take = xp.take
        return lambda: copyto(d2, take(a2, i1, axis=0), casting="unsafe")
    i3 = xp.arange(A3).reshape(A3, 1, 1)
    i2 = xp.arange(A2).reshape(1, A2, 1)
    ii = idx[0]
    return lambda: copyto(dst, a[i3, i2, ii], casting="unsafe")


@kernel(Op.SET_ROWS, supports=_sup_set_rows, any_type=True)
def _k_set_rows(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    """SET_ROWS: ``dst[i3, i2, c[i3 % C2, i2 % C1, i]] = convert(b[i3, i2, i])`` (NumPy indices;
    dst is the node's view of its destination ``a``, converted with :func:`from_f32`)."""
    b, c = srcs[0], srcs[1]             # b (B3, B2, R, n) f32; c (1, C2, C1, R) i64/i32
    td = node.type
    d = bf16_bits(xp, dst) if td == Type.BF16 else dst
    B3, B2 = b.shape[0], b.shape[1]
    C2, C1 = c.shape[1], c.shape[2]
    if td == Type.F32:
        conv = None
    else:
        conv = partial(from_f32, xp, td)
    if B3 == 1 and B2 == 1:
        d2, b2, c1 = d[0, 0], b[0, 0], c[0, 0, 0]
        if c1.shape[0] == 1 and conv is None:  # one row: a basic-index copy
            row = b2[0]

            def run_row() -> None:
                d2[int(c1[0])] = row
            return run_row

        def run_2d() -> None:
            d2[c1] = b2 if conv is None else conv(b2)
        return run_2d
    j3 = xp.arange(B3).reshape(B3, 1, 1)
    j2 = xp.arange(B2).reshape(1, B2, 1)
    i3 = xp.asarray(np.arange(B3) % C2).reshape(B3, 1)
    i2 = xp.asarray(np.arange(B2) % C1).reshape(1, B2)
    c3 = c[0]                            # (C2, C1, R)

    def run() -> None:
        rows = c3[i3, i2]                # (B3, B2, R)
        d[j3, j2, rows] = b if conv is None else conv(b)
    return run


@kernel(Op.PAD, supports=sup_f32)
def _k_pad(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = [int(v) for v in node.op_params[:8]] + [0] * max(0, 8 - len(node.op_params))
    circular = bool(node.op_params[8]) if len(node.op_params) > 8 else False
    a = srcs[0]
    copyto = xp.copyto
    if circular:
        idx = []
        for dim in range(4):
            ax = 3 - dim
            n_src, n_dst, lp = a.shape[ax], dst.shape[ax], p[2 * dim]
            idx.append((ax, xp.asarray((np.arange(n_dst) - lp) % n_src)))
        take = xp.take

        def run_circ() -> None:
            x = a
            for ax, ix in idx:
                x = take(x, ix, axis=ax)
            copyto(dst, x, casting="unsafe")
        return run_circ
    inner = tuple(slice(p[2 * (3 - ax)], p[2 * (3 - ax)] + a.shape[ax]) for ax in range(4))
    d_in = dst[inner]

    def run() -> None:
        copyto(dst, 0)
        copyto(d_in, a, casting="unsafe")
    return run


@kernel(Op.ARANGE, supports=_sup_arange)
def _k_arange(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    start, _stop, step = (F32(v) for v in node.op_params[:3])
    n = dst.shape[-1]
    # no sources: the values are constants, computed once (f32 start + step*i, like ggml)
    vals = xp.asarray((start + step * np.arange(n, dtype=F32)).astype(F32).reshape(dst.shape))
    return partial(xp.copyto, dst, vals, casting="unsafe")


@kernel(Op.TIMESTEP_EMBEDDING, supports=sup_f32)
def _k_timestep_embedding(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    dim, max_period = int(node.op_params[0]), node.op_params[1]
    half = dim // 2
    j = np.arange(half, dtype=F32)
    with np.errstate(all="ignore"):
        freqs = np.exp((-np.log(F32(max_period)) * j) / F32(half)).astype(F32)
    freqs_x = xp.asarray(freqs)
    t = srcs[0]                       # (1, 1, 1, N)
    tcol = t.reshape(-1)[:, None] if c_contig(t) else None
    d = dst[0, 0]                     # (N, ne0)
    d_cos, d_sin, d_rest = d[:, :half], d[:, half:2 * half], d[:, 2 * half:]
    copyto, cos, sin = xp.copyto, xp.cos, xp.sin

    def run() -> None:
        tt = tcol if tcol is not None else t.reshape(-1)[:, None]
        args = tt * freqs_x
        cos(args, out=d_cos)
        sin(args, out=d_sin)
        if d_rest.size:
            copyto(d_rest, 0)
    return run
