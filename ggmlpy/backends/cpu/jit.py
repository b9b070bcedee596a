"""Numba-compiled CPU kernels (the optional ``jit`` extra): GELU_ERF, masked SOFT_MAX, NORM and
row-broadcast binary ops, each one vectorized pass over memory.

NumPy evaluates these kernels as a chain of whole-array ufunc calls (GELU_ERF: ~20 passes, a
masked softmax: 7); here each is one loop that LLVM vectorizes (AVX2/AVX-512 where the CPU has
it). The NumPy formulations in :mod:`ggmlpy.backends.cpu.fastpath` and :mod:`ggmlpy.core.special` stay
the fallback (no Numba, or ``GGMLPY_JIT=0``) and the test referee.

Single-threaded by design: the BLAS GEMMs between these kernels leave OpenBLAS's worker threads
spinning for a while, and a multithreaded Numba kernel (``parallel=True``, OpenMP or workqueue
layer) launched then competes with them for the cores, and a cheap kernel right after a
threaded GEMM runs many times slower multithreaded than on one thread.

Accuracy. ``exp`` is evaluated in float32 as ggml's vectorized ``expf`` is: ``2^k * q(r)``,
``r = y - k ln 2`` in two Cody-Waite steps, ``|r| <= ln2/2``, ``q`` the degree-7 Taylor polynomial,
``2^k`` built from its bits: no calls into libm, so the loops vectorize with 8 or 16 float32
lanes (twice the lanes of a float64 formulation).
Error below 1 ulp (7.9e-8 relative, measured on a 4e6-point grid of ``[-87.3, 0]``). Results below
float32's smallest normal number are flushed to zero (subnormal operands make the next GEMM up to
13x slower; the flush moves a value by less than 1.2e-38):

* :func:`gelu_erf` ``max(x, 0) - 0.5|x| erfc(|x|/sqrt 2)`` with Abramowitz & Stegun 7.1.26 for
  ``erfc``, in float32: error <= ``GELU_ERF_F32_BOUND * max(1, |x|)`` (2e-7, the bound of
  :func:`ggmlpy.core.special.gelu_erf_f32`; measured 1.5e-7); NaN propagates, ``+inf -> +inf``,
  ``-inf -> 0``.
* :func:`soft_max` ``softmax(x * scale + mask)`` per row (``x * scale + mask`` in float32 as
  ggml, the exponentials in float32, their sum in float64, as ggml's ``ggml_float`` sum); a row
  of only ``-inf`` gives NaN, as in ggml. The row maximum is taken over the float32 bit patterns
  mapped to order-preserving int32 keys (an integer max vectorizes, a float one does not here).
* :func:`norm` ggml's NORM in ggml-cpu's order (x86 AVX-512: ``ggml_compute_forward_norm_f32``
  with ``ggml_vec_cvar_f32``; :mod:`.jit_kernels`), bit for bit.
* :func:`binary` ADD/SUB/MUL/DIV of float32 rows with a same-shape or one-row (bias) operand:
  IEEE float32 results, identical to NumPy's.

When the output is the input (the allocator computes in place whenever it can) each kernel runs
a variant that names one array only: with two names for one memory LLVM's run-time overlap check
fails and the loop runs scalar (4-5x slower).

Compilation happens on first use of each kernel (0.3-0.9 s) and is cached on disk (Numba's
``cache=True``: ``__pycache__`` beside this file, or Numba's user cache directory when that is
read-only), so later processes load the machine code in milliseconds. Calls are synchronous on
the calling thread and release the GIL.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from ggmlpy.core import env

__all__ = ["available", "reason", "kernel_module", "f16_table", "warm_up", "gelu_erf", "gelu_table",
           "soft_max", "norm", "binary", "BINARY_OPS"]

#: ``binary`` op codes
BINARY_OPS = {"add": 0, "subtract": 1, "multiply": 2, "divide": 3}

_state: dict[str, Any] = {}
_NO_MASK = np.zeros(1, np.float32)


def kernel_module(name: str) -> Any:
    """The Numba kernel module ``ggmlpy.backends.cpu.<name>`` (imported on the first call, which
    imports Numba), or None when it cannot be imported (no Numba, a broken install); the outcome
    is kept, so a failing import is tried once. Does not read ``GGMLPY_JIT`` (callers do).

    Args:
        name: the module's name inside ``ggmlpy.backends.cpu`` (``"qmatmul_kernels"``, ...).
    """
    key = "mod:" + name
    m = _state.get(key)
    if m is None:
        try:
            with _numba_import_without_scipy_probe():
                m = importlib.import_module(f"ggmlpy.backends.cpu.{name}")
                importlib.import_module("numba.np.arraymath")  # (the probe: on first use)
        except Exception as e:  # noqa: BLE001 - ImportError, or a broken Numba install
            m = f"numba is not importable ({type(e).__name__}: {e})"
        _state[key] = m
    return None if isinstance(m, str) else m


def f16_table() -> np.ndarray:
    """float32 ``(65536,)``: the value of every f16 bit pattern (ggml's ``ggml_table_f32_f16``;
    256 KiB, made once), which the compiled kernels read block scales from."""
    tbl = _state.get("f16_table")
    if tbl is None:
        tbl = _state["f16_table"] = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(
            np.float16).astype(np.float32)
    return tbl


@contextmanager
def _numba_import_without_scipy_probe() -> Iterator[None]:
    """While Numba is first imported, ``scipy.linalg.cython_blas`` reads as not installed.

    Numba's import probes for SciPy's BLAS (``numba.np.arraymath._HAVE_BLAS``) by importing
    ``scipy.linalg``: 28 MiB of resident memory in a process that never calls SciPy (ggmlpy's
    kernels use no BLAS inside compiled code). The probe only chooses how ``np.convolve`` and
    ``np.correlate`` compute inside ``@njit`` functions (a loop instead of BLAS); ``np.dot`` and
    ``np.linalg`` in compiled code import SciPy themselves when first compiled, after this. A
    process that imported Numba or SciPy's BLAS before is left as it is."""
    name = "scipy.linalg.cython_blas"
    if "numba" in sys.modules or name in sys.modules:
        yield
        return
    sys.modules[name] = None  # type: ignore[assignment] - ImportError for the probe
    try:
        yield
    finally:
        if sys.modules.get(name, 0) is None:
            del sys.modules[name]


