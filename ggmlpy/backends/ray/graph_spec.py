"""The compact, pickle-free description of a graph a remote device computes (ggml-rpc's
``graph_compute`` message, as data).

A remote device (:mod:`ggmlpy.backends.ray.runtime`) cannot receive :class:`~ggmlpy.core.tensor.Tensor`
objects: the driver ships a *spec* instead, and the device rebuilds just enough tensor metadata to
compile a :class:`~ggmlpy.backends.plan.Plan` over its own memory. The spec holds, per tensor the
graph computes or reads: its type id, ``ne`` (elements), ``nb`` (bytes), name and where its data
lives as ``(buffer handle, byte offset)``; per computed node: the tensor index, the op's number,
``op_params`` (typed scalars) and its sources' indices (``-1`` for an absent optional source).
Sources are the ones the graph really reads (``graph.node_srcs``, i.e. the scheduler's copies).
View and NONE nodes and empty nodes compute nothing and are left out; views that are read keep
their own ``ne``/``nb`` and absolute offset, so nothing else about them is needed.

The encoding is UTF-8 JSON (no pickle: decoding never runs code), with a format version. Its
:func:`spec_hash` (BLAKE2b, 16 bytes) names a compiled plan in the device's cache, so an
unchanged split costs one message carrying the hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any

import numpy as np

from ggmlpy.core.errors import NotAllocatedError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

__all__ = ["SPEC_VERSION", "GraphSpec", "encode_graph", "decode_spec", "spec_hash"]

#: Format version; bumped whenever the layout of the JSON below changes.
SPEC_VERSION = 1

#: ``handle_of(tensor) -> int``: the buffer handle of ``tensor``'s memory on the remote device.
HandleOf = Callable[[Tensor], int]


class GraphSpec:
    """One encoded graph: ``data`` (UTF-8 JSON bytes), its ``hash`` (16-byte hex string) and the
    buffer ``handles`` it reads or writes (so a device can drop plans when a buffer is freed)."""

    __slots__ = ("data", "hash", "handles", "n_nodes")

    def __init__(self, data: bytes, handles: frozenset[int], n_nodes: int) -> None:
        self.data = data
        self.hash = spec_hash(data)
        self.handles = handles
        self.n_nodes = n_nodes

    def __repr__(self) -> str:
        return f"<GraphSpec {self.hash[:12]} {self.n_nodes} nodes, {len(self.data)} bytes>"


def spec_hash(data: bytes) -> str:
    """The 16-byte BLAKE2b digest of an encoded spec, as 32 hex characters."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _param(v: Any) -> list[Any]:
    # one op_params slot, tagged so the device gets back the same Python/NumPy scalar type
    if isinstance(v, (bool, np.bool_)):
        return ["b", bool(v)]
    if isinstance(v, IntEnum):
        return ["i", int(v)]
    if isinstance(v, (int, np.integer)):
        return ["i", int(v)]
    if isinstance(v, np.float32):
        return ["f4", float(v)]
    if isinstance(v, np.float16):
        return ["f2", float(v)]
    if isinstance(v, (float, np.floating)):
        return ["f", float(v)]
    raise TypeError(f"graph spec: op parameter {v!r} of type {type(v).__name__} cannot be encoded "
                    "(ints, floats and bools only)")


_DECODE_PARAM: dict[str, Callable[[Any], Any]] = {
    "b": bool, "i": int, "f": float, "f4": np.float32, "f2": np.float16}


def encode_graph(graph: Graph, handle_of: HandleOf, check: Callable[[Tensor], None] | None = None
                 ) -> GraphSpec:
    """Encode the nodes of ``graph`` that compute something into a :class:`GraphSpec`.

    Args:
        graph: an allocated graph (every computed node and every source it reads has memory).
        handle_of: the remote buffer handle of a tensor's memory; raises NotAllocatedError when
            the tensor is not in this device's memory.
        check: called with every computed node first (e.g. to raise UnsupportedOpError).

    Raises:
        NotAllocatedError: a node or a source it reads has no memory (or ``handle_of`` refused it).
        TypeError: an op parameter is not an int, float or bool.
    """
    index: dict[int, int] = {}
    tensors: list[list[Any]] = []
    handles: set[int] = set()

    def ref(t: Tensor) -> int:
        i = index.get(id(t))
        if i is not None:
            return i
        if t.offset is None or (t.buffer is None and (t.view_src is None or t.view_src.buffer is None)):
            raise NotAllocatedError(f"graph spec: tensor '{t.name}' has no memory")
        h = handle_of(t)
        handles.add(h)
        i = len(tensors)
        tensors.append([int(t.type), list(t.ne), list(t.nb), h, int(t.offset), t.name])
        index[id(t)] = i
        return i

    nodes: list[list[Any]] = []
    for node in graph.nodes:
        if node.op == Op.NONE or node.op in VIEW_OPS or node.is_empty():
            continue
        if check is not None:
            check(node)
        srcs = [-1 if s is None else ref(s) for s in graph.node_srcs(node)]
        nodes.append([ref(node), int(node.op), [_param(p) for p in node.op_params], srcs])
    doc = {"v": SPEC_VERSION, "tensors": tensors, "nodes": nodes}
    data = json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()
    return GraphSpec(data, frozenset(handles), len(nodes))


def decode_spec(data: bytes) -> tuple[list[tuple[Tensor, int]], list[Tensor]]:
    """Rebuild tensor metadata from an encoded spec (the device side of :func:`encode_graph`).

    Returns:
        ``(tensors, nodes)``: every tensor with its buffer handle (its ``offset`` set, no
        ``buffer``), and the computed nodes in order with ``op``, ``op_params`` and ``src`` set.

    Raises:
        ValueError: malformed data, an unknown format version, op or type number.
    """
    try:
        doc = json.loads(data)
        if doc.get("v") != SPEC_VERSION:
            raise ValueError(f"graph spec: format version {doc.get('v')!r}, expected {SPEC_VERSION} "
                             "(driver and device run different ggmlpy versions)")
        tensors: list[tuple[Tensor, int]] = []
        for type_id, ne, nb, h, off, name in doc["tensors"]:
            t = Tensor(Type(type_id), tuple(ne), tuple(nb))  # type: ignore[arg-type]
            t._offset = int(off)
            t.name = str(name)
            tensors.append((t, int(h)))
        nodes: list[Tensor] = []
        for ti, op, params, srcs in doc["nodes"]:
            t = tensors[ti][0]
            t.op = Op(op)
            t.op_params = [_DECODE_PARAM[tag](v) for tag, v in params]
            t.src = [None if i < 0 else tensors[i][0] for i in srcs]
            nodes.append(t)
    except (KeyError, TypeError, IndexError, json.JSONDecodeError) as e:
        raise ValueError(f"graph spec: malformed data ({type(e).__name__}: {e})") from None
    return tensors, nodes


def spec_handles(tensors: Sequence[tuple[Tensor, int]]) -> frozenset[int]:
    """The buffer handles a decoded spec uses."""
    return frozenset(h for _, h in tensors)
