"""Fixtures of the LLM tests: GGUF tokenizer metadata and llama.cpp's reference data.

The reference JSON files and ``tiny_llama_bpe.gguf`` are committed under ``tests/data/`` (made by
``scripts/make_llm_reference.py``). The Gemma 3 270M file is large and not committed: the tests
that need it use the ``gemma_gguf`` fixture (``$GGMLPY_GEMMA3_GGUF``), which marks them ``model``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[2] / "data"


def read_tokenizer_metadata(path: Path) -> dict[str, Any]:
    """The ``tokenizer.*`` and ``general.*`` metadata of a GGUF file, read with gguf-py's
    ``GGUFReader``: string arrays as lists of str, numeric arrays as NumPy arrays, scalars as
    Python values."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(path))
    vt = gguf.GGUFValueType
    meta: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if not key.startswith(("tokenizer.", "general.")):
            continue
        if f.types[0] == vt.ARRAY:
            if f.types[-1] == vt.STRING:
                meta[key] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                meta[key] = np.concatenate([f.parts[i] for i in f.data]) if f.data else np.array([])
        elif f.types[0] == vt.STRING:
            meta[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            meta[key] = f.parts[f.data[0]].tolist()[0]
    return meta


def _load_json(name: str) -> dict[str, Any]:
    path = DATA / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: llama.cpp reference data missing (scripts/make_llm_reference.py "
                                f"writes it)")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def bpe_ref() -> dict[str, Any]:
    """llama.cpp's ids / detokenizations for the strings of ``llm_ref_strings`` on the BPE file."""
    return _load_json("bpe_tokenizer.json")


@pytest.fixture(scope="session")
def gemma_ref() -> dict[str, Any]:
    """llama.cpp's ids / detokenizations for the same strings on Gemma 3 270M."""
    return _load_json("gemma3_tokenizer.json")


@pytest.fixture(scope="session")
def bpe_meta() -> dict[str, Any]:
    """Tokenizer metadata of ``tests/data/tiny_llama_bpe.gguf`` (gpt2 model, pre ``gpt-2``)."""
    path = DATA / "tiny_llama_bpe.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the committed tiny BPE GGUF is missing")
    return read_tokenizer_metadata(path)


@pytest.fixture(scope="session")
def gemma_meta(gemma_gguf: Path) -> dict[str, Any]:
    """Tokenizer metadata of the Gemma 3 270M GGUF (the ``gemma_gguf`` fixture: skips when
    ``$GGMLPY_GEMMA3_GGUF`` is unset or names no file; its users are marked ``model``)."""
    return read_tokenizer_metadata(gemma_gguf)
