"""GGUF save/load round trips for every type and one GGUFError per corrupt-file kind."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import ggmlpy
from ggmlpy import BufferUsage, GGUFError, Type, backend_tensor_get
from ggmlpy.quants import QUANTIZABLE, dequantize, quantize

gguf = pytest.importorskip("gguf")

INT_TYPES = [Type.I8, Type.I16, Type.I32, Type.I64]


@pytest.fixture(scope="module")
def cpu():
    return ggmlpy.backend_cpu_init()


def _raw(t: ggmlpy.Tensor) -> np.ndarray:
    g = backend_tensor_get(t)
    return np.frombuffer(g, np.uint8) if isinstance(g, (bytes, bytearray)) else \
        np.ascontiguousarray(g).reshape(-1).view(np.uint8)


def _values(rng, t: Type, shape):
    if t in INT_TYPES:
        info = np.iinfo(t.dtype)
        return rng.integers(info.min, info.max, shape, dtype=t.dtype, endpoint=True)
    return rng.standard_normal(shape).astype(np.float32)


def test_round_trip_every_type(tmp_path, cpu):
    rng = np.random.default_rng(1)
    types = sorted(QUANTIZABLE) + INT_TYPES
    src, want = {}, {}
    for i, t in enumerate(types):
        shape = (2, 3, 256) if i % 2 else (5, 512)
        v = _values(rng, t, shape)
        if t in INT_TYPES:
            src[f"t.{t.type_name}"] = v
            want[f"t.{t.type_name}"] = (t, list(shape[::-1]), v.reshape(-1).view(np.uint8))
        elif t == Type.BF16:  # a bfloat16 array is stored as BF16 directly
            b = v.astype(ml_dtypes.bfloat16)
            src[f"t.{t.type_name}"] = b
            want[f"t.{t.type_name}"] = (t, list(shape[::-1]), b.reshape(-1).view(np.uint8))
        else:
            src[f"t.{t.type_name}"] = (t, v)
            want[f"t.{t.type_name}"] = (t, list(shape[::-1]), quantize(v, t).reshape(-1))
    meta = {"general.architecture": "bert", "bert.block_count": 6, "x.neg": -3, "x.big": 2**40,
            "x.f": 0.25, "x.s": "héllo", "x.b": False, "x.ints": [1, -2, 3],
            "x.floats": [0.5, 1.5], "x.strs": ["a", "", "c"]}
    p = tmp_path / "all.gguf"
    ggmlpy.gguf_save(p, src, meta)
    m = ggmlpy.gguf_load(p, cpu)
    assert list(m.tensors) == list(src)  # file order kept
    assert m.metadata == {**meta, "ggmlpy.writer": "ggmlpy"}  # gguf_save marks its files
    assert m.buffer is not None and m.buffer.usage == BufferUsage.WEIGHTS
    for name, (t, ne, raw) in want.items():
        tt = m[name]
        assert tt.type == t and list(tt.ne[:len(ne)]) == ne and tt.buffer is m.buffer, name
        assert np.array_equal(_raw(tt), raw), name
    # all tensors in the one buffer, in disjoint aligned ranges
    spans = sorted((tt.offset, tt.offset + tt.nbytes) for tt in m.tensors.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    # the quantized data decodes to the values written
    q = m["t.q8_0"]
    v = src["t.q8_0"][1]
    np.testing.assert_allclose(dequantize(_raw(q), Type.Q8_0, list(q.ne)).reshape(v.shape), v,
                               atol=np.abs(v).max() / 127)
    m.free()


def test_resave_loaded_tensors_with_types_is_identical(tmp_path, cpu):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    p1, p2 = tmp_path / "a.gguf", tmp_path / "b.gguf"
    ggmlpy.gguf_save(p1, {"w": (Type.Q4_K, x), "b": x[0].copy()},
                     {"general.architecture": "llama", "general.alignment": 64, "k": [1, 2]})
    m = ggmlpy.gguf_load(p1, cpu)
    assert m.alignment == 64
    ggmlpy.gguf_save(p2, m.ctx, m.metadata, types=m.metadata_types)
    assert p1.read_bytes() == p2.read_bytes()


def test_load_into_sim_buffer(tmp_path, sim_devices):
    sim = sim_devices(1)[0].init_backend()
    x = np.arange(512, dtype=np.float32).reshape(2, 256)
    p = tmp_path / "s.gguf"
    ggmlpy.gguf_save(p, {"a": (Type.Q6_K, x), "b": x}, {})
    m = ggmlpy.gguf_load(p, sim.get_default_buffer_type())
    assert m.buffer.buft is sim.get_default_buffer_type() or m.buffer.buft.name == "SIM0"
    assert np.array_equal(_raw(m["b"]), x.reshape(-1).view(np.uint8))
    assert np.array_equal(_raw(m["a"]), quantize(x, Type.Q6_K).reshape(-1))


def test_save_errors(tmp_path):
    with pytest.raises(ValueError, match=r"ne\[0\] = 100 .* block size 32 of q4_0"):
        ggmlpy.gguf_save(tmp_path / "e.gguf", {"a": (Type.Q4_0, np.zeros((2, 100)))}, {})
    with pytest.raises(TypeError, match="tensor 'a' must be a Tensor"):
        ggmlpy.gguf_save(tmp_path / "e.gguf", {"a": [1.0, 2.0]}, {})
    with pytest.raises(TypeError, match="has no GGUF type"):
        ggmlpy.gguf_save(tmp_path / "e.gguf", {}, {"k": object()})
    with pytest.raises(ValueError, match="not a power of two"):
        ggmlpy.gguf_save(tmp_path / "e.gguf", {}, {"general.alignment": 48})


@pytest.mark.parametrize("value, exc, rule", [
    ((Type.Q4_0, np.zeros((2, 100))), ValueError, r"ne\[0\] = 100 .* block size 32 of q4_0"),
    ((Type.Q8_0, np.full(32, np.nan)), ValueError, "non-finite value nan"),
    ((99, np.zeros(32)), TypeError, "type must be a ggmlpy.Type, got 99"),
    ((Type.I32, np.zeros(4)), ValueError, "i32 is not a float or block-quantized type"),
    (np.zeros(3, np.complex64), TypeError, "no ggml type for NumPy dtype complex64"),
])
def test_save_value_errors_name_the_tensor(tmp_path, value, exc, rule):
    """Every refused tensor value names the tensor and the rule, and writes no file."""
    p = tmp_path / "e.gguf"
    with pytest.raises(exc, match=r"^gguf_save: tensor 'w\.0': .*" + rule):
        ggmlpy.gguf_save(p, {"w.0": value}, {})
    assert not p.exists()


# ---------------------------------------------------------------- corrupt files


def _good_file(tmp_path):
    rng = np.random.default_rng(3)
    p = tmp_path / "good.gguf"
    ggmlpy.gguf_save(p, {"first": rng.standard_normal((2, 64)).astype(np.float32),
                         "second": (Type.Q8_0, rng.standard_normal((2, 64))),
                         "third": (Type.Q4_K, rng.standard_normal((1, 256)))},
                     {"general.architecture": "bert"})
    return p


class _RawInfoReader(gguf.GGUFReader if gguf else object):
    # gguf-py's reader keeping the raw tensor infos (memmap views of the file) to patch them
    def _build_tensors(self, start_offs, fields):
        self.tensors = []
        self.tensor_fields = fields


def _field(p, name, mode="r"):
    # the raw tensor info (parts: name_len, name, n_dims, dims, type, offset), as memmap views
    r = _RawInfoReader(p, mode)
    for fld in r.tensor_fields:
        if bytes(fld.parts[1]).decode() == name:
            return r, fld
    raise AssertionError(name)


def _patch_tensor_field(p, name, part, value):
    r, fld = _field(p, name, "r+")
    fld.parts[part][...] = value
    r.data.flush()


def test_bad_magic(tmp_path, cpu):
    p = _good_file(tmp_path)
    b = bytearray(p.read_bytes())
    b[:4] = b"GGML"
    p.write_bytes(bytes(b))
    with pytest.raises(GGUFError, match=r"good.gguf: not a GGUF file: magic b'GGML' at byte 0, "
                       r"expected b'GGUF'") as ei:
        ggmlpy.gguf_load(p, cpu)
    assert ei.value.tensor is None and ei.value.path == str(p)


def test_truncated_header(tmp_path, cpu):
    p = _good_file(tmp_path)
    p.write_bytes(p.read_bytes()[:60])
    with pytest.raises(GGUFError, match=r"good.gguf: the header declares 3 tensors and \d+ keys, "
                       r"which need at least \d+ bytes after byte 24; the file has 36"):
        ggmlpy.gguf_load(p, cpu)


def test_truncated_data_names_tensor(tmp_path, cpu):
    p = _good_file(tmp_path)
    p.write_bytes(p.read_bytes()[:-40])  # the last tensor is padded to 160 bytes; cut into its 144
    with pytest.raises(GGUFError, match=r"good.gguf: tensor 'third': data .* runs past the end .* "
                       "truncated") as ei:
        ggmlpy.gguf_load(p, cpu)
    assert ei.value.tensor == "third"


def test_unknown_type_names_tensor(tmp_path, cpu):
    p = _good_file(tmp_path)
    _patch_tensor_field(p, "second", 4, 99)
    with pytest.raises(GGUFError, match="tensor 'second': unknown or unsupported ggml type id 99"):
        ggmlpy.gguf_load(p, cpu)
    # a type ggml has but ggmlpy does not (Q2_K = 10) is refused the same way
    _patch_tensor_field(p, "second", 4, 10)
    with pytest.raises(GGUFError, match="tensor 'second': unknown or unsupported ggml type id 10"):
        ggmlpy.gguf_load(p, cpu)


def test_misaligned_offset_names_tensor(tmp_path, cpu):
    p = _good_file(tmp_path)
    off = int(_field(p, "second")[1].parts[5][0])
    _patch_tensor_field(p, "second", 5, off + 4)
    with pytest.raises(GGUFError, match=f"tensor 'second': data offset {off + 4} is not a "
                       "multiple of the alignment 32"):
        ggmlpy.gguf_load(p, cpu)


def test_bad_block_multiple_names_tensor(tmp_path, cpu):
    p = _good_file(tmp_path)
    _patch_tensor_field(p, "third", 3, [128, 2])  # same byte count, ne[0] not a multiple of 256
    with pytest.raises(GGUFError, match=r"tensor 'third': ne\[0\] = 128 is not a multiple of "
                       "the block size 256 of q4_K"):
        ggmlpy.gguf_load(p, cpu)


def test_load_argument_errors(tmp_path, cpu):
    with pytest.raises(FileNotFoundError):
        ggmlpy.gguf_load(tmp_path / "missing.gguf", cpu)
    with pytest.raises(TypeError, match="Backend or BufferType"):
        ggmlpy.gguf_load(_good_file(tmp_path), "CPU")


def test_failed_load_frees_its_buffer(tmp_path, cpu, monkeypatch):
    """A load that fails while copying tensor data frees the WEIGHTS buffer it allocated (the
    caller never gets a handle to it, so nobody else could)."""
    from ggmlpy.gguf import weights as gguf_io

    made = []
    real_alloc, real_set = gguf_io.alloc_ctx_tensors_from_buft, gguf_io.backend_tensor_set
    monkeypatch.setattr(gguf_io, "alloc_ctx_tensors_from_buft",
                        lambda ctx, buft: made.append(real_alloc(ctx, buft)) or made[-1])

    def failing_set(t, data, *args):
        if t.name == "second":
            raise OSError("read error")
        real_set(t, data, *args)

    monkeypatch.setattr(gguf_io, "backend_tensor_set", failing_set)
    with pytest.raises(OSError, match="read error"):
        ggmlpy.gguf_load(_good_file(tmp_path), cpu)
    assert len(made) == 1 and made[0].freed
