"""A llama.cpp vocabulary read from a GGUF file's ``tokenizer.ggml.*`` metadata.

:class:`Vocab` holds what llama.cpp's ``llama_vocab::impl::load`` (llama-vocab.cpp) derives from
the metadata: the token texts and the text -> id map, the scores, the per-token attributes
(``llama_token_attr`` bits, from ``tokenizer.ggml.token_type`` plus llama.cpp's name-based fix-ups),
the special ids (BOS, EOS, EOT, EOM, UNK, SEP, PAD, MASK, FIM ...), the add-BOS/EOS/space-prefix
flags, the BPE pre-tokenizer settings, the end-of-generation set and the special-token cache
(control, user-defined and unknown tokens in the order ``tokenizer_st_partition`` tries them).

Building is vectorised over the token arrays (NumPy for the types; one ``dict`` build for the
text -> id map); nothing is done per token in Python beyond that map.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ggmlpy.core.errors import FileFormatError

__all__ = ["Vocab", "TokenAttr", "TokenType", "VocabType"]


class TokenType:
    """``tokenizer.ggml.token_type`` values (llama.cpp's ``llama_token_type``)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr:
    """Per-token attribute bits (llama.cpp's ``llama_token_attr``)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


class VocabType:
    """``tokenizer.ggml.model`` values this package tokenizes (llama.cpp's vocab types)."""

    SPM = "llama"  # LLAMA_VOCAB_TYPE_SPM: SentencePiece-style score merges with byte fallback
    BPE = "gpt2"  # LLAMA_VOCAB_TYPE_BPE: byte-level BPE with ranked merges and a pre-tokenizer


# token_type -> attribute (llama_vocab::impl::load's switch); out-of-range types are UNDEFINED
_TYPE_TO_ATTR = np.array([TokenAttr.UNDEFINED, TokenAttr.NORMAL, TokenAttr.UNKNOWN, TokenAttr.CONTROL,
                          TokenAttr.USER_DEFINED, TokenAttr.UNUSED, TokenAttr.BYTE], dtype=np.int32)

# special ids set from metadata: attribute name -> metadata keys (the later, deprecated keys
# write the same slot, as in llama.cpp's special_token_types table)
_SPECIAL_KEYS: tuple[tuple[str, str], ...] = (
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("fim_pre", "tokenizer.ggml.fim_pre_token_id"),
    ("fim_suf", "tokenizer.ggml.fim_suf_token_id"),
    ("fim_mid", "tokenizer.ggml.fim_mid_token_id"),
    ("fim_pad", "tokenizer.ggml.fim_pad_token_id"),
    ("fim_rep", "tokenizer.ggml.fim_rep_token_id"),
    ("fim_sep", "tokenizer.ggml.fim_sep_token_id"),
    ("fim_pre", "tokenizer.ggml.prefix_token_id"),
    ("fim_suf", "tokenizer.ggml.suffix_token_id"),
    ("fim_mid", "tokenizer.ggml.middle_token_id"),
)

# llama.cpp finds these special ids by token text when the metadata do not set them; a token found
# this way that is not CONTROL becomes CONTROL
_TEXT_DETECTED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("eot", ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
             "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")),
    ("eom", ("<|eom_id|>",)),
    ("fim_pre", ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                 "<|code_prefix|>", "<|prefix|>")),
    ("fim_suf", ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                 "<|code_suffix|>", "<|suffix|>")),
    ("fim_mid", ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                 "<|code_middle|>", "<|middle|>")),
    ("fim_pad", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    ("fim_rep", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    ("fim_sep", ("<|file_sep|>",)),
)

# token texts llama.cpp always treats as end of generation (llama_vocab::impl::load)
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")

# gpt-oss: these are always rendered (their attribute becomes USER_DEFINED)
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# tokenizer.ggml.pre -> (pre-tokenizer family, clean_spaces, ignore_merges, add_bos default)
_BPE_PRE: dict[str, tuple[str, bool, bool, bool]] = {}
for _names, _entry in (
    (("default",), ("default", True, False, False)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"), ("llama3", True, True, True)),
    (("dbrx", "smaug-bpe"), ("llama3", True, False, False)),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
      "modern-bert", "mpt", "olmo", "jais", "exaone4", "jina-v1-en", "jina-v2-code", "roberta-bpe"),
     ("gpt2", True, False, False)),
    (("trillion", "granite-docling"), ("gpt2", False, False, False)),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), ("qwen2", False, False, False)),
    (("megrez", "stablelm2"), ("qwen2", True, False, False)),
    (("starcoder", "refact", "codeshell", "exaone", "minerva-7b"), ("starcoder", True, False, False)),
    (("command-r", "smollm"), ("starcoder", False, False, False)),
    (("falcon",), ("falcon", True, False, False)),
):
    for _n in _names:
        _BPE_PRE[_n] = _entry

