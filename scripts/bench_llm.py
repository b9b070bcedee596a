"""ggmlpy's decoder LLM next to llama.cpp (llama-cpp-python) on one GGUF, interleaved; JSON out.

    python scripts/bench_llm.py [--model gemma3-270m|FILE.gguf] [--rounds 3] [--threads 2]
        [--llama-python $GGMLPY_REF_PYTHON] [--device CPU --ngl 0] [--gen 64]
        [--weight-cache-mb MB] [--reference llama_cpp|stub] [--llama-env OMP_WAIT_POLICY=PASSIVE]

Each round starts one fresh process per tool (ggmlpy's under this interpreter, llama.cpp's
under ``--llama-python``, which must have ``llama_cpp``; the two alternate, ggmlpy first), and
each process measures, in this order, with ``--threads`` threads, ``n_batch = n_ubatch = 512``,
an F32 KV cache of 1024 cells and greedy sampling (the arg max of the last logits):

* ``load_s``: the model load (ggmlpy ``LLM.load``; llama.cpp ``Llama(...)``), and
  ``rss_load_mib``: the process's resident set (``VmRSS``) right after it;
* ``first_token_ms``: a 16-token prompt decoded and its first token picked, right after load;
* ``pp128_tok_s``, ``pp512_tok_s``: a 128- and a 512-token prompt, each on a cleared cache;
* ``tg_tok_s``: ``--gen`` one-token decode steps after a 16-token prompt, and
  ``rss_gen_mib``: the largest ``VmRSS`` seen after any of those steps.

The prompts are BOS followed by seeded ids (the same for both tools). The medians over the
rounds are compared as ratios ggmlpy / llama.cpp and checked against the targets
(``targets``: ``pp512 >= 1.0x``, ``generation >= 0.5x``, ``load <= 1 s``, ``first token <=
2x`` llama.cpp's time, ``RSS during generation <= file + KV cache + 300 MiB``), each with its
value, limit and ``pass``. ``--reference stub`` replaces llama.cpp with fixed figures (to test
this script without llama-cpp-python). ``--weight-cache-mb`` sets ``GGMLPY_WEIGHT_CACHE_MB``
for ggmlpy's process (unset: ggmlpy's default); the value used is in the output.
``--llama-env KEY=VALUE`` (repeatable) sets variables of llama.cpp's process, recorded in the
output: on cores shared with other work llama.cpp's OpenMP threads spin-wait by default and lose
most of their time to it; ``OMP_WAIT_POLICY=PASSIVE`` makes them sleep instead.

Byte code: before the rounds, ggmlpy's modules are compiled into ``__pycache__`` (what any
``pip install`` leaves, and what a checkout gets on its first import unless
``PYTHONDONTWRITEBYTECODE`` is set), so that the load time does not include compiling ggmlpy's
sources in every process; ``--no-compile`` skips that (``bytecode`` in the output).

``--worker ggmlpy|llama_cpp|stub`` is the child side: it runs one round and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
N_CTX = 1024
N_BATCH = 512
FIRST_PROMPT = 16
PP_SIZES = (128, 512)
RSS_SLACK_MIB = 300.0
#: target name -> (metric, comparison, limit)
TARGETS = {
    "pp512_vs_llama_cpp": ("ratio_pp512", ">=", 1.0),
    "generation_vs_llama_cpp": ("ratio_tg", ">=", 0.5),
    "load_s": ("ggmlpy_load_s", "<=", 1.0),
    "first_token_vs_llama_cpp": ("ratio_first_token_time", "<=", 2.0),
    "rss_during_generation_mib": ("ggmlpy_rss_gen_mib", "<=", None),  # file + KV + slack
}


def _rss_mib() -> float:
    """This process's resident set size (``VmRSS`` of /proc/self/status) in MiB."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS line in /proc/self/status")


