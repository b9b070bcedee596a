"""Op implementations written once over an array module ``xp`` (numpy or cupy).

Contract (used by ggmlpy/backends/plan.py for every backend):

* ``compile_node(xp, node, dst, srcs) -> Callable[[], None] | None`` resolves one node into a
  zero-argument closure that computes it, writing into ``dst`` (an ``xp`` array view of the node's
  memory: shape ``ne[::-1]``, strides ``nb[::-1]``). ``srcs[i]`` is the view of ``node.src[i]``
  (None for absent optional sources). Everything that does not depend on data (shapes, broadcast
  views, constants) is prepared here, once per plan.
* ``supports_op(node, xp) -> bool`` answers honestly per op and type combination.

Rules every kernel follows:

* Only functions NumPy and CuPy both provide are used (``xp.add(..., out=)``, ``xp.matmul``,
  ``xp.copyto``, ``xp.lib.stride_tricks.as_strided``, ``xp.take``, ...). Where the two differ
  (``erf``) the difference is handled in one helper. Plans run with NumPy's floating-point
  warnings off (:meth:`ggmlpy.backends.plan.Plan.run`): overflow to inf and NaN propagate
  silently, as in ggml.
* Results are written into ``dst`` (``out=`` where possible, else ``xp.copyto``); ``dst`` may be
  a strided view, and may share memory with ``srcs[0]`` (in-place ops, ggml-alloc's in-place
  reuse): kernels that read a source after writing part of ``dst`` compute into a temporary first.
* Sources and destinations may be non-contiguous (permuted, transposed, strided views).
* F16 tensors are computed in float32 and rounded once to float16 (round-to-nearest-even), as
  ggml's CPU kernels do. Sums that ggml accumulates in double (SUM, SUM_ROWS, MEAN, NORM,
  RMS_NORM, GROUP_NORM, L2_NORM) are accumulated in float64 here too.

Known deliberate differences from ggml's CPU backend: GELU and GELU_QUICK use the exact float32
formula where ggml's CPU looks the value up in an f16 table (so ggml is *less* accurate there,
rel. error ~2^-11 inside (-10, 10)); SILU/SIGMOID use ``exp`` instead of ggml's SIMD approximation;
ROPE builds ``theta`` in float64 (ggml multiplies in float32, drifting a few ulps); FLASH_ATTN_EXT
is an exact float32 softmax (ggml's CPU accumulates in f16 when V is F16). Index ops do not check
bounds beyond what ``xp`` itself does (ggml aborts on out-of-range GET_ROWS indices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .. import special
from ..opcodes import GluOp, Op, UnaryOp
from ..tensor import Tensor
from ..types import Type

__all__ = ["compile_node", "supports_op"]

Step = Callable[[], None]
Kernel = Callable[[Any, Tensor, Any, list[Any]], "Step | None"]

_F32 = np.float32
_F64 = np.float64
_FLOATS = (Type.F32, Type.F16)
_PLAIN = (Type.F32, Type.F16, Type.I32, Type.I16, Type.I8, Type.F64, Type.I64)


# ---------------------------------------------------------------------------------------------
# small helpers


def _is_numpy(xp: Any) -> bool:
    return xp is np


def _as_strided(xp: Any, x: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


def _c_contig(x: Any) -> bool:
    return bool(x.flags.c_contiguous)


def _ufunc_step(xp: Any, fn: Any, *args: Any, out: Any) -> Step:
    """A closure ``fn(*args, out=out)`` for a ufunc. For NumPy the output is passed positionally:
    ``partial(np.add, a, b, d)`` has no keyword dict to merge per call and costs ~40% less than
    the ``out=`` form on tiny arrays (the per-node overhead target of the plan).

    Inputs that view exactly the memory of ``out`` (in-place ops) are replaced by ``out`` itself:
    a CuPy ufunc copies every input that *may share memory* with an output unless it is the very
    same object (``cupy/_core/_kernel.pyx``, ``_copy_in_args_if_needed``), which would cost a
    temporary and a full copy per call."""
    args = tuple(_alias(x, out) for x in args)
    if _is_numpy(xp) and fn not in (np.maximum, np.minimum):  # those deprecate positional out
        return partial(fn, *args, out)
    return partial(fn, *args, out=out)


def _same_memory(x: Any, y: Any) -> bool:
    """True when two views start at the same address with the same layout (in-place aliasing)."""
    try:
        return (x.shape == y.shape and x.strides == y.strides and x.dtype == y.dtype
                and _data_ptr(x) == _data_ptr(y))
    except Exception:  # pragma: no cover - exotic array types
        return False


def _alias(x: Any, out: Any) -> Any:
    """``out`` when ``x`` is an array viewing exactly ``out``'s memory (same start, shape, strides,
    dtype), else ``x``. Passing the output object itself as the input of an in-place ufunc lets
    CuPy skip its defensive copy of inputs that overlap an output (NumPy: no difference)."""
    if x is out or type(x) is not type(out):  # scalars, or already the same object
        return x
    return out if _same_memory(x, out) else x


def _data_ptr(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    return int(x.data.ptr)  # cupy


def _copy_into(xp: Any, dst: Any, src: Any) -> Step:
    """A closure copying ``src`` into ``dst`` (same shape), or a no-op if they are the same memory."""
    if _same_memory(dst, src):
        return _noop
    return partial(xp.copyto, dst, src, casting="unsafe")


def _noop() -> None:
    return None


def _f32(xp: Any, x: Any) -> Any:
    """``x`` as float32 (no copy when it already is)."""
    return x if x.dtype == _F32 else x.astype(_F32)


def _tile_views(xp: Any, a: Any, b: Any, dst: Any) -> tuple[Any, Any, Any]:
    """Views of ``a``, ``b`` and ``dst`` such that NumPy broadcasting of ``b`` against ``a``
    implements ggml's *tiling* broadcast (``b.ne[i]`` divides ``a.ne[i]``, index modulo).

    Shapes are NumPy shapes (``ne[::-1]``); ``a`` and ``dst`` have the same shape. Each axis where
    ``1 < b_n < a_n`` is split into ``(a_n // b_n, b_n)`` (a zero-copy strided view); ``b`` gets
    a size-1 axis in front, so broadcasting repeats it. Axes where NumPy broadcasting already
    works (``b_n == a_n`` or ``b_n == 1``) are left as they are.
    """
    if a.shape == b.shape:
        return a, b, dst
    if all(m == 1 or m == n for n, m in zip(a.shape, b.shape)):
        return a, b, dst
    sha, sa, sd, shb, sb = [], [], [], [], []
    for ax, (n, m) in enumerate(zip(a.shape, b.shape)):
        if n % m:
            raise ValueError(f"tiling broadcast: {b.shape} does not tile {a.shape}")
        if 1 < m < n:
            r = n // m
            sha += [r, m]
            sa += [a.strides[ax] * m, a.strides[ax]]
            sd += [dst.strides[ax] * m, dst.strides[ax]]
            shb += [1, m]
            sb += [0, b.strides[ax]]
        else:
            sha.append(n)
            sa.append(a.strides[ax])
            sd.append(dst.strides[ax])
            shb.append(m)
            sb.append(b.strides[ax])
    return (_as_strided(xp, a, tuple(sha), tuple(sa)), _as_strided(xp, b, tuple(shb), tuple(sb)),
            _as_strided(xp, dst, tuple(sha), tuple(sd)))


def _flatten_ew(a: Any, b: Any, dst: Any) -> tuple[Any, Any, Any]:
    """1-D views for an element-wise op when every operand is C-contiguous (cheaper ufunc calls);
    ``b`` may also be a single element. Otherwise the inputs unchanged."""
    if (a.shape == dst.shape and _c_contig(a) and _c_contig(dst)
            and (b is None or (_c_contig(b) and (b.shape == a.shape or b.size == 1)))):
        a1, d1 = a.reshape(-1), dst.reshape(-1)
        b1 = None if b is None else b.reshape(-1)
        return a1, b1, d1
    return a, b, dst


def _split_axis(shape: tuple[int, ...], strides: tuple[int, ...], ax: int, outer: int
                ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape/strides with axis ``ax`` (size ``n``) split into ``(outer, n // outer)`` (block order)."""
    n = shape[ax]
    inner = n // outer
    sh = shape[:ax] + (outer, inner) + shape[ax + 1:]
    st = strides[:ax] + (strides[ax] * inner, strides[ax]) + strides[ax + 1:]
    return sh, st


# ---------------------------------------------------------------------------------------------
# erf (exact-erf GELU)

def _erfc_fn(xp: Any) -> Callable[[Any], Any]:
    """The element-wise erfc of ``xp``: :func:`ggmlpy.special.erfc` (float64) for NumPy, which has
    none; ``cupyx.scipy.special.erfc`` (a CuPy ufunc: float64 in, float64 out) for CuPy."""
    if _is_numpy(xp):
        return special.erfc
    from cupyx.scipy.special import erfc  # noqa: PLC0415 - only with cupy

    return erfc


def _gelu_erf(xp: Any, x: Any) -> Any:
    """0.5*x*(1 + erf(x/sqrt(2))) as float32, from float32 ``x``.

    Both array modules evaluate ``0.5*x*erfc(-x/sqrt(2))`` in float64 and round once, so the
    backends agree to the ulp: in float32, ``1 + erf(x/sqrt(2))`` cancels to 0 for x below about
    -5.5 (CUDA's ``erff`` is also only accurate to 2 ulp)."""
    if _is_numpy(xp):
        return special.gelu_erf(x)
    x64 = x.astype(_F64)
    r = _erfc_fn(xp)(x64 * -math.sqrt(0.5))
    r *= x64
    r *= 0.5
    return r.astype(_F32)


# ---------------------------------------------------------------------------------------------
# unary activations: each maps a float32 array to a new float32 array (never writes its input)


def _sigmoid(xp: Any, x: Any) -> Any:
    # 1/(1+exp(-x)) without overflow: e = exp(-|x|) <= 1
    e = xp.exp(-xp.abs(x))
    d = 1.0 + e
    return xp.where(x >= 0, 1.0 / d, e / d).astype(x.dtype, copy=False)


def _act_abs(xp, x): return xp.abs(x)
def _act_sgn(xp, x): return xp.sign(x)
def _act_neg(xp, x): return xp.negative(x)
def _act_step(xp, x): return (x > 0).astype(x.dtype)
def _act_tanh(xp, x): return xp.tanh(x)
def _act_elu(xp, x): return xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0)))
def _act_relu(xp, x): return xp.maximum(x, 0)
def _act_sigmoid(xp, x): return _sigmoid(xp, x)
def _act_silu(xp, x): return x * _sigmoid(xp, x)
def _act_gelu_quick(xp, x): return x * _sigmoid(xp, x * _F32(1.702))
def _act_hardsigmoid(xp, x): return xp.minimum(xp.maximum((x + 3) / 6, 0), 1)
def _act_hardswish(xp, x): return x * xp.minimum(xp.maximum((x + 3) / 6, 0), 1)
def _act_exp(xp, x): return xp.exp(x)
def _act_gelu_erf(xp, x): return _gelu_erf(xp, x)


