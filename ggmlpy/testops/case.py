"""One test case of ``test-backend-ops``: how it is named, built and initialised (mirrors ggml's
``struct test_case`` in ``tests/test-backend-ops.cpp``).

A :class:`TestCase` holds an op description (``"ADD"``, ``"GELU"``), an ordered parameter dict
(rendered by :func:`format_vars` exactly like ggml's ``vars()``: ``type=f32,ne=[10,5,4,3]``), a
build function that creates the inputs through a :class:`Builder` and returns the output tensor,
the NMSE threshold, the input value range and, for matrix ops, a flop count. Building never
allocates: the builder works in a ``no_alloc`` :class:`~ggmlpy.core.tensor.Context`.

Data are deterministic: :meth:`TestCase.rng` is seeded from the case name, so one case's values
do not depend on which other cases run.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type

__all__ = ["Init", "Builder", "TestCase", "format_vars", "init_uniform", "init_unique_rows",
           "init_ints", "DEFAULT_NMSE"]

#: ggml's default ``max_nmse_err()``.
DEFAULT_NMSE = 1e-7

#: ``init(rng, tensor) -> ndarray`` of the tensor's dtype, NumPy shape ``tensor.ne[::-1]``.
Init = Callable[[np.random.Generator, Tensor], np.ndarray]


def format_vars(params: dict[str, Any]) -> str:
    """``name=value`` pairs joined by commas, formatted like ggml's ``VARS_TO_STR`` helpers.

    Arrays print as ``[a,b,c,d]``, floats with 6 decimals (``std::to_string``), types by their
    ggml name (``f32``), bools as 0/1, strings as they are.
    """
    return ",".join(f"{k}={_fmt(v)}" for k, v in params.items())


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, Type):
        return v.type_name
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6f}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt(x) for x in v) + "]"
    return str(v)


def _to_dtype(x: np.ndarray, t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.astype(np.float32).astype(t.type.dtype).reshape(t.ne[::-1]))


def init_uniform(lo: float, hi: float) -> Init:
    """Uniform values in ``[lo, hi)`` drawn in float32, then converted to the tensor's type
    (F16 rounds to nearest even; integer types truncate toward zero) (ggml's ``init_tensor_uniform``)."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        x = rng.uniform(lo, hi, size=t.nelements).astype(np.float32)
        if not t.type.traits.is_float:
            x = np.trunc(x)
        return _to_dtype(x, t)
    return init


def init_unique_rows(scale: float = 1.0) -> Init:
    """Every row (``ne0`` values) is a random permutation of ``0..ne0-1`` times ``scale``, so
    argmax/argsort have no ties (ggml's ARGMAX/ARGSORT initialisation)."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        n0 = t.ne[0]
        rows = np.stack([rng.permutation(n0) for _ in range(t.nrows)]) if t.nrows else \
            np.empty((0, n0))
        return _to_dtype(rows.astype(np.float64) * scale - scale * (n0 - 1) / 2, t)
    return init


def init_ints(lo: int, hi: int) -> Init:
    """Uniform integers in ``[lo, hi)`` (indices for GET_ROWS, positions for ROPE)."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        return np.ascontiguousarray(
            rng.integers(lo, hi, size=t.nelements).astype(t.type.dtype).reshape(t.ne[::-1]))
    return init


