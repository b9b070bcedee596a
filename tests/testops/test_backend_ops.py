"""test-backend-ops (ggmlpy.testops): the case table passes on a SIM device, and the tool catches
wrong kernels, out-of-bounds writes, unsupported ops and diverging graph nodes.

Broken backends are built here as small subclasses of the CPU backend whose compiled plan runs
the honest kernel and then damages the result (a wrong value, or a write past the destination),
so the tool is checked against known faults without touching any shared kernel code. SIM devices
come from the ``sim_devices`` fixture (not the registry), so no global state is changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.backend.interface import DeviceProps
from ggmlpy.backend.tensor_data import backend_tensor_get
from ggmlpy.backends.cpu.backend import CPUBackend, CPUDevice, backend_cpu_init
from ggmlpy.backends.plan import Plan, build_plan
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type
from ggmlpy.testops import compare_graph, main, run_tests
from ggmlpy.testops.families import all_cases, family_counts
from ggmlpy.testops.runner import run_case_test, select_cases

# ------------------------------------------------------------------------------------------------
# broken test backends


class _FaultyBackend(CPUBackend):
    """A CPU backend that, after computing a node whose op is ``op``, calls ``fault(node, mem)``
    with the node's host memory (the buffer's whole uint8 array)."""

    def __init__(self, device: CPUDevice, op: Op, fault: Callable[[Tensor, np.ndarray], None]):
        super().__init__(device)
        self._op, self._fault = op, fault

    def _build_plan(self, graph: Graph) -> Plan:
        plan = build_plan(graph, np, self.name, lambda t: t.buffer.buft.is_host(),
                          self.device.supports_op)
        steps = []
        for step, node in zip(plan.steps, plan.nodes):
            if node.op == self._op:
                def damaged(step=step, node=node) -> None:
                    step()
                    root = node.view_src if node.view_src is not None else node
                    self._fault(node, root.buffer.data)
                steps.append(damaged)
            else:
                steps.append(step)
        return Plan(steps, plan.nodes)


class _FaultyDevice(CPUDevice):
    def __init__(self, name: str, op: Op, fault: Callable[[Tensor, np.ndarray], None]) -> None:
        super().__init__()
        self._name, self._op, self._fault = name, op, fault

    def _get_props(self) -> DeviceProps:
        p = super()._get_props()
        p.name = self._name
        return p

    def _init_backend(self, params: str | None) -> CPUBackend:
        return _FaultyBackend(self, self._op, self._fault)


def _add_to_output(node: Tensor, mem: np.ndarray) -> None:
    # a wrong kernel: every element of the result is off by 0.01 (NMSE ~1e-4 on values ~1)
    host = np.ndarray(node.ne[::-1], node.type.dtype, mem, node.offset, node.nb[::-1])
    host += node.type.dtype.type(0.01)


def _write_past_end(node: Tensor, mem: np.ndarray) -> None:
    # an out-of-bounds kernel: writes one element right after the last byte of dst
    end = node.offset + node.nbytes
    mem[end:end + node.type.type_size] = np.frombuffer(
        np.array([1234.5], node.type.dtype).tobytes(), np.uint8)


def _faulty(name: str, op: Op, fault: Callable[[Tensor, np.ndarray], None]) -> CPUBackend:
    return _FaultyDevice(name, op, fault).init_backend()


@pytest.fixture
def sim_backend(sim_devices):
    b = sim_devices(1)[0].init_backend()
    yield b
    b.free()


# ------------------------------------------------------------------------------------------------
# the case table


def test_case_table_covers_every_op_family_with_unique_ggml_style_names():
    cases = all_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    assert len(cases) >= 1000  # hundreds of cases, in ggml's spirit
    counts = family_counts(cases)
    computing = {op.name for op in Op} - {"NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"}
    missing = computing - set(counts)
    assert not missing, f"op families without cases: {sorted(missing)}"
    assert "ADD(type=f32,ne=[10,5,4,3],nr=[2,1,1,1],perm1=1)" in names
    assert any(n.startswith("GELU(type=f16,") for n in names)


def test_filters_select_by_op_family_and_regex():
    cases = all_cases()
    adds = select_cases(cases, "ADD")
    assert adds and all(c.op == "ADD" for c in adds)
    assert {c.op for c in select_cases(cases, "UNARY")} >= {"GELU", "SILU", "EXP"}
    f16_gelu = select_cases(cases, "GELU", r"type=f16")
    assert f16_gelu and all("type=f16" in c.name for c in f16_gelu)
    one = select_cases(cases, adds[0].name)
    assert [c.name for c in one] == [adds[0].name]


# ------------------------------------------------------------------------------------------------
# the full table against SIM0, one test per op family of the case table (so pytest-xdist can
# spread it, and a new family is run without a test edit)

_FAMILIES = sorted({c.family for c in all_cases()})


@pytest.mark.parametrize("family", _FAMILIES)
def test_all_cases_pass_on_sim0(family, sim_backend):
    report = run_tests("test", backend=sim_backend, op=family)
    failed = [r.line() for r in report.failed]
    assert not failed, "\n".join(failed[:10])
    passed, run, not_supported = report.counts()
    assert passed == run > 0
    # only the BF16/Q8_0/Q4_0 coverage cases may be unsupported (the NumPy kernels lack them)
    for r in report.results:
        if r.status == "not supported":
            assert any(t in r.case for t in ("bf16", "q8_0", "q4_0")), r.case


# ------------------------------------------------------------------------------------------------
# the tool catches faults


def test_wrong_kernel_is_reported_failed_and_blamed_on_the_backend():
    broken = _faulty("BROKEN0", Op.MUL, _add_to_output)
    report = run_tests("test", backend=broken, op="MUL,ADD", params=r"type=f32,ne=\[10,5,4,3\]")
    muls = [r for r in report.results if r.op == "MUL"]
    adds = [r for r in report.results if r.op == "ADD"]
    assert muls and adds
    assert all(r.status == "FAIL" for r in muls)
    assert all(r.status == "OK" for r in adds)
    for r in muls:
        assert r.verdict == "backend wrong"
        # MUL inputs are U(0.9, 1.1): an offset of 0.01 gives NMSE ~ 1e-4 against float64
        assert r.err_backend > 1e-5 and r.err_cpu <= r.threshold
    assert report.exit_code() == 1
    assert report.summary_lines()[-1] == f"{len(adds)}/{len(adds) + len(muls)} tests passed"
    assert report.summary_lines()[-2] == "0/1 backends passed"


def test_wrong_reference_is_blamed_on_the_cpu():
    case = select_cases(all_cases(), "MUL", r"type=f32,ne=\[10,5,4,3\],nr=\[1,1,1,1\],perm1=0")[0]
    bad_cpu = _faulty("BADCPU", Op.MUL, _add_to_output)
    r = run_case_test(case, backend_cpu_init(), bad_cpu)
    assert r.status == "FAIL" and r.verdict == "CPU wrong"


def test_out_of_bounds_write_is_caught_by_the_guards():
    broken = _faulty("OOB0", Op.SCALE, _write_past_end)
    report = run_tests("test", backend=broken, op="SCALE")
    assert report.results and all(r.status == "FAIL" for r in report.results)
    for r in report.results:
        text = " ".join(r.messages)
        assert "guard bytes overwritten" in text
        # in-place SCALE writes into its input's memory, so the guard after the input is hit
        assert "bytes past the end of" in text
    # the values themselves are right: only the guards fail
    assert all(r.node is None for r in report.results)


def test_guards_do_not_fire_on_a_correct_backend():
    report = run_tests("test", backend=backend_cpu_init(), op="SCALE,CPY,SET,ACC,GET_ROWS")
    assert report.ok and report.counts()[0] > 50


def test_unsupported_op_is_reported_not_supported_never_passed(sim_devices):
    b = sim_devices(1, refuse_ops=[Op.SOFT_MAX])[0].init_backend()
    try:
        report = run_tests("test", backend=b, op="SOFT_MAX,SCALE")
    finally:
        b.free()
    soft = [r for r in report.results if r.op == "SOFT_MAX"]
    assert soft and all(r.status == "not supported" for r in soft)
    assert all("SOFT_MAX" in r.messages[0] for r in soft)
    passed, run, ns = report.counts()
    assert ns == len(soft) and run == passed == len(report.results) - len(soft)
    assert report.exit_code() == 0


# ------------------------------------------------------------------------------------------------
# perf and support modes, CLI


def test_perf_mode_reports_time_and_throughput():
    cases = select_cases(all_cases(), "MUL_MAT,ADD",
                         r"(type_a=f32,type_b=f32,m=16,n=1,k=256,bs=\[1,1\])|"
                         r"(ADD\(type=f32,ne=\[10,5,4,3\],nr=\[1,1,1,1\],perm1=0)")
    report = run_tests("perf", backend=backend_cpu_init(), cases=cases, min_time=0.01)
    assert len(report.results) == 2
    for r in report.results:
        assert r.runs >= 3 and r.us_per_run > 0
    mm = next(r for r in report.results if r.op == "MUL_MAT")
    add = next(r for r in report.results if r.op == "ADD")
    assert mm.gflops > 0 and mm.gbps is None
    # ADD reads a and b and writes the result: 3 * 600 floats per run
    assert add.gbps > 0 and add.kb_per_run == pytest.approx(3 * 600 * 4 / 1024)


def test_support_mode_table_and_markdown(capsys):
    assert main(["support", "-b", "CPU", "-o", "MUL_MAT", "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| op | types | CPU |"
    assert "| MUL_MAT | f16/f32 | yes |" in out
    assert "| MUL_MAT | q8_0/f32 | yes |" in out


def test_cli_test_mode_exit_status_and_json(capsys):
    assert main(["-b", "CPU", "-o", "ADD", "-p", r"type=f32,ne=\[10,5,4,3\]"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].endswith("tests passed") and lines[-2] == "1/1 backends passed"
    n = int(lines[-1].split("/")[0])
    assert lines[-1] == f"{n}/{n} tests passed" and n > 0
    assert main(["-b", "CPU", "-o", "SQRT", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["passed"] == doc["summary"]["run"] > 0
    assert main(["-b", "NO_SUCH_DEVICE"]) == 2


# ------------------------------------------------------------------------------------------------
# whole-graph comparison


def _mlp(ctx):
    """mul_mat -> add -> gelu on fixed inputs; returns the graph, inputs and the numpy float64
    values of the mul_mat node (independent reference)."""
    rng = np.random.default_rng(7)
    w = ctx.new_tensor(Type.F32, [32, 16])   # [K=32, M=16], NumPy (16, 32)
    x = ctx.new_tensor(Type.F32, [32, 4])    # NumPy (4, 32)
    bias = ctx.new_tensor(Type.F32, [16, 1])
    mm = ops.mul_mat(ctx, w, x)              # [16, 4], NumPy (4, 16) = x @ w.T
    h = ops.add(ctx, mm, bias)
    out = ops.gelu(ctx, h)
    g = Graph()
    g.build_forward_expand(out)
    vals = {w: rng.uniform(-1, 1, (16, 32)), x: rng.uniform(-1, 1, (4, 32)),
            bias: rng.uniform(-1, 1, (1, 16))}
    inputs = {t: v.astype(np.float32) for t, v in vals.items()}
    ref_mm = inputs[x].astype(np.float64) @ inputs[w].astype(np.float64).T
    return g, inputs, ref_mm, (mm, h, out)


def test_compare_graph_finds_first_diverging_node_and_saves_its_inputs(tmp_path):
    from ggmlpy.core.tensor import Context

    g, inputs, ref_mm, (mm, h, out) = _mlp(Context(no_alloc=True))
    broken = _faulty("BROKEN1", Op.ADD, _add_to_output)
    rep = compare_graph(g, inputs, broken, backend_cpu_init(), save_dir=str(tmp_path))
    assert rep.diverged and rep.node == h.name and rep.op == "ADD"
    assert rep.index == g.nodes.index(h)
    assert rep.ne == [16, 4, 1, 1] and rep.type == "f32"
    assert [s["name"] for s in rep.sources] == [mm.name, g.leafs[-1].name]
    saved = np.load(rep.saved)
    # src0 of the ADD node is the mul_mat result: float32 rounding of the float64 product
    np.testing.assert_allclose(saved["src0"].reshape(4, 16), ref_mm, rtol=1e-5, atol=1e-5)
    diff = saved["out_backend1"] - saved["out_backend2"]
    np.testing.assert_allclose(diff, 0.01, rtol=1e-3)  # the injected fault, exactly
    # tensors the comparison placed are released again
    assert not mm.is_allocated and not out.is_allocated


def test_compare_graph_agrees_for_identical_backends():
    from ggmlpy.core.tensor import Context

    g, inputs, _, _ = _mlp(Context(no_alloc=True))
    rep = compare_graph(g, inputs, backend_cpu_init(), backend_cpu_init())
    assert not rep.diverged and rep.nodes_compared == 3


def test_cli_graph_mode(tmp_path, capsys):
    f = tmp_path / "g.py"
    f.write_text(
        "import numpy as np\n"
        "from ggmlpy import ops\nfrom ggmlpy.core.graph import Graph\nfrom ggmlpy.core.types import Type\n"
        "def build(ctx):\n"
        "    a = ctx.new_tensor(Type.F32, [8, 3])\n"
        "    out = ops.soft_max(ctx, ops.scale(ctx, a, 0.5))\n"
        "    g = Graph(); g.build_forward_expand(out)\n"
        "    return g, {a: np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)}\n")
    assert main(["--graph", str(f), "-b", "CPU", "--save", str(tmp_path / "s")]) == 0
    assert "2 nodes agree" in capsys.readouterr().out


def test_backend_tensor_get_roundtrip_of_guarded_case():
    # the runner's initial data reaches the backend unchanged (read back through the guards' layout)
    from ggmlpy.testops.guards import guarded_alloc

    case = select_cases(all_cases(), "ADD", r"ne=\[10,5,4,3\],nr=\[2,2,2,2\],perm1=1")[0]
    ctx, builder, out = case.build_graph()
    data = case.initial_data(ctx, builder)
    alloc = guarded_alloc(ctx, backend_cpu_init())
    try:
        from ggmlpy.backend.tensor_data import backend_tensor_set

        for t in ctx:
            if t.view_src is None:
                backend_tensor_set(t, data[id(t)])
        for t in ctx:
            if t.view_src is None:
                np.testing.assert_array_equal(backend_tensor_get(t), data[id(t)])
        assert alloc.check() == []
    finally:
        alloc.free()
