"""Write llama.cpp's own inputs and outputs of the products whose float32 order ggmlpy's CPU
variants reproduce (F16 MUL_MAT, SOFT_MAX, Q4_K and Q6_K MUL_MAT), from the Gemma 3 270M Q4_K_M
file, for tests/backends/cpu/test_ggml_order_llamacpp.py.

Reference tool only: it runs under the reference venv (llama-cpp-python 0.3.36 and gguf, named
by $GGMLPY_REF_PYTHON; see tests/data/README.md), never under ggmlpy's, and ggmlpy never imports
it. Settings as scripts/make_llm_reference.py: CPU, 2 threads, n_ctx 2048, n_batch = n_ubatch =
512, flash attention off, F16 KV cache, the model loaded with llama.cpp's defaults (the Q4_K
weights in the CPU_REPACK buffer).

It decodes the 9 prompt ids ``PROMPT`` (the ``french`` case of tests/data/gemma3_greedy.json),
then the single id ``NEXT`` (its greedy continuation's first id), with a scheduler eval callback
(``llama_context_params.cb_eval``), and keeps, of layer 0 of each decode (suffix ``_p`` for the
prompt, 9 rows, ``_g`` for the generated token, 1 row):

* ``kq_in_q``: the scaled query (the SCALE of ``Qcur-0``) ``(1, T, 4, 256)``,
  ``k_cache``: ``Kcur-0`` rows of this decode and the prompt's ``(T_all, 256)``, ``kq``: ``kq-0``
  ``(1, 4, T, 256)`` (F16 x F16, 256 cells: tinyBLAS for 9 rows, ``ggml_vec_dot_f16`` for 1);
* ``mask``: the KQ mask rows ``(T, 256)`` this decode used (0 / -inf; SWA layer 0), ``soft_max``:
  ``kq_soft_max-0``;
* ``v_cache``: ``Vcur-0`` rows ``(T_all, 256)``, ``kqv``: ``kqv-0`` ``(1, 4, T, 256)``;
* ``attn_in``: ``kqv_out-0`` ``(T, 1024)``, ``attn_out``: the attention output projection
  ``(T, 64)`` (its first 64 of 640 columns; Q4_K, repacked: gemm for 8 rows, gemv for the 9th
  and for 1);
* ``ffn_in``: ``ffn_geglu-0`` ``(T, 2048)``, ``ffn_out``: ``ffn_out-0`` ``(T, 64)`` (first 64
  columns; Q6_K: the tiled kernel for 9 rows, ``ggml_vec_dot_q6_K_q8_K`` for 1);

and ``w_attn_output`` / ``w_ffn_down``: the first 64 rows of ``blk.0.attn_output.weight`` (Q4_K)
and ``blk.0.ffn_down.weight`` (Q6_K) as stored bytes ``(64, row bytes)``, read with ``gguf``.

Rerun::

    $GGMLPY_REF_PYTHON scripts/make_ggml_order_reference.py [--model FILE]
        [--out tests/data/ggml_order_gemma3.npz]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
from pathlib import Path

import numpy as np

PROMPT = [2, 12834, 19068, 3037, 16886, 3037, 35256, 64046, 2947]
NEXT = 23144
COLS = 64


class _Tensor(ctypes.Structure):
    """The head of ggml.h ``struct ggml_tensor`` up to ``name`` (GGML_MAX_DIMS 4, 10 srcs)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p),
                ("name", ctypes.c_char * 64)]


