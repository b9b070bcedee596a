"""``convert`` gives every tensor a type whose blocks tile its rows (llama.cpp's fallback chain in
``llama_tensor_get_type``: K-quant -> Q5_0/Q5_1/Q8_0 -> F16), says which tensors fell back, and
refuses weights a block type cannot hold. Table test over row lengths x schemes, and a tiny BERT
with rows of 312 and 100 values (neither a multiple of 256; 100 not even of 32)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("safetensors")

from ggmlpy.cli import main as cli_main  # noqa: E402
from ggmlpy.core.types import Type  # noqa: E402
from ggmlpy.gguf.reader import GGUFReader  # noqa: E402
from ggmlpy.models.gguf_bert import SCHEMES, convert, tensor_type_for  # noqa: E402
from ggmlpy.quants import dequantize  # noqa: E402

NAMES = ["blk.0.attn_q.weight", "blk.1.attn_v.weight", "blk.0.ffn_down.weight",
         "token_embd.weight", "position_embd.weight"]
ROWS = [16, 32, 48, 64, 100, 128, 256, 312, 320, 384, 500, 512, 768, 1000, 1024, 1536]


def _llama_cpp_chain(t: Type, ne0: int) -> Type:
    """llama-quant.cpp's rule, transcribed: a K-quant whose QK_K = 256 does not divide ne0 becomes
    Q5_0 (Q4_K), Q5_1 (Q5_K) or Q8_0 (Q6_K); if ne0 is not a multiple of that type's block size
    either, F16. (A 32-element type that does not fit goes to F16 here; llama.cpp has no case.)"""
    if t in (Type.Q4_K, Type.Q5_K, Type.Q6_K) and ne0 % 256:
        t = {Type.Q4_K: Type.Q5_0, Type.Q5_K: Type.Q5_1, Type.Q6_K: Type.Q8_0}[t]
    if ne0 % t.blck_size:
        t = Type.F16
    return t


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_row_length_gets_a_type_that_tiles_it(scheme):
    for name in NAMES:
        wanted = tensor_type_for(scheme, name, (4, 256))
        for ne0 in ROWS:
            got = tensor_type_for(scheme, name, (4, ne0))
            assert ne0 % got.blck_size == 0, (scheme, name, ne0, got)
            assert got == _llama_cpp_chain(wanted, ne0), (scheme, name, ne0)


def test_chain_examples():
    assert tensor_type_for("q4_k", "blk.0.attn_q.weight", (4, 312)) == Type.F16
    assert tensor_type_for("q4_k", "blk.0.attn_q.weight", (4, 320)) == Type.Q5_0
    assert tensor_type_for("q4_k", "blk.0.attn_q.weight", (4, 100)) == Type.F16
    assert tensor_type_for("q4_k_m", "blk.0.ffn_down.weight", (4, 384)) == Type.Q8_0
    assert tensor_type_for("q4_k_m", "blk.0.ffn_down.weight", (4, 100)) == Type.F16
    assert tensor_type_for("q4_0", "blk.0.ffn_down.weight", (4, 100)) == Type.F16
    assert tensor_type_for("q4_k", "blk.0.ffn_down.weight", (4, 512)) == Type.Q4_K


TINY = {"vocab_size": 8, "hidden_size": 312, "num_hidden_layers": 1, "num_attention_heads": 12,
        "intermediate_size": 100, "max_position_embeddings": 16, "type_vocab_size": 2}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "cat", "dog"]


def _tiny_dir(tmp_path: Path, mutate=None) -> Path:
    from safetensors.numpy import save_file

    from ggmlpy.models.loader import BertConfig, expected_weight_shapes

    d = tmp_path / "tiny312"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY), encoding="utf-8")
    tok = {"model": {"type": "WordPiece", "vocab": {t: i for i, t in enumerate(VOCAB)}},
           "normalizer": {"lowercase": True}}
    (d / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    shapes = expected_weight_shapes(BertConfig.from_model_dir(d))
    rng = np.random.default_rng(0)
    w = {"bert." + k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
    if mutate:
        mutate(w)
    save_file(w, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("scheme", ["q4_k", "q4_k_m", "q4_0", "q8_0"])
def test_convert_rows_of_312_and_100(tmp_path, scheme):
    from safetensors.numpy import load_file

    from ggmlpy.models.gguf_bert import hf_to_gguf_names

    d = _tiny_dir(tmp_path)
    info = convert(d, tmp_path / "t.gguf", scheme)
    r = GGUFReader(info["path"])
    src = {hf_to_gguf_names(1).get(k[len("bert."):]): v
           for k, v in load_file(str(d / "model.safetensors")).items()}
    for name, ti in r.tensors.items():
        assert ti.ne[0] % ti.type.blck_size == 0, name
        want = tensor_type_for(scheme, name, src[name].shape)
        assert ti.type == want, name
        vals = dequantize(np.asarray(ti.data), ti.type, list(ti.ne)).reshape(src[name].shape)
        tol = 1e-7 if ti.type == Type.F32 else 0.05  # 4-bit blocks of N(0, 0.1): < 0.05 off
        assert np.max(np.abs(vals - src[name])) < tol, name
    fb = info["fallbacks"]
    # rows of 312: every matrix but ffn_down; rows of 100: ffn_down
    assert fb["blk.0.ffn_down.weight"]["type"] == "f16" and fb["blk.0.ffn_down.weight"]["ne0"] == 100
    assert fb["blk.0.attn_q.weight"] == {"wanted": tensor_type_for(scheme, "blk.0.attn_q.weight",
                                                                   (312, 256)).type_name,
                                         "type": "f16", "ne0": 312}
    assert all(f["type"] == r.tensors[n].type.type_name for n, f in fb.items())
    assert set(fb) == {n for n, ti in r.tensors.items()
                       if ti.type != tensor_type_for(scheme, n, src[n].shape[:-1] + (256,))}
    assert not any(n.endswith(("norm.weight", "norm.bias", ".bias")) for n in fb)  # F32 anyway


def test_cli_lists_the_fallbacks(tmp_path, capsys):
    d = _tiny_dir(tmp_path)
    out = tmp_path / "c.gguf"
    assert cli_main(["convert", str(d), "--type", "q4_k", "-o", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fallbacks"]["blk.0.ffn_up.weight"] == {"wanted": "q4_K", "type": "f16", "ne0": 312}
    # q, k, v, output, ffn_up, ffn_down, token_embd, position_embd (token_types is F32)
    assert sorted(info["fallbacks"]) == sorted(
        ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
         "blk.0.attn_output.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
         "token_embd.weight", "position_embd.weight"])
    assert cli_main(["convert", str(d), "--type", "q4_k", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "8 tensors fell back to a type that tiles their rows: " in text
    assert "(q4_K -> f16, rows of 312)" in text


def test_convert_refuses_a_weight_the_type_cannot_hold(tmp_path, capsys):
    """Rows of 312 fall back to F16, where 1e9 would be stored as inf: refused like a block type's
    overflowing scale (ggml_validate_row_data rejects an F16 inf too)."""
    def huge(w):
        w["bert.encoder.layer.0.intermediate.dense.weight"][3, 40] = 1e9

    d = _tiny_dir(tmp_path, huge)
    with pytest.raises(ValueError, match=r"tensor 'blk.0.ffn_up.weight': element 40 of row 3 "
                                         r"\(flat element 976\) of f16 is inf or NaN"):
        convert(d, tmp_path / "h.gguf", "q8_0")
    assert cli_main(["convert", str(d), "--type", "q8_0", "-o", str(tmp_path / "h.gguf")]) == 2
    assert "blk.0.ffn_up.weight" in capsys.readouterr().err
