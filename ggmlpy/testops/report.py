"""Results of a ``test-backend-ops`` run and their console, JSON and Markdown renderings."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Result", "Report", "SupportRow"]

OK = "OK"
FAIL = "FAIL"
UNSUPPORTED = "not supported"


@dataclass
class Result:
    """One case on one backend.

    Attributes:
        case: the case name ``OP(vars)``. op: its op description. family: its ggmlpy op name.
        backend: the device name under test.
        status: ``"OK"``, ``"FAIL"`` or ``"not supported"`` (test mode), ``"OK"`` in perf mode.
        messages: why it failed (first per-node error, NaN, guard or input-corruption reports),
            or which node is not supported.
        nmse: the largest per-node NMSE measured (test mode), threshold: the case's threshold.
        node: the name of the first failing node.
        verdict: for failures, the float64 judgement: ``"backend wrong"``, ``"CPU wrong"``,
            ``"both"``, ``"inconclusive"`` or ``"no float64 reference"``.
        err_backend, err_cpu: NMSE of each side against the float64 evaluation (failures only).
        runs, us_per_run, gflops, gbps, kb_per_run: perf-mode figures (GFLOP/s for ops with a
            flop count, else GB/s of bytes read + written; 1 GB = 1e9 bytes).
    """

    case: str
    op: str
    family: str
    backend: str
    status: str
    messages: list[str] = field(default_factory=list)
    nmse: float | None = None
    threshold: float | None = None
    node: str | None = None
    verdict: str | None = None
    err_backend: float | None = None
    err_cpu: float | None = None
    runs: int | None = None
    us_per_run: float | None = None
    gflops: float | None = None
    gbps: float | None = None
    kb_per_run: float | None = None

    def line(self) -> str:
        """The console line, e.g. ``  ADD(type=f32,...): OK``."""
        if self.status == UNSUPPORTED:
            return f"  {self.case}: not supported [{self.backend}]"
        if self.runs is not None:
            speed = (f"{self.gflops:9.2f} GFLOP/s" if self.gflops is not None
                     else f"{self.gbps:9.2f} GB/s")
            return (f"  {self.case}: {self.runs} runs - {self.us_per_run:10.2f} us/run - "
                    f"{self.kb_per_run:8.0f} kB/run - {speed}")
        if self.status == OK:
            return f"  {self.case}: OK"
        why = "; ".join(self.messages) if self.messages else ""
        verdict = f" [{self.verdict}]" if self.verdict else ""
        return f"  {self.case}: FAIL{verdict}" + (f"\n      {why}" if why else "")


@dataclass
class SupportRow:
    """Support of one (op, types) combination on every backend: ``cells[backend]`` is
    ``"yes"``, ``"no"`` or ``"partial n/m"`` over the matching cases."""

    op: str
    types: str
    cells: dict[str, str]


@dataclass
class Report:
    """Everything one run produced.

    Attributes:
        mode: ``"test"``, ``"perf"`` or ``"support"``.
        backends: the device names under test (support mode: every listed device).
        results: per case and backend (test and perf modes).
        support: support rows (support mode).
    """

    mode: str
    backends: list[str]
    results: list[Result] = field(default_factory=list)
    support: list[SupportRow] = field(default_factory=list)

    # -- counts ---------------------------------------------------------------------------------
    def counts(self, backend: str | None = None) -> tuple[int, int, int]:
        """``(passed, run, not_supported)`` over ``backend``'s results (all backends if None)."""
        rs = [r for r in self.results if backend is None or r.backend == backend]
        run = [r for r in rs if r.status != UNSUPPORTED]
        return (sum(r.status == OK for r in run), len(run),
                sum(r.status == UNSUPPORTED for r in rs))

    @property
    def failed(self) -> list[Result]:
        """The failing results."""
        return [r for r in self.results if r.status == FAIL]

    @property
    def ok(self) -> bool:
        """True when nothing failed (support mode: always True)."""
        return not self.failed

    def backends_passed(self) -> int:
        """Backends with no failing case (ggml's ``N/M backends passed``)."""
        return sum(1 for b in self.backends if not any(
            r.status == FAIL for r in self.results if r.backend == b))

    def exit_code(self) -> int:
        """0 when every backend passed, else 1."""
        return 0 if self.ok else 1

    # -- renderings -----------------------------------------------------------------------------
    def summary_lines(self) -> list[str]:
        """Per-backend summary and the final two lines (test mode)."""
        lines = []
        for b in self.backends:
            p, n, ns = self.counts(b)
            status = "OK" if p == n else "FAIL"
            lines.append(f"Backend {b}: {p}/{n} tests passed, {ns} not supported - {status}")
        p, n, _ = self.counts()
        lines.append(f"{self.backends_passed()}/{len(self.backends)} backends passed")
        lines.append(f"{p}/{n} tests passed")
        return lines

    def to_json(self) -> str:
        """A JSON document: mode, backends, results (or support rows), summary counts."""
        doc: dict[str, Any] = {"mode": self.mode, "backends": self.backends}
        if self.mode == "support":
            doc["support"] = [asdict(r) for r in self.support]
        else:
            doc["results"] = [{k: v for k, v in asdict(r).items() if v is not None and v != []}
                              for r in self.results]
            p, n, ns = self.counts()
            doc["summary"] = {"passed": p, "run": n, "not_supported": ns,
                              "backends_passed": self.backends_passed(),
                              "per_backend": {b: dict(zip(("passed", "run", "not_supported"),
                                                          self.counts(b)))
                                              for b in self.backends}}
        return json.dumps(_finite(doc), indent=1, default=str)

    def support_table(self, markdown: bool = False) -> str:
        """The op x type x backend table (support mode); Markdown when ``markdown``."""
        cols = self.backends
        rows = [[r.op, r.types] + [r.cells.get(b, "") for b in cols] for r in self.support]
        head = ["op", "types"] + cols
        if markdown:
            out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            out += ["| " + " | ".join(r) + " |" for r in rows]
            return "\n".join(out)
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        return "\n".join([fmt.format(*head)] + [fmt.format(*r) for r in rows])


def _finite(x: Any) -> Any:
    """``x`` with non-finite floats replaced by their ``repr`` ("inf", "nan"), for strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