def _build() -> dict[str, Any]:
    """Compile-on-first-call dispatchers for every kernel, or the reason Numba is unusable."""
    try:
        with _numba_import_without_scipy_probe():
            from ggmlpy.backends.cpu import jit_kernels as kj
            importlib.import_module("numba.np.arraymath")  # (the probe: on first use)
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install
        return {"reason": f"numba is not importable ({type(e).__name__}: {e})"}
    return {name: getattr(kj, name + "_body") for name in _NAMES}


_NAMES = ("gelu", "gelu_inplace", "softmax", "softmax_inplace", "norm", "norm_inplace", "rms_norm",
          "half_to_f32",
          "binary", "binary_inplace", "gelu_table", "gelu_table_inplace", "geglu_table")


def _kernels() -> dict[str, Any]:
    k = _state.get("k")
    if k is None:
        k = _state["k"] = _build()  # a race builds it twice: harmless
    return k


def available() -> bool:
    """True when the compiled kernels can be used: Numba imports and ``GGMLPY_JIT`` is not 0.
    Read when a plan is built (a plan keeps the kernels it was built with).

    Raises:
        EnvError: ``GGMLPY_JIT`` is malformed.
    """
    return env.jit_enabled() and "reason" not in _kernels()


def reason() -> str | None:
    """Why the compiled kernels are not used (None when :func:`available`)."""
    if not env.jit_enabled():
        return f"{env.JIT}=0"
    return _kernels().get("reason")


