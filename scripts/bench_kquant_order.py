"""The Q4_K/Q6_K MUL_MAT variants in llama.cpp's x86 orders (``cpu.jit.mul_mat_q4k``,
``cpu.jit.mul_mat_q6k``) on prompt batches: the integer-GEMM form
(:mod:`ggmlpy.backends.cpu.kquant_igemm`) against the dot-kernel form and the BLAS GEMM path,
interleaved, as JSON on stdout.

    python scripts/bench_kquant_order.py [--threads 2] [--repeat 5] [--rows 8,16,...,512]
        [--cases Q4_K:2048x640,Q6_K:1024x640] [--min-s 0.1]

* Cases: ``type:KxM`` (ggml ``ne = [K, M]`` of the weight; default the Gemma 3 270M
  ``ffn_down`` 2048 x 640 and ``attn_output`` 1024 x 640, Q4_K and Q6_K) at ``--rows``
  activation rows (F32, standard normal). Weights: standard-normal values quantized with
  ``ggmlpy.quantize``.
* Three plans of one MUL_MAT node each on ``backend_cpu_init()`` with ``--threads`` threads,
  built before timing: ``old`` the variant with the integer GEMMs turned off (every output on
  the compiled dot kernel), ``new`` the variant as it runs by default, ``blas`` the GEMM path
  (dequantized weight tiles and BLAS, :mod:`ggmlpy.backends.cpu.qgemm`: not ggml's order),
  forced at every batch. ``old`` and ``new`` run with ``GGMLPY_QUANT_MATMUL=dot`` (the variants
  at every batch) and must give the same bits (``same_bits``).
* Timing: after an untimed warm-up of each plan, ``--repeat`` rounds alternate the three plans; each round is the mean over calls
  lasting ``--min-s``; the best round is reported, with ``new/old`` and ``new/blas`` ratios.
  ``loadavg`` before and after (other work on the machine slows every plan).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_qmatmul as bq  # noqa: E402

from ggmlpy.backends.cpu import kquant_igemm, qmatmul  # noqa: E402
from ggmlpy.core import env  # noqa: E402
from ggmlpy.core.types import Type  # noqa: E402

bq.Type = Type  # bench_qmatmul imports it only when run as a script
CASES = "Q4_K:2048x640,Q6_K:2048x640,Q4_K:1024x640,Q6_K:1024x640"


def _case(cpu, mode: str, t: Type, wq: np.ndarray, K: int, M: int, N: int) -> bq._Case:
    """A plan built in ``mode`` (module doc); the settings hold while the plan is built."""
    saved_env = os.environ.get(env.QUANT_MATMUL)
    saved_cross, saved_addr = qmatmul.CROSSOVER[t], kquant_igemm.gemm_address
    try:
        if mode == "blas":
            os.environ[env.QUANT_MATMUL] = "fast"  # the mode whose path CROSSOVER picks
            qmatmul.CROSSOVER[t] = 1
        else:
            os.environ[env.QUANT_MATMUL] = "dot"
            if mode == "old":
                kquant_igemm.gemm_address = lambda n_rows, min_rows: 0
        return bq._Case(cpu, t, wq, K, M, N, 11)
    finally:
        if saved_env is None:
            os.environ.pop(env.QUANT_MATMUL, None)
        else:
            os.environ[env.QUANT_MATMUL] = saved_env
        qmatmul.CROSSOVER[t], kquant_igemm.gemm_address = saved_cross, saved_addr


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", default="8,16,32,64,128,256,512")
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--min-s", type=float, default=0.1)
    args = ap.parse_args()
    from ggmlpy.backends.cpu.backend import backend_cpu_init
    cpu = backend_cpu_init()
    cpu.set_n_threads(args.threads)
    res: dict = {"threads": args.threads, "loadavg_start": os.getloadavg(),
                 "igemm": kquant_igemm.gemm_address(1 << 30, 0) != 0, "cases": []}
    for spec in args.cases.split(","):
        tname, shape = spec.split(":")
        K, M = (int(v) for v in shape.split("x"))
        t = Type[tname]
        wq = bq._weights(tname, K, M, 7)
        for N in (int(v) for v in args.rows.split(",")):
            cases = {m: _case(cpu, m, t, wq, K, M, N) for m in ("old", "new", "blas")}
            times = {m: float("inf") for m in cases}
            for c in cases.values():  # untimed: the pool's threads and every kernel warm
                bq._mean_time(c.run, args.min_s / 4)
            for _ in range(args.repeat):
                for m, c in cases.items():
                    times[m] = min(times[m], bq._mean_time(c.run, args.min_s))
            same = bool(np.array_equal(cases["old"].result(), cases["new"].result()))
            for c in cases.values():
                c.free()
            row = {"type": tname, "K": K, "M": M, "rows": N,
                   **{f"{m}_ms": round(v * 1e3, 3) for m, v in times.items()},
                   "new/old": round(times["new"] / times["old"], 3),
                   "new/blas": round(times["new"] / times["blas"], 3), "same_bits": same}
            res["cases"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    res["loadavg_end"] = os.getloadavg()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
