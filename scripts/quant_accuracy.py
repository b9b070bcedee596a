"""Accuracy of MiniLM converted to GGUF per type scheme, against the F32 safetensors model, as
JSON on stdout: per scheme the minimum cosine and the maximum absolute difference of the
embeddings over the fixture sentences (``$GGMLPY_FIXTURES`` or ../shared/fixtures,
minilm_public.json), the GGUF file size and the bytes of the weights buffers, and the tensor
types the scheme chose. Also the fixture's own embeddings vs the F32 model (sanity: ~1e-7).
The GGUF files run with the erf GELU of the F32 model (``gelu="erf"``; a ``.gguf`` file runs
llama.cpp's tanh GELU by default, 2.8e-4 away), so the numbers are the quantization's alone.

    python scripts/quant_accuracy.py [--schemes f16,q8_0,...] [--device CPU]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggmlpy.models.bert import BertModel
from ggmlpy.models.gguf_bert import SCHEMES, convert
from ggmlpy.models.loader import find_default_model_dir


def fixture_sentences() -> tuple[list[str], np.ndarray]:
    """The fixture sentences and their sentence-transformers embeddings."""
    root = os.environ.get("GGMLPY_FIXTURES") or Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
    path = Path(root) / "minilm_public.json"
    if not path.is_file():
        sys.exit(f"quant_accuracy.py: no fixture file {path}; set GGMLPY_FIXTURES to the folder "
                 "holding minilm_public.json")
    d = json.loads(path.read_text())
    return list(d["sentences"]), np.asarray(d["embeddings"], np.float64)


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """Per-sentence cosine (min) and max |a - b| of two embedding matrices (n, dim)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cos = (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))
    return {"cos_min": float(cos.min()), "max_abs": float(np.abs(a64 - b64).max())}


def measure(scheme: str, sentences: list[str], ref: np.ndarray, tmp: Path, device: str) -> dict:
    """Convert with ``scheme``, embed ``sentences`` from the GGUF, compare with ``ref``."""
    path = tmp / f"minilm-{scheme}.gguf"
    info = convert(find_default_model_dir(), path, scheme)
    with BertModel.load(path, device=device, n_gpu_layers=-1 if device != "CPU" else 0,
                        gelu="erf") as m:
        emb = m.encode(sentences)
        weights = sum(b.size for b in m._weight_bufs)
    return {"scheme": scheme, **compare(emb, ref), "file_bytes": info["bytes"],
            "weights_bytes": int(weights), "types": info["types"]}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--device", default="CPU")
    a = ap.parse_args()
    sentences, fixture = fixture_sentences()
    with BertModel.load(None) as m:
        ref = m.encode(sentences)
        ref_bytes = sum(b.size for b in m._weight_bufs)
    out = {"sentences": len(sentences), "device": a.device,
           "safetensors_f32": {**compare(ref, fixture), "weights_bytes": int(ref_bytes),
                               "vs": "sentence-transformers fixture"},
           "schemes": []}
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.schemes.split(","):
            out["schemes"].append(measure(s, sentences, ref, Path(tmp), a.device))
            print(json.dumps(out["schemes"][-1]), file=sys.stderr)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
