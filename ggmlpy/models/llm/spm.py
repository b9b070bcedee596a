"""SentencePiece-style (SPM) tokenization of one text fragment, as llama.cpp does it.

llama.cpp's ``llm_tokenizer_spm_session::tokenize`` (llama-vocab.cpp) does not run SentencePiece:
it splits the (space-escaped) text into UTF-8 characters, then repeatedly merges the adjacent pair
whose concatenation is a vocabulary token with the highest score (ties: the leftmost pair), and
finally maps each remaining piece to its token, or, when the piece is not a token, to the
byte-fallback tokens ``<0xXX>`` of its UTF-8 bytes. Any token text can be formed by merges, of
whatever type. This module runs the same algorithm on Python strings; the ``tokenizers`` library
has no model with these merge rules (its BPE merges by rank, and building ranks for a 262k
vocabulary costs seconds), so this part is Python.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["spm_tokenize"]


def spm_tokenize(text: str, token_to_id: dict[str, int], scores: list[float], byte_ids: np.ndarray,
                 out: list[int]) -> None:
    """Appends the SPM tokens of ``text`` to ``out`` (``llm_tokenizer_spm_session::tokenize``).

    Args:
        text: one raw fragment, spaces already replaced by ``▁`` (U+2581) by the caller.
        token_to_id: text -> id of the whole vocabulary.
        scores: id -> score (Python floats; float32 values of ``tokenizer.ggml.scores``).
        byte_ids: int64 [256], byte -> id of its ``<0xXX>`` token (or of the one-byte ASCII token),
            -1 where the vocabulary has none.
        out: the id list to extend (modified in place).

    Raises:
        ValueError: a character is not a token and one of its bytes has no byte-fallback token
            (llama.cpp throws ``std::out_of_range`` in ``byte_to_token`` there).
    """
    n = len(text)
    if n == 0:
        return
    get = token_to_id.get
    if n == 1:
        tid = get(text)
        if tid is not None:
            out.append(tid)
        else:
            _append_bytes(text, byte_ids, out)
        return
    # symbol i covers text[start[i] : start[i] + length[i]]; merged-away symbols have length 0
    start = list(range(n))
    length = [1] * n
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    heap: list[tuple[float, int, int, int]] = []
    push = heapq.heappush
    for i in range(n - 1):
        tid = get(text[i:i + 2])
        if tid is not None:
            # llama.cpp's comparator pops the highest score, then the smallest left index
            heap.append((-scores[tid], i, i + 1, 2))
    heapq.heapify(heap)
    pop = heapq.heappop
    while heap:
        _, left, right, size = pop(heap)
        ln, rn = length[left], length[right]
        if ln == 0 or rn == 0 or ln + rn != size:
            continue  # one side already merged into something else
        length[left] = ln + rn
        length[right] = 0
        r_next = nxt[right]
        nxt[left] = r_next
        if r_next >= 0:
            prev[r_next] = left
        p = prev[left]
        if p >= 0:
            s = start[p]
            piece = text[s:start[left] + ln + rn]
            tid = get(piece)
            if tid is not None:
                push(heap, (-scores[tid], p, left, len(piece)))
        if r_next >= 0:
            piece = text[start[left]:start[r_next] + length[r_next]]
            tid = get(piece)
            if tid is not None:
                push(heap, (-scores[tid], left, r_next, len(piece)))
    i = 0
    while i != -1:
        s = start[i]
        piece = text[s:s + length[i]]
        tid = get(piece)
        if tid is not None:
            out.append(tid)
        else:
            # a merged piece is always a token, so what is left here is a single character
            _append_bytes(piece, byte_ids, out)
        i = nxt[i]


def _append_bytes(piece: str, byte_ids: np.ndarray, out: list[int]) -> None:
    for b in piece.encode("utf-8"):
        tid = int(byte_ids[b])
        if tid < 0:
            raise ValueError(f"character {piece!r} is not in the vocabulary and byte 0x{b:02X} has no "
                             f"byte-fallback token <0x{b:02X}>")
        out.append(tid)
