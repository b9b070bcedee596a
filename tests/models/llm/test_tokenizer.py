"""ggmlpy.models.llm.tokenizer against llama.cpp's ids, and the llama.cpp rules it ports.

Reference data: ``tests/data/{bpe,gemma3}_tokenizer.json`` (llama-cpp-python 0.3.36,
``scripts/make_llm_reference.py``): for every string, the ids of ``llama_tokenize`` in two modes
(``bos``: add_special=True, parse_special=False; ``special``: add_special=False,
parse_special=True) and ``llama_detokenize`` of those ids with and without ``unparse_special``.
The synthetic vocabularies below check single rules of llama-vocab.cpp with hand-derived ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ggmlpy.core.errors import FileFormatError
from ggmlpy.models.llm.stream import StreamDecoder
from ggmlpy.models.llm.tokenizer import Tokenizer, _clean_spaces
from ggmlpy.models.llm.vocab import _parse_merges

MODES = {"bos": (True, False), "special": (False, True)}


def _mismatches(tok: Tokenizer, ref: dict[str, Any], mode: str) -> list[str]:
    add_special, parse_special = MODES[mode]
    bad = []
    for case in ref["cases"]:
        got = tok.encode(case["text"], add_special=add_special, parse_special=parse_special)
        if got != case[mode]["ids"]:
            bad.append(f"{case['text']!r}: got {got[:16]} want {case[mode]['ids'][:16]}")
    return bad


def _check_vocab(tok: Tokenizer, ref: dict[str, Any]) -> None:
    v = ref["meta"]["vocab"]
    assert tok.n_vocab == v["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (v["bos_id"], v["eos_id"], v["eot_id"])
    assert tok.add_bos == v["add_bos"] and tok.add_eos == v["add_eos"]
    assert sorted(tok.eog_ids) == v["eog_ids"]
    assert [i for i in range(tok.n_vocab) if tok.is_eog(i)] == v["eog_ids"]
    assert not tok.is_eog(-1) and not tok.is_eog(tok.n_vocab)


def _check_detok(tok: Tokenizer, ref: dict[str, Any]) -> None:
    bad = []
    for case in ref["cases"]:
        for mode in MODES:
            r = case[mode]
            got = (tok.decode(r["ids"]), tok.decode(r["ids"], unparse_special=True))
            if got != (r["detok"], r["detok_special"]):
                bad.append(f"{r['ids'][:12]}: got {got!r} want {(r['detok'], r['detok_special'])!r}")
    assert not bad, f"{len(bad)} detokenizations differ from llama.cpp's:\n" + "\n".join(bad[:10])


# --- the BPE vocabulary (tests/data/tiny_llama_bpe.gguf, gpt2 model, pre "gpt-2") --------------

@pytest.fixture(scope="module")
def bpe_tok(bpe_meta: dict[str, Any]) -> Tokenizer:
    pytest.importorskip("tokenizers")
    return Tokenizer.from_gguf_metadata(bpe_meta)


@pytest.mark.parametrize("mode", list(MODES))
def test_bpe_ids_match_llama_cpp(bpe_tok: Tokenizer, bpe_ref: dict[str, Any], mode: str) -> None:
    assert len(bpe_ref["cases"]) >= 300
    bad = _mismatches(bpe_tok, bpe_ref, mode)
    assert not bad, f"{len(bad)}/{len(bpe_ref['cases'])} strings differ from llama.cpp:\n" + \
        "\n".join(bad[:10])


def test_bpe_vocab_matches_llama_cpp(bpe_tok: Tokenizer, bpe_ref: dict[str, Any]) -> None:
    assert bpe_tok.vocab.model == "gpt2" and bpe_tok.vocab.pre_family == "gpt2"
    _check_vocab(bpe_tok, bpe_ref)


def test_bpe_detokenize_matches_llama_cpp(bpe_tok: Tokenizer, bpe_ref: dict[str, Any]) -> None:
    _check_detok(bpe_tok, bpe_ref)


# --- Gemma 3 270M (SPM), needs $GGMLPY_GEMMA3_GGUF -------------------------------------------

@pytest.fixture(scope="module")
def gemma_tok(gemma_meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gemma_meta)


@pytest.mark.parametrize("mode", list(MODES))
def test_gemma_ids_match_llama_cpp(gemma_tok: Tokenizer, gemma_ref: dict[str, Any], mode: str) -> None:
    assert len(gemma_ref["cases"]) >= 300
    bad = _mismatches(gemma_tok, gemma_ref, mode)
    assert not bad, f"{len(bad)}/{len(gemma_ref['cases'])} strings differ from llama.cpp:\n" + \
        "\n".join(bad[:10])


def test_gemma_vocab_matches_llama_cpp(gemma_tok: Tokenizer, gemma_ref: dict[str, Any]) -> None:
    assert gemma_tok.vocab.model == "llama" and not gemma_tok.vocab.add_space_prefix
    _check_vocab(gemma_tok, gemma_ref)


def test_gemma_detokenize_matches_llama_cpp(gemma_tok: Tokenizer, gemma_ref: dict[str, Any]) -> None:
    _check_detok(gemma_tok, gemma_ref)


# --- single llama.cpp rules on a synthetic SPM vocabulary --------------------------------------

_BASE = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
_BASE_TYPES = [2, 3, 3] + [6] * 256


def _spm(extra: list[tuple[str, float, int]], **meta: Any) -> Tokenizer:
    """A SPM vocab: unk/bos/eos, the 256 byte tokens (ids 3..258), then ``extra`` (text, score,
    token_type) from id 259 on."""
    tokens = _BASE + [t for t, _, _ in extra]
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.scores": np.array([0.0] * len(_BASE) + [s for _, s, _ in extra], np.float32),
          "tokenizer.ggml.token_type": np.array(_BASE_TYPES + [ty for _, _, ty in extra], np.int32)}
    md.update(meta)
    return Tokenizer.from_gguf_metadata(md)


def _ids(tok: Tokenizer, *texts: str) -> list[int]:
    return [tok.vocab.token_to_id[t] for t in texts]


NORMAL, CONTROL, USER = 1, 3, 4


@pytest.mark.parametrize("s_ab,s_bc,want", [(-1.0, -2.0, ("ab", "c")), (-2.0, -1.0, ("a", "bc")),
                                            (-1.0, -1.0, ("ab", "c"))])
def test_spm_merges_highest_score_then_leftmost(s_ab: float, s_bc: float, want: tuple[str, ...]) -> None:
    tok = _spm([("a", -5, NORMAL), ("b", -5, NORMAL), ("c", -5, NORMAL), ("ab", s_ab, NORMAL),
                ("bc", s_bc, NORMAL)], **{"tokenizer.ggml.add_space_prefix": False})
    assert tok.encode("abc", add_special=False) == _ids(tok, *want)


def test_spm_merges_continue_through_longer_pieces() -> None:
    # ab (-1) first, then ab+c = abc (-3) is a token: one piece; "abcabc" merges each half
    tok = _spm([("a", -5, NORMAL), ("b", -5, NORMAL), ("c", -5, NORMAL), ("ab", -1, NORMAL),
                ("bc", -2, NORMAL), ("abc", -3, NORMAL)], **{"tokenizer.ggml.add_space_prefix": False})
    assert tok.encode("abc", add_special=False) == _ids(tok, "abc")
    assert tok.encode("abcabc", add_special=False) == _ids(tok, "abc", "abc")


def test_spm_byte_fallback_and_space_prefix() -> None:
    tok = _spm([("\u2581", -1, NORMAL), ("a", -2, NORMAL), ("\u2581a", -1.5, NORMAL)])
    bos = tok.bos_id
    assert bos == 1 and tok.eos_id == 2 and tok.add_bos
    # the space prefix makes "a" -> "▁a"; é is not a token: its UTF-8 bytes C3 A9 -> ids 3 + byte
    assert tok.encode("a") == [bos] + _ids(tok, "\u2581a")
    assert tok.encode("é", add_special=False) == _ids(tok, "\u2581") + [3 + 0xC3, 3 + 0xA9]
    assert tok.decode([3 + 0xC3, 3 + 0xA9]) == "é"
    # the first token loses one leading space on decode (add_space_prefix)
    assert tok.decode(_ids(tok, "\u2581a", "\u2581a")) == "a a"
    off = _spm([("\u2581", -1, NORMAL), ("a", -2, NORMAL), ("\u2581a", -1.5, NORMAL)],
               **{"tokenizer.ggml.add_space_prefix": False})
    assert off.encode("a", add_special=False) == _ids(off, "a")
    assert off.decode(_ids(off, "\u2581a")) == " a"


def test_spm_special_partition_rules() -> None:
    tok = _spm([("\u2581", -1, NORMAL), ("x", -2, NORMAL), ("<", -2, NORMAL), (">", -2, NORMAL),
                ("u", -2, NORMAL), ("<u>", 0, USER), ("<ctl>", 0, CONTROL), ("c", -2, NORMAL),
                ("t", -2, NORMAL), ("l", -2, NORMAL)], **{"tokenizer.ggml.add_space_prefix": False})
    u, ctl = _ids(tok, "<u>", "<ctl>")
    # user-defined tokens are split out in both modes; control tokens only with parse_special
    assert tok.encode("x<u>x", add_special=False) == _ids(tok, "x") + [u] + _ids(tok, "x")
    assert tok.encode("x<ctl>", add_special=False) == _ids(tok, "x", "<", "c", "t", "l", ">")
    assert tok.encode("x<ctl>", add_special=False, parse_special=True) == _ids(tok, "x") + [ctl]
    # control tokens decode to nothing unless unparse_special
    assert tok.decode([ctl]) == "" and tok.decode([ctl], unparse_special=True) == "<ctl>"
    assert tok.decode([u]) == "<u>"


def test_spm_space_prefix_after_special() -> None:
    # a raw fragment right after a special token (or at the start) gets the space prefix
    tok = _spm([("\u2581", -1, NORMAL), ("a", -2, NORMAL), ("\u2581a", -1.5, NORMAL), ("<u>", 0, USER)])
    u = tok.vocab.token_to_id["<u>"]
    assert tok.encode("a<u>a", add_special=False) == _ids(tok, "\u2581a") + [u] + _ids(tok, "\u2581a")


def test_partition_is_longest_token_first_not_leftmost() -> None:
    # specials "AB" and "BCD": llama.cpp cuts every occurrence of the longest first, so "ABCD" is
    # "A" + BCD (a leftmost-longest matcher would give AB + "CD")
    tok = _spm([("A", -1, NORMAL), ("C", -1, NORMAL), ("D", -1, NORMAL), ("AB", 0, USER), ("BCD", 0, USER)],
               **{"tokenizer.ggml.add_space_prefix": False})
    assert tok.encode("ABCD", add_special=False) == _ids(tok, "A", "BCD")
    assert tok.encode("ABAB", add_special=False) == _ids(tok, "AB", "AB")


def test_eog_by_text_and_ids() -> None:
    # "<end_of_turn>" is an EOT text, "[EOS]" only an end-of-generation text
    tok = _spm([("<end_of_turn>", 0, USER), ("[EOS]", 0, NORMAL), ("z", 0, NORMAL)])
    eot, eos2 = _ids(tok, "<end_of_turn>", "[EOS]")
    # EOT found by its text; both are end-of-generation, with EOS, and become CONTROL
    assert tok.eot_id == eot
    assert tok.eog_ids == {2, eot, eos2}
    assert tok.is_eog(2) and tok.is_eog(eos2) and not tok.is_eog(tok.vocab.token_to_id["z"])
    assert tok.decode([eos2]) == "" and tok.decode([eos2], unparse_special=True) == "[EOS]"
    # given by the metadata, the EOT id is not searched by text
    tok2 = _spm([("<end_of_turn>", 0, USER), ("z", 0, NORMAL)], **{"tokenizer.ggml.eot_token_id": 260})
    assert tok2.eot_id == 260 and tok2.eog_ids == {2, 259, 260}


def test_metadata_errors() -> None:
    with pytest.raises(FileFormatError, match="tokenizer.ggml.model"):
        Tokenizer.from_gguf_metadata({})
    with pytest.raises(FileFormatError, match="'bert'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(FileFormatError, match="duplicate token 'a'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama",
                                      "tokenizer.ggml.tokens": ["a", "b", "a"]})
    with pytest.raises(FileFormatError, match="pre-tokenizer not implemented"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"],
                                      "tokenizer.ggml.merges": [], "tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(FileFormatError, match="scores has 1 values for 2 tokens"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"],
                                      "tokenizer.ggml.scores": np.zeros(1, np.float32)})


def test_misuse_errors() -> None:
    tok = _spm([("a", -1, NORMAL)])
    with pytest.raises(TypeError, match="text"):
        tok.encode(b"a")  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="token id 999"):
        tok.decode([999])
    with pytest.raises(IndexError, match="token id -1"):
        tok.token_to_piece(-1)


def test_clean_spaces_passes() -> None:
    # llama_detokenize's clean-up: " ?!.," lose the space, " ' " loses both, " 's 'm 're 've" lose it
    assert _clean_spaces(b"Hello , world . Ok ? Yes !") == b"Hello, world. Ok? Yes!"
    assert _clean_spaces(b"rock ' n roll") == b"rock'n roll"
    assert _clean_spaces(b"it 's I 'm we 're you 've") == b"it's I'm we're you've"
    assert _clean_spaces(b"don 't he 'd we 'll") == b"don 't he 'd we 'll"


def test_stream_decoder_matches_llama_cpp_pieces(bpe_tok: Tokenizer, bpe_ref: dict[str, Any]) -> None:
    # "pieces": llama-cpp-python's Llama.detokenize, the llama_token_to_piece(special=False) bytes
    # joined with one leading space dropped after a BOS
    bad = []
    for case in bpe_ref["cases"]:
        for mode in MODES:
            ids = case[mode]["ids"]
            dec = StreamDecoder(bpe_tok)
            text = "".join(dec.push(i) for i in ids) + dec.flush()
            if ids and ids[0] == bpe_tok.bos_id and text.startswith(" "):
                text = text[1:]
            if text != case[mode]["pieces"]:
                bad.append(f"{ids[:12]}: {text!r} != {case[mode]['pieces']!r}")
    assert not bad, "\n".join(bad[:10])


def test_stream_decoder_holds_partial_characters() -> None:
    tok = _spm([("a", -1, NORMAL)], **{"tokenizer.ggml.add_space_prefix": False})
    dec = StreamDecoder(tok)
    # "€" = E2 82 AC as three byte tokens (ids 3 + byte): nothing until the last byte
    assert [dec.push(3 + b) for b in (0xE2, 0x82, 0xAC)] == ["", "", "€"]
    assert dec.push(3 + 0xE2) == "" and dec.flush() == "\ufffd"
    assert dec.push(tok.vocab.token_to_id["a"]) == "a"


def test_merge_lines_split_after_the_first_character() -> None:
    # llama.cpp splits at the first space found from position 1: a leading space belongs to the
    # left part; a line without a space is an empty pair
    assert _parse_merges(["ab c", "Ġ t", "a bc d"]) == [("ab", "c"), ("Ġ", "t"), ("a", "bc d")]
    assert _parse_merges([" a b", "x", "ab c"]) == [(" a", "b"), ("", ""), ("ab", "c")]
