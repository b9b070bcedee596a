"""The NumPy CPU backend: buffers over host memory, compiled plans, threads, the CBLAS
GEMM path and Numba kernels.
"""