def warm_up() -> bool:
    """*Sync*: compile (or load from Numba's disk cache) every kernel for the float32 C-contiguous
    layouts plans use (``binary``'s second operand also read-only: a weight read in place from a
    mapped file), so the first graph evaluation does not pay for it (0.3-0.5 s with a warm
    cache, a few seconds on the first run after installation). Returns :func:`available`."""
    if not available():
        return False
    v, m = np.ones(8, np.float32), np.ones((2, 4), np.float32)
    x4 = np.ones((1, 1, 2, 4), np.float32)
    gelu_erf(v, v.copy())
    gelu_erf(v, v)
    table = np.zeros(65536, np.float32)  # any table: only the kernels' types matter here
    gelu_table(v, v.copy(), table)
    gelu_table(v, v, table)
    gelu_table(v, v.copy(), table, v.copy())
    soft_max(x4, x4.copy(), 0.5, x4.copy())
    soft_max(x4, x4.copy(), 0.5, x4)
    norm(m, 1e-5, m.copy())
    norm(m, 1e-5, m)
    binary("add", m, m[:1].copy(), m.copy())
    binary("add", m, m[:1].copy(), m)
    # a weight operand read in place from a read-only file map (Numba types read-only
    # arrays apart): the norm weights' MUL and the biases' ADD
    ro = m[:1].copy()
    ro.flags.writeable = False
    binary("add", m, ro, m.copy())
    binary("add", m, ro, m)
    return True


def _call(name: str, size: int, *args: Any) -> None:
    _kernels()[name](*args)


def _check_f32_c(fn: str, **arrays: Any) -> None:
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
            got = (f"{a.dtype} {'C-contiguous' if a.flags.c_contiguous else 'strided'}"
                   if isinstance(a, np.ndarray) else type(a).__name__)
            raise ValueError(f"cpu_jit.{fn}: {name} must be a C-contiguous float32 ndarray, "
                             f"got {got}")


