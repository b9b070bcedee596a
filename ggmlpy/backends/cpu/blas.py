"""An external CBLAS for the CPU backend's float32 GEMMs, called through :mod:`ctypes`
(``GGMLPY_BLAS``; the ``mkl`` extra).

ggml's BLAS backend is built against one vendor's CBLAS (``GGML_BLAS_VENDOR``: OpenBLAS, Intel
MKL, BLIS, ...). NumPy's ``matmul`` is bound to the BLAS NumPy was built with: OpenBLAS in the
PyPI wheels. This module lets MUL_MAT and OUT_PROD with float32 operands
(:mod:`ggmlpy.backends.kernels.matmul`) call another library's ``cblas_sgemm`` instead, with the
operands' pointers, transposes and leading dimensions worked out once when the plan is built.

Why: on x86-64, MKL's single-threaded SGEMM is faster than the OpenBLAS of NumPy's wheels on
the thin products of an encoder's linear layers (a few hundred to a few thousand rows by 384 by
384/1536), and its ``cblas_sgemm_batch`` runs attention's many small per-head products in one
call, faster than NumPy's batched ``matmul`` (``scripts/bench_shapes.py`` measures both).

Selection, by ``GGMLPY_BLAS`` (:func:`ggmlpy.core.env.blas`), read when a plan is built:

==============  ====================================================================================
``auto``        (default) MKL when its runtime library ``libmkl_rt`` is found (the ``mkl`` wheel,
                ``pip install 'ggmlpy[mkl]'``, or one on the loader's path), else NumPy
``numpy``       NumPy's ``matmul`` (its own BLAS)
``mkl``         MKL; :class:`~ggmlpy.core.errors.BackendUnavailableError` when it cannot be loaded
a path          that CBLAS library: ``cblas_sgemm`` with 32-bit ints, or the ILP64 names of the
                OpenBLAS that NumPy and SciPy wheels bundle (``scipy_cblas_sgemm64_``)
==============  ====================================================================================

Threads. MKL is loaded with its *sequential* threading layer: the backend's own threads split
large GEMMs by rows (:mod:`ggmlpy.backends.cpu.threads`), so MKL never starts an OpenMP team that
would compete with them. (When another library in the process initialised MKL first with a
threaded layer, ``auto`` keeps NumPy.) A library given by path threads as it was built to; the
backend holds it at one thread while a threaded plan runs when ``threadpoolctl`` finds it.

Every call is synchronous on the calling thread and releases the GIL. Products that the library
cannot take as they lie (a non-float32 operand, an operand with neither a unit row nor a unit
column stride, an output that overlaps an input, a dimension of 0 or beyond 32-bit ints, a batched
product without ``cblas_sgemm_batch``) stay on NumPy's ``matmul``; :func:`gemm_step` returns None
for them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import sys
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ggmlpy.core import env
from ggmlpy.core.env import EnvError
from ggmlpy.core.errors import BackendUnavailableError

__all__ = ["CBlas", "BlasUnavailableError", "active", "load", "load_mkl", "numpy_openblas_path",
           "gemm_step", "warm_up", "describe"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_MKL_THREADING_SEQUENTIAL = 1
_MKL_INTERFACE_LP64 = 0
_I32_MAX = 2**31 - 1
_F32 = np.dtype(np.float32)


class CBlas:
    """One loaded CBLAS library: ``cblas_sgemm`` (and ``cblas_sgemm_batch`` when it has the
    group API, as MKL does).

    Attributes:
        name: ``"mkl"`` or the library's file name. path: the file loaded. version: the library's
            version (MKL: ``"2026.2"``) when it reports one, else ``""``. batched: True when it has
            ``cblas_sgemm_batch`` (batched products go to it; otherwise they stay on NumPy).
    """

    def __init__(self, name: str, path: str, lib: ctypes.CDLL, sgemm: str, ilp64: bool,
                 sgemm_batch: str | None = None, version: str = "") -> None:
        self.name, self.path, self.version, self._lib = name, path, version, lib
        self._int = ctypes.c_int64 if ilp64 else ctypes.c_int32
        self._np_int = np.int64 if ilp64 else np.int32
        vp, i = ctypes.c_void_p, self._int
        self._sgemm = getattr(lib, sgemm)
        self._sgemm.restype = None
        self._sgemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, i, i, i, ctypes.c_float,
                                vp, i, vp, i, ctypes.c_float, vp, i]
        self._batch = None
        if sgemm_batch is not None:
            self._batch = getattr(lib, sgemm_batch)
            self._batch.restype = None
            self._batch.argtypes = [ctypes.c_int] + [vp] * 13 + [i, vp]
        self.batched = self._batch is not None

    def __repr__(self) -> str:
        return f"CBlas({self.name!r}, {self.version or self.path!r})"

    def symbol_address(self, symbol: str) -> int:
        """The address of the function ``symbol`` in this library (for compiled callers that
        call it by address, :mod:`ggmlpy.backends.cpu.kquant_igemm`), or 0 when the library
        has none of that name."""
        fn = getattr(self._lib, symbol, None)
        return 0 if fn is None else int(ctypes.cast(fn, ctypes.c_void_p).value or 0)

    def gemm_step(self, bv: Any, aT: Any, dv: Any) -> Callable[[], None] | None:
        """*Sync*: a closure computing ``dv = bv @ aT`` (NumPy ``matmul`` semantics, float32, no
        broadcasting: the three arrays share their leading batch shape) with this library, or
        None when the product must stay on NumPy (see the module doc).

        Shapes (NumPy order): ``bv`` ``(..., N, K)``, ``aT`` ``(..., K, M)``, ``dv`` ``(..., N, M)``;
        in ggml's MUL_MAT ``bv`` is src1, ``aT`` src0 transposed, ``dv`` the destination. The
        closure keeps the arrays alive and writes ``dv`` only (``beta = 0``: its old contents,
        NaN included, are never read). Batched products (``ndim > 2``) need :attr:`batched`.
        """
        got = self.gemm_call(bv, aT, dv)
        if got is None:
            return None
        call, scratch = got
        call.keep = (scratch, bv, aT, dv)  # the memory behind the addresses lives with the step
        return call

    def gemm_call(self, bv: Any, aT: Any, dv: Any) -> tuple[partial, Any] | None:
        """:meth:`gemm_step` without the keep-alive: ``(call, scratch)`` where ``call`` holds the
        operands' addresses only and ``scratch`` (None or the batched call's pointer arrays) must
        outlive it. The caller keeps the operands' memory alive while it calls ``call``: used by
        the weight cache's MUL_MAT, whose float32 weight copy may be evicted between calls."""
        if not (isinstance(bv, np.ndarray) and isinstance(aT, np.ndarray)
                and isinstance(dv, np.ndarray)) or bv.ndim != aT.ndim or bv.ndim != dv.ndim:
            return None
        if bv.ndim < 2 or not (bv.dtype == aT.dtype == dv.dtype == _F32):
            return None
        *batch, N, K = bv.shape
        if (tuple(batch) != aT.shape[:-2] or tuple(batch) != dv.shape[:-2] or aT.shape[-2] != K
                or dv.shape[-1] != aT.shape[-1] or dv.shape[-2] != N):
            return None
        M = aT.shape[-1]
        if min(N, K, M) == 0 or max(N, K, M) > _I32_MAX or dv.size == 0:
            return None
        if not (bv.flags.aligned and aT.flags.aligned and dv.flags.aligned and dv.flags.writeable):
            return None
        if _overlap(dv, bv) or _overlap(dv, aT):
            return None  # NumPy buffers overlapping operands; BLAS would read what it wrote
        first = (0,) * len(batch)
        lc = _layout(dv[first], N, M)
        if lc is None or lc[0] != _NO_TRANS:
            # a column-major output: compute its transpose, dv^T = aT^T @ bv^T
            bv, aT, dv = aT.swapaxes(-1, -2), bv.swapaxes(-1, -2), dv.swapaxes(-1, -2)
            N, M = M, N
        lc = _layout(dv[first], N, M)
        la = _layout(bv[first], N, K)
        lb = _layout(aT[first], K, M)
        if lc is None or lc[0] != _NO_TRANS or la is None or lb is None:
            return None
        if any(n > 1 and s < 0 for x in (bv, aT, dv) for n, s in zip(x.shape, x.strides)):
            return None
        if max(la[1], lb[1], lc[1]) > _I32_MAX:
            return None
        n_mat = int(np.prod(batch, dtype=np.int64)) if batch else 1
        if n_mat == 1:
            return partial(self._sgemm, _ROW_MAJOR, la[0], lb[0], N, M, K, 1.0,
                           _address(bv[first]), la[1], _address(aT[first]), lb[1], 0.0,
                           _address(dv[first]), lc[1]), None
        if self._batch is None or any(n > 1 and st == 0 for n, st in zip(batch, dv.strides)):
            return None  # (a broadcast output: several products would write one matrix)
        # one group: every product has the same sizes, transposes and leading dimensions
        ints = np.array([N, M, K, la[1], lb[1], lc[1], n_mat], self._np_int)
        trans = np.array([la[0], lb[0]], np.int32)
        scal = np.array([1.0, 0.0], np.float32)  # alpha, beta
        ptrs = _pointers((bv, aT, dv), batch)
        i0, n = ints.ctypes.data, ints.itemsize
        t0, f0, p0 = trans.ctypes.data, scal.ctypes.data, ptrs.ctypes.data
        return partial(self._batch, _ROW_MAJOR, t0, t0 + 4, i0, i0 + n, i0 + 2 * n, f0,
                       p0, i0 + 3 * n, p0 + 8 * n_mat, i0 + 4 * n, f0 + 4, p0 + 16 * n_mat,
                       i0 + 5 * n, 1, i0 + 6 * n), (ints, trans, scal, ptrs)


