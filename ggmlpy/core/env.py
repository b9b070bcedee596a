"""The ``GGMLPY_*`` environment variables: each one parsed and validated in one place.

=========================  ===============================================================
variable                   accepted value
=========================  ===============================================================
``GGMLPY_BACKENDS``        comma-separated device names (``SIM0,CPU``): letters then digits
``GGMLPY_SIM_DEVICES``     integer 0..64: SIM devices registered at first use
``GGMLPY_SIM_LATENCY_US``  finite number >= 0: microseconds per SIM launch and copy
``GGMLPY_SIM_MEMORY_MB``   finite number > 0: MiB of memory per SIM device
``GGMLPY_SIM_PINNED_DIRECT``  0 or 1: SIM uploads straight from pinned ``SIM_Host`` tensors in
                           stream order, as the CUDA runtime does (default 0: staged snapshot)
``GGMLPY_SCHED_DEBUG``     0, 1 or 2: scheduler debug printing
``GGMLPY_PRECISE_KERNELS``  0 or 1: the reference CPU kernels (GELU, NORM, RMS_NORM, ROPE in
                           float64) instead of the fast paths and ggml-cpu's roundings
``GGMLPY_JIT``             0 or 1: Numba-compiled CPU kernels when Numba is installed (default 1)
``GGMLPY_CPU_ZMM``         0 or 1: the legacy quantized products' prompt-batch tiles in 512-bit
                           registers where the CPU has AVX512-VNNI (default 1; same results)
``GGMLPY_BLAS``            ``auto``, ``numpy``, ``mkl`` or a CBLAS library's path: the CPU's
                           float32 GEMMs (default ``auto``: MKL when installed, else NumPy)
``GGMLPY_WEIGHT_CACHE_MB``  finite number >= 0: MiB of float32 weight copies kept by the
                           NumPy MUL_MAT (default 256 for F16/BF16 weights, off for
                           block-quantized ones; 0 = off)
``GGMLPY_QUANT_MATMUL``    ``ggml``, ``fast``, ``dot`` or ``dequant``: how the NumPy MUL_MAT
                           multiplies F16/BF16/quantized weights (default ``ggml``: ggml's
                           quantized-activation dot products in ggml-cpu's orders at every batch)
``GGMLPY_Q8_ROUNDING``     ``native``, ``ref``, ``x86`` or ``arm``: how the CPU MUL_MAT rounds
                           activations to Q8_0/Q8_1 (default ``native``: as ggml-cpu on this
                           machine's architecture)
``GGMLPY_RAY_DEVICES``     integer 0..1024: RAY devices (Ray actors) registered at first use
``GGMLPY_RAY_ADDRESS``     ``auto`` or ``HOST:PORT``: the Ray cluster the RAY devices join
``GGMLPY_RAY_TIMEOUT_S``   finite number > 0: seconds any wait on a RAY device may take
``GGMLPY_RAY_CPUS``        integer 1..1024: CPUs of the local Ray instance (default 2)
``GGMLPY_RAY_OBJECT_STORE_MB``  integer 75..1048576: its object store in MiB (default 512)
``GGMLPY_CACHE``           a folder: where ``download`` writes model files (default
                           ``$XDG_CACHE_HOME/ggmlpy``, else ``~/.cache/ggmlpy``)
``GGMLPY_GEMMA3_GGUF``     a file: the Gemma 3 270M GGUF that ``-m gemma3-270m`` and the tests
                           use instead of the one in the cache folder
``GGMLPY_FIXTURES``        a folder (read by the test suite only)
``GGMLPY_REF_PYTHON``      an interpreter with the reference tools (llama-cpp-python,
                           ggml-python): read by the benchmark and reference scripts only
=========================  ===============================================================

An empty or all-blank value means "unset". A malformed value raises :class:`EnvError` (a
``ValueError``) whose one-line message names the variable, the value and what is accepted.
:func:`validate` checks every variable at once; the registry calls it before it registers
anything, so a bad variable leaves no half-initialised state. This module imports only
:mod:`ggmlpy.core.errors`, so every layer may use it.
"""

from __future__ import annotations

import math
import os
import re