_GELU_C = _F32(math.sqrt(2.0 / math.pi))
_GELU_A = _F32(0.044715)


def _act_gelu(xp, x):
    # tanh approximation, exact float32 formula (ggml's CPU uses an f16 lookup table; see module doc)
    return 0.5 * x * (1.0 + xp.tanh(_GELU_C * x * (1.0 + _GELU_A * x * x)))


_UNARY: dict[UnaryOp, Callable[[Any, Any], Any]] = {
    UnaryOp.ABS: _act_abs, UnaryOp.SGN: _act_sgn, UnaryOp.NEG: _act_neg, UnaryOp.STEP: _act_step,
    UnaryOp.TANH: _act_tanh, UnaryOp.ELU: _act_elu, UnaryOp.RELU: _act_relu,
    UnaryOp.SIGMOID: _act_sigmoid, UnaryOp.GELU: _act_gelu, UnaryOp.GELU_QUICK: _act_gelu_quick,
    UnaryOp.SILU: _act_silu, UnaryOp.HARDSWISH: _act_hardswish,
    UnaryOp.HARDSIGMOID: _act_hardsigmoid, UnaryOp.EXP: _act_exp, UnaryOp.GELU_ERF: _act_gelu_erf,
}

#: unary ops that are a single ufunc: computed straight into dst with ``out=`` for F32
_UNARY_UFUNC = {UnaryOp.ABS: "abs", UnaryOp.SGN: "sign", UnaryOp.NEG: "negative",
                UnaryOp.TANH: "tanh", UnaryOp.EXP: "exp"}

_GLU: dict[GluOp, Callable[[Any, Any], Any]] = {
    GluOp.REGLU: _act_relu, GluOp.GEGLU: _act_gelu, GluOp.SWIGLU: _act_silu,
    GluOp.GEGLU_ERF: _act_gelu_erf, GluOp.GEGLU_QUICK: _act_gelu_quick,
}


# ---------------------------------------------------------------------------------------------
# element-wise and binary ops


def _k_binary(ufunc_name: str) -> Kernel:
    def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
        fn = getattr(xp, ufunc_name)
        a, b, d = _tile_views(xp, srcs[0], srcs[1], dst)
        if b.size == 1 and b.ndim != 1:
            b = b.reshape(1)
        a, b, d = _flatten_ew(a, b, d)
        step = _ufunc_step(xp, fn, a, b, out=d)
        return step
    return make


