"""Block data that would not decode to finite values is refused everywhere it enters a block
type: gguf_save (tensors, arrays, (Type, array) pairs), CPY into a block type, and gguf_load
(on by default for files ggmlpy wrote, on request for foreign ones), as llama-quantize's
``ggml_validate_row_data`` check does."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import _backend, alloc_ctx

import ggmlpy
from ggmlpy import ops
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.core.errors import GGUFError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize, quantize

gguf = pytest.importorskip("gguf")

QTYPES = [Type.Q4_0, Type.Q4_1, Type.Q5_0, Type.Q5_1, Type.Q8_0, Type.Q4_K, Type.Q5_K, Type.Q6_K]
#: byte offset of the f16 ``d`` in each block
D_AT = {t: (208 if t == Type.Q6_K else 0) for t in QTYPES}


def _bad_bytes(t: Type, nrows: int, bad_row: int, bad_block: int) -> np.ndarray:
    """Valid blocks of ones, with block ``bad_block`` of row ``bad_row`` given d = +inf."""
    per = 2
    raw = quantize(np.ones((nrows, per * t.blck_size), np.float32), t).copy()
    at = bad_block * t.type_size + D_AT[t]
    raw[bad_row, at:at + 2] = np.array([np.inf], np.float16).view(np.uint8)
    return raw


@pytest.mark.parametrize("t", QTYPES, ids=lambda t: t.type_name)
def test_save_refuses_a_pair_whose_scale_overflows(tmp_path, t):
    value = {Type.Q4_0: 1e6, Type.Q5_0: 2e6, Type.Q8_0: 1e7, Type.Q4_1: 2e6, Type.Q5_1: 4e6}.get(t, 1e9)
    x = np.ones((2, 2 * t.blck_size), np.float32)
    x[1, t.blck_size] = value
    p = tmp_path / "x.gguf"
    with pytest.raises(ValueError, match=r"gguf_save: tensor 'w': quantize: block 1 of row 1 "):
        ggmlpy.gguf_save(p, {"ok": np.ones(4, np.float32), "w": (t, x)})
    assert not p.exists()


@pytest.mark.parametrize("t", QTYPES, ids=lambda t: t.type_name)
def test_save_refuses_a_tensor_with_an_inf_scale(tmp_path, cpu, t):
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(t, (2 * t.blck_size, 3)).set_name("blk.0.w")
    buf = alloc_ctx(ctx)
    try:
        backend_tensor_set(w, _bad_bytes(t, 3, 2, 1).reshape(-1))
        with pytest.raises(ValueError, match=rf"tensor 'blk.0.w': block 1 of row 2 \(flat block 5\) "
                                             rf"of {t.type_name} does not decode to finite"):
            ggmlpy.gguf_save(tmp_path / "x.gguf", [w])
    finally:
        buf.free()


def _foreign_file(path, t: Type, raw: np.ndarray, ne0: int) -> None:
    """A GGUF file written by gguf-py alone (no ggmlpy.writer key), like a foreign converter."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", raw.reshape(raw.shape[0], -1), raw_dtype=gguf.GGMLQuantizationType(int(t)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def cpu():
    return _backend()


@pytest.mark.parametrize("t", QTYPES, ids=lambda t: t.type_name)
def test_load_validation_of_a_foreign_file_is_opt_in(tmp_path, cpu, t):
    raw = _bad_bytes(t, 3, 2, 0)
    p = tmp_path / "foreign.gguf"
    _foreign_file(p, t, raw, 2 * t.blck_size)
    m = ggmlpy.gguf_load(p, cpu)  # default: not ggmlpy's file, loaded as it is
    try:
        got = np.asarray(backend_tensor_get(m["w"])).reshape(-1).view(np.uint8)
        assert np.array_equal(got, raw.reshape(-1))
        assert not np.isfinite(dequantize(got, t, [2 * t.blck_size, 3])).all()
    finally:
        m.free()
    with pytest.raises(GGUFError, match=r"tensor 'w': block 0 of row 2 \(flat block 4\) of "
                                        rf"{t.type_name} does not decode to finite values") as ei:
        ggmlpy.gguf_load(p, cpu, validate=True)
    assert ei.value.tensor == "w" and ei.value.path == str(p)


@pytest.mark.parametrize("t", [Type.Q4_0, Type.Q4_K, Type.Q6_K], ids=lambda t: t.type_name)
def test_load_validates_ggmlpy_files_by_default(tmp_path, cpu, t):
    x = np.random.default_rng(1).standard_normal((4, 2 * t.blck_size)).astype(np.float32)
    p = tmp_path / "mine.gguf"
    ggmlpy.gguf_save(p, {"a": np.ones(8, np.float32), "w": (t, x)})
    m = ggmlpy.gguf_load(p, cpu)
    assert m.metadata["ggmlpy.writer"] == "ggmlpy"
    np.testing.assert_array_equal(dequantize(backend_tensor_get(m["w"]), t, [2 * t.blck_size, 4]),
                                  dequantize(quantize(x, t), t, [2 * t.blck_size, 4]))
    m.free()
    # corrupt one scale in the file: block 3 (row 1, block 1) gets d = NaN
    r = gguf.GGUFReader(str(p))
    off = int(r.tensors[[ti.name for ti in r.tensors].index("w")].data_offset)
    del r
    data = bytearray(p.read_bytes())
    at = off + 3 * t.type_size + D_AT[t]
    data[at:at + 2] = np.array([np.nan], np.float16).tobytes()
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=r"tensor 'w': block 1 of row 1 \(flat block 3\)"):
        ggmlpy.gguf_load(p, cpu)
    m = ggmlpy.gguf_load(p, cpu, validate=False)
    m.free()
    with pytest.raises(TypeError, match="validate must be None, True or False"):
        ggmlpy.gguf_load(p, cpu, validate="yes")


