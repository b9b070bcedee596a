"""The CPU's ggml-order variants against llama.cpp's own tensors (``tests/data/ggml_order_gemma3.npz``,
made by ``scripts/make_ggml_order_reference.py`` with llama-cpp-python 0.3.36 on the Gemma 3
270M Q4_K_M file, this x86-64 AVX-512 machine): layer 0 of a 9-token prompt and of the next
single token, bit for bit: KQ and KQV (F16 x F16: tinyBLAS for 9 rows, ``ggml_vec_dot_f16`` for
1), the masked softmax, the attention output projection (Q4_K, repacked: gemm for 8 rows, gemv
for the 9th and for 1) and ``ffn_down`` (Q6_K: the tiled kernel for 9 rows, the AVX2 vec_dot for
1; the first 64 of 640 weight rows are stored).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu import repack_q4k, sgemm_f16, soft_max_ggml, vec_dot_q6k

DATA = Path(__file__).resolve().parents[2] / "data" / "ggml_order_gemma3.npz"
F32 = np.float32
N_CELLS = 256        # llama.cpp's KV cells for these decodes (padded to 256)
pytestmark = pytest.mark.skipif(not cpu_jit.available(),
                                reason="the variants need Numba (the jit extra)")


@pytest.fixture(scope="module")
def ref():
    return np.load(DATA)


def _cache(rows: np.ndarray) -> np.ndarray:
    c = np.zeros((1, 1, N_CELLS, rows.shape[1]), np.float16)
    c[0, 0, :rows.shape[0]] = rows.astype(np.float16)
    return c


@pytest.mark.parametrize("sfx", ["_p", "_g"])
def test_attention_products_and_softmax_are_llamacpps(ref, sfx):
    q = ref["kq_in_q" + sfx]                              # (1, T, 4, 256)
    T = q.shape[1]
    qp = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).astype(np.float16)
    k = _cache(ref["k_cache" + sfx])
    kq = np.empty((1, 4, T, N_CELLS), F32)
    sgemm_f16.mul_mat_f16_step(k, qp, kq, sgemm_f16.uses_tinyblas(N_CELLS, T, 256))()
    np.testing.assert_array_equal(kq, ref["kq" + sfx])
    n_past = ref["k_cache" + sfx].shape[0] - T
    pos = n_past + np.arange(T)[:, None]
    mask = np.where(np.arange(N_CELLS)[None, :] <= pos, 0, -np.inf).astype(F32)[None, None]
    p = np.empty_like(kq)
    soft_max_ggml.soft_max_step(ref["kq" + sfx], mask, 1.0, p)()
    np.testing.assert_array_equal(p, ref["soft_max" + sfx])
    v = ref["v_cache" + sfx]
    vt = np.zeros((1, 1, 256, N_CELLS), np.float16)
    vt[0, 0, :, :v.shape[0]] = v.T.astype(np.float16)
    kqv = np.empty((1, 4, T, 256), F32)
    sgemm_f16.mul_mat_f16_step(vt, p.astype(np.float16), kqv,
                               sgemm_f16.uses_tinyblas(256, T, N_CELLS))()
    np.testing.assert_array_equal(kqv, ref["kqv" + sfx])


@pytest.mark.parametrize("sfx", ["_p", "_g"])
def test_kquant_products_are_llamacpps(ref, sfx):
    x = ref["attn_in" + sfx]
    N = x.shape[0]
    w = ref["w_attn_output"]
    d = np.empty((1, 1, N, w.shape[0]), F32)
    repack_q4k.mul_mat_q4k_step(w[None, None], x[None, None], d, N)()
    np.testing.assert_array_equal(d[0, 0], ref["attn_out" + sfx])
    x = ref["ffn_in" + sfx]
    w = ref["w_ffn_down"]
    d = np.empty((1, 1, N, w.shape[0]), F32)
    vec_dot_q6k.mul_mat_q6k_step(w[None, None], x[None, None], d, vec_dot_q6k.uses_tiled(N))()
    np.testing.assert_array_equal(d[0, 0], ref["ffn_out" + sfx])
    assert vec_dot_q6k.uses_tiled(N) == (sfx == "_p")
