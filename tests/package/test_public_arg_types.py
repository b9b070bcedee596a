"""Every public function of ``ggmlpy.__all__`` refuses a wrong argument type by name (issue 10,
item 12).

The functions are enumerated from ``ggmlpy.__all__`` (plus the public methods of Context, Graph,
GraphAllocator and Scheduler); for each parameter with a checkable annotation (a class, ``int``,
``float``, ``bool``, ``str``, an Enum, or ``X | None``) every other argument gets a valid value
and this one a value of a wrong type (None where None is not allowed, a str, a float, a list, a
bool for an int, an object of the wrong class). The call must raise TypeError or ValueError whose
message names the argument (``"<name> must be ..."``), and nothing else may escape (before:
AttributeError/``'NoneType' object is not iterable`` from inside).
"""

from __future__ import annotations

import enum
import inspect
import types
import typing

import numpy as np
import pytest
from backend_kinds import new_sim_devices

import ggmlpy
from ggmlpy import Context, Graph, Tensor, Type
from ggmlpy.alloc.gallocr import GraphAllocator
from ggmlpy.backend.interface import Backend, Buffer, BufferType, Device, Event, event_new
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.sched.scheduler import Scheduler

_CPU = backend_cpu_init()
_SIM = new_sim_devices(1)[0].init_backend()  # the CPU has no events


def _tensor():
    return Context().new_tensor(Type.F32, [4, 4]).set_name("t")


def _graph():
    g = Graph()
    g.build_forward_expand(ggmlpy.scale(Context(), _tensor(), 2.0))
    return g


VALID = {
    Context: Context, Tensor: _tensor, Graph: _graph, Backend: lambda: _CPU,
    BufferType: lambda: _CPU.get_default_buffer_type(),
    Buffer: lambda: _CPU.get_default_buffer_type().alloc_buffer(256),
    Device: lambda: _CPU.get_device(), Event: lambda: event_new(_SIM.get_device()),
    int: lambda: 1, float: lambda: 1.0, bool: lambda: False, str: lambda: "x",
}


class _Wrong:
    def __repr__(self) -> str:
        return "<wrong object>"


def _members(ann):
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return [m for m in typing.get_args(ann) if m is not type(None)], type(None) in typing.get_args(ann)
    return [ann], False


def _checkable(ann) -> bool:
    ms, _ = _members(ann)
    return all(m in VALID or (isinstance(m, type) and issubclass(m, enum.Enum)) for m in ms)


def _valid(ann):
    if ann is None or not _checkable(ann):
        # Any / containers: the checks run before the body, so any plausible value will do
        return [4] if typing.get_origin(ann) is not None else np.zeros(16, np.float32)
    m = _members(ann)[0][0]
    if isinstance(m, type) and issubclass(m, enum.Enum):
        return list(m)[0]
    return VALID[m]()


def _bad_values(ann, default):
    ms, optional = _members(ann)
    optional = optional or default is None
    out = [] if optional else [None]
    num = {int, float} & set(ms) or any(isinstance(m, type) and issubclass(m, enum.Enum) for m in ms)
    if str not in ms:
        out.append("x")
    if not num:
        out.append(1.5)
    elif float not in ms:
        out.append(1.5)
    if int in ms and bool not in ms:
        out.append(True)
    out += [[1], _Wrong()]
    return out


def _hints(fn):
    base = getattr(fn, "__wrapped_base__", None)  # in-place twins: resolve in the base's module
    base = inspect.unwrap(base) if base is not None else None
    return typing.get_type_hints(fn, globalns=getattr(base, "__globals__", None))