def _overlap(x: np.ndarray, y: np.ndarray) -> bool:
    """True when ``x`` and ``y`` share an element (exact for interleaved views; a problem too
    hard to decide counts as sharing)."""
    if not np.may_share_memory(x, y):
        return False
    try:
        return bool(np.shares_memory(x, y, max_work=100_000))
    except np.exceptions.TooHardError:
        return True


def _address(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]


def _layout(x: np.ndarray, rows: int, cols: int) -> tuple[int, int] | None:
    """``(transpose flag, leading dimension in elements)`` of a 2-D float32 view as CBLAS
    row-major sees it: unit column stride -> no transpose, ``ld`` the row stride; unit row
    stride -> transposed, ``ld`` the column stride. The stride of an axis of size 1 is free.
    None when neither stride is one element or ``ld`` is too small for the matrix."""
    s0, s1 = x.strides
    if s0 % 4 or s1 % 4:
        return None
    if cols == 1 or s1 == 4:
        ld = s0 // 4 if rows > 1 else max(cols, 1)
        return (_NO_TRANS, ld) if ld >= max(cols, 1) else None
    if rows == 1 or s0 == 4:
        ld = s1 // 4 if cols > 1 else max(rows, 1)
        return (_TRANS, ld) if ld >= max(rows, 1) else None
    return None


