"""Guarded allocation: every tensor of a case placed in one buffer with sentinel bytes around it.

ggml's test-backend-ops creates a 1024-float sentinel tensor after every input and compares the
sentinels between backends. ggmlpy places the tensors itself (``tensor_alloc`` at padded offsets)
and surrounds each one with guard regions filled with a known byte pattern: the region right
after a tensor starts at its last byte + 1 (not aligned), so writing one element past the end of
any tensor changes a guard byte. After compute, :meth:`GuardedAllocation.check` reads every
guard back and names the tensor whose neighbourhood was overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggmlpy.backend.interface import Backend, Buffer, tensor_alloc, view_init
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type

__all__ = ["GUARD_BYTES", "GuardedAllocation", "guarded_alloc", "guard_pattern"]

#: Bytes of sentinel at least before and after every tensor.
GUARD_BYTES = 64


def guard_pattern(n: int) -> np.ndarray:
    """The sentinel bytes (a non-constant pattern, so neither zero fills nor one-value memsets
    can pass for it): ``(37*i + 0xA5) mod 256``."""
    return ((np.arange(n, dtype=np.int64) * 37 + 0xA5) & 0xFF).astype(np.uint8)


@dataclass
class _Guard:
    tensor: Tensor
    after: str | None   # name of the tensor just before this region (an overflow of it)
    before: str | None  # name of the tensor just after this region (an underflow of it)


@dataclass
class GuardedAllocation:
    """A case's tensors in one buffer with guard regions (see the module docstring).

    Attributes:
        buffer: the backend buffer (free it with :meth:`free`).
        guards: the guard regions, as I8 tensors of a private context.
    """

    buffer: Buffer
    guards: list[_Guard]
    _ctx: Context

    def check(self) -> list[str]:
        """Read every guard back (blocking); one message per overwritten region, naming the
        neighbouring tensors and the first changed byte. Empty when all guards are intact."""
        bad: list[str] = []
        for g in self.guards:
            got = np.asarray(backend_tensor_get(g.tensor)).view(np.uint8).reshape(-1)
            want = guard_pattern(got.size)
            diff = np.nonzero(got != want)[0]
            if diff.size:
                where = []
                if g.after is not None:
                    where.append(f"{int(diff[0])} bytes past the end of '{g.after}'")
                if g.before is not None:
                    where.append(f"{got.size - int(diff[-1])} bytes before '{g.before}'")
                bad.append(f"guard bytes overwritten ({diff.size} bytes; first at "
                           f"{' / '.join(where)})")
        return bad

    def free(self) -> None:
        """Release the buffer."""
        self.buffer.free()


def guarded_alloc(ctx: Context, backend: Backend, guard: int = GUARD_BYTES) -> GuardedAllocation:
    """Place every tensor of ``ctx`` in one new buffer of ``backend``'s default buffer type with
    at least ``guard`` sentinel bytes before and after each non-view tensor; views are
    initialised over their sources. Synchronous.

    Raises:
        OutOfMemoryError: the buffer could not be allocated.
        ValueError: a tensor of ``ctx`` already has memory.
    """
    buft = backend.get_default_buffer_type()
    align = max(1, buft.get_alignment())
    roots = [t for t in ctx if t.view_src is None]
    placements: list[tuple[Tensor, int]] = []
    regions: list[tuple[int, int, str | None, str | None]] = []
    cur, prev = 0, None
    for t in roots:
        start = -(-(cur + guard) // align) * align
        regions.append((cur, start - cur, prev, t.name))
        placements.append((t, start))
        # the guard starts right after the last byte, inside any padding the buffer type asks for
        cur = start + t.nbytes
        reserve = start + buft.get_alloc_size(t)
        prev = t.name
        if reserve > cur + guard:  # keep the padding itself outside the checked region
            regions.append((cur, guard, prev, None))
            cur = reserve
            prev = None
    regions.append((cur, guard, prev, None))
    buf = buft.alloc_buffer(cur + guard)
    try:
        for t, off in placements:
            tensor_alloc(buf, t, off)
        for t in ctx:
            if t.view_src is not None:
                view_init(t)
        gctx = Context(no_alloc=True)
        guards = []
        for off, size, after, before in regions:
            g = gctx.new_tensor(Type.I8, (size,))
            g.set_name(f"guard@{off}")
            tensor_alloc(buf, g, off)
            backend_tensor_set(g, guard_pattern(size))
            guards.append(_Guard(g, after, before))
    except BaseException:
        buf.free()
        raise
    return GuardedAllocation(buf, guards, gctx)
