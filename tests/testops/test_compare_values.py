"""test-backend-ops' value comparison accepts what ggml's harness accepts (test-backend-ops.cpp,
``test_case::eval``'s callback: any NaN fails; ``isinf_or_max`` values must pair with an
``isinf_or_max`` value of the same sign, so +inf against FLT_MAX and -FLT_MAX against -inf are
equal) and nothing more: finite elements next to a paired infinity still count in the NMSE
(ggml's sum turns NaN there and its ``err > max_err`` passes the whole tensor). Table tests of
the element rule and of whole cases run between two deliberately damaged CPU backends."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ggmlpy.backend.interface import DeviceProps
from ggmlpy.backends.cpu.backend import CPUBackend, CPUDevice
from ggmlpy.backends.plan import Plan, build_plan
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.testops.compare import isinf_or_max, nmse, values_mismatch
from ggmlpy.testops.families import all_cases
from ggmlpy.testops.runner import run_case_test, select_cases

FMAX = float(np.finfo(np.float32).max)
INF, NAN = float("inf"), float("nan")

# (value on the tested backend, value on the CPU, what ggml's callback says)
PAIRS = [
    (INF, INF, None), (-INF, -INF, None),
    (INF, FMAX, None), (FMAX, INF, None), (-FMAX, -INF, None), (-INF, -FMAX, None),
    (FMAX, FMAX, None), (-FMAX, -FMAX, None),
    (INF, -INF, "inf sign mismatch"), (FMAX, -INF, "inf sign mismatch"),
    (-FMAX, FMAX, "inf sign mismatch"),
    (INF, 1.0, "inf mismatch"), (1.0, -INF, "inf mismatch"), (FMAX, 3e38, "inf mismatch"),
    (float(np.nextafter(np.float32(FMAX), np.float32(0))), FMAX, "inf mismatch"),
    (NAN, NAN, "NaN"), (NAN, 1.0, "NaN"), (1.0, NAN, "NaN"), (NAN, INF, "NaN"),
    (1.0, 1.0, None), (0.0, -0.0, None),
]


def _ggml_scalar(a: float, b: float) -> str | None:
    """The callback's checks for one element, transcribed from test-backend-ops.cpp."""
    def inf_or_max(f: float) -> bool:
        return np.isinf(f) or f == FMAX or f == -FMAX

    if np.isnan(a) or np.isnan(b):
        return "NaN"
    if inf_or_max(a) or inf_or_max(b):
        if inf_or_max(a) and inf_or_max(b):
            if np.signbit(a) != np.signbit(b):
                return "inf sign mismatch"
        else:
            return "inf mismatch"
    return None


@pytest.mark.parametrize(("a", "b", "want"), PAIRS)
def test_element_rule_table(a, b, want):
    assert _ggml_scalar(a, b) == want  # the table is ggml's rule
    x = np.array([0.5, a, 2.0], np.float32).astype(np.float64)
    y = np.array([0.5, b, 2.0], np.float32).astype(np.float64)
    got = values_mismatch(x, y)
    assert got == (None if want is None else (1, want))
    if want is None:
        assert nmse(x, y) == 0.0


def test_random_vectors_match_the_scalar_rule():
    rng = np.random.default_rng(3)
    pool = np.array([INF, -INF, FMAX, -FMAX, NAN, 1.0, -2.0, 0.0, 3e38], np.float32)
    for _ in range(300):
        n = int(rng.integers(1, 6))
        a = rng.choice(pool, n).astype(np.float64)
        b = rng.choice(pool, n).astype(np.float64)
        want = next(((i, w) for i in range(n) if (w := _ggml_scalar(a[i], b[i])) is not None),
                    None)
        assert values_mismatch(a, b) == want


def test_nmse_still_counts_finite_elements_next_to_paired_infinities():
    a = np.array([INF, 1.0, 2.0, -FMAX])
    assert nmse(a, np.array([FMAX, 1.0, 2.0, -INF])) == 0.0
    assert nmse(a, np.array([FMAX, 1.5, 2.0, -INF])) == pytest.approx(0.25 / 5.0)
    assert nmse(np.array([INF, 1.0]), np.array([1.0, 1.0])) == INF
    assert isinf_or_max(np.array([FMAX, -FMAX, INF, 3e38])).tolist() == [True, True, True, False]


# ------------------------------------------------------------------------------ through the runner


class _SetBackend(CPUBackend):
    """CPU backend that, after each MUL, writes given values at given flat positions."""

    def __init__(self, device: CPUDevice, edits: dict[int, float]):
        super().__init__(device)
        self._edits = edits

    def _build_plan(self, graph: Graph) -> Plan:
        plan = build_plan(graph, np, self.name, lambda t: t.buffer.buft.is_host(),
                          self.device.supports_op)
        steps: list[Callable[[], None]] = []
        for step, node in zip(plan.steps, plan.nodes):
            if node.op == Op.MUL:
                def edited(step=step, node=node) -> None:
                    step()
                    _poke(node, self._edits)
                steps.append(edited)
            else:
                steps.append(step)
        return Plan(steps, plan.nodes)


def _poke(node: Tensor, edits: dict[int, float]) -> None:
    root = node.view_src if node.view_src is not None else node
    host = np.ndarray(node.ne[::-1], node.type.dtype, root.buffer.data, node.offset, node.nb[::-1])
    flat = host.reshape(-1)
    for i, v in edits.items():
        flat[i] = v


class _SetDevice(CPUDevice):
    def __init__(self, name: str, edits: dict[int, float]) -> None:
        super().__init__()
        self._name, self._edits = name, edits

    def _get_props(self) -> DeviceProps:
        p = super()._get_props()
        p.name = self._name
        return p

    def _init_backend(self, params: str | None) -> CPUBackend:
        return _SetBackend(self, self._edits)


@pytest.mark.parametrize(("tested", "cpu", "ok"), [
    ({0: INF}, {0: FMAX}, True),
    ({3: -FMAX}, {3: -INF}, True),
    ({0: INF, 5: -INF}, {0: INF, 5: -FMAX}, True),
    ({0: INF}, {0: -FMAX}, False),
    ({0: INF}, {}, False),
    ({0: NAN}, {0: NAN}, False),
    ({0: INF, 7: 5.0}, {0: FMAX}, False),  # ggml would pass this: its NMSE is NaN
])
def test_runner_verdicts(tested, cpu, ok):
    case = select_cases(all_cases(), "MUL", r"type=f32,ne=\[10,5,4,3\],nr=\[1,1,1,1\],perm1=0")[0]
    a = _SetDevice("SET0", tested).init_backend()
    b = _SetDevice("SETCPU", cpu).init_backend()
    r = run_case_test(case, a, b)
    assert (r.status == "OK") == ok, r.messages
    if not ok and 7 not in tested:
        assert "mismatch at index" in r.messages[0] or "NaN at index" in r.messages[0]