def _pointers(xs: tuple[np.ndarray, ...], batch: list[int]) -> np.ndarray:
    """Addresses (uint64) of the 2-D matrices of batched views sharing the batch shape
    ``batch``: those of ``xs[0]`` in C order over the batch axes, then those of ``xs[1]``, ..."""
    idx = np.indices(batch, dtype=np.int64).reshape(len(batch), -1)      # (axes, matrices)
    strides = np.array([x.strides[:-2] for x in xs], np.int64)            # (arrays, axes)
    base = np.array([_address(x) for x in xs], np.int64)[:, None]
    return (strides @ idx + base).reshape(-1).astype(np.uint64)


# ---------------------------------------------------------------------------------------------
# loading


def _mkl_candidates() -> list[str]:
    out = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        out += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")), reverse=True)
        out += sorted(glob.glob(os.path.join(prefix, "Library", "bin", "mkl_rt*.dll")))
    found = ctypes.util.find_library("mkl_rt")
    if found:
        out.append(found)
    return out


def load_mkl() -> CBlas:
    """*Sync*: load Intel MKL's runtime library (``libmkl_rt``: the ``mkl`` wheel's, in the
    environment's ``lib``, else one on the loader's path) with the sequential threading layer and
    32-bit ints, once per process.

    Raises:
        BackendUnavailableError: no MKL library found, or it could not be loaded, or another
            library already initialised it with a threaded layer.
    """
    errors = []
    for path in _mkl_candidates():
        try:
            lib = ctypes.CDLL(os.path.realpath(path))
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        return _mkl(lib, path)
    detail = "; ".join(errors) if errors else "no libmkl_rt found"
    raise BackendUnavailableError(f"MKL is not available ({detail}); pip install 'ggmlpy[mkl]'")


