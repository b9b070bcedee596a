"""Oversized tensors are refused by name, never allocated anyway (issue 10, item 16).

* ``alloc_ctx_tensors_from_buft``/``_size``: a tensor larger than the buffer type's max size is
  refused with ValueError naming the tensor, its bytes and the max size (ggml logs and returns
  NULL; ggmlpy allocated it anyway). Nothing is placed.
* A buffer that cannot be allocated: the OutOfMemoryError names the largest tensor.
* Tensor creation (``new_tensor*``, views, op results) whose element count or bytes overflow
  int64: ValueError naming the type and ``ne`` (before: NumPy failed later, unnamed);
  ``Context(no_alloc=False)`` host allocation failures are an OutOfMemoryError naming the tensor.
"""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft, alloc_ctx_tensors_size
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import CPUBufferType
from ggmlpy.core.errors import OutOfMemoryError
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


class _MaxBuft(CPUBufferType):
    def __init__(self, max_size: int) -> None:
        super().__init__(f"CPU_max{max_size}", None)
        self._max = max_size

    def _get_max_size(self) -> int:
        return self._max


@pytest.mark.parametrize("fn", [alloc_ctx_tensors_from_buft, alloc_ctx_tensors_size])
def test_tensor_above_max_size_is_refused_by_name(fn):
    buft = _MaxBuft(256)
    ctx = Context()
    small = ctx.new_tensor_1d(Type.F32, 8).set_name("small")
    ctx.new_tensor_1d(Type.F32, 65).set_name("big")  # 260 bytes > 256
    with pytest.raises(ValueError, match=r"tensor 'big' \(f32, ne=\[65, 1, 1, 1\]\) needs 288 "
                                         r"bytes, more than the max size 256 bytes of a "
                                         r"CPU_max256 buffer"):
        fn(ctx, buft)
    assert small.buffer is None  # nothing placed


@pytest.mark.parametrize("n", [1, 63, 64])
def test_tensors_up_to_max_size_still_allocate(n):
    buft = _MaxBuft(256)
    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, n).set_name("a")
    b = ctx.new_tensor_1d(Type.F32, 64).set_name("b")  # exactly 256 bytes: a buffer of its own
    buf = alloc_ctx_tensors_from_buft(ctx, buft)
    try:
        backend_tensor_set(a, np.arange(n, dtype=np.float32))
        backend_tensor_set(b, np.full(64, 7, np.float32))
        np.testing.assert_array_equal(backend_tensor_get(a).reshape(-1), np.arange(n))
        np.testing.assert_array_equal(backend_tensor_get(b).reshape(-1), np.full(64, 7))
    finally:
        buf.free()


def test_out_of_memory_names_the_largest_tensor(sim_devices):
    buft = sim_devices(1, memory_mb=1)[0].get_buffer_type()
    ctx = Context()
    ctx.new_tensor_1d(Type.F32, 4).set_name("tiny")
    big = ctx.new_tensor_2d(Type.F32, 1024, 1024).set_name("huge")
    with pytest.raises(OutOfMemoryError, match=r"the largest 'huge' \(f32, ne=\[1024, 1024, 1, 1\]"
                                               r", 4194304 bytes\)"):
        alloc_ctx_tensors_from_buft(ctx, buft)
    assert big.buffer is None


OVERFLOW = [
    ("new_tensor_2d", lambda c: c.new_tensor_2d(Type.F32, 2**40, 2**40), ("ne=[1099511627776, "
     "1099511627776, 1, 1]")),
    ("new_tensor_1d bytes", lambda c: c.new_tensor_1d(Type.F32, 2**62), "ne=[4611686018427387904"),
    ("new_tensor_4d", lambda c: c.new_tensor_4d(Type.F16, 2**16, 2**16, 2**16, 2**16),
     "a f16 tensor with ne=[65536, 65536, 65536, 65536]"),
    ("op result", lambda c: ops.mul_mat(c, c.new_tensor_2d(Type.F32, 2, 2**40),
                                        c.new_tensor_2d(Type.F32, 2, 2**40)),
     "ne=[1099511627776, 1099511627776, 1, 1]"),
    ("view", lambda c: ops.view_2d(c, c.new_tensor_1d(Type.F32, 4), 2**40, 2**40, 0, 0),
     "view of"),
]


@pytest.mark.parametrize("what,make,text", OVERFLOW, ids=[o[0] for o in OVERFLOW])
def test_int64_overflow_of_a_new_tensor_is_refused(what, make, text):
    with pytest.raises(ValueError) as info:
        make(Context())
    assert text in str(info.value), str(info.value)
    if what != "view":
        assert "more than 2**63-1 (int64 overflow)" in str(info.value)


def test_host_context_allocation_failure_names_the_tensor():
    ctx = Context(no_alloc=False)
    with pytest.raises(OutOfMemoryError, match=r"new f32 tensor with ne=\[1073741824, 268435456"):
        ctx.new_tensor_2d(Type.F32, 2**30, 2**28)  # 2**60 bytes: fits int64, not memory
    assert len(ctx.tensors) == 0  # the context is left unchanged
