"""``embed --input`` (issue 10, item 15): every input line is a row (blank lines included, embedded
as sentence-transformers embeds them), ``--json`` says where each row came from, a UTF-8 BOM and a
JSON array on stdin work, and ``-ngl``/``--parallel`` on the CPU say they are ignored."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from ggmlpy.models.cli import _UsageError, embed_main, read_sentences

DATA = Path(__file__).resolve().parents[1] / "data"
# as test_model_bert.py: float32 summation order only differs from PyTorch's
EMB_MAX_ABS = 1e-5

BOM = "\ufeff"

LINES = [
    ("a\nb\n", ["a", "b"]),
    ("a\nb", ["a", "b"]),
    ("a\n\n   \nb\n", ["a", "", "   ", "b"]),
    ("\n", [""]),
    ("\n\n", ["", ""]),
    ("", []),
    ("a\r\nb\r\n", ["a", "b"]),
    (BOM + "a\nb\n", ["a", "b"]),
    ("x\u2028y\n", ["x\u2028y"]),  # only "\n" ends a line (not Unicode line separators)
]


@pytest.mark.parametrize("text, expected", LINES)
def test_lines_file_every_line_is_a_row(tmp_path, text, expected):
    p = tmp_path / "s.txt"
    p.write_bytes(text.encode("utf-8"))
    assert read_sentences(str(p)) == expected


@pytest.mark.parametrize("text, expected", [
    ('["a", "", "b"]', ["a", "", "b"]),
    (BOM + '["a", "b"]', ["a", "b"]),
    ('[]', []),
])
def test_json_file(tmp_path, text, expected):
    p = tmp_path / "s.json"
    p.write_bytes(text.encode("utf-8"))
    assert read_sentences(str(p)) == expected


@pytest.mark.parametrize("text, expected", [
    ('["x", "", "y"]\n', ["x", "", "y"]),            # a JSON array piped in
    (BOM + '  ["x"]', ["x"]),
    ("[citation needed] a line\nnext\n", ["[citation needed] a line", "next"]),  # not JSON: lines
    ('["a", 1]\n', None),                             # JSON array, but not of strings: an error
    ("plain\n\nlines\n", ["plain", "", "lines"]),
])
def test_stdin_json_or_lines(monkeypatch, text, expected):
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    if expected is None:
        with pytest.raises(_UsageError, match="element 1 is int"):
            read_sentences("-")
    else:
        assert read_sentences("-") == expected


@pytest.mark.parametrize("text, needle", [
    ('{"a": 1}', "must hold a JSON array of strings, got dict"),
    ('["a", null]', "element 1 is NoneType"),
    ("[1", "is not valid JSON"),
])
def test_json_file_errors_name_the_file(tmp_path, text, needle):
    p = tmp_path / "bad.json"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(_UsageError) as ei:
        read_sentences(str(p))
    assert str(p) in str(ei.value) and needle in str(ei.value)


def _embed_json(capsys, argv):
    rc = embed_main(["--json", "--no-progress", *argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out), err


@pytest.mark.model
def test_blank_lines_embedded_like_sentence_transformers(model_dir, tmp_path, capsys):
    ref = json.loads((DATA / "minilm_empty_sentence.json").read_text(encoding="utf-8"))
    p = tmp_path / "s.txt"
    p.write_bytes((BOM + "hello\n\n   \nworld\r\n").encode("utf-8"))
    data, _ = _embed_json(capsys, ["first arg", "--input", str(p)])
    assert data["input_source"] == ["argv", str(p), str(p), str(p), str(p)]
    assert data["input_index"] == [0, 0, 1, 2, 3]
    assert data["n_tokens"][2:4] == [2, 2]  # [CLS] [SEP]
    emb = np.asarray(data["embeddings"], dtype=np.float64)
    assert emb.shape == (5, 384)
    np.testing.assert_allclose(emb[2], ref["empty"], atol=EMB_MAX_ABS, rtol=0)
    np.testing.assert_allclose(emb[3], ref["blank"], atol=EMB_MAX_ABS, rtol=0)
    # the other rows stay where their lines are: "hello" differs from the blank rows
    assert np.abs(emb[1] - emb[2]).max() > 0.05 and np.abs(emb[4] - emb[2]).max() > 0.05


@pytest.mark.model
def test_json_array_on_stdin_and_ignored_options_noted(model_dir, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO('["hello", ""]\n'))
    data, err = _embed_json(capsys, ["--input", "-", "-ngl", "3", "--parallel"])
    assert data["input_source"] == ["-", "-"] and data["input_index"] == [0, 1]
    assert data["n_tokens"] == [3, 2]
    assert data["n_gpu_layers"] == 0 and data["parallel"] is False and data["devices"] == ["CPU"]
    assert "note: -ngl and --parallel ignored: --device is the CPU" in err
    assert err.count("\n") == 1


@pytest.mark.model
def test_no_note_when_options_not_given(model_dir, capsys):
    _, err = _embed_json(capsys, ["hello"])
    assert "ignored" not in err