def _mkl(lib: ctypes.CDLL, path: str) -> CBlas:
    """A loaded MKL runtime library set to the sequential layer and LP64 (before any other MKL
    call in the process; BackendUnavailableError when another library set a threaded layer)."""
    layer = lib.MKL_Set_Threading_Layer(ctypes.c_int(_MKL_THREADING_SEQUENTIAL))
    if layer != _MKL_THREADING_SEQUENTIAL:
        raise BackendUnavailableError(
            f"MKL at {path} was initialised with threading layer {layer} by another library; "
            "ggmlpy needs its sequential layer (set MKL_THREADING_LAYER=SEQUENTIAL)")
    lib.MKL_Set_Interface_Layer(ctypes.c_int(_MKL_INTERFACE_LP64))
    buf = ctypes.create_string_buffer(256)
    try:
        lib.MKL_Get_Version_String(buf, ctypes.c_int(len(buf)))
        text = buf.value.decode(errors="replace")
        found = re.search(r"Version\s+([\w.]+)", text)
        version = found.group(1) if found else text.strip()
    except (AttributeError, OSError):
        version = ""
    batch = "cblas_sgemm_batch" if hasattr(lib, "cblas_sgemm_batch") else None
    return CBlas("mkl", path, lib, "cblas_sgemm", False, batch, version)


#: ``(cblas_sgemm symbol, ILP64)`` tried in order in a library given by path
_SYMBOLS = (("cblas_sgemm", False), ("scipy_cblas_sgemm64_", True), ("scipy_cblas_sgemm", False),
            ("cblas_sgemm64_", True))


def load(path: str) -> CBlas:
    """*Sync*: load the CBLAS library at ``path`` (``cblas_sgemm`` with 32-bit ints, or the
    prefixed/ILP64 names of the OpenBLAS that NumPy and SciPy wheels bundle). The file is opened
    by its real path (a symbolic link elsewhere would make MKL look for its parts beside the
    link). A library with MKL's ``MKL_Set_Threading_Layer``, whatever its name, is set up as
    :func:`load_mkl` sets MKL up and gets ``cblas_sgemm_batch``; other libraries' batched
    calls are not used (OpenBLAS's crashed in one 0.3.31 build).

    Raises:
        BackendUnavailableError: the file cannot be loaded or has none of those symbols.
    """
    try:
        lib = ctypes.CDLL(os.path.realpath(path))
    except OSError as e:
        raise BackendUnavailableError(f"cannot load the CBLAS library {path}: {e}") from e
    if hasattr(lib, "MKL_Set_Threading_Layer"):
        return _mkl(lib, path)
    for sgemm, ilp64 in _SYMBOLS:
        if hasattr(lib, sgemm):
            return CBlas(os.path.basename(path), path, lib, sgemm, ilp64)
    raise BackendUnavailableError(f"{path} has no cblas_sgemm (nor scipy_cblas_sgemm64_)")


