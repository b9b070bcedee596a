"""Prompt processing and generation speed of ggmlpy's decoder LLM, next to llama.cpp's.

    python scripts/bench_llm.py --model gemma3-270m-q4_k_m.gguf [--threads 2] [--prompt 128]
        [--gen 32] [--rounds 3] [--device CPU] [--ngl 0] [--llama-python /path/to/python]
        [--llama-env OMP_WAIT_POLICY=PASSIVE ...]

Each round evaluates one ``--prompt``-token prompt (BOS then seeded ids; one ``eval``, micro-
batches of 512) and then ``--gen`` greedy one-token steps, and reports tokens per second of each
phase (the model is loaded once; the first round includes compiling and caching, so the median
over rounds is reported too). With ``--llama-python`` (an interpreter that has
llama-cpp-python, e.g. the reference venv) every round also runs the same token ids through
``llama_cpp.Llama`` (same thread count, F32 KV cache as ggmlpy's default, flash attention off) in
a child process, interleaved with ggmlpy's round, and the ratios ggmlpy / llama.cpp are printed.
``--llama-env`` sets environment variables of that child (recorded in the output): on a machine
whose cores are shared with other work, llama.cpp's OpenMP threads spin-wait by default and
lose most of their time to it; ``OMP_WAIT_POLICY=PASSIVE`` makes them sleep instead.

``GGMLPY_WEIGHT_CACHE_MB`` defaults to 2048 here (float32 copies of every weight stay cached:
the Gemma 3 270M output matrix alone is 671 MB as float32); the value used is in the output.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

_CHILD = r"""
import json, sys, time
import llama_cpp
args = json.loads(sys.argv[1])
llm = llama_cpp.Llama(args["model"], n_ctx=args["n_ctx"], n_threads=args["threads"],
                      n_batch=512, n_ubatch=512, verbose=False, type_k=0, type_v=0,
                      flash_attn=False)
ids = args["ids"]
t = time.perf_counter(); llm.eval(ids); pp = time.perf_counter() - t
import numpy as np
tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
t = time.perf_counter()
for _ in range(args["gen"]):
    llm.eval([tok]); tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
tg = time.perf_counter() - t
print(json.dumps({"pp_s": pp, "tg_s": tg}))
"""


def _llama_cpp_round(python: str, model: str, ids: list[int], gen: int, threads: int,
                     n_ctx: int, env: dict[str, str]) -> dict:
    arg = json.dumps({"model": model, "ids": ids, "gen": gen, "threads": threads, "n_ctx": n_ctx})
    out = subprocess.run([python, "-c", _CHILD, arg], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="CPU")
    p.add_argument("--ngl", type=int, default=0)
    p.add_argument("--llama-python", default=None)
    p.add_argument("--llama-env", action="append", default=[], metavar="KEY=VALUE")
    a = p.parse_args(argv)
    llama_env = dict(kv.split("=", 1) for kv in a.llama_env)
    os.environ.setdefault("GGMLPY_WEIGHT_CACHE_MB", "2048")
    from ggmlpy.models.llm.model import LLM

    n_ctx = a.prompt + a.gen + 8
    t0 = time.perf_counter()
    m = LLM.load(a.model, device=a.device, n_gpu_layers=a.ngl, n_threads=a.threads, n_ctx=n_ctx)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    ids = [2] + rng.integers(1000, min(20000, m.hp.n_vocab), a.prompt - 1).tolist()
    rows = []
    for _ in range(a.rounds):
        m.clear()
        t = time.perf_counter()
        logits = m.eval(ids)
        pp = time.perf_counter() - t
        tok = int(np.argmax(logits))
        t = time.perf_counter()
        for _ in range(a.gen):
            tok = int(np.argmax(m.eval([tok])))
        tg = time.perf_counter() - t
        row = {"ggmlpy_pp_tok_s": a.prompt / pp, "ggmlpy_tg_tok_s": a.gen / tg}
        if a.llama_python:
            r = _llama_cpp_round(a.llama_python, a.model, ids, a.gen, a.threads, n_ctx, llama_env)
            row["llama_cpp_pp_tok_s"] = a.prompt / r["pp_s"]
            row["llama_cpp_tg_tok_s"] = a.gen / r["tg_s"]
        rows.append(row)
    m.close()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    if a.llama_python:
        med["ratio_pp"] = med["ggmlpy_pp_tok_s"] / med["llama_cpp_pp_tok_s"]
        med["ratio_tg"] = med["ggmlpy_tg_tok_s"] / med["llama_cpp_tg_tok_s"]
    print(json.dumps({"model": os.path.basename(a.model), "threads": a.threads,
                      "prompt_tokens": a.prompt, "gen_tokens": a.gen, "device": a.device,
                      "ngl": a.ngl, "load_s": load_s,
                      "weight_cache_mb": os.environ["GGMLPY_WEIGHT_CACHE_MB"],
                      "llama_env": llama_env, "load_average": os.getloadavg(),
                      "rounds": rows, "median": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
