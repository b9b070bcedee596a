"""The kernel registry: one entry per op, holding the kernel factory and its support predicate.

Every family module registers its kernels here with :func:`kernel`::

    @kernel(Op.ADD, supports=_sup_binary)
    def _k_add(xp, node, dst, srcs): ...

The registry is the single source of truth for op support: :func:`supports_op` answers from the
predicates, :func:`compile_node` dispatches to the factories, and the README's "Supported ops per
backend" table is generated from :func:`supports_op` (:mod:`ggmlpy.testops.support_table`).

Variants: every other implementation of an op is an override stacked in front of its generic
entry with :meth:`KernelRegistry.override`, each with a name and its predicate, so "which kernel
computes this node" is one lookup, :meth:`KernelRegistry.select` (``python -m ggmlpy
test-backend-ops --kernels`` lists it per case). :func:`ggmlpy.backends.install` stacks them:

* the fused one-launch CUDA kernels (:mod:`ggmlpy.backends.cuda.kernels`, CuPy only): their
  predicate decides support alone (the blanket refusal of quantized/BF16 tensors applies to
  generic entries only), so it tests the array module itself (``is_cuda(xp) and ...``);
* the CPU's Numba kernels (``GGMLPY_JIT``), the float32 fast paths and the float64 referee
  chosen by ``GGMLPY_PRECISE_KERNELS`` (:mod:`ggmlpy.backends.cpu.variants`): they *narrow*
  the generic entry (``narrows=True``: they compute only nodes the generic entry supports, so
  support is the generic entry's answer) and may also require a layout of the actual arrays
  (``fits(dst, srcs)``: contiguity, a broadcast shape), since a threaded CPU plan compiles row
  slices of a node.

:meth:`KernelRegistry.select` tries the overrides of the op in registration order; the first
whose predicate (and ``fits``, when it has one) says yes wins, else the generic entry.

A predicate ``pred(node, xp) -> bool`` sees the array module the kernel would run with
(``numpy`` for CPU and SIM, ``cupy`` for CUDA), so one runtime can declare its own gaps
(``return not is_numpy(xp) and ...``) without touching the others.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ggmlpy.backends.kernels.bounds import WRAPPERS
from ggmlpy.core.env import EnvError
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

__all__ = ["Step", "Kernel", "Predicate", "Fits", "layout_arrays", "KernelEntry", "KernelRegistry", "REGISTRY", "kernel",
           "compile_node", "supports_op", "registered_ops"]

#: a compiled node: a zero-argument closure computing it into its destination view
Step = Callable[[], None]
#: ``make(xp, node, dst, srcs) -> Step | None``: resolves one node into a :data:`Step`
Kernel = Callable[[Any, Tensor, Any, list[Any]], "Step | None"]
#: ``supports(node, xp) -> bool``: whether the kernel computes ``node`` with array module ``xp``
Predicate = Callable[[Tensor, Any], bool]
#: ``fits(dst, srcs) -> bool``: whether a variant suits the actual arrays (layout, broadcast)
Fits = Callable[[Any, list[Any]], bool]

#: ops that compute nothing (leafs and views): supported for every type and array module
_NO_COMPUTE = (Op.NONE, Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE)


@dataclass(frozen=True)
class KernelEntry:
    """One registered kernel.

    Attributes:
        op: the op it computes.
        make: the factory ``make(xp, node, dst, srcs) -> Step | None``.
        supports: the predicate ``supports(node, xp) -> bool``.
        any_type: True when the predicate itself decides on BF16 and block-quantized tensors
            (otherwise the registry refuses them before asking it); generic entries only.
        name: what listings show: ``"generic"`` for an op's generic entry, the variant's name
            for an override (``"cuda.fused"``, ``"cpu.jit.gelu_erf"``, ...).
        fits: for an override, ``fits(dst, srcs) -> bool`` on the actual arrays (None: any).
        narrows: for an override, True when it computes a subset of the generic entry's nodes
            (:meth:`KernelRegistry.supports_op` then does not ask it).
    """

    op: Op
    make: Kernel
    supports: Predicate
    any_type: bool = False
    name: str = "generic"
    fits: Fits | None = None
    narrows: bool = False


def _check_predicate(supports: Any, ops: tuple[Op, ...]) -> None:
    if not callable(supports):
        raise TypeError(f"kernel({', '.join(o.name for o in ops)}): supports must be a callable "
                        f"pred(node, xp) -> bool, got {type(supports).__name__}")
    try:
        inspect.signature(supports).bind(None, None)
    except TypeError as e:
        raise TypeError(f"kernel({', '.join(o.name for o in ops)}): supports must accept "
                        f"(node, xp): {e}") from None
    except ValueError:  # pragma: no cover - builtins without a signature
        pass


def _layout_array(t: Tensor | None) -> Any:
    if t is None:
        return None
    try:
        dtype = np.dtype(t.type.dtype)
    except TypeError:  # block-quantized: rows of bytes, as the buffers' arrays give them
        return as_strided(np.zeros(1, np.uint8), shape=(t.ne[3], t.ne[2], t.ne[1], t.nb[1]),
                          strides=(t.nb[3], t.nb[2], t.nb[1], 1))
    return as_strided(np.zeros(1, dtype), shape=tuple(t.ne[::-1]), strides=tuple(t.nb[::-1]))


def layout_arrays(node: Tensor) -> tuple[Any, list[Any]]:
    """``(dst, srcs)``: NumPy arrays with the layout of ``node`` and of its sources (shape
    ``ne[::-1]``, strides ``nb[::-1]``, the type's dtype) over no real memory, never to be read
    or written; what :meth:`KernelRegistry.select` gives a variant's ``fits`` when no arrays are
    being compiled."""
    return _layout_array(node), [_layout_array(s) for s in node.src]


class KernelRegistry:
    """Kernels and support predicates by op: ggml's per-backend ``supports_op`` and
    ``compute_forward`` switch, as data. The package uses one instance, :data:`REGISTRY`; tests may build their own.
    """

    def __init__(self) -> None:
        self._entries: dict[Op, KernelEntry] = {}
        self._overrides: dict[Op, list[KernelEntry]] = {}

    def kernel(self, *ops: Op, supports: Predicate,
               any_type: bool = False) -> Callable[[Kernel], Kernel]:
        """Decorator registering a kernel factory for ``ops`` with predicate ``supports``.

        ``any_type=True`` declares that the predicate checks BF16 and block-quantized sources and
        destinations itself (GET_ROWS, the copies, MUL_MAT); other kernels never see them.

        Returns the factory unchanged. Raises TypeError when an op is not an :class:`Op` or the
        predicate does not take ``(node, xp)``, ValueError when no op is given, an op computes
        nothing (NONE and the view ops) or already has a kernel."""
        if not ops:
            raise ValueError("kernel(): name at least one op")
        for op in ops:
            if not isinstance(op, Op):
                raise TypeError(f"kernel(): ops must be Op members, got {op!r}")
            if op in _NO_COMPUTE:
                raise ValueError(f"kernel(): {op.name} computes nothing and takes no kernel")
            if op in self._entries:
                raise ValueError(f"kernel(): {op.name} already has a kernel "
                                 f"({self._entries[op].make.__qualname__})")
        _check_predicate(supports, ops)

        def register(make: Kernel) -> Kernel:
            if not callable(make):
                raise TypeError(f"kernel({', '.join(o.name for o in ops)}): the kernel must be "
                                f"a callable make(xp, node, dst, srcs)")
            for op in ops:
                if op in self._entries:
                    raise ValueError(f"kernel(): {op.name} already has a kernel")
                self._entries[op] = KernelEntry(op, make, supports, any_type)
            return make
        return register

    def override(self, op: Op, make: Kernel, supports: Predicate, *, name: str | None = None,
                 fits: Fits | None = None, narrows: bool = False) -> None:
        """Stack ``make`` in front of ``op``'s generic kernel for the nodes where
        ``supports(node, xp)`` is True (e.g. a fused CUDA kernel, used only when ``xp`` is CuPy)
        and, when given, ``fits(dst, srcs)`` is True for the arrays being compiled.

        Overrides of one op are tried in registration order; the first that applies wins, else
        the generic entry does. Unlike generic entries, an override is consulted for
        quantized/BF16 nodes too: its predicate must refuse what it cannot compute. With
        ``narrows`` the override computes only nodes the generic entry supports, and
        :meth:`supports_op` leaves it out. ``name`` is what :meth:`select`'s listings show (default: ``make``'s qualified name).

        Raises:
            TypeError: ``op`` is not an :class:`Op`, ``make`` is not callable or ``supports`` does
                not take ``(node, xp)``.
            ValueError: ``op`` has no generic kernel (an override only specialises one), or
                ``make`` is already an override of ``op``.
        """
        if not isinstance(op, Op):
            raise TypeError(f"override(): op must be an Op member, got {op!r}")
        if op not in self._entries:
            raise ValueError(f"override(): {op.name} has no generic kernel to override")
        if not callable(make):
            raise TypeError(f"override({op.name}): the kernel must be a callable "
                            "make(xp, node, dst, srcs)")
        _check_predicate(supports, (op,))
        stack = self._overrides.setdefault(op, [])
        if any(e.make is make for e in stack):
            raise ValueError(f"override(): {getattr(make, '__qualname__', make)!r} already "
                             f"overrides {op.name}")
        name = name or getattr(make, "__qualname__", "override")
        stack.append(KernelEntry(op, make, supports, name=name, fits=fits, narrows=narrows))

    def overrides(self, op: Op) -> tuple[KernelEntry, ...]:
        """The overrides stacked on ``op``, in the order they are tried."""
        return tuple(self._overrides.get(op, ()))

    def entry(self, op: Op) -> KernelEntry | None:
        """The generic entry registered for ``op`` (without overrides), or None."""
        return self._entries.get(op)

    def select(self, node: Tensor, xp: Any, dst: Any = None,
               srcs: list[Any] | None = None) -> KernelEntry | None:
        """The entry that computes ``node`` with ``xp``: the first override of its op whose
        predicate is True (a predicate raising ValueError/TypeError/IndexError counts as False;
        a malformed ``GGMLPY_*`` variable, :class:`~ggmlpy.core.env.EnvError`, propagates) and
        whose ``fits`` accepts the arrays, else the generic entry (None when the op has none).
        Without ``dst``/``srcs`` the arrays are the node's own layout (NumPy views of no
        memory: shape ``ne[::-1]``, strides ``nb[::-1]``). Does not check the generic entry's
        predicate."""
        for e in self._overrides.get(node.op, ()):
            try:
                if not e.supports(node, xp):
                    continue
            except EnvError:
                raise
            except (ValueError, TypeError, IndexError):
                continue
            if e.fits is not None:
                if dst is None:
                    dst, srcs = layout_arrays(node)
                if not e.fits(dst, srcs):
                    continue
            return e
        return self._entries.get(node.op)

    def ops(self) -> tuple[Op, ...]:
        """Every op with a kernel, in registration order."""
        return tuple(self._entries)

    def compile_node(self, xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step | None:
        """A closure computing ``node`` into ``dst`` from ``srcs``, made by the kernel
        :meth:`select` picks (an override whose predicate accepts ``(node, xp)``, else the
        generic kernel).

        Args:
            xp: ``numpy`` or ``cupy``.
            node: the tensor to compute (its op, op_params, types and shapes are read here, once).
            dst: ``xp`` view of the node's memory, NumPy shape ``node.ne[::-1]``, strides
                ``node.nb[::-1]`` (bytes).
            srcs: ``xp`` views of ``node.src`` (None where a source is absent).

        Returns:
            A zero-argument callable that computes the node synchronously (on CuPy: launches on
            the current stream), or None when there is nothing to compute.

        Raises:
            ValueError: no kernel for the op (callers check :meth:`supports_op` first), or a
                malformed node (e.g. a SET/ACC region outside the destination).
        """
        e = self.select(node, xp, dst, srcs)
        if e is None:
            raise ValueError(f"compile_node: no kernel for op {node.op.name} of '{node.name}'")
        step = e.make(xp, node, dst, srcs)
        wrap = WRAPPERS.get(node.op)  # index bounds checks (kernels/bounds.py)
        if wrap is not None and step is not None:
            step = wrap(xp, node, dst, srcs, step)
        return step

    def supports_op(self, node: Tensor, xp: Any) -> bool:
        """Whether ``node``'s op and type combination has a kernel for array module ``xp``
        (mirrors ``ggml_backend_supports_op``).

        NONE and the view ops (RESHAPE, VIEW, PERMUTE, TRANSPOSE) compute nothing and are
        supported for any type. Quantized and BF16 tensors are refused unless the kernel was
        registered with ``any_type=True``. Otherwise the op's predicate decides, given ``node``
        and ``xp``; a predicate that raises ValueError/TypeError/IndexError on a malformed node
        means "not supported". An override (:meth:`override`) that does not narrow and whose
        predicate says yes makes the node supported first."""
        op = node.op
        if op in _NO_COMPUTE:
            return True
        for o in self._overrides.get(op, ()):
            if o.narrows:
                continue
            try:
                if o.supports(node, xp):
                    return True  # an override that decides alone said yes
            except (ValueError, TypeError, IndexError):
                continue
        e = self._entries.get(op)
        if e is None:
            return False
        if not e.any_type:
            if node.type.is_quantized or node.type == Type.BF16:
                return False
            for s in node.src:
                if s is not None and (s.type.is_quantized or s.type == Type.BF16):
                    return False
        try:
            return bool(e.supports(node, xp))
        except (ValueError, TypeError, IndexError):
            return False


#: the registry every backend uses
REGISTRY = KernelRegistry()


def kernel(*ops: Op, supports: Predicate, any_type: bool = False) -> Callable[[Kernel], Kernel]:
    """``@kernel(Op.ADD, supports=pred)``: register a kernel in :data:`REGISTRY` (see
    :meth:`KernelRegistry.kernel`)."""
    return REGISTRY.kernel(*ops, supports=supports, any_type=any_type)


def compile_node(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step | None:
    """:meth:`KernelRegistry.compile_node` of :data:`REGISTRY` (the contract plan.py uses)."""
    return REGISTRY.compile_node(xp, node, dst, srcs)


def supports_op(node: Tensor, xp: Any) -> bool:
    """:meth:`KernelRegistry.supports_op` of :data:`REGISTRY` (CPU: ``xp = numpy``; device
    backends: their runtime's array module)."""
    return REGISTRY.supports_op(node, xp)


def registered_ops() -> tuple[Op, ...]:
    """Every op with a kernel in :data:`REGISTRY`."""
    return REGISTRY.ops()
