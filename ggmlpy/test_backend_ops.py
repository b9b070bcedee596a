"""``python -m ggmlpy test-backend-ops``: compare every op across backends, time them, list support
(mirrors ggml's ``tests/test-backend-ops.cpp``).

The implementation lives in the :mod:`ggmlpy.testops` package; this module is the stable entry
point the CLI dispatches to.

* :func:`main` ``(argv) -> int``: the command line (see :mod:`ggmlpy.testops.cli`).
* :func:`run_tests` ``(mode, backend=None, op=None, params=None) -> Report``: the same from Python.
* :func:`compare_graph` ``(graph, inputs, backend1, backend2, tolerance=None) -> DivergenceReport``:
  any graph, node by node, first divergence.
"""

from __future__ import annotations

from .testops.cli import main
from .testops.graph_compare import DivergenceReport, compare_graph
from .testops.report import Report, Result
from .testops.runner import run_tests

__all__ = ["main", "run_tests", "compare_graph", "Report", "Result", "DivergenceReport"]
