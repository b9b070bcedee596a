"""A float64 NumPy evaluator of case graphs, used to tell which backend is wrong when a case fails.

Memory model: every non-view tensor ("root") gets a flat float64 array with one slot per element
of its storage; a view is ``as_strided`` over its root with element strides ``nb // type_size``
and offset ``view_offs // type_size`` (views keep their root's element type in every op this
evaluator covers). So in-place ops, CPY into views and SET/ACC regions behave as in ggml's memory.

Each op's formula is written plainly from ggml's semantics (reference section 2), evaluated in
float64 and rounded once to the node's storage type (F16 round-to-nearest-even, integer types as
they are stored). This is *not* the kernel under test: it shares no code with
:mod:`ggmlpy.backends.kernels`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, GluOp, Op, UnaryOp
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type

__all__ = ["evaluate", "RefUnsupported"]

_F64 = np.float64


class RefUnsupported(Exception):
    """The float64 evaluator has no formula for an op/type of the graph."""


def _view(flat: dict[int, np.ndarray], t: Tensor) -> np.ndarray:
    root = t.view_src if t.view_src is not None else t
    base = flat[id(root)]
    ts = t.type.type_size
    off = t.view_offs // ts if t.view_src is not None else 0
    strides = tuple(n // ts * 8 for n in t.nb[::-1])
    return np.lib.stride_tricks.as_strided(base[off:], shape=t.ne[::-1], strides=strides)


def evaluate(ctx: Context, graph: Graph, initial: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Evaluate every node of ``graph`` in float64.

    Args:
        ctx: the case's context (every root tensor of the graph is in it).
        graph: the case graph (nodes in execution order).
        initial: ``id(root) -> initial contents`` (dtype of the tensor, NumPy shape ``ne[::-1]``).

    Returns:
        ``id(node) -> float64 array`` (NumPy shape ``ne[::-1]``, a copy) for every computed node.

    Raises:
        RefUnsupported: a node's op or type has no float64 formula (quantized, BF16, ...).
    """
    flat: dict[int, np.ndarray] = {}
    for t in ctx:
        if t.view_src is None:
            if t.type.is_quantized or t.type == Type.BF16:
                raise RefUnsupported(f"type {t.type.type_name} of '{t.name}'")
            n = t.nbytes // t.type.type_size if t.nbytes else 0
            arr = np.zeros(max(n, 1), _F64)
            init = initial.get(id(t))
            if init is not None:
                arr[:init.size] = init.reshape(-1).astype(_F64)
            flat[id(t)] = arr
    out: dict[int, np.ndarray] = {}
    for node in graph.nodes:
        if node.op == Op.NONE or node.op in VIEW_OPS:
            continue
        fn = _REF.get(node.op)
        if fn is None:
            raise RefUnsupported(f"op {node.op.name}")
        srcs = [None if s is None else _view(flat, s).copy() for s in node.src]
        val = np.asarray(fn(node, srcs), _F64)
        dst = _view(flat, node)
        np.copyto(dst, _store(node.type, np.broadcast_to(val, dst.shape)))
        out[id(node)] = dst.copy()
    return out


def _store(type: Type, x: np.ndarray) -> np.ndarray:
    if type == Type.F16:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(_F64)
    if type == Type.F32:
        with np.errstate(over="ignore"):
            return x.astype(np.float32).astype(_F64)
    if not type.traits.is_float:
        return np.trunc(x)
    return x


# ------------------------------------------------------------------------------------------------
# formulas; each takes (node, float64 source arrays in NumPy layout) and returns the node's value

