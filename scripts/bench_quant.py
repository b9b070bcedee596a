"""Quantize/dequantize throughput per type, as JSON on stdout.

MB/s counts the float32 side (4 bytes per element, 1 MB = 1e6 bytes) on one CPU thread: a
1024 x 1024 standard-normal matrix, best of ``--repeat`` runs. ``source`` says whose code runs
(``gguf`` = gguf-py's gguf.quants, ``ggmlpy`` = ggmlpy.quants.kquants / ggmlpy's F16/BF16 rules).

    python scripts/bench_quant.py [--rows 1024] [--cols 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ggmlpy import Type
from ggmlpy.quants import QUANTIZABLE, dequantize, quantize
from ggmlpy.quants.legacy import GGUF_DEQUANTIZE, GGUF_QUANTIZE


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
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
    print(json.dumps({"bench": "quant", "elements": int(x.size), "results": out}, indent=1))


if __name__ == "__main__":
    main()