from ggmlpy.core.errors import GgmlpyError

__all__ = ["EnvError", "KNOWN", "BACKENDS", "SIM_DEVICES", "SIM_LATENCY_US", "SIM_MEMORY_MB",
           "SIM_PINNED_DIRECT", "sim_pinned_direct", "SCHED_DEBUG", "PRECISE_KERNELS", "precise_kernels", "JIT", "jit_enabled", "CPU_ZMM", "cpu_zmm", "BLAS", "blas", "FIXTURES", "backends", "sim_devices", "sim_latency_us",
           "sim_memory_mb", "sched_debug", "validate", "unknown_variables", "MAX_SIM_DEVICES",
           "RAY_DEVICES", "RAY_ADDRESS", "RAY_TIMEOUT_S", "RAY_CPUS", "RAY_OBJECT_STORE_MB",
           "ray_devices", "ray_address", "ray_timeout_s", "ray_cpus", "ray_object_store_mb",
           "ray_requested", "parse_ray_address", "WEIGHT_CACHE_MB", "DEFAULT_WEIGHT_CACHE_MB",
           "weight_cache_mb", "weight_cache_mb_set", "QUANT_MATMUL", "quant_matmul",
           "Q8_ROUNDING", "q8_rounding",
           "CACHE", "GEMMA3_GGUF", "cache_dir", "gemma3_gguf"]

BACKENDS = "GGMLPY_BACKENDS"
SIM_DEVICES = "GGMLPY_SIM_DEVICES"
SIM_LATENCY_US = "GGMLPY_SIM_LATENCY_US"
SIM_MEMORY_MB = "GGMLPY_SIM_MEMORY_MB"
SIM_PINNED_DIRECT = "GGMLPY_SIM_PINNED_DIRECT"
SCHED_DEBUG = "GGMLPY_SCHED_DEBUG"
PRECISE_KERNELS = "GGMLPY_PRECISE_KERNELS"
JIT = "GGMLPY_JIT"
CPU_ZMM = "GGMLPY_CPU_ZMM"
BLAS = "GGMLPY_BLAS"
WEIGHT_CACHE_MB = "GGMLPY_WEIGHT_CACHE_MB"
QUANT_MATMUL = "GGMLPY_QUANT_MATMUL"
CPU_SPIN = "GGMLPY_CPU_SPIN"
Q8_ROUNDING = "GGMLPY_Q8_ROUNDING"
FIXTURES = "GGMLPY_FIXTURES"
CACHE = "GGMLPY_CACHE"
GEMMA3_GGUF = "GGMLPY_GEMMA3_GGUF"
REF_PYTHON = "GGMLPY_REF_PYTHON"
RAY_DEVICES = "GGMLPY_RAY_DEVICES"
RAY_ADDRESS = "GGMLPY_RAY_ADDRESS"
RAY_TIMEOUT_S = "GGMLPY_RAY_TIMEOUT_S"
RAY_CPUS = "GGMLPY_RAY_CPUS"
RAY_OBJECT_STORE_MB = "GGMLPY_RAY_OBJECT_STORE_MB"

#: Every variable ggmlpy reads.
KNOWN = (BACKENDS, SIM_DEVICES, SIM_LATENCY_US, SIM_MEMORY_MB, SIM_PINNED_DIRECT, SCHED_DEBUG,
         PRECISE_KERNELS, JIT, CPU_ZMM, BLAS, WEIGHT_CACHE_MB, QUANT_MATMUL, CPU_SPIN, Q8_ROUNDING,
         FIXTURES, CACHE,
         GEMMA3_GGUF, REF_PYTHON,
         RAY_DEVICES, RAY_ADDRESS, RAY_TIMEOUT_S, RAY_CPUS, RAY_OBJECT_STORE_MB)

#: Upper bound of ``GGMLPY_SIM_DEVICES``.
MAX_SIM_DEVICES = 64

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z_]*\d*$")


class EnvError(GgmlpyError, ValueError):
    """A ``GGMLPY_*`` variable holds a value ggmlpy cannot use.

    Attributes:
        name: the variable's name. value: its (raw) value.
    """

    def __init__(self, name: str, value: str, expected: str) -> None:
        self.name = name
        self.value = value
        super().__init__(f"{name}={value!r} is invalid: expected {expected}")


