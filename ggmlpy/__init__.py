"""ggmlpy: ggml's backend layer in Python.

Tensors and compute graphs (:mod:`ggmlpy.core.tensor`, :mod:`ggmlpy.core.graph`), graph-building ops with
ggml's names and shape rules (:mod:`ggmlpy.ops`, re-exported here: ``ggmlpy.add(ctx, a, b)``), the
backend interface (:mod:`ggmlpy.backend.interface`), a registry of devices (:mod:`ggmlpy.backend.registry`), the
allocators (:mod:`ggmlpy.alloc.tallocr`, :mod:`ggmlpy.alloc.gallocr`), the NumPy CPU backend, a CuPy CUDA backend and a
host-emulated device (:mod:`ggmlpy.backends`), and the multi-backend scheduler
(:mod:`ggmlpy.sched.scheduler`), ggml's quantized types (:mod:`ggmlpy.quants`: ``ggmlpy.quantize``,
``ggmlpy.dequantize``) and GGUF files (:mod:`ggmlpy.gguf.weights`: ``ggmlpy.gguf_load``,
``ggmlpy.gguf_save``; saving needs the ``[gguf]`` extra; :mod:`ggmlpy.gguf.reader` parses).

Conventions: shapes are ggml's ``ne`` (``ne[0]`` innermost); the NumPy array holding the same data
has shape ``ne[::-1]``. Strides ``nb`` and all offsets and sizes are in bytes.
"""

from __future__ import annotations

from ggmlpy.core import sigint as _sigint

_sigint.install_startup_handler()  # `python -m ggmlpy`: Ctrl-C while importing -> one line, 130

from ggmlpy.backend.buffers import MultiBuffer
from ggmlpy.backend.interface import (
    Backend,
    Buffer,
    BufferType,
    BufferUsage,
    Device,
    DeviceCaps,
    DeviceProps,
    DeviceType,
    Event,
    Reg,
    Status,
    event_new,
    event_query,
    event_record,
    event_synchronize,
    event_wait,
    tensor_alloc,
    view_init,
)
from ggmlpy.backend.registry import (
    backend_init_best,
    backend_init_by_name,
    backend_init_by_type,
    dev_by_name,
    dev_by_type,
    dev_count,
    dev_get,
    devices,
    reg_by_name,
    reg_count,
    reg_get,
)
from ggmlpy.backend.tensor_data import (
    backend_tensor_copy,
    backend_tensor_copy_async,
    backend_tensor_get,
    backend_tensor_get_async,
    backend_tensor_memset,
    backend_tensor_set,
    backend_tensor_set_async,
)
from ggmlpy.backends import install as _install_backends
from ggmlpy.backends.cpu.backend import backend_cpu_init, cpu_buffer_from_array, cpu_buffer_type
from ggmlpy.backends.sim import register_sim_devices
from ggmlpy.core.errors import (
    BackendUnavailableError,
    ComputeError,
    FileFormatError,
    GgmlpyError,
    GGUFError,
    GraphFullError,
    NotAllocatedError,
    OutOfMemoryError,
    UnsupportedOpError,
)
from ggmlpy.core.graph import Graph, graph_view, new_graph
from ggmlpy.core.opcodes import GluOp, Op, UnaryOp
from ggmlpy.core.tensor import Context, Flag, Tensor
from ggmlpy.core.types import Type, row_size, type_from_dtype, type_from_name
from ggmlpy.ops import *  # noqa: F401,F403  (graph-building functions: add, mul_mat, soft_max_ext, ...)
from ggmlpy.ops import __all__ as _ops_all

__all__ = [
    "Type", "row_size", "type_from_dtype", "type_from_name", "quantize", "dequantize",
    "gguf_load", "gguf_save", "GGUFModel", "GGUFError", "FileFormatError", "Op", "UnaryOp", "GluOp", "GgmlpyError",
    "OutOfMemoryError", "NotAllocatedError", "UnsupportedOpError", "GraphFullError",
    "BackendUnavailableError", "ComputeError", "Tensor", "Context", "Flag", "Graph", "new_graph",
    "graph_view", "Status", "BufferUsage", "DeviceType", "DeviceCaps", "DeviceProps", "BufferType",
    "Buffer", "MultiBuffer", "Backend", "Device", "Reg", "Event", "tensor_alloc", "view_init",
    "backend_tensor_set", "backend_tensor_get", "backend_tensor_memset", "backend_tensor_copy",
    "backend_tensor_set_async", "backend_tensor_get_async", "backend_tensor_copy_async",
    "event_new", "event_record", "event_wait", "event_synchronize", "event_query", "reg_count",
    "reg_get", "reg_by_name", "dev_count", "dev_get", "dev_by_name", "dev_by_type", "devices",
    "backend_init_by_name", "backend_init_by_type", "backend_init_best", "register_sim_devices",
    "backend_cpu_init", "cpu_buffer_type", "cpu_buffer_from_array", "GraphAllocator",
    "TensorAllocator", "backend_alloc_ctx_tensors", "backend_alloc_ctx_tensors_from_buft",
    "alloc_ctx_tensors_size", "Scheduler", "graph_copy", "compare_graph_backend",
] + list(_ops_all)

__version__ = "0.1.0"

# the built-in backends, the interop hooks and the kernel variants (see ggmlpy.backends.install)
_install_backends()

# a library logs, the application decides where logs go (nothing is printed by default)
import logging as _logging

_logging.getLogger("ggmlpy").addHandler(_logging.NullHandler())

#: Public names loaded on first use (PEP 562), so that ``import ggmlpy`` does not import the
#: allocator, the scheduler, the quantizers or the GGUF reader: name -> (module, attribute).
_LAZY: dict[str, tuple[str, str]] = {
    "GraphAllocator": ("ggmlpy.alloc.gallocr", "GraphAllocator"),
    "TensorAllocator": ("ggmlpy.alloc.tallocr", "TensorAllocator"),
    "backend_alloc_ctx_tensors": ("ggmlpy.alloc.tallocr", "alloc_ctx_tensors"),
    "backend_alloc_ctx_tensors_from_buft": ("ggmlpy.alloc.tallocr", "alloc_ctx_tensors_from_buft"),
    "alloc_ctx_tensors_size": ("ggmlpy.alloc.tallocr", "alloc_ctx_tensors_size"),
    "quantize": ("ggmlpy.quants", "quantize"),
    "dequantize": ("ggmlpy.quants", "dequantize"),
    "gguf_load": ("ggmlpy.gguf.weights", "gguf_load"),
    "gguf_save": ("ggmlpy.gguf.weights", "gguf_save"),
    "GGUFModel": ("ggmlpy.gguf.weights", "GGUFModel"),
    "Scheduler": ("ggmlpy.sched.scheduler", "Scheduler"),
    "graph_copy": ("ggmlpy.testops.compare", "graph_copy"),
    "compare_graph_backend": ("ggmlpy.testops.compare", "compare_graph_backend"),
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'ggmlpy' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value
