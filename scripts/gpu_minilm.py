"""MiniLM embeddings on a device: accuracy against the fixture and sentences per second (JSON).

Reads a model directory made by ``scripts/trim_minilm.py`` (weights plus ``fixture.json`` with
token ids remapped to the kept vocabulary rows), so it needs neither the model package nor the
tokenizer. Runs the fixture fully offloaded, split (``n_gpu_layers=3``) and split with
``parallel=True``, checking every embedding (max abs difference <= 1e-5, cosine >= 0.99999),
then times 64 sequences (the fixture's, repeated) at batch 32 on each configuration.

Usage: ``python scripts/gpu_minilm.py --model-dir DIR [--device CUDA0]`` (``SIM0`` works too, for
a dry run on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ggmlpy import registry
from ggmlpy.models.bert import BertModel


def run(model_dir: Path, device: str, repeats: int = 3) -> dict:
    """Accuracy and speed per configuration; see the module docstring."""
    fixture = json.loads((model_dir / "fixture.json").read_text())
    ids = fixture["token_ids"]
    ref = np.asarray(fixture["embeddings"], dtype=np.float64)
    if device.upper().startswith("SIM") and registry.dev_by_name(device) is None:
        registry.register_sim_devices(int(device[3:]) + 1)
    out: dict = {"device": device, "n_fixture": len(ids), "configs": []}
    stream = (ids * (64 // len(ids) + 1))[:64]
    for name, ngl, parallel in (("full", -1, False), ("split3", 3, False), ("split3_parallel", 3, True)):
        with BertModel.load(model_dir, device=device, n_gpu_layers=ngl, parallel=parallel) as m:
            emb = m.encode_ids(ids, batch_size=8).astype(np.float64)
            diff = float(np.abs(emb - ref).max())
            cos = float(np.min(np.sum(emb * ref, 1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref, axis=1)))
            m.encode_ids(stream[:32], batch_size=32)  # warm-up
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                m.encode_ids(stream, batch_size=32)
                best = min(best, time.perf_counter() - t0)
            out["configs"].append({
                "config": name, "n_splits": m.n_splits, "devices": m.devices,
                "max_abs_diff": diff, "min_cosine": cos, "ok": diff <= 1e-5 and cos >= 0.99999,
                "sentences_per_s": len(stream) / best})
    out["ok"] = all(c["ok"] for c in out["configs"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--device", default="CUDA0")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    res = run(args.model_dir, args.device, args.repeats)
    print(json.dumps(res, indent=2))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
