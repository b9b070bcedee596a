"""Cross-check ``tests/data/gemma3_logits.npz`` against a float64 NumPy forward of the GGUF.

Reference-tool script (run under the reference venv, needs numpy and gguf; never imported by
ggmlpy). It dequantizes every weight of the Gemma 3 file with gguf-py (``gguf.quants.dequantize``)
and runs the graph that llama.cpp builds for ``gemma3`` (llama.cpp src/models/gemma3.cpp) in
float64: embeddings times sqrt(n_embd); per layer RMSNorm -> Q/K/V -> RMSNorm of each Q and K head
(attn_q_norm / attn_k_norm) -> RoPE NEOX (rotating x[i] with x[i + head_dim/2]; base 10000 on the
sliding-window layers, ``gemma3.rope.freq_base`` on every 6th layer, il % 6 == 5) -> Q times
1/sqrt(head_dim) -> causal attention, GQA, keys older than ``sliding_window`` masked on the SWA
layers (masked when pos_q - pos_k >= n_swa) -> attn_output -> post_attention_norm -> residual ->
ffn_norm -> GeGLU (gelu_tanh(gate) * up) -> ffn_down -> post_ffw_norm -> residual; final norm
and the output tied to ``token_embd``. The file's norm weights already include Gemma's +1.

It prints JSON: per prompt the max |diff| and relative L2 error over the 16384 stored logits and
whether the argmax agrees. With ``--emulate`` it also applies llama.cpp's CPU roundings (see
``VEC_DOT_BLOCK``). Fed llama.cpp's own input of each layer (scripts/dump_llamacpp_tensors.py),
the emulated layers match llama.cpp's outputs to 1e-5..1e-8 relative (layer 0: 1e-3, from
rounding flips in its outlier-heavy activations), so the graph is the same; end to end the
differences still grow to a few percent of the logits' L2 norm, with or without emulation, because
each Q8 rounding flip is amplified by the later layers.

Usage: ``$GGMLPY_REF_PYTHON scripts/check_gemma3_numpy.py [--model PATH] [--data DIR]
[--names a,b,...]``
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np


def load(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    w = {}
    for t in reader.tensors:
        w["type:" + t.name] = t.tensor_type.name
        shape = [int(x) for x in reversed(t.shape.tolist())]
        w[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    f = reader.fields

    def val(key):
        return f[key].contents()

    hp = {"n_layer": val("gemma3.block_count"), "n_embd": val("gemma3.embedding_length"),
          "n_head": val("gemma3.attention.head_count"),
          "n_head_kv": val("gemma3.attention.head_count_kv"),
          "head_dim": val("gemma3.attention.key_length"),
          "eps": val("gemma3.attention.layer_norm_rms_epsilon"),
          "base_global": val("gemma3.rope.freq_base"), "base_swa": 10000.0,
          "n_swa": val("gemma3.attention.sliding_window"), "swa_pattern": 6}
    return w, hp


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_neox(x, pos, base):
    d = x.shape[-1]
    half = d // 2
    theta = pos[:, None] * base ** (-2.0 * np.arange(half) / d)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


# llama.cpp's CPU roundings, applied when ``emulate`` is on: the activation operand of a quantized
# mul_mat is quantized to the weight type's vec_dot_type (Q8_K blocks of 256 for Q4_K/Q6_K,
# ggml-cpu quants quantize_row_q8_K; Q8_0 blocks of 32 for Q5_0/Q8_0), the F16 KV cache rounds K
# and V, the F16 K/V mul_mats round their other operand (Q, the softmax) to F16, and GELU is read
# from ggml's F16 table (ggml-cpu vec.h ggml_vec_geglu_f32).
VEC_DOT_BLOCK = {"Q4_K": 256, "Q6_K": 256, "Q5_0": 32, "Q8_0": 32}


def _q8(x, block):
    shape = x.shape
    xb = x.reshape(-1, block)
    amax = np.abs(xb).max(-1, keepdims=True)
    d = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32).astype(np.float64)
    q = np.clip(np.round(xb / d), -127, 127)
    if block == 32:
        d = d.astype(np.float16).astype(np.float64)  # block_q8_0 keeps d as F16
    return (q * d).reshape(shape)


def _f16(x):
    return x.astype(np.float16).astype(np.float64)


def _mm(w, name, x, emulate):
    if emulate:
        x = _q8(x.astype(np.float32).astype(np.float64), VEC_DOT_BLOCK[w["type:" + name]])
    return x @ w[name].T.astype(np.float64)


def last_logits(w, hp, ids, emulate: bool = False) -> np.ndarray:
    """float64 logits (n_vocab,) after the last of ``ids`` (positions 0..len-1)."""
    f16 = _f16 if emulate else (lambda a: a)
    t = len(ids)
    nh, nkv, hd, eps = hp["n_head"], hp["n_head_kv"], hp["head_dim"], hp["eps"]
    pos = np.arange(t, dtype=np.float64)
    x = w["token_embd.weight"][np.asarray(ids)].astype(np.float64) * np.sqrt(hp["n_embd"])
    dq = pos[:, None] - pos[None, :]
    causal = np.where(dq < 0, -np.inf, 0.0)
    window = np.where((dq < 0) | (dq >= hp["n_swa"]), -np.inf, 0.0)
    for il in range(hp["n_layer"]):
        p = f"blk.{il}."
        swa = il % hp["swa_pattern"] < hp["swa_pattern"] - 1
        base = hp["base_swa"] if swa else hp["base_global"]
        h = _rms(x, w[p + "attn_norm.weight"], eps)
        q = _mm(w, p + "attn_q.weight", h, emulate).reshape(t, nh, hd)
        k = _mm(w, p + "attn_k.weight", h, emulate).reshape(t, nkv, hd)
        v = f16(_mm(w, p + "attn_v.weight", h, emulate).reshape(t, nkv, hd))
        q = f16(_rope_neox(_rms(q, w[p + "attn_q_norm.weight"], eps), pos, base) / np.sqrt(hd))
        k = f16(_rope_neox(_rms(k, w[p + "attn_k_norm.weight"], eps), pos, base))
        k = np.repeat(k, nh // nkv, axis=1)
        v = np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) + (window if swa else causal)
        s = np.exp(s - s.max(-1, keepdims=True))
        s = f16(s / s.sum(-1, keepdims=True))
        o = np.einsum("hts,shd->thd", s, v).reshape(t, nh * hd)
        o = _mm(w, p + "attn_output.weight", o, emulate)
        x = x + _rms(o, w[p + "post_attention_norm.weight"], eps)
        h = _rms(x, w[p + "ffn_norm.weight"], eps)
        g = _mm(w, p + "ffn_gate.weight", h, emulate)
        u = _mm(w, p + "ffn_up.weight", h, emulate)
        act = f16(_gelu_tanh(f16(g))) if emulate else _gelu_tanh(g)
        f = _mm(w, p + "ffn_down.weight", act * u, emulate)
        x = x + _rms(f, w[p + "post_ffw_norm.weight"], eps)
    h = _rms(x[-1:], w["output_norm.weight"], eps)
    return _mm(w, "token_embd.weight", h, emulate)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", type=Path, default=os.environ.get("GGMLPY_GEMMA3_GGUF"),
                    required="GGMLPY_GEMMA3_GGUF" not in os.environ,
                    help="the Gemma 3 270M Q4_K_M file (default: $GGMLPY_GEMMA3_GGUF)")
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data")
    ap.add_argument("--names", default="")
    ap.add_argument("--emulate", action="store_true",
                    help="apply llama.cpp's CPU roundings (see VEC_DOT_BLOCK)")
    args = ap.parse_args()
    w, hp = load(args.model)
    z = np.load(args.data / "gemma3_logits.npz")
    names = [str(n) for n in z["names"]]
    offsets = np.concatenate([[0], np.cumsum(z["prompt_lens"])])
    wanted = set(args.names.split(",")) if args.names else set(names)
    out = {"emulate_llama_cpp_rounding": args.emulate, "hparams": {k: (float(v) if isinstance(v, float) else int(v)) for k, v in hp.items()},
           "prompts": {}}
    for i, name in enumerate(names):
        if name not in wanted:
            continue
        ids = z["prompt_ids_concat"][offsets[i]:offsets[i + 1]]
        ref = z["subset_logits"][i].astype(np.float64)
        full = last_logits(w, hp, ids, args.emulate)
        mine = full[z["subset_ids"]]
        out["prompts"][name] = {
            "n_tokens": int(len(ids)),
            "max_abs_diff": float(np.abs(mine - ref).max()),
            "rel_l2": float(np.linalg.norm(mine - ref) / np.linalg.norm(ref)),
            "argmax_agrees": bool(int(full.argmax()) == int(z["top_ids"][i][0])),
            "top1_llama_cpp": int(z["top_ids"][i][0]), "top1_numpy": int(full.argmax()),
        }
        print(name, out["prompts"][name], flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