class Builder:
    """Creates a case's input tensors in a ``no_alloc`` context and records how each is initialised.

    Args:
        ctx: the context the case builds in (``Context(no_alloc=True)``).

    Attributes:
        ctx: the context.
        inits: ``id(tensor) -> Init`` for tensors with a specific initialisation; every other
            non-view tensor of the context gets the case's default uniform range.
        params: tensors flagged PARAM (none by default; kept for ggml parity).
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.inits: dict[int, Init] = {}

    def new(self, type: Type, ne: Sequence[int], init: Init | None = None,
            name: str | None = None) -> Tensor:
        """A new packed input tensor ``ne`` (ggml order; NumPy shape ``ne[::-1]``) of ``type``.

        ``init`` overrides the case's default uniform initialisation for this tensor.
        """
        t = self.ctx.new_tensor(type, ne)
        if name:
            t.set_name(name)
        if init is not None:
            self.inits[id(t)] = init
        return t

    def set_init(self, t: Tensor, init: Init) -> Tensor:
        """Give an existing (non-view) tensor a specific initialisation; returns ``t``."""
        self.inits[id(t.view_src if t.view_src is not None else t)] = init
        return t


@dataclass
class TestCase:
    """One op configuration (mirrors ggml's ``test_case`` subclasses).

    Attributes:
        op: the op description printed and matched by ``-o`` (``"ADD"``, ``"GELU"``, ``"SWIGLU"``).
        params: ordered parameters; :attr:`name` is ``op(format_vars(params))``.
        build: ``build(builder) -> out``: creates inputs with ``builder.new`` and returns the output.
        family: the ggmlpy :class:`~ggmlpy.core.opcodes.Op` name of the output (``"UNARY"`` for GELU),
            used for per-family counts.
        max_nmse: NMSE threshold (ggml's ``max_nmse_err``; 1e-7 by default).
        init_range: the default uniform range of every tensor without a specific init.
        flops: ``flops(out) -> int`` for matrix ops (perf mode reports GFLOP/s), else None
            (perf mode reports GB/s from bytes read + written).
        tags: free-form labels (e.g. ``"large"`` for cases left out of the quick subset).
    """

    op: str
    params: dict[str, Any]
    build: Callable[[Builder], Tensor]
    family: str = ""
    max_nmse: float = DEFAULT_NMSE
    init_range: tuple[float, float] = (-1.0, 1.0)
    flops: Callable[[Tensor], int] | None = None
    tags: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.family:
            self.family = self.op

    @property
    def vars(self) -> str:
        """The parameter string (ggml's ``vars()``), matched by ``-p``."""
        return format_vars(self.params)

    @property
    def name(self) -> str:
        """``OP(vars)``, e.g. ``ADD(type=f32,ne=[10,5,4,3],nr=[2,1,1,1],perm1=0)``."""
        return f"{self.op}({self.vars})"

    def rng(self) -> np.random.Generator:
        """A generator seeded from the case name (same data on every run and in any subset)."""
        return np.random.default_rng(zlib.crc32(self.name.encode()))

    def build_graph(self) -> tuple[Context, Builder, Tensor]:
        """Build the case in a fresh ``no_alloc`` context; returns ``(ctx, builder, out)``."""
        ctx = Context(no_alloc=True)
        b = Builder(ctx)
        out = self.build(b)
        if not out.name:
            out.set_name("out")
        return ctx, b, out

    def initial_data(self, ctx: Context, builder: Builder) -> dict[int, np.ndarray]:
        """Deterministic initial contents for every non-view tensor of ``ctx`` (outputs included,
        as ggml initialises all tensors), keyed by ``id(tensor)``: arrays of the tensor's dtype and
        NumPy shape ``ne[::-1]``. Quantized tensors get raw random bytes."""
        rng = self.rng()
        default = init_uniform(*self.init_range)
        default_int = init_uniform(-1000.0, 1000.0)
        data: dict[int, np.ndarray] = {}
        for t in ctx:
            if t.view_src is not None or t.nbytes == 0:
                continue
            init = builder.inits.get(id(t))
            if init is None:
                if t.type.is_quantized or t.type == Type.BF16:
                    data[id(t)] = _raw_init(rng, t, *self.init_range)
                    continue
                init = default if t.type.traits.is_float else default_int
            data[id(t)] = init(rng, t)
        return data


def _raw_init(rng: np.random.Generator, t: Tensor, lo: float, hi: float) -> np.ndarray:
    """Raw bytes for BF16 and block-quantized tensors holding uniform values in ``[lo, hi)``:
    BF16 = the top half of float32 uniforms; block types = those uniforms quantized with ggml's
    reference quantizer (as ggml's ``init_tensor_uniform`` does), so every block is well formed."""
    x = rng.uniform(lo, hi, size=t.nelements).astype(np.float32)
    if t.type == Type.BF16:
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    from ggmlpy.quants import quantize  # noqa: PLC0415 - the optional gguf extra, block types only

    return quantize(x.reshape(t.ne[::-1]), t.type).reshape(-1)
