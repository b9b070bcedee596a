"""Write llama.cpp's reference data for the LLM job (Gemma 3 270M) and its tokenizers.

Reference tool only: it runs under the reference venv (a venv with llama-cpp-python, named by $GGMLPY_REF_PYTHON; see tests/data/README.md),
never under ggmlpy's, and ggmlpy never imports it. The tests read its outputs, never llama.cpp.

What it makes (into ``--out``, default ``tests/data/``):

- ``gemma3_tokenizer.json``: for each string of ``llm_ref_strings.tokenizer_strings()`` (beside
  this file), llama.cpp's ids for the Gemma 3 file (SentencePiece vocab, ``tokenizer.ggml.model =
  "llama"``) in two modes, ``bos`` = ``llama_tokenize(add_special=True, parse_special=False)`` and
  ``special`` = ``llama_tokenize(add_special=False, parse_special=True)``, and for each id list its
  detokenization three ways: ``pieces`` (llama-cpp-python's ``Llama.detokenize``: the
  ``llama_token_to_piece(special=False)`` pieces joined, minus one leading space after a BOS),
  ``detok`` (``llama_detokenize(remove_special=False, unparse_special=False)``) and
  ``detok_special`` (``unparse_special=True``); plus the vocab's special ids and the file's
  ``tokenizer.ggml.*`` flags.
- ``tiny_llama_bpe.gguf``: a tiny random-weight ``llama``-architecture GGUF (2 layers, n_embd 64,
  4 heads, 2 KV heads, head dim 16, FFN 128, F32 weights from a fixed seed, output tied to
  ``token_embd``) carrying a byte-level BPE (``tokenizer.ggml.model = "gpt2"``, pre ``"gpt-2"``)
  trained here with HF ``tokenizers`` on the deterministic text of ``llm_ref_strings``.
- ``bpe_tokenizer.json``: the same strings and modes through llama.cpp's BPE tokenizer on that file.
- ``tiny_llama_bpe_logits.npz``: llama.cpp's logits for every position of 3 prompts on the tiny
  model (all vocab entries) and the greedy 16-token continuation of each.
- ``gemma3_logits.npz`` + ``gemma3_greedy.json``: for each prompt of ``GEMMA_PROMPTS`` its ids (BOS
  added, special tokens parsed), llama.cpp's logits after the whole prompt at a seeded subset of
  16384 vocab ids, that prompt's top-64 ids/values, the full vector's L2 norm, max and logsumexp,
  and the greedy 32-token continuation (argmax of the raw logits, so no sampler, no penalty; it
  stops early at an end-of-generation token) with each step's top-8 ids/logits and top-2 gap.

Settings: llama-cpp-python (version recorded in every file, llama.cpp built from its vendored
source with ``-mno-amx-tile -mno-amx-int8 -mno-amx-bf16``, LLAVA_BUILD=OFF, GGML_NATIVE default),
CPU only, ``n_threads = n_threads_batch = 2``, ``n_ctx = 2048``, ``n_batch = n_ubatch = 512``,
``flash_attn = False``, ``logits_all = False`` (Gemma) / ``True`` (tiny model), mmap on.

Rerun::

    $GGMLPY_REF_PYTHON scripts/make_llm_reference.py \
        --model GEMMA3.gguf [--out tests/data] [--copy-to DIR] \
        [--only tokenizer,bpe,logits]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import llm_ref_numpy_llama
import llm_ref_strings
import numpy as np

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers is imported

N_CTX = 2048
N_BATCH = 512
N_THREADS = 2
BUILD_FLAGS = ("CMAKE_ARGS=-DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF "
               "-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' "
               "-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' (GGML_NATIVE on)")
SUBSET_SIZE = 16384
SUBSET_SEED = 20261201
TOPK = 64
GREEDY_STEPS = 32
TINY_GREEDY_STEPS = 16
GGML_TYPE_F32 = 0

CHAT = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"

LONG_STORY = (
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker named Elias. Every morning he opened the wooden shutters of his shop, wound the "
    "dozens of clocks that hung on its walls, and listened to them tick in slightly different "
    "rhythms. The villagers brought him broken pocket watches, cuckoo clocks that no longer sang, "
    "and grandfather clocks whose pendulums had stopped swinging. Elias repaired them all with "
    "patience, and he never charged more than a loaf of bread or a basket of apples. One winter, a "
    "young girl named Mira knocked on his door holding a strange silver clock with no hands. "
)

LONG_NOTES = (
    "Notes on matrix multiplication. Given A with shape (m, k) and B with shape (k, n), the product "
    "C = AB has shape (m, n) and each entry is a dot product of a row of A and a column of B. The "
    "naive algorithm costs m*n*k multiply-adds. Blocking the loops so that tiles of A and B stay in "
    "cache reduces memory traffic, and vector instructions process several entries at once. "
    "Quantized formats store weights in blocks of 32 or 256 values with a shared scale, which "
    "shrinks memory and bandwidth; the kernels dequantize a block on the fly before the dot "
    "product, or multiply integer values directly and apply the scales at the end. "
)

GEMMA_PROMPTS: list[tuple[str, str]] = [
    ("question_capital", "The capital of France is"),
    ("question_why_sky", "Why is the sky blue?"),
    ("chat_capital", CHAT.format("What is the capital of Japan?")),
    ("chat_haiku", CHAT.format("Write a haiku about autumn leaves.")),
    ("chat_math", CHAT.format("What is 17 times 23? Answer with the number only.")),
    ("code_python_def", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("code_c_loop", "#include <stdio.h>\n\nint main(void) {\n    for (int i = 0; i < 10; i++) {\n"),
    ("code_sql", "-- list the ten oldest users\nSELECT name, age FROM users ORDER BY"),
    ("list_fruits", "Here is a list of fruits:\n1. Apple\n2. Banana\n3."),
    ("list_steps", "To make a cup of tea:\n- Boil water\n- "),
    ("count", "1, 2, 3, 4, 5, 6,"),
    ("alphabet", "A B C D E F G"),
    ("german", "Die Hauptstadt von Deutschland ist"),
    ("french", "Il \u00e9tait une fois une petite fille qui"),
    ("spanish", "El perro corre por el parque y"),
    ("chinese", "\u4e2d\u56fd\u7684\u9996\u90fd\u662f"),
    ("japanese", "\u65e5\u672c\u306e\u6709\u540d\u306a\u98df\u3079\u7269\u306f"),
    ("russian", "\u0421\u0442\u043e\u043b\u0438\u0446\u0430 \u0420\u043e\u0441\u0441\u0438\u0438 \u2014"),
    ("arabic", "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0647\u064a"),
    ("emoji", "My favourite emoji are \U0001F600 and"),
    ("json", "{\"name\": \"Alice\", \"age\": 30, \"city\":"),
    ("sixteen_tokens", "The quick brown fox jumps over the lazy dog and then runs away into the"),
    ("single_word", "Hello"),
    ("spaces_newlines", "  Line one\n\n\tLine two\n   "),
    ("story_long", LONG_STORY + "Mira asked:"),
    ("notes_long", LONG_NOTES * 2 + "In summary,"),
    ("chat_long", CHAT.format(LONG_STORY + "\nContinue the story in one sentence.")),
    # beyond Gemma 3's 512-token sliding window, and split over two n_batch chunks
    ("swa_beyond_window", LONG_NOTES * 5 + LONG_STORY * 2 + "The end of the story is"),
]

TINY_PROMPTS: list[tuple[str, str]] = [
    ("hello", "Hello world"),
    ("fox", "The quick brown fox jumps over the lazy dog."),
    ("code", "def add(a, b):\n    return a + b"),
]

BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_VOCAB_SIZE = 2000
TINY_SEED = 20261201
TINY_HP = dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
               rms_eps=1e-5, rope_base=10000.0, n_ctx_train=512)


# ----------------------------------------------------------------------------------------------
# shared helpers


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_meta(model_path: Path, **extra) -> dict:
    import llama_cpp

    meta = {
        "tool": "llama-cpp-python",
        "llama_cpp_python_version": llama_cpp.__version__,
        "llama_cpp_build_flags": BUILD_FLAGS,
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "n_threads": N_THREADS,
        "n_ctx": N_CTX,
        "n_batch": N_BATCH,
        "n_ubatch": N_BATCH,
        "flash_attn": False,
        "model_file": model_path.name,
        "model_sha256": sha256_file(model_path),
        "script": "scripts/make_llm_reference.py",
    }
    meta.update(extra)
    return meta


def text_field(b: bytes, key: str) -> dict:
    """``{key: text}`` when ``b`` is UTF-8, else ``{key + "_hex": b.hex()}``."""
    try:
        return {key: b.decode("utf-8")}
    except UnicodeDecodeError:
        return {key + "_hex": b.hex()}


def c_detokenize(vocab, ids: list[int], unparse_special: bool) -> bytes:
    import llama_cpp

    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    if n < 0:
        size = -n + 1
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    if n < 0:
        raise RuntimeError(f"llama_detokenize failed for {ids}")
    return buf.raw[:n]


def write_cases_json(path: Path, meta: dict, cases: list[dict]) -> None:
    """One case per line, so diffs of the file stay readable."""
    lines = ['{"meta": ' + json.dumps(meta, ensure_ascii=False, indent=1) + ',\n"cases": [']
    lines.append(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":"))
                            for c in cases))
    lines.append("]}\n")
    path.write_text("\n".join(lines), encoding="utf-8")


def vocab_info(llm) -> dict:
    import llama_cpp

    v = llm._model.vocab
    info = {
        "n_vocab": llama_cpp.llama_vocab_n_tokens(v),
        "bos_id": llama_cpp.llama_vocab_bos(v),
        "eos_id": llama_cpp.llama_vocab_eos(v),
        "eot_id": llama_cpp.llama_vocab_eot(v),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v)),
        "eog_ids": [t for t in range(llama_cpp.llama_vocab_n_tokens(v))
                    if llama_cpp.llama_vocab_is_eog(v, t)],
    }
    info["gguf_tokenizer_metadata"] = {k: val for k, val in llm.metadata.items()
                                       if k.startswith("tokenizer.ggml.")
                                       or k == "tokenizer.chat_template"}
    return info


def tokenize_cases(llm, strings: list[str]) -> list[dict]:
    v = llm._model.vocab
    cases = []
    for s in strings:
        b = s.encode("utf-8")
        case: dict = {"text": s}
        for mode, add_bos, special in (("bos", True, False), ("special", False, True)):
            ids = llm.tokenize(b, add_bos=add_bos, special=special)
            entry: dict = {"ids": ids}
            entry.update(text_field(llm.detokenize(ids), "pieces"))
            entry.update(text_field(c_detokenize(v, ids, False), "detok"))
            entry.update(text_field(c_detokenize(v, ids, True), "detok_special"))
            case[mode] = entry
        cases.append(case)
    return cases


# ----------------------------------------------------------------------------------------------
# a. Gemma 3 tokenizer


def make_gemma_tokenizer(model_path: Path, out: Path) -> list[Path]:
    from llama_cpp import Llama

    llm = Llama(str(model_path), vocab_only=True, verbose=False)
    strings = llm_ref_strings.tokenizer_strings()
    meta = run_meta(model_path, what="llama.cpp SPM tokenizer ids/detokenization of Gemma 3 270M",
                    modes={"bos": "llama_tokenize(add_special=True, parse_special=False)",
                           "special": "llama_tokenize(add_special=False, parse_special=True)"},
                    detok_fields={
                        "pieces": "Llama.detokenize: llama_token_to_piece(special=False) "
                                  "joined, one leading space after a BOS dropped",
                        "detok": "llama_detokenize(remove_special=False, unparse_special=False)",
                        "detok_special": "llama_detokenize(remove_special=False, "
                                         "unparse_special=True)"},
                    vocab=vocab_info(llm), n_cases=len(strings))
    path = out / "gemma3_tokenizer.json"
    write_cases_json(path, meta, tokenize_cases(llm, strings))
    del llm
    return [path]


# ----------------------------------------------------------------------------------------------
# b. byte-level BPE in a tiny random llama GGUF


def train_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, min_frequency=2,
                                  special_tokens=BPE_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(llm_ref_strings.bpe_training_corpus(), trainer=trainer)
    return tok


def bpe_tables(tok) -> tuple[list[str], list[str]]:
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [None] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    if any(t is None for t in tokens):
        raise RuntimeError("BPE vocab ids are not dense")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def tiny_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """NumPy arrays in GGUF order: shape = ne reversed, e.g. attn_q (n_embd_out, n_embd_in)."""
    hp = TINY_HP
    rng = np.random.default_rng(TINY_SEED)
    e, ff = hp["n_embd"], hp["n_ff"]
    q_out = hp["n_head"] * hp["head_dim"]
    kv_out = hp["n_head_kv"] * hp["head_dim"]

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w = {"token_embd.weight": normal((n_vocab, e), 0.5)}
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = (1.0 + normal((e,), 0.1)).astype(np.float32)
        w[p + "attn_q.weight"] = normal((q_out, e), 0.2)
        w[p + "attn_k.weight"] = normal((kv_out, e), 0.2)
        w[p + "attn_v.weight"] = normal((kv_out, e), 0.125)
        w[p + "attn_output.weight"] = normal((e, q_out), 0.125)
        w[p + "ffn_norm.weight"] = (1.0 + normal((e,), 0.1)).astype(np.float32)
        w[p + "ffn_gate.weight"] = normal((ff, e), 0.125)
        w[p + "ffn_up.weight"] = normal((ff, e), 0.125)
        w[p + "ffn_down.weight"] = normal((e, ff), 0.09)
    w["output_norm.weight"] = (1.0 + normal((e,), 0.1)).astype(np.float32)
    return w


def write_tiny_gguf(path: Path, tokens: list[str], merges: list[str]) -> None:
    import gguf

    hp = TINY_HP
    special_ids = {t: tokens.index(t) for t in BPE_SPECIALS}
    types = [int(gguf.TokenType.CONTROL) if t in special_ids else int(gguf.TokenType.NORMAL)
             for t in tokens]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama-bpe (random weights, ggmlpy test data)")
    w.add_context_length(hp["n_ctx_train"])
    w.add_embedding_length(hp["n_embd"])
    w.add_block_count(hp["n_layer"])
    w.add_feed_forward_length(hp["n_ff"])
    w.add_head_count(hp["n_head"])
    w.add_head_count_kv(hp["n_head_kv"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_rope_dimension_count(hp["head_dim"])
    w.add_rope_freq_base(hp["rope_base"])
    w.add_layer_norm_rms_eps(hp["rms_eps"])
    w.add_vocab_size(len(tokens))
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(special_ids["<|endoftext|>"])
    w.add_eos_token_id(special_ids["<|endoftext|>"])
    w.add_eot_token_id(special_ids["<|im_end|>"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for name, arr in tiny_weights(len(tokens)).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_bpe(out: Path) -> list[Path]:
    from llama_cpp import Llama

    tok = train_bpe()
    tokens, merges = bpe_tables(tok)
    again = bpe_tables(train_bpe())
    if again != (tokens, merges):
        raise RuntimeError("BPE training is not deterministic")
    gguf_path = out / "tiny_llama_bpe.gguf"
    write_tiny_gguf(gguf_path, tokens, merges)

    llm = Llama(str(gguf_path), vocab_only=True, verbose=False)
    strings = llm_ref_strings.tokenizer_strings()
    cases = tokenize_cases(llm, strings)
    hf_agree = 0
    for c in cases:
        hf_ids = tok.encode(c["text"], add_special_tokens=False).ids
        c["hf_tokenizers_ids"] = hf_ids
        hf_agree += hf_ids == c["special"]["ids"]
    import tokenizers

    meta = run_meta(gguf_path,
                    what="llama.cpp BPE (gpt2, pre gpt-2) tokenizer ids/detokenization of "
                         "tiny_llama_bpe.gguf",
                    bpe_trainer=f"HF tokenizers {tokenizers.__version__} BpeTrainer(vocab_size="
                                f"{BPE_VOCAB_SIZE}, min_frequency=2, ByteLevel(add_prefix_space="
                                f"False, use_regex=True), initial_alphabet=ByteLevel.alphabet(), "
                                f"special_tokens={BPE_SPECIALS}) on "
                                f"llm_ref_strings.bpe_training_corpus()",
                    modes={"bos": "llama_tokenize(add_special=True, parse_special=False)",
                           "special": "llama_tokenize(add_special=False, parse_special=True)"},
                    hf_tokenizers_ids="the HF tokenizer's own ids for the text "
                                      "(encode(add_special_tokens=False): special-token text "
                                      "is still matched), for comparison only",
                    hf_agrees_with_llama_cpp_special_mode=f"{hf_agree}/{len(cases)}",
                    vocab=vocab_info(llm), n_cases=len(strings))
    path = out / "bpe_tokenizer.json"
    write_cases_json(path, meta, cases)
    del llm

    logits_path = out / "tiny_llama_bpe_logits.npz"
    make_tiny_logits(gguf_path, logits_path)
    return [gguf_path, path, logits_path]


# ----------------------------------------------------------------------------------------------
# greedy decoding on raw logits


def last_logits(llm) -> np.ndarray:
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32, copy=True)


def greedy(llm, prompt_ids: list[int], steps: int, topn: int = 8) -> dict:
    """Evaluate the prompt, then ``steps`` argmax tokens fed back one at a time."""
    import llama_cpp

    v = llm._model.vocab
    llm.reset()
    llm.eval(prompt_ids)
    first = last_logits(llm)
    out_ids, gaps, top_ids, top_vals = [], [], [], []
    stop = "length"
    logits = first
    for _ in range(steps):
        order = np.argsort(-logits, kind="stable")[:topn]
        tok = int(order[0])
        out_ids.append(tok)
        gaps.append(float(logits[order[0]] - logits[order[1]]))
        top_ids.append(order.astype(np.int32))
        top_vals.append(logits[order].astype(np.float32))
        if llama_cpp.llama_vocab_is_eog(v, tok):
            stop = "eog"
            break
        llm.eval([tok])
        logits = last_logits(llm)
    return {"first_logits": first, "ids": out_ids, "gaps": gaps, "stop": stop,
            "top_ids": np.stack(top_ids), "top_vals": np.stack(top_vals)}


def make_tiny_logits(gguf_path: Path, out_path: Path) -> None:
    from llama_cpp import Llama

    llm = Llama(str(gguf_path), n_ctx=256, n_batch=N_BATCH, n_ubatch=N_BATCH,
                n_threads=N_THREADS, n_threads_batch=N_THREADS, logits_all=True,
                flash_attn=False, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False)
    arrays: dict[str, np.ndarray] = {}
    names = []
    w64 = llm_ref_numpy_llama.load_weights(str(gguf_path))
    numpy_diff = 0.0
    for name, text in TINY_PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        all_logits = np.array(llm._scores, dtype=np.float32, copy=True)
        g = greedy(llm, ids, TINY_GREEDY_STEPS)
        if not np.array_equal(g["first_logits"], all_logits[-1]):
            raise RuntimeError("tiny model: logits differ between two identical evaluations")
        full = np.asarray(ids + g["ids"][:-1])
        ref64 = llm_ref_numpy_llama.forward(w64, full, TINY_HP)
        numpy_diff = max(numpy_diff, float(np.abs(ref64[:len(ids)] - all_logits).max()))
        if ref64[len(ids) - 1:].argmax(-1).tolist() != g["ids"]:
            raise RuntimeError(f"tiny model: greedy ids of {name} differ from the NumPy forward")
        arrays[f"{name}/prompt_ids"] = np.asarray(ids, dtype=np.int32)
        arrays[f"{name}/logits"] = all_logits
        arrays[f"{name}/greedy_ids"] = np.asarray(g["ids"], dtype=np.int32)
        arrays[f"{name}/greedy_gap"] = np.asarray(g["gaps"], dtype=np.float32)
        names.append(name)
    meta = run_meta(gguf_path, what="llama.cpp logits of tiny_llama_bpe.gguf",
                    n_ctx=256, logits_all=True, kv_cache_type="f32 (type_k = type_v = F32)",
                    prompts=dict(TINY_PROMPTS), names=names,
                    hparams=TINY_HP, weight_seed=TINY_SEED,
                    max_abs_diff_vs_numpy_f64=numpy_diff,
                    numpy_f64_check="scripts/llm_ref_numpy_llama.py forward() of the same file "
                                    "matches these logits to max_abs_diff_vs_numpy_f64 and "
                                    "gives the same greedy ids",
                    arrays={"<name>/prompt_ids": "int32 (n_tokens,), BOS added, specials parsed",
                            "<name>/logits": "float32 (n_tokens, n_vocab): logits at every "
                                             "prompt position, one decode of the whole prompt",
                            "<name>/greedy_ids": f"int32 (<= {TINY_GREEDY_STEPS},) argmax "
                                                 "continuation, one token per decode",
                            "<name>/greedy_gap": "float32: top-1 minus top-2 logit per step"})
    arrays["meta_json"] = np.asarray(json.dumps(meta, ensure_ascii=False))
    np.savez_compressed(out_path, **arrays)
    del llm


# ----------------------------------------------------------------------------------------------
# c. Gemma 3 logits and greedy continuations


def make_gemma_logits(model_path: Path, out: Path) -> list[Path]:
    from llama_cpp import Llama

    llm = Llama(str(model_path), n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH,
                n_threads=N_THREADS, n_threads_batch=N_THREADS, logits_all=False,
                flash_attn=False, verbose=False)
    n_vocab = llm.n_vocab()
    subset = np.sort(np.random.default_rng(SUBSET_SEED).choice(n_vocab, SUBSET_SIZE,
                                                                 replace=False)).astype(np.int32)
    arrays: dict[str, np.ndarray] = {"subset_ids": subset}
    greedy_cases = []
    sub_logits, top_ids, top_vals, stats, prompt_lens = [], [], [], [], []
    all_prompt_ids = []
    for name, text in GEMMA_PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=True)
        g = greedy(llm, ids, GREEDY_STEPS)
        lg = g["first_logits"].astype(np.float64)
        order = np.argsort(-g["first_logits"], kind="stable")[:TOPK]
        sub_logits.append(g["first_logits"][subset])
        top_ids.append(order.astype(np.int32))
        top_vals.append(g["first_logits"][order])
        m = lg.max()
        stats.append([np.sqrt((lg * lg).sum()), m, m + np.log(np.exp(lg - m).sum())])
        prompt_lens.append(len(ids))
        all_prompt_ids.extend(ids)
        cont = llm.detokenize(g["ids"])
        case = {"name": name, "prompt": text, "prompt_ids": ids, "greedy_ids": g["ids"],
                "stop": g["stop"], "top2_gap": [round(x, 6) for x in g["gaps"]],
                "step_top8_ids": g["top_ids"].tolist(),
                "step_top8_logits": [[round(float(x), 5) for x in row] for row in g["top_vals"]]}
        case.update(text_field(cont, "greedy_text"))
        greedy_cases.append(case)
        print(f"  {name}: {len(ids)} prompt tokens, {len(g['ids'])} generated ({g['stop']}), "
              f"min gap {min(g['gaps']):.4f}", file=sys.stderr)

    # determinism check: the first prompt once more
    g0 = greedy(llm, greedy_cases[0]["prompt_ids"], 4)
    repeat_exact = bool(np.array_equal(g0["first_logits"][subset], sub_logits[0]))

    arrays["names"] = np.asarray([n for n, _ in GEMMA_PROMPTS])
    arrays["prompt_lens"] = np.asarray(prompt_lens, dtype=np.int32)
    arrays["prompt_ids_concat"] = np.asarray(all_prompt_ids, dtype=np.int32)
    arrays["subset_logits"] = np.stack(sub_logits).astype(np.float32)
    arrays["top_ids"] = np.stack(top_ids)
    arrays["top_logits"] = np.stack(top_vals).astype(np.float32)
    arrays["l2_max_lse"] = np.asarray(stats, dtype=np.float64)
    meta = run_meta(model_path,
                    what="llama.cpp logits after each whole prompt (Gemma 3 270M Q4_K_M)",
                    logits_all=False, subset_seed=SUBSET_SEED, subset_size=SUBSET_SIZE,
                    repeat_run_bit_identical=repeat_exact,
                    tokenize="llama_tokenize(add_special=True, parse_special=True)",
                    arrays={"subset_ids": "int32 (16384,) sorted vocab ids, "
                                          "rng default_rng(subset_seed).choice(n_vocab, 16384)",
                            "names": "prompt names, same order as gemma3_greedy.json",
                            "prompt_lens": "int32 (n_prompts,)",
                            "prompt_ids_concat": "int32: all prompts' ids, split by prompt_lens",
                            "subset_logits": "float32 (n_prompts, 16384) at subset_ids",
                            "top_ids": "int32 (n_prompts, 64) ids of the 64 largest logits",
                            "top_logits": "float32 (n_prompts, 64) their logits",
                            "l2_max_lse": "float64 (n_prompts, 3): full-vector L2 norm, max, "
                                          "logsumexp (float64 sums of the float32 logits)"})
    arrays["meta_json"] = np.asarray(json.dumps(meta, ensure_ascii=False))
    npz = out / "gemma3_logits.npz"
    np.savez_compressed(npz, **arrays)

    gmeta = run_meta(model_path, what="llama.cpp greedy continuations (Gemma 3 270M Q4_K_M)",
                     greedy=f"argmax of the raw logits (first index on ties), {GREEDY_STEPS} "
                            "steps, one token per decode, stops after an EOG token "
                            "(llama_vocab_is_eog); no sampler, no penalties",
                     fields={"prompt_ids": "llama_tokenize(add_special=True, parse_special=True)",
                             "top2_gap": "per step, top-1 minus top-2 logit",
                             "step_top8_ids/logits": "per step, the 8 largest logits",
                             "greedy_text": "Llama.detokenize(greedy_ids)"},
                     repeat_run_bit_identical=repeat_exact)
    gpath = out / "gemma3_greedy.json"
    write_cases_json(gpath, gmeta, greedy_cases)
    del llm
    return [npz, gpath]


# ----------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=os.environ.get("GGMLPY_GEMMA3_GGUF"),
                    required="GGMLPY_GEMMA3_GGUF" not in os.environ,
                    help="the Gemma 3 270M Q4_K_M file (default: $GGMLPY_GEMMA3_GGUF)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data")
    ap.add_argument("--copy-to", type=Path, default=None)
    ap.add_argument("--only", default="tokenizer,bpe,logits")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.only.split(","))
    written: list[Path] = []
    t0 = time.time()
    if "tokenizer" in parts:
        written += make_gemma_tokenizer(args.model, args.out)
    if "bpe" in parts:
        written += make_bpe(args.out)
    if "logits" in parts:
        written += make_gemma_logits(args.model, args.out)
    for p in written:
        print(f"{p}: {p.stat().st_size} bytes", file=sys.stderr)
        if args.copy_to is not None:
            args.copy_to.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, args.copy_to / p.name)
    print(f"done in {time.time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
