"""A sentence-transformers BERT (all-MiniLM-L6-v2) as a GGUF file: convert, and read back.

:func:`convert` writes llama.cpp's BERT layout (meant to be interchangeable with files from
llama.cpp's ``convert_hf_to_gguf.py``; not tested against one): architecture ``bert`` with the keys of
``gguf.Keys`` (``bert.context_length``, ``bert.embedding_length``, ``bert.feed_forward_length``,
``bert.block_count``, ``bert.attention.head_count``, ``bert.attention.layer_norm_epsilon``,
``bert.attention.causal = false``, ``bert.pooling_type``), tensor names from
``gguf.TENSOR_NAMES`` for ``MODEL_ARCH.BERT`` (``token_embd``, ``position_embd``,
``token_types``, ``token_embd_norm``, ``blk.N.attn_q`` ... ``blk.N.layer_output_norm``, each
``.weight``/``.bias``), and the WordPiece tokenizer as llama.cpp stores it
(``tokenizer.ggml.model = "bert"``; ``tokens`` in "phantom space" form: a word-initial piece gets
a leading U+2581, a ``##`` continuation loses its ``##``, ``[SPECIAL]`` tokens stay;
``token_type`` NORMAL/CONTROL/UNKNOWN/UNUSED; ``token_type_count``; CLS/SEP/UNK/PAD/MASK ids).
sentence-transformers settings llama.cpp has no key for are stored under ``ggmlpy.*``
(``max_seq_length``, ``do_lower_case``, ``normalize``, the tokenizer's ``lowercase``); files
without them (llama.cpp's ``convert_hf_to_gguf.py`` writes none) get BERT-uncased defaults
(lower-casing, L2-normalised) and the truncation length of :func:`fallback_max_seq_length`.

A file read back runs llama.cpp's graph: its ``config.gelu`` is ``"tanh"`` (ggml's
``ggml_gelu``, as ``llm_build_bert`` computes the FFN of every BERT GGUF), where the model
directory runs sentence-transformers' exact erf GELU; ``BertModel.load(gelu=...)`` overrides
either. The two differ by at most 4.7e-4 per activation (plus the f16 table's rounding
on the CPU) and 2.7e-4 in a MiniLM embedding.

Quantization schemes (``--type``), 1-D tensors (norms, biases) and ``token_types`` always F32:

==========  =======================================================================================
scheme      matrices (attn_q/k/v/output, ffn_up/down) / embeddings (token, position)
==========  =======================================================================================
f32, f16    all F32 / all F16
q8_0        Q8_0 / Q8_0
q4_0        Q4_0 / Q4_0 (every matrix; cos ~0.88 on MiniLM, see scripts/quant_accuracy.py)
q4_k        Q4_K where ``ne0 % 256 == 0`` (ffn_down), else Q5_0, or F16 when ``ne0 % 32`` / same
q4_0_m      Q4_0, but attn_v and ffn_down of every layer at Q8_0 / Q8_0 (llama-quantize's _M idea)
q4_k_m      Q4_K/Q5_0 as q4_k, but attn_v and ffn_down at Q6_K/Q8_0 / Q8_0
==========  =======================================================================================

Every tensor gets a type whose blocks tile its rows (:func:`fallback_type`, llama.cpp's chain:
K-quant -> Q5_0/Q5_1/Q8_0 -> F16); :func:`convert` lists the tensors that fell back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ggmlpy.core.types import Type
from ggmlpy.gguf.reader import GGUFReader
from ggmlpy.models.loader import BertConfig, BertTokenizer, check_model_dir, load_weights

__all__ = ["SCHEMES", "TypedWeight", "convert", "read_bert_gguf", "tensor_type_for",
           "hf_to_gguf_names", "is_gguf_path", "fallback_max_seq_length", "KNOWN_MAX_SEQ_LENGTH",
           "FALLBACK_MAX_SEQ_LENGTH"]

#: ``max_seq_length`` of published sentence-transformers models (their
#: ``sentence_bert_config.json``), by name with everything but letters and digits removed and
#: lower-cased; used for GGUF files that lack ``ggmlpy.max_seq_length``.
KNOWN_MAX_SEQ_LENGTH: dict[str, int] = {"allminilml6v2": 256}
#: Truncation length of a foreign BERT GGUF of unknown name: at most this many tokens (BERT's
#: position table; sentence-transformers caps at ``max_position_embeddings`` too).
FALLBACK_MAX_SEQ_LENGTH = 512

#: the ``--type`` values of ``python -m ggmlpy convert``
SCHEMES = ("f32", "f16", "q8_0", "q4_0", "q4_k", "q4_0_m", "q4_k_m")

_ARCH = "bert"


@dataclass(frozen=True)
class TypedWeight:
    """A weight read from a GGUF file: its ggml ``type``, ``ne`` (ggml order) and raw bytes
    (``data``: uint8, C-contiguous rows, ``row_size(type, ne0) * ne1 * ne2 * ne3`` bytes; a view
    of the memory-mapped file)."""

    type: Type
    ne: tuple[int, ...]
    data: np.ndarray


def is_gguf_path(path: Any) -> bool:
    """True when ``path`` names a file ending in ``.gguf`` (the ``--model FILE.gguf`` form)."""
    return path is not None and str(path).lower().endswith(".gguf")


def _gguf() -> Any:
    try:
        import gguf  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("GGUF models need the gguf package: pip install 'ggmlpy[gguf]'") from e
    return gguf


def hf_to_gguf_names(n_layer: int) -> dict[str, str]:
    """Hugging Face BERT tensor names (``loader.load_weights``' form) -> GGUF names, from
    ``gguf.TENSOR_NAMES`` for ``MODEL_ARCH.BERT``."""
    gguf = _gguf()
    T, N = gguf.MODEL_TENSOR, gguf.TENSOR_NAMES
    m = {"embeddings.word_embeddings.weight": N[T.TOKEN_EMBD] + ".weight",
         "embeddings.position_embeddings.weight": N[T.POS_EMBD] + ".weight",
         "embeddings.token_type_embeddings.weight": N[T.TOKEN_TYPES] + ".weight",
         "embeddings.LayerNorm.weight": N[T.TOKEN_EMBD_NORM] + ".weight",
         "embeddings.LayerNorm.bias": N[T.TOKEN_EMBD_NORM] + ".bias"}
    per_layer = {"attention.self.query": T.ATTN_Q, "attention.self.key": T.ATTN_K,
                 "attention.self.value": T.ATTN_V, "attention.output.dense": T.ATTN_OUT,
                 "attention.output.LayerNorm": T.ATTN_OUT_NORM, "intermediate.dense": T.FFN_UP,
                 "output.dense": T.FFN_DOWN, "output.LayerNorm": T.LAYER_OUT_NORM}
    for il in range(n_layer):
        for hf, t in per_layer.items():
            for suf in ("weight", "bias"):
                m[f"encoder.layer.{il}.{hf}.{suf}"] = N[t].format(bid=il) + "." + suf
    return m


#: llama.cpp's replacement for a K-quant whose 256-element blocks do not tile a row
#: (``llama_tensor_get_type`` in llama-quant.cpp, ``convert_incompatible_tensor``)
K_QUANT_FALLBACK = {Type.Q4_K: Type.Q5_0, Type.Q5_K: Type.Q5_1, Type.Q6_K: Type.Q8_0}


def fallback_type(t: Type, ne0: int) -> Type:
    """The type a row of ``ne0`` elements is stored in when ``t`` is wanted (llama.cpp's chain).

    ``t`` itself when its blocks tile the row (``ne0 % t.blck_size == 0``); else for a K-quant
    the 32-element type of :data:`K_QUANT_FALLBACK` (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0)
    and, when that does not tile the row either, F16, as llama-quantize does; a legacy 32-element
    type that does not tile the row goes to F16 (llama-quantize would stop there). The result
    always tiles the row.
    """
    if t.blck_size == 1 or ne0 % t.blck_size == 0:
        return t
    new = K_QUANT_FALLBACK.get(t, Type.F16)
    if ne0 % new.blck_size:
        new = Type.F16
    return new


def tensor_type_for(scheme: str, gguf_name: str, shape: tuple[int, ...]) -> Type:
    """The storage type of tensor ``gguf_name`` (NumPy ``shape``) under ``scheme`` (module table).

    Raises:
        ValueError: unknown scheme.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown type scheme {scheme!r} (one of {', '.join(SCHEMES)})")
    if len(shape) < 2 or gguf_name.startswith("token_types"):
        return Type.F32
    ne0 = shape[-1]
    embd = gguf_name.startswith(("token_embd", "position_embd"))
    base = {"f32": Type.F32, "f16": Type.F16, "q8_0": Type.Q8_0, "q4_0": Type.Q4_0,
            "q4_k": Type.Q4_K, "q4_0_m": Type.Q4_0, "q4_k_m": Type.Q4_K}[scheme]
    if scheme.endswith("_m"):
        if embd:
            return fallback_type(Type.Q8_0, ne0)
        if ".attn_v." in gguf_name or ".ffn_down." in gguf_name:
            return fallback_type(Type.Q6_K if scheme == "q4_k_m" else Type.Q8_0, ne0)
    return fallback_type(base, ne0)


def _phantom(tok: str) -> str:
    # llama.cpp's BERT converter: WordPiece -> "phantom space" pieces
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    if tok.startswith("##"):
        return tok[2:]
    return "\u2581" + tok


def _unphantom(tok: str) -> str:
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    if tok.startswith("\u2581"):
        return tok[1:]
    return "##" + tok


def _vocab_metadata(model_dir: Path, type_vocab_size: int) -> dict[str, Any]:
    gguf = _gguf()
    K, TT = gguf.Keys.Tokenizer, gguf.TokenType
    tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = tj.get("model", {})
    if model.get("type") != "WordPiece":
        raise ValueError(f"{model_dir}/tokenizer.json: a {model.get('type')!r} tokenizer, "
                         "only WordPiece (BERT) is converted")
    vocab: dict[str, int] = model["vocab"]
    toks = [""] * len(vocab)
    for tok, i in vocab.items():
        toks[i] = tok
    types = []
    for t in toks:
        if t == "[UNK]":
            types.append(int(TT.UNKNOWN))
        elif t.startswith("[unused") and t.endswith("]"):
            types.append(int(TT.UNUSED))
        elif t.startswith("[") and t.endswith("]"):
            types.append(int(TT.CONTROL))
        else:
            types.append(int(TT.NORMAL))
    norm = tj.get("normalizer") or {}
    md: dict[str, Any] = {K.MODEL: "bert", K.LIST: [_phantom(t) for t in toks],
                          K.TOKEN_TYPE: types, K.TOKEN_TYPE_COUNT: type_vocab_size,
                          "ggmlpy.tokenizer.lowercase": bool(norm.get("lowercase", True))}
    ids = {"[CLS]": (K.BOS_ID,),
           "[SEP]": (K.EOS_ID, K.SEP_ID), "[UNK]": (K.UNK_ID,), "[PAD]": (K.PAD_ID,),
           "[MASK]": (K.MASK_ID,)}
    for tok, keys in ids.items():
        if tok in vocab:
            for k in keys:
                if k is not None:
                    md[k] = int(vocab[tok])
    md[K.ADD_BOS] = True
    md[K.ADD_EOS] = True
    return md


def convert(model_dir: str | Path, out_path: str | os.PathLike[str], scheme: str = "f16") -> dict[str, Any]:
    """Write the BERT model of ``model_dir`` (safetensors + config + tokenizer.json) as a GGUF.

    Args:
        model_dir: a sentence-transformers BERT directory (``loader.check_model_dir``).
        out_path: the ``.gguf`` file to write (replaced only once complete: written to a
            temporary name in the same folder and renamed, :mod:`.atomic`).
        scheme: one of :data:`SCHEMES` (module table).

    Returns:
        ``{"path", "scheme", "tensors": n, "bytes": file size, "types": {type name: count},
        "fallbacks": {tensor name: {"wanted": type name, "type": type name, "ne0": row length}}}``;
        ``fallbacks`` lists the tensors whose rows the scheme's type cannot tile
        (:func:`fallback_type`).

    Raises:
        ValueError: unknown scheme, a non-WordPiece tokenizer, a config this model code cannot run,
            a weight a block type cannot hold (:func:`~ggmlpy.quants.quantize`'s range check;
            the message names the tensor and the block).
        ModelNotFoundError: files missing in ``model_dir``.
        ImportError: gguf / safetensors missing.
    """
    from ggmlpy.gguf.weights import gguf_save  # noqa: PLC0415

    gguf = _gguf()
    if scheme not in SCHEMES:
        raise ValueError(f"unknown type scheme {scheme!r} (one of {', '.join(SCHEMES)})")
    model_dir = check_model_dir(model_dir)
    cfg = BertConfig.from_model_dir(model_dir)
    weights = load_weights(model_dir)
    names = hf_to_gguf_names(cfg.num_hidden_layers)
    L, A = gguf.Keys.LLM, gguf.Keys.Attention
    md: dict[str, Any] = {
        "general.architecture": _ARCH,
        "general.name": model_dir.name if model_dir.name != "model" else model_dir.parent.name,
        "general.file_type": {"f32": 0, "f16": 1, "q8_0": 7, "q4_0": 2, "q4_k": 15,
                              "q4_0_m": 2, "q4_k_m": 15}[scheme],
        L.CONTEXT_LENGTH.format(arch=_ARCH): cfg.max_position_embeddings,
        L.EMBEDDING_LENGTH.format(arch=_ARCH): cfg.hidden_size,
        L.FEED_FORWARD_LENGTH.format(arch=_ARCH): cfg.intermediate_size,
        L.BLOCK_COUNT.format(arch=_ARCH): cfg.num_hidden_layers,
        A.HEAD_COUNT.format(arch=_ARCH): cfg.num_attention_heads,
        A.LAYERNORM_EPS.format(arch=_ARCH): float(cfg.layer_norm_eps),
        A.CAUSAL.format(arch=_ARCH): False,
        L.POOLING_TYPE.format(arch=_ARCH): int(gguf.PoolingType.MEAN if cfg.pooling_mode == "mean"
                                               else gguf.PoolingType.CLS),
        "ggmlpy.max_seq_length": cfg.max_seq_length,
        "ggmlpy.do_lower_case": cfg.do_lower_case,
        "ggmlpy.normalize": cfg.normalize,
    }
    md.update(_vocab_metadata(model_dir, cfg.type_vocab_size))
    tensors: dict[str, Any] = {}
    counts: dict[str, int] = {}
    fallbacks: dict[str, dict[str, Any]] = {}
    for hf, arr in weights.items():
        g = names.get(hf)
        if g is None:
            continue  # the pooler and other heads sentence embeddings do not use
        t = tensor_type_for(scheme, g, arr.shape)
        wanted = tensor_type_for(scheme, g, arr.shape[:-1] + (256,))  # rows every type tiles
        if t != wanted:
            fallbacks[g] = {"wanted": wanted.type_name, "type": t.type_name,
                            "ne0": int(arr.shape[-1])}
        counts[t.type_name] = counts.get(t.type_name, 0) + 1
        tensors[g] = arr if t == Type.F32 else (t, arr)
    missing = sorted(set(names) - set(weights))
    if missing:
        raise ValueError(f"{model_dir}/model.safetensors: missing tensors {missing[:3]}")
    types = {"ggmlpy.max_seq_length": (int(gguf.GGUFValueType.UINT32), None),
             gguf.Keys.Tokenizer.TOKEN_TYPE_COUNT: (int(gguf.GGUFValueType.UINT32), None),
             gguf.Keys.Tokenizer.TOKEN_TYPE: (int(gguf.GGUFValueType.ARRAY),
                                              int(gguf.GGUFValueType.INT32))}
    from ggmlpy.models.atomic import atomic_path  # noqa: PLC0415

    with atomic_path(out_path) as tmp:  # an interrupted convert leaves no half-written file
        gguf_save(tmp, tensors, md, types=types)
    return {"path": os.fspath(out_path), "scheme": scheme, "tensors": len(tensors),
            "bytes": os.path.getsize(out_path), "types": counts, "fallbacks": fallbacks}


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    return reader.fields.get(key, default)


def _name_key(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def fallback_max_seq_length(names: list[str], context_length: int) -> tuple[int, str]:
    """The truncation length of a BERT GGUF without ``ggmlpy.max_seq_length`` (a file from
    llama.cpp's ``convert_hf_to_gguf.py``, which stores only ``bert.context_length``, the
    position table's size): the published ``max_seq_length`` when one of ``names`` (the file's
    ``general.name``, ``general.basename`` + ``size_label`` + ``version``, ...) is in
    :data:`KNOWN_MAX_SEQ_LENGTH`, else ``min(context_length, FALLBACK_MAX_SEQ_LENGTH)``; always
    capped at ``context_length``.

    Returns:
        ``(max_seq_length, source)``, ``source`` saying which rule gave it (for messages):
        ``"known model name 'X'"`` or ``"fallback min(bert.context_length, 512)"``.
    """
    for n in names:
        k = _name_key(n)
        for known, length in KNOWN_MAX_SEQ_LENGTH.items():
            if known and known in k:
                return min(length, context_length), f"known model name {n!r}"
    return (min(context_length, FALLBACK_MAX_SEQ_LENGTH),
            f"fallback min(bert.context_length, {FALLBACK_MAX_SEQ_LENGTH})")


def read_bert_gguf(path: str | Path) -> tuple[BertConfig, BertTokenizer, dict[str, TypedWeight]]:
    """Read a BERT GGUF (ours; llama.cpp's uses the same names) for :class:`~ggmlpy.models.bert.BertModel`.

    Returns:
        ``(config, tokenizer, weights)``: the config from the ``bert.*`` keys (and ``ggmlpy.*``
        where present; without ``ggmlpy.max_seq_length`` the truncation length is
        :func:`fallback_max_seq_length`'s and ``config.max_seq_length_source`` says so); a
        WordPiece tokenizer rebuilt with the ``tokenizers`` package from the stored vocabulary; weights by Hugging Face name as :class:`TypedWeight` (views of the
        memory-mapped file, read once when uploaded).

    Raises:
        ModelNotFoundError: the file does not exist.
        GGUFError: the file is not a readable GGUF file, or a tensor has a type ggmlpy lacks
            (:class:`~ggmlpy.gguf.reader.GGUFReader`'s checks; naming the file and what is wrong).
        ValueError: not a BERT GGUF, a key or tensor missing (each naming the file).
        ImportError: gguf or tokenizers missing.
    """
    from ggmlpy.models.loader import ModelNotFoundError  # noqa: PLC0415

    gguf = _gguf()
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF model file {str(path)!r} does not exist")
    reader = GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != _ARCH:
        raise ValueError(f"{path}: architecture {arch!r}, expected 'bert'")
    L, A, K = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Tokenizer

    def need(key: str) -> Any:
        v = _field(reader, key)
        if v is None:
            raise ValueError(f"{path}: missing key {key!r}")
        return v

    hidden = int(need(L.EMBEDDING_LENGTH.format(arch=_ARCH)))
    heads = int(need(A.HEAD_COUNT.format(arch=_ARCH)))
    n_layer = int(need(L.BLOCK_COUNT.format(arch=_ARCH)))
    ctx_len = int(need(L.CONTEXT_LENGTH.format(arch=_ARCH)))
    tokens = list(need(K.LIST))
    pooling = int(_field(reader, L.POOLING_TYPE.format(arch=_ARCH), int(gguf.PoolingType.MEAN)))
    if pooling not in (int(gguf.PoolingType.MEAN), int(gguf.PoolingType.CLS)):
        raise ValueError(f"{path}: pooling type {pooling} is not supported (mean or cls)")
    own = _field(reader, "ggmlpy.max_seq_length")
    if own is not None:
        max_seq, source = min(int(own), ctx_len), "ggmlpy.max_seq_length"
    else:
        g = [_field(reader, f"general.{k}") for k in ("name", "basename", "size_label",
                                                       "finetune", "version")]
        names = [str(g[0])] if g[0] else []
        parts = [str(x) for x in g[1:] if x]
        if parts:
            names.append("-".join(parts))
        max_seq, source = fallback_max_seq_length(names, ctx_len)
    cfg = BertConfig(
        vocab_size=len(tokens), hidden_size=hidden, num_hidden_layers=n_layer,
        num_attention_heads=heads,
        intermediate_size=int(need(L.FEED_FORWARD_LENGTH.format(arch=_ARCH))),
        max_position_embeddings=ctx_len,
        type_vocab_size=int(_field(reader, K.TOKEN_TYPE_COUNT, 2)),
        layer_norm_eps=float(need(A.LAYERNORM_EPS.format(arch=_ARCH))), hidden_act="gelu",
        max_seq_length=max_seq, do_lower_case=bool(_field(reader, "ggmlpy.do_lower_case", False)),
        pooling_mode="mean" if pooling == int(gguf.PoolingType.MEAN) else "cls",
        normalize=bool(_field(reader, "ggmlpy.normalize", True)),
        pad_token_id=int(_field(reader, K.PAD_ID, 0)), max_seq_length_source=source,
        gelu="tanh")
    tokenizer = _tokenizer(tokens, bool(_field(reader, "ggmlpy.tokenizer.lowercase", True)), cfg)
    by_gguf = {g: hf for hf, g in hf_to_gguf_names(n_layer).items()}
    weights: dict[str, TypedWeight] = {}
    for rt in reader.tensors.values():
        hf = by_gguf.get(rt.name)
        if hf is None:
            continue
        t, ne = rt.type, rt.ne
        data = rt.little_endian().reshape(-1)
        if t != Type.F32 and (all(n == 1 for n in ne[1:]) or rt.name.startswith("token_types")):
            # used by element-wise ops (ADD/MUL), which compute F32/F16 only: stored as F32
            from ggmlpy.quants import dequantize  # noqa: PLC0415

            data = dequantize(data, t, list(ne)).reshape(-1).view(np.uint8)
            t = Type.F32
        weights[hf] = TypedWeight(t, ne, data)
    missing = sorted(set(by_gguf.values()) - set(weights))
    if missing:
        raise ValueError(f"{path}: missing tensors {[hf_to_gguf_names(n_layer)[m] for m in missing[:3]]}")
    return cfg, tokenizer, weights


def _tokenizer(tokens: list[str], lowercase: bool, cfg: BertConfig) -> BertTokenizer:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors  # noqa: PLC0415

    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(_unphantom(t), i)
    for s in ("[CLS]", "[SEP]", "[UNK]"):
        if s not in vocab:
            raise ValueError(f"the GGUF vocabulary has no {s} token")
    tk = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                               strip_accents=None, lowercase=lowercase)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tk.decoder = decoders.WordPiece()
    tk.no_padding()
    tk.enable_truncation(max_length=cfg.max_seq_length)
    return BertTokenizer(tk, cfg.max_seq_length, cfg.do_lower_case)