def gelu_erf(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """*Sync*: exact-erf GELU (``ggml_gelu_erf``) of float32 ``x`` into ``out`` (any shape,
    both C-contiguous, ``out`` may be ``x``); error <= 2e-7 * max(1, |x|) (module docstring).

    Raises:
        ValueError: a non-float32 or non-C-contiguous array, or shapes differ.
    """
    _check_f32_c("gelu_erf", x=x, out=out)
    if x.shape != out.shape:
        raise ValueError(f"cpu_jit.gelu_erf: out shape {out.shape} != x shape {x.shape}")
    if _same(x, out):
        _call("gelu_inplace", x.size, out.reshape(-1))
    else:
        _call("gelu", x.size, x.reshape(-1), out.reshape(-1))
    return out


def gelu_table(x: np.ndarray, out: np.ndarray, table: np.ndarray,
               g: np.ndarray | None = None) -> np.ndarray:
    """*Sync*: ggml-cpu's table GELU (``GGML_GELU_FP16``, vec.h ``ggml_vec_gelu_f32``), or GEGLU's
    ``gelu(x) * g`` (``ggml_vec_geglu_f32``) when ``g`` is given, in one compiled pass: ``x``
    rounded to f16 (nearest even) indexes ``table`` (float32 ``(65536,)``,
    :func:`ggmlpy.backends.kernels.unary.gelu_f16_table`); ``x >= 10`` gives ``x``, ``x <= -10``
    gives 0. Bit-identical to :func:`ggmlpy.backends.kernels.unary.gelu_f16_table_into` (its
    NumPy form and the fallback). ``x``, ``out`` (and ``g``) float32 C-contiguous, any one shape;
    ``out`` may be ``x`` or ``g`` (each element is read before it is written).

    Raises:
        ValueError: a non-float32 or non-C-contiguous array, shapes that differ, or a table that
            is not float32 ``(65536,)``.
    """
    _check_f32_c("gelu_table", x=x, out=out, table=table)
    if table.shape != (65536,):
        raise ValueError(f"cpu_jit.gelu_table: table shape {table.shape} != (65536,)")
    if x.shape != out.shape:
        raise ValueError(f"cpu_jit.gelu_table: out shape {out.shape} != x shape {x.shape}")
    if g is None:
        if _same(x, out):
            _call("gelu_table_inplace", x.size, out.reshape(-1), table)
        else:
            _call("gelu_table", x.size, x.reshape(-1), table, out.reshape(-1))
        return out
    _check_f32_c("gelu_table", g=g)
    if g.shape != x.shape:
        raise ValueError(f"cpu_jit.gelu_table: g shape {g.shape} != x shape {x.shape}")
    _call("geglu_table", x.size, x.reshape(-1), g.reshape(-1), table, out.reshape(-1))
    return out


def soft_max(x: np.ndarray, mask: np.ndarray | None, scale: float, out: np.ndarray) -> np.ndarray:
    """*Sync*: ``softmax(x * scale + mask)`` over the last axis (``ggml_soft_max_ext`` with
    ``max_bias == 0``).

    Args:
        x: float32 C-contiguous, NumPy shape ``(X3, X2, X1, X0)`` (ggml ``ne = [X0, X1, X2, X3]``).
        mask: None, or float32 C-contiguous ``(M3, M2, M1, X0)`` with ``M1 >= X1`` and
            ``M2``/``M3`` dividing ``X2``/``X3``: row ``i1`` of ``x[i3, i2]`` adds mask row
            ``mask[i3 % M3, i2 % M2, i1]`` (ggml's broadcast of the mask).
        scale: multiplies ``x`` before the mask is added (float32 arithmetic, as ggml).
        out: float32 C-contiguous, ``x``'s shape (may be ``x``).

    Returns:
        ``out``.

    Raises:
        ValueError: layouts, dtypes or shapes as above violated.
    """
    _check_f32_c("soft_max", x=x, out=out)
    if x.ndim != 4 or out.shape != x.shape:
        raise ValueError(f"cpu_jit.soft_max: x must be 4-D and out of its shape, got "
                         f"{x.shape} and {out.shape}")
    X3, X2, X1, X0 = x.shape
    if mask is None:
        m, has = _NO_MASK, False
        dims = (X3, X2, X1, X0, 1, 1, 1)
    else:
        _check_f32_c("soft_max", mask=mask)
        if (mask.ndim != 4 or mask.shape[3] != X0 or mask.shape[2] < X1
                or min(mask.shape[:2]) < 1 or X2 % mask.shape[1] or X3 % mask.shape[0]):
            raise ValueError(f"cpu_jit.soft_max: mask {mask.shape} does not broadcast to rows "
                             f"of x {x.shape}")
        m, has = mask.reshape(-1), True
        dims = (X3, X2, X1, X0, *mask.shape[:3])
    if _same(x, out):
        _call("softmax_inplace", x.size, out.reshape(-1), m, has, dims, np.float32(scale))
    else:
        _call("softmax", x.size, x.reshape(-1), m, has, dims, np.float32(scale),
              out.reshape(-1))
    return out


def rms_norm(x: np.ndarray, eps: float, out: np.ndarray) -> np.ndarray:
    """*Sync*: ``x / sqrt(mean(x^2) + eps)`` per row (``ggml_rms_norm``) in ggml-cpu's order:
    the squares (float32) summed in float64 in element order, the mean rounded to float32, the
    scale and the products in float32 (ggml's ``ggml_compute_forward_rms_norm_f32``).

    Args:
        x: float32 C-contiguous ``(R, n)`` (ggml ``ne = [n, R]``).
        eps: added to the mean square.
        out: float32 C-contiguous ``(R, n)`` (may be ``x``).

    Returns:
        ``out``.

    Raises:
        ValueError: layouts, dtypes or shapes violated.
    """
    rms_norm_step(x, eps, out)()
    return out


def rms_norm_step(x: np.ndarray, eps: float, out: np.ndarray) -> Callable[[], None]:
    """:func:`rms_norm`'s arguments checked now and bound to the compiled kernel, for a plan
    step called per evaluation (no per-call checks: a decoder runs about a hundred small ones
    per token). Nothing is computed until the step is called.

    Raises:
        ValueError: as :func:`rms_norm`.
    """
    _check_f32_c("rms_norm", x=x, out=out)
    if x.ndim != 2 or out.shape != x.shape:
        raise ValueError(f"cpu_jit.rms_norm: x must be 2-D and out of its shape, got {x.shape} "
                         f"and {out.shape}")
    return partial(_kernels()["rms_norm"], x, float(eps), out)


#: float16 elements from which :func:`f16_to_f32` runs the compiled conversion (below, NumPy's
#: ``astype`` costs less than the call)
F16_MIN_ELEMENTS = 256


def f16_to_f32(x: np.ndarray) -> np.ndarray:
    """*Sync*: ``x.astype(float32)`` for a float16 ndarray, the same values (the conversion is
    exact; a signalling NaN comes out quiet, as ggml's F16C conversion gives it, where NumPy keeps
    its bits), in vector code (F16C) when the compiled kernels are used and ``x`` is C-contiguous
    with at least :data:`F16_MIN_ELEMENTS` elements: NumPy's ``astype`` converts one element at a
    time (45 us for a KV cache's 80 x 256 keys, 2 us here). Returns a new C-contiguous array
    of ``x``'s shape.

    Raises:
        TypeError: ``x`` is not a float16 ndarray.
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float16:
        raise TypeError(f"cpu_jit.f16_to_f32: x must be a float16 ndarray, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if not available():
        return x.astype(np.float32)
    return f16_converter()(x)


def f16_converter() -> Callable[[np.ndarray], np.ndarray]:
    """:func:`f16_to_f32` with the compiled kernels taken now (Numba must be available: check
    :func:`available` first), for a plan step that converts per evaluation without reading
    ``GGMLPY_JIT`` again. The returned function takes float16 ndarrays only (unchecked)."""
    body = _kernels()["half_to_f32"]
    f32, u16, least = np.float32, np.uint16, F16_MIN_ELEMENTS

    def convert(x: np.ndarray) -> np.ndarray:
        if x.size < least or not x.flags.c_contiguous:
            return x.astype(f32)
        out = np.empty(x.shape, f32)
        body(x.reshape(-1).view(u16), out.reshape(-1))
        return out
    return convert


def norm(x: np.ndarray, eps: float, out: np.ndarray) -> np.ndarray:
    """*Sync*: ``(x - mean) / sqrt(var + eps)`` per row (``ggml_norm``) in ggml-cpu's x86
    AVX-512 order (the row sum in float64, the mean in float32, the squares of each 16 values
    reduced in float32 and summed in float64, the variance and scale in float32).

    Args:
        x: float32 C-contiguous ``(R, n)`` (ggml ``ne = [n, R]``).
        eps: added to the variance.
        out: float32 C-contiguous ``(R, n)`` (may be ``x``).

    Raises:
        ValueError: layouts, dtypes or shapes violated.
    """
    _check_f32_c("norm", x=x, out=out)
    if x.ndim != 2 or out.shape != x.shape:
        raise ValueError(f"cpu_jit.norm: x must be 2-D and out of its shape, got {x.shape} "
                         f"and {out.shape}")
    if _same(x, out):
        _call("norm_inplace", x.size, out, float(eps))
    else:
        _call("norm", x.size, x, float(eps), out)
    return out


def binary(op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """*Sync*: ``out = a (op) b`` for float32 rows, ``b`` one row broadcast over ``a``'s rows
    (a bias) or of ``a``'s shape (``ggml_add``/``sub``/``mul``/``div`` in those layouts).

    Args:
        op: ``"add"``, ``"subtract"``, ``"multiply"`` or ``"divide"``.
        a: float32 C-contiguous ``(R, n)``.
        b: float32 C-contiguous ``(1, n)`` or ``(R, n)``.
        out: float32 C-contiguous ``(R, n)``; may be ``a`` or ``b`` (element-wise in place).

    Raises:
        ValueError: unknown op; layouts, dtypes or shapes violated.
    """
    if op not in BINARY_OPS:
        raise ValueError(f"cpu_jit.binary: op must be one of {sorted(BINARY_OPS)}, got {op!r}")
    _check_f32_c("binary", a=a, b=b, out=out)
    if (a.ndim != 2 or out.shape != a.shape or b.ndim != 2 or b.shape[1] != a.shape[1]
            or b.shape[0] not in (1, a.shape[0])):
        raise ValueError(f"cpu_jit.binary: shapes a {a.shape}, b {b.shape}, out {out.shape} "
                         f"are not (R, n), (1 or R, n), (R, n)")
    code = BINARY_OPS[op]
    if _same(out, a):
        _call("binary_inplace", a.size, out, b, code)
    elif _same(out, b) and code in (0, 2) and b.shape == a.shape:  # commutative: out += a
        _call("binary_inplace", a.size, out, a, code)
    else:
        _call("binary", a.size, a, b, out, code)
    return out


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    return (x is y or (x.__array_interface__["data"][0] == y.__array_interface__["data"][0]
                       and x.shape == y.shape and x.strides == y.strides))
