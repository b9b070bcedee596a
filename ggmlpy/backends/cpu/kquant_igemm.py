"""Where the Q4_K and Q6_K products in llama.cpp's x86 orders (:mod:`.repack_q4k`,
:mod:`.vec_dot_q6k`) take their step sums from integer GEMMs (:mod:`.kquant_igemm_kernel`:
MKL's ``cblas_gemm_s16s16s32`` over int16 tiles of the weight, exact, then ggml's float32
steps; on a CPU with AVX512-VNNI the compiled int16 GEMM of :mod:`.s16_vnni_ir` instead, with
no MKL needed, :func:`vnni_gemm`): elsewhere when the CBLAS that ``GGMLPY_BLAS`` selects (:func:`ggmlpy.backends.cpu.blas.active`,
read when the step is built) has that function, and the product has enough activation rows
for the GEMMs to beat the dot kernels (:data:`Q4K_MIN_ROWS`, :data:`Q6K_MIN_ROWS`). The
choice never changes the bits, only the time.
"""

from __future__ import annotations

from ggmlpy.backends.cpu import blas as cpu_blas

__all__ = ["GEMM_SYMBOL", "Q4K_MIN_ROWS", "Q6K_MIN_ROWS", "MAX_CHUNK_ROWS", "VNNI_GEMM",
           "chunk_rows", "gemm_address", "vnni_gemm"]

#: the integer GEMM called by address from the compiled kernels (MKL, LP64 interface)
GEMM_SYMBOL = "cblas_gemm_s16s16s32"
#: Q4_K activation rows in groups of four (``ne11 - ne11 % 4``) from which the integer GEMMs run
#: (below, the fixed cost of the weight tiles would outweigh what the GEMMs save)
Q4K_MIN_ROWS = 8
#: Q6_K activation rows from which the integer GEMMs run (the tiled order's, from 8)
Q6K_MIN_ROWS = 8
#: the most weight rows per chunk of a task on the integer GEMMs (the unit the threads claim;
#: larger tiles make the GEMM calls more efficient)
MAX_CHUNK_ROWS = 160


def chunk_rows(M: int) -> int:
    """Weight rows per chunk of a task on the integer GEMMs for a weight of ``M`` rows: ``M``
    cut into a multiple of four chunks of at most :data:`MAX_CHUNK_ROWS` rows (so that two or
    four threads get equal shares), rounded up to 16 (the combining pass's lanes)."""
    n = 4 * -(-M // (4 * MAX_CHUNK_ROWS))
    rows = -(-M // n)
    return max(16, 16 * -(-rows // 16))


#: :func:`gemm_address`'s value for the compiled AVX512-VNNI int16 GEMM
#: (:func:`ggmlpy.backends.cpu.s16_vnni_ir.gemm16`; the kernels' ``VNNI_GEMM``)
VNNI_GEMM = -1


def vnni_gemm() -> bool:
    """Whether the integer steps run on the compiled int16 GEMM (Numba for a CPU with
    AVX512-F, -BW and -VNNI, ``GGMLPY_CPU_ZMM`` on): exact like MKL's, one compiled loop
    instead of thousands of small library calls (a 512-token Q4_K product on an AMD Zen 5:
    see docs/quant_matmul.md), and no MKL needed."""
    from ggmlpy.core import env  # noqa: PLC0415

    if not env.cpu_zmm():
        return False
    try:
        from ggmlpy.backends.cpu.legacy_zmm_ir import ZMM  # noqa: PLC0415 - imports llvmlite
    except ImportError:
        return False
    return bool(ZMM)


def gemm_address(n_rows: int, min_rows: int) -> int:
    """Where the integer steps come from when ``n_rows >= min_rows``: :data:`VNNI_GEMM` where
    :func:`vnni_gemm` holds, else the address of :data:`GEMM_SYMBOL` in the active CBLAS; 0
    below ``min_rows``, or without either (the dot kernels then compute every output).

    Raises:
        EnvError: ``GGMLPY_BLAS`` is malformed or names a library that cannot be loaded.
    """
    if n_rows < min_rows:
        return 0
    if vnni_gemm():
        return VNNI_GEMM
    lib = cpu_blas.active()
    return 0 if lib is None else lib.symbol_address(GEMM_SYMBOL)
