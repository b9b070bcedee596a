"""The decoder LLM on tiny random-weight GGUF files of every architecture, against the float64
NumPy reference (:mod:`ggmlpy.models.llm.reference`) and against itself across devices.

The files (:func:`ggmlpy.models.llm.tiny.write_tiny_gguf`) hold the real model's tensor types
(Q8_0 embeddings, Q5_0/Q8_0 projections, Q4_K attention output, Q6_K FFN down, F32 norms); the
reference dequantizes the same bytes, so only float32 arithmetic separates the two. Tolerance
``ATOL`` = 5e-5 on logits of magnitude ~4: float32 rounding through 2-7 blocks of sums of at
most 256 products, softmax and RMS norms (the observed error is ~3e-6).

The comparisons with the reference run MUL_MAT on its exact path (``GGMLPY_QUANT_MATMUL=dequant``:
dequantized weights, float32 activations), which is what the reference computes in float64. The
default path rounds the activations to 8 bits before each quantized product, as ggml-cpu does
(bit-exact with ggml's ``vec_dot``: tests/quants/test_quant_dot.py);
:func:`test_default_path_tracks_the_reference` bounds its distance to the exact logits.

The gemma3 file has 7 blocks (block 5 global, the others sliding-window) and a window of 8
tokens, so 20-token sequences exercise the window mask; micro-batches of 8 tokens exercise the
micro-batched prompt and KV reads across batches.
"""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.backends.sim import sim_reg
from ggmlpy.core.types import Type
from ggmlpy.models.llm.model import LLM
from ggmlpy.models.llm.reference import forward, load_weights_f64
from ggmlpy.models.llm.tiny import write_tiny_gguf

ATOL = 5e-5
ARCHS = ("gemma3", "llama", "qwen2")
TOKENS = [2, 17, 200, 45, 45, 9, 133, 250, 4, 78, 101, 3, 66, 190, 7, 7, 31, 222, 12, 5]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """arch -> (path, float64 reference logits of TOKENS (T, n_vocab))."""
    out = {}
    d = tmp_path_factory.mktemp("tiny_llm")
    for arch in ARCHS:
        p = d / f"tiny_{arch}.gguf"
        write_tiny_gguf(p, arch, seed=3)
        hp, w = load_weights_f64(str(p))
        out[arch] = (p, forward(hp, w, TOKENS))
    return out


#: the reference's cache: F32 (the default F16 cache rounds K and V: test_f16_cache_stays_close)
F32_CACHE = {"type_k": Type.F32, "type_v": Type.F32}


@pytest.fixture(autouse=True)
def exact_matmul(monkeypatch):
    """The reference's maths: the exact dequantize-then-GEMM MUL_MAT and the exact GELU instead of
    ggml-cpu's f16 table (both read when plans are built)."""
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "dequant")
    monkeypatch.setenv("GGMLPY_PRECISE_KERNELS", "1")


