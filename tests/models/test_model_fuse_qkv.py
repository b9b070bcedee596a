"""BertModel's fused query/key/value weights (``fuse_qkv``): one ``[H, 3H]`` weight and one GEMM
per layer instead of three, for every weight type the loader takes (F32 safetensors, GGUF F16 /
Q8_0, and a mixed-type GGUF file whose layers keep separate tensors where the types differ)."""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.backend.tensor_data import backend_tensor_get
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.models.bert import BertModel, _fuse_qkv
from ggmlpy.models.gguf_bert import TypedWeight

SENTENCES = ["ggml runs graphs", "a quick brown fox jumps over the lazy dog by the river bank",
             "NumPy runs arrays"]


def _layer_bytes(t):
    return np.asarray(backend_tensor_get(t)).reshape(-1).view(np.uint8)


def test_f32_fused_matches_separate_and_views_hold_the_weights(model_dir):
    from safetensors.numpy import load_file

    raw = load_file(str(model_dir / "model.safetensors"))
    with BertModel.load(model_dir=model_dir) as fused, \
            BertModel.load(model_dir=model_dir, fuse_qkv=False) as sep:
        a, b = fused.encode(SENTENCES), sep.encode(SENTENCES)
        # float32 sums of 384 products each way: the GEMM may block 3H rows differently
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        for il, (lf, ls) in enumerate(zip(fused.layers, sep.layers)):
            assert lf.wqkv is not None and lf.wqkv.ne[:2] == (384, 1152) and ls.wqkv is None
            assert lf.wq.view_src is lf.wqkv and lf.bv.view_src is lf.bqkv
            for name, t in (("query.weight", lf.wq), ("key.weight", lf.wk), ("value.weight", lf.wv),
                            ("query.bias", lf.bq), ("key.bias", lf.bk), ("value.bias", lf.bv)):
                want = raw[f"encoder.layer.{il}.attention.self.{name}"]
                np.testing.assert_array_equal(
                    np.asarray(backend_tensor_get(t)).reshape(want.shape), want)
        gf = next(iter(fused.cached_graphs.values()))
        gs = next(iter(sep.cached_graphs.values()))
        assert gf.n_nodes == gs.n_nodes - 4 * 6  # per layer: 3 GEMM + 3 bias adds -> 1 + 1


@pytest.fixture(scope="module")
def ggufs(model_dir, tmp_path_factory):
    pytest.importorskip("gguf")
    from ggmlpy.models.gguf_bert import convert

    tmp = tmp_path_factory.mktemp("gguf_qkv")
    return {s: convert(model_dir, tmp / f"minilm-{s}.gguf", s)["path"]
            for s in ("f16", "q8_0", "q4_k_m")}


@pytest.mark.parametrize("scheme", ["f16", "q8_0", "q4_k_m"])
def test_gguf_types_fuse_where_they_agree(ggufs, scheme):
    """Stacking rows of any ggml type stacks the matrices: fused and separate agree. Where a
    file gives Q, K and V different types (q4_k_m keeps some in Q6_K), that layer stays
    separate."""
    with BertModel.load(ggufs[scheme]) as fused, BertModel.load(ggufs[scheme], fuse_qkv=False) as sep:
        np.testing.assert_allclose(fused.encode(SENTENCES), sep.encode(SENTENCES), rtol=0, atol=1e-6)
        for lf, ls in zip(fused.layers, sep.layers):
            same = ls.wq.type == ls.wk.type == ls.wv.type
            assert (lf.wqkv is not None) == same
            if same:
                assert lf.wqkv.type == ls.wq.type
                for a, b in ((lf.wq, ls.wq), (lf.wk, ls.wk), (lf.wv, ls.wv)):
                    np.testing.assert_array_equal(_layer_bytes(a), _layer_bytes(b))
        if scheme != "q4_k_m":
            assert all(lf.wqkv is not None for lf in fused.layers)
        else:  # this file keeps V in Q8_0 beside Q5_0 Q and K: the separate path runs
            assert any(lf.wqkv is None for lf in fused.layers)


def _tw(t, ne, fill=0):
    return TypedWeight(t, ne, np.full(t.row_size(ne[0]) * int(np.prod(ne[1:])), fill, np.uint8))


@pytest.mark.parametrize("case, arrs", [
    ("F32 and GGUF mixed", [np.zeros((4, 4), np.float32)] * 2 + [_tw(Type.F32, (4, 4))]
     + [np.zeros(4, np.float32)] * 3),
    ("weight shapes differ", [np.zeros((4, 4), np.float32)] * 2 + [np.zeros((8, 4), np.float32)]
     + [np.zeros(4, np.float32)] * 3),
    ("weight types differ", [_tw(Type.Q8_0, (32, 4))] * 2 + [_tw(Type.F16, (32, 4))]
     + [_tw(Type.F32, (4,))] * 3),
    ("bias length differs from the rows", [np.zeros((4, 4), np.float32)] * 3
     + [np.zeros(5, np.float32)] * 3),
    ("float64 weights", [np.zeros((4, 4), np.float64)] * 3 + [np.zeros(4, np.float32)] * 3),
])
def test_fuse_refused_when_the_parts_differ(case, arrs):
    uploads = []
    names = [f"x.{a}.{b}" for b in ("weight", "bias") for a in ("query", "key", "value")]
    assert _fuse_qkv(Context(), arrs, names, uploads) is None, case
    assert uploads == []


def test_fuse_stacks_rows_in_order():
    rng = np.random.default_rng(0)
    w = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3)]   # [out=3, in=5]
    b = [rng.standard_normal(3).astype(np.float32) for _ in range(3)]
    uploads = []
    names = [f"x.{a}.{k}" for k in ("weight", "bias") for a in ("query", "key", "value")]
    (wqkv, bqkv), views = _fuse_qkv(Context(), w + b, names, uploads)
    assert wqkv.ne[:2] == (5, 9) and bqkv.ne[0] == 9
    np.testing.assert_array_equal(uploads[0][1], np.concatenate(w).reshape(-1))
    np.testing.assert_array_equal(uploads[1][1], np.concatenate(b))
    assert [v.name for v in views] == names
    assert [v.view_offs for v in views] == [0, 60, 120, 0, 12, 24]
