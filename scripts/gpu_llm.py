"""Generation on a device against ggmlpy's CPU, on a random-weight model of Gemma 3 270M's shape.

    python scripts/gpu_llm.py [--device CUDA0] [--n-vocab 262144] [--n-layer 18] [--prompt 128]
        [--gen 32] [--threads 2] [--file PATH] [--seed 0]

The real GGUF (253 MB) does not travel to the GPU machine, so this script writes one of the same
architecture with :func:`ggmlpy.models.llm.tiny.write_tiny_gguf`: Gemma 3 270M's metadata and
tensor shapes (18 blocks, n_embd 640, 4 query heads on 1 KV head of 256, FFN 2048, sliding
window 512 on five of every six layers, tied output, ``--n-vocab`` tokens) and random weights in
the file's tensor types (Q8_0 embeddings, Q5_0/Q8_0/Q4_K/Q6_K blocks, F32 norms). Then it loads
the file twice, on the CPU and with every layer on ``--device`` (``-ngl`` all), and for each
measures the load, a ``--prompt``-token prompt (tokens/s) and ``--gen`` greedy one-token steps
(tokens/s), and compares the two: the prompt's last logits (max |diff| relative to the largest
|logit|) and the greedy tokens (the prefix on which they agree; random weights have near ties,
so the comparison stops at the first step whose top-2 gap on the CPU is under 1e-3).

The CPU has two numerics, and the file is also run a second time on the CPU with the exact one
(untimed): by default it computes as ggml-cpu does (activations quantized to the weight's
``vec_dot_type``, ggml's f16 GELU table and float32 RoPE angles), which SIM and RAY devices share
(they run the same NumPy kernels); ``GGMLPY_QUANT_MATMUL=dequant`` with ``GGMLPY_PRECISE_KERNELS=1``
gives float32 products of the dequantized weights and the float64 referee kernels, which is what
the CUDA kernels compute (dequantized rows, float GEMMs). The device is compared with the
nearer of the two (``referee`` in the output); both distances are printed.

``--device SIM0`` runs the same thing on the host-emulated device (the CUDA backend's code paths
without a GPU) as a dry run; a smaller ``--n-vocab`` and ``--n-layer`` keep that quick. Prints one JSON object;
exit status 0 when the device's logits are within 1e-3 (relative) of the referee's and the greedy
prefixes agree, 1 otherwise, 2 when the device does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
REL_TOL = 1e-3
MIN_GAP = 1e-3
#: the CPU's exact numerics (read when plans are built, i.e. at load)
EXACT_ENV = {"GGMLPY_QUANT_MATMUL": "dequant", "GGMLPY_PRECISE_KERNELS": "1"}


def gemma3_270m_config(n_vocab: int, n_layer: int = 18):
    """Gemma 3 270M's sizes as a :class:`~ggmlpy.models.llm.tiny.TinyConfig`."""
    from ggmlpy.models.llm.tiny import TinyConfig

    return TinyConfig(n_layer=n_layer, n_embd=640, n_head=4, n_head_kv=1, head_dim=256, n_ff=2048,
                      n_vocab=n_vocab, n_ctx_train=32768, n_swa=512, tied=True)


def write_model(path: Path, n_vocab: int, seed: int, n_layer: int = 18) -> float:
    """Write the random-weight file; returns the seconds it took."""
    from ggmlpy.models.llm.tiny import write_tiny_gguf

    t = time.perf_counter()
    write_tiny_gguf(path, "gemma3", seed=seed, config=gemma3_270m_config(n_vocab, n_layer),
                    extra_metadata={"general.name": "Gemma 3 270m shape, random weights",
                                    "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
                                    "general.file_type": 15})
    return time.perf_counter() - t