@pytest.mark.parametrize("t", QTYPES, ids=lambda t: t.type_name)
def test_cpy_into_a_block_type_refuses_values_it_cannot_hold(t):
    ctx = Context(no_alloc=True)
    src = ctx.new_tensor(Type.F32, (t.blck_size, 2))
    dst = ctx.new_tensor(t, (t.blck_size, 2))
    out = ops.cpy(ctx, src, dst)
    buf = alloc_ctx(ctx)
    try:
        x = np.ones((2, t.blck_size), np.float32)
        x[1, 3] = 1e9 if t.blck_size == 256 else 1e7
        backend_tensor_set(src, x)
        g = Graph(16)
        g.build_forward_expand(out)
        with pytest.raises(ValueError, match=rf"block 0 of row 1 .* cannot be stored as {t.type_name}"):
            _backend().graph_compute(g)
    finally:
        buf.free()


@pytest.mark.parametrize(("t", "value"), [(Type.F16, 7e4), (Type.F16, -1e9), (Type.BF16, 3.4e38)])
def test_save_refuses_a_finite_value_that_overflows_f16_or_bf16(tmp_path, t, value):
    """A (Type, array) pair converted to F16/BF16: ggml's conversion would store inf."""
    x = np.ones((2, 8), np.float32)
    x[1, 5] = value
    with pytest.raises(ValueError, match=rf"tensor 'f': element 5 of row 1 \(flat element 13\) "
                                         rf"of {t.type_name} is inf or NaN .* overflows"):
        ggmlpy.gguf_save(tmp_path / "f.gguf", {"f": (t, x)})


def test_float_tensors_are_stored_as_given(tmp_path, cpu):
    """NaN/inf that the caller puts in a float tensor on purpose (a damaged model for a test, a
    mask) are written and read back unchanged, also with load validation on."""
    x = np.ones((2, 8), np.float32)
    x[0, 1], x[1, 2] = np.nan, -np.inf
    h = x.copy()
    p = tmp_path / "f.gguf"
    ggmlpy.gguf_save(p, {"f32": x, "f16": (Type.F16, h)})
    m = ggmlpy.gguf_load(p, cpu, validate=True)
    try:
        np.testing.assert_array_equal(np.asarray(backend_tensor_get(m["f32"])).reshape(2, 8), x)
        got = np.asarray(backend_tensor_get(m["f16"])).astype(np.float32).reshape(2, 8)
        np.testing.assert_array_equal(got, x)
    finally:
        m.free()