def _array(tt: _Tensor) -> np.ndarray:
    ne = list(tt.ne)
    n = ne[0] * ne[1] * ne[2] * ne[3]
    buf = ctypes.cast(tt.data, ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(buf, shape=(n,)).copy().reshape(ne[3], ne[2], ne[1], ne[0])


#: llama.cpp's tensor names -> keys (the last tensor of a name wins: Kcur-0 after RoPE, Vcur-0
#: reshaped)
WANT = {"Kcur-0": "k", "Vcur-0": "v", "kq-0": "kq", "kq_soft_max-0": "soft_max", "kqv-0": "kqv",
        "kqv_out-0": "attn_in", "ffn_geglu-0": "ffn_in", "ffn_out-0": "ffn_out"}
GGML_OP_MUL_MAT, GGML_OP_SCALE = 29, 32


def _src_name(tt: _Tensor, i: int) -> str:
    p = tt.src[i]
    return ctypes.cast(p, ctypes.POINTER(_Tensor)).contents.name.decode() if p else ""


def _decodes(model_path: Path) -> list[dict[str, np.ndarray]]:
    import llama_cpp

    cur: dict[str, np.ndarray] = {}

    @llama_cpp.ggml_backend_sched_eval_callback
    def callback(t, ask, _user_data):
        if ask:
            return True
        tt = ctypes.cast(t, ctypes.POINTER(_Tensor)).contents
        name = tt.name.decode()
        contiguous = tt.nb[0] == 4 and tt.nb[1] == 4 * tt.ne[0]
        if tt.type != 0 or not tt.data or not contiguous:
            return True
        if name in WANT:
            cur[WANT[name]] = _array(tt)
        elif tt.op == GGML_OP_SCALE and _src_name(tt, 0) == "Qcur-0":
            cur["kq_in_q"] = _array(tt)
        elif tt.op == GGML_OP_MUL_MAT and _src_name(tt, 1) == "kqv_out-0":
            cur["attn_out"] = _array(tt)
        return True

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(),
                                                 llama_cpp.llama_model_default_params())
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 2048, 512, 512
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.cb_eval = callback
    ctx = llama_cpp.llama_init_from_model(model, cp)
    out = []
    for ids in (PROMPT, [NEXT]):
        cur.clear()
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(ids))) != 0:
            raise RuntimeError("llama_decode failed")
        out.append(dict(cur))
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return out


def main() -> int:
    from gguf import GGUFReader

    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=os.environ.get("GGMLPY_GEMMA3_GGUF"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent
                    / "tests" / "data" / "ggml_order_gemma3.npz")
    args = ap.parse_args()
    if args.model is None:
        ap.error("--model or $GGMLPY_GEMMA3_GGUF is required")
    prompt, gen = _decodes(args.model)
    store: dict[str, np.ndarray] = {}
    for sfx, d in (("_p", prompt), ("_g", gen)):
        for k, v in d.items():
            if k in ("k", "v"):
                v = v.reshape(-1, 256)
            elif k in ("attn_in", "attn_out", "ffn_in", "ffn_out"):
                v = v.reshape(-1, v.shape[-1])
                if k in ("attn_out", "ffn_out"):
                    v = v[:, :COLS]
            store[k + sfx] = np.ascontiguousarray(v)
    for k in ("k", "v"):                      # the cache rows the generated token reads
        store[f"{k}_cache_g"] = np.concatenate([store[f"{k}_p"], store[f"{k}_g"]])
        store[f"{k}_cache_p"] = store.pop(f"{k}_p")
        store.pop(f"{k}_g")
    r = GGUFReader(str(args.model))
    t = {x.name: x for x in r.tensors}
    store["w_attn_output"] = np.asarray(t["blk.0.attn_output.weight"].data)[:COLS].copy()
    store["w_ffn_down"] = np.asarray(t["blk.0.ffn_down.weight"].data)[:COLS].copy()
    import llama_cpp

    store["meta_json"] = np.array(json.dumps({
        "tool": "llama-cpp-python", "version": llama_cpp.__version__, "prompt": PROMPT,
        "next": NEXT, "settings": "CPU, 2 threads, n_ctx 2048, n_batch=n_ubatch=512, -fa off, "
                                  "F16 KV cache", "model": args.model.name}))
    np.savez_compressed(args.out, **store)
    print(f"{args.out}: {sorted(store)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
