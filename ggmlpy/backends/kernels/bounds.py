"""Index bounds checks wrapped around index kernels: GET_ROWS and SET_ROWS.

ggml aborts on an out-of-range GET_ROWS or SET_ROWS index; NumPy would read a negative index from the end
(``-1`` = last row) and CuPy's ``take`` wraps every index silently. Here every backend raises
:class:`~ggmlpy.core.errors.ComputeError` naming the op, the node, the source and the bad index:

* host arrays (``xp is numpy``: CPU, SIM): the min and max of the index tensor are checked
  before the rows are gathered or scattered (O(number of indices), no copy); nothing is
  written on failure.
  On a SIM device the error is raised by the stream and re-raised by ``synchronize``.
* device arrays (CuPy): no host sync per evaluation. Two reductions fold the indices' min and
  max into a 2-element ``int64`` device array owned by the step; the step carries a ``check``
  callable that the device backend runs after its next ``synchronize`` (host read of 16 bytes),
  raises on a bad index and re-arms the flag. The gathered rows are then garbage (CuPy wrapped
  the index) and must not be used.

The wrapper is applied by :meth:`~ggmlpy.backends.kernels.registry.KernelRegistry.compile_node`
to whatever kernel is registered for the op (:data:`WRAPPERS`), so kernel modules stay free of
checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ggmlpy.core.errors import ComputeError
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor

Step = Callable[[], None]

__all__ = ["WRAPPERS", "checked_get_rows", "checked_set_rows", "bad_index_message"]


def bad_index_message(node: Tensor, bad: int, n_rows: int) -> str:
    """One-line message for a GET_ROWS/SET_ROWS index ``bad`` outside ``0..n_rows-1`` in
    ``node`` (the indices are ``src[1]`` of both; the rows are GET_ROWS' ``src[0]`` and
    SET_ROWS' destination ``src[2]``)."""
    a = node.src[2] if node.op == Op.SET_ROWS and len(node.src) > 2 else node.src[0]
    idx = node.src[1]
    return (f"{node.op.name} node '{node.name}': index {bad} in "
            f"'{idx.name if idx is not None else '?'}'"
            f" is out of range for the {n_rows} rows of '{a.name if a is not None else '?'}' "
            f"(valid 0..{n_rows - 1})")


def _bad(lo: int, hi: int, n_rows: int) -> int | None:
    if lo < 0:
        return lo
    if hi >= n_rows:
        return hi
    return None


def checked_get_rows(xp: Any, node: Tensor, dst: Any, srcs: list[Any], step: Step) -> Step:
    """Wrap GET_ROWS ``step`` with a bounds check of ``srcs[1]`` (I32 indices, NumPy shape
    ``node.src[1].ne[::-1]``) against ``node.src[0].ne[1]`` rows. See the module docstring for
    the host (eager) and device (flag read at synchronize) variants."""
    return _checked(xp, node, srcs[1], int(node.src[0].ne[1]), step)


def checked_set_rows(xp: Any, node: Tensor, dst: Any, srcs: list[Any], step: Step) -> Step:
    """Wrap SET_ROWS ``step`` with a bounds check of ``srcs[1]`` (I64/I32 row indices) against
    the destination's ``node.ne[1]`` rows; as :func:`checked_get_rows` otherwise."""
    return _checked(xp, node, srcs[1], int(node.ne[1]), step)


def _checked(xp: Any, node: Tensor, idx: Any, n_rows: int, step: Step) -> Step:
    if idx.size == 0:
        return step
    if xp is np:
        if idx.size == 1:  # one row (a generated token's K and V): no reductions
            one = idx.reshape(-1)

            def run_one() -> None:
                v = int(one[0])
                if v < 0 or v >= n_rows:
                    raise ComputeError(bad_index_message(node, v, n_rows))
                step()
            return run_one
        amin, amax = idx.min, idx.max

        def run() -> None:
            bad = _bad(int(amin()), int(amax()), n_rows)
            if bad is not None:
                raise ComputeError(bad_index_message(node, bad, n_rows))
            step()
        return run

    # [min, max] of the indices seen since the last check: int64 device memory, made at the first
    # launch (compiling does no device work)
    cell: list[Any] = []
    minimum, maximum = xp.minimum, xp.maximum

    def run_dev() -> None:
        if not cell:
            st = xp.zeros(2, dtype=xp.int64)
            cell.extend((st, st[0:1], st[1:2]))
        _, lo_view, hi_view = cell
        minimum(lo_view, idx.min(), out=lo_view)
        maximum(hi_view, idx.max(), out=hi_view)
        step()

    def check() -> None:
        if not cell:
            return
        state = cell[0]
        host = state.get() if hasattr(state, "get") else np.asarray(state)  # 16 bytes, after sync
        lo, hi = int(host[0]), int(host[1])
        state.fill(0)
        bad = _bad(lo, hi, n_rows)
        if bad is not None:
            raise ComputeError(bad_index_message(node, bad, n_rows))

    run_dev.check = check  # type: ignore[attr-defined]
    return run_dev


#: op -> wrapper(xp, node, dst, srcs, step) -> step, applied to every compiled kernel of that op.
WRAPPERS: dict[Op, Callable[[Any, Tensor, Any, list[Any], Step], Step]] = {
    Op.GET_ROWS: checked_get_rows,
    Op.SET_ROWS: checked_set_rows,
}