@pytest.fixture(scope="module")
def sim0():
    return sim_reg(1, latency_us=0.0).devices[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_all_logits_match_the_float64_reference(files, arch):
    path, ref = files[arch]
    with LLM.load(path, n_ubatch=8, n_ctx=64, **F32_CACHE) as m:
        lg = m.eval(TOKENS, all_logits=True)
    assert lg.shape == ref.shape and lg.dtype == np.float32
    np.testing.assert_allclose(lg, ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_default_path_tracks_the_reference(files, arch, monkeypatch):
    """ggml's numerics, the defaults: every activation row feeding a quantized weight is rounded
    to Q8_0/Q8_K blocks (a step of max|x|/127 per block of 32 or 256), GELU read from ggml-cpu's
    f16 table (2**-11 relative steps), K and V (and, without flash attention, Q and the softmax
    probabilities) rounded to f16, so the logits move away from the exact ones by a few q8 steps
    through 2-7 blocks: observed at most 0.094 on logits of magnitude ~4; the bound 0.25 is 2.5
    times that, while a wrong kernel (a mis-decoded block) gives errors of the order of the
    logits themselves."""
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "ggml")
    monkeypatch.delenv("GGMLPY_PRECISE_KERNELS")
    path, ref = files[arch]
    for fa in (True, False):
        with LLM.load(path, n_ubatch=8, n_ctx=64, flash_attn=fa) as m:
            lg = m.eval(TOKENS, all_logits=True)
        err = np.abs(lg - ref).max()
        assert 0 < err <= 0.25, (fa, err)
        assert (lg.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.9


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decode_equals_the_full_evaluation(files, arch):
    """A 13-token prompt (two micro-batches), then one token per step: each step's logits are the
    reference's row at that position; only the prompt's last row is computed."""
    path, ref = files[arch]
    with LLM.load(path, n_ubatch=8, n_ctx=64, **F32_CACHE) as m:
        last = m.eval(TOKENS[:13])
        assert last.shape == (ref.shape[1],) and m.n_past == 13
        np.testing.assert_allclose(last, ref[12], rtol=0, atol=ATOL)
        for i in range(13, len(TOKENS)):
            np.testing.assert_allclose(m.eval([TOKENS[i]]), ref[i], rtol=0, atol=ATOL,
                                       err_msg=f"decode step at position {i}")
        assert m.n_past == len(TOKENS)


def test_truncate_and_clear(files):
    path, ref = files["gemma3"]
    other = [11, 12, 13, 14]
    with LLM.load(path, n_ubatch=8, n_ctx=64, **F32_CACHE) as m:
        m.eval(TOKENS[:12])
        m.truncate(8)                      # drop positions 8..11 (llama_memory_seq_rm)
        assert m.n_past == 8
        got = m.eval(other, all_logits=True)
        hp, w = load_weights_f64(str(path))
        want = forward(hp, w, TOKENS[:8] + other)[8:]
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
        m.clear()
        assert m.n_past == 0
        np.testing.assert_allclose(m.eval(TOKENS[:5]), ref[4], rtol=0, atol=ATOL)
        with pytest.raises(ValueError, match="truncate"):
            m.truncate(6)


def test_decode_steps_reuse_one_graph_and_the_split(files):
    """Decode graphs keep their shape while the cache length stays within one 256-cell pad:
    no graph is built after the first decode step and the scheduler replays its split."""
    path, _ = files["llama"]
    with LLM.load(path, n_ctx=512) as m:
        m.eval(TOKENS)
        m.eval([5])
        builds, hits = m.n_graph_builds, m.sched.reuse.hits
        for t in range(20):
            m.eval([t + 4])
        assert m.n_graph_builds == builds
        assert m.sched.reuse.hits - hits == 20


def test_generate_greedy_is_the_arg_max_chain(files):
    path, _ = files["qwen2"]
    hp, w = load_weights_f64(str(path))
    prompt = TOKENS[:6]
    seq, want = list(prompt), []
    for _ in range(5):
        t = int(np.argmax(forward(hp, w, seq)[-1]))
        want.append(t)
        seq.append(t)
    with LLM.load(path, n_ctx=64) as m:
        assert list(m.generate(prompt, 5)) == want
        m.clear()
        s = want[2]
        assert list(m.generate(prompt, 5, stop={s})) == want[:want.index(s) + 1]
        # a str prompt goes through the file's tokenizer (BOS + byte-fallback ids here)
        ids = m.tokenizer.encode("hi!")
        assert ids[0] == 2 and len(ids) > 1
        m.clear()
        from_text = list(m.generate("hi!", 3))
        m.clear()
        assert from_text == list(m.generate(ids, 3))
        with pytest.raises(TypeError, match="sampler"):
            next(m.generate(prompt, 3, sampler=5))


def test_two_sim_devices_share_the_blocks(files):
    """Two devices: the 7 offloaded blocks in chunks of 4 and 3 (llama.cpp's layer split), the
    output layer on the last device; pipelined micro-batches cross both."""
    path, ref = files["gemma3"]
    reg = sim_reg(2, latency_us=0.0)
    with LLM.load(path, device=list(reg.devices), n_gpu_layers=-1, n_ubatch=8, n_ctx=64,
                  parallel=True, **F32_CACHE) as m:
        bufts = [b.get_default_buffer_type() for b in m._backends[:2]]
        assert [bufts.index(m.kv.k[il].buffer.buft) for il in range(7)] == [0] * 4 + [1] * 3
        assert m.output.buffer.buft is bufts[1]
        np.testing.assert_allclose(m.eval(TOKENS, all_logits=True), ref, rtol=0, atol=ATOL)


@pytest.mark.parametrize("ngl, parallel", [(3, False), (-1, False), (3, True), (-1, True)])
def test_sim_offload_matches_the_reference(files, sim0, ngl, parallel):
    """``-ngl 3``: blocks 4-6 and their KV cache on SIM0, the output layer on the CPU; ``-1``:
    everything on SIM0, the output a device copy of the tied ``token_embd``; ``parallel``
    pipelines the 8-token micro-batches."""
    path, ref = files["gemma3"]
    with LLM.load(path, device=sim0, n_gpu_layers=ngl, n_ubatch=8, n_ctx=64,
                  parallel=parallel, **F32_CACHE) as m:
        sim_buft = m._backends[0].get_default_buffer_type()
        n_layer = m.hp.n_layer
        first_dev = n_layer - (n_layer if ngl == -1 else ngl)
        for il in range(n_layer):
            on_dev = m.kv.k[il].buffer.buft is sim_buft
            assert on_dev == (il >= first_dev), il
        assert (m.output.buffer.buft is sim_buft) == (ngl == -1)
        lg = m.eval(TOKENS[:13], all_logits=True)
        np.testing.assert_allclose(lg, ref[:13], rtol=0, atol=ATOL)
        for i in range(13, 16):
            np.testing.assert_allclose(m.eval([TOKENS[i]]), ref[i], rtol=0, atol=ATOL)


def test_f16_cache_stays_close(files):
    """An F16 KV cache (llama.cpp's default) rounds K and V to 11 significant bits: logits stay
    within 2e-2 of the float64 reference (K/V values of magnitude ~1 off by <= 2^-11 relative,
    through 7 blocks)."""
    path, ref = files["gemma3"]
    with LLM.load(path, n_ctx=64, type_k=Type.F16, type_v=Type.F16) as m:
        assert m.kv.k[0].type == Type.F16
        lg = m.eval(TOKENS, all_logits=True)
    err = np.abs(lg - ref).max()
    assert err < 2e-2
    assert err > 0  # the rounding is really there (an F32 cache would be ~3e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_without_flash_attn_matches_the_reference(files, arch):
    """``flash_attn=False``: llama.cpp's ``-fa off`` graph (KQ mul_mat, soft_max_ext, KQV mul_mat
    of the transposed V) over an F32 cache is the same float32 maths, prompt and decode steps."""
    path, ref = files[arch]
    with LLM.load(path, n_ubatch=8, n_ctx=64, flash_attn=False, **F32_CACHE) as m:
        assert not m.flash_attn
        ops_seen = {n.op.name for n in m._graph_for(1, m.kv.n_kv(1), 1).graph.nodes}
        assert "FLASH_ATTN_EXT" not in ops_seen and "SOFT_MAX" in ops_seen
        np.testing.assert_allclose(m.eval(TOKENS[:13], all_logits=True), ref[:13], rtol=0,
                                   atol=ATOL)
        for i in range(13, 16):
            np.testing.assert_allclose(m.eval([TOKENS[i]]), ref[i], rtol=0, atol=ATOL)


def test_attention_without_flash_attn_on_a_sim_device(files, sim0):
    """The same graph with every block on a SIM device, pipelined micro-batches, an F16 cache:
    the device computes the casts and products with the CPU's kernels, so the logits are the
    CPU's, bit for bit."""
    path, _ = files["gemma3"]
    with LLM.load(path, n_ubatch=8, n_ctx=64, flash_attn=False) as m:
        want = m.eval(TOKENS, all_logits=True)
    with LLM.load(path, device=sim0, n_gpu_layers=-1, n_ubatch=8, n_ctx=64, flash_attn=False,
                  parallel=True) as m:
        np.testing.assert_array_equal(m.eval(TOKENS, all_logits=True), want)


def test_f16_cache_without_flash_attn_rounds_q_and_probabilities(files):
    """With an F16 cache and ``flash_attn=False``, Q and the softmax probabilities are rounded to
    f16 before their products (ggml-cpu's ``vec_dot_type`` of F16): the graph holds those casts,
    the logits differ from the fused attention's over the same cache, and stay within the same
    2e-2 of the float64 reference as the cache rounding alone (2**-11 relative per value)."""
    path, ref = files["gemma3"]
    with LLM.load(path, n_ctx=64) as m:                       # defaults: F16 cache, fused
        assert m.flash_attn and m.kv.k[0].type == Type.F16 and m.kv.v[0].type == Type.F16
        fused = m.eval(TOKENS, all_logits=True)
    with LLM.load(path, n_ctx=64, flash_attn=False) as m:
        casts = [n for n in m._graph_for(1, m.kv.n_kv(1), 1).graph.nodes
                 if n.op.name == "CPY" and n.type == Type.F16 and "cache" not in n.name]
        assert len(casts) == 2 * m.hp.n_layer                # Q and the probabilities, per block
        split = m.eval(TOKENS, all_logits=True)
    assert np.abs(split - fused).max() > 0
    assert np.abs(split - ref).max() < 2e-2


def test_load_and_eval_errors(files):
    path, _ = files["llama"]
    with pytest.raises(ValueError, match="n_gpu_layers"):
        LLM.load(path, n_gpu_layers=5)
    with pytest.raises(ValueError, match="type_k"):
        LLM.load(path, type_k=Type.Q8_0)
    with pytest.raises(TypeError, match="flash_attn"):
        LLM.load(path, flash_attn="off")
    with LLM.load(path, n_ctx=256) as m:
        with pytest.raises(ValueError, match="0..319"):
            m.eval([320])
        with pytest.raises(ValueError, match="non-empty"):
            m.eval([])
        with pytest.raises(TypeError, match="ints"):
            m.eval([1.5])
        with pytest.raises(ValueError, match="exceed the context"):
            m.eval(list(range(200)) + list(range(57)))
    with pytest.raises(ValueError, match="closed"):
        m.eval([1])


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_ray_offload_matches_the_reference(files, ray_reg2, monkeypatch):
    """The last block and its KV cache on a RAY device (a Ray actor): the cache's SET_ROWS
    writes and the attention's reads of it happen in the actor's memory across steps. The actor
    reads the ``GGMLPY_*`` settings of its own process (the environment Ray started with, here
    the default MUL_MAT path), so the comparison is with the CPU on that same path."""
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "ggml")
    monkeypatch.delenv("GGMLPY_PRECISE_KERNELS")
    path, _ = files["llama"]
    with LLM.load(path, n_ubatch=8, n_ctx=64) as m:
        want = m.eval(TOKENS[:10], all_logits=True)
        steps = [m.eval([TOKENS[i]]) for i in range(10, 13)]
    with LLM.load(path, device=ray_reg2.devices[0], n_gpu_layers=1, n_ubatch=8,
                  n_ctx=64) as m:
        assert m.devices[0].startswith("RAY")
        lg = m.eval(TOKENS[:10], all_logits=True)
        np.testing.assert_allclose(lg, want, rtol=0, atol=ATOL)
        for i, w in zip(range(10, 13), steps):
            np.testing.assert_allclose(m.eval([TOKENS[i]]), w, rtol=0, atol=ATOL)


def test_gemma3_without_a_global_layer(tmp_path):
    """A gemma3 model of 3 blocks has only sliding-window layers (every 6th is global): no node
    reads the global mask, so the graph has none (it used to be an unallocated input the step
    wrote: NotAllocatedError)."""
    import dataclasses

    from ggmlpy.models.llm.tiny import TINY

    cfg = dataclasses.replace(TINY["gemma3"], n_layer=3)
    p = tmp_path / "gemma3_3_layers.gguf"
    write_tiny_gguf(p, "gemma3", seed=5, config=cfg)
    hp, w = load_weights_f64(str(p))
    ref = forward(hp, w, TOKENS)
    with LLM.load(p, n_ubatch=8, n_ctx=64, **F32_CACHE) as m:
        lg = m.eval(TOKENS, all_logits=True)
    np.testing.assert_allclose(lg, ref, rtol=0, atol=ATOL)
