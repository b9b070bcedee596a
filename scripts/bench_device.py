"""Benchmarks of the async device backend: copy bandwidths, a mul_mat, graph-compute latency. Prints JSON.

Usage::

    PYTHONPATH=. python scripts/bench_device.py [--device CUDA0|SIM0] [--copy-mb 256]
        [--mm 4096,4096,512] [--repeat 5] [--table]
    PYTHONPATH=. python scripts/bench_device.py --launches [--device CUDA0|FAKE] [--model-dir DIR]

Without ``--device`` it uses CUDA0 when CuPy sees a GPU, else a SIM device (latency 0). Every
figure is the median of ``--repeat`` runs, timed with ``time.perf_counter`` after a warm-up, with
the backend synchronized inside the timed region. Bandwidths are GB/s (10**9 bytes per second).

* ``h2d_blocking_gbps`` / ``d2h_blocking_gbps``: ``backend_tensor_set`` / ``backend_tensor_get`` of
  ``copy_mb`` MiB from/to pageable NumPy memory.
* ``h2d_async_gbps``: ``backend_tensor_set_async`` + ``synchronize`` (snapshot into pinned staging
  included).
* ``h2d_pinned_gbps``: async copy from a tensor in the pinned host buffer type (``*_Host``) with
  ``backend_tensor_copy_async`` + ``synchronize``.
* ``d2d_gbps``: ``backend_tensor_copy_async`` between two device tensors on one backend (bytes
  copied, not read+written).
* ``mul_mat_gflops``: F32 ``mul_mat`` of ``[K, M] x [K, N]`` (2*M*N*K flops) via ``graph_compute``.
* ``graph_latency_us``: a one-node graph (add of 1024 floats) ``graph_compute`` round trip;
  ``graph_async_return_us``: time for ``graph_compute_async`` to return on that graph.

``--launches`` prints instead the kernel launches per MiniLM evaluation (full offload, batch 8)
with the generic kernels and with ``ggmlpy.backends.cuda.kernels`` registered, per op, and the
largest embedding difference between the two; ``--device FAKE`` runs it on the tests' fake CuPy
(no GPU; it counts every launch CuPy would issue). On a real GPU only fused launches are counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from ggmlpy import ops
from ggmlpy.backend.interface import BufferType, tensor_alloc
from ggmlpy.backend.tensor_data import (
    backend_tensor_copy_async,
    backend_tensor_get,
    backend_tensor_set,
    backend_tensor_set_async,
)
from ggmlpy.backends.cuda.runtime import cuda_reg
from ggmlpy.backends.sim import sim_reg
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import GluOp, Op, UnaryOp
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type


def _place(buft: BufferType, *tensors: Tensor):
    align = buft.get_alignment()
    offs, total = [], 0
    for t in tensors:
        offs.append(total)
        total += -(-t.nbytes // align) * align
    buf = buft.alloc_buffer(total)
    for t, o in zip(tensors, offs):
        tensor_alloc(buf, t, o)
    return buf


def _median_time(fn, repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _pick_device(name: str | None):
    if name is None:
        reg = cuda_reg()
        return reg.devices[0] if reg.devices else sim_reg(1, latency_us=0).devices[0]
    if name.upper().startswith("SIM"):
        idx = int(name[3:] or 0)
        return sim_reg(idx + 1, latency_us=0).devices[idx]
    reg = cuda_reg()
    for d in reg.devices:
        if d.name.upper() == name.upper():
            return d
    raise SystemExit(f"no device {name}: {reg.unavailable_reason or 'not found'}")


def bench(device_name: str | None, copy_mb: int, mm: tuple[int, int, int], repeat: int) -> dict[str, Any]:
    """Run every benchmark on one device; returns the JSON-able result dict."""
    dev = _pick_device(device_name)
    be = dev.init_backend()
    out: dict[str, Any] = {"device": dev.name, "description": dev.description,
                           "copy_mb": copy_mb, "repeat": repeat}
    buft = dev.get_buffer_type()
    try:
        # copies -------------------------------------------------------------------------------
        n = copy_mb * (1 << 20) // 4
        nbytes = n * 4
        ctx = Context()
        a, b = ctx.new_tensor_1d(Type.F32, n), ctx.new_tensor_1d(Type.F32, n)
        h = ctx.new_tensor_1d(Type.F32, n)
        dbuf = _place(buft, a, b)
        hbuf = _place(dev.get_host_buffer_type(), h)
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        backend_tensor_set(h, x)

        def gbps(sec: float) -> float:
            return round(nbytes / sec / 1e9, 3)

        out["h2d_blocking_gbps"] = gbps(_median_time(lambda: backend_tensor_set(a, x), repeat))
        out["d2h_blocking_gbps"] = gbps(_median_time(lambda: backend_tensor_get(a), repeat))

        def h2d_async() -> None:
            backend_tensor_set_async(be, a, x)
            be.synchronize()

        out["h2d_async_gbps"] = gbps(_median_time(h2d_async, repeat))

        from ggmlpy.backends.cpu.backend import backend_cpu_init
        cpu = backend_cpu_init()

        def h2d_pinned() -> None:
            backend_tensor_copy_async(cpu, be, h, a)
            be.synchronize()

        out["h2d_pinned_gbps"] = gbps(_median_time(h2d_pinned, repeat))

        def d2d() -> None:
            backend_tensor_copy_async(be, be, a, b)
            be.synchronize()

        out["d2d_gbps"] = gbps(_median_time(d2d, repeat))
        ok = np.array_equal(backend_tensor_get(b).reshape(-1), x)
        out["copies_correct"] = bool(ok)
        dbuf.free()
        hbuf.free()

        # mul_mat ------------------------------------------------------------------------------
        K, M, N = mm
        ctx = Context()
        w, v = ctx.new_tensor_2d(Type.F32, K, M), ctx.new_tensor_2d(Type.F32, K, N)
        r = ops.mul_mat(ctx, w, v)
        g = Graph()
        g.build_forward_expand(r)
        mbuf = _place(buft, w, v, r)
        rng = np.random.default_rng(1)
        wx = rng.standard_normal((M, K)).astype(np.float32)
        vx = rng.standard_normal((N, K)).astype(np.float32)
        backend_tensor_set(w, wx)
        backend_tensor_set(v, vx)
        sec = _median_time(lambda: be.graph_compute(g), repeat)
        out["mul_mat_shape_KMN"] = [K, M, N]
        out["mul_mat_gflops"] = round(2.0 * K * M * N / sec / 1e9, 1)
        res = backend_tensor_get(r).reshape(N, M)
        ref = vx[:8].astype(np.float64) @ wx.astype(np.float64).T
        out["mul_mat_max_rel_err"] = float(np.max(np.abs(res[:8] - ref)) / np.max(np.abs(ref)))
        mbuf.free()

        # graph latency ------------------------------------------------------------------------
        ctx = Context()
        p, q = ctx.new_tensor_1d(Type.F32, 1024), ctx.new_tensor_1d(Type.F32, 1024)
        s = ops.add(ctx, p, q)
        g = Graph()
        g.build_forward_expand(s)
        lbuf = _place(buft, p, q, s)
        lbuf.clear(0)
        reps = max(20, repeat * 10)
        out["graph_latency_us"] = round(_median_time(lambda: be.graph_compute(g), reps, 3) * 1e6, 1)
        rets = []
        for _ in range(reps):
            t0 = time.perf_counter()
            be.graph_compute_async(g)
            rets.append(time.perf_counter() - t0)
            be.synchronize()
        out["graph_async_return_us"] = round(statistics.median(rets) * 1e6, 1)
        lbuf.free()
    finally:
        be.free()
    return out


def _fake_cuda_device():
    """CUDA0 of the test suite's NumPy-backed fake CuPy (``tests/fake_cupy.py``): counts launches
    and runs the fused kernels' NumPy emulations; proves nothing about speed."""
    from pathlib import Path  # noqa: PLC0415

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from fake_cupy import fake_cuda_reg  # noqa: PLC0415

    from ggmlpy.backends.kernels import unary  # noqa: PLC0415
    from ggmlpy.core import special  # noqa: PLC0415

    unary._erfc_fn = lambda xp: special.erfc  # the fake has no cupyx.scipy.special: NumPy's erfc
    return fake_cuda_reg(1, capacity=4 << 30).devices[0]


