"""test-backend-ops: ``-o``/``-p`` that select no case exit 2 saying so; perf mode keeps the
F16/quantized weight of a MUL_MAT case in a WEIGHTS buffer, as a model does (so the timing is a
model's, not a per-call conversion's), and the result says so."""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.core.types import Type
from ggmlpy.testops import main as tbo_main
from ggmlpy.testops.families import perf_cases
from ggmlpy.testops.runner import _alloc_weights, _weight_leaves, run_case_perf


@pytest.mark.parametrize("argv, needle", [
    (["-b", "CPU", "-o", "ADD", "-p", "zzz-no-such"], "no test case matches -o ADD and -p 'zzz-no-such'"),
    (["perf", "-b", "CPU", "-p", "zzz-no-such"], "no perf case matches -p 'zzz-no-such'"),
    (["-b", "CPU", "-p", "zzz", "--list"], "no test case matches -p 'zzz'"),
])
def test_a_selection_of_no_case_exits_2(capsys, argv, needle):
    rc = tbo_main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1


def _small_f16_case():
    cases = [c for c in perf_cases() if c.op == "MUL_MAT" and c.params.get("type_a") == Type.F16]
    return min(cases, key=lambda c: c.params["m"] * c.params["n"] * c.params["k"])


def test_perf_mul_mat_weight_lives_in_a_weights_buffer():
    case = _small_f16_case()
    ctx, _, out = case.build_graph()
    from ggmlpy.core.graph import Graph

    g = Graph(64)
    g.build_forward_expand(out)
    weights = _weight_leaves(g)
    assert [w.type for w in weights] == [Type.F16] and weights[0] is out.src[0]
    be = backend_cpu_init()
    wbuf = _alloc_weights(weights, be.get_default_buffer_type())
    try:
        assert wbuf.usage == BufferUsage.WEIGHTS and weights[0].buffer is wbuf
    finally:
        wbuf.free()


def test_perf_result_says_what_it_timed_and_computes_the_product():
    case = _small_f16_case()
    res = run_case_perf(case, backend_cpu_init(), min_time=0.0, min_runs=1)
    assert res.status == "OK" and res.gflops > 0
    assert any("weights (f16) in a WEIGHTS buffer" in m for m in res.messages)
    f32 = [c for c in perf_cases() if c.op == "MUL_MAT" and c.params.get("type_a") == Type.F32]
    res32 = run_case_perf(min(f32, key=lambda c: c.params["m"] * c.params["n"]), backend_cpu_init(),
                          min_time=0.0, min_runs=1)
    assert not any("WEIGHTS" in m for m in res32.messages)  # F32 weights: nothing to convert
    assert np.isfinite(res32.gflops)