def _raw(name: str) -> str | None:
    v = os.environ.get(name)
    if v is None or not v.strip():
        return None
    return v.strip()


def backends() -> list[str] | None:
    """``GGMLPY_BACKENDS`` as a list of upper-case device names (order kept, duplicates
    dropped), or None when unset.

    Raises:
        EnvError: an entry is empty or is not a device name (letters, then optional digits).
    """
    v = _raw(BACKENDS)
    if v is None:
        return None
    out: list[str] = []
    for part in v.split(","):
        p = part.strip()
        if not p or not _NAME_RE.match(p):
            raise EnvError(BACKENDS, v, "a comma-separated list of device names such as "
                                        "'SIM0,CPU' (bad entry " + repr(p) + ")")
        if p.upper() not in out:
            out.append(p.upper())
    return out


def sim_devices() -> int:
    """``GGMLPY_SIM_DEVICES`` as an int in 0..64 (0 when unset).

    Raises:
        EnvError: not an integer, or out of range.
    """
    v = _raw(SIM_DEVICES)
    if v is None:
        return 0
    expected = f"an integer in 0..{MAX_SIM_DEVICES}"
    try:
        n = int(v)
    except ValueError:
        raise EnvError(SIM_DEVICES, v, expected) from None
    if not 0 <= n <= MAX_SIM_DEVICES:
        raise EnvError(SIM_DEVICES, v, expected)
    return n


def _number(name: str, positive: bool) -> float | None:
    v = _raw(name)
    if v is None:
        return None
    expected = "a finite number " + ("> 0" if positive else ">= 0")
    try:
        x = float(v)
    except ValueError:
        raise EnvError(name, v, expected) from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        raise EnvError(name, v, expected)
    return x


def sim_latency_us() -> float | None:
    """``GGMLPY_SIM_LATENCY_US`` in microseconds (finite, >= 0), or None when unset.

    Raises:
        EnvError: not a finite number >= 0 (``nan``, ``inf``, ``-1``, ``abc`` are refused).
    """
    return _number(SIM_LATENCY_US, positive=False)


def sim_memory_mb() -> float | None:
    """``GGMLPY_SIM_MEMORY_MB`` in MiB (finite, > 0), or None when unset.

    Raises:
        EnvError: not a finite number > 0.
    """
    return _number(SIM_MEMORY_MB, positive=True)


def sim_pinned_direct() -> bool:
    """``GGMLPY_SIM_PINNED_DIRECT`` as a bool (False when unset): True makes SIM devices upload
    from tensors in their pinned host buffer type (``SIM_Host``) straight from that memory when
    the stream reaches the copy, as the CUDA runtime does with ``CUDA_Host`` (see
    :class:`ggmlpy.backends.sim.SimRuntime`); False snapshots the bytes into staging at enqueue.

    Raises:
        EnvError: a value other than 0 or 1.
    """
    return _flag(SIM_PINNED_DIRECT, False)


def sched_debug() -> int:
    """``GGMLPY_SCHED_DEBUG`` as 0, 1 or 2 (0 when unset).

    Raises:
        EnvError: any other value.
    """
    v = _raw(SCHED_DEBUG)
    if v is None:
        return 0
    if v not in ("0", "1", "2"):
        raise EnvError(SCHED_DEBUG, v, "0, 1 or 2")
    return int(v)


def _int_in(name: str, lo: int, hi: int) -> int | None:
    v = _raw(name)
    if v is None:
        return None
    expected = f"an integer in {lo}..{hi}"
    try:
        n = int(v)
    except ValueError:
        raise EnvError(name, v, expected) from None
    if not lo <= n <= hi:
        raise EnvError(name, v, expected)
    return n


_ADDRESS_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_ADDRESS_EXPECTED = "'auto' or HOST:PORT of a Ray head (e.g. 10.0.0.5:6379)"


