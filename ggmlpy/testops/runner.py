"""Running cases: test mode (compare with the CPU backend), perf mode (timing) and support mode.

Mirrors ``test_case::eval``, ``eval_perf`` and ``eval_support`` of ggml's test-backend-ops:

* **test**: the case is built in a fresh ``no_alloc`` context; if any tensor is unsupported by
  the backend under test or by the CPU backend the case is "not supported". Otherwise every tensor
  is placed in one buffer of the backend under test with guard bytes around it
  (:mod:`.guards`), every non-view tensor (outputs included) gets the case's deterministic
  initial data, and :func:`ggmlpy.testops.compare.compare_graph_backend` computes the graph node by node
  on both backends (the CPU side gets a copy made with ``graph_copy``). Each computed node's two
  results must be free of NaN and within the case's NMSE threshold; afterwards the guards must be
  intact and inputs nobody writes must still hold their initial bytes. When a case fails, a
  float64 evaluation (:mod:`.reference`) says which side is wrong.
* **perf**: the case is allocated plainly, computed once to warm up, then computed and
  synchronized repeatedly until ``min_time`` seconds and ``min_runs`` runs have passed.
* **support**: ``supports_op`` of every tensor of every case, per backend, grouped by op and types.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import numpy as np

from ggmlpy.backend.interface import Backend, Device
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.core.check import check_int, check_number, check_optional, check_str_sequence, check_type
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.testops.case import TestCase
from ggmlpy.testops.compare import compare_graph_backend, nmse, values_mismatch
from ggmlpy.testops.guards import guarded_alloc
from ggmlpy.testops.reference import RefUnsupported, evaluate
from ggmlpy.testops.report import FAIL, OK, UNSUPPORTED, Report, Result, SupportRow

__all__ = ["select_cases", "resolve_backends", "run_case_test", "run_case_perf", "run_tests",
           "support_rows", "case_types"]

GRAPH_SIZE = 8192


# ------------------------------------------------------------------------------------------------
# selection

def select_cases(cases: Iterable[TestCase], op: str | Sequence[str] | None = None,
                 params: str | None = None) -> list[TestCase]:
    """Filter cases like ggml's ``-o`` and ``-p``.

    Args:
        op: comma-separated (or a list of) op descriptions (``ADD``, ``GELU``) or ggmlpy op family
            names (``UNARY``); an entry containing ``(`` must equal a full case name.
        params: a regular expression searched in the case name ``OP(vars)``.

    Raises:
        re.error: ``params`` is not a valid regular expression.
        TypeError: ``cases`` is not an iterable of TestCase, ``op`` not a str or a sequence of
            str, ``params`` not a str.
        ValueError: an ``op`` entry names no op, family or case of ``cases``.
    """
    where = "select_cases"
    if isinstance(cases, (str, bytes)) or not isinstance(cases, Iterable):
        raise TypeError(f"{where}: cases must be an iterable of TestCase, got {type(cases).__name__}")
    cases = list(cases)
    for i, c in enumerate(cases):
        check_type(f"cases[{i}]", c, TestCase, where)
    if op is not None and not isinstance(op, str):
        check_str_sequence("op", op, where)
    check_optional("params", params, str, where)
    ops: list[str] = []
    if op:
        ops = [o.strip() for o in (_split_top(op) if isinstance(op, str) else op) if o.strip()]
    known = {c.op for c in cases} | {c.family for c in cases}
    names = {c.name for c in cases}
    unknown = [o for o in ops if (o not in names if "(" in o else o.upper() not in known)]
    if unknown:
        raise ValueError(f"unknown op, family or case name(s): {', '.join(unknown)} "
                         f"(known ops: {', '.join(sorted(known))})")
    rx = re.compile(params) if params else None
    out = []
    for c in cases:
        if ops and not any((o == c.name) if "(" in o else (o.upper() in (c.op, c.family))
                           for o in ops):
            continue
        if rx is not None and not rx.search(c.name):
            continue
        out.append(c)
    return out


def _split_top(s: str) -> list[str]:
    """Split on commas outside brackets, so full case names (which contain commas) survive."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def resolve_backends(backend: Any = None, *, include_cpu: bool = False) -> list[Backend]:
    """The backends under test.

    Args:
        backend: None for every registered non-CPU device (ggml's default); a device name or a
            comma-separated list of names (``"SIM0,CPU"``); or Backend/Device objects (or a list).
        include_cpu: with ``backend=None``, also list the CPU (support mode).

    Raises:
        TypeError: ``backend`` (or one of its items) is not a str, Backend or Device.
        BackendUnavailableError: a named device does not exist.
    """
    from ggmlpy.backend import registry

    check_type("include_cpu", include_cpu, bool, "resolve_backends")
    if backend is None:
        devs = [d for d in registry.devices() if include_cpu or d.name.upper() != "CPU"]
        return [d.init_backend() for d in devs]
    items = backend.split(",") if isinstance(backend, str) else (
        list(backend) if isinstance(backend, (list, tuple)) else [backend])
    out: list[Backend] = []
    for i, it in enumerate(items):
        name = f"backend[{i}]" if isinstance(backend, (list, tuple)) else "backend"
        check_type(name, it, (str, Backend, Device), "resolve_backends")
        if isinstance(it, Backend):
            out.append(it)
        elif isinstance(it, Device):
            out.append(it.init_backend())
        elif str(it).strip():
            out.append(registry.backend_init_by_name(str(it).strip()))
    return out


# ------------------------------------------------------------------------------------------------
# helpers

def _unsupported(ctx: Context, backend: Backend) -> str | None:
    for t in ctx:
        if not backend.supports_op(t):
            srcs = ",".join(s.type.type_name for s in t.src if s is not None)
            return f"{backend.name}: {t.op.name} '{t.name}' ({t.type.type_name} <- {srcs})"
    return None


def _root(t: Tensor) -> Tensor:
    return t.view_src if t.view_src is not None else t


def _as_f64(t: Tensor) -> np.ndarray:
    """A tensor's values in float64; BF16 and block types are decoded (ggml compares them after
    ``to_float``, not as raw bytes)."""
    data = np.asarray(backend_tensor_get(t))
    if t.type.is_quantized or t.type == Type.BF16:
        if t.type.is_quantized and not t.is_contiguous():
            raise ValueError(f"cannot compare the non-contiguous {t.type.type_name} tensor "
                             f"'{t.name}'")
        from ggmlpy.quants import dequantize  # noqa: PLC0415

        return dequantize(data.reshape(-1).view(np.uint8), t.type, t.ne).astype(np.float64)
    return data.astype(np.float64)


def _written_roots(graph: Graph) -> set[int]:
    return {id(_root(n)) for n in graph.nodes if n.op != Op.NONE and n.op not in VIEW_OPS}


def _judge(err_b: float, err_c: float, thr: float) -> str:
    bad_b, bad_c = not err_b <= thr, not err_c <= thr
    if bad_b and bad_c:
        return "both"
    if bad_b:
        return "backend wrong"
    if bad_c:
        return "CPU wrong"
    return "inconclusive"


# ------------------------------------------------------------------------------------------------
# test mode

def run_case_test(case: TestCase, backend: Backend, cpu: Backend) -> Result:
    """Run one case in test mode on ``backend`` against ``cpu`` (see the module docstring).

    Never raises for a failing backend: exceptions during compute become a FAIL result with the
    exception text. Returns the :class:`Result`.
    """
    res = Result(case.name, case.op, case.family, backend.name, OK, threshold=case.max_nmse)
    ctx, builder, out = case.build_graph()
    graph = Graph(GRAPH_SIZE)
    graph.build_forward_expand(out)
    why = _unsupported(ctx, backend) or _unsupported(ctx, cpu)
    if why:
        res.status = UNSUPPORTED
        res.messages.append(why)
        return res
    data = case.initial_data(ctx, builder)
    written = _written_roots(graph)
    # ggml appends its sentinels and PARAM inputs to the graph as op-NONE nodes and requires them
    # byte-identical on both sides after compute; ggmlpy does the same with the inputs (leafs)
    for leaf in list(graph.leafs):
        graph.add_node(leaf)
    alloc = guarded_alloc(ctx, backend)
    fails: list[tuple[Tensor, np.ndarray, np.ndarray, str]] = []
    worst = 0.0

    def callback(i: int, t1: Tensor, t2: Tensor) -> bool:
        nonlocal worst
        if t1.op == Op.NONE:
            if id(_root(t1)) not in written:
                b1 = np.asarray(backend_tensor_get(t1)).reshape(-1).view(np.uint8)
                b2 = np.asarray(backend_tensor_get(t2)).reshape(-1).view(np.uint8)
                if not np.array_equal(b1, b2):
                    res.messages.append(f"input '{t1.name}' differs between the backends "
                                        "after compute")
            return True
        a1, a2 = _as_f64(t1), _as_f64(t2)
        bad = values_mismatch(a1, a2)  # test-backend-ops' NaN and isinf_or_max checks
        if bad is not None:
            i, what = bad
            v1, v2 = a1.reshape(-1)[i], a2.reshape(-1)[i]
            msg = (f"[{t1.op.name}] {what} at index {i} of '{t1.name}' "
                   f"(backend={float(v1)!r} CPU={float(v2)!r})")
            fails.append((t1, a1, a2, msg))
            return True
        err = nmse(a1, a2)  # ggml: normalised by the tested backend's values
        worst = max(worst, err)
        if not err <= case.max_nmse:
            fails.append((t1, a1, a2, (f"[{t1.op.name}] NMSE = {err:.9f} > {case.max_nmse:.9f} "
                                      f"at node '{t1.name}'")))
        return True

    try:
        for t in ctx:
            if t.view_src is None and id(t) in data:
                backend_tensor_set(t, data[id(t)])
        try:
            compare_graph_backend(backend, cpu, graph, callback)
        except Exception as e:  # a backend failing to compute is a test failure, not a crash
            res.status = FAIL
            res.verdict = "exception"
            res.messages.append(f"exception during compute: {type(e).__name__}: {e}")
        res.messages.extend(alloc.check())
        for t in ctx:
            if t.view_src is None and id(t) not in written and id(t) in data and graph.contains(t):
                now = np.asarray(backend_tensor_get(t)).reshape(-1).view(np.uint8)
                if not np.array_equal(now, data[id(t)].reshape(-1).view(np.uint8)):
                    res.messages.append(f"input '{t.name}' was modified by the backend")
    finally:
        alloc.free()
    res.nmse = worst
    if fails:
        res.node = fails[0][0].name
        res.messages.insert(0, fails[0][3])
    if fails or res.messages:
        res.status = FAIL
    if fails:
        t1, a1, a2, _ = fails[0]
        try:
            ref = evaluate(ctx, graph, data)[id(t1)]
            res.err_backend, res.err_cpu = nmse(ref, a1), nmse(ref, a2)
            res.verdict = _judge(res.err_backend, res.err_cpu, case.max_nmse)
        except (RefUnsupported, KeyError) as e:
            res.verdict = f"no float64 reference ({e})"
        res.messages.append(f"float64 reference: NMSE backend {res.err_backend!s}, "
                            f"CPU {res.err_cpu!s}")
    elif res.status == FAIL and res.verdict is None:
        res.verdict = "backend wrong"  # guards/inputs are only checked on the backend under test
    return res


# ------------------------------------------------------------------------------------------------
# perf mode

def _op_bytes(graph: Graph) -> int:
    total = 0
    for n in graph.nodes:
        if n.op == Op.NONE or n.op in VIEW_OPS:
            continue
        total += n.nbytes + sum(s.nbytes for s in n.src if s is not None)
    return total


def _weight_leaves(graph: Graph) -> list[Tensor]:
    """The non-F32 leaf tensors that are ``src[0]`` of a MUL_MAT node: the
    weights of a model's matrix products."""
    out: list[Tensor] = []
    for n in graph.nodes:
        if n.op != Op.MUL_MAT:
            continue
        w = n.src[0]
        if (w is not None and w.op == Op.NONE and w.view_src is None and w.type != Type.F32
                and all(w is not x for x in out)):
            out.append(w)
    return out


def _alloc_weights(weights: list[Tensor], buft: Any) -> Any:
    """Allocate ``weights`` in one buffer of ``buft`` marked usage WEIGHTS (as a model's weights
    are: backends may then keep a converted copy across computes); returns it or None."""
    from ggmlpy.alloc.tallocr import TensorAllocator
    from ggmlpy.backend.interface import BufferUsage

    if not weights:
        return None
    align = buft.get_alignment()
    size = sum((buft.get_alloc_size(w) + align - 1) // align * align for w in weights)
    wbuf = buft.alloc_buffer(size)
    talloc = TensorAllocator(wbuf)
    for w in weights:
        talloc.alloc(w)
    wbuf.set_usage(BufferUsage.WEIGHTS)
    return wbuf


def run_case_perf(case: TestCase, backend: Backend, min_time: float = 0.2,
                  min_runs: int = 3) -> Result:
    """Time one case on ``backend`` (mirrors ``eval_perf``): one warm-up compute, then compute +
    synchronize until at least ``min_time`` seconds and ``min_runs`` runs. Reports µs/run and
    GFLOP/s (when the case counts flops) or GB/s (bytes read + written per run / time, 1e9).

    The non-F32 weight (``src[0]``) of a MUL_MAT case lives in a buffer of usage
    WEIGHTS, as a model's weights do (:func:`_weight_leaves`), so the timing is that of a model's
    matrix product: a backend that converts such weights once (the NumPy backends' float32 copy)
    is timed with the conversion done at the warm-up; the result's message says so. Everything
    else is in one plain buffer."""
    from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft

    res = Result(case.name, case.op, case.family, backend.name, OK)
    ctx, builder, out = case.build_graph()
    graph = Graph(GRAPH_SIZE)
    graph.build_forward_expand(out)
    why = _unsupported(ctx, backend)
    if why:
        res.status = UNSUPPORTED
        res.messages.append(why)
        return res
    buft = backend.get_default_buffer_type()
    weights = _weight_leaves(graph)
    wbuf = _alloc_weights(weights, buft)
    if weights:
        res.messages.append(f"weights ({', '.join(w.type.type_name for w in weights)}) in a "
                            "WEIGHTS buffer, as a model holds them")
    buf = alloc_ctx_tensors_from_buft(ctx, buft)
    try:
        data = case.initial_data(ctx, builder)
        for t in ctx:
            if t.view_src is None and id(t) in data:
                backend_tensor_set(t, data[id(t)])
        backend.graph_compute(graph)
        runs = 0
        t0 = time.perf_counter()
        while True:
            backend.graph_compute_async(graph)
            backend.synchronize()
            runs += 1
            el = time.perf_counter() - t0
            if el >= min_time and runs >= min_runs:
                break
    finally:
        if buf is not None:
            buf.free()
        if wbuf is not None:
            wbuf.free()
    nbytes = _op_bytes(graph)
    res.runs = runs
    res.us_per_run = el / runs * 1e6
    res.kb_per_run = nbytes / 1024
    if case.flops is not None:
        res.gflops = case.flops(out) / (el / runs) / 1e9
    else:
        res.gbps = nbytes / (el / runs) / 1e9
    return res


# ------------------------------------------------------------------------------------------------
# support mode

def case_types(case: TestCase) -> str:
    """The type parameters of a case joined with ``/`` (``"f16/f32"``), or ``"-"``."""
    ts = [v.type_name for v in case.params.values() if isinstance(v, Type)]
    return "/".join(ts) if ts else "-"


def support_rows(cases: Sequence[TestCase], backends: Sequence[Backend]) -> list[SupportRow]:
    """Group cases by (op, types) and ask each backend's ``supports_op`` for every tensor of each
    case: a cell is ``yes`` (all cases), ``no`` (none) or ``partial n/m``."""
    groups: dict[tuple[str, str], list[TestCase]] = {}
    for c in cases:
        groups.setdefault((c.op, case_types(c)), []).append(c)
    rows = []
    for (op, types), cs in sorted(groups.items(), key=lambda kv: kv[0][0]):
        cells = {}
        built = [c.build_graph()[0] for c in cs]
        for b in backends:
            n = sum(1 for ctx in built if _unsupported(ctx, b) is None)
            cells[b.name] = "yes" if n == len(cs) else "no" if n == 0 else f"partial {n}/{len(cs)}"
        rows.append(SupportRow(op, types, cells))
    return rows


# ------------------------------------------------------------------------------------------------
# entry point

def run_tests(mode: str = "test", backend: Any = None, op: str | Sequence[str] | None = None,
              params: str | None = None, *, cases: Sequence[TestCase] | None = None,
              quick: bool = False, min_time: float = 0.2, min_runs: int = 3,
              stream: TextIO | None = None,
              progress: Callable[[Result], None] | None = None) -> Report:
    """Run test, perf or support mode and return a :class:`Report` (the CLI prints it).

    Args:
        mode: ``"test"``, ``"perf"`` or ``"support"``.
        backend: backends under test: None (every registered non-CPU device; support mode adds
            the CPU), a device name / comma list, or Backend/Device objects.
        op, params: ggml's ``-o`` / ``-p`` filters (see :func:`select_cases`).
        cases: the case list (default: :func:`ggmlpy.testops.families.all_cases`, or the perf
            list in perf mode).
        quick: use only cases not tagged ``"large"`` (the CI subset).
        min_time, min_runs: perf-mode timing floor per case.
        stream: where to print per-case lines as they finish (None: silent).
        progress: called with every result as it finishes.

    Raises:
        TypeError: an argument of the wrong type (named in the message).
        ValueError: unknown mode, ``min_time < 0`` or ``min_runs < 1``.
        BackendUnavailableError: a named backend does not exist.
    """
    from ggmlpy.backends.cpu.backend import backend_cpu_init
    from ggmlpy.testops.families import all_cases, perf_cases

    where = "run_tests"
    check_type("mode", mode, str, where)
    check_type("quick", quick, bool, where)
    check_number("min_time", min_time, lo=0.0, where=where)
    check_int("min_runs", min_runs, lo=1, where=where)
    if progress is not None and not callable(progress):
        raise TypeError(f"{where}: progress must be callable, got {type(progress).__name__}")
    if mode not in ("test", "perf", "support"):
        raise ValueError(f"run_tests: mode must be test, perf or support, got {mode!r}")
    if cases is None:
        cases = perf_cases() if mode == "perf" else all_cases()
    if quick:
        cases = [c for c in cases if "large" not in c.tags]
    sel = select_cases(cases, op, params)
    backends = resolve_backends(backend, include_cpu=(mode == "support"))
    report = Report(mode, [b.name for b in backends])
    if mode == "support":
        report.support = support_rows(sel, backends)
        return report
    cpu = backend_cpu_init()
    for b in backends:
        if stream is not None:
            print(f"Testing backend {b.name} ({len(sel)} cases)", file=stream, flush=True)
        for c in sel:
            r = run_case_test(c, b, cpu) if mode == "test" else \
                run_case_perf(c, b, min_time, min_runs)
            report.results.append(r)
            if stream is not None:
                print(r.line(), file=stream, flush=True)
            if progress is not None:
                progress(r)
    return report

