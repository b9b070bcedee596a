"""Dump llama.cpp's intermediate tensors for one prompt, to debug a graph layer by layer.

Reference-tool script (run under the reference venv with llama-cpp-python; never imported by
ggmlpy). It decodes the given token ids once with llama.cpp's low-level API and a scheduler eval
callback (``llama_context_params.cb_eval``, ggml-backend ``ggml_backend_sched_eval_callback``)
and saves every contiguous F32 tensor the graph computes, keyed by llama.cpp's own names
(``inp_scaled``, ``attn_norm-0``, ``Qcur_normed-0``, ``Kcur-0``, ``kq_soft_max-0``, ``kqv_out-0``,
``sa_out-0``, ``ffn_out-0``, ``l_out-0`` ... ``result_norm``, ``result_output``), as NumPy arrays
of shape ne reversed (ne3, ne2, ne1, ne0). On the last layer llama.cpp keeps only the output rows
(the last token); a name several nodes carry is stored as ``name``, ``name#2`` ... in graph
order. ``kq``/``kq_soft_max`` span the padded KV cache (n_kv >= n_tokens).

Settings as in make_llm_reference.py: CPU, 2 threads, n_ctx 2048, n_batch = n_ubatch = 512,
flash attention off, default F16 KV cache.

``--embedding`` (an encoder such as BERT, e.g. all-MiniLM-L6-v2): the context is made with
``embeddings = true`` and ``pooling_type`` MEAN (as ``Llama(file, embedding=True,
pooling_type=1)``), n_ctx = n_batch = n_ubatch = 512, and the ids are run with
``llama_encode`` (no KV cache: every tensor has all the tokens; BERT's names are
``inp_embd``, ``inp_norm``, ``Qcur-0``, ``Kcur-0``, ``Vcur-0``, ``kq-0``, ``kq_soft_max-0``,
``kqv_out-0``, ``attn_out-0``, ``ffn_inp-0``, ``ffn_up-0``, ``ffn_gelu-0``, ``ffn_out-0``,
``l_out-0`` ..., ``result_norm``, ``result_embd_pooled``). The pooled embedding itself (before
any normalisation) is stored as ``embd_pooled`` (``llama_get_embeddings_seq``).

``--ordered``: every F32 node is kept in graph order under the key ``NNNN:name`` instead, and
``_nodes`` holds one JSON line per kept node (key, ggml op number, type, ne, and each source's
name, type and ne), to tell which kernel computed it and to find the first tensor that differs
from another run of the same ids.

Usage: ``$GGMLPY_REF_PYTHON scripts/dump_llamacpp_tensors.py --ids 2,818,5279 OUT.npz
[--model PATH] [--embedding] [--threads 2] [--ordered]``
"""

from __future__ import annotations

import argparse
import ctypes
import os
from pathlib import Path

import numpy as np


class _Tensor(ctypes.Structure):
    """The head of ggml.h ``struct ggml_tensor`` up to ``name`` (GGML_MAX_DIMS 4, 10 srcs)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p),
                ("name", ctypes.c_char * 64)]


def _src_info(p: int) -> list:
    t = ctypes.cast(p, ctypes.POINTER(_Tensor)).contents
    return [t.name.decode(), t.type, list(t.ne)]


def dump(model_path: Path, ids: list[int], embedding: bool = False,
         threads: int = 2, ordered: bool = False) -> dict[str, np.ndarray]:
    """Run ``ids`` once and return every contiguous F32 tensor by name, or with ``ordered`` in
    graph order with a ``_nodes`` table (module docstring)."""
    import json

    import llama_cpp

    store: dict[str, np.ndarray] = {}
    nodes: list[str] = []

    @llama_cpp.ggml_backend_sched_eval_callback
    def callback(t, ask, _user_data):
        if ask:
            return True
        tt = ctypes.cast(t, ctypes.POINTER(_Tensor)).contents
        ne, nb = list(tt.ne), list(tt.nb)
        contiguous = nb[0] == 4 and nb[1] == 4 * ne[0] and nb[2] == nb[1] * ne[1] \
            and nb[3] == nb[2] * ne[2]
        if tt.type == 0 and tt.data and contiguous:  # GGML_TYPE_F32
            n = ne[0] * ne[1] * ne[2] * ne[3]
            buf = ctypes.cast(tt.data, ctypes.POINTER(ctypes.c_float))
            name = tt.name.decode()
            key, k = name, 1
            if ordered:
                key = f"{len(nodes):04d}:{name}"
                nodes.append(json.dumps({"key": key, "op": tt.op, "type": tt.type, "ne": ne,
                                         "src": [_src_info(p) for p in tt.src if p]}))
            while key in store:  # a name given to several nodes: name, name#2, name#3 ...
                k += 1
                key = f"{name}#{k}"
            store[key] = np.ctypeslib.as_array(buf, shape=(n,)).copy().reshape(
                ne[3], ne[2], ne[1], ne[0])
        return True

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(),
                                                 llama_cpp.llama_model_default_params())
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = (512 if embedding else 2048), 512, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if embedding:
        cp.embeddings = True
        cp.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    cp.cb_eval = callback
    ctx = llama_cpp.llama_init_from_model(model, cp)
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    if embedding:
        batch = llama_cpp.llama_batch_init(len(ids), 0, 1)
        batch.n_tokens = len(ids)
        for i, t in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, True
        rc = llama_cpp.llama_encode(ctx, batch)
        if rc == 0:
            hidden = llama_cpp.llama_model_n_embd(model)
            p = llama_cpp.llama_get_embeddings_seq(ctx, 0)
            store["embd_pooled"] = np.ctypeslib.as_array(p, shape=(hidden,)).copy()
        llama_cpp.llama_batch_free(batch)
    else:
        rc = llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(ids)))
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")
    if ordered:
        store["_nodes"] = np.array("\n".join(nodes))
    return store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("out", type=Path)
    ap.add_argument("--ids", required=True, help="comma-separated token ids (include the BOS)")
    ap.add_argument("--model", type=Path, default=os.environ.get("GGMLPY_GEMMA3_GGUF"),
                    required="GGMLPY_GEMMA3_GGUF" not in os.environ,
                    help="the GGUF file (default: $GGMLPY_GEMMA3_GGUF, the Gemma 3 270M Q4_K_M)")
    ap.add_argument("--embedding", action="store_true",
                    help="an encoder (BERT): embeddings on, mean pooling, llama_encode")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ordered", action="store_true",
                    help="every F32 node in graph order (keys NNNN:name; _nodes: ops, sources)")
    args = ap.parse_args()
    store = dump(args.model, [int(x) for x in args.ids.split(",")], args.embedding, args.threads,
                 args.ordered)
    np.savez_compressed(args.out, **store)
    print(f"{args.out}: {len(store)} tensors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
