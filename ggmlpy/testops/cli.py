"""Command line of ``python -m ggmlpy test-backend-ops`` (mirrors ggml's ``test-backend-ops`` CLI).

    python -m ggmlpy test-backend-ops [--mode test|perf|support] [-b BACKEND[,..]] [-o OP[,..]]
        [-p REGEX] [--json] [--markdown] [--quick] [--list] [--kernels]
        [--graph FILE [--save DIR]]

Exit status: 0 when every backend passed (or nothing failed), 1 on a failing case or a diverging
graph, 2 on bad usage (unknown backend, bad regex, ``-o``/``-p`` selecting no case, bad graph
file).

perf mode keeps the non-F32 weight of a MUL_MAT case in a WEIGHTS buffer, as a model does
(:func:`ggmlpy.testops.runner.run_case_perf`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence

from ggmlpy.core.check import OneLineArgumentParser, check_str_sequence

__all__ = ["main"]




def _parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="python -m ggmlpy test-backend-ops", error_name="test-backend-ops",
        description="Compare every op across backends against the CPU backend (test), time "
                    "them (perf), or list which backend supports what (support).")
    p.add_argument("mode_pos", nargs="?", choices=("test", "perf", "support"),
                   help="mode, as in ggml (same as --mode)")
    p.add_argument("--mode", choices=("test", "perf", "support"), default=None)
    p.add_argument("-b", "--backend", default=None,
                   help="device name(s) under test, comma-separated (default: every non-CPU "
                        "device; 'CPU' compares a second CPU backend)")
    p.add_argument("-o", "--op", default=None,
                   help="op descriptions (ADD, GELU, SWIGLU) or families (UNARY), comma-separated; "
                        "an entry with '(' must equal a full case name")
    p.add_argument("-p", "--params", default=None, help="regex searched in the case name OP(vars)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--markdown", action="store_true", help="support mode: a Markdown table")
    p.add_argument("--quick", action="store_true",
                   help="leave out cases tagged large (the CI subset)")
    p.add_argument("--list", action="store_true", help="list the selected cases and family counts")
    p.add_argument("--kernels", action="store_true",
                   help="list which kernel of the registry computes each selected case's nodes, "
                        "per array module (generic, cuda.fused, cpu.jit.*, fast.*)")
    p.add_argument("--min-time", type=float, default=0.2,
                   help="perf mode: seconds of timed runs per case (default 0.2)")
    p.add_argument("--graph", default=None,
                   help="a .py file defining build(ctx) -> (graph, inputs): compare that graph "
                        "node by node and report the first diverging node")
    p.add_argument("--save", default=None,
                   help="--graph: directory for the diverging node's inputs/outputs "
                        "(default: a new temporary directory, printed)")
    p.add_argument("--no-isolate", action="store_true",
                   help="--graph: let each backend keep its own intermediates")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (see the module docstring).

    Raises:
        TypeError: ``argv`` is not None or a sequence of str.
    """
    from ggmlpy.core.errors import BackendUnavailableError

    if argv is not None:
        check_str_sequence("argv", argv, "test-backend-ops main")
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # --help (0) or a usage error (2, already printed as one line)
        return int(e.code or 0)
    if args.mode and args.mode_pos and args.mode != args.mode_pos:
        print(f"test-backend-ops: mode given twice: {args.mode_pos!r} and --mode {args.mode!r}",
              file=sys.stderr)
        return 2
    mode = args.mode or args.mode_pos or "test"
    try:
        _register_named_sim(args.backend)
        if args.graph:
            return _graph_main(args)
        if (args.op or args.params) and not _selected(args, mode):
            sel = " and ".join(x for x in (f"-o {args.op}" if args.op else "",
                                           f"-p {args.params!r}" if args.params else "") if x)
            print(f"test-backend-ops: no {mode} case matches {sel}"
                  f"{' (without the large cases: --quick)' if args.quick else ''}; "
                  "--list shows the case names", file=sys.stderr)
            return 2
        if args.list:
            return _list_main(args, mode)
        if args.kernels:
            return _kernels_main(args, mode)
        return _run_main(args, mode)
    except BackendUnavailableError as e:
        print(f"test-backend-ops: {e}", file=sys.stderr)
        return 2
    except re.error as e:
        print(f"test-backend-ops: bad -p regex {args.params!r}: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"test-backend-ops: {e}", file=sys.stderr)
        return 2


def _selected(args: argparse.Namespace, mode: str) -> int:
    """How many cases of ``mode`` (perf mode has its own list) ``-o``/``-p``/``--quick`` select.

    Raises:
        ValueError: an ``-o`` entry names no op, family or case. re.error: a bad ``-p`` regex.
    """
    from ggmlpy.testops.families import all_cases, perf_cases
    from ggmlpy.testops.runner import select_cases

    cases = perf_cases() if mode == "perf" else all_cases()
    if args.quick:
        cases = [c for c in cases if "large" not in c.tags]
    return len(select_cases(cases, args.op, args.params))


def _register_named_sim(backend: str | None) -> None:
    """``-b SIMn`` without GGMLPY_SIM_DEVICES registers SIM0..SIMn once (as ``embed --device``
    does, :func:`ggmlpy.cli_names.register_named_devices`); a name that is not a device then
    raises BackendUnavailableError naming ``-b`` and why (GGMLPY_BACKENDS leaving it out, ...)."""
    from ggmlpy.backend import registry
    from ggmlpy.cli_names import register_named_devices
    from ggmlpy.core.errors import BackendUnavailableError

    names = [n.strip() for n in (backend or "").split(",") if n.strip()]
    register_named_devices(names, "test-backend-ops")
    for name in names:
        why = registry.device_unavailable_reason(name)
        if why:
            raise BackendUnavailableError(f"-b {name}: {why}")


def _check_build_result(result: object) -> str | None:
    """What is wrong with build()'s return value (one clause), or None when it is usable."""
    from ggmlpy.core.graph import Graph
    from ggmlpy.core.tensor import Tensor

    if not isinstance(result, tuple) or len(result) != 2:
        n = f" of {len(result)}" if isinstance(result, tuple) else ""
        return f"it returned {type(result).__name__}{n}"
    graph, inputs = result
    if not isinstance(graph, Graph):
        hint = " (wrap it: g = Graph(); g.build_forward_expand(out))" \
            if isinstance(graph, Tensor) else ""
        return f"the first element is {type(graph).__name__}, not a Graph{hint}"
    if not isinstance(inputs, dict):
        return f"the second element is {type(inputs).__name__}, not a dict"
    for k in inputs:
        if not isinstance(k, Tensor):
            return f"an inputs key is {type(k).__name__}, not a Tensor"
    return None


def _list_main(args: argparse.Namespace, mode: str) -> int:
    from ggmlpy.testops.families import all_cases, family_counts, perf_cases
    from ggmlpy.testops.runner import select_cases

    cases = perf_cases() if mode == "perf" else all_cases()
    if args.quick:
        cases = [c for c in cases if "large" not in c.tags]
    sel = select_cases(cases, args.op, args.params)
    counts = family_counts(sel)
    if args.json:
        print(json.dumps({"cases": [c.name for c in sel], "family_counts": counts}, indent=1))
        return 0
    for c in sel:
        print(f"  {c.name}")
    for fam, n in sorted(counts.items()):
        print(f"{fam:<20} {n:5d}")
    print(f"{len(sel)} cases")
    return 0


def _kernels_main(args: argparse.Namespace, mode: str) -> int:
    """``--kernels``: per selected case, the registry entry (:meth:`KernelRegistry.select`)
    that computes each of its graph's nodes, with NumPy (CPU, SIM) and with each other array
    module a device here uses (CuPy on CUDA); ``-`` where the node is not supported."""
    import numpy as np

    from ggmlpy.backend import registry
    from ggmlpy.backends.device.backend import AsyncDevice
    from ggmlpy.backends.kernels.registry import REGISTRY
    from ggmlpy.core.graph import Graph
    from ggmlpy.testops.families import all_cases, perf_cases
    from ggmlpy.testops.runner import select_cases

    xps: dict[str, object] = {"numpy": np}
    for d in registry.devices():
        if isinstance(d, AsyncDevice) and d.runtime.xp is not np:
            xps.setdefault(d.runtime.xp.__name__, d.runtime.xp)
    cases = perf_cases() if mode == "perf" else all_cases()
    if args.quick:
        cases = [c for c in cases if "large" not in c.tags]
    rows = []
    for case in select_cases(cases, args.op, args.params):
        _, _, out = case.build_graph()
        g = Graph()
        g.build_forward_expand(out)
        kernels = {}
        for xp_name, xp in xps.items():
            kernels[xp_name] = ", ".join(
                f"{n.op.name}:{REGISTRY.select(n, xp).name if REGISTRY.supports_op(n, xp) else '-'}"
                for n in g.nodes if REGISTRY.entry(n.op) is not None)
        rows.append({"case": case.name, "kernels": kernels})
    if args.json:
        print(json.dumps({"array_modules": list(xps), "cases": rows}, indent=1))
        return 0
    for r in rows:
        print(f"{r['case']}\n    " + "\n    ".join(f"{k}: {v}" for k, v in r["kernels"].items()))
    print(f"{len(rows)} cases")
    return 0


def _run_main(args: argparse.Namespace, mode: str) -> int:
    from ggmlpy.testops.runner import run_tests

    stream = None if args.json else sys.stdout
    if mode == "support":
        stream = None
    report = run_tests(mode, args.backend, args.op, args.params, quick=args.quick,
                       min_time=args.min_time, stream=stream)
    if not report.backends:
        print("test-backend-ops: no backend to test besides the CPU reference (set "
              "GGMLPY_SIM_DEVICES=N or pass -b SIM0; -b CPU tests a second CPU backend)",
              file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json())
    elif mode == "support":
        print(report.support_table(markdown=args.markdown))
    elif mode == "test":
        for line in report.summary_lines():
            print(line)
    return report.exit_code() if mode == "test" else 0


def _graph_main(args: argparse.Namespace) -> int:
    from ggmlpy.backend import registry
    from ggmlpy.backends.cpu.backend import backend_cpu_init
    from ggmlpy.core.tensor import Context
    from ggmlpy.testops.divergence import compare_graph
    from ggmlpy.testops.runner import resolve_backends

    spec = importlib.util.spec_from_file_location("ggmlpy_user_graph", args.graph)
    if spec is None or spec.loader is None:
        print(f"test-backend-ops: cannot load {args.graph!r} (--graph takes a .py file)",
              file=sys.stderr)
        return 2
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except (OSError, SyntaxError) as e:
        print(f"test-backend-ops: {args.graph}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except Exception as e:  # the user's module failed while importing: one line, no traceback
        print(f"test-backend-ops: {args.graph}: importing it raised {type(e).__name__}: "
              f"{' '.join(str(e).split())}", file=sys.stderr)
        return 2
    build = getattr(mod, "build", None)
    if build is None:
        print(f"test-backend-ops: {args.graph}: defines no build(ctx) -> (graph, inputs)",
              file=sys.stderr)
        return 2
    if args.backend:
        chosen = resolve_backends(args.backend)
        if len(chosen) > 2:
            print("test-backend-ops: --graph compares two backends; -b names at most two",
                  file=sys.stderr)
            return 2
        b1 = chosen[0]
        b2 = chosen[1] if len(chosen) == 2 else backend_cpu_init()
    else:
        devs = [d for d in registry.devices() if d.name.upper() != "CPU"]
        if not devs:
            print("test-backend-ops: no backend to compare with the CPU (set GGMLPY_SIM_DEVICES=N "
                  "or pass -b NAME or -b A,B)", file=sys.stderr)
            return 2
        b1, b2 = devs[0].init_backend(), backend_cpu_init()
    if not callable(build):
        print(f"test-backend-ops: {args.graph}: build is {type(build).__name__}, not a function "
              "build(ctx) -> (graph, inputs)", file=sys.stderr)
        return 2
    try:
        result = build(Context(no_alloc=True))
    except Exception as e:  # the user's code: report it as one line, no traceback
        print(f"test-backend-ops: {args.graph}: build(ctx) raised {type(e).__name__}: "
              f"{' '.join(str(e).split())}", file=sys.stderr)
        return 2
    shape_err = _check_build_result(result)
    if shape_err:
        print(f"test-backend-ops: {args.graph}: build(ctx) must return (graph, inputs) with "
              f"inputs a dict {{Tensor: numpy array}}; {shape_err}", file=sys.stderr)
        return 2
    graph, inputs = result
    # the default directory is only created when there is something to save
    save = args.save or os.path.join(tempfile.gettempdir(),
                                     f"ggmlpy-divergence-{os.getpid()}-{int(time.time())}")
    rep = compare_graph(graph, inputs, b1, b2, isolate=not args.no_isolate, save_dir=save)
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(rep), indent=1, default=str))
    else:
        print(rep.summary())
        if rep.diverged and not args.save:
            print(f"  (save directory: {save})")
    return 1 if rep.diverged else 0
