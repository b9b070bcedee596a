"""Byte-level BPE tokenization of text fragments with the ``tokenizers`` library.

llama.cpp's ``llm_tokenizer_bpe_session::tokenize`` (llama-vocab.cpp) splits a fragment with the
pre-tokenizer's regexes (``unicode_regex_split``: each regex splits the pieces of the previous one;
the matches and the text between them are pieces), maps each piece's UTF-8 bytes to GPT-2's
byte-to-unicode alphabet, and merges adjacent symbols by the lowest merge rank (ties: the leftmost
pair); with ``ignore_merges`` a piece that is a whole token is taken as it is. The ``tokenizers``
library runs the same steps: a ``Sequence`` of ``Split(regex, "isolated")`` pre-tokenizers, a
``ByteLevel`` pre-tokenizer without its own regex, and a ``BPE`` model over the file's vocabulary
and merges. Special tokens are not given to it: the caller splits them out first (as llama.cpp's
``tokenizer_st_partition``) and hands over raw text only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ggmlpy.models.llm.vocab import BPE_PRE_REGEXES, Vocab

__all__ = ["BPEEncoder"]


def _tokenizers():
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("BPE (tokenizer.ggml.model = 'gpt2') vocabularies need the tokenizers "
                          "package: pip install 'ggmlpy[llm]'") from e
    return tokenizers


class BPEEncoder:
    """Encodes raw text fragments with a vocabulary's byte-level BPE (no special tokens).

    Built from a :class:`~ggmlpy.models.llm.vocab.Vocab` of type ``gpt2``. Merges whose parts or
    result are not vocabulary tokens cannot be given to ``tokenizers``; they are left out and
    counted in :attr:`n_merges_dropped` (llama.cpp would apply such a merge and then fall back to
    single-byte tokens).

    Raises:
        ValueError: the vocabulary is not a BPE one.
        ImportError: the ``tokenizers`` package is missing.
    """

    def __init__(self, vocab: Vocab) -> None:
        if vocab.model != "gpt2":
            raise ValueError(f"BPEEncoder: vocab.model is {vocab.model!r}, expected 'gpt2'")
        tk = _tokenizers()
        t2i = vocab.token_to_id
        merges = [(a, b) for a, b in vocab.merges if a in t2i and b in t2i and (a + b) in t2i]
        self.n_merges_dropped = len(vocab.merges) - len(merges)
        model = tk.models.BPE(vocab=t2i, merges=merges, ignore_merges=vocab.ignore_merges,
                              byte_fallback=False, fuse_unk=False)
        tok = tk.Tokenizer(model)
        steps = [tk.pre_tokenizers.Split(tk.Regex(r), behavior="isolated", invert=False)
                 for r in BPE_PRE_REGEXES[vocab.pre_family]]
        steps.append(tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        tok.pre_tokenizer = tk.pre_tokenizers.Sequence(steps)
        self._tok = tok

    def encode(self, fragments: Sequence[str]) -> list[list[int]]:
        """Token ids of each raw fragment (no special-token matching), as
        ``llm_tokenizer_bpe_session::tokenize`` per fragment; one ``tokenizers`` batch call.

        Args:
            fragments: raw text pieces (special tokens already split out).

        Returns:
            one list of int ids per fragment, in order.
        """
        if len(fragments) == 1:
            return [self._tok.encode(fragments[0], add_special_tokens=False).ids]
        return [e.ids for e in self._tok.encode_batch(list(fragments), add_special_tokens=False)]
