"""gguf_load through ggmlpy.gguf.reader: big-endian files load as their little-endian
originals, tensors copied in pieces land whole, nested metadata stays nested, and the Gemma 3
file (when GGMLPY_GEMMA3_GGUF names it) loads every tensor with the bytes gguf-py reads."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

import ggmlpy
from ggmlpy import Type, backend_tensor_get
from ggmlpy.gguf import weights

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def cpu():
    return ggmlpy.backend_cpu_init()


def _raw(t: ggmlpy.Tensor) -> np.ndarray:
    g = backend_tensor_get(t)
    return np.frombuffer(g, np.uint8) if isinstance(g, (bytes, bytearray)) else \
        np.ascontiguousarray(g).reshape(-1).view(np.uint8)


def _file(tmp_path: Path) -> tuple[Path, dict]:
    rng = np.random.default_rng(29)
    src = {"f32": rng.standard_normal((3, 64)).astype(np.float32),
           "f16": rng.standard_normal((2, 64)).astype(np.float16),
           "q4_0": (Type.Q4_0, rng.standard_normal((3, 64))),
           "q8_0": (Type.Q8_0, rng.standard_normal((5, 64))),
           "q4_k": (Type.Q4_K, rng.standard_normal((2, 512))),
           "q6_k": (Type.Q6_K, rng.standard_normal((3, 256)))}
    p = tmp_path / "le.gguf"
    ggmlpy.gguf_save(p, src, {"general.architecture": "llama", "x.ints": [1, -2, 3],
                              "x.s": ["a", "b"]})
    return p, src


def test_big_endian_file_loads_as_its_little_endian_original(tmp_path, cpu, monkeypatch):
    """The little-endian file converted by gguf-py's gguf_convert_endian.py (its own per-type
    block swaps) loads to the same tensor bytes and metadata."""
    conv = pytest.importorskip("gguf.scripts.gguf_convert_endian")
    p, _ = _file(tmp_path)
    le = ggmlpy.gguf_load(p, cpu)
    q = tmp_path / "be.gguf"
    q.write_bytes(p.read_bytes())
    monkeypatch.setattr("builtins.input", lambda *a: "YES")
    g = gguf.GGUFReader(str(q), "r+")
    conv.convert_byteorder(g, argparse.Namespace(order="big", dry_run=False))
    g.data.flush()
    del g
    assert q.read_bytes() != p.read_bytes()
    be = ggmlpy.gguf_load(q, cpu)
    assert be.metadata == le.metadata and be.metadata_types == le.metadata_types
    assert list(be.tensors) == list(le.tensors)
    for name, t in le.tensors.items():
        b = be[name]
        assert (b.type, list(b.ne)) == (t.type, list(t.ne)), name
        assert np.array_equal(_raw(b), _raw(t)), name


def test_tensors_copied_in_pieces_land_whole(tmp_path, cpu, monkeypatch):
    """With a piece size smaller than one row (and not a multiple of any block size), every
    tensor still arrives byte for byte, in whole blocks per piece."""
    p, _ = _file(tmp_path)
    want = ggmlpy.gguf_load(p, cpu)
    pieces = []
    real_set = weights.backend_tensor_set

    def recording_set(t, data, offset=0, size=None):
        pieces.append((t.name, offset, size))
        real_set(t, data, offset, size)

    monkeypatch.setattr(weights, "_COPY_CHUNK", 100)
    monkeypatch.setattr(weights, "backend_tensor_set", recording_set)
    got = ggmlpy.gguf_load(p, cpu)
    for name, t in want.tensors.items():
        assert np.array_equal(_raw(got[name]), _raw(t)), name
        mine = [(o, s) for n, o, s in pieces if n == name]
        ts = t.type.type_size
        assert len(mine) > 1 and all(o % ts == 0 and s % ts == 0 for o, s in mine), name
        assert sum(s for _, s in mine) == t.nbytes and mine[0][0] == 0, name


def test_nested_metadata_stays_nested(tmp_path, cpu):
    p = tmp_path / "n.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_key_value("n", [[1, 2], [3, 4, 5]], gguf.GGUFValueType.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = ggmlpy.gguf_load(p, cpu)
    assert m.metadata["n"] == [[1, 2], [3, 4, 5]] and m.buffer is None
    assert m.metadata_types["n"] == (int(gguf.GGUFValueType.ARRAY), int(gguf.GGUFValueType.ARRAY))


def test_gemma3_loads_every_tensor_with_gguf_py_bytes(cpu, gemma_gguf):
    p = str(gemma_gguf)
    m = ggmlpy.gguf_load(p, cpu)
    g = gguf.GGUFReader(p)
    assert len(m.tensors) == len(g.tensors) == 236
    for t in g.tensors:
        mine = m[t.name]
        assert int(mine.type) == int(t.tensor_type) and mine.nbytes == int(t.n_bytes), t.name
        assert np.array_equal(_raw(mine), np.asarray(t.data).reshape(-1).view(np.uint8)), t.name
    assert m.metadata["general.architecture"] == "gemma3"
    assert len(m.metadata["tokenizer.ggml.tokens"]) == 262144
    m.free()
