"""ggmlpy: ggml's backend layer in Python.

Tensors and compute graphs (:mod:`ggmlpy.tensor`, :mod:`ggmlpy.graph`), graph-building ops with
ggml's names and shape rules (:mod:`ggmlpy.ops`, re-exported here: ``ggmlpy.add(ctx, a, b)``), the
backend interface (:mod:`ggmlpy.backend`), a registry of devices (:mod:`ggmlpy.registry`), the
allocators (:mod:`ggmlpy.alloc`, :mod:`ggmlpy.gallocr`), the NumPy CPU backend, a CuPy CUDA backend and a
host-emulated device (:mod:`ggmlpy.backends`), and the multi-backend scheduler
(:mod:`ggmlpy.sched`), ggml's quantized types (:mod:`ggmlpy.quants`: ``ggmlpy.quantize``,
``ggmlpy.dequantize``) and GGUF files (:mod:`ggmlpy.gguf_io`: ``ggmlpy.gguf_load``,
``ggmlpy.gguf_save``; needs the ``[gguf]`` extra).

Conventions: shapes are ggml's ``ne`` (``ne[0]`` innermost); the NumPy array holding the same data
has shape ``ne[::-1]``. Strides ``nb`` and all offsets and sizes are in bytes.
"""

from __future__ import annotations

from .types import Type, row_size, type_from_dtype, type_from_name
from .opcodes import Op, UnaryOp, GluOp
from .errors import (GgmlpyError, OutOfMemoryError, NotAllocatedError, UnsupportedOpError,
                     GraphFullError, BackendUnavailableError, ComputeError, FileFormatError, GGUFError)
from .tensor import Tensor, Context, Flag
from .graph import Graph, new_graph, graph_view
from .ops import *  # noqa: F401,F403  (graph-building functions: add, mul_mat, soft_max_ext, ...)
from .ops import __all__ as _ops_all
from .backend import (Status, BufferUsage, DeviceType, DeviceCaps, DeviceProps, BufferType, Buffer,
                      Backend, Device, Reg, Event, tensor_alloc, view_init, event_new,
                      event_record, event_wait, event_synchronize, event_query)
from .generic_buffers import MultiBuffer
from .tensor_data import (backend_tensor_set, backend_tensor_get, backend_tensor_memset,
                          backend_tensor_copy, backend_tensor_set_async, backend_tensor_get_async,
                          backend_tensor_copy_async)
from .registry import (reg_count, reg_get, reg_by_name, dev_count, dev_get, dev_by_name,
                       dev_by_type, devices, backend_init_by_name, backend_init_by_type,
                       backend_init_best, register_sim_devices)
from .backends.cpu import backend_cpu_init, cpu_buffer_type, cpu_buffer_from_array
from .backends import interop as _interop  # noqa: F401  (installs Tensor.numpy/__dlpack__/...)

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

# a library logs, the application decides where logs go (nothing is printed by default)
import logging as _logging

_logging.getLogger("ggmlpy").addHandler(_logging.NullHandler())

# old module paths (ggmlpy.test_backend_ops, ggmlpy.compare, ggmlpy.testops.graph_compare) stay
# importable, resolved on first import (see ggmlpy/_aliases.py)
from . import _aliases  # noqa: E402

_aliases.install()


def __getattr__(name: str):
    # the allocator and scheduler are imported lazily so that importing ggmlpy stays cheap
    if name in ("GraphAllocator", "TensorAllocator", "backend_alloc_ctx_tensors",
                "backend_alloc_ctx_tensors_from_buft", "alloc_ctx_tensors_size"):
        from . import alloc

        return getattr(alloc, {"backend_alloc_ctx_tensors": "alloc_ctx_tensors",
                               "backend_alloc_ctx_tensors_from_buft": "alloc_ctx_tensors_from_buft",
                               }.get(name, name))
    if name in ("quantize", "dequantize"):
        from . import quants

        return getattr(quants, name)
    if name in ("gguf_load", "gguf_save", "GGUFModel"):
        from . import gguf_io

        return getattr(gguf_io, name)
    if name == "Scheduler":
        from .sched import Scheduler

        return Scheduler
    if name in ("graph_copy", "compare_graph_backend"):
        from . import backend_compare

        return getattr(backend_compare, name)
    if f"ggmlpy.{name}" in _aliases.ALIASES:  # e.g. ggmlpy.test_backend_ops.compare_graph
        import importlib

        return importlib.import_module(f"ggmlpy.{name}")
    raise AttributeError(f"module 'ggmlpy' has no attribute {name!r}")