# BPE pre-tokenizer families whose text is split before merging (one regex after the other;
# the matches and the text between them both become pieces, as in llama.cpp's
# unicode_regex_split). The regexes are the ones llama.cpp uses (llm_tokenizer_bpe), in the
# syntax of the Oniguruma engine the ``tokenizers`` library runs.
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
BPE_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2_RE,),
    "llama3": ((r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
               r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),),
    "qwen2": ((r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),),
    "starcoder": (r"\p{N}", _GPT2_RE),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_RE, r"[0-9][0-9][0-9]"),
}


def _as_str_list(value: Any, key: str, source: str) -> list[str]:
    """A metadata string array as a list of str (bytes are decoded as UTF-8)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise FileFormatError(source, f"{key}: expected an array of strings, got {type(value).__name__}")
    out = list(value)
    if out and not isinstance(out[0], str):
        try:
            out = [v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v) for v in out]
        except UnicodeDecodeError as e:
            raise FileFormatError(source, f"{key}: a string is not valid UTF-8 ({e})") from e
    return out


def _parse_merges(lines: list[str]) -> list[tuple[str, str]]:
    """``"left right"`` merge lines as pairs, split at the first space after the first character
    (llama_vocab::impl::load); a line without one gives ``("", "")``, a merge that never matches."""
    pairs = [m.split(" ", 1) for m in lines]
    if all(len(p) == 2 and p[0] for p in pairs):
        return [(p[0], p[1]) for p in pairs]
    out = []
    for m in lines:
        pos = m.find(" ", 1)
        out.append((m[:pos], m[pos + 1:]) if pos >= 0 else ("", ""))
    return out


def _meta_bool(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    value = meta.get(key)
    return default if value is None else bool(value)


@dataclass
class Vocab:
    """The vocabulary of a GGUF file, as llama.cpp loads it (``llama_vocab::impl::load``).

    Attributes:
        model: ``tokenizer.ggml.model`` (``"llama"`` = SPM or ``"gpt2"`` = BPE).
        pre: ``tokenizer.ggml.pre`` ("" when absent; BPE vocabularies use it).
        tokens: token id -> text (``n_vocab`` strings; an empty text is stored as ``[EMPTY_<id>]``).
        token_to_id: text -> token id.
        scores: float32 array [n_vocab] (0 where the file has none).
        attrs: int32 array [n_vocab] of :class:`TokenAttr` bits.
        special: special slot name (bos, eos, eot, eom, unk, sep, pad, mask, fim_*) -> id or -1.
        add_bos, add_eos, add_sep, add_space_prefix: llama.cpp's flags after the metadata.
        clean_spaces, ignore_merges: BPE detokenizer / merge settings of the pre-tokenizer.
        pre_family: the pre-tokenizer family (a key of :data:`BPE_PRE_REGEXES`) for BPE, else "".
        merges: BPE merges as (left, right) pairs in rank order (empty for SPM).
        eog_ids: the ids that end generation (``special_eog_ids``).
        special_cache: control / user-defined / unknown ids in the order llama.cpp's
            ``tokenizer_st_partition`` matches them (UTF-8 length descending, then id).
        byte_ids: int64 array [256]: the id of the byte-fallback token of each byte, -1 if none.
        chat_template: ``tokenizer.chat_template`` or None.
    """

    model: str
    pre: str
    tokens: list[str]
    token_to_id: dict[str, int]
    scores: np.ndarray
    attrs: np.ndarray
    special: dict[str, int]
    add_bos: bool
    add_eos: bool
    add_sep: bool
    add_space_prefix: bool
    clean_spaces: bool
    ignore_merges: bool
    pre_family: str
    merges: list[tuple[str, str]] = field(repr=False)
    eog_ids: frozenset[int] = frozenset()
    special_cache: list[int] = field(default_factory=list, repr=False)
    byte_ids: np.ndarray = field(default_factory=lambda: np.full(256, -1, np.int64), repr=False)
    chat_template: str | None = None

    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return len(self.tokens)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], source: str = "GGUF metadata") -> Vocab:
        """Reads a vocabulary from GGUF metadata (key -> value), as ``llama_vocab::impl::load``.

        Args:
            meta: the file's metadata; ``tokenizer.ggml.tokens`` a sequence of str (or bytes, or a
                NumPy string array), ``tokenizer.ggml.scores`` float32/int32 values and
                ``tokenizer.ggml.token_type`` int32 values, each [n_vocab] when present.
            source: what the metadata came from (a file path), named in error messages.

        Raises:
            FileFormatError: a required key is missing, an array is shorter than the token list,
                a token text is duplicated, or ``tokenizer.ggml.model`` / ``tokenizer.ggml.pre``
                names a tokenizer this package does not implement.
        """
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise FileFormatError(source, "tokenizer.ggml.model is missing: the file carries no tokenizer")
        model = str(model)
        if model not in (VocabType.SPM, VocabType.BPE):
            raise FileFormatError(source, f"tokenizer.ggml.model = {model!r}: only 'llama' (SentencePiece) "
                                          f"and 'gpt2' (byte-level BPE) vocabularies are implemented")
        pre = str(meta.get("tokenizer.ggml.pre") or "")
        if "tokenizer.ggml.tokens" not in meta:
            raise FileFormatError(source, "tokenizer.ggml.tokens is missing: cannot find the vocabulary")
        tokens = _as_str_list(meta["tokenizer.ggml.tokens"], "tokenizer.ggml.tokens", source)
        n = len(tokens)
        if n == 0:
            raise FileFormatError(source, "tokenizer.ggml.tokens is empty")
        if "" in tokens:
            tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        token_to_id = dict(zip(tokens, range(n)))
        if len(token_to_id) != n:
            seen: set[str] = set()
            dup = next(t for t in tokens if t in seen or seen.add(t))
            raise FileFormatError(source, f"tokenizer.ggml.tokens: duplicate token {dup!r} "
                                  f"(ids {tokens.index(dup)} and {tokens.index(dup, tokens.index(dup) + 1)})")

        scores = np.zeros(n, np.float32)
        if meta.get("tokenizer.ggml.scores") is not None:
            s = np.asarray(meta["tokenizer.ggml.scores"])
            if s.shape[0] < n:
                raise FileFormatError(source, f"tokenizer.ggml.scores has {s.shape[0]} values for {n} tokens")
            scores = s[:n].astype(np.float32, copy=False)
        attrs = np.full(n, TokenAttr.NORMAL, np.int32)
        if meta.get("tokenizer.ggml.token_type") is not None:
            t = np.asarray(meta["tokenizer.ggml.token_type"]).astype(np.int64, copy=False)
            if t.shape[0] < n:
                raise FileFormatError(source, f"tokenizer.ggml.token_type has {t.shape[0]} values "
                                              f"for {n} tokens")
            t = t[:n]
            attrs = np.where((t >= 0) & (t < len(_TYPE_TO_ATTR)), _TYPE_TO_ATTR[np.clip(t, 0, 6)],
                             TokenAttr.UNDEFINED).astype(np.int32)

        # type defaults (llama_vocab::impl::load)
        merges: list[tuple[str, str]] = []
        if model == VocabType.SPM:
            special = {"bos": 1, "eos": 2, "unk": 0}
            add_bos, add_eos, add_sep, add_space_prefix = True, False, False, True
            clean_spaces, ignore_merges, pre_family = False, False, ""
        else:
            raw = meta.get("tokenizer.ggml.merges")
            if raw is None:
                raise FileFormatError(source, "tokenizer.ggml.merges is missing: a 'gpt2' vocabulary "
                                              "needs its merges")
            merges = _parse_merges(_as_str_list(raw, "tokenizer.ggml.merges", source))
            special = {"bos": 11, "eos": 11}
            key = pre or "default"
            if key not in _BPE_PRE:
                raise FileFormatError(source, f"tokenizer.ggml.pre = {pre!r}: pre-tokenizer not implemented "
                                      f"(implemented: {', '.join(sorted(_BPE_PRE))})")
            pre_family, clean_spaces, ignore_merges, add_bos = _BPE_PRE[key]
            add_eos, add_sep, add_space_prefix = False, False, False
        add_space_prefix = _meta_bool(meta, "tokenizer.ggml.add_space_prefix", add_space_prefix)

        for name in ("unk", "eot", "eom", "sep", "pad", "mask", "fim_pre", "fim_suf", "fim_mid", "fim_pad",
                     "fim_rep", "fim_sep"):
            special.setdefault(name, -1)
        for name, key in _SPECIAL_KEYS:
            if special[name] >= n:
                special[name] = -1
            value = meta.get(key)
            if value is not None and 0 <= int(value) < n:
                special[name] = int(value)
        add_bos = _meta_bool(meta, "tokenizer.ggml.add_bos_token", add_bos)
        add_eos = _meta_bool(meta, "tokenizer.ggml.add_eos_token", add_eos)
        add_sep = _meta_bool(meta, "tokenizer.ggml.add_sep_token", add_sep)
        for flag, slot in ((add_bos, "bos"), (add_eos, "eos"), (add_sep, "sep")):
            if flag and special[slot] < 0:
                raise FileFormatError(source, f"tokenizer.ggml.add_{slot}_token is true, but "
                                      f"the {slot} token id is not set")

        # text-detected special ids; a detected token that is not CONTROL becomes CONTROL.
        # llama.cpp walks an unordered map, so among several matching texts the one it keeps is
        # unspecified; this takes the first text of each list that the vocabulary has.
        for name, texts in _TEXT_DETECTED:
            if special[name] >= 0:
                continue
            for text in texts:
                tid = token_to_id.get(text)
                if tid is not None:
                    special[name] = tid
                    attrs[tid] |= TokenAttr.CONTROL
                    break
        # control tokens whose text says "unused" are UNUSED as well
        control = np.flatnonzero(attrs & TokenAttr.CONTROL)
        for tid in control.tolist():
            if "unused" in tokens[tid]:
                attrs[tid] |= TokenAttr.UNUSED

        eog = {special[k] for k in ("fim_pad", "fim_rep", "fim_sep") if special[k] >= 0}
        for text in _EOG_TEXTS:
            tid = token_to_id.get(text)
            if tid is not None:
                eog.add(tid)
                attrs[tid] |= TokenAttr.CONTROL
        for text in _ALWAYS_RENDERED:
            tid = token_to_id.get(text)
            if tid is not None:
                attrs[tid] = TokenAttr.USER_DEFINED
        eog.update(special[k] for k in ("eos", "eot", "eom") if special[k] >= 0)
        texts_eog = {tokens[i]: i for i in eog}
        # o200k_harmony / solar-open: "<|end|>" is not EOG next to "<|return|>" + "<|call|>"
        # (or "<|calls|>" + "<|flush|>")
        if "<|end|>" in texts_eog and (("<|return|>" in texts_eog and ("<|call|>" in texts_eog or
                                                                      "<|calls|>" in texts_eog))
                                       or ("<|flush|>" in texts_eog and ("<|call|>" in texts_eog or
                                                                         "<|calls|>" in texts_eog))):
            eog.discard(texts_eog["<|end|>"])
            attrs[texts_eog["<|end|>"]] = TokenAttr.USER_DEFINED
        # gemma4 / paddleocr: "</s>" is not EOG next to "<|tool_response>"
        if "<|tool_response>" in texts_eog and "</s>" in texts_eog:
            eog.discard(texts_eog["</s>"])
            attrs[texts_eog["</s>"]] = TokenAttr.NORMAL

        # special-token cache: CONTROL | USER_DEFINED | UNKNOWN, longest UTF-8 text first. llama.cpp
        # sorts with std::sort (not stable); ties keep id order here.
        cache_ids = np.flatnonzero(attrs & (TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN))
        cache = sorted(cache_ids.tolist(), key=lambda i: -len(tokens[i].encode("utf-8")))

        # per-token strip attributes llama.cpp sets by model / tokenizer / architecture name
        name = str(meta.get("general.name") or "").lower()
        arch = str(meta.get("general.architecture") or "")
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or \
                any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if "<mask>" in token_to_id:
                attrs[token_to_id["<mask>"]] |= TokenAttr.LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for tid in cache:
                attrs[tid] |= TokenAttr.RSTRIP
            for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if text in token_to_id:
                    tid = token_to_id[text]
                    attrs[tid] = attrs[tid] | TokenAttr.RSTRIP if on else attrs[tid] & ~TokenAttr.RSTRIP
        elif "modern-bert" in name and "[MASK]" in token_to_id:
            attrs[token_to_id["[MASK]"]] |= TokenAttr.LSTRIP

        byte_ids = np.full(256, -1, np.int64)
        if model == VocabType.SPM:
            for b in range(256):
                tid = token_to_id.get(f"<0x{b:02X}>")
                if tid is None and b < 0x80:
                    tid = token_to_id.get(chr(b))
                if tid is not None:
                    byte_ids[b] = tid
        template = meta.get("tokenizer.chat_template")
        return cls(model=model, pre=pre, tokens=tokens, token_to_id=token_to_id, scores=scores,
                   attrs=attrs, special=special, add_bos=add_bos, add_eos=add_eos, add_sep=add_sep,
                   add_space_prefix=add_space_prefix, clean_spaces=clean_spaces,
                   ignore_merges=ignore_merges, pre_family=pre_family, merges=merges,
                   eog_ids=frozenset(eog), special_cache=cache, byte_ids=byte_ids,
                   chat_template=None if template is None else str(template))

    def token_attr(self, token_id: int) -> int:
        """The :class:`TokenAttr` bits of ``token_id`` (``llama_vocab::token_get_attr``).

        Raises:
            IndexError: ``token_id`` is outside [0, n_vocab).
        """
        self.check_id(token_id)
        return int(self.attrs[token_id])

    def check_id(self, token_id: int) -> None:
        """Raises IndexError unless ``0 <= token_id < n_vocab``."""
        if not 0 <= token_id < len(self.tokens):
            raise IndexError(f"token id {token_id} is outside the vocabulary [0, {len(self.tokens)})")


def as_sequence(ids: Sequence[int] | np.ndarray) -> list[int]:
    """Token ids as a list of Python ints (accepts lists, tuples and integer NumPy arrays)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"ids: expected a 1-d integer array, got shape {ids.shape} dtype {ids.dtype}")
        return ids.tolist()
    return [int(i) for i in ids]
