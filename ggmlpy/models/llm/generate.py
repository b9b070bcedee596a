"""Text generation around :class:`~ggmlpy.models.llm.model.LLM`: prompt text in, text pieces out.

:class:`Generation` is llama.cpp's ``llama-simple`` / ``llama-cli`` loop for one sequence:
tokenize the prompt (BOS as the file says, special-token text parsed, as ``common_tokenize``
with ``parse_special``), decode it in ``n_batch``-token calls of :meth:`LLM.eval` (each split
into the model's ``n_ubatch`` micro-batches), then sample (a
:class:`~ggmlpy.models.llm.sampling.Sampler`, or greedy) and decode one token per step,
streaming each token's text through a :class:`~ggmlpy.models.llm.stream.StreamDecoder`. It
stops at an end-of-generation token (``llama_vocab_is_eog``; not printed, as llama.cpp does),
after ``n_predict`` tokens, or when the context is full, and keeps llama.cpp-style
:class:`Timings` (``llama_perf_context_print``'s prompt eval and eval lines).
:func:`generate_text` is the one-call form.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ggmlpy.core.check import ArgumentValueError, check_bool, check_int, check_type
from ggmlpy.models.llm.sampling import Sampler, greedy
from ggmlpy.models.llm.stream import StreamDecoder

__all__ = ["Timings", "GenerationResult", "Generation", "generate_text", "STOP_REASONS"]

#: ``stop_reason`` values: an end-of-generation token, ``n_predict`` reached, the context full
STOP_REASONS = ("eog", "length", "context")


def _rate(n: int, ms: float) -> tuple[float | None, float | None]:
    """(ms per token, tokens per second); None where there is nothing to divide."""
    if n <= 0:
        return None, None
    return ms / n, (1e3 * n / ms if ms > 0 else None)


@dataclass
class Timings:
    """Wall-clock figures of one generation, in milliseconds (llama.cpp's
    ``llama_perf_context_data``).

    Attributes:
        load_ms: model load, when the caller measured it (else 0).
        n_prompt: prompt tokens decoded; prompt_ms: their decode (all ``n_batch`` calls).
        n_eval: one-token decode steps after the prompt; eval_ms: their time.
        n_sample: tokens sampled; sample_ms: time in the sampler.
        first_token_ms: start to the first sampled token (prompt decode + first sample).
        total_ms: start to end of the generation (load excluded).
    """

    load_ms: float = 0.0
    n_prompt: int = 0
    prompt_ms: float = 0.0
    n_eval: int = 0
    eval_ms: float = 0.0
    n_sample: int = 0
    sample_ms: float = 0.0
    first_token_ms: float | None = None
    total_ms: float = 0.0

    @property
    def prompt_tok_s(self) -> float | None:
        """Prompt tokens per second (None without prompt tokens)."""
        return _rate(self.n_prompt, self.prompt_ms)[1]

    @property
    def eval_tok_s(self) -> float | None:
        """Generated-token decode steps per second (None without any)."""
        return _rate(self.n_eval, self.eval_ms)[1]

    def as_dict(self) -> dict[str, Any]:
        """The fields plus ``prompt_ms_per_token``, ``prompt_tok_s``, ``eval_ms_per_token``,
        ``eval_tok_s`` (JSON-ready; None where undefined)."""
        d = asdict(self)
        d["prompt_ms_per_token"], d["prompt_tok_s"] = _rate(self.n_prompt, self.prompt_ms)
        d["eval_ms_per_token"], d["eval_tok_s"] = _rate(self.n_eval, self.eval_ms)
        return d

    def report(self) -> str:
        """llama.cpp's ``llama_perf_context_print`` lines (load, prompt eval, eval, total)."""
        def line(name: str, ms: float, n: int, unit: str) -> str:
            per, rate = _rate(n, ms)
            tail = (f" ({per:8.2f} ms per token, {rate:8.2f} tokens per second)"
                    if per is not None and rate is not None else "")
            return f"{name:>17} = {ms:10.2f} ms / {n:5d} {unit}{tail}"

        return "\n".join([
            f"{'load time':>17} = {self.load_ms:10.2f} ms",
            line("prompt eval time", self.prompt_ms, self.n_prompt, "tokens"),
            line("eval time", self.eval_ms, self.n_eval, "runs  "),
            line("sampling time", self.sample_ms, self.n_sample, "runs  "),
            f"{'total time':>17} = {self.total_ms:10.2f} ms / {self.n_prompt + self.n_eval:5d} tokens",
        ])


@dataclass
class GenerationResult:
    """What one generation produced.

    Attributes:
        prompt_tokens: the prompt's ids. tokens: the generated ids (an end-of-generation token
            included when it stopped the loop). text: the generated text (the EOG token's text
            left out). stop_reason: one of :data:`STOP_REASONS`. timings: :class:`Timings`.
    """

    prompt_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = "length"
    timings: Timings = field(default_factory=Timings)


