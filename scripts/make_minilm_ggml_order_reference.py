"""Write llama.cpp's own inputs and outputs of MiniLM's float32 products and LayerNorm (F32 x F32
MUL_MAT: K*Q, KQV, mean pooling; NORM), from the q8_0 GGUF, for
tests/backends/cpu/test_sgemm_f32_llamacpp.py.

Reference tool only: it runs under the reference venv (llama-cpp-python 0.3.36, named by
$GGMLPY_REF_PYTHON; see tests/data/README.md), never under ggmlpy's, and ggmlpy never imports
it. Each id list is encoded once by ``scripts/dump_llamacpp_tensors.py``'s ``dump`` with
``--embedding`` settings (CPU, 2 threads, n_ctx = n_batch = n_ubatch = 512, flash attention
off, ``embeddings = true``, mean pooling, ``llama_encode``; the file:
``python -m ggmlpy convert all-MiniLM-L6-v2 --type q8_0``).

Id lists (``T`` tokens): ``ids_52`` (the 52-token sentence of the public fixture: K*Q on
``ggml_vec_dot_f32``'s scalar tail, KQV with 52 columns on it too), ``ids_32`` and ``ids_70``
([CLS], seeded random ids, [SEP]: KQV through tinyBLAS at 32 columns, through
``ggml_vec_dot_f32``'s 64-wide FMA part and a tail at 70). Per list, suffix ``_T``, of layer 0,
heads 0-1 only (the first 64 of 384 columns):

* ``q``, ``k``: ``Qcur-0`` / ``Kcur-0`` after their biases ``(T, 2, 32)``; ``kq``: ``kq-0``
  ``(2, T, T)`` (ne ``[T_kv, T_q, head]`` reversed);
* ``v_cont``: ``v_cont-0`` ``(2, 32, T)``, ``soft_max``: ``kq_soft_max-0`` ``(2, T, T)``,
  ``kqv``: ``kqv-0`` ``(2, T, 32)``;
* ``norm_in``: ``inp_embd`` rows 0-3 ``(4, 384)``, ``norm_out``: ``norm-0`` (the first NORM)
  rows 0-3;
* ``pool_in``: the first 32 rows of ``result_embd (transposed) (cont)`` ``(32, T)``,
  ``pool_out``: ``result_embd_pooled``'s first 32 values (``mul_mat(x^T, inp_mean)``, one
  column: ``ggml_vec_dot_f32``).

Rerun::

    $GGMLPY_REF_PYTHON scripts/make_minilm_ggml_order_reference.py --model minilm-q8_0.gguf
        [--out tests/data/minilm_ggml_order.npz]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT.parent / "shared" / "fixtures" / "minilm_public.json"
HEADS, D, NORM_ROWS, POOL_ROWS = 2, 32, 4, 32


def _ids() -> dict[int, list[int]]:
    fx = json.loads(FIXTURE.read_text())
    out = {52: next(t for t in fx["token_ids"] if len(t) == 52)}
    rng = np.random.default_rng(20261202)
    for n in (32, 70):
        out[n] = [101] + [int(v) for v in rng.integers(1000, 20000, n - 2)] + [102]
    return out


def _node(store: dict[str, np.ndarray], name: str, i: int = 0) -> np.ndarray:
    keys = [k for k in store if ":" in k and k.split(":", 1)[1] == name]
    return store[keys[i]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", type=Path, required=True, help="the MiniLM q8_0 GGUF file")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "minilm_ggml_order.npz")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    import llama_cpp
    from dump_llamacpp_tensors import dump

    store: dict[str, np.ndarray] = {}
    for T, ids in _ids().items():
        s = dump(args.model, ids, embedding=True, threads=2, ordered=True)
        c = HEADS * D
        q = _node(s, "Qcur-0", 1).reshape(T, 384)[:, :c].reshape(T, HEADS, D)
        k = _node(s, "Kcur-0", 1).reshape(T, 384)[:, :c].reshape(T, HEADS, D)
        store[f"ids_{T}"] = np.asarray(ids, np.int32)
        store[f"q_{T}"], store[f"k_{T}"] = q, k
        store[f"kq_{T}"] = _node(s, "kq-0")[0, :HEADS]
        store[f"v_cont_{T}"] = _node(s, "v_cont-0")[0, :HEADS]
        store[f"soft_max_{T}"] = _node(s, "kq_soft_max-0")[0, :HEADS]
        store[f"kqv_{T}"] = _node(s, "kqv-0")[0, :HEADS]
        store[f"norm_in_{T}"] = _node(s, "inp_embd").reshape(T, 384)[:NORM_ROWS]
        store[f"norm_out_{T}"] = _node(s, "norm-0").reshape(T, 384)[:NORM_ROWS]
        store[f"pool_in_{T}"] = _node(s, "result_embd (transposed) (cont)").reshape(384, T)[:POOL_ROWS]
        store[f"pool_out_{T}"] = _node(s, "result_embd_pooled").reshape(384)[:POOL_ROWS]
    store["meta_json"] = np.array(json.dumps({
        "tool": "llama-cpp-python", "llama_cpp_python_version": llama_cpp.__version__,
        "model": args.model.name, "n_threads": 2, "flash_attn": False, "embedding": True,
        "pooling_type": 1, "layer": 0, "heads": HEADS}))
    np.savez_compressed(args.out, **store)
    print(f"{args.out}: {len(store)} arrays, {args.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
