"""Where the Q4_K and Q6_K products in llama.cpp's x86 orders (:mod:`.repack_q4k`,
:mod:`.vec_dot_q6k`) take their step sums from integer GEMMs (:mod:`.kquant_igemm_kernel`:
MKL's ``cblas_gemm_s16s16s32`` over int16 tiles of the weight, exact, then ggml's float32
steps): when the CBLAS that ``GGMLPY_BLAS`` selects (:func:`ggmlpy.backends.cpu.blas.active`,
read when the step is built) has that function, and the product has enough activation rows
for the GEMMs to beat the dot kernels (:data:`Q4K_MIN_ROWS`, :data:`Q6K_MIN_ROWS`). The
choice never changes the bits, only the time.
"""

from __future__ import annotations

from ggmlpy.backends.cpu import blas as cpu_blas

__all__ = ["GEMM_SYMBOL", "Q4K_MIN_ROWS", "Q6K_MIN_ROWS", "MAX_CHUNK_ROWS", "chunk_rows",
           "gemm_address"]

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


def gemm_address(n_rows: int, min_rows: int) -> int:
    """The address of :data:`GEMM_SYMBOL` in the active CBLAS when ``n_rows >= min_rows``, else
    0 (also without a CBLAS, or with one that lacks it: the dot kernels then compute every
    output).

    Raises:
        EnvError: ``GGMLPY_BLAS`` is malformed or names a library that cannot be loaded.
    """
    if n_rows < min_rows:
        return 0
    lib = cpu_blas.active()
    return 0 if lib is None else lib.symbol_address(GEMM_SYMBOL)