class Generation:
    """One prompt's generation, iterated for its text pieces (not thread-safe; sync: each
    ``next`` runs the model).

    Args:
        model: a loaded :class:`~ggmlpy.models.llm.model.LLM` with a tokenizer. Its sequence is
            cleared first unless ``keep_context``.
        prompt: the prompt text, or its token ids (then used as they are).
        n_predict: the most tokens to generate; -1: until an end-of-generation token or the
            context is full (llama.cpp's ``-n -1``).
        sampler: a :class:`~ggmlpy.models.llm.sampling.Sampler`, or None for greedy (the arg
            max, lowest id on ties).
        n_batch: prompt tokens per :meth:`LLM.eval` call (llama.cpp's ``-b``; >= 1).
        chat: format ``prompt`` as one user message with the file's chat template
            (:class:`~ggmlpy.models.llm.chat.ChatTemplate`).
        ignore_eos: do not stop at end-of-generation tokens.
        special: render control tokens' text in the output.
        keep_context: append to the model's current sequence instead of clearing it.

    After the iteration, :attr:`result` holds the :class:`GenerationResult`.

    Raises:
        TypeError: an argument of the wrong type, a str prompt and a model without tokenizer.
        ValueError: an empty prompt, ``n_predict < -1``, ``n_batch < 1``, a prompt longer than
            the context (ArgumentValueError naming ``prompt``).
        FileFormatError: ``chat`` and the file has no chat template.
        ComputeError: a backend failed while iterating.
    """

    def __init__(self, model: Any, prompt: str | Sequence[int], n_predict: int = 32,
                 sampler: Sampler | None = None, n_batch: int = 2048, chat: bool = False,
                 ignore_eos: bool = False, special: bool = False,
                 keep_context: bool = False) -> None:
        where = "Generation"
        check_int("n_predict", n_predict, -1, None, where)
        check_int("n_batch", n_batch, 1, None, where)
        for name, v in (("chat", chat), ("ignore_eos", ignore_eos), ("special", special),
                        ("keep_context", keep_context)):
            check_bool(name, v, where)
        if sampler is not None:
            check_type("sampler", sampler, Sampler, where)
        tok = model.tokenizer
        if isinstance(prompt, str):
            if tok is None:
                raise TypeError(f"{where}: a text prompt needs the file's tokenizer (this file "
                                f"has none); pass token ids")
            if chat:
                from ggmlpy.models.llm.chat import ChatTemplate

                template = ChatTemplate.from_tokenizer(tok, source=str(model.path))
                ids = template.encode(tok, [{"role": "user", "content": prompt}])
            else:
                ids = tok.encode(prompt, add_special=True, parse_special=True)
        elif isinstance(prompt, (bytes, Mapping)) or not isinstance(prompt, Sequence):
            raise TypeError(f"{where}: prompt must be a str or a sequence of token ids, got "
                            f"{type(prompt).__name__}")
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ArgumentValueError("prompt", "encodes to no tokens (give some text)", where)
        self.model = model
        self.n_ctx = int(model.kv.n_ctx)
        base = 0 if not keep_context else int(model.n_past)
        if base + len(ids) > self.n_ctx:
            raise ArgumentValueError("prompt", f"has {len(ids)} tokens, more than the context "
                                     f"of {self.n_ctx - base} left (raise -c/--ctx-size)", where)
        self.n_predict = n_predict
        self.sampler = sampler
        self.n_batch = n_batch
        self.ignore_eos = ignore_eos
        self.keep_context = keep_context
        self.decoder = StreamDecoder(tok, special=special) if tok is not None else None
        self.result = GenerationResult(prompt_tokens=list(ids))
        self._iter: Iterator[str] | None = None

    def __iter__(self) -> Iterator[str]:
        if self._iter is None:
            self._iter = self._run()
        return self._iter

    def _run(self) -> Iterator[str]:
        m, r, t = self.model, self.result, self.result.timings
        tok = m.tokenizer
        if not self.keep_context:
            m.clear()
        t0 = time.perf_counter()
        ids = r.prompt_tokens
        logits = None
        for i in range(0, len(ids), self.n_batch):
            logits = m.eval(ids[i:i + self.n_batch])
        t.prompt_ms = (time.perf_counter() - t0) * 1e3
        t.n_prompt = len(ids)
        history = list(ids)
        n = 0
        pieces: list[str] = []
        try:
            while self.n_predict != 0:
                ts = time.perf_counter()
                token = (greedy(logits) if self.sampler is None
                         else self.sampler.sample(logits, history))
                te = time.perf_counter()
                t.sample_ms += (te - ts) * 1e3
                t.n_sample += 1
                if t.first_token_ms is None:
                    t.first_token_ms = (te - t0) * 1e3
                token = int(token)
                history.append(token)
                r.tokens.append(token)
                n += 1
                eog = tok is not None and not self.ignore_eos and bool(tok.is_eog(token))
                if eog:
                    r.stop_reason = "eog"
                    break
                if self.decoder is not None:
                    piece = self.decoder.push(token)
                    if piece:
                        pieces.append(piece)
                        yield piece
                if self.n_predict >= 0 and n >= self.n_predict:
                    r.stop_reason = "length"
                    break
                if m.n_past >= self.n_ctx:
                    r.stop_reason = "context"
                    break
                ts = time.perf_counter()
                logits = m.eval([token])
                t.eval_ms += (time.perf_counter() - ts) * 1e3
                t.n_eval += 1
            if self.decoder is not None:
                tail = self.decoder.flush()
                if tail:
                    pieces.append(tail)
                    yield tail
        finally:
            r.text = "".join(pieces)
            t.total_ms = (time.perf_counter() - t0) * 1e3

    def run(self) -> GenerationResult:
        """Iterate to the end and return :attr:`result`."""
        for _ in self:
            pass
        return self.result


def generate_text(model: Any, prompt: str | Sequence[int], n_predict: int = 32,
                  sampler: Sampler | None = None, **kwargs: Any) -> Iterator[str]:
    """Stream the text generated after ``prompt`` (a :class:`Generation` with these arguments;
    ``kwargs``: ``n_batch``, ``chat``, ``ignore_eos``, ``special``, ``keep_context``). The
    arguments are checked at once; the model runs as the iterator is advanced.

    Yields:
        str pieces, each ending on a whole UTF-8 character; their concatenation is the
        generated text (greedy when ``sampler`` is None).

    Raises:
        As :class:`Generation`.
    """
    return iter(Generation(model, prompt, n_predict, sampler, **kwargs))
