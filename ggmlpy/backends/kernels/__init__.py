"""Op implementations written once over an array module ``xp`` (numpy or cupy).

Contract (used by ggmlpy/backends/plan.py for every backend):

* ``compile_node(xp, node, dst, srcs) -> Callable[[], None] | None`` resolves one node into a
  zero-argument closure that computes it, writing into ``dst`` (an ``xp`` array view of the node's
  memory: shape ``ne[::-1]``, strides ``nb[::-1]``). ``srcs[i]`` is the view of ``node.src[i]``
  (None for absent optional sources). Everything that does not depend on data (shapes, broadcast
  views, constants) is prepared here, once per plan.
* ``supports_op(node, xp) -> bool`` answers honestly per op, type combination and array module.

Layout: one module per op family (:mod:`.elementwise`, :mod:`.unary` (UNARY, GLU), :mod:`.layout`
(copies, REPEAT, CONCAT, SET/ACC, GET_ROWS, PAD, ARANGE, TIMESTEP_EMBEDDING), :mod:`.reduce`,
:mod:`.norm`, :mod:`.matmul`, :mod:`.attention` (DIAG_MASK, SOFT_MAX, FLASH_ATTN_EXT),
:mod:`.rope`), helpers in :mod:`.common`, type conversion (F16, BF16, block-quantized rows
to and from float32, on the host or with :mod:`ggmlpy.backends.cuda.quant` on the device) in
:mod:`.typeconv`. Each kernel is registered once, with its support
predicate, in :mod:`.registry`: ``@kernel(Op.ADD, supports=pred)`` where ``pred(node, xp) -> bool``
may depend on the array module, so a runtime can declare its own gaps. That registry is the only
statement of op support; the README's support table is generated from it
(``python scripts/gen_support_table.py``). Every other implementation of an op is a named
variant stacked in front of the generic one with ``REGISTRY.override(op, make, supports,
name=...)``: the fused CUDA kernels of :mod:`ggmlpy.backends.cuda.kernels` (CuPy only) and the
CPU's Numba, float32 fast-path variants of :mod:`ggmlpy.backends.cpu.variants`
(:func:`ggmlpy.backends.install` stacks both); ``REGISTRY.select(node, xp)`` says which runs.
To add an op: write the kernel and its predicate in its
family module (or a new module imported below) and decorate it.

Rules every kernel follows:

* Only functions NumPy and CuPy both provide are used (``xp.add(..., out=)``, ``xp.matmul``,
  ``xp.copyto``, ``xp.lib.stride_tricks.as_strided``, ``xp.take``, ...). Where the two differ
  (``erf``) the difference is handled in one helper. Plans run with NumPy's floating-point
  warnings off (:meth:`ggmlpy.backends.plan.Plan.run`): overflow to inf and NaN propagate
  silently, as in ggml.
* Results are written into ``dst`` (``out=`` where possible, else ``xp.copyto``); ``dst`` may be
  a strided view, and may share memory with ``srcs[0]`` (in-place ops, ggml-alloc's in-place
  reuse): kernels that read a source after writing part of ``dst`` compute into a temporary first.
* Sources and destinations may be non-contiguous (permuted, transposed, strided views).
* F16 tensors are computed in float32 and rounded once to float16 (round-to-nearest-even), as
  ggml's CPU kernels do. Sums that ggml accumulates in double (SUM, SUM_ROWS, MEAN, NORM,
  RMS_NORM, GROUP_NORM, L2_NORM) are accumulated in float64 here too.

Known deliberate differences from ggml's CPU backend: GELU and GELU_QUICK use the exact float32
formula where ggml's CPU looks the value up in an f16 table (so ggml is *less* accurate there,
rel. error ~2^-11 inside (-10, 10)); SILU/SIGMOID use ``exp`` instead of ggml's SIMD approximation;
ROPE builds ``theta`` in float64 (ggml multiplies in float32, drifting a few ulps); FLASH_ATTN_EXT
is an exact float32 softmax (ggml's CPU accumulates in f16 when V is F16). GET_ROWS indices are
bounds-checked on every backend (:mod:`.bounds`: ComputeError naming the node and the index;
ggml aborts).
"""

from __future__ import annotations

# the family modules register their kernels on import (order is irrelevant: one op, one module)
from ggmlpy.backends.kernels import attention, bounds, elementwise, layout, matmul, norm, reduce, rope, unary  # noqa: F401
from ggmlpy.backends.kernels.registry import (
                                              REGISTRY,
                                              Kernel,
                                              KernelEntry,
                                              KernelRegistry,
                                              Predicate,
                                              Step,
                                              compile_node,
                                              kernel,
                                              registered_ops,
                                              supports_op,
)

__all__ = ["compile_node", "supports_op", "kernel", "registered_ops", "REGISTRY", "KernelRegistry",
           "KernelEntry", "Kernel", "Predicate", "Step"]
