"""Damaged model files (issue 10, item 13): for every file the loader reads, a truncated or
garbage file gives one line naming the file (ModelFileError, a ValueError) and ``embed`` exits 2.

The model directory of each case is the installed all-MiniLM-L6-v2 folder mirrored with symbolic
links, except the one file the case damages (no 90 MB copies).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggmlpy.models.loader import ModelFileError


def _mirror(model_dir: Path, dst: Path) -> Path:
    for p in model_dir.rglob("*"):
        q = dst / p.relative_to(model_dir)
        if p.is_dir():
            q.mkdir(parents=True, exist_ok=True)
        else:
            q.parent.mkdir(parents=True, exist_ok=True)
            q.symlink_to(p)
    return dst


def _damage(d: Path, rel: str, data: bytes) -> None:
    (d / rel).unlink()
    (d / rel).write_bytes(data)


def _truncated_safetensors(model_dir: Path) -> bytes:
    with open(model_dir / "model.safetensors", "rb") as f:
        return f.read(100_000)  # header and the start of the first tensor only


CASES = [
    ("model.safetensors", "truncated", _truncated_safetensors, "not a readable safetensors file"),
    ("model.safetensors", "text", lambda m: b"hello", "not a readable safetensors file"),
    ("model.safetensors", "empty", lambda m: b"", "not a readable safetensors file"),
    ("tokenizer.json", "garbage", lambda m: b"\x00\x01garbage", "not valid JSON"),
    ("tokenizer.json", "json-not-tokenizer", lambda m: b'{"garbage": 1}', "not a tokenizers tokenizer"),
    ("tokenizer.json", "truncated", lambda m: (m / "tokenizer.json").read_bytes()[:5000],
     "not valid JSON"),
    ("config.json", "not-json", lambda m: b"hidden_size: 384", "not valid JSON"),
    ("config.json", "array", lambda m: b"[1, 2]", "must hold a JSON object"),
    ("config.json", "latin1", lambda m: b'{"x": "\xe9"}', "not UTF-8"),
    ("config.json", "missing-key", lambda m: b'{"hidden_size": 384}', "missing key"),
    ("config.json", "wrong-type",
     lambda m: json.dumps({**json.loads((m / "config.json").read_text()),
                           "num_hidden_layers": "six"}).encode(), "num_hidden_layers must be an integer"),
    ("config.json", "zero-heads",
     lambda m: json.dumps({**json.loads((m / "config.json").read_text()),
                           "num_attention_heads": 0}).encode(), "num_attention_heads must be >= 1"),
    ("sentence_bert_config.json", "not-json", lambda m: b"{", "not valid JSON"),
    ("sentence_bert_config.json", "bad-length", lambda m: b'{"max_seq_length": "long"}',
     "max_seq_length must be an integer"),
    ("modules.json", "not-json", lambda m: b"nope", "not valid JSON"),
    ("modules.json", "object", lambda m: b'{"a": 1}', "must hold a JSON array"),
    ("1_Pooling/config.json", "not-json", lambda m: b"}", "not valid JSON"),
    ("1_Pooling/config.json", "no-mode", lambda m: b"{}", "pooling must enable exactly one"),
]


@pytest.mark.parametrize("rel, kind, make, needle", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_damaged_file_named_in_one_line(model_dir: Path, tmp_path: Path, rel, kind, make, needle):
    from ggmlpy.models.bert import BertModel

    d = _mirror(model_dir, tmp_path / "m")
    _damage(d, rel, make(model_dir))
    with pytest.raises(ModelFileError) as ei:
        with BertModel.load(d):
            pass
    msg = str(ei.value)
    assert msg.startswith(str(d / rel) + ": "), msg
    assert needle in msg and "\n" not in msg
    assert ei.value.path == str(d / rel)


@pytest.mark.parametrize("rel, make", [
    ("model.safetensors", _truncated_safetensors),
    ("tokenizer.json", lambda m: b"garbage"),
    ("config.json", lambda m: b"not json"),
])
def test_embed_cli_exit_2_one_line(model_dir: Path, tmp_path: Path, capsys, rel, make):
    from ggmlpy.models.cli import embed_main

    d = _mirror(model_dir, tmp_path / "m")
    _damage(d, rel, make(model_dir))
    assert embed_main(["--model", str(d), "--no-progress", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ggmlpy embed: {d / rel}: "), err
    assert "Traceback" not in err


def test_bom_in_config_is_accepted(model_dir: Path, tmp_path: Path):
    # a UTF-8 byte-order mark (as Windows editors write) is not an error
    from ggmlpy.models.loader import BertConfig

    d = _mirror(model_dir, tmp_path / "m")
    text = (model_dir / "config.json").read_bytes()
    _damage(d, "config.json", b"\xef\xbb\xbf" + text)
    assert BertConfig.from_model_dir(d) == BertConfig.from_model_dir(model_dir)


@pytest.mark.parametrize("value", ['"false"', '"true"', "0", "null"])
def test_do_lower_case_not_boolean_is_refused_by_both_readers(model_dir: Path, tmp_path: Path,
                                                              value):
    # load_tokenizer(lower_case=None) read it with bool(): "false" lower-cased the text silently
    from ggmlpy.models.loader import BertConfig, load_tokenizer

    d = _mirror(model_dir, tmp_path / "m")
    _damage(d, "sentence_bert_config.json",
            b'{"max_seq_length": 256, "do_lower_case": ' + value.encode() + b"}")
    for read in (lambda: BertConfig.from_model_dir(d), lambda: load_tokenizer(d, 128)):
        with pytest.raises(ModelFileError, match="do_lower_case must be true or false") as ei:
            read()
        assert ei.value.path == str(d / "sentence_bert_config.json")


TINY = {"vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 8, "max_position_embeddings": 6, "type_vocab_size": 2}


def _tiny_dir(tmp_path: Path, mutate) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    from ggmlpy.models.loader import BertConfig, expected_weight_shapes

    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY), encoding="utf-8")
    shapes = expected_weight_shapes(BertConfig.from_model_dir(d))
    rng = np.random.default_rng(0)
    w = {"bert." + k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    mutate(w)
    save_file(w, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("label, mutate, needle", [
    ("missing", lambda w: w.pop("bert.encoder.layer.1.output.dense.weight"),
     "missing tensor 'encoder.layer.1.output.dense.weight'"),
    ("short-norm", lambda w: w.__setitem__("bert.embeddings.LayerNorm.weight",
                                            w["bert.embeddings.LayerNorm.weight"][:3]),
     "tensor 'embeddings.LayerNorm.weight' has shape (3,), config.json implies (4,)"),
    ("transposed", lambda w: w.__setitem__("bert.encoder.layer.0.intermediate.dense.weight",
                                            w["bert.encoder.layer.0.intermediate.dense.weight"].T.copy()),
     "has shape (4, 8), config.json implies (8, 4)"),
])
def test_weights_that_do_not_fit_the_config_are_named(tmp_path: Path, label, mutate, needle):
    pytest.importorskip("safetensors")
    from ggmlpy.models.loader import load_weights

    d = _tiny_dir(tmp_path, mutate)
    with pytest.raises(ModelFileError) as ei:
        load_weights(d)
    assert str(ei.value).startswith(f"{d / 'model.safetensors'}: ") and needle in str(ei.value)


def test_weights_that_fit_load_unchanged(tmp_path: Path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    from ggmlpy.models.loader import load_weights

    d = _tiny_dir(tmp_path, lambda w: None)
    got = load_weights(d)
    raw = load_file(str(d / "model.safetensors"))
    assert set(got) == {k[len("bert."):] for k in raw}
    for k, v in raw.items():
        assert (got[k[len("bert."):]] == v).all()


def test_model_and_gguf_file_errors_share_one_base():
    """ModelFileError and GGUFError are both FileFormatError: one except clause catches both, and
    both carry the path and a one-line reason."""
    from ggmlpy.core.errors import FileFormatError, GGUFError
    from ggmlpy.models.loader import ModelFileError

    m = ModelFileError("m/config.json", "not JSON:\n line 1")
    g = GGUFError("w.gguf", "truncated", tensor="blk.0.attn_q.weight")
    for e in (m, g):
        assert isinstance(e, FileFormatError) and isinstance(e, ValueError)
    assert (m.path, m.reason, str(m)) == ("m/config.json", "not JSON: line 1",
                                          "m/config.json: not JSON: line 1")
    assert str(g) == "w.gguf: tensor 'blk.0.attn_q.weight': truncated"