def numpy_openblas_path() -> str | None:
    """The OpenBLAS library bundled with NumPy's wheel (``numpy.libs/libscipy_openblas*``), or
    None (a NumPy built against a system BLAS)."""
    root = os.path.dirname(os.path.dirname(np.__file__))
    hits = sorted(glob.glob(os.path.join(root, "numpy.libs", "libscipy_openblas*")))
    return hits[0] if hits else None


class BlasUnavailableError(EnvError, BackendUnavailableError):
    """``GGMLPY_BLAS`` names a library (``mkl`` or a path) that cannot be used: both a malformed
    environment variable (:class:`~ggmlpy.core.env.EnvError`, a ``ValueError``: the CLI exits with
    status 2) and an unavailable backend library (:class:`~ggmlpy.core.errors.BackendUnavailableError`).
    ``reason`` says why."""

    def __init__(self, value: str, reason: str) -> None:
        self.reason = reason
        super().__init__(env.BLAS, value, f"a loadable CBLAS library ({reason})")


_lock = threading.Lock()
_loaded: dict[str, CBlas | BaseException] = {}


def _get(spec: str) -> CBlas:
    with _lock:
        got = _loaded.get(spec)
        if got is None:
            try:
                got = load_mkl() if spec == "mkl" else load(spec)
            except BackendUnavailableError as e:
                got = e
            _loaded[spec] = got
    if isinstance(got, BaseException):
        raise got
    return got


def active() -> CBlas | None:
    """The library the CPU's float32 GEMMs use under the current ``GGMLPY_BLAS``, or None for
    NumPy's ``matmul``. Loads it on first use (once per process and library). Read when a plan is
    built: a plan keeps the library it was built with.

    Raises:
        EnvError: ``GGMLPY_BLAS`` is malformed.
        BlasUnavailableError: ``GGMLPY_BLAS`` names MKL or a library that cannot be loaded (an
            ``EnvError`` and a ``BackendUnavailableError``).
    """
    spec = env.blas()
    if spec == "numpy":
        return None
    if spec == "auto":
        try:
            return _get("mkl")
        except BackendUnavailableError:
            return None
    try:
        return _get(spec)
    except BackendUnavailableError as e:
        raise BlasUnavailableError(spec, str(e)) from e


def gemm_step(bv: Any, aT: Any, dv: Any) -> Callable[[], None] | None:
    """:meth:`CBlas.gemm_step` of the :func:`active` library, or None (NumPy's matmul)."""
    lib = active()
    return None if lib is None else lib.gemm_step(bv, aT, dv)


def warm_up() -> CBlas | None:
    """*Sync*: load the :func:`active` library and run one tiny product on the calling thread, so
    the first graph evaluation does not pay for loading (MKL: its CPU dispatch and
    buffers). Returns the library, or None when the GEMMs stay on NumPy. Called when a CPU
    backend is created, so that a library named by ``GGMLPY_BLAS`` that cannot be loaded is
    reported there, at once.

    Raises:
        EnvError: ``GGMLPY_BLAS`` is malformed, or names a library that cannot be loaded
            (:class:`BlasUnavailableError`).
    """
    lib = active()
    if lib is not None:
        x = np.ones((4, 4), np.float32)
        out = np.empty((4, 4), np.float32)
        step = lib.gemm_step(x, x, out)
        if step is not None:
            step()
    return lib


def describe() -> str:
    """One line for ``ggmlpy devices`` and the benchmarks: ``"numpy"``, ``"mkl <version>"`` or
    the library's file name; ``"unavailable (<reason>)"`` when ``GGMLPY_BLAS`` names a library
    that cannot be loaded (plans with float32 products then fail to build)."""
    try:
        lib = active()
    except BlasUnavailableError as e:
        return f"unavailable ({e.reason})"
    if lib is None:
        return "numpy"
    return f"{lib.name} {lib.version}".strip()
