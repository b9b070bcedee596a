"""The kernel registry: one entry per op, holding the kernel factory and its support predicate.

Every family module registers its kernels here with :func:`kernel`::

    @kernel(Op.ADD, supports=_sup_binary)
    def _k_add(xp, node, dst, srcs): ...

The registry is the single source of truth for op support: :func:`supports_op` answers from the
predicates, :func:`compile_node` dispatches to the factories, and the README's "Supported ops per
backend" table is generated from :func:`supports_op` (:mod:`ggmlpy.testops.support_table`).

Overrides: a runtime-specific kernel (the fused CUDA kernels of
:mod:`ggmlpy.backends.cuda.kernels`) is stacked in front of an op's generic entry with
:meth:`KernelRegistry.override`. :meth:`KernelRegistry.compile_node` and
:meth:`KernelRegistry.supports_op` try the overrides of the op in registration order, the first
whose predicate says yes wins, then the generic entry. An override's predicate decides alone
(the blanket refusal of quantized/BF16 tensors applies to generic entries only), so it must test
the array module itself (``is_cuda(xp) and ...``).

A predicate ``pred(node, xp) -> bool`` sees the array module the kernel would run with
(``numpy`` for CPU and SIM, ``cupy`` for CUDA), so one runtime can declare its own gaps
(``return not is_numpy(xp) and ...``) without touching the others.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ggmlpy.backends.kernels.bounds import WRAPPERS
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

__all__ = ["Step", "Kernel", "Predicate", "KernelEntry", "KernelRegistry", "REGISTRY", "kernel",
           "compile_node", "supports_op", "registered_ops"]

#: a compiled node: a zero-argument closure computing it into its destination view
Step = Callable[[], None]
#: ``make(xp, node, dst, srcs) -> Step | None``: resolves one node into a :data:`Step`
Kernel = Callable[[Any, Tensor, Any, list[Any]], "Step | None"]
#: ``supports(node, xp) -> bool``: whether the kernel computes ``node`` with array module ``xp``
Predicate = Callable[[Tensor, Any], bool]

#: ops that compute nothing (leafs and views): supported for every type and array module
_NO_COMPUTE = (Op.NONE, Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE)


@dataclass(frozen=True)
class KernelEntry:
    """One registered kernel: the op, the factory ``make(xp, node, dst, srcs)``, the predicate
    ``supports(node, xp)`` and ``any_type``: True when the predicate itself decides on BF16 and
    block-quantized tensors (otherwise the registry refuses them before asking it)."""

    op: Op
    make: Kernel
    supports: Predicate
    any_type: bool = False


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

    def override(self, op: Op, make: Kernel, supports: Predicate) -> None:
        """Stack ``make`` in front of ``op``'s generic kernel for the nodes where
        ``supports(node, xp)`` is True (e.g. a fused CUDA kernel, used only when ``xp`` is CuPy).

        Overrides of one op are tried in registration order; the first whose predicate is True
        wins, else the generic entry applies. Unlike generic entries, an override is consulted
        for quantized/BF16 nodes too: its predicate must refuse what it cannot compute.

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
        stack.append(KernelEntry(op, make, supports))

    def overrides(self, op: Op) -> tuple[KernelEntry, ...]:
        """The overrides stacked on ``op``, in the order they are tried."""
        return tuple(self._overrides.get(op, ()))

    def entry(self, op: Op) -> KernelEntry | None:
        """The generic entry registered for ``op`` (without overrides), or None."""
        return self._entries.get(op)

    def select(self, node: Tensor, xp: Any) -> KernelEntry | None:
        """The entry that computes ``node`` with ``xp``: the first override of its op whose
        predicate is True (a predicate raising ValueError/TypeError/IndexError counts as False),
        else the generic entry (None when the op has none). Does not check the generic entry's
        predicate."""
        for e in self._overrides.get(node.op, ()):
            try:
                if e.supports(node, xp):
                    return e
            except (ValueError, TypeError, IndexError):
                continue
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
        e = self.select(node, xp)
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
        means "not supported". An override (:meth:`override`) whose predicate says yes makes the
        node supported first."""
        op = node.op
        if op in _NO_COMPUTE:
            return True
        e = self.select(node, xp)
        if e is None:
            return False
        if e is not self._entries.get(op):
            return True  # an override's predicate already said yes
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
