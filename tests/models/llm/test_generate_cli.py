"""``python -m ggmlpy generate`` on tiny GGUF files: greedy tokens against llama.cpp's and a
float64 reference loop, streaming, ``--json``, the sampler flags, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import read_tokenizer_metadata

from ggmlpy.cli import main as cli_main
from ggmlpy.core import env
from ggmlpy.models.llm.model import LLM
from ggmlpy.models.llm.reference import forward, load_weights_f64
from ggmlpy.models.llm.sampling import Sampler, SamplerParams
from ggmlpy.models.llm.tiny import write_tiny_gguf
from ggmlpy.models.llm.tokenizer import Tokenizer

DATA = Path(__file__).resolve().parents[2] / "data"
BPE = DATA / "tiny_llama_bpe.gguf"
PROMPTS = {"hello": "Hello world", "fox": "The quick brown fox jumps over the lazy dog.",
           "code": "def add(a, b):\n    return a + b"}


@pytest.fixture(scope="module")
def llama_ref():
    return np.load(DATA / "tiny_llama_bpe_logits.npz")


@pytest.fixture()
def exact_products(monkeypatch):
    """MUL_MAT on the exact weight values (GGMLPY_QUANT_MATMUL=dequant), as the float64
    reference computes: ggml's dot kernels round the activations to Q8 blocks (~1e-2 relative
    on a logit), enough to flip a greedy step whose float64 gap is a few 1e-3; this file checks
    the command line's loop, not that rounding."""
    monkeypatch.setenv(env.QUANT_MATMUL, "dequant")


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """A tiny random-weight gemma3 file (the real model's tensor types) and its float64
    weights for the reference forward."""
    p = tmp_path_factory.mktemp("gen") / "tiny_gemma3.gguf"
    write_tiny_gguf(p, "gemma3", seed=5)
    hp, w = load_weights_f64(str(p))
    return p, hp, w


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["generate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys, *argv: str) -> dict:
    rc, out, err = _run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_greedy_equals_llama_cpp(capsys, llama_ref, name):
    """The prompt text encodes to llama.cpp's ids and greedy decoding gives llama.cpp's 16
    tokens (tests/data/tiny_llama_bpe_logits.npz, llama-cpp-python 0.3.36, F32 KV cache)."""
    ref_ids = llama_ref[f"{name}/greedy_ids"].tolist()
    r = _json(capsys, "-m", str(BPE), "-p", PROMPTS[name], "-n", "16", "--temp", "0", "-c", "64")
    assert r["prompt_tokens"] == llama_ref[f"{name}/prompt_ids"].tolist()
    assert r["tokens"] == ref_ids
    assert r["stop_reason"] == ("length" if len(ref_ids) == 16 else "eog")


def test_greedy_equals_float64_reference_loop(capsys, tiny_gemma, exact_products):
    """gemma3 (Q4_K/Q6_K/Q8_0 weights, sliding window of 8 crossed): the CLI's greedy tokens are
    the arg max of the float64 forward over the growing sequence, step by step."""
    path, hp, w = tiny_gemma
    r = _json(capsys, "-m", str(path), "-p", "hello there, general", "-n", "12", "--temp", "0",
              "-ub", "4", "-c", "64", "--ignore-eos")
    seq = list(r["prompt_tokens"])
    assert len(seq) > 8  # the window is crossed inside the prompt
    want = []
    for _ in range(12):
        logits = forward(hp, w, seq)[-1]
        top2 = np.sort(logits)[-2:]
        assert top2[1] - top2[0] > 1e-3  # no near tie float32 could flip
        t = int(np.argmax(logits))
        want.append(t)
        seq.append(t)
    assert r["tokens"] == want
    assert r["timings"]["n_prompt"] == len(r["prompt_tokens"])
    assert r["timings"]["n_eval"] == 11 and r["timings"]["n_sample"] == 12


def test_sampling_flags_reach_the_sampler(capsys, tiny_gemma, exact_products):
    """--temp/--top-k/--top-p/--min-p/--repeat-penalty/--seed: the tokens are those of
    llama.cpp's chain (Sampler) fed the float64 reference logits, and a seed repeats."""
    path, hp, w = tiny_gemma
    argv = ("-m", str(path), "-p", "once upon", "-n", "8", "--temp", "1.5", "--top-k", "50",
            "--top-p", "0.9", "--min-p", "0.02", "--repeat-penalty", "1.3", "-s", "1234",
            "--ignore-eos")
    r = _json(capsys, *argv)
    sampler = Sampler(SamplerParams(temp=1.5, top_k=50, top_p=0.9, min_p=0.02,
                                    repeat_penalty=1.3, seed=1234))
    seq = list(r["prompt_tokens"])
    for _ in range(8):
        seq.append(sampler.sample(forward(hp, w, seq)[-1].astype(np.float32), seq))
    assert r["tokens"] == seq[len(r["prompt_tokens"]):]
    assert len(set(r["tokens"])) > 1
    assert _json(capsys, *argv)["tokens"] == r["tokens"]
    other = _json(capsys, *argv[:-2], "4321", "--ignore-eos")["tokens"]
    assert other != r["tokens"]


def test_streams_pieces_between_decode_steps(capsys, monkeypatch):
    """stdout gets the prompt, then one write per token piece while decoding goes on (each
    write is flushed before the next eval), then a newline; the timings go to stderr."""
    events: list[str] = []
    real_eval = LLM.eval
    monkeypatch.setattr(LLM, "eval", lambda self, t, **k: (events.append("eval"),
                                                           real_eval(self, t, **k))[1])

    class Out:
        def write(self, s):
            events.append("write:" + s)
            return len(s)

        def flush(self):
            events.append("flush")

    monkeypatch.setattr("sys.stdout", Out())
    rc = cli_main(["generate", "-m", str(BPE), "-p", PROMPTS["fox"], "-n", "6", "--temp", "0"])
    err = capsys.readouterr().err
    assert rc == 0
    writes = [e[6:] for e in events if e.startswith("write:")]
    assert writes[0] == PROMPTS["fox"] and writes[-1] == "\n"
    # every generated piece after the first comes after an eval and is flushed before the next
    first_piece = events.index("write:" + writes[1])
    assert events[:first_piece].count("eval") == 1  # the prompt's decode only
    assert events[first_piece + 1] == "flush"
    assert events.count("eval") == 6  # prompt + 5 steps (the 6th token is not decoded)
    for key in ("load time", "prompt eval time", "eval time", "total time",
                "tokens per second", "stop: length, 6 tokens"):
        assert key in err


def test_text_is_the_tokens_pieces(capsys, llama_ref):
    """Plain output = prompt + the generated ids' pieces (token_to_piece joined), + newline."""
    tok = Tokenizer.from_gguf_metadata(read_tokenizer_metadata(BPE))
    ids = llama_ref["code/greedy_ids"].tolist()
    rc, out, err = _run(capsys, "-m", str(BPE), "-p", PROMPTS["code"], "-n", "16", "--temp", "0")
    assert rc == 0
    text = b"".join(tok.token_to_bytes(i) for i in ids).decode("utf-8", errors="replace")
    assert out == PROMPTS["code"] + text + "\n"
    rc, out2, _ = _run(capsys, "-m", str(BPE), "-p", PROMPTS["code"], "-n", "16", "--temp", "0",
                       "--no-display-prompt")
    assert out2 == text + "\n"


def test_json_document(capsys, tmp_path):
    """--json: one object, nothing else on stdout; timings consistent; prompt from -f."""
    f = tmp_path / "p.txt"
    f.write_text(PROMPTS["hello"], encoding="utf-8")
    rc, out, err = _run(capsys, "-m", str(BPE), "-f", str(f), "-n", "5", "--temp", "0", "--json")
    assert rc == 0
    r = json.loads(out)  # the whole of stdout is the document
    assert r["prompt"] == PROMPTS["hello"] and r["n_generated"] == len(r["tokens"]) == 5
    t = r["timings"]
    assert t["n_prompt"] == 3 and t["n_eval"] == 4 and t["n_sample"] == 5
    assert t["load_ms"] > 0 and t["total_ms"] >= t["prompt_ms"] + t["eval_ms"]
    assert t["first_token_ms"] >= t["prompt_ms"]
    assert abs(t["eval_tok_s"] - 4e3 / t["eval_ms"]) < 1e-9 * t["eval_tok_s"]
    assert r["settings"]["ubatch_size"] == 512 and r["settings"]["devices"] == ["CPU"]
    # llama.cpp's defaults: an F16 KV cache, flash attention auto (on)
    assert (r["settings"]["cache_type_k"], r["settings"]["cache_type_v"]) == ("f16", "f16")
    assert r["settings"]["flash_attn"] is True


def test_reference_settings_same_tokens(capsys, llama_ref):
    """-ctk f32 -ctv f32 -fa off: the settings llama.cpp's tiny-model reference was made with
    (tests/data/tiny_llama_bpe_logits.npz), its greedy tokens."""
    r = _json(capsys, "-m", str(BPE), "-p", PROMPTS["fox"], "-n", "16", "--temp", "0",
              "-ctk", "f32", "-ctv", "f32", "-fa", "off")
    assert r["settings"]["flash_attn"] is False and r["settings"]["cache_type_k"] == "f32"
    assert r["tokens"] == llama_ref["fox/greedy_ids"].tolist()


def test_prompt_in_batches_and_ubatches_same_tokens(capsys, llama_ref):
    """-b 4 -ub 2 (several eval calls, micro-batches of 2) gives the same greedy tokens."""
    r = _json(capsys, "-m", str(BPE), "-p", PROMPTS["fox"], "-n", "16", "--temp", "0",
              "-b", "4", "-ub", "2")
    assert r["tokens"] == llama_ref["fox/greedy_ids"].tolist()
    assert r["settings"]["ubatch_size"] == 2


def test_sim_device_same_tokens(capsys, llama_ref, monkeypatch):
    """--device SIM0 (all layers offloaded by default) gives llama.cpp's tokens too."""
    r = _json(capsys, "-m", str(BPE), "-p", PROMPTS["hello"], "-n", "16", "--temp", "0",
              "--device", "SIM0")
    assert r["settings"]["devices"][0] == "SIM0" and r["settings"]["n_gpu_layers"] == -1
    assert r["tokens"] == llama_ref["hello/greedy_ids"].tolist()


def test_model_name_resolves(capsys, monkeypatch, tmp_path, llama_ref):
    """-m gemma3-270m is the file find_default_gemma3 names; absent: exit 2 naming download."""
    monkeypatch.setenv(env.GEMMA3_GGUF, str(BPE))
    r = _json(capsys, "-m", "gemma3-270m", "-p", PROMPTS["hello"], "-n", "2", "--temp", "0")
    assert r["model"] == str(BPE) and r["tokens"] == llama_ref["hello/greedy_ids"].tolist()[:2]
    monkeypatch.delenv(env.GEMMA3_GGUF)
    monkeypatch.setenv(env.CACHE, str(tmp_path))
    rc, out, err = _run(capsys, "-m", "gemma3-270m", "-p", "x")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "python -m ggmlpy download gemma3-270m" in err


def _damaged(tmp_path: Path) -> Path:
    p = tmp_path / "cut.gguf"
    p.write_bytes(BPE.read_bytes()[:5000])
    return p


@pytest.mark.parametrize("argv, needle", [
    (["-p", "x", "--bogus"], "unrecognized arguments: --bogus"),
    (["-p", "x", "--n-pred", "3"], "unrecognized arguments: --n-pred"),  # no abbreviations
    (["-p", "x", "-n", "many"], "-n/--n-predict: invalid int value"),
    (["-p", "x", "-n", "-2"], "-n/--n-predict must be >= -1, got -2"),
    (["-p", "x", "-t", "0"], "-t/--threads must be in 1..512, got 0"),
    (["-p", "x", "-c", "0"], "-c/--ctx-size must be >= 1"),
    (["-p", "x", "--repeat-penalty", "0"], "--repeat-penalty must be > 0"),
    (["-p", "x", "--temp", "nan"], "--temp must be a finite number"),
    (["-p", "x", "-s", "-5"], "-s/--seed must be -1 or in 0..4294967295"),
    ([], "a prompt is required"),
    (["-p", "x", "-f", "y"], "not allowed with argument"),
    (["-p", "x", "--device", "NOPE0"], "--device NOPE0"),
    (["-p", "x", "--device", "SIM0", "-ngl", "9"], "-ngl/--n-gpu-layers must be in 0..2"),
    (["-p", "x", "--chat"], "chat template"),
    (["-p", "word " * 300, "-c", "16"], "-p/--prompt has"),
])
def test_usage_errors_exit_2(capsys, argv, needle):
    rc, out, err = _run(capsys, "-m", str(BPE), *argv)
    assert rc == 2, err
    assert out == ""
    lines = [ln for ln in err.strip().splitlines()
             if not ln.startswith("ggmlpy generate: registered")]  # the SIM note, first time only
    assert len(lines) == 1, err
    assert needle in err


def test_file_errors_exit_2(capsys, tmp_path):
    for path, needle in ((tmp_path / "none.gguf", "no such file"), (tmp_path, "a folder"),
                         (_damaged(tmp_path), "cut.gguf")):
        rc, out, err = _run(capsys, "-m", str(path), "-p", "x")
        assert rc == 2 and out == "", err
        assert len(err.strip().splitlines()) == 1 and needle in err, err
    rc, out, err = _run(capsys, "-m", str(BPE), "-f", str(tmp_path / "missing.txt"))
    assert rc == 2 and "-f/--file" in err and len(err.strip().splitlines()) == 1


def test_help_lists_llama_cpp_flags(capsys):
    rc, out, _ = _run(capsys, "--help")
    assert rc == 0
    for flag in ("-m", "-p", "-n", "-c", "-b", "-ub", "-t", "-ngl", "--temp", "--seed",
                 "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--device", "--parallel",
                 "--chat", "--json"):
        assert f" {flag}" in out


GEMMA_GAP = 0.5  # llama.cpp's top-2 gaps under this may flip between the two tools' float sums


@pytest.mark.model
@pytest.mark.parametrize("case_name", ["question_capital", "chat_capital", "arabic"])
def test_gemma3_by_name_matches_llama_cpp(capsys, monkeypatch, gemma_gguf, case_name):
    """-m gemma3-270m (the file find_default_gemma3 names), F16 KV cache as the reference was
    made: llama.cpp's prompt ids (the chat case: control-token text parsed), and its greedy
    tokens up to its first near tie
    (tests/data/gemma3_greedy.json); the text is the tokens' pieces (multi-byte characters
    whole)."""
    case = next(c for c in json.loads((DATA / "gemma3_greedy.json").read_text())["cases"]
                if c["name"] == case_name)
    monkeypatch.setenv(env.GEMMA3_GGUF, str(gemma_gguf))
    monkeypatch.setenv(env.WEIGHT_CACHE_MB, "2048")  # float32 output matrix kept between steps
    r = _json(capsys, "-m", "gemma3-270m", "-p", case["prompt"], "-n", "16", "--temp", "0",
              "-t", "2", "-c", "256", "-ctk", "f16", "-ctv", "f16")
    assert r["prompt_tokens"] == case["prompt_ids"]
    want = case["greedy_ids"][:16]
    first_tie = next((k for k, g in enumerate(case["top2_gap"][:16]) if g < GEMMA_GAP), 16)
    assert first_tie >= 1
    assert r["tokens"][:first_tie] == want[:first_tie]
    tok = Tokenizer.from_gguf_metadata(read_tokenizer_metadata(gemma_gguf))
    assert r["text"] == b"".join(tok.token_to_bytes(t) for t in r["tokens"]).decode("utf-8", "replace")