def parse_ray_address(value: str, name: str = RAY_ADDRESS) -> str:
    """``value`` stripped if it is ``auto`` (any case; returned lower-case) or ``HOST:PORT`` with
    a port in 1..65535 (``[v6addr]:PORT`` for IPv6).

    Raises:
        EnvError: anything else (``ray://`` client URLs included), naming ``name``.
    """
    v = value.strip()
    if v.lower() == "auto":
        return "auto"
    m = _ADDRESS_RE.match(v)
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise EnvError(name, value, _ADDRESS_EXPECTED)
    return v


def ray_devices() -> int | None:
    """``GGMLPY_RAY_DEVICES`` as an int in 0..1024, or None when unset.

    Raises:
        EnvError: not an integer, or out of range.
    """
    return _int_in(RAY_DEVICES, 0, 1024)


def ray_address() -> str | None:
    """``GGMLPY_RAY_ADDRESS`` (``"auto"`` or ``"HOST:PORT"``), or None when unset.

    Raises:
        EnvError: any other value.
    """
    v = _raw(RAY_ADDRESS)
    return None if v is None else parse_ray_address(v)


def ray_timeout_s() -> float | None:
    """``GGMLPY_RAY_TIMEOUT_S`` in seconds (finite, > 0), or None when unset.

    Raises:
        EnvError: not a finite number > 0.
    """
    return _number(RAY_TIMEOUT_S, positive=True)


def ray_cpus() -> int | None:
    """``GGMLPY_RAY_CPUS`` (1..1024), or None when unset. Raises EnvError otherwise."""
    return _int_in(RAY_CPUS, 1, 1024)


def ray_object_store_mb() -> int | None:
    """``GGMLPY_RAY_OBJECT_STORE_MB`` (75..1048576, Ray's minimum is 75 MiB), or None when
    unset. Raises EnvError otherwise."""
    return _int_in(RAY_OBJECT_STORE_MB, 75, 1 << 20)


def ray_requested() -> bool:
    """Whether the environment asks for RAY devices at first use: ``GGMLPY_RAY_DEVICES`` > 0,
    or ``GGMLPY_RAY_ADDRESS`` set and ``GGMLPY_RAY_DEVICES`` not 0.

    Raises:
        EnvError: a malformed RAY variable.
    """
    n = ray_devices()
    return (n is not None and n > 0) or (ray_address() is not None and n != 0)


def precise_kernels() -> bool:
    """``GGMLPY_PRECISE_KERNELS`` as a bool (False when unset): True selects the reference
    formulations of the CPU's GELU/GEGLU (the float32 formula), GELU_ERF, NORM, RMS_NORM and
    ROPE kernels (float64 sums and angles; the test referee) instead of the float32 fast paths
    and ggml-cpu's own roundings (its f16 GELU table, float32 RoPE angles). Read when a plan is
    built.

    Raises:
        EnvError: a value other than 0 or 1.
    """
    return _flag(PRECISE_KERNELS, False)


def jit_enabled() -> bool:
    """``GGMLPY_JIT`` as a bool (True when unset): False keeps the CPU on its NumPy kernels even
    when Numba is installed (:mod:`ggmlpy.backends.cpu.jit`). Read when a plan is built.

    Raises:
        EnvError: a value other than 0 or 1.
    """
    return _flag(JIT, True)


def cpu_zmm() -> bool:
    """``GGMLPY_CPU_ZMM`` as a bool (True when unset): with Numba on a CPU with AVX512-F, -BW and
    -VNNI, the Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 dot kernels compute batches of four or more activation
    rows in 512-bit registers (:mod:`ggmlpy.backends.cpu.legacy_zmm_ir`: two outputs per
    register, each output's operations unchanged, so the results are the same bits); False
    keeps the 256-bit tiles (for CPUs whose 512-bit units are slower than two 256-bit ones).
    Read when a plan is built.

    Raises:
        EnvError: a value other than 0 or 1.
    """
    return _flag(CPU_ZMM, True)


