"""Tensors and contexts: ggml's ``struct ggml_tensor`` and ``struct ggml_context``.

A :class:`Tensor` is metadata only: element type, shape ``ne`` (elements, ``ne[0]`` innermost),
strides ``nb`` (bytes), the op that produces it with its sources and parameters, view information
and flags. Its memory is ``(buffer, offset)``: a backend buffer and a byte offset from the
buffer's base, both ``None`` until an allocator places it. The NumPy array holding the same data
has shape ``ne[::-1]`` and strides ``nb[::-1]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from enum import IntFlag
from typing import TYPE_CHECKING, Any

from ggmlpy.core import snapshot as _snapshot
from ggmlpy.core.check import checked_args
from ggmlpy.core.errors import OutOfMemoryError
from ggmlpy.core.opcodes import Op
from ggmlpy.core.snapshot import TrackedList
from ggmlpy.core.types import Type

if TYPE_CHECKING:  # pragma: no cover
    from ggmlpy.backend.interface import Buffer

__all__ = ["MAX_DIMS", "MAX_SRC", "MAX_NAME", "Flag", "Tensor", "Context", "nbytes_of"]

#: Allocates a zero-filled host buffer of ``n`` bytes for ``Context(no_alloc=False)``. Injected
#: by :mod:`ggmlpy.backends.cpu.backend` when it is imported (``import ggmlpy`` does), so that this module
#: never imports a backend (tensors sit below backends in the layering).
_host_buffer_alloc: Callable[[int], Buffer] | None = None


def set_host_buffer_alloc(fn: Callable[[int], Buffer]) -> None:
    """Install the host allocator used by ``no_alloc=False`` contexts
    (:func:`ggmlpy.backends.install` installs the CPU backend's)."""
    global _host_buffer_alloc
    _host_buffer_alloc = fn

#: Zero-copy interop hooks (``numpy``, ``array``, ``cuda_array_interface``, ``dlpack``,
#: ``dlpack_device``), installed by :func:`ggmlpy.backends.install` (``import ggmlpy`` does), so
#: that this module never imports a backend.
_interop: Any = None


def set_interop(hooks: Any) -> None:
    """Install the interop hooks behind :meth:`Tensor.numpy` and the array protocols
    (:func:`ggmlpy.backends.install` installs :data:`ggmlpy.backends.interop.HOOKS`)."""
    global _interop
    _interop = hooks


def _hooks() -> Any:
    if _interop is None:  # pragma: no cover - ``import ggmlpy`` installs them
        raise RuntimeError("tensor interop is not installed: import ggmlpy (it imports "
                           "ggmlpy.backends.interop)")
    return _interop


MAX_DIMS = 4
MAX_SRC = 10
MAX_NAME = 64  # ggml's GGML_MAX_NAME: 63 characters + NUL


class Flag(IntFlag):
    """Tensor flags (mirrors ``enum ggml_tensor_flag``)."""

    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


_UNTRACKED = frozenset(("name", "buffer", "offset"))  # unread, or properties over _buffer/_offset
_VALUE_FIELDS = frozenset(("type", "ne", "nb", "op", "view_offs", "flags", "_offset"))  # compared by ==
_MISSING = object()
_tracked = TrackedList.of
_gen_lock = _snapshot._lock


def nbytes_of(type: Type, ne: Sequence[int], nb: Sequence[int]) -> int:
    """Byte extent of a tensor with this type, shape and strides (mirrors ``ggml_nbytes``).

    Valid for strided views: it is the distance from the first byte to one past the last byte,
    not ``nelements * type_size``. Returns 0 if any ``ne[i] <= 0``.
    """
    if min(ne) <= 0:
        return 0
    blck = type.blck_size
    if blck == 1:
        n = type.type_size
        for i in range(MAX_DIMS):
            n += (ne[i] - 1) * nb[i]
        return n
    n = ne[0] * nb[0] // blck
    for i in range(1, MAX_DIMS):
        n += (ne[i] - 1) * nb[i]
    return n


#: Largest element count and byte extent of a tensor (ggml's ``int64_t``/``size_t`` arithmetic).
MAX_EXTENT = 2**63 - 1


def _check_extent(type: Type, ne: Sequence[int], nb: Sequence[int], what: str) -> None:
    """ValueError naming ``what``, the type and ``ne`` when the element count or the byte
    extent of a tensor overflows int64 (ggml would overflow ``int64_t``/``size_t`` silently)."""
    n = 1
    for v in ne:
        n *= v
    size = nbytes_of(type, ne, nb)
    if n > MAX_EXTENT or size > MAX_EXTENT:
        raise ValueError(f"{what}: a {type.type_name} tensor with ne={list(ne)} has {n} elements "
                         f"and {size} bytes, more than 2**63-1 (int64 overflow)")


def _packed_strides(type: Type, ne: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    nb0 = type.type_size
    nb1 = nb0 * (ne[0] // type.blck_size)
    nb2 = nb1 * ne[1]
    return (nb0, nb1, nb2, nb2 * ne[2])


class Tensor:
    """One tensor's metadata (mirrors ``struct ggml_tensor``). Create tensors through a :class:`Context`
    or the op functions in :mod:`ggmlpy.ops`, never directly.

    Attributes:
        type: element :class:`~ggmlpy.core.types.Type`.
        ne: ``(ne0, ne1, ne2, ne3)`` element counts, ``ne0`` innermost; NumPy shape is ``ne[::-1]``.
        nb: ``(nb0, nb1, nb2, nb3)`` strides in **bytes**; NumPy strides are ``nb[::-1]``.
        op: the :class:`~ggmlpy.core.opcodes.Op` producing this tensor (``Op.NONE`` for leaves).
        op_params: the op's parameters in ggml's slot order, as Python ints/floats (ggml stores them
            bit-wise in int32 slots; here each slot holds its typed value).
        src: the op's sources, at most :data:`MAX_SRC`; entries may be ``None`` (optional sources).
        view_src: the **root** tensor whose memory this view aliases, or ``None``. Views of views
            are flattened to the root.
        view_offs: byte offset of this view into ``view_src``.
        flags: :class:`Flag` bits (INPUT, OUTPUT, PARAM, ...).
        name: up to 63 characters.
        buffer: the backend buffer holding the data, or ``None`` while unallocated. For a view it is
            its ``view_src``'s buffer once the view is initialised.
        offset: byte offset of element 0 from the buffer's base (ggml's ``data`` pointer), or
            ``None`` while unallocated.
    """

    __slots__ = ("type", "ne", "nb", "op", "op_params", "src", "view_src", "view_offs", "flags",
                 "name", "_buffer", "_offset", "_ver", "__weakref__")

    def __init__(self, type: Type, ne: tuple[int, int, int, int], nb: tuple[int, int, int, int],
                 view_src: Tensor | None = None, view_offs: int = 0) -> None:
        # a new tensor is in no snapshot yet: set the slots directly, without bumping
        osa = object.__setattr__
        osa(self, "type", type)
        osa(self, "ne", ne)
        osa(self, "nb", nb)
        osa(self, "op", Op.NONE)
        osa(self, "op_params", [])  # plain lists until a snapshot publishes the tensor
        osa(self, "src", [])
        osa(self, "view_src", view_src)
        osa(self, "view_offs", view_offs)
        osa(self, "flags", Flag(0))
        osa(self, "name", "")
        osa(self, "_buffer", None)
        osa(self, "_offset", None)
        osa(self, "_ver", -1)  # generation of the last change; -1: in no snapshot yet (ggmlpy.core.snapshot)

    def __setattr__(self, key: str, value: Any) -> None:
        """Set a field. Once a snapshot has recorded the tensor (:mod:`ggmlpy.core.snapshot`), a real
        change of a field a cache reads stamps it with a new generation, and ``op_params`` and
        ``src`` are tracked lists, so ``t.op_params[i] = v`` and ``t.src[i] = s`` stamp it too.
        Before that, assignments are plain (graph building stays cheap)."""
        if self._ver < 0 or key in _UNTRACKED:  # in no snapshot yet: nothing can depend on it
            object.__setattr__(self, key, value)
            return
        if key == "op_params" or key == "src":
            value = _tracked(value, self)
        else:
            try:
                old = object.__getattribute__(self, key)
            except AttributeError:
                old = _MISSING
            if old is value or (key in _VALUE_FIELDS and type(old) is type(value) and old == value):
                return
        object.__setattr__(self, key, value)
        with _gen_lock:  # inline snapshot.touch(self): this is on every graph-building path
            _snapshot._generation += 1
            object.__setattr__(self, "_ver", _snapshot._generation)

    @property
    def buffer(self) -> Buffer | None:
        """The backend buffer holding the data (for views: the ``view_src``'s), or None."""
        return self._buffer

    @buffer.setter
    def buffer(self, value: Buffer | None) -> None:
        self._buffer = value

    @property
    def offset(self) -> int | None:
        """Byte offset of element 0 from the buffer's base (ggml's ``data``), or None."""
        return self._offset

    @offset.setter
    def offset(self, value: int | None) -> None:
        self._offset = value

    # -- size and shape -------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Byte extent of the tensor (mirrors ``ggml_nbytes``; valid for strided views)."""
        return nbytes_of(self.type, self.ne, self.nb)

    @property
    def nelements(self) -> int:
        """Number of elements ``ne0*ne1*ne2*ne3`` (mirrors ``ggml_nelements``)."""
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    @property
    def nrows(self) -> int:
        """Number of rows ``ne1*ne2*ne3`` (mirrors ``ggml_nrows``)."""
        ne = self.ne
        return ne[1] * ne[2] * ne[3]

    @property
    def n_dims(self) -> int:
        """1 + index of the highest dimension with ``ne > 1``; 1 for scalars (mirrors ``ggml_n_dims``)."""
        for i in range(MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy shape of the tensor: ``ne`` reversed, always 4 axes ``(ne3, ne2, ne1, ne0)``."""
        return self.ne[::-1]

    def row_size(self) -> int:
        """Bytes of one packed row of ``ne0`` elements (``ggml_row_size(type, ne0)``)."""
        return self.type.row_size(self.ne[0])

    # -- predicates -----------------------------------------------------------------------------
    @property
    def is_view(self) -> bool:
        """True when the tensor aliases ``view_src``'s memory (mirrors ``ggml_is_view``)."""
        return self.view_src is not None

    @property
    def is_allocated(self) -> bool:
        """True when the tensor has memory: ``buffer`` and ``offset`` are set."""
        return self.offset is not None and self.buffer is not None

    def is_empty(self) -> bool:
        """True when some ``ne[i] == 0`` (mirrors ``ggml_is_empty``)."""
        return min(self.ne) == 0

    def is_transposed(self) -> bool:
        """``nb[0] > nb[1]`` (mirrors ``ggml_is_transposed``)."""
        return self.nb[0] > self.nb[1]

    def is_permuted(self) -> bool:
        """Some ``nb[i] > nb[i+1]`` (mirrors ``ggml_is_permuted``)."""
        nb = self.nb
        return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]

    def _is_contiguous_n(self, n: int) -> bool:
        # ggml_is_contiguous_n: dim 0 packed; dims 1..n have free strides (the next expected
        # stride becomes ne[i]*nb[i], even when ne[i] == 1); dims above n must sit at the expected
        # stride unless ne[i] == 1, and always advance it by ne[i].
        ne, nb, ts = self.ne, self.nb, self.type.type_size
        if ne[0] != self.type.blck_size and nb[0] != ts:
            return False
        expect = ts * (ne[0] // self.type.blck_size)
        for i in (1, 2, 3):
            if i <= n:
                expect = ne[i] * nb[i]
            else:
                if ne[i] != 1 and nb[i] != expect:
                    return False
                expect *= ne[i]
        return True

    def is_contiguous(self) -> bool:
        """Dense in ggml's order; a dim with ``ne == 1`` may have any stride (mirrors ``ggml_is_contiguous``)."""
        return self._is_contiguous_n(0)

    def is_contiguous_1(self) -> bool:
        """Rows packed; dim-1 stride free; dims 2-3 packed relative to ``ne1*nb1`` (also when
        ``ne1 == 1``: then dim 2's expected stride is ``nb1``); size-1 dims 2-3 may have any stride
        (mirrors ``ggml_is_contiguous_1``)."""
        return self._is_contiguous_n(1)

    def is_contiguous_2(self) -> bool:
        """Rows packed; dims 1-2 free; dim 3 packed relative to ``ne2*nb2`` unless ``ne3 == 1``
        (mirrors ``ggml_is_contiguous_2``)."""
        return self._is_contiguous_n(2)

    def is_contiguous_rows(self) -> bool:
        """Elements inside a row are packed (mirrors ``ggml_is_contiguous_rows``)."""
        return self.ne[0] == self.type.blck_size or self.nb[0] == self.type.type_size

    def is_contiguously_allocated(self) -> bool:
        """No gaps in memory, permutation allowed (mirrors ``ggml_is_contiguously_allocated``)."""
        return self.nbytes == self.nelements * self.type.type_size // self.type.blck_size

    @checked_args
    def are_same_shape(self, other: Tensor) -> bool:
        """Equal ``ne`` (mirrors ``ggml_are_same_shape``)."""
        return self.ne == other.ne

    @checked_args
    def are_same_layout(self, other: Tensor) -> bool:
        """Equal type, ``ne`` and ``nb`` (mirrors ``ggml_are_same_layout``)."""
        return self.type == other.type and self.ne == other.ne and self.nb == other.nb

    @checked_args
    def can_repeat_to(self, other: Tensor) -> bool:
        """True when this tensor tiles ``other``: every ``other.ne[i] % self.ne[i] == 0``
        (mirrors ``ggml_can_repeat(self, other)``; an empty tensor only repeats to an empty one)."""
        if self.is_empty():
            return other.is_empty()
        return all(o % s == 0 for s, o in zip(self.ne, other.ne))

    # -- flags and names ------------------------------------------------------------------------
    @checked_args
    def set_name(self, name: str) -> Tensor:
        """Set the name, truncated to 63 characters (mirrors ``ggml_set_name``); returns ``self``."""
        self.name = str(name)[: MAX_NAME - 1]
        return self

    def set_input(self) -> Tensor:
        """Flag as a graph input (mirrors ``ggml_set_input``); returns ``self``."""
        self.flags |= Flag.INPUT
        return self

    def set_output(self) -> Tensor:
        """Flag as a graph output, and its ``view_src`` too (mirrors ``ggml_set_output``); returns ``self``."""
        self.flags |= Flag.OUTPUT
        if self.view_src is not None:
            self.view_src.flags |= Flag.OUTPUT
        return self

    def set_param(self) -> Tensor:
        """Flag as a trainable parameter (mirrors ``ggml_set_param``).

        Raises:
            ValueError: if the tensor is the result of an op (ggml allows PARAM only on leaves).
        """
        if self.op != Op.NONE:
            raise ValueError(f"set_param: tensor '{self.name}' has op {self.op.name}; "
                             "only op NONE tensors can be parameters")
        self.flags |= Flag.PARAM
        return self

    # -- zero-copy interop (ggmlpy.backends.interop) ----------------------------------------------
    def numpy(self) -> Any:
        """A NumPy view (shape ``ne[::-1]``, strides ``nb[::-1]`` bytes) of the tensor in a host
        buffer; writes go to the tensor. Valid until its memory is reused (the next evaluation for
        an intermediate). Raises NotAllocatedError (unallocated/freed) or TypeError (device
        memory, quantized). See :mod:`ggmlpy.backends.interop`."""
        return _hooks().numpy(self)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """``np.asarray(tensor)``: the host view, or a copy for device memory (``copy=False``
        then raises ValueError)."""
        return _hooks().array(self, dtype, copy)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3 of a tensor in CUDA device memory (``stream``: the producing
        backend's stream); AttributeError elsewhere. See :mod:`ggmlpy.backends.interop`."""
        return _hooks().cuda_array_interface(self)

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        """A DLPack capsule sharing the tensor's memory (host or CUDA); ``stream`` as in the
        DLPack protocol. See :mod:`ggmlpy.backends.interop`."""
        return _hooks().dlpack(self, stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)`` of the tensor's memory (1: CPU, 2: CUDA)."""
        return _hooks().dlpack_device(self)

    def __repr__(self) -> str:
        name = f" '{self.name}'" if self.name else ""
        alloc = "" if self.offset is None else f" @{self.offset}"
        return (f"<Tensor{name} {self.type.type_name} ne={list(self.ne)} nb={list(self.nb)} "
                f"op={self.op.name}{alloc}>")


def _check_ne(ne: Sequence[int], what: str) -> tuple[int, int, int, int]:
    if isinstance(ne, int):
        ne = (ne,)
    ne = tuple(ne)
    if not 1 <= len(ne) <= MAX_DIMS:
        raise ValueError(f"{what}: ne must have 1 to {MAX_DIMS} entries, got {len(ne)}")
    out = []
    for v in ne:
        if isinstance(v, bool) or not isinstance(v, int):
            try:
                iv = int(v)
            except (TypeError, ValueError):
                raise TypeError(f"{what}: ne entries must be ints, got {v!r}") from None
            if iv != v:
                raise TypeError(f"{what}: ne entries must be ints, got {v!r}")
            v = iv
        if v < 0:
            raise ValueError(f"{what}: ne entries must be >= 0, got {list(ne)}")
        out.append(int(v))
    while len(out) < MAX_DIMS:
        out.append(1)
    return tuple(out)  # type: ignore[return-value]


class Context:
    """Owns tensor metadata and creates tensors (mirrors ``struct ggml_context`` / ``ggml_init``).

    Args:
        no_alloc: when True (the default, and always the case with backends) tensors get no memory
            until an allocator or ``backend_alloc_ctx_tensors`` places them. When False, every new
            non-view tensor gets its own zero-filled host buffer (ggml's ``mem_buffer`` mode) so it
            can be filled with ``backend_tensor_set`` at once.

    Tensors are kept in creation order (``ggml_get_first_tensor``/``ggml_get_next_tensor``); iterate
    the context to walk them.
    """

    def __init__(self, no_alloc: bool = True) -> None:
        self.no_alloc = bool(no_alloc)
        self.tensors: list[Tensor] = []

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @checked_args
    def get_tensor(self, name: str) -> Tensor | None:
        """The first tensor named ``name``, or None (mirrors ``ggml_get_tensor``)."""
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def _add(self, t: Tensor) -> Tensor:
        if not self.no_alloc and t.view_src is None and t.nbytes > 0:
            if _host_buffer_alloc is None:  # only when ggmlpy.backends.cpu.backend was never imported
                raise RuntimeError("Context(no_alloc=False) needs the CPU backend: import ggmlpy "
                                   "(or ggmlpy.backends.cpu.backend) first")
            try:
                mem = _host_buffer_alloc(t.nbytes)
            except (MemoryError, ValueError) as e:  # NumPy: "array is too big", "Maximum ..."
                raise OutOfMemoryError("Context(no_alloc=False)", t.nbytes, None,
                                       f"new {t.type.type_name} tensor with ne={list(t.ne)}: "
                                       f"{e}") from e
            t.buffer, t.offset = mem, 0
        elif t.view_src is not None and t.view_src.is_allocated:
            # ggml sets a view's data from an allocated view_src at creation
            t.buffer, t.offset = t.view_src.buffer, t.view_src.offset + t.view_offs
        self.tensors.append(t)  # last: a failed allocation leaves the context unchanged
        return t

    @checked_args
    def new_tensor(self, type: Type, ne: Sequence[int]) -> Tensor:
        """A new packed tensor (mirrors ``ggml_new_tensor``).

        Args:
            type: element type.
            ne: 1 to 4 element counts in ggml order (``ne0`` innermost); the NumPy shape of the
                result is ``ne`` reversed and padded with 1s to 4 axes.

        Raises:
            ValueError: bad ``ne`` length, negative counts, or ``ne0`` not a multiple of the
                type's block size. TypeError: ``type`` is not a :class:`Type`.
        """
        return self._new(type, _check_ne(ne, "new_tensor"))

    @checked_args
    def new_tensor_1d(self, type: Type, ne0: int) -> Tensor:
        """A new packed 1-D tensor ``[ne0]`` (NumPy shape ``(ne0,)``; mirrors ``ggml_new_tensor_1d``)."""
        return self.new_tensor(type, (ne0,))

    @checked_args
    def new_tensor_2d(self, type: Type, ne0: int, ne1: int) -> Tensor:
        """A new packed 2-D tensor ``[ne0, ne1]`` (NumPy shape ``(ne1, ne0)``; mirrors ``ggml_new_tensor_2d``)."""
        return self.new_tensor(type, (ne0, ne1))

    @checked_args
    def new_tensor_3d(self, type: Type, ne0: int, ne1: int, ne2: int) -> Tensor:
        """A new packed 3-D tensor ``[ne0, ne1, ne2]`` (NumPy ``(ne2, ne1, ne0)``; mirrors ``ggml_new_tensor_3d``)."""
        return self.new_tensor(type, (ne0, ne1, ne2))

    @checked_args
    def new_tensor_4d(self, type: Type, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
        """A new packed 4-D tensor (NumPy ``(ne3, ne2, ne1, ne0)``; mirrors ``ggml_new_tensor_4d``)."""
        return self.new_tensor(type, (ne0, ne1, ne2, ne3))

    @checked_args
    def dup_tensor(self, src: Tensor) -> Tensor:
        """A new packed tensor with ``src``'s type and shape, no data (mirrors ``ggml_dup_tensor``)."""
        return self._new(src.type, src.ne)

    @checked_args
    def dup_tensor_layout(self, src: Tensor) -> Tensor:
        """A new tensor with ``src``'s type, ``ne`` and ``nb`` (strides kept, possibly not packed),
        no data (mirrors ``ggml_dup_tensor_layout``). Used for copies that must match byte for byte."""
        return self._add(Tensor(src.type, src.ne, src.nb))

    def _new(self, type: Type, ne: tuple[int, int, int, int]) -> Tensor:
        if not isinstance(type, Type):
            try:
                type = Type(type)
            except ValueError:
                raise TypeError(f"new_tensor: {type!r} is not a ggmlpy Type") from None
        if ne[0] % type.blck_size:
            raise ValueError(f"new_tensor: ne0={ne[0]} is not a multiple of the block size "
                             f"{type.blck_size} of {type.type_name}")
        nb = _packed_strides(type, ne)
        _check_extent(type, ne, nb, "new_tensor")
        return self._add(Tensor(type, ne, nb))

    @checked_args
    def new_view(self, src: Tensor, type: Type, ne: Sequence[int], nb: Sequence[int] | None,
                 offset: int) -> Tensor:
        """A tensor aliasing ``src``'s memory at byte ``offset`` (ggml's ``ggml_new_tensor_impl``
        with a ``view_src``). Views of views are flattened: the result's ``view_src`` is the root.

        Args:
            src: tensor whose memory is viewed.
            type: element type of the view.
            ne: 1-4 element counts of the view.
            nb: byte strides, or None for packed strides.
            offset: byte offset into ``src`` (not into the root).

        Raises:
            ValueError: when the packed size of ``ne`` plus the offset exceeds the root's
                ``nbytes`` (ggml's check in ``ggml_new_tensor_impl``), or a negative offset.
        """
        ne4 = _check_ne(ne, "view")
        if offset < 0:
            raise ValueError(f"view of '{src.name}': negative offset {offset}")
        root, offs = src, int(offset)
        if src.view_src is not None:
            root, offs = src.view_src, offs + src.view_offs
        packed = nbytes_of(type, ne4, _packed_strides(type, ne4))
        if packed + offs > root.nbytes:
            raise ValueError(f"view of '{src.name or root.name}' out of bounds: "
                             f"{packed} bytes at offset {offs} exceed the {root.nbytes} bytes "
                             f"of '{root.name}'")
        nb4 = _packed_strides(type, ne4) if nb is None else tuple(int(x) for x in nb)
        if len(nb4) != MAX_DIMS:
            raise ValueError(f"view of '{src.name}': nb must have {MAX_DIMS} entries")
        _check_extent(type, ne4, nb4, f"view of '{src.name or root.name}'")
        t = Tensor(type, ne4, nb4, view_src=root, view_offs=offs)  # type: ignore[arg-type]
        return self._add(t)