def minilm_launches(dev: Any, model_dir: str | None, fused: bool, n_seq: int = 8) -> dict[str, Any]:
    """Kernel launches per MiniLM evaluation on ``dev`` (full offload, batch ``n_seq``): launches
    and compute nodes per device graph evaluation, per op, and the embeddings (for comparing the
    generic and the fused kernels). ``fused`` True compiles as the registry does (the fused
    :mod:`ggmlpy.backends.cuda.kernels` override wherever it applies), False forces every node
    onto its generic kernel."""
    from ggmlpy.backends import plan as plan_mod  # noqa: PLC0415
    from ggmlpy.backends.cuda import kernels as ck  # noqa: PLC0415
    from ggmlpy.models.bert import BertModel  # noqa: PLC0415

    rt = dev.runtime
    if rt.launch_count() is None:
        return {"launches": f"{dev.name}'s runtime does not count launches"}
    generic = plan_mod.kernels.compile_node
    registry = plan_mod.kernels.REGISTRY
    per_op: dict[str, list[int]] = {}
    evals = {"n": 0, "launches": 0, "nodes": 0}

    def compile_node(xp, node, dst, srcs):
        if fused:
            step = generic(xp, node, dst, srcs)
        else:
            step = registry.entry(node.op).make(xp, node, dst, srcs)
        if step is None or not ck.is_cuda(xp):
            return step  # host plans (the scheduler's CPU splits) are not counted
        key = node.op.name
        if node.op in (Op.UNARY, Op.GLU):  # name the sub-op: "UNARY:GELU_ERF"
            sub = (UnaryOp if node.op == Op.UNARY else GluOp)(int(node.op_params[0]))
            key = f"{key}:{sub.name}"

        def counted() -> None:
            n0 = rt.launch_count()
            step()
            d = rt.launch_count() - n0
            rec = per_op.setdefault(key, [0, 0])
            rec[0] += 1
            rec[1] += d
            evals["launches"] += d
            evals["nodes"] += 1
        return counted

    orig_launch = rt.launch

    def launch(stream, fn):
        evals["n"] += 1
        return orig_launch(stream, fn)

    from ggmlpy.backends.device.backend import AsyncBackend  # noqa: PLC0415

    plan_mod.kernels.compile_node = compile_node
    rt.launch = launch
    replay0 = AsyncBackend.graph_replay
    AsyncBackend.graph_replay = False  # count every node's launches (a replay is one launch)
    try:
        with BertModel.load(model_dir, device=dev, n_gpu_layers=-1) as m:
            emb = m.encode_ids(_minilm_ids(n_seq), batch_size=n_seq)
    finally:
        plan_mod.kernels.compile_node = generic
        del rt.launch
        AsyncBackend.graph_replay = replay0
    n = max(evals["n"], 1)
    return {"fused": fused, "device_evaluations": evals["n"],
            "launches_per_evaluation": round(evals["launches"] / n, 1),
            "nodes_per_evaluation": round(evals["nodes"] / n, 1),
            "launches_per_node": round(evals["launches"] / max(evals["nodes"], 1), 3),
            "by_op_nodes_launches": {k: [v[0] // n, v[1] // n] for k, v in sorted(per_op.items())},
            "_embeddings": emb}


def _minilm_ids(n_seq: int) -> list[list[int]]:
    return [[101] + [1000 + 37 * i + j for j in range(5 + i)] + [102] for i in range(n_seq)]


def minilm_replay(dev: Any, model_dir: str | None, n_seq: int = 8, evals: int = 4) -> dict[str, Any]:
    """Launches per MiniLM evaluation with graph replay (the default): ``evals`` evaluations of
    one batch shape (the first eager, the second captured, the rest replayed), the launches of
    the last one, the backends' replay counters, and the largest difference between the eager
    and the replayed embeddings."""
    from ggmlpy.models.bert import BertModel  # noqa: PLC0415

    rt = dev.runtime
    ids = _minilm_ids(n_seq)
    with BertModel.load(model_dir, device=dev, n_gpu_layers=-1) as m:
        embs, last = [], 0
        for _ in range(evals):
            n0 = rt.launch_count()
            embs.append(m.encode_ids(ids, batch_size=n_seq).astype(np.float64))
            last = rt.launch_count() - n0
        stats: dict[str, int] = {}
        for be in m._backends:
            for k, v in getattr(be, "replay_stats", None).as_dict().items() if hasattr(be, "replay_stats") else ():
                stats[k] = stats.get(k, 0) + v
    return {"evaluations": evals, "launches_last_evaluation": last, "replay_stats": stats,
            "replayed_vs_eager_max_abs_diff": float(max(np.abs(e - embs[0]).max() for e in embs))}


def launches_report(device_name: str | None, model_dir: str | None) -> dict[str, Any]:
    """Launches per MiniLM evaluation with the generic kernels and with the fused kernels, and
    the largest difference between the two runs' embeddings."""
    dev = _fake_cuda_device() if (device_name or "").upper() == "FAKE" else _pick_device(device_name)
    out: dict[str, Any] = {"device": dev.name, "count_scope": (
        "every launch (fake CuPy)" if callable(getattr(dev.runtime.xp, "launch_count", None))
        else "fused kernels only (CuPy has no launch hook)")}
    runs = [minilm_launches(dev, model_dir, fused) for fused in (False, True)]
    if "_embeddings" in runs[0]:
        diff = float(np.abs(runs[0].pop("_embeddings").astype(np.float64)
                            - runs[1].pop("_embeddings").astype(np.float64)).max())
        out["fused_vs_generic_max_abs_diff"] = diff
    out["generic"], out["fused"] = runs
    out["replay"] = minilm_replay(dev, model_dir)
    return out


def _table(res: dict[str, Any]) -> str:
    rows = list(res.items())
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="CUDA0, CUDA1, SIM0 ... (default: CUDA0 if present, else SIM0)")
    ap.add_argument("--copy-mb", type=int, default=256, help="MiB per copy (default 256)")
    ap.add_argument("--mm", default="4096,4096,512", help="mul_mat K,M,N (default 4096,4096,512)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--table", action="store_true", help="also print a table to stderr")
    ap.add_argument("--launches", action="store_true",
                    help="only count kernel launches per MiniLM evaluation (generic vs fused kernels); "
                         "--device FAKE uses the tests' fake CuPy (no GPU needed)")
    ap.add_argument("--model-dir", default=None, help="MiniLM directory (default: the model package)")
    args = ap.parse_args(argv)
    if args.launches:
        print(json.dumps(launches_report(args.device, args.model_dir)))
        return 0
    mm = tuple(int(v) for v in args.mm.split(","))
    if len(mm) != 3:
        ap.error("--mm needs K,M,N")
    res = bench(args.device, args.copy_mb, mm, args.repeat)  # type: ignore[arg-type]
    print(json.dumps(res))
    if args.table:
        print(_table(res), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
