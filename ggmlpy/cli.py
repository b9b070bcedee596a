"""Command line: ``python -m ggmlpy {devices,test-backend-ops,embed,generate,convert,download}``.

Each subcommand lives in its own module and is imported only when used; this module only parses
the first word and dispatches. Exit status 0 on success, 1 on a failed check, 2 on bad usage or an
error the user can fix (the message is one line on stderr).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from ggmlpy.core.check import OneLineArgumentParser, check_str_sequence

__all__ = ["main"]


def _cmd_devices(argv: Sequence[str]) -> int:
    p = OneLineArgumentParser(prog="python -m ggmlpy devices",
                                description="List the devices ggmlpy can use, in priority order.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    from ggmlpy.backend import registry

    rows = []
    for d in registry.devices():
        props = d.get_props()
        caps = props.caps
        rows.append({
            "name": props.name, "description": props.description, "type": props.type.name,
            "memory_free": props.memory_free, "memory_total": props.memory_total,
            "caps": {"async": caps.async_, "host_buffer": caps.host_buffer,
                     "buffer_from_host_ptr": caps.buffer_from_host_ptr, "events": caps.events},
            **({"extra": props.extra} if props.extra else {}),
        })
    # a backend whose reg has no devices says why (CUDA without a driver, a Ray that did not start)
    why = {f.name: registry.reg_unavailable_reason(f.name) for f in registry.factories()}
    why = {name: reason for name, reason in why.items() if reason}
    unknown = registry.unknown_backend_names()
    if args.json:
        print(json.dumps({"devices": rows, **{f"{n.lower()}_unavailable": r for n, r in why.items()},
                          "ignored_in_GGMLPY_BACKENDS": unknown}, indent=2, default=str))
        return 0
    print(f"{'name':<8} {'type':<6} {'free MiB':>10} {'total MiB':>10}  caps  description")
    for r in rows:
        caps = "".join(c if r["caps"][k] else "-" for c, k in
                       (("a", "async"), ("h", "host_buffer"), ("p", "buffer_from_host_ptr"),
                        ("e", "events")))
        print(f"{r['name']:<8} {r['type']:<6} {r['memory_free'] / 2**20:>10.0f} "
              f"{r['memory_total'] / 2**20:>10.0f}  {caps}  {r['description']}")
    print("caps: a=async h=pinned host buffer p=buffer_from_host_ptr e=events")
    for name, reason in why.items():
        print(f"{name}: not available: {reason}")
    if unknown:
        print(f"GGMLPY_BACKENDS: no device named {', '.join(unknown)} (ignored)")
    return 0


def _cmd_test_backend_ops(argv: Sequence[str]) -> int:
    from ggmlpy.testops import main as tbo_main

    return tbo_main(argv)


def _cmd_embed(argv: Sequence[str]) -> int:
    if "--list-devices" in argv:  # llama.cpp's flag: the device table, then exit
        return _cmd_devices([])
    from ggmlpy.models.cli import embed_main

    return embed_main(argv)


def _cmd_generate(argv: Sequence[str]) -> int:
    from ggmlpy.models.llm.cli import generate_main

    return generate_main(argv)


def _cmd_convert(argv: Sequence[str]) -> int:
    from ggmlpy.models.convert_cli import convert_main

    return convert_main(argv)


def _cmd_download(argv: Sequence[str]) -> int:
    from ggmlpy.models.cli import download_main

    return download_main(argv)


_COMMANDS = {
    "devices": (_cmd_devices, "list devices (name, type, memory, caps)"),
    "test-backend-ops": (_cmd_test_backend_ops, "compare ops across backends / time them"),
    "embed": (_cmd_embed, "sentence embeddings with all-MiniLM-L6-v2"),
    "generate": (_cmd_generate, "text generation from a llama.cpp GGUF (gemma3-270m)"),
    "convert": (_cmd_convert, "write a BERT model as GGUF (--type f16, q8_0, q4_k_m, ...)"),
    "download": (_cmd_download, "install a model (all-MiniLM-L6-v2, gemma3-270m)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m ggmlpy`` and the ``ggmlpy`` script; returns the exit status.

    Every ``GGMLPY_*`` variable is validated before the subcommand runs (a bad one: one line
    naming it, exit status 2); set ``GGMLPY_*`` variables ggmlpy does not know are reported as
    ignored on stderr (likely typos). Ctrl-C at any moment gives one line
    (``ggmlpy COMMAND: interrupted``) and exit status 130; ``--version`` prints the version.

    Raises:
        TypeError: ``argv`` is not None or a sequence of str.
    """
    if argv is not None:
        check_str_sequence("argv", argv, "main")
    from ggmlpy.core import sigint

    # Ctrl-C is a KeyboardInterrupt again (the start-up handler is off), held while Numba compiles
    sigint.restore_default()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with sigint.defer_in_compiler():
            return _main(argv)
    except KeyboardInterrupt:
        print(f"ggmlpy {argv[0] if argv else ''}: interrupted".replace("  ", " "), file=sys.stderr)
        return 130


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ggmlpy")
    except PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


def _main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(f"ggmlpy {_version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m ggmlpy COMMAND [ARGS]\n\ncommands:")
        for name, (_, help_) in _COMMANDS.items():
            print(f"  {name:<18} {help_}")
        return 0 if argv else 2
    cmd = _COMMANDS.get(argv[0])
    if cmd is None:
        print(f"ggmlpy: unknown command {argv[0]!r}; try: {', '.join(_COMMANDS)}", file=sys.stderr)
        return 2
    from ggmlpy.core import env
    from ggmlpy.core.errors import GgmlpyError

    try:
        env.validate()
        if env.blas() not in ("auto", "numpy"):  # a named GEMM library must load (exit 2)
            from ggmlpy.backends.cpu import blas as cpu_blas

            cpu_blas.active()
    except env.EnvError as e:
        print(f"ggmlpy {argv[0]}: {e}", file=sys.stderr)
        return 2
    for name in env.unknown_variables():
        print(f"ggmlpy {argv[0]}: {name} is not a ggmlpy variable (ignored); known: "
              f"{', '.join(env.KNOWN)}", file=sys.stderr)
    try:
        return cmd[0](argv[1:])
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except GgmlpyError as e:
        print(f"ggmlpy {argv[0]}: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        if "GGMLPY_" not in str(e):  # a bug, not a setting the user can fix: keep the traceback
            raise
        print(f"ggmlpy {argv[0]}: {e}", file=sys.stderr)
        return 2
