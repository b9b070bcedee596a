"""What ``LLM.load`` prepares before the first ``eval``: the CPU's weights read in place from the
file's read-only map (``use_mmap``, llama.cpp's default), compute buffers reserved for a full
micro-batch (llama.cpp's ``graph_reserve``), and a two-token warm-up decode (llama.cpp's
``common_init_from_params``) that leaves the sequence empty.

On the tiny gemma3 file of :mod:`ggmlpy.models.llm.tiny`, against the float64 reference of
:mod:`ggmlpy.models.llm.reference` (``ATOL`` as in test_llm_tiny.py: float32 rounding on logits of
magnitude ~4, observed ~3e-6) with the exact dequantize-then-GEMM MUL_MAT, the precise kernels
and an F32 cache.
"""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.core.types import Type
from ggmlpy.gguf.reader import GGUFReader
from ggmlpy.models.llm import model as model_mod
from ggmlpy.models.llm.model import LLM
from ggmlpy.models.llm.reference import forward, load_weights_f64
from ggmlpy.models.llm.tiny import write_tiny_gguf

ATOL = 5e-5
#: the reference's arithmetic: an F32 cache (whatever the default cache type)
F32_KV = dict(n_ubatch=8, n_ctx=64, type_k=Type.F32, type_v=Type.F32)
TOKENS = [2, 17, 200, 45, 45, 9, 133, 250, 4, 78, 101, 3]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(path, float64 reference logits of TOKENS (T, n_vocab))."""
    p = tmp_path_factory.mktemp("llm_load") / "tiny_gemma3.gguf"
    write_tiny_gguf(p, "gemma3", seed=3)
    hp, w = load_weights_f64(str(p))
    return p, forward(hp, w, TOKENS)


@pytest.fixture(autouse=True)
def exact_kernels(monkeypatch):
    """The reference's arithmetic: the exact dequantize-then-GEMM MUL_MAT and the precise
    kernels (read when plans are built)."""
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "dequant")
    monkeypatch.setenv("GGMLPY_PRECISE_KERNELS", "1")


def test_mapped_weights_are_the_files_bytes_read_in_place(gemma):
    path, ref = gemma
    reader = GGUFReader(path)
    with LLM.load(path, **F32_KV) as mapped, \
            LLM.load(path, use_mmap=False, **F32_KV) as copied:
        for m, buft in ((mapped, "CPU_Mapped"), (copied, "CPU")):
            for t in (m.tok_embd, m.layers[0].wq, m.layers[-1].w_down, m.output_norm):
                assert t.buffer.name == buft, t.name
                got = backend_tensor_get(t).reshape(-1).view(np.uint8)
                np.testing.assert_array_equal(got, reader.tensors[t.name].data.reshape(-1),
                                              err_msg=t.name)
        with pytest.raises(ValueError, match="read-only"):
            backend_tensor_set(mapped.layers[0].attn_norm, np.zeros(mapped.hp.n_embd, np.float32))
        a = mapped.eval(TOKENS, all_logits=True)
        b = copied.eval(TOKENS, all_logits=True)
    np.testing.assert_array_equal(a, b)  # the same kernels on the same bytes
    np.testing.assert_allclose(a, ref, rtol=0, atol=ATOL)


def test_load_reserves_a_full_micro_batch_and_warms_up_without_a_trace(gemma):
    """After load: the sequence is empty, one graph is cached (the reserved micro-batch; the
    warm-up's is not kept), the first eval matches the reference, and neither a full
    micro-batch nor a decode step grows a compute buffer."""
    path, ref = gemma
    with LLM.load(path, **F32_KV) as m:
        cpu = m.sched.backends[-1]
        size = m.sched.get_buffer_size(cpu)
        assert size > 0 and m.n_past == 0 and m.n_graph_builds == 1
        np.testing.assert_allclose(m.eval(TOKENS[:8]), ref[7], rtol=0, atol=ATOL)  # a full one
        for i in range(8, len(TOKENS)):
            np.testing.assert_allclose(m.eval([TOKENS[i]]), ref[i], rtol=0, atol=ATOL)
        assert m.sched.get_buffer_size(cpu) == size


def test_the_warm_up_evaluates_bos_eos_with_the_first_vocabulary_entries(gemma, monkeypatch):
    """The warm-up computes BOS, EOS at positions 0-1 with the logits of the first
    WARM_UP_VOCAB entries only (they are the reference's for that sequence) and leaves the
    sequence empty."""
    path, _ = gemma
    monkeypatch.setattr(model_mod, "WARM_UP_VOCAB", 40)
    with LLM.load(path, **F32_KV) as m:
        tok = m.tokenizer
        hp, w = load_weights_f64(str(path))
        want = forward(hp, w, [tok.bos_id, tok.eos_id])[-1]
        m.eval(TOKENS[:3])
        builds = m.n_graph_builds
        got = m._warm_up()
        assert got.shape == (40,) and got.dtype == np.float32
        np.testing.assert_allclose(got, want[:40], rtol=0, atol=ATOL)
        assert m.n_past == 0 and m.n_graph_builds == builds  # not a cached graph