def _k_add1(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a, b, d = _flatten_ew(srcs[0], srcs[1].reshape(1), dst)
    return _ufunc_step(xp, xp.add, a, b, out=d)


def _k_ufunc1(ufunc_name: str) -> Kernel:
    def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
        a, _, d = _flatten_ew(srcs[0], None, dst)
        return _ufunc_step(xp, getattr(xp, ufunc_name), a, out=d)
    return make


def _k_scale(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = node.op_params
    s = float(p[0]) if len(p) > 0 else 1.0
    bias = float(p[1]) if len(p) > 1 else 0.0
    a, _, d = _flatten_ew(srcs[0], None, dst)
    s32 = _F32(s)
    if bias == 0.0:
        return _ufunc_step(xp, xp.multiply, a, s32, out=d)
    b32 = _F32(bias)
    mul, add = xp.multiply, xp.add
    a = _alias(a, d)

    def run() -> None:
        mul(a, s32, out=d)
        add(d, b32, out=d)
    return run


def _k_clamp(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    lo, hi = _F32(node.op_params[0]), _F32(node.op_params[1])
    a, _, d = _flatten_ew(srcs[0], None, dst)
    a = _alias(a, d)
    mn, mx = xp.minimum, xp.maximum

    def run() -> None:  # ggml: MAX(MIN(x, max), min)
        mn(a, hi, out=d)
        mx(d, lo, out=d)
    return run


def _k_leaky_relu(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    slope = _F32(node.op_params[0])
    a = srcs[0]
    where, copyto = xp.where, xp.copyto

    def run() -> None:
        x = _f32(xp, a)
        copyto(dst, where(x > 0, x, x * slope), casting="unsafe")
    return run


def _k_unary(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    op = UnaryOp(node.op_params[0])
    a = srcs[0]
    if node.type == Type.F32 and a.dtype == _F32 and op in _UNARY_UFUNC:
        a1, _, d1 = _flatten_ew(a, None, dst)
        step = _ufunc_step(xp, getattr(xp, _UNARY_UFUNC[op]), a1, out=d1)
        return step
    if op == UnaryOp.RELU and node.type == Type.F32 and a.dtype == _F32:
        a1, _, d1 = _flatten_ew(a, None, dst)
        return _ufunc_step(xp, xp.maximum, a1, _F32(0), out=d1)
    act = _UNARY[op]
    copyto = xp.copyto

    def run() -> None:
        copyto(dst, act(xp, _f32(xp, a)), casting="unsafe")
    return run


def _k_glu(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    op = GluOp(node.op_params[0])
    swapped = bool(node.op_params[1]) if len(node.op_params) > 1 else False
    act = _GLU[op]
    a = srcs[0]
    b = srcs[1] if len(srcs) > 1 else None
    if b is None:
        n = dst.shape[-1]
        x, g = (a[..., n:2 * n], a[..., :n]) if swapped else (a[..., :n], a[..., n:2 * n])
    else:
        x, g = a, b  # split form: ggml ignores `swapped`
    copyto = xp.copyto

    def run() -> None:
        gg = _f32(xp, g)
        copyto(dst, act(xp, _f32(xp, x)) * gg, casting="unsafe")
    return run


# ---------------------------------------------------------------------------------------------
# copies and layout


def _k_copy(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    """DUP / CONT / CPY: copy src0 into dst in logical row-major order, converting the type
    (through float32 when neither side is float32; f32 -> i32 truncates toward zero)."""
    a = srcs[0]
    need_f32 = (a.dtype != dst.dtype and a.dtype != _F32 and dst.dtype != _F32
                and (a.dtype.kind == "f" or dst.dtype.kind == "f"))
    copyto = xp.copyto
    if a.shape == dst.shape:
        if need_f32:
            return lambda: copyto(dst, a.astype(_F32), casting="unsafe")
        return _copy_into(xp, dst, a)
    shape = dst.shape
    if _c_contig(a):
        a_r = a.reshape(shape)  # a view: nothing to do per call but the copy
        if need_f32:
            return lambda: copyto(dst, a_r.astype(_F32), casting="unsafe")
        return partial(copyto, dst, a_r, casting="unsafe")
    if _c_contig(dst):
        d_flat = dst.reshape(-1)

        def run_flat() -> None:
            src = a.reshape(-1)  # a copy for non-contiguous a (logical order)
            copyto(d_flat, src.astype(_F32) if need_f32 else src, casting="unsafe")
        return run_flat

    def run() -> None:
        src = a.reshape(shape)
        copyto(dst, src.astype(_F32) if need_f32 else src, casting="unsafe")
    return run


def _k_repeat(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    d, a, _ = _tile_views(xp, dst, srcs[0], dst)
    return partial(xp.copyto, d, a, casting="unsafe")


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
    if not _c_contig(dst):
        raise ValueError(f"{node.op.name} '{node.name}': destination must be contiguous")
    if offset < 0 or offset % item or offset + extent > total:
        raise ValueError(f"{node.op.name} '{node.name}': view of {list(ne)} with strides "
                         f"{[nb1, nb2, nb3]} at byte offset {offset} does not fit the "
                         f"{total} bytes of the destination")
    flat = dst.reshape(-1)[offset // item:]
    return _as_strided(xp, flat, b.shape, strides[::-1])


def _k_set(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a, b = srcs[0], srcs[1]
    region = _region(xp, node, dst, b)
    copy_a = _copy_into(xp, dst, a)
    copyto = xp.copyto

    def run() -> None:
        copy_a()
        copyto(region, b, casting="unsafe")
    return run


def _k_acc(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a, b = srcs[0], srcs[1]
    region = _region(xp, node, dst, b)
    copy_a = _copy_into(xp, dst, a)
    add = xp.add

    def run() -> None:
        copy_a()
        add(region, b, out=region)
    return run


def _k_get_rows(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a, idx = srcs[0], srcs[1]          # a (A3, A2, R, n); idx (1, A3, A2, r) int32
    A3, A2 = a.shape[0], a.shape[1]
    copyto = xp.copyto
    if A3 == 1 and A2 == 1:
        a2, i1, d2 = a[0, 0], idx[0, 0, 0], dst[0, 0]
        if a.dtype == dst.dtype and _c_contig(d2):
            return partial(xp.take, a2, i1, axis=0, out=d2)
        take = xp.take
        return lambda: copyto(d2, take(a2, i1, axis=0), casting="unsafe")
    i3 = xp.arange(A3).reshape(A3, 1, 1)
    i2 = xp.arange(A2).reshape(1, A2, 1)
    ii = idx[0]
    return lambda: copyto(dst, a[i3, i2, ii], casting="unsafe")


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


def _k_arange(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    start, _stop, step = (_F32(v) for v in node.op_params[:3])
    n = dst.shape[-1]
    # no sources: the values are constants, computed once (f32 start + step*i, like ggml)
    vals = xp.asarray((start + step * np.arange(n, dtype=_F32)).astype(_F32).reshape(dst.shape))
    return partial(xp.copyto, dst, vals, casting="unsafe")


def _k_timestep_embedding(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    dim, max_period = int(node.op_params[0]), node.op_params[1]
    half = dim // 2
    j = np.arange(half, dtype=_F32)
    with np.errstate(all="ignore"):
        freqs = np.exp((-np.log(_F32(max_period)) * j) / _F32(half)).astype(_F32)
    freqs_x = xp.asarray(freqs)
    t = srcs[0]                       # (1, 1, 1, N)
    tcol = t.reshape(-1)[:, None] if _c_contig(t) else None
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


def _k_diag_mask(value: float) -> Kernel:
    def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
        n_past = int(node.op_params[0])
        ne1, ne0 = dst.shape[2], dst.shape[3]
        mask = xp.asarray(np.arange(ne0)[None, :] > n_past + np.arange(ne1)[:, None])
        copy_a = _copy_into(xp, dst, srcs[0])
        copyto = xp.copyto
        v = _F32(value)

        def run() -> None:
            copy_a()
            copyto(dst, v, where=mask)
        return run
    return make


# ---------------------------------------------------------------------------------------------
# reductions


def _k_sum(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]
    copyto, sm = xp.copyto, xp.sum
    return lambda: copyto(dst, sm(a, dtype=_F64), casting="unsafe")


def _k_sum_rows(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]
    copyto, sm = xp.copyto, xp.sum
    return lambda: copyto(dst, sm(a, axis=-1, keepdims=True, dtype=_F64), casting="unsafe")


def _k_mean(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]
    n = a.shape[-1]
    copyto, sm = xp.copyto, xp.sum
    return lambda: copyto(dst, sm(a, axis=-1, keepdims=True, dtype=_F64) / n, casting="unsafe")


def _k_argmax(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    a = srcs[0]                       # (1, 1, ne1, ne0) -> dst (1, 1, 1, ne1)
    n = a.shape[-1]
    rev = a[..., ::-1]                # ggml returns the LAST maximal index; argmax the first
    d = dst.reshape(a.shape[:-1]) if _c_contig(dst) else None
    copyto, argmax = xp.copyto, xp.argmax

    def run() -> None:
        r = (n - 1) - argmax(rev, axis=-1)
        if d is not None:
            copyto(d, r, casting="unsafe")
        else:
            copyto(dst, r.reshape(dst.shape), casting="unsafe")
    return run


def _k_argsort(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    desc = bool(node.op_params[0]) if node.op_params else False
    a = srcs[0]
    copyto = xp.copyto
    # stable on both: CuPy's argsort is always stable (thrust; it accepts only kind=None or
    # "stable"), NumPy's default quicksort is not, so ties would order differently per backend
    argsort = partial(xp.argsort, axis=-1, kind="stable")
    if desc:
        return lambda: copyto(dst, argsort(-a), casting="unsafe")
    return lambda: copyto(dst, argsort(a), casting="unsafe")


# ---------------------------------------------------------------------------------------------
# normalisation (sums in float64 like ggml's CPU; the result is float32)


def _k_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    eps = float(node.op_params[0])
    a = srcs[0]
    n = a.shape[-1]
    sm, copyto, sqrt = xp.sum, xp.copyto, xp.sqrt

    def run() -> None:
        mean = (sm(a, axis=-1, keepdims=True, dtype=_F64) / n).astype(_F32)
        d = a - mean                                            # f32, as ggml
        var = sm(d * d, axis=-1, keepdims=True, dtype=_F64) / n
        scale = (1.0 / sqrt(var + eps)).astype(_F32)
        d *= scale
        copyto(dst, d, casting="unsafe")
    return run


def _k_rms_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    eps = float(node.op_params[0])
    a = srcs[0]
    n = a.shape[-1]
    sm, mul, sqrt = xp.sum, xp.multiply, xp.sqrt
    a = _alias(a, dst)  # in-place: CuPy would copy an overlapping input of ``mul`` per call

    def run() -> None:
        x64 = a.astype(_F64)
        ms = sm(x64 * x64, axis=-1, keepdims=True) / n
        scale = (1.0 / sqrt(ms + eps)).astype(_F32)
        mul(a, scale, out=dst)
    return run


def _k_l2_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    eps = _F32(node.op_params[0])
    a = srcs[0]
    sm, mul, sqrt, maximum = xp.sum, xp.multiply, xp.sqrt, xp.maximum
    a = _alias(a, dst)

    def run() -> None:
        x64 = a.astype(_F64)
        ss = sm(x64 * x64, axis=-1, keepdims=True)
        scale = 1.0 / maximum(sqrt(ss).astype(_F32), eps)       # ggml: 1/fmaxf(sqrtf(sum), eps)
        mul(a, scale.astype(_F32), out=dst)
    return run


def _k_group_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    n_groups, eps = int(node.op_params[0]), float(node.op_params[1])
    a = srcs[0]                       # (ne3, ne2=channels, ne1, ne0)
    ne2 = a.shape[1]
    cpg = (ne2 + n_groups - 1) // n_groups
    groups = [slice(g, min(g + cpg, ne2)) for g in range(0, ne2, cpg)]
    sm, copyto, sqrt = xp.sum, xp.copyto, xp.sqrt
    axes = (1, 2, 3)

    def run() -> None:
        outs = []
        for s in groups:               # ~32 groups: compute all first (dst may alias a)
            x = a[:, s]
            n = x.shape[1] * x.shape[2] * x.shape[3]
            mean = (sm(x, axis=axes, keepdims=True, dtype=_F64) / n).astype(_F32)
            d = x - mean
            var = sm(d * d, axis=axes, keepdims=True, dtype=_F64) / n
            d *= (1.0 / sqrt(var + eps)).astype(_F32)
            outs.append(d)
        for s, d in zip(groups, outs):
            copyto(dst[:, s], d, casting="unsafe")
    return run


# ---------------------------------------------------------------------------------------------
# matrix products


def _mm_views(xp: Any, a: Any, b: Any, d: Any) -> tuple[Any, Any, Any]:
    """Views for ``d = b @ A^T`` with ggml's block-repeat broadcast of ``a`` over dims 2/3.

    ``a`` (A3, A2, M, K), ``b`` (B3, B2, N, K), ``d`` (B3, B2, N, M) NumPy shapes, with
    ``B2 = r2*A2``, ``B3 = r3*A3``. Batch axes are split into (A, r) blocks (``a`` gets stride 0
    on the r axes); trailing broadcast batch axes whose strides allow it are folded into the row
    axis N so one large GEMM replaces many small ones. Returns (aT, bv, dv) with
    ``matmul(bv, aT, out=dv)`` computing the product.
    """
    A3, A2, M, K = a.shape
    B3, B2, N, _ = b.shape
    r2, r3 = B2 // A2, B3 // A3
    sa, sb, sd = a.strides, b.strides, d.strides
    # batch axes: (size, a_stride, b_stride, d_stride)
    batch = [(A3, sa[0], sb[0] * r3, sd[0] * r3), (r3, 0, sb[0], sd[0]),
             (A2, sa[1], sb[1] * r2, sd[1] * r2), (r2, 0, sb[1], sd[1])]
    batch = [x for x in batch if x[0] != 1]
    rows, b_row, d_row = N, sb[2], sd[2]
    while batch:
        n, s_a, s_b, s_d = batch[-1]
        if s_a == 0 and s_b == rows * b_row and s_d == rows * d_row:
            rows *= n
            batch.pop()
        else:
            break
    shp = tuple(x[0] for x in batch)
    aT = _as_strided(xp, a, shp + (K, M), tuple(x[1] for x in batch) + (sa[3], sa[2]))
    bv = _as_strided(xp, b, shp + (rows, K), tuple(x[2] for x in batch) + (b_row, sb[3]))
    dv = _as_strided(xp, d, shp + (rows, M), tuple(x[3] for x in batch) + (d_row, sd[3]))
    return aT, bv, dv


def _matmul_step(xp: Any, a: Any, b: Any, dst: Any) -> Step:
    """A closure for ``dst = b @ a^T`` (ggml MUL_MAT layout) over F32/F16 inputs.

    CuPy's ``matmul`` makes both operands C-contiguous first (``ascontiguousarray`` in
    ``cupy/_core/_routines_linalg.pyx``), i.e. it would copy the transposed weight ``a^T`` on every
    call. When the product folds into one 2-D GEMM with a C-contiguous output, CuPy gets ``dot``
    instead, which hands transposed (F-contiguous) operands to cuBLAS as they are
    (``_mat_to_cublas_contiguous``) and requires exactly that output layout."""
    matmul = xp.matmul
    if a.dtype == _F32 and b.dtype == _F32:
        aT, bv, dv = _mm_views(xp, a, b, dst)
        if (not _is_numpy(xp) and aT.ndim == 2 and dv.dtype == _F32 and _c_contig(dv)
                and (aT.flags.f_contiguous or _c_contig(aT))):
            return partial(xp.dot, bv, aT, out=dv)
        return partial(matmul, bv, aT, out=dv)

    def run() -> None:
        a32 = _f32(xp, a)
        b32 = _f32(xp, b)
        aT, bv, dv = _mm_views(xp, a32, b32, dst)
        matmul(bv, aT, out=dv)
    return run


def _k_mul_mat(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    return _matmul_step(xp, srcs[0], srcs[1], dst)


def _k_out_prod(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    # out_np = b^T @ A  ==  MUL_MAT(a^T, b^T) in NumPy layout
    a, b = srcs[0], srcs[1]
    return _matmul_step(xp, a.swapaxes(-1, -2), b.swapaxes(-1, -2), dst)


# ---------------------------------------------------------------------------------------------
# softmax, ALiBi, attention


def _alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """Per-head ALiBi slopes (float32, ggml's formula); all ones when ``max_bias == 0``."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=_F32)
    n_log2 = 2 ** int(math.floor(math.log2(n_head)))
    m0 = _F32(2.0) ** _F32(-max_bias / n_log2)
    m1 = _F32(2.0) ** _F32(-(max_bias / 2.0) / n_log2)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1).astype(_F32),
                    m1 ** (2 * (h - n_log2) + 1).astype(_F32)).astype(_F32)


def _tile_23(xp: Any, x: Any, m: Any) -> tuple[Any, Any]:
    """Split dims 2/3 (NumPy axes 0/1) of ``x`` so that ``m`` (same ne0/ne1, ne2/ne3 dividing
    x's) tiles over them by modulo. Returns (x6, m6) with x6 (r3, m3, r2, m2, ...) and m6
    (1, m3, 1, m2, ...)."""
    X3, X2 = x.shape[0], x.shape[1]
    M3, M2 = m.shape[0], m.shape[1]
    r3, r2 = X3 // M3, X2 // M2
    sx, smk = x.strides, m.strides
    x6 = _as_strided(xp, x, (r3, M3, r2, M2) + x.shape[2:],
                     (sx[0] * M3, sx[0], sx[1] * M2, sx[1]) + sx[2:])
    m6 = _as_strided(xp, m, (1, M3, 1, M2) + m.shape[2:], (0, smk[0], 0, smk[1]) + smk[2:])
    return x6, m6


def _k_soft_max(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = node.op_params
    scale = float(p[0]) if len(p) > 0 else 1.0
    max_bias = float(p[1]) if len(p) > 1 else 0.0
    a = srcs[0]
    mask = srcs[1] if len(srcs) > 1 else None
    X3, X2, X1, X0 = a.shape
    s32 = _F32(scale)
    exp, divide = xp.exp, xp.divide
    if mask is None:
        def run_plain() -> None:
            w = a * s32
            w -= w.max(axis=-1, keepdims=True)
            exp(w, out=w)
            divide(w, w.sum(axis=-1, keepdims=True), out=dst)
        return run_plain
    mrows = mask[:, :, :X1, :]
    a6, m6 = _tile_23(xp, a, mrows)
    d6, _ = _tile_23(xp, dst, mrows)
    M2 = mrows.shape[1]
    r2 = X2 // M2
    slope = xp.asarray(_alibi_slopes(X2, max_bias).reshape(1, 1, r2, M2, 1, 1))
    use_slope = max_bias > 0.0

    def run() -> None:
        w = a6 * s32
        mk = _f32(xp, m6)
        if use_slope:
            w += slope * mk
        else:
            w += mk
        w -= w.max(axis=-1, keepdims=True)
        exp(w, out=w)
        divide(w, w.sum(axis=-1, keepdims=True), out=d6)
    return run


def _k_flash_attn_ext(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = node.op_params
    scale = float(p[0]) if len(p) > 0 else 1.0
    max_bias = float(p[1]) if len(p) > 1 else 0.0
    softcap = float(p[2]) if len(p) > 2 else 0.0
    q, k, v = srcs[0], srcs[1], srcs[2]
    mask = srcs[3] if len(srcs) > 3 else None
    B, H, NQ, DK = q.shape
    Hkv, NKV = k.shape[1], k.shape[2]
    DV = v.shape[3]
    g = H // Hkv
    qs = _as_strided(xp, q, (B, Hkv, g, NQ, DK),
                     (q.strides[0], q.strides[1] * g, q.strides[1], q.strides[2], q.strides[3]))
    k5 = k[:, :, None]                             # (B, Hkv, 1, NKV, DK)
    v5 = v[:, :, None]                             # (B, Hkv, 1, NKV, DV)
    d_perm = dst.transpose(0, 2, 1, 3)             # dst (B, NQ, H, DV) -> (B, H, NQ, DV)
    d5 = _as_strided(xp, d_perm, (B, Hkv, g, NQ, DV),
                     (d_perm.strides[0], d_perm.strides[1] * g, d_perm.strides[1],
                      d_perm.strides[2], d_perm.strides[3]))
    s_scale = _F32(scale / softcap) if softcap != 0.0 else _F32(scale)
    cap = _F32(softcap)
    slopes = xp.asarray(_alibi_slopes(H, max_bias).reshape(1, Hkv, g, 1, 1))
    use_slope = max_bias > 0.0
    mask_fn = None
    if mask is not None:
        mB, mH = mask.shape[0], mask.shape[1]
        mq = mask[:, :, :NQ, :]                    # (mB, mH, NQ, NKV)
        if mH == 1:
            m_b = _as_strided(xp, mq, (mB, 1, 1, NQ, NKV),
                              (mq.strides[0], 0, 0, mq.strides[2], mq.strides[3]))
            if mB in (1, B):
                mask_fn = lambda: m_b  # noqa: E731
            else:
                bi = xp.asarray(np.arange(B) % mB)
                mask_fn = lambda: m_b[bi]  # noqa: E731
        else:
            bi = xp.asarray((np.arange(B) % mB).reshape(B, 1))
            hi = xp.asarray((np.arange(H) % mH).reshape(1, H))
            mask_fn = lambda: mq[bi, hi].reshape(B, Hkv, g, NQ, NKV)  # noqa: E731
    matmul, tanh, exp, copyto, where = xp.matmul, xp.tanh, xp.exp, xp.copyto, xp.where

    def run() -> None:
        kk = _f32(xp, k5)
        vv = _f32(xp, v5)
        s = matmul(qs, kk.swapaxes(-1, -2))        # (B, Hkv, g, NQ, NKV) f32
        s *= s_scale
        if softcap != 0.0:
            tanh(s, out=s)
            s *= cap
        if mask_fn is not None:
            mk = _f32(xp, mask_fn())
            s += slopes * mk if use_slope else mk
        m = s.max(axis=-1, keepdims=True)
        m = where(m == -np.inf, _F32(0), m)        # fully masked rows: exp(-inf) = 0 -> output 0
        s -= m
        exp(s, out=s)
        den = s.sum(axis=-1, keepdims=True)
        o = matmul(s, vv)
        o /= where(den == 0, _F32(1), den)
        copyto(d5, o, casting="unsafe")
    return run


# ---------------------------------------------------------------------------------------------
# rope


def _rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                         beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims in float32 with C's MAX/MIN ternaries (NaN/inf cases included)."""
    f = _F32
    with np.errstate(all="ignore"):
        def corr(n_rot: float) -> np.float32:
            return f(f(n_dims) * np.log(f(f(n_ctx_orig) / (f(n_rot) * f(2) * f(math.pi))))
                     / (f(2) * np.log(f(freq_base))))
        start = np.floor(corr(beta_fast))
        end = np.ceil(corr(beta_slow))
    lo = f(0) if f(0) > start else start            # MAX(0, start)
    hi = f(n_dims - 1) if f(n_dims - 1) < end else end  # MIN(n_dims - 1, end)
    return float(lo), float(hi)


def _rope_ramp(lo: float, hi: float, m: np.ndarray) -> np.ndarray:
    """1 - MIN(1, MAX(0, (m - lo) / MAX(0.001, hi - lo))) with C ternary semantics, float32."""
    f = _F32
    with np.errstate(all="ignore"):
        den = f(hi - lo)
        den = f(0.001) if f(0.001) > den else den
        y = (m.astype(_F32) - f(lo)) / den
        y = np.where(f(0) > y, f(0), y)             # MAX(0, y): NaN stays NaN
        y = np.where(f(1) < y, f(1), y)             # MIN(1, y)
    return (f(1) - y).astype(_F32)


def _k_rope(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    p = list(node.op_params) + [0] * (16 - len(node.op_params))
    n_dims, mode, n_ctx_orig = int(p[1]), int(p[2]), int(p[4])
    freq_base, freq_scale, ext_factor = float(p[5]), float(p[6]), float(p[7])
    attn_factor, beta_fast, beta_slow = float(p[8]), float(p[9]), float(p[10])
    a, pos = srcs[0], srcs[1]
    ff = srcs[2] if len(srcs) > 2 else None
    n_tok = a.shape[1]
    half = n_dims // 2
    if half == 0:                                   # nothing rotates: a plain copy
        return _copy_into(xp, dst, a)
    m = np.arange(half)
    theta_scale = float(_F32(freq_base) ** _F32(-2.0 / n_dims))
    powers = theta_scale ** m.astype(_F64)          # theta_m = p * theta_scale^m
    mscale = attn_factor
    if ext_factor != 0.0:
        lo, hi = _rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        mix = _rope_ramp(lo, hi, m).astype(_F64) * ext_factor
        coef = freq_scale * (1.0 - mix) + mix      # theta = t_interp*(1-mix) + t_extrap*mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    else:
        coef = np.full(half, freq_scale)
    base = xp.asarray(powers * coef)               # (half,) float64
    ms = _F64(mscale)
    if mode & 2:  # NEOX: (m, m + n_dims/2)
        x0, x1 = a[..., :half], a[..., half:n_dims]
        d0, d1 = dst[..., :half], dst[..., half:n_dims]
    else:         # NORMAL: (2m, 2m+1)
        x0, x1 = a[..., 0:n_dims:2], a[..., 1:n_dims:2]
        d0, d1 = dst[..., 0:n_dims:2], dst[..., 1:n_dims:2]
    rest = _copy_into(xp, dst[..., n_dims:], a[..., n_dims:]) if n_dims < a.shape[-1] else _noop
    cos, sin, copyto = xp.cos, xp.sin, xp.copyto
    # a reshape of a non-contiguous view is a copy: take it per call, never a stale one now
    posv = pos.reshape(-1) if _c_contig(pos) else None

    def run() -> None:
        pf = (posv if posv is not None else pos.reshape(-1))[:n_tok].astype(_F64)
        vec = base if ff is None else base / ff.reshape(-1)[:half].astype(_F64)
        theta = pf[:, None] * vec[None, :]         # (n_tok, half)
        c = (cos(theta) * ms).astype(_F32)[None, :, None, :]
        s = (sin(theta) * ms).astype(_F32)[None, :, None, :]
        y0 = _f32(xp, x0)
        y1 = _f32(xp, x1)
        o0 = y0 * c - y1 * s
        o1 = y0 * s + y1 * c
        copyto(d0, o0, casting="unsafe")
        copyto(d1, o1, casting="unsafe")
        rest()
    return run


# ---------------------------------------------------------------------------------------------
# dispatch

_KERNELS: dict[Op, Kernel] = {
    Op.DUP: _k_copy, Op.CPY: _k_copy, Op.CONT: _k_copy,
    Op.ADD: _k_binary("add"), Op.SUB: _k_binary("subtract"), Op.MUL: _k_binary("multiply"),
    Op.DIV: _k_binary("divide"), Op.ADD1: _k_add1, Op.ACC: _k_acc, Op.SET: _k_set,
    Op.SQR: _k_ufunc1("square"), Op.SQRT: _k_ufunc1("sqrt"),
    Op.LOG: _k_ufunc1("log"), Op.SIN: _k_ufunc1("sin"), Op.COS: _k_ufunc1("cos"),
    Op.SUM: _k_sum, Op.SUM_ROWS: _k_sum_rows, Op.MEAN: _k_mean, Op.ARGMAX: _k_argmax,
    Op.REPEAT: _k_repeat, Op.CONCAT: _k_concat, Op.NORM: _k_norm, Op.RMS_NORM: _k_rms_norm,
    Op.GROUP_NORM: _k_group_norm, Op.L2_NORM: _k_l2_norm, Op.MUL_MAT: _k_mul_mat,
    Op.OUT_PROD: _k_out_prod, Op.SCALE: _k_scale, Op.GET_ROWS: _k_get_rows,
    Op.DIAG_MASK_INF: _k_diag_mask(-math.inf), Op.DIAG_MASK_ZERO: _k_diag_mask(0.0),
    Op.SOFT_MAX: _k_soft_max, Op.ROPE: _k_rope, Op.CLAMP: _k_clamp, Op.ARANGE: _k_arange,
    Op.TIMESTEP_EMBEDDING: _k_timestep_embedding, Op.ARGSORT: _k_argsort,
    Op.LEAKY_RELU: _k_leaky_relu, Op.PAD: _k_pad, Op.FLASH_ATTN_EXT: _k_flash_attn_ext,
    Op.UNARY: _k_unary, Op.GLU: _k_glu,
}


def compile_node(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step | None:
    """A closure computing ``node`` into ``dst`` from ``srcs`` (see the module docstring).

    Args:
        xp: ``numpy`` or ``cupy``.
        node: the tensor to compute (its op, op_params, types and shapes are read here, once).
        dst: ``xp`` view of the node's memory, NumPy shape ``node.ne[::-1]``.
        srcs: ``xp`` views of ``node.src`` (None where a source is absent).

    Returns:
        A zero-argument callable that computes the node synchronously (on CuPy: launches on the
        current stream), or None when there is nothing to compute.

    Raises:
        ValueError: no kernel for the op (callers check :func:`supports_op` first), or a
            malformed node (e.g. a SET/ACC region outside the destination).
    """
    kernel = _KERNELS.get(node.op)
    if kernel is None:
        raise ValueError(f"compile_node: no kernel for op {node.op.name} of '{node.name}'")
    return kernel(xp, node, dst, srcs)


# ---------------------------------------------------------------------------------------------
# support


def _types(node: Tensor) -> list[Type | None]:
    return [None if s is None else s.type for s in node.src]


def _src(node: Tensor, i: int) -> Tensor | None:
    return node.src[i] if i < len(node.src) else None


def _tiles(b: Tensor, a: Tensor) -> bool:
    return all(m > 0 and n % m == 0 for n, m in zip(a.ne, b.ne))


def _sup_binary(node: Tensor) -> bool:
    a, b = _src(node, 0), _src(node, 1)
    return (a is not None and b is not None and node.type in _FLOATS and a.type in _FLOATS
            and b.type in _FLOATS and a.ne == node.ne and _tiles(b, a))


def _sup_same_float(node: Tensor) -> bool:
    a = _src(node, 0)
    return a is not None and a.type in _FLOATS and node.type in _FLOATS and a.ne == node.ne


def _sup_f32(node: Tensor) -> bool:
    a = _src(node, 0)
    return a is not None and a.type == Type.F32 and node.type == Type.F32


def _sup_copy(node: Tensor) -> bool:
    a = _src(node, 0)
    ok = (Type.F32, Type.F16, Type.I32)
    if a is None or a.nelements != node.nelements:
        return False
    if a.type == node.type:
        return a.type in _PLAIN
    return a.type in ok and node.type in ok


def _sup_mul_mat(node: Tensor) -> bool:
    a, b = _src(node, 0), _src(node, 1)
    if a is None or b is None or node.type != Type.F32:
        return False
    if a.type not in _FLOATS or b.type not in _FLOATS:
        return False
    if node.op == Op.MUL_MAT:
        shape_ok = (a.ne[0] == b.ne[0] and node.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3]))
    else:
        shape_ok = (a.ne[1] == b.ne[1] and node.ne == (a.ne[0], b.ne[0], b.ne[2], b.ne[3]))
    return shape_ok and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


def _sup_get_rows(node: Tensor) -> bool:
    a, b = _src(node, 0), _src(node, 1)
    if a is None or b is None or b.type != Type.I32:
        return False
    if a.type in (Type.F32, Type.F16):
        ok_t = node.type in _FLOATS
    elif a.type == Type.I32:
        ok_t = node.type == Type.I32
    else:
        return False
    return ok_t and a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1


def _sup_soft_max(node: Tensor) -> bool:
    a, mask = _src(node, 0), _src(node, 1)
    if a is None or a.type != Type.F32 or node.type != Type.F32 or a.ne != node.ne:
        return False
    if len(node.src) > 2 and any(s is not None for s in node.src[2:]):
        return False  # sinks not implemented
    max_bias = float(node.op_params[1]) if len(node.op_params) > 1 else 0.0
    if mask is None:
        return max_bias == 0.0
    return (mask.type in _FLOATS and mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1]
            and a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0)


def _sup_rope(node: Tensor) -> bool:
    a, pos = _src(node, 0), _src(node, 1)
    if a is None or pos is None or pos.type != Type.I32 or a.type not in _FLOATS:
        return False
    p = list(node.op_params) + [0] * (16 - len(node.op_params))
    n_dims, mode = int(p[1]), int(p[2])
    if mode not in (0, 2) or int(p[15]) != 0:
        return False  # MROPE/VISION/IMROPE and n_offs not implemented
    ff = _src(node, 2)
    if ff is not None and (ff.type != Type.F32 or ff.ne[0] < n_dims // 2):
        return False
    return (node.type == a.type and node.ne == a.ne and 0 <= n_dims <= a.ne[0] and n_dims % 2 == 0
            and pos.nelements >= a.ne[2])


def _sup_fa(node: Tensor) -> bool:
    q, k, v = _src(node, 0), _src(node, 1), _src(node, 2)
    mask = _src(node, 3)
    if q is None or k is None or v is None or node.type != Type.F32 or q.type != Type.F32:
        return False
    if k.type not in _FLOATS or v.type not in _FLOATS:
        return False
    if len(node.src) > 4 and any(s is not None for s in node.src[4:]):
        return False  # sinks not implemented
    if mask is not None and (mask.type not in _FLOATS or mask.ne[0] != k.ne[1]
                             or mask.ne[1] < q.ne[1] or q.ne[2] % mask.ne[2]
                             or q.ne[3] % mask.ne[3]):
        return False
    return (k.ne[0] == q.ne[0] and v.ne[1] == k.ne[1] and k.ne[2] == v.ne[2]
            and q.ne[2] % k.ne[2] == 0 and q.ne[3] == k.ne[3] == v.ne[3]
            and node.ne == (v.ne[0], q.ne[2], q.ne[1], q.ne[3]))


def _sup_unary(node: Tensor) -> bool:
    if not node.op_params:
        return False
    try:
        UnaryOp(int(node.op_params[0]))
    except ValueError:
        return False
    return _sup_same_float(node)


def _sup_glu(node: Tensor) -> bool:
    a, b = _src(node, 0), _src(node, 1)
    if not node.op_params or a is None:
        return False
    try:
        GluOp(int(node.op_params[0]))
    except ValueError:
        return False
    if a.type not in _FLOATS or node.type not in _FLOATS:
        return False
    if b is None:
        return a.ne[0] == 2 * node.ne[0] and a.ne[1:] == node.ne[1:]
    return b.type in _FLOATS and a.ne == b.ne == node.ne


def _sup_set_acc(node: Tensor) -> bool:
    a, b = _src(node, 0), _src(node, 1)
    if a is None or b is None or len(node.op_params) < 4:
        return False
    types = (Type.F32, Type.I32) if node.op == Op.SET else (Type.F32,)
    return (a.type == b.type == node.type and a.type in types and a.ne == node.ne
            and a.is_contiguous() and b.nelements <= a.nelements)


def _sup_reduce(node: Tensor) -> bool:
    a = _src(node, 0)
    if a is None or a.type not in _FLOATS:
        return False
    if node.op == Op.MEAN:
        return node.type == Type.F32
    return node.type == a.type


def _sup_argmax(node: Tensor) -> bool:
    a = _src(node, 0)
    return (a is not None and a.type == Type.F32 and node.type == Type.I32
            and a.ne[2] == a.ne[3] == 1 and node.ne[0] == a.ne[1])


def _sup_argsort(node: Tensor) -> bool:
    a = _src(node, 0)
    return a is not None and a.type == Type.F32 and node.type == Type.I32 and a.ne == node.ne


def _sup_repeat(node: Tensor) -> bool:
    a = _src(node, 0)
    return a is not None and a.type == node.type and a.type in _PLAIN and _tiles(a, node)


def _sup_concat(node: Tensor) -> bool:
    a, b = _src(node, 0), _src(node, 1)
    return (a is not None and b is not None and a.type == b.type == node.type
            and a.type in _PLAIN and bool(node.op_params) and 0 <= int(node.op_params[0]) < 4)


def _sup_pad(node: Tensor) -> bool:
    return _sup_f32(node)


def _sup_norm(node: Tensor) -> bool:
    a = _src(node, 0)
    return a is not None and a.type == node.type == Type.F32 and a.ne == node.ne


def _sup_diag_mask(node: Tensor) -> bool:
    return _sup_norm(node)


def _sup_arange(node: Tensor) -> bool:
    return node.type == Type.F32


def _sup_timestep(node: Tensor) -> bool:
    return _sup_f32(node)


def _sup_leaky_clamp(node: Tensor) -> bool:
    return _sup_same_float(node) and node.type == _src(node, 0).type


def _sup_add1(node: Tensor) -> bool:
    a, b = _src(node, 0), _src(node, 1)
    return (a is not None and b is not None and a.type in _FLOATS and b.type in _FLOATS
            and node.type in _FLOATS and b.nelements == 1 and a.ne == node.ne)


_SUPPORT: dict[Op, Callable[[Tensor], bool]] = {
    Op.DUP: _sup_copy, Op.CPY: _sup_copy, Op.CONT: _sup_copy,
    Op.ADD: _sup_binary, Op.SUB: _sup_binary, Op.MUL: _sup_binary, Op.DIV: _sup_binary,
    Op.ADD1: _sup_add1, Op.ACC: _sup_set_acc, Op.SET: _sup_set_acc,
    Op.SQR: _sup_same_float, Op.SQRT: _sup_same_float, Op.LOG: _sup_same_float,
    Op.SIN: _sup_same_float, Op.COS: _sup_same_float,
    Op.SUM: _sup_reduce, Op.SUM_ROWS: _sup_reduce, Op.MEAN: _sup_reduce, Op.ARGMAX: _sup_argmax,
    Op.REPEAT: _sup_repeat, Op.CONCAT: _sup_concat, Op.NORM: _sup_norm, Op.RMS_NORM: _sup_norm,
    Op.GROUP_NORM: _sup_norm, Op.L2_NORM: _sup_norm, Op.MUL_MAT: _sup_mul_mat,
    Op.OUT_PROD: _sup_mul_mat, Op.SCALE: _sup_norm, Op.GET_ROWS: _sup_get_rows,
    Op.DIAG_MASK_INF: _sup_diag_mask, Op.DIAG_MASK_ZERO: _sup_diag_mask,
    Op.SOFT_MAX: _sup_soft_max, Op.ROPE: _sup_rope, Op.CLAMP: _sup_leaky_clamp,
    Op.ARANGE: _sup_arange, Op.TIMESTEP_EMBEDDING: _sup_timestep, Op.ARGSORT: _sup_argsort,
    Op.LEAKY_RELU: _sup_leaky_clamp, Op.PAD: _sup_pad, Op.FLASH_ATTN_EXT: _sup_fa,
    Op.UNARY: _sup_unary, Op.GLU: _sup_glu,
}


def supports_op(node: Tensor, xp: Any) -> bool:
    """Whether ``node``'s op and type combination has a kernel for array module ``xp``.

    View ops (RESHAPE, VIEW, PERMUTE, TRANSPOSE) and NONE compute nothing and are supported for
    any type. Quantized and BF16 tensors are never supported by the compute kernels.
    """
    op = node.op
    if op == Op.NONE or op in (Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE):
        return True
    check = _SUPPORT.get(op)
    if check is None:
        return False
    if node.type.is_quantized or node.type == Type.BF16:
        return False
    for s in node.src:
        if s is not None and (s.type.is_quantized or s.type == Type.BF16):
            return False
    try:
        return bool(check(node))
    except (ValueError, TypeError, IndexError):
        return False
