"""Text <-> token ids for a llama.cpp GGUF vocabulary, with llama.cpp's ids.

:class:`Tokenizer` mirrors ``llama_tokenize`` / ``llama_detokenize`` / ``llama_token_to_piece``
(llama-vocab.cpp, ``llama_vocab::impl::tokenize`` and friends) for the two vocabulary types of
llama.cpp GGUF files that this package reads:

* ``tokenizer.ggml.model = "llama"`` (SPM, e.g. Gemma 3): score-ordered merges with ``<0xXX>``
  byte fallback, spaces as ``▁``, an optional space prefix (:mod:`.spm`, Python);
* ``tokenizer.ggml.model = "gpt2"`` (byte-level BPE, e.g. Llama 3, Qwen 2, GPT-2): the file's
  merges and llama.cpp's pre-tokenizer regexes for ``tokenizer.ggml.pre`` (:mod:`.bpe`, run by the
  ``tokenizers`` library).

Both first split special tokens out of the text as ``tokenizer_st_partition`` does: every
control, user-defined and unknown token, longest first, cuts each raw fragment at each of its
occurrences; user-defined tokens always, control and unknown ones only with ``parse_special``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ggmlpy.models.llm.bpe import BPEEncoder
from ggmlpy.models.llm.spm import spm_tokenize
from ggmlpy.models.llm.vocab import TokenAttr, Vocab, VocabType, as_sequence

__all__ = ["Tokenizer"]

_SPECIAL_ATTRS = TokenAttr.CONTROL | TokenAttr.UNKNOWN
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale, used by the LSTRIP/RSTRIP attributes


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte <-> printable-unicode map, inverted (unicode_utf8_to_byte in unicode.cpp)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class Tokenizer:
    """A llama.cpp tokenizer over one GGUF vocabulary.

    Build it with :meth:`from_gguf_metadata`. Encoding returns the ids llama.cpp's
    ``llama_tokenize(vocab, text, add_special, parse_special)`` returns; decoding mirrors
    ``llama_detokenize`` / ``llama_token_to_piece``. Thread-safe for concurrent reads once built
    (the lazily built tables are built under the GIL with idempotent assignments).

    Attributes:
        vocab: the :class:`~ggmlpy.models.llm.vocab.Vocab` read from the metadata.
    """

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._scores: list[float] | None = None
        self._bpe: BPEEncoder | None = None
        self._trie: dict[Any, Any] | None = None
        self._first_re: re.Pattern[str] | None = None
        self._order: dict[int, int] | None = None
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._byte_decoder: dict[str, int] | None = None

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], source: str = "GGUF metadata") -> Tokenizer:
        """Builds the tokenizer of a GGUF file from its metadata (key -> value).

        ``tokenizer.ggml.tokens`` may be a list of str / bytes or a NumPy string array;
        ``tokenizer.ggml.scores`` (float32) and ``tokenizer.ggml.token_type`` (int32) are arrays of
        the same length. The expensive tables (the special-token matcher, the BPE model) are built
        on first use. ``source`` (a file path) names the metadata in error messages.

        Raises:
            ggmlpy.core.errors.FileFormatError: the metadata describe no vocabulary, an inconsistent one,
                or a tokenizer model / pre-tokenizer that is not implemented.
        """
        return cls(Vocab.from_gguf_metadata(metadata, source))

    # --- properties -------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Number of tokens (``llama_vocab_n_tokens``)."""
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        """The BOS id (``llama_vocab_bos``), None when the vocabulary has none."""
        return self._slot("bos")

    @property
    def eos_id(self) -> int | None:
        """The EOS id (``llama_vocab_eos``), None when the vocabulary has none."""
        return self._slot("eos")

    @property
    def eot_id(self) -> int | None:
        """The end-of-turn id (``llama_vocab_eot``), None when the vocabulary has none."""
        return self._slot("eot")

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every id that ends generation (llama.cpp's ``special_eog_ids``)."""
        return self.vocab.eog_ids

    @property
    def add_bos(self) -> bool:
        """Whether :meth:`encode` with ``add_special`` prepends BOS (``llama_vocab_get_add_bos``)."""
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        """Whether :meth:`encode` with ``add_special`` appends EOS (``llama_vocab_get_add_eos``)."""
        return self.vocab.add_eos

    def _slot(self, name: str) -> int | None:
        tid = self.vocab.special.get(name, -1)
        return None if tid < 0 else tid

    def is_eog(self, token_id: int) -> bool:
        """Whether ``token_id`` ends generation (``llama_vocab_is_eog``): EOS, EOT, EOM, the FIM
        pad/repo/separator tokens and every token whose text llama.cpp lists as an end (e.g.
        ``<end_of_turn>``, ``<|im_end|>``, ``<|eot_id|>``). Ids outside the vocabulary are not."""
        return token_id in self.vocab.eog_ids

    # --- encode -----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (``llama_tokenize(vocab, text, add_special, parse_special)``).

        Args:
            text: the text (a str; llama.cpp's UTF-8 bytes are its encoding).
            add_special: add BOS / EOS where the vocabulary asks for them (``add_bos_token`` /
                ``add_eos_token``).
            parse_special: also turn the texts of control and unknown tokens (``<start_of_turn>``,
                ``<bos>`` ...) into their ids; user-defined tokens are always matched.

        Returns:
            list of int ids in [0, n_vocab).

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: (SPM) a character has neither a token nor byte-fallback tokens.
        """
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        v = self.vocab
        frags = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and v.add_bos:
            out.append(v.special["bos"])
        if v.model == VocabType.SPM:
            if self._scores is None:
                self._scores = v.scores.tolist()
            scores, t2i, byte_ids = self._scores, v.token_to_id, v.byte_ids
            prev_special = True
            for f in frags:
                if isinstance(f, str):
                    if v.add_space_prefix and prev_special:
                        f = " " + f
                    spm_tokenize(f.replace(" ", "\u2581"), t2i, scores, byte_ids, out)
                    prev_special = False
                else:
                    out.append(f)
                    prev_special = True
        else:
            raw = [f for f in frags if isinstance(f, str)]
            encoded = iter(self._bpe_encoder().encode(raw)) if raw else iter(())
            for f in frags:
                if isinstance(f, str):
                    out.extend(next(encoded))
                else:
                    out.append(f)
        if add_special and v.add_eos:
            out.append(v.special["eos"])
        return out

    def _bpe_encoder(self) -> BPEEncoder:
        if self._bpe is None:
            self._bpe = BPEEncoder(self.vocab)
        return self._bpe

    def _build_matcher(self) -> None:
        """The special-token trie (char -> node; node[None] = id) and the first-character regex."""
        tokens = self.vocab.tokens
        trie: dict[Any, Any] = {}
        for tid in self.vocab.special_cache:
            node = trie
            for ch in tokens[tid]:
                node = node.setdefault(ch, {})
            node[None] = tid
        self._order = {tid: k for k, tid in enumerate(self.vocab.special_cache)}
        firsts = "".join(sorted(k for k in trie if k is not None))
        self._first_re = re.compile("[" + re.escape(firsts) + "]") if firsts else None
        self._trie = trie

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Splits ``text`` into raw fragments (str) and special ids (int), as
        ``tokenizer_st_partition``: for each special token in cache order (longest first), every
        raw fragment is cut at each non-overlapping occurrence, left to right."""
        if self._trie is None:
            self._build_matcher()
        if self._first_re is None:
            return [text]
        # the specials that occur anywhere in the text: a trie walk from each possible start
        trie, attrs, n = self._trie, self.vocab.attrs, len(text)
        found: set[int] = set()
        for m in self._first_re.finditer(text):
            node = trie
            j = m.start()
            while j < n:
                node = node.get(text[j])
                if node is None:
                    break
                j += 1
                tid = node.get(None)
                if tid is not None:
                    found.add(tid)
        if not found:
            return [text]
        cands = sorted(found, key=self._order.__getitem__)
        tokens = self.vocab.tokens
        frags: list[str | int] = [text]
        for tid in cands:
            attr = int(attrs[tid])
            if not parse_special and attr & _SPECIAL_ATTRS:
                continue
            s = tokens[tid]
            ls, rs = attr & TokenAttr.LSTRIP, attr & TokenAttr.RSTRIP
            new: list[str | int] = []
            for f in frags:
                if not isinstance(f, str) or s not in f:
                    new.append(f)
                    continue
                pos = 0
                while True:
                    m = f.find(s, pos)
                    if m < 0:
                        break
                    left = f[pos:m]
                    if ls:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        new.append(left)
                    new.append(tid)
                    pos = m + len(s)
                    if rs:
                        while pos < len(f) and f[pos] in _C_SPACE:
                            pos += 1
                if pos < len(f):
                    new.append(f[pos:])
            frags = new
        return frags

    # --- decode -----------------------------------------------------------------------------

    def token_to_bytes(self, token_id: int, special: bool = False, lstrip: int = 0) -> bytes:
        """The UTF-8 bytes of one token (``llama_token_to_piece(vocab, id, buf, n, lstrip, special)``).

        Control and unknown tokens give ``b""`` unless ``special``; byte tokens (``<0xXX>``) give
        their one byte, which may be part of a multi-byte character (decode the concatenation).
        ``lstrip``: leading spaces to drop (at most).

        Raises:
            IndexError: ``token_id`` is outside the vocabulary.
        """
        self.vocab.check_id(token_id)
        key = (token_id, bool(special))
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._piece(token_id, bool(special))
            self._pieces[key] = piece
        if lstrip:
            k = 0
            while k < lstrip and k < len(piece) and piece[k] == 0x20:
                k += 1
            piece = piece[k:]
        return piece

    def token_to_piece(self, token_id: int, special: bool = False) -> str:
        """One token's text (:meth:`token_to_bytes` decoded as UTF-8; a lone byte of a
        multi-byte character becomes U+FFFD).

        Raises:
            IndexError: ``token_id`` is outside the vocabulary.
        """
        return self.token_to_bytes(token_id, special).decode("utf-8", errors="replace")

    def _piece(self, token_id: int, special: bool) -> bytes:
        v = self.vocab
        attr = int(v.attrs[token_id])
        text = v.tokens[token_id]
        if not special and attr & _SPECIAL_ATTRS:
            return b""
        if attr & (_SPECIAL_ATTRS | TokenAttr.USER_DEFINED):
            return text.encode("utf-8")
        if attr & TokenAttr.NORMAL:
            if v.model == VocabType.SPM:
                return text.replace("\u2581", " ").encode("utf-8")
            if self._byte_decoder is None:
                self._byte_decoder = _gpt2_unicode_to_byte()
            dec = self._byte_decoder
            out = bytearray()
            for ch in text:
                b = dec.get(ch)
                if b is None:  # llama_decode_text's marker for a character outside the map
                    out += ("[UNK_BYTE_0x" + ch.encode("utf-8").hex() + text + "]").encode("utf-8")
                else:
                    out.append(b)
            return bytes(out)
        if attr & TokenAttr.BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def decode_bytes(self, ids: Sequence[int] | np.ndarray, remove_special: bool = False,
                     unparse_special: bool = False) -> bytes:
        """The UTF-8 bytes of ``ids`` (``llama_detokenize(vocab, ids, n, text, len, remove_special,
        unparse_special)``).

        ``remove_special`` drops a leading BOS / trailing EOS when the vocabulary adds them;
        ``unparse_special`` renders control tokens as their text. The first token loses one
        leading space when the vocabulary adds a space prefix; BPE vocabularies with
        ``clean_spaces`` drop the spaces llama.cpp drops (before ``?!.,``, around a lone ``'``,
        before ``'s 'm 're 've``).

        Raises:
            IndexError: an id is outside the vocabulary.
            TypeError: ``ids`` is not a sequence of ints / a 1-d integer array.
        """
        v = self.vocab
        seq = as_sequence(ids)
        remove_space = v.add_space_prefix
        if remove_special and v.add_bos and seq and seq[0] == v.special["bos"]:
            remove_space = False
            seq = seq[1:]
        if remove_special and v.add_eos and seq and seq[-1] == v.special["eos"]:
            seq = seq[:-1]
        parts = []
        for i, tid in enumerate(seq):
            parts.append(self.token_to_bytes(tid, unparse_special, 1 if (remove_space and i == 0) else 0))
        text = b"".join(parts)
        return _clean_spaces(text) if v.clean_spaces else text

    def decode(self, ids: Sequence[int] | np.ndarray, remove_special: bool = False,
               unparse_special: bool = False) -> str:
        """The text of ``ids``: :meth:`decode_bytes` as UTF-8 (invalid sequences -> U+FFFD).

        Raises:
            IndexError: an id is outside the vocabulary.
        """
        return self.decode_bytes(ids, remove_special, unparse_special).decode("utf-8", errors="replace")


def _clean_spaces(text: bytes) -> bytes:
    """llama_detokenize's three clean-up passes over the detokenized bytes (``clean_spaces``)."""
    t = bytearray(text)
    # pass 1: " ?", " !", " .", " ," lose the space
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    t = out
    # pass 2: " ' " -> "'" (both spaces go; the dropped one no longer counts as a space before
    # the next character)
    out = bytearray(t[:1])
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            t[i + 1] = 0
            out.append(x)
            i += 2
            continue
        out.append(x)
        i += 1
    t = bytearray(out)
    # pass 3: " 's", " 'm", " 're", " 've" lose the space
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm":
                out.pop()
            elif i + 2 < len(t) and ((x1 == 0x72 and t[i + 2] == 0x65) or (x1 == 0x76 and t[i + 2] == 0x65)):
                out.pop()
        out.append(x)
    return bytes(out)
