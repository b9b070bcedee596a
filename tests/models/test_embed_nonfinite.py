"""A model whose output holds NaN: the CLI names the rows in one line, exits 1 unless
``--allow-nonfinite``, and prints valid JSON (``null`` for NaN) in every JSON form;
``--check-weights`` refuses the file on load, naming the tensor. The damaged model is the F32
GGUF of MiniLM with the word-embedding row of "cat" (id 4937) set to NaN: a sentence with "cat"
turns NaN, the fixture's sentence 0 (no "cat") must still match sentence-transformers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from ggmlpy.models.cli import embed_main  # noqa: E402
from ggmlpy.models.gguf_bert import convert  # noqa: E402

pytestmark = pytest.mark.model

EMB_MAX_ABS = 1e-5  # as tests/models/test_model_bert.py
# a .gguf file runs llama.cpp's graph, whose FFN uses ggml's tanh GELU: the f32 file is 2.8e-4
# from sentence-transformers' erf GELU on the fixture (docs/types-and-gguf.md)
GGUF_EMB_MAX_ABS = 5e-4
CAT = 4937


def _strict_json(text: str):
    def refuse(c):
        raise ValueError(f"non-standard JSON constant {c}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def public(fixtures_dir: Path) -> dict:
    with open(fixtures_dir / "minilm_public.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def nan_gguf(model_dir, tmp_path_factory) -> Path:
    from ggmlpy import backend_cpu_init, backend_tensor_get, gguf_load, gguf_save

    tmp = tmp_path_factory.mktemp("nan")
    src = convert(model_dir, tmp / "f32.gguf", "f32")["path"]
    m = gguf_load(src, backend_cpu_init())
    try:
        tensors = {}
        for name, t in m.tensors.items():
            ne = list(t.ne)
            while len(ne) > 1 and ne[-1] == 1:
                ne.pop()
            tensors[name] = np.array(backend_tensor_get(t), dtype=np.float32).reshape(ne[::-1])
        tensors["token_embd.weight"][CAT] = np.nan
        out = tmp / "nan.gguf"
        gguf_save(out, tensors, m.metadata, types=m.metadata_types)
    finally:
        m.free()
    return out


def _run(capsys, argv):
    rc = embed_main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_nan_row_is_named_json_stays_valid_and_exit_is_1(nan_gguf, public, capsys):
    s0 = public["sentences"][0]
    rc, out, err = _run(capsys, ["--model", str(nan_gguf), "--json", "--no-progress", s0, "a cat"])
    assert rc == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "1 of 2 row(s) hold NaN/inf (row 1)" in lines[0]
    assert "--allow-nonfinite" in lines[0] and "--check-weights" in lines[0]
    doc = _strict_json(out)
    assert doc["nonfinite_rows"] == [1]
    assert all(v is None for v in doc["embeddings"][1])
    np.testing.assert_allclose(doc["embeddings"][0], public["embeddings"][0], rtol=0,
                               atol=GGUF_EMB_MAX_ABS)


@pytest.mark.parametrize("fmt", ["array", "json", "json+"])
def test_llama_output_formats_stay_valid_json(nan_gguf, capsys, fmt):
    rc, out, err = _run(capsys, ["--model", str(nan_gguf), "--embd-output-format", fmt,
                                 "--allow-nonfinite", "--no-progress", "a dog", "a cat"])
    assert rc == 0 and err.startswith("ggmlpy embed: warning: 1 of 2 row(s) hold NaN/inf (row 1)")
    doc = _strict_json(out)
    rows = doc if fmt == "array" else [d["embedding"] for d in doc["data"]]
    assert rows[1] == [None] * 384 and all(isinstance(v, float) for v in rows[0])
    if fmt == "json+":
        assert doc["cosineSimilarity"][0][0] == pytest.approx(1.0, abs=1e-6)
        assert doc["cosineSimilarity"][0][1] is None


def test_human_output_also_warns(nan_gguf, capsys):
    rc, out, err = _run(capsys, ["--model", str(nan_gguf), "--no-progress", "a cat"])
    assert rc == 1 and "row 0" in err and "nan" in out


def test_check_weights_refuses_the_file_naming_the_tensor(nan_gguf, capsys):
    rc, out, err = _run(capsys, ["--model", str(nan_gguf), "--check-weights", "a dog"])
    assert rc == 2 and out == ""
    assert err.strip() == (f"ggmlpy embed: {nan_gguf}: tensor 'token_embd.weight' holds 384 "
                           f"non-finite values (NaN/inf), the first at element {CAT * 384}")


def test_check_weights_passes_a_sound_model(model_dir, public, capsys):
    rc, out, err = _run(capsys, ["--check-weights", "--json", "--no-progress",
                                 public["sentences"][1]])
    assert rc == 0, err
    np.testing.assert_allclose(_strict_json(out)["embeddings"][0], public["embeddings"][1],
                               rtol=0, atol=EMB_MAX_ABS)
