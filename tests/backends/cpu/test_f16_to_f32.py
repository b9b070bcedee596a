""":func:`ggmlpy.backends.cpu.jit.f16_to_f32`: NumPy's ``astype(float32)`` of a float16 array bit for
bit (every f16 bit pattern: zeros, subnormals, inf, NaN payloads; signalling NaNs quiet, as F16C
converts them), in the compiled form (C-contiguous,
at least ``F16_MIN_ELEMENTS``), for sizes with and without a tail of fewer than 16, strided views
(NumPy's ``astype``) and with ``GGMLPY_JIT=0``; a non-float16 input is refused."""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.backends.cpu import jit as cpu_jit


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("n", [1 << 16, (1 << 16) - 5])
def test_every_f16_bit_pattern(n: int) -> None:
    """NumPy's values, but signalling NaNs quiet (F16C sets the quiet bit; NumPy keeps the
    payload as it is) in the compiled form, tail included."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)[:n].view(np.float16)
    want = h.astype(np.float32)
    if cpu_jit.available():
        bits = want.view(np.uint32)
        snan = np.isnan(want) & ((bits & 0x00400000) == 0)
        assert snan.sum() > 1000
        bits[snan] |= 0x00400000
    _same(cpu_jit.f16_to_f32(h), want)


@pytest.mark.parametrize("jit", ["1", "0"])
@pytest.mark.parametrize("shape", [(5,), (256,), (257,), (1, 1, 1, 80, 256), (33, 31)])
def test_shapes_and_views(monkeypatch, jit: str, shape: tuple[int, ...]) -> None:
    monkeypatch.setenv("GGMLPY_JIT", jit)
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 300).astype(np.float16)
    _same(cpu_jit.f16_to_f32(x), x.astype(np.float32))
    if x.ndim > 1:
        v = x[..., ::2]                                  # strided: NumPy's astype
        _same(cpu_jit.f16_to_f32(v), v.astype(np.float32))


def test_refuses_other_dtypes() -> None:
    with pytest.raises(TypeError, match="float16"):
        cpu_jit.f16_to_f32(np.zeros(300, np.float32))
