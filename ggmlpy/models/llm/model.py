"""Text generation from a llama.cpp decoder GGUF (gemma3, llama, qwen2) as ggml graphs.

:class:`LLM` loads a GGUF file (:mod:`.gguf_file`), places its tensors the way llama.cpp's
``-ngl`` does (the last ``n_gpu_layers`` blocks and their KV cache on the device, the output
layer with them when every block is offloaded, the token embeddings on the CPU), builds each
micro-batch's graph following llama.cpp's ``llm_build_<arch>`` (:mod:`.arch` holds the
per-architecture rules) and runs it with the multi-backend :class:`~ggmlpy.sched.Scheduler`.

Graph of a micro-batch of ``T`` tokens reading ``n_kv`` cache cells and producing ``n_out``
rows of logits (ggml ``ne`` order; NumPy shapes are the reverse):

* inputs (``set_input``): ``inp_tokens`` I32 ``[T]``, ``inp_pos`` I32 ``[T]``, ``inp_kv_idxs``
  I64 ``[T]`` (the cells the tokens' K/V rows go to: their positions), ``inp_kq_mask`` F32
  ``[n_kv, T]`` (0 where query ``i`` sees cell ``c``: ``c <= pos_i``; ``-inf`` elsewhere), and
  ``inp_kq_mask_swa`` for sliding-window layers (also ``-inf`` where ``pos_i - c >= n_swa``),
  ``inp_out_ids`` I32 ``[n_out]`` when ``n_out < T`` (llama.cpp's ``inp_out_ids``: only the
  last token's logits during prompt processing);
* ``x = get_rows(token_embd, inp_tokens)`` ``[n_embd, T]`` (times ``sqrt(n_embd)`` for gemma);
* per block: ``rms_norm`` * ``attn_norm``; Q/K/V ``mul_mat`` (+ biases) reshaped to
  ``[head_dim, n_head(_kv), T]``; gemma: per-head ``rms_norm`` * ``attn_q_norm``/``attn_k_norm``;
  ``rope_ext`` (the architecture's mode, the layer's base); K and V written into the cache with
  SET_ROWS at ``inp_kv_idxs`` (:meth:`~.kv_cache.KVCache.store`, expanded into the graph before
  the attention); the attention over ``K[:n_kv]``, ``V[:n_kv]`` with scale ``1/sqrt(head_dim)``
  (:func:`~.attention.build_attn`: ``flash_attn_ext``, or with ``flash_attn=False`` llama.cpp's
  ``mul_mat`` / ``soft_max_ext`` / ``mul_mat``) as ``[n_head*head_dim, T]``; ``attn_output``; in
  the last block the rows of ``inp_out_ids`` are kept (``get_rows``) from here on; gemma:
  ``post_attention_norm``; residual; ``ffn_norm``; ``geglu_split``/``swiglu_split`` of
  ``ffn_gate`` and ``ffn_up``; ``ffn_down``; gemma: ``post_ffw_norm``; residual;
* ``rms_norm`` * ``output_norm``; ``logits = mul_mat(output, x)`` ``[n_vocab, n_out]``
  (``output`` = ``token_embd`` when tied; a copy of its bytes in the device buffer when the
  output layer is offloaded, as llama.cpp's ``TENSOR_DUPLICATED``).

Shapes and reuse: a prompt is cut into micro-batches of ``n_ubatch`` tokens; generation runs one
token per step. ``n_kv`` is the cache's filled length rounded up to
:data:`~.kv_cache.KV_PAD` (256) cells and every position-dependent value is an input, so a
decode graph keeps its shape for 256 steps: the graph, the scheduler's split and the backends'
plans are reused (``LLM.n_graph_builds`` counts builds; ``sched.reuse.hits`` the scheduler's
unchanged-graph replays). Graphs are cached per ``(T, n_kv, n_out)``.
"""

from __future__ import annotations

import gc
import math
import mmap
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import Backend, Buffer, BufferUsage, Device, DeviceType, Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_get_async, backend_tensor_set
from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.backends.cpu import qgemm, qmatmul, repack_q4k, rope_ggml, vec_dot_q6k
from ggmlpy.core.check import ArgumentValueError, check_bool, check_int, check_optional, check_type
from ggmlpy.core.errors import ComputeError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import GluOp
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.models.llm.arch import HParams, block_tensor_names
from ggmlpy.models.llm.attention import build_attn
from ggmlpy.models.llm.gguf_file import TypedWeight, read_decoder_gguf
from ggmlpy.models.llm.kv_cache import KVCache
from ggmlpy.models.llm.sampling import greedy
from ggmlpy.models.llm.tokenizer import Tokenizer
from ggmlpy.models.runtime import SchedModel, check_n_gpu_layers, cpu_backend, resolve_devices

__all__ = ["LLM", "GRAPH_CACHE_SIZE", "GRAPH_SIZE", "WARM_UP_VOCAB"]

