"""scripts/gpu_llm.py as a dry run on SIM0 (what gpu_check.sh runs on CUDA0): the random-weight
file has Gemma 3 270M's metadata and shapes, and the device's logits and greedy tokens are
the CPU's; on the CUDA backend's code over the fake CuPy (dequantized weights, float GEMMs) they
are the exact CPU run's, which the script then picks as the referee."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ggmlpy.gguf.reader import GGUFReader

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gpu_llm():
    spec = importlib.util.spec_from_file_location("gpu_llm", ROOT / "scripts" / "gpu_llm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_written_file_has_gemma3_270m_shapes(gpu_llm, tmp_path):
    p = tmp_path / "g.gguf"
    gpu_llm.write_model(p, n_vocab=512, seed=0, n_layer=6)
    r = GGUFReader(p)
    f = r.fields
    assert (f["general.architecture"], f["gemma3.embedding_length"], f["gemma3.block_count"],
            f["gemma3.attention.head_count"], f["gemma3.attention.head_count_kv"],
            f["gemma3.attention.key_length"], f["gemma3.feed_forward_length"],
            f["gemma3.attention.sliding_window"], f["gemma3.rope.freq_base"]) == \
        ("gemma3", 640, 6, 4, 1, 256, 2048, 512, 1e6)
    want = {"token_embd.weight": ("Q8_0", (640, 512)), "blk.0.attn_q.weight": ("Q5_0", (640, 1024)),
            "blk.0.attn_k.weight": ("Q5_0", (640, 256)), "blk.0.attn_v.weight": ("Q8_0", (640, 256)),
            "blk.0.attn_output.weight": ("Q4_K", (1024, 640)),
            "blk.5.ffn_down.weight": ("Q6_K", (2048, 640)),
            "blk.5.ffn_gate.weight": ("Q5_0", (640, 2048)),
            "blk.0.attn_q_norm.weight": ("F32", (256,))}
    for name, (t, ne) in want.items():
        assert (r[name].type.name, tuple(r[name].ne)) == (t, ne), name
    assert "output.weight" not in r.tensors  # tied, as the real file


def test_dry_run_on_sim0(gpu_llm, capsys):
    rc = gpu_llm.main(["--device", "SIM0", "--n-vocab", "512", "--n-layer", "6", "--prompt", "12",
                       "--gen", "3", "--threads", "1"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"]
    assert out["devices"][0] == "SIM0"
    assert out["prompt_logits_max_rel_diff"] <= 1e-3
    assert out["greedy_steps_agreeing"] == out["greedy_steps_compared"]
    assert out["cpu_tokens"][:out["greedy_steps_compared"]] == \
        out["dev_tokens"][:out["greedy_steps_compared"]]


def test_cuda_code_compares_with_the_exact_cpu_run(gpu_llm, capsys):
    """The CUDA kernels multiply dequantized weights in float32, so their logits are the CPU's
    exact run's (``GGMLPY_QUANT_MATMUL=dequant``, precise kernels) to float32 rounding and 1e-2
    away from the default CPU's (activations quantized to Q8 as ggml-cpu does): the script must
    pick the exact run as the referee, or a correct GPU would fail its check."""
    from fake_cupy import fake_cuda_reg

    from ggmlpy.backend import registry

    reg = fake_cuda_reg(1, 1 << 30)
    registry.register(reg)
    try:
        rc = gpu_llm.main(["--device", reg.devices[0].name, "--n-vocab", "512", "--n-layer", "1",
                           "--prompt", "6", "--gen", "1", "--threads", "1"])
    finally:
        registry.unregister(reg.name)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] and out["referee"] == "cpu_exact"
    assert out["max_rel_diff_vs"]["cpu_exact"] <= 1e-4
    assert out["max_rel_diff_vs"]["cpu"] > 1e-3  # the two CPU numerics really differ here
    assert out["dev_tokens"] == out["cpu_exact_tokens"][:len(out["dev_tokens"])]


def test_missing_device_exit_2(gpu_llm, capsys):
    assert gpu_llm.main(["--device", "NOPE0"]) == 2
    assert "unavailable" in json.loads(capsys.readouterr().out)
