"""Streaming detokenization: text as tokens arrive, never splitting a UTF-8 character.

llama.cpp's examples stream generated text with ``common_token_to_piece`` per token (one
``llama_token_to_piece`` each, no cross-token clean-up); a byte-fallback token may carry only part
of a multi-byte character. :class:`StreamDecoder` concatenates those pieces through an incremental
UTF-8 decoder, so each :meth:`~StreamDecoder.push` returns only complete characters.
"""

from __future__ import annotations

import codecs

from ggmlpy.models.llm.tokenizer import Tokenizer

__all__ = ["StreamDecoder"]


class StreamDecoder:
    """Incremental text of a token stream (``llama_token_to_piece`` per token, UTF-8 joined).

    Args:
        tokenizer: the vocabulary's :class:`~ggmlpy.models.llm.tokenizer.Tokenizer`.
        special: render control tokens as their text (``llama_token_to_piece(..., special)``).

    The concatenated output of :meth:`push` calls and a final :meth:`flush` equals the UTF-8
    decoding (invalid bytes -> U+FFFD) of all the tokens' pieces; it does not apply
    ``Tokenizer.decode``'s first-token space strip or BPE ``clean_spaces`` passes.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self.tokenizer = tokenizer
        self.special = bool(special)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by one more token (possibly ``""`` while a character is open).

        Raises:
            IndexError: ``token_id`` is outside the vocabulary.
        """
        return self._utf8.decode(self.tokenizer.token_to_bytes(token_id, self.special))

    def flush(self) -> str:
        """The rest at the end of the stream (U+FFFD for an unfinished character); resets."""
        out = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return out