def run(path: Path, device: str, threads: int, ids: list[int], gen: int) -> dict:
    """Load on ``device`` (all layers) or the CPU; prompt logits, timings and greedy tokens."""
    from ggmlpy.models.llm.model import LLM

    ngl = 0 if device.upper() == "CPU" else -1
    t = time.perf_counter()
    m = LLM.load(path, device=device, n_gpu_layers=ngl, n_threads=threads,
                 n_ctx=len(ids) + gen + 8, n_ubatch=512)
    load_s = time.perf_counter() - t
    try:
        m.eval(ids[:8])  # first use: kernels and weight copies made, not timed
        m.clear()
        t = time.perf_counter()
        logits = m.eval(ids)
        pp_s = time.perf_counter() - t
        tokens, gaps = [], []
        cur = logits
        t = time.perf_counter()
        for _ in range(gen):
            top2 = np.sort(cur)[-2:]
            gaps.append(float(top2[1] - top2[0]))
            tok = int(np.argmax(cur))
            tokens.append(tok)
            cur = m.eval([tok])
        tg_s = time.perf_counter() - t
        devices = m.devices
    finally:
        m.close()
    return {"devices": devices, "load_s": load_s, "prompt_tok_s": len(ids) / pp_s,
            "gen_tok_s": gen / tg_s, "logits": logits, "tokens": tokens, "gaps": gaps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--device", default="CUDA0")
    p.add_argument("--n-vocab", type=int, default=262144)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-layer", type=int, default=18, help="blocks (fewer: a quicker dry run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--file", default=None, help="where to write the GGUF (default: a temp dir)")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from ggmlpy.backend import registry
    from ggmlpy.cli_names import register_named_devices

    register_named_devices([a.device], "gpu_llm")
    why = registry.device_unavailable_reason(a.device)
    if why:
        print(json.dumps({"device": a.device, "unavailable": why}))
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(a.file) if a.file else Path(tmp) / "gemma3-270m-shape-random.gguf"
        write_s = write_model(path, a.n_vocab, a.seed, a.n_layer)
        size_mib = path.stat().st_size / 2**20
        rng = np.random.default_rng(1)
        ids = [2] + rng.integers(300, a.n_vocab, a.prompt - 1).tolist()
        cpu = run(path, "CPU", a.threads, ids, a.gen)
        saved = {k: os.environ.get(k) for k in EXACT_ENV}
        os.environ.update(EXACT_ENV)
        try:
            exact = run(path, "CPU", a.threads, ids, a.gen)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        dev = run(path, a.device, a.threads, ids, a.gen)
    rels = {name: float(np.abs(dev["logits"] - ref["logits"]).max())
            / float(np.abs(ref["logits"]).max()) for name, ref in (("cpu", cpu), ("cpu_exact", exact))}
    referee = min(rels, key=rels.get)
    ref = cpu if referee == "cpu" else exact
    rel = rels[referee]
    n_cmp = next((i for i, g in enumerate(ref["gaps"]) if g < MIN_GAP), a.gen)
    agree = next((i for i in range(n_cmp) if ref["tokens"][i] != dev["tokens"][i]), n_cmp)
    ok = rel <= REL_TOL and agree == n_cmp
    out = {
        "device": a.device, "devices": dev["devices"], "n_vocab": a.n_vocab,
        "n_layer": a.n_layer,
        "file_mib": size_mib, "write_s": write_s, "prompt_tokens": a.prompt, "gen_tokens": a.gen,
        "threads": a.threads,
        "cpu": {k: cpu[k] for k in ("load_s", "prompt_tok_s", "gen_tok_s")},
        "dev": {k: dev[k] for k in ("load_s", "prompt_tok_s", "gen_tok_s")},
        "ratio_prompt_dev_over_cpu": dev["prompt_tok_s"] / cpu["prompt_tok_s"],
        "ratio_gen_dev_over_cpu": dev["gen_tok_s"] / cpu["gen_tok_s"],
        "referee": referee, "prompt_logits_max_rel_diff": rel,
        "max_rel_diff_vs": rels, "rel_tol": REL_TOL,
        "greedy_steps_compared": n_cmp, "greedy_steps_agreeing": agree,
        "cpu_tokens": cpu["tokens"], "cpu_exact_tokens": exact["tokens"],
        "dev_tokens": dev["tokens"], "ok": ok,
    }
    print(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