def prompt_ids(n: int, bos: int | None, n_vocab: int) -> list[int]:
    """BOS (when the vocabulary has one) then seeded ids in ``[lo, hi)`` of the vocabulary,
    ``n`` ids in all (the same list for every tool and round)."""
    import numpy as np

    lo, hi = min(1000, n_vocab // 4), min(20000, n_vocab)
    rest = np.random.default_rng(0).integers(lo, hi, n).tolist()
    return ([bos] + rest)[:n] if bos is not None else rest


class _GgmlpyModel:
    def __init__(self, path: str, threads: int, device: str, ngl: int) -> None:
        from ggmlpy.core.types import Type
        from ggmlpy.models.llm.model import LLM

        self.m = LLM.load(path, device=device, n_gpu_layers=ngl, n_threads=threads,
                          n_ctx=N_CTX, n_ubatch=N_BATCH, type_k=Type.F32, type_v=Type.F32)
        hp = self.m.hp
        self.n_vocab = hp.n_vocab
        self.bos = self.m.tokenizer.bos_id if self.m.tokenizer is not None else None
        self.kv_mib = (hp.n_layer * self.m.kv.n_ctx * hp.n_head_kv
                       * (hp.head_dim_k + hp.head_dim_v) * 4) / 2**20

    def reset(self) -> None:
        self.m.clear()

    def eval_argmax(self, ids: list[int]) -> int:
        import numpy as np

        last = None
        for i in range(0, len(ids), N_BATCH):
            last = self.m.eval(ids[i:i + N_BATCH])
        return int(np.argmax(last))


class _LlamaCppModel:
    def __init__(self, path: str, threads: int, device: str, ngl: int) -> None:
        import llama_cpp

        self.m = llama_cpp.Llama(path, n_ctx=N_CTX, n_threads=threads, n_batch=N_BATCH,
                                 n_ubatch=N_BATCH, n_gpu_layers=ngl, verbose=False, type_k=0,
                                 type_v=0)
        self.n_vocab = self.m.n_vocab()
        bos = self.m.token_bos()
        self.bos = None if bos < 0 else bos
        self.kv_mib = None

    def reset(self) -> None:
        self.m.reset()

    def eval_argmax(self, ids: list[int]) -> int:
        import numpy as np

        self.m.eval(ids)
        return int(np.argmax(self.m.scores[self.m.n_tokens - 1]))


def _stub_round() -> dict:
    """Fixed figures standing in for llama.cpp (tests of this script)."""
    return {"tool": "stub", "load_s": 0.25, "rss_load_mib": 300.0, "first_token_ms": 50.0,
            "pp128_tok_s": 1000.0, "pp512_tok_s": 900.0, "tg_tok_s": 100.0,
            "rss_gen_mib": 320.0, "kv_mib": None}


def worker(kind: str, path: str, threads: int, gen: int, device: str, ngl: int) -> dict:
    """One round of one tool in this process (see the module doc); returns its figures."""
    if kind == "stub":
        return _stub_round()
    if kind == "ggmlpy":
        sys.path.insert(0, str(ROOT))
    cls = _GgmlpyModel if kind == "ggmlpy" else _LlamaCppModel
    t = time.perf_counter()
    m = cls(path, threads, device, ngl)
    out: dict = {"tool": kind, "load_s": time.perf_counter() - t, "rss_load_mib": _rss_mib(),
                 "kv_mib": m.kv_mib}
    short = prompt_ids(FIRST_PROMPT, m.bos, m.n_vocab)
    t = time.perf_counter()
    m.eval_argmax(short)
    out["first_token_ms"] = (time.perf_counter() - t) * 1e3
    for n in PP_SIZES:
        ids = prompt_ids(n, m.bos, m.n_vocab)
        m.reset()
        t = time.perf_counter()
        m.eval_argmax(ids)
        out[f"pp{n}_tok_s"] = n / (time.perf_counter() - t)
    m.reset()
    tok = m.eval_argmax(short)
    rss = _rss_mib()
    t = time.perf_counter()
    for _ in range(gen):
        tok = m.eval_argmax([tok])
        rss = max(rss, _rss_mib())
    out["tg_tok_s"] = gen / (time.perf_counter() - t)
    out["rss_gen_mib"] = rss
    return out


def _child(python: str, kind: str, a: argparse.Namespace, env: dict | None) -> dict:
    cmd = [python, os.path.abspath(__file__), "--worker", kind, "--model", a.model_path,
           "--threads", str(a.threads), "--gen", str(a.gen), "--device", a.device,
           "--ngl", str(a.ngl)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{kind} worker failed (exit {r.returncode}): "
                           f"{r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def summarize(rows_g: list[dict], rows_l: list[dict], file_mib: float) -> dict:
    """Medians of each tool's rounds, the ratios ggmlpy / llama.cpp (for the first token:
    ggmlpy's time / llama.cpp's time) and the targets' verdicts."""
    keys = ("load_s", "rss_load_mib", "first_token_ms", "pp128_tok_s", "pp512_tok_s",
            "tg_tok_s", "rss_gen_mib")
    med = {}
    for prefix, rows in (("ggmlpy", rows_g), ("llama_cpp", rows_l)):
        for k in keys:
            med[f"{prefix}_{k}"] = statistics.median(r[k] for r in rows)
    kv = rows_g[0]["kv_mib"]
    med["ratio_pp128"] = med["ggmlpy_pp128_tok_s"] / med["llama_cpp_pp128_tok_s"]
    med["ratio_pp512"] = med["ggmlpy_pp512_tok_s"] / med["llama_cpp_pp512_tok_s"]
    med["ratio_tg"] = med["ggmlpy_tg_tok_s"] / med["llama_cpp_tg_tok_s"]
    med["ratio_first_token_time"] = med["ggmlpy_first_token_ms"] / med["llama_cpp_first_token_ms"]
    med["ratio_load_time"] = med["ggmlpy_load_s"] / med["llama_cpp_load_s"]
    targets = {}
    for name, (metric, op, limit) in TARGETS.items():
        if limit is None:
            limit = file_mib + kv + RSS_SLACK_MIB
        value = med[metric]
        ok = value >= limit if op == ">=" else value <= limit
        targets[name] = {"metric": metric, "value": value, "op": op, "limit": limit, "pass": ok}
    return {"median": med, "kv_cache_mib": kv, "targets": targets,
            "all_pass": all(t["pass"] for t in targets.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--device", default="CPU")
    p.add_argument("--ngl", type=int, default=0)
    p.add_argument("--llama-python", default=os.environ.get("GGMLPY_REF_PYTHON", sys.executable))
    p.add_argument("--reference", choices=("llama_cpp", "stub"), default="llama_cpp")
    p.add_argument("--weight-cache-mb", default=None)
    p.add_argument("--llama-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--worker", choices=("ggmlpy", "llama_cpp", "stub"), default=None)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker, a.model, a.threads, a.gen, a.device, a.ngl)))
        return 0
    sys.path.insert(0, str(ROOT))
    from ggmlpy.models.llm.download import resolve_model

    a.model_path = str(resolve_model(a.model))
    env = dict(os.environ)
    if a.weight_cache_mb is not None:
        env["GGMLPY_WEIGHT_CACHE_MB"] = str(a.weight_cache_mb)
    llama_env = dict(os.environ)
    for kv in a.llama_env:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            p.error(f"--llama-env {kv!r}: expected KEY=VALUE")
        llama_env[key] = value
    if not a.no_compile:
        import compileall

        compileall.compile_dir(str(ROOT / "ggmlpy"), quiet=1)
    rows_g, rows_l = [], []
    for _ in range(a.rounds):
        rows_g.append(_child(sys.executable, "ggmlpy", a, env))
        ref_python = a.llama_python if a.reference == "llama_cpp" else sys.executable
        rows_l.append(_child(ref_python, a.reference, a, llama_env))
    file_mib = Path(a.model_path).stat().st_size / 2**20
    doc = {"model": os.path.basename(a.model_path), "file_mib": file_mib, "threads": a.threads,
           "n_batch": N_BATCH, "n_ubatch": N_BATCH, "n_ctx": N_CTX, "gen_tokens": a.gen,
           "first_prompt_tokens": FIRST_PROMPT, "device": a.device, "ngl": a.ngl,
           "reference": a.reference, "llama_env": a.llama_env, "bytecode": not a.no_compile,
           "weight_cache_mb": env.get("GGMLPY_WEIGHT_CACHE_MB", "default"),
           "rounds": {"ggmlpy": rows_g, "llama_cpp": rows_l},
           **summarize(rows_g, rows_l, file_mib)}
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
