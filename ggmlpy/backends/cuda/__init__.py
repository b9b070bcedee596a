"""CUDA through CuPy: the runtime (device memory, streams, events, pinned host
buffers) and its fused, GEMM and dequantization kernels.
"""
