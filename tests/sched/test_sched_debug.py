"""``GGMLPY_SCHED_DEBUG``: the split table is printed once per split actually made (ggml prints in
``ggml_backend_sched_split_graph``, once per call), its header naming the entry point that split;
an unchanged graph replaying its recorded splits prints nothing."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ggmlpy as gp
from ggmlpy import Context, Graph, Type
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.sched.scheduler import Scheduler

_HEADER = re.compile(r"^sched: (.*?): (\d+) splits, n_copies=(\d+), graph of (\d+) nodes$")


def _graph(n: int):
    """x [n] (input) on the CPU -> sqr -> scale 3 -> soft_max (refused by the SIM: a second
    split); returns (x, out, graph)."""
    ctx = Context()
    x = ctx.new_tensor_1d(Type.F32, n).set_name("x").set_input()
    y = gp.soft_max(ctx, gp.scale(ctx, gp.sqr(ctx, x), 3.0)).set_name("y").set_output()
    g = Graph()
    g.build_forward_expand(y)
    return x, y, g


def _headers(err: str) -> list[str]:
    """The callers named by the header lines of ``err``; checks each table is printed once
    (one ``## SPLIT #0`` line per header)."""
    lines = err.splitlines()
    heads = [m.group(1) for m in map(_HEADER.match, lines) if m]
    assert sum(ln.startswith("## SPLIT #0:") for ln in lines) == len(heads)
    return heads


def _compute(sched: Scheduler, x, y, g, n: int) -> None:
    sched.reset()
    assert sched.alloc_graph(g)
    v = np.linspace(-1, 1, n, dtype=np.float32)
    backend_tensor_set(x, v)
    assert sched.graph_compute(g) == gp.Status.SUCCESS
    w = 3.0 * v.astype(np.float64) ** 2
    ref = np.exp(w - w.max()) / np.exp(w - w.max()).sum()
    np.testing.assert_allclose(backend_tensor_get(y).ravel(), ref, rtol=1e-5, atol=1e-7)


@pytest.fixture
def sched(monkeypatch, sim_devices):
    monkeypatch.setenv("GGMLPY_SCHED_DEBUG", "1")
    sim = sim_devices(1, latency_us=0.0, refuse_ops={gp.Op.SOFT_MAX})[0].init_backend()
    return Scheduler([sim, gp.backend_cpu_init()])


# (steps, the headers expected after all steps): "reserve" / "compute" / "split" act on a graph
# of the given size; "new" builds a fresh graph object of that size (same structure as before)
_CASES = [
    ([("compute", 16)], ["alloc_graph"]),
    ([("reserve", 16), ("compute", 16)], ["reserve", "alloc_graph"]),
    ([("compute", 16), ("compute", 16), ("compute", 16)], ["alloc_graph"]),       # replayed
    ([("compute", 16), ("new", 16), ("compute", 16)],
     ["alloc_graph", "alloc_graph (split template)"]),                             # template
    ([("compute", 16), ("new", 32), ("compute", 32), ("compute", 32)],
     ["alloc_graph", "alloc_graph"]),                                              # new shape
    ([("split", 16)], ["split_graph"]),
    ([("reserve_size", 16)], ["reserve_size"]),
]


@pytest.mark.parametrize("steps,expected", _CASES)
def test_split_table_printed_once_per_split(sched, capsys, steps, expected):
    x, y, g = _graph(steps[0][1])
    capsys.readouterr()
    for action, n in steps:
        if action == "new":
            x, y, g = _graph(n)
        elif action == "compute":
            _compute(sched, x, y, g, n)
        elif action == "reserve":
            assert sched.reserve(g)
        elif action == "reserve_size":
            assert len(sched.reserve_size(g)) == 2
        else:
            sched.reset()
            sched.split_graph(g)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert _headers(captured.err) == expected


def test_header_counts_and_level_0_prints_nothing(sched, capsys, monkeypatch):
    x, y, g = _graph(16)
    capsys.readouterr()
    _compute(sched, x, y, g, 16)
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("sched:")]
    assert _HEADER.match(line).groups() == ("alloc_graph", str(sched.get_n_splits()), "1",
                                            str(g.n_nodes))
    monkeypatch.setenv("GGMLPY_SCHED_DEBUG", "0")
    quiet = Scheduler([gp.backend_cpu_init()])
    _compute(quiet, x, y, g, 16)
    assert capsys.readouterr().err == ""
