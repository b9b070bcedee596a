"""Write llama.cpp's sampler-chain draws for ggmlpy's sampling tests (tests/data/llm_sampling_ref.npz).

Reference tool only: run it with the reference venv (llama-cpp-python; never a dependency of
ggmlpy, never imported by the tests)::

    $GGMLPY_REF_PYTHON scripts/make_llm_sampling_reference.py [--out tests/data/llm_sampling_ref.npz]

For each case (settings below) it builds llama.cpp's common chain with llama-cpp-python's
low-level API: ``llama_sampler_init_penalties(n_vocab, last_n, repeat, freq, present)`` ->
``top_k(k)`` -> ``top_p(p, min_keep)`` -> ``min_p(p, min_keep)`` -> ``temp_ext(t, 0, 1)`` ->
``dist(seed)``, feeds it the case's prompt tokens with ``llama_sampler_accept``, then for each
step applies the chain to that step's logits (``llama_sampler_apply`` on a
``llama_token_data_array`` of all ids in id order), records the selected id and accepts it.
Logits: float32 standard normals times 2.5 from ``numpy.random.default_rng(1000 + case)``, stored
in the file. No model is involved.

Stored: ``meta`` (JSON: tool, llama-cpp-python version, the case settings), and per case ``i``:
``logits_i`` float32 [steps, n_vocab], ``prompt_i`` int32, ``ids_i`` int32 [steps].
"""

from __future__ import annotations

import argparse
import ctypes
import json

import numpy as np

CASES = [
    # sampler settings per case (penalties' last_n -1: the whole history)
    dict(temp=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat=1.0, last_n=64, freq=0.0, present=0.0,
         min_keep=0, seed=1),
    dict(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat=1.0, last_n=64, freq=0.0, present=0.0,
         min_keep=0, seed=2),
    dict(temp=1.3, top_k=0, top_p=0.9, min_p=0.0, repeat=1.0, last_n=64, freq=0.0, present=0.0,
         min_keep=0, seed=3),
    dict(temp=0.7, top_k=0, top_p=1.0, min_p=0.1, repeat=1.0, last_n=64, freq=0.0, present=0.0,
         min_keep=0, seed=4),
    dict(temp=0.9, top_k=20, top_p=0.8, min_p=0.02, repeat=1.3, last_n=16, freq=0.2, present=0.4,
         min_keep=0, seed=5),
    dict(temp=0.0, top_k=40, top_p=0.95, min_p=0.05, repeat=1.1, last_n=8, freq=0.0, present=0.0,
         min_keep=0, seed=6),
    dict(temp=1.5, top_k=5, top_p=0.5, min_p=0.0, repeat=1.0, last_n=0, freq=0.0, present=0.0,
         min_keep=3, seed=7),
    dict(temp=0.6, top_k=500, top_p=0.99, min_p=0.01, repeat=1.05, last_n=-1, freq=0.1, present=0.0,
         min_keep=0, seed=8),
]
N_VOCAB, STEPS, PROMPT = 300, 24, 12


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/llm_sampling_ref.npz")
    args = ap.parse_args()
    import llama_cpp as L

    out: dict[str, np.ndarray] = {}
    for ci, c in enumerate(CASES):
        rng = np.random.default_rng(1000 + ci)
        logits = (rng.standard_normal((STEPS, N_VOCAB)) * 2.5).astype(np.float32)
        prompt = rng.integers(0, N_VOCAB, size=PROMPT).astype(np.int32)
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        last_n = c["last_n"] if c["last_n"] >= 0 else STEPS + PROMPT  # -1: the whole history
        penalties = L.llama_sampler_init_penalties(N_VOCAB, last_n, c["repeat"], c["freq"], c["present"])
        L.llama_sampler_chain_add(chain, penalties)
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(c["top_k"]))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(c["top_p"], c["min_keep"]))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(c["min_p"], c["min_keep"]))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp_ext(c["temp"], 0.0, 1.0))
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(c["seed"]))
        for t in prompt.tolist():
            L.llama_sampler_accept(chain, t)
        ids = []
        for step in range(STEPS):
            data = (L.llama_token_data * N_VOCAB)()
            for i in range(N_VOCAB):
                data[i].id, data[i].logit, data[i].p = i, float(logits[step, i]), 0.0
            arr = L.llama_token_data_array(data=ctypes.cast(data, L.llama_token_data_p), size=N_VOCAB,
                                           selected=-1, sorted=False)
            L.llama_sampler_apply(chain, ctypes.byref(arr))
            tok = int(arr.data[arr.selected].id)
            ids.append(tok)
            L.llama_sampler_accept(chain, tok)
        L.llama_sampler_free(chain)
        out[f"logits_{ci}"] = logits
        out[f"prompt_{ci}"] = prompt
        out[f"ids_{ci}"] = np.array(ids, np.int32)
    meta = {"tool": "llama-cpp-python", "llama_cpp_python_version": L.__version__,
            "script": "scripts/make_llm_sampling_reference.py", "n_vocab": N_VOCAB, "steps": STEPS,
            "prompt_len": PROMPT, "cases": CASES,
            "what": "llama.cpp chain penalties -> top_k -> top_p -> min_p -> temp_ext -> dist, seeded"}
    out["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    np.savez_compressed(args.out, **out)
    print(args.out, {k: v.shape for k, v in out.items() if k.startswith("ids_")})


if __name__ == "__main__":
    main()
