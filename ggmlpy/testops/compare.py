"""Cross-backend comparison: ``graph_copy`` and ``compare_graph_backend`` (mirrors
``ggml_backend_graph_copy`` and ``ggml_backend_compare_graph_backend``), and the NMSE metric."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ggmlpy.backend.interface import Backend, Buffer, view_init
from ggmlpy.backend.tensor_data import backend_tensor_copy
from ggmlpy.core.check import checked_args
from ggmlpy.core.errors import NotAllocatedError
from ggmlpy.core.graph import Graph, graph_view
from ggmlpy.core.opcodes import VIEW_OPS
from ggmlpy.core.tensor import Context, Tensor

__all__ = ["GraphCopy", "graph_copy", "compare_graph_backend", "nmse", "isinf_or_max",
           "values_mismatch"]


@dataclass
class GraphCopy:
    """A graph duplicated onto another backend (mirrors ``struct ggml_backend_graph_copy``).

    Attributes:
        buffer: the buffer holding every non-view tensor of the copy (free it when done).
        ctx_allocated: the copies of non-view tensors. ctx_unallocated: the copies of views.
        graph: the copied graph; ``graph.nodes[i]`` is the copy of the source graph's node ``i``.
        tensor_map: original tensor -> copy.
    """

    buffer: Buffer | None
    ctx_allocated: Context
    ctx_unallocated: Context
    graph: Graph
    tensor_map: dict[Tensor, Tensor]

    def free(self) -> None:
        """Release the copy's buffer (mirrors ``ggml_backend_graph_copy_free``)."""
        if self.buffer is not None:
            self.buffer.free()


@checked_args
def graph_copy(backend: Backend, graph: Graph) -> GraphCopy:
    """Duplicate ``graph`` with its current data into one buffer of ``backend`` (mirrors ``ggml_backend_graph_copy``).

    Every tensor reachable from the nodes (sources read through ``graph.node_srcs``) must have
    data. Non-view tensors get new memory in a single buffer of ``backend``'s default buffer type
    and their bytes are copied (blocking); views are re-created over their copied ``view_src``.
    Op, op_params, flags and names are kept.

    Raises:
        NotAllocatedError: a tensor of the graph has no memory.
        OutOfMemoryError: the backend could not allocate the buffer.
    """
    from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft

    ctx_a, ctx_u = Context(), Context()
    memo: dict[Tensor, Tensor] = {}

    def dup(t: Tensor) -> Tensor:
        d = memo.get(t)
        if d is not None:
            return d
        if not t.is_allocated:
            raise NotAllocatedError(f"graph_copy: tensor '{t.name}' has no data")
        if t.view_src is not None:
            vs = dup(t.view_src)
            d = ctx_u.new_view(vs, t.type, t.ne, t.nb, t.view_offs)
            d.buffer = None
            d.offset = None
        else:
            d = ctx_a.dup_tensor_layout(t)
        d.op, d.op_params, d.flags, d.name = t.op, list(t.op_params), t.flags, t.name
        memo[t] = d
        d.src = [None if s is None else dup(s) for s in graph.node_srcs(t)]
        return d

    nodes = [dup(n) for n in graph.nodes]
    buf = alloc_ctx_tensors_from_buft(ctx_a, backend.get_default_buffer_type())
    for t in ctx_u:
        view_init(t)
    for src, dst in memo.items():
        if src.view_src is None:
            backend_tensor_copy(src, dst)
    g = Graph(max(len(memo), 1))
    for n in nodes:
        g.build_forward_expand(n)
    g.nodes = nodes  # keep the source's node order exactly
    return GraphCopy(buf, ctx_a, ctx_u, g, memo)


