"""Quantize/dequantize throughput per type, MUL_MAT throughput per weight type on the CPU
backend next to F32, and MiniLM sentences/s per GGUF type scheme, as JSON on stdout.

* ``quant``: MB/s counts the float32 side (4 bytes per element, 1 MB = 1e6 bytes) on one CPU
  thread: a ``--rows`` x ``--cols`` standard-normal matrix, best of ``--repeat`` runs. ``source``
  says whose code runs (``gguf`` = gguf-py's gguf.quants, ``ggmlpy`` = ggmlpy.quants.kquants /
  ggmlpy's F16/BF16 rules).
* ``mul_mat``: one MUL_MAT node ``[K, M] x [K, N]`` per MiniLM shape (K, M) in (384, 384),
  (384, 1536), (1536, 384) and N in 1, 32, 1024 tokens on the CPU backend, the weight in a
  WEIGHTS buffer: microseconds per call (best of ``--repeat`` round-robin rounds of >= 50 ms
  each, all cases of one (shape, N) interleaved), GFLOP/s
  (2*M*N*K per call) and ``vs_f32``, the time relative to the F32 weight. Each non-F32 type
  runs with the float32 weight cache on (``cache: on``, default budget) and off (``off``:
  ``GGMLPY_WEIGHT_CACHE_MB=0``, the per-call row-block conversion, which is what every call did
  before the cache).
* ``minilm``: ``python -m ggmlpy convert`` per scheme (``--schemes``), then sentences/s
  embedding ``--sentences`` seeded sentences of 5-40 words (batches of 32) on the CPU, best of
  ``--repeat``, ``time_vs_<first scheme>``; the latency of encoding one sentence (``one_sentence_ms``,
  the first sentence, mean over >= 0.3 s, best of ``--repeat``) and its ratio; the weights
  buffer bytes and the weight cache's bytes;
  non-F32 schemes with the cache on and off. ``--no-minilm`` skips it (needs the model package).

* ``vs_ggml`` (``--vs-ggml``): the per-type table against ggml's own CPU MUL_MAT on the Gemma 3
  shapes at 1 and 512 tokens (ggmlpy ms, ggml ms, ratio, weight GB/s of each, fraction of the
  bandwidth measured in the run), from ``scripts/bench_qmatmul.py`` run in its own process.

    python scripts/bench_quant.py [--rows 1024] [--cols 1024] [--repeat 3] [--no-minilm]
        [--no-quant] [--mm-types F16,BF16,Q8_0,Q4_0] [--schemes safetensors,f32,f16,...]
        [--vs-ggml [--ggml-python $GGMLPY_REF_PYTHON]]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggmlpy import Type  # noqa: E402
from ggmlpy.quants import QUANTIZABLE, dequantize, quantize  # noqa: E402
from ggmlpy.quants.legacy import GGUF_DEQUANTIZE, GGUF_QUANTIZE  # noqa: E402


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


#: MiniLM-L6's matrix shapes (K, M): attention q/k/v/o, FFN up, FFN down
_MM_SHAPES = ((384, 384), (384, 1536), (1536, 384))
_MM_TOKENS = (1, 32, 1024)


def _time_calls(fn, repeat: int, min_s: float = 0.05) -> float:
    """Seconds per call: best over ``repeat`` rounds of the mean of enough calls to last
    ``min_s`` (so 1-token products of ~50 us are not timer noise)."""
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    inner = max(1, int(min_s / one))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def bench_mul_mat(repeat: int, types: list[Type]) -> list[dict]:
    """MUL_MAT time per weight type on the CPU backend next to F32, weight in a WEIGHTS buffer,
    with the float32 weight cache on (default budget) and off (``GGMLPY_WEIGHT_CACHE_MB=0`` when
    the plan is built: the per-call row-block conversion every call used before the cache).
    Per (shape, N) every case is built first, then timed round-robin ``repeat`` times (paired
    under the same machine load); each case keeps its best round."""
    import os  # noqa: PLC0415

    from ggmlpy import ops  # noqa: PLC0415
    from ggmlpy.alloc.tallocr import alloc_ctx_tensors  # noqa: PLC0415
    from ggmlpy.backend.interface import BufferUsage
    from ggmlpy.backend.tensor_data import backend_tensor_set  # noqa: PLC0415
    from ggmlpy.backends.cpu.backend import backend_cpu_init  # noqa: PLC0415
    from ggmlpy.backends.kernels.weight_cache import CACHE, configure_from_env  # noqa: PLC0415
    from ggmlpy.core.graph import Graph  # noqa: PLC0415
    from ggmlpy.core.tensor import Context  # noqa: PLC0415

    cpu = backend_cpu_init()
    rng = np.random.default_rng(0)
    rows = []
    env_before = os.environ.get("GGMLPY_WEIGHT_CACHE_MB")

    def set_env(off: bool) -> None:
        if off:
            os.environ["GGMLPY_WEIGHT_CACHE_MB"] = "0"
        elif env_before is None:
            os.environ.pop("GGMLPY_WEIGHT_CACHE_MB", None)
        else:
            os.environ["GGMLPY_WEIGHT_CACHE_MB"] = env_before
        configure_from_env()

    try:
        for K, M in _MM_SHAPES:
            w = rng.standard_normal((M, K)).astype(np.float32)
            for N in _MM_TOKENS:
                CACHE.clear()
                cases, bufs = [], []
                # "off" plans first (built with the budget 0), then the rest with the budget back
                order = [(t, "off") for t in types if t != Type.F32 and K % t.blck_size == 0]
                order += [(Type.F32, "-")] + [(t, "on") for t in types
                                               if t != Type.F32 and K % t.blck_size == 0]
                xv = rng.standard_normal((N, K)).astype(np.float32)
                for t, cache in order:
                    set_env(cache == "off")
                    wctx, ctx = Context(no_alloc=True), Context(no_alloc=True)
                    a = wctx.new_tensor(t, (K, M))
                    b = ctx.new_tensor(Type.F32, (K, N))
                    out = ops.mul_mat(ctx, a, b)
                    wbuf = alloc_ctx_tensors(wctx, cpu)
                    wbuf.set_usage(BufferUsage.WEIGHTS)
                    buf = alloc_ctx_tensors(ctx, cpu)
                    bufs += [wbuf, buf]
                    backend_tensor_set(a, quantize(w, t).reshape(-1))
                    backend_tensor_set(b, xv)
                    g = Graph(8)
                    g.build_forward_expand(out)
                    cpu.graph_compute(g)  # build the plan (and fill the cache) once
                    cases.append((t, cache, g))
                set_env(False)
                best = [float("inf")] * len(cases)
                try:
                    for _ in range(repeat):
                        for i, (_t, _c, g) in enumerate(cases):
                            best[i] = min(best[i], _time_calls(lambda: cpu.graph_compute(g), 1))
                finally:
                    for bf in bufs:
                        bf.free()
                base = best[[c[0] for c in cases].index(Type.F32)]
                for (t, cache, _g), sec in sorted(zip(cases, best), key=lambda r: r[0][0] != Type.F32):
                    rows.append({"type": t.type_name, "cache": cache, "K": K, "M": M, "N": N,
                                 "GFLOPs": round(2 * M * N * K / sec / 1e9, 2),
                                 "us": round(sec * 1e6, 1), "vs_f32": round(sec / base, 2)})
    finally:
        set_env(False)
        CACHE.clear()
    return rows


def bench_minilm(repeat: int, n_sentences: int, schemes: list[str]) -> list[dict]:
    """Sentences/s of MiniLM per GGUF scheme on the CPU (see the module docstring); schemes
    other than safetensors/f32 also run with the weight cache off (``cache: off``)."""
    import os  # noqa: PLC0415

    from ggmlpy.backends.kernels.weight_cache import CACHE  # noqa: PLC0415
    from ggmlpy.models.bert import BertModel  # noqa: PLC0415
    from ggmlpy.models.gguf_bert import convert  # noqa: PLC0415
    from ggmlpy.models.loader import find_default_model_dir  # noqa: PLC0415

    rng = np.random.default_rng(1)
    words = ("the a cat dog runs quickly over lazy model tensor graph backend quantized weights "
             "sentence embedding small large fast slow good bad").split()
    sents = [" ".join(rng.choice(words, rng.integers(5, 41))) for _ in range(n_sentences)]
    out = []
    env_before = os.environ.get("GGMLPY_WEIGHT_CACHE_MB")
    base = base1 = None
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in schemes:
            path = None
            if scheme != "safetensors":
                path = Path(tmp) / f"m-{scheme}.gguf"
                convert(find_default_model_dir(), path, scheme)
            for cache in (("-",) if scheme in ("safetensors", "f32") else ("on", "off")):
                if cache == "off":
                    os.environ["GGMLPY_WEIGHT_CACHE_MB"] = "0"
                elif env_before is None:
                    os.environ.pop("GGMLPY_WEIGHT_CACHE_MB", None)
                else:
                    os.environ["GGMLPY_WEIGHT_CACHE_MB"] = env_before
                CACHE.clear()
                with BertModel.load(path) as m:
                    m.encode(sents[:32])  # plans for the common shapes
                    m.encode(sents[:1])
                    sec = _best(lambda: m.encode(sents), repeat)
                    one = _time_calls(lambda: m.encode(sents[:1]), repeat, min_s=0.3)
                    wbytes = sum(b.size for b in m._weight_bufs)
                    cached = CACHE.stats()["bytes"]
                base = sec if scheme in ("safetensors", "f32") and base is None else base
                base1 = one if scheme in ("safetensors", "f32") and base1 is None else base1
                out.append({"scheme": scheme, "cache": cache,
                            "sentences_per_s": round(len(sents) / sec, 1),
                            "time_vs_" + schemes[0]: round(sec / base, 2),
                            "one_sentence_ms": round(one * 1e3, 2),
                            "one_sentence_vs_" + schemes[0]: round(one / base1, 2),
                            "weights_bytes": int(wbytes), "cache_bytes": int(cached)})
    if env_before is None:
        os.environ.pop("GGMLPY_WEIGHT_CACHE_MB", None)
    else:
        os.environ["GGMLPY_WEIGHT_CACHE_MB"] = env_before
    CACHE.clear()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=128)
    ap.add_argument("--no-minilm", action="store_true")
    ap.add_argument("--no-quant", action="store_true", help="skip the (de)quantize throughput table")
    ap.add_argument("--mm-types", default="F16,BF16,Q8_0,Q4_0",
                    help="comma-separated weight types for the mul_mat table (F32 always runs)")
    ap.add_argument("--schemes", default="safetensors,f32,f16,q8_0,q4_0,q4_k,q4_0_m,q4_k_m",
                    help="MiniLM schemes (the first is the time_vs_ base)")
    ap.add_argument("--vs-ggml", action="store_true",
                    help="add the per-type table against ggml's own MUL_MAT on the Gemma 3 "
                         "shapes (scripts/bench_qmatmul.py; needs --ggml-python)")
    ap.add_argument("--ggml-python", default=os.environ.get("GGMLPY_REF_PYTHON"),
                    help="an interpreter with ggml-python (default $GGMLPY_REF_PYTHON)")
    a = ap.parse_args()
    mm_types = [Type[n.strip().upper()] for n in a.mm_types.split(",") if n.strip()]
    res = {"bench": "quant"}
    if not a.no_quant:
        x = np.random.default_rng(0).standard_normal((a.rows, a.cols)).astype(np.float32)
        mb = x.nbytes / 1e6
        out = []
        for t in sorted(QUANTIZABLE):
            b = quantize(x, t)
            tq = _best(lambda: quantize(x, t), a.repeat)
            td = _best(lambda: dequantize(b, t, [a.cols, a.rows]), a.repeat)
            out.append({"type": t.type_name, "bytes_per_weight": round(b.nbytes / x.size, 4),
                        "quantize_MBps": round(mb / tq, 1), "dequantize_MBps": round(mb / td, 1),
                        "quantize_source": "gguf" if t in GGUF_QUANTIZE else "ggmlpy",
                        "dequantize_source": "gguf" if t in GGUF_DEQUANTIZE else "ggmlpy"})
        res.update({"elements": int(x.size), "results": out})
    res["mul_mat"] = bench_mul_mat(a.repeat, mm_types)
    if not a.no_minilm:
        res["minilm"] = bench_minilm(a.repeat, a.sentences,
                                     [s.strip() for s in a.schemes.split(",") if s.strip()])
    if a.vs_ggml:
        res["vs_ggml"] = bench_vs_ggml(a.repeat, a.ggml_python)
    print(json.dumps(res, indent=1))


def bench_vs_ggml(repeat: int, ggml_python: str | None) -> dict:
    """``vs_ggml``: scripts/bench_qmatmul.py's run at 1 and 512 tokens (its ``cases``: per type
    and Gemma 3 shape ggmlpy's and ggml's milliseconds, their ratio, the weight GB/s of both and
    the fraction of the bandwidth measured in the same run), in a process of its own."""
    if not ggml_python:
        raise SystemExit("bench_quant: --vs-ggml needs --ggml-python or $GGMLPY_REF_PYTHON")
    cmd = [sys.executable, str(Path(__file__).with_name("bench_qmatmul.py")), "--tokens", "1,512",
           "--repeat", str(repeat), "--ggml-python", ggml_python]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"bench_quant: bench_qmatmul.py failed: {r.stderr.strip()[-500:]}")
    d = json.loads(r.stdout)
    keys = ("type", "K", "M", "tokens", "ggmlpy_ms", "ggml_ms", "ratio", "ggmlpy_weight_gbps",
            "ggml_weight_gbps", "bw_frac")
    return {"bandwidth": d.get("bandwidth"),
            "cases": [{k: c.get(k) for k in keys} for c in d.get("cases", [])]}


if __name__ == "__main__":
    main()
