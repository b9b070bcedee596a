"""Where the truncation length comes from (sentence-transformers' ``max_seq_length``, 256 for
MiniLM): the model folder's ``sentence_bert_config.json``; ggmlpy's own GGUF files
(``ggmlpy.max_seq_length``); a foreign GGUF as llama.cpp's ``convert_hf_to_gguf.py`` writes it
(only ``bert.context_length = 512``): a known model name, else ``min(context_length, 512)`` with
a warning; always settable. The reference is the fixture's sentence 2 (280 tokens untruncated),
embedded by sentence-transformers cut at 256 tokens."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from ggmlpy.core.check import ArgumentValueError  # noqa: E402
from ggmlpy.models.bert import BertModel, TruncationFallbackWarning  # noqa: E402
from ggmlpy.models.gguf_bert import convert, fallback_max_seq_length  # noqa: E402

pytestmark = pytest.mark.model

EMB_MAX_ABS = 1e-5  # as tests/models/test_model_bert.py
# a .gguf file runs llama.cpp's graph, whose FFN uses ggml's tanh GELU: the f32 file is 3.2e-4
# from sentence-transformers' erf GELU on this sentence (docs/types-and-gguf.md); a cut at
# another length moves the embedding by more than 1e-2
GGUF_EMB_MAX_ABS = 5e-4
LONG = 2  # the fixture sentence of 280 tokens


@pytest.fixture(scope="module")
def public(fixtures_dir: Path) -> dict:
    with open(fixtures_dir / "minilm_public.json", encoding="utf-8") as f:
        d = json.load(f)
    assert d["max_seq_length"] == 256 and d["untruncated_token_counts"][LONG] > 256
    return d


def write_foreign_copy(src: Path, dst: Path, name: str | None) -> Path:
    """``src`` (a ggmlpy GGUF) rewritten as llama.cpp's converter writes it: no ``ggmlpy.*``
    keys, ``general.name`` = ``name`` (absent when None)."""
    from ggmlpy import backend_cpu_init, gguf_load, gguf_save

    m = gguf_load(src, backend_cpu_init())
    try:
        md = {k: v for k, v in m.metadata.items() if not k.startswith("ggmlpy.")}
        types = {k: v for k, v in m.metadata_types.items() if k in md}
        md.pop("general.name", None)
        if name is not None:
            md["general.name"] = name
        gguf_save(dst, dict(m.tensors), md, types=types)
    finally:
        m.free()
    return dst


@pytest.fixture(scope="module")
def files(model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("maxseq")
    own = Path(convert(model_dir, tmp / "own-f32.gguf", "f32")["path"])
    return {"own": own,
            "foreign": write_foreign_copy(own, tmp / "foreign.gguf", "bert-base-whatever"),
            "foreign_named": write_foreign_copy(own, tmp / "named.gguf", "All MiniLM L6 v2")}


def _long(m: BertModel, public: dict) -> np.ndarray:
    return m.encode([public["sentences"][LONG]])[0].astype(np.float64)


def test_model_dir_and_own_gguf_cut_at_the_published_256(model_dir, files, public):
    ref = np.asarray(public["embeddings"][LONG])
    for path, source, tol in ((model_dir, "sentence_bert_config.json", EMB_MAX_ABS),
                              (files["own"], "ggmlpy.max_seq_length", GGUF_EMB_MAX_ABS)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            m = BertModel.load(path)
        with m:
            assert m.max_seq_length == 256 and m.config.max_seq_length_source == source
            assert np.abs(_long(m, public) - ref).max() <= tol


def test_foreign_gguf_of_unknown_name_falls_back_to_512_with_a_warning(files, public):
    ref = np.asarray(public["embeddings"][LONG])
    with pytest.warns(TruncationFallbackWarning, match=r"cut at 512 tokens.*--max-seq-length"):
        m = BertModel.load(files["foreign"])
    with m:
        assert m.max_seq_length == 512
        ids, cut = m.token_ids_truncated([public["sentences"][LONG]])
        assert len(ids[0]) == public["untruncated_token_counts"][LONG] and cut == [False]
        got = _long(m, public)
        cos = got @ ref / np.linalg.norm(got) / np.linalg.norm(ref)
        assert cos < 0.999  # all 280 tokens pooled: not sentence-transformers' vector
        m.max_seq_length = 256  # settable, as SentenceTransformer.max_seq_length
        assert np.abs(_long(m, public) - ref).max() <= GGUF_EMB_MAX_ABS
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit limit: no warning
        m = BertModel.load(files["foreign"], max_seq_length=256)
    with m:
        assert m.config.max_seq_length_source == "max_seq_length argument"
        assert np.abs(_long(m, public) - ref).max() <= GGUF_EMB_MAX_ABS


def test_foreign_gguf_of_a_known_name_gets_its_published_limit(files, public):
    ref = np.asarray(public["embeddings"][LONG])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = BertModel.load(files["foreign_named"])
    with m:
        assert m.max_seq_length == 256
        assert m.config.max_seq_length_source == "known model name 'All MiniLM L6 v2'"
        assert np.abs(_long(m, public) - ref).max() <= GGUF_EMB_MAX_ABS


def test_fallback_rule():
    assert fallback_max_seq_length(["sentence-transformers/all-MiniLM-L6-v2"], 512)[0] == 256
    assert fallback_max_seq_length(["all-MiniLM-L6-v2"], 128)[0] == 128  # capped at the table
    assert fallback_max_seq_length(["bge-small"], 8192) == (512, "fallback min(bert.context_length, 512)")
    assert fallback_max_seq_length([], 384)[0] == 384


def test_truncation_flags_and_limits(model_dir, public):
    with BertModel.load(model_dir) as m:
        _, cut = m.token_ids_truncated(public["sentences"])
        assert cut == [n > 256 for n in public["untruncated_token_counts"]]
        with pytest.raises(ArgumentValueError, match=r"max_seq_length must be in 2\.\.512"):
            m.max_seq_length = 513
    with pytest.raises(ArgumentValueError, match=r"max_seq_length must be in 2\.\.512"):
        BertModel.load(model_dir, max_seq_length=1)


def test_cli_warns_for_a_foreign_gguf_and_ctx_size_fixes_it(files, public, capsys):
    from ggmlpy.models.cli import embed_main

    s = public["sentences"][LONG]
    ref = np.asarray(public["embeddings"][LONG])
    assert embed_main(["--model", str(files["foreign"]), "--json", "--no-progress", s]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert err.startswith("ggmlpy embed: warning: ") and "cut at 512 tokens" in err
    assert len(err.strip().splitlines()) == 1
    assert doc["max_seq_length"] == 512 and doc["truncated"] == [False]
    assert doc["max_seq_length_source"] == "fallback min(bert.context_length, 512)"
    for flag in ("-c", "--ctx-size", "--max-seq-length"):
        assert embed_main(["--model", str(files["foreign"]), "--json", "--no-progress",
                           flag, "256", s]) == 0
        out, err = capsys.readouterr()
        doc = json.loads(out)
        assert err == "" and doc["truncated"] == [True] and doc["n_tokens"] == [256]
        assert np.abs(np.asarray(doc["embeddings"][0]) - ref).max() <= GGUF_EMB_MAX_ABS
