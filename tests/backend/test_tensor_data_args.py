"""The tensor data functions (ggmlpy.backend.tensor_data) check every argument at the entry point.

One table over all seven public functions: each row passes one wrong argument, every other valid,
and must raise the named class with a message naming the function and the argument, before any
byte moves (the tensor still holds its values afterwards). Before, ``backend_tensor_memset`` with a
float offset or a non-Tensor, ``backend_tensor_get_async``/``copy_async`` with a non-Backend and
``backend_tensor_get(size=1.5)`` raised AttributeErrors from deep inside or truncated silently.
"""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend import tensor_data as td
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type

VALUES = np.arange(8, dtype=np.float32)


@pytest.fixture()
def env():
    be = backend_cpu_init()
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor_1d(Type.F32, 8).set_name("a")
    b = ctx.new_tensor_1d(Type.F32, 8).set_name("b")
    buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
    td.backend_tensor_set(a, VALUES)
    td.backend_tensor_set(b, VALUES)
    yield be, a, b
    buf.free()


OUT = np.zeros(2, np.float32)

ROWS = [
    ("get tensor", lambda be, a, b: td.backend_tensor_get("a"), TypeError, "backend_tensor_get: tensor must be Tensor"),
    ("get offset", lambda be, a, b: td.backend_tensor_get(a, 1.0), TypeError, r": offset must be int"),
    ("get size", lambda be, a, b: td.backend_tensor_get(a, 0, 1.5), TypeError, r": size must be int"),
    ("get range", lambda be, a, b: td.backend_tensor_get(a, 4, 32), ValueError, r"\[4, 36\) is outside tensor 'a'"),
    ("memset tensor", lambda be, a, b: td.backend_tensor_memset(None, 0), TypeError, "backend_tensor_memset: tensor must be Tensor"),
    ("memset value", lambda be, a, b: td.backend_tensor_memset(a, 1.5), TypeError, "backend_tensor_memset: value must be int"),
    ("memset value range", lambda be, a, b: td.backend_tensor_memset(a, 256), ValueError, "value 256 is not a byte"),
    ("memset offset", lambda be, a, b: td.backend_tensor_memset(a, 0, 2.0), TypeError, r": offset must be int"),
    ("memset size", lambda be, a, b: td.backend_tensor_memset(a, 0, 0, 4.0), TypeError, r": size must be int"),
    ("memset range", lambda be, a, b: td.backend_tensor_memset(a, 0, -1), ValueError, "outside tensor 'a'"),
    ("set tensor", lambda be, a, b: td.backend_tensor_set(3, VALUES), TypeError, "backend_tensor_set: tensor must be Tensor"),
    ("set offset", lambda be, a, b: td.backend_tensor_set(a, VALUES[:2], 0.5), TypeError, r": offset must be int"),
    ("set_async backend", lambda be, a, b: td.backend_tensor_set_async(None, a, VALUES), TypeError, "backend_tensor_set_async: backend must be Backend"),
    ("get_async backend", lambda be, a, b: td.backend_tensor_get_async(None, a, OUT.copy()), TypeError, "backend_tensor_get_async: backend must be Backend"),
    ("get_async tensor", lambda be, a, b: td.backend_tensor_get_async(be, "a", OUT.copy()), TypeError, "backend_tensor_get_async: tensor must be Tensor"),
    ("get_async offset", lambda be, a, b: td.backend_tensor_get_async(be, a, OUT.copy(), 1.0), TypeError, r": offset must be int"),
    ("get_async out type", lambda be, a, b: td.backend_tensor_get_async(be, a, [0.0]), TypeError, "out must be a NumPy array"),
    ("get_async out strided", lambda be, a, b: td.backend_tensor_get_async(be, a, np.zeros(4, np.float32)[::2]), ValueError, "writable C-contiguous"),
    ("copy tensor", lambda be, a, b: td.backend_tensor_copy(a, None), TypeError, "backend_tensor_copy: dst must be Tensor"),
    ("copy_async backend_src", lambda be, a, b: td.backend_tensor_copy_async("CPU", be, a, b), TypeError, "backend_tensor_copy_async: backend_src must be Backend"),
    ("copy_async backend_dst", lambda be, a, b: td.backend_tensor_copy_async(be, None, a, b), TypeError, "backend_tensor_copy_async: backend_dst must be Backend"),
    ("copy_async src", lambda be, a, b: td.backend_tensor_copy_async(be, be, VALUES, b), TypeError, "backend_tensor_copy_async: src must be Tensor"),
]


@pytest.mark.parametrize("call, exc, text", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_wrong_argument_is_named_and_nothing_moves(env, call, exc, text):
    be, a, b = env
    with pytest.raises(exc, match=text):
        call(be, a, b)
    np.testing.assert_array_equal(td.backend_tensor_get(a).reshape(-1), VALUES)
    np.testing.assert_array_equal(td.backend_tensor_get(b).reshape(-1), VALUES)


def test_valid_calls_still_work(env):
    """The checks accept NumPy integers and leave the results as before."""
    be, a, b = env
    td.backend_tensor_memset(a, np.uint8(0), np.int64(4), np.int32(8))
    np.testing.assert_array_equal(td.backend_tensor_get(a).reshape(-1), [0, 0, 0, 3, 4, 5, 6, 7])  # bytes 4..12 = elements 1, 2
    assert td.backend_tensor_get(b, np.int64(4), 4) == VALUES[1:2].tobytes()
    out = np.zeros(2, np.float32)
    td.backend_tensor_get_async(be, b, out, np.int64(8))
    be.synchronize()
    np.testing.assert_array_equal(out, [2, 3])
    td.backend_tensor_copy_async(be, be, b, a)
    be.synchronize()
    np.testing.assert_array_equal(td.backend_tensor_get(a).reshape(-1), VALUES)


@pytest.mark.parametrize("shape, ok", [
    ((2, 3), True), ((1, 2, 3), True), ((2, 1, 3), True), ((6,), True), ((1, 1, 2, 3), True),
    ((3, 2), False), ((6, 1, 1), False), ((1, 6), False), ((3, 1, 2), False),
])
def test_set_refuses_a_typed_array_of_another_layout(env, shape, ok):
    """A whole-tensor write of a multi-dimensional array must have NumPy shape ``ne[::-1]`` up to
    size-1 dims: a (ne0, ne1) array for ne = [3, 2] (NumPy (2, 3)) was written transposed,
    silently. Dims of size 1 do not change the order of the data and are ignored."""
    be = env[0]
    ctx = Context(no_alloc=True)
    t = ctx.new_tensor(Type.F32, [3, 2]).set_name("t")
    buf = alloc_ctx_tensors_from_buft(ctx, be.get_default_buffer_type())
    td.backend_tensor_set(t, np.full((2, 3), -1, np.float32))
    data = np.arange(6, dtype=np.float32).reshape(shape)
    if ok:
        td.backend_tensor_set(t, data)
        np.testing.assert_array_equal(td.backend_tensor_get(t), np.arange(6).reshape(1, 1, 2, 3))
    else:
        with pytest.raises(ValueError, match=r"array of shape .* for tensor 't' of NumPy shape "
                                             r"\(1, 1, 2, 3\)"):
            td.backend_tensor_set(t, data)
        np.testing.assert_array_equal(td.backend_tensor_get(t), np.full((1, 1, 2, 3), -1))
    buf.free()
