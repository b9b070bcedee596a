"""Whole-graph comparison: run any graph on two backends node by node and find the first node
whose output diverges beyond its tolerance (``test-backend-ops --graph FILE``).

Unlike test mode (where each backend keeps its own intermediate results, as ggml's
``compare_graph_backend`` does), :func:`compare_graph` by default *isolates* nodes: before node
``i`` runs, the memory of its sources (and its own, for in-place and partial writers) is copied
from backend 1 to backend 2, so both compute node ``i`` from identical inputs and a divergence is
charged to the node that produced it, not to everything downstream. The first diverging node's
inputs and both outputs are saved with ``np.savez`` for replay.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ggmlpy.backend.interface import Backend, tensor_alloc, view_init
from ggmlpy.backend.tensor_data import (
    backend_tensor_copy,
    backend_tensor_get,
    backend_tensor_set,
    check_array_shape,
)
from ggmlpy.core.check import check_bool, check_number, check_optional, check_type
from ggmlpy.core.graph import Graph, graph_view
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.testops.compare import graph_copy, nmse

__all__ = ["DivergenceReport", "compare_graph", "default_tolerance"]

_TOL = {Op.MUL_MAT: 5e-4, Op.OUT_PROD: 5e-4, Op.FLASH_ATTN_EXT: 5e-4, Op.SOFT_MAX: 1e-6}


def default_tolerance(node: Tensor) -> float:
    """ggml's NMSE threshold for a node's op: 5e-4 for MUL_MAT/OUT_PROD/FLASH_ATTN_EXT, 1e-6 for
    SOFT_MAX, 0 for ARGMAX, 1e-7 otherwise."""
    if node.op == Op.ARGMAX:
        return 0.0
    return _TOL.get(node.op, 1e-7)


@dataclass
class DivergenceReport:
    """Outcome of :func:`compare_graph`.

    Attributes:
        diverged: True when some node's outputs differ beyond its tolerance (or by NaN).
        backend1, backend2: the two backends' names.
        nodes_compared: computed nodes compared (view and NONE nodes are not).
        index, node, op, type, ne, nb, op_params: the first diverging node (graph index, name, op
            name, type name, ``ne``/``nb`` in ggml order).
        err, tolerance: its NMSE (normalised by backend 1's values) and the tolerance applied.
        sources: ``{name, op, type, ne, nb}`` of each source of that node.
        saved: path of the ``.npz`` holding ``src<j>`` (the node's inputs as backend 1 had them),
            ``out_backend1`` and ``out_backend2``; a ``.json`` beside it holds the metadata.
        worst: ``(node name, nmse)`` of the largest error seen among compared nodes.
    """

    diverged: bool
    backend1: str
    backend2: str
    nodes_compared: int = 0
    index: int | None = None
    node: str | None = None
    op: str | None = None
    type: str | None = None
    ne: list[int] | None = None
    nb: list[int] | None = None
    op_params: list[Any] | None = None
    err: float | None = None
    tolerance: float | None = None
    sources: list[dict[str, Any]] = field(default_factory=list)
    saved: str | None = None
    worst: tuple[str, float] | None = None

    def summary(self) -> str:
        """A few human-readable lines."""
        if not self.diverged:
            w = f"; largest NMSE {self.worst[1]:.3g} at '{self.worst[0]}'" if self.worst else ""
            return (f"{self.backend1} vs {self.backend2}: {self.nodes_compared} nodes agree "
                    f"within tolerance{w}")
        lines = [(f"{self.backend1} vs {self.backend2}: first divergence at node {self.index} "
                 f"'{self.node}' ({self.op}, {self.type}, ne={self.ne}, nb={self.nb}, "
                 f"op_params={self.op_params})"),
                 f"  NMSE {self.err} > tolerance {self.tolerance}"]
        for j, s in enumerate(self.sources):
            lines.append(f"  src{j}: '{s['name']}' {s['op']} {s['type']} ne={s['ne']} nb={s['nb']}")
        if self.saved:
            lines.append(f"  inputs and outputs saved to {self.saved}")
        return "\n".join(lines)


def _tol(node: Tensor, tolerance: float | Mapping[Any, float] | None) -> float:
    if tolerance is None:
        return default_tolerance(node)
    if isinstance(tolerance, Mapping):
        for key in (node.op, node.op.name, node.name):
            if key in tolerance:
                return float(tolerance[key])
        return default_tolerance(node)
    return float(tolerance)


def _reachable(graph: Graph) -> list[Tensor]:
    seen: dict[int, Tensor] = {}
    stack = list(graph.nodes) + list(graph.leafs)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        stack.extend(s for s in graph.node_srcs(t) if s is not None)
        if t.view_src is not None:
            stack.append(t.view_src)
    return list(seen.values())


def _allocate(tensors: list[Tensor], backend: Backend) -> tuple[Any, list[Tensor]]:
    """Place unallocated roots in one new buffer of ``backend``; init views. Returns the buffer
    (or None) and the tensors given memory here (to reset afterwards)."""
    buft = backend.get_default_buffer_type()
    align = max(1, buft.get_alignment())
    roots = [t for t in tensors if t.view_src is None and not t.is_allocated]
    for t in tensors:
        if t.is_allocated and not backend.supports_buft(t.buffer.buft):
            raise ValueError(f"compare_graph: tensor '{t.name}' is in buffer {t.buffer.name}, "
                             f"which backend {backend.name} cannot use")
    placed: list[Tensor] = []
    buf = None
    if roots:
        offs, cur = [], 0
        for t in roots:
            offs.append(cur)
            cur += -(-buft.get_alloc_size(t) // align) * align
        buf = buft.alloc_buffer(max(cur, 1))
        buf.clear(0)
        for t, off in zip(roots, offs):
            tensor_alloc(buf, t, off)
            placed.append(t)
    for t in tensors:
        if t.view_src is not None and not t.is_allocated:
            view_init(t)
            placed.append(t)
    return buf, placed


def _check_inputs(tensors: list[Tensor], inputs: Mapping[Tensor, np.ndarray]) -> None:
    """Every graph input has a value, every value belongs to the graph and has the right size."""
    ids = {id(t) for t in tensors}
    missing = [t for t in tensors if t.op == Op.NONE and t.view_src is None
               and not t.is_allocated and t not in inputs]
    if missing:
        names = ", ".join(f"'{t.name}' ne={list(t.ne)}" for t in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"compare_graph: graph input(s) {names}{more} have no value in inputs "
                         "and no memory; give each input an array (NumPy shape ne[::-1])")
    for t, arr in inputs.items():
        if id(t) not in ids:
            raise ValueError(f"compare_graph: inputs key '{t.name}' is not a tensor of the graph")
        a = np.asarray(arr)
        if a.size != t.nelements:
            raise ValueError(f"compare_graph: inputs['{t.name}'] has {a.size} elements (shape "
                             f"{a.shape}), the tensor has {t.nelements} (NumPy shape "
                             f"{tuple(reversed(t.ne))})")
        check_array_shape(t, a.shape, f"compare_graph: inputs['{t.name}']")


def _f64(t: Tensor) -> np.ndarray:
    return np.asarray(backend_tensor_get(t)).astype(np.float64)


def compare_graph(graph: Graph, inputs: Mapping[Tensor, np.ndarray], backend1: Backend,
                  backend2: Backend, tolerance: float | Mapping[Any, float] | None = None, *,
                  isolate: bool = True, save_dir: str | None = None) -> DivergenceReport:
    """Run ``graph`` on two backends node by node and report the first diverging node.

    Args:
        graph: any graph. Tensors without memory are placed in one new buffer of ``backend1``
            (zero-filled) and released afterwards; tensors that already have memory must be in a
            buffer ``backend1`` can use.
        inputs: ``tensor -> array`` written before compute (converted to the tensor's dtype; NumPy
            shape ``ne[::-1]``).
        backend1: the backend under test (its values normalise the NMSE, as in ggml).
        backend2: the reference (usually the CPU); it computes on a ``graph_copy``.
        tolerance: None for ggml's per-op thresholds (:func:`default_tolerance`), a float for every
            node, or a mapping from Op / op name / node name to a threshold.
        isolate: copy each node's input memory from backend 1 to backend 2 before computing it
            (see the module docstring); False lets each side keep its own intermediates.
        save_dir: where to ``np.savez`` the first diverging node's inputs/outputs (created if
            missing); None saves nothing.

    Returns:
        A :class:`DivergenceReport`.

    Raises:
        TypeError: an argument has the wrong type (named in the message), or an ``inputs`` key
            is not a Tensor.
        ValueError: a graph input (a leaf without memory, op NONE, not a view) has no entry in
            ``inputs`` -- it would otherwise run on whatever the new buffer holds; an ``inputs``
            key is not part of ``graph``; an input array's element count differs from the
            tensor's, or a multi-dimensional one is not shaped ``ne[::-1]`` (up to size-1 dims);
            a pre-allocated tensor is in memory ``backend1`` cannot use.
        OutOfMemoryError: a buffer could not be allocated. Backend compute errors propagate.
    """
    where = "compare_graph"
    check_type("graph", graph, Graph, where)
    if not isinstance(inputs, Mapping):
        raise TypeError(f"{where}: inputs must be a mapping Tensor -> array, got "
                        f"{type(inputs).__name__}")
    check_type("backend1", backend1, Backend, where)
    check_type("backend2", backend2, Backend, where)
    if tolerance is not None and not isinstance(tolerance, Mapping):
        check_number("tolerance", tolerance, 0.0, where=where)
    check_bool("isolate", isolate, where)
    check_optional("save_dir", save_dir, (str, os.PathLike), where)
    for k in inputs:
        if not isinstance(k, Tensor):
            raise TypeError(f"compare_graph: inputs must map Tensor -> array, got a key of type "
                            f"{type(k).__name__}")
    tensors = _reachable(graph)
    _check_inputs(tensors, inputs)
    buf, placed = _allocate(tensors, backend1)
    rep = DivergenceReport(False, backend1.name, backend2.name)
    cp = None
    try:
        for t, arr in inputs.items():
            backend_tensor_set(t, np.ascontiguousarray(np.asarray(arr).astype(t.type.dtype)))
        cp = graph_copy(backend2, graph)
        g1, g2 = graph, cp.graph
        tmap = cp.tensor_map
        for i, (n1, n2) in enumerate(zip(g1.nodes, g2.nodes)):
            if n1.op == Op.NONE or n1.op in VIEW_OPS:
                continue
            srcs = [s for s in graph.node_srcs(n1) if s is not None]
            before = [(s, _f64(s)) for s in srcs] if save_dir is not None else []
            if isolate:
                for t in srcs + [n1]:
                    r = t.view_src if t.view_src is not None else t
                    if r in tmap:
                        backend_tensor_copy(r, tmap[r])
            backend1.graph_compute(graph_view(g1, i, i + 1))
            backend2.graph_compute(graph_view(g2, i, i + 1))
            a1, a2 = _f64(n1), _f64(n2)
            rep.nodes_compared += 1
            nan = bool(np.isnan(a1).any() or np.isnan(a2).any())
            err = float("inf") if nan and not np.array_equal(np.isnan(a1), np.isnan(a2)) \
                else nmse(a1, a2)
            if rep.worst is None or err > rep.worst[1]:
                rep.worst = (n1.name, err)
            tol = _tol(n1, tolerance)
            if err <= tol:
                continue
            rep.diverged = True
            rep.index, rep.node, rep.op = i, n1.name, n1.op.name
            rep.type, rep.ne, rep.nb = n1.type.type_name, list(n1.ne), list(n1.nb)
            rep.op_params = list(n1.op_params)
            rep.err, rep.tolerance = err, tol
            rep.sources = [{"name": s.name, "op": s.op.name, "type": s.type.type_name,
                            "ne": list(s.ne), "nb": list(s.nb)} for s in srcs]
            if save_dir is not None:
                rep.saved = _save(save_dir, rep, before, a1, a2)
            break
    finally:
        if cp is not None:
            cp.free()
        for t in placed:
            t.buffer = None
            t.offset = None
        if buf is not None:
            buf.free()
    return rep


def _save(save_dir: str, rep: DivergenceReport, before: list[tuple[Tensor, np.ndarray]],
          a1: np.ndarray, a2: np.ndarray) -> str:
    os.makedirs(save_dir, exist_ok=True)
    stem = os.path.join(save_dir, f"divergence_node{rep.index}")
    arrays = {f"src{j}": a for j, (_, a) in enumerate(before)}
    np.savez(stem + ".npz", out_backend1=a1, out_backend2=a2, **arrays)
    meta = {k: v for k, v in asdict(rep).items() if k != "saved"}
    with open(stem + ".json", "w") as f:
        json.dump(meta, f, indent=1, default=str)
    return stem + ".npz"
