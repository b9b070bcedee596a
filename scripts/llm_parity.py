"""How close ggmlpy's Gemma 3 run is to llama.cpp's reference data (``tests/data``); JSON out.

    python scripts/llm_parity.py [--model FILE.gguf] [--threads 2] [--cache-type f16|f32]
        [--flash-attn on|off] [--n-ctx 2048] [--prompts name,name,...] [--no-greedy]
        [--without VARIANT,...] [--all-dot]

Reads ``gemma3_logits.npz`` and ``gemma3_greedy.json`` (made by ``scripts/make_llm_reference.py``
with llama-cpp-python; its header has llama.cpp's settings) and runs the same prompts through
:class:`ggmlpy.models.llm.model.LLM` with the settings given (defaults: those of the reference:
an F16 KV cache, flash attention off, 2048 cells). Per prompt, on the reference's 16384 vocabulary
ids of the logits after the whole prompt: ``max_abs``, ``cosine``, ``top1`` (same arg max over
the whole vocabulary as the reference's top-1); and the greedy 32-token continuation: ``n_same``
(tokens equal before the first difference), ``full`` (all equal, or equal through llama.cpp's
EOG) and, for the gap threshold ``err``, ``first_tie`` (the first step whose llama.cpp top-2 gap
is below ``err``) and ``ok_to_tie`` (``n_same >= first_tie``).

``err`` ("the measured logit error") is the largest first-token ``max_abs`` over the prompts run
(a continuation step differs from the reference by about as much as a first token does); the
summary also gives ``ok_to_tie`` counts for the fixed thresholds 0.1, 0.25 and 0.5.

Experiments (this script only): ``--without`` takes named kernel variants out of the registry
(e.g. ``cpu.jit.rope``, ``cpu.gelu_f16_table,cpu.geglu_f16_table``) to measure each one's effect;
``--all-dot`` runs with ``GGMLPY_QUANT_MATMUL=dot``: every quantized MUL_MAT, prompt batches
included, through the dot kernels (and the CPU's ggml-order variants), every F16 one in
ggml-cpu's order.
The activation rounding follows ``GGMLPY_Q8_ROUNDING`` (default ``native``: ggml-cpu's quantizer
of this machine's architecture; ``ref``: ggml's reference quantizer); the summary names it.

The model file: ``--model``, else ``$GGMLPY_GEMMA3_GGUF``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def _first_below(gaps: list[float], thr: float, n: int) -> int:
    return next((k for k, g in enumerate(gaps) if g < thr), n)


def _drop_variants(names: set[str]) -> None:
    import ggmlpy.backends
    from ggmlpy.backends.kernels.registry import REGISTRY

    ggmlpy.backends.install()
    found = set()
    for op, stack in REGISTRY._overrides.items():
        keep = [e for e in stack if e.name not in names]
        found |= {e.name for e in stack} & names
        REGISTRY._overrides[op] = keep
    if found != names:
        raise SystemExit(f"--without: no variant named {sorted(names - found)}")


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.environ.get("GGMLPY_GEMMA3_GGUF"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-type", choices=("f16", "f32"), default="f16")
    ap.add_argument("--flash-attn", choices=("on", "off"), default="off")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--prompts", default="", help="comma-separated names (default: all)")
    ap.add_argument("--no-greedy", action="store_true")
    ap.add_argument("--label", default="")
    ap.add_argument("--without", default="",
                    help="comma-separated kernel variants taken out of the registry for this "
                         "run (e.g. cpu.jit.rope,cpu.gelu_f16_table,cpu.geglu_f16_table), to "
                         "measure what each one changes")
    ap.add_argument("--all-dot", action="store_true",
                    help="GGMLPY_QUANT_MATMUL=dot: every quantized MUL_MAT through ggml's "
                         "dot kernels (q8 activations), prompt batches included, and every F16 "
                         "one in ggml-cpu's order")
    args = ap.parse_args()
    if not args.model:
        ap.error("--model or $GGMLPY_GEMMA3_GGUF is required")
    sys.path.insert(0, str(ROOT))
    from ggmlpy.core.types import Type
    from ggmlpy.models.llm.model import LLM

    os.environ.setdefault("GGMLPY_WEIGHT_CACHE_MB", "2048")
    if args.without:
        _drop_variants(set(args.without.split(",")))
    if args.all_dot:
        os.environ["GGMLPY_QUANT_MATMUL"] = "dot"
    ref = np.load(DATA / "gemma3_logits.npz")
    cases = json.loads((DATA / "gemma3_greedy.json").read_text())["cases"]
    names = [str(n) for n in ref["names"]]
    lens = ref["prompt_lens"]
    offs = np.concatenate([[0], np.cumsum(lens)])
    want_names = set(args.prompts.split(",")) if args.prompts else set(names)
    ct = Type.F16 if args.cache_type == "f16" else Type.F32
    kw = {"type_k": ct, "type_v": ct}
    if args.flash_attn == "off":
        kw["flash_attn"] = False
    t0 = time.time()
    rows = []
    with LLM.load(args.model, n_ctx=args.n_ctx, n_threads=args.threads, **kw) as m:
        sub = ref["subset_ids"]
        for i, name in enumerate(names):
            if name not in want_names:
                continue
            ids = ref["prompt_ids_concat"][offs[i]:offs[i + 1]]
            m.clear()
            lg = m.eval(ids)
            got = lg[sub].astype(np.float64)
            want = ref["subset_logits"][i].astype(np.float64)
            row = {"name": name,
                   "max_abs": float(np.abs(got - want).max()),
                   "cosine": float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)),
                   "top1": bool(int(lg.argmax()) == int(ref["top_ids"][i][0]))}
            if not args.no_greedy:
                case = cases[i]
                want_ids = case["greedy_ids"]
                m.clear()
                out = list(m.generate(ids.tolist(), len(want_ids)))
                n_same = next((k for k, (a, b) in enumerate(zip(out, want_ids)) if a != b),
                              min(len(out), len(want_ids)))
                row.update(n_same=n_same, n_want=len(want_ids),
                           full=n_same == len(want_ids), gaps=case["top2_gap"])
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "gaps"}), file=sys.stderr)
    err = max(r["max_abs"] for r in rows)
    from ggmlpy.quants import q8_arch

    summary = {"label": args.label, "settings": vars(args), "q8_rounding": q8_arch.env_form(),
               "n_prompts": len(rows),
               "max_abs_max": err, "max_abs_median": float(np.median([r["max_abs"] for r in rows])),
               "cosine_min": min(r["cosine"] for r in rows),
               "top1": sum(r["top1"] for r in rows), "seconds": round(time.time() - t0, 1)}
    n_pass_logits = sum(r["max_abs"] <= 2e-2 and r["cosine"] >= 0.9999 for r in rows)
    summary["logits_within_2e-2_and_cos_0.9999"] = n_pass_logits
    if not args.no_greedy:
        summary["greedy_full"] = sum(r["full"] for r in rows)
        for thr, key in ((err, "ok_to_tie_err"), (0.1, "ok_to_tie_0.1"),
                         (0.25, "ok_to_tie_0.25"), (0.5, "ok_to_tie_0.5")):
            summary[key] = sum(r["n_same"] >= _first_below(r["gaps"], thr, r["n_want"])
                               for r in rows)
        summary["fails_to_err"] = [
            (r["name"], r["n_same"], _first_below(r["gaps"], err, r["n_want"])) for r in rows
            if r["n_same"] < _first_below(r["gaps"], err, r["n_want"])]
    summary["rows"] = [{k: (round(v, 5) if isinstance(v, float) else v)
                        for k, v in r.items() if k != "gaps"} for r in rows]
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
