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
    # backend.py below ~900 lines: buffer implementations and the write generations moved out
    ("ggmlpy.backend", "ggmlpy.generic_buffers", ["MultiBuffer", "_ZeroBuffer"]),
    ("ggmlpy", "ggmlpy.generic_buffers", ["MultiBuffer"]),
    ("ggmlpy.backend", "ggmlpy.write_gen",
     ["buffer_written", "buffer_write_queued", "_writes_landed", "WriteTracked", "_DATA_GEN"]),
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


def test_star_import_of_backend_gives_every_name_of_its_all():
    # names in __all__ that moved resolve through the module __getattr__, also for `import *`
    import ggmlpy.backend as backend

    ns: dict = {}
    exec("from ggmlpy.backend import *", ns)  # noqa: S102
    missing = [n for n in backend.__all__ if n not in ns]
    assert not missing, missing
    for name in backend.__all__:
        assert ns[name] is getattr(backend, name), name
    assert ns["MultiBuffer"].__module__ == "ggmlpy.generic_buffers"
    assert ns["buffer_written"].__module__ == "ggmlpy.write_gen"


def test_moved_classes_keep_their_docstrings():
    from ggmlpy import generic_buffers, write_gen

    for mod in (generic_buffers, write_gen):
        doc = mod.__doc__ or ""
        assert "separate" in doc or "beside" in doc, mod.__name__  # says why it is its own module
    for obj in (generic_buffers.MultiBuffer, generic_buffers._ZeroBuffer,
                generic_buffers.MultiBuffer.set_usage, write_gen.buffer_written,
                write_gen.buffer_write_queued, write_gen.WriteTracked):
        assert obj.__doc__ and len(obj.__doc__.split()) >= 8, obj
