"""Helpers shared by the kernel families: array-module checks, strided views, in-place aliasing,
ggml's tiling broadcast, and the support-predicate building blocks (every predicate has the
signature ``pred(node, xp) -> bool``, see :mod:`.registry`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided as _np_as_strided

from ggmlpy.backends.kernels.registry import Step
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

F32 = np.float32
F64 = np.float64
#: the float types every float kernel computes (F16 via float32, rounded once)
FLOATS = (Type.F32, Type.F16)
#: types a plain copy/layout kernel moves bit-exactly
PLAIN = (Type.F32, Type.F16, Type.I32, Type.I16, Type.I8, Type.F64, Type.I64)


# ---------------------------------------------------------------------------------------------
# array helpers


def is_numpy(xp: Any) -> bool:
    """True when the array module is NumPy (the host path); False for CuPy or a stand-in."""
    return xp is np


def as_strided(xp: Any, x: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    """A zero-copy view of ``x`` with NumPy ``shape`` and byte ``strides`` (no bounds check)."""
    if xp is np:  # (``np.lib`` is a lazy module attribute: ~2 us per lookup)
        return _np_as_strided(x, shape=shape, strides=strides)
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


def c_contig(x: Any) -> bool:
    """True when the array ``x`` is C-contiguous (row-major, NumPy order ``ne[::-1]``)."""
    return bool(x.flags.c_contiguous)


def ufunc_step(xp: Any, fn: Any, *args: Any, out: Any) -> Step:
    """A closure ``fn(*args, out=out)`` for a ufunc. For NumPy the output is passed positionally:
    ``partial(np.add, a, b, d)`` has no keyword dict to merge per call and costs ~40% less than
    the ``out=`` form on tiny arrays (the per-node overhead target of the plan).

    Inputs that view exactly the memory of ``out`` (in-place ops) are replaced by ``out`` itself:
    a CuPy ufunc copies every input that *may share memory* with an output unless it is the very
    same object (``cupy/_core/_kernel.pyx``, ``_copy_in_args_if_needed``), which would cost a
    temporary and a full copy per call."""
    args = tuple(alias(x, out) for x in args)
    if is_numpy(xp) and fn not in (np.maximum, np.minimum):  # those deprecate positional out
        return partial(fn, *args, out)
    return partial(fn, *args, out=out)


def same_memory(x: Any, y: Any) -> bool:
    """True when two views start at the same address with the same layout (in-place aliasing)."""
    try:
        return (x.shape == y.shape and x.strides == y.strides and x.dtype == y.dtype
                and data_ptr(x) == data_ptr(y))
    except Exception:  # pragma: no cover - exotic array types
        return False


def alias(x: Any, out: Any) -> Any:
    """``out`` when ``x`` is an array viewing exactly ``out``'s memory (same start, shape, strides,
    dtype), else ``x``. Passing the output object itself as the input of an in-place ufunc lets
    CuPy skip its defensive copy of inputs that overlap an output (NumPy: no difference)."""
    if x is out or type(x) is not type(out):  # scalars, or already the same object
        return x
    return out if same_memory(x, out) else x


def data_ptr(x: Any) -> int:
    """The address of ``x``'s first element (NumPy: host address; CuPy: device address)."""
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    return int(x.data.ptr)  # cupy


def copy_into(xp: Any, dst: Any, src: Any) -> Step:
    """A closure copying ``src`` into ``dst`` (same shape), or a no-op if they are the same memory."""
    if same_memory(dst, src):
        return noop
    return partial(xp.copyto, dst, src, casting="unsafe")


def noop() -> None:
    """The step of a node with nothing to compute (e.g. a copy onto the same memory)."""
    return None


def as_f32(xp: Any, x: Any) -> Any:
    """``x`` as float32 (no copy when it already is)."""
    return x if x.dtype == F32 else x.astype(F32)


def tile_views(xp: Any, a: Any, b: Any, dst: Any) -> tuple[Any, Any, Any]:
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
    return (as_strided(xp, a, tuple(sha), tuple(sa)), as_strided(xp, b, tuple(shb), tuple(sb)),
            as_strided(xp, dst, tuple(sha), tuple(sd)))


def flatten_ew(a: Any, b: Any, dst: Any) -> tuple[Any, Any, Any]:
    """1-D views for an element-wise op when every operand is C-contiguous (cheaper ufunc calls);
    ``b`` may also be a single element. Otherwise the inputs unchanged."""
    if (a.shape == dst.shape and c_contig(a) and c_contig(dst)
            and (b is None or (c_contig(b) and (b.shape == a.shape or b.size == 1)))):
        a1, d1 = a.reshape(-1), dst.reshape(-1)
        b1 = None if b is None else b.reshape(-1)
        return a1, b1, d1
    return a, b, dst


# ---------------------------------------------------------------------------------------------
# support-predicate building blocks


def src_of(node: Tensor, i: int) -> Tensor | None:
    """``node.src[i]``, or None when the node has fewer sources."""
    return node.src[i] if i < len(node.src) else None


def tiles(b: Tensor, a: Tensor) -> bool:
    """True when ``b.ne[i]`` divides ``a.ne[i]`` for every dim (ggml's ``can_repeat``)."""
    return all(m > 0 and n % m == 0 for n, m in zip(a.ne, b.ne))


def sup_same_float(node: Tensor, xp: Any) -> bool:
    """Predicate: src0 and node F32/F16 (any mix) with the same ``ne``."""
    a = src_of(node, 0)
    return a is not None and a.type in FLOATS and node.type in FLOATS and a.ne == node.ne


def sup_f32(node: Tensor, xp: Any) -> bool:
    """Predicate: src0 and node F32 (shapes are the op constructor's business)."""
    a = src_of(node, 0)
    return a is not None and a.type == Type.F32 and node.type == Type.F32


def sup_f32_same(node: Tensor, xp: Any) -> bool:
    """Predicate: src0 and node F32 with the same ``ne``."""
    a = src_of(node, 0)
    return a is not None and a.type == node.type == Type.F32 and a.ne == node.ne
