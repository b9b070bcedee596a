"""ggmlpy.models.llm.chat: chat templates rendered with a sandboxed Jinja2, as transformers does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ggmlpy.core.errors import FileFormatError
from ggmlpy.models.llm.tokenizer import Tokenizer

jinja2 = pytest.importorskip("jinja2", reason="chat templates need jinja2 (the [llm] extra)")

from ggmlpy.models.llm.chat import ChatTemplate  # noqa: E402

# a turn-based template in the style of Gemma's: system text folded into the first user turn,
# roles must alternate, "assistant" printed as "model"
TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}
{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}
{%- for m in turns -%}
{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{ raise_exception('roles must alternate user/assistant') }}
{%- endif -%}
{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}
{{- (prefix if loop.first else '') + m['content'] | trim }}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt -%}<start_of_turn>model
{% endif -%}"""


def test_render_small_template() -> None:
    t = ChatTemplate(TEMPLATE, bos_token="<bos>", eos_token="<eos>")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi! "},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]
    want = ("<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\n2+2?<end_of_turn>\n"
            "<start_of_turn>model\n")
    assert t.apply(msgs) == want
    assert t.apply(msgs, add_generation_prompt=False) == want[:-len("<start_of_turn>model\n")]


def test_raise_exception_and_bad_messages() -> None:
    t = ChatTemplate(TEMPLATE, bos_token="<bos>")
    with pytest.raises(ValueError, match="roles must alternate"):
        t.apply([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(ValueError, match="'role' and 'content'"):
        t.apply([{"content": "a"}])
    with pytest.raises(TypeError, match="sequence of dicts"):
        t.apply("hello")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for x in %}")


def test_sandbox_blocks_attribute_escape() -> None:
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises((ValueError, jinja2.exceptions.SecurityError)):
        t.apply([{"role": "user", "content": "x"}])
    # tojson keeps non-ASCII text, as transformers' filter does
    assert ChatTemplate("{{ messages[0] | tojson }}").apply([{"role": "user", "content": "é"}], False) == \
        '{"role": "user", "content": "é"}'


def _tiny_spm() -> Tokenizer:
    tokens = ["<unk>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "\u2581", "\n"] + \
        [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3, 3, 3, 1, 4] + [6] * 256
    return Tokenizer.from_gguf_metadata({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array(types, np.int32), "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.chat_template": TEMPLATE})


def test_from_tokenizer_and_encode() -> None:
    tok = _tiny_spm()
    t = ChatTemplate.from_tokenizer(tok)
    assert (t.bos_token, t.eos_token) == ("<bos>", "<eos>")
    ids = t.encode(tok, [{"role": "user", "content": "A"}])
    # one BOS (the template prints it; no second one is added), specials parsed, "A" as byte 0x41
    assert ids == [1, 3, 7 + ord("u"), 7 + ord("s"), 7 + ord("e"), 7 + ord("r"), 6, 7 + 0x41, 4, 6, 3,
                   7 + ord("m"), 7 + ord("o"), 7 + ord("d"), 7 + ord("e"), 7 + ord("l"), 6]


def test_missing_template_is_a_clear_error() -> None:
    tok = Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama",
                                        "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"]})
    with pytest.raises(FileFormatError, match="has no chat template"):
        ChatTemplate.from_tokenizer(tok, source="x.gguf")
    assert ChatTemplate.from_tokenizer(tok, template="{{ bos_token }}").apply([]) == "<s>"


def test_gemma_file_has_no_template(gemma_meta: dict[str, Any]) -> None:
    # the Gemma 3 270M GGUF carries no tokenizer.chat_template: the error says so and a template
    # passed in renders with the file's BOS text
    tok = Tokenizer.from_gguf_metadata(gemma_meta)
    assert "tokenizer.chat_template" not in gemma_meta
    with pytest.raises(FileFormatError, match="has no chat template"):
        ChatTemplate.from_tokenizer(tok, source="gemma3-270m")
    t = ChatTemplate.from_tokenizer(tok, template=TEMPLATE)
    ids = t.encode(tok, [{"role": "user", "content": "Hi"}])
    assert ids[:2] == [tok.bos_id, tok.vocab.token_to_id["<start_of_turn>"]]
    assert ids.count(tok.bos_id) == 1 and ids[-1] == tok.vocab.token_to_id["\n"]
    assert tok.decode(ids, unparse_special=True) == \
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
