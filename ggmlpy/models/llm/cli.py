"""``python -m ggmlpy generate``: text generation from a llama.cpp GGUF, with llama.cpp's flags.

The flags are ``llama-cli`` / ``llama-simple``'s (``-m -p -f -n -c -b -ub -t -ngl --temp --seed
--top-k --top-p --min-p --repeat-penalty --repeat-last-n -ctk -ctv --ignore-eos
--no-display-prompt``) plus ``--device`` (``-dev``), ``--parallel``, ``--chat`` and ``--json``.
``-m`` takes a file or a model name (``gemma3-270m``, see
:func:`ggmlpy.models.llm.download.resolve_model`). The prompt is echoed, then each token's text
is written to stdout as it is generated (flushed per piece); llama.cpp's timing lines follow on
stderr. ``--json`` prints one JSON object instead (prompt, text, token ids, stop reason,
timings, settings).

Exit status: 0 success; 1 a compute failure; 2 bad usage or an error the user can fix (unknown
flag or bad value, missing or damaged model file, unknown device, a prompt longer than the
context, ``--chat`` on a file without chat template): one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ggmlpy.core.check import OneLineArgumentParser, check_str_sequence

__all__ = ["generate_main", "build_parser"]

PROG = "ggmlpy generate"

#: LLM.load / Generation parameters -> the flag that feeds them (for one-line errors)
_FLAG_OF_PARAM = {"n_gpu_layers": "-ngl/--n-gpu-layers", "n_threads": "-t/--threads",
                  "n_ctx": "-c/--ctx-size", "n_ubatch": "-ub/--ubatch-size",
                  "n_batch": "-b/--batch-size", "n_predict": "-n/--n-predict",
                  "device": "--device", "prompt": "-p/--prompt"}


class _UsageError(Exception):
    """An error the user can fix: one line on stderr, exit status 2."""


def _err(msg: str) -> None:
    print(f"{PROG}: {' '.join(str(msg).split())}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The ``generate`` argument parser (``allow_abbrev=False``: a flag is spelled out)."""
    p = OneLineArgumentParser(prog="python -m ggmlpy generate", allow_abbrev=False,
                              description="Generate text from a llama.cpp GGUF model (llama.cpp's "
                                          "llama-cli flags).")
    p.add_argument("-m", "--model", required=True, metavar="FILE|NAME",
                   help="a .gguf file, or gemma3-270m (after `python -m ggmlpy download "
                        "gemma3-270m`)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", metavar="FILE", help="read the prompt from a UTF-8 file")
    p.add_argument("-n", "--n-predict", type=int, default=32, metavar="N",
                   help="tokens to generate (default 32; -1: until end of generation or a full "
                        "context)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N",
                   help="context size in tokens (default 4096)")
    p.add_argument("-b", "--batch-size", type=int, default=2048, metavar="N",
                   help="prompt tokens per decode call (default 2048)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, metavar="N",
                   help="tokens per micro-batch (default 512; at most -b)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="CPU threads (default: the CPU backend's)")
    p.add_argument("-dev", "--device", default="CPU", metavar="NAME[,NAME]",
                   help="offload device(s): CUDA0, SIM0, RAY0, ... (default CPU)")
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=None, metavar="N",
                   help="layers on --device (-1 all; default: all when --device is not the CPU)")
    p.add_argument("--parallel", action="store_true",
                   help="pipeline prompt micro-batches across the devices")
    p.add_argument("-ctk", "--cache-type-k", choices=("f32", "f16"), default="f16",
                   help="K cache type (default f16, as llama.cpp)")
    p.add_argument("-ctv", "--cache-type-v", choices=("f32", "f16"), default="f16",
                   help="V cache type (default f16, as llama.cpp)")
    p.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto",
                   help="one fused attention op per layer (on; auto: on, as llama.cpp on the "
                        "CPU), or llama.cpp's -fa off graph with its f16 roundings (off)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature (default 0.8; 0: greedy)")
    p.add_argument("-s", "--seed", type=int, default=-1,
                   help="sampling seed (default -1: random)")
    p.add_argument("--top-k", type=int, default=40, help="top-k (default 40; 0: off)")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p (default 0.95; 1: off)")
    p.add_argument("--min-p", type=float, default=0.05, help="min-p (default 0.05; 0: off)")
    p.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="repeat penalty (default 1.0: off)")
    p.add_argument("--repeat-last-n", type=int, default=64,
                   help="tokens the penalties look at (default 64; -1: all)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at end of generation")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message with the file's chat template")
    p.add_argument("--special", action="store_true", help="print control tokens' text")
    p.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (text, token ids, timings) instead of the stream")
    return p