#: Graphs kept per model, keyed by ``(T, n_kv, n_out)``.
GRAPH_CACHE_SIZE = 32
#: Node capacity of a micro-batch graph.
GRAPH_SIZE = 8192
#: Vocabulary entries whose logits the load's warm-up evaluation computes.
WARM_UP_VOCAB = 256


@dataclass
class _Layer:
    """One block's weights (GGUF names without the ``blk.{il}.`` prefix)."""

    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    ffn_norm: Tensor
    w_gate: Tensor
    w_up: Tensor
    w_down: Tensor
    bq: Tensor | None = None
    bk: Tensor | None = None
    bv: Tensor | None = None
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None
    post_attn_norm: Tensor | None = None
    post_ffw_norm: Tensor | None = None


@dataclass
class _UbatchGraph:
    """One cached micro-batch graph and its input tensors."""

    n_tokens: int
    n_kv: int
    n_out: int
    graph: Graph
    tokens: Tensor
    pos: Tensor
    kv_idxs: Tensor
    mask: Tensor | None
    mask_swa: Tensor | None
    out_ids: Tensor | None
    logits: Tensor


class LLM(SchedModel):
    """A decoder language model from a GGUF file run as ggmlpy graphs (mirrors llama.cpp's
    ``llama_model`` + ``llama_context`` for one sequence: ``llama_decode`` with a KV cache).

    Build it with :meth:`load`. Attributes: ``hp`` (:class:`~.arch.HParams`), ``path``,
    ``metadata`` (the file's key/value pairs, e.g. for the tokenizer), ``n_gpu_layers``,
    ``n_ubatch``, ``parallel``, ``flash_attn``,
    ``kv`` (:class:`~.kv_cache.KVCache`), ``n_graph_builds``, ``sched``
    (:class:`~ggmlpy.sched.Scheduler`), ``tokenizer`` (the file's
    :class:`~ggmlpy.models.llm.tokenizer.Tokenizer`, None when it has no ``tokenizer.ggml.model``;
    :meth:`generate` encodes a str prompt with it and stops at its end-of-generation ids).
    Not thread-safe. Call :meth:`close` (or use it as a context manager) to free its buffers.
    """

    def __init__(self) -> None:  # use LLM.load
        self.hp: HParams
        self.path: Path
        self.metadata: dict[str, Any] = {}
        self.n_gpu_layers = 0
        self.n_ubatch = 512
        self.parallel = False
        self.flash_attn = True
        self.n_graph_builds = 0
        self.kv: KVCache | None = None
        self.sched: Any = None
        self.tokenizer: Any = None
        self._backends: list[Backend] = []
        self._device_backends: list[Backend] = []
        self._weight_bufs: list[Buffer] = []
        self._graphs: OrderedDict[tuple[int, int, int], _UbatchGraph] = OrderedDict()
        self._closed = False

    # ------------------------------------------------------------------------------------------
    # loading

    @classmethod
    def load(cls, path: str | Path, device: str | Device | Sequence[str | Device] = "CPU",
             n_gpu_layers: int = 0, n_threads: int | None = None, n_ctx: int = 4096,
             n_ubatch: int = 512, parallel: bool = False, type_k: Type = Type.F16,
             type_v: Type = Type.F16, flash_attn: bool = True,
             op_offload: bool = False, use_mmap: bool = True) -> LLM:
        """Load a decoder GGUF file and prepare it for :meth:`eval` and :meth:`generate`.

        Args:
            path: the ``.gguf`` file (``general.architecture`` gemma3, llama or qwen2).
            device: the accelerator to offload to ("SIM0", "CUDA0", "RAY0" or a
                :class:`~ggmlpy.backend.Device`; several as a list or "SIM0,SIM1": the offloaded
                blocks in contiguous chunks, in order); "CPU" runs everything on the CPU.
            n_gpu_layers: llama.cpp's ``-ngl``: the last ``n_gpu_layers`` blocks (weights and KV
                cache) go to ``device``; with all of them (``n_layer`` or -1) the output layer
                too. 0..n_layer or -1. Ignored when ``device`` is the CPU.
            n_threads: CPU backend threads (1..512; llama.cpp's ``-t``); None: its default.
            n_ctx: KV cells (the longest sequence; rounded up to a multiple of 256).
            n_ubatch: tokens per prompt micro-batch (llama.cpp's ``-ub``, >= 1).
            parallel: pipeline prompt micro-batches across the backends (scheduler
                ``parallel=True``, 4 copies of every split input).
            type_k, type_v: KV cache element types, F16 (llama.cpp's default) or F32
                (llama.cpp's ``-ctk``/``-ctv``).
            flash_attn: one FLASH_ATTN_EXT node per block (llama.cpp ``-fa on``), else
                MUL_MAT / SOFT_MAX / MUL_MAT with ggml's CPU f16 roundings of Q and of the
                softmax probabilities for an F16 cache (``-fa off``; :mod:`.attention`).
            op_offload: the scheduler's ``op_offload`` (off: ``n_gpu_layers`` alone decides).
            use_mmap: llama.cpp's ``use_mmap``: the CPU's weights are read in place from the
                file's read-only memory map (no copy; writes to them raise; the file must not
                be changed while the model is open, as with llama.cpp); False: copied into an
                allocated CPU buffer. The offloaded weights are always uploaded.

        Returns:
            The model: weights in place, the compute buffers reserved for a full micro-batch
            (:meth:`_reserve`), the compiled CPU kernels loaded
            (:func:`ggmlpy.backends.cpu.jit.warm_up`, with Numba) and a two-token warm-up
            evaluated and forgotten (:meth:`_warm_up`).

        Raises:
            FileNotFoundError: no such file. GGUFError: not a readable GGUF file.
            ValueError: an unsupported architecture, a missing key or tensor, arguments out of
                range (an :class:`~ggmlpy.core.check.ArgumentValueError` naming the argument).
            BackendUnavailableError: ``device`` does not exist here.
            OutOfMemoryError: a weight, cache or compute buffer could not be allocated.
            TypeError: an argument of the wrong type (named).
        """
        where = "LLM.load"
        check_type("path", path, (str, Path), where)
        check_type("device", device, (str, Device, list, tuple), where)
        check_int("n_gpu_layers", n_gpu_layers, -1, None, where)
        check_optional("n_threads", n_threads, int, where)
        check_int("n_ctx", n_ctx, 1, None, where)
        check_int("n_ubatch", n_ubatch, 1, None, where)
        check_bool("parallel", parallel, where)
        check_bool("op_offload", op_offload, where)
        check_bool("flash_attn", flash_attn, where)
        check_bool("use_mmap", use_mmap, where)
        for name, t in (("type_k", type_k), ("type_v", type_v)):
            if t not in (Type.F32, Type.F16):
                raise ArgumentValueError(name, f"must be Type.F32 or Type.F16, got {t!r}", where)
        if n_threads is not None and (isinstance(n_threads, bool) or not 1 <= n_threads <= 512):
            raise ArgumentValueError("n_threads", f"must be an int in 1..512, got {n_threads!r}",
                                     where)
        # loading makes ~10^5 long-lived objects (Numba's typing registries, the vocabulary, the
        # graphs): the cyclic collector is paused meanwhile (it would scan the growing heap in
        # ~200 collections, the whole of it twice) and runs once, in full, at the end
        gc_on = gc.isenabled()
        if gc_on:
            gc.disable()
        try:
            self = cls._open(path, device, n_gpu_layers, n_threads, n_ctx, n_ubatch, parallel,
                             type_k, type_v, flash_attn, op_offload, use_mmap)
        finally:
            if gc_on:
                gc.enable()
        if gc_on:
            gc.collect()
        return self

    @classmethod
    def _open(cls, path: str | Path, device: str | Device | Sequence[str | Device],
              n_gpu_layers: int, n_threads: int | None, n_ctx: int, n_ubatch: int,
              parallel: bool, type_k: Type, type_v: Type, flash_attn: bool, op_offload: bool,
              use_mmap: bool) -> LLM:
        """:meth:`load` after its argument checks."""
        where = "LLM.load"
        meta, tensors = read_decoder_gguf(path)
        if "token_embd.weight" not in tensors:
            raise ValueError(f"{path}: missing tensor 'token_embd.weight'")
        hp = HParams.from_metadata(meta, tensors["token_embd.weight"].ne[1], str(path))
        n_layer = hp.n_layer
        n_gpu_layers = check_n_gpu_layers(n_gpu_layers, n_layer, where)
        devs = resolve_devices(device, where)
        self = cls()
        self.path = Path(path)
        self.metadata = meta
        self.hp = hp
        if "tokenizer.ggml.model" in meta:
            self.tokenizer = Tokenizer.from_gguf_metadata(meta, str(path))
        self.n_ubatch = n_ubatch
        self.parallel = parallel
        self.flash_attn = flash_attn
        try:
            self._backends = [cpu_backend(n_threads)]
            if devs[0].type != DeviceType.CPU and n_gpu_layers > 0:
                self.n_gpu_layers = n_gpu_layers
                self._add_device_backends(devs)
            layer_be = self._layer_backends()
            self._load_weights(tensors, layer_be, use_mmap)
            self.kv = KVCache(hp, n_ctx, layer_be, type_k, type_v)
            from ggmlpy.sched.scheduler import Scheduler

            self.sched = Scheduler(self._backends, graph_size=GRAPH_SIZE, parallel=parallel,
                                   op_offload=op_offload)
            self._reserve()
            if cpu_jit.warm_up():  # compiled CPU kernels loaded now, not in the first eval
                rope_ggml.warm_up()
                wtypes = {w.type for w in tensors.values()}
                if Type.Q4_K in wtypes:  # the K-quant orders' tasks (prompt batches)
                    repack_q4k.warm_up()
                if Type.Q6_K in wtypes:
                    vec_dot_q6k.warm_up()
                # the GEMM path, for the weight types whose micro-batches take it (none of the
                # block types by default: ggml's orders at every batch)
                qgemm.warm_up({t for t in wtypes if not qmatmul.chooses_dot(
                    t, Type.F32, min(self.n_ubatch, self.kv.n_ctx))})
            self._warm_up()
        except BaseException:
            self.close()
            raise
        return self

    def _reserve(self) -> None:
        """Reserve the compute buffers for the worst-case micro-batch, as llama.cpp's
        ``llama_context`` does when it is created (``graph_reserve`` of a full micro-batch):
        ``min(n_ubatch, n_ctx)`` tokens reading every cell, one row of logits. Evaluations of up
        to ``n_ubatch`` tokens with one row of logits then never grow a buffer (growing drops
        every recorded placement).

        Raises:
            ComputeError: a compute buffer could not be allocated.
        """
        kv: KVCache = self.kv  # type: ignore[assignment]
        n_tokens = min(self.n_ubatch, kv.n_ctx)
        if not self.sched.reserve(self._graph_for(n_tokens, kv.n_ctx, 1).graph):
            raise ComputeError(f"out of memory reserving the compute buffers of a "
                               f"{n_tokens}-token micro-batch on {', '.join(self.devices)}")

    def _warm_up(self) -> np.ndarray:
        """Evaluate two tokens (BOS, EOS) at positions 0-1 and forget them, as llama.cpp's warm-up
        decode (``common_init_from_params``): every kernel a prompt micro-batch runs is loaded
        now (Numba's cached machine code for the layouts of a multi-row batch and of the one
        row of logits, lazily imported dequantizers), not in the first :meth:`eval`. The
        logits are those of the first :data:`WARM_UP_VOCAB` entries only (the output matrix is
        most of the bytes a step reads), the graph is not kept, and the cache is left as after
        :meth:`truncate` to 0 (the two cells written hold finite values and are masked).

        Returns:
            The second token's logits of those entries, float32 ``[min(WARM_UP_VOCAB,
            n_vocab)]``.

        Raises:
            ComputeError: the graph could not be allocated or a backend failed.
        """
        tok, sched = self.tokenizer, self.sched
        kv: KVCache = self.kv  # type: ignore[assignment]
        ids = np.array([t if t is not None and 0 <= t < self.hp.n_vocab else 0
                        for t in ((tok.bos_id, tok.eos_id) if tok is not None else (0, 0))],
                       np.int32)
        n = min(len(ids), kv.n_ctx, self.n_ubatch)
        g = self._build_graph(n, kv.n_kv(n), 1, min(WARM_UP_VOCAB, self.hp.n_vocab))
        sched.reset()
        if not sched.alloc_graph(g.graph):
            raise ComputeError("scheduler could not allocate the warm-up graph")
        self._set_inputs(g, ids[:n], 0)
        status = sched.graph_compute(g.graph)
        if status != Status.SUCCESS:
            sched.reset()
            raise ComputeError(f"warm-up graph failed: {status.name}")
        logits = backend_tensor_get(g.logits).reshape(-1)
        sched.reset()
        kv.truncate(0)
        return logits

    def _layer_backends(self) -> list[Backend]:
        """The backend of each block: the CPU for the first ``n_layer - n_gpu_layers``, then the
        devices in contiguous chunks as equal as possible (the first ones one more)."""
        n_layer, ngl = self.hp.n_layer, self.n_gpu_layers
        cpu = self._backends[-1]
        out = [cpu] * (n_layer - ngl)
        devs = self._device_backends
        for k, be in enumerate(devs):
            out += [be] * (ngl // len(devs) + (k < ngl % len(devs)))
        return out

    def _load_weights(self, tensors: dict[str, TypedWeight], layer_be: list[Backend],
                      use_mmap: bool) -> None:
        """Create the weight tensors per backend and give them memory (usage WEIGHTS): the CPU's
        read in place from the file's memory map with ``use_mmap`` (:func:`_map_weights`), the
        others (and the CPU's without ``use_mmap``) allocated and uploaded."""
        hp, spec = self.hp, self.hp.arch
        ctxs: dict[int, tuple[Backend, Context]] = {}
        uploads: list[tuple[Tensor, np.ndarray]] = []

        def ctx_of(be: Backend) -> Context:
            return ctxs.setdefault(id(be), (be, Context()))[1]

        def new(be: Backend, name: str, required: bool = True, as_name: str | None = None) -> Tensor | None:
            w = tensors.get(name)
            if w is None:
                if required:
                    raise ValueError(f"{self.path}: missing tensor {name!r}")
                return None
            t = ctx_of(be).new_tensor(w.type, w.ne).set_name(as_name or name)
            uploads.append((t, w.data))
            return t

        cpu = self._backends[-1]
        out_be = self._device_backends[-1] if self.n_gpu_layers == hp.n_layer and \
            self._device_backends else cpu
        self.tok_embd = new(cpu, "token_embd.weight")
        self.output_norm = new(out_be, "output_norm.weight")
        if "output.weight" in tensors:
            self.output = new(out_be, "output.weight")
        elif out_be is cpu:
            self.output = self.tok_embd  # tied
        else:  # tied, offloaded: a copy of token_embd's bytes on the device
            self.output = new(out_be, "token_embd.weight", as_name="output.weight")
        self.layers: list[_Layer] = []
        for il in range(hp.n_layer):
            be = layer_be[il]
            for n in block_tensor_names(spec, il):
                if n not in tensors:
                    raise ValueError(f"{self.path}: missing tensor {n!r}")
            b = f"blk.{il}."
            opt = not spec.qkv_bias
            self.layers.append(_Layer(
                attn_norm=new(be, b + "attn_norm.weight"), wq=new(be, b + "attn_q.weight"),
                wk=new(be, b + "attn_k.weight"), wv=new(be, b + "attn_v.weight"),
                wo=new(be, b + "attn_output.weight"), ffn_norm=new(be, b + "ffn_norm.weight"),
                w_gate=new(be, b + "ffn_gate.weight"), w_up=new(be, b + "ffn_up.weight"),
                w_down=new(be, b + "ffn_down.weight"),
                bq=new(be, b + "attn_q.bias", not opt), bk=new(be, b + "attn_k.bias", not opt),
                bv=new(be, b + "attn_v.bias", not opt),
                q_norm=new(be, b + "attn_q_norm.weight") if spec.qk_norm else None,
                k_norm=new(be, b + "attn_k_norm.weight") if spec.qk_norm else None,
                post_attn_norm=new(be, b + "post_attention_norm.weight") if spec.post_norms else None,
                post_ffw_norm=new(be, b + "post_ffw_norm.weight") if spec.post_norms else None))
        data_of = {id(t): data for t, data in uploads}
        for be, ctx in ctxs.values():
            buf = None
            if use_mmap and be is cpu:
                buf = _map_weights(ctx, data_of)
            if buf is None:
                buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
                if buf is None:
                    continue
                for t in ctx.tensors:
                    backend_tensor_set(t, data_of[id(t)])
            buf.set_usage(BufferUsage.WEIGHTS)
            self._weight_bufs.append(buf)

    # ------------------------------------------------------------------------------------------
    # graph

    def _norm(self, ctx: Context, x: Tensor, w: Tensor) -> Tensor:
        # llama.cpp build_norm(LLM_NORM_RMS): ggml_rms_norm, then * weight
        return ops.mul(ctx, ops.rms_norm(ctx, x, self.hp.eps), w)

    def _build_graph(self, n_tokens: int, n_kv: int, n_out: int,
                     n_vocab_out: int | None = None) -> _UbatchGraph:
        """The graph of a micro-batch of ``n_tokens`` tokens reading ``n_kv`` cells and giving the
        logits of its last ``n_out`` tokens (module docstring); with ``n_vocab_out`` only those of
        the first ``n_vocab_out`` vocabulary entries (the warm-up's: the same kernels, a
        fraction of the output matrix read)."""
        hp, spec = self.hp, self.hp.arch
        kv: KVCache = self.kv  # type: ignore[assignment]  (set by load before any graph)
        T, d, dv = n_tokens, hp.head_dim_k, hp.head_dim_v
        ctx = Context()
        graph = Graph(GRAPH_SIZE)
        tokens = ctx.new_tensor_1d(Type.I32, T).set_name("inp_tokens").set_input()
        pos = ctx.new_tensor_1d(Type.I32, T).set_name("inp_pos").set_input()
        kv_idxs = ctx.new_tensor_1d(Type.I64, T).set_name("inp_kv_idxs").set_input()
        # each mask only when a layer reads it (a model may have no global or no local layer:
        # an input no node reads is never allocated)
        mask = None
        if not all(hp.is_swa(il) for il in range(hp.n_layer)):
            mask = ctx.new_tensor_2d(Type.F32, n_kv, T).set_name("inp_kq_mask").set_input()
        mask_swa = None
        if any(hp.is_swa(il) for il in range(hp.n_layer)):
            mask_swa = ctx.new_tensor_2d(Type.F32, n_kv, T).set_name("inp_kq_mask_swa").set_input()
        out_ids = None
        if n_out < T:
            out_ids = ctx.new_tensor_1d(Type.I32, n_out).set_name("inp_out_ids").set_input()

        x = ops.get_rows(ctx, self.tok_embd, tokens)
        if spec.embd_scale:
            x = ops.scale(ctx, x, math.sqrt(hp.n_embd))
        x.set_name("inp_embd")
        glu = GluOp.GEGLU if spec.ffn == "geglu" else GluOp.SWIGLU
        for il, lw in enumerate(self.layers):
            inp = x
            cur = self._norm(ctx, x, lw.attn_norm)
            q = ops.mul_mat(ctx, lw.wq, cur)
            k = ops.mul_mat(ctx, lw.wk, cur)
            v = ops.mul_mat(ctx, lw.wv, cur)
            if lw.bq is not None:
                q = ops.add(ctx, q, lw.bq)
            if lw.bk is not None:
                k = ops.add(ctx, k, lw.bk)
            if lw.bv is not None:
                v = ops.add(ctx, v, lw.bv)
            q = ops.reshape_3d(ctx, q, d, hp.n_head, T)
            k = ops.reshape_3d(ctx, k, d, hp.n_head_kv, T)
            v = ops.reshape_3d(ctx, v, dv, hp.n_head_kv, T)
            if lw.q_norm is not None:
                q = self._norm(ctx, q, lw.q_norm)
                k = self._norm(ctx, k, lw.k_norm)
            base = hp.layer_rope_base(il)
            q = ops.rope_ext(ctx, q, pos, None, hp.n_rot, spec.rope_mode, hp.n_ctx_train, base,
                             1.0, 0.0, 1.0, 0.0, 0.0)
            k = ops.rope_ext(ctx, k, pos, None, hp.n_rot, spec.rope_mode, hp.n_ctx_train, base,
                             1.0, 0.0, 1.0, 0.0, 0.0)
            q.set_name(f"Qcur-{il}")
            k.set_name(f"Kcur-{il}")
            kq_scale = hp.attn_scale
            if spec.q_prescale:
                # llama.cpp gemma3: Qcur = ggml_scale(Qcur, f_attention_scale) before the f16
                # cast of the -fa off product (an f16-subnormal q rounds as llama.cpp's)
                q, kq_scale = ops.scale(ctx, q, hp.attn_scale), 1.0
            for w in kv.store(ctx, il, k, v, kv_idxs):
                graph.build_forward_expand(w)  # the cache is written before it is read
            cur = build_attn(ctx, q, kv.view_k(ctx, il, n_kv), kv.view_v(ctx, il, n_kv),
                             mask_swa if hp.is_swa(il) else mask, kq_scale,
                             self.flash_attn)                     # [dv*n_head, T]
            cur = ops.mul_mat(ctx, lw.wo, cur)
            if il == hp.n_layer - 1 and out_ids is not None:
                cur = ops.get_rows(ctx, cur, out_ids)
                inp = ops.get_rows(ctx, inp, out_ids)
            if lw.post_attn_norm is not None:
                cur = self._norm(ctx, cur, lw.post_attn_norm)
            sa = ops.add(ctx, cur, inp)
            cur = self._norm(ctx, sa, lw.ffn_norm)
            gate = ops.mul_mat(ctx, lw.w_gate, cur)
            up = ops.mul_mat(ctx, lw.w_up, cur)
            cur = ops.glu_split(ctx, gate, up, glu)
            cur = ops.mul_mat(ctx, lw.w_down, cur)
            if lw.post_ffw_norm is not None:
                cur = self._norm(ctx, cur, lw.post_ffw_norm)
            x = ops.add(ctx, cur, sa).set_name(f"l_out-{il}")
        x = self._norm(ctx, x, self.output_norm).set_name("result_norm")
        out_w = self.output
        if n_vocab_out is not None:
            out_w = ops.view_2d(ctx, out_w, out_w.ne[0], n_vocab_out, out_w.nb[1], 0)
        logits = ops.mul_mat(ctx, out_w, x).set_name("result_output").set_output()
        graph.build_forward_expand(logits)
        return _UbatchGraph(T, n_kv, n_out, graph, tokens, pos, kv_idxs, mask, mask_swa,
                            out_ids, logits)

    def _graph_for(self, n_tokens: int, n_kv: int, n_out: int) -> _UbatchGraph:
        key = (n_tokens, n_kv, n_out)
        g = self._graphs.get(key)
        if g is None:
            self.n_graph_builds += 1
            gc_on = gc.isenabled()  # (paused while building, as the scheduler's split)
            if gc_on:
                gc.disable()
            try:
                g = self._graphs[key] = self._build_graph(n_tokens, n_kv, n_out)
            finally:
                if gc_on:
                    gc.enable()
            while len(self._graphs) > GRAPH_CACHE_SIZE:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return g

    def _set_inputs(self, g: _UbatchGraph, tokens: np.ndarray, n_past: int) -> None:
        hp = self.hp
        T = len(tokens)
        pos = np.arange(n_past, n_past + T, dtype=np.int32)
        backend_tensor_set(g.tokens, tokens.astype(np.int32))
        backend_tensor_set(g.pos, pos)
        backend_tensor_set(g.kv_idxs, pos.astype(np.int64))
        cell = np.arange(g.n_kv)[None, :]
        p = pos[:, None]
        visible = cell <= p                                           # (T, n_kv)
        if g.mask is not None:
            backend_tensor_set(g.mask, np.where(visible, np.float32(0), np.float32(-np.inf)))
        if g.mask_swa is not None:
            vis_swa = visible & (p - cell < hp.n_swa)
            backend_tensor_set(g.mask_swa,
                               np.where(vis_swa, np.float32(0), np.float32(-np.inf)))
        if g.out_ids is not None:
            backend_tensor_set(g.out_ids, np.arange(T - g.n_out, T, dtype=np.int32))

    # ------------------------------------------------------------------------------------------
    # public API

    @property
    def n_past(self) -> int:
        """Tokens in the KV cache (the position of the next token)."""
        return 0 if self.kv is None else self.kv.n_past

    def eval(self, tokens: Sequence[int] | np.ndarray, all_logits: bool = False) -> np.ndarray:
        """Append ``tokens`` to the sequence and return their logits (mirrors ``llama_decode``).

        The tokens are processed in micro-batches of ``n_ubatch``; with ``parallel`` the batches
        are queued without a host wait and the host synchronizes once, for the logits.

        Args:
            tokens: token ids (each in ``0..n_vocab-1``), at least one.
            all_logits: return every token's logits (llama.cpp's ``logits_all``); else only the
                last token's (the output matmul runs on one row).

        Returns:
            float32 ``[n_vocab]`` (the last token), or ``[len(tokens), n_vocab]`` with
            ``all_logits``.

        Raises:
            ValueError: no tokens, an id outside the vocabulary, the context full, the model
                closed. TypeError: ids that are not ints. ComputeError: a backend failed.
        """
        check_bool("all_logits", all_logits, "LLM.eval")
        if self._closed or self.kv is None:
            raise ValueError("LLM.eval: the model was closed")
        if isinstance(tokens, (str, bytes)):
            raise TypeError("LLM.eval: tokens must be a sequence of int ids, got a str")
        arr = np.asarray(tokens)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"LLM.eval: tokens must be a non-empty 1-D sequence, got shape "
                             f"{arr.shape}")
        if arr.dtype.kind not in "iu":
            raise TypeError(f"LLM.eval: token ids must be ints, got dtype {arr.dtype}")
        if arr.min() < 0 or arr.max() >= self.hp.n_vocab:
            raise ValueError(f"LLM.eval: token ids must be in 0..{self.hp.n_vocab - 1}")
        kv = self.kv
        if kv.n_past + arr.size > kv.n_ctx:
            raise ValueError(f"LLM.eval: {arr.size} tokens after {kv.n_past} exceed the context "
                             f"of {kv.n_ctx}")
        n = arr.size
        out = np.empty((n if all_logits else 1, self.hp.n_vocab), np.float32)
        sched = self.sched
        last_be: Backend | None = None
        for i0 in range(0, n, self.n_ubatch):
            chunk = arr[i0:i0 + self.n_ubatch]
            T = chunk.size
            final = i0 + T == n
            n_out = T if all_logits else (1 if final else 0)
            g = self._graph_for(T, kv.n_kv(T), max(n_out, 1))
            sched.reset()
            if not sched.alloc_graph(g.graph):
                raise ComputeError(f"scheduler could not allocate the graph of {T} tokens")
            self._set_inputs(g, chunk, kv.n_past)
            if self.parallel:
                status = sched.graph_compute_async(g.graph)
            else:
                status = sched.graph_compute(g.graph)
            if status != Status.SUCCESS:
                raise ComputeError(f"graph of {T} tokens failed: {status.name}")
            kv.n_past += T
            if n_out:
                dest = out[i0:i0 + T] if all_logits else out
                be = sched.get_tensor_backend(g.logits) or self._backends[-1]
                if self.parallel:
                    backend_tensor_get_async(be, g.logits, dest)
                    last_be = be
                else:
                    dest[...] = backend_tensor_get(g.logits).reshape(dest.shape)
        if self.parallel or last_be is not None:
            sched.synchronize()
        return out if all_logits else out[0]

    def generate(self, prompt: str | Sequence[int], n_predict: int,
                 sampler: Any = None, stop: Collection[int] | None = None) -> Iterator[int]:
        """Generate up to ``n_predict`` tokens after ``prompt``, one id at a time (llama.cpp's
        ``llama-simple`` loop: decode the prompt, then sample and decode one token per step).

        The prompt is appended to the current sequence (call :meth:`clear` first for a new one);
        each generated token is evaluated as a one-token step.

        Args:
            prompt: token ids, or a str encoded with :attr:`tokenizer` (BOS added when the file
                says so, special-token text not parsed).
            n_predict: the most tokens to generate (>= 0).
            sampler: a :class:`~ggmlpy.models.llm.sampling.Sampler` (its ``sample(logits,
                history)`` sees every token so far, for the penalties), a callable
                ``f(logits) -> id``, or None: greedy (the arg max, the lowest id on ties, as
                llama.cpp's greedy sampler). ``logits`` are float32 ``[n_vocab]``.
            stop: ids that end generation (yielded, then stop); None: the tokenizer's
                end-of-generation ids (none without a tokenizer).

        Yields:
            The generated token ids.

        Raises:
            TypeError: a str prompt without a tokenizer. ValueError: as :meth:`eval`.
        """
        check_int("n_predict", n_predict, 0, None, "LLM.generate")
        tok = self.tokenizer
        if isinstance(prompt, str):
            if tok is None:
                raise TypeError("LLM.generate: a str prompt needs a tokenizer (this file has none);"
                                " pass token ids")
            ids = list(tok.encode(prompt))
        else:
            ids = [int(t) for t in prompt]
        if stop is None:
            is_stop = (lambda t: bool(tok.is_eog(t))) if tok is not None else (lambda t: False)
        else:
            is_stop = frozenset(int(s) for s in stop).__contains__
        history = list(ids)
        if sampler is None:
            pick = greedy
        elif hasattr(sampler, "sample"):
            pick = lambda lg: sampler.sample(lg, history)  # noqa: E731
        elif callable(sampler):
            pick = sampler
        else:
            raise TypeError(f"LLM.generate: sampler must be a Sampler, a callable or None, got "
                            f"{type(sampler).__name__}")
        if n_predict == 0:
            return
        logits = self.eval(ids)
        for i in range(n_predict):
            t = int(pick(logits))
            history.append(t)
            yield t
            if is_stop(t) or i == n_predict - 1:
                return
            logits = self.eval([t])

    def clear(self) -> None:
        """Forget the sequence (llama.cpp ``llama_memory_clear``)."""
        if self.kv is not None:
            self.kv.clear()

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens of the sequence (llama.cpp ``llama_memory_seq_rm``).

        Raises:
            ValueError: ``n`` outside ``0..n_past``.
        """
        if self.kv is None:
            raise ValueError("LLM.truncate: the model was closed")
        self.kv.truncate(n)

    def _free_model_state(self) -> None:
        self._graphs.clear()
        if self.kv is not None:
            self.kv.free()
            self.kv = None

    def __enter__(self) -> LLM:
        return self

    def __repr__(self) -> str:
        arch = self.hp.arch.name if hasattr(self, "hp") else "?"
        return (f"<LLM {arch} {self.path.name if hasattr(self, 'path') else '?'} "
                f"devices={self.devices} n_gpu_layers={self.n_gpu_layers}>")


def _map_weights(ctx: Context, data_of: dict[int, np.ndarray]) -> Buffer | None:
    """Place every tensor of ``ctx`` in a read-only CPU buffer over the file's memory map, at its
    bytes' offset (llama.cpp's ``use_mmap``: ``llama_mmap`` + ``ggml_backend_cpu_buffer_from_ptr``
    + ``ggml_backend_tensor_alloc`` at ``mapping + offs``), and map every page now (one read per
    page; llama.cpp maps with ``MAP_POPULATE``), so neither an upload copy nor page faults in the
    first evaluation are paid. ``data_of``: ``id(tensor) -> uint8 bytes``. None (nothing placed)
    when the bytes are not all views of one 1-D array (a byte-swapped file's are copies) or an
    offset is not a multiple of the CPU's tensor alignment."""
    from ggmlpy.backend.interface import tensor_alloc
    from ggmlpy.backends.cpu.backend import TENSOR_ALIGNMENT, cpu_buffer_from_mapped

    tensors = list(ctx.tensors)
    if not tensors:
        return None
    base = data_of[id(tensors[0])].base
    if not isinstance(base, np.ndarray) or base.ndim != 1 or base.dtype != np.uint8 \
            or not base.flags.c_contiguous or base.ctypes.data % TENSOR_ALIGNMENT:
        return None
    start = base.ctypes.data
    offsets = []
    for t in tensors:
        d = data_of[id(t)]
        off = d.ctypes.data - start
        if d.base is not base or off % TENSOR_ALIGNMENT or d.nbytes != t.nbytes:
            return None
        offsets.append(off)
    buf = cpu_buffer_from_mapped(base)
    for t, off in zip(tensors, offsets):
        tensor_alloc(buf, t, off)
    lo, hi = min(offsets), max(o + t.nbytes for o, t in zip(offsets, tensors))
    int(base[lo:hi:mmap.PAGESIZE].max())  # one read per page: the pages mapped now
    return buf