@checked_args
def compare_graph_backend(backend1: Backend, backend2: Backend, graph: Graph,
                          callback: Callable[[int, Tensor, Tensor], bool],
                          test_nodes: list[Tensor] | None = None) -> bool:
    """Compute ``graph`` on two backends and hand each node's two results to ``callback``
    (mirrors ``ggml_backend_compare_graph_backend``).

    ``graph`` must be allocated where ``backend1`` can compute it; it is copied to ``backend2``
    with :func:`graph_copy`. Without ``test_nodes`` both compute one node at a time and
    ``callback(i, t1, t2)`` is called for every non-view node (synchronously, after both finished);
    returning False stops. With ``test_nodes`` both compute the whole graph and the callback gets
    only those nodes. Returns True (False only when the copy could not be made).

    Raises:
        ValueError: none of ``test_nodes`` is in the graph.
    """
    try:
        cp = graph_copy(backend2, graph)
    except (NotAllocatedError, MemoryError):
        return False
    try:
        g1, g2 = graph, cp.graph
        if test_nodes:
            backend1.graph_compute(g1)
            backend2.graph_compute(g2)
            found = False
            for i, (t1, t2) in enumerate(zip(g1.nodes, g2.nodes)):
                if t1 in test_nodes:
                    found = True
                    if not callback(i, t1, t2):
                        break
            if not found:
                raise ValueError("compare_graph_backend: none of test_nodes is in the graph")
            return True
        for i, (t1, t2) in enumerate(zip(g1.nodes, g2.nodes)):
            if t1.op in VIEW_OPS:
                continue
            backend1.graph_compute(graph_view(g1, i, i + 1))
            backend2.graph_compute(graph_view(g2, i, i + 1))
            if not callback(i, t1, t2):
                break
        return True
    finally:
        cp.free()


_FLT_MAX = float(np.finfo(np.float32).max)


def isinf_or_max(x: np.ndarray) -> np.ndarray:
    """Elementwise ``isinf(x) or x == FLT_MAX or x == -FLT_MAX`` (test-backend-ops.cpp's
    ``isinf_or_max``: a backend may saturate to the largest float instead of overflowing).

    Args:
        x: float array (any shape; float32 values, possibly widened to float64).

    Returns:
        bool array of the same shape.
    """
    x = np.asarray(x)
    return np.isinf(x) | (x == _FLT_MAX) | (x == -_FLT_MAX)


def values_mismatch(a: np.ndarray, b: np.ndarray) -> tuple[int, str] | None:
    """test-backend-ops' element checks before its error metric, in its order (the ``callback``
    of ``test_case::eval``): the first index where either value is NaN, or where one is
    :func:`isinf_or_max` and the other is not, or both are but with different signs.

    Args:
        a, b: the two backends' values of one tensor (same size; flattened in order).

    Returns:
        ``(flat index, "NaN" | "inf mismatch" | "inf sign mismatch")`` for the first failing
        element, or None when every element passes (then +inf against FLT_MAX, or -FLT_MAX
        against -inf, count as equal).
    """
    a = np.asarray(a).ravel()
    b = np.asarray(b).ravel()
    nan = np.isnan(a) | np.isnan(b)
    ia, ib = isinf_or_max(a), isinf_or_max(b)
    inf_bad = (ia != ib) | (ia & ib & (np.signbit(a) != np.signbit(b)))
    bad = nan | inf_bad
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    if nan[i]:
        return i, "NaN"
    return i, "inf mismatch" if ia[i] != ib[i] else "inf sign mismatch"


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    """Normalised mean squared error ``sum((a-b)^2) / sum(a^2)`` in float64 (ggml's ``nmse``).

    ``a`` is the normaliser (test-backend-ops passes the tested backend's values first). Pairs
    that :func:`values_mismatch` accepts as equal infinities (both :func:`isinf_or_max` with the
    same sign) and pairs of NaN are left out; the rest must be finite. ggml's own sum turns NaN
    as soon as one infinity is present, and its ``err > max_err`` then passes the whole tensor;
    here the finite elements still count. Returns ``inf`` when an infinity or NaN is unpaired.

    Raises:
        ValueError: the shapes differ.
    """
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"nmse: shapes {a.shape} and {b.shape} differ")
    same_inf = isinf_or_max(a) & isinf_or_max(b) & (np.signbit(a) == np.signbit(b))
    both_nan = np.isnan(a) & np.isnan(b)
    keep = ~(same_inf | both_nan)
    a, b = a[keep], b[keep]
    if not np.all(np.isfinite(a)) or not np.all(np.isfinite(b)):
        return float("inf")
    den = float(np.sum(a * a))
    num = float(np.sum((a - b) ** 2))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den