def _tile(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.tile(b, [s // t for s, t in zip(shape, b.shape)])


def _binary(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    return lambda n, s: f(s[0], _tile(s[1], s[0].shape))


def _logical_copy(n: Tensor, s: list) -> np.ndarray:
    x = s[0].reshape(-1)
    if not n.type.traits.is_float:
        x = np.trunc(x)
    return x.reshape(n.ne[::-1])


def _region(n: Tensor, base: np.ndarray, b: np.ndarray) -> np.ndarray:
    nb1, nb2, nb3, offset = (int(v) for v in n.op_params[:4])
    ts = n.type.type_size
    flat = base.reshape(-1)
    return np.lib.stride_tricks.as_strided(
        flat[offset // ts:], shape=b.shape,
        strides=(nb3 // ts * 8, nb2 // ts * 8, nb1 // ts * 8, 8))


def _set(n: Tensor, s: list) -> np.ndarray:
    out = s[0].copy()
    _region(n, out, s[1])[...] = s[1]
    return out


def _acc(n: Tensor, s: list) -> np.ndarray:
    out = s[0].copy()
    r = _region(n, out, s[1])
    r[...] = r + s[1]
    return out


def _argmax(n: Tensor, s: list) -> np.ndarray:
    """ggml's ``ggml_vec_argmax_f32`` rule per row: the last index of the maximum of the values
    after the last NaN that precedes the row's last non-NaN value (0 for an all-NaN row)."""
    a = s[0][0, 0]  # (ne1, ne0)
    out = np.zeros(a.shape[0], np.int64)
    for r, row in enumerate(a):
        ok = np.flatnonzero(~np.isnan(row))
        if ok.size == 0:
            continue
        q = int(ok[-1])
        nans = np.flatnonzero(np.isnan(row[:q]))
        start = int(nans[-1]) + 1 if nans.size else 0
        seg = row[start:q + 1]
        out[r] = start + int(np.flatnonzero(seg == seg.max())[-1])
    return out.reshape(n.ne[::-1])


def _argsort(n: Tensor, s: list) -> np.ndarray:
    a = s[0] if int(n.op_params[0]) == 0 else -s[0]
    return np.argsort(a, axis=-1, kind="stable")


def _norm(n: Tensor, s: list) -> np.ndarray:
    x = s[0]
    eps = float(n.op_params[0])
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def _rms_norm(n: Tensor, s: list) -> np.ndarray:
    x = s[0]
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(n.op_params[0]))


def _l2_norm(n: Tensor, s: list) -> np.ndarray:
    x = s[0]
    return x / np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), float(n.op_params[0]))


def _group_norm(n: Tensor, s: list) -> np.ndarray:
    x = s[0]  # (ne3, ne2 = channels, ne1, ne0)
    groups, eps = int(n.op_params[0]), float(n.op_params[1])
    c = x.shape[1]
    cpg = -(-c // groups)
    out = np.empty_like(x)
    for g0 in range(0, c, cpg):
        blk = x[:, g0:g0 + cpg]
        mu = blk.mean(axis=(1, 2, 3), keepdims=True)
        var = ((blk - mu) ** 2).mean(axis=(1, 2, 3), keepdims=True)
        out[:, g0:g0 + cpg] = (blk - mu) / np.sqrt(var + eps)
    return out


def _block_repeat(a: np.ndarray, like: np.ndarray) -> np.ndarray:
    r3, r2 = like.shape[0] // a.shape[0], like.shape[1] // a.shape[1]
    return np.repeat(np.repeat(a, r2, axis=1), r3, axis=0)


def _mul_mat(n: Tensor, s: list) -> np.ndarray:
    a = _block_repeat(s[0], s[1])
    return s[1] @ a.swapaxes(-1, -2)


def _out_prod(n: Tensor, s: list) -> np.ndarray:
    a = _block_repeat(s[0], s[1])
    return s[1].swapaxes(-1, -2) @ a


def _get_rows(n: Tensor, s: list) -> np.ndarray:
    a, idx = s[0], s[1].astype(np.int64)  # idx NumPy (1, ne2, ne1, r)
    out = np.empty(n.ne[::-1], _F64)
    for k in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[k, j] = a[k, j, idx[0, k, j]]
    return out


def _set_rows(n: Tensor, s: list) -> np.ndarray:
    b, idx, out = s[0], s[1].astype(np.int64), s[2].copy()  # idx NumPy (1, C2, C1, r)
    for i3 in range(b.shape[0]):
        for i2 in range(b.shape[1]):
            out[i3, i2, idx[0, i3 % idx.shape[1], i2 % idx.shape[2]]] = b[i3, i2]
    return out


def _diag_mask(value: float) -> Callable:
    def f(n: Tensor, s: list) -> np.ndarray:
        x = s[0].copy()
        n_past = int(n.op_params[0])
        i1 = np.arange(x.shape[2])[:, None]
        i0 = np.arange(x.shape[3])[None, :]
        x[..., i0 > n_past + i1] = value
        return x
    return f


def _alibi(n_head: int, max_bias: float) -> np.ndarray:
    if max_bias <= 0.0:
        return np.ones(n_head)
    n_log2 = 2 ** math.floor(math.log2(n_head))
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1), m1 ** (2 * (h - n_log2) + 1))


def _soft_max(n: Tensor, s: list) -> np.ndarray:
    x = s[0]
    scale, max_bias = float(n.op_params[0]), float(n.op_params[1])
    w = x * scale
    mask = s[1] if len(s) > 1 else None
    if mask is not None:
        m = mask[:, :, :x.shape[2], :]
        m = _tile(m, (x.shape[0], x.shape[1], x.shape[2], x.shape[3]))
        slope = _alibi(x.shape[1], max_bias)[None, :, None, None]
        w = w + slope * m
    mx = np.max(w, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(w - mx)
    return e / e.sum(axis=-1, keepdims=True)


def _rope_corr_dim(n_dims: int, n_ctx: int, n_rot: float, base: float) -> float:
    with np.errstate(divide="ignore"):
        return n_dims * np.log(n_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def _rope(n: Tensor, s: list) -> np.ndarray:
    x, pos = s[0], s[1].reshape(-1)
    ff = s[2].reshape(-1) if len(s) > 2 and s[2] is not None else None
    p = list(n.op_params) + [0] * 16
    n_dims, mode, n_ctx_orig = int(p[1]), int(p[2]), int(p[4])
    base, fscale, ext, attn, bfast, bslow = (float(v) for v in p[5:11])
    half = n_dims // 2
    m = np.arange(half, dtype=_F64)
    theta_scale = base ** (-2.0 / n_dims)
    theta = pos[:, None] * theta_scale ** m[None, :]  # (n_tok, half)
    if ff is not None:
        theta = theta / ff[None, :half]
    t_interp = fscale * theta
    if ext != 0.0:
        lo = max(0.0, float(np.floor(_rope_corr_dim(n_dims, n_ctx_orig, bfast, base))))
        hi = min(n_dims - 1.0, float(np.ceil(_rope_corr_dim(n_dims, n_ctx_orig, bslow, base))))
        y = (m - lo) / max(0.001, hi - lo)
        ramp = 1.0 - np.clip(y, 0.0, 1.0)
        mix = ramp * ext
        theta = t_interp * (1 - mix) + theta * mix
        mscale = attn * (1.0 + 0.1 * math.log(1.0 / fscale))
    else:
        theta = t_interp
        mscale = attn
    cos = (np.cos(theta) * mscale)[None, :, None, :]  # (1, n_tok, 1, half)
    sin = (np.sin(theta) * mscale)[None, :, None, :]
    out = x.copy()
    if mode == 0:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = x0 * cos - x1 * sin
        out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    elif mode == 2:
        x0, x1 = x[..., :half], x[..., half:n_dims]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_dims] = x0 * sin + x1 * cos
    else:
        raise RefUnsupported(f"rope mode {mode}")
    return out


def _flash_attn(n: Tensor, s: list) -> np.ndarray:
    q, k, v = s[0], s[1], s[2]  # NumPy (B, H, n_q, D), (B, H_kv, n_kv, D)
    mask = s[3] if len(s) > 3 else None
    scale, max_bias, softcap = (float(x) for x in n.op_params[:3])
    H, H_kv = q.shape[1], k.shape[1]
    k = np.repeat(k, H // H_kv, axis=1)
    v = np.repeat(v, H // H_kv, axis=1)
    sc = q @ k.swapaxes(-1, -2) * scale  # (B, H, n_q, n_kv)
    if softcap != 0.0:
        sc = softcap * np.tanh(sc / softcap)
    if mask is not None:
        m = mask[:, :, :q.shape[2], :]
        m = _tile(m, (q.shape[0], H, q.shape[2], k.shape[2]))
        sc = sc + _alibi(H, max_bias)[None, :, None, None] * m
    mx = np.max(sc, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.where(np.isfinite(mx), np.exp(sc - mx), 0.0)
        den = e.sum(axis=-1, keepdims=True)
        o = np.where(den > 0, (e @ v) / np.where(den > 0, den, 1.0), 0.0)  # (B, H, n_q, Dv)
    return o.transpose(0, 2, 1, 3)  # result ne [Dv, H, n_q, B]


def _pad(n: Tensor, s: list) -> np.ndarray:
    p = [int(v) for v in n.op_params[:8]]
    return np.pad(s[0], [(p[6], p[7]), (p[4], p[5]), (p[2], p[3]), (p[0], p[1])])


def _arange(n: Tensor, s: list) -> np.ndarray:
    start, _, step = (float(v) for v in n.op_params[:3])
    return (start + step * np.arange(n.ne[0], dtype=_F64)).reshape(n.ne[::-1])


def _timestep(n: Tensor, s: list) -> np.ndarray:
    t = s[0].reshape(-1)
    dim, max_period = int(n.op_params[0]), int(n.op_params[1])
    half = dim // 2
    f = np.exp(-math.log(max_period) * np.arange(half) / half)
    out = np.zeros((t.size, n.ne[0]))
    out[:, :half] = np.cos(t[:, None] * f[None, :])
    out[:, half:2 * half] = np.sin(t[:, None] * f[None, :])
    return out.reshape(n.ne[::-1])


def _concat(n: Tensor, s: list) -> np.ndarray:
    return np.concatenate([s[0], s[1]], axis=3 - int(n.op_params[0]))


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[_F64])(x)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


_UNARY: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.ABS: np.abs, UnaryOp.SGN: np.sign, UnaryOp.NEG: np.negative,
    UnaryOp.STEP: lambda x: (x > 0).astype(_F64), UnaryOp.TANH: np.tanh,
    UnaryOp.ELU: lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    UnaryOp.RELU: lambda x: np.maximum(x, 0), UnaryOp.SIGMOID: _sigmoid, UnaryOp.GELU: _gelu,
    UnaryOp.GELU_QUICK: lambda x: x * _sigmoid(1.702 * x), UnaryOp.SILU: lambda x: x * _sigmoid(x),
    UnaryOp.HARDSWISH: lambda x: x * np.clip((x + 3) / 6, 0, 1),
    UnaryOp.HARDSIGMOID: lambda x: np.clip((x + 3) / 6, 0, 1),
    UnaryOp.EXP: lambda x: np.exp(x), UnaryOp.GELU_ERF: lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
}

_GLU: dict[GluOp, Callable[[np.ndarray], np.ndarray]] = {
    GluOp.REGLU: _UNARY[UnaryOp.RELU], GluOp.GEGLU: _gelu, GluOp.SWIGLU: _UNARY[UnaryOp.SILU],
    GluOp.GEGLU_ERF: _UNARY[UnaryOp.GELU_ERF], GluOp.GEGLU_QUICK: _UNARY[UnaryOp.GELU_QUICK],
}


def _unary(n: Tensor, s: list) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _UNARY[UnaryOp(int(n.op_params[0]))](s[0])


def _glu(n: Tensor, s: list) -> np.ndarray:
    act = _GLU[GluOp(int(n.op_params[0]))]
    if len(s) > 1 and s[1] is not None:
        x, g = s[0], s[1]
    else:
        h = n.ne[0]
        x, g = s[0][..., :h], s[0][..., h:2 * h]
        if int(n.op_params[1]):
            x, g = g, x
    with np.errstate(over="ignore"):
        return act(x) * g


def _scale(n: Tensor, s: list) -> np.ndarray:
    sc = float(n.op_params[0])
    b = float(n.op_params[1]) if len(n.op_params) > 1 else 0.0
    return s[0] * sc + b


def _clamp(n: Tensor, s: list) -> np.ndarray:
    return np.clip(s[0], float(n.op_params[0]), float(n.op_params[1]))


def _leaky(n: Tensor, s: list) -> np.ndarray:
    k = float(n.op_params[0])
    return np.maximum(s[0], 0) + k * np.minimum(s[0], 0)


def _log(n: Tensor, s: list) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(s[0])


def _sqrt(n: Tensor, s: list) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.sqrt(s[0])


_REF: dict[Op, Callable[[Tensor, list[Any]], np.ndarray]] = {
    Op.DUP: _logical_copy, Op.CPY: _logical_copy, Op.CONT: _logical_copy,
    Op.ADD: _binary(np.add), Op.SUB: _binary(np.subtract), Op.MUL: _binary(np.multiply),
    Op.DIV: _binary(np.divide), Op.ADD1: lambda n, s: s[0] + s[1].reshape(-1)[0],
    Op.ACC: _acc, Op.SET: _set,
    Op.SQR: lambda n, s: s[0] * s[0], Op.SQRT: _sqrt, Op.LOG: _log,
    Op.SIN: lambda n, s: np.sin(s[0]), Op.COS: lambda n, s: np.cos(s[0]),
    Op.SUM: lambda n, s: np.sum(s[0]).reshape(1, 1, 1, 1),
    Op.SUM_ROWS: lambda n, s: s[0].sum(axis=-1, keepdims=True),
    Op.MEAN: lambda n, s: s[0].mean(axis=-1, keepdims=True),
    Op.ARGMAX: _argmax, Op.ARGSORT: _argsort,
    Op.REPEAT: lambda n, s: _tile(s[0], n.ne[::-1]), Op.CONCAT: _concat,
    Op.NORM: _norm, Op.RMS_NORM: _rms_norm, Op.L2_NORM: _l2_norm, Op.GROUP_NORM: _group_norm,
    Op.MUL_MAT: _mul_mat, Op.OUT_PROD: _out_prod, Op.SCALE: _scale, Op.GET_ROWS: _get_rows,
    Op.SET_ROWS: _set_rows,
    Op.DIAG_MASK_INF: _diag_mask(-math.inf), Op.DIAG_MASK_ZERO: _diag_mask(0.0),
    Op.SOFT_MAX: _soft_max, Op.ROPE: _rope, Op.CLAMP: _clamp, Op.LEAKY_RELU: _leaky,
    Op.ARANGE: _arange, Op.TIMESTEP_EMBEDDING: _timestep, Op.PAD: _pad,
    Op.FLASH_ATTN_EXT: _flash_attn, Op.UNARY: _unary, Op.GLU: _glu,
}
