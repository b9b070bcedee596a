"""MiniLM GGUF files against llama.cpp's embeddings of the same files (``tests/data/minilm_llamacpp.npz``,
made by ``scripts/make_minilm_llamacpp_reference.py`` with llama-cpp-python 0.3.36, CPU, 2 threads,
``embedding=True, pooling_type=1``; its ``meta`` field lists every setting).

Tolerances, from the measured distances on the 7 fixture sentences:

* f32 file: 3.9e-5 max abs with ggml's tanh GELU (the GGUF default, as llama.cpp's
  ``llm_build_bert``), 2.7e-4 with the exact erf GELU; held at 1.5e-4 (float32 summation order
  differs between BLAS and ggml-cpu's kernels; the GELU table rounds its input to f16, so an input
  one ulp apart can land on the neighbouring entry) and erf must stay farther than tanh.
* q8_0 file: 5.1e-3 max abs (2e-3 on 6 of the 7 sentences, the 3-token one averages fewest
  tokens), min cosine 0.99967. Both tools quantize the same activations with the same rounding
  (ggml-cpu's x86 ``quantize_row_q8_0``: fed llama.cpp's own input of block 0's attention output,
  ggmlpy reproduces llama.cpp's product to 3e-7), but the float32 ops before each quantized
  product (softmax, attention products, LayerNorm, the quantized GEMMs' own sums) are not
  ggml-cpu's bit for bit, and a 1e-7 difference flips an 8-bit rounding now and then; six layers
  amplify the flips to the size of the quantization noise itself (each tool is ~7e-3 from
  sentence-transformers). Held at 1e-2 max abs and cosine 0.9993.
* q8_0 file with ``GGMLPY_QUANT_MATMUL=dot`` (and Numba): every Q8_0 product on the dot kernels
  (ggml's per-output order), the float32 attention products, pooling and LayerNorm in ggml-cpu's
  order (``cpu.jit.mul_mat_f32``, ``cpu.jit.norm``): one sentence per batch 3e-8 (every tensor
  up to the last layer's output is llama.cpp's bit for bit; the one sequence's pooling product is
  2-D and stays on BLAS, then the final normalisation), the 7 sentences
  in one batch 2.7e-5 (padded to 52 tokens, the 28-token sentence's softmax rows take ggml's
  vector ``expf`` where llama.cpp's 28 columns took the scalar one). Held at 1e-6 and 1e-4.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from ggmlpy.backends.cpu import jit as cpu_jit  # noqa: E402
from ggmlpy.core import env  # noqa: E402
from ggmlpy.gguf.reader import GGUFReader  # noqa: E402
from ggmlpy.models.bert import BertModel  # noqa: E402
from ggmlpy.models.gguf_bert import convert  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "minilm_llamacpp.npz"


@pytest.fixture(scope="module")
def ref():
    d = np.load(DATA)
    return {k: d[k] for k in d.files}


@pytest.fixture(scope="module")
def files(model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf_ref")
    return {t: convert(model_dir, tmp / f"minilm-{t}.gguf", t)["path"] for t in ("f32", "q8_0")}


def _weights_sha256(path: str) -> str:
    h = hashlib.sha256()
    for rt in GGUFReader(path).tensors.values():
        h.update(rt.name.encode())
        h.update(np.ascontiguousarray(rt.little_endian()).view(np.uint8).tobytes())
    return h.hexdigest()


def _embed(path: str, sentences: list[str], **kw) -> tuple[np.ndarray, list[list[int]]]:
    with BertModel.load(path, n_threads=2, **kw) as m:
        return m.encode(sentences).astype(np.float64), m.token_ids(sentences)


def test_reference_header_names_the_tool_and_settings(ref):
    meta = json.loads(str(ref["meta"]))
    assert meta["tool"] == "llama-cpp-python" and meta["llama_cpp_python_version"] == "0.3.36"
    assert meta["pooling_type"] == 1 and meta["embedding"] and meta["flash_attn"] is False
    assert meta["n_threads"] == 2 and set(meta["files"]) == {"f32", "q8_0"}


@pytest.mark.parametrize("t", ["f32", "q8_0"])
def test_our_conversion_holds_the_reference_weights_and_ids(ref, files, t):
    assert _weights_sha256(files[t]) == str(ref[f"{t}_weights_sha256"]), \
        "convert now writes other weights: rerun scripts/make_minilm_llamacpp_reference.py"
    sentences = [str(s) for s in ref["sentences"]]
    with BertModel.load(files[t]) as m:
        ids = m.token_ids(sentences)
    assert ids == [[int(v) for v in row[row >= 0]] for row in ref[f"{t}_token_ids"]]


def test_f32_file_follows_llama_cpp_with_ggml_gelu(ref, files):
    sentences = [str(s) for s in ref["sentences"]]
    want = ref["f32_embeddings"].astype(np.float64)
    tanh, _ = _embed(files["f32"], sentences)  # the GGUF default: ggml_gelu
    erf, _ = _embed(files["f32"], sentences, gelu="erf")
    d_tanh, d_erf = np.abs(tanh - want).max(), np.abs(erf - want).max()
    assert d_tanh <= 1.5e-4
    assert d_erf > d_tanh


def test_q8_0_file_stays_near_llama_cpp(ref, files):
    sentences = [str(s) for s in ref["sentences"]]
    want = ref["q8_0_embeddings"].astype(np.float64)
    got, _ = _embed(files["q8_0"], sentences)
    assert np.abs(got - want).max() <= 1e-2
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.9993


def test_gelu_defaults_and_the_override_check(model_dir, files):
    from ggmlpy.core.check import ArgumentValueError
    from ggmlpy.models.gguf_bert import read_bert_gguf
    from ggmlpy.models.loader import BertConfig

    assert BertConfig.from_model_dir(model_dir).gelu == "erf"  # sentence-transformers' GELU
    assert read_bert_gguf(files["q8_0"])[0].gelu == "tanh"      # llama.cpp's ggml_gelu
    with pytest.raises(ArgumentValueError, match="gelu"):
        BertModel.load(files["q8_0"], gelu="exact")


@pytest.mark.skipif(not cpu_jit.available(), reason="ggml's float32 orders need Numba")
def test_q8_0_file_on_the_dot_kernels_is_llama_cpps(ref, files, monkeypatch):
    monkeypatch.setenv(env.QUANT_MATMUL, "dot")
    sentences = [str(s) for s in ref["sentences"]]
    want = ref["q8_0_embeddings"].astype(np.float64)
    with BertModel.load(files["q8_0"], n_threads=2) as m:
        batch = m.encode(sentences).astype(np.float64)
        one = np.stack([m.encode([s])[0] for s in sentences]).astype(np.float64)
    assert np.abs(one - want).max() <= 1e-6
    assert np.abs(batch - want).max() <= 1e-4
