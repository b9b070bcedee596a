"""ggmlpy's test-backend-ops: op cases compared across backends, timed, and checked for support
(mirrors ggml's ``tests/test-backend-ops.cpp``; ``python -m ggmlpy test-backend-ops``).

Also importable as ``ggmlpy.testops`` (its former home; see :mod:`ggmlpy._aliases`).
Entry points: :func:`main` ``(argv) -> int`` (the command line, :mod:`.cli`); :func:`run_tests`
``(mode, backend=None, op=None, params=None) -> Report``; :func:`compare_graph`
``(graph, inputs, backend1, backend2, tolerance=None) -> DivergenceReport`` (any graph, node by
node, first divergence).

Modules (one job each): :mod:`.case` (a case: name, build, init), ``cases_*`` (the case tables),
:mod:`.families` (the lists), :mod:`.reference` (float64 evaluator), :mod:`.guards` (guarded
allocation), :mod:`.runner` (test/perf/support execution), :mod:`.report` (results and output),
:mod:`.divergence` (whole-graph first-divergence search), :mod:`.cli` (command line).
"""

from ggmlpy.testops.case import Builder, TestCase
from ggmlpy.testops.cli import main
from ggmlpy.testops.divergence import DivergenceReport, compare_graph
from ggmlpy.testops.families import all_cases, family_counts, perf_cases
from ggmlpy.testops.report import Report, Result
from ggmlpy.testops.runner import run_tests

__all__ = ["main", "Builder", "TestCase", "all_cases", "perf_cases", "family_counts", "run_tests",
           "Report", "Result", "compare_graph", "DivergenceReport"]
