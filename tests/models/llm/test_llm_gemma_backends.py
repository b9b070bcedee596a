"""The real Gemma 3 270M file gives the same greedy tokens on every way of running it: the CPU
alone, the last 9 blocks on a SIM device (``-ngl 9``), every block and the output layer on it,
that split with pipelined micro-batches (``--parallel``), and the last block on a RAY device (a
Ray actor holding its weights and KV cache).

Every run uses the same micro-batch size (8 tokens, so each prompt is several micro-batches and
``--parallel`` has something to pipeline) and ggmlpy's defaults (F16 cache, fused attention,
ggml's q8 activations). SIM computes with the CPU's NumPy kernels and the Ray actor with the
same library in its own process, so the logits are the same floats and the greedy tokens are
compared exactly, token for token (16 per prompt, 3 prompts; ``model``-marked: the file named by
``$GGMLPY_GEMMA3_GGUF``). The RAY run is marked ``ray`` (it starts a Ray instance and uploads one
block's weights to the actor).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ggmlpy.backends.sim import sim_reg
from ggmlpy.models.llm.model import LLM

DATA = Path(__file__).resolve().parents[2] / "data"
N_TOKENS = 16
N_UBATCH = 8
PROMPTS = ("question_capital", "chat_capital", "code_python_def")


@pytest.fixture(scope="module")
def gemma_cpu():
    """The file, the prompts' ids (from the committed llama.cpp reference) and the CPU's greedy
    tokens and first logits for each."""
    path = os.environ.get("GGMLPY_GEMMA3_GGUF")
    if not path:
        pytest.skip("set GGMLPY_GEMMA3_GGUF to the Gemma 3 270M Q4_K_M file")
    cases = {c["name"]: c for c in json.loads((DATA / "gemma3_greedy.json").read_text())["cases"]}
    prompts = [cases[n]["prompt_ids"] for n in PROMPTS]
    with LLM.load(path, n_ctx=512, n_ubatch=N_UBATCH, n_threads=2) as m:
        want = []
        for ids in prompts:
            m.clear()
            first = m.eval(ids)
            m.clear()
            want.append((first, list(m.generate(ids, N_TOKENS))))
    return path, prompts, want


def _check(m: LLM, prompts, want) -> None:
    for ids, (first, tokens) in zip(prompts, want):
        m.clear()
        np.testing.assert_array_equal(m.eval(ids), first)
        m.clear()
        assert list(m.generate(ids, N_TOKENS)) == tokens


@pytest.mark.model
def test_cpu_greedy_matches_llama_cpp_where_it_is_clear(gemma_cpu):
    """The CPU's tokens themselves: llama.cpp's up to its first near tie (top-2 gap < 0.5)."""
    _, _, want = gemma_cpu
    cases = {c["name"]: c for c in json.loads((DATA / "gemma3_greedy.json").read_text())["cases"]}
    for name, (_, tokens) in zip(PROMPTS, want):
        ref, gaps = cases[name]["greedy_ids"][:N_TOKENS], cases[name]["top2_gap"][:N_TOKENS]
        tie = next((k for k, g in enumerate(gaps) if g < 0.5), N_TOKENS)
        assert tokens[:tie] == ref[:tie], name


@pytest.mark.model
@pytest.mark.parametrize("ngl,parallel", [(9, False), (-1, False), (9, True)],
                         ids=["sim_ngl9", "sim_full", "sim_ngl9_parallel"])
def test_sim_offload_same_tokens(gemma_cpu, ngl, parallel):
    path, prompts, want = gemma_cpu
    dev = sim_reg(1, latency_us=0.0).devices[0]
    with LLM.load(path, device=dev, n_gpu_layers=ngl, n_ctx=512, n_ubatch=N_UBATCH,
                  n_threads=2, parallel=parallel) as m:
        assert len(m.devices) == 2
        _check(m, prompts, want)


@pytest.mark.model
@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_ray_offload_same_tokens(gemma_cpu, ray_reg2):
    path, prompts, want = gemma_cpu
    with LLM.load(path, device=ray_reg2.devices[0], n_gpu_layers=1, n_ctx=512,
                  n_ubatch=N_UBATCH, n_threads=2) as m:
        assert m.devices[0].startswith("RAY")
        _check(m, prompts[:1], want[:1])
