"""all-MiniLM-L6-v2 from a q8_0 GGUF against the f32 GGUF: ggmlpy's speed ratio, and how close
its embeddings are to llama.cpp's embedding of the same files; JSON on stdout.

    python scripts/bench_minilm_gguf.py [--dir DIR] [--repeats 5] [--threads 2]
        [--llama-python $GGMLPY_REF_PYTHON] [--types f32,q8_0]

* Files: ``python -m ggmlpy convert MODEL --type T`` of the installed model into ``--dir``
  (kept there; made once).
* Sentences: the public fixture (``../shared/fixtures/minilm_public.json``) with at most 256
  tokens, each encoded by ggmlpy's ``BertModel.encode`` (batched as it batches) on the CPU
  backend with ``--threads`` threads; ``--repeats`` timed rounds alternate the files (f32, q8_0,
  f32, ...) after one warm-up call each; ``sentences_per_s`` is the best round, ``ratio`` the
  q8_0 rate over the f32 rate (best rounds), ``ratio_median`` the median over the rounds of each
  round's ratio (the two files timed back to back); the load average at the start and the end.
* llama.cpp: a worker under ``--llama-python`` (llama-cpp-python) embeds every sentence with
  ``Llama(file, embedding=True, pooling_type=1)`` (mean pooling, the model's), normalized;
  ``max_abs_vs_llama_cpp`` is the largest absolute difference of any component, and
  ``max_abs_vs_st`` of each tool against the fixture's sentence-transformers embeddings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT.parent / "shared" / "fixtures" / "minilm_public.json"
MAX_TOKENS = 256

_WORKER = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
path, sentences, threads = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
llm = Llama(path, embedding=True, n_ctx=512, n_threads=threads, verbose=False, pooling_type=1)
out = []
for s in sentences:
    v = np.asarray(llm.embed(s), np.float64)
    out.append((v / np.linalg.norm(v)).tolist())
json.dump(out, sys.stdout)
"""


def _files(d: Path, types: list[str]) -> dict[str, Path]:
    from ggmlpy.models.loader import find_default_model_dir

    d.mkdir(parents=True, exist_ok=True)
    model = find_default_model_dir()
    out = {}
    for t in types:
        p = d / f"minilm-{t}.gguf"
        if not p.exists():
            subprocess.run([sys.executable, "-m", "ggmlpy", "convert", str(model), "--type", t,
                            "-o", str(p)], check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        out[t] = p
    return out


def _llama(python: str, path: Path, sentences: list[str], threads: int, tmp: Path) -> np.ndarray:
    sp = tmp / "sentences.json"
    sp.write_text(json.dumps(sentences))
    r = subprocess.run([python, "-c", _WORKER, str(path), str(sp), str(threads)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp worker failed: {r.stderr.strip().splitlines()[-1:]}")
    return np.asarray(json.loads(r.stdout), np.float64)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "ggmlpy_minilm_gguf")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default="f32,q8_0")
    ap.add_argument("--llama-python", default=os.environ.get("GGMLPY_REF_PYTHON", sys.executable))
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from ggmlpy.models.bert import BertModel

    types = a.types.split(",")
    files = _files(a.dir, types)
    fx = json.loads(FIXTURE.read_text())
    keep = [i for i, c in enumerate(fx["untruncated_token_counts"]) if c <= MAX_TOKENS]
    sentences = [fx["sentences"][i] for i in keep]
    st = np.asarray(fx["embeddings"], np.float64)[keep]
    models = {t: BertModel.load(str(files[t]), n_threads=a.threads) for t in types}
    emb = {t: np.asarray(m.encode(sentences), np.float64) for t, m in models.items()}  # warm-up
    best = {t: float("inf") for t in types}
    rounds: list[dict[str, float]] = []
    load_start = os.getloadavg()
    for _ in range(a.repeats):
        rounds.append({})
        for t, m in models.items():
            t0 = time.perf_counter()
            m.encode(sentences)
            rounds[-1][t] = time.perf_counter() - t0
            best[t] = min(best[t], rounds[-1][t])
    for m in models.values():
        m.close()
    res: dict = {"sentences": len(sentences), "threads": a.threads, "repeats": a.repeats,
                 "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "files": {}}
    for t in types:
        ref = _llama(a.llama_python, files[t], sentences, a.threads, a.dir)
        res["files"][t] = {"path": str(files[t]), "sentences_per_s": len(sentences) / best[t],
                           "max_abs_vs_llama_cpp": float(np.abs(emb[t] - ref).max()),
                           "max_abs_vs_st": float(np.abs(emb[t] - st).max()),
                           "llama_cpp_max_abs_vs_st": float(np.abs(ref - st).max())}
    if "f32" in best and "q8_0" in best:
        res["ratio_q8_0_vs_f32"] = best["f32"] / best["q8_0"]
        res["ratio_median"] = float(np.median([r["f32"] / r["q8_0"] for r in rounds]))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
