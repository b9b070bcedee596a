"""MUL_MAT with F16/BF16/quantized weights: ggmlpy's CPU backend against ggml's, interleaved, and
the weight bandwidth both reach, as JSON on stdout.

    python scripts/bench_qmatmul.py [--threads 2] [--repeat 5] [--tokens 1,512]
        [--ggml-python $GGMLPY_REF_PYTHON] [--crossover] [--types Q8_0,Q4_K]
        [--max-gmacs 10] [--ggml-poll 0]

* Cases: the Gemma 3 270M matrix shapes ``K x M`` (ggml ``ne = [K, M]`` of the weight):
  640 x 262144 Q8_0 (the token embedding as output projection), 640 x 1024 and 640 x 2048 Q5_0,
  2048 x 640 Q4_K, Q6_K and Q5_K, and 640 x 2048 F16, BF16, Q4_0, Q4_1, Q5_1; each at
  ``--tokens`` activation rows (F32). Weights: standard-normal values quantized with
  ``ggmlpy.quantize`` (bit-exact with ggml's reference quantizers).
* ggmlpy: one MUL_MAT node on ``backend_cpu_init()`` with ``set_n_threads(--threads)``, the weight
  in a WEIGHTS buffer, the plan built before timing (default settings: ``GGMLPY_QUANT_MATMUL``
  ggml, the weight cache off for block types).
* ggml: the same product through ggml-python (a worker process running ``--ggml-python``, which
  must import ``ggml``): a context holding the tensors, ``ggml_graph_plan`` with a persistent
  ``ggml_threadpool`` of ``--threads`` threads (``poll`` = ``--ggml-poll``, default 0: waiting
  threads sleep instead of spinning), ``ggml_graph_compute``; the threadpool is paused between its
  timing rounds so that its threads do not run while ggmlpy is timed.
  A plain ggml context: no weight repacking (llama.cpp's CPU_REPACK buffers) for either side.
* Timing: per case, ``--repeat`` rounds alternate ggml and ggmlpy; each round is the mean over
  enough calls to last 0.2 s; the best round is reported. ``ratio`` = ggmlpy / ggml time.
* Bandwidth: ``weight_gbps`` = weight bytes / time (1 GB = 1e9 bytes); the machine's memory
  bandwidth measured in the same run: ``read_gbps`` a NumPy sum over a 512 MiB float32 array by
  ``--threads`` threads (each its half), ``copy_gbps`` a 512 MiB ``np.copyto`` (bytes read +
  written). ``bw_frac`` = weight_gbps / read_gbps (matrix-vector targets: >= 0.6).
* ``--crossover``: ggmlpy alone, per type (shapes :data:`XCASES`), the dot kernels (forced at
  any batch) against the GEMM path (forced at any batch: dequantized tiles and the activations
  in the ``vec_dot_type``, :mod:`ggmlpy.backends.cpu.qgemm`) for 1..512 tokens, the two plans
  timed in alternating rounds (``GGMLPY_QUANT_MATMUL=fast``, the mode that picks the path by
  :data:`~ggmlpy.backends.cpu.qmatmul.CROSSOVER`); ``crossover`` is the first batch where the
  GEMM path wins.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

#: (type name, K, M)
CASES = [("Q8_0", 640, 262144), ("Q5_0", 640, 1024), ("Q5_0", 640, 2048), ("Q4_K", 2048, 640),
         ("Q6_K", 2048, 640), ("Q5_K", 2048, 640), ("F16", 640, 2048), ("BF16", 640, 2048),
         ("Q4_0", 640, 2048), ("Q4_1", 640, 2048), ("Q5_1", 640, 2048)]
#: the crossover runs: one shape per type (the first of CASES with M <= 8192; Q8_0 on 640 x 2048)
XCASES = [("Q5_0", 640, 1024), ("Q4_K", 2048, 640), ("Q6_K", 2048, 640), ("Q5_K", 2048, 640),
          ("F16", 640, 2048), ("BF16", 640, 2048), ("Q4_0", 640, 2048), ("Q4_1", 640, 2048),
          ("Q5_1", 640, 2048), ("Q8_0", 640, 2048)]
MIN_S = 0.2


def _mean_time(fn, min_s: float = MIN_S) -> float:
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    inner = max(1, int(min_s / one))
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


# ----------------------------------------------------------------------------- ggml worker


def _worker() -> None:
    """Runs under the reference venv: reads JSON commands on stdin, answers on stdout."""
    import ctypes

    import ggml

    ggml.ggml_cpu_init()
    state: dict = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "setup":
            for k in ("ctx", "tp"):
                if k in state:
                    (ggml.ggml_free if k == "ctx" else ggml.ggml_threadpool_free)(state.pop(k))
            t = getattr(ggml, "GGML_TYPE_" + cmd["type"])
            K, M, N, nt = cmd["K"], cmd["M"], cmd["N"], cmd["threads"]
            w = np.load(cmd["weight"], mmap_mode="r")
            size = w.nbytes + K * N * 4 + M * N * 4 + (64 << 20)
            ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=size, mem_buffer=None,
                                                       no_alloc=False))
            a = ggml.ggml_new_tensor_2d(ctx, t, K, M)
            b = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, K, N)
            c = ggml.ggml_mul_mat(ctx, a, b)
            gf = ggml.ggml_new_graph(ctx)
            ggml.ggml_build_forward_expand(gf, c)
            wc = np.ascontiguousarray(w)
            ctypes.memmove(ggml.ggml_get_data(a), wc.ctypes.data, wc.nbytes)
            x = np.random.default_rng(cmd["seed"]).standard_normal((N, K)).astype(np.float32)
            ctypes.memmove(ggml.ggml_get_data(b), x.ctypes.data, x.nbytes)
            params = ggml.ggml_threadpool_params_default(nt)
            params.poll = cmd["poll"]
            tp = ggml.ggml_threadpool_new(ctypes.byref(params))
            plan = ggml.ggml_graph_plan(gf, nt, tp)
            work = np.zeros(max(plan.work_size, 1), np.uint8)
            plan.work_data = work.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            state.update(ctx=ctx, tp=tp, gf=gf, plan=plan, work=work, c=c, M=M, N=N)
            ggml.ggml_graph_compute(gf, ctypes.byref(plan))
            ggml.ggml_threadpool_pause(tp)
            print(json.dumps({"ok": True}), flush=True)
        elif cmd["op"] == "time":
            gf, plan, tp = state["gf"], state["plan"], state["tp"]
            ggml.ggml_threadpool_resume(tp)
            dt = _mean_time(lambda gf=gf, plan=plan: ggml.ggml_graph_compute(gf, ctypes.byref(plan)))
            ggml.ggml_threadpool_pause(tp)
            print(json.dumps({"s": dt}), flush=True)
        elif cmd["op"] == "result":
            M, N = state["M"], state["N"]
            p = ggml.ggml_get_data(state["c"])
            out = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), (N * M,))
            np.save(cmd["path"], out.reshape(N, M))
            print(json.dumps({"ok": True}), flush=True)


class _Ggml:
    def __init__(self, python: str) -> None:
        self.p = subprocess.Popen([python, __file__, "--ggml-worker"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def ask(self, **cmd) -> dict:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("the ggml worker died")
        return json.loads(line)

    def close(self) -> None:
        if self.p.stdin is not None:
            self.p.stdin.close()
        self.p.wait(timeout=30)


# ----------------------------------------------------------------------------- ggmlpy side


def _bandwidth(threads: int) -> dict:
    a = np.ones(1 << 27, np.float32)  # 512 MiB
    b = np.empty_like(a)
    parts = np.array_split(a, threads)

    def read() -> None:
        ts = [threading.Thread(target=np.sum, args=(p,)) for p in parts[1:]]
        for t in ts:
            t.start()
        np.sum(parts[0])
        for t in ts:
            t.join()

    r = min(_mean_time(read, 0.5) for _ in range(3))
    c = min(_mean_time(lambda: np.copyto(b, a), 0.5) for _ in range(3))
    return {"read_gbps": a.nbytes / r / 1e9, "copy_gbps": 2 * a.nbytes / c / 1e9,
            "threads": threads}


class _Case:
    """One ggmlpy MUL_MAT graph: weight ``(M, row_bytes)`` in a WEIGHTS buffer, ``x`` (N, K)."""

    def __init__(self, cpu, t, wq: np.ndarray, K: int, M: int, N: int, seed: int) -> None:
        from ggmlpy import ops
        from ggmlpy.alloc.tallocr import alloc_ctx_tensors
        from ggmlpy.backend.interface import BufferUsage
        from ggmlpy.backend.tensor_data import backend_tensor_set
        from ggmlpy.core.graph import Graph
        from ggmlpy.core.tensor import Context

        wctx, ctx = Context(no_alloc=True), Context(no_alloc=True)
        a = wctx.new_tensor(t, (K, M))
        b = ctx.new_tensor(Type.F32, (K, N))
        self.out = ops.mul_mat(ctx, a, b)
        self.wbuf = alloc_ctx_tensors(wctx, cpu)
        self.wbuf.set_usage(BufferUsage.WEIGHTS)
        self.buf = alloc_ctx_tensors(ctx, cpu)
        backend_tensor_set(a, wq.reshape(-1).view(np.uint8))
        x = np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32)
        backend_tensor_set(b, x)
        self.g = Graph(8)
        self.g.build_forward_expand(self.out)
        self.cpu = cpu
        cpu.graph_compute(self.g)

    def run(self) -> None:
        self.cpu.graph_compute(self.g)

    def result(self) -> np.ndarray:
        from ggmlpy.backend.tensor_data import backend_tensor_get
        return np.asarray(backend_tensor_get(self.out)).reshape(self.out.ne[1], self.out.ne[0])

    def free(self) -> None:
        self.wbuf.free()
        self.buf.free()


def _weights(tname: str, K: int, M: int, seed: int) -> np.ndarray:
    from ggmlpy.quants import quantize
    rng = np.random.default_rng(seed)
    out = []
    for r in range(0, M, 8192):  # chunks: the float32 matrix of the largest case is 671 MB
        out.append(quantize(rng.standard_normal((min(8192, M - r), K)).astype(np.float32),
                            Type[tname]))
    return np.concatenate(out).reshape(M, -1)


def bench(args, cpu) -> dict:
    import tempfile
    ggml_w = _Ggml(args.ggml_python)
    bw = _bandwidth(args.threads)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for tname, K, M in CASES:
                if args.types and tname not in args.types:
                    continue
                wq = _weights(tname, K, M, 7)
                path = os.path.join(tmp, "w.npy")
                np.save(path, wq.view(np.uint8))
                for N in args.tokens:
                    if args.max_gmacs and K * M * N > args.max_gmacs * 1e9:
                        continue
                    ggml_w.ask(op="setup", type=tname, K=K, M=M, N=N, threads=args.threads,
                               weight=path, seed=11, poll=args.ggml_poll)
                    case = _Case(cpu, Type[tname], wq, K, M, N, 11)
                    tg, tp = float("inf"), float("inf")
                    for _ in range(args.repeat):
                        tg = min(tg, ggml_w.ask(op="time")["s"])
                        tp = min(tp, _mean_time(case.run))
                    rpath = os.path.join(tmp, "r.npy")
                    ggml_w.ask(op="result", path=rpath)
                    ref, got = np.load(rpath), case.result()
                    rel = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
                    case.free()
                    rows.append({"type": tname, "K": K, "M": M, "tokens": N,
                                 "ggmlpy_ms": tp * 1e3, "ggml_ms": tg * 1e3, "ratio": tp / tg,
                                 "weight_mb": wq.nbytes / 1e6,
                                 "ggmlpy_weight_gbps": wq.nbytes / tp / 1e9,
                                 "ggml_weight_gbps": wq.nbytes / tg / 1e9,
                                 "bw_frac": wq.nbytes / tp / 1e9 / bw["read_gbps"],
                                 "max_rel_diff_vs_ggml": rel})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        ggml_w.close()
    return {"bandwidth": bw, "cases": rows}


def crossover(args, cpu) -> dict:
    from ggmlpy.backends.cpu import qmatmul
    from ggmlpy.core import env
    os.environ[env.QUANT_MATMUL] = "fast"  # the mode in which CROSSOVER picks the path
    out = {}
    for tname, K, M in XCASES:
        if args.types and tname not in args.types:
            continue
        t = Type[tname]
        wq = _weights(tname, K, M, 7)
        res = []
        first = None
        for N in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 384, 512):
            cases = {}
            saved = qmatmul.CROSSOVER[t]
            try:
                for mode, cross in (("dot", 1 << 30), ("gemm", 1)):
                    qmatmul.CROSSOVER[t] = cross  # the plan's path is fixed when it is built
                    cases[mode] = _Case(cpu, t, wq, K, M, N, 11)
            finally:
                qmatmul.CROSSOVER[t] = saved
            times = {mode: float("inf") for mode in cases}
            for _ in range(args.repeat):  # interleaved rounds
                for mode, case in cases.items():
                    times[mode] = min(times[mode], _mean_time(case.run, 0.1))
            for case in cases.values():
                case.free()
            res.append({"tokens": N, "dot_ms": times["dot"] * 1e3, "gemm_ms": times["gemm"] * 1e3})
            if first is None and times["gemm"] < times["dot"]:
                first = N
        out[tname] = {"K": K, "M": M, "crossover": first, "runs": res}
        print(json.dumps({tname: out[tname]}), file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokens", default="1,512")
    ap.add_argument("--types", default="")
    ap.add_argument("--ggml-python", default=os.environ.get("GGMLPY_REF_PYTHON", sys.executable))
    ap.add_argument("--crossover", action="store_true")
    ap.add_argument("--max-gmacs", type=float, default=0.0,
                    help="skip cases of more multiply-adds (GMAC) than this (0: none)")
    ap.add_argument("--ggml-poll", type=int, default=0,
                    help="ggml_threadpool_params.poll (ggml's default 50 busy-waits, which on an "
                         "oversubscribed machine stalls its barriers for milliseconds)")
    args = ap.parse_args()
    args.tokens = [int(x) for x in args.tokens.split(",")]
    args.types = [x for x in args.types.split(",") if x]
    from ggmlpy.backends.cpu.backend import backend_cpu_init
    cpu = backend_cpu_init()
    cpu.set_n_threads(args.threads)
    res = {"threads": args.threads, "numpy": np.__version__, "ggml_poll": args.ggml_poll,
           "loadavg_start": os.getloadavg()}
    if args.crossover:
        res["crossover"] = crossover(args, cpu)
    else:
        res.update(bench(args, cpu))
    res["loadavg_end"] = os.getloadavg()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    if "--ggml-worker" in sys.argv:
        _worker()
    else:
        sys.path.insert(0, str(ROOT))
        from ggmlpy.core.types import Type  # noqa: E402
        main()
