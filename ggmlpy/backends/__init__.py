"""Backend implementations: the NumPy CPU backend, the async device backend and its runtimes
(CuPy for CUDA, a host-emulated SIM device), and the kernels they share."""
