"""``test-backend-ops --graph`` and its bad inputs (issue 10, item 14): one line each, exit 2; a
graph input without a value is an error, never a run on leftover memory."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.testops.cli import main
from ggmlpy.testops.divergence import compare_graph

HEADER = ("import numpy as np\nfrom ggmlpy import ops\nfrom ggmlpy.core.graph import Graph\n"
          "from ggmlpy.core.types import Type\n")
GRAPH = ("    a = ctx.new_tensor(Type.F32, [4, 2]).set_name('a')\n"
         "    b = ctx.new_tensor(Type.F32, [4, 2]).set_name('b')\n"
         "    out = ops.add(ctx, a, b)\n"
         "    g = Graph(); g.build_forward_expand(out)\n")

BODIES = [
    ("returns-none", "    return None\n", "it returned NoneType"),
    ("returns-tensor", GRAPH + "    return out\n", "it returned Tensor"),
    ("returns-3-tuple", GRAPH + "    return g, {}, 1\n", "it returned tuple of 3"),
    ("tensor-not-graph", GRAPH + "    return out, {a: np.zeros((2, 4))}\n",
     "the first element is Tensor, not a Graph (wrap it"),
    ("inputs-list", GRAPH + "    return g, [a]\n", "the second element is list, not a dict"),
    ("inputs-key-str", GRAPH + "    return g, {'a': np.zeros((2, 4))}\n",
     "an inputs key is str, not a Tensor"),
    ("raises", "    raise RuntimeError('boom\\nsecond line')\n",
     "build(ctx) raised RuntimeError: boom second line"),
    ("missing-input", GRAPH + "    return g, {a: np.ones((2, 4), np.float32)}\n",
     "graph input(s) 'b' ne=[4, 2, 1, 1] have no value in inputs"),
    ("wrong-size", GRAPH + "    return g, {a: np.ones(3), b: np.ones((2, 4))}\n",
     "inputs['a'] has 3 elements"),
]


@pytest.mark.parametrize("label, body, needle", BODIES, ids=[b[0] for b in BODIES])
def test_graph_file_errors_one_line_exit_2(tmp_path, capsys, label, body, needle):
    f = tmp_path / "g.py"
    f.write_text(HEADER + "def build(ctx):\n" + body)
    assert main(["--graph", str(f), "-b", "CPU", "--save", str(tmp_path / "s")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("test-backend-ops: ") and needle in err, err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("name, text, needle", [
    ("g.py", "import nonexistent_module_xyz\n",
     "importing it raised ModuleNotFoundError: No module named 'nonexistent_module_xyz'"),
    ("g.py", "def build(ctx) return\n", "expected ':'"),
    ("g.py", "x = 1\n", "defines no build(ctx)"),
    ("g.txt", "x = 1\n", "--graph takes a .py file"),
])
def test_graph_file_that_cannot_be_loaded(tmp_path, capsys, name, text, needle):
    f = tmp_path / name
    f.write_text(text)
    assert main(["--graph", str(f), "-b", "CPU"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_build_not_callable(tmp_path, capsys):
    f = tmp_path / "g.py"
    f.write_text("build = 3\n")
    assert main(["--graph", str(f), "-b", "CPU"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "build is int, not a function" in err


@pytest.mark.parametrize("argv, needle", [
    (["--mode", "bogus"], "argument --mode: invalid choice: 'bogus'"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["--min-time", "x"], "argument --min-time: invalid float value: 'x'"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["perf", "--mode", "test"], "mode given twice"),
])
def test_bad_usage_one_line_exit_2(capsys, argv, needle):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and needle in err, err
    assert "usage:" not in err


def _add_graph():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(Type.F32, [4, 2]).set_name("a")
    b = ctx.new_tensor(Type.F32, [4, 2]).set_name("b")
    out = ops.add(ctx, a, b)
    g = Graph()
    g.build_forward_expand(out)
    return g, a, b, out


def test_missing_input_is_an_error_not_leftover_memory():
    # before: b was placed in a zero-filled buffer and the run was reported as agreeing
    g, a, b, _ = _add_graph()
    with pytest.raises(ValueError, match=r"graph input\(s\) 'b' ne=\[4, 2, 1, 1\] have no value"):
        compare_graph(g, {a: np.ones((2, 4), np.float32)}, backend_cpu_init(), backend_cpu_init())
    assert not a.is_allocated and not b.is_allocated  # nothing placed before the check


def test_inputs_key_outside_graph_refused():
    g, a, b, _ = _add_graph()
    stranger = Context(no_alloc=True).new_tensor(Type.F32, [4, 2]).set_name("stranger")
    x = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="inputs key 'stranger' is not a tensor of the graph"):
        compare_graph(g, {a: x, b: x, stranger: x}, backend_cpu_init(), backend_cpu_init())


@pytest.mark.parametrize("shape, ok", [((2, 4), True), ((8,), True), ((1, 2, 4), True),
                                       ((4, 2), False), ((2, 2, 2), False)])
def test_input_array_of_another_layout_refused_before_placing(shape, ok):
    # before: a (4, 2) array for ne = [4, 2] (NumPy (2, 4)) passed the element count check and
    # was written flat, i.e. transposed, and both backends agreed on the wrong input
    g, a, b, out = _add_graph()
    xa = np.arange(8, dtype=np.float32).reshape(shape)
    xb = np.ones((2, 4), np.float32)
    if ok:
        rep = compare_graph(g, {a: xa, b: xb}, backend_cpu_init(), backend_cpu_init())
        assert not rep.diverged
        return
    with pytest.raises(ValueError, match=r"compare_graph: inputs\['a'\]: array of shape "
                                         + re.escape(str(shape))):
        compare_graph(g, {a: xa, b: xb}, backend_cpu_init(), backend_cpu_init())
    assert not a.is_allocated and not b.is_allocated  # nothing placed before the check


def test_all_inputs_given_still_compares_with_real_values():
    g, a, b, out = _add_graph()
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal((2, 4)), rng.standard_normal((2, 4))
    rep = compare_graph(g, {a: xa, b: xb}, backend_cpu_init(), backend_cpu_init())
    assert not rep.diverged and rep.nodes_compared == 1 and rep.worst[1] == 0.0
