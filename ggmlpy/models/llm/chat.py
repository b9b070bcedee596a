"""Chat prompts from a GGUF file's ``tokenizer.chat_template`` (a Jinja2 template).

The template is rendered as Hugging Face transformers' ``apply_chat_template`` renders it: a
sandboxed Jinja2 environment (``ImmutableSandboxedEnvironment``, ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension), the globals ``raise_exception`` and
``strftime_now``, a ``tojson`` filter that keeps non-ASCII text, and the variables ``messages``,
``add_generation_prompt``, ``bos_token`` and ``eos_token`` (plus any extra keyword the caller
passes, e.g. ``tools``). llama.cpp's ``common_chat_templates_apply`` renders the same templates
with its own Jinja engine. Needs the ``jinja2`` package (the ``[llm]`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ggmlpy.core.errors import FileFormatError
from ggmlpy.models.llm.tokenizer import Tokenizer

__all__ = ["ChatTemplate"]


def _jinja2():
    try:
        import jinja2
        import jinja2.ext
        import jinja2.sandbox
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("chat templates need the jinja2 package: pip install 'ggmlpy[llm]'") from e
    return jinja2


class ChatTemplate:
    """A compiled chat template with the BOS / EOS texts it may print.

    Args:
        template: the Jinja2 source (``tokenizer.chat_template``).
        bos_token: the text bound to ``bos_token`` (the BOS token's text, e.g. ``"<bos>"``).
        eos_token: the text bound to ``eos_token``.

    Raises:
        TypeError: ``template`` is not a str.
        ValueError: the template does not compile (Jinja2 syntax error, message included).
        ImportError: jinja2 is not installed.
    """

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        if not isinstance(template, str):
            raise TypeError(f"template: expected str, got {type(template).__name__}")
        jinja2 = _jinja2()

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            return datetime.now().strftime(fmt)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            self._template = env.from_string(template)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ValueError(f"chat template does not compile: {e.message} (line {e.lineno})") from e
        self._jinja2 = jinja2
        self.source = template
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, template: str | None = None,
                       source: str = "GGUF metadata") -> ChatTemplate:
        """The chat template of a tokenizer's GGUF file, with its BOS / EOS texts.

        Args:
            tokenizer: the file's :class:`~ggmlpy.models.llm.tokenizer.Tokenizer`.
            template: a template to use instead of the file's ``tokenizer.chat_template``.
            source: the file's name, for the error message.

        Raises:
            FileFormatError: no ``template`` is given and the file has no ``tokenizer.chat_template``.
        """
        if template is None:
            template = tokenizer.vocab.chat_template
            if template is None:
                raise FileFormatError(source, "has no chat template (tokenizer.chat_template is absent); "
                                              "pass template= to format chat prompts")
        tokens = tokenizer.vocab.tokens
        bos = tokenizer.bos_id
        eos = tokenizer.eos_id
        return cls(template, "" if bos is None else tokens[bos], "" if eos is None else tokens[eos])

    def apply(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
              **kwargs: Any) -> str:
        """Renders the conversation to the prompt text (transformers' ``apply_chat_template`` with
        ``tokenize=False``).

        Args:
            messages: dicts with at least ``role`` and ``content``, oldest first.
            add_generation_prompt: append the opening of the assistant's turn.
            **kwargs: more template variables (``tools``, ``documents``, ...).

        Raises:
            TypeError: ``messages`` is not a sequence of mappings.
            ValueError: a message lacks ``role`` / ``content``, or the template rejects the
                conversation (its ``raise_exception`` message, or another rendering error).
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages: expected a sequence of dicts, got {type(messages).__name__}")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping):
                raise TypeError(f"messages[{i}]: expected a dict, got {type(m).__name__}")
            if "role" not in m or "content" not in m:
                raise ValueError(f"messages[{i}]: needs 'role' and 'content' keys, has {sorted(m)}")
        try:
            return self._template.render(messages=[dict(m) for m in messages],
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)
        except self._jinja2.exceptions.TemplateError as e:
            raise ValueError(f"chat template rejected the conversation: {e}") from e

    def encode(self, tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]],
               add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        """The prompt's token ids: :meth:`apply`, then ``tokenizer.encode`` with special-token
        parsing; BOS is added only when the vocabulary adds one and the rendered text does not
        already start with the BOS text.

        Raises:
            TypeError, ValueError: as :meth:`apply`.
        """
        text = self.apply(messages, add_generation_prompt, **kwargs)
        starts_with_bos = bool(self.bos_token) and text.startswith(self.bos_token)
        return tokenizer.encode(text, add_special=not starts_with_bos, parse_special=True)