def _cases():
    targets = []
    for name in ggmlpy.__all__:
        obj = getattr(ggmlpy, name)
        if inspect.isfunction(obj):
            targets.append((name, obj, None))
    for cls, meths in ((Context, ("new_tensor_1d", "new_tensor_2d", "dup_tensor", "get_tensor")),
                       (Graph, ("build_forward_expand", "node", "contains", "view")),
                       (GraphAllocator, ("reserve", "alloc_graph", "get_buffer_size")),
                       (Scheduler, ("reserve", "alloc_graph", "graph_compute",
                                    "graph_compute_async", "get_backend"))):
        for m in meths:
            targets.append((f"{cls.__name__}.{m}", getattr(cls, m), cls))
    cases = []
    for label, fn, cls in targets:
        try:
            hints = _hints(fn)
        except Exception:  # noqa: BLE001 -- an annotation that cannot be resolved: not enumerable
            continue
        sig = inspect.signature(fn)
        params = [(k, p) for k, p in sig.parameters.items() if k != "self"
                  and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for k, p in params:
            if k not in hints or not _checkable(hints[k]):
                continue
            default = None if p.default is inspect.Parameter.empty else p.default
            for bad in _bad_values(hints[k], default if p.default is not inspect.Parameter.empty
                                   else inspect.Parameter.empty):
                cases.append((label, fn, cls, params, hints, k, bad))
    return cases


CASES = _cases()

#: public functions with no parameter of a checkable annotation (``np.dtype | type``,
#: ``str | os.PathLike``, ``np.ndarray``): their own checks are asserted in
#: test_wrong_types_of_the_remaining_functions below
NOT_ENUMERATED = {"type_from_dtype", "gguf_save", "cpu_buffer_from_array"}


def _self(cls):
    if cls is Context:
        return Context()
    if cls is Graph:
        return _graph()
    if cls is GraphAllocator:
        return GraphAllocator(_CPU.get_default_buffer_type())
    return Scheduler([_CPU])


def test_the_table_covers_the_public_api():
    labels = {c[0] for c in CASES}
    # the families the issue names: ops builders, Context, Graph, backend API, allocators, Scheduler
    for must in ("add", "view_2d", "rope_ext", "mul_mat", "Context.new_tensor_2d",
                 "Graph.build_forward_expand", "backend_tensor_set", "backend_tensor_get",
                 "tensor_alloc", "backend_alloc_ctx_tensors", "backend_alloc_ctx_tensors_from_buft",
                 "GraphAllocator.alloc_graph", "Scheduler.graph_compute", "graph_view"):
        assert must in labels, must
    for name in ggmlpy.__all__:  # every public function with parameters is in the table
        obj = getattr(ggmlpy, name)
        if inspect.isfunction(obj) and inspect.signature(obj).parameters:
            assert name in labels or name in NOT_ENUMERATED, name
    assert len(CASES) > 2000


@pytest.mark.parametrize("label, fn, cls, params, hints, arg, bad", CASES,
                         ids=[f"{c[0]}-{c[5]}-{type(c[6]).__name__}" for c in CASES])
def test_wrong_type_is_refused_naming_the_argument(label, fn, cls, params, hints, arg, bad):
    kwargs = {}
    for k, p in params:
        if p.default is inspect.Parameter.empty:
            kwargs[k] = _valid(hints.get(k))
    kwargs[arg] = bad
    call = (lambda: fn(_self(cls), **kwargs)) if cls is not None else (lambda: fn(**kwargs))
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    msg = str(info.value)
    assert f"{arg} must" in msg or f"{arg} (the first argument) must" in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize("call, needle", [
    (lambda: ggmlpy.type_from_dtype(None), "dtype must be"),
    (lambda: ggmlpy.gguf_save(None, None), "path must be"),
    (lambda: ggmlpy.cpu_buffer_from_array(None), "array"),
    (lambda: ggmlpy.type_from_dtype("not a dtype"), "dtype must be"),
    (lambda: ggmlpy.gguf_save("x.gguf", 3), "tensors must be"),
    (lambda: ggmlpy.gguf_save("x.gguf", [], metadata=[1]), "metadata must be"),
], ids=["type_from_dtype", "gguf_save", "cpu_buffer_from_array", "type_from_dtype-str",
        "gguf_save-tensors", "gguf_save-metadata"])
def test_wrong_types_of_the_remaining_functions(call, needle):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert needle in str(info.value), str(info.value)
