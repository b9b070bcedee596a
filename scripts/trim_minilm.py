"""Write a trimmed copy of all-MiniLM-L6-v2 for a GPU machine that lacks the model package.

Keeps every encoder weight, but only the rows of the word-embedding table that the fixture
sentences use (about 44 MB instead of 90 MB, still exact float32), and writes the fixture beside
it with its token ids remapped to the kept rows. ``scripts/gpu_minilm.py`` runs it.

Usage: ``python scripts/trim_minilm.py OUT_DIR [--fixtures DIR]`` (default fixtures:
``$GGMLPY_FIXTURES`` or ``../shared/fixtures``). Put OUT_DIR under a git-ignored folder (``.carry/``)
and name that folder in the device tool's ``carry``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ggmlpy.models.loader import find_default_model_dir

COPIED = ("config.json", "sentence_bert_config.json", "modules.json", "tokenizer.json",
          "1_Pooling/config.json")


def trim(out_dir: Path, fixtures_dir: Path, model_dir: Path | None = None) -> dict:
    """Write the trimmed model and remapped fixture into ``out_dir``; returns a summary dict."""
    from safetensors.numpy import load_file, save_file

    model_dir = model_dir or find_default_model_dir()
    fixture = json.loads((fixtures_dir / "minilm_public.json").read_text())
    used = sorted({i for seq in fixture["token_ids"] for i in seq})
    remap = {old: new for new, old in enumerate(used)}
    tensors = load_file(str(model_dir / "model.safetensors"))
    key = next(k for k in tensors if k.endswith("embeddings.word_embeddings.weight"))
    tensors[key] = np.ascontiguousarray(tensors[key][used])
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"))
    for name in COPIED:
        src = model_dir / name
        if src.is_file():
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out_dir / name)
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["vocab_size"] = len(used)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    fixture["token_ids"] = [[remap[i] for i in seq] for seq in fixture["token_ids"]]
    fixture["trimmed_vocab_rows"] = used
    (out_dir / "fixture.json").write_text(json.dumps(fixture))
    size = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    return {"out_dir": str(out_dir), "rows_kept": len(used), "bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    default_fx = os.environ.get("GGMLPY_FIXTURES") or str(Path(__file__).resolve().parents[2] / "shared" / "fixtures")
    ap.add_argument("--fixtures", type=Path, default=Path(default_fx))
    args = ap.parse_args()
    print(json.dumps(trim(args.out_dir, args.fixtures)))


if __name__ == "__main__":
    main()
