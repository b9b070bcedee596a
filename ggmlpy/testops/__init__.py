"""ggmlpy's test-backend-ops: op cases compared across backends, timed, and checked for support.

Modules (one job each): :mod:`.case` (a case: name, build, init), ``cases_*`` (the case tables),
:mod:`.families` (the lists), :mod:`.reference` (float64 evaluator), :mod:`.guards` (guarded
allocation), :mod:`.runner` (test/perf/support execution), :mod:`.report` (results and output),
:mod:`.graph_compare` (whole-graph divergence search), :mod:`.cli` (command line).
"""

from .case import Builder, TestCase
from .families import all_cases, family_counts, perf_cases
from .graph_compare import DivergenceReport, compare_graph
from .report import Report, Result
from .runner import run_tests

__all__ = ["Builder", "TestCase", "all_cases", "perf_cases", "family_counts", "run_tests",
           "Report", "Result", "compare_graph", "DivergenceReport"]