def blas() -> str:
    """``GGMLPY_BLAS``: which BLAS the CPU backend's float32 GEMMs call
    (:mod:`ggmlpy.backends.cpu.blas`). ``"auto"`` when unset (MKL when its runtime library is
    installed, else NumPy's matmul), ``"numpy"``, ``"mkl"``, or the path of a CBLAS shared library
    (returned as given). The names are case-insensitive and returned in lower case. Read when a
    plan is built.

    Raises:
        EnvError: neither a name above nor the path of an existing file (a folder is named as
            such). Whether the library loads is checked by
            :func:`ggmlpy.backends.cpu.blas.active` (a ``BlasUnavailableError``, also an
            ``EnvError``).
    """
    v = _raw(BLAS)
    if v is None:
        return "auto"
    if v.lower() in ("auto", "numpy", "mkl"):
        return v.lower()
    if not os.path.isfile(v):
        why = "a folder, not a file" if os.path.isdir(v) else "no such file"
        raise EnvError(BLAS, v, f"auto, numpy, mkl or the path of a CBLAS shared library ({why})")
    return v


def _flag(name: str, default: bool) -> bool:
    """A 0/1 variable as a bool (``default`` when unset); EnvError for anything else."""
    v = _raw(name)
    if v is None:
        return default
    if v not in ("0", "1"):
        raise EnvError(name, v, "0 or 1")
    return v == "1"


#: ``GGMLPY_WEIGHT_CACHE_MB`` when unset: 256 MiB holds every float32 copy of MiniLM-L6's F16
#: or quantized matrices (about 87 MB) several times over
DEFAULT_WEIGHT_CACHE_MB = 256.0


def weight_cache_mb() -> float:
    """``GGMLPY_WEIGHT_CACHE_MB``: the byte budget, in MiB (2**20 bytes), of the float32 copies of
    F16/BF16/quantized weights that the NumPy MUL_MAT keeps between calls
    (:mod:`ggmlpy.backends.kernels.weight_cache`); :data:`DEFAULT_WEIGHT_CACHE_MB` when unset.
    ``0`` turns the cache off (every call converts the weight in row blocks). Read when a plan
    is built.

    Raises:
        EnvError: not a finite number >= 0.
    """
    v = _number(WEIGHT_CACHE_MB, positive=False)
    return DEFAULT_WEIGHT_CACHE_MB if v is None else v


def weight_cache_mb_set() -> bool:
    """True when ``GGMLPY_WEIGHT_CACHE_MB`` is set (not blank): block-quantized weights are cached
    only then (an explicit trade of memory for speed; their MUL_MAT reads them in place by
    default, see :func:`quant_matmul`).

    Raises:
        EnvError: a malformed value.
    """
    return _number(WEIGHT_CACHE_MB, positive=False) is not None


#: ``GGMLPY_CPU_SPIN`` when unset
CPU_SPIN_DEFAULT = 50000


def cpu_spin() -> int:
    """``GGMLPY_CPU_SPIN`` (0..10**8; default :data:`CPU_SPIN_DEFAULT`): how many spins (a load
    and the CPU's spin-loop hint each, of the order of 10 ns) a CPU backend worker thread polls
    for the next dot task after its work before it sleeps
    (:class:`ggmlpy.backends.cpu.threads.Pool`). Large values save the wake-ups of back-to-back
    products on a machine with cores to spare; 0 sleeps at once (the polite choice on cores
    shared with other work). Read when a pool's workers start.

    Raises:
        EnvError: not an integer in range.
    """
    v = _int_in(CPU_SPIN, 0, 10 ** 8)
    return CPU_SPIN_DEFAULT if v is None else v


