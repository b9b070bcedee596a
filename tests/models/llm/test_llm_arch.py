"""Architecture rules read from GGUF metadata (:mod:`ggmlpy.models.llm.arch`): the keys llama.cpp's
``load_hparams`` reads, gemma3's sliding-window pattern and per-layer RoPE base, and the errors."""

from __future__ import annotations

import math

import pytest

from ggmlpy.models.llm.arch import HParams, arch_spec, block_tensor_names

GEMMA3_270M = {
    "general.architecture": "gemma3", "gemma3.context_length": 32768,
    "gemma3.embedding_length": 640, "gemma3.block_count": 18, "gemma3.feed_forward_length": 2048,
    "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1,
    "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256,
    "gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.rope.freq_base": 1e6,
    "gemma3.attention.sliding_window": 512,
}


def test_gemma3_270m_hyperparameters_and_layer_rules():
    hp = HParams.from_metadata(GEMMA3_270M, 262144)
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv) == (18, 640, 4, 1)
    assert (hp.head_dim_k, hp.head_dim_v, hp.n_rot, hp.n_ff, hp.n_swa) == (256, 256, 256, 2048, 512)
    # llama.cpp set_swa_pattern(6): every 6th layer (5, 11, 17) is global, with the file's base
    assert [il for il in range(18) if not hp.is_swa(il)] == [5, 11, 17]
    assert hp.layer_rope_base(5) == 1e6 and hp.layer_rope_base(0) == 10000.0
    assert hp.attn_scale == pytest.approx(1 / math.sqrt(256))   # 1/sqrt(head_dim), not n_embd/n_head
    assert "blk.3.post_ffw_norm.weight" in block_tensor_names(hp.arch, 3)


def test_llama_defaults_and_no_window():
    meta = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
            "llama.attention.head_count": 4, "llama.feed_forward_length": 128}
    hp = HParams.from_metadata(meta, 100)
    assert (hp.n_head_kv, hp.head_dim_k, hp.n_rot, hp.rope_base, hp.n_swa) == (4, 16, 16, 10000.0, 0)
    assert not any(hp.is_swa(il) for il in range(2))
    assert block_tensor_names(arch_spec("llama"), 1, optional=True) == [
        "blk.1.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias"]


@pytest.mark.parametrize("change, match", [
    ({"general.architecture": "mamba"}, "architecture 'mamba' is not supported"),
    ({"gemma3.block_count": None}, "missing key 'gemma3.block_count'"),
    ({"gemma3.attention.head_count_kv": 3}, "not a multiple of head_count_kv 3"),
])
def test_metadata_errors(change, match):
    meta = {k: v for k, v in {**GEMMA3_270M, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=match):
        HParams.from_metadata(meta, 262144)
