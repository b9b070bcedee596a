"""Backend implementations: the NumPy CPU backend, the async device backend and its runtimes
(CuPy for CUDA, a host-emulated SIM device, Ray actors), and the kernels they share.

Everything the backends install into lower layers is installed by :func:`install`, in one place,
so that ``ggmlpy.core`` and ``ggmlpy.backend`` never import a backend.
"""

from __future__ import annotations

__all__ = ["install"]

_installed = False


def install() -> None:
    """Install the built-in backends into the layers below them, once (``import ggmlpy`` calls
    it; later calls do nothing). It installs:

    1. the backend table of :mod:`ggmlpy.backend.registry`: the factories of CUDA (priority
       10, :mod:`ggmlpy.backends.cuda.runtime`), SIM (20, :mod:`ggmlpy.backends.sim`), RAY (30,
       :mod:`ggmlpy.backends.ray.runtime`) and the CPU (100, :mod:`ggmlpy.backends.cpu.backend`).
       A new backend adds its ``FACTORY`` here;
    2. the host allocator of ``Context(no_alloc=False)`` (:func:`ggmlpy.core.tensor.set_host_buffer_alloc`):
       zero-filled CPU buffers;
    3. the interop hooks behind ``Tensor.numpy``, ``__array__``, ``__cuda_array_interface__``,
       ``__dlpack__`` and ``__dlpack_device__`` (:data:`ggmlpy.backends.interop.HOOKS`);
    4. the kernel variants stacked in front of the generic kernels of
       :data:`ggmlpy.backends.kernels.registry.REGISTRY`: the fused CUDA kernels
       (:func:`ggmlpy.backends.cuda.kernels.register`) and the CPU's Numba, fast-path and
       precise variants (:func:`ggmlpy.backends.cpu.variants.register`).
    """
    global _installed
    if _installed:
        return
    from ggmlpy.backend import registry
    from ggmlpy.backends import interop, sim
    from ggmlpy.backends.cpu import backend as cpu
    from ggmlpy.backends.cpu import variants as cpu_variants
    from ggmlpy.backends.cuda import kernels as cuda_kernels
    from ggmlpy.backends.cuda import runtime as cuda
    from ggmlpy.backends.kernels.registry import REGISTRY
    from ggmlpy.backends.ray import runtime as ray
    from ggmlpy.core import tensor

    for factory in (cuda.FACTORY, sim.FACTORY, ray.FACTORY, cpu.FACTORY):
        registry.register_factory(factory)
    tensor.set_host_buffer_alloc(cpu.alloc_host_zeroed)
    tensor.set_interop(interop.HOOKS)
    cuda_kernels.register(REGISTRY)
    cpu_variants.register(REGISTRY)
    _installed = True
