"""Write llama.cpp's embeddings of MiniLM GGUF files for ggmlpy's regression test.

Reference tool only: it runs under the reference venv (llama-cpp-python and gguf, named by
``$GGMLPY_REF_PYTHON``; see tests/data/README.md), never under ggmlpy's, and ggmlpy never
imports it. ``tests/models/test_minilm_llamacpp_ref.py`` reads its output, never llama.cpp.

Inputs: GGUF files of all-MiniLM-L6-v2 written by ``python -m ggmlpy convert MODEL --type T``
(f32 and q8_0), and the sentences of the public fixture (``../shared/fixtures/minilm_public.json``)
with at most 256 tokens (ggmlpy cuts longer ones at the model's 256, llama.cpp at its context).

Output (``--out``, default ``tests/data/minilm_llamacpp.npz``), per file type ``T``:

- ``T_embeddings``: float32 ``[n, 384]``, llama.cpp's sentence embedding of each sentence:
  ``Llama(file, embedding=True, pooling_type=1)`` (mean pooling, the model's), one
  ``Llama.embed(sentence)`` per sentence, L2-normalised here in float64 (what
  ``scripts/bench_minilm_gguf.py`` compares);
- ``T_token_ids``: int32 ``[n, 256]``, llama.cpp's tokenization of each sentence
  (``Llama.tokenize(add_bos=True)``, [CLS] ... [SEP]), padded with -1;
- ``T_weights_sha256``: sha256 over every tensor's name and raw bytes in file order, so the test
  can check that its own conversion made the same weights;

plus ``sentences`` (the texts) and ``meta`` (a JSON string: tool, version, build flags, system
info, settings, the files' sha256).

Settings: llama-cpp-python (version in ``meta``; llama.cpp built from its vendored source with
``-mno-amx-tile -mno-amx-int8 -mno-amx-bf16``, GGML_NATIVE default), CPU only,
``n_threads = n_threads_batch = 2``, ``n_ctx = 512``, flash attention off (llama-cpp-python's
default), ``embedding=True``, ``pooling_type=1``.

Rerun::

    python -m ggmlpy convert MODEL_DIR --type f32 -o minilm-f32.gguf
    python -m ggmlpy convert MODEL_DIR --type q8_0 -o minilm-q8_0.gguf
    $GGMLPY_REF_PYTHON scripts/make_minilm_llamacpp_reference.py \
        --f32 minilm-f32.gguf --q8_0 minilm-q8_0.gguf [--out tests/data/minilm_llamacpp.npz]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT.parent / "shared" / "fixtures" / "minilm_public.json"
MAX_TOKENS = 256
N_THREADS = 2
N_CTX = 512
BUILD_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 (CMAKE_C_FLAGS/CMAKE_CXX_FLAGS)"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_sha256(path: Path) -> str:
    """sha256 over ``name`` + raw bytes of every tensor in file order (gguf-py's reader)."""
    import gguf

    h = hashlib.sha256()
    for t in gguf.GGUFReader(path).tensors:
        h.update(t.name.encode())
        h.update(np.ascontiguousarray(t.data).view(np.uint8).tobytes())
    return h.hexdigest()


def embed(path: Path, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from llama_cpp import Llama

    llm = Llama(str(path), embedding=True, n_ctx=N_CTX, n_threads=N_THREADS,
                n_threads_batch=N_THREADS, verbose=False, pooling_type=1)
    emb, ids = [], np.full((len(sentences), MAX_TOKENS), -1, np.int32)
    for i, s in enumerate(sentences):
        v = np.asarray(llm.embed(s), np.float64)
        emb.append((v / np.linalg.norm(v)).astype(np.float32))
        t = llm.tokenize(s.encode(), add_bos=True)
        ids[i, :len(t)] = t
    llm.close()
    return np.stack(emb), ids


def main() -> int:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--f32", type=Path, required=True)
    ap.add_argument("--q8_0", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "minilm_llamacpp.npz")
    a = ap.parse_args()
    fx = json.loads(FIXTURE.read_text())
    keep = [i for i, c in enumerate(fx["untruncated_token_counts"]) if c <= MAX_TOKENS]
    sentences = [fx["sentences"][i] for i in keep]
    out: dict[str, np.ndarray] = {"sentences": np.asarray(sentences)}
    files = {}
    for t, path in (("f32", a.f32), ("q8_0", a.q8_0)):
        out[f"{t}_embeddings"], out[f"{t}_token_ids"] = embed(path, sentences)
        out[f"{t}_weights_sha256"] = np.asarray(weights_sha256(path))
        files[t] = {"file": path.name, "sha256": sha256_file(path),
                    "made_by": f"python -m ggmlpy convert MODEL --type {t}"}
    meta = {"tool": "llama-cpp-python", "llama_cpp_python_version": llama_cpp.__version__,
            "llama_cpp_build_flags": BUILD_FLAGS,
            "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "n_threads": N_THREADS, "n_ctx": N_CTX, "flash_attn": False, "embedding": True,
            "pooling_type": 1, "normalised": "L2 in float64, stored float32",
            "sentences": f"fixture minilm_public.json, untruncated_token_counts <= {MAX_TOKENS}",
            "files": files, "script": "scripts/make_minilm_llamacpp_reference.py"}
    out["meta"] = np.asarray(json.dumps(meta))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(a.out, **out)
    print(f"{a.out}: {len(sentences)} sentences, {a.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
