#!/usr/bin/env python3
"""Benchmark ggmlpy's GGUF tokenizer against llama.cpp's (llama-cpp-python); prints one JSON object.

Workload: every string of a reference file (``--strings``, default
``tests/data/gemma3_tokenizer.json``), tokenized in llama.cpp's two test modes
(add_special=True/parse_special=False and add_special=False/parse_special=True), ``--reps`` passes
per round. Contenders, **interleaved** round by round (``--rounds``):

- ``ggmlpy``: ``Tokenizer.from_gguf_metadata`` on the file's metadata (read once with gguf-py
  before timing; ``build_s`` is the best build time of the rounds) and ``Tokenizer.encode``;
- ``llama_cpp``: run in the reference interpreter (``--ref-python``, a venv with llama-cpp-python;
  never a dependency of ggmlpy) as a subprocess per round: ``Llama(path, vocab_only=True)``
  (``load_s`` includes reading the file) and ``Llama.tokenize`` (what a user calls; it includes the
  binding's ctypes overhead), plus the bare ``llama_cpp.llama_tokenize`` ctypes call with a
  preallocated buffer (``raw``).

Reported: microseconds per string per mode (best round) for each contender, the ratios
``llama_cpp / ggmlpy`` (> 1: ggmlpy is faster), and whether every id list agreed.

Usage: ``python scripts/bench_llm_tokenizer.py --gguf FILE [--strings JSON] [--rounds 5] [--reps 3]
[--ref-python $GGMLPY_REF_PYTHON]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_WORKER = r"""
import ctypes, json, sys, time
import llama_cpp
from llama_cpp import Llama
path, strings_file, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
strings = [s.encode("utf-8") for s in json.load(open(strings_file))]
t0 = time.perf_counter()
m = Llama(path, vocab_only=True, verbose=False)
load_s = time.perf_counter() - t0
vocab = llama_cpp.llama_model_get_vocab(m.model)
buf = (llama_cpp.llama_token * 65536)()
modes = ((True, False), (False, True))
ids = [[m.tokenize(s, add_bos=a, special=p) for s in strings] for a, p in modes]
best = {}
for name in ("tokenize", "raw"):
    t = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for a, p in modes:
            if name == "tokenize":
                for s in strings:
                    m.tokenize(s, add_bos=a, special=p)
            else:
                for s in strings:
                    llama_cpp.llama_tokenize(vocab, s, len(s), buf, 65536, a, p)
        t = min(t, time.perf_counter() - t0)
    best[name] = t
print(json.dumps({"load_s": load_s, "tokenize_s": best["tokenize"], "raw_s": best["raw"], "ids": ids,
                  "version": llama_cpp.__version__}))
"""


def _read_metadata(path: str) -> dict:
    import numpy as np
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    meta: dict = {}
    for key, f in reader.fields.items():
        if not key.startswith(("tokenizer.", "general.")):
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            if f.types[-1] == GGUFValueType.STRING:
                meta[key] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                meta[key] = np.concatenate([f.parts[i] for i in f.data]) if f.data else np.array([])
        elif f.types[0] == GGUFValueType.STRING:
            meta[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            meta[key] = f.parts[f.data[0]].tolist()[0]
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    default_strings = Path(__file__).resolve().parent.parent / "tests/data/gemma3_tokenizer.json"
    ap.add_argument("--strings", default=str(default_strings))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ref-python", default=os.environ.get("GGMLPY_REF_PYTHON", sys.executable))
    args = ap.parse_args()

    from ggmlpy.models.llm.tokenizer import Tokenizer

    cases = json.loads(Path(args.strings).read_text(encoding="utf-8"))["cases"]
    strings = [c["text"] for c in cases]
    tmp = Path("/tmp") / f"bench_llm_tokenizer_{id(strings)}.json"
    tmp.write_text(json.dumps(strings), encoding="utf-8")
    t0 = time.perf_counter()
    meta = _read_metadata(args.gguf)
    read_s = time.perf_counter() - t0
    modes = ((True, False), (False, True))
    ours = {"build_s": float("inf"), "encode_s": float("inf")}
    ref = {"load_s": float("inf"), "tokenize_s": float("inf"), "raw_s": float("inf")}
    agree = True
    version = None
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        tok = Tokenizer.from_gguf_metadata(meta)
        ours["build_s"] = min(ours["build_s"], time.perf_counter() - t0)
        got = [[tok.encode(s, a, p) for s in strings] for a, p in modes]  # warm-up (lazy tables)
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for a, p in modes:
                for s in strings:
                    tok.encode(s, a, p)
            best = min(best, time.perf_counter() - t0)
        ours["encode_s"] = min(ours["encode_s"], best)
        out = subprocess.run([args.ref_python, "-c", _WORKER, args.gguf, str(tmp), str(args.reps)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        version = r["version"]
        for k in ref:
            ref[k] = min(ref[k], r[k])
        agree = agree and r["ids"] == got
    tmp.unlink(missing_ok=True)
    n = 2 * len(strings)
    us = lambda s: round(s / n * 1e6, 2)  # noqa: E731
    print(json.dumps({
        "gguf": args.gguf, "n_strings": len(strings), "modes": 2, "rounds": args.rounds, "reps": args.reps,
        "llama_cpp_python": version, "metadata_read_s_gguf_py": round(read_s, 3),
        "ggmlpy": {"build_s": round(ours["build_s"], 4), "us_per_string": us(ours["encode_s"])},
        "llama_cpp": {"load_vocab_only_s": round(ref["load_s"], 4),
                      "us_per_string_tokenize": us(ref["tokenize_s"]),
                      "us_per_string_raw_ctypes": us(ref["raw_s"])},
        "ratio_llama_cpp_tokenize_over_ggmlpy": round(ref["tokenize_s"] / ours["encode_s"], 3),
        "ratio_llama_cpp_raw_over_ggmlpy": round(ref["raw_s"] / ours["encode_s"], 3),
        "ids_identical": agree,
    }, indent=1))


if __name__ == "__main__":
    sys.exit(main())
