"""``BertModel.encode`` with sentence-transformers' arguments and results, and
``BertModel.similarity``; every value is checked against the sentence-transformers fixture
(``minilm_public.json``: ``model.encode(sentences, normalize_embeddings=True)``) or a float64
NumPy formula over it.

Tolerance: 1e-5 per element, as tests/models/test_model_bert.py (an exact float32 path lands at
~5e-7; only the float32 summation order differs from PyTorch)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggmlpy.core.check import ArgumentValueError

pytestmark = pytest.mark.model

EMB_MAX_ABS = 1e-5


@pytest.fixture(scope="module")
def public(fixtures_dir: Path) -> dict:
    with open(fixtures_dir / "minilm_public.json", encoding="utf-8") as f:
        d = json.load(f)
    d["ref"] = np.asarray(d["embeddings"], np.float64)
    return d


@pytest.fixture(scope="module")
def model(model_dir: Path):
    from ggmlpy.models.bert import BertModel

    m = BertModel.load(model_dir, max_batch=8)
    yield m
    m.close()


def test_a_single_string_gives_one_vector(model, public):
    v = model.encode(public["sentences"][0])
    assert v.shape == (384,) and v.dtype == np.float32
    assert np.abs(v - public["ref"][0]).max() <= EMB_MAX_ABS


def test_list_and_numpy_forms(model, public):
    s = public["sentences"][:3]
    arr = model.encode(s, batch_size=2)
    assert isinstance(arr, np.ndarray) and arr.shape == (3, 384)
    rows = model.encode(s, convert_to_numpy=False)
    assert isinstance(rows, list) and [r.shape for r in rows] == [(384,)] * 3
    np.testing.assert_allclose(np.stack(rows), public["ref"][:3], rtol=0, atol=EMB_MAX_ABS)


def test_truncate_dim_then_normalize_as_sentence_transformers(model, public):
    s, ref = public["sentences"], public["ref"]
    cut = model.encode(s, truncate_dim=64)
    np.testing.assert_allclose(cut, ref[:, :64], rtol=0, atol=EMB_MAX_ABS)  # cut, not renormalised
    cut_n = model.encode(s, truncate_dim=64, normalize_embeddings=True)
    want = ref[:, :64] / np.linalg.norm(ref[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(cut_n, want, rtol=0, atol=5e-5)  # 1/|x[:64]| ~ 1.5-3 amplifies
    np.testing.assert_allclose(np.linalg.norm(cut_n.astype(np.float64), axis=1), 1.0, atol=1e-6)


def test_token_embeddings_pool_to_the_sentence_embedding(model, public):
    s, ids, ref = public["sentences"], public["token_ids"], public["ref"]
    toks = model.encode(s, output_value="token_embeddings")
    assert [t.shape for t in toks] == [(len(i), 384) for i in ids]  # real tokens only, [CLS]..[SEP]
    # sentence-transformers' pipeline: mean over the tokens, then Normalize
    pooled = np.stack([t.astype(np.float64).mean(0) for t in toks])
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    np.testing.assert_allclose(pooled, ref, rtol=0, atol=EMB_MAX_ABS)
    one = model.encode(s[1], output_value="token_embeddings")
    # hidden states of magnitude 1-10: a batch of one blocks its GEMMs differently (float32)
    np.testing.assert_allclose(one, toks[1], rtol=0, atol=1e-5)
    assert np.linalg.norm(toks[0][0]) > 2  # hidden states, not unit vectors


def test_prompt_is_put_before_every_sentence(model):
    got = model.encode(["a cat", "a dog"], prompt="query: ")
    want = model.encode(["query: a cat", "query: a dog"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    model.prompts["query"] = "query: "
    try:
        np.testing.assert_allclose(model.encode(["a cat", "a dog"], prompt_name="query"), want,
                                   rtol=0, atol=1e-6)
    finally:
        model.prompts.clear()
    with pytest.raises(ArgumentValueError, match="prompt_name 'nope' is not one of"):
        model.encode(["x"], prompt_name="nope")


def test_max_tokens_bounds_each_graph_run_and_keeps_the_values(model, public):
    s, ref = public["sentences"], public["ref"]
    model._graphs.clear()
    got = model.encode(s, batch_size=8, max_tokens=64)
    np.testing.assert_allclose(got, ref, rtol=0, atol=EMB_MAX_ABS)
    longest = max(len(i) for i in public["token_ids"])
    for n_seq, length in model._graphs:
        assert n_seq == 1 or n_seq * length <= 64 + 8 * n_seq, (n_seq, length)  # + bucket padding
    assert any(n_seq == 1 and length >= longest for n_seq, length in model._graphs)


def test_similarity_functions(model, public):
    ref = public["ref"]
    e = model.encode(public["sentences"])
    x = e.astype(np.float64)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    sim = model.similarity(e, e)
    assert sim.shape == (8, 8) and sim.dtype == np.float32
    np.testing.assert_allclose(sim, (ref / np.linalg.norm(ref, axis=1, keepdims=True)) @
                               (ref / np.linalg.norm(ref, axis=1, keepdims=True)).T, atol=2e-5)
    np.testing.assert_allclose(model.similarity(e[0], e[1:3]), xn[:1] @ xn[1:3].T, atol=1e-6)
    try:
        model.similarity_fn_name = "dot"
        np.testing.assert_allclose(model.similarity(e, e), x @ x.T, atol=1e-6)
        model.similarity_fn_name = "euclidean"
        want = -np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
        np.testing.assert_allclose(model.similarity(e, e), want, atol=1e-5)
        model.similarity_fn_name = "manhattan"
        np.testing.assert_allclose(model.similarity(e, e),
                                   -np.abs(x[:, None, :] - x[None, :, :]).sum(-1), atol=1e-4)
        model.similarity_fn_name = "jaccard"
        with pytest.raises(ValueError, match="jaccard"):
            model.similarity(e, e)
    finally:
        model.similarity_fn_name = "cosine"
    with pytest.raises(ValueError, match="same dim"):
        model.similarity(e, e[:, :10])


@pytest.mark.parametrize("kw, needle", [
    ({"output_value": None}, "output_value"),
    ({"output_value": "cls"}, "output_value must be 'sentence_embedding'"),
    ({"precision": "int8"}, "precision must be 'float32'"),
    ({"convert_to_tensor": True}, "convert_to_tensor must be False"),
    ({"truncate_dim": 0}, "truncate_dim must be in 1..384"),
    ({"truncate_dim": 385}, "truncate_dim must be in 1..384"),
    ({"max_tokens": 0}, "max_tokens must be >= 1"),
])
def test_bad_arguments_are_named(model, kw, needle):
    with pytest.raises((TypeError, ValueError), match=needle):
        model.encode(["x"], **kw)
