"""The dot kernels alone: one compiled MUL_MAT product on the calling thread (no graph, no
thread pool) against ggml's MUL_MAT on one thread, interleaved, as JSON on stdout.

    python scripts/bench_qkernels.py [--repeat 7] [--tokens 1] [--types Q4_K,Q6_K]
        [--ggml-python $GGMLPY_REF_PYTHON] [--min-s 0.1]

* Cases: the shapes of ``scripts/bench_qmatmul.py`` (``CASES``: the Gemma 3 270M matrices, the
  640 x 262144 Q8_0 one replaced by 640 x 2048 so that the weight stays in cache like the others)
  at ``--tokens`` activation rows; the same weights and activations on both sides.
* ggmlpy: the step of :func:`ggmlpy.backends.cpu.qmatmul.prepare` with no ``run_dot`` (the
  calling thread alone): the activation quantization and the weight rows' dot products in one
  compiled call, as a plan's MUL_MAT step runs it, without the graph's dispatch.
* ggml: a one-node graph through ggml-python with one thread (``ggml_graph_compute``: its
  activation quantization and ``vec_dot`` loops plus its graph call, a few microseconds).
* ``ggmlpy_kernel_us``: the compiled row kernel alone on activations quantized beforehand (the
  step less its activation quantization and its call overhead); ``ggml_kernel_us``: ggml's time
  less that of the same product with :data:`MSMALL` weight rows (its activation quantization
  and graph call), scaled to ``M`` rows: the two sides' ``vec_dot`` loops.
* Timing: ``--repeat`` rounds alternate ggml and ggmlpy per case, each the mean over calls lasting
  ``--min-s``; the best round is reported. ``ratio`` = ggmlpy / ggml. ``max_rel_diff_vs_ggml`` =
  ``max |y - y_ggml| / max |y_ggml|``. ``loadavg`` before and after (other work on the machine
  slows both sides).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_qmatmul as bq  # noqa: E402

from ggmlpy.backends.cpu import qmatmul  # noqa: E402
from ggmlpy.core.types import Type  # noqa: E402

bq.Type = Type  # bench_qmatmul imports it only when run as a script
#: weight rows of the product that measures ggml's fixed cost per call
MSMALL = 16
CASES = [(t, K, 2048 if M > 8192 else M) for t, K, M in bq.CASES]


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--types", default="")
    ap.add_argument("--min-s", type=float, default=0.1)
    ap.add_argument("--ggml-python", default=os.environ.get("GGMLPY_REF_PYTHON", sys.executable))
    args = ap.parse_args()
    types = [x for x in args.types.split(",") if x]
    tokens = [int(x) for x in args.tokens.split(",")]
    res: dict = {"loadavg_start": os.getloadavg(), "jit": qmatmul.warm_up(), "cases": []}
    ggml_w = bq._Ggml(args.ggml_python)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for tname, K, M in CASES:
                if types and tname not in types:
                    continue
                t = Type[tname]
                wq = bq._weights(tname, K, M, 7)
                path = os.path.join(tmp, "w.npy")
                np.save(path, wq.view(np.uint8))
                small = os.path.join(tmp, "ws.npy")
                np.save(small, wq.view(np.uint8)[:MSMALL])
                w = wq.view(np.uint16) if t in (Type.F16, Type.BF16) else wq.view(np.uint8)
                for N in tokens:
                    ggml_w.ask(op="setup", type=tname, K=K, M=M, N=N, threads=1, weight=path,
                               seed=11, poll=0)
                    x = np.random.default_rng(11).standard_normal((N, K)).astype(np.float32)
                    out = np.empty((N, M), np.float32)
                    step = qmatmul.prepare(t, w, x, out)
                    act = qmatmul.quantize_act(qmatmul.VEC_DOT_TYPE[t], x)
                    (kern,) = qmatmul.mul_mat_parts(t, w, act, np.empty_like(out), 1)
                    tg = tp = tk = float("inf")
                    for _ in range(args.repeat):
                        tg = min(tg, ggml_w.ask(op="time")["s"])
                        tp = min(tp, bq._mean_time(step, args.min_s))
                        tk = min(tk, bq._mean_time(kern, args.min_s))
                    rpath = os.path.join(tmp, "r.npy")
                    ggml_w.ask(op="result", path=rpath)
                    ref = np.load(rpath)
                    step()
                    rel = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
                    # ggml's fixed cost: the same product with MSMALL weight rows
                    ggml_w.ask(op="setup", type=tname, K=K, M=MSMALL, N=N, threads=1,
                               weight=small, seed=11, poll=0)
                    t0 = min(ggml_w.ask(op="time")["s"] for _ in range(args.repeat))
                    row = {"type": tname, "K": K, "M": M, "tokens": N, "ggmlpy_us": tp * 1e6,
                           "ggml_us": tg * 1e6, "ratio": tp / tg,
                           "ggmlpy_kernel_us": tk * 1e6,
                           "ggml_kernel_us": (tg - t0) * M / (M - MSMALL) * 1e6,
                           "max_rel_diff_vs_ggml": rel}
                    res["cases"].append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        ggml_w.close()
    res["loadavg_end"] = os.getloadavg()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
