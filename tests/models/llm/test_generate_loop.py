"""The generation loop (:class:`ggmlpy.models.llm.generate.Generation`) over a scripted model:
stop rules, text pieces, timings counts, argument checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import read_tokenizer_metadata

from ggmlpy.core.check import ArgumentValueError
from ggmlpy.models.llm.generate import Generation, generate_text
from ggmlpy.models.llm.tokenizer import Tokenizer

BPE = Path(__file__).resolve().parents[2] / "data" / "tiny_llama_bpe.gguf"


class _KV:
    def __init__(self, n_ctx: int) -> None:
        self.n_ctx = n_ctx


class ScriptedModel:
    """Emits ``script`` (one id per step, arg max of one-hot logits); records eval calls."""

    def __init__(self, tok: Tokenizer, script: list[int], n_ctx: int = 64) -> None:
        self.tokenizer = tok
        self.script = script
        self.kv = _KV(n_ctx)
        self.path = BPE
        self.n_past = 0
        self.calls: list[list[int]] = []

    def clear(self) -> None:
        self.n_past = 0

    def eval(self, tokens):
        self.calls.append([int(t) for t in tokens])
        self.n_past += len(tokens)
        step = len(self.calls) - 1 - self._prompt_calls
        logits = np.zeros(self.tokenizer.n_vocab, np.float32)
        logits[self.script[min(step + 1, len(self.script) - 1)] if step >= 0 else self.script[0]] = 1
        return logits

    _prompt_calls = 0


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(read_tokenizer_metadata(BPE))


def _model(tok, script, n_ctx=64, prompt_calls=1):
    m = ScriptedModel(tok, script, n_ctx)
    m._prompt_calls = prompt_calls
    return m


def test_stops_at_eog_without_its_text(tok):
    eos = tok.eos_id
    script = [300, 301, eos, 302]
    m = _model(tok, script)
    g = Generation(m, "Hello world", n_predict=10)
    pieces = list(g)
    r = g.result
    assert r.tokens == [300, 301, eos] and r.stop_reason == "eog"
    want = (tok.token_to_bytes(300) + tok.token_to_bytes(301)).decode()
    assert "".join(pieces) == r.text == want
    assert r.timings.n_eval == 2 and r.timings.n_sample == 3
    assert m.calls[0] == tok.encode("Hello world", parse_special=True)


def test_ignore_eos_and_length(tok):
    eos = tok.eos_id
    m = _model(tok, [300, eos, 301, 302])
    r = Generation(m, "Hello", n_predict=3, ignore_eos=True).run()
    assert r.tokens == [300, eos, 301] and r.stop_reason == "length"
    assert r.timings.n_eval == 2  # the last token is not decoded


def test_context_full_stops(tok):
    m = _model(tok, [300] * 50, n_ctx=6)
    prompt = tok.encode("Hello world", parse_special=True)  # 3 tokens
    r = Generation(m, prompt, n_predict=-1).run()
    assert r.stop_reason == "context" and m.n_past == 6
    assert len(r.tokens) == 4  # 3 decoded after the prompt + the last one sampled


def test_prompt_in_n_batch_calls(tok):
    ids = list(range(40, 50))
    m = _model(tok, [300, 301], prompt_calls=3)
    Generation(m, ids, n_predict=1, n_batch=4).run()
    assert m.calls == [ids[0:4], ids[4:8], ids[8:10]]


def test_n_predict_zero_and_special_text(tok):
    m = _model(tok, [300])
    r = Generation(m, "Hello", n_predict=0).run()
    assert r.tokens == [] and r.text == "" and m.calls == [tok.encode("Hello", parse_special=True)]
    # <|im_start|> (id 1, control) in the prompt text is parsed as the special token
    assert Generation(_model(tok, [300]), "<|im_start|>Hi", 1).result.prompt_tokens[:2] == [0, 1]


def test_argument_checks(tok):
    m = _model(tok, [300])
    with pytest.raises(ArgumentValueError, match="n_predict"):
        Generation(m, "x", n_predict=-2)
    with pytest.raises(ArgumentValueError, match="n_batch"):
        Generation(m, "x", n_batch=0)
    with pytest.raises(ArgumentValueError, match="prompt has 5 tokens, more than the context of 4"):
        Generation(_model(tok, [300], n_ctx=4), [5, 6, 7, 8, 9])
    with pytest.raises(TypeError, match="prompt must be a str or a sequence"):
        Generation(m, b"bytes")
    with pytest.raises(TypeError, match="sampler"):
        Generation(m, "x", sampler=lambda lg: 0)
    with pytest.raises(ArgumentValueError, match="no tokens"):
        Generation(m, [])
    with pytest.raises(ArgumentValueError, match="n_predict"):
        generate_text(m, "x", n_predict=-3)  # checked at the call, not at the first next()
