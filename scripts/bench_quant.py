"""Quantize/dequantize throughput per type, MUL_MAT throughput per weight type on the CPU
backend next to F32, and MiniLM sentences/s per GGUF type scheme, as JSON on stdout.

* ``quant``: MB/s counts the float32 side (4 bytes per element, 1 MB = 1e6 bytes) on one CPU
  thread: a ``--rows`` x ``--cols`` standard-normal matrix, best of ``--repeat`` runs. ``source``
  says whose code runs (``gguf`` = gguf-py's gguf.quants, ``ggmlpy`` = ggmlpy.quants.kquants /
  ggmlpy's F16/BF16 rules).
* ``mul_mat``: one MUL_MAT node ``[K, M] x [K, N]`` (MiniLM's FFN up: K=384, M=1536; N=1 token
  and N=1024 tokens) on the CPU backend, best of ``--repeat``: GFLOP/s (2*M*N*K per call) and
  the time relative to the F32 weight. The weight is converted in row blocks on every call
  (kernels/matmul.py), so small N shows the conversion cost and large N the GEMM.
* ``minilm``: ``python -m ggmlpy convert`` per scheme, then sentences/s embedding ``--sentences``
  seeded sentences of 5-40 words (batches of 32) on the CPU, best of ``--repeat``; plus the
  weights buffer bytes. ``--no-minilm`` skips it (needs the model package).

    python scripts/bench_quant.py [--rows 1024] [--cols 1024] [--repeat 3] [--no-minilm]
"""

from __future__ import annotations

import argparse
import json
import time

import sys
import tempfile
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


_MM_TYPES = (Type.F32, Type.F16, Type.BF16, Type.Q8_0, Type.Q4_0, Type.Q4_1, Type.Q5_0,
             Type.Q5_1, Type.Q4_K, Type.Q5_K, Type.Q6_K)


def bench_mul_mat(repeat: int) -> list[dict]:
    """MUL_MAT GFLOP/s per weight type on the CPU backend (see the module docstring)."""
    from ggmlpy import ops  # noqa: PLC0415
    from ggmlpy.alloc import alloc_ctx_tensors  # noqa: PLC0415
    from ggmlpy.backend import backend_tensor_set  # noqa: PLC0415
    from ggmlpy.backends.cpu import backend_cpu_init  # noqa: PLC0415
    from ggmlpy.graph import Graph  # noqa: PLC0415
    from ggmlpy.tensor import Context  # noqa: PLC0415

    cpu = backend_cpu_init()
    rng = np.random.default_rng(0)
    rows = []
    for K, M in ((384, 1536), (1536, 384)):
        w = rng.standard_normal((M, K)).astype(np.float32)
        for N in (1, 1024):
            base = None
            for t in _MM_TYPES:
                if K % t.blck_size:
                    continue
                ctx = Context(no_alloc=True)
                a = ctx.new_tensor(t, (K, M))
                b = ctx.new_tensor(Type.F32, (K, N))
                out = ops.mul_mat(ctx, a, b)
                buf = alloc_ctx_tensors(ctx, cpu)
                try:
                    backend_tensor_set(a, quantize(w, t).reshape(-1))
                    backend_tensor_set(b, rng.standard_normal((N, K)).astype(np.float32))
                    g = Graph(8)
                    g.build_forward_expand(out)
                    cpu.graph_compute(g)  # build the plan once
                    sec = _best(lambda: cpu.graph_compute(g), repeat)
                finally:
                    buf.free()
                base = sec if t == Type.F32 else base
                rows.append({"type": t.type_name, "K": K, "M": M, "N": N,
                             "GFLOPs": round(2 * M * N * K / sec / 1e9, 2),
                             "ms": round(sec * 1e3, 3), "vs_f32": round(sec / base, 2)})
    return rows


def bench_minilm(repeat: int, n_sentences: int) -> list[dict]:
    """Sentences/s of MiniLM per GGUF scheme on the CPU (see the module docstring)."""
    from ggmlpy.models.bert import BertModel  # noqa: PLC0415
    from ggmlpy.models.gguf_bert import SCHEMES, convert  # noqa: PLC0415
    from ggmlpy.models.loader import find_default_model_dir  # noqa: PLC0415

    rng = np.random.default_rng(1)
    words = "the a cat dog runs quickly over lazy model tensor graph backend quantized weights " \
            "sentence embedding small large fast slow good bad".split()
    sents = [" ".join(rng.choice(words, rng.integers(5, 41))) for _ in range(n_sentences)]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in ("safetensors",) + SCHEMES:
            path = None
            if scheme != "safetensors":
                path = Path(tmp) / f"m-{scheme}.gguf"
                convert(find_default_model_dir(), path, scheme)
            with BertModel.load(path) as m:
                m.encode(sents[:32])  # plans for the common shapes
                sec = _best(lambda: m.encode(sents), repeat)
                wbytes = sum(b.size for b in m._weight_bufs)
            out.append({"scheme": scheme, "sentences_per_s": round(len(sents) / sec, 1),
                        "weights_bytes": int(wbytes)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=128)
    ap.add_argument("--no-minilm", action="store_true")
    a = ap.parse_args()
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
    res = {"bench": "quant", "elements": int(x.size), "results": out,
           "mul_mat": bench_mul_mat(a.repeat)}
    if not a.no_minilm:
        res["minilm"] = bench_minilm(a.repeat, a.sentences)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