def quant_matmul() -> str:
    """``GGMLPY_QUANT_MATMUL``: ``"ggml"`` (default), ``"fast"``, ``"dot"`` or ``"dequant"``,
    case-insensitive, returned in lower case; how a NumPy MUL_MAT multiplies a weight that has
    a dot kernel (:mod:`ggmlpy.backends.cpu.qmatmul`). ``ggml``: as ggml-cpu computes it, at
    every batch size: the activations quantized to the weight's ``vec_dot_type`` and ggml's
    block dot products on the weight's bytes, in ggml-cpu's per-output summation order (its
    ``vec_dot`` and llamafile's integer tiles; so an LLM's results follow llama.cpp's), but for
    F16/BF16 weights, whose batches of 2 and 4 rows on take the GEMM path (below). ``fast``: the
    faster path per shape: the dot kernels below the weight type's measured crossover
    (:data:`ggmlpy.backends.cpu.qmatmul.CROSSOVER`), from it on dequantized weight tiles times
    the activations' block values in a BLAS GEMM (ggml's roundings, BLAS's summation order:
    about 10% more prompt throughput for an LLM, results no longer llama.cpp's bits). ``dot``:
    the dot kernels for every weight type and batch, and the F16/F32 activation products
    (attention) in ggml-cpu's order at every size. ``dequant``: float32 products of the exact
    weight values with the float32 activations at every batch size (the referee). Read when a
    plan is built.

    Raises:
        EnvError: any other value.
    """
    v = _raw(QUANT_MATMUL)
    if v is None:
        return "ggml"
    if v.lower() not in ("ggml", "fast", "dot", "dequant"):
        raise EnvError(QUANT_MATMUL, v, "ggml, fast, dot or dequant")
    return v.lower()


def q8_rounding() -> str:
    """``GGMLPY_Q8_ROUNDING``: ``"native"`` (default), ``"ref"``, ``"x86"`` or ``"arm"``,
    case-insensitive, returned in lower case: which of ggml's activation quantizers the CPU
    MUL_MAT follows when it converts ``src1`` to Q8_0/Q8_1 (:mod:`ggmlpy.quants.q8_arch`):
    ``native`` the one ggml-cpu runs on this machine's architecture
    (:func:`ggmlpy.quants.q8_arch.host_form`), ``ref`` ggml-quants.c's reference loop, ``x86`` /
    ``arm`` ggml-cpu's AVX2 / NEON forms on any machine. Q8_K is the reference loop in every
    setting. Read at each quantization.

    Raises:
        EnvError: any other value.
    """
    v = _raw(Q8_ROUNDING)
    if v is None:
        return "native"
    if v.lower() not in ("native", "ref", "x86", "arm"):
        raise EnvError(Q8_ROUNDING, v, "native, ref, x86 or arm")
    return v.lower()


def cache_dir() -> str:
    """``GGMLPY_CACHE``: the folder ``python -m ggmlpy download`` writes model files into
    (created on demand, not here); when unset ``$XDG_CACHE_HOME/ggmlpy``, else
    ``~/.cache/ggmlpy``. Returned with ``~`` expanded, not resolved.

    Raises:
        EnvError: the path exists and is not a folder.
    """
    v = _raw(CACHE)
    if v is None:
        xdg = _raw("XDG_CACHE_HOME")
        return os.path.join(xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache"),
                            "ggmlpy")
    v = os.path.expanduser(v)
    if os.path.exists(v) and not os.path.isdir(v):
        raise EnvError(CACHE, v, "a folder (or a path where one can be made), not a file")
    return v


def gemma3_gguf() -> str | None:
    """``GGMLPY_GEMMA3_GGUF``: the Gemma 3 270M GGUF file to use instead of the cached one
    (``~`` expanded), or None when unset. Whether the file exists is checked by its user
    (:func:`ggmlpy.models.llm.download.find_default_gemma3`), which names the variable."""
    v = _raw(GEMMA3_GGUF)
    return None if v is None else os.path.expanduser(v)


def validate() -> None:
    """Check every variable ggmlpy reads; raise the first :class:`EnvError` (in :data:`KNOWN`
    order). ``GGMLPY_FIXTURES`` is not checked here (only the tests read it)."""
    backends()
    sim_devices()
    sim_latency_us()
    sim_memory_mb()
    sim_pinned_direct()
    sched_debug()
    precise_kernels()
    jit_enabled()
    cpu_zmm()
    blas()
    weight_cache_mb()
    quant_matmul()
    q8_rounding()
    ray_devices()
    ray_address()
    ray_timeout_s()
    ray_cpus()
    ray_object_store_mb()
    cache_dir()


def unknown_variables() -> list[str]:
    """Names of set ``GGMLPY_*`` variables that ggmlpy does not read (likely typos), sorted."""
    return sorted(k for k in os.environ if k.startswith("GGMLPY_") and k not in KNOWN)
