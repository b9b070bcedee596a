"""The compute-buffer address planner of the graph allocator (ggml-alloc's ``ggml_dyn_tallocr``).

Planning only: :class:`_DynAllocator` hands out ``(chunk, offset)`` addresses in bytes over up
to :data:`MAX_CHUNKS` chunks with ggml's best-fit rules and holds no memory;
:class:`~ggmlpy.alloc.gallocr.GraphAllocator` (which re-exports these names) turns the plan into
backend buffers.
"""

from __future__ import annotations

import sys

__all__ = ["MAX_CHUNKS"]

#: Largest number of chunks (backend buffers) one buffer type's plan may use (mirrors
#: ``GGML_VBUFFER_MAX_CHUNKS``). The last chunk is unbounded, so planning never fails by itself.
MAX_CHUNKS = 16

# ggml's SIZE_MAX / 2: the size of an "unbounded" free block.
_UNBOUNDED = sys.maxsize


def _pad(size: int, align: int) -> int:
    """``size`` rounded up to a multiple of ``align`` (ggml's ``GGML_PAD`` / ``aligned_offset``)."""
    return (size + align - 1) // align * align


class _Chunk:
    """One planned chunk: sorted free blocks ``[offset, size]`` and the high-water mark."""

    __slots__ = ("blocks", "max_size")

    def __init__(self, size: int) -> None:
        self.blocks: list[list[int]] = [[0, size]]
        self.max_size = 0


class _DynAllocator:
    """Address planner over up to :data:`MAX_CHUNKS` chunks (mirrors ``ggml_dyn_tallocr``).

    Plans ``(chunk, offset)`` addresses; holds no memory. Every size is rounded up to
    ``alignment`` on alloc and on free. Best fit follows ggml exactly, quirks included (see
    :meth:`alloc`). ggml's limit of 256 free blocks per chunk (an abort) is not enforced; it never
    changes a layout.
    """

    __slots__ = ("alignment", "max_chunk_size", "chunks")

    def __init__(self, alignment: int, max_size: int) -> None:
        self.alignment = int(alignment)
        self.max_chunk_size = min(int(max_size), _UNBOUNDED)
        self.chunks: list[_Chunk] = []

    def reset(self) -> None:
        """Forget every chunk (mirrors ``ggml_dyn_tallocr_reset``)."""
        self.chunks = []

    def _new_chunk(self, min_size: int) -> int:
        if len(self.chunks) >= MAX_CHUNKS:  # unreachable: the last chunk is unbounded
            raise RuntimeError("graph allocation: more than MAX_CHUNKS chunks")
        size = max(min_size, self.max_chunk_size)
        if len(self.chunks) == MAX_CHUNKS - 1:
            size = _UNBOUNDED
        self.chunks.append(_Chunk(size))
        return len(self.chunks) - 1

    def alloc(self, size: int) -> tuple[int, int]:
        """Plan ``size`` bytes; returns ``(chunk, offset)`` (mirrors ``ggml_dyn_tallocr_alloc``).

        1. Best fit among every chunk's blocks except each chunk's last one; ties go to the later
           block, and the best size is reset per chunk, so a later chunk's fitting block wins.
        2. Else the last block of a chunk, scored ``chunk.max_size - block.offset - size``: the
           smallest non-negative score (fits under the high-water mark), else the largest
           negative one (least growth).
        3. Else a new chunk.
        """
        size = _pad(size, self.alignment)
        best_c = best_b = -1
        for c, chunk in enumerate(self.chunks):
            best_size = _UNBOUNDED + 1  # SIZE_MAX
            blocks = chunk.blocks
            for i in range(len(blocks) - 1):
                bsize = blocks[i][1]
                if bsize >= size and bsize <= best_size:
                    best_c, best_b, best_size = c, i, bsize
        if best_b == -1:
            best_reuse: int | None = None  # INT64_MIN
            for c, chunk in enumerate(self.chunks):
                if not chunk.blocks:
                    continue
                last = len(chunk.blocks) - 1
                boff, bsize = chunk.blocks[last]
                reuse = chunk.max_size - boff - size
                if best_reuse is None:
                    better = True
                else:
                    better = ((best_reuse < 0 and reuse > best_reuse)
                              or (reuse >= 0 and reuse < best_reuse))
                if bsize >= size and better:
                    best_c, best_b, best_reuse = c, last, reuse
        if best_b == -1:
            best_c, best_b = self._new_chunk(size), 0
        chunk = self.chunks[best_c]
        block = chunk.blocks[best_b]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del chunk.blocks[best_b]
        chunk.max_size = max(chunk.max_size, offset + size)
        return best_c, offset

    def free(self, chunk_id: int, offset: int, size: int) -> None:
        """Return ``size`` bytes at ``(chunk_id, offset)``, merging neighbours (mirrors
        ``ggml_dyn_tallocr_free_bytes``)."""
        size = _pad(size, self.alignment)
        blocks = self.chunks[chunk_id].blocks
        n = len(blocks)
        for i in range(n):
            block = blocks[i]
            if block[0] + block[1] == offset:
                block[1] += size
                if i < n - 1 and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < n and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])

    def chunk_max_size(self, c: int) -> int:
        """High-water mark of chunk ``c``; 0 if it does not exist (``ggml_dyn_tallocr_max_size``)."""
        return self.chunks[c].max_size if c < len(self.chunks) else 0

    @property
    def total_size(self) -> int:
        """Sum of the chunks' high-water marks, in bytes."""
        return sum(c.max_size for c in self.chunks)
