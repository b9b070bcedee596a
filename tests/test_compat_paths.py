"""Names and module paths that moved in issue 15 stay importable, as the same objects."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import ggmlpy

MOVED_NAMES = [
    # (old module, new module, names)
    ("ggmlpy.alloc", "ggmlpy.gallocr", ["GraphAllocator", "MAX_CHUNKS", "POLICIES", "_DynAllocator"]),
    ("ggmlpy.backend", "ggmlpy.tensor_data",
     ["backend_tensor_set", "backend_tensor_get", "backend_tensor_memset", "backend_tensor_copy",
      "backend_tensor_set_async", "backend_tensor_get_async", "backend_tensor_copy_async",
      "as_bytes"]),
    ("ggmlpy", "ggmlpy.tensor_data", ["backend_tensor_set", "backend_tensor_copy_async"]),
    ("ggmlpy", "ggmlpy.gallocr", ["GraphAllocator"]),
    ("ggmlpy", "ggmlpy.backend_compare", ["graph_copy", "compare_graph_backend"]),
]


@pytest.mark.parametrize("old, new, names", MOVED_NAMES)
def test_moved_names_are_the_same_objects(old, new, names):
    o, n = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(o, name) is getattr(n, name), f"{old}.{name}"


@pytest.mark.parametrize("old, new", sorted(ggmlpy._aliases.ALIASES.items()))
def test_old_module_paths_are_the_new_modules(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_test_backend_ops_path_as_in_the_readme():
    import ggmlpy.test_backend_ops as tbo
    from ggmlpy.test_backend_ops import compare_graph, main, run_tests

    assert ggmlpy.test_backend_ops.compare_graph is compare_graph
    assert tbo.main is main and tbo.run_tests is run_tests
    assert not hasattr(ggmlpy, "no_such_module")


def test_unknown_names_still_raise():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ggmlpy.backend.nope  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ggmlpy.test_no_such_module")


def test_import_ggmlpy_loads_no_aliased_module():
    # the alias finder is lazy: a bare `import ggmlpy` must not pull in the test-backend-ops code
    code = ("import sys, ggmlpy; print(sorted(m for m in sys.modules if m.startswith("
            "('ggmlpy.testops', 'ggmlpy.backend_compare', 'ggmlpy.test_backend_ops'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]", out.stdout