def _check_args(a: argparse.Namespace) -> None:
    """Range checks llama.cpp makes before loading; one-line _UsageError naming the flag."""
    if a.prompt is None and a.file is None:
        raise _UsageError("a prompt is required: -p/--prompt TEXT or -f/--file FILE")
    checks = [
        (a.n_predict >= -1, f"-n/--n-predict must be >= -1, got {a.n_predict}"),
        (a.ctx_size >= 1, f"-c/--ctx-size must be >= 1, got {a.ctx_size}"),
        (a.batch_size >= 1, f"-b/--batch-size must be >= 1, got {a.batch_size}"),
        (a.ubatch_size >= 1, f"-ub/--ubatch-size must be >= 1, got {a.ubatch_size}"),
        (a.threads is None or 1 <= a.threads <= 512,
         f"-t/--threads must be in 1..512, got {a.threads}"),
        (a.n_gpu_layers is None or a.n_gpu_layers >= -1,
         f"-ngl/--n-gpu-layers must be >= -1, got {a.n_gpu_layers}"),
        (a.seed == -1 or 0 <= a.seed <= 0xFFFFFFFF,
         f"-s/--seed must be -1 or in 0..4294967295, got {a.seed}"),
        (a.top_p >= 0, f"--top-p must be >= 0, got {a.top_p}"),
        (a.min_p >= 0, f"--min-p must be >= 0, got {a.min_p}"),
        (a.repeat_penalty > 0, f"--repeat-penalty must be > 0, got {a.repeat_penalty}"),
        (a.repeat_last_n >= -1, f"--repeat-last-n must be >= -1, got {a.repeat_last_n}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise _UsageError(msg)
    for name in ("temp", "top_p", "min_p", "repeat_penalty"):
        v = getattr(a, name)
        if v != v or v in (float("inf"), float("-inf")):
            raise _UsageError(f"--{name.replace('_', '-')} must be a finite number, got {v}")


def _read_prompt(a: argparse.Namespace) -> str:
    if a.prompt is not None:
        return a.prompt
    try:
        return Path(a.file).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise _UsageError(f"-f/--file {a.file}: {e}") from e


def _pick_device(spec: str) -> str:
    """``--device`` checked and normalised by :func:`ggmlpy.models.device_flag.pick_devices`.

    Raises:
        _UsageError: one line naming ``--device`` and the offending name.
    """
    from ggmlpy.models.device_flag import pick_devices

    return pick_devices(spec, PROG, _UsageError)


def _sampler(a: argparse.Namespace) -> Any:
    """None (greedy) for ``--temp <= 0`` without penalties, else llama.cpp's sampler chain."""
    from ggmlpy.models.llm.sampling import Sampler, SamplerParams

    if a.temp <= 0 and a.repeat_penalty == 1.0:
        return None
    return Sampler(SamplerParams(temp=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                                 repeat_penalty=a.repeat_penalty,
                                 repeat_last_n=a.repeat_last_n,
                                 seed=None if a.seed == -1 else a.seed))


def _flag_error(e: ValueError) -> _UsageError:
    """A ValueError from LLM.load / Generation as one line naming the flag it came from."""
    from ggmlpy.core.check import ArgumentValueError

    if isinstance(e, ArgumentValueError) and e.arg in _FLAG_OF_PARAM:
        return _UsageError(f"{_FLAG_OF_PARAM[e.arg]} {e.detail}")
    return _UsageError(str(e))


def generate_main(argv: Sequence[str]) -> int:
    """Entry point of ``python -m ggmlpy generate``; returns the exit status (see the module).

    Raises:
        TypeError: ``argv`` is not a sequence of str.
    """
    check_str_sequence("argv", argv, "generate_main")
    try:
        args = build_parser().parse_args(list(argv))
    except SystemExit as e:  # --help (0) or a usage error (2, already printed)
        return int(e.code or 0)
    try:
        return _generate(args)
    except _UsageError as e:
        _err(str(e))
        return 2


def _generate(a: argparse.Namespace) -> int:
    from ggmlpy.core.errors import ComputeError, GgmlpyError
    from ggmlpy.core.types import Type
    from ggmlpy.models.llm.download import ModelFileNotFoundError, resolve_model
    from ggmlpy.models.llm.generate import Generation
    from ggmlpy.models.llm.model import LLM

    _check_args(a)
    prompt = _read_prompt(a)
    try:
        path = resolve_model(a.model)
    except ModelFileNotFoundError as e:
        raise _UsageError(f"-m/--model: {e}") from e
    device = _pick_device(a.device)
    on_cpu = device.upper() == "CPU"
    ngl = 0 if on_cpu else (-1 if a.n_gpu_layers is None else a.n_gpu_layers)
    n_ubatch = min(a.ubatch_size, a.batch_size)
    cache = {"f32": Type.F32, "f16": Type.F16}
    t0 = time.perf_counter()
    try:
        model = LLM.load(path, device=device, n_gpu_layers=ngl, n_threads=a.threads,
                         n_ctx=a.ctx_size, n_ubatch=n_ubatch, parallel=a.parallel,
                         type_k=cache[a.cache_type_k], type_v=cache[a.cache_type_v],
                         flash_attn=a.flash_attn != "off")
    except (ComputeError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise _UsageError(f"-m/--model: {e}") from e
        _err(f"could not load {path}: {e}")
        return 1 if isinstance(e, ComputeError) else 2
    except ValueError as e:
        raise _flag_error(e) from e
    load_ms = (time.perf_counter() - t0) * 1e3
    try:
        try:
            gen = Generation(model, prompt, a.n_predict, _sampler(a), n_batch=a.batch_size,
                             chat=a.chat, ignore_eos=a.ignore_eos, special=a.special)
        except (ValueError, TypeError, GgmlpyError) as e:
            raise _flag_error(e if isinstance(e, ValueError) else ValueError(str(e))) from e
        gen.result.timings.load_ms = load_ms
        out = sys.stdout
        if not a.json and not a.no_display_prompt:
            out.write(prompt)
            out.flush()
        try:
            for piece in gen:
                if not a.json:
                    out.write(piece)
                    out.flush()
        except ComputeError as e:
            _err(f"generation failed: {e}")
            return 1
        r = gen.result
        if a.json:
            print(json.dumps({
                "model": str(path), "prompt": prompt, "prompt_tokens": r.prompt_tokens,
                "text": r.text, "tokens": r.tokens, "n_generated": len(r.tokens),
                "stop_reason": r.stop_reason, "timings": r.timings.as_dict(),
                "settings": {"n_predict": a.n_predict, "ctx_size": a.ctx_size,
                             "batch_size": a.batch_size, "ubatch_size": n_ubatch,
                             "threads": a.threads, "device": device, "n_gpu_layers": ngl,
                             "devices": model.devices, "parallel": a.parallel,
                             "cache_type_k": a.cache_type_k, "cache_type_v": a.cache_type_v,
                             "flash_attn": model.flash_attn,
                             "temp": a.temp, "seed": a.seed, "top_k": a.top_k,
                             "top_p": a.top_p, "min_p": a.min_p,
                             "repeat_penalty": a.repeat_penalty, "chat": a.chat},
            }, ensure_ascii=False))
        else:
            out.write("\n")
            out.flush()
            print(f"\n{PROG}: stop: {r.stop_reason}, {len(r.tokens)} tokens\n"
                  f"{r.timings.report()}", file=sys.stderr)
    finally:
        model.close()
    return 0
