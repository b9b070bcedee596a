"""The CPU's F32 x F32 MUL_MAT variant and ggml-order NORM against llama.cpp's own MiniLM tensors
(``tests/data/minilm_ggml_order.npz``, made by ``scripts/make_minilm_ggml_order_reference.py``
with llama-cpp-python 0.3.36 on the q8_0 GGUF, this x86-64 AVX-512 machine; its docstring lists
every field): layer 0 of 32, 52 and 70-token encodes, bit for bit: K*Q (permuted views:
``ggml_vec_dot_f32``, all 32 products in its scalar tail), KQV (``cont(V^T)`` by the softmax:
tinyBLAS at 32 columns, ``ggml_vec_dot_f32``'s tail at 52, its 64-wide fused part and a tail at
70), the mean pooling's one-column product and the first LayerNorm (``ggml_norm``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu import sgemm_f32

DATA = Path(__file__).resolve().parents[2] / "data" / "minilm_ggml_order.npz"
F32 = np.float32
pytestmark = pytest.mark.skipif(not cpu_jit.available(),
                                reason="the variants need Numba (the jit extra)")


@pytest.fixture(scope="module")
def ref():
    return np.load(DATA)


def test_reference_header(ref):
    meta = json.loads(str(ref["meta_json"]))
    assert meta["tool"] == "llama-cpp-python" and meta["llama_cpp_python_version"] == "0.3.36"
    assert meta["n_threads"] == 2 and meta["flash_attn"] is False and meta["pooling_type"] == 1


@pytest.mark.parametrize("T", [32, 52, 70])
def test_attention_products_are_llamacpps(ref, T):
    q, k = ref[f"q_{T}"], ref[f"k_{T}"]                           # (T, heads, 32)
    nh = q.shape[1]
    qp = q.transpose(1, 0, 2)[None]                               # permuted views, as ggml's
    kp = k.transpose(1, 0, 2)[None]
    kq = np.empty((1, nh, T, T), F32)
    sgemm_f32.mul_mat_f32_step(kp, qp, kq, sgemm_f32.uses_tinyblas(T, T, 32, False))()
    np.testing.assert_array_equal(kq[0], ref[f"kq_{T}"])
    vt, p = ref[f"v_cont_{T}"][None], ref[f"soft_max_{T}"][None]  # (1, heads, 32, T), (.., T, T)
    tiny = sgemm_f32.uses_tinyblas(32, T, T, True)
    assert tiny == (T % 16 == 0)
    kqv = np.empty((1, nh, T, 32), F32)
    sgemm_f32.mul_mat_f32_step(vt, p, kqv, tiny)()
    np.testing.assert_array_equal(kqv[0], ref[f"kqv_{T}"])
    other = np.empty_like(kqv)
    if tiny:   # the other order gives other bits: the test tells the two apart
        sgemm_f32.mul_mat_f32_step(vt, p, other, False)()
        assert not np.array_equal(other, kqv)


@pytest.mark.parametrize("T", [32, 52, 70])
def test_pooling_and_layer_norm_are_llamacpps(ref, T):
    x = ref[f"pool_in_{T}"]                                       # (rows, T): x^T
    mean = np.full((1, 1, 1, T), F32(1.0) / F32(T), F32)
    out = np.empty((1, 1, 1, x.shape[0]), F32)
    sgemm_f32.mul_mat_f32_step(x[None, None], mean, out, sgemm_f32.uses_tinyblas(
        x.shape[0], 1, T, True))()
    np.testing.assert_array_equal(out.reshape(-1), ref[f"pool_out_{T}"])
    y = np.empty_like(ref[f"norm_in_{T}"])
    cpu_jit.norm(ref[f"norm_in_{T}"], 1e-12, y)
    np.testing.assert_array_equal(y, ref[f"norm_out_{T}"])
