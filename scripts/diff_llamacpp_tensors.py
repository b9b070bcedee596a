"""Compare ggmlpy's intermediate tensors with llama.cpp's for the same token ids; JSON out.

    python scripts/diff_llamacpp_tensors.py LLAMA.npz --ids 2,818,5279 [--model FILE.gguf]
        [--threads 2] [--all]

``LLAMA.npz`` is ``scripts/dump_llamacpp_tensors.py --ordered`` of the same ids (llama.cpp's F32
nodes in graph order, with their ops). This script evaluates the ids once with
:class:`ggmlpy.models.llm.model.LLM` (flash attention off, F16 KV cache, 2048 cells: the
reference's settings) under a scheduler eval callback (``Scheduler.set_eval_callback``), keeps
every F32 node, and matches each llama.cpp node to the ggmlpy node of the same size whose values
are closest (relative max difference below 1e-2; the two graphs order independent nodes
differently and name them differently). Per llama.cpp node (``--all``) or for the first one that
is not bit-identical (default): its key and op, the matched ggmlpy node, the max abs and relative
difference and how many elements differ. That first tensor names the kernel to look at
(docs/llm-numerics.md). The model file: ``--model``, else ``$GGMLPY_GEMMA3_GGUF``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _ggmlpy_tensors(model: str, ids: list[int], threads: int) -> list[tuple[str, np.ndarray]]:
    from ggmlpy.backend.tensor_data import backend_tensor_get
    from ggmlpy.core.types import Type
    from ggmlpy.models.llm.model import LLM

    out: list[tuple[str, np.ndarray]] = []

    def callback(t, ask):
        if not ask and t.type == Type.F32:
            out.append((f"{len(out):04d}:{t.name}",
                        np.array(backend_tensor_get(t), np.float32).reshape(-1)))
        return True

    with LLM.load(model, n_ctx=2048, n_threads=threads, flash_attn=False) as m:
        m.sched.set_eval_callback(callback)
        m.eval(ids)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("llama", type=Path)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--model", default=os.environ.get("GGMLPY_GEMMA3_GGUF"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--all", action="store_true", help="every llama.cpp node, not the first diff")
    args = ap.parse_args()
    if not args.model:
        ap.error("--model or $GGMLPY_GEMMA3_GGUF is required")
    sys.path.insert(0, str(ROOT))
    ref = np.load(args.llama)
    if "_nodes" not in ref:
        ap.error(f"{args.llama} has no _nodes: dump it with dump_llamacpp_tensors.py --ordered")
    nodes = [json.loads(line) for line in str(ref["_nodes"]).split("\n")]
    mine = _ggmlpy_tensors(args.model, [int(x) for x in args.ids.split(",")], args.threads)
    rows = []
    for n in nodes:
        a = ref[n["key"]].reshape(-1).astype(np.float64)
        fin = np.isfinite(a)
        scale = float(np.abs(a[fin]).max()) if fin.any() else 1.0
        best = None
        for key, b in mine:
            if b.size != a.size or (np.isfinite(b) != fin).any():
                continue
            d = float(np.abs(a[fin] - b[fin]).max()) if fin.any() else 0.0
            if best is None or d < best[1]:
                best = (key, d, int((a[fin] != b[fin]).sum()))
        row = {"llama": n["key"], "op": n["op"], "ne": n["ne"]}
        if best is None or best[1] > 1e-2 * max(scale, 1e-30):
            row["match"] = None
        else:
            row.update(ggmlpy=best[0], max_abs=best[1], rel=best[1] / max(scale, 1e-30),
                       n_diff=best[2], size=a.size)
        rows.append(row)
        if not args.all and row.get("n_diff"):
            break
    first = next((r for r in rows if r.get("n_diff")), None)
    print(json.dumps({"ids": args.ids, "n_llama_nodes": len(nodes), "n_ggmlpy_nodes": len(mine),
                      "first_difference": first, "rows": rows if args.all else []}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
